// GPU versions of reference primitives: same names and argument order as reference/, plus a stream
// (STYLE.md habit 1). Pointers are device pointers.
#pragma once
#include <cstdint>
#include <string>

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

// Number of usable CUDA devices: 0 when this machine has no CUDA driver or no device (GPU tests skip then). A
// driver that is loaded but fails (a driver older than the runtime, a mismatched kernel module, a device in a bad
// state) throws trident::Error with CUDA's error string: a broken setup is a failure, never a skip. Counted once
// per process.
int device_count();
// What device_count() saw, for messages: "1 CUDA device(s)", or why none ("no CUDA driver (cudaErrorInsufficientDriver:
// ...)"). Never throws.
std::string device_status();

namespace detail {
enum class DeviceCountVerdict { ok, none, broken };
// cudaGetDeviceCount's error and whether libcuda.so.1 is loaded -> no device (skip) or a broken setup (fail).
DeviceCountVerdict classify_device_count(int cuda_error, bool driver_loaded);
}  // namespace detail

}  // namespace trident::gpu
