// The MPI transport (mpi/fabric.h, docs/mpi.md).
#include "mpi/fabric.h"

#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <list>

#include <sys/mman.h>

#include "emulator/fiber.h"
#include "platform/memory_info.h"
#include "platform/wait.h"
#include "reference/check.h"
#include "reference/exact_acc.h"

namespace trident::mpi {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kTagData = 1, kTagHeartbeat = 2, kTagAbort = 3;

using Header = ChunkHeader;  // one MPI message of a (possibly chunked) transport message (mpi/wire.h)

std::string mpi_error(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, static_cast<size_t>(len));
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The exact accumulators' format: what a native merge of another process's accumulator bytes relies on.
struct AccFormat {
  uint32_t bytes_f32, limbs_f32, digit_f32, bytes_f64, limbs_f64, digit_f64, little_endian, pad;
  bool operator==(const AccFormat&) const = default;
};
AccFormat acc_format() {
  const uint32_t one = 1;
  unsigned char first = 0;
  std::memcpy(&first, &one, 1);
  return AccFormat{sizeof(ExactAcc<float>), ExactAcc<float>::kLimbs, ExactAcc<float>::kDigit,
                   sizeof(ExactAcc<double>), ExactAcc<double>::kLimbs, ExactAcc<double>::kDigit, first, 0};
}

constexpr size_t kIdleBlocks = 16;  // idle pool blocks kept mapped (their touched pages stay resident)
std::mutex g_pool_m;
void* g_pool[kIdleBlocks];  // idle kWireBlock mappings
size_t g_idle = 0;
}  // namespace

void* wire_pages(size_t bytes) {
  if (bytes <= kWireBlock) {
    {
      std::lock_guard lk(g_pool_m);
      if (g_idle > 0) return g_pool[--g_idle];
    }
    bytes = kWireBlock;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  return p;
}

void free_wire_pages(void* p, size_t bytes) noexcept {
  if (bytes <= kWireBlock) {
    {
      std::lock_guard lk(g_pool_m);
      if (g_idle < kIdleBlocks) {
        g_pool[g_idle++] = p;
        return;
      }
    }
    bytes = kWireBlock;
  }
  munmap(p, bytes);
}

void trim_wire_pages() noexcept {
  std::lock_guard lk(g_pool_m);
  for (; g_idle > 0; --g_idle) munmap(g_pool[g_idle - 1], kWireBlock);
}

std::string Fabric::describe_process(int p) const {
  if (k_ == 1) return fmt::format("rank {} (process {})", p, p);
  return fmt::format("ranks {}..{} (process {})", p * k_, p * k_ + k_ - 1, p);
}

Fabric::Fabric(const FabricOptions& opt) : opt_(opt) {
  TD_CHECK(opt_.ranks_per_process >= 1, "mpi: ranks per process must be >= 1");
  k_ = opt_.ranks_per_process;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &proc_);
  MPI_Comm_size(comm_, &nproc_);
  chunk_ = opt_.chunk_bytes > 0 ? opt_.chunk_bytes : static_cast<size_t>(INT_MAX) - 64;
  TD_CHECK(chunk_ + sizeof(Header) <= static_cast<size_t>(INT_MAX), "mpi: chunk of {} bytes exceeds INT_MAX", chunk_);
  bundle_cap_ = std::min(chunk_ + sizeof(Header), kWireBlock);
  out_.resize(static_cast<size_t>(nproc_));
  for (int i = 0; i < k_; ++i) boxes_.push_back(std::make_unique<Mailbox>());
  // Every process started, with its accumulator format: an all-gather with a deadline (a process that never
  // arrives is named by its absence).
  const AccFormat mine = acc_format();
  std::vector<AccFormat> formats(static_cast<size_t>(nproc_));
  MPI_Request req;
  MPI_Iallgather(&mine, sizeof mine, MPI_BYTE, formats.data(), sizeof mine, MPI_BYTE, comm_, &req);
  const auto t0 = Clock::now();
  for (int flag = 0; !flag;) {
    MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
    if (!flag && seconds_since(t0) > std::max(60.0, opt_.peer_timeout_s))
      trident::fail(fmt::format("mpi: not every process of {} reached startup within {:.0f} s", nproc_,
                       std::max(60.0, opt_.peer_timeout_s)));
    if (!flag) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  native_exact_ = !opt_.lower_exact_sum;
  for (const AccFormat& f : formats) native_exact_ = native_exact_ && f == mine;
  MPI_Comm local = MPI_COMM_NULL;
  if (MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, proc_, MPI_INFO_NULL, &local) == MPI_SUCCESS &&
      local != MPI_COMM_NULL) {
    MPI_Comm_size(local, &local_procs_);
    MPI_Comm_free(&local);
  }
  progress_ = std::thread([this] { progress_main(); });
}

Fabric::~Fabric() {
  if (progress_.joinable()) {
    if (!done_.load()) mode_.store(2);
    out_cv_.notify_all();
    progress_.join();
  }
  if (comm_ != MPI_COMM_NULL && !failed_.load()) MPI_Comm_free(&comm_);
  trim_wire_pages();
}

std::string Fabric::failure() const {
  std::lock_guard lk(fail_m_);
  return failure_;
}

void Fabric::set_failure(const std::string& msg, bool tell_others) {
  {
    std::lock_guard lk(fail_m_);
    if (failed_.load()) return;
    failure_ = msg;
    tell_others_ = tell_others;
    failed_.store(true);
  }
  // No rank takes a message any more: the queued ones are dropped, which releases the post_ref ones (their
  // senders wait for that before they leave; released outside the mailbox's lock, which release_ref takes).
  for (auto& b : boxes_) {
    std::vector<void*> owners;
    {
      std::lock_guard lk(b->m);
      for (auto& [key, q] : b->q)
        while (Item* it = front(q)) {
          if (it->owner) owners.push_back(it->owner);
          pop(*b, q);
        }
      wake_locked(*b);
    }
    for (void* o : owners) release_ref(o);
  }
  out_cv_.notify_all();
}

Fabric::Mailbox::~Mailbox() {
  for (auto& [key, q] : this->q)
    while (Item* it = q.head) {
      q.head = it->next;
      delete it;
    }
  while (Item* it = free_items) {
    free_items = it->next;
    delete it;
  }
}

Received& Received::operator=(Received&& o) noexcept {
  if (this != &o) {
    release();
    sig = o.sig;
    f_ = o.f_;
    ptr_ = o.ptr_;
    size_ = o.size_;
    keep_ = std::move(o.keep_);
    owner_ = o.owner_;
    o.owner_ = nullptr;
    o.ptr_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

void Received::release() {
  if (owner_) f_->release_ref(owner_);
  owner_ = nullptr;
}

void Fabric::release_ref(void* owner) {
  Mailbox& b = *static_cast<Mailbox*>(owner);
  if (b.refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  std::lock_guard lk(b.m);
  wake_locked(b);
}

bool Fabric::in_fiber() const {
  return sched_.load(std::memory_order_acquire) != nullptr && emu::fiber::Scheduler::current_arg() != nullptr;
}

void Fabric::sleep_on(Mailbox& b, bool fiber, uint32_t old) {
  if (fiber) sched_.load(std::memory_order_acquire)->wait(b.word, old);
  else platform::wait_word(b.word, old);
}

void Fabric::wake_locked(Mailbox& b) {
  b.word.fetch_add(1, std::memory_order_release);
  if (!b.waiting) return;
  // A fiber waiter keeps its scheduler alive (run_ranks returns only after every fiber did), and it clears
  // `waiting` under b.m before it leaves.
  if (b.fiber) sched_.load(std::memory_order_acquire)->wake(b.word, INT_MAX);
  else platform::wake_word(b.word, INT_MAX);
}

void Fabric::wake_overdue() {
  for (auto& b : boxes_) {
    std::lock_guard lk(b->m);
    if (b->waiting && seconds_since(b->since) > opt_.wait_timeout_s) wake_locked(*b);
  }
}

void Fabric::run_ranks(const std::function<void(int)>& fn, const RankExecOptions& opt) {
  struct Arg {
    const std::function<void(int)>* fn;
    int g;
  };
  std::vector<Arg> args(static_cast<size_t>(k_));
  for (int i = 0; i < k_; ++i) args[static_cast<size_t>(i)] = Arg{&fn, first_rank() + i};
  auto body = [](void* p) {
    const auto* a = static_cast<const Arg*>(p);
    (*a->fn)(a->g);
  };
  if (!opt.fibers) {
    std::vector<std::thread> ts;
    for (int i = 0; i < k_; ++i) {
      try {
        ts.emplace_back(body, &args[static_cast<size_t>(i)]);
      } catch (const std::exception& e) {
        fail(fmt::format("rank {}: could not start its thread ({} of {} in this process: {})", first_rank() + i, i,
                         k_, e.what()));
        break;
      }
    }
    for (auto& t : ts) t.join();
    return;
  }
  int workers = opt.workers;
  if (workers <= 0)
    workers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) / std::max(1, local_procs_);
  workers = std::clamp(workers, 1, k_);
  pools_.make(workers);  // rank i: worker i % workers
  emu::fiber::Scheduler s(workers, static_cast<size_t>(k_));
  for (int i = 0; i < k_; ++i) {
    if (std::string err = s.add(i % workers, opt.stack_bytes, body, &args[static_cast<size_t>(i)]); !err.empty()) {
      fail(fmt::format("rank {}: could not start its fiber ({} of {} in this process: {})", first_rank() + i, i, k_,
                       err));
      break;  // the ranks added so far run, see the failure and return
    }
  }
  sched_.store(&s, std::memory_order_release);
  try {
    s.run();
  } catch (const std::exception& e) {  // no worker thread started: no rank ran
    fail(fmt::format("process {}: {}", proc_, e.what()));
  }
  sched_.store(nullptr, std::memory_order_release);
  pools_.clear();  // every rank, and its device, has finished
}

void Fabric::fail(const std::string& msg) { set_failure(msg, true); }

Fabric::Channel* Fabric::channel(uint64_t ctx, int src, int dst) {
  TD_CHECK(process_of(dst) == proc_, "mpi: a channel to rank {}, which is not in process {}", dst, proc_);
  Mailbox& b = box(dst);
  std::lock_guard lk(b.m);
  return &queue_locked(b, ctx, src, dst);
}

// Under b.m: the queue of (ctx, src) in b, the mailbox of dst, made on first use. It stays (unordered_map references
// are stable; emptied queues are kept) and its key is written only when it is made, so a channel's key can be read
// without the lock.
Fabric::Queue& Fabric::queue_locked(Mailbox& b, uint64_t ctx, int src, int dst) {
  const auto [it, made] = b.q.try_emplace({ctx, src});
  if (made) {
    it->second.ctx = ctx;
    it->second.src = src;
    it->second.dst = dst;
  }
  return it->second;
}

void Fabric::deliver(uint64_t ctx, int src, int dst, uint32_t sig, const char* ptr, size_t size,
                     std::shared_ptr<const void> keep, void* owner) {
  Mailbox& b = box(dst);
  {
    std::lock_guard lk(b.m);
    if (push_locked(b, queue_locked(b, ctx, src, dst), sig, ptr, size, keep, owner)) return;
  }
  if (owner) release_ref(owner);  // the run failed: nobody takes it
}

void Fabric::deliver(Channel& q, uint32_t sig, const char* ptr, size_t size, std::shared_ptr<const void> keep,
                     void* owner) {
  Mailbox& b = box(q.dst);
  {
    std::lock_guard lk(b.m);
    if (push_locked(b, q, sig, ptr, size, keep, owner)) return;
  }
  if (owner) release_ref(owner);  // the run failed: nobody takes it
}

void Fabric::pop(Mailbox& b, Queue& q) {
  Item* it = &q.slot;
  if (q.slot_full) {
    q.slot_full = false;
  } else {
    it = q.head;
    q.head = it->next;
    if (!q.head) q.tail = nullptr;
    it->next = b.free_items;
    b.free_items = it;
  }
  it->keep.reset();
  it->owner = nullptr;
}

// Under b.m: appends the message to q (a queue of b) and wakes b's rank if it waits for q; false after a failure
// (the message is not queued: the caller releases it).
bool Fabric::push_locked(Mailbox& b, Queue& q, uint32_t sig, const char* ptr, size_t size,
                         std::shared_ptr<const void>& keep, void* owner) {
  if (failed_.load()) return false;
  Item* it = &q.slot;
  if (!q.slot_full && !q.head) {
    q.slot_full = true;
  } else {
    it = b.free_items;
    if (it) b.free_items = it->next;
    else it = new Item;
    it->next = nullptr;
    (q.tail ? q.tail->next : q.head) = it;
    q.tail = it;
  }
  it->sig = sig;
  it->keep = std::move(keep);
  it->ptr = ptr;
  it->size = size;
  it->owner = owner;
  if (b.waiting && b.want == std::make_pair(q.ctx, q.src)) wake_locked(b);
  return true;
}

void Fabric::post(uint64_t ctx, int src, int dst, uint32_t sig, const void* data, size_t bytes) {
  TD_CHECK(dst >= 0 && dst < world(), "mpi: destination rank {} out of range [0, {})", dst, world());
  if (failed_.load()) trident::fail(fmt::format("rank {}: {}", src, failure()));
  const char* p = static_cast<const char*>(data);
  if (process_of(dst) == proc_) {
    auto copy = std::make_shared<const std::vector<char>>(p, p + bytes);
    const char* at = copy->data();
    deliver(ctx, src, dst, sig, at, bytes, std::move(copy), nullptr);
    return;
  }
  remote_msgs_.fetch_add(1, std::memory_order_relaxed);
  remote_bytes_.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  // Appended to the open bundle for dst's process, chunk by chunk (the only copy before MPI).
  bool wake = false;
  {
    std::lock_guard lk(out_m_);
    auto& bundles = out_[static_cast<size_t>(process_of(dst))];
    uint64_t off = 0;
    do {
      const uint64_t n = std::min<uint64_t>(chunk_, bytes - off);
      const size_t rec = sizeof(Header) + n;
      if (bundles.empty() || (!bundles.back().empty() && bundles.back().size() + rec > bundle_cap_)) {
        bundles.emplace_back();
        mpi_msgs_.fetch_add(1, std::memory_order_relaxed);
      }
      WireBytes& b = bundles.back();
      // Small bundles stay on malloc's heap (32 KiB); past that, one pool block for the rest of the bundle (its
      // address space: pages are touched as it fills), so a bundle is copied at most once, at 32 KiB.
      constexpr size_t kSmallBundle = size_t{32} << 10;
      if (const size_t want = b.size() + rec; want > b.capacity())
        b.reserve(std::max(want, want <= kSmallBundle ? std::min(kSmallBundle, bundle_cap_) : bundle_cap_));
      const Header h{ctx, src, dst, sig, static_cast<uint32_t>(n), bytes, off};
      // resize leaves the new bytes unset (WireAlloc's construct), then two copies: insert() would go through the
      // allocator's construct byte by byte.
      const size_t at = b.size();
      b.resize(at + rec);
      std::memcpy(b.data() + at, &h, sizeof h);
      if (n) std::memcpy(b.data() + at + sizeof h, p + off, n);
      off += n;
    } while (off < bytes);
    wake = !out_pending_;
    out_pending_ = true;
  }
  if (wake) out_cv_.notify_one();
}

void Fabric::post_ref(uint64_t ctx, int src, int dst, uint32_t sig, const void* data, size_t bytes) {
  if (process_of(dst) != proc_) return post(ctx, src, dst, sig, data, bytes);
  TD_CHECK(dst >= 0 && dst < world(), "mpi: destination rank {} out of range [0, {})", dst, world());
  post_ref(channel(ctx, src, dst), sig, data, bytes);
}

void Fabric::post_ref(Channel* c, uint32_t sig, const void* data, size_t bytes) {
  if (failed_.load()) trident::fail(fmt::format("rank {}: {}", c->src, failure()));
  Mailbox& own = box(c->src);
  own.refs.fetch_add(1, std::memory_order_relaxed);
  deliver(*c, sig, static_cast<const char*>(data), bytes, nullptr, &own);
}

// Waits until every post_ref message of src was released. With `what`, a wait past wait_timeout_s fails the run
// (which drops the queued messages, so the wait then ends); without, it waits as long as it takes (noexcept).
void Fabric::await_refs(int src, const Describe* what) {
  Mailbox& b = box(src);
  if (b.refs.load(std::memory_order_acquire) == 0) return;
  const bool fiber = in_fiber();
  std::unique_lock lk(b.m);
  const auto t0 = Clock::now();
  bool timed_out = false;
  while (b.refs.load(std::memory_order_acquire) != 0) {
    if (what && !timed_out && seconds_since(t0) > opt_.wait_timeout_s) {
      timed_out = true;
      lk.unlock();
      fail(fmt::format("rank {} waited {:.0f} s for its {} to be received: a receiver is stuck or issued "
                       "different calls (--mpi-wait-timeout)",
                       src, opt_.wait_timeout_s, (*what)()));
      lk.lock();
      continue;
    }
    b.waiting = true;
    b.fiber = fiber;
    b.want = {~uint64_t{0}, -1};  // no message: release_ref wakes it
    b.since = t0;
    const uint32_t old = b.word.load(std::memory_order_acquire);
    if (b.refs.load(std::memory_order_acquire) == 0) break;
    lk.unlock();
    sleep_on(b, fiber, old);
    lk.lock();
    b.waiting = false;
  }
  b.waiting = false;
}

void Fabric::drain_refs(int src) noexcept { await_refs(src, nullptr); }

void Fabric::wait_refs(int src, const Describe& what) {
  await_refs(src, &what);
  if (failed_.load()) trident::fail(fmt::format("rank {}: {} (after {})", src, failure(), what()));
}

Received Fabric::take(uint64_t ctx, int src, int dst, const Describe& what) {
  return take(channel(ctx, src, dst), what);
}

Received Fabric::take(Channel* c, const Describe& what) {
  Queue& q = *c;
  const uint64_t ctx = q.ctx;
  const int src = q.src, dst = q.dst;
  Mailbox& b = box(dst);
  const bool fiber = in_fiber();
  std::unique_lock lk(b.m);
  Clock::time_point t0{};
  for (;;) {
    if (failed_.load()) {  // checked first: after a failure no message is handed out (their senders may be gone)
      lk.unlock();
      trident::fail(fmt::format("rank {}: {} (while waiting for {} from rank {})", dst, failure(), what(), src));
    }
    if (Item* it = front(q)) {
      Received r;
      r.f_ = this;
      r.sig = it->sig;
      r.keep_ = std::move(it->keep);
      r.ptr_ = it->ptr;
      r.size_ = it->size;
      r.owner_ = it->owner;
      pop(b, q);
      return r;
    }
    if (t0 == Clock::time_point{}) t0 = Clock::now();
    if (seconds_since(t0) > opt_.wait_timeout_s) {
      lk.unlock();
      const std::string msg = fmt::format(
          "rank {} waited {:.0f} s for {} from rank {} on {}: that rank is stuck or issued different calls "
          "(--mpi-wait-timeout)",
          dst, opt_.wait_timeout_s, what(), src, describe_process(process_of(src)));
      fail(msg);
      trident::fail(msg);
    }
    b.waiting = true;
    b.fiber = fiber;
    b.want = {ctx, src};
    b.since = t0;
    const uint32_t old = b.word.load(std::memory_order_acquire);
    lk.unlock();
    sleep_on(b, fiber, old);
    lk.lock();
    b.waiting = false;
  }
}

void Fabric::shutdown() {
  mode_.store(1);
  out_cv_.notify_all();
  while (!done_.load() && !failed_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!done_.load()) {
    const std::string f = failure();
    stop_after_failure();
    trident::fail(f);
  }
  progress_.join();
}

void Fabric::stop_after_failure() {
  if (!progress_.joinable()) return;
  mode_.store(2);
  out_cv_.notify_all();
  progress_.join();
}

int64_t Fabric::peak_rss() { return platform::peak_rss_bytes(); }

// The progress thread: the only caller of MPI while it runs.
void Fabric::progress_main() {
  struct Inflight {
    MPI_Request req;
    WireBytes buf;
    bool data;  // a data chunk (shutdown waits for these), else a heartbeat or abort notice
  };
  std::list<Inflight> inflight;
  struct Arrival {
    MPI_Request req;
    int tag;
    std::shared_ptr<WireBytes> buf;  // shared with the messages delivered as views of it
    bool done = false;
  };
  std::vector<MPI_Request> reqs;  // scratch for MPI_Testsome
  std::vector<int> idx;
  std::vector<Arrival*> waiting;
  std::vector<std::deque<Arrival>> recvs(static_cast<size_t>(nproc_));  // per source, in match order
  std::vector<std::vector<WireBytes>> outs(static_cast<size_t>(nproc_));  // bundles taken from out_
  Reassembler reassembly(WireLayout{nproc_, k_, proc_, chunk_});  // checks every chunk (mpi/wire.h)
  std::vector<Clock::time_point> heard(static_cast<size_t>(nproc_), Clock::now());
  auto last_hb = Clock::now() - std::chrono::hours(1);
  bool aborts_sent = false, barrier_posted = false;
  MPI_Request barrier{};
  auto stop_at = Clock::time_point::max();
  auto backoff = std::chrono::microseconds(20);
  // The channels of arriving messages, direct-mapped by (context, source, destination): a hit queues the message
  // without the mailbox's hash-map look-up (a channel stays valid while the fabric lives).
  struct ChannelSlot {
    uint64_t ctx = 0;
    int src = -1, dst = -1;
    Channel* c = nullptr;
  };
  constexpr size_t kChannelSlots = size_t{1} << 13;
  std::vector<ChannelSlot> channels(kChannelSlots);
  auto channel_of = [&](uint64_t ctx, int src, int dst) -> Channel& {
    const uint64_t h = (ctx ^ (static_cast<uint64_t>(static_cast<uint32_t>(src)) << 20) ^ static_cast<uint32_t>(dst)) *
                       0x9E3779B97F4A7C15ull;
    ChannelSlot& e = channels[static_cast<size_t>(h >> 51)];  // the top 13 bits
    if (e.c == nullptr || e.ctx != ctx || e.src != src || e.dst != dst)
      e = ChannelSlot{ctx, src, dst, channel(ctx, src, dst)};
    return *e.c;
  };
  auto mpi_failed = [&](int rc, const char* call) {
    if (rc == MPI_SUCCESS) return false;
    set_failure(fmt::format("process {}: {} failed: {}", proc_, call, mpi_error(rc)), true);
    return true;
  };

  for (;;) {
    bool active = false;
    const int mode = mode_.load();
    // 1. queued bundles, per destination process in posting order: one MPI message each
    {
      std::lock_guard lk(out_m_);
      if (out_pending_) outs.swap(out_);
      out_pending_ = false;
    }
    for (size_t to = 0; to < outs.size(); ++to) {
      for (WireBytes& bundle : outs[to]) {
        active = true;
        inflight.push_back(Inflight{MPI_REQUEST_NULL, std::move(bundle), true});
        Inflight& f = inflight.back();
        if (mpi_failed(MPI_Isend(f.buf.data(), static_cast<int>(f.buf.size()), MPI_BYTE, static_cast<int>(to),
                                 kTagData, comm_, &f.req),
                       "MPI_Isend"))
          break;
      }
      outs[to].clear();
    }
    // 2. failure notices to the other processes (once)
    if (failed_.load() && tell_others_ && !aborts_sent) {
      aborts_sent = true;
      const std::string msg = failure();
      for (int p = 0; p < nproc_; ++p) {
        if (p == proc_) continue;
        inflight.push_back(Inflight{MPI_REQUEST_NULL, WireBytes(msg.begin(), msg.end()), false});
        Inflight& b = inflight.back();
        MPI_Isend(b.buf.data(), static_cast<int>(b.buf.size()), MPI_BYTE, p, kTagAbort, comm_, &b.req);
      }
    }
    // 3. completed sends: one MPI_Testsome for all (each MPI test call runs the library's progress engine, which
    // yields the core when oversubscribed: one call per request would yield hundreds of times per pass)
    if (!inflight.empty()) {
      reqs.clear();
      for (auto& f : inflight) reqs.push_back(f.req);
      idx.resize(reqs.size());
      int done = 0;
      if (mpi_failed(MPI_Testsome(static_cast<int>(reqs.size()), reqs.data(), &done, idx.data(), MPI_STATUSES_IGNORE),
                     "MPI_Testsome"))
        inflight.clear();
      else if (done != MPI_UNDEFINED && done > 0) {
        active = true;
        size_t i = 0;
        for (auto it = inflight.begin(); it != inflight.end(); ++i)
          it = reqs[i] == MPI_REQUEST_NULL ? inflight.erase(it) : std::next(it);
      }
    }
    // 4. arrivals: matched with MPI_Improbe, received with MPI_Imrecv (never a blocking receive: a sender that dies
    // mid-message must not block this thread), handled in match order per source (chunk and FIFO order).
    for (int budget = 0; budget < 256; ++budget) {
      int flag = 0;
      MPI_Message mh;
      MPI_Status st;
      if (mpi_failed(MPI_Improbe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, &mh, &st), "MPI_Improbe") || !flag) break;
      active = true;
      int bytes = 0;
      if (MPI_Get_count(&st, MPI_BYTE, &bytes) != MPI_SUCCESS || bytes < 0) bytes = 0;  // MPI_UNDEFINED: none
      auto& q = recvs[static_cast<size_t>(st.MPI_SOURCE)];
      q.push_back(Arrival{MPI_REQUEST_NULL, st.MPI_TAG, std::make_shared<WireBytes>(static_cast<size_t>(bytes))});
      if (mpi_failed(MPI_Imrecv(q.back().buf->data(), bytes, MPI_BYTE, &mh, &q.back().req), "MPI_Imrecv")) break;
    }
    // completed receives (one MPI_Testsome), handled per source in match order
    reqs.clear();
    waiting.clear();
    for (auto& q : recvs)
      for (Arrival& a : q)
        if (!a.done) reqs.push_back(a.req), waiting.push_back(&a);
    if (!reqs.empty()) {
      idx.resize(reqs.size());
      int done = 0;
      if (!mpi_failed(MPI_Testsome(static_cast<int>(reqs.size()), reqs.data(), &done, idx.data(), MPI_STATUSES_IGNORE),
                      "MPI_Testsome") &&
          done != MPI_UNDEFINED)
        for (int i = 0; i < done; ++i) {
          Arrival& a = *waiting[static_cast<size_t>(idx[static_cast<size_t>(i)])];
          a.done = true;
          a.req = MPI_REQUEST_NULL;
        }
    }
    for (int from = 0; from < nproc_; ++from) {
      auto& q = recvs[static_cast<size_t>(from)];
      while (!q.empty()) {
        if (!q.front().done) break;
        active = true;
        heard[static_cast<size_t>(from)] = Clock::now();
        Arrival a = std::move(q.front());
        q.pop_front();
        const WireBytes& buf = *a.buf;
        if (a.tag == kTagAbort) {
          set_failure(fmt::format("{} failed: {}", describe_process(from), notice_text(buf)), true);
        } else if (a.tag == kTagData) {
          try {
            reassembly.take_bundle(from, buf.data(), buf.size(), [&](Delivery&& d) {
              if (d.in_place) {
                deliver(channel_of(d.ctx, d.src, d.dst), d.msg.sig, d.view, d.view_size, a.buf, nullptr);
              } else {
                auto whole = std::make_shared<const std::vector<char>>(std::move(d.msg.data));
                const char* at = whole->data();
                const size_t n = whole->size();
                deliver(channel_of(d.ctx, d.src, d.dst), d.msg.sig, at, n, std::move(whole), nullptr);
              }
            });
          } catch (const Error& e) {
            set_failure(e.what(), true);
          } catch (const std::bad_alloc&) {
            set_failure(fmt::format("mpi: out of memory reassembling a message from {}", describe_process(from)),
                        true);
          }
        } else if (a.tag == kTagHeartbeat) {
          if (!buf.empty())
            set_failure(fmt::format("mpi: {} sent a malformed heartbeat ({} bytes; a heartbeat is empty)",
                                    describe_process(from), buf.size()),
                        true);
        } else {
          set_failure(fmt::format("mpi: {} sent a message with unknown tag {}", describe_process(from), a.tag), true);
        }
      }
    }
    // 5. heartbeats and liveness (until the final barrier completed), ranks past the wait limit
    if (mode == 2) {
      // failure end: give the notices up to a second, then leave (requests are abandoned with the process)
      if (stop_at == Clock::time_point::max()) stop_at = Clock::now() + std::chrono::seconds(1);
      bool pending = false;
      for (const auto& f : inflight) pending |= !f.data;
      if ((aborts_sent || !tell_others_) && (!pending || Clock::now() > stop_at)) return;
      if (Clock::now() > stop_at) return;
    } else {
      if (seconds_since(last_hb) >= opt_.heartbeat_s) {
        last_hb = Clock::now();
        wake_overdue();
        for (int p = 0; p < nproc_; ++p) {
          if (p == proc_) continue;
          inflight.push_back(Inflight{MPI_REQUEST_NULL, {}, false});
          MPI_Isend(nullptr, 0, MPI_BYTE, p, kTagHeartbeat, comm_, &inflight.back().req);
        }
      }
      if (!failed_.load())
        for (int p = 0; p < nproc_; ++p) {
          if (p == proc_) continue;
          const double quiet = seconds_since(heard[static_cast<size_t>(p)]);
          if (quiet > opt_.peer_timeout_s) {
            set_failure(fmt::format("{} sent nothing for {:.1f} s (no heartbeat): it died, was stopped or is "
                                    "unreachable (--mpi-peer-timeout {})",
                                    describe_process(p), quiet, opt_.peer_timeout_s),
                        true);
            break;
          }
        }
      if (mode == 1 && !failed_.load()) {
        bool data_pending = false;
        for (const auto& f : inflight) data_pending |= f.data;
        std::lock_guard lk(out_m_);
        data_pending |= out_pending_;
        if (!barrier_posted && !data_pending) {
          mpi_failed(MPI_Ibarrier(comm_, &barrier), "MPI_Ibarrier");
          barrier_posted = true;
        }
      }
      if (barrier_posted && !failed_.load()) {
        int flag = 0;
        if (!mpi_failed(MPI_Test(&barrier, &flag, MPI_STATUS_IGNORE), "MPI_Test") && flag) {
          for (auto& f : inflight) MPI_Request_free(&f.req);  // heartbeats to live peers complete on their own
          for (auto& q : recvs)  // matched heartbeats: complete (eager, the senders are alive) or released
            for (auto& a : q) {
              int f = 0;
              for (auto t = Clock::now(); !f && seconds_since(t) < 1.0;) MPI_Test(&a.req, &f, MPI_STATUS_IGNORE);
              if (!f) MPI_Request_free(&a.req);
            }
          done_.store(true);
          return;
        }
      }
    }
    // 6. idle: back off (20 us .. 1 ms); a local post wakes us at once
    if (active) {
      backoff = std::chrono::microseconds(20);
    } else {
      std::unique_lock lk(out_m_);
      if (!out_pending_ && mode_.load() == mode) out_cv_.wait_for(lk, backoff);
      backoff = std::min(backoff * 2, std::chrono::microseconds(1000));
    }
  }
}

}  // namespace trident::mpi
