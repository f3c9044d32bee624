// dmx: the dm:: functions (reference/dmath.h) as the ref-tier bodies call them. Host build: the reference's own
// functions. nvcc: the device build of the same source (gpu/ref/dmath_device.cuh), so every result has the
// reference's bits (dm:: uses only IEEE +, -, *, /, sqrt and integer operations; --fmad=false keeps them unfused).
#pragma once
#if defined(__CUDACC__)
#include "gpu/ref/dmath_device.cuh"
namespace trident::gpu::ref {
namespace dmx = ::trident::gpu::devdm::trident::dm;
}
#else
#include "reference/dmath.h"
namespace trident::gpu::ref {
namespace dmx = ::trident::dm;
}
#endif
