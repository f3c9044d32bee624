// CudaDevice::exact_pack / exact_unpack (parallel/device.h): the i64 lowering of exact_sum as CUDA kernels on the
// collective's stream, one thread per element, with the host's element functions (parallel/exact_lowering_impl.h):
// the same words and accumulators. A word sum that is not a sum of packed accumulators is found on the device; the
// unpack then waits for its stream and raises the host's error line.
#include <cuda_runtime.h>

#include "gpu/cuda_device.h"
#include "parallel/comm.h"
#include "parallel/exact_lowering.h"
#include "parallel/exact_lowering_impl.h"
#include "reference/check.h"

namespace trident::gpu {
namespace {

namespace el = exact_lowering::elem;

template <class T>
__global__ void pack_kernel(const ExactAcc<T>* acc, int64_t n, int64_t* out) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e < n) el::pack(acc[e], out + e * el::words<T>());
}

// bad[0]: the first failing element + 1 (0: none), bad[1]: its code, bad[2]: its word.
template <class T>
__global__ void unpack_kernel(const int64_t* in, int64_t n, ExactAcc<T>* acc, long long* bad) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n) return;
  ExactAcc<T> a;
  int word = 0;
  const int code = el::unpack<T>(in + e * el::words<T>(), a, word);
  if (code != el::kOk) {
    if (atomicCAS(reinterpret_cast<unsigned long long*>(bad), 0ull, static_cast<unsigned long long>(e + 1)) == 0ull) {
      bad[1] = code;
      bad[2] = word;
    }
    return;
  }
  acc[e] = a;
}

constexpr int kBlock = 128;
unsigned blocks(size_t n) { return static_cast<unsigned>((n + kBlock - 1) / kBlock); }

}  // namespace

void CudaDevice::exact_pack(DataType t, const void* acc, size_t count, int64_t* out, Stream s, loc_t loc) {
  if (count == 0) return;
  const auto n = static_cast<int64_t>(count);
  if (t == DataType::exact_f32)
    pack_kernel<float><<<blocks(count), kBlock, 0, stream(s)>>>(static_cast<const ExactAcc<float>*>(acc), n, out);
  else if (t == DataType::exact_f64)
    pack_kernel<double><<<blocks(count), kBlock, 0, stream(s)>>>(static_cast<const ExactAcc<double>*>(acc), n, out);
  else
    fail(fmt::format("exact_sum lowering: {} is not an exact dtype", to_string(t)));
  check(cudaGetLastError(), "exact_pack kernel launch", loc);
}

void CudaDevice::exact_unpack(DataType t, const int64_t* in, size_t count, void* acc, Stream s, loc_t loc) {
  if (count == 0) return;
  if (t != DataType::exact_f32 && t != DataType::exact_f64)
    fail(fmt::format("exact_sum lowering: {} is not an exact dtype", to_string(t)));
  const auto n = static_cast<int64_t>(count);
  auto* bad = static_cast<long long*>(allocate(3 * sizeof(long long), s, loc));
  check(cudaMemsetAsync(bad, 0, 3 * sizeof(long long), stream(s)), "cudaMemsetAsync", loc);
  if (t == DataType::exact_f32)
    unpack_kernel<float><<<blocks(count), kBlock, 0, stream(s)>>>(in, n, static_cast<ExactAcc<float>*>(acc), bad);
  else
    unpack_kernel<double><<<blocks(count), kBlock, 0, stream(s)>>>(in, n, static_cast<ExactAcc<double>*>(acc), bad);
  check(cudaGetLastError(), "exact_unpack kernel launch", loc);
  long long h[3] = {0, 0, 0};
  check(cudaMemcpyAsync(h, bad, sizeof h, cudaMemcpyDeviceToHost, stream(s)), "cudaMemcpyAsync", loc);
  check(cudaStreamSynchronize(stream(s)), "cudaStreamSynchronize (exact_unpack check)", loc);
  free(bad, s, loc);
  if (h[0] != 0) {
    const int64_t e = h[0] - 1;
    const int word = static_cast<int>(h[2]);
    const int64_t W = static_cast<int64_t>(exact_lowering::words_per_element(t));
    int64_t value = 0;
    check(cudaMemcpy(&value, in + e * W + word, sizeof value, cudaMemcpyDeviceToHost), "cudaMemcpy", loc);
    exact_lowering::unpack_failed(static_cast<int>(h[1]), e, word, value);
  }
}

}  // namespace trident::gpu
