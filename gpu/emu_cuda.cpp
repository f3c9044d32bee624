// W emulated ranks on one GPU (gpu/emu_cuda.h): the device check, managed memory and the ranks' streams.
#include "gpu/emu_cuda.h"

#include <fmt/format.h>

#include <filesystem>

#include "reference/check.h"

namespace trident::gpu {
namespace {

void* managed_allocate(size_t bytes) {
  void* p = nullptr;
  if (cudaMallocManaged(&p, bytes, cudaMemAttachGlobal) != cudaSuccess) {
    (void)cudaGetLastError();  // the emulator reports the out-of-memory error with the rank and the call site
    return nullptr;
  }
  return p;
}

void managed_release(void* p) {
  if (cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
}

}  // namespace

EmuGpuInfo check_emu_gpu() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    fail(fmt::format("--kernels cuda-ref and cuda-fast need a CUDA device, and this machine has none usable (CUDA: "
                     "{}); --kernels cuda-ref-host and cuda-fast-host run the same kernel bodies on the CPU",
                     e != cudaSuccess ? std::string(cudaGetErrorString(e)) : "no device found"));
  }
  cudaDeviceProp prop{};
  e = cudaGetDeviceProperties(&prop, 0);
  if (e != cudaSuccess) fail(fmt::format("cudaGetDeviceProperties(0) failed: {}", cudaGetErrorString(e)));
  EmuGpuInfo info{prop.name, prop.major, prop.minor, true};
  if (prop.major < 9)  // sm_90 code and compute_90 PTX: runs on 9.x, JIT-compiled for newer devices
    fail(fmt::format("CUDA device 0 ({}) has compute capability {}.{}: this trident's GPU code is built for sm_90 "
                     "(reconfigure with -DTRIDENT_CUDA_ARCHITECTURES=<arch>)",
                     info.name, prop.major, prop.minor));
  int managed = 0, concurrent = 0;
  (void)cudaDeviceGetAttribute(&managed, cudaDevAttrManagedMemory, 0);
  (void)cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, 0);
  if (!managed) fail(fmt::format("CUDA device 0 ({}) has no managed memory, which the emulated step needs", info.name));
  info.concurrent = concurrent != 0;
  e = cudaSetDevice(0);
  if (e != cudaSuccess) fail(fmt::format("cudaSetDevice(0) failed: {}", cudaGetErrorString(e)));
  return info;
}

const emu::MemorySource& cuda_managed_memory() {
  static const emu::MemorySource source{"CUDA managed memory", managed_allocate, managed_release};
  return source;
}

RankStream::RankStream() {
  const cudaError_t e = cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    fail(fmt::format("cudaStreamCreateWithFlags failed for an emulated rank's stream: {}", cudaGetErrorString(e)));
  }
}

RankStream::~RankStream() {
  if (!s_) return;
  (void)cudaStreamSynchronize(s_);
  (void)cudaStreamDestroy(s_);
  (void)cudaGetLastError();
}

void RankStream::finish(const char* op, std::source_location loc) const {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaStreamSynchronize(s_);
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();
  fail(fmt::format("CUDA kernel of '{}' (issued at {}:{}) failed: {} ({})", op,
                   std::filesystem::path(loc.file_name()).filename().string(), loc.line(), cudaGetErrorString(e),
                   cudaGetErrorName(e)));
}

}  // namespace trident::gpu
