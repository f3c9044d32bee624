// The distributed step (parallel/step.h, docs/parallel.md): the shared-state checks and RankStep's forwarding to its
// parts (parallel/step_impl.h: FSDP, CP attention, EP, layers and driver, optimizer).
#include "parallel/step.h"

#include <cmath>
#include <type_traits>

#include "parallel/step_impl.h"
#include "reference/check.h"

namespace trident {

namespace md = trident::model;

template <class T>
void StepShared<T>::validate() const {
  cfg.validate();
  run.validate();
  TD_CHECK(init != nullptr, "StepShared: initial parameters missing");
  TD_CHECK(init_step >= 0, "StepShared: init_step {} < 0", init_step);
  if (std::is_same_v<T, double> != (cfg.policy == Policy::fp64))
    fail(fmt::format("step: policy {} needs {} parameters", to_string(cfg.policy),
                     cfg.policy == Policy::fp64 ? "double" : "float"));
  validate_layout(mesh, cfg.experts, run.sequences, run.seq_len, cfg.tile, ep_chunks);
  (void)trident::vocab_slices(cfg.vocab, cfg.vocab_chunk, mesh.fsdp * mesh.cp, vocab_slices);
  // A layout-only init (no tensors) is a shapes-only run: no kernel reads the rope table.
  TD_CHECK(rope.max_pos >= run.seq_len || init->t.empty(), "StepShared: rope table of {} positions for seq_len {}",
           rope.max_pos, run.seq_len);
}

template <class T>
RankStep<T>::RankStep(const StepShared<T>& sh, Communicator& world, MeshComms& comms, Device& dev, Kernels<T>& k)
    : impl_(std::make_unique<StepImpl<T>>(sh, world, comms, dev, k)) {}
template <class T>
RankStep<T>::~RankStep() = default;
template <class T>
RankStepStats RankStep<T>::step(const md::Batch& b) {
  const int64_t n = impl_->step_count + 1;  // the optimizer step this call takes (a resumed run continues its count)
  RankStepStats st;
  try {
    st = impl_->step(b);
  } catch (const Error& e) {  // e.g. the router's NaN score: say at which step (and layer, when it says one)
    const std::string what = e.what();
    if (what.rfind("step ", 0) == 0) throw;
    fail(fmt::format("step {}{} {}", n, what.rfind("layer ", 0) == 0 ? "," : ":", what));
  }
  // Loss and grad norm are global values, the same on every rank: every rank stops at the same step, naming the
  // first tensor of its gradient shards that holds a non-finite value (every path: emulator, MPI, NCCL).
  if (!impl_->data) return st;  // shapes only: no values to check
  if (!std::isfinite(st.loss) || !std::isfinite(st.grad_norm))
    fail(fmt::format("step {}: loss {} / grad norm {} is not finite{} (diverged: lower --lr?)", n, st.loss,
                     st.grad_norm, impl_->first_nonfinite_gradient()));
  // Finite gradients can still make the update overflow (a huge --lr): one pass over the rank's shards.
  if (const std::string bad = impl_->first_nonfinite_state(); !bad.empty())
    fail(fmt::format("step {}: the update made {} (diverged: lower --lr?)", n, bad));
  return st;
}
template <class T>
void RankStep<T>::write_params(md::ParamSet<T>& full) const {
  impl_->write(full, false);
}
template <class T>
void RankStep<T>::write_grads(md::ParamSet<T>& full) const {
  impl_->write(full, true);
}
template <class T>
ShardState<T> RankStep<T>::state() const {
  return impl_->state();
}
template <class T>
const MemTracker& RankStep<T>::memory() const {
  return impl_->mem;
}
template <class T>
const PhaseCounts& RankStep<T>::phase_counts() const {
  return impl_->counts;
}

template struct StepShared<float>;
template struct StepShared<double>;
template class RankStep<float>;
template class RankStep<double>;

}  // namespace trident
