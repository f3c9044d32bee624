// The distributed FSDP x CP x EP training step (docs/parallel.md), backend-agnostic: written against the
// communicator interface (parallel/comm.h), the mesh communicators (parallel/mesh_comm.h), the layout
// arithmetic (parallel/layout.h) and a kernel set (parallel/step_kernels.h). The emulator drives it with fake
// ranks and CpuKernels (emulator/run_step.h); a GPU backend drives the same code with NCCL and CUDA kernels.
//
// One RankStep per rank. Every rank calls step() with the same global batch; the step takes its own rows
// (zig-zag over cp, whole sequences per data group), holds only its parameter shards, and produces exactly
// the bits of the single-rank reference (reference/model/train.h) for every valid mesh, EP chunk count and
// recompute setting.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm.h"
#include "parallel/layout.h"
#include "parallel/mesh_comm.h"
#include "parallel/routing.h"
#include "parallel/step_kernels.h"
#include "reference/model/adamw.h"
#include "reference/model/config.h"
#include "reference/model/model.h"
#include "reference/model/params.h"

namespace trident {

// Bytes of the step's big per-rank buffers (gathered parameters, gradient accumulators, saved activations,
// gathered KV, EP buffers, shards and optimizer state), counted where they are allocated and freed.
struct MemTracker {
  int64_t cur = 0, peak = 0;
  void add(int64_t b) {
    cur += b;
    if (cur > peak) peak = cur;
  }
  void sub(int64_t b) { cur -= b; }
};

// Collective calls per phase of the step, as issued by the step ("fwd.layer.1", "bwd.embed", "loss", "opt";
// see docs/parallel.md "Schedule and collective accounting"): phase -> communicator name -> op -> calls.
using PhaseCounts = std::map<std::string, std::map<std::string, std::array<int64_t, kNumCollOps>>>;

// Test hook of the step: a fault injected into the real step (tests/step/test_step_faults.cpp), so tests see how a
// backend reports what a real run can meet.
struct StepFault {
  enum class Kind : uint8_t { none, throw_error, stall, wrong_collective } kind = Kind::none;
  int rank = 0;          // the world rank that misbehaves
  int64_t layer = 0;     // at the start of this layer's (first) forward
  int64_t stall_ms = 0;  // stall: how long the rank stays in "compute" before it goes on
};

// Test hook of the step: a planted bug, so `trident fuzz` can show it finds and shrinks one (docs/fuzz.md section 5).
// none in every real run. zigzag_off_by_one: every cp rank but the first takes the mirror chunk 2cp-c instead of
// 2cp-1-c (needs cp >= 2 to show). chunk_drops_token: the last token row of every EP chunk but the last is not
// dispatched to its experts (needs 2 or more EP chunks to show).
enum class StepPlant : uint8_t { none, zigzag_off_by_one, chunk_drops_token };

// Everything one run shares read-only between its ranks (built once by the driver).
template <class T>
struct StepShared {
  model::Config cfg;
  model::RunConfig run;       // sequences, seq_len, token_chunk, recompute, optimizer hyper-parameters
  MeshShape mesh;
  int64_t ep_chunks = 1;      // chunked EP: tile-aligned token chunks per MoE layer
  int64_t vocab_slices = 0;   // lm_head / embedding gradients in slices (layout.h vocab_slices; 0: per vocab chunk)
  const model::ParamSet<T>* init = nullptr;  // initial full parameters: each rank copies its shards
  // Resuming (docs/checkpoints.md): the full AdamW moments each rank copies its shards of (both or neither; null:
  // zeros) and the optimizer steps already taken (AdamW bias correction continues from it).
  const model::ParamSet<T>* init_m = nullptr;
  const model::ParamSet<T>* init_v = nullptr;
  int64_t init_step = 0;
  model::RopeTable<T> rope;   // (seq_len, rope width)
  // Test hook: "fsdp_gather" drops the compute stream's wait for each FSDP all-gather (a missing event wait the
  // emulator's hazard checker must report). Empty in every real run.
  std::string skip_wait;
  // Test hook: a fault injected into the real step (StepFault). Kind none in every real run.
  StepFault fault;
  // Test hook: a planted bug (StepPlant). none in every real run.
  StepPlant plant = StepPlant::none;
  // World rank 0 writes where its step is (progress lines); null: not reported. Changes no result.
  StepProgress* progress = nullptr;
  // Routing counts (parallel/routing.h), per step, MoE layer, rank, EP chunk and expert. A data run records its
  // router's counts into it when set (each rank writes its own slots). A shapes-only run (Device::has_data() false)
  // takes every size of the EP exchange from it, and needs it for a MoE model. `init` may then hold the layout
  // only (info and index, no tensors).
  RoutingCounts* routing = nullptr;
  // Checks cfg, run and mesh (validate_layout): a mesh or chunking that would split a tile is rejected.
  void validate() const;
};

struct RankStepStats {
  double loss = 0;       // the step's loss in T, widened
  int64_t n_valid = 0;   // global valid targets
  double grad_norm = 0;  // sqrt(round(exact global sum of squares))
  double clip = 1;
  double indexer_loss = 0;  // DSA: round(exact global sum of the indexer KL terms) / tokens (the reference's)
};

// One rank's optimizer state as a checkpoint stores it (parallel/shard.h, docs/checkpoints.md): per parameter in
// ParamSet order, the valid (unpadded) part of the weights and AdamW moments the rank owns (ParamPlacement::owner;
// empty where it does not own the parameter, and m, v empty for buffers), and the steps taken.
template <class T>
struct ShardState {
  int64_t step = 0;
  std::vector<std::vector<T>> w, m, v;
};

template <class T>
struct StepImpl;  // parallel/step_impl.h

template <class T>
class RankStep {
 public:
  // `world` has every rank; `comms` are this rank's mesh communicators (make_mesh_comms); `dev` its device.
  RankStep(const StepShared<T>& sh, Communicator& world, MeshComms& comms, Device& dev, Kernels<T>& k);
  ~RankStep();
  RankStep(const RankStep&) = delete;
  RankStep& operator=(const RankStep&) = delete;

  // One optimizer step on the global batch (every rank passes the same batch; it takes its own rows).
  RankStepStats step(const model::Batch& global_batch);

  // Checking (the emulator assembles full tensors from every rank's part; parts are disjoint):
  // dense tensors from d_rep coordinate 0, expert tensors from every rank, buffers from world rank 0.
  void write_params(model::ParamSet<T>& full) const;  // master weights (and router biases)
  void write_grads(model::ParamSet<T>& full) const;   // the last step's rounded gradients
  ShardState<T> state() const;                        // for a checkpoint (host sync)
  const MemTracker& memory() const;
  const PhaseCounts& phase_counts() const;            // of the last step

 private:
  std::unique_ptr<StepImpl<T>> impl_;
};

extern template struct StepShared<float>;
extern template struct StepShared<double>;
extern template class RankStep<float>;
extern template class RankStep<double>;

}  // namespace trident
