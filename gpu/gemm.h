// GPU versions of reference primitives: same names and argument order as reference/, plus a stream
// (STYLE.md habit 1). Pointers are device pointers.
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

namespace trident::gpu {

// reference/gemm.h: C[m, n] = sum_k A[m, k] * B(k, n), k ascending, products rounded then added (this
// kernel is compiled with --fmad=false and runs one k-loop per output element, so fp32/fp64 results are
// bit-identical to the reference; tensor-core kernels will instead carry a tolerance, docs/numerics.md).
template <class T>
void gemm(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, bool trans_b, T* C,
          int64_t ldc, cudaStream_t stream);

// reference/bf16.h: x[i] = round_bf16(x[i]) (round to nearest even; NaN stays NaN).
void round_bf16_inplace(float* x, long n, cudaStream_t stream);

// Number of usable CUDA devices (0 when there is no driver or no device; never throws).
int device_count();

}  // namespace trident::gpu
