// CudaRefKernels (gpu/ref/cuda_kernels.h): the ref tier's bodies (gpu/ref/ops.h) launched as CUDA kernels.
// Compiled by nvcc for sm_90 with --fmad=false (and __fmul_rn/__fadd_rn in the bodies), --extended-lambda,
// --expt-relaxed-constexpr; the dm:: functions are the device build of reference/dmath.cpp.
#include "gpu/ref/cuda_kernels.h"

#include "gpu/emu_cuda.h"

#include "gpu/ref/cuda_exec.cuh"
#include "gpu/ref/kernels_impl.h"

namespace trident::gpu {

template <class T>
std::unique_ptr<Kernels<T>> make_cuda_ref_kernels(CudaDevice& dev) {
  return std::make_unique<ref::RefKernels<T, ref::CudaLaunch>>(ref::CudaLaunch{&dev, nullptr, nullptr});
}
template std::unique_ptr<Kernels<float>> make_cuda_ref_kernels<float>(CudaDevice&);
template std::unique_ptr<Kernels<double>> make_cuda_ref_kernels<double>(CudaDevice&);

// An emulated rank on the GPU (gpu/emu_cuda.h): the same class, the same bodies; its own CUDA stream.
template <class T>
std::unique_ptr<Kernels<T>> make_emu_cuda_ref_kernels(Device& dev) {
  return std::make_unique<ref::RefKernels<T, ref::CudaLaunch>>(
      ref::CudaLaunch{nullptr, &dev, std::make_shared<RankStream>()});
}
template std::unique_ptr<Kernels<float>> make_emu_cuda_ref_kernels<float>(Device&);
template std::unique_ptr<Kernels<double>> make_emu_cuda_ref_kernels<double>(Device&);

}  // namespace trident::gpu
