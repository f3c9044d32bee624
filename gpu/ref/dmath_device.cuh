// The dm:: functions for the device: reference/dmath.cpp compiled a second time by nvcc, inside the namespace
// trident::gpu::devdm, with every function and table marked __device__ (TD_DM / TD_DM_TABLE). Same source, same
// operations (IEEE +, -, *, /, sqrt with --fmad=false, integer bit manipulation), so the same bits as the host.
// Included by gpu/ref/math.h under nvcc only.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "reference/dmath.h"  // (pragma once: dmath.cpp's own includes are then no-ops inside the namespace)
#include "reference/dmath_detail.h"

#define TD_DM __device__
#define TD_DM_TABLE __device__
namespace trident::gpu::devdm {
#include "reference/dmath.cpp"  // NOLINT(bugprone-suspicious-include)
}  // namespace trident::gpu::devdm
#undef TD_DM
#undef TD_DM_TABLE
