// TD_HD: marks a small inline function of the reference that CUDA kernels call too (the ref tier of the CUDA
// kernels, gpu/ref/): `__host__ __device__` when nvcc compiles the file, nothing for the host compiler, so the
// host build and its bits are unchanged. Only header-inline, allocation-free, exception-free code carries it.
#pragma once

#if defined(__CUDACC__)
#define TD_HD __host__ __device__
#else
#define TD_HD
#endif
