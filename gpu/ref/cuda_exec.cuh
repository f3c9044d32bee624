// The CUDA executor of the ref tier (gpu/ref/exec.h): for_each launches one thread per index on the op's stream;
// scratch is stream-ordered (gpu/cuda_memory.h: cudaMallocAsync from the device's pool, or cudaMalloc where pools
// are unsupported; zeroed, freed when the executor goes out of scope, after the op's kernels in stream order); host
// metadata is copied to the device at issue (pageable source: the copy is staged before cudaMemcpyAsync returns, so
// the caller's vector may go away); constant tables (RoPE) are uploaded once and reused (gpu::device_table).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <source_location>
#include <span>
#include <string>
#include <vector>

#include "gpu/cuda_device.h"
#include "gpu/cuda_memory.h"
#include "gpu/emu_cuda.h"
#include "gpu/ref/exec.h"

namespace trident::gpu::ref {

// Throws trident::Error naming the CUDA call (gpu/ref_errors.cpp: compiled by the host compiler).
[[noreturn]] void cuda_ref_fail(const char* call, int error, const char* error_string);

template <class F>
__global__ void for_each_kernel(int64_t n, F f) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) f(i);
}

class CudaExec {
 public:
  static constexpr bool kHost = false;
  static constexpr int kBlock = 256;
  explicit CudaExec(cudaStream_t s) : s_(s) {}
  cudaStream_t stream() const { return s_; }  // the op's stream (the fast tier's cuBLAS calls run on it)
  ~CudaExec() {
    for (void* p : bufs_) (void)stream_free(p, s_);
  }
  CudaExec(const CudaExec&) = delete;
  CudaExec& operator=(const CudaExec&) = delete;

  template <class F>
  void for_each(int64_t n, const F& f) {
    if (n <= 0) return;
    const int64_t blocks = (n + kBlock - 1) / kBlock;
    if (blocks > 0x7fffffff) cuda_ref_fail("for_each (more than 2^31-1 blocks)", 0, "grid too large");
    for_each_kernel<<<static_cast<unsigned>(blocks), kBlock, 0, s_>>>(n, f);
    check(cudaGetLastError(), "kernel launch");
  }
  template <class U>
  U* scratch(int64_t n) {
    const size_t bytes = static_cast<size_t>(n > 0 ? n : 1) * sizeof(U);
    void* p = nullptr;
    check(stream_malloc(&p, bytes, s_), "cudaMallocAsync (ref-tier scratch)");
    bufs_.push_back(p);
    check(cudaMemsetAsync(p, 0, bytes, s_), "cudaMemsetAsync (ref-tier scratch)");
    return static_cast<U*>(p);
  }
  template <class U>
  const U* meta(std::span<const U> v) {
    if (v.empty()) return nullptr;
    U* d = scratch<U>(static_cast<int64_t>(v.size()));
    check(cudaMemcpyAsync(d, v.data(), v.size() * sizeof(U), cudaMemcpyHostToDevice, s_),
          "cudaMemcpyAsync (ref-tier metadata)");
    return d;
  }
  // A constant table (the RoPE table): the device copy kept for the process, uploaded again only when the host
  // bytes change (gpu::device_table).
  template <class U>
  const U* table(std::span<const U> v) {
    return static_cast<const U*>(device_table(v.data(), v.size() * sizeof(U)));
  }
  // The data-check flag (gpu/ref/exec.h): a zeroed device int; check_flag waits for the stream and reads it.
  int* flag() {
    if (!flag_) flag_ = scratch<int>(1);
    return flag_;
  }
  void check_flag(const char* rule) {
    if (!flag_) return;
    int h = 0;
    check(cudaMemcpyAsync(&h, flag_, sizeof(int), cudaMemcpyDeviceToHost, s_), "cudaMemcpyAsync (ref-tier check)");
    check(cudaStreamSynchronize(s_), "cudaStreamSynchronize (ref-tier check)");
    if (h != 0) fail(std::string("cuda-ref: ") + rule + " (found on the device; the cpu backend names the row)");
  }

 private:
  static void check(cudaError_t e, const char* call) {
    if (e != cudaSuccess) cuda_ref_fail(call, static_cast<int>(e), cudaGetErrorString(e));
  }
  cudaStream_t s_;
  std::vector<void*> bufs_;
  int* flag_ = nullptr;
};

// How the CUDA executor's op runs, in one of two settings:
//  - on a CudaDevice (`dev`; one GPU per rank): CudaDevice::launch runs the closure at once (it enqueues the op's
//    kernels on the device's stream s) and checks cudaGetLastError, naming the op and the caller's line;
//  - on an emulated rank (`emu`, `rank`; W ranks on one GPU, `emulate --kernels cuda-ref|cuda-fast`): the closure
//    is the emulator device's launch (traced, ordered with the rank's other streams, deferred or eager); it enqueues
//    the op's kernels on the rank's CUDA stream and waits for them, so that the op is complete when the closure
//    returns, as the emulator's host-side collectives and copies expect of device memory (CUDA managed memory).
// Both settings instantiate the same bodies once.
struct CudaLaunch {
  CudaDevice* dev = nullptr;
  Device* emu = nullptr;
  std::shared_ptr<RankStream> rank;
  template <class F>
  void operator()(Stream s, const char* name, std::source_location loc, F&& f) const {
    if (dev) {
      dev->launch(s, name, Accesses{}, 0, std::function<void()>([&] {
                    CudaExec ex(dev->stream(s));
                    f(ex);
                  }),
                  loc);
      return;
    }
    emu->launch(s, name, Accesses{}, 0, std::function<void()>([f = std::forward<F>(f), r = rank, name, loc] {
                  {
                    CudaExec ex(r->get());
                    f(ex);
                  }  // the scratch's frees are enqueued: wait for them too
                  r->finish(name, loc);
                }),
                loc);
  }
};

}  // namespace trident::gpu::ref
