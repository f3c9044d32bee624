#include <cstdint>
#include <cuda_runtime.h>

#include "gpu/gemm.h"

namespace trident::gpu {
namespace {

// One thread per output element; the k loop runs in the reference's order. (--fmad=false: no contraction.)
template <class T>
__global__ void gemm_kernel(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
                            bool trans_b, T* C, int64_t ldc) {
  const int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t m = blockIdx.y * static_cast<int64_t>(blockDim.y) + threadIdx.y;
  if (m >= M || n >= N) return;
  T s = T(0);
  for (int64_t k = 0; k < K; ++k) {
    const T b = trans_b ? B[n * ldb + k] : B[k * ldb + n];
    const T p = A[m * lda + k] * b;  // rounded product, then the add: order fixed for determinism
    s = s + p;
  }
  C[m * ldc + n] = s;
}

__global__ void round_bf16_kernel(float* x, long n) {
  const long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  uint32_t u = __float_as_uint(x[i]);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    u = (u | 0x00400000u) & 0xffff0000u;  // quiet NaN, sign kept
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
  }
  x[i] = __uint_as_float(u);
}

}  // namespace

template <class T>
void gemm(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, bool trans_b, T* C,
          int64_t ldc, cudaStream_t stream) {
  if (M == 0 || N == 0) return;
  dim3 block(32, 8);
  dim3 grid(static_cast<unsigned>((N + 31) / 32), static_cast<unsigned>((M + 7) / 8));
  gemm_kernel<T><<<grid, block, 0, stream>>>(M, N, K, A, lda, B, ldb, trans_b, C, ldc);
}

template void gemm<float>(int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t, bool, float*,
                          int64_t, cudaStream_t);
template void gemm<double>(int64_t, int64_t, int64_t, const double*, int64_t, const double*, int64_t, bool,
                           double*, int64_t, cudaStream_t);

void round_bf16_inplace(float* x, long n, cudaStream_t stream) {
  if (n <= 0) return;
  round_bf16_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(x, n);
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky error of a missing driver
    return 0;
  }
  return n;
}

}  // namespace trident::gpu
