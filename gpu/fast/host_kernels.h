// "cuda-fast on host" (backend cuda-fast-host): the fast tier's kernel set (gpu/fast/kernels_impl.h) with the host
// executor. The fused attention and linear-CE bodies are the ones nvcc compiles into the CUDA build
// (gpu/fast/cuda_kernels.h); the GEMMs (cuBLAS there) are a split-K loop here (four interleaved partial sums per
// element): another summation order than the reference, so this kernel set is checked with the tolerance table's "gpu" rows, like the device build. Every op the
// fast tier does not override runs the ref tier's bodies (the reference's bits).
#pragma once
#include <memory>

#include "parallel/step_kernels.h"

namespace trident::gpu {

template <class T>
std::unique_ptr<Kernels<T>> make_fast_host_kernels(Device& dev);

}  // namespace trident::gpu
