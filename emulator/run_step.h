// Runs the distributed step (parallel/step.h) on emulated ranks: spawns the world, builds the mesh
// communicators, runs N optimizer steps, and assembles every rank's shards into full tensors so they can be
// compared bit for bit with the single-rank reference (reference/model/train.h).
#pragma once
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "emulator/device.h"
#include "emulator/world.h"
#include "parallel/comm.h"
#include "parallel/layout.h"
#include "parallel/step.h"
#include "parallel/step_kernels.h"
#include "parallel/trace.h"
#include "reference/model/config.h"
#include "reference/model/model.h"
#include "reference/model/params.h"
#include "reference/model/train.h"

namespace trident::emu {

enum class CommBackend { emu, nccl_fake };
std::string_view to_string(CommBackend b);  // "emu", "nccl-fake"
std::string_view to_string(StepPlant p);    // "none", "zigzag-off-by-one", "chunk-drops-token"
StepPlant parse_plant(const std::string& s);  // the names above; throws trident::Error naming them otherwise
// "emu-drop:OP:COUNT" (the planted communicator, EmulateSpec::drop_count): op and count; throws trident::Error on
// another form, an unknown collective (all_gather, reduce_scatter, all_reduce, broadcast, reduce) or COUNT < 1.
std::pair<CollOp, size_t> parse_comm_drop(const std::string& s);

// One thread per rank: emulate() rejects larger meshes (docs/emulator.md gives the memory per rank).
inline constexpr int64_t kMaxEmulatedRanks = 65536;

struct EmulateSpec {
  model::Config cfg;
  std::string preset = "tiny";  // for repro(): the preset cfg came from (ignored when config_path is set)
  std::string config_path;      // for repro(): the config file cfg came from ("": the preset)
  model::RunConfig run;         // sequences, seq_len, steps, token_chunk, recompute, optimizer, data_seed
  MeshShape mesh;
  int64_t ep_chunks = 1;
  int64_t vocab_slices = 0;     // see StepShared::vocab_slices (0: one per vocab chunk)
  int64_t nvl = 8;              // GPUs per NVLink domain: bounds mesh.cp_inner (2D CP; `emulate --nvl`)
  std::vector<model::Batch> batches;  // one per step; empty: synthetic_batch(cfg, run, first_step + step)
  int64_t first_step = 0;       // synthetic data position: a run resumed after n steps starts at n
  // Initial values replacing ParamSet::init's for named tensors (e.g. router biases that force routing);
  // applied to the emulated run and to the reference alike.
  std::vector<std::pair<std::string, std::vector<double>>> overrides;
  bool keep_tensors = true;     // assemble full gradients and parameters after every step
  bool keep_state = false;      // every rank's optimizer state after the last step (EmulateResult::state)
  bool record_trace = false;    // per-stream traces of every rank (memory grows with ranks and steps)
  int watchdog_s = 600;
  // Each rank's Device (emulator/device.h): eager (default) or deferred execution with a seed; check_hazards runs
  // the stream-hazard checker in eager mode too. Every mode gives the same bits.
  DeviceOptions device;
  // Test hook: drop one event wait of the step (StepShared::skip_wait), to see the checker catch it.
  std::string skip_wait;
  // Test hook: a fault injected into the step (StepShared::fault); tests pair it with a short watchdog_ms.
  StepFault fault;
  int64_t watchdog_ms = 0;        // > 0: the emulator watchdog in milliseconds (overrides watchdog_s)
  size_t eager_bytes = 0;         // emulator small-call protocol threshold (0: SpawnOptions' default); each rank
                                  // keeps two staging buffers of up to this size per communicator
  bool lower_exact_sum = false;   // SpawnOptions::lower_exact_sum: run every exact_sum through the i64 lowering
  RankExec exec = RankExec::fibers;  // SpawnOptions::exec: ranks as fibers or threads (bits unchanged)
  int workers = 0;                   // SpawnOptions::workers (fibers; 0: one per hardware thread)
  // The communicator the step runs on: the emulator's own, or NcclCommunicator (the CUDA path's communicator,
  // gpu/nccl/nccl_comm.h) over the fake NCCL (emulator/fake_nccl.h). Same bits.
  CommBackend comm = CommBackend::emu;
  bool nccl_blocking = false;     // CommBackend::nccl_fake: blocking communicators (default: non-blocking)
  // Test hooks for `trident fuzz`'s planted bugs (docs/fuzz.md section 5); off in every real run. plant: a bug in the
  // step (StepShared::plant). drop_count > 0: the emulator's communicator drops rank 1's contribution to every
  // collective drop_op of drop_count elements (SpawnOptions::drop_op; CommBackend::emu only). Both print in repro()
  // (--plant NAME, --comm emu-drop:OP:COUNT), so the line fails alone the way the fuzzed run failed.
  StepPlant plant = StepPlant::none;
  CollOp drop_op = CollOp::all_reduce;
  size_t drop_count = 0;
  // Shapes only (docs/emulator.md "Shapes-only runs"): every rank's device has addresses and sizes but no data
  // (DeviceOptions::shapes_only), the communicator moves no bytes, the parameters are their layout only, and the EP
  // sizes come from `routing` (parse_routing: uniform, zipf:S, dirichlet:A, file:PATH; "" = uniform) or, when set,
  // from `replay` (counts a data run recorded). The schedule, the collectives' calls and bytes, the device memory
  // and the trace are the data run's; losses and norms are NaN. Needs the emulator's communicator, eager mode, no
  // kept tensors or state.
  bool shapes_only = false;
  std::string routing;
  const RoutingCounts* replay = nullptr;
  uint64_t routing_seed = 0;      // seeds the drawn routings (with the step, layer, rank and chunk)
  // A data run: record the router's counts into EmulateResult::routing (what --record-routing writes).
  bool record_routing = false;
  // Called by rank 0 after each step (progress display).
  std::function<void(int64_t step, const RankStepStats&)> progress;
  // Where world rank 0 is inside a step (forward layer, backward layer, optimizer), for progress lines; null: not
  // reported. Read by another thread while the step runs.
  StepProgress* where = nullptr;
  // The `trident emulate ...` command line of this spec (synthetic data, no overrides): every flag that differs
  // from its default (reference/model/repro.h), with --check-reference when check_reference.
  std::string repro(bool check_reference = true) const;
};

template <class T>
struct EmulateResult {
  std::vector<RankStepStats> steps;  // rank 0's view (identical on every rank, checked)
  std::vector<model::ParamSet<T>> grads;       // per step: full rounded gradients (keep_tensors)
  std::vector<model::ParamSet<T>> params;      // per step: full parameters after the step (keep_tensors)
  std::vector<int64_t> peak_bytes;             // per rank: peak of the step's tracked buffers
  std::vector<int64_t> device_peak_bytes;      // per rank: peak of every device allocation (EmuDevice::memory)
  std::vector<CommStats> rank_stats;           // per rank: calls and bytes per communicator name
  std::vector<PhaseCounts> phases;   // per rank: collectives per phase of the last step
  std::vector<RankTrace> traces;               // per rank: every stream's entries of the whole run (record_trace)
  std::vector<ShardState<T>> state;            // per rank: optimizer state after the last step (keep_state)
  RoutingCounts routing;                       // record_routing: the router's counts; shapes only: those used
  CommStats total() const;                     // summed over ranks
  double seconds = 0;                          // wall time of the steps (spawn included)
  // Per step: CPU seconds (user + system, every thread; with --backend mpi every process) from the start of the
  // steps (spawn included) to the end of that step on its last rank, cumulative.
  std::vector<double> step_cpu_seconds;
};

// This process's CPU time at the end of each step: the last of `ranks` ranks to finish step s stamps it, counted
// from construction (platform::cpu_seconds). done() is thread-safe; seconds() is read after every rank finished.
class StepCpuClock {
 public:
  StepCpuClock(int ranks, int64_t steps);
  void done(int64_t step);
  const std::vector<double>& seconds() const { return at_; }

 private:
  double t0_ = 0;
  std::unique_ptr<std::atomic<int>[]> left_;
  std::vector<double> at_;
};

// kernels: one kernel set per rank, launching on that rank's device (nullptr factory: CpuKernels).
template <class T>
using KernelFactory = std::function<std::unique_ptr<Kernels<T>>(int rank, Device& dev)>;

// resume: start from a saved state (docs/checkpoints.md) instead of spec_init and zero moments; the data position
// is spec.first_step.
template <class T>
EmulateResult<T> emulate(const EmulateSpec& spec, const KernelFactory<T>& kernels = nullptr,
                         const model::TrainState<T>* resume = nullptr);

// What every rank of a spec shares (parallel/step.h): `init` the initial parameters (spec_init; ignored when
// resuming), kept alive by the caller as long as the steps run.
template <class T>
StepShared<T> step_shared(const EmulateSpec& spec, const model::ParamSet<T>& init,
                          const model::TrainState<T>* resume = nullptr);

// Bitwise comparison with the single-rank reference (Trainer<T> on the same batches).
struct TensorCheck {
  int64_t step = 0;
  std::string what;    // "loss", "grad", "param"
  std::string name;    // tensor name ("" for the loss)
  bool equal = true;
  int64_t first_index = -1;   // first differing element
  double got = 0, want = 0;   // values there
};
// The bitwise comparison of n values: equal, or the first differing element and both values there.
template <class T>
TensorCheck compare_bits(int64_t step, const char* what, const std::string& name, const T* got, const T* want,
                         int64_t n) {
  TensorCheck c;
  c.step = step;
  c.what = what;
  c.name = name;
  for (int64_t i = 0; i < n; ++i)
    if (std::memcmp(got + i, want + i, sizeof(T)) != 0) {
      c.equal = false;
      c.first_index = i;
      c.got = static_cast<double>(got[i]);
      c.want = static_cast<double>(want[i]);
      break;
    }
  return c;
}
struct CheckReport {
  std::vector<TensorCheck> checks;
  bool ok() const;
  const TensorCheck* first_mismatch() const;
  std::string summary() const;  // one line: "bitwise equal: N tensors over S steps" or the first mismatch
};
template <class T>
CheckReport check_reference(const EmulateSpec& spec, const EmulateResult<T>& got,
                            const model::TrainState<T>* resume = nullptr);

// The initial parameters of a spec (ParamSet::init plus overrides).
template <class T>
model::ParamSet<T> spec_init(const EmulateSpec& spec);
// The batches a spec runs (spec.batches, or synthetic).
std::vector<model::Batch> spec_batches(const EmulateSpec& spec);

extern template EmulateResult<float> emulate<float>(const EmulateSpec&, const KernelFactory<float>&,
                                                    const model::TrainState<float>*);
extern template EmulateResult<double> emulate<double>(const EmulateSpec&, const KernelFactory<double>&,
                                                      const model::TrainState<double>*);
extern template CheckReport check_reference<float>(const EmulateSpec&, const EmulateResult<float>&,
                                                   const model::TrainState<float>*);
extern template CheckReport check_reference<double>(const EmulateSpec&, const EmulateResult<double>&,
                                                    const model::TrainState<double>*);

}  // namespace trident::emu
