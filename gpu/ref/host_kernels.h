// "cuda-ref on host": the ref tier's kernel bodies (gpu/ref/ops.h) run by the host executor, as a Kernels<T>:
// every op of the kernel set runs the same bodies nvcc compiles into the CUDA kernels (gpu/ref/cuda_kernels.h),
// so a bitwise comparison with CpuKernels (goldens, whole steps) checks those bodies on any machine. Each op runs
// on the calling thread (on a deferred device it is launched as one closure without declared accesses: the
// stream-hazard checker does not see its reads and writes).
#pragma once
#include <memory>

#include "parallel/step_kernels.h"

namespace trident::gpu {

template <class T>
std::unique_ptr<Kernels<T>> make_ref_host_kernels(Device& dev);

}  // namespace trident::gpu
