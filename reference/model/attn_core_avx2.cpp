// The attention core's loops (reference/model/attn_core_kernel.h) for AVX2, compiled with -mavx2 and without -mfma
// (CMakeLists.txt); reference/model/attention.cpp calls them where the GEMM runs its avx2 copy. Same bits as every copy.
#if TRIDENT_GEMM_DISPATCH
#define TRIDENT_GEMM_NS avx2
#include "reference/model/attn_core_kernel.h"
#endif
