#include "gpu/cuda_device.h"

#include <fmt/format.h>

#include <filesystem>

#include "gpu/cuda_memory.h"

#include "reference/check.h"

namespace trident::gpu {
namespace {
std::string site(std::source_location loc) {
  return fmt::format("{}:{}", std::filesystem::path(loc.file_name()).filename().string(), loc.line());
}
}  // namespace

void CudaDevice::check(cudaError_t e, const char* call, loc_t loc) const {
  if (e == cudaSuccess) return;
  fail(fmt::format("CUDA device {}: {} failed at {}: {} ({})", ordinal_, call, site(loc), cudaGetErrorString(e),
                   cudaGetErrorName(e)));
}

CudaDevice::CudaDevice(int ordinal) : ordinal_(ordinal) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    fail(fmt::format("CudaDevice: no usable CUDA driver/device ({})", cudaGetErrorString(e)));
  }
  TD_CHECK(ordinal >= 0 && ordinal < n, "CudaDevice: device {} does not exist ({} CUDA devices)", ordinal, n);
  const loc_t here = loc_t::current();
  check(cudaSetDevice(ordinal), "cudaSetDevice", here);
  (void)memory_pools_in_use();  // the pool's release threshold, set once per device
  for (const char* name : {"compute", "comm"}) (void)create_stream(name);
}

CudaDevice::~CudaDevice() {
  cudaSetDevice(ordinal_);
  for (cudaStream_t s : streams_) cudaStreamSynchronize(s);
  for (const auto& [p, bytes] : sizes_)
    (void)stream_free(const_cast<void*>(p), streams_.empty() ? nullptr : streams_[0]);
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  for (cudaStream_t s : streams_) cudaStreamDestroy(s);
  (void)cudaGetLastError();
}

cudaStream_t CudaDevice::stream(Stream s) const {
  TD_CHECK(s.id >= 0 && static_cast<size_t>(s.id) < streams_.size(), "CudaDevice: unknown stream {}", s.id);
  return streams_[static_cast<size_t>(s.id)];
}

Stream CudaDevice::create_stream(std::string name) {
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", loc_t::current());
  streams_.push_back(s);
  stream_names_.push_back(std::move(name));
  return Stream{static_cast<int>(streams_.size() - 1)};
}

Event CudaDevice::create_event() {
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags", loc_t::current());
  events_.push_back(e);
  return Event{static_cast<int>(events_.size() - 1)};
}

void CudaDevice::record(Event e, Stream s, loc_t loc) {
  TD_CHECK(e.id >= 0 && static_cast<size_t>(e.id) < events_.size(), "CudaDevice: unknown event {}", e.id);
  check(cudaEventRecord(events_[static_cast<size_t>(e.id)], stream(s)), "cudaEventRecord", loc);
}

void CudaDevice::wait(Stream s, Event e, loc_t loc) {
  TD_CHECK(e.id >= 0 && static_cast<size_t>(e.id) < events_.size(), "CudaDevice: unknown event {}", e.id);
  check(cudaStreamWaitEvent(stream(s), events_[static_cast<size_t>(e.id)], 0), "cudaStreamWaitEvent", loc);
}

void CudaDevice::launch(Stream s, std::string_view name, const Accesses& acc, double flops, std::function<void()> fn,
                        loc_t loc) {
  (void)acc, (void)flops, (void)stream(s);
  fn();
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    fail(fmt::format("CUDA device {}: kernel '{}' on stream '{}' failed to launch at {}: {}", ordinal_, name,
                     stream_names_[static_cast<size_t>(s.id)], site(loc), cudaGetErrorString(e)));
}

void CudaDevice::synchronize(Stream s, loc_t loc) { check(cudaStreamSynchronize(stream(s)), "cudaStreamSynchronize", loc); }

void* CudaDevice::allocate(int64_t bytes, Stream s, loc_t loc) {
  TD_CHECK(bytes >= 0, "CudaDevice::allocate: negative size {} at {}", bytes, site(loc));
  void* p = nullptr;
  const cudaError_t e = stream_malloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 1)), stream(s));
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    std::lock_guard lk(mu_);
    fail(fmt::format("CUDA device {}: out of memory allocating {} bytes at {} ({} bytes in use, peak {})", ordinal_,
                     bytes, site(loc), mem_.cur, mem_.peak));
  }
  check(e, memory_pools_in_use() ? "cudaMallocAsync" : "cudaMalloc", loc);
  std::lock_guard lk(mu_);
  sizes_[p] = bytes;
  mem_.cur += bytes;
  mem_.peak = std::max(mem_.peak, mem_.cur);
  return p;
}

void CudaDevice::free(void* p, Stream s, loc_t loc) {
  if (!p) return;
  {
    std::lock_guard lk(mu_);
    auto it = sizes_.find(p);
    TD_CHECK(it != sizes_.end(), "CudaDevice::free: {} is not an allocation of this device (at {})", p, site(loc));
    mem_.cur -= it->second;
    sizes_.erase(it);
  }
  check(stream_free(p, stream(s)), "cudaFreeAsync", loc);
}

void CudaDevice::copy(void* dst, const void* src, int64_t bytes, Stream s, loc_t loc) {
  if (bytes <= 0) return;
  check(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream(s)), "cudaMemcpyAsync",
        loc);
}

void CudaDevice::memset(void* dst, int value, int64_t bytes, Stream s, loc_t loc) {
  if (bytes <= 0) return;
  check(cudaMemsetAsync(dst, value, static_cast<size_t>(bytes), stream(s)), "cudaMemsetAsync", loc);
}

void CudaDevice::copy_2d(void* dst, int64_t dpitch, const void* src, int64_t spitch, int64_t width, int64_t rows,
                         Stream s, loc_t loc) {
  if (width <= 0 || rows <= 0) return;
  check(cudaMemcpy2DAsync(dst, static_cast<size_t>(dpitch), src, static_cast<size_t>(spitch),
                          static_cast<size_t>(width), static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, stream(s)),
        "cudaMemcpy2DAsync", loc);
}

void CudaDevice::upload(void* dst, const void* src, int64_t bytes, Stream s, loc_t loc) {
  if (bytes <= 0) return;
  check(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream(s)), "cudaMemcpyAsync",
        loc);
  // The contract: src is consumed when upload returns. Pageable memory is staged before cudaMemcpyAsync returns;
  // pinned (page-locked) memory is read later by DMA, so wait for it.
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, src) == cudaSuccess && a.type == cudaMemoryTypeHost)
    check(cudaStreamSynchronize(stream(s)), "cudaStreamSynchronize (pinned upload)", loc);
  (void)cudaGetLastError();
}

void CudaDevice::download(void* dst, const void* src, int64_t bytes, Stream s, loc_t loc) {
  if (bytes <= 0) return;
  check(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, stream(s)), "cudaMemcpyAsync",
        loc);
}

DeviceMemory CudaDevice::memory() const {
  std::lock_guard lk(mu_);
  return mem_;
}

}  // namespace trident::gpu
