// The GEMM kernel (reference/gemm_kernel.h) for AVX-512F (16 floats per vector), compiled with -mavx512f and
// without -mfma (CMakeLists.txt); reference/gemm.cpp calls it where the CPU has AVX-512F. Same bits as every
// other copy.
#if TRIDENT_GEMM_DISPATCH
#define TRIDENT_GEMM_VEC_BYTES 64
#define TRIDENT_GEMM_NS avx512
#include "reference/gemm_kernel.h"
#endif
