// The MPI transport (mpi/fabric.h, docs/mpi.md).
#include "mpi/fabric.h"

#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <list>

#include "platform/memory_info.h"
#include "reference/check.h"

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

}  // namespace

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
  for (int i = 0; i < k_; ++i) boxes_.push_back(std::make_unique<Mailbox>());
  // Every process started: a barrier with a deadline (a process that never arrives is named by its absence).
  MPI_Request req;
  MPI_Ibarrier(comm_, &req);
  const auto t0 = Clock::now();
  for (int flag = 0; !flag;) {
    MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
    if (!flag && seconds_since(t0) > std::max(60.0, opt_.peer_timeout_s))
      trident::fail(fmt::format("mpi: not every process of {} reached startup within {:.0f} s", nproc_,
                       std::max(60.0, opt_.peer_timeout_s)));
    if (!flag) std::this_thread::sleep_for(std::chrono::microseconds(200));
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
  for (auto& b : boxes_) {
    std::lock_guard lk(b->m);
    b->cv.notify_all();
  }
  out_cv_.notify_all();
}

void Fabric::fail(const std::string& msg) { set_failure(msg, true); }

void Fabric::deliver(uint64_t ctx, int src, int dst, Msg&& m) {
  Mailbox& b = *boxes_[static_cast<size_t>(dst - first_rank())];
  std::lock_guard lk(b.m);
  b.q[{ctx, src}].push_back(std::move(m));
  if (b.waiting && b.want == std::make_pair(ctx, src)) b.cv.notify_all();
}

void Fabric::post(uint64_t ctx, int src, int dst, uint32_t sig, const void* data, size_t bytes) {
  TD_CHECK(dst >= 0 && dst < world(), "mpi: destination rank {} out of range [0, {})", dst, world());
  if (failed_.load()) trident::fail(fmt::format("rank {}: {}", src, failure()));
  if (process_of(dst) == proc_) {
    Msg m;
    m.sig = sig;
    m.data.assign(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
    deliver(ctx, src, dst, std::move(m));
    return;
  }
  Out o{ctx, src, dst, sig, std::vector<char>(static_cast<const char*>(data), static_cast<const char*>(data) + bytes)};
  {
    std::lock_guard lk(out_m_);
    outq_.push_back(std::move(o));
  }
  out_cv_.notify_all();
}

Msg Fabric::take(uint64_t ctx, int src, int dst, const std::string& what) {
  Mailbox& b = *boxes_[static_cast<size_t>(dst - first_rank())];
  std::unique_lock lk(b.m);
  const auto t0 = Clock::now();
  for (;;) {
    auto it = b.q.find({ctx, src});
    if (it != b.q.end() && !it->second.empty()) {
      Msg m = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty()) b.q.erase(it);
      return m;
    }
    if (failed_.load()) {
      lk.unlock();
      trident::fail(fmt::format("rank {}: {} (while waiting for {} from rank {})", dst, failure(), what, src));
    }
    if (seconds_since(t0) > opt_.wait_timeout_s) {
      lk.unlock();
      const std::string msg = fmt::format(
          "rank {} waited {:.0f} s for {} from rank {} on {}: that rank is stuck or issued different calls "
          "(--mpi-wait-timeout)",
          dst, opt_.wait_timeout_s, what, src, describe_process(process_of(src)));
      fail(msg);
      trident::fail(msg);
    }
    b.waiting = true;
    b.want = {ctx, src};
    b.cv.wait_for(lk, std::chrono::milliseconds(50));
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
    std::vector<char> buf;
    bool data;  // a data chunk (shutdown waits for these), else a heartbeat or abort notice
  };
  std::list<Inflight> inflight;
  struct Arrival {
    MPI_Request req;
    int tag;
    std::vector<char> buf;
  };
  std::vector<std::deque<Arrival>> recvs(static_cast<size_t>(nproc_));  // per source, in match order
  Reassembler reassembly(WireLayout{nproc_, k_, proc_, chunk_});  // checks every chunk (mpi/wire.h)
  std::vector<Clock::time_point> heard(static_cast<size_t>(nproc_), Clock::now());
  auto last_hb = Clock::now() - std::chrono::hours(1);
  bool aborts_sent = false, barrier_posted = false;
  MPI_Request barrier{};
  auto stop_at = Clock::time_point::max();
  auto backoff = std::chrono::microseconds(20);
  auto mpi_failed = [&](int rc, const char* call) {
    if (rc == MPI_SUCCESS) return false;
    set_failure(fmt::format("process {}: {} failed: {}", proc_, call, mpi_error(rc)), true);
    return true;
  };

  for (;;) {
    bool active = false;
    const int mode = mode_.load();
    // 1. queued sends, in order, chunked
    std::deque<Out> outs;
    {
      std::lock_guard lk(out_m_);
      outs.swap(outq_);
    }
    for (Out& o : outs) {
      active = true;
      const uint64_t total = o.data.size();
      uint64_t off = 0;
      do {
        const uint64_t n = std::min<uint64_t>(chunk_, total - off);
        Header h{o.ctx, o.src, o.dst, o.sig, 0, total, off};
        Inflight f{MPI_REQUEST_NULL, std::vector<char>(sizeof(Header) + n), true};
        std::memcpy(f.buf.data(), &h, sizeof h);
        if (n) std::memcpy(f.buf.data() + sizeof h, o.data.data() + off, n);
        inflight.push_back(std::move(f));
        Inflight& b = inflight.back();
        if (mpi_failed(MPI_Isend(b.buf.data(), static_cast<int>(b.buf.size()), MPI_BYTE, process_of(o.dst),
                                 kTagData, comm_, &b.req),
                       "MPI_Isend"))
          break;
        off += n;
      } while (off < total);
    }
    // 2. failure notices to the other processes (once)
    if (failed_.load() && tell_others_ && !aborts_sent) {
      aborts_sent = true;
      const std::string msg = failure();
      for (int p = 0; p < nproc_; ++p) {
        if (p == proc_) continue;
        inflight.push_back(Inflight{MPI_REQUEST_NULL, std::vector<char>(msg.begin(), msg.end()), false});
        Inflight& b = inflight.back();
        MPI_Isend(b.buf.data(), static_cast<int>(b.buf.size()), MPI_BYTE, p, kTagAbort, comm_, &b.req);
      }
    }
    // 3. completed sends
    for (auto it = inflight.begin(); it != inflight.end();) {
      int flag = 0;
      if (mpi_failed(MPI_Test(&it->req, &flag, MPI_STATUS_IGNORE), "MPI_Test")) flag = 1;
      if (flag) {
        it = inflight.erase(it);
        active = true;
      } else {
        ++it;
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
      q.push_back(Arrival{MPI_REQUEST_NULL, st.MPI_TAG, std::vector<char>(static_cast<size_t>(bytes))});
      if (mpi_failed(MPI_Imrecv(q.back().buf.data(), bytes, MPI_BYTE, &mh, &q.back().req), "MPI_Imrecv")) break;
    }
    for (int from = 0; from < nproc_; ++from) {
      auto& q = recvs[static_cast<size_t>(from)];
      while (!q.empty()) {
        int flag = 0;
        if (mpi_failed(MPI_Test(&q.front().req, &flag, MPI_STATUS_IGNORE), "MPI_Test") || !flag) break;
        active = true;
        heard[static_cast<size_t>(from)] = Clock::now();
        Arrival a = std::move(q.front());
        q.pop_front();
        const std::vector<char>& buf = a.buf;
        if (a.tag == kTagAbort) {
          set_failure(fmt::format("{} failed: {}", describe_process(from), notice_text(buf)), true);
        } else if (a.tag == kTagData) {
          try {
            if (std::optional<Delivery> d = reassembly.take(from, buf))
              deliver(d->ctx, d->src, d->dst, std::move(d->msg));
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
    // 5. heartbeats and liveness (until the final barrier completed)
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
        data_pending |= !outq_.empty();
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
      if (outq_.empty() && mode_.load() == mode) out_cv_.wait_for(lk, backoff);
      backoff = std::min(backoff * 2, std::chrono::microseconds(1000));
    }
  }
}

}  // namespace trident::mpi
