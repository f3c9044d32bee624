// CudaDevice: the Device seam (parallel/device.h) on one CUDA GPU. Streams are non-blocking cudaStream_t, events
// cudaEvent_t (timing disabled), memory is stream-ordered (cudaMallocAsync / cudaFreeAsync from the device's pool,
// which keeps freed memory; cudaMalloc / cudaFree where pools are unsupported: gpu/cuda_memory.h) with current and
// peak bytes tracked. launch() runs its function at once on the calling thread: on this device a kernel set's function
// enqueues CUDA kernels on native_stream(s); the launch then checks cudaGetLastError and names the kernel and its
// call site on failure. Every CUDA error throws trident::Error naming the call and the site.
#pragma once
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/device.h"

namespace trident::gpu {

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int ordinal = 0);
  ~CudaDevice() override;  // synchronizes, frees what is left, destroys streams and events; never throws
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  int ordinal() const { return ordinal_; }
  Stream compute_stream() override { return Stream{0}; }
  Stream comm_stream() override { return Stream{1}; }
  void* native_stream(Stream s) override { return stream(s); }
  cudaStream_t stream(Stream s) const;
  Stream create_stream(std::string name) override;
  Event create_event() override;
  void record(Event e, Stream s, loc_t loc = loc_t::current()) override;
  void wait(Stream s, Event e, loc_t loc = loc_t::current()) override;
  void launch(Stream s, std::string_view name, const Accesses& acc, double flops, std::function<void()> fn,
              loc_t loc = loc_t::current()) override;
  void synchronize(Stream s, loc_t loc = loc_t::current()) override;

  void* allocate(int64_t bytes, Stream s, loc_t loc = loc_t::current()) override;
  void free(void* p, Stream s, loc_t loc = loc_t::current()) override;
  void copy(void* dst, const void* src, int64_t bytes, Stream s, loc_t loc = loc_t::current()) override;
  void memset(void* dst, int value, int64_t bytes, Stream s, loc_t loc = loc_t::current()) override;
  void copy_2d(void* dst, int64_t dpitch, const void* src, int64_t spitch, int64_t width, int64_t rows, Stream s,
               loc_t loc = loc_t::current()) override;
  void upload(void* dst, const void* src, int64_t bytes, Stream s, loc_t loc = loc_t::current()) override;
  void download(void* dst, const void* src, int64_t bytes, Stream s, loc_t loc = loc_t::current()) override;
  DeviceMemory memory() const override;
  // The i64 lowering of exact_sum as CUDA kernels on s (gpu/exact_lowering.cu).
  void exact_pack(DataType t, const void* acc, size_t count, int64_t* out, Stream s,
                  loc_t loc = loc_t::current()) override;
  void exact_unpack(DataType t, const int64_t* in, size_t count, void* acc, Stream s,
                    loc_t loc = loc_t::current()) override;

 private:
  void check(cudaError_t e, const char* call, loc_t loc) const;
  int ordinal_;
  std::vector<cudaStream_t> streams_;
  std::vector<std::string> stream_names_;
  std::vector<cudaEvent_t> events_;
  mutable std::mutex mu_;                 // guards sizes_ and mem_
  std::map<const void*, int64_t> sizes_;  // live allocations
  DeviceMemory mem_;
};

}  // namespace trident::gpu
