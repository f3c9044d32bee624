// NcclCommunicator: parallel/comm.h over an NCCL implementation (gpu/nccl/nccl_api.h): the real library loaded
// with dlopen, or the fake NCCL over the emulator (emulator/fake_nccl.h), which runs this same code on CPU threads.
//
//   split          -> ncclCommSplit (the child inherits blocking mode, deadline and watchdog)
//   send/recv      -> ncclSend/ncclRecv; group_start/end -> ncclGroupStart/End; all_to_allv is grouped send/recv
//   exact_sum      -> lowered onto an ncclInt64 sum by Communicator (native_exact_sum() is false)
//   exact_* moves  -> ncclUint8, dtype_size(t) bytes per element
// Every NCCL call goes through one checker: kInProgress (non-blocking communicators) is polled with
// ncclCommGetAsyncError until it settles or the deadline passes (then the communicator is aborted); any other
// error throws trident::Error naming the rank, the communicator, the call site, NCCL's last error and the ring of
// the communicator's last operations with their call sites. A process-wide watchdog thread polls every live
// communicator's async error; on an error it aborts the communicator (ncclCommAbort), so a rank waiting on its
// stream is released, and the next call on that communicator throws the report. The watchdog and the owning thread
// share a lock around every NCCL call on the communicator (ncclCommAbort frees it): the watchdog skips a poll while
// the owner is inside a call, so a call blocked inside NCCL is released only on a non-blocking communicator (the
// default), whose calls return at once and are polled.
#pragma once
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gpu/nccl/nccl_api.h"
#include "parallel/comm.h"

namespace trident {

struct NcclOptions {
  bool blocking = false;                             // ncclConfig_t::blocking of every communicator
  std::chrono::milliseconds deadline{300'000};       // an operation still in progress after this fails
  std::chrono::milliseconds watchdog_period{100};    // async-error polling period (0: no watchdog)
  size_t ring_size = 16;                             // operations remembered for reports
};

class NcclCommunicator final : public Communicator {
 public:
  // Collective over the nranks callers passing the same id (ncclCommInitRank). `dev` maps Streams to the
  // backend's stream handles (Device::native_stream). Throws trident::Error on failure.
  static std::unique_ptr<NcclCommunicator> init(const nccl::Api& api, const nccl::UniqueId& id, int nranks, int rank,
                                                Device& dev, std::string name, const NcclOptions& opts = {},
                                                loc_t loc = loc_t::current());
  ~NcclCommunicator() override;  // ncclCommDestroy (nothing after an abort); never throws

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const nccl::Api& api() const { return api_; }
  nccl::Comm handle() const { return comm_; }
  // The last operations, oldest first, one per line: "#seq op count x dtype [peer/root] at file:line".
  std::string recent_ops() const;
  // True once the watchdog (or the deadline checker) aborted this communicator.
  bool aborted() const { return aborted_.load(); }

 protected:
  void do_collective(const CollArgs& a, Stream s, loc_t loc) override;
  void do_send(const void* buf, size_t count, DataType t, int peer, Stream s, loc_t loc) override;
  void do_recv(void* buf, size_t count, DataType t, int peer, Stream s, loc_t loc) override;
  void do_group_start(loc_t loc) override;
  void do_group_end(loc_t loc) override;
  std::unique_ptr<Communicator> do_split(int color, int key, std::string name, loc_t loc) override;
  // The lowering of exact_sum packs and unpacks on dev's streams (kernels on a CUDA device).
  Device* lowering_device() override { return &dev_; }

 private:
  friend struct NcclWatchdog;
  NcclCommunicator(const nccl::Api& api, nccl::Comm comm, Device& dev, std::string name, const NcclOptions& opts);
  // The one checker (see the top of this file).
  void check(nccl::Result r, const char* call, loc_t loc);
  [[noreturn]] void raise(const std::string& what, loc_t loc);
  void remember(std::string what, loc_t loc);
  void throw_if_aborted(loc_t loc);
  // NCCL's last error for this communicator ("" once aborted: ncclCommAbort freed it); takes the call lock.
  std::string last_error();
  // Runs one NCCL call on comm_ (f) under the call lock, after checking that the communicator was not aborted.
  template <class F>
  nccl::Result locked(F&& f, loc_t loc);
  void abort_locked(std::string why);  // records why, marks aborted, ncclCommAbort; the call lock held
  void watchdog_poll();  // called by the watchdog thread

  const nccl::Api& api_;
  nccl::Comm comm_;
  Device& dev_;
  NcclOptions opts_;
  int rank_ = 0, size_ = 0;
  std::atomic<bool> aborted_{false};
  // The call lock: held by the owning thread around each NCCL call on comm_ (and each poll of an operation in
  // progress), and by the watchdog around its poll and abort, so that ncclCommAbort (which frees the communicator)
  // never runs during, or between the owner's abort check and, a call on it. Taken before mu_.
  std::mutex call_mu_;
  mutable std::mutex mu_;       // guards ring_, abort_reason_
  std::string abort_reason_;
  struct Op {
    int64_t seq;
    std::string what;
    const char* file;
    unsigned line;
  };
  std::vector<Op> ring_;
  int64_t seq_ = 0;
};

}  // namespace trident
