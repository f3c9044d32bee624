// The emulator: a world of fake ranks (user-space fibers on a few worker threads, or one thread each) in this process, with a Communicator and a Device per
// rank. Collectives and send/recv execute eagerly on the calling rank's thread and copy directly between the
// ranks' buffers; every call is checked against the other ranks' calls, and blocked states are watched so
// that a mismatch or a deadlock fails every involved rank with one report instead of hanging (docs/emulator.md).
//
//   trident::emu::spawn(8, [&](trident::emu::RankContext& ctx) {
//     auto& world = ctx.world();
//     world.all_reduce(x.data(), x.data(), x.size(), trident::DataType::f32, trident::ReduceOp::sum);
//   });
#pragma once
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "emulator/device.h"
#include "parallel/comm.h"
#include "parallel/trace.h"
#include "reference/check.h"

namespace trident::emu {

// How ranks execute (docs/emulator.md section 4). fibers: each rank is a user-space fiber pinned to one of a few
// worker threads; a rank that blocks in a communicator call switches to the next runnable rank of its worker (no
// system call), so a collective costs about a microsecond per rank instead of a kernel wake-up. A rank that
// computes (or sleeps) holds its worker meanwhile. threads: one OS thread per rank, as before.
enum class RankExec { fibers, threads };

struct SpawnOptions {
  RankExec exec = RankExec::fibers;
  int workers = 0;                  // fibers: worker threads (0: min(hardware threads, world size)); rank r runs on r % workers
  size_t stack_bytes = 256 * 1024;  // per rank (thread or fiber; raise it for deep recursion or sanitizers)
  // A rank blocked in a communicator call while nothing anywhere made progress for this long fails, with a
  // report of every rank's state (covers a rank stuck in compute, which deadlock detection cannot see).
  std::chrono::milliseconds watchdog{60'000};
  bool record_trace = true;  // record per-stream traces (RankContext::trace)
  // Collectives that read at most this many bytes per rank use the eager protocol (inputs staged in the
  // rendezvous, no completion barrier); larger ones copy directly between the ranks' buffers. A parameter so
  // tests run both paths (0: always direct).
  size_t eager_bytes = 32 * 1024;  // staging memory per rank and communicator is at most 2x this
  // Each rank's Device: eager or deferred execution, hazard checking (emulator/device.h). record_trace above
  // overrides device.record_trace.
  DeviceOptions device;
  // exact_sum is merged natively (accumulators combined in rank order). true: every communicator reports no
  // native exact_sum, so Communicator lowers it onto i64 sums (parallel/exact_lowering.h), as on NCCL; same bits.
  bool lower_exact_sum = false;
  // Test hook (`trident fuzz`'s planted communicator bug, docs/fuzz.md section 5): in every collective `drop_op` of
  // `drop_count` elements, communicator rank 1 contributes zeros instead of its input. 0: off (every real run).
  CollOp drop_op = CollOp::all_reduce;
  size_t drop_count = 0;
};

struct World;
struct RankState;
class EmuDevice;

// What a rank's function gets.
class RankContext {
 public:
  int rank() const;
  int world_size() const;
  Communicator& world();  // all ranks, name "world"
  Device& device();       // streams and events of this rank
  Stream compute_stream() { return device().compute_stream(); }
  Stream comm_stream() { return device().comm_stream(); }
  // This rank's counters of every communicator it has used (live and destroyed), by communicator name.
  CommStats stats() const;
  const RankTrace& trace() const;

  RankContext(World& w, RankState& r);
  ~RankContext();

 private:
  World& w_;
  RankState& r_;
  std::unique_ptr<Device> dev_;  // declared before world_: destroyed after it
  std::unique_ptr<Communicator> world_;
};

struct RankResult {
  CommStats stats;
  RankTrace trace;
};
struct SpawnResult {
  std::vector<RankResult> ranks;  // by world rank
  CommStats total() const;        // summed over ranks
};

// Thrown by spawn() when a rank failed: the first failure (in time), with the rank and its original message.
struct RankError : Error {
  RankError(int rank, std::string original, int failed_ranks);
  int rank;
  std::string original;  // the rank's exception message, unchanged
  int failed_ranks;      // how many ranks failed in total (the others usually as a consequence)
};

// A pointer slot that belongs to the calling rank (nullptr outside spawn's ranks), for state that rank code would
// otherwise keep in a thread_local across communicator calls: with RankExec::fibers several ranks share a worker
// thread and switch at every blocking call, so a thread_local set by one rank would be seen by the next one.
// (The fake NCCL's per-rank binding lives here.)
void** rank_local_slot();

// Runs fn on world_size ranks (SpawnOptions::exec) and joins them. Rethrows the first failure as RankError. Every call
// creates a fresh world; nothing is left behind after a failure.
SpawnResult spawn(int world_size, const std::function<void(RankContext&)>& fn, const SpawnOptions& opts = {});

}  // namespace trident::emu
