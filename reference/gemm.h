// Batch-invariant GEMM (docs/numerics.md, "GEMM order").
//
//   C[m, n] = sum_{k = 0..K-1} A[m, k] * B(k, n)    with B(k, n) = B[k, n] (trans_b = false) or B[n, k] (true)
//
// Every C[m, n] is computed as  s = +0; for k = 0, 1, ..., K-1: s = s + round_T(A[m,k] * B(k,n));  C = s
// in T (float or double): one fixed order over K, no blocking of K, no FMA. The value of C[m, n] therefore
// depends only on row m of A and column n of op(B): not on M, N, other rows, thread count or ISA.
// Parallelism (OpenMP) is over tiles of output elements only. Vectorisation is across n (independent
// output elements), never across k.
//
// bf16 policy: round both operands with round_bf16 first (their products are then exact in fp32), then call
// the float GEMM.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace trident {

// A: (M, K) row stride lda; B: (K, N) stride ldb, or (N, K) stride ldb when trans_b; C: (M, N) stride ldc.
template <class T>
void gemm(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, bool trans_b,
          T* C, int64_t ldc);

// bf16 policy: C = round_bf16(A) * op(round_bf16(B)) computed by gemm<float> (operands are rounded into
// temporary copies of the referenced M x K / K x N elements; A and B are not modified).
void gemm_bf16(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
               bool trans_b, float* C, int64_t ldc);

// Serial building block of gemm (no OpenMP; for callers that already run inside a parallel region, e.g.
// tile_reduce). Same per-element order; A is addressed as A[m * a_rs + k * a_ks] (so X^T is a_rs = 1,
// a_ks = ldx). accumulate = false: every C[m, n] starts from +0; accumulate = true: the running sums continue
// from the values in C (s = C[m, n]; for k: s += round(a*b)), which equals one longer in-order sum.
template <class T>
void gemm_serial(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_ks, const T* B,
                 int64_t ldb, bool trans_b, T* C, int64_t ldc, bool accumulate);

// Which copy of the kernel runs (reference/gemm_kernel.h). Every copy gives the same bits; they differ in how many
// output elements advance per instruction. baseline: the build's own ISA (SSE2 on x86-64, NEON on arm64);
// avx2 / avx512: x86-64 builds with GCC or Clang, where the CPU has them. The default is the widest the CPU
// runs; the environment variable TRIDENT_GEMM_ISA (auto, baseline, avx2, avx512) overrides it, read once. A value
// that names no kernel this CPU runs makes every gemm / gemm_serial / gemm_isa call outside an OpenMP parallel
// region throw trident::Error (inside one, the default kernel runs until the next call outside). The tile
// reductions (reference/tile_reduce.h) and dm::exp_n run their copy for the same instruction set.
enum class GemmIsa { baseline, avx2, avx512 };
GemmIsa gemm_isa();
void set_gemm_isa(GemmIsa isa);              // throws where the CPU or the build lacks it (tests, benchmarks)
bool gemm_isa_supported(GemmIsa isa);
const char* gemm_isa_name(GemmIsa isa);
bool parse_gemm_isa(std::string_view name, GemmIsa* out);  // "baseline", "avx2", "avx512"
std::string gemm_isa_list();                 // the kernels this CPU and build run, e.g. "baseline, avx2, avx512"

}  // namespace trident
