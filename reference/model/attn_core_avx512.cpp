// The attention core's loops (reference/model/attn_core_kernel.h) for AVX-512F, compiled with -mavx512f and without -mfma
// (CMakeLists.txt); reference/model/attention.cpp calls them where the GEMM runs its avx512 copy. Same bits as every copy.
#if TRIDENT_GEMM_DISPATCH
#define TRIDENT_GEMM_NS avx512
#include "reference/model/attn_core_kernel.h"
#endif
