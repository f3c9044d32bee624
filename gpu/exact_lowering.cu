// CudaDevice::exact_pack / exact_unpack (parallel/device.h): the i64 lowering of exact_sum as CUDA kernels on the
// collective's stream, one thread per element, with the host's element functions (parallel/exact_lowering_impl.h):
// the same words and accumulators. A word sum that is not a sum of packed accumulators is found on the device; the
// unpack then waits for its stream and raises the host's error line.
#include <cuda_runtime.h>

#include <vector>

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

// *first: the smallest failing element (atomicMin: the same element whatever the threads' order; starts at
// ~0, none). The host then reads that element's words and names its failure with the same element function.
template <class T>
__global__ void unpack_kernel(const int64_t* in, int64_t n, ExactAcc<T>* acc, unsigned long long* first) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n) return;
  ExactAcc<T> a;
  int word = 0;
  const int code = el::unpack<T>(in + e * el::words<T>(), a, word);
  if (code != el::kOk) {
    atomicMin(first, static_cast<unsigned long long>(e));
    return;
  }
  acc[e] = a;
}

// The host side of a failed unpack: element e's words, unpacked again with the device's element function, name
// the failing word and its value (the host's error line).
template <class T>
[[noreturn]] void unpack_failed_at(const int64_t* words, int64_t e) {
  ExactAcc<T> a;
  int word = 0;
  const int code = el::unpack<T>(words, a, word);
  exact_lowering::unpack_failed(code, e, word, words[word]);
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
  auto* first = static_cast<unsigned long long*>(allocate(sizeof(unsigned long long), s, loc));
  check(cudaMemsetAsync(first, 0xff, sizeof(unsigned long long), stream(s)), "cudaMemsetAsync", loc);
  if (t == DataType::exact_f32)
    unpack_kernel<float><<<blocks(count), kBlock, 0, stream(s)>>>(in, n, static_cast<ExactAcc<float>*>(acc), first);
  else
    unpack_kernel<double><<<blocks(count), kBlock, 0, stream(s)>>>(in, n, static_cast<ExactAcc<double>*>(acc), first);
  check(cudaGetLastError(), "exact_unpack kernel launch", loc);
  unsigned long long h = ~0ull;
  check(cudaMemcpyAsync(&h, first, sizeof h, cudaMemcpyDeviceToHost, stream(s)), "cudaMemcpyAsync", loc);
  check(cudaStreamSynchronize(stream(s)), "cudaStreamSynchronize (exact_unpack check)", loc);
  free(first, s, loc);
  if (h != ~0ull) {
    const auto e = static_cast<int64_t>(h);
    const size_t W = exact_lowering::words_per_element(t);
    std::vector<int64_t> words(W);
    check(cudaMemcpy(words.data(), in + static_cast<size_t>(e) * W, W * sizeof(int64_t), cudaMemcpyDeviceToHost),
          "cudaMemcpy", loc);
    if (t == DataType::exact_f32)
      unpack_failed_at<float>(words.data(), e);
    else
      unpack_failed_at<double>(words.data(), e);
  }
}

}  // namespace trident::gpu
