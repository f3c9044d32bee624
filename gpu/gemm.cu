#include <cuda_runtime.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

#include "gpu/gemm.h"
#include "reference/check.h"

namespace trident::gpu {
namespace {

constexpr int64_t kMaxGridY = 65535;

// One thread per output element; the k loop runs in the reference's order. (--fmad=false: no contraction.)
// Rows stride by the grid's height (grid.y is capped at 65,535 blocks), so any M runs.
template <class T>
__global__ void gemm_kernel(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
                            bool trans_b, T* C, int64_t ldc) {
  const int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (n >= N) return;
  for (int64_t m = blockIdx.y * static_cast<int64_t>(blockDim.y) + threadIdx.y; m < M;
       m += static_cast<int64_t>(gridDim.y) * blockDim.y) {
    T s = T(0);
    for (int64_t k = 0; k < K; ++k) {
      const T b = trans_b ? B[n * ldb + k] : B[k * ldb + n];
      const T p = A[m * lda + k] * b;  // rounded product, then the add: order fixed for determinism
      s = s + p;
    }
    C[m * ldc + n] = s;
  }
}

void check_launch(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    fail(fmt::format("gpu::{}: kernel launch failed: {} ({})", kernel, cudaGetErrorString(e), cudaGetErrorName(e)));
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
  if (M <= 0 || N <= 0) return;
  const dim3 block(32, 8);
  const int64_t gx = (N + 31) / 32, gy = std::min<int64_t>((M + 7) / 8, kMaxGridY);
  TD_CHECK(gx <= 0x7fffffff, "gpu::gemm: N = {} needs more than 2^31-1 blocks", N);
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
  gemm_kernel<T><<<grid, block, 0, stream>>>(M, N, K, A, lda, B, ldb, trans_b, C, ldc);
  check_launch("gemm");
}

template void gemm<float>(int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t, bool, float*,
                          int64_t, cudaStream_t);
template void gemm<double>(int64_t, int64_t, int64_t, const double*, int64_t, const double*, int64_t, bool,
                           double*, int64_t, cudaStream_t);

void round_bf16_inplace(float* x, long n, cudaStream_t stream) {
  if (n <= 0) return;
  TD_CHECK((n + 255) / 256 <= 0x7fffffff, "gpu::round_bf16_inplace: n = {} needs more than 2^31-1 blocks", n);
  round_bf16_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(x, n);
  check_launch("round_bf16_inplace");
}

namespace detail {
DeviceCountVerdict classify_device_count(int cuda_error, bool driver_loaded) {
  switch (cuda_error) {
    case cudaSuccess: return DeviceCountVerdict::ok;
    case cudaErrorNoDevice: return DeviceCountVerdict::none;      // a driver, no device
    case cudaErrorStubLibrary: return DeviceCountVerdict::none;   // the toolkit's stub libcuda, no driver
    case cudaErrorInsufficientDriver:                              // no libcuda at all, or one too old
      return driver_loaded ? DeviceCountVerdict::broken : DeviceCountVerdict::none;
    default: return DeviceCountVerdict::broken;
  }
}
}  // namespace detail

namespace {
struct CountResult {
  int n = 0;
  cudaError_t error = cudaSuccess;
  bool driver = false;
};
const CountResult& counted() {
  static const CountResult r = [] {
    CountResult c;
    c.error = cudaGetDeviceCount(&c.n);
    if (c.error != cudaSuccess) {
      (void)cudaGetLastError();  // clear the sticky error
      c.n = 0;
    }
    // the driver library the runtime loaded (RTLD_NOLOAD: only asks whether it is in the process)
    if (void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD)) {
      c.driver = true;
      dlclose(h);
    }
    return c;
  }();
  return r;
}
}  // namespace

int device_count() {
  const CountResult& c = counted();
  if (detail::classify_device_count(static_cast<int>(c.error), c.driver) == detail::DeviceCountVerdict::broken)
    fail(fmt::format("the CUDA driver is present but unusable: cudaGetDeviceCount failed: {} ({}); a broken CUDA "
                     "setup is an error, not a machine without a GPU",
                     cudaGetErrorString(c.error), cudaGetErrorName(c.error)));
  return c.n;
}

std::string device_status() {
  const CountResult& c = counted();
  if (c.error == cudaSuccess) return fmt::format("{} CUDA device(s)", c.n);
  return fmt::format("{} ({}: {})", c.driver ? "CUDA driver loaded" : "no CUDA driver", cudaGetErrorName(c.error),
                     cudaGetErrorString(c.error));
}

}  // namespace trident::gpu
