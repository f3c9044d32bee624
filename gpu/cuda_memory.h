// Device memory shared by CudaDevice and the kernel tiers' CUDA executor (gpu/ref/cuda_exec.cuh).
//
// Stream-ordered allocations: cudaMallocAsync / cudaFreeAsync on the device's default memory pool, whose release
// threshold is raised once per device so that freed memory stays in the pool for reuse (CUDA's default threshold,
// 0, hands every free byte back to the driver at each synchronisation, and the next op allocates it again). Where
// memory pools are unsupported (cudaDevAttrMemoryPoolsSupported 0: some virtualised or sandboxed devices) or turned
// off (set_memory_pools(false), TRIDENT_CUDA_NO_POOLS=1), cudaMalloc and, after the stream's work, cudaFree.
//
// Constant tables (the RoPE cos/sin tables): device_table uploads a host table once per device and content and
// hands the same device copy to every later call.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

namespace trident::gpu {

// Whether allocations on the current device go through its memory pool (false: cudaMalloc / cudaFree).
bool memory_pools_in_use();
// Turns pool allocations off (false) or back on where supported (true) for later allocations; tests use it to run
// the fallback on a device that has pools. Allocations made before keep their own free path.
void set_memory_pools(bool enabled);

// Allocate / free `bytes` on the current device, ordered on stream s. stream_free knows which path allocated p.
cudaError_t stream_malloc(void** p, size_t bytes, cudaStream_t s);
cudaError_t stream_free(void* p, cudaStream_t s);

// A device copy of the host table [host, host + bytes) on the current device, uploaded on first use and reused
// while the host bytes are unchanged (compared on every call: a table rebuilt at the same address with other
// values is uploaded again). Lives for the process. Throws trident::Error on a CUDA failure.
const void* device_table(const void* host, size_t bytes);
// Uploads device_table made so far (tests: the second call with the same table must not add one).
size_t device_table_uploads();

}  // namespace trident::gpu
