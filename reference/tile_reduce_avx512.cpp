// The tile reductions' loops (reference/tile_reduce_kernel.h) for AVX-512F, compiled with -mavx512f and without -mfma
// (CMakeLists.txt); reference/tile_reduce.cpp calls them where the GEMM runs its avx512 copy. Same bits as every copy.
#if TRIDENT_GEMM_DISPATCH
#define TRIDENT_GEMM_NS avx512
#include "reference/tile_reduce_kernel.h"
#endif
