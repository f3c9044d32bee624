// "cuda-ref on host" (gpu/ref/host_kernels.h): the ref tier's kernel set with the host executor.
#include "gpu/ref/host_kernels.h"

#include "gpu/ref/kernels_impl.h"
#include "gpu/ref/launch.h"

namespace trident::gpu {

template <class T>
std::unique_ptr<Kernels<T>> make_ref_host_kernels(Device& dev) {
  return std::make_unique<ref::RefKernels<T, ref::HostLaunch>>(ref::HostLaunch{&dev});
}
template std::unique_ptr<Kernels<float>> make_ref_host_kernels<float>(Device&);
template std::unique_ptr<Kernels<double>> make_ref_host_kernels<double>(Device&);

}  // namespace trident::gpu
