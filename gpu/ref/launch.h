// How a kernel set of the ref or fast tier (gpu/ref/kernels_impl.h, gpu/fast/kernels_impl.h) issues an op's closure
// over an executor: HostLaunch on any Device with the host executor (g++); CudaLaunch (gpu/ref/cuda_exec.cuh, nvcc
// only) on a CudaDevice with the CUDA executor.
#pragma once
#include <functional>
#include <source_location>
#include <utility>

#include "gpu/ref/exec.h"
#include "parallel/device.h"

namespace trident::gpu::ref {

// The host executor's launch: at once on an immediate device; else one closure on the stream (no declared
// accesses: the stream-hazard checker does not see this op's reads and writes).
struct HostLaunch {
  Device* dev;
  template <class F>
  void operator()(Stream s, const char* name, std::source_location loc, F&& f) const {
    if (dev->immediate()) {
      HostExec ex;
      f(ex);
      return;
    }
    dev->launch(s, name, Accesses{}, 0, std::function<void()>([f = std::forward<F>(f)] {
                  HostExec ex;
                  f(ex);
                }),
                loc);
  }
};

}  // namespace trident::gpu::ref
