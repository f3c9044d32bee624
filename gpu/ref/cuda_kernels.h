// CudaRefKernels: the ref tier of the CUDA kernels (docs/gpu.md "cuda-ref") as a Kernels<T> over a CudaDevice.
// Every op runs the bodies of gpu/ref/ops.h as CUDA kernels on Device::native_stream(s), one thread per output
// element / row / column, with the reference's bits. Pointers are device pointers; host metadata (tile segments,
// row lists, the RoPE table) is copied at issue. Built only with nvcc (the trident_gpu library).
#pragma once
#include <memory>

#include "gpu/cuda_device.h"
#include "parallel/step_kernels.h"

namespace trident::gpu {

template <class T>
std::unique_ptr<Kernels<T>> make_cuda_ref_kernels(CudaDevice& dev);

}  // namespace trident::gpu
