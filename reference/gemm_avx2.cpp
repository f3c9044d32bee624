// The GEMM kernel (reference/gemm_kernel.h) for AVX2 (8 floats per vector), compiled with -mavx2 and without
// -mfma (CMakeLists.txt); reference/gemm.cpp calls it where the CPU has AVX2. Same bits as every other copy.
#if TRIDENT_GEMM_DISPATCH
#define TRIDENT_GEMM_VEC_BYTES 32
#define TRIDENT_GEMM_NS avx2
#include "reference/gemm_kernel.h"
#endif
