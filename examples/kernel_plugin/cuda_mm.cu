// The example's CUDA kernel: mm as a 16x16-tiled kernel, one thread per element of C (cuda_mm.h).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "cuda_mm.h"

namespace example::cuda {

namespace {

constexpr int kTile = 16;

// fp32 -> bf16 -> fp32, round to nearest even (as example_kernels.cpp; the bf16 policy rounds GEMM inputs first).
__device__ float round_bf16(float x) {
  unsigned u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return x;  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return __uint_as_float(u & 0xffff0000u);
}

// A is (M,K), B (N,K) when trans_b else (K,N), C (M,N), all dense. Each thread adds its element's K products in k
// order in fp32; the tiles past K (or past M, N) are zeros, which add nothing.
__global__ void mm_kernel(int64_t M, int64_t N, int64_t K, const float* A, const float* B, bool trans_b, bool bf16,
                          float* C) {
  __shared__ float As[kTile][kTile];
  __shared__ float Bs[kTile][kTile + 1];
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  const int64_t row = static_cast<int64_t>(blockIdx.y) * kTile + ty;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kTile + tx;
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < K; k0 += kTile) {
    const int64_t ka = k0 + tx, kb = k0 + ty;
    float a = row < M && ka < K ? A[row * K + ka] : 0.0f;
    float b = col < N && kb < K ? (trans_b ? B[col * K + kb] : B[kb * N + col]) : 0.0f;
    if (bf16) {
      a = round_bf16(a);
      b = round_bf16(b);
    }
    As[ty][tx] = a;
    Bs[ty][tx] = b;
    __syncthreads();
    for (int k = 0; k < kTile; ++k) acc += As[ty][k] * Bs[k][tx];
    __syncthreads();
  }
  if (row < M && col < N) C[row * N + col] = acc;
}

std::string failed(const char* what, cudaError_t e) {
  return std::string("the example CUDA mm: ") + what + " failed: " + cudaGetErrorString(e) + " (" +
         cudaGetErrorName(e) + ")";
}

// A device buffer, freed on every path out.
struct DeviceBuffer {
  float* p = nullptr;
  ~DeviceBuffer() {
    if (p) cudaFree(p);
  }
};

}  // namespace

std::string device_missing() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear it
    return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e) + " (" + cudaGetErrorName(e) + ")";
  }
  if (n == 0) return "cudaGetDeviceCount: 0 devices";
  return "";
}

std::string mm_f32(bool bf16, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                   int64_t ldb, bool trans_b, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return "";
  const int64_t blocks_y = (M + kTile - 1) / kTile, blocks_x = (N + kTile - 1) / kTile;
  if (blocks_y > 65535 || blocks_x > 2147483647)
    return "the example CUDA mm: M = " + std::to_string(M) + ", N = " + std::to_string(N) + " is past its grid";
  const size_t fs = sizeof(float);
  const int64_t b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
  DeviceBuffer a, b, c;
  cudaError_t e;
  if (K > 0) {
    if ((e = cudaMalloc(&a.p, size_t(M * K) * fs)) != cudaSuccess) return failed("cudaMalloc of A", e);
    if ((e = cudaMalloc(&b.p, size_t(N * K) * fs)) != cudaSuccess) return failed("cudaMalloc of B", e);
    if ((e = cudaMemcpy2D(a.p, size_t(K) * fs, A, size_t(lda) * fs, size_t(K) * fs, size_t(M),
                          cudaMemcpyHostToDevice)) != cudaSuccess)
      return failed("cudaMemcpy2D of A to the device", e);
    if ((e = cudaMemcpy2D(b.p, size_t(b_cols) * fs, B, size_t(ldb) * fs, size_t(b_cols) * fs, size_t(b_rows),
                          cudaMemcpyHostToDevice)) != cudaSuccess)
      return failed("cudaMemcpy2D of B to the device", e);
  }
  if ((e = cudaMalloc(&c.p, size_t(M * N) * fs)) != cudaSuccess) return failed("cudaMalloc of C", e);
  mm_kernel<<<dim3(unsigned(blocks_x), unsigned(blocks_y)), dim3(kTile, kTile)>>>(M, N, K, a.p, b.p, trans_b, bf16,
                                                                                  c.p);
  if ((e = cudaGetLastError()) != cudaSuccess) return failed("the launch of mm_kernel", e);
  if ((e = cudaDeviceSynchronize()) != cudaSuccess) return failed("mm_kernel", e);
  if ((e = cudaMemcpy2D(C, size_t(ldc) * fs, c.p, size_t(N) * fs, size_t(N) * fs, size_t(M),
                        cudaMemcpyDeviceToHost)) != cudaSuccess)
    return failed("cudaMemcpy2D of C to the host", e);
  return "";
}

}  // namespace example::cuda
