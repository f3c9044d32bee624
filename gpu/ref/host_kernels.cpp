// "cuda-ref on host" (gpu/ref/host_kernels.h): the ref tier's kernel set with the host executor.
#include "gpu/ref/host_kernels.h"

#include <functional>

#include "gpu/ref/kernels_impl.h"

namespace trident::gpu {

namespace {

// The host executor's launch: at once on an immediate device; else one closure on the stream (no declared
// accesses: the stream-hazard checker does not see this op's reads and writes).
struct HostLaunch {
  Device* dev;
  template <class F>
  void operator()(Stream s, const char* name, std::source_location loc, F&& f) const {
    if (dev->immediate()) {
      ref::HostExec ex;
      f(ex);
      return;
    }
    dev->launch(s, name, Accesses{}, 0, std::function<void()>([f = std::forward<F>(f)] {
                  ref::HostExec ex;
                  f(ex);
                }),
                loc);
  }
};

}  // namespace

template <class T>
std::unique_ptr<Kernels<T>> make_ref_host_kernels(Device& dev) {
  return std::make_unique<ref::RefKernels<T, HostLaunch>>(HostLaunch{&dev});
}
template std::unique_ptr<Kernels<float>> make_ref_host_kernels<float>(Device&);
template std::unique_ptr<Kernels<double>> make_ref_host_kernels<double>(Device&);

}  // namespace trident::gpu
