// The CUDA side of the example's CUDA kernel set (cuda_mm.cu): plain C++ declarations, no Trident header, so nvcc
// compiles the .cu file alone and the plugin (cuda_plugin.cpp) turns a returned error into a trident::Error.
#pragma once
#include <cstdint>
#include <string>

namespace example::cuda {

// "" when this process sees a CUDA device, else why not (one line).
std::string device_missing();

// C (M,N) = A (M,K) @ op(B) on the GPU, every pointer in host memory (row-major, leading dimensions lda, ldb, ldc;
// B is (N,K) when trans_b, else (K,N)): copies A and B to the device, runs the kernel (one thread per element of C,
// 16x16 tiles staged in shared memory, fp32 accumulation in k order; the operands rounded to bf16 first when bf16),
// copies C back (only its M x N elements: the gaps between rows stay as they are) and frees the device memory.
// Returns "" on success, else the failing CUDA call and its error (one line).
std::string mm_f32(bool bf16, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                   int64_t ldb, bool trans_b, float* C, int64_t ldc);

}  // namespace example::cuda
