// The ref tier's ops (docs/gpu.md "cuda-ref"): every op of Kernels<T> written here has the reference op's bits
// (reference/model/*, docs/numerics.md). Each op is host code templated on an executor (gpu/ref/exec.h): it
// computes the op's scalars as the reference does, then issues bodies over a flat index range. A body computes one
// output element / row / column with the reference's per-element order:
//   - GEMM-like: s = +0; for k ascending: s = s + round(a*b) (bf16 policy: operands rounded to bf16 first);
//   - tile reductions: per output element, per tile in order, the in-tile partial as one sequential chain from +0,
//     then ExactAcc::add of the partial (exact, so the order of the adds does not matter);
//   - elementwise ops: the reference's expression, operation by operation.
// The reference's checks of the data (token ids, targets, positions, NaN router scores, negative loads) run on the
// host before the bodies with the host executor (the reference's messages); with the CUDA executor the bodies set
// a flag (ex.flag()) and the op throws after its kernels (ex.check_flag: one stream synchronisation).
#pragma once
#include <cmath>  // std::sqrt on the host (the AdamW scalars), as the reference
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "gpu/ref/exec.h"
#include "gpu/ref/math.h"
#include "reference/bf16.h"
#include "reference/exact_acc.h"
#include "reference/model/adamw.h"
#include "reference/model/attention.h"
#include "reference/model/config.h"
#include "reference/model/ops.h"
#include "reference/policy.h"

#include "reference/check.h"

namespace trident::gpu::ref {

// x, or x rounded to bf16 (the bf16 policy's GEMM operands; float only).
template <class T>
TD_REF inline T operand(T x, bool bf) {
  if constexpr (std::is_same_v<T, float>) return bf ? round_bf16(x) : x;
  else return x;
}
// s0 + a[0]*b[0] + a[1]*b[1] + ... in order, each product and sum rounded (the GEMM / tile-partial chain).
template <class T>
TD_REF inline T dot(int64_t n, const T* a, int64_t as, const T* b, int64_t bs, bool bf, T s0) {
  T s = s0;
  for (int64_t k = 0; k < n; ++k) s = fadd(s, fmul(operand(a[k * as], bf), operand(b[k * bs], bf)));
  return s;
}
template <class T>
bool bf16_operands(Policy pol) {
  return std::is_same_v<T, float> && pol == Policy::bf16;
}

// ---- GEMM-like -------------------------------------------------------------------------------------------------
// reference/model/ops.h mm: C (M,N) = A (M,K) @ op(B), one chain per element.
template <class T, class Ex>
void mm(Ex& ex, Policy pol, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
        bool trans_b, T* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  const bool bf = bf16_operands<T>(pol);
  const int64_t bk = trans_b ? 1 : ldb, bn = trans_b ? ldb : 1;  // B(k, n) = B[k * bk + n * bn]
  ex.for_each(M * N, [=] TD_REF_LAMBDA(int64_t i) {
    const int64_t m = i / N, n = i % N;
    C[m * ldc + n] = dot<T>(K, A + m * lda, 1, B + n * bn, bk, bf, T(0));
  });
}

// acc (K,M) += X^T dY over the tiles of segs: per element, per non-empty tile, the in-order partial, added exactly.
// (wgrad_acc_block: into a (K, M) block of a wider accumulator matrix with row stride ld_acc.)
template <class T, class Ex>
void wgrad_acc(Ex& ex, Policy pol, const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M,
               std::span<const int64_t> segs, ExactAcc<T>* acc, int64_t ld_acc = -1) {
  if (K <= 0 || M <= 0 || segs.empty() || segs.back() == segs.front()) return;
  if (ld_acc < 0) ld_acc = M;
  const bool bf = bf16_operands<T>(pol);
  const int64_t nt = static_cast<int64_t>(segs.size()) - 1;
  const int64_t* sg = ex.meta(segs);
  ex.for_each(K * M, [=] TD_REF_LAMBDA(int64_t i) {
    const int64_t k = i / M, m = i % M;
    for (int64_t t = 0; t < nt; ++t) {
      const int64_t r0 = sg[t], len = sg[t + 1] - sg[t];
      if (len == 0) continue;
      acc[k * ld_acc + m].add(dot<T>(len, X + r0 * ldx + k, ldx, dY + r0 * ldy + m, ldy, bf, T(0)));
    }
  });
}

// acc (J) += the rows of x (rows, J) summed per tile (in order from +0), the partials added exactly.
template <class T, class Ex>
void sum_acc(Ex& ex, const T* x, int64_t J, std::span<const int64_t> segs, ExactAcc<T>* acc) {
  if (J <= 0 || segs.empty() || segs.back() == segs.front()) return;
  const int64_t nt = static_cast<int64_t>(segs.size()) - 1;
  const int64_t* sg = ex.meta(segs);
  ex.for_each(J, [=] TD_REF_LAMBDA(int64_t j) {
    for (int64_t t = 0; t < nt; ++t) {
      if (sg[t] == sg[t + 1]) continue;
      T p = T(0);
      for (int64_t r = sg[t]; r < sg[t + 1]; ++r) p = fadd(p, x[r * J + j]);
      acc[j].add(p);
    }
  });
}

template <class T, class Ex>
void exact_round(Ex& ex, const ExactAcc<T>* acc, T* out, int64_t n) {
  ex.for_each(n, [=] TD_REF_LAMBDA(int64_t i) { out[i] = acc[i].round(); });
}

// ---- per-token ops ---------------------------------------------------------------------------------------------
template <class T, class Ex>
void embedding_forward(Ex& ex, T* out, const int32_t* tokens, const T* embed, int64_t N, int64_t d, int64_t V) {
  if constexpr (Ex::kHost)
    for (int64_t r = 0; r < N; ++r)
      if (tokens[r] < 0 || tokens[r] >= V)
        fail(fmt::format("token id {} at row {} is out of range [0, {})", tokens[r], r, V));
  if (N <= 0 || d <= 0) return;
  int* bad = ex.flag();
  ex.for_each(N * d, [=] TD_REF_LAMBDA(int64_t i) {
    const int64_t r = i / d, c = i % d;
    if (tokens[r] < 0 || tokens[r] >= V) {
      *bad = 1;
      return;
    }
    out[i] = embed[static_cast<int64_t>(tokens[r]) * d + c];
  });
  ex.check_flag("embedding_forward: a token id is out of range [0, V)");
}

// Per column c, per tile: each distinct id's rows summed in row order from +0, the partial added exactly.
template <class T, class Ex>
void embedding_backward(Ex& ex, ExactAcc<T>* dembed, const int32_t* tokens, const T* dout, int64_t N, int64_t d,
                        std::span<const int64_t> segs) {
  if (d <= 0 || segs.size() < 2) return;
  const int64_t nt = static_cast<int64_t>(segs.size()) - 1;
  const int64_t* sg = ex.meta(segs);
  ex.for_each(d, [=] TD_REF_LAMBDA(int64_t c) {
    for (int64_t t = 0; t < nt; ++t)
      for (int64_t r = sg[t]; r < sg[t + 1]; ++r) {
        const int32_t id = tokens[r];
        if (id < 0) continue;
        bool first = true;
        for (int64_t q = sg[t]; q < r && first; ++q) first = tokens[q] != id;
        if (!first) continue;
        T p = T(0);
        for (int64_t q = r; q < sg[t + 1]; ++q)
          if (tokens[q] == id) p = fadd(p, dout[q * d + c]);
        dembed[static_cast<int64_t>(id) * d + c].add(p);
      }
  });
}

template <class T, class Ex>
void rmsnorm_forward(Ex& ex, const T* x, int64_t ldx, const T* g, int64_t N, int64_t d, double eps, T* y,
                     int64_t ldy, T* rinv) {
  const T e = static_cast<T>(eps), dd = static_cast<T>(d);
  ex.for_each(N, [=] TD_REF_LAMBDA(int64_t r) {
    const T* xr = x + r * ldx;
    T ss = T(0);
    for (int64_t i = 0; i < d; ++i) ss = fadd(ss, fmul(xr[i], xr[i]));
    const T ri = dmx::rsqrt(fadd(fdiv(ss, dd), e));
    rinv[r] = ri;
    T* yr = y + r * ldy;
    for (int64_t i = 0; i < d; ++i) yr[i] = fmul(fmul(xr[i], ri), g[i]);
  });
}

template <class T, class Ex>
void rmsnorm_backward(Ex& ex, const T* dy, int64_t lddy, const T* x, int64_t ldx, const T* rinv, const T* g,
                      int64_t N, int64_t d, std::span<const int64_t> segs, T* dx, int64_t lddx, ExactAcc<T>* dg) {
  const T dd = static_cast<T>(d);
  ex.for_each(N, [=] TD_REF_LAMBDA(int64_t r) {
    const T* xr = x + r * ldx;
    const T* dyr = dy + r * lddy;
    const T ri = rinv[r];
    T c = T(0);
    for (int64_t i = 0; i < d; ++i) c = fadd(c, fmul(fmul(dyr[i], g[i]), fmul(xr[i], ri)));
    c = fdiv(c, dd);
    T* dxr = dx + r * lddx;
    for (int64_t i = 0; i < d; ++i) {
      const T xh = fmul(xr[i], ri), dxh = fmul(dyr[i], g[i]);
      dxr[i] = fmul(ri, fsub(dxh, fmul(xh, c)));
    }
  });
  if (!dg || d <= 0 || segs.empty() || segs.back() == segs.front()) return;
  const int64_t nt = static_cast<int64_t>(segs.size()) - 1;
  const int64_t* sg = ex.meta(segs);
  ex.for_each(d, [=] TD_REF_LAMBDA(int64_t i) {  // the gain terms dy * xhat, per tile (sum_acc's order)
    for (int64_t t = 0; t < nt; ++t) {
      if (sg[t] == sg[t + 1]) continue;
      T p = T(0);
      for (int64_t r = sg[t]; r < sg[t + 1]; ++r) p = fadd(p, fmul(dy[r * lddy + i], fmul(x[r * ldx + i], rinv[r])));
      dg[i].add(p);
    }
  });
}

template <class T, class Ex>
void residual_forward(Ex& ex, T* out, const T* a, const T* b, int64_t n) {
  ex.for_each(n, [=] TD_REF_LAMBDA(int64_t i) { out[i] = fadd(a[i], b[i]); });
}

template <class T, class Ex>
void swiglu_forward(Ex& ex, Policy pol, const T* x, const T* wg, const T* wu, const T* wd, int64_t N, int64_t d,
                    int64_t F, T* ug, T* uu, T* h, T* y) {
  if (N == 0) return;
  mm<T>(ex, pol, N, F, d, x, d, wg, F, false, ug, F);
  mm<T>(ex, pol, N, F, d, x, d, wu, F, false, uu, F);
  ex.for_each(N * F, [=] TD_REF_LAMBDA(int64_t i) { h[i] = fmul(dmx::silu(ug[i]), uu[i]); });
  mm<T>(ex, pol, N, d, F, h, F, wd, d, false, y, d);
}

template <class T, class Ex>
void swiglu_backward_dgrad(Ex& ex, Policy pol, const T* dy, const T* wg, const T* wu, const T* wd, const T* ug,
                           const T* uu, int64_t N, int64_t d, int64_t F, T* dug, T* duu, T* dx) {
  if (N == 0) return;
  T* dh = ex.template scratch<T>(N * F);
  T* t2 = ex.template scratch<T>(N * d);
  mm<T>(ex, pol, N, F, d, dy, d, wd, d, true, dh, F);
  ex.for_each(N * F, [=] TD_REF_LAMBDA(int64_t i) {
    const T sg = dmx::sigmoid(ug[i]);
    dug[i] = fmul(fmul(dh[i], uu[i]), fmul(sg, fadd(T(1), fmul(ug[i], fsub(T(1), sg)))));
    duu[i] = fmul(dh[i], dmx::silu(ug[i]));
  });
  mm<T>(ex, pol, N, d, F, dug, F, wg, F, true, dx, d);
  mm<T>(ex, pol, N, d, F, duu, F, wu, F, true, t2, d);
  residual_forward<T>(ex, dx, dx, t2, N * d);
}

// Top-K by biased score: the k-th pick is the best of the experts ranked after the (k-1)-th in the order
// (biased descending, then index ascending), which is the reference's greedy strict-'>' scan.
template <class T, class Ex>
void router_forward(Ex& ex, Policy pol, const T* a, const T* wr, const T* bias, int64_t N, int64_t d, int64_t E,
                    int64_t K, double alpha, T* logits, T* scores, int32_t* sel, T* gates) {
  if (N == 0) return;
  mm<T>(ex, pol, N, E, d, a, d, wr, E, false, logits, E);
  const T al = static_cast<T>(alpha);
  int* bad = ex.flag();
  ex.for_each(N, [=] TD_REF_LAMBDA(int64_t r) {
    T* s = scores + r * E;
    for (int64_t e = 0; e < E; ++e) {
      s[e] = dmx::sigmoid(logits[r * E + e]);
      if (s[e] != s[e]) *bad = 1;
    }
    int32_t* sr = sel + r * K;
    int64_t prev = -1;
    for (int64_t k = 0; k < K; ++k) {
      int64_t best = -1;
      T bb = T(0), pb = prev < 0 ? T(0) : fadd(s[prev], bias[prev]);
      for (int64_t e = 0; e < E; ++e) {
        const T be = fadd(s[e], bias[e]);
        const bool after_prev = prev < 0 || be < pb || (be == pb && e > prev);
        if (after_prev && (best < 0 || be > bb)) best = e, bb = be;
      }
      sr[k] = static_cast<int32_t>(best);
      prev = best;
    }
    for (int64_t k = 1; k < K; ++k)  // ascending expert ids (insertion sort)
      for (int64_t j = k; j > 0 && sr[j - 1] > sr[j]; --j) {
        const int32_t t = sr[j];
        sr[j] = sr[j - 1];
        sr[j - 1] = t;
      }
    T ssum = T(0);
    for (int64_t k = 0; k < K; ++k) ssum = fadd(ssum, s[sr[k]]);
    for (int64_t k = 0; k < K; ++k) gates[r * K + k] = fdiv(fmul(al, s[sr[k]]), ssum);
  });
  if constexpr (Ex::kHost)
    for (int64_t r = 0; r < N; ++r)
      for (int64_t e = 0; e < E; ++e)
        TD_CHECK(!std::isnan(scores[r * E + e]), "router: NaN score at row {} expert {}", r, e);
  ex.check_flag("router: a NaN score");
}

template <class T, class Ex>
void router_backward(Ex& ex, const T* dgates, const T* scores, const int32_t* sel, int64_t N, int64_t E, int64_t K,
                     double alpha, T* dlogits) {
  const T al = static_cast<T>(alpha);
  ex.for_each(N, [=] TD_REF_LAMBDA(int64_t r) {
    const T* s = scores + r * E;
    const int32_t* sr = sel + r * K;
    const T* dg = dgates + r * K;
    T* dl = dlogits + r * E;
    for (int64_t e = 0; e < E; ++e) dl[e] = T(0);
    T ssum = T(0), c = T(0);
    for (int64_t k = 0; k < K; ++k) ssum = fadd(ssum, s[sr[k]]);
    for (int64_t k = 0; k < K; ++k) c = fadd(c, fmul(dg[k], s[sr[k]]));
    const T cs = fdiv(c, ssum);
    for (int64_t k = 0; k < K; ++k) {
      const T se = s[sr[k]];
      const T ds = fdiv(fmul(al, fsub(dg[k], cs)), ssum);
      dl[sr[k]] = fmul(ds, fmul(se, fsub(T(1), se)));
    }
  });
}

template <class T, class Ex>
void moe_combine_forward(Ex& ex, T* out, const T* gates, const T* yk, int64_t N, int64_t d, int64_t K) {
  ex.for_each(N * d, [=] TD_REF_LAMBDA(int64_t i) {
    const int64_t t = i / d, c = i % d;
    T o = T(0);
    for (int64_t k = 0; k < K; ++k) o = fadd(o, fmul(gates[t * K + k], yk[(t * K + k) * d + c]));
    out[i] = o;
  });
}

template <class T, class Ex>
void moe_combine_backward(Ex& ex, const T* dout, const T* gates, const T* yk, std::span<const int64_t> tk, int64_t d,
                          int64_t K, T* dgates, T* dyk) {
  const int64_t n = static_cast<int64_t>(tk.size());
  if (n == 0) return;
  const int64_t* p_of = ex.meta(tk);
  ex.for_each(n, [=] TD_REF_LAMBDA(int64_t j) {
    const int64_t p = p_of[j], t = p / K;
    const T g = gates[p];
    T s = T(0);
    for (int64_t c = 0; c < d; ++c) {
      s = fadd(s, fmul(dout[t * d + c], yk[p * d + c]));
      dyk[j * d + c] = fmul(g, dout[t * d + c]);
    }
    dgates[p] = s;
  });
}

template <class T, class Ex>
void moe_dx_sum(Ex& ex, T* dx, const T* dxk, int64_t N, int64_t d, int64_t K) {
  ex.for_each(N * d, [=] TD_REF_LAMBDA(int64_t i) {
    const int64_t t = i / d, c = i % d;
    T o = T(0);
    for (int64_t k = 0; k < K; ++k) o = fadd(o, dxk[(t * K + k) * d + c]);
    dx[i] = o;
  });
}

template <class T, class Ex>
void gather_rows(Ex& ex, T* dst, const T* src, std::span<const int64_t> idx, int64_t w) {
  const int64_t n = static_cast<int64_t>(idx.size());
  if (n == 0 || w <= 0) return;
  const int64_t* ix = ex.meta(idx);
  ex.for_each(n * w, [=] TD_REF_LAMBDA(int64_t i) { dst[i] = src[ix[i / w] * w + i % w]; });
}

template <class T, class Ex>
void scatter_rows(Ex& ex, T* dst, const T* src, std::span<const int64_t> idx, int64_t w) {
  const int64_t n = static_cast<int64_t>(idx.size());
  if (n == 0 || w <= 0) return;
  const int64_t* ix = ex.meta(idx);
  ex.for_each(n * w, [=] TD_REF_LAMBDA(int64_t i) { dst[ix[i / w] * w + i % w] = src[i]; });
}

// ---- context-parallel block moves (reference/model/rows.h) --------------------------------------------------
TD_HD inline int64_t zigzag_slot(int64_t b, int64_t cp) { return b < cp ? 2 * b : 2 * (2 * cp - 1 - b) + 1; }

template <class T, class Ex>
void kv_zigzag_reorder(Ex& ex, T* dst, const T* src, int64_t cp, int64_t block, bool to_gather) {
  if (cp <= 0 || block <= 0) return;
  ex.for_each(2 * cp * block, [=] TD_REF_LAMBDA(int64_t i) {
    const int64_t b = i / block, off = i % block, sl = zigzag_slot(b, cp);
    if (to_gather) dst[sl * block + off] = src[i];
    else dst[i] = src[sl * block + off];
  });
}

// In place through the permutation's cycles with one block of scratch (the reference's order of swaps).
template <class T, class Ex>
void kv_zigzag_to_gather_acc(Ex& ex, ExactAcc<T>* x, ExactAcc<T>* scratch, int64_t cp, int64_t block) {
  if (cp <= 0 || block <= 0) return;
  std::vector<bool> done(static_cast<size_t>(2 * cp), false);
  for (int64_t b0 = 0; b0 < 2 * cp; ++b0) {
    if (done[static_cast<size_t>(b0)] || zigzag_slot(b0, cp) == b0) continue;
    ExactAcc<T>* first = x + b0 * block;
    ex.for_each(block, [=] TD_REF_LAMBDA(int64_t i) { scratch[i] = first[i]; });
    int64_t b = b0;
    do {
      const int64_t nb = zigzag_slot(b, cp);
      ExactAcc<T>* blk = x + nb * block;
      ex.for_each(block, [=] TD_REF_LAMBDA(int64_t i) {
        const ExactAcc<T> t = scratch[i];
        scratch[i] = blk[i];
        blk[i] = t;
      });
      done[static_cast<size_t>(nb)] = true;
      b = nb;
    } while (b != b0);
  }
}

// ---- row moves and RoPE (reference/model/ops.h) ----------------------------------------------------------------
template <class T, class Ex>
void fill_zero(Ex& ex, T* p, int64_t n) {
  ex.for_each(n, [=] TD_REF_LAMBDA(int64_t i) { p[i] = T(0); });
}
// dst (rows, w) row stride ldd = src (rows, w) row stride lds.
template <class T, class Ex>
void copy_rows(Ex& ex, T* dst, int64_t ldd, const T* src, int64_t lds, int64_t rows, int64_t w) {
  if (rows <= 0 || w <= 0) return;
  ex.for_each(rows * w, [=] TD_REF_LAMBDA(int64_t i) { dst[(i / w) * ldd + i % w] = src[(i / w) * lds + i % w]; });
}
// rope_forward / rope_backward on n_heads heads of each row (one body per rotated pair).
template <class T, class Ex>
void rope(Ex& ex, bool backward, T* x, int64_t ldx, int64_t n_heads, int64_t head_stride, const int64_t* pos,
          int64_t N, const model::RopeTable<T>& tab) {
  if constexpr (Ex::kHost)
    for (int64_t r = 0; r < N; ++r)
      TD_CHECK(pos[r] >= 0 && pos[r] < tab.max_pos, "rope: position {} outside the table [0, {})", pos[r], tab.max_pos);
  const int64_t h = tab.D / 2;
  if (N <= 0 || n_heads <= 0 || h <= 0) return;
  const T* cs = ex.table(std::span<const T>(tab.cos));  // uploaded once per table on a GPU
  const T* sn = ex.table(std::span<const T>(tab.sin));
  const int64_t max_pos = tab.max_pos;
  int* bad = ex.flag();
  ex.for_each(N * n_heads * h, [=] TD_REF_LAMBDA(int64_t e) {
    const int64_t r = e / (n_heads * h), hd = (e / h) % n_heads, i = e % h;
    if (pos[r] < 0 || pos[r] >= max_pos) {
      *bad = 1;
      return;
    }
    const T c = cs[pos[r] * h + i], s = sn[pos[r] * h + i];
    T* u = x + r * ldx + hd * head_stride;
    const T a = u[i], b = u[i + h];
    if (!backward) {
      u[i] = fsub(fmul(a, c), fmul(b, s));
      u[i + h] = fadd(fmul(b, c), fmul(a, s));
    } else {
      u[i] = fadd(fmul(a, c), fmul(b, s));
      u[i + h] = fsub(fmul(b, c), fmul(a, s));
    }
  });
  ex.check_flag("rope: a position outside the table");
}

// ---- attention projections (reference/model/attention.cpp "(a) projections"): the reference's sequence of
// GEMMs, norms, RoPE and row moves, each one of the ops above -----------------------------------------------------
template <class T, class Ex>
void attn_qkv_forward(Ex& ex, Policy pol, const model::Config& cfg, const model::AttnW<T>& W, const T* a,
                      const int64_t* pos, int64_t N, const model::RopeTable<T>& rp, const model::AttnBufs<T>& A) {
  const int64_t d = cfg.d_model, H = cfg.heads, P = cfg.payload_dim();
  fill_zero<T>(ex, A.payload, N * P);
  if (cfg.attn == model::AttnKind::gqa) {
    const int64_t Dh = cfg.head_dim, Hkv = cfg.kv_heads;
    fill_zero<T>(ex, A.qc, N * H * Dh);
    mm<T>(ex, pol, N, H * Dh, d, a, d, W.wq, H * Dh, false, A.qc, H * Dh);
    rope<T>(ex, false, A.qc, H * Dh, H, Dh, pos, N, rp);
    mm<T>(ex, pol, N, Hkv * Dh, d, a, d, W.wk, Hkv * Dh, false, A.payload, P);
    rope<T>(ex, false, A.payload, P, Hkv, Dh, pos, N, rp);
    mm<T>(ex, pol, N, Hkv * Dh, d, a, d, W.wv, Hkv * Dh, false, A.payload + Hkv * Dh, P);
    return;
  }
  const int64_t Dn = cfg.nope_dim, Dr = cfg.rope_dim, r = cfg.kv_lora_rank, Qw = H * (Dn + Dr), Dq = r + Dr;
  fill_zero<T>(ex, A.q, N * Qw);
  mm<T>(ex, pol, N, Qw, d, a, d, W.wq, Qw, false, A.q, Qw);
  fill_zero<T>(ex, A.qc, N * H * Dq);
  for (int64_t h = 0; h < H; ++h) {
    mm<T>(ex, pol, N, r, Dn, A.q + h * (Dn + Dr), Qw, W.wuk + h * Dn, H * Dn, true, A.qc + h * Dq, H * Dq);
    copy_rows<T>(ex, A.qc + h * Dq + r, H * Dq, A.q + h * (Dn + Dr) + Dn, Qw, N, Dr);
  }
  rope<T>(ex, false, A.qc + r, H * Dq, H, Dq, pos, N, rp);
  fill_zero<T>(ex, A.c, N * Dq);
  mm<T>(ex, pol, N, r + Dr, d, a, d, W.wdkv, r + Dr, false, A.c, r + Dr);
  fill_zero<T>(ex, A.kv_rinv, N);
  rmsnorm_forward<T>(ex, A.c, r + Dr, W.kv_norm, N, r, cfg.norm_eps, A.payload, P, A.kv_rinv);
  copy_rows<T>(ex, A.payload + r, P, A.c + r, r + Dr, N, Dr);
  rope<T>(ex, false, A.payload + r, P, 1, 0, pos, N, rp);
}

template <class T, class Ex>
void attn_out_forward(Ex& ex, Policy pol, const model::Config& cfg, const model::AttnW<T>& W, int64_t N,
                      const model::AttnBufs<T>& A, T* y) {
  const int64_t d = cfg.d_model, H = cfg.heads;
  if (cfg.attn == model::AttnKind::gqa) {
    const int64_t Dh = cfg.head_dim;
    mm<T>(ex, pol, N, d, H * Dh, A.o, H * Dh, W.wo, d, false, y, d);
    return;
  }
  const int64_t r = cfg.kv_lora_rank, Dv = cfg.v_dim;
  fill_zero<T>(ex, A.ocat, N * H * Dv);
  for (int64_t h = 0; h < H; ++h)
    mm<T>(ex, pol, N, Dv, r, A.o + h * r, H * r, W.wuv + h * Dv, H * Dv, false, A.ocat + h * Dv, H * Dv);
  mm<T>(ex, pol, N, d, H * Dv, A.ocat, H * Dv, W.wo, d, false, y, d);
}

template <class T, class Ex>
void attn_out_backward(Ex& ex, Policy pol, const model::Config& cfg, const model::AttnW<T>& W,
                       const model::AttnG<T>& G, int64_t N, const model::AttnBufs<T>& A, const T* dy,
                       std::span<const int64_t> segs, T* dO) {
  const int64_t d = cfg.d_model, H = cfg.heads;
  if (cfg.attn == model::AttnKind::gqa) {
    const int64_t Dh = cfg.head_dim;
    wgrad_acc<T>(ex, pol, A.o, H * Dh, dy, d, H * Dh, d, segs, G.wo);
    mm<T>(ex, pol, N, H * Dh, d, dy, d, W.wo, d, true, dO, H * Dh);
    return;
  }
  const int64_t r = cfg.kv_lora_rank, Dv = cfg.v_dim;
  wgrad_acc<T>(ex, pol, A.ocat, H * Dv, dy, d, H * Dv, d, segs, G.wo);
  T* docat = ex.template scratch<T>(N * H * Dv);
  mm<T>(ex, pol, N, H * Dv, d, dy, d, W.wo, d, true, docat, H * Dv);
  for (int64_t h = 0; h < H; ++h) {
    wgrad_acc<T>(ex, pol, A.o + h * r, H * r, docat + h * Dv, H * Dv, r, Dv, segs, G.wuv + h * Dv, H * Dv);
    mm<T>(ex, pol, N, r, Dv, docat + h * Dv, H * Dv, W.wuv + h * Dv, H * Dv, true, dO + h * r, H * r);
  }
}

template <class T, class Ex>
void attn_qkv_backward(Ex& ex, Policy pol, const model::Config& cfg, const model::AttnW<T>& W,
                       const model::AttnG<T>& G, const T* a, const int64_t* pos, int64_t N,
                       const model::RopeTable<T>& rp, const model::AttnBufs<T>& A, const T* dqc, const T* dpayload,
                       std::span<const int64_t> segs, T* da) {
  const int64_t d = cfg.d_model, H = cfg.heads, P = cfg.payload_dim();
  T* tmp = ex.template scratch<T>(N * d);
  if (cfg.attn == model::AttnKind::gqa) {
    const int64_t Dh = cfg.head_dim, Hkv = cfg.kv_heads, Kw = Hkv * Dh;
    T* dq = ex.template scratch<T>(N * H * Dh);
    T* dk = ex.template scratch<T>(N * Kw);
    copy_rows<T>(ex, dq, H * Dh, dqc, H * Dh, N, H * Dh);
    rope<T>(ex, true, dq, H * Dh, H, Dh, pos, N, rp);
    copy_rows<T>(ex, dk, Kw, dpayload, P, N, Kw);
    rope<T>(ex, true, dk, Kw, Hkv, Dh, pos, N, rp);
    const T* dv = dpayload + Kw;
    wgrad_acc<T>(ex, pol, a, d, dq, H * Dh, d, H * Dh, segs, G.wq);
    wgrad_acc<T>(ex, pol, a, d, dk, Kw, d, Kw, segs, G.wk);
    wgrad_acc<T>(ex, pol, a, d, dv, P, d, Kw, segs, G.wv);
    mm<T>(ex, pol, N, d, H * Dh, dq, H * Dh, W.wq, H * Dh, true, da, d);
    mm<T>(ex, pol, N, d, Kw, dk, Kw, W.wk, Kw, true, tmp, d);
    residual_forward<T>(ex, da, da, tmp, N * d);
    mm<T>(ex, pol, N, d, Kw, dv, P, W.wv, Kw, true, tmp, d);
    residual_forward<T>(ex, da, da, tmp, N * d);
    return;
  }
  const int64_t Dn = cfg.nope_dim, Dr = cfg.rope_dim, r = cfg.kv_lora_rank, Qw = H * (Dn + Dr), Dq = r + Dr;
  T* dq = ex.template scratch<T>(N * Qw);
  T* dc = ex.template scratch<T>(N * Dq);
  for (int64_t h = 0; h < H; ++h) {
    mm<T>(ex, pol, N, Dn, r, dqc + h * Dq, H * Dq, W.wuk + h * Dn, H * Dn, false, dq + h * (Dn + Dr), Qw);
    wgrad_acc<T>(ex, pol, dqc + h * Dq, H * Dq, A.q + h * (Dn + Dr), Qw, r, Dn, segs, G.wuk + h * Dn, H * Dn);
    copy_rows<T>(ex, dq + h * (Dn + Dr) + Dn, Qw, dqc + h * Dq + r, H * Dq, N, Dr);
  }
  rope<T>(ex, true, dq + Dn, Qw, H, Dn + Dr, pos, N, rp);
  rmsnorm_backward<T>(ex, dpayload, P, A.c, Dq, A.kv_rinv, W.kv_norm, N, r, segs, dc, Dq, G.kv_norm);
  copy_rows<T>(ex, dc + r, Dq, dpayload + r, P, N, Dr);
  rope<T>(ex, true, dc + r, Dq, 1, 0, pos, N, rp);
  wgrad_acc<T>(ex, pol, a, d, dq, Qw, d, Qw, segs, G.wq);
  wgrad_acc<T>(ex, pol, a, d, dc, Dq, d, Dq, segs, G.wdkv);
  mm<T>(ex, pol, N, d, Qw, dq, Qw, W.wq, Qw, true, da, d);
  mm<T>(ex, pol, N, d, Dq, dc, Dq, W.wdkv, Dq, true, tmp, d);
  residual_forward<T>(ex, da, da, tmp, N * d);
}

// ---- attention core (reference/model/attention.h) -------------------------------------------------------------
// Causal softmax attention of query rows over key positions [0, qpos]: one body per (row, head). Scores are the
// reference's chains (s = +0; s += q[c]*k[c], c ascending; times scale), the running max, the exp sum in key
// order, then o[c] = +0 + p_0 v_0[c] + p_1 v_1[c] + ..., keys ascending. bf16: q, k, v (and dO) rounded operands,
// p rounded before the value products.
template <class T>
TD_REF inline T score(const T* qh, const T* kv, int64_t P, int64_t kbase, int64_t j, int64_t Dq, bool bf) {
  T s = T(0);
  for (int64_t c = 0; c < Dq; ++c) s = fadd(s, fmul(operand(qh[c], bf), operand(kv[j * P + kbase + c], bf)));
  return s;
}

// Query positions must lie in the key range [0, S): checked on the host (the reference's message) or flagged by
// the body that would read out of range.
// Packed sequences: qdoc (nullable) holds each query's document start, which must lie in [0, qpos].
template <class Ex>
void check_query_positions(const int64_t* qpos, int64_t Nq, int64_t S, const int64_t* qdoc = nullptr) {
  if constexpr (Ex::kHost)
    for (int64_t r = 0; r < Nq; ++r) {
      TD_CHECK(qpos[r] >= 0 && qpos[r] < S, "attention: query position {} outside the key range [0, {})", qpos[r], S);
      if (qdoc)
        TD_CHECK(qdoc[r] >= 0 && qdoc[r] <= qpos[r], "attention: document start {} of the query at position {} is "
                 "outside [0, {}]", qdoc[r], qpos[r], qpos[r]);
    }
}
// A backward's query tiles must cover the rows [0, Nq) (the reference's message, naming the op).
inline void check_query_segments(const char* op, std::span<const int64_t> qsegs, int64_t Nq) {
  TD_CHECK(!qsegs.empty() && qsegs.front() == 0 && qsegs.back() == Nq, "{}: query segments must cover rows [0, {})",
           op, Nq);
}
TD_REF inline bool bad_position(int64_t p, int64_t S, int* bad) {
  if (p >= 0 && p < S) return false;
  *bad = 1;
  return true;
}
// Query r's first key: its document's start (packed sequences) or 0; an out-of-range start is flagged.
TD_REF inline int64_t first_key(const int64_t* qdoc, int64_t r, int64_t p, int* bad) {
  if (!qdoc) return 0;
  if (qdoc[r] >= 0 && qdoc[r] <= p) return qdoc[r];
  *bad = 1;
  return p + 1;
}

// qdoc (nullable): keys [qdoc[r], qpos[r]] instead of [0, qpos[r]] (attn_doc_core_forward), the same chains over them.
template <class T, class Ex>
void attn_doc_core_forward(Ex& ex, Policy pol, const model::CoreDims& cd, const T* q, const int64_t* qpos,
                           const int64_t* qdoc, int64_t Nq, const T* kv, int64_t S, T* o, T* stats) {
  check_query_positions<Ex>(qpos, Nq, S, qdoc);
  const int64_t H = cd.H, Dq = cd.Dq, Dv = cd.Dv, P = cd.P, hpg = cd.H / cd.G, vb = cd.val_base;
  const T sc = static_cast<T>(cd.scale);
  const bool bf = bf16_operands<T>(pol);
  int* bad = ex.flag();
  ex.for_each(Nq * H, [=] TD_REF_LAMBDA(int64_t i) {
    const int64_t r = i / H, h = i % H, g = h / hpg, np = qpos[r] + 1;
    if (bad_position(qpos[r], S, bad)) return;
    const int64_t j0 = first_key(qdoc, r, qpos[r], bad);
    const T* qh = q + i * Dq;
    T m = T(0);
    for (int64_t j = j0; j < np; ++j) {
      const T sj = fmul(score(qh, kv, P, g * Dq, j, Dq, bf), sc);
      if (j == j0 || sj > m) m = sj;
    }
    T l = T(0);
    for (int64_t j = j0; j < np; ++j) l = fadd(l, dmx::exp(fsub(fmul(score(qh, kv, P, g * Dq, j, Dq, bf), sc), m)));
    T* oh = o + i * Dv;
    for (int64_t c = 0; c < Dv; ++c) oh[c] = T(0);
    for (int64_t j = j0; j < np; ++j) {
      const T e = dmx::exp(fsub(fmul(score(qh, kv, P, g * Dq, j, Dq, bf), sc), m));
      const T p = operand(fdiv(e, l), bf);
      const T* v = kv + j * P + vb + g * Dv;
      for (int64_t c = 0; c < Dv; ++c) oh[c] = fadd(oh[c], fmul(p, operand(v[c], bf)));
    }
    stats[i * 2 + 0] = m;
    stats[i * 2 + 1] = l;
  });
  ex.check_flag("attention: a query position outside the key range [0, S) or a document start outside [0, qpos]");
}
template <class T, class Ex>
void attn_core_forward(Ex& ex, Policy pol, const model::CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq,
                       const T* kv, int64_t S, T* o, T* stats) {
  attn_doc_core_forward<T>(ex, pol, cd, q, qpos, nullptr, Nq, kv, S, o, stats);
}

// Backward. Query side, one body per (row, head): p_j and dsc_j = (p_j (dp_j - D)) scale (bf16: both rounded) into
// scratch (Nq, H, S), and dq[c] = +0 + dsc_0 k_0[c] + dsc_1 k_1[c] + ..., keys ascending. Key side, one body per
// payload element (key j, column c): per query tile, the in-tile partial over (row, head) in order, the K term and
// then the V term of each (they share columns under MLA), added exactly.
// One key's query-side terms of the backward (attn_doc_core_backward and dsa_core_backward): p = exp(s - m) / l
// recomputed from the stats, dp = dO . v, ds = (p (dp - D)) scale; dq += ds k (keys in the caller's order). Returns
// p and ds as the key side uses them (bf16: rounded).
template <class T>
struct KeyTerms {
  T p, ds;
};
template <class T>
TD_REF inline KeyTerms<T> key_terms(const T* qh, const T* doh, const T* kv, int64_t P, int64_t kbase, int64_t vbase,
                                    int64_t Dq, int64_t Dv, T sc, bool bf, int64_t j, T m, T l, T D, T* dqh) {
  const T s = fmul(score(qh, kv, P, kbase, j, Dq, bf), sc);
  const T p = fdiv(dmx::exp(fsub(s, m)), l);
  const T dp = score(doh, kv, P, vbase, j, Dv, bf);
  const T ds = operand(fmul(fmul(p, fsub(dp, D)), sc), bf);
  const T* k = kv + j * P + kbase;
  for (int64_t c = 0; c < Dq; ++c) dqh[c] = fadd(dqh[c], fmul(ds, operand(k[c], bf)));
  return {operand(p, bf), ds};
}

// qdoc (nullable): keys [qdoc[r], qpos[r]] only (attn_doc_core_backward); masked pairs add nothing.
template <class T, class Ex>
void attn_doc_core_backward(Ex& ex, Policy pol, const model::CoreDims& cd, const T* q, const int64_t* qpos,
                            const int64_t* qdoc, int64_t Nq, const T* kv, int64_t S, const T* o, const T* stats,
                            const T* dO, std::span<const int64_t> qsegs, T* dq, ExactAcc<T>* dkv) {
  check_query_segments("attn_core_backward", qsegs, Nq);
  check_query_positions<Ex>(qpos, Nq, S, qdoc);
  if (Nq <= 0 || S <= 0) return;
  const int64_t H = cd.H, Dq = cd.Dq, Dv = cd.Dv, P = cd.P, hpg = cd.H / cd.G, vb = cd.val_base;
  const T sc = static_cast<T>(cd.scale);
  const bool bf = bf16_operands<T>(pol);
  T* pbuf = ex.template scratch<T>(Nq * H * S);
  T* dsbuf = ex.template scratch<T>(Nq * H * S);
  int* bad = ex.flag();
  ex.for_each(Nq * H, [=] TD_REF_LAMBDA(int64_t i) {
    const int64_t r = i / H, h = i % H, g = h / hpg, np = qpos[r] + 1;
    if (bad_position(qpos[r], S, bad)) return;
    const int64_t j0 = first_key(qdoc, r, qpos[r], bad);
    const T* qh = q + i * Dq;
    const T* doh = dO + i * Dv;
    const T m = stats[i * 2 + 0], l = stats[i * 2 + 1];
    T D = T(0);
    for (int64_t c = 0; c < Dv; ++c) D = fadd(D, fmul(doh[c], o[i * Dv + c]));
    T* dqh = dq + i * Dq;
    for (int64_t c = 0; c < Dq; ++c) dqh[c] = T(0);
    for (int64_t j = j0; j < np; ++j) {
      const KeyTerms<T> kt = key_terms(qh, doh, kv, P, g * Dq, vb + g * Dv, Dq, Dv, sc, bf, j, m, l, D, dqh);
      pbuf[i * S + j] = kt.p;
      dsbuf[i * S + j] = kt.ds;
    }
  });
  const int64_t nt = static_cast<int64_t>(qsegs.size()) - 1;
  const int64_t* sg = ex.meta(qsegs);
  ex.for_each(S * P, [=] TD_REF_LAMBDA(int64_t e) {
    const int64_t j = e / P, c = e % P;
    for (int64_t t = 0; t < nt; ++t) {
      int64_t nk = 0;  // keys the tile touches: 0..its largest position
      for (int64_t r = sg[t]; r < sg[t + 1]; ++r) nk = qpos[r] + 1 > nk ? qpos[r] + 1 : nk;
      if (j >= nk) continue;
      T part = T(0);
      for (int64_t r = sg[t]; r < sg[t + 1]; ++r) {
        if (j > qpos[r] || (qdoc && j < qdoc[r])) continue;  // masked: no term
        for (int64_t h = 0; h < H; ++h) {
          const int64_t g = h / hpg, i = r * H + h;
          if (c >= g * Dq && c < g * Dq + Dq) part = fadd(part, fmul(dsbuf[i * S + j], operand(q[i * Dq + c - g * Dq], bf)));
          if (c >= vb + g * Dv && c < vb + g * Dv + Dv)
            part = fadd(part, fmul(pbuf[i * S + j], operand(dO[i * Dv + c - vb - g * Dv], bf)));
        }
      }
      dkv[e].add(part);
    }
  });
  ex.check_flag("attention: a query position outside the key range [0, S) or a document start outside [0, qpos]");
}
template <class T, class Ex>
void attn_core_backward(Ex& ex, Policy pol, const model::CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq,
                        const T* kv, int64_t S, const T* o, const T* stats, const T* dO,
                        std::span<const int64_t> qsegs, T* dq, ExactAcc<T>* dkv) {
  attn_doc_core_backward<T>(ex, pol, cd, q, qpos, nullptr, Nq, kv, S, o, stats, dO, qsegs, dq, dkv);
}

// ---- DSA (reference/model/attention.h "dsa_*") ---------------------------------------------------------------------
// Index score of query r for key j: +0 + w_0 relu(z_0) + ..., z_t the chain of iq_t . k_j (bf16: rounded operands).
template <class T>
TD_REF inline T index_score(const model::CoreDims& cd, const T* iqr, const T* kv, int64_t j, bool bf) {
  const T* w = iqr + cd.Hi * cd.Di;
  T I = T(0);
  for (int64_t t = 0; t < cd.Hi; ++t) {
    const T z = score(iqr + t * cd.Di, kv, cd.P, cd.ikey, j, cd.Di, bf);
    I = fadd(I, fmul(w[t], z > T(0) || z != z ? z : T(0)));  // relu, NaN passed through (reported)
  }
  return I;
}
// (a, ja) before (b, jb) in the selection order: the higher score, then the lower position.
template <class T>
TD_REF inline bool index_before(T a, int64_t ja, T b, int64_t jb) {
  return a > b || (!(b > a) && ja < jb);
}
// The selected entries of one query (up to the first -1); a malformed selection is flagged (checked on the host
// first with the reference's messages).
TD_REF inline int64_t sel_count(const int32_t* sr, int64_t K, int64_t p, int* bad) {
  int64_t n = 0;
  while (n < K && sr[n] >= 0) {
    if (sr[n] > p || (n > 0 && sr[n] <= sr[n - 1])) *bad = 1;
    ++n;
  }
  if (n == 0) *bad = 1;
  return n;
}

// One query's indexer softmax over its n selected keys: mI = the first largest score, returns lI = +0 + exp(I_e - mI)
// (ascending entries).
template <class T>
TD_REF inline T index_lse(const model::CoreDims& cd, const T* iqr, const T* kv, const int32_t* sr, int64_t n, bool bf,
                          T& mI) {
  mI = T(0);
  for (int64_t e = 0; e < n; ++e) {
    const T Ie = index_score(cd, iqr, kv, sr[e], bf);
    if (e == 0 || Ie > mI) mI = Ie;
  }
  T lI = T(0);
  for (int64_t e = 0; e < n; ++e) lI = fadd(lI, dmx::exp(fsub(index_score(cd, iqr, kv, sr[e], bf), mI)));
  return lI;
}
// Query r's attention probabilities of key j summed over heads (+0 + p^0 + ..., ascending), recomputed from the
// stats bit for bit.
template <class T>
TD_REF inline T head_prob_sum(const model::CoreDims& cd, const T* q, const T* kv, const T* stats, int64_t r, int64_t j,
                              bool bf) {
  const int64_t hpg = cd.H / cd.G;
  const T sc = static_cast<T>(cd.scale);
  T pk = T(0);
  for (int64_t h = 0; h < cd.H; ++h) {
    const int64_t g = h / hpg, i = r * cd.H + h;
    const T s = fmul(score(q + i * cd.Dq, kv, cd.P, g * cd.Dq, j, cd.Dq, bf), sc);
    pk = fadd(pk, fdiv(dmx::exp(fsub(s, stats[i * 2 + 0])), stats[i * 2 + 1]));
  }
  return pk;
}

// Selection. One body per (query, key) computes the index scores of the query's candidates once into scratch
// (Nq, S); then one body per query finds the k-th best candidate by (score descending, position ascending) in k
// passes over its scores and lists the candidates not after it in ascending positions (the reference's set, in its
// order).
template <class T, class Ex>
void dsa_select(Ex& ex, Policy pol, const model::CoreDims& cd, const T* iq, const int64_t* qpos, const int64_t* qdoc,
                int64_t Nq, const T* kv, int64_t S, int32_t* sel) {
  if constexpr (Ex::kHost) {
    TD_CHECK(cd.topk > 0 && cd.Hi > 0 && cd.Di > 0, "dsa_select: not a DSA configuration");
    check_query_positions<Ex>(qpos, Nq, S, qdoc);
  }
  if (Nq <= 0 || S <= 0) return;
  const int64_t K = cd.topk, Iw = cd.Hi * cd.Di + cd.Hi;
  const bool bf = bf16_operands<T>(pol);
  const model::CoreDims c = cd;
  T* score_buf = ex.template scratch<T>(Nq * S);
  int* bad = ex.flag();
  ex.for_each(Nq * S, [=] TD_REF_LAMBDA(int64_t e) {
    const int64_t r = e / S, j = e % S;
    if (j <= qpos[r] && (!qdoc || j >= qdoc[r])) score_buf[e] = index_score(c, iq + r * Iw, kv, j, bf);
  });
  ex.for_each(Nq, [=] TD_REF_LAMBDA(int64_t r) {
    int32_t* out = sel + r * K;
    for (int64_t i = 0; i < K; ++i) out[i] = -1;
    if (bad_position(qpos[r], S, bad)) return;
    const int64_t j0 = first_key(qdoc, r, qpos[r], bad), j1 = qpos[r] + 1;
    const T* I = score_buf + r * S;
    for (int64_t j = j0; j < j1; ++j)
      if (I[j] != I[j]) {  // NaN
        *bad = 1;
        return;
      }
    int64_t kth = -1;  // the last candidate of the k best
    T ks = T(0);
    if (j1 - j0 > K)
      for (int64_t pass = 0; pass < K; ++pass) {
        int64_t best = -1;
        T bs = T(0);
        for (int64_t j = j0; j < j1; ++j) {
          if (kth >= 0 && !index_before(ks, kth, I[j], j)) continue;  // already among the best
          if (best < 0 || index_before(I[j], j, bs, best)) best = j, bs = I[j];
        }
        kth = best, ks = bs;
      }
    int64_t n = 0;
    for (int64_t j = j0; j < j1 && n < K; ++j)
      if (kth < 0 || !index_before(ks, kth, I[j], j)) out[n++] = static_cast<int32_t>(j);
  });
  if constexpr (Ex::kHost)  // the reference's message for the first NaN score (the scratch is host memory here)
    for (int64_t r = 0; r < Nq; ++r)
      for (int64_t j = qdoc ? qdoc[r] : 0; j <= qpos[r]; ++j)
        TD_CHECK(!std::isnan(score_buf[r * S + j]), "dsa_select: the index score of query {} (position {}) for key {} "
                 "is NaN", r, qpos[r], j);
  ex.check_flag("dsa_select: a NaN index score, or a query position / document start out of range");
}

// Sparse core forward: attn_doc_core_forward's chains over the selected keys, one body per (row, head); then, when
// ikl is not null, one body per row for the indexer's KL term (the heads' probabilities recomputed bit for bit).
template <class T, class Ex>
void dsa_core_forward(Ex& ex, Policy pol, const model::CoreDims& cd, const T* q, const T* iq, const int64_t* qpos,
                      int64_t Nq, const T* kv, int64_t S, const int32_t* sel, T* o, T* stats, T* ikl) {
  if constexpr (Ex::kHost) {
    check_query_positions<Ex>(qpos, Nq, S);
    model::dsa_check_selection(cd, sel, qpos, Nq, "dsa_core_forward");
  }
  const int64_t H = cd.H, Dq = cd.Dq, Dv = cd.Dv, P = cd.P, hpg = cd.H / cd.G, vb = cd.val_base, K = cd.topk;
  const int64_t Iw = cd.Hi * cd.Di + cd.Hi;
  const T sc = static_cast<T>(cd.scale);
  const bool bf = bf16_operands<T>(pol);
  const model::CoreDims c = cd;
  int* bad = ex.flag();
  ex.for_each(Nq * H, [=] TD_REF_LAMBDA(int64_t i) {
    const int64_t r = i / H, h = i % H, g = h / hpg;
    if (bad_position(qpos[r], S, bad)) return;
    const int32_t* sr = sel + r * K;
    const int64_t n = sel_count(sr, K, qpos[r], bad);
    const T* qh = q + i * Dq;
    T m = T(0);
    for (int64_t e = 0; e < n; ++e) {
      const T sj = fmul(score(qh, kv, P, g * Dq, sr[e], Dq, bf), sc);
      if (e == 0 || sj > m) m = sj;
    }
    T l = T(0);
    for (int64_t e = 0; e < n; ++e) l = fadd(l, dmx::exp(fsub(fmul(score(qh, kv, P, g * Dq, sr[e], Dq, bf), sc), m)));
    T* oh = o + i * Dv;
    for (int64_t cc = 0; cc < Dv; ++cc) oh[cc] = T(0);
    for (int64_t e = 0; e < n; ++e) {
      const T p = operand(fdiv(dmx::exp(fsub(fmul(score(qh, kv, P, g * Dq, sr[e], Dq, bf), sc), m)), l), bf);
      const T* v = kv + sr[e] * P + vb + g * Dv;
      for (int64_t cc = 0; cc < Dv; ++cc) oh[cc] = fadd(oh[cc], fmul(p, operand(v[cc], bf)));
    }
    stats[i * 2 + 0] = m;
    stats[i * 2 + 1] = l;
  });
  if (ikl)
    ex.for_each(Nq, [=] TD_REF_LAMBDA(int64_t r) {
      if (bad_position(qpos[r], S, bad)) return;
      const int32_t* sr = sel + r * K;
      const int64_t n = sel_count(sr, K, qpos[r], bad);
      const T* iqr = iq + r * Iw;
      T mI;
      const T logl = dmx::log(index_lse(c, iqr, kv, sr, n, bf, mI));
      T kl = T(0);
      for (int64_t e = 0; e < n; ++e) {
        const T p = fdiv(head_prob_sum(c, q, kv, stats, r, sr[e], bf), static_cast<T>(H));
        if (p > T(0))
          kl = fadd(kl, fmul(p, fsub(dmx::log(p), fsub(fsub(index_score(c, iqr, kv, sr[e], bf), mI), logl))));
      }
      ikl[r] = kl;
    });
  ex.check_flag("dsa_core_forward: a query position out of range or a malformed selection");
}

// Sparse core backward. Query side, one body per (row, head): dq and the per-entry p / dsc (scratch (Nq, K, H)).
// Indexer, one body per row: dI_e = (eI_e / lI - p_e) * iscale, dw, dz (scratch (Nq, K, Hi)) and diq. Key side,
// one body per payload element (key j, column c): per query tile, the partial over the rows that selected j, in
// order (heads' K then V terms, then the indexer heads' terms), added exactly; a tile no row of which selected j
// adds nothing.
template <class T, class Ex>
void dsa_core_backward(Ex& ex, Policy pol, const model::CoreDims& cd, const T* q, const T* iq, const int64_t* qpos,
                       int64_t Nq, const T* kv, int64_t S, const int32_t* sel, const T* o, const T* stats,
                       const T* dO, T iscale, std::span<const int64_t> qsegs, T* dq, T* diq, ExactAcc<T>* dkv) {
  check_query_segments("dsa_core_backward", qsegs, Nq);
  if constexpr (Ex::kHost) {
    check_query_positions<Ex>(qpos, Nq, S);
    model::dsa_check_selection(cd, sel, qpos, Nq, "dsa_core_backward");
  }
  if (Nq <= 0 || S <= 0) return;
  const int64_t H = cd.H, Dq = cd.Dq, Dv = cd.Dv, P = cd.P, hpg = cd.H / cd.G, vb = cd.val_base, K = cd.topk;
  const int64_t Hi = cd.Hi, Di = cd.Di, Iw = Hi * Di + Hi, ik = cd.ikey;
  const T sc = static_cast<T>(cd.scale);
  const bool bf = bf16_operands<T>(pol);
  const model::CoreDims c = cd;
  T* pbuf = ex.template scratch<T>(Nq * K * H);
  T* dsbuf = ex.template scratch<T>(Nq * K * H);
  T* dzbuf = ex.template scratch<T>(Nq * K * Hi);
  int* bad = ex.flag();
  ex.for_each(Nq * H, [=] TD_REF_LAMBDA(int64_t i) {
    const int64_t r = i / H, h = i % H, g = h / hpg;
    if (bad_position(qpos[r], S, bad)) return;
    const int32_t* sr = sel + r * K;
    const int64_t n = sel_count(sr, K, qpos[r], bad);
    const T* qh = q + i * Dq;
    const T* doh = dO + i * Dv;
    const T m = stats[i * 2 + 0], l = stats[i * 2 + 1];
    T D = T(0);
    for (int64_t cc = 0; cc < Dv; ++cc) D = fadd(D, fmul(doh[cc], o[i * Dv + cc]));
    T* dqh = dq + i * Dq;
    for (int64_t cc = 0; cc < Dq; ++cc) dqh[cc] = T(0);
    for (int64_t e = 0; e < n; ++e) {
      const int64_t j = sr[e];
      const KeyTerms<T> kt = key_terms(qh, doh, kv, P, g * Dq, vb + g * Dv, Dq, Dv, sc, bf, j, m, l, D, dqh);
      pbuf[(r * K + e) * H + h] = kt.p;
      dsbuf[(r * K + e) * H + h] = kt.ds;
    }
  });
  ex.for_each(Nq, [=] TD_REF_LAMBDA(int64_t r) {
    if (bad_position(qpos[r], S, bad)) return;
    const int32_t* sr = sel + r * K;
    const int64_t n = sel_count(sr, K, qpos[r], bad);
    const T* iqr = iq + r * Iw;
    const T* w = iqr + Hi * Di;
    T mI;
    const T lI = index_lse(c, iqr, kv, sr, n, bf, mI);
    T* dqi = diq + r * Iw;
    for (int64_t cc = 0; cc < Iw; ++cc) dqi[cc] = T(0);
    T* dw = dqi + Hi * Di;
    for (int64_t e = 0; e < n; ++e) {
      const int64_t j = sr[e];
      const T pk = head_prob_sum(c, q, kv, stats, r, j, bf);
      const T eI = dmx::exp(fsub(index_score(c, iqr, kv, j, bf), mI));
      const T dI = fmul(fsub(fdiv(eI, lI), fdiv(pk, static_cast<T>(H))), iscale);
      const T* kj = kv + j * P + ik;
      for (int64_t t = 0; t < Hi; ++t) {
        const T zt = score(iqr + t * Di, kv, P, ik, j, Di, bf);
        dw[t] = fadd(dw[t], fmul(dI, zt > T(0) ? zt : T(0)));
        const T dz = operand(zt > T(0) ? fmul(dI, w[t]) : T(0), bf);
        dzbuf[(r * K + e) * Hi + t] = dz;
        for (int64_t cc = 0; cc < Di; ++cc) dqi[t * Di + cc] = fadd(dqi[t * Di + cc], fmul(dz, operand(kj[cc], bf)));
      }
    }
  });
  const int64_t nt = static_cast<int64_t>(qsegs.size()) - 1;
  const int64_t* sg = ex.meta(qsegs);
  ex.for_each(S * P, [=] TD_REF_LAMBDA(int64_t el) {
    const int64_t j = el / P, cc = el % P;
    for (int64_t t = 0; t < nt; ++t) {
      T part = T(0);
      bool any = false;
      for (int64_t r = sg[t]; r < sg[t + 1]; ++r) {
        const int32_t* sr = sel + r * K;
        int64_t e = -1;
        for (int64_t x = 0; x < K && sr[x] >= 0 && sr[x] <= j; ++x)
          if (sr[x] == j) e = x;
        if (e < 0) continue;
        any = true;
        for (int64_t h = 0; h < H; ++h) {
          const int64_t g = h / hpg, i = r * H + h;
          if (cc >= g * Dq && cc < g * Dq + Dq)
            part = fadd(part, fmul(dsbuf[(r * K + e) * H + h], operand(q[i * Dq + cc - g * Dq], bf)));
          if (cc >= vb + g * Dv && cc < vb + g * Dv + Dv)
            part = fadd(part, fmul(pbuf[(r * K + e) * H + h], operand(dO[i * Dv + cc - vb - g * Dv], bf)));
        }
        if (cc >= ik && cc < ik + Di)
          for (int64_t x = 0; x < Hi; ++x)
            part = fadd(part, fmul(dzbuf[(r * K + e) * Hi + x], operand(iq[r * Iw + x * Di + cc - ik], bf)));
      }
      if (any) dkv[el].add(part);
    }
  });
  ex.check_flag("dsa_core_backward: a query position out of range or a malformed selection");
}

// ---- linear cross-entropy (reference/model/linear_ce.h) --------------------------------------------------------
// Logits as the GEMM's chains (into scratch), then one body per row: vocab chunks ascending, each chunk's max and
// exp sum in vocabulary order, the reference's running (M, S) merge, lse = M + log(S). The backward recomputes the
// logits of its columns, turns them into dlogit (bf16: rounded), then dhidden[r, k] continues its one in-order sum
// over the columns and dW[k, j] gets the tile partials of hidden[r, k] * dlogit[r, j], added exactly.
inline constexpr int32_t kIgnoreIndex = -100;

inline void check_targets(const char* fn, const int32_t* targets, int64_t N, int64_t V) {
  for (int64_t i = 0; i < N; ++i)
    if (targets[i] != kIgnoreIndex && (targets[i] < 0 || targets[i] >= V))
      fail(fmt::format("{}: target {} at row {} is out of range [0, {}) (and not the ignore index {})", fn, targets[i],
                       i, V, kIgnoreIndex));
}

// L (N, w) = logits of columns [j0, j0 + w): hidden (N, d) @ W (d, V) columns.
template <class T, class Ex>
void logits_cols(Ex& ex, const T* hidden, const T* W, int64_t N, int64_t d, int64_t V, int64_t j0, int64_t w,
                 bool bf, T* L) {
  ex.for_each(N * w, [=] TD_REF_LAMBDA(int64_t i) {
    const int64_t r = i / w, j = i % w;
    L[i] = dot<T>(d, hidden + r * d, 1, W + j0 + j, V, bf, T(0));
  });
}

template <class T, class Ex>
void linear_ce_forward(Ex& ex, Policy pol, const T* hidden, const T* W, const int32_t* targets, int64_t N, int64_t d,
                       int64_t V, int64_t vocab_chunk, int64_t token_chunk, T* token_loss, T* lse) {
  TD_CHECK(N >= 0 && d > 0 && V > 0 && vocab_chunk > 0 && token_chunk > 0,
           "linear_ce_forward: N, d, V, vocab_chunk, token_chunk ({}, {}, {}, {}, {})", N, d, V, vocab_chunk,
           token_chunk);
  if constexpr (Ex::kHost) check_targets("linear_ce_forward", targets, N, V);
  if (N == 0) return;
  const bool bf = bf16_operands<T>(pol);
  const int64_t vc = vocab_chunk < V ? vocab_chunk : V;
  T* L = ex.template scratch<T>(N * V);
  logits_cols<T>(ex, hidden, W, N, d, V, 0, V, bf, L);
  int* bad = ex.flag();
  ex.for_each(N, [=] TD_REF_LAMBDA(int64_t r) {
    const T* l = L + r * V;
    const int64_t t = targets[r];
    if (t != kIgnoreIndex && (t < 0 || t >= V)) *bad = 1;
    T M = T(0), S = T(0), tl = T(0);
    for (int64_t j0 = 0; j0 < V; j0 += vc) {
      const int64_t w = vc < V - j0 ? vc : V - j0;
      T m = l[j0];
      for (int64_t j = 1; j < w; ++j) m = l[j0 + j] > m ? l[j0 + j] : m;
      T sc = T(0);
      for (int64_t j = 0; j < w; ++j) sc = fadd(sc, dmx::exp(fsub(l[j0 + j], m)));
      if (j0 == 0) {
        M = m;
        S = sc;
      } else if (m > M) {
        S = fadd(fmul(S, dmx::exp(fsub(M, m))), sc);
        M = m;
      } else {
        S = fadd(S, fmul(sc, dmx::exp(fsub(m, M))));
      }
      if (t >= j0 && t < j0 + w) tl = l[t];
    }
    lse[r] = fadd(M, dmx::log(S));
    token_loss[r] = t == kIgnoreIndex ? T(0) : fsub(lse[r], tl);
  });
  ex.check_flag("linear_ce_forward: a target out of range [0, V) (and not the ignore index -100)");
}

// The arguments linear_ce_backward (this tier's and the fast tier's) accepts, with the reference's messages.
inline void check_linear_ce_backward(int64_t N, int64_t d, int64_t V, int64_t vocab_chunk, int64_t token_chunk,
                                     std::span<const int64_t> segs, int64_t j_begin, int64_t j_end) {
  TD_CHECK(N >= 0 && d > 0 && V > 0 && vocab_chunk > 0 && token_chunk > 0,
           "linear_ce_backward: N, d, V, vocab_chunk, token_chunk ({}, {}, {}, {}, {})", N, d, V, vocab_chunk,
           token_chunk);
  TD_CHECK(0 <= j_begin && j_begin < j_end && j_end <= V,
           "linear_ce_backward: vocabulary columns [{}, {}) are not a non-empty range of [0, {})", j_begin, j_end, V);
  TD_CHECK(j_begin % vocab_chunk == 0 && (j_end % vocab_chunk == 0 || j_end == V),
           "linear_ce_backward: vocabulary columns [{}, {}) do not consist of whole vocab chunks of {}", j_begin, j_end,
           vocab_chunk);
  TD_CHECK(!segs.empty() && segs.front() == 0 && segs.back() == N,
           "linear_ce_backward: segs must run from row 0 to row N = {}", N);
}

template <class T, class Ex>
void linear_ce_backward(Ex& ex, Policy pol, const T* hidden, const T* W, const int32_t* targets, const T* lse,
                        int64_t N, int64_t d, int64_t V, int64_t vocab_chunk, int64_t token_chunk, T grad_scale,
                        std::span<const int64_t> segs, int64_t j_begin, int64_t j_end, T* dhidden, ExactAcc<T>* dW) {
  check_linear_ce_backward(N, d, V, vocab_chunk, token_chunk, segs, j_begin, j_end);
  if constexpr (Ex::kHost) check_targets("linear_ce_backward", targets, N, V);
  if (N == 0) return;
  const bool bf = bf16_operands<T>(pol);
  const int64_t w = j_end - j_begin;
  T* DL = ex.template scratch<T>(N * w);
  logits_cols<T>(ex, hidden, W, N, d, V, j_begin, w, bf, DL);
  int* bad = ex.flag();
  ex.for_each(N * w, [=] TD_REF_LAMBDA(int64_t i) {  // logits -> dlogit, in place
    const int64_t r = i / w, j = j_begin + i % w;
    const int64_t t = targets[r];
    if (t != kIgnoreIndex && (t < 0 || t >= V)) *bad = 1;
    if (t == kIgnoreIndex) {
      DL[i] = T(0);
      return;
    }
    const T p = dmx::exp(fsub(DL[i], lse[r]));
    DL[i] = operand(fmul(j == t ? fsub(p, T(1)) : p, grad_scale), bf);
  });
  ex.for_each(N * d, [=] TD_REF_LAMBDA(int64_t i) {  // dhidden continues its sum over the columns
    const int64_t r = i / d, k = i % d;
    T s = dot<T>(w, DL + r * w, 1, W + k * V + j_begin, 1, bf, j_begin > 0 ? dhidden[i] : T(0));
    if (j_end == V && targets[r] == kIgnoreIndex) s = T(0);
    dhidden[i] = s;
  });
  const int64_t nt = static_cast<int64_t>(segs.size()) - 1;
  const int64_t* sg = ex.meta(segs);
  ex.for_each(d * w, [=] TD_REF_LAMBDA(int64_t i) {  // dW tile partials, added exactly
    const int64_t k = i / w, j = i % w;
    for (int64_t t = 0; t < nt; ++t) {
      const int64_t r0 = sg[t], len = sg[t + 1] - sg[t];
      if (len == 0) continue;
      dW[i].add(dot<T>(len, hidden + r0 * d + k, d, DL + r0 * w + j, w, bf, T(0)));
    }
  });
  ex.check_flag("linear_ce_backward: a target out of range [0, V) (and not the ignore index -100)");
}

// ---- optimizer -------------------------------------------------------------------------------------------------
// acc += sum of g squared, exactly: the terms of chunks of kSqChunk elements go into one accumulator per chunk
// (in parallel), then the chunk accumulators are merged into acc (integer limb sums: the exact value of the
// reference's sequential adds).
inline constexpr int64_t kSqChunk = 4096;
template <class T, class Ex>
void grad_sq_acc(Ex& ex, const T* g, int64_t n, ExactAcc<double>* acc) {
  if (n <= 0) return;
  const int64_t nc = (n + kSqChunk - 1) / kSqChunk;
  ExactAcc<double>* part = ex.template scratch<ExactAcc<double>>(nc);
  ex.for_each(nc, [=] TD_REF_LAMBDA(int64_t c) {
    const int64_t end = (c + 1) * kSqChunk < n ? (c + 1) * kSqChunk : n;
    ExactAcc<double>& pc = part[c];
    for (int64_t i = c * kSqChunk; i < end; ++i) {
      const double a = static_cast<double>(g[i]);
      const double p = fmul(a, a);
      if constexpr (std::is_same_v<T, float>) {
        pc.add(p);  // 24 x 24 significand bits fit in 53: exact
      } else {
        if (!(fsub(p, p) == 0.0)) {  // +Inf or NaN (not finite)
          pc.add(p);
          continue;
        }
        const double cc = fmul(134217729.0, a);  // Veltkamp split and Dekker's two-square, as the reference
        const double hi = fsub(cc, fsub(cc, a));
        const double lo = fsub(a, hi);
        const double err = fadd(fadd(fsub(fmul(hi, hi), p), fmul(fmul(2.0, hi), lo)), fmul(lo, lo));
        pc.add(p);
        pc.add(err);
      }
    }
  });
  ex.for_each(1, [=] TD_REF_LAMBDA(int64_t) {
    for (int64_t c = 0; c < nc; ++c) acc->merge(part[c]);
  });
}

// The scalars of one AdamW step, computed on the host exactly as reference/model/adamw.cpp does.
template <class T>
struct AdamWScalars {
  T c, dec, b1, ob1, b2, ob2, ss, bc2s, e;
};
template <class T>
AdamWScalars<T> adamw_scalars(const model::AdamWHyper& h, int64_t step, double clip) {
  double p1 = 1.0, p2 = 1.0;
  for (int64_t s = 0; s < step; ++s) {
    p1 = p1 * h.beta1;
    p2 = p2 * h.beta2;
  }
  const double bc1 = 1.0 - p1, bc2 = 1.0 - p2;
  return {static_cast<T>(clip),           static_cast<T>(1.0 - h.lr * h.weight_decay),
          static_cast<T>(h.beta1),        static_cast<T>(1.0 - h.beta1),
          static_cast<T>(h.beta2),        static_cast<T>(1.0 - h.beta2),
          static_cast<T>(h.lr / bc1),     static_cast<T>(std::sqrt(bc2)),
          static_cast<T>(h.eps)};
}

template <class T, class Ex>
void adamw_step(Ex& ex, T* w, const T* g, T* m, T* v, int64_t n, const model::AdamWHyper& hyper, int64_t step,
                double clip, bool decay) {
  TD_CHECK_GE(step, int64_t(1), "adamw_step: step is 1-based");
  const AdamWScalars<T> k = adamw_scalars<T>(hyper, step, clip);
  ex.for_each(n, [=] TD_REF_LAMBDA(int64_t i) {
    const T gc = fmul(g[i], k.c);
    T wi = w[i];
    if (decay) wi = fmul(wi, k.dec);
    const T mi = fadd(fmul(k.b1, m[i]), fmul(k.ob1, gc));
    const T vi = fadd(fmul(k.b2, v[i]), fmul(fmul(k.ob2, gc), gc));
    const T den = fadd(fdiv(fsqrt(vi), k.bc2s), k.e);
    wi = fsub(wi, fdiv(fmul(k.ss, mi), den));
    w[i] = wi;
    m[i] = mi;
    v[i] = vi;
  });
}

template <class T, class Ex>
void router_bias_update(Ex& ex, T* b, const int64_t* load, int64_t E, double gamma) {
  TD_CHECK_GT(E, int64_t(0), "router_bias_update: E");
  if (gamma == 0) return;  // (before the load checks, as the reference)
  if constexpr (Ex::kHost)
    for (int64_t e = 0; e < E; ++e) TD_CHECK_GE(load[e], int64_t(0), "router_bias_update: load of expert {}", e);
  const T step = static_cast<T>(gamma);
  int* bad = ex.flag();
  ex.for_each(1, [=] TD_REF_LAMBDA(int64_t) {
    int64_t total = 0;
    for (int64_t e = 0; e < E; ++e) {
      if (load[e] < 0) {
        *bad = 1;
        return;
      }
      total += load[e];
    }
    for (int64_t e = 0; e < E; ++e) {
      const int64_t scaled = load[e] * E;  // compare load_e with total/E exactly
      if (scaled < total) b[e] = fadd(b[e], step);
      else if (scaled > total) b[e] = fsub(b[e], step);
    }
  });
  ex.check_flag("router_bias_update: a negative expert load");
}

}  // namespace trident::gpu::ref
