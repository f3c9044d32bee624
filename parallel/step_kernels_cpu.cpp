// CpuKernels: the kernel set of the distributed step on the CPU = the reference ops (reference/model/*).
#include "parallel/step_kernels.h"

#include "reference/model/adamw.h"
#include "reference/model/linear_ce.h"

namespace trident::parallel {

namespace m = trident::model;

template <class T>
void CpuKernels<T>::mm(Policy pol, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
                       bool trans_b, T* C, int64_t ldc) {
  m::mm<T>(pol, M, N, K, A, lda, B, ldb, trans_b, C, ldc);
}
template <class T>
void CpuKernels<T>::wgrad_acc(Policy pol, const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M,
                              std::span<const int64_t> segs, ExactAcc<T>* acc) {
  m::wgrad_acc<T>(pol, X, ldx, dY, ldy, K, M, segs, acc);
}
template <class T>
void CpuKernels<T>::sum_acc(const T* x, int64_t J, std::span<const int64_t> segs, ExactAcc<T>* acc) {
  m::sum_acc<T>(x, J, segs, acc);
}
template <class T>
void CpuKernels<T>::exact_round(const ExactAcc<T>* acc, T* out, int64_t n) {
  trident::exact_round<T>(acc, out, n);
}
template <class T>
void CpuKernels<T>::embedding_forward(T* out, const int32_t* tokens, const T* embed, int64_t N, int64_t d, int64_t V) {
  m::embedding_forward<T>(out, tokens, embed, N, d, V);
}
template <class T>
void CpuKernels<T>::embedding_backward(ExactAcc<T>* dembed, const int32_t* tokens, const T* dout, int64_t N,
                                       int64_t d, std::span<const int64_t> segs) {
  m::embedding_backward<T>(dembed, tokens, dout, N, d, segs);
}
template <class T>
void CpuKernels<T>::rmsnorm_forward(const T* x, int64_t ldx, const T* g, int64_t N, int64_t d, double eps, T* y,
                                    int64_t ldy, T* rinv) {
  m::rmsnorm_forward<T>(x, ldx, g, N, d, eps, y, ldy, rinv);
}
template <class T>
void CpuKernels<T>::rmsnorm_backward(const T* dy, int64_t lddy, const T* x, int64_t ldx, const T* rinv, const T* g,
                                     int64_t N, int64_t d, std::span<const int64_t> segs, T* dx, int64_t lddx,
                                     ExactAcc<T>* dg) {
  m::rmsnorm_backward<T>(dy, lddy, x, ldx, rinv, g, N, d, segs, dx, lddx, dg);
}
template <class T>
void CpuKernels<T>::swiglu_forward(Policy pol, const T* x, const T* wg, const T* wu, const T* wd, int64_t N, int64_t d,
                                   int64_t F, T* ug, T* uu, T* h, T* y) {
  m::swiglu_forward<T>(pol, x, wg, wu, wd, N, d, F, ug, uu, h, y);
}
template <class T>
void CpuKernels<T>::swiglu_backward_dgrad(Policy pol, const T* dy, const T* wg, const T* wu, const T* wd, const T* ug,
                                          const T* uu, int64_t N, int64_t d, int64_t F, T* dug, T* duu, T* dx) {
  m::swiglu_backward_dgrad<T>(pol, dy, wg, wu, wd, ug, uu, N, d, F, dug, duu, dx);
}
template <class T>
void CpuKernels<T>::router_forward(Policy pol, const T* a, const T* wr, const T* bias, int64_t N, int64_t d, int64_t E,
                                   int64_t K, double alpha, T* logits, T* scores, int32_t* sel, T* gates) {
  m::router_forward<T>(pol, a, wr, bias, N, d, E, K, alpha, logits, scores, sel, gates);
}
template <class T>
void CpuKernels<T>::router_backward(const T* dgates, const T* scores, const int32_t* sel, int64_t N, int64_t E,
                                    int64_t K, double alpha, T* dlogits) {
  m::router_backward<T>(dgates, scores, sel, N, E, K, alpha, dlogits);
}
template <class T>
void CpuKernels<T>::attn_qkv_forward(Policy pol, const Config& cfg, const AttnW& W, const T* a, const int64_t* pos,
                                     int64_t N, const Rope& rope, AttnActs& acts) {
  m::attn_qkv_forward<T>(pol, cfg, W, a, pos, N, rope, acts);
}
template <class T>
void CpuKernels<T>::attn_core_forward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq,
                                      const T* kv, int64_t S, T* o, T* stats) {
  m::attn_core_forward<T>(pol, cd, q, qpos, Nq, kv, S, o, stats);
}
template <class T>
void CpuKernels<T>::attn_core_backward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq,
                                       const T* kv, int64_t S, const T* o, const T* stats, const T* dO,
                                       std::span<const int64_t> qsegs, T* dq, ExactAcc<T>* dkv) {
  m::attn_core_backward<T>(pol, cd, q, qpos, Nq, kv, S, o, stats, dO, qsegs, dq, dkv);
}
template <class T>
void CpuKernels<T>::attn_out_forward(Policy pol, const Config& cfg, const AttnW& W, int64_t N, AttnActs& acts, T* y) {
  m::attn_out_forward<T>(pol, cfg, W, N, acts, y);
}
template <class T>
void CpuKernels<T>::attn_out_backward(Policy pol, const Config& cfg, const AttnW& W, const AttnG& G, int64_t N,
                                      const AttnActs& acts, const T* dy, std::span<const int64_t> segs, T* dO) {
  m::attn_out_backward<T>(pol, cfg, W, G, N, acts, dy, segs, dO);
}
template <class T>
void CpuKernels<T>::attn_qkv_backward(Policy pol, const Config& cfg, const AttnW& W, const AttnG& G, const T* a,
                                      const int64_t* pos, int64_t N, const Rope& rope, const AttnActs& acts,
                                      const T* dqc, const T* dpayload, std::span<const int64_t> segs, T* da) {
  m::attn_qkv_backward<T>(pol, cfg, W, G, a, pos, N, rope, acts, dqc, dpayload, segs, da);
}
template <class T>
void CpuKernels<T>::linear_ce_forward(const T* hidden, const T* W, const int32_t* targets, int64_t N, int64_t d,
                                      int64_t V, int64_t vocab_chunk, Policy pol, int64_t token_chunk, T* token_loss,
                                      T* lse) {
  m::linear_ce_forward<T>(hidden, W, targets, N, d, V, vocab_chunk, pol, token_chunk, token_loss, lse);
}
template <class T>
void CpuKernels<T>::linear_ce_backward(const T* hidden, const T* W, const int32_t* targets, const T* lse, int64_t N,
                                       int64_t d, int64_t V, int64_t vocab_chunk, Policy pol, int64_t token_chunk,
                                       T grad_scale, std::span<const int64_t> segs, int64_t j_begin,
                                       int64_t j_end, T* dhidden, ExactAcc<T>* dW) {
  m::linear_ce_backward_cols<T>(hidden, W, targets, lse, N, d, V, vocab_chunk, pol, token_chunk, grad_scale, segs,
                                j_begin, j_end, dhidden, dW);
}
template <class T>
void CpuKernels<T>::grad_sq_acc(const T* g, int64_t n, ExactAcc<double>& acc) {
  m::grad_sq_acc<T>(g, n, acc);
}
template <class T>
void CpuKernels<T>::adamw_step(T* w, const T* g, T* mm_, T* v, int64_t n, const m::AdamWHyper& hyper, int64_t step,
                               double clip, bool decay) {
  m::adamw_step<T>(w, g, mm_, v, n, hyper, step, clip, decay);
}
template <class T>
void CpuKernels<T>::router_bias_update(T* b, const int64_t* load, int64_t E, double gamma) {
  m::router_bias_update(b, load, E, gamma);
}

template class CpuKernels<float>;
template class CpuKernels<double>;

}  // namespace trident::parallel
