// A fake NCCL implemented over the emulator: the entry points of gpu/nccl/nccl_api.h running on emulated ranks, so
// that NcclCommunicator (gpu/nccl/nccl_comm.h) — the communicator of the CUDA path — runs its own code on CPU
// threads, in CI, under the emulator's mismatch and deadlock detection, with the emulator's bits.
//
// Each rank thread binds its RankContext with a FakeNcclScope. ncclCommInitRank over the whole world returns the
// rank's world communicator; ncclCommSplit creates emulated sub-communicators (named through set_next_comm_name);
// streams are the rank's Device streams (Device::native_stream's default encoding). ncclGroupStart/End map to
// the emulator's group on each communicator used inside the group. Non-blocking communicators report every
// operation kInProgress once before it settles, so NcclCommunicator's polling path runs too. Errors raised by
// the emulator (a mismatch, a deadlock, a failed peer) become kSystemError with the report as ncclGetLastError.
//
// Like the real library, an id serves one ncclCommInitRank per rank (a reused id is refused with kInvalidUsage),
// and ncclCommAbort frees the communicator: any later call on the handle, an abort during another call on it, or
// a second abort is an unsafe use, refused and counted (fake_nccl_stats), so tests can demand none.
//
// Limits: one world per id (ncclCommInitRank over a subset of ranks is refused: use ncclCommSplit), collectives
// inside a group run at once (the step groups only send/recv).
#pragma once
#include <memory>
#include <mutex>
#include <optional>

#include "emulator/world.h"
#include "gpu/nccl/nccl_api.h"
#include "gpu/nccl/nccl_bootstrap.h"
#include "gpu/nccl/nccl_comm.h"

namespace trident::emu {

const nccl::Api& fake_nccl();

// Binds the calling rank thread to ctx for the fake's entry points. Communicators created through the fake on
// this thread that were aborted rather than destroyed are freed when the scope ends.
class FakeNcclScope {
 public:
  explicit FakeNcclScope(RankContext& ctx);
  ~FakeNcclScope();
  FakeNcclScope(const FakeNcclScope&) = delete;
  FakeNcclScope& operator=(const FakeNcclScope&) = delete;
};

// Fault injection for tests, on one fake communicator.
enum class FakeFault {
  none,
  async_error,   // ncclCommGetAsyncError reports ncclRemoteError from now on (the watchdog aborts the comm)
  stuck,         // every later operation stays kInProgress forever (the deadline checker aborts the comm)
  error_during_call,  // the next operation raises async_error as it starts and takes 50 ms more to return (an
                      // abort that does not wait for the caller frees the communicator during the call)
};
void fake_nccl_inject(nccl::Comm comm, FakeFault f);

// Process-wide counts: communicators destroyed (ncclCommDestroy after a finalize), aborted (ncclCommAbort), and
// unsafe uses (a call on a handle after ncclCommAbort freed it, an abort during a call on it, a second abort).
struct FakeNcclStats {
  int64_t destroyed = 0, aborted = 0, unsafe_uses = 0;
};
FakeNcclStats fake_nccl_stats();

// The world communicator of every rank of one emulated run, as an NcclCommunicator over the fake NCCL: the first
// rank to call world() makes the unique id and the others take it (no rank waits for another outside the
// communicator: ranks may be fibers sharing a thread). One object per run, shared by the ranks; world() is
// called once on each rank inside a FakeNcclScope.
class FakeNcclWorld {
 public:
  explicit FakeNcclWorld(NcclOptions opts = {}) : opts_(opts) {}
  std::unique_ptr<NcclCommunicator> world(RankContext& ctx);

 private:
  NcclOptions opts_;
  std::mutex id_mu_;
  std::optional<nccl::UniqueId> id_;
};

}  // namespace trident::emu
