// CudaRefKernels (gpu/ref/cuda_kernels.h): the ref tier's bodies (gpu/ref/ops.h) launched as CUDA kernels.
// Compiled by nvcc for sm_90 with --fmad=false (and __fmul_rn/__fadd_rn in the bodies), --extended-lambda,
// --expt-relaxed-constexpr; the dm:: functions are the device build of reference/dmath.cpp.
#include "gpu/ref/cuda_kernels.h"

#include <functional>

#include "gpu/ref/cuda_exec.cuh"
#include "gpu/ref/kernels_impl.h"

namespace trident::gpu {
namespace {

// The CUDA executor's launch: CudaDevice::launch runs the closure at once (it enqueues the op's kernels on the
// stream) and checks cudaGetLastError, naming the op and the caller's line.
struct CudaLaunch {
  CudaDevice* dev;
  template <class F>
  void operator()(Stream s, const char* name, std::source_location loc, F&& f) const {
    dev->launch(s, name, Accesses{}, 0, std::function<void()>([&] {
                  ref::CudaExec ex(dev->stream(s));
                  f(ex);
                }),
                loc);
  }
};

}  // namespace

template <class T>
std::unique_ptr<Kernels<T>> make_cuda_ref_kernels(CudaDevice& dev) {
  return std::make_unique<ref::RefKernels<T, CudaLaunch>>(CudaLaunch{&dev});
}
template std::unique_ptr<Kernels<float>> make_cuda_ref_kernels<float>(CudaDevice&);
template std::unique_ptr<Kernels<double>> make_cuda_ref_kernels<double>(CudaDevice&);

}  // namespace trident::gpu
