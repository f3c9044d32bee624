#include "gpu/nccl/nccl_comm.h"

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <set>
#include <thread>

#include "reference/check.h"

namespace trident {

using nccl::Result;

// ---- the process-wide watchdog ----------------------------------------------------------------------------------
// One thread polls every live communicator that asked for a watchdog; it runs while at least one is registered.
// The state is never destroyed (a detached thread may still be leaving when static destructors run).
struct NcclWatchdog {
  std::mutex mu;
  std::condition_variable cv;
  std::set<NcclCommunicator*> comms;
  std::chrono::milliseconds period{100};
  bool running = false;

  static NcclWatchdog& get() {
    static auto* w = new NcclWatchdog;
    return *w;
  }
  void add(NcclCommunicator* c, std::chrono::milliseconds p) {
    std::lock_guard lk(mu);
    comms.insert(c);
    period = std::min(period, p);
    if (!running) {
      running = true;
      std::thread([this] { loop(); }).detach();
    }
  }
  void remove(NcclCommunicator* c) {
    std::unique_lock lk(mu);
    comms.erase(c);
    cv.notify_all();
  }
  void loop() {
    std::unique_lock lk(mu);
    while (!comms.empty()) {
      // Polled under the lock: remove() waits for a poll in progress, so a communicator is never polled after its
      // destructor started.
      for (NcclCommunicator* c : comms) c->watchdog_poll();
      cv.wait_for(lk, period);
    }
    running = false;
    period = std::chrono::milliseconds{100};
  }
};

namespace {

nccl::DType nccl_type(DataType t, size_t* scale) {
  *scale = 1;
  switch (t) {
    case DataType::f64: return nccl::kFloat64;
    case DataType::f32: return nccl::kFloat32;
    case DataType::bf16: return nccl::kBfloat16;
    case DataType::i32: return nccl::kInt32;
    case DataType::i64: return nccl::kInt64;
    case DataType::u8: return nccl::kUint8;
    case DataType::exact_f32:
    case DataType::exact_f64: *scale = dtype_size(t); return nccl::kUint8;  // moved as opaque bytes
  }
  return nccl::kUint8;
}
nccl::RedOp nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return nccl::kSum;
    case ReduceOp::max: return nccl::kMax;
    case ReduceOp::min: return nccl::kMin;
    case ReduceOp::exact_sum: break;  // lowered by Communicator before it reaches a backend without native support
  }
  fail("NcclCommunicator: exact_sum reached the backend (it must be lowered onto an i64 sum)");
}
// Polls a non-blocking communicator until its pending operation settles or the deadline passes; returns the
// settled result (kInProgress at the deadline).
Result settle(const nccl::Api& api, nccl::Comm c, std::chrono::milliseconds deadline) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  Result st = nccl::kInProgress, r;
  while ((r = api.comm_get_async_error(c, &st)) == nccl::kSuccess && st == nccl::kInProgress &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  return r == nccl::kSuccess ? st : r;
}
std::string site(std::source_location loc) {
  return fmt::format("{}:{}", std::filesystem::path(loc.file_name()).filename().string(), loc.line());
}

}  // namespace

NcclCommunicator::NcclCommunicator(const nccl::Api& api, nccl::Comm comm, Device& dev, std::string name,
                                   const NcclOptions& opts)
    : Communicator(std::move(name)), api_(api), comm_(comm), dev_(dev), opts_(opts) {
  TD_CHECK(opts_.ring_size >= 1, "NcclOptions: ring_size must be >= 1");
  TD_CHECK(opts_.deadline.count() > 0, "NcclOptions: deadline must be positive (got {} ms)", opts_.deadline.count());
  ring_.reserve(opts_.ring_size);
  // rank and size are queried once; a failure here leaves nothing registered
  Result r = api_.comm_user_rank(comm_, &rank_);
  if (r == nccl::kSuccess) r = api_.comm_count(comm_, &size_);
  if (r != nccl::kSuccess) {
    api_.comm_abort(comm_);
    fail(fmt::format("NCCL communicator '{}': ncclCommUserRank/ncclCommCount failed: {}", this->name(),
                     nccl::to_string(r)));
  }
  if (opts_.watchdog_period.count() > 0) NcclWatchdog::get().add(this, opts_.watchdog_period);
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::init(const nccl::Api& api, const nccl::UniqueId& id, int nranks,
                                                         int rank, Device& dev, std::string name,
                                                         const NcclOptions& opts, loc_t loc) {
  TD_CHECK(nranks >= 1 && rank >= 0 && rank < nranks, "NCCL init: rank {} of {} ranks is out of range", rank, nranks);
  nccl::Comm c = nullptr;
  Result r = api.comm_init_rank(&c, nranks, id, rank, opts.blocking ? 1 : 0);
  if (r == nccl::kInProgress && c) r = settle(api, c, opts.deadline);  // non-blocking init
  if (r != nccl::kSuccess) {
    const char* last = api.get_last_error(c);  // ncclGetLastError takes a null communicator
    if (c) api.comm_abort(c);
    fail(fmt::format("rank {}: ncclCommInitRank of '{}' ({} ranks, {}) at {} failed: {}{}{}", rank, name, nranks,
                     api.name, site(loc), r == nccl::kInProgress ? "still in progress at the deadline" :
                     nccl::to_string(r), last && *last ? ": " : "", last ? last : ""));
  }
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(api, c, dev, std::move(name), opts));
}

NcclCommunicator::~NcclCommunicator() {
  // After this the watchdog never polls this communicator (remove() waits for a poll in progress).
  if (opts_.watchdog_period.count() > 0) NcclWatchdog::get().remove(this);
  if (aborted_.load()) return;  // ncclCommAbort freed it
  // ncclCommFinalize flushes the communicator's operations; a non-blocking communicator answers ncclInProgress and
  // settles later (polled to the deadline). A finalize that fails (a peer died) or does not settle falls back to an
  // abort; errors are not thrown from a destructor.
  Result r = api_.comm_finalize(comm_);
  if (r == nccl::kInProgress) r = settle(api_, comm_, opts_.deadline);
  if (r == nccl::kSuccess) {
    api_.comm_destroy(comm_);
    return;
  }
  api_.comm_abort(comm_);
}

void NcclCommunicator::remember(std::string what, loc_t loc) {
  if (api_.set_call_site) api_.set_call_site(&loc);
  std::lock_guard lk(mu_);
  Op op{++seq_, std::move(what), loc.file_name(), loc.line()};
  if (ring_.size() < opts_.ring_size)
    ring_.push_back(std::move(op));
  else
    ring_[static_cast<size_t>((seq_ - 1) % static_cast<int64_t>(opts_.ring_size))] = std::move(op);
}

std::string NcclCommunicator::recent_ops() const {
  std::lock_guard lk(mu_);
  std::vector<const Op*> ops;
  for (const Op& o : ring_) ops.push_back(&o);
  std::sort(ops.begin(), ops.end(), [](const Op* a, const Op* b) { return a->seq < b->seq; });
  std::string s;
  for (const Op* o : ops)
    s += fmt::format("  #{} {} at {}:{}\n", o->seq, o->what, std::filesystem::path(o->file).filename().string(),
                     o->line);
  return s;
}

std::string NcclCommunicator::last_error() {
  std::lock_guard cl(call_mu_);
  if (aborted_.load()) return {};  // the communicator is gone (ncclCommAbort frees it)
  const char* last = api_.get_last_error(comm_);
  return last ? last : "";
}

void NcclCommunicator::raise(const std::string& what, loc_t loc) {
  const std::string last = last_error();
  fail(fmt::format("rank {} of NCCL communicator '{}' (size {}): {} at {}{}{}; last operations (oldest first):\n{}",
                   rank_, name(), size_, what, site(loc), last.empty() ? "" : "; NCCL: ", last, recent_ops()));
}

void NcclCommunicator::throw_if_aborted(loc_t loc) {
  if (!aborted_.load()) return;
  std::string why;
  {
    std::lock_guard lk(mu_);
    why = abort_reason_;
  }
  raise("communicator was aborted (" + why + ")", loc);
}

void NcclCommunicator::abort_locked(std::string why) {
  {
    std::lock_guard lk(mu_);
    abort_reason_ = std::move(why);
  }
  aborted_.store(true);
  api_.comm_abort(comm_);
}

template <class F>
Result NcclCommunicator::locked(F&& f, loc_t loc) {
  std::unique_lock cl(call_mu_);
  if (aborted_.load()) {
    cl.unlock();
    throw_if_aborted(loc);
  }
  return f();
}

void NcclCommunicator::check(Result r, const char* what, loc_t loc) {
  if (r == nccl::kInProgress) {
    const auto until = std::chrono::steady_clock::now() + opts_.deadline;
    Result st = nccl::kInProgress;
    for (;;) {
      {
        // One poll under the call lock, released between polls so that the watchdog can abort meanwhile.
        std::unique_lock cl(call_mu_);
        if (aborted_.load()) {
          cl.unlock();
          throw_if_aborted(loc);
        }
        r = api_.comm_get_async_error(comm_, &st);
        if (r != nccl::kSuccess || st != nccl::kInProgress) break;
        if (std::chrono::steady_clock::now() >= until) {
          abort_locked(fmt::format("{} still in progress after {} ms", what, opts_.deadline.count()));
          cl.unlock();
          throw_if_aborted(loc);
        }
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (r == nccl::kSuccess) r = st;
  }
  if (r != nccl::kSuccess) raise(fmt::format("{} failed: {}", what, nccl::to_string(r)), loc);
  throw_if_aborted(loc);
}

void NcclCommunicator::watchdog_poll() {
  // The owner holds the call lock for each NCCL call on this communicator: an abort never lands between its check
  // of aborted_ and its call, or during the call (ncclCommAbort frees the communicator). A poll that finds the
  // owner inside a call is skipped; the next period polls again.
  std::unique_lock cl(call_mu_, std::try_to_lock);
  if (!cl.owns_lock() || aborted_.load()) return;
  Result st = nccl::kSuccess;
  const Result r = api_.comm_get_async_error(comm_, &st);
  if (r == nccl::kSuccess && (st == nccl::kSuccess || st == nccl::kInProgress)) return;
  abort_locked(
      fmt::format("the watchdog saw an asynchronous error: {}", nccl::to_string(r != nccl::kSuccess ? r : st)));
}

void NcclCommunicator::do_collective(const CollArgs& a, Stream s, loc_t loc) {
  throw_if_aborted(loc);
  size_t scale = 1;
  const nccl::DType t = nccl_type(a.dtype, &scale);
  const size_t n = a.count * scale;
  void* st = dev_.native_stream(s);
  remember(fmt::format("{} {} x {}{}", to_string(a.op), a.count, to_string(a.dtype),
                       a.root >= 0 ? fmt::format(" root {}", a.root) : std::string()),
           loc);
  Result r = nccl::kSuccess;
  const char* call = "";
  switch (a.op) {
    case CollOp::all_gather:
      call = "ncclAllGather";
      r = locked([&] { return api_.all_gather(a.send, a.recv, n, t, comm_, st); }, loc);
      break;
    case CollOp::reduce_scatter:
      call = "ncclReduceScatter";
      r = locked([&] { return api_.reduce_scatter(a.send, a.recv, n, t, nccl_op(a.redop), comm_, st); }, loc);
      break;
    case CollOp::all_reduce:
      call = "ncclAllReduce";
      r = locked([&] { return api_.all_reduce(a.send, a.recv, n, t, nccl_op(a.redop), comm_, st); }, loc);
      break;
    case CollOp::broadcast:
      call = "ncclBroadcast";
      r = locked([&] { return api_.broadcast(a.send, a.recv, n, t, a.root, comm_, st); }, loc);
      break;
    case CollOp::reduce:
      call = "ncclReduce";
      r = locked([&] { return api_.reduce(a.send, a.recv, n, t, nccl_op(a.redop), a.root, comm_, st); }, loc);
      break;
    default: fail(fmt::format("NcclCommunicator: {} is not a collective", to_string(a.op)));
  }
  check(r, call, loc);
}

void NcclCommunicator::do_send(const void* buf, size_t count, DataType t, int peer, Stream s, loc_t loc) {
  throw_if_aborted(loc);
  size_t scale = 1;
  const nccl::DType nt = nccl_type(t, &scale);
  remember(fmt::format("send {} x {} to {}", count, to_string(t), peer), loc);
  void* st = dev_.native_stream(s);
  check(locked([&] { return api_.send(buf, count * scale, nt, peer, comm_, st); }, loc), "ncclSend", loc);
}

void NcclCommunicator::do_recv(void* buf, size_t count, DataType t, int peer, Stream s, loc_t loc) {
  throw_if_aborted(loc);
  size_t scale = 1;
  const nccl::DType nt = nccl_type(t, &scale);
  remember(fmt::format("recv {} x {} from {}", count, to_string(t), peer), loc);
  void* st = dev_.native_stream(s);
  check(locked([&] { return api_.recv(buf, count * scale, nt, peer, comm_, st); }, loc), "ncclRecv", loc);
}

void NcclCommunicator::do_group_start(loc_t loc) {
  throw_if_aborted(loc);
  if (api_.set_call_site) api_.set_call_site(&loc);
  check(locked([&] { return api_.group_start(); }, loc), "ncclGroupStart", loc);
}

void NcclCommunicator::do_group_end(loc_t loc) {
  throw_if_aborted(loc);
  remember("group_end", loc);
  check(locked([&] { return api_.group_end(); }, loc), "ncclGroupEnd", loc);
}

std::unique_ptr<Communicator> NcclCommunicator::do_split(int color, int key, std::string name, loc_t loc) {
  throw_if_aborted(loc);
  remember(fmt::format("split color {} key {} -> '{}'", color, key, name), loc);
  if (api_.set_next_comm_name) api_.set_next_comm_name(name.c_str());
  nccl::Comm c = nullptr;
  Result r = locked([&] { return api_.comm_split(comm_, color < 0 ? nccl::kSplitNoColor : color, key, &c,
                                               opts_.blocking ? 1 : 0); }, loc);
  if (r == nccl::kInProgress && c) {  // a non-blocking split completes on the child
    r = settle(api_, c, opts_.deadline);
    if (r != nccl::kSuccess) api_.comm_abort(c);
    if (r == nccl::kInProgress)
      raise(fmt::format("ncclCommSplit still in progress after {} ms", opts_.deadline.count()), loc);
  }
  check(r, "ncclCommSplit", loc);
  if (!c) return nullptr;  // NCCL_SPLIT_NOCOLOR
  return std::unique_ptr<Communicator>(new NcclCommunicator(api_, c, dev_, std::move(name), opts_));
}

}  // namespace trident
