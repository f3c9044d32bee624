// The kernel set of the distributed step: every piece of per-rank compute the step launches, behind one
// interface, so the same step code (parallel/step.h) can drive the CPU reference ops (CpuKernels, below)
// and, later, CUDA kernels with the same names and argument order (STYLE.md habit 1).
//
// Every kernel has the semantics (and the bits) of the reference op it is named after (reference/model/*.h);
// the step only arranges rows, collectives and reduction order around them. Shapes are given as comments.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "reference/exact_acc.h"
#include "reference/model/adamw.h"
#include "reference/model/attention.h"
#include "reference/model/config.h"
#include "reference/model/ops.h"
#include "reference/policy.h"

namespace trident::parallel {

template <class T>
class Kernels {
 public:
  virtual ~Kernels() = default;
  using Config = model::Config;
  using AttnW = model::AttnW<T>;
  using AttnG = model::AttnG<T>;
  using AttnActs = model::AttnActs<T>;
  using CoreDims = model::CoreDims;
  using Rope = model::RopeTable<T>;

  // ---- GEMM-like ---------------------------------------------------------------------------------------------
  virtual void mm(Policy pol, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
                  bool trans_b, T* C, int64_t ldc) = 0;
  virtual void wgrad_acc(Policy pol, const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M,
                         std::span<const int64_t> segs, ExactAcc<T>* acc) = 0;
  virtual void sum_acc(const T* x, int64_t J, std::span<const int64_t> segs, ExactAcc<T>* acc) = 0;
  virtual void exact_round(const ExactAcc<T>* acc, T* out, int64_t n) = 0;

  // ---- per-token ops -----------------------------------------------------------------------------------------
  virtual void embedding_forward(T* out, const int32_t* tokens, const T* embed, int64_t N, int64_t d,
                                 int64_t V) = 0;
  virtual void embedding_backward(ExactAcc<T>* dembed, const int32_t* tokens, const T* dout, int64_t N, int64_t d,
                                  std::span<const int64_t> segs) = 0;
  virtual void rmsnorm_forward(const T* x, int64_t ldx, const T* g, int64_t N, int64_t d, double eps, T* y,
                               int64_t ldy, T* rinv) = 0;
  virtual void rmsnorm_backward(const T* dy, int64_t lddy, const T* x, int64_t ldx, const T* rinv, const T* g,
                                int64_t N, int64_t d, std::span<const int64_t> segs, T* dx, int64_t lddx,
                                ExactAcc<T>* dg) = 0;
  // Dense MLP and shared expert: SwiGLU (reference/model/ops.h).
  virtual void swiglu_forward(Policy pol, const T* x, const T* wg, const T* wu, const T* wd, int64_t N, int64_t d,
                              int64_t F, T* ug, T* uu, T* h, T* y) = 0;
  virtual void swiglu_backward_dgrad(Policy pol, const T* dy, const T* wg, const T* wu, const T* wd, const T* ug,
                                     const T* uu, int64_t N, int64_t d, int64_t F, T* dug, T* duu, T* dx) = 0;
  // (SwiGLU weight gradients: the step issues the reference's swiglu_backward_wgrad as its three wgrad_acc calls,
  // one tensor at a time, so one accumulator is live at a time.)
  // A routed expert on a row list: x (n, d) -> y (n, d) with its SwiGLU activations. The default is the
  // SwiGLU; the identity-expert test hook overrides it (y = x).
  virtual void expert_forward(Policy pol, const T* x, const T* wg, const T* wu, const T* wd, int64_t n, int64_t d,
                              int64_t F, T* ug, T* uu, T* h, T* y) {
    swiglu_forward(pol, x, wg, wu, wd, n, d, F, ug, uu, h, y);
  }
  // Test hook, called after the EP combine of each MoE layer's forward with the routed part of the output
  // (before the shared expert is added): a (N, d) the expert input, gates/sel (N, K), routed (N, d).
  virtual void on_moe_combined(int64_t layer, const T* a, const T* gates, const int32_t* sel, const T* routed,
                               int64_t N, int64_t d, int64_t K) {}
  virtual void router_forward(Policy pol, const T* a, const T* wr, const T* bias, int64_t N, int64_t d, int64_t E,
                              int64_t K, double alpha, T* logits, T* scores, int32_t* sel, T* gates) = 0;
  virtual void router_backward(const T* dgates, const T* scores, const int32_t* sel, int64_t N, int64_t E, int64_t K,
                               double alpha, T* dlogits) = 0;

  // ---- attention (reference/model/attention.h) ----------------------------------------------------------------
  virtual void attn_qkv_forward(Policy pol, const Config& cfg, const AttnW& W, const T* a, const int64_t* pos,
                                int64_t N, const Rope& rope, AttnActs& acts) = 0;
  virtual void attn_core_forward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq,
                                 const T* kv, int64_t S, T* o, T* stats) = 0;
  virtual void attn_core_backward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq,
                                  const T* kv, int64_t S, const T* o, const T* stats, const T* dO,
                                  std::span<const int64_t> qsegs, T* dq, ExactAcc<T>* dkv) = 0;
  virtual void attn_out_forward(Policy pol, const Config& cfg, const AttnW& W, int64_t N, AttnActs& acts,
                                T* y) = 0;
  virtual void attn_out_backward(Policy pol, const Config& cfg, const AttnW& W, const AttnG& G, int64_t N,
                                 const AttnActs& acts, const T* dy, std::span<const int64_t> segs, T* dO) = 0;
  virtual void attn_qkv_backward(Policy pol, const Config& cfg, const AttnW& W, const AttnG& G, const T* a,
                                 const int64_t* pos, int64_t N, const Rope& rope, const AttnActs& acts,
                                 const T* dqc, const T* dpayload, std::span<const int64_t> segs, T* da) = 0;

  // ---- loss and optimizer -------------------------------------------------------------------------------------
  virtual void linear_ce_forward(const T* hidden, const T* W, const int32_t* targets, int64_t N, int64_t d,
                                 int64_t V, int64_t vocab_chunk, Policy pol, int64_t token_chunk, T* token_loss,
                                 T* lse) = 0;
  // The columns [j_begin, j_end) of the backward (linear_ce_backward_cols): dW (d, j_end - j_begin).
  virtual void linear_ce_backward(const T* hidden, const T* W, const int32_t* targets, const T* lse, int64_t N,
                                  int64_t d, int64_t V, int64_t vocab_chunk, Policy pol, int64_t token_chunk,
                                  T grad_scale, std::span<const int64_t> segs, int64_t j_begin, int64_t j_end,
                                  T* dhidden, ExactAcc<T>* dW) = 0;
  virtual void grad_sq_acc(const T* g, int64_t n, ExactAcc<double>& acc) = 0;
  virtual void adamw_step(T* w, const T* g, T* m, T* v, int64_t n, const model::AdamWHyper& hyper,
                          int64_t step, double clip, bool decay) = 0;
  virtual void router_bias_update(T* b, const int64_t* load, int64_t E, double gamma) = 0;
};

// The CPU instance: forwards every kernel to the reference op of the same name (bits of the reference).
template <class T>
class CpuKernels : public Kernels<T> {
 public:
  using typename Kernels<T>::Config;
  using typename Kernels<T>::AttnW;
  using typename Kernels<T>::AttnG;
  using typename Kernels<T>::AttnActs;
  using typename Kernels<T>::CoreDims;
  using typename Kernels<T>::Rope;
  void mm(Policy pol, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
          bool trans_b, T* C, int64_t ldc) override;
  void wgrad_acc(Policy pol, const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M,
                 std::span<const int64_t> segs, ExactAcc<T>* acc) override;
  void sum_acc(const T* x, int64_t J, std::span<const int64_t> segs, ExactAcc<T>* acc) override;
  void exact_round(const ExactAcc<T>* acc, T* out, int64_t n) override;
  void embedding_forward(T* out, const int32_t* tokens, const T* embed, int64_t N, int64_t d, int64_t V) override;
  void embedding_backward(ExactAcc<T>* dembed, const int32_t* tokens, const T* dout, int64_t N, int64_t d,
                          std::span<const int64_t> segs) override;
  void rmsnorm_forward(const T* x, int64_t ldx, const T* g, int64_t N, int64_t d, double eps, T* y, int64_t ldy,
                       T* rinv) override;
  void rmsnorm_backward(const T* dy, int64_t lddy, const T* x, int64_t ldx, const T* rinv, const T* g, int64_t N,
                        int64_t d, std::span<const int64_t> segs, T* dx, int64_t lddx, ExactAcc<T>* dg) override;
  void swiglu_forward(Policy pol, const T* x, const T* wg, const T* wu, const T* wd, int64_t N, int64_t d, int64_t F,
                      T* ug, T* uu, T* h, T* y) override;
  void swiglu_backward_dgrad(Policy pol, const T* dy, const T* wg, const T* wu, const T* wd, const T* ug, const T* uu,
                             int64_t N, int64_t d, int64_t F, T* dug, T* duu, T* dx) override;
  void router_forward(Policy pol, const T* a, const T* wr, const T* bias, int64_t N, int64_t d, int64_t E, int64_t K,
                      double alpha, T* logits, T* scores, int32_t* sel, T* gates) override;
  void router_backward(const T* dgates, const T* scores, const int32_t* sel, int64_t N, int64_t E, int64_t K,
                       double alpha, T* dlogits) override;
  void attn_qkv_forward(Policy pol, const Config& cfg, const AttnW& W, const T* a, const int64_t* pos, int64_t N,
                        const Rope& rope, AttnActs& acts) override;
  void attn_core_forward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq, const T* kv,
                         int64_t S, T* o, T* stats) override;
  void attn_core_backward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq, const T* kv,
                          int64_t S, const T* o, const T* stats, const T* dO, std::span<const int64_t> qsegs, T* dq,
                          ExactAcc<T>* dkv) override;
  void attn_out_forward(Policy pol, const Config& cfg, const AttnW& W, int64_t N, AttnActs& acts, T* y) override;
  void attn_out_backward(Policy pol, const Config& cfg, const AttnW& W, const AttnG& G, int64_t N,
                         const AttnActs& acts, const T* dy, std::span<const int64_t> segs, T* dO) override;
  void attn_qkv_backward(Policy pol, const Config& cfg, const AttnW& W, const AttnG& G, const T* a,
                         const int64_t* pos, int64_t N, const Rope& rope, const AttnActs& acts, const T* dqc,
                         const T* dpayload, std::span<const int64_t> segs, T* da) override;
  void linear_ce_forward(const T* hidden, const T* W, const int32_t* targets, int64_t N, int64_t d, int64_t V,
                         int64_t vocab_chunk, Policy pol, int64_t token_chunk, T* token_loss, T* lse) override;
  void linear_ce_backward(const T* hidden, const T* W, const int32_t* targets, const T* lse, int64_t N, int64_t d,
                          int64_t V, int64_t vocab_chunk, Policy pol, int64_t token_chunk, T grad_scale,
                          std::span<const int64_t> segs, int64_t j_begin, int64_t j_end, T* dhidden,
                          ExactAcc<T>* dW) override;
  void grad_sq_acc(const T* g, int64_t n, ExactAcc<double>& acc) override;
  void adamw_step(T* w, const T* g, T* m, T* v, int64_t n, const model::AdamWHyper& hyper, int64_t step,
                  double clip, bool decay) override;
  void router_bias_update(T* b, const int64_t* load, int64_t E, double gamma) override;
};

extern template class CpuKernels<float>;
extern template class CpuKernels<double>;

}  // namespace trident::parallel
