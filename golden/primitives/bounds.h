// Error bounds of the fast tier's ops against the reference (reference/tolerances.h, direction "gpu"): for every
// output element, in fp64 from the op's inputs, the magnitude sum_abs and the term count n_terms that the table's
// rows turn into bound = (k_const + k_per_term * n_terms) * u * sum_abs; under the bf16 policy the op's bf16 row
// adds k_bf16 * u_bf16 * sum_abs_bf16. The derivations are the rows' reasons (and docs/numerics.md "The fast GPU
// tier"). Inputs are given as the op's arguments (double copies of the T values, bf16 policy: the bf16-rounded
// GEMM operands); outputs are laid out as the op writes them.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "reference/model/attention.h"
#include "reference/tolerances.h"

namespace trident::golden {

struct ElemBounds {
  std::string primitive;         // the table's primitive (gemm, tile_wgrad, attn_core, linear_ce)
  std::vector<double> sum_abs;   // per element
  std::vector<double> n_terms;   // per element
  std::vector<double> sum_abs_bf16;  // per element: the bf16 row's magnitude (empty: no bf16 rounding in the op)
  explicit ElemBounds(std::string prim = {}, int64_t n = 0, bool bf = false)
      : primitive(std::move(prim)), sum_abs(static_cast<size_t>(n), 0.0), n_terms(static_cast<size_t>(n), 0.0),
        sum_abs_bf16(bf ? static_cast<size_t>(n) : 0, 0.0) {}
  // The bound of element i: the accumulation type's row (fp32 or fp64), plus the bf16 row under the bf16 policy.
  double bound(int64_t i, const std::string& acc_dtype) const {
    const size_t k = static_cast<size_t>(i);
    const Tolerance& t = tolerance(primitive, acc_dtype, "accept");
    double b = (t.k_const + t.k_per_term * n_terms[k]) * unit_roundoff(acc_dtype) * sum_abs[k];
    if (!sum_abs_bf16.empty()) {
      const Tolerance& tb = tolerance(primitive, "bf16", "accept");
      b += tb.k_const * unit_roundoff("bf16") * sum_abs_bf16[k];
    }
    return b;
  }
};

inline int64_t longest_tile_of(std::span<const int64_t> segs) {
  int64_t m = 0;
  for (size_t t = 0; t + 1 < segs.size(); ++t) m = std::max(m, segs[t + 1] - segs[t]);
  return m;
}

// C (M, ldc) = A (M, lda) @ op(B).
inline ElemBounds mm_bounds(int64_t M, int64_t N, int64_t K, const double* A, int64_t lda, const double* B,
                            int64_t ldb, bool trans_b, int64_t ldc) {
  ElemBounds e("gemm", M * ldc);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += std::fabs(A[m * lda + k] * (trans_b ? B[n * ldb + k] : B[k * ldb + n]));
      e.sum_abs[static_cast<size_t>(m * ldc + n)] = s;
      e.n_terms[static_cast<size_t>(m * ldc + n)] = static_cast<double>(K);
    }
  return e;
}

// acc (K, M) = X^T dY over the tiles.
inline ElemBounds wgrad_bounds(const double* X, int64_t ldx, const double* dY, int64_t ldy, int64_t K, int64_t M,
                               std::span<const int64_t> segs) {
  ElemBounds e("tile_wgrad", K * M);
  // n_terms: every row of the sum (an implementation may sum them in one chain, not per tile)
  const int64_t rows = segs.empty() ? 0 : segs.back(), T = segs.empty() ? 0 : segs.back() - segs.front();
  for (int64_t k = 0; k < K; ++k)
    for (int64_t m = 0; m < M; ++m) {
      double s = 0;
      for (int64_t r = segs.empty() ? 0 : segs.front(); r < rows; ++r) s += std::fabs(X[r * ldx + k] * dY[r * ldy + m]);
      e.sum_abs[static_cast<size_t>(k * M + m)] = s;
      e.n_terms[static_cast<size_t>(k * M + m)] = static_cast<double>(T);
    }
  return e;
}

// Per (row, head): the key range, the scores and their magnitudes S_j = scale * sum_c |q_c k_jc|.
struct AttnRow {
  int64_t j0 = 0, np = 0;
  std::vector<double> s, S;
  double Smax = 0;
};
inline AttnRow attn_row(const model::CoreDims& cd, const double* q, const int64_t* qpos, const int64_t* qdoc,
                        const double* kv, int64_t r, int64_t h) {
  AttnRow a;
  const int64_t g = h / (cd.H / cd.G), i = r * cd.H + h;
  a.j0 = qdoc ? qdoc[r] : 0;
  a.np = qpos[r] + 1;
  for (int64_t j = a.j0; j < a.np; ++j) {
    double s = 0, S = 0;
    for (int64_t c = 0; c < cd.Dq; ++c) {
      const double t = q[i * cd.Dq + c] * kv[j * cd.P + g * cd.Dq + c];
      s += t, S += std::fabs(t);
    }
    a.s.push_back(s * cd.scale);
    a.S.push_back(S * std::fabs(cd.scale));
    a.Smax = std::max(a.Smax, S * std::fabs(cd.scale));
  }
  return a;
}

// Forward: o (Nq, H*Dv) and stats (Nq, H*2).
struct AttnFwdBounds {
  ElemBounds o, stats;
};
inline AttnFwdBounds attn_forward_bounds(const model::CoreDims& cd, bool bf, const double* q, const int64_t* qpos,
                                         const int64_t* qdoc, int64_t Nq, const double* kv) {
  const int64_t H = cd.H, Dv = cd.Dv, hpg = cd.H / cd.G;
  AttnFwdBounds b{ElemBounds("attn_core", Nq * H * Dv, bf), ElemBounds("attn_core", Nq * H * 2)};
  for (int64_t r = 0; r < Nq; ++r)
    for (int64_t h = 0; h < H; ++h) {
      const AttnRow a = attn_row(cd, q, qpos, qdoc, kv, r, h);
      const int64_t i = r * H + h, g = h / hpg, nk = a.np - a.j0;
      if (nk <= 0) continue;
      double m = a.s[0];
      for (double x : a.s) m = std::max(m, x);
      double l = 0;
      for (double x : a.s) l += std::exp(x - m);
      const double n = static_cast<double>(nk + cd.Dq + 1), f = 1 + a.Smax;
      for (int64_t c = 0; c < Dv; ++c) {
        double pv = 0;
        for (int64_t j = a.j0; j < a.np; ++j)
          pv += std::exp(a.s[static_cast<size_t>(j - a.j0)] - m) / l * std::fabs(kv[j * cd.P + cd.val_base + g * Dv + c]);
        const size_t k = static_cast<size_t>(i * Dv + c);
        b.o.sum_abs[k] = f * pv;
        b.o.n_terms[k] = n;
        if (bf) b.o.sum_abs_bf16[k] = pv;
      }
      b.stats.sum_abs[static_cast<size_t>(i * 2)] = f;
      b.stats.sum_abs[static_cast<size_t>(i * 2 + 1)] = f * l;
      b.stats.n_terms[static_cast<size_t>(i * 2)] = b.stats.n_terms[static_cast<size_t>(i * 2 + 1)] = n;
    }
  return b;
}

// Backward: dq (Nq, H*Dq) and the key-side dkv (S, P), from the given o and stats.
struct AttnBwdBounds {
  ElemBounds dq, dkv;
};
inline AttnBwdBounds attn_backward_bounds(const model::CoreDims& cd, bool bf, const double* q, const int64_t* qpos,
                                          const int64_t* qdoc, int64_t Nq, const double* kv, int64_t S,
                                          const double* o, const double* stats, const double* dO,
                                          std::span<const int64_t> qsegs) {
  const int64_t H = cd.H, Dq = cd.Dq, Dv = cd.Dv, P = cd.P, hpg = cd.H / cd.G, vb = cd.val_base;
  AttnBwdBounds b{ElemBounds("attn_core", Nq * H * Dq, bf), ElemBounds("attn_core", S * P, bf)};
  const double sc = std::fabs(cd.scale);
  const int64_t T = Nq;  // every query of the key's sum (an implementation need not sum per tile)
  const double n_dkv = static_cast<double>(2 * H * T + Dq + Dv + 1);
  for (double& x : b.dkv.n_terms) x = n_dkv;
  for (int64_t r = 0; r < Nq; ++r)
    for (int64_t h = 0; h < H; ++h) {
      const AttnRow a = attn_row(cd, q, qpos, qdoc, kv, r, h);
      const int64_t i = r * H + h, g = h / hpg, nk = a.np - a.j0;
      const double m = stats[i * 2], l = stats[i * 2 + 1], f = 1 + a.Smax;
      double D = 0, DOabs = 0;
      for (int64_t c = 0; c < Dv; ++c) D += dO[i * Dv + c] * o[i * Dv + c], DOabs += std::fabs(dO[i * Dv + c] * o[i * Dv + c]);
      const double n_dq = static_cast<double>(std::max<int64_t>(nk, 0) + Dq + Dv + 1);
      for (int64_t c = 0; c < Dq; ++c) b.dq.n_terms[static_cast<size_t>(i * Dq + c)] = n_dq;
      for (int64_t j = a.j0; j < a.np; ++j) {
        const double p = l > 0 ? std::exp(a.s[static_cast<size_t>(j - a.j0)] - m) / l : 0.0;
        double dp = 0, DPabs = 0;
        for (int64_t c = 0; c < Dv; ++c) {
          const double t = dO[i * Dv + c] * kv[j * P + vb + g * Dv + c];
          dp += t, DPabs += std::fabs(t);
        }
        const double ds = sc * p * std::fabs(dp - D);
        const double A = sc * p * (std::fabs(dp - D) + DPabs + DOabs) * f;  // |ds| and its error's magnitude
        const double B = p * f;                                              // p and its error's magnitude
        for (int64_t c = 0; c < Dq; ++c) {
          const double kc = std::fabs(kv[j * P + g * Dq + c]), qc = std::fabs(q[i * Dq + c]);
          const size_t kq = static_cast<size_t>(i * Dq + c), kk = static_cast<size_t>(j * P + g * Dq + c);
          b.dq.sum_abs[kq] += kc * A;
          b.dkv.sum_abs[kk] += qc * A;
          // bf16: ds rounded, and dp's operand dO rounded (dp moves by u_bf16 sum|dO v|, ds by scale p that)
          const double dsb = ds + sc * p * DPabs;
          if (bf) b.dq.sum_abs_bf16[kq] += kc * dsb, b.dkv.sum_abs_bf16[kk] += qc * dsb;
        }
        for (int64_t c = 0; c < Dv; ++c) {
          const double dc = std::fabs(dO[i * Dv + c]);
          const size_t kk = static_cast<size_t>(j * P + vb + g * Dv + c);
          b.dkv.sum_abs[kk] += dc * B;
          if (bf) b.dkv.sum_abs_bf16[kk] += dc * p;
        }
      }
    }
  return b;
}

// Linear CE per row: logits, their magnitudes sum_k |h_k W_kj|, and the largest.
struct CeRow {
  std::vector<double> l, L;
  double Lmax = 0;
};
inline CeRow ce_row(const double* hidden, const double* W, int64_t d, int64_t V, int64_t r, int64_t j0, int64_t j1) {
  CeRow c;
  for (int64_t j = j0; j < j1; ++j) {
    double s = 0, a = 0;
    for (int64_t k = 0; k < d; ++k) {
      const double t = hidden[r * d + k] * W[k * V + j];
      s += t, a += std::fabs(t);
    }
    c.l.push_back(s), c.L.push_back(a), c.Lmax = std::max(c.Lmax, a);
  }
  return c;
}

struct CeFwdBounds {
  ElemBounds token_loss, lse;
};
inline CeFwdBounds linear_ce_forward_bounds(const double* hidden, const double* W, const int32_t* targets, int64_t N,
                                            int64_t d, int64_t V, int64_t vocab_chunk) {
  CeFwdBounds b{ElemBounds("linear_ce", N), ElemBounds("linear_ce", N)};
  const int64_t chunks = (V + vocab_chunk - 1) / vocab_chunk;
  const double n = static_cast<double>(d + V + 2 * chunks + 1);
  for (int64_t r = 0; r < N; ++r) {
    const CeRow c = ce_row(hidden, W, d, V, r, 0, V);
    double m = c.l[0], s = 0;
    for (double x : c.l) m = std::max(m, x);
    for (double x : c.l) s += std::exp(x - m);
    const double lse = m + std::log(s);
    const size_t k = static_cast<size_t>(r);
    b.lse.sum_abs[k] = c.Lmax + 1 + std::fabs(lse);
    b.lse.n_terms[k] = b.token_loss.n_terms[k] = n;
    const int32_t t = targets[r];
    if (t >= 0 && t < V)
      b.token_loss.sum_abs[k] = b.lse.sum_abs[k] + c.L[static_cast<size_t>(t)] + std::fabs(lse - c.l[static_cast<size_t>(t)]);
  }
  return b;
}

struct CeBwdBounds {
  ElemBounds dhidden, dW;
};
// dhidden (N, d): dhidden_in is the continued sum's input (columns before j_begin); dW (d, j_end - j_begin).
inline CeBwdBounds linear_ce_backward_bounds(bool bf, const double* hidden, const double* W, const int32_t* targets,
                                             const double* lse, int64_t N, int64_t d, int64_t V, double grad_scale,
                                             std::span<const int64_t> segs, int64_t j_begin, int64_t j_end,
                                             const double* dhidden_in) {
  const int64_t w = j_end - j_begin;
  CeBwdBounds b{ElemBounds("linear_ce", N * d, bf), ElemBounds("linear_ce", d * w, bf)};
  const double sc = std::fabs(grad_scale);
  const double n_dh = static_cast<double>(w + d + 1), n_dw = static_cast<double>(N + d + 1);  // every row of dW's sum
  for (double& x : b.dW.n_terms) x = n_dw;
  for (int64_t r = 0; r < N; ++r) {
    const int32_t t = targets[r];
    for (int64_t k = 0; k < d; ++k) {
      b.dhidden.n_terms[static_cast<size_t>(r * d + k)] = n_dh;
      if (j_begin > 0) b.dhidden.sum_abs[static_cast<size_t>(r * d + k)] = std::fabs(dhidden_in[r * d + k]);
    }
    if (t < 0 || t >= V) continue;  // ignored row: dlogit 0 on both sides
    const CeRow c = ce_row(hidden, W, d, V, r, j_begin, j_end);
    for (int64_t jj = 0; jj < w; ++jj) {
      const int64_t j = j_begin + jj;
      const double p = std::exp(c.l[static_cast<size_t>(jj)] - lse[r]);
      const double dl = sc * std::fabs(j == t ? p - 1 : p);
      const double A = dl + sc * p * (1 + c.L[static_cast<size_t>(jj)] + std::fabs(c.l[static_cast<size_t>(jj)] - lse[r]));
      for (int64_t k = 0; k < d; ++k) {
        const double wk = std::fabs(W[k * V + j]), hk = std::fabs(hidden[r * d + k]);
        const size_t kh = static_cast<size_t>(r * d + k), kw = static_cast<size_t>(k * w + jj);
        b.dhidden.sum_abs[kh] += wk * A;
        b.dW.sum_abs[kw] += hk * A;
        if (bf) b.dhidden.sum_abs_bf16[kh] += wk * dl, b.dW.sum_abs_bf16[kw] += hk * dl;
      }
    }
  }
  return b;
}

}  // namespace trident::golden
