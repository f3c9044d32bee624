// The batch-invariant GEMM's kernel (reference/gemm.h, docs/numerics.md "GEMM order"), compiled once per
// instruction set: reference/gemm.cpp (the build's baseline ISA), gemm_avx2.cpp (-mavx2) and gemm_avx512.cpp
// (-mavx512f); gemm.cpp picks one at run time (gemm_isa()). The includer defines
//   TRIDENT_GEMM_NS         the namespace of this copy (trident::gemm_isa_impl::TRIDENT_GEMM_NS), so the copies
//                           never share a symbol;
//   TRIDENT_GEMM_VEC_BYTES  the vector width in bytes (16, 32 or 64).
// Every copy computes the same bits: each vector lane is one output element following its own sequential order
// over k (s = s + round(a*b), two roundings: every target is compiled with -ffp-contract=off and no -mfma), so
// only how many elements advance at once differs.
//
// Structure: output tiles (MC rows x NC columns) are the unit of OpenMP work; inside a tile the K range is walked
// in blocks of KC, and a register-blocked micro-kernel (MR rows x NR columns of running sums, vectors across n)
// adds round(a*b) for k ascending. Between K blocks the running sums are stored to C and reloaded: a float stored
// and reloaded is the same float, so this is exactly the single in-order sum. Nothing depends on M, N, the thread
// count or the vector width.
#if !defined(TRIDENT_GEMM_NS) || !defined(TRIDENT_GEMM_VEC_BYTES)
#error "define TRIDENT_GEMM_NS and TRIDENT_GEMM_VEC_BYTES before including reference/gemm_kernel.h"
#endif
#include <algorithm>
#include <cstdint>
#include <cstring>

namespace trident::gemm_isa_impl {
// Scratch for one thread's packed B panels, in elements, enough for every copy (static_assert below).
inline constexpr int64_t kPackElems = int64_t{256} * (128 + 64);
}  // namespace trident::gemm_isa_impl

namespace trident::gemm_isa_impl::TRIDENT_GEMM_NS {
namespace {

constexpr int kVecBytes = TRIDENT_GEMM_VEC_BYTES;

template <class T>
struct Vec;
template <>
struct Vec<float> {
  typedef float V __attribute__((vector_size(kVecBytes), aligned(4), __may_alias__));
  typedef float VA __attribute__((vector_size(kVecBytes), __may_alias__));
};
template <>
struct Vec<double> {
  typedef double V __attribute__((vector_size(kVecBytes), aligned(8), __may_alias__));
  typedef double VA __attribute__((vector_size(kVecBytes), __may_alias__));
};

template <class T>
struct Blocking {
  static constexpr int W = kVecBytes / static_cast<int>(sizeof(T));  // lanes
  static constexpr int NV = 2;                                       // vectors per micro-tile row
  static constexpr int NR = W * NV;                                  // columns per micro-tile
  static constexpr int MR = 6;                                       // rows per micro-tile
  static constexpr int KC = 256;                                     // K block (running sums stored between)
  static constexpr int MC = 96;                                      // rows per OpenMP tile
  static constexpr int NC = sizeof(T) == 4 ? 128 : 64;               // columns per OpenMP tile (mult. of NR)
};

// B(k, n) for k in [k0, k0+kc), n in [n0, n0+nc) packed as ceil(nc/NR) panels of [kc][NR], zero padded. Without
// trans_b only the last panel is packed, and only when it is partial: the micro-kernel reads a full panel's rows of
// NR in place (gemm_tile), which moves B once instead of twice.
template <class T>
void pack_b(const T* B, int64_t ldb, bool trans_b, int64_t k0, int64_t kc, int64_t n0, int64_t nc, T* out) {
  constexpr int NR = Blocking<T>::NR;
  for (int64_t j0 = 0; j0 < nc; j0 += NR) {
    const int w = static_cast<int>(std::min<int64_t>(NR, nc - j0));
    T* p = out + j0 * kc;
    if (!trans_b) {
      if (w == NR) continue;  // read in place
      for (int64_t k = 0; k < kc; ++k) {
        const T* src = B + (k0 + k) * ldb + n0 + j0;
        T* dst = p + k * NR;
        int j = 0;
        for (; j < w; ++j) dst[j] = src[j];
        for (; j < NR; ++j) dst[j] = T(0);
      }
    } else {
      for (int64_t k = 0; k < kc; ++k)
        for (int j = w; j < NR; ++j) p[k * NR + j] = T(0);
      for (int j = 0; j < w; ++j) {
        const T* src = B + (n0 + j0 + j) * ldb + k0;
        for (int64_t k = 0; k < kc; ++k) p[k * NR + j] = src[k];
      }
    }
  }
}

// Splat x into every lane. x - (+0) == x exactly for every x (incl. -0, Inf, NaN), so the compiler folds the
// subtraction and emits a plain broadcast.
template <class VA, class T>
inline VA broadcast(T x) {
  return x - VA{};
}

// C[0..mr, 0..nr) (+)= A[0..mr, 0..kc) * Bp, in-order over k. Bp is one [kc][NR] panel whose rows are b_ks elements
// apart: NR packed (64-byte aligned), or B's own row stride for a panel read in place (unaligned loads).
template <class T, int MR>
inline void micro_kernel(int64_t kc, const T* A, int64_t a_rs, int64_t a_ks, const T* Bp, int64_t b_ks, T* C,
                         int64_t ldc, int nr, bool load_c) {
  using V = typename Vec<T>::V;
  using VA = typename Vec<T>::VA;
  constexpr int W = Blocking<T>::W, NV = Blocking<T>::NV, NR = Blocking<T>::NR;
  VA acc[MR][NV];
  if (load_c) {
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      alignas(64) T tmp[NR] = {};
      std::memcpy(tmp, C + i * ldc, sizeof(T) * static_cast<size_t>(nr));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = *reinterpret_cast<const VA*>(tmp + v * W);
    }
  } else {
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = VA{};  // +0
  }
  for (int64_t k = 0; k < kc; ++k) {
    VA b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = *reinterpret_cast<const V*>(Bp + k * b_ks + v * W);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const VA ai = broadcast<VA>(A[i * a_rs + k * a_ks]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        const VA prod = ai * b[v];  // rounded product
        acc[i][v] = acc[i][v] + prod;
      }
    }
  }
  if (nr == NR) {
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) *reinterpret_cast<V*>(C + i * ldc + v * W) = acc[i][v];
  } else {
    for (int i = 0; i < MR; ++i) {
      alignas(64) T tmp[NR];
      for (int v = 0; v < NV; ++v) *reinterpret_cast<VA*>(tmp + v * W) = acc[i][v];
      std::memcpy(C + i * ldc, tmp, sizeof(T) * static_cast<size_t>(nr));
    }
  }
}

template <class T>
void micro_dispatch(int mr, int64_t kc, const T* A, int64_t a_rs, int64_t a_ks, const T* Bp, int64_t b_ks, T* C,
                    int64_t ldc, int nr, bool load_c) {
  switch (mr) {
    case 6: micro_kernel<T, 6>(kc, A, a_rs, a_ks, Bp, b_ks, C, ldc, nr, load_c); break;
    case 5: micro_kernel<T, 5>(kc, A, a_rs, a_ks, Bp, b_ks, C, ldc, nr, load_c); break;
    case 4: micro_kernel<T, 4>(kc, A, a_rs, a_ks, Bp, b_ks, C, ldc, nr, load_c); break;
    case 3: micro_kernel<T, 3>(kc, A, a_rs, a_ks, Bp, b_ks, C, ldc, nr, load_c); break;
    case 2: micro_kernel<T, 2>(kc, A, a_rs, a_ks, Bp, b_ks, C, ldc, nr, load_c); break;
    case 1: micro_kernel<T, 1>(kc, A, a_rs, a_ks, Bp, b_ks, C, ldc, nr, load_c); break;
    default: break;
  }
}
static_assert(Blocking<float>::MR == 6 && Blocking<double>::MR == 6);

}  // namespace

// One output tile: rows [m0, m0+mc), columns [n0, n0+nc), all of K in blocks of KC. pack: >= KC*(NC+NR)
// scratch, 64-byte aligned.
template <class T>
void gemm_tile(int64_t m0, int64_t mc, int64_t n0, int64_t nc, int64_t K, const T* A, int64_t a_rs, int64_t a_ks,
               const T* B, int64_t ldb, bool trans_b, T* C, int64_t ldc, bool accumulate, T* pack) {
  using Bl = Blocking<T>;
  if (K == 0) {
    if (!accumulate)
      for (int64_t i = 0; i < mc; ++i)
        for (int64_t j = 0; j < nc; ++j) C[(m0 + i) * ldc + n0 + j] = T(0);
    return;
  }
  for (int64_t k0 = 0; k0 < K; k0 += Bl::KC) {
    const int64_t kc = std::min<int64_t>(Bl::KC, K - k0);
    pack_b(B, ldb, trans_b, k0, kc, n0, nc, pack);
    const bool load_c = accumulate || k0 > 0;
    for (int64_t j0 = 0; j0 < nc; j0 += Bl::NR) {
      const int nr = static_cast<int>(std::min<int64_t>(Bl::NR, nc - j0));
      const bool in_place = !trans_b && nr == Bl::NR;
      const T* Bp = in_place ? B + k0 * ldb + n0 + j0 : pack + j0 * kc;
      const int64_t b_ks = in_place ? ldb : Bl::NR;
      for (int64_t i0 = 0; i0 < mc; i0 += Bl::MR) {
        const int mr = static_cast<int>(std::min<int64_t>(Bl::MR, mc - i0));
        micro_dispatch<T>(mr, kc, A + (m0 + i0) * a_rs + k0 * a_ks, a_rs, a_ks, Bp, b_ks,
                          C + (m0 + i0) * ldc + n0 + j0, ldc, nr, load_c);
      }
    }
  }
}

static_assert(int64_t{Blocking<float>::KC} * (Blocking<float>::NC + Blocking<float>::NR) <= kPackElems);
static_assert(int64_t{Blocking<double>::KC} * (Blocking<double>::NC + Blocking<double>::NR) <= kPackElems);
static_assert(Blocking<float>::MC == 96 && Blocking<float>::NC == 128 && Blocking<double>::MC == 96 &&
              Blocking<double>::NC == 64, "gemm.cpp tiles the output with these");

template void gemm_tile<float>(int64_t, int64_t, int64_t, int64_t, int64_t, const float*, int64_t, int64_t,
                               const float*, int64_t, bool, float*, int64_t, bool, float*);
template void gemm_tile<double>(int64_t, int64_t, int64_t, int64_t, int64_t, const double*, int64_t, int64_t,
                                const double*, int64_t, bool, double*, int64_t, bool, double*);

}  // namespace trident::gemm_isa_impl::TRIDENT_GEMM_NS
