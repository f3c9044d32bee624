// FastKernels<T, Launch, Gemm>: the fast tier (docs/gpu.md "cuda-fast") as a Kernels<T>. It derives from the ref
// tier's RefKernels (gpu/ref/kernels_impl.h), so every op it does not override runs the ref tier's bodies (the
// reference's bits), and overrides only the ops of gpu/fast/ops.h: mm and wgrad_acc (the GEMM functor: split-K on the
// host, cuBLAS on the device), the attention core (online softmax over key blocks) and the linear cross-entropy
// (online logsumexp over vocab chunks). Those are checked against the reference with the tolerance table's "gpu"
// rows (reference/tolerances.h, gpu/fast/bounds.h), not bitwise. A new op added to Kernels<T> and the ref tier
// needs nothing here.
#pragma once
#include <utility>

#include "gpu/fast/ops.h"
#include "gpu/ref/kernels_impl.h"

namespace trident::gpu::fast {

// The ops this tier computes in its own order (checked with tolerances); every other op has the reference's bits.
inline constexpr const char* kFastOps[] = {"mm",
                                           "wgrad_acc",
                                           "attn_core_forward",
                                           "attn_core_backward",
                                           "attn_doc_core_forward",
                                           "attn_doc_core_backward",
                                           "linear_ce_forward",
                                           "linear_ce_backward"};

template <class T, class Launch, class Gemm>
class FastKernels final : public ref::RefKernels<T, Launch> {
  using Base = ref::RefKernels<T, Launch>;

 public:
  using typename Kernels<T>::CoreDims;
  using typename Kernels<T>::Segs;
  using typename Kernels<T>::loc_t;
  FastKernels(Launch launch, Gemm gemm) : Base(std::move(launch)), gemm_(std::move(gemm)) {}

  void mm(Policy pol, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, bool trans_b,
          T* C, int64_t ldc, Stream s, loc_t loc = loc_t::current()) override {
    this->launch_(s, "mm", loc, [=, g = gemm_](auto& ex) { fast::mm<T>(ex, g, pol, M, N, K, A, lda, B, ldb, trans_b,
        C, ldc); });
  }
  void wgrad_acc(Policy pol, const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M, Segs segs,
                 ExactAcc<T>* acc, Stream s, loc_t loc = loc_t::current()) override {
    this->launch_(s, "wgrad_acc", loc, [=, g = gemm_, sg = ref::held(segs)](auto& ex) { fast::wgrad_acc<T>(ex, g, pol,
        X, ldx, dY, ldy, K, M, sg.span(), acc); });
  }
  void attn_core_forward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq, const T* kv,
                         int64_t S, T* o, T* stats, Stream s, loc_t loc = loc_t::current()) override {
    this->launch_(s, "attn_core_forward", loc, [=](auto& ex) { fast::attn_doc_core_forward<T>(ex, pol, cd, q, qpos,
        nullptr, Nq, kv, S, o, stats); });
  }
  void attn_core_backward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq, const T* kv,
                          int64_t S, const T* o, const T* stats, const T* dO, Segs qsegs, T* dq, ExactAcc<T>* dkv,
                          Stream s, loc_t loc = loc_t::current()) override {
    this->launch_(s, "attn_core_backward", loc, [=, sg = ref::held(qsegs)](auto& ex) {
      fast::attn_doc_core_backward<T>(ex, pol, cd, q, qpos, nullptr, Nq, kv, S, o, stats, dO, sg.span(), dq, dkv);
    });
  }
  void attn_doc_core_forward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, const int64_t* qdoc,
                             int64_t Nq, const T* kv, int64_t S, T* o, T* stats, Stream s,
                             loc_t loc = loc_t::current()) override {
    this->launch_(s, "attn_doc_core_forward", loc, [=](auto& ex) { fast::attn_doc_core_forward<T>(ex, pol, cd, q,
        qpos, qdoc, Nq, kv, S, o, stats); });
  }
  void attn_doc_core_backward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, const int64_t* qdoc,
                              int64_t Nq, const T* kv, int64_t S, const T* o, const T* stats, const T* dO, Segs qsegs,
                              T* dq, ExactAcc<T>* dkv, Stream s, loc_t loc = loc_t::current()) override {
    this->launch_(s, "attn_doc_core_backward", loc, [=, sg = ref::held(qsegs)](auto& ex) {
      fast::attn_doc_core_backward<T>(ex, pol, cd, q, qpos, qdoc, Nq, kv, S, o, stats, dO, sg.span(), dq, dkv);
    });
  }
  void linear_ce_forward(Policy pol, const T* hidden, const T* W, const int32_t* targets, int64_t N, int64_t d,
                         int64_t V, int64_t vocab_chunk, int64_t token_chunk, T* token_loss, T* lse, Stream s,
                         loc_t loc = loc_t::current()) override {
    this->launch_(s, "linear_ce_forward", loc, [=, g = gemm_](auto& ex) { fast::linear_ce_forward<T>(ex, g, pol,
        hidden, W, targets, N, d, V, vocab_chunk, token_chunk, token_loss, lse); });
  }
  void linear_ce_backward(Policy pol, const T* hidden, const T* W, const int32_t* targets, const T* lse, int64_t N,
                          int64_t d, int64_t V, int64_t vocab_chunk, int64_t token_chunk, T grad_scale, Segs segs,
                          int64_t j_begin, int64_t j_end, T* dhidden, ExactAcc<T>* dW, Stream s,
                          loc_t loc = loc_t::current()) override {
    this->launch_(s, "linear_ce_backward", loc, [=, g = gemm_, sg = ref::held(segs)](auto& ex) {
      fast::linear_ce_backward<T>(ex, g, pol, hidden, W, targets, lse, N, d, V, vocab_chunk, token_chunk, grad_scale,
                                  sg.span(), j_begin, j_end, dhidden, dW);
    });
  }

 private:
  Gemm gemm_;
};

}  // namespace trident::gpu::fast
