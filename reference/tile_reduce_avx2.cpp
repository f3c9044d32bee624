// The tile reductions' loops (reference/tile_reduce_kernel.h) for AVX2, compiled with -mavx2 and without -mfma
// (CMakeLists.txt); reference/tile_reduce.cpp calls them where the GEMM runs its avx2 copy. Same bits as every copy.
#if TRIDENT_GEMM_DISPATCH
#define TRIDENT_GEMM_NS avx2
#include "reference/tile_reduce_kernel.h"
#endif
