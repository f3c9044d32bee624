// Arithmetic of one training step of the reference model, counted from the shapes (docs/model.md): 2 FLOPs per
// multiply-add of every matrix product and of the attention core, nothing for elementwise work (norms, RoPE,
// SwiGLU gates, softmax exponentials, AdamW), which is O(params + tokens x d) and below 2% for every preset.
// Used by bench_small to turn a measured step time into achieved GFLOP/s.
#pragma once
#include "reference/model/config.h"

namespace trident::model {

struct StepFlops {
  double forward = 0;    // one forward pass: projections, attention core (causal pairs only), FFN/MoE, LM head
  double backward = 0;   // dX and dW of every product (2x forward's), the attention core backward (scores
                         // recomputed from the saved stats, dp, dq, dk, dv) and the LM head backward (logits
                         // recomputed chunk by chunk, dhidden, dW)
  double recompute = 0;  // full recompute: every layer's forward again inside the backward (0 without it; DSA: not
                         // the selection, which is kept)
  // What the step executes.
  double executed() const { return forward + backward + recompute; }
  // The usual "model FLOPs" of utilisation figures: forward + backward, no recomputation.
  double model() const { return forward + backward - attn_score_recompute - lm_head_recompute; }
  double attn_core_forward = 0;     // part of forward: the attention core (q.k and p.v over causal pairs; DSA: over
                                    // the selected pairs, plus the indexer's scores of every causal pair and of the
                                    // selected ones for its KL term)
  double attn_score_recompute = 0;  // part of backward: q.k of the core again
  double lm_head_recompute = 0;     // part of backward: the logits again
};

StepFlops step_flops(const Config& cfg, const RunConfig& run);

}  // namespace trident::model
