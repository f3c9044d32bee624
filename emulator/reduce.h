// Elementwise reduction of n contributions in rank order: dst[i] = ((src[0][i] op src[1][i]) op src[2][i]) ...
// dst may alias one of the sources element for element (in-place collectives); each block of the result is
// written only after all sources of that block were read.
#pragma once
#include <cstddef>

#include "parallel/comm.h"

namespace trident::emu {

void reduce_into(DataType t, ReduceOp op, void* dst, const void* const* srcs, int n, size_t count);

}  // namespace trident::emu
