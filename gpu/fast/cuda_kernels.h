// The fast tier on a CUDA device (backend cuda-fast, docs/gpu.md "cuda-fast"): gpu/fast/kernels_impl.h with the
// CUDA executor (gpu/ref/cuda_exec.cuh) and cuBLAS GEMMs (cublasGemmEx: bf16 operands on tensor cores with fp32
// accumulation under the bf16 policy, fp32 without TF32, fp64). cuBLAS is loaded with dlopen on first use
// (libcublas.so.13, then .12; the loader's search, then site-packages/nvidia/cublas/lib): the binaries carry no
// cuBLAS and start on a machine without one; a missing library is one error naming what was tried. Built only with nvcc (the trident_gpu library).
#pragma once
#include <memory>
#include <string>

#include "gpu/cuda_device.h"
#include "parallel/step_kernels.h"

namespace trident::gpu {

template <class T>
std::unique_ptr<Kernels<T>> make_cuda_fast_kernels(CudaDevice& dev);

// Loads cuBLAS now (the check a caller can make before running anything); throws naming the libraries tried.
void load_cublas();
// The cuBLAS loaded (loading it now): "cuBLAS 13.1.0 (/path/to/libcublas.so.13)"; throws like load_cublas.
std::string cublas_library();

}  // namespace trident::gpu
