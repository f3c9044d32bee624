// Training driver of the single-rank reference: synthetic data, one optimizer step (forward, backward with
// optional full recompute, exact global grad norm, clipping, AdamW, router bias update), and the golden
// state dump of a step is written by `trident train --dump` (docs/model.md "Training").
#pragma once
#include <cstdint>
#include <string>

#include "reference/model/adamw.h"
#include "reference/model/config.h"
#include "reference/model/model.h"
#include "reference/model/params.h"

namespace trident::model {

// Synthetic next-token task with a fixed pattern: a random permutation pi of the vocabulary (from data_seed);
// sequence b of step s starts at a pseudo-random token and continues t_{i+1} = pi(t_i); targets are the next
// tokens (all valid). Deterministic in (data_seed, step, b); learnable, so the loss falls.
Batch synthetic_batch(const Config& cfg, const RunConfig& run, int64_t step);

AdamWHyper adamw_hyper(const RunConfig& run);

struct StepStats {
  double loss = 0;        // the step's loss (value in T, widened)
  int64_t n_valid = 0;
  double grad_norm = 0;   // sqrt(round(exact sum of squares))
  double clip = 1;        // clip coefficient applied
  double indexer_loss = 0;  // DSA: the indexer's KL loss (ForwardResult::indexer_loss); 0 without DSA
};

// Everything the optimizer carries from one step to the next (docs/checkpoints.md): the master weights with the
// router-bias buffers, the AdamW moments and the steps taken (the bias correction's t and the synthetic data
// position). Gradients are not state: each step recomputes them from zero.
template <class T>
struct TrainState {
  ParamSet<T> params, m, v;
  int64_t step = 0;
};

template <class T>
struct Trainer {
  Config cfg;
  RunConfig run;
  ParamSet<T> params;   // master weights (fp32 for fp32/bf16, double for fp64) + router_bias buffers
  ParamSet<T> grads;    // rounded gradients of the last step (0 for buffers)
  ParamSet<T> m, v;     // AdamW state
  GradAcc<T> acc;       // exact accumulators, streaming: one block (layer) at a time, rounded into grads
  int64_t step_count = 0;
  StepProgress* progress = nullptr;  // where step() is, for progress lines (null: not reported)

  Trainer(const Config& c, const RunConfig& r);   // params = ParamSet::init(c, c.seed)
  // One full step on `batch`: grads, clip, AdamW (decay on matrices), router bias update.
  StepStats step(const Batch& batch);
  TrainState<T> state() const { return {params, m, v, step_count}; }
  // Continue from a saved state (layouts must match this config's).
  void restore(const TrainState<T>& s);
};

// The golden state dump of a step lives in cli/cmd_train.cpp (trident_golden links this library, not
// the other way round).

extern template struct Trainer<float>;
extern template struct Trainer<double>;

}  // namespace trident::model
