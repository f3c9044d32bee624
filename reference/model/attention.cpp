#include "reference/model/attention.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "reference/bf16.h"
#include "reference/check.h"
#include "reference/dmath.h"

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
  return d;
}

namespace {

// Operand copy: bf16-rounded under the bf16 policy, else the pointer itself.
template <class T>
const T* operand(Policy pol, const T* x, int64_t n, std::vector<T>& buf) {
  if constexpr (std::is_same_v<T, float>) {
    if (pol == Policy::bf16) {
      buf.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) buf[static_cast<size_t>(i)] = round_bf16(x[i]);
      return buf.data();
    }
  }
  return x;
}
template <class T>
inline T op1(Policy pol, T x) {
  if constexpr (std::is_same_v<T, float>) {
    if (pol == Policy::bf16) return round_bf16(x);
  }
  return x;
}

template <class T>
inline T dot(const T* a, const T* b, int64_t n) {  // ascending, each product rounded, from +0
  T s = T(0);
  for (int64_t i = 0; i < n; ++i) s = s + a[i] * b[i];
  return s;
}

// Keys and values of every KV group transposed: kT (G*Dq, S), vT (G*Dv, S), so the per-key dot products of
// one query can run as vector loops across keys (each dot still sums ascending c from +0: same bits).
template <class T>
void transpose_kv(const CoreDims& cd, const T* kr, int64_t S, std::vector<T>& kT, std::vector<T>& vT) {
  const int64_t nkc = cd.G * cd.Dq, nvc = cd.G * cd.Dv;
  kT.resize(static_cast<size_t>(nkc * S));
  vT.resize(static_cast<size_t>(nvc * S));
  // Blocked over keys (a cache line of outputs per column), so the writes are not one line per element.
  constexpr int64_t JB = 16;
  for (int64_t j0 = 0; j0 < S; j0 += JB) {
    const int64_t j1 = std::min(S, j0 + JB);
    for (int64_t c = 0; c < nkc; ++c) {
      T* out = kT.data() + c * S;
      for (int64_t j = j0; j < j1; ++j) out[j] = kr[j * cd.P + c];
    }
    for (int64_t c = 0; c < nvc; ++c) {
      T* out = vT.data() + c * S;
      for (int64_t j = j0; j < j1; ++j) out[j] = kr[j * cd.P + cd.val_base + c];
    }
  }
}

// y[i] = y[i] + a * x[i] for i < n (elementwise, each element's operations unchanged). Full blocks of 8 have a
// compile-time length and restrict pointers, so -O2's cheap vectoriser takes them (a runtime-length loop needs
// an epilogue and is left scalar).
template <class T>
inline void axpy(T* __restrict y, T a, const T* __restrict x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int64_t k = 0; k < 8; ++k) y[i + k] = y[i + k] + a * x[i + k];
  for (; i < n; ++i) y[i] = y[i] + a * x[i];
}

// out[j] = dot(x, column j of XT) for j < n: s = +0; for c ascending: s = s + x[c]*XT[c, j].
template <class T>
inline void dots_t(T* out, const T* x, const T* XT, int64_t D, int64_t S, int64_t n) {
  for (int64_t j = 0; j < n; ++j) out[j] = T(0);
  for (int64_t c = 0; c < D; ++c) {
    const T xc = x[c];
    const T* row = XT + c * S;
    axpy(out, xc, row, n);
  }
}

}  // namespace

namespace {

// Query r's first key: its document's start (packed sequences) or 0.
inline int64_t first_key(const int64_t* qdoc, int64_t r) { return qdoc ? qdoc[r] : 0; }

void check_queries(const int64_t* qpos, const int64_t* qdoc, int64_t Nq, int64_t S) {
  for (int64_t r = 0; r < Nq; ++r) {
    TD_CHECK(qpos[r] >= 0 && qpos[r] < S, "attention: query position {} outside the key range [0, {})", qpos[r], S);
    if (qdoc)
      TD_CHECK(qdoc[r] >= 0 && qdoc[r] <= qpos[r], "attention: document start {} of the query at position {} is "
               "outside [0, {}]", qdoc[r], qpos[r], qpos[r]);
  }
}

// The core forward; qdoc null: causal over the whole sequence (keys 0..qpos), else keys qdoc..qpos.
template <class T>
void core_forward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, const int64_t* qdoc, int64_t Nq,
                  const T* kv, int64_t S, T* o, T* stats) {
  const int64_t H = cd.H, Dq = cd.Dq, Dv = cd.Dv, P = cd.P, hpg = cd.H / cd.G;
  const T sc = static_cast<T>(cd.scale);
  check_queries(qpos, qdoc, Nq, S);
  std::vector<T> qb, kb;
  const T* qr = operand(pol, q, Nq * H * Dq, qb);   // rounded copies (bf16) for the dot products
  const T* kr = operand(pol, kv, S * P, kb);
  std::vector<T> kT, vT;
  transpose_kv(cd, kr, S, kT, vT);
  const bool par = Nq * H * S * Dq >= (int64_t{1} << 18);  // parallel regions only where they pay off
#pragma omp parallel if (par)
  {
  std::vector<T> s(static_cast<size_t>(S));  // per thread, reused by every row (rows use s[0, np))
#pragma omp for schedule(dynamic, 4)
  for (int64_t r = 0; r < Nq; ++r) {
    const int64_t np = qpos[r] + 1, j0 = first_key(qdoc, r);  // keys [j0, np)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / hpg;
      const T* qh = qr + (r * H + h) * Dq;
      dots_t(s.data() + j0, qh, kT.data() + g * Dq * S + j0, Dq, S, np - j0);
      T m = T(0);
      for (int64_t j = j0; j < np; ++j) {
        s[j] = s[j] * sc;
        if (j == j0 || s[j] > m) m = s[j];
      }
      T l = T(0);
      for (int64_t j = j0; j < np; ++j) {
        s[j] = dm::exp(s[j] - m);
        l = l + s[j];
      }
      T* oh = o + (r * H + h) * Dv;
      for (int64_t c = 0; c < Dv; ++c) oh[c] = T(0);
      for (int64_t j = j0; j < np; ++j) {
        const T p = op1(pol, s[j] / l);
        const T* v = kr + j * P + cd.val_base + g * Dv;
        axpy(oh, p, v, Dv);
      }
      stats[(r * H + h) * 2 + 0] = m;
      stats[(r * H + h) * 2 + 1] = l;
    }
  }
  }
}

template <class T>
void core_backward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, const int64_t* qdoc, int64_t Nq,
                   const T* kv, int64_t S, const T* o, const T* stats, const T* dO, std::span<const int64_t> qsegs,
                   T* dq, ExactAcc<T>* dkv) {
  const int64_t H = cd.H, Dq = cd.Dq, Dv = cd.Dv, P = cd.P, hpg = cd.H / cd.G;
  const T sc = static_cast<T>(cd.scale);
  TD_CHECK(!qsegs.empty() && qsegs.front() == 0 && qsegs.back() == Nq,
           "attn_core_backward: query segments must cover rows [0, {})", Nq);
  check_queries(qpos, qdoc, Nq, S);
  std::vector<T> qb, kb, db;
  const T* qr = operand(pol, q, Nq * H * Dq, qb);
  const T* kr = operand(pol, kv, S * P, kb);
  const T* dOr = operand(pol, dO, Nq * H * Dv, db);
  std::vector<T> kT, vT;
  transpose_kv(cd, kr, S, kT, vT);
  std::vector<T> pbuf, dsbuf;
  for (size_t t = 0; t + 1 < qsegs.size(); ++t) {
    const int64_t r0 = qsegs[t], r1 = qsegs[t + 1], nr = r1 - r0;
    if (nr == 0) continue;
    int64_t nk = 0, k0 = S;  // keys touched by this tile: [k0, nk), k0 the smallest first key (0 when causal)
    for (int64_t r = r0; r < r1; ++r) nk = std::max(nk, qpos[r] + 1), k0 = std::min(k0, first_key(qdoc, r));
    pbuf.assign(static_cast<size_t>(nr * H * nk), T(0));   // (nr, H, nk) p_j (bf16: rounded)
    dsbuf.assign(static_cast<size_t>(nr * H * nk), T(0));  // (nr, H, nk) dsc_j (bf16: rounded)
    // Per (row, head): probabilities, dsc, and dq (per-query reduction over keys, ascending).
    const bool par = nr * H * nk * (Dq + Dv) >= (int64_t{1} << 17);
#pragma omp parallel if (par)
    {
    std::vector<T> sv(static_cast<size_t>(nk)), dpv(static_cast<size_t>(nk));  // per thread; rows use [0, np)
#pragma omp for schedule(dynamic, 1)
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t np = qpos[r] + 1, j0 = first_key(qdoc, r);  // keys [j0, np); p = dsc = 0 outside
      for (int64_t h = 0; h < H; ++h) {
        const int64_t g = h / hpg;
        const T* qh = qr + (r * H + h) * Dq;
        const T* doh = dO + (r * H + h) * Dv;
        const T* dohr = dOr + (r * H + h) * Dv;
        const T m = stats[(r * H + h) * 2 + 0], l = stats[(r * H + h) * 2 + 1];
        const T D = dot(doh, o + (r * H + h) * Dv, Dv);
        T* pp = pbuf.data() + ((r - r0) * H + h) * nk;
        T* dd = dsbuf.data() + ((r - r0) * H + h) * nk;
        dots_t(sv.data() + j0, qh, kT.data() + g * Dq * S + j0, Dq, S, np - j0);
        dots_t(dpv.data() + j0, dohr, vT.data() + g * Dv * S + j0, Dv, S, np - j0);
        for (int64_t j = j0; j < np; ++j) {
          const T s = sv[j] * sc;
          const T p = dm::exp(s - m) / l;
          const T dp = dpv[j];
          pp[j] = op1(pol, p);
          dd[j] = op1(pol, (p * (dp - D)) * sc);
        }
        T* dqh = dq + (r * H + h) * Dq;
        for (int64_t c = 0; c < Dq; ++c) dqh[c] = T(0);
        for (int64_t j = j0; j < np; ++j) {
          const T* k = kr + j * P + g * Dq;
          axpy(dqh, dd[j], k, Dq);
        }
      }
    }
    }
    // Key side: per key, in-tile partial over (row, head) in order, then one exact add per element.
    ReductionSection timer;
#pragma omp parallel if (par)
    {
    std::vector<T> part(static_cast<size_t>(P));  // per thread, zeroed per key
#pragma omp for schedule(static)
    for (int64_t j = k0; j < nk; ++j) {
      std::fill(part.begin(), part.end(), T(0));
      for (int64_t r = r0; r < r1; ++r) {
        if (j > qpos[r] || j < first_key(qdoc, r)) continue;  // masked: no term
        for (int64_t h = 0; h < H; ++h) {
          const int64_t g = h / hpg;
          const T ds = dsbuf[((r - r0) * H + h) * nk + j];
          const T p = pbuf[((r - r0) * H + h) * nk + j];
          const T* qh = qr + (r * H + h) * Dq;
          const T* doh = dOr + (r * H + h) * Dv;
          T* kp = part.data() + g * Dq;
          axpy(kp, ds, qh, Dq);
          T* vp = part.data() + cd.val_base + g * Dv;
          axpy(vp, p, doh, Dv);
        }
      }
      ExactAcc<T>* a = dkv + j * P;
      for (int64_t c = 0; c < P; ++c) a[c].add(part[c]);
    }
    }
  }
}

}  // namespace

template <class T>
void attn_core_forward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq, const T* kv,
                       int64_t S, T* o, T* stats) {
  core_forward<T>(pol, cd, q, qpos, nullptr, Nq, kv, S, o, stats);
}
template <class T>
void attn_core_backward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq, const T* kv,
                        int64_t S, const T* o, const T* stats, const T* dO, std::span<const int64_t> qsegs, T* dq,
                        ExactAcc<T>* dkv) {
  core_backward<T>(pol, cd, q, qpos, nullptr, Nq, kv, S, o, stats, dO, qsegs, dq, dkv);
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
  core_backward<T>(pol, cd, q, qpos, qdoc, Nq, kv, S, o, stats, dO, qsegs, dq, dkv);
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
}

// ---- (a) projections ----------------------------------------------------------------------------------------
template <class T>
void attn_qkv_forward(Policy pol, const Config& cfg, const AttnW<T>& W, const T* a, const int64_t* pos, int64_t N,
                      const RopeTable<T>& rope, const AttnBufs<T>& A) {
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

template <class T>
void attn_out_backward(Policy pol, const Config& cfg, const AttnW<T>& W, const AttnG<T>& G, int64_t N,
                       const AttnBufs<T>& A, const T* dy, std::span<const int64_t> segs, T* dO) {
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

template <class T>
void attn_qkv_backward(Policy pol, const Config& cfg, const AttnW<T>& W, const AttnG<T>& G, const T* a,
                       const int64_t* pos, int64_t N, const RopeTable<T>& rope, const AttnBufs<T>& A, const T* dqc,
                       const T* dpayload, std::span<const int64_t> segs, T* da) {
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
  const int64_t N = rows.n;
  const CoreDims cd = CoreDims::from(cfg);
  attn_acts_size<T>(cfg, N, acts);
  const AttnBufs<T> A = acts.bufs();
  const std::vector<int64_t> rpos = rope_positions(rows);
  attn_qkv_forward<T>(pol, cfg, W, a, rpos.data(), N, rope, A);
  for (const auto& run : rows.sequence_runs()) {
    check_run(rows, run);
    const int64_t S = run.end - run.begin, b = run.begin;
    if (rows.doc.empty())
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
  const AttnBufs<T> A = acts.bufs();
  const int64_t N = rows.n;
  const CoreDims cd = CoreDims::from(cfg);
  std::vector<T> dO(static_cast<size_t>(N * cd.H * cd.Dv)), dqc(static_cast<size_t>(N * cd.H * cd.Dq)),
      dpay(static_cast<size_t>(N * cd.P));
  attn_out_backward<T>(pol, cfg, W, G, N, A, dy, rows.segs, dO.data());
  std::vector<ExactAcc<T>> acc;
  for (const auto& run : rows.sequence_runs()) {
    check_run(rows, run);
    const int64_t S = run.end - run.begin;
    const std::vector<int64_t> qsegs = rows.segs_in(run.begin, run.end);
    acc.assign(static_cast<size_t>(S * cd.P), ExactAcc<T>());
    const int64_t b = run.begin;
    if (rows.doc.empty())
      attn_core_backward<T>(pol, cd, A.qc + b * cd.H * cd.Dq, rows.pos.data() + b, S, A.payload + b * cd.P, S,
                            A.o + b * cd.H * cd.Dv, A.stats + b * cd.H * 2, dO.data() + b * cd.H * cd.Dv, qsegs,
                            dqc.data() + b * cd.H * cd.Dq, acc.data());
    else
      attn_doc_core_backward<T>(pol, cd, A.qc + b * cd.H * cd.Dq, rows.pos.data() + b, rows.doc.data() + b, S,
                                A.payload + b * cd.P, S, A.o + b * cd.H * cd.Dv, A.stats + b * cd.H * 2,
                                dO.data() + b * cd.H * cd.Dv, qsegs, dqc.data() + b * cd.H * cd.Dq, acc.data());
    {
      ReductionSection timer;
      exact_round<T>(acc.data(), dpay.data() + run.begin * cd.P, S * cd.P);  // the single rounding of the key side
    }
  }
  const std::vector<int64_t> rpos = rope_positions(rows);
  attn_qkv_backward<T>(pol, cfg, W, G, a, rpos.data(), N, rope, A, dqc.data(), dpay.data(), rows.segs, da);
}

#define TD_ATTN(T)                                                                                                 \
  template void attn_core_forward<T>(Policy, const CoreDims&, const T*, const int64_t*, int64_t, const T*, int64_t, \
                                     T*, T*);                                                                      \
  template void attn_core_backward<T>(Policy, const CoreDims&, const T*, const int64_t*, int64_t, const T*,        \
                                      int64_t, const T*, const T*, const T*, std::span<const int64_t>, T*,         \
                                      ExactAcc<T>*);                                                               \
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
  template void attention_forward<T>(Policy, const Config&, const AttnW<T>&, const T*, const TokenRows&,           \
                                     const RopeTable<T>&, AttnActs<T>&, T*);                                       \
  template void attention_backward<T>(Policy, const Config&, const AttnW<T>&, const AttnG<T>&, const T*,           \
                                      const TokenRows&, const RopeTable<T>&, const AttnActs<T>&, const T*, T*);
TD_ATTN(float)
TD_ATTN(double)
#undef TD_ATTN

}  // namespace trident::model
