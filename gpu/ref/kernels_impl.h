// RefKernels<T, Launch>: the ref tier (gpu/ref/ops.h) as a Kernels<T>, one class for both builds. Every op hands
// a closure over an executor to `Launch`, which runs it with the host executor (gpu/ref/host_kernels.cpp: at once,
// or as one launch on a deferred device) or the CUDA executor (gpu/ref/cuda_kernels.cu: the kernels enqueued on the
// op's stream). Closures capture by value, host metadata (tile segments, row lists) copied: a deferred launch runs
// after the call returned. The model config and RoPE table are captured by reference, as CpuKernels does (the step
// keeps them alive). The fast tier (gpu/fast/kernels_impl.h) derives from RefKernels and overrides only its own ops.
#pragma once
#include <cstdint>
#include <source_location>
#include <span>
#include <utility>
#include <vector>

#include "gpu/ref/ops.h"
#include "parallel/step_kernels.h"

namespace trident::gpu::ref {

// Host metadata held by value in an op's closure.
struct Held {
  std::vector<int64_t> v;
  std::span<const int64_t> span() const { return v; }
};
inline Held held(std::span<const int64_t> s) { return Held{std::vector<int64_t>(s.begin(), s.end())}; }

template <class T, class Launch>
class RefKernels : public Kernels<T> {
 public:
  using typename Kernels<T>::Config;
  using typename Kernels<T>::AttnW;
  using typename Kernels<T>::AttnG;
  using typename Kernels<T>::AttnBufs;
  using typename Kernels<T>::CoreDims;
  using typename Kernels<T>::Rope;
  using typename Kernels<T>::Segs;
  using typename Kernels<T>::loc_t;
  explicit RefKernels(Launch launch) : launch_(std::move(launch)) {}

  void mm(Policy pol, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, bool trans_b,
          T* C, int64_t ldc, Stream s, loc_t loc = loc_t::current()) override {
    launch_(s, "mm", loc, [=](auto& ex) { ref::mm<T>(ex, pol, M, N, K, A, lda, B, ldb, trans_b, C, ldc); });
  }
  void wgrad_acc(Policy pol, const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M, Segs segs,
                 ExactAcc<T>* acc, Stream s, loc_t loc = loc_t::current()) override {
    launch_(s, "wgrad_acc", loc, [=, sg = held(segs)](auto& ex) { ref::wgrad_acc<T>(ex, pol, X, ldx, dY, ldy, K, M,
        sg.span(), acc); });
  }
  void sum_acc(const T* x, int64_t J, Segs segs, ExactAcc<T>* acc, Stream s, loc_t loc = loc_t::current()) override {
    launch_(s, "sum_acc", loc, [=, sg = held(segs)](auto& ex) { ref::sum_acc<T>(ex, x, J, sg.span(), acc); });
  }
  void exact_round(const ExactAcc<T>* acc, T* out, int64_t n, Stream s, loc_t loc = loc_t::current()) override {
    launch_(s, "exact_round", loc, [=](auto& ex) { ref::exact_round<T>(ex, acc, out, n); });
  }
  void embedding_forward(T* out, const int32_t* tokens, const T* embed, int64_t N, int64_t d, int64_t V, Stream s,
                         loc_t loc = loc_t::current()) override {
    launch_(s, "embedding_forward", loc, [=](auto& ex) { ref::embedding_forward<T>(ex, out, tokens, embed, N, d, V); });
  }
  void embedding_backward(ExactAcc<T>* dembed, const int32_t* tokens, const T* dout, int64_t N, int64_t d, Segs segs,
                          Stream s, loc_t loc = loc_t::current()) override {
    launch_(s, "embedding_backward", loc, [=, sg = held(segs)](auto& ex) { ref::embedding_backward<T>(ex, dembed,
        tokens, dout, N, d, sg.span()); });
  }
  void rmsnorm_forward(const T* x, int64_t ldx, const T* g, int64_t N, int64_t d, double eps, T* y, int64_t ldy,
                       T* rinv, Stream s, loc_t loc = loc_t::current()) override {
    launch_(s, "rmsnorm_forward", loc, [=](auto& ex) { ref::rmsnorm_forward<T>(ex, x, ldx, g, N, d, eps, y, ldy,
        rinv); });
  }
  void rmsnorm_backward(const T* dy, int64_t lddy, const T* x, int64_t ldx, const T* rinv, const T* g, int64_t N,
                        int64_t d, Segs segs, T* dx, int64_t lddx, ExactAcc<T>* dg, Stream s,
                        loc_t loc = loc_t::current()) override {
    launch_(s, "rmsnorm_backward", loc, [=, sg = held(segs)](auto& ex) { ref::rmsnorm_backward<T>(ex, dy, lddy, x, ldx,
        rinv, g, N, d, sg.span(), dx, lddx, dg); });
  }
  void residual_forward(T* out, const T* a, const T* b, int64_t n, Stream s, loc_t loc = loc_t::current()) override {
    launch_(s, "residual_forward", loc, [=](auto& ex) { ref::residual_forward<T>(ex, out, a, b, n); });
  }
  void swiglu_forward(Policy pol, const T* x, const T* wg, const T* wu, const T* wd, int64_t N, int64_t d, int64_t F,
                      T* ug, T* uu, T* h, T* y, Stream s, loc_t loc = loc_t::current()) override {
    launch_(s, "swiglu_forward", loc, [=](auto& ex) { ref::swiglu_forward<T>(ex, pol, x, wg, wu, wd, N, d, F, ug, uu, h,
        y); });
  }
  void swiglu_backward_dgrad(Policy pol, const T* dy, const T* wg, const T* wu, const T* wd, const T* ug, const T* uu,
                             int64_t N, int64_t d, int64_t F, T* dug, T* duu, T* dx, Stream s,
                             loc_t loc = loc_t::current()) override {
    launch_(s, "swiglu_backward_dgrad", loc, [=](auto& ex) { ref::swiglu_backward_dgrad<T>(ex, pol, dy, wg, wu, wd, ug,
        uu, N, d, F, dug, duu, dx); });
  }
  void expert_forward(Policy pol, const T* x, const T* wg, const T* wu, const T* wd, int64_t N, int64_t d, int64_t F,
                      T* ug, T* uu, T* h, T* y, Stream s, loc_t loc = loc_t::current()) override {
    launch_(s, "expert_forward", loc, [=](auto& ex) { ref::swiglu_forward<T>(ex, pol, x, wg, wu, wd, N, d, F, ug, uu, h,
        y); });
  }
  void expert_backward_dgrad(Policy pol, const T* dy, const T* wg, const T* wu, const T* wd, const T* ug, const T* uu,
                             int64_t N, int64_t d, int64_t F, T* dug, T* duu, T* dx, Stream s,
                             loc_t loc = loc_t::current()) override {
    launch_(s, "expert_backward_dgrad", loc, [=](auto& ex) { ref::swiglu_backward_dgrad<T>(ex, pol, dy, wg, wu, wd, ug,
        uu, N, d, F, dug, duu, dx); });
  }
  void router_forward(Policy pol, const T* a, const T* wr, const T* bias, int64_t N, int64_t d, int64_t E, int64_t K,
                      double alpha, T* logits, T* scores, int32_t* sel, T* gates, Stream s,
                      loc_t loc = loc_t::current()) override {
    launch_(s, "router_forward", loc, [=](auto& ex) { ref::router_forward<T>(ex, pol, a, wr, bias, N, d, E, K, alpha,
        logits, scores, sel, gates); });
  }
  void router_backward(const T* dgates, const T* scores, const int32_t* sel, int64_t N, int64_t E, int64_t K,
                       double alpha, T* dlogits, Stream s, loc_t loc = loc_t::current()) override {
    launch_(s, "router_backward", loc, [=](auto& ex) { ref::router_backward<T>(ex, dgates, scores, sel, N, E, K, alpha,
        dlogits); });
  }
  void moe_combine_forward(T* out, const T* gates, const T* yk, int64_t N, int64_t d, int64_t K, Stream s,
                           loc_t loc = loc_t::current()) override {
    launch_(s, "moe_combine_forward", loc, [=](auto& ex) { ref::moe_combine_forward<T>(ex, out, gates, yk, N, d, K); });
  }
  void moe_combine_backward(const T* dout, const T* gates, const T* yk, std::span<const int64_t> tk, int64_t d,
                            int64_t K, T* dgates, T* dyk, Stream s, loc_t loc = loc_t::current()) override {
    launch_(s, "moe_combine_backward", loc, [=, sg = held(tk)](auto& ex) { ref::moe_combine_backward<T>(ex, dout, gates,
        yk, sg.span(), d, K, dgates, dyk); });
  }
  void moe_dx_sum(T* dx, const T* dxk, int64_t N, int64_t d, int64_t K, Stream s,
                  loc_t loc = loc_t::current()) override {
    launch_(s, "moe_dx_sum", loc, [=](auto& ex) { ref::moe_dx_sum<T>(ex, dx, dxk, N, d, K); });
  }
  void gather_rows(T* dst, const T* src, std::span<const int64_t> idx, int64_t w, Stream s,
                   loc_t loc = loc_t::current()) override {
    launch_(s, "gather_rows", loc, [=, sg = held(idx)](auto& ex) { ref::gather_rows<T>(ex, dst, src, sg.span(), w); });
  }
  void scatter_rows(T* dst, const T* src, std::span<const int64_t> idx, int64_t w, Stream s,
                    loc_t loc = loc_t::current()) override {
    launch_(s, "scatter_rows", loc, [=, sg = held(idx)](auto& ex) { ref::scatter_rows<T>(ex, dst, src, sg.span(),
        w); });
  }
  void kv_zigzag_reorder(T* dst, const T* src, int64_t cp, int64_t block, bool to_gather, Stream s,
                         loc_t loc = loc_t::current()) override {
    launch_(s, "kv_zigzag_reorder", loc, [=](auto& ex) { ref::kv_zigzag_reorder<T>(ex, dst, src, cp, block,
        to_gather); });
  }
  void kv_zigzag_to_gather_acc(ExactAcc<T>* x, ExactAcc<T>* scratch, int64_t cp, int64_t block, Stream s,
                               loc_t loc = loc_t::current()) override {
    launch_(s, "kv_zigzag_to_gather_acc", loc, [=](auto& ex) { ref::kv_zigzag_to_gather_acc<T>(ex, x, scratch, cp,
        block); });
  }
  void attn_qkv_forward(Policy pol, const Config& cfg, const AttnW& W, const T* a, const int64_t* pos, int64_t N,
                        const Rope& rope, const AttnBufs& acts, Stream s, loc_t loc = loc_t::current()) override {
    launch_(s, "attn_qkv_forward", loc, [=, &cfg, &rope](auto& ex) { ref::attn_qkv_forward<T>(ex, pol, cfg, W, a, pos,
        N, rope, acts); });
  }
  void attn_out_forward(Policy pol, const Config& cfg, const AttnW& W, int64_t N, const AttnBufs& acts, T* y, Stream s,
                        loc_t loc = loc_t::current()) override {
    launch_(s, "attn_out_forward", loc, [=, &cfg](auto& ex) { ref::attn_out_forward<T>(ex, pol, cfg, W, N, acts, y); });
  }
  void attn_out_backward(Policy pol, const Config& cfg, const AttnW& W, const AttnG& G, int64_t N, const AttnBufs& acts,
                         const T* dy, Segs segs, T* dO, Stream s, loc_t loc = loc_t::current()) override {
    launch_(s, "attn_out_backward", loc, [=, &cfg, sg = held(segs)](auto& ex) { ref::attn_out_backward<T>(ex, pol, cfg,
        W, G, N, acts, dy, sg.span(), dO); });
  }
  void attn_qkv_backward(Policy pol, const Config& cfg, const AttnW& W, const AttnG& G, const T* a, const int64_t* pos,
                         int64_t N, const Rope& rope, const AttnBufs& acts, const T* dqc, const T* dpayload, Segs segs,
                         T* da, Stream s, loc_t loc = loc_t::current()) override {
    launch_(s, "attn_qkv_backward", loc, [=, &cfg, &rope, sg = held(segs)](auto& ex) { ref::attn_qkv_backward<T>(ex,
        pol, cfg, W, G, a, pos, N, rope, acts, dqc, dpayload, sg.span(), da); });
  }
  void attn_core_forward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq, const T* kv,
                         int64_t S, T* o, T* stats, Stream s, loc_t loc = loc_t::current()) override {
    launch_(s, "attn_core_forward", loc, [=](auto& ex) { ref::attn_core_forward<T>(ex, pol, cd, q, qpos, Nq, kv, S, o,
        stats); });
  }
  void attn_core_backward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq, const T* kv,
                          int64_t S, const T* o, const T* stats, const T* dO, Segs qsegs, T* dq, ExactAcc<T>* dkv,
                          Stream s, loc_t loc = loc_t::current()) override {
    launch_(s, "attn_core_backward", loc, [=, sg = held(qsegs)](auto& ex) { ref::attn_core_backward<T>(ex, pol, cd, q,
        qpos, Nq, kv, S, o, stats, dO, sg.span(), dq, dkv); });
  }
  void attn_doc_core_forward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, const int64_t* qdoc,
                             int64_t Nq, const T* kv, int64_t S, T* o, T* stats, Stream s,
                             loc_t loc = loc_t::current()) override {
    launch_(s, "attn_doc_core_forward", loc, [=](auto& ex) { ref::attn_doc_core_forward<T>(ex, pol, cd, q, qpos, qdoc,
        Nq, kv, S, o, stats); });
  }
  void attn_doc_core_backward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, const int64_t* qdoc,
                              int64_t Nq, const T* kv, int64_t S, const T* o, const T* stats, const T* dO, Segs qsegs,
                              T* dq, ExactAcc<T>* dkv, Stream s, loc_t loc = loc_t::current()) override {
    launch_(s, "attn_doc_core_backward", loc, [=, sg = held(qsegs)](auto& ex) { ref::attn_doc_core_backward<T>(ex,
        pol, cd, q, qpos, qdoc, Nq, kv, S, o, stats, dO, sg.span(), dq, dkv); });
  }
  void dsa_select(Policy pol, const CoreDims& cd, const T* iq, const int64_t* qpos, const int64_t* qdoc, int64_t Nq,
                  const T* kv, int64_t S, int32_t* sel, Stream s, loc_t loc = loc_t::current()) override {
    launch_(s, "dsa_select", loc, [=](auto& ex) { ref::dsa_select<T>(ex, pol, cd, iq, qpos, qdoc, Nq, kv, S, sel); });
  }
  void dsa_core_forward(Policy pol, const CoreDims& cd, const T* q, const T* iq, const int64_t* qpos, int64_t Nq,
                        const T* kv, int64_t S, const int32_t* sel, T* o, T* stats, T* ikl, Stream s,
                        loc_t loc = loc_t::current()) override {
    launch_(s, "dsa_core_forward", loc, [=](auto& ex) { ref::dsa_core_forward<T>(ex, pol, cd, q, iq, qpos, Nq, kv, S,
        sel, o, stats, ikl); });
  }
  void dsa_core_backward(Policy pol, const CoreDims& cd, const T* q, const T* iq, const int64_t* qpos, int64_t Nq,
                         const T* kv, int64_t S, const int32_t* sel, const T* o, const T* stats, const T* dO, T iscale,
                         Segs qsegs, T* dq, T* diq, ExactAcc<T>* dkv, Stream s, loc_t loc = loc_t::current()) override {
    launch_(s, "dsa_core_backward", loc, [=, sg = held(qsegs)](auto& ex) { ref::dsa_core_backward<T>(ex, pol, cd, q,
        iq, qpos, Nq, kv, S, sel, o, stats, dO, iscale, sg.span(), dq, diq, dkv); });
  }
  void linear_ce_forward(Policy pol, const T* hidden, const T* W, const int32_t* targets, int64_t N, int64_t d,
                         int64_t V, int64_t vocab_chunk, int64_t token_chunk, T* token_loss, T* lse, Stream s,
                         loc_t loc = loc_t::current()) override {
    launch_(s, "linear_ce_forward", loc, [=](auto& ex) { ref::linear_ce_forward<T>(ex, pol, hidden, W, targets, N, d, V,
        vocab_chunk, token_chunk, token_loss, lse); });
  }
  void linear_ce_backward(Policy pol, const T* hidden, const T* W, const int32_t* targets, const T* lse, int64_t N,
                          int64_t d, int64_t V, int64_t vocab_chunk, int64_t token_chunk, T grad_scale, Segs segs,
                          int64_t j_begin, int64_t j_end, T* dhidden, ExactAcc<T>* dW, Stream s,
                          loc_t loc = loc_t::current()) override {
    launch_(s, "linear_ce_backward", loc, [=, sg = held(segs)](auto& ex) { ref::linear_ce_backward<T>(ex, pol, hidden,
        W, targets, lse, N, d, V, vocab_chunk, token_chunk, grad_scale, sg.span(), j_begin, j_end, dhidden, dW); });
  }
  void grad_sq_acc(const T* g, int64_t n, ExactAcc<double>* acc, Stream s, loc_t loc = loc_t::current()) override {
    launch_(s, "grad_sq_acc", loc, [=](auto& ex) { ref::grad_sq_acc<T>(ex, g, n, acc); });
  }
  void adamw_step(T* w, const T* g, T* m, T* v, int64_t n, const model::AdamWHyper& hyper, int64_t step, double clip,
                  bool decay, Stream s, loc_t loc = loc_t::current()) override {
    launch_(s, "adamw_step", loc, [=](auto& ex) { ref::adamw_step<T>(ex, w, g, m, v, n, hyper, step, clip, decay); });
  }
  void router_bias_update(T* b, const int64_t* load, int64_t E, double gamma, Stream s,
                          loc_t loc = loc_t::current()) override {
    launch_(s, "router_bias_update", loc, [=](auto& ex) { ref::router_bias_update<T>(ex, b, load, E, gamma); });
  }

 protected:  // the fast tier (gpu/fast/kernels_impl.h) derives from this class and launches through it
  Launch launch_;
};

}  // namespace trident::gpu::ref
