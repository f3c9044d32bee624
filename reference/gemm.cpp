// Batch-invariant GEMM (reference/gemm.h, docs/numerics.md "GEMM order"): tiling, OpenMP and the choice of
// kernel copy. The kernel itself is reference/gemm_kernel.h, compiled here for the build's baseline ISA and, on
// x86-64 (TRIDENT_GEMM_DISPATCH), in gemm_avx2.cpp and gemm_avx512.cpp; every copy computes the same bits.
#include "reference/gemm.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "reference/bf16.h"
#include "reference/check.h"
#include "reference/profile.h"

#if defined(__AVX__)
#define TRIDENT_GEMM_VEC_BYTES 32
#else
#define TRIDENT_GEMM_VEC_BYTES 16
#endif
#define TRIDENT_GEMM_NS base
#include "reference/gemm_kernel.h"
#undef TRIDENT_GEMM_NS
#undef TRIDENT_GEMM_VEC_BYTES

namespace trident {

namespace gemm_isa_impl {
#if TRIDENT_GEMM_DISPATCH
#define TRIDENT_GEMM_DECLARE(ns)                                                                                    \
  namespace ns {                                                                                                    \
  template <class T>                                                                                                \
  void gemm_tile(int64_t m0, int64_t mc, int64_t n0, int64_t nc, int64_t K, const T* A, int64_t a_rs, int64_t a_ks, \
                 const T* B, int64_t ldb, bool trans_b, T* C, int64_t ldc, bool accumulate, T* pack);               \
  extern template void gemm_tile<float>(int64_t, int64_t, int64_t, int64_t, int64_t, const float*, int64_t,        \
                                        int64_t, const float*, int64_t, bool, float*, int64_t, bool, float*);       \
  extern template void gemm_tile<double>(int64_t, int64_t, int64_t, int64_t, int64_t, const double*, int64_t,     \
                                         int64_t, const double*, int64_t, bool, double*, int64_t, bool, double*);   \
  }
TRIDENT_GEMM_DECLARE(avx2)
TRIDENT_GEMM_DECLARE(avx512)
#undef TRIDENT_GEMM_DECLARE
#endif
}  // namespace gemm_isa_impl

namespace {

constexpr int64_t kMC = 96;                                    // rows per OpenMP tile
template <class T>
constexpr int64_t kNC = sizeof(T) == 4 ? 128 : 64;             // columns per OpenMP tile

template <class T>
using TileFn = void (*)(int64_t, int64_t, int64_t, int64_t, int64_t, const T*, int64_t, int64_t, const T*, int64_t,
                        bool, T*, int64_t, bool, T*);

bool cpu_has(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::baseline: return true;
#if TRIDENT_GEMM_DISPATCH
    case GemmIsa::avx2: return __builtin_cpu_supports("avx2");
    case GemmIsa::avx512: return __builtin_cpu_supports("avx512f");
#else
    case GemmIsa::avx2:
    case GemmIsa::avx512: return false;
#endif
  }
  return false;
}

GemmIsa best_isa() {
  if (cpu_has(GemmIsa::avx512)) return GemmIsa::avx512;
  if (cpu_has(GemmIsa::avx2)) return GemmIsa::avx2;
  return GemmIsa::baseline;
}

// -1: not chosen yet. Chosen once from TRIDENT_GEMM_ISA (or the CPU), or by set_gemm_isa.
std::atomic<int> g_isa{-1};
// A TRIDENT_GEMM_ISA value that names no usable kernel: reported by every gemm call outside a parallel region.
std::atomic<bool> g_env_bad{false};

GemmIsa current_isa() {
  int v = g_isa.load(std::memory_order_relaxed);
  if (v >= 0) return static_cast<GemmIsa>(v);
  GemmIsa isa = best_isa();
  if (const char* e = std::getenv("TRIDENT_GEMM_ISA"); e && *e && std::string_view(e) != "auto") {
    GemmIsa want{};
    if (parse_gemm_isa(e, &want) && cpu_has(want)) isa = want;
    else g_env_bad.store(true, std::memory_order_relaxed);
  }
  int expected = -1;
  g_isa.compare_exchange_strong(expected, static_cast<int>(isa));
  return static_cast<GemmIsa>(g_isa.load(std::memory_order_relaxed));
}

void check_env() {
  current_isa();  // the first call reads TRIDENT_GEMM_ISA
  if (!g_env_bad.load(std::memory_order_relaxed) || omp_in_parallel()) return;
  const char* e = std::getenv("TRIDENT_GEMM_ISA");
  GemmIsa want{};
  if (e && parse_gemm_isa(e, &want))
    throw Error(fmt::format("TRIDENT_GEMM_ISA={}: this CPU cannot run the {} GEMM kernel (it can: {})", e, e,
                            gemm_isa_list()));
  throw Error(fmt::format("TRIDENT_GEMM_ISA={}: not a GEMM kernel; use auto, baseline, avx2 or avx512", e ? e : ""));
}

template <class T>
TileFn<T> tile_fn(GemmIsa isa) {
  switch (isa) {
#if TRIDENT_GEMM_DISPATCH
    case GemmIsa::avx2: return &gemm_isa_impl::avx2::gemm_tile<T>;
    case GemmIsa::avx512: return &gemm_isa_impl::avx512::gemm_tile<T>;
#endif
    default: return &gemm_isa_impl::base::gemm_tile<T>;
  }
}

template <class T>
struct PackBuf {
  std::vector<T> v;
  T* get() {
    const size_t n = static_cast<size_t>(gemm_isa_impl::kPackElems) + 64 / sizeof(T);
    if (v.size() < n) v.resize(n);
    // Align the panel to 64 bytes (vector loads of packed B use aligned access).
    auto p = reinterpret_cast<uintptr_t>(v.data());
    return reinterpret_cast<T*>((p + 63) & ~uintptr_t{63});
  }
};

template <class T>
T* thread_pack() {
  static thread_local PackBuf<T> buf;
  return buf.get();
}

}  // namespace

bool parse_gemm_isa(std::string_view name, GemmIsa* out) {
  if (name == "baseline") *out = GemmIsa::baseline;
  else if (name == "avx2") *out = GemmIsa::avx2;
  else if (name == "avx512") *out = GemmIsa::avx512;
  else return false;
  return true;
}

const char* gemm_isa_name(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::baseline: return "baseline";
    case GemmIsa::avx2: return "avx2";
    case GemmIsa::avx512: return "avx512";
  }
  return "?";
}

bool gemm_isa_supported(GemmIsa isa) { return cpu_has(isa); }

std::string gemm_isa_list() {
  std::string out;
  for (GemmIsa i : {GemmIsa::baseline, GemmIsa::avx2, GemmIsa::avx512})
    if (cpu_has(i)) out += (out.empty() ? "" : ", ") + std::string(gemm_isa_name(i));
  return out;
}

GemmIsa gemm_isa() {
  check_env();
  return current_isa();
}

void set_gemm_isa(GemmIsa isa) {
  TD_CHECK(cpu_has(isa), "set_gemm_isa({}): this CPU or build cannot run that kernel (it can: {})",
           gemm_isa_name(isa), gemm_isa_list());
  g_isa.store(static_cast<int>(isa), std::memory_order_relaxed);
  g_env_bad.store(false, std::memory_order_relaxed);
}

template <class T>
void gemm_serial(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_ks, const T* B,
                 int64_t ldb, bool trans_b, T* C, int64_t ldc, bool accumulate) {
  prof::OpSection prof_section(prof::Op::gemm, prof::gemm_flops(M, N, K));
  if (M <= 0 || N <= 0) return;
  const TileFn<T> tile = tile_fn<T>(gemm_isa());
  T* pack = thread_pack<T>();
  for (int64_t n0 = 0; n0 < N; n0 += kNC<T>)
    tile(0, M, n0, std::min<int64_t>(kNC<T>, N - n0), K, A, a_rs, a_ks, B, ldb, trans_b, C, ldc, accumulate, pack);
}

template <class T>
void gemm(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, bool trans_b, T* C,
          int64_t ldc) {
  prof::OpSection prof_section(prof::Op::gemm, prof::gemm_flops(M, N, K));
  if (M <= 0 || N <= 0) return;
  const TileFn<T> tile = tile_fn<T>(gemm_isa());
  const int64_t tm = (M + kMC - 1) / kMC, tn = (N + kNC<T> - 1) / kNC<T>;
  const int64_t tiles = tm * tn;
  const bool par = tiles > 1 && M * N * std::max<int64_t>(K, 1) >= 32768;
  // Tiles are independent output blocks; each is computed entirely by one thread (no reduction is split).
#pragma omp parallel for schedule(static) if (par)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t im = t / tn, in = t % tn;
    const int64_t m0 = im * kMC, n0 = in * kNC<T>;
    tile(m0, std::min<int64_t>(kMC, M - m0), n0, std::min<int64_t>(kNC<T>, N - n0), K, A, lda, 1, B, ldb, trans_b,
         C, ldc, false, thread_pack<T>());
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
