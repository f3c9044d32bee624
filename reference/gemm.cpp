// Batch-invariant GEMM (reference/gemm.h, docs/numerics.md "GEMM order").
//
// Structure: output tiles (kMC rows x kNC columns) are the unit of OpenMP work; inside a tile the K range
// is walked in blocks of kKC, and a register-blocked micro-kernel (MR rows x NR columns of running sums,
// vectors across n) adds round(a*b) for k ascending. Between K blocks the running sums are stored to C and
// reloaded: a float stored and reloaded is the same float, so this is exactly the single in-order sum.
// Nothing depends on M, N, the thread count or the vector width: each lane of each vector is one output
// element following its own sequential order, and -ffp-contract=off keeps mul and add separate.
#include "reference/gemm.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "reference/bf16.h"
#include "reference/profile.h"

namespace trident {
namespace {

#if defined(__AVX__)
constexpr int kVecBytes = 32;
#else
constexpr int kVecBytes = 16;
#endif

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

// B(k, n) for k in [k0, k0+kc), n in [n0, n0+nc) packed as ceil(nc/NR) panels of [kc][NR], zero padded.
template <class T>
void pack_b(const T* B, int64_t ldb, bool trans_b, int64_t k0, int64_t kc, int64_t n0, int64_t nc, T* out) {
  constexpr int NR = Blocking<T>::NR;
  for (int64_t j0 = 0; j0 < nc; j0 += NR) {
    const int w = static_cast<int>(std::min<int64_t>(NR, nc - j0));
    T* p = out + j0 * kc;
    if (!trans_b) {
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

// C[0..mr, 0..nr) (+)= A[0..mr, 0..kc) * Bp, in-order over k. Bp is one packed [kc][NR] panel.
template <class T, int MR>
inline void micro_kernel(int64_t kc, const T* A, int64_t a_rs, int64_t a_ks, const T* Bp, T* C, int64_t ldc,
                         int nr, bool load_c) {
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
    for (int v = 0; v < NV; ++v) b[v] = *reinterpret_cast<const VA*>(Bp + k * NR + v * W);
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
void micro_dispatch(int mr, int64_t kc, const T* A, int64_t a_rs, int64_t a_ks, const T* Bp, T* C, int64_t ldc,
                    int nr, bool load_c) {
  switch (mr) {
    case 6: micro_kernel<T, 6>(kc, A, a_rs, a_ks, Bp, C, ldc, nr, load_c); break;
    case 5: micro_kernel<T, 5>(kc, A, a_rs, a_ks, Bp, C, ldc, nr, load_c); break;
    case 4: micro_kernel<T, 4>(kc, A, a_rs, a_ks, Bp, C, ldc, nr, load_c); break;
    case 3: micro_kernel<T, 3>(kc, A, a_rs, a_ks, Bp, C, ldc, nr, load_c); break;
    case 2: micro_kernel<T, 2>(kc, A, a_rs, a_ks, Bp, C, ldc, nr, load_c); break;
    case 1: micro_kernel<T, 1>(kc, A, a_rs, a_ks, Bp, C, ldc, nr, load_c); break;
    default: break;
  }
}
static_assert(Blocking<float>::MR == 6 && Blocking<double>::MR == 6);

// One output tile: rows [m0, m0+mc), columns [n0, n0+nc), all of K in blocks of KC. pack: >= KC*NC scratch.
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
      const T* Bp = pack + j0 * kc;
      for (int64_t i0 = 0; i0 < mc; i0 += Bl::MR) {
        const int mr = static_cast<int>(std::min<int64_t>(Bl::MR, mc - i0));
        micro_dispatch<T>(mr, kc, A + (m0 + i0) * a_rs + k0 * a_ks, a_rs, a_ks, Bp,
                          C + (m0 + i0) * ldc + n0 + j0, ldc, nr, load_c);
      }
    }
  }
}

template <class T>
struct PackBuf {
  std::vector<T, std::allocator<T>> v;
  T* get(size_t n) {
    if (v.size() < n + 16) v.resize(n + 16);
    // Align the panel to 64 bytes (vector loads of packed B use aligned access).
    auto p = reinterpret_cast<uintptr_t>(v.data());
    return reinterpret_cast<T*>((p + 63) & ~uintptr_t{63});
  }
};

template <class T>
T* thread_pack(size_t n) {
  static thread_local PackBuf<T> buf;
  return buf.get(n);
}

}  // namespace

template <class T>
void gemm_serial(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_ks, const T* B,
                 int64_t ldb, bool trans_b, T* C, int64_t ldc, bool accumulate) {
  prof::OpSection prof_section(prof::Op::gemm, prof::gemm_flops(M, N, K));
  using Bl = Blocking<T>;
  if (M <= 0 || N <= 0) return;
  T* pack = thread_pack<T>(static_cast<size_t>(Bl::KC) * (Bl::NC + Bl::NR));
  for (int64_t n0 = 0; n0 < N; n0 += Bl::NC)
    gemm_tile<T>(0, M, n0, std::min<int64_t>(Bl::NC, N - n0), K, A, a_rs, a_ks, B, ldb, trans_b, C, ldc,
                 accumulate, pack);
}

template <class T>
void gemm(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, bool trans_b, T* C,
          int64_t ldc) {
  prof::OpSection prof_section(prof::Op::gemm, prof::gemm_flops(M, N, K));
  using Bl = Blocking<T>;
  if (M <= 0 || N <= 0) return;
  const int64_t tm = (M + Bl::MC - 1) / Bl::MC, tn = (N + Bl::NC - 1) / Bl::NC;
  const int64_t tiles = tm * tn;
  const bool par = tiles > 1 && M * N * std::max<int64_t>(K, 1) >= 32768;
  // Tiles are independent output blocks; each is computed entirely by one thread (no reduction is split).
#pragma omp parallel for schedule(static) if (par)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t im = t / tn, in = t % tn;
    const int64_t m0 = im * Bl::MC, n0 = in * Bl::NC;
    T* pack = thread_pack<T>(static_cast<size_t>(Bl::KC) * (Bl::NC + Bl::NR));
    gemm_tile<T>(m0, std::min<int64_t>(Bl::MC, M - m0), n0, std::min<int64_t>(Bl::NC, N - n0), K, A, lda, 1, B,
                 ldb, trans_b, C, ldc, false, pack);
  }
}

void gemm_bf16(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
               bool trans_b, float* C, int64_t ldc) {
  prof::OpSection prof_section(prof::Op::gemm, prof::gemm_flops(M, N, K));
  if (M <= 0 || N <= 0) return;
  const int64_t br = trans_b ? N : K, bc = trans_b ? K : N;  // rows / columns of B as stored
  std::vector<float> a(static_cast<size_t>(M * K)), b(static_cast<size_t>(br * bc));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) a[m * K + k] = round_bf16(A[m * lda + k]);
  for (int64_t r = 0; r < br; ++r)
    for (int64_t c = 0; c < bc; ++c) b[r * bc + c] = round_bf16(B[r * ldb + c]);
  gemm<float>(M, N, K, a.data(), K, b.data(), bc, trans_b, C, ldc);
}

template void gemm<float>(int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t, bool, float*,
                          int64_t);
template void gemm<double>(int64_t, int64_t, int64_t, const double*, int64_t, const double*, int64_t, bool,
                           double*, int64_t);
template void gemm_serial<float>(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t,
                                 bool, float*, int64_t, bool);
template void gemm_serial<double>(int64_t, int64_t, int64_t, const double*, int64_t, int64_t, const double*,
                                  int64_t, bool, double*, int64_t, bool);

}  // namespace trident
