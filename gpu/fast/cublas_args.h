// The arguments of one cublasGemmEx call for a row-major GEMM of the fast tier (gpu/fast/ops.h's Gemm contract):
// row-major C (M,N) ldc [+]= op(A) (M,K) @ op(B) (K,N) is column-major C^T = op(B)^T op(A)^T, so cuBLAS gets
// m = N, n = M, k = K, its first operand our B (transposed iff trans_b), its second our A (transposed iff trans_a),
// and C with ldc. Plain C++ (no CUDA types), so the mapping is tested on the host against cuBLAS's documented
// column-major semantics (tests/gpu/test_cuda_fast_host.cpp); gpu/fast/cuda_kernels.cu makes the call from it.
// Under the bf16 policy the operands are first copied, rounded, into dense row-major buffers of their stored shape
// (rows x cols, leading dimension cols), which bf16_copy gives.
#pragma once
#include <cstdint>

namespace trident::gpu::fast {

struct CublasGemmArgs {
  bool op_first_t = false, op_second_t = false;  // CUBLAS_OP_T for the first (our B) / second (our A) operand
  int64_t m = 0, n = 0, k = 0;
  int64_t ld_first = 0, ld_second = 0, ldc = 0;  // leading dimensions of our B, our A, C
};
inline CublasGemmArgs cublas_gemm_args(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, int64_t lda,
                                       int64_t ldb, int64_t ldc) {
  return {trans_b, trans_a, N, M, K, ldb, lda, ldc};
}
// The stored shape of an operand: op(X) is (rows_op, cols_op); stored X is that, or its transpose when trans.
struct StoredShape {
  int64_t rows = 0, cols = 0;
};
inline StoredShape stored_shape(bool trans, int64_t rows_op, int64_t cols_op) {
  return trans ? StoredShape{cols_op, rows_op} : StoredShape{rows_op, cols_op};
}

}  // namespace trident::gpu::fast
