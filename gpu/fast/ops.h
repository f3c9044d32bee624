// The fast tier's ops (docs/gpu.md "cuda-fast"): the ops of Kernels<T> that the fast tier computes in another
// order than the reference, checked with error bounds (reference/tolerances.h, direction "gpu") instead of bits.
// Like the ref tier (gpu/ref/ops.h) each op is host code templated on an executor (gpu/ref/exec.h) that issues
// bodies over a flat index range; the GEMMs go through a `Gemm` functor:
//   - host (gpu/fast/host_kernels.cpp): a split-K loop (four interleaved partial sums per element, OpenMP);
//   - device (gpu/fast/cuda_kernels.cu): cuBLAS cublasGemmEx (bf16 policy: bf16 operands on tensor cores, fp32
//     accumulation; fp32: CUBLAS_COMPUTE_32F without TF32; fp64: CUBLAS_COMPUTE_64F).
// Gemm: gemm(ex, bf, trans_a, trans_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc): row-major
// C (M,N) ldc [+]= op(A) (M,K) @ op(B) (K,N); op(A) = A (M,K) lda, or A^T with A (K,M) lda when trans_a; op(B)
// likewise; bf: both operands rounded to bf16 (RNE) first. K > 0.
//
// The fused ops:
//   - attention core: flash-style, one pass over the keys in blocks of kKeyBlock with an online softmax (running
//     max and sum, the output rescaled when the max grows), per (row, head); scores never stored. The backward
//     recomputes p from the stats, query side (dq) per (row, head), key side per key (one pass over the query
//     tiles, the in-tile partial of the key's payload row in scratch, added exactly): no (Nq, H, S) buffers.
//   - linear cross-entropy: the logits of one vocab chunk at a time (a GEMM into an (N, chunk) buffer), merged
//     into a running (max, sum) per row (online logsumexp); the full (N, V) logits never exist. The backward runs
//     per chunk: logits, dlogit in place, dhidden += dlogit @ W_chunk^T (GEMM, accumulating), dW tile partials by
//     GEMM, added exactly.
// Dot products inside the bodies use four interleaved partial sums (a vector unit's order), not the reference's
// chain. Every tile reduction keeps the reference's definition across tiles (in-tile partials added exactly),
// so a result never depends on how tiles are spread over ranks; only the in-tile order differs.
#pragma once
#include <cstdint>
#include <span>
#include <type_traits>

#include "gpu/ref/exec.h"
#include "gpu/ref/math.h"
#include "gpu/ref/ops.h"
#include "reference/bf16.h"
#include "reference/exact_acc.h"
#include "reference/model/attention.h"
#include "reference/policy.h"

namespace trident::gpu::fast {

using ref::bf16_operands;
using ref::fadd;
using ref::fdiv;
using ref::fmul;
using ref::fsub;
using ref::operand;
namespace dmx = ref::dmx;

inline constexpr int64_t kKeyBlock = 32;  // keys per block of the online softmax

// sum_c a[c*as] * b[c*bs] with four interleaved partial sums, combined pairwise ((s0 + s1) + (s2 + s3)).
template <class T>
TD_REF inline T dot4(int64_t n, const T* a, int64_t as, const T* b, int64_t bs, bool bf) {
  T s[4] = {T(0), T(0), T(0), T(0)};
  for (int64_t k = 0; k < n; ++k) s[k & 3] = fadd(s[k & 3], fmul(operand(a[k * as], bf), operand(b[k * bs], bf)));
  return fadd(fadd(s[0], s[1]), fadd(s[2], s[3]));
}

// ---- GEMM-like -------------------------------------------------------------------------------------------------
template <class T, class Ex, class Gemm>
void mm(Ex& ex, const Gemm& gemm, Policy pol, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B,
        int64_t ldb, bool trans_b, T* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    ex.for_each(M * N, [=] TD_REF_LAMBDA(int64_t i) { C[(i / N) * ldc + i % N] = T(0); });
    return;
  }
  gemm(ex, bf16_operands<T>(pol), false, trans_b, M, N, K, A, lda, B, ldb, false, C, ldc);
}

// acc (K,M) += X^T dY: per non-empty tile, the partial X_t^T dY_t by one GEMM (its own order), added exactly.
template <class T, class Ex, class Gemm>
void wgrad_acc(Ex& ex, const Gemm& gemm, Policy pol, const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K,
               int64_t M, std::span<const int64_t> segs, ExactAcc<T>* acc, int64_t ld_acc = -1) {
  if (K <= 0 || M <= 0 || segs.empty() || segs.back() == segs.front()) return;
  if (ld_acc < 0) ld_acc = M;
  const bool bf = bf16_operands<T>(pol);
  T* part = ex.template scratch<T>(K * M);
  for (size_t t = 0; t + 1 < segs.size(); ++t) {
    const int64_t r0 = segs[t], len = segs[t + 1] - segs[t];
    if (len <= 0) continue;
    gemm(ex, bf, true, false, K, M, len, X + r0 * ldx, ldx, dY + r0 * ldy, ldy, false, part, M);
    ex.for_each(K * M, [=] TD_REF_LAMBDA(int64_t i) { acc[(i / M) * ld_acc + i % M].add(part[i]); });
  }
}

// ---- attention core: online softmax over key blocks -----------------------------------------------------------
template <class T>
TD_REF inline T score4(const T* qh, const T* kv, int64_t P, int64_t kbase, int64_t j, int64_t Dq, bool bf) {
  return dot4<T>(Dq, qh, 1, kv + j * P + kbase, 1, bf);
}

// One (row, head) of the forward: keys [j0, np) in blocks; o (Dv) is the running accumulator.
template <class T>
TD_REF inline void attn_row_forward(const T* qh, const T* kv, int64_t P, int64_t kbase, int64_t vbase, int64_t Dq,
                                    int64_t Dv, T sc, bool bf, int64_t j0, int64_t np, T* oh, T* st) {
  for (int64_t c = 0; c < Dv; ++c) oh[c] = T(0);
  T m = T(0), l = T(0);
  T e[kKeyBlock];
  for (int64_t b0 = j0; b0 < np; b0 += kKeyBlock) {
    const int64_t nb = np - b0 < kKeyBlock ? np - b0 : kKeyBlock;
    T mb = T(0);
    for (int64_t jj = 0; jj < nb; ++jj) {
      e[jj] = fmul(score4<T>(qh, kv, P, kbase, b0 + jj, Dq, bf), sc);
      if (jj == 0 || e[jj] > mb) mb = e[jj];
    }
    const bool first = b0 == j0;
    const T mn = first || mb > m ? mb : m;
    const T alpha = first ? T(0) : dmx::exp(fsub(m, mn));  // rescale of what the earlier blocks summed
    T ls = T(0);
    for (int64_t jj = 0; jj < nb; ++jj) {
      e[jj] = dmx::exp(fsub(e[jj], mn));
      ls = fadd(ls, e[jj]);
    }
    l = first ? ls : fadd(fmul(l, alpha), ls);
    for (int64_t c = 0; c < Dv; ++c) {
      T a = first ? T(0) : fmul(oh[c], alpha);
      for (int64_t jj = 0; jj < nb; ++jj) a = fadd(a, fmul(operand(e[jj], bf), operand(kv[(b0 + jj) * P + vbase + c], bf)));
      oh[c] = a;
    }
    m = mn;
  }
  if (np > j0)
    for (int64_t c = 0; c < Dv; ++c) oh[c] = fdiv(oh[c], l);
  st[0] = m;
  st[1] = l;
}

template <class T, class Ex>
void attn_doc_core_forward(Ex& ex, Policy pol, const model::CoreDims& cd, const T* q, const int64_t* qpos,
                           const int64_t* qdoc, int64_t Nq, const T* kv, int64_t S, T* o, T* stats) {
  ref::check_query_positions<Ex>(qpos, Nq, S, qdoc);
  const int64_t H = cd.H, Dq = cd.Dq, Dv = cd.Dv, P = cd.P, hpg = cd.H / cd.G, vb = cd.val_base;
  const T sc = static_cast<T>(cd.scale);
  const bool bf = bf16_operands<T>(pol);
  int* bad = ex.flag();
  ex.for_each(Nq * H, [=] TD_REF_LAMBDA(int64_t i) {
    const int64_t r = i / H, h = i % H, g = h / hpg;
    if (ref::bad_position(qpos[r], S, bad)) return;
    const int64_t j0 = ref::first_key(qdoc, r, qpos[r], bad);
    attn_row_forward<T>(q + i * Dq, kv, P, g * Dq, vb + g * Dv, Dq, Dv, sc, bf, j0, qpos[r] + 1, o + i * Dv,
                        stats + i * 2);
  });
  ex.check_flag("attention: a query position outside the key range [0, S) or a document start outside [0, qpos]");
}

// p and ds of one (row, head, key) from the stats (the backward's recomputation).
template <class T>
struct PDs {
  T p, ds;
};
template <class T>
TD_REF inline PDs<T> attn_p_ds(const T* qh, const T* doh, const T* kv, int64_t P, int64_t kbase, int64_t vbase,
                               int64_t Dq, int64_t Dv, T sc, bool bf, int64_t j, T m, T l, T D) {
  const T s = fmul(score4<T>(qh, kv, P, kbase, j, Dq, bf), sc);
  const T p = fdiv(dmx::exp(fsub(s, m)), l);
  const T dp = score4<T>(doh, kv, P, vbase, j, Dv, bf);
  return {operand(p, bf), operand(fmul(fmul(p, fsub(dp, D)), sc), bf)};
}

template <class T, class Ex>
void attn_doc_core_backward(Ex& ex, Policy pol, const model::CoreDims& cd, const T* q, const int64_t* qpos,
                            const int64_t* qdoc, int64_t Nq, const T* kv, int64_t S, const T* o, const T* stats,
                            const T* dO, std::span<const int64_t> qsegs, T* dq, ExactAcc<T>* dkv) {
  ref::check_query_segments("attn_core_backward", qsegs, Nq);
  ref::check_query_positions<Ex>(qpos, Nq, S, qdoc);
  if (Nq <= 0 || S <= 0) return;
  const int64_t H = cd.H, Dq = cd.Dq, Dv = cd.Dv, P = cd.P, hpg = cd.H / cd.G, vb = cd.val_base;
  const T sc = static_cast<T>(cd.scale);
  const bool bf = bf16_operands<T>(pol);
  T* Dbuf = ex.template scratch<T>(Nq * H);
  int* bad = ex.flag();
  // Query side: D = dO . o, then dq = sum over the keys of ds_j k_j.
  ex.for_each(Nq * H, [=] TD_REF_LAMBDA(int64_t i) {
    const int64_t r = i / H, h = i % H, g = h / hpg, np = qpos[r] + 1;
    if (ref::bad_position(qpos[r], S, bad)) return;
    const int64_t j0 = ref::first_key(qdoc, r, qpos[r], bad);
    const T* qh = q + i * Dq;
    const T* doh = dO + i * Dv;
    const T D = dot4<T>(Dv, doh, 1, o + i * Dv, 1, false);
    Dbuf[i] = D;
    T* dqh = dq + i * Dq;
    for (int64_t c = 0; c < Dq; ++c) dqh[c] = T(0);
    for (int64_t j = j0; j < np; ++j) {
      const PDs<T> pd = attn_p_ds<T>(qh, doh, kv, P, g * Dq, vb + g * Dv, Dq, Dv, sc, bf, j, stats[i * 2],
                                     stats[i * 2 + 1], D);
      const T* k = kv + j * P + g * Dq;
      for (int64_t c = 0; c < Dq; ++c) dqh[c] = fadd(dqh[c], fmul(pd.ds, operand(k[c], bf)));
    }
  });
  ex.check_flag("attention: a query position outside the key range [0, S) or a document start outside [0, qpos]");
  // Key side: one body per key; per query tile the payload row's partial in scratch, added exactly.
  const int64_t nt = static_cast<int64_t>(qsegs.size()) - 1;
  const int64_t* sg = ex.meta(qsegs);
  T* part = ex.template scratch<T>(S * P);
  ex.for_each(S, [=] TD_REF_LAMBDA(int64_t j) {
    T* pj = part + j * P;
    for (int64_t t = 0; t < nt; ++t) {
      int64_t nk = 0;
      for (int64_t r = sg[t]; r < sg[t + 1]; ++r) nk = qpos[r] + 1 > nk ? qpos[r] + 1 : nk;
      if (j >= nk) continue;
      for (int64_t c = 0; c < P; ++c) pj[c] = T(0);
      for (int64_t r = sg[t]; r < sg[t + 1]; ++r) {
        if (j > qpos[r] || (qdoc && j < qdoc[r])) continue;
        for (int64_t h = 0; h < H; ++h) {
          const int64_t g = h / hpg, i = r * H + h;
          const T* qh = q + i * Dq;
          const T* doh = dO + i * Dv;
          const PDs<T> pd = attn_p_ds<T>(qh, doh, kv, P, g * Dq, vb + g * Dv, Dq, Dv, sc, bf, j, stats[i * 2],
                                         stats[i * 2 + 1], Dbuf[i]);
          for (int64_t c = 0; c < Dq; ++c) pj[g * Dq + c] = fadd(pj[g * Dq + c], fmul(pd.ds, operand(qh[c], bf)));
          for (int64_t c = 0; c < Dv; ++c)
            pj[vb + g * Dv + c] = fadd(pj[vb + g * Dv + c], fmul(pd.p, operand(doh[c], bf)));
        }
      }
      for (int64_t c = 0; c < P; ++c) dkv[j * P + c].add(pj[c]);
    }
  });
}

// ---- linear cross-entropy: online logsumexp over vocab chunks -------------------------------------------------
template <class T, class Ex, class Gemm>
void linear_ce_forward(Ex& ex, const Gemm& gemm, Policy pol, const T* hidden, const T* W, const int32_t* targets,
                       int64_t N, int64_t d, int64_t V, int64_t vocab_chunk, int64_t token_chunk, T* token_loss,
                       T* lse) {
  TD_CHECK(N >= 0 && d > 0 && V > 0 && vocab_chunk > 0 && token_chunk > 0,
           "linear_ce_forward: N, d, V, vocab_chunk, token_chunk ({}, {}, {}, {}, {})", N, d, V, vocab_chunk,
           token_chunk);
  if constexpr (Ex::kHost) ref::check_targets("linear_ce_forward", targets, N, V);
  if (N == 0) return;
  const bool bf = bf16_operands<T>(pol);
  const int64_t vc = vocab_chunk < V ? vocab_chunk : V;
  T* L = ex.template scratch<T>(N * vc);  // one chunk's logits
  T* run = ex.template scratch<T>(N * 3);  // per row: running max, running sum, the target's logit
  int* bad = ex.flag();
  for (int64_t j0 = 0; j0 < V; j0 += vc) {
    const int64_t w = vc < V - j0 ? vc : V - j0;
    gemm(ex, bf, false, false, N, w, d, hidden, d, W + j0, V, false, L, w);
    ex.for_each(N, [=] TD_REF_LAMBDA(int64_t r) {
      const T* l = L + r * w;
      T* st = run + r * 3;
      const int64_t t = targets[r];
      if (t != ref::kIgnoreIndex && (t < 0 || t >= V)) *bad = 1;
      T m = l[0];
      for (int64_t j = 1; j < w; ++j) m = l[j] > m ? l[j] : m;
      T s = T(0);
      for (int64_t j = 0; j < w; ++j) s = fadd(s, dmx::exp(fsub(l[j], m)));
      if (j0 == 0) {
        st[0] = m;
        st[1] = s;
      } else if (m > st[0]) {
        st[1] = fadd(fmul(st[1], dmx::exp(fsub(st[0], m))), s);
        st[0] = m;
      } else {
        st[1] = fadd(st[1], fmul(s, dmx::exp(fsub(m, st[0]))));
      }
      if (t >= j0 && t < j0 + w) st[2] = l[t - j0];
    });
  }
  ex.for_each(N, [=] TD_REF_LAMBDA(int64_t r) {
    const T* st = run + r * 3;
    lse[r] = fadd(st[0], dmx::log(st[1]));
    token_loss[r] = targets[r] == ref::kIgnoreIndex ? T(0) : fsub(lse[r], st[2]);
  });
  ex.check_flag("linear_ce_forward: a target out of range [0, V) (and not the ignore index -100)");
}

template <class T, class Ex, class Gemm>
void linear_ce_backward(Ex& ex, const Gemm& gemm, Policy pol, const T* hidden, const T* W, const int32_t* targets,
                        const T* lse, int64_t N, int64_t d, int64_t V, int64_t vocab_chunk, int64_t token_chunk,
                        T grad_scale, std::span<const int64_t> segs, int64_t j_begin, int64_t j_end, T* dhidden,
                        ExactAcc<T>* dW) {
  ref::check_linear_ce_backward(N, d, V, vocab_chunk, token_chunk, segs, j_begin, j_end);
  if constexpr (Ex::kHost) ref::check_targets("linear_ce_backward", targets, N, V);
  if (N == 0) return;
  const bool bf = bf16_operands<T>(pol);
  const int64_t wt = j_end - j_begin;  // dW's row length
  const int64_t vc = vocab_chunk < wt ? vocab_chunk : wt;
  T* DL = ex.template scratch<T>(N * vc);
  T* part = ex.template scratch<T>(d * vc);
  int* bad = ex.flag();
  for (int64_t j0 = j_begin; j0 < j_end; j0 += vc) {
    const int64_t w = vc < j_end - j0 ? vc : j_end - j0;
    gemm(ex, bf, false, false, N, w, d, hidden, d, W + j0, V, false, DL, w);
    ex.for_each(N * w, [=] TD_REF_LAMBDA(int64_t i) {  // logits -> dlogit, in place
      const int64_t r = i / w, j = j0 + i % w;
      const int64_t t = targets[r];
      if (t != ref::kIgnoreIndex && (t < 0 || t >= V)) *bad = 1;
      if (t == ref::kIgnoreIndex) {
        DL[i] = T(0);
        return;
      }
      const T p = dmx::exp(fsub(DL[i], lse[r]));
      DL[i] = operand(fmul(j == t ? fsub(p, T(1)) : p, grad_scale), bf);
    });
    // dhidden (N,d) [+]= dlogit (N,w) @ W[:, j0:j0+w]^T
    gemm(ex, bf, false, true, N, d, w, DL, w, W + j0, V, j0 > 0, dhidden, d);
    for (size_t t = 0; t + 1 < segs.size(); ++t) {  // dW tile partials, added exactly
      const int64_t r0 = segs[t], len = segs[t + 1] - segs[t];
      if (len <= 0) continue;
      gemm(ex, bf, true, false, d, w, len, hidden + r0 * d, d, DL + r0 * w, w, false, part, w);
      const int64_t off = j0 - j_begin;
      ex.for_each(d * w, [=] TD_REF_LAMBDA(int64_t i) { dW[(i / w) * wt + off + i % w].add(part[i]); });
    }
  }
  if (j_end == V)
    ex.for_each(N * d, [=] TD_REF_LAMBDA(int64_t i) {
      if (targets[i / d] == ref::kIgnoreIndex) dhidden[i] = T(0);
    });
  ex.check_flag("linear_ce_backward: a target out of range [0, V) (and not the ignore index -100)");
}

}  // namespace trident::gpu::fast
