// W emulated ranks on one GPU (`trident emulate --kernels cuda-ref|cuda-fast`, docs/gpu.md "The step on one GPU"):
// every rank keeps the emulator's Device (emulator/device.h: streams, events, traces, eager or deferred order, the
// emulated collectives on the host), its device memory is CUDA managed memory, and its kernel set is the ref or the
// fast tier of the CUDA kernels, each op's kernels on the rank's own CUDA stream, complete when the op's launch
// has run. The step, the communicators and the kernel bodies are the same code as on the CPU (`cuda-ref-host`) and
// on a CudaDevice; only where the kernels run changes.
#pragma once
#include <cuda_runtime_api.h>

#include <memory>
#include <source_location>
#include <string>

#include "emulator/device.h"
#include "parallel/step_kernels.h"

namespace trident::gpu {

// What the emulated step needs of the GPU, checked once before any rank starts: a device (ordinal 0) that can run
// the kernels (sm_90 code and compute_90 PTX: compute capability 9.0 or newer) and managed memory. `concurrent` is
// false when the host must not touch managed memory while any kernel runs (cudaDevAttrConcurrentManagedAccess 0):
// the caller then runs the ranks on one worker. Throws one error line naming what is missing.
struct EmuGpuInfo {
  std::string name;
  int major = 0, minor = 0;
  bool concurrent = true;
};
EmuGpuInfo check_emu_gpu();

// CUDA managed memory as the emulator's device memory (DeviceOptions::memory): cudaMallocManaged (attached
// globally), released with cudaFree.
const emu::MemorySource& cuda_managed_memory();

// One CUDA stream of an emulated rank, shared by the rank's kernel set.
class RankStream {
 public:
  RankStream();
  ~RankStream();  // never throws
  RankStream(const RankStream&) = delete;
  RankStream& operator=(const RankStream&) = delete;
  cudaStream_t get() const { return s_; }
  // Waits for the op's kernels; a failed one is one error naming the op, its call site and the CUDA error.
  void finish(const char* op, std::source_location loc) const;

 private:
  cudaStream_t s_ = nullptr;
};

// The kernel sets of an emulated rank on the GPU (dev: the rank's emulator Device). Built by nvcc in
// gpu/ref/cuda_kernels.cu and gpu/fast/cuda_kernels.cu.
template <class T>
std::unique_ptr<Kernels<T>> make_emu_cuda_ref_kernels(Device& dev);
template <class T>
std::unique_ptr<Kernels<T>> make_emu_cuda_fast_kernels(Device& dev);

}  // namespace trident::gpu
