// CudaRefKernels (gpu/ref/cuda_kernels.h): the ref tier's bodies (gpu/ref/ops.h) launched as CUDA kernels.
// Compiled by nvcc for sm_90 with --fmad=false (and __fmul_rn/__fadd_rn in the bodies), --extended-lambda,
// --expt-relaxed-constexpr; the dm:: functions are the device build of reference/dmath.cpp.
#include "gpu/ref/cuda_kernels.h"

#include <string>

#include "gpu/ref/cuda_exec.cuh"
#include "gpu/ref/ops.h"

namespace trident::gpu {
namespace {

template <class T>
class CudaRefKernels final : public Kernels<T> {
 public:
  using typename Kernels<T>::Config;
  using typename Kernels<T>::AttnW;
  using typename Kernels<T>::AttnG;
  using typename Kernels<T>::AttnBufs;
  using typename Kernels<T>::CoreDims;
  using typename Kernels<T>::Rope;
  using typename Kernels<T>::Segs;
  using typename Kernels<T>::loc_t;
  explicit CudaRefKernels(CudaDevice& dev) : dev_(dev) {}
  void mm(Policy pol, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, bool trans_b, T* C, int64_t ldc, Stream s, loc_t loc = loc_t::current()) override {
    run(s, "mm", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::mm<T>(ex, pol, M, N, K, A, lda, B, ldb, trans_b, C, ldc);
    }, loc);
  }
  void wgrad_acc(Policy pol, const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M, Segs segs, ExactAcc<T>* acc, Stream s, loc_t loc = loc_t::current()) override {
    run(s, "wgrad_acc", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::wgrad_acc<T>(ex, pol, X, ldx, dY, ldy, K, M, segs, acc);
    }, loc);
  }
  void sum_acc(const T* x, int64_t J, Segs segs, ExactAcc<T>* acc, Stream s, loc_t loc = loc_t::current()) override {
    run(s, "sum_acc", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::sum_acc<T>(ex, x, J, segs, acc);
    }, loc);
  }
  void exact_round(const ExactAcc<T>* acc, T* out, int64_t n, Stream s, loc_t loc = loc_t::current()) override {
    run(s, "exact_round", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::exact_round<T>(ex, acc, out, n);
    }, loc);
  }
  void embedding_forward(T* out, const int32_t* tokens, const T* embed, int64_t N, int64_t d, int64_t V, Stream s, loc_t loc = loc_t::current()) override {
    run(s, "embedding_forward", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::embedding_forward<T>(ex, out, tokens, embed, N, d, V);
    }, loc);
  }
  void embedding_backward(ExactAcc<T>* dembed, const int32_t* tokens, const T* dout, int64_t N, int64_t d, Segs segs, Stream s, loc_t loc = loc_t::current()) override {
    run(s, "embedding_backward", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::embedding_backward<T>(ex, dembed, tokens, dout, N, d, segs);
    }, loc);
  }
  void rmsnorm_forward(const T* x, int64_t ldx, const T* g, int64_t N, int64_t d, double eps, T* y, int64_t ldy, T* rinv, Stream s, loc_t loc = loc_t::current()) override {
    run(s, "rmsnorm_forward", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::rmsnorm_forward<T>(ex, x, ldx, g, N, d, eps, y, ldy, rinv);
    }, loc);
  }
  void rmsnorm_backward(const T* dy, int64_t lddy, const T* x, int64_t ldx, const T* rinv, const T* g, int64_t N, int64_t d, Segs segs, T* dx, int64_t lddx, ExactAcc<T>* dg, Stream s, loc_t loc = loc_t::current()) override {
    run(s, "rmsnorm_backward", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::rmsnorm_backward<T>(ex, dy, lddy, x, ldx, rinv, g, N, d, segs, dx, lddx, dg);
    }, loc);
  }
  void residual_forward(T* out, const T* a, const T* b, int64_t n, Stream s, loc_t loc = loc_t::current()) override {
    run(s, "residual_forward", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::residual_forward<T>(ex, out, a, b, n);
    }, loc);
  }
  void swiglu_forward(Policy pol, const T* x, const T* wg, const T* wu, const T* wd, int64_t N, int64_t d, int64_t F, T* ug, T* uu, T* h, T* y, Stream s, loc_t loc = loc_t::current()) override {
    run(s, "swiglu_forward", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::swiglu_forward<T>(ex, pol, x, wg, wu, wd, N, d, F, ug, uu, h, y);
    }, loc);
  }
  void swiglu_backward_dgrad(Policy pol, const T* dy, const T* wg, const T* wu, const T* wd, const T* ug, const T* uu, int64_t N, int64_t d, int64_t F, T* dug, T* duu, T* dx, Stream s, loc_t loc = loc_t::current()) override {
    run(s, "swiglu_backward_dgrad", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::swiglu_backward_dgrad<T>(ex, pol, dy, wg, wu, wd, ug, uu, N, d, F, dug, duu, dx);
    }, loc);
  }
  void expert_forward(Policy pol, const T* x, const T* wg, const T* wu, const T* wd, int64_t N, int64_t d, int64_t F, T* ug, T* uu, T* h, T* y, Stream s, loc_t loc = loc_t::current()) override {
    run(s, "expert_forward", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::swiglu_forward<T>(ex, pol, x, wg, wu, wd, N, d, F, ug, uu, h, y);
    }, loc);
  }
  void expert_backward_dgrad(Policy pol, const T* dy, const T* wg, const T* wu, const T* wd, const T* ug, const T* uu, int64_t N, int64_t d, int64_t F, T* dug, T* duu, T* dx, Stream s, loc_t loc = loc_t::current()) override {
    run(s, "expert_backward_dgrad", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::swiglu_backward_dgrad<T>(ex, pol, dy, wg, wu, wd, ug, uu, N, d, F, dug, duu, dx);
    }, loc);
  }
  void router_forward(Policy pol, const T* a, const T* wr, const T* bias, int64_t N, int64_t d, int64_t E, int64_t K, double alpha, T* logits, T* scores, int32_t* sel, T* gates, Stream s, loc_t loc = loc_t::current()) override {
    run(s, "router_forward", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::router_forward<T>(ex, pol, a, wr, bias, N, d, E, K, alpha, logits, scores, sel, gates);
    }, loc);
  }
  void router_backward(const T* dgates, const T* scores, const int32_t* sel, int64_t N, int64_t E, int64_t K, double alpha, T* dlogits, Stream s, loc_t loc = loc_t::current()) override {
    run(s, "router_backward", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::router_backward<T>(ex, dgates, scores, sel, N, E, K, alpha, dlogits);
    }, loc);
  }
  void moe_combine_forward(T* out, const T* gates, const T* yk, int64_t N, int64_t d, int64_t K, Stream s, loc_t loc = loc_t::current()) override {
    run(s, "moe_combine_forward", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::moe_combine_forward<T>(ex, out, gates, yk, N, d, K);
    }, loc);
  }
  void moe_combine_backward(const T* dout, const T* gates, const T* yk, std::span<const int64_t> tk, int64_t d, int64_t K, T* dgates, T* dyk, Stream s, loc_t loc = loc_t::current()) override {
    run(s, "moe_combine_backward", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::moe_combine_backward<T>(ex, dout, gates, yk, tk, d, K, dgates, dyk);
    }, loc);
  }
  void moe_dx_sum(T* dx, const T* dxk, int64_t N, int64_t d, int64_t K, Stream s, loc_t loc = loc_t::current()) override {
    run(s, "moe_dx_sum", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::moe_dx_sum<T>(ex, dx, dxk, N, d, K);
    }, loc);
  }
  void gather_rows(T* dst, const T* src, std::span<const int64_t> idx, int64_t w, Stream s, loc_t loc = loc_t::current()) override {
    run(s, "gather_rows", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::gather_rows<T>(ex, dst, src, idx, w);
    }, loc);
  }
  void scatter_rows(T* dst, const T* src, std::span<const int64_t> idx, int64_t w, Stream s, loc_t loc = loc_t::current()) override {
    run(s, "scatter_rows", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::scatter_rows<T>(ex, dst, src, idx, w);
    }, loc);
  }
  void kv_zigzag_reorder(T* dst, const T* src, int64_t cp, int64_t block, bool to_gather, Stream s, loc_t loc = loc_t::current()) override {
    run(s, "kv_zigzag_reorder", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::kv_zigzag_reorder<T>(ex, dst, src, cp, block, to_gather);
    }, loc);
  }
  void kv_zigzag_to_gather_acc(ExactAcc<T>* x, ExactAcc<T>* scratch, int64_t cp, int64_t block, Stream s, loc_t loc = loc_t::current()) override {
    run(s, "kv_zigzag_to_gather_acc", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::kv_zigzag_to_gather_acc<T>(ex, x, scratch, cp, block);
    }, loc);
  }
  void attn_qkv_forward(Policy pol, const Config& cfg, const AttnW& W, const T* a, const int64_t* pos, int64_t N,
                        const Rope& rope, const AttnBufs& acts, Stream s, loc_t loc = loc_t::current()) override {
    run(s, "attn_qkv_forward", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::attn_qkv_forward<T>(ex, pol, cfg, W, a, pos, N, rope, acts);
    }, loc);
  }
  void attn_out_forward(Policy pol, const Config& cfg, const AttnW& W, int64_t N, const AttnBufs& acts, T* y, Stream s,
                        loc_t loc = loc_t::current()) override {
    run(s, "attn_out_forward", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::attn_out_forward<T>(ex, pol, cfg, W, N, acts, y);
    }, loc);
  }
  void attn_out_backward(Policy pol, const Config& cfg, const AttnW& W, const AttnG& G, int64_t N,
                         const AttnBufs& acts, const T* dy, Segs segs, T* dO, Stream s,
                         loc_t loc = loc_t::current()) override {
    run(s, "attn_out_backward", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::attn_out_backward<T>(ex, pol, cfg, W, G, N, acts, dy, segs, dO);
    }, loc);
  }
  void attn_qkv_backward(Policy pol, const Config& cfg, const AttnW& W, const AttnG& G, const T* a, const int64_t* pos,
                         int64_t N, const Rope& rope, const AttnBufs& acts, const T* dqc, const T* dpayload, Segs segs,
                         T* da, Stream s, loc_t loc = loc_t::current()) override {
    run(s, "attn_qkv_backward", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::attn_qkv_backward<T>(ex, pol, cfg, W, G, a, pos, N, rope, acts, dqc, dpayload, segs, da);
    }, loc);
  }
  void attn_core_forward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq, const T* kv,
                         int64_t S, T* o, T* stats, Stream s, loc_t loc = loc_t::current()) override {
    run(s, "attn_core_forward", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::attn_core_forward<T>(ex, pol, cd, q, qpos, Nq, kv, S, o, stats);
    }, loc);
  }
  void attn_core_backward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq, const T* kv,
                          int64_t S, const T* o, const T* stats, const T* dO, Segs qsegs, T* dq, ExactAcc<T>* dkv,
                          Stream s, loc_t loc = loc_t::current()) override {
    run(s, "attn_core_backward", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::attn_core_backward<T>(ex, pol, cd, q, qpos, Nq, kv, S, o, stats, dO, qsegs, dq, dkv);
    }, loc);
  }
  void linear_ce_forward(Policy pol, const T* hidden, const T* W, const int32_t* targets, int64_t N, int64_t d,
                         int64_t V, int64_t vocab_chunk, int64_t token_chunk, T* token_loss, T* lse, Stream s,
                         loc_t loc = loc_t::current()) override {
    run(s, "linear_ce_forward", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::linear_ce_forward<T>(ex, pol, hidden, W, targets, N, d, V, vocab_chunk, token_chunk, token_loss, lse);
    }, loc);
  }
  void linear_ce_backward(Policy pol, const T* hidden, const T* W, const int32_t* targets, const T* lse, int64_t N,
                          int64_t d, int64_t V, int64_t vocab_chunk, int64_t token_chunk, T grad_scale, Segs segs,
                          int64_t j_begin, int64_t j_end, T* dhidden, ExactAcc<T>* dW, Stream s,
                          loc_t loc = loc_t::current()) override {
    run(s, "linear_ce_backward", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::linear_ce_backward<T>(ex, pol, hidden, W, targets, lse, N, d, V, vocab_chunk, token_chunk, grad_scale,
                                 segs, j_begin, j_end, dhidden, dW);
    }, loc);
  }
  void grad_sq_acc(const T* g, int64_t n, ExactAcc<double>* acc, Stream s, loc_t loc = loc_t::current()) override {
    run(s, "grad_sq_acc", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::grad_sq_acc<T>(ex, g, n, acc);
    }, loc);
  }
  void adamw_step(T* w, const T* g, T* m, T* v, int64_t n, const model::AdamWHyper& hyper, int64_t step, double clip, bool decay, Stream s, loc_t loc = loc_t::current()) override {
    run(s, "adamw_step", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::adamw_step<T>(ex, w, g, m, v, n, hyper, step, clip, decay);
    }, loc);
  }
  void router_bias_update(T* b, const int64_t* load, int64_t E, double gamma, Stream s, loc_t loc = loc_t::current()) override {
    run(s, "router_bias_update", [&] {
      ref::CudaExec ex(dev_.stream(s));
      ref::router_bias_update<T>(ex, b, load, E, gamma);
    }, loc);
  }

 private:
  // CudaDevice::launch runs the function at once (it enqueues the kernels) and checks cudaGetLastError, naming
  // the op and the caller's line.
  template <class F>
  void run(Stream s, const char* name, F&& fn, loc_t loc) {
    dev_.launch(s, name, Accesses{}, 0, std::function<void()>(std::forward<F>(fn)), loc);
  }
  CudaDevice& dev_;
};

}  // namespace

template <class T>
std::unique_ptr<Kernels<T>> make_cuda_ref_kernels(CudaDevice& dev) {
  return std::make_unique<CudaRefKernels<T>>(dev);
}
template std::unique_ptr<Kernels<float>> make_cuda_ref_kernels<float>(CudaDevice&);
template std::unique_ptr<Kernels<double>> make_cuda_ref_kernels<double>(CudaDevice&);

}  // namespace trident::gpu
