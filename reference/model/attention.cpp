#include "reference/model/attention.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "reference/bf16.h"
#include "reference/check.h"
#include "reference/dmath.h"
#include "reference/gemm.h"
#include "reference/profile.h"

#define TRIDENT_GEMM_NS base
#include "reference/model/attn_core_kernel.h"
#undef TRIDENT_GEMM_NS

namespace trident::model {

CoreDims CoreDims::from(const Config& c) {
  CoreDims d;
  d.H = c.heads;
  d.G = c.kv_groups();
  d.Dq = c.core_q_dim();
  d.Dv = c.core_v_dim();
  d.P = c.payload_dim();
  d.val_base = c.attn == AttnKind::mla ? 0 : c.kv_heads * c.head_dim;
  d.scale = 1.0 / std::sqrt(static_cast<double>(c.attn == AttnKind::mla ? c.nope_dim + c.rope_dim : c.head_dim));
  if (c.dsa()) {
    d.Hi = c.index_heads;
    d.Di = c.index_dim;
    d.topk = c.dsa_topk;
    d.ikey = c.kv_lora_rank + c.rope_dim;
  }
  return d;
}

namespace {
void check_queries(const int64_t* qpos, const int64_t* qdoc, int64_t Nq, int64_t S) {
  for (int64_t r = 0; r < Nq; ++r) {
    TD_CHECK(qpos[r] >= 0 && qpos[r] < S, "attention: query position {} outside the key range [0, {})", qpos[r], S);
    if (qdoc)
      TD_CHECK(qdoc[r] >= 0 && qdoc[r] <= qpos[r], "attention: document start {} of the query at position {} is "
               "outside [0, {}]", qdoc[r], qpos[r], qpos[r]);
  }
}
}  // namespace

namespace attn_isa {
// The core's arguments checked, then the copy for the GEMM's instruction set (reference/model/attn_core_kernel.h).
template <class T>
void core_forward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, const int64_t* qdoc, int64_t Nq,
                  const T* kv, int64_t S, T* o, T* stats) {
  check_queries(qpos, qdoc, Nq, S);
#if TRIDENT_GEMM_DISPATCH
  switch (gemm_isa()) {
    case GemmIsa::avx512: return avx512::core_forward<T>(pol, cd, q, qpos, qdoc, Nq, kv, S, o, stats);
    case GemmIsa::avx2: return avx2::core_forward<T>(pol, cd, q, qpos, qdoc, Nq, kv, S, o, stats);
    case GemmIsa::baseline: break;
  }
#endif
  base::core_forward<T>(pol, cd, q, qpos, qdoc, Nq, kv, S, o, stats);
}
template <class T>
void core_backward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, const int64_t* qdoc, int64_t Nq,
                   const T* kv, int64_t S, const T* o, const T* stats, const T* dO, std::span<const int64_t> qsegs,
                   T* dq, KeySide<T> ks) {
  TD_CHECK(!qsegs.empty() && qsegs.front() == 0 && qsegs.back() == Nq,
           "attn_core_backward: query segments must cover rows [0, {})", Nq);
  check_queries(qpos, qdoc, Nq, S);
#if TRIDENT_GEMM_DISPATCH
  switch (gemm_isa()) {
    case GemmIsa::avx512:
      return avx512::core_backward<T>(pol, cd, q, qpos, qdoc, Nq, kv, S, o, stats, dO, qsegs, dq, ks);
    case GemmIsa::avx2: return avx2::core_backward<T>(pol, cd, q, qpos, qdoc, Nq, kv, S, o, stats, dO, qsegs, dq, ks);
    case GemmIsa::baseline: break;
  }
#endif
  base::core_backward<T>(pol, cd, q, qpos, qdoc, Nq, kv, S, o, stats, dO, qsegs, dq, ks);
}
}  // namespace attn_isa

namespace {
// The baseline copy's helpers serve the DSA core below.
using attn_isa::base::axpy;
using attn_isa::base::dot;
using attn_isa::base::first_key;
using attn_isa::base::op1;
using attn_isa::base::operand;
using attn_isa::core_backward;
using attn_isa::core_forward;
using attn_isa::KeySide;

// krow (S) must be a permutation of [0, S): one clear error naming the op otherwise.
void check_permutation(std::span<const int64_t> krow, int64_t S, const char* op) {
  std::vector<uint8_t> seen(static_cast<size_t>(S));
  for (int64_t j = 0; j < S; ++j) {
    const int64_t r = krow[static_cast<size_t>(j)];
    TD_CHECK(r >= 0 && r < S && !seen[static_cast<size_t>(r)],
             "{}: the key rows are not a permutation of [0, {}) (key {} -> row {})", op, S, j, r);
    seen[static_cast<size_t>(r)] = 1;
  }
}

}  // namespace

namespace {
// ---- DSA ------------------------------------------------------------------------------------------------------
// One query's index scores over a key list (dsa_select, dsa_core_forward and _backward share it, so the three
// agree bit for bit): I[i] = +0 + sum_t w_t relu(z_t(keys[i])). qr: the query's Hi*Di (operand-rounded) values,
// w: its Hi weights (unrounded), kr: the operand-rounded payload. z (Hi) per key kept when zs is not null.
template <class T>
T index_score(const CoreDims& cd, const T* qr, const T* w, const T* kr, int64_t j, T* zs) {
  const T* k = kr + j * cd.P + cd.ikey;
  T I = T(0);
  for (int64_t t = 0; t < cd.Hi; ++t) {
    const T z = dot(qr + t * cd.Di, k, cd.Di);
    if (zs) zs[t] = z;
    I = I + w[t] * (z > T(0) || z != z ? z : T(0));  // relu, NaN passed through (reported, never hidden)
  }
  return I;
}

void check_dsa(const CoreDims& cd, const char* op) {
  TD_CHECK(cd.topk > 0 && cd.Hi > 0 && cd.Di > 0 && cd.ikey >= 0 && cd.ikey + cd.Di <= cd.P,
           "{}: not a DSA configuration (topk {}, index heads {}, index dim {}, indexer key at {} of {})", op, cd.topk,
           cd.Hi, cd.Di, cd.ikey, cd.P);
}

// The selected keys of query r: sel[r][0..n) (n: up to the first -1), checked: ascending, inside [0, qpos[r]].
int64_t selected(const CoreDims& cd, const int32_t* sel, const int64_t* qpos, int64_t r, const char* op) {
  const int32_t* sr = sel + r * cd.topk;
  int64_t n = 0;
  while (n < cd.topk && sr[n] >= 0) {
    TD_CHECK(sr[n] <= qpos[r] && (n == 0 || sr[n] > sr[n - 1]),
             "{}: selection of query {} (position {}) is not ascending inside [0, {}] at entry {} ({})", op, r, qpos[r],
             qpos[r], n, sr[n]);
    ++n;
  }
  TD_CHECK(n > 0, "{}: query {} (position {}) has no selected key", op, r, qpos[r]);
  for (int64_t i = n; i < cd.topk; ++i)
    TD_CHECK(sr[i] == -1, "{}: selection of query {} has entry {} = {} after its end (-1)", op, r, i, sr[i]);
  return n;
}
// The entries of a selection already checked (dsa_check_selection): up to the first -1. The ops' parallel loops use
// this, so nothing in them can throw.
int64_t n_selected(const int32_t* sr, int64_t topk) {
  int64_t n = 0;
  while (n < topk && sr[n] >= 0) ++n;
  return n;
}

// The indexer's softmax over one query's n selected scores I: eI[i] = exp(I[i] - mI), returns lI = +0 + eI[0] + ...
// (ascending); mI = the first largest score (forward and backward share it).
template <class T>
T index_softmax(int64_t n, const T* I, T* eI, T& mI) {
  mI = I[0];
  for (int64_t i = 1; i < n; ++i)
    if (I[i] > mI) mI = I[i];
  for (int64_t i = 0; i < n; ++i) eI[i] = I[i] - mI;
  dm::exp_n(eI, eI, n);
  T lI = T(0);
  for (int64_t i = 0; i < n; ++i) lI = lI + eI[i];
  return lI;
}

}  // namespace

void dsa_check_selection(const CoreDims& cd, const int32_t* sel, const int64_t* qpos, int64_t Nq, const char* op) {
  check_dsa(cd, op);
  for (int64_t r = 0; r < Nq; ++r) selected(cd, sel, qpos, r, op);
}

template <class T>
void dsa_select(Policy pol, const CoreDims& cd, const T* iq, const int64_t* qpos, const int64_t* qdoc, int64_t Nq,
                const T* kv, int64_t S, int32_t* sel) {
  prof::OpSection prof_section(prof::Op::attn_core_fwd);
  check_dsa(cd, "dsa_select");
  check_queries(qpos, qdoc, Nq, S);
  const int64_t Iw = cd.Hi * cd.Di + cd.Hi;
  std::vector<T> kb;
  const T* kr = operand(pol, kv, S * cd.P, kb);
  int64_t nan_row = -1, nan_key = -1;
#pragma omp parallel if (Nq * S * cd.Hi * cd.Di >= (int64_t{1} << 18))
  {
  std::vector<T> I(static_cast<size_t>(S)), qrow(static_cast<size_t>(cd.Hi * cd.Di));
  std::vector<int32_t> idx(static_cast<size_t>(S));
#pragma omp for schedule(dynamic, 4)
  for (int64_t r = 0; r < Nq; ++r) {
    const T* qi = iq + r * Iw;
    for (int64_t c = 0; c < cd.Hi * cd.Di; ++c) qrow[static_cast<size_t>(c)] = op1(pol, qi[c]);
    const int64_t j0 = first_key(qdoc, r), j1 = qpos[r] + 1, n = j1 - j0;
    int32_t* out = sel + r * cd.topk;
    bool row_nan = false;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = j0 + i;
      I[static_cast<size_t>(i)] = index_score(cd, qrow.data(), qi + cd.Hi * cd.Di, kr, j, static_cast<T*>(nullptr));
      if (std::isnan(I[static_cast<size_t>(i)])) {  // reported after the parallel region (no throw inside it)
        row_nan = true;
#pragma omp critical(dsa_select_nan)
        if (nan_row < 0 || r < nan_row) nan_row = r, nan_key = j;
      }
      idx[static_cast<size_t>(i)] = static_cast<int32_t>(j);
    }
    const int64_t k = row_nan ? 0 : std::min(n, cd.topk);  // NaN: no order to select by (the op throws below)
    if (k < n && !row_nan) {  // the k best by (score descending, position ascending): a total order, so the set is unique
      auto better = [&](int32_t a, int32_t b) {
        const T ia = I[static_cast<size_t>(a - j0)], ib = I[static_cast<size_t>(b - j0)];
        return ia > ib || (!(ib > ia) && a < b);
      };
      std::nth_element(idx.begin(), idx.begin() + (k - 1), idx.begin() + n, better);
      std::sort(idx.begin(), idx.begin() + k);
    }
    for (int64_t i = 0; i < cd.topk; ++i) out[i] = i < k ? idx[static_cast<size_t>(i)] : -1;
  }
  }
  TD_CHECK(nan_row < 0, "dsa_select: the index score of query {} (position {}) for key {} is NaN", nan_row,
           nan_row < 0 ? 0 : qpos[nan_row], nan_key);
}

template <class T>
void dsa_core_forward(Policy pol, const CoreDims& cd, const T* q, const T* iq, const int64_t* qpos, int64_t Nq,
                      const T* kv, int64_t S, const int32_t* sel, T* o, T* stats, T* ikl) {
  prof::OpSection prof_section(prof::Op::attn_core_fwd);
  check_dsa(cd, "dsa_core_forward");
  check_queries(qpos, nullptr, Nq, S);
  const int64_t H = cd.H, Dq = cd.Dq, Dv = cd.Dv, P = cd.P, hpg = cd.H / cd.G, K = cd.topk;
  const int64_t Iw = cd.Hi * cd.Di + cd.Hi;
  const T sc = static_cast<T>(cd.scale);
  dsa_check_selection(cd, sel, qpos, Nq, "dsa_core_forward");
  std::vector<T> qb, kb, ib;
  const T* qr = operand(pol, q, Nq * H * Dq, qb);
  const T* kr = operand(pol, kv, S * P, kb);
  const T* iqr = operand(pol, iq, Nq * Iw, ib);
#pragma omp parallel if (Nq * H * K * Dq >= (int64_t{1} << 18))
  {
  std::vector<T> s(static_cast<size_t>(K)), pk(static_cast<size_t>(K)), I(static_cast<size_t>(K)),
      eI(static_cast<size_t>(K));
#pragma omp for schedule(dynamic, 4)
  for (int64_t r = 0; r < Nq; ++r) {
    const int32_t* sr = sel + r * K;
    const int64_t n = n_selected(sr, K);
    std::fill(pk.begin(), pk.end(), T(0));
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / hpg;
      const T* qh = qr + (r * H + h) * Dq;
      T m = T(0);
      for (int64_t i = 0; i < n; ++i) {
        s[i] = dot(qh, kr + sr[i] * P + g * Dq, Dq) * sc;
        if (i == 0 || s[i] > m) m = s[i];
      }
      for (int64_t i = 0; i < n; ++i) s[i] = s[i] - m;
      dm::exp_n(s.data(), s.data(), n);
      T l = T(0);
      for (int64_t i = 0; i < n; ++i) l = l + s[i];
      T* oh = o + (r * H + h) * Dv;
      for (int64_t c = 0; c < Dv; ++c) oh[c] = T(0);
      for (int64_t i = 0; i < n; ++i) {
        const T pu = s[i] / l;
        pk[i] = pk[i] + pu;
        axpy(oh, op1(pol, pu), kr + sr[i] * P + cd.val_base + g * Dv, Dv);
      }
      stats[(r * H + h) * 2 + 0] = m;
      stats[(r * H + h) * 2 + 1] = l;
    }
    if (!ikl) continue;
    const T* w = iq + r * Iw + cd.Hi * cd.Di;
    for (int64_t i = 0; i < n; ++i) I[i] = index_score(cd, iqr + r * Iw, w, kr, sr[i], static_cast<T*>(nullptr));
    T mI;
    const T lI = index_softmax(n, I.data(), eI.data(), mI);
    const T logl = dm::log(lI);
    T kl = T(0);
    for (int64_t i = 0; i < n; ++i) {
      const T p = pk[i] / static_cast<T>(H);
      if (p > T(0)) kl = kl + p * (dm::log(p) - ((I[i] - mI) - logl));
    }
    ikl[r] = kl;
  }
  }
}

template <class T>
void dsa_core_backward(Policy pol, const CoreDims& cd, const T* q, const T* iq, const int64_t* qpos, int64_t Nq,
                       const T* kv, int64_t S, const int32_t* sel, const T* o, const T* stats, const T* dO, T iscale,
                       std::span<const int64_t> qsegs, T* dq, T* diq, ExactAcc<T>* dkv) {
  prof::OpSection prof_section(prof::Op::attn_core_bwd);
  check_dsa(cd, "dsa_core_backward");
  const int64_t H = cd.H, Dq = cd.Dq, Dv = cd.Dv, P = cd.P, hpg = cd.H / cd.G, K = cd.topk, Hi = cd.Hi, Di = cd.Di;
  const int64_t Iw = Hi * Di + Hi;
  const T sc = static_cast<T>(cd.scale);
  TD_CHECK(!qsegs.empty() && qsegs.front() == 0 && qsegs.back() == Nq,
           "dsa_core_backward: query segments must cover rows [0, {})", Nq);
  check_queries(qpos, nullptr, Nq, S);
  dsa_check_selection(cd, sel, qpos, Nq, "dsa_core_backward");
  std::vector<T> qb, kb, db, ib;
  const T* qr = operand(pol, q, Nq * H * Dq, qb);
  const T* kr = operand(pol, kv, S * P, kb);
  const T* dOr = operand(pol, dO, Nq * H * Dv, db);
  const T* iqr = operand(pol, iq, Nq * Iw, ib);
  // Per row and selected entry i: p and dsc per head, dz per indexer head (bf16: rounded), for the key side.
  std::vector<T> pbuf, dsbuf, dzbuf;
  for (size_t t = 0; t + 1 < qsegs.size(); ++t) {
    const int64_t r0 = qsegs[t], r1 = qsegs[t + 1], nr = r1 - r0;
    if (nr == 0) continue;
    pbuf.assign(static_cast<size_t>(nr * K * H), T(0));
    dsbuf.assign(static_cast<size_t>(nr * K * H), T(0));
    dzbuf.assign(static_cast<size_t>(nr * K * Hi), T(0));
#pragma omp parallel if (nr * H * K * (Dq + Dv) >= (int64_t{1} << 17))
    {
    std::vector<T> pk(static_cast<size_t>(K)), I(static_cast<size_t>(K)), eI(static_cast<size_t>(K)),
        z(static_cast<size_t>(K * Hi));
#pragma omp for schedule(dynamic, 1)
    for (int64_t r = r0; r < r1; ++r) {
      const int32_t* sr = sel + r * K;
      const int64_t n = n_selected(sr, K);
      std::fill(pk.begin(), pk.end(), T(0));
      for (int64_t h = 0; h < H; ++h) {
        const int64_t g = h / hpg;
        const T* qh = qr + (r * H + h) * Dq;
        const T* doh = dO + (r * H + h) * Dv;
        const T* dohr = dOr + (r * H + h) * Dv;
        const T m = stats[(r * H + h) * 2 + 0], l = stats[(r * H + h) * 2 + 1];
        const T D = dot(doh, o + (r * H + h) * Dv, Dv);
        T* dqh = dq + (r * H + h) * Dq;
        for (int64_t c = 0; c < Dq; ++c) dqh[c] = T(0);
        for (int64_t i = 0; i < n; ++i) {
          const int64_t j = sr[i];
          const T sv = dot(qh, kr + j * P + g * Dq, Dq) * sc;
          const T p = dm::exp(sv - m) / l;
          const T dp = dot(dohr, kr + j * P + cd.val_base + g * Dv, Dv);
          pk[i] = pk[i] + p;
          pbuf[((r - r0) * K + i) * H + h] = op1(pol, p);
          const T dd = op1(pol, (p * (dp - D)) * sc);
          dsbuf[((r - r0) * K + i) * H + h] = dd;
          axpy(dqh, dd, kr + j * P + g * Dq, Dq);
        }
      }
      // The indexer: dI = (softmax(I) - p) * iscale over the selected keys, through the weighted ReLU heads.
      const T* w = iq + r * Iw + Hi * Di;
      for (int64_t i = 0; i < n; ++i) I[i] = index_score(cd, iqr + r * Iw, w, kr, sr[i], z.data() + i * Hi);
      T mI;
      const T lI = index_softmax(n, I.data(), eI.data(), mI);
      T* dqi = diq + r * Iw;
      for (int64_t c = 0; c < Iw; ++c) dqi[c] = T(0);
      T* dw = dqi + Hi * Di;
      for (int64_t i = 0; i < n; ++i) {
        const T dI = (eI[i] / lI - pk[i] / static_cast<T>(H)) * iscale;
        const T* kj = kr + sr[i] * P + cd.ikey;
        for (int64_t t = 0; t < Hi; ++t) {
          const T zt = z[i * Hi + t];
          dw[t] = dw[t] + dI * (zt > T(0) ? zt : T(0));
          const T dz = op1(pol, zt > T(0) ? dI * w[t] : T(0));
          dzbuf[((r - r0) * K + i) * Hi + t] = dz;
          axpy(dqi + t * Di, dz, kj, Di);
        }
      }
    }
    }
    // Key side: per key, the tile's partial over its rows in order (attention heads, then indexer heads), one
    // exact add per element. Keys no row of the tile selected receive nothing.
    int64_t k0 = S, k1 = 0;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t n = n_selected(sel + r * K, K);
      k0 = std::min<int64_t>(k0, sel[r * K]);
      k1 = std::max<int64_t>(k1, sel[r * K + n - 1] + 1);
    }
    // slot[(r - r0) * (k1 - k0) + j - k0]: the entry of key j in row r's selection, or -1.
    std::vector<int32_t> slot(static_cast<size_t>(nr * (k1 - k0)), -1);
    std::vector<uint8_t> used(static_cast<size_t>(k1 - k0), 0);
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t i = 0; i < K && sel[r * K + i] >= 0; ++i) {
        slot[static_cast<size_t>((r - r0) * (k1 - k0) + sel[r * K + i] - k0)] = static_cast<int32_t>(i);
        used[static_cast<size_t>(sel[r * K + i] - k0)] = 1;
      }
    prof::OpSection key_side(prof::Op::tile_reduce);
#pragma omp parallel if (nr * H * K * (Dq + Dv) >= (int64_t{1} << 17))
    {
    std::vector<T> part(static_cast<size_t>(P));
#pragma omp for schedule(static)
    for (int64_t j = k0; j < k1; ++j) {
      if (!used[static_cast<size_t>(j - k0)]) continue;
      std::fill(part.begin(), part.end(), T(0));
      for (int64_t r = r0; r < r1; ++r) {
        const int32_t i = slot[static_cast<size_t>((r - r0) * (k1 - k0) + j - k0)];
        if (i < 0) continue;
        for (int64_t h = 0; h < H; ++h) {
          const int64_t g = h / hpg;
          axpy(part.data() + g * Dq, dsbuf[((r - r0) * K + i) * H + h], qr + (r * H + h) * Dq, Dq);
          axpy(part.data() + cd.val_base + g * Dv, pbuf[((r - r0) * K + i) * H + h], dOr + (r * H + h) * Dv, Dv);
        }
        for (int64_t t = 0; t < Hi; ++t)
          axpy(part.data() + cd.ikey, dzbuf[((r - r0) * K + i) * Hi + t], iqr + r * Iw + t * Di, Di);
      }
      ExactAcc<T>* a = dkv + j * P;
      for (int64_t c = 0; c < P; ++c) a[c].add(part[c]);
    }
    }
  }
}

template <class T>
void attn_core_forward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq, const T* kv,
                       int64_t S, T* o, T* stats) {
  core_forward<T>(pol, cd, q, qpos, nullptr, Nq, kv, S, o, stats);
}
template <class T>
void attn_core_backward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq, const T* kv,
                        int64_t S, const T* o, const T* stats, const T* dO, std::span<const int64_t> qsegs, T* dq,
                        ExactAcc<T>* dkv) {
  core_backward<T>(pol, cd, q, qpos, nullptr, Nq, kv, S, o, stats, dO, qsegs, dq, KeySide<T>{dkv});
}
template <class T>
void attn_core_backward_rows(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq, const T* kv,
                             int64_t S, const T* o, const T* stats, const T* dO, std::span<const int64_t> qsegs, T* dq,
                             ExactAcc<T>* dkv, std::span<const int64_t> krow) {
  TD_CHECK_EQ(static_cast<int64_t>(krow.size()), S, "attn_core_backward_rows: one accumulator row per key");
  check_permutation(krow, S, "attn_core_backward_rows");
  core_backward<T>(pol, cd, q, qpos, nullptr, Nq, kv, S, o, stats, dO, qsegs, dq, KeySide<T>{dkv, krow.data()});
}
template <class T>
void attn_core_backward_partials(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq,
                                 const T* kv, int64_t S, const T* o, const T* stats, const T* dO,
                                 std::span<const int64_t> qsegs, T* dq, T* part, std::span<const int64_t> krow,
                                 int64_t blk) {
  TD_CHECK_EQ(static_cast<int64_t>(krow.size()), S, "attn_core_backward_partials: one partial row per key and tile");
  TD_CHECK(blk > 0 && S % blk == 0, "attn_core_backward_partials: {} keys are not blocks of {}", S, blk);
  check_permutation(krow, S, "attn_core_backward_partials");
  core_backward<T>(pol, cd, q, qpos, nullptr, Nq, kv, S, o, stats, dO, qsegs, dq,
                   KeySide<T>{nullptr, krow.data(), part, blk});
}
template <class T>
void attn_doc_core_forward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, const int64_t* qdoc,
                           int64_t Nq, const T* kv, int64_t S, T* o, T* stats) {
  TD_CHECK(qdoc != nullptr, "attn_doc_core_forward: no document starts");
  core_forward<T>(pol, cd, q, qpos, qdoc, Nq, kv, S, o, stats);
}
template <class T>
void attn_doc_core_backward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, const int64_t* qdoc,
                            int64_t Nq, const T* kv, int64_t S, const T* o, const T* stats, const T* dO,
                            std::span<const int64_t> qsegs, T* dq, ExactAcc<T>* dkv) {
  TD_CHECK(qdoc != nullptr, "attn_doc_core_backward: no document starts");
  core_backward<T>(pol, cd, q, qpos, qdoc, Nq, kv, S, o, stats, dO, qsegs, dq, KeySide<T>{dkv});
}

std::vector<int64_t> rope_positions(const TokenRows& rows) {
  if (rows.doc.empty()) return rows.pos;
  TD_CHECK_EQ(rows.doc.size(), rows.pos.size(), "rope_positions: one document start per row");
  std::vector<int64_t> rp(rows.pos.size());
  for (size_t i = 0; i < rp.size(); ++i) rp[i] = rows.pos[i] - rows.doc[i];
  return rp;
}

// ---- activations ----------------------------------------------------------------------------------------------
AttnActSizes AttnActSizes::of(const Config& cfg, int64_t N) {
  const CoreDims cd = CoreDims::from(cfg);
  const int64_t H = cfg.heads;
  const bool mla = cfg.attn == AttnKind::mla;
  AttnActSizes z;
  z.q = mla ? N * H * (cfg.nope_dim + cfg.rope_dim) : 0;
  z.qc = N * H * cd.Dq;
  z.c = mla ? N * (cfg.kv_lora_rank + cfg.rope_dim) : 0;
  z.kv_rinv = mla ? N : 0;
  z.payload = N * cd.P;
  z.o = N * H * cd.Dv;
  z.stats = N * H * 2;
  z.ocat = mla ? N * H * cfg.v_dim : 0;
  z.iq = N * cfg.index_q_width();
  return z;
}

template <class T>
void attn_acts_size(const Config& cfg, int64_t N, AttnActs<T>& A) {
  const AttnActSizes z = AttnActSizes::of(cfg, N);
  auto set = [](std::vector<T>& v, int64_t n) { v.assign(static_cast<size_t>(n), T(0)); };
  set(A.q, z.q);
  set(A.qc, z.qc);
  set(A.c, z.c);
  set(A.kv_rinv, z.kv_rinv);
  set(A.payload, z.payload);
  set(A.o, z.o);
  set(A.stats, z.stats);
  set(A.ocat, z.ocat);
  set(A.iq, z.iq);
}

template <class T>
void dsa_index_forward(Policy pol, const Config& cfg, const AttnW<T>& W, const T* a, int64_t N, const AttnBufs<T>& A) {
  prof::OpSection prof_section(prof::Op::attn_other);
  const int64_t d = cfg.d_model, Hi = cfg.index_heads, Di = cfg.index_dim, Iw = cfg.index_q_width();
  const int64_t P = cfg.payload_dim(), ikey = cfg.kv_lora_rank + cfg.rope_dim;
  mm<T>(pol, N, Hi * Di, d, a, d, W.wiq, Hi * Di, false, A.iq, Iw);
  mm<T>(pol, N, Hi, d, a, d, W.wiw, Hi, false, A.iq + Hi * Di, Iw);
  mm<T>(pol, N, Di, d, a, d, W.wik, Di, false, A.payload + ikey, P);
}

template <class T>
void dsa_index_wgrad(Policy pol, const Config& cfg, const AttnG<T>& G, const T* a, int64_t N, const T* diq,
                     const T* dpayload, std::span<const int64_t> segs) {
  prof::OpSection prof_section(prof::Op::attn_other);
  (void)N;
  const int64_t d = cfg.d_model, Hi = cfg.index_heads, Di = cfg.index_dim, Iw = cfg.index_q_width();
  const int64_t P = cfg.payload_dim(), ikey = cfg.kv_lora_rank + cfg.rope_dim;
  wgrad_acc<T>(pol, a, d, diq, Iw, d, Hi * Di, segs, G.wiq);
  wgrad_acc<T>(pol, a, d, diq + Hi * Di, Iw, d, Hi, segs, G.wiw);
  wgrad_acc<T>(pol, a, d, dpayload + ikey, P, d, Di, segs, G.wik);
}

// ---- (a) projections ----------------------------------------------------------------------------------------
template <class T>
void attn_qkv_forward(Policy pol, const Config& cfg, const AttnW<T>& W, const T* a, const int64_t* pos, int64_t N,
                      const RopeTable<T>& rope, const AttnBufs<T>& A) {
  prof::OpSection prof_section(prof::Op::attn_other);
  const int64_t d = cfg.d_model, H = cfg.heads, P = cfg.payload_dim();
  std::fill_n(A.payload, N * P, T(0));
  if (cfg.attn == AttnKind::gqa) {
    const int64_t Dh = cfg.head_dim, Hkv = cfg.kv_heads;
    std::fill_n(A.qc, N * H * Dh, T(0));
    mm<T>(pol, N, H * Dh, d, a, d, W.wq, H * Dh, false, A.qc, H * Dh);
    rope_forward<T>(A.qc, H * Dh, H, Dh, pos, N, rope);
    mm<T>(pol, N, Hkv * Dh, d, a, d, W.wk, Hkv * Dh, false, A.payload, P);
    rope_forward<T>(A.payload, P, Hkv, Dh, pos, N, rope);
    mm<T>(pol, N, Hkv * Dh, d, a, d, W.wv, Hkv * Dh, false, A.payload + Hkv * Dh, P);
    return;
  }
  const int64_t Dn = cfg.nope_dim, Dr = cfg.rope_dim, r = cfg.kv_lora_rank, Qw = H * (Dn + Dr), Dq = r + Dr;
  std::fill_n(A.q, N * Qw, T(0));
  mm<T>(pol, N, Qw, d, a, d, W.wq, Qw, false, A.q, Qw);
  std::fill_n(A.qc, N * H * Dq, T(0));
  for (int64_t h = 0; h < H; ++h) {
    // absorbed query: q_nope_h (N, Dn) @ W_uk_h^T (Dn, r), W_uk_h = columns h*Dn.. of W_uk (r, H*Dn)
    mm<T>(pol, N, r, Dn, A.q + h * (Dn + Dr), Qw, W.wuk + h * Dn, H * Dn, true, A.qc + h * Dq, H * Dq);
    for (int64_t t = 0; t < N; ++t)
      std::copy_n(A.q + t * Qw + h * (Dn + Dr) + Dn, Dr, A.qc + (t * H + h) * Dq + r);
  }
  rope_forward<T>(A.qc + r, H * Dq, H, Dq, pos, N, rope);
  std::fill_n(A.c, N * Dq, T(0));
  mm<T>(pol, N, r + Dr, d, a, d, W.wdkv, r + Dr, false, A.c, r + Dr);
  std::fill_n(A.kv_rinv, N, T(0));
  rmsnorm_forward<T>(A.c, r + Dr, W.kv_norm, N, r, cfg.norm_eps, A.payload, P, A.kv_rinv);
  for (int64_t t = 0; t < N; ++t) std::copy_n(A.c + t * (r + Dr) + r, Dr, A.payload + t * P + r);
  rope_forward<T>(A.payload + r, P, 1, 0, pos, N, rope);
}

template <class T>
void attn_out_forward(Policy pol, const Config& cfg, const AttnW<T>& W, int64_t N, const AttnBufs<T>& A, T* y) {
  prof::OpSection prof_section(prof::Op::attn_other);
  const int64_t d = cfg.d_model, H = cfg.heads;
  if (cfg.attn == AttnKind::gqa) {
    const int64_t Dh = cfg.head_dim;
    mm<T>(pol, N, d, H * Dh, A.o, H * Dh, W.wo, d, false, y, d);
    return;
  }
  const int64_t r = cfg.kv_lora_rank, Dv = cfg.v_dim;
  std::fill_n(A.ocat, N * H * Dv, T(0));
  for (int64_t h = 0; h < H; ++h)  // o_h = o_lat_h (N, r) @ W_uv_h (r, Dv)
    mm<T>(pol, N, Dv, r, A.o + h * r, H * r, W.wuv + h * Dv, H * Dv, false, A.ocat + h * Dv, H * Dv);
  mm<T>(pol, N, d, H * Dv, A.ocat, H * Dv, W.wo, d, false, y, d);
}

// attn_out_backward / attn_qkv_backward for either view of the gradients: GV = AttnG<T> (accumulators) or AttnGP<T>
// (tile partials); wgrad_acc / wgrad_acc_block take either (reference/model/ops.h).
template <class T, class GV>
void attn_out_backward_v(Policy pol, const Config& cfg, const AttnW<T>& W, const GV& G, int64_t N,
                         const AttnBufs<T>& A, const T* dy, std::span<const int64_t> segs, T* dO) {
  prof::OpSection prof_section(prof::Op::attn_other);
  const int64_t d = cfg.d_model, H = cfg.heads;
  if (cfg.attn == AttnKind::gqa) {
    const int64_t Dh = cfg.head_dim;
    wgrad_acc<T>(pol, A.o, H * Dh, dy, d, H * Dh, d, segs, G.wo);
    mm<T>(pol, N, H * Dh, d, dy, d, W.wo, d, true, dO, H * Dh);
    return;
  }
  const int64_t r = cfg.kv_lora_rank, Dv = cfg.v_dim;
  wgrad_acc<T>(pol, A.ocat, H * Dv, dy, d, H * Dv, d, segs, G.wo);
  std::vector<T> docat(static_cast<size_t>(N * H * Dv));
  mm<T>(pol, N, H * Dv, d, dy, d, W.wo, d, true, docat.data(), H * Dv);
  for (int64_t h = 0; h < H; ++h) {
    wgrad_acc_block<T>(pol, A.o + h * r, H * r, docat.data() + h * Dv, H * Dv, r, Dv, segs, G.wuv + h * Dv,
                       H * Dv);
    mm<T>(pol, N, r, Dv, docat.data() + h * Dv, H * Dv, W.wuv + h * Dv, H * Dv, true, dO + h * r, H * r);
  }
}

template <class T, class GV>
void attn_qkv_backward_v(Policy pol, const Config& cfg, const AttnW<T>& W, const GV& G, const T* a,
                         const int64_t* pos, int64_t N, const RopeTable<T>& rope, const AttnBufs<T>& A, const T* dqc,
                         const T* dpayload, std::span<const int64_t> segs, T* da) {
  prof::OpSection prof_section(prof::Op::attn_other);
  const int64_t d = cfg.d_model, H = cfg.heads, P = cfg.payload_dim();
  std::vector<T> tmp(static_cast<size_t>(N * d));
  if (cfg.attn == AttnKind::gqa) {
    const int64_t Dh = cfg.head_dim, Hkv = cfg.kv_heads, Kw = Hkv * Dh;
    std::vector<T> dq(dqc, dqc + N * H * Dh), dk(static_cast<size_t>(N * Kw));
    rope_backward<T>(dq.data(), H * Dh, H, Dh, pos, N, rope);
    for (int64_t t = 0; t < N; ++t) std::copy_n(dpayload + t * P, Kw, dk.data() + t * Kw);
    rope_backward<T>(dk.data(), Kw, Hkv, Dh, pos, N, rope);
    const T* dv = dpayload + Kw;  // (N, Kw) stride P
    wgrad_acc<T>(pol, a, d, dq.data(), H * Dh, d, H * Dh, segs, G.wq);
    wgrad_acc<T>(pol, a, d, dk.data(), Kw, d, Kw, segs, G.wk);
    wgrad_acc<T>(pol, a, d, dv, P, d, Kw, segs, G.wv);
    mm<T>(pol, N, d, H * Dh, dq.data(), H * Dh, W.wq, H * Dh, true, da, d);
    mm<T>(pol, N, d, Kw, dk.data(), Kw, W.wk, Kw, true, tmp.data(), d);
    for (int64_t i = 0; i < N * d; ++i) da[i] = da[i] + tmp[i];
    mm<T>(pol, N, d, Kw, dv, P, W.wv, Kw, true, tmp.data(), d);
    for (int64_t i = 0; i < N * d; ++i) da[i] = da[i] + tmp[i];
    return;
  }
  const int64_t Dn = cfg.nope_dim, Dr = cfg.rope_dim, r = cfg.kv_lora_rank, Qw = H * (Dn + Dr), Dq = r + Dr;
  std::vector<T> dq(static_cast<size_t>(N * Qw)), dc(static_cast<size_t>(N * Dq));
  for (int64_t h = 0; h < H; ++h) {
    // dq_nope_h = dqc_h[:, :r] (N, r) @ W_uk_h (r, Dn); dW_uk_h[c, i] += sum_t dqc_h[t, c] q_nope_h[t, i]
    mm<T>(pol, N, Dn, r, dqc + h * Dq, H * Dq, W.wuk + h * Dn, H * Dn, false, dq.data() + h * (Dn + Dr), Qw);
    wgrad_acc_block<T>(pol, dqc + h * Dq, H * Dq, A.q + h * (Dn + Dr), Qw, r, Dn, segs, G.wuk + h * Dn,
                       H * Dn);
    for (int64_t t = 0; t < N; ++t)
      std::copy_n(dqc + (t * H + h) * Dq + r, Dr, dq.data() + t * Qw + h * (Dn + Dr) + Dn);
  }
  rope_backward<T>(dq.data() + Dn, Qw, H, Dn + Dr, pos, N, rope);
  rmsnorm_backward<T>(dpayload, P, A.c, Dq, A.kv_rinv, W.kv_norm, N, r, segs, dc.data(), Dq, G.kv_norm);
  for (int64_t t = 0; t < N; ++t) std::copy_n(dpayload + t * P + r, Dr, dc.data() + t * Dq + r);
  rope_backward<T>(dc.data() + r, Dq, 1, 0, pos, N, rope);
  wgrad_acc<T>(pol, a, d, dq.data(), Qw, d, Qw, segs, G.wq);
  wgrad_acc<T>(pol, a, d, dc.data(), Dq, d, Dq, segs, G.wdkv);
  mm<T>(pol, N, d, Qw, dq.data(), Qw, W.wq, Qw, true, da, d);
  mm<T>(pol, N, d, Dq, dc.data(), Dq, W.wdkv, Dq, true, tmp.data(), d);
  for (int64_t i = 0; i < N * d; ++i) da[i] = da[i] + tmp[i];
}

template <class T>
void attn_out_backward(Policy pol, const Config& cfg, const AttnW<T>& W, const AttnG<T>& G, int64_t N,
                       const AttnBufs<T>& A, const T* dy, std::span<const int64_t> segs, T* dO) {
  attn_out_backward_v<T>(pol, cfg, W, G, N, A, dy, segs, dO);
}
template <class T>
void attn_out_backward(Policy pol, const Config& cfg, const AttnW<T>& W, const AttnGP<T>& G, int64_t N,
                       const AttnBufs<T>& A, const T* dy, std::span<const int64_t> segs, T* dO) {
  attn_out_backward_v<T>(pol, cfg, W, G, N, A, dy, segs, dO);
}
template <class T>
void attn_qkv_backward(Policy pol, const Config& cfg, const AttnW<T>& W, const AttnG<T>& G, const T* a,
                       const int64_t* pos, int64_t N, const RopeTable<T>& rope, const AttnBufs<T>& A, const T* dqc,
                       const T* dpayload, std::span<const int64_t> segs, T* da) {
  attn_qkv_backward_v<T>(pol, cfg, W, G, a, pos, N, rope, A, dqc, dpayload, segs, da);
}
template <class T>
void attn_qkv_backward(Policy pol, const Config& cfg, const AttnW<T>& W, const AttnGP<T>& G, const T* a,
                       const int64_t* pos, int64_t N, const RopeTable<T>& rope, const AttnBufs<T>& A, const T* dqc,
                       const T* dpayload, std::span<const int64_t> segs, T* da) {
  attn_qkv_backward_v<T>(pol, cfg, W, G, a, pos, N, rope, A, dqc, dpayload, segs, da);
}

// ---- single-rank composition ---------------------------------------------------------------------------------
namespace {
void check_run(const TokenRows& rows, const TokenRows::Run& run) {
  for (int64_t i = run.begin; i < run.end; ++i)
    TD_CHECK_EQ(rows.pos[static_cast<size_t>(i)], i - run.begin,
                "single-rank attention: the rows of sequence {} must be its positions 0..S-1 in order", run.seq);
}
}  // namespace

template <class T>
void attention_forward(Policy pol, const Config& cfg, const AttnW<T>& W, const T* a, const TokenRows& rows,
                       const RopeTable<T>& rope, AttnActs<T>& acts, T* y) {
  prof::OpSection prof_section(prof::Op::attn_other);
  const int64_t N = rows.n;
  const CoreDims cd = CoreDims::from(cfg);
  attn_acts_size<T>(cfg, N, acts);
  const AttnBufs<T> A = acts.bufs();
  const std::vector<int64_t> rpos = rope_positions(rows);
  attn_qkv_forward<T>(pol, cfg, W, a, rpos.data(), N, rope, A);
  if (cfg.dsa()) {
    dsa_index_forward<T>(pol, cfg, W, a, N, A);
    if (!acts.keep_sel) acts.sel.assign(static_cast<size_t>(N * cd.topk), -1);
    TD_CHECK_EQ(static_cast<int64_t>(acts.sel.size()), N * cd.topk, "attention_forward: the kept DSA selection");
    acts.ikl.assign(static_cast<size_t>(N), T(0));
  }
  for (const auto& run : rows.sequence_runs()) {
    check_run(rows, run);
    const int64_t S = run.end - run.begin, b = run.begin;
    if (cfg.dsa()) {  // sparse attention: select (unless kept), then attend the selected keys
      const int64_t Iw = cfg.index_q_width();
      int32_t* sel = acts.sel.data() + b * cd.topk;
      if (!acts.keep_sel)
        dsa_select<T>(pol, cd, A.iq + b * Iw, rows.pos.data() + b, rows.doc.empty() ? nullptr : rows.doc.data() + b, S,
                      A.payload + b * cd.P, S, sel);
      dsa_core_forward<T>(pol, cd, A.qc + b * cd.H * cd.Dq, A.iq + b * Iw, rows.pos.data() + b, S,
                          A.payload + b * cd.P, S, sel, A.o + b * cd.H * cd.Dv, A.stats + b * cd.H * 2,
                          acts.ikl.data() + b);
    } else if (rows.doc.empty())
      attn_core_forward<T>(pol, cd, A.qc + b * cd.H * cd.Dq, rows.pos.data() + b, S, A.payload + b * cd.P, S,
                           A.o + b * cd.H * cd.Dv, A.stats + b * cd.H * 2);
    else
      attn_doc_core_forward<T>(pol, cd, A.qc + b * cd.H * cd.Dq, rows.pos.data() + b, rows.doc.data() + b, S,
                               A.payload + b * cd.P, S, A.o + b * cd.H * cd.Dv, A.stats + b * cd.H * 2);
  }
  attn_out_forward<T>(pol, cfg, W, N, A, y);
}

template <class T>
void attention_backward(Policy pol, const Config& cfg, const AttnW<T>& W, const AttnG<T>& G, const T* a,
                        const TokenRows& rows, const RopeTable<T>& rope, const AttnActs<T>& acts, const T* dy,
                        T* da) {
  prof::OpSection prof_section(prof::Op::attn_other);
  const AttnBufs<T> A = acts.bufs();
  const int64_t N = rows.n;
  const CoreDims cd = CoreDims::from(cfg);
  const T iscale = T(1) / static_cast<T>(N);  // DSA: the indexer loss is a mean over every query of the batch
  std::vector<T> dO(static_cast<size_t>(N * cd.H * cd.Dv)), dqc(static_cast<size_t>(N * cd.H * cd.Dq)),
      dpay(static_cast<size_t>(N * cd.P)), diq(static_cast<size_t>(N * cfg.index_q_width()));
  attn_out_backward<T>(pol, cfg, W, G, N, A, dy, rows.segs, dO.data());
  std::vector<ExactAcc<T>> acc;
  for (const auto& run : rows.sequence_runs()) {
    check_run(rows, run);
    const int64_t S = run.end - run.begin;
    const std::vector<int64_t> qsegs = rows.segs_in(run.begin, run.end);
    acc.assign(static_cast<size_t>(S * cd.P), ExactAcc<T>());
    const int64_t b = run.begin;
    if (cfg.dsa())
      dsa_core_backward<T>(pol, cd, A.qc + b * cd.H * cd.Dq, A.iq + b * cfg.index_q_width(), rows.pos.data() + b, S,
                           A.payload + b * cd.P, S, acts.sel.data() + b * cd.topk, A.o + b * cd.H * cd.Dv,
                           A.stats + b * cd.H * 2, dO.data() + b * cd.H * cd.Dv, iscale, qsegs,
                           dqc.data() + b * cd.H * cd.Dq, diq.data() + b * cfg.index_q_width(), acc.data());
    else if (rows.doc.empty())
      attn_core_backward<T>(pol, cd, A.qc + b * cd.H * cd.Dq, rows.pos.data() + b, S, A.payload + b * cd.P, S,
                            A.o + b * cd.H * cd.Dv, A.stats + b * cd.H * 2, dO.data() + b * cd.H * cd.Dv, qsegs,
                            dqc.data() + b * cd.H * cd.Dq, acc.data());
    else
      attn_doc_core_backward<T>(pol, cd, A.qc + b * cd.H * cd.Dq, rows.pos.data() + b, rows.doc.data() + b, S,
                                A.payload + b * cd.P, S, A.o + b * cd.H * cd.Dv, A.stats + b * cd.H * 2,
                                dO.data() + b * cd.H * cd.Dv, qsegs, dqc.data() + b * cd.H * cd.Dq, acc.data());
    {
      prof::OpSection rounding(prof::Op::tile_reduce);
      exact_round<T>(acc.data(), dpay.data() + run.begin * cd.P, S * cd.P);  // the single rounding of the key side
    }
  }
  const std::vector<int64_t> rpos = rope_positions(rows);
  attn_qkv_backward<T>(pol, cfg, W, G, a, rpos.data(), N, rope, A, dqc.data(), dpay.data(), rows.segs, da);
  if (cfg.dsa()) dsa_index_wgrad<T>(pol, cfg, G, a, N, diq.data(), dpay.data(), rows.segs);
}

#define TD_ATTN(T)                                                                                                 \
  template void dsa_select<T>(Policy, const CoreDims&, const T*, const int64_t*, const int64_t*, int64_t, const T*, \
                              int64_t, int32_t*);                                                                  \
  template void dsa_core_forward<T>(Policy, const CoreDims&, const T*, const T*, const int64_t*, int64_t, const T*, \
                                    int64_t, const int32_t*, T*, T*, T*);                                          \
  template void dsa_core_backward<T>(Policy, const CoreDims&, const T*, const T*, const int64_t*, int64_t,         \
                                     const T*, int64_t, const int32_t*, const T*, const T*, const T*, T,           \
                                     std::span<const int64_t>, T*, T*, ExactAcc<T>*);                              \
  template void dsa_index_forward<T>(Policy, const Config&, const AttnW<T>&, const T*, int64_t, const AttnBufs<T>&); \
  template void dsa_index_wgrad<T>(Policy, const Config&, const AttnG<T>&, const T*, int64_t, const T*, const T*,  \
                                   std::span<const int64_t>);                                                      \
  template void attn_core_forward<T>(Policy, const CoreDims&, const T*, const int64_t*, int64_t, const T*, int64_t, \
                                     T*, T*);                                                                      \
  template void attn_core_backward<T>(Policy, const CoreDims&, const T*, const int64_t*, int64_t, const T*,        \
                                      int64_t, const T*, const T*, const T*, std::span<const int64_t>, T*,         \
                                      ExactAcc<T>*);                                                               \
  template void attn_core_backward_rows<T>(Policy, const CoreDims&, const T*, const int64_t*, int64_t, const T*,   \
                                           int64_t, const T*, const T*, const T*, std::span<const int64_t>, T*,    \
                                           ExactAcc<T>*, std::span<const int64_t>);                                \
  template void attn_core_backward_partials<T>(Policy, const CoreDims&, const T*, const int64_t*, int64_t,         \
                                               const T*, int64_t, const T*, const T*, const T*,                    \
                                               std::span<const int64_t>, T*, T*, std::span<const int64_t>, int64_t); \
  template void attn_doc_core_forward<T>(Policy, const CoreDims&, const T*, const int64_t*, const int64_t*, int64_t, \
                                         const T*, int64_t, T*, T*);                                               \
  template void attn_doc_core_backward<T>(Policy, const CoreDims&, const T*, const int64_t*, const int64_t*,       \
                                          int64_t, const T*, int64_t, const T*, const T*, const T*,                \
                                          std::span<const int64_t>, T*, ExactAcc<T>*);                             \
  template void attn_acts_size<T>(const Config&, int64_t, AttnActs<T>&);                                           \
  template void attn_qkv_forward<T>(Policy, const Config&, const AttnW<T>&, const T*, const int64_t*, int64_t,     \
                                    const RopeTable<T>&, const AttnBufs<T>&);                                      \
  template void attn_out_forward<T>(Policy, const Config&, const AttnW<T>&, int64_t, const AttnBufs<T>&, T*);     \
  template void attn_out_backward<T>(Policy, const Config&, const AttnW<T>&, const AttnG<T>&, int64_t,             \
                                     const AttnBufs<T>&, const T*, std::span<const int64_t>, T*);                  \
  template void attn_qkv_backward<T>(Policy, const Config&, const AttnW<T>&, const AttnG<T>&, const T*,            \
                                     const int64_t*, int64_t, const RopeTable<T>&, const AttnBufs<T>&, const T*,   \
                                     const T*, std::span<const int64_t>, T*);                                      \
  template void attn_out_backward<T>(Policy, const Config&, const AttnW<T>&, const AttnGP<T>&, int64_t,            \
                                     const AttnBufs<T>&, const T*, std::span<const int64_t>, T*);                  \
  template void attn_qkv_backward<T>(Policy, const Config&, const AttnW<T>&, const AttnGP<T>&, const T*,           \
                                     const int64_t*, int64_t, const RopeTable<T>&, const AttnBufs<T>&, const T*,   \
                                     const T*, std::span<const int64_t>, T*);                                      \
  template void attention_forward<T>(Policy, const Config&, const AttnW<T>&, const T*, const TokenRows&,           \
                                     const RopeTable<T>&, AttnActs<T>&, T*);                                       \
  template void attention_backward<T>(Policy, const Config&, const AttnW<T>&, const AttnG<T>&, const T*,           \
                                      const TokenRows&, const RopeTable<T>&, const AttnActs<T>&, const T*, T*);
TD_ATTN(float)
TD_ATTN(double)
#undef TD_ATTN

}  // namespace trident::model
