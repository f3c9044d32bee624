// The attention core's loops (reference/model/attention.h: attn_core_forward/backward and their row, partial and
// document forms), compiled once per instruction set like the GEMM kernel (reference/gemm_kernel.h): in
// reference/model/attention.cpp (the build's baseline ISA, plus the argument checks and the choice of copy: the
// copies take checked arguments),
// attn_core_avx2.cpp (-mavx2) and attn_core_avx512.cpp (-mavx512f). The includer defines TRIDENT_GEMM_NS, the namespace
// of this copy (trident::model::attn_isa::TRIDENT_GEMM_NS). Every copy computes the same bits: each dot product,
// softmax term and key-side partial is an in-order chain of IEEE operations per element (vectorised across keys or
// across the elements of a row only; -ffp-contract=off and no -mfma), exp is dm::exp_n's bits whichever copy calls it,
// and the exact adds are integer operations, so only how many elements advance at once differs.
#if !defined(TRIDENT_GEMM_NS)
#error "define TRIDENT_GEMM_NS before including reference/model/attn_core_kernel.h"
#endif
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "reference/bf16.h"
#include "reference/dmath.h"
#include "reference/model/attn_core.h"
#include "reference/profile.h"

namespace trident::model::attn_isa::TRIDENT_GEMM_NS {

namespace {

// The calling thread's scratch vector number `slot`, kept across calls: the cores' transposed keys and per-tile
// buffers are allocated (and their pages faulted in) once per thread, not once per call of a rank's layer. Slots 0-1
// the transposed keys and values, 2-3 the backward's per-tile buffers; the cores are leaves (no core runs inside
// another on one thread), and their OpenMP teams only read the caller's buffers.
template <class T>
std::vector<T>& scratch(int slot) {
  static thread_local std::vector<T> v[4];
  return v[slot];
}

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
  // Grow only: every element the call reads is written below, so a scratch vector is not cleared or shrunk.
  if (kT.size() < static_cast<size_t>(nkc * S)) kT.resize(static_cast<size_t>(nkc * S));
  if (vT.size() < static_cast<size_t>(nvc * S)) vT.resize(static_cast<size_t>(nvc * S));
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

// This copy's vectors: 64 bytes (AVX-512F), 32 (AVX2) or 16 (the baseline: SSE2, NEON). Loads and stores are
// unaligned; each lane is one output element with its own chain of operations, as a scalar loop would do them.
#if defined(__AVX512F__)
constexpr int kVecBytes = 64;
#elif defined(__AVX2__)
constexpr int kVecBytes = 32;
#else
constexpr int kVecBytes = 16;
#endif
template <class T, int B>
struct Vec {
  typedef T V __attribute__((vector_size(B), aligned(sizeof(T)), __may_alias__));
  static constexpr int W = B / static_cast<int>(sizeof(T));
};
// Splat: x - (+0) is x for every x (-0, Inf and NaN included).
template <class V, class T>
inline V splat(T x) {
  return x - V{};
}

// out[c] = +0 + a[j0] * X[j0, c] + ... + a[j1-1] * X[j1-1, c] (rows j ascending, ld apart) for c in [c, n), in blocks
// of U vectors of B bytes, then single vectors, then narrower vectors; returns the first element left (fewer than
// one 16-byte vector). The U running sums of a block stay in registers (unrolled), and each add takes the running sum
// as its first operand, so NaN propagation is the scalar loop's.
template <class T, int B>
inline int64_t rows_axpy_vec(T* out, const T* a, const T* X, int64_t ld, int64_t j0, int64_t j1, int64_t c,
                             int64_t n) {
  using V = typename Vec<T, B>::V;
  constexpr int W = Vec<T, B>::W, U = 4;
  for (; c + U * W <= n; c += U * W) {
    V s[U];
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) s[u] = V{};
    for (int64_t j = j0; j < j1; ++j) {
      const V aj = splat<V>(a[j]);
      const T* row = X + j * ld + c;
#pragma GCC unroll 4
      for (int u = 0; u < U; ++u) s[u] = s[u] + aj * *reinterpret_cast<const V*>(row + u * W);
    }
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) *reinterpret_cast<V*>(out + c + u * W) = s[u];
  }
  for (; c + W <= n; c += W) {
    V s = V{};
    for (int64_t j = j0; j < j1; ++j) s = s + splat<V>(a[j]) * *reinterpret_cast<const V*>(X + j * ld + c);
    *reinterpret_cast<V*>(out + c) = s;
  }
  if constexpr (B > 16) return rows_axpy_vec<T, B / 2>(out, a, X, ld, j0, j1, c, n);
  return c;
}

// out[c] for c < n: +0, then for rows j in [j0, j1) ascending: out[c] = out[c] + a[j] * X[j*ld + c] (axpy's
// arithmetic, row by row).
template <class T>
inline void rows_axpy(T* out, const T* a, const T* X, int64_t ld, int64_t j0, int64_t j1, int64_t n) {
  for (int64_t c = rows_axpy_vec<T, kVecBytes>(out, a, X, ld, j0, j1, 0, n); c < n; ++c) {
    T s = T(0);
    for (int64_t j = j0; j < j1; ++j) s = s + a[j] * X[j * ld + c];
    out[c] = s;
  }
}

// out[j] = dot(x, column j of XT) for j < n: s = +0; for c ascending: s = s + x[c]*XT[c, j] (rows_axpy over the D
// rows of XT).
template <class T>
inline void dots_t(T* out, const T* x, const T* XT, int64_t D, int64_t S, int64_t n) {
  rows_axpy(out, x, XT, S, 0, D, n);
}

// Query r's first key: its document's start (packed sequences) or 0.
inline int64_t first_key(const int64_t* qdoc, int64_t r) { return qdoc ? qdoc[r] : 0; }

}  // namespace

// The core forward; qdoc null: causal over the whole sequence (keys 0..qpos), else keys qdoc..qpos.
template <class T>
void core_forward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, const int64_t* qdoc, int64_t Nq,
                  const T* kv, int64_t S, T* o, T* stats) {
  prof::OpSection prof_section(prof::Op::attn_core_fwd);
  const int64_t H = cd.H, Dq = cd.Dq, Dv = cd.Dv, P = cd.P, hpg = cd.H / cd.G;
  const T sc = static_cast<T>(cd.scale);
  std::vector<T> qb, kb;
  const T* qr = operand(pol, q, Nq * H * Dq, qb);   // rounded copies (bf16) for the dot products
  const T* kr = operand(pol, kv, S * P, kb);
  std::vector<T>&kT = scratch<T>(0), &vT = scratch<T>(1);
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
      for (int64_t j = j0; j < np; ++j) s[j] = s[j] - m;
      dm::exp_n(s.data() + j0, s.data() + j0, np - j0);  // exp's bits, many elements at once
      T l = T(0);
      for (int64_t j = j0; j < np; ++j) l = l + s[j];
      for (int64_t j = j0; j < np; ++j) s[j] = op1(pol, s[j] / l);  // p_j
      rows_axpy(o + (r * H + h) * Dv, s.data(), kr + cd.val_base + g * Dv, P, j0, np, Dv);
      stats[(r * H + h) * 2 + 0] = m;
      stats[(r * H + h) * 2 + 1] = l;
    }
  }
  }
}

template <class T>
void core_backward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, const int64_t* qdoc, int64_t Nq,
                   const T* kv, int64_t S, const T* o, const T* stats, const T* dO, std::span<const int64_t> qsegs,
                   T* dq, KeySide<T> ks) {
  prof::OpSection prof_section(prof::Op::attn_core_bwd);
  ExactAcc<T>* const dkv = ks.dkv;
  const int64_t* const krow = ks.dkv ? ks.krow : nullptr;
  const int64_t nt = static_cast<int64_t>(qsegs.size()) - 1;
  // Partial rows of tile t for key j (part mode): P values.
  auto prow = [&](int64_t t, int64_t j) {
    const int64_t r = ks.krow[j];
    return ks.part + ((r / ks.blk * nt + t) * ks.blk + r % ks.blk) * cd.P;
  };
  auto clear_parts = [&](int64_t t, int64_t j0, int64_t j1) {  // keys [j0, j1) without a term in tile t
    if (ks.part)
      for (int64_t j = j0; j < j1; ++j) std::fill_n(prow(t, j), cd.P, T(0));
  };
  const int64_t H = cd.H, Dq = cd.Dq, Dv = cd.Dv, P = cd.P, hpg = cd.H / cd.G;
  const T sc = static_cast<T>(cd.scale);
  std::vector<T> qb, kb, db;
  const T* qr = operand(pol, q, Nq * H * Dq, qb);
  const T* kr = operand(pol, kv, S * P, kb);
  const T* dOr = operand(pol, dO, Nq * H * Dv, db);
  std::vector<T>&kT = scratch<T>(0), &vT = scratch<T>(1);
  transpose_kv(cd, kr, S, kT, vT);
  std::vector<uint8_t> written(krow ? static_cast<size_t>(S) : 0);  // krow: whether key j's row holds its sum yet
  std::vector<T>&pbuf = scratch<T>(2), &dsbuf = scratch<T>(3);
  for (size_t t = 0; t + 1 < qsegs.size(); ++t) {
    const int64_t r0 = qsegs[t], r1 = qsegs[t + 1], nr = r1 - r0;
    if (nr == 0) {
      clear_parts(static_cast<int64_t>(t), 0, S);
      continue;
    }
    int64_t nk = 0, k0 = S;  // keys touched by this tile: [k0, nk), k0 the smallest first key (0 when causal)
    for (int64_t r = r0; r < r1; ++r) nk = std::max(nk, qpos[r] + 1), k0 = std::min(k0, first_key(qdoc, r));
    clear_parts(static_cast<int64_t>(t), 0, k0);
    clear_parts(static_cast<int64_t>(t), nk, S);
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
        for (int64_t j = j0; j < np; ++j) sv[j] = sv[j] * sc - m;  // two roundings, as s = sv * sc; s - m
        dm::exp_n(sv.data() + j0, sv.data() + j0, np - j0);
        for (int64_t j = j0; j < np; ++j) {
          const T p = sv[j] / l;
          const T dp = dpv[j];
          pp[j] = op1(pol, p);
          dd[j] = op1(pol, (p * (dp - D)) * sc);
        }
        rows_axpy(dq + (r * H + h) * Dq, dd, kr + g * Dq, P, j0, np, Dq);
      }
    }
    }
    // Key side: per key, in-tile partial over (row, head) in order, then one exact add per element.
    prof::OpSection key_side(prof::Op::tile_reduce);
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
      if (ks.part) {
        std::copy(part.begin(), part.end(), prow(static_cast<int64_t>(t), j));
      } else if (!krow) {
        ExactAcc<T>* a = dkv + j * P;
        for (int64_t c = 0; c < P; ++c) a[c].add(part[c]);
      } else {
        ExactAcc<T>* a = dkv + krow[j] * P;
        if (written[static_cast<size_t>(j)]) {
          for (int64_t c = 0; c < P; ++c) a[c].add(part[c]);
        } else {  // the key's first tile: an empty accumulator plus this partial, stored without reading the row
          for (int64_t c = 0; c < P; ++c) {
            ExactAcc<T> e;
            e.add(part[c]);
            a[c] = e;
          }
          written[static_cast<size_t>(j)] = 1;
        }
      }
    }
    }
  }
  if (krow)
    for (int64_t j = 0; j < S; ++j)
      if (!written[static_cast<size_t>(j)]) std::fill_n(dkv + krow[j] * P, P, ExactAcc<T>());  // no term: zero
}

template void core_forward<float>(Policy, const CoreDims&, const float*, const int64_t*, const int64_t*, int64_t,
                                  const float*, int64_t, float*, float*);
template void core_forward<double>(Policy, const CoreDims&, const double*, const int64_t*, const int64_t*, int64_t,
                                   const double*, int64_t, double*, double*);
template void core_backward<float>(Policy, const CoreDims&, const float*, const int64_t*, const int64_t*, int64_t,
                                   const float*, int64_t, const float*, const float*, const float*,
                                   std::span<const int64_t>, float*, KeySide<float>);
template void core_backward<double>(Policy, const CoreDims&, const double*, const int64_t*, const int64_t*, int64_t,
                                    const double*, int64_t, const double*, const double*, const double*,
                                    std::span<const int64_t>, double*, KeySide<double>);

}  // namespace trident::model::attn_isa::TRIDENT_GEMM_NS
