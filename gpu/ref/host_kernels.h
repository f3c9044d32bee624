// "cuda-ref on host": the ref tier's kernel bodies (gpu/ref/ops.h) run by the host executor, as a Kernels<T>.
// The ops the ref tier covers (ref_covered_ops) run the same bodies nvcc compiles into the CUDA kernels
// (gpu/ref/cuda_kernels.h); the others are the CPU reference ops (CpuKernels), so a whole step runs, and a
// bitwise comparison with CpuKernels checks exactly the covered ops' bodies. Each op runs on the calling thread
// (on a deferred device it is launched as one closure without declared accesses: no hazard checks for it).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "parallel/step_kernels.h"

namespace trident::gpu {

// The Kernels<T> ops written in the ref tier (gpu/ref/ops.h), in header order.
const std::vector<std::string>& ref_covered_ops();
bool ref_covers(const std::string& op);

template <class T>
std::unique_ptr<Kernels<T>> make_ref_host_kernels(Device& dev);

}  // namespace trident::gpu
