// The single-rank reference model: layers, full forward, manual backward with optional full recompute
// (docs/model.md). Gradients go into GradAcc<T> (ExactAcc per element), rounded once by GradAcc::finalize.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "reference/check.h"
#include "reference/model/attention.h"
#include "reference/model/config.h"
#include "reference/model/moe.h"
#include "reference/model/ops.h"
#include "reference/model/params.h"
#include "reference/progress.h"

namespace trident::model {

template <class T>
struct LayerW {
  bool moe = false;
  const T* attn_norm = nullptr;  // (d)
  AttnW<T> attn;
  const T* ffn_norm = nullptr;   // (d)
  const T *mlp_wg = nullptr, *mlp_wu = nullptr, *mlp_wd = nullptr;  // dense: (d,F), (d,F), (F,d)
  MoeW<T> moe_w;
};
template <class T>
struct LayerG {
  ExactAcc<T>* attn_norm = nullptr;
  AttnG<T> attn;
  ExactAcc<T>* ffn_norm = nullptr;
  ExactAcc<T> *mlp_wg = nullptr, *mlp_wu = nullptr, *mlp_wd = nullptr;
  // Or, where the dense MLP's three gradients are this backward's alone (the streaming Trainer): rounded into these
  // (swiglu_backward_wgrad_round; the same bits), the accumulators above unused.
  T *mlp_dwg = nullptr, *mlp_dwu = nullptr, *mlp_dwd = nullptr;
  MoeG<T> moe_g;
};
// Views by parameter name (layer i) into a ParamSet / GradAcc with that ParamSet's layout.
template <class T>
LayerW<T> layer_weights(const Config& cfg, const ParamSet<T>& p, int64_t i);
template <class T>
LayerG<T> layer_grads(const Config& cfg, const ParamSet<T>& layout, GradAcc<T>& g, int64_t i);

template <class T>
struct LayerActs {
  std::vector<T> a1, rinv1;  // (N,d), (N): attn_norm(x)
  AttnActs<T> attn;
  std::vector<T> h;          // (N,d) x + attn
  std::vector<T> a2, rinv2;  // ffn_norm(h)
  std::vector<T> ug, uu, hh; // dense MLP (N,F) x3
  MoeActs<T> moe;
};

// h = x + Attn(RMSNorm(x; g1)); out = h + FFN(RMSNorm(h; g2)). x, out: (N, d).
template <class T>
void layer_forward(Policy pol, const Config& cfg, const LayerW<T>& W, const T* x, const TokenRows& rows,
                   const RopeTable<T>& rope, LayerActs<T>& A, T* out);
// Runs f, a forward of layer i: an error about its values (the router's NaN score, the DSA indexer's NaN score)
// gets the layer in front, "layer 2 router: NaN score at row 0 expert 0"; a step adds its number
// ("step 3, layer 2 router: ..."). Other errors pass unchanged.
template <class F>
void in_layer(int64_t i, F&& f) {
  try {
    f();
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.rfind("router:", 0) != 0 && what.rfind("dsa_select:", 0) != 0) throw;
    fail(fmt::format("layer {} {}", i, what));
  }
}

// dout (N,d) -> dx (N,d) written; gradients accumulated into G.
// dh = dout + dnorm2(ffn backward); dx = dh + dnorm1(attn backward) (elementwise, in that order).
template <class T>
void layer_backward(Policy pol, const Config& cfg, const LayerW<T>& W, const LayerG<T>& G, const T* x,
                    const TokenRows& rows, const RopeTable<T>& rope, const LayerActs<T>& A, const T* dout, T* dx);

// Inputs of one step: B sequences of S tokens (row-major (B, S)); targets -100 = ignored.
struct Batch {
  int64_t B = 0, S = 0;
  std::vector<int32_t> tokens, targets;  // (B, S)
  // Packed sequences (docs/model.md "Packed sequences"): (B, S) position of the first token of each token's
  // document, so doc_start[b, p] is p or doc_start[b, p-1]; empty = one document per sequence.
  std::vector<int64_t> doc_start;
};

template <class T>
struct ForwardResult {
  T loss = T(0);                      // round(exact sum of token losses) / n_valid; 0 when n_valid == 0
  int64_t n_valid = 0;                // targets != -100
  ExactAcc<T> loss_sum;               // exact sum of token losses (unrounded; tile partials)
  std::vector<T> token_loss;          // (N)
  std::vector<T> hidden;              // (N, d) final-normed hidden (only if requested)
  std::vector<std::vector<int64_t>> load;  // per layer (E) routed-token counts (empty for dense layers)
  std::vector<std::vector<int32_t>> sel;   // per layer (N, K) selected experts (empty for dense layers)
  // DSA: the indexer loss, round(exact sum over layers and queries of the KL terms) / N (docs/model.md), and each
  // layer's (N, topk) key selection.
  T indexer_loss = T(0);
  std::vector<std::vector<int32_t>> dsa_sel;
};

struct StepOptions {
  int64_t token_chunk = 64;  // linear-CE token chunk (bitwise irrelevant)
  bool recompute = false;    // full recompute: keep only each layer's input
  bool keep_hidden = false;  // return the final hidden in ForwardResult
  StepProgress* progress = nullptr;  // where the step is, for progress lines (null: not reported)
};

// Forward only (loss and per-token results). T must match cfg.policy (double <=> fp64).
template <class T>
ForwardResult<T> model_forward(const Config& cfg, const ParamSet<T>& params, const Batch& batch,
                               const StepOptions& opt);
// Forward + backward: accumulates every trainable gradient into grads (not cleared here, not rounded).
template <class T>
ForwardResult<T> model_forward_backward(const Config& cfg, const ParamSet<T>& params, const Batch& batch,
                                        const StepOptions& opt, GradAcc<T>& grads);

// Checks a batch against the config (shapes, token ids in [0, V), targets in [0, V) or -100).
void validate_batch(const Config& cfg, const Batch& b);

}  // namespace trident::model
