#include "gpu/cuda_memory.h"

#include <fmt/format.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <vector>

#include "reference/check.h"

namespace trident::gpu {
namespace {

std::atomic<bool> g_pools_enabled{[] {
  const char* e = std::getenv("TRIDENT_CUDA_NO_POOLS");
  return !(e && *e && std::strcmp(e, "0") != 0);
}()};

std::mutex g_mu;
std::map<int, bool> g_pool_supported;  // per device ordinal, threshold raised when true
std::set<const void*> g_plain;         // live cudaMalloc allocations (the fallback path)

// Whether device d supports memory pools; on first sight raises its default pool's release threshold.
bool pools_supported(int d) {
  std::lock_guard lk(g_mu);
  auto it = g_pool_supported.find(d);
  if (it != g_pool_supported.end()) return it->second;
  int v = 0;
  bool ok = cudaDeviceGetAttribute(&v, cudaDevAttrMemoryPoolsSupported, d) == cudaSuccess && v != 0;
  if (ok) {
    cudaMemPool_t pool = nullptr;
    uint64_t keep = UINT64_MAX;
    ok = cudaDeviceGetDefaultMemPool(&pool, d) == cudaSuccess &&
         cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep) == cudaSuccess;
  }
  (void)cudaGetLastError();  // a refused attribute is the fallback, not a sticky error
  g_pool_supported[d] = ok;
  return ok;
}

int current_device() {
  int d = 0;
  (void)cudaGetDevice(&d);
  return d;
}

struct Table {
  std::vector<unsigned char> bytes;
  void* dev = nullptr;
};
std::map<std::tuple<int, const void*, size_t>, Table> g_tables;
std::atomic<size_t> g_uploads{0};

}  // namespace

bool memory_pools_in_use() { return g_pools_enabled.load() && pools_supported(current_device()); }

void set_memory_pools(bool enabled) { g_pools_enabled.store(enabled); }

cudaError_t stream_malloc(void** p, size_t bytes, cudaStream_t s) {
  if (memory_pools_in_use()) return cudaMallocAsync(p, bytes, s);
  const cudaError_t e = cudaMalloc(p, bytes);
  if (e == cudaSuccess) {
    std::lock_guard lk(g_mu);
    g_plain.insert(*p);
  }
  return e;
}

cudaError_t stream_free(void* p, cudaStream_t s) {
  if (!p) return cudaSuccess;
  {
    std::lock_guard lk(g_mu);
    auto it = g_plain.find(p);
    if (it == g_plain.end()) return cudaFreeAsync(p, s);
    g_plain.erase(it);
  }
  // cudaFree is not ordered on s: wait for the work on s that may still use p
  const cudaError_t e = cudaStreamSynchronize(s);
  return e != cudaSuccess ? e : cudaFree(p);
}

const void* device_table(const void* host, size_t bytes) {
  if (bytes == 0) return nullptr;
  const int d = current_device();
  std::lock_guard lk(g_mu);
  Table& t = g_tables[{d, host, bytes}];
  if (t.dev && std::memcmp(t.bytes.data(), host, bytes) == 0) return t.dev;
  // First use, or new contents at the same address: a new copy (an older one may still be read by queued kernels,
  // so it is kept).
  void* dev = nullptr;
  cudaError_t e = cudaMalloc(&dev, bytes);
  if (e == cudaSuccess) e = cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice);
  // a pageable source may return before the DMA is done, and the kernels reading the table run on non-blocking
  // streams, which do not wait for the legacy stream: wait here (once per table)
  if (e == cudaSuccess) e = cudaStreamSynchronize(cudaStreamLegacy);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    fail(fmt::format("CUDA device {}: uploading a {}-byte constant table failed: {} ({})", d, bytes,
                     cudaGetErrorString(e), cudaGetErrorName(e)));
  }
  t.bytes.assign(static_cast<const unsigned char*>(host), static_cast<const unsigned char*>(host) + bytes);
  t.dev = dev;
  g_uploads.fetch_add(1);
  return dev;
}

size_t device_table_uploads() { return g_uploads.load(); }

}  // namespace trident::gpu
