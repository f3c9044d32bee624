// "cuda-fast on host" (gpu/fast/host_kernels.h): the fast tier with the host executor and a split-K host GEMM.
#include "gpu/fast/host_kernels.h"

#include <vector>

#include "gpu/fast/kernels_impl.h"
#include "gpu/ref/launch.h"

namespace trident::gpu {

namespace {

// The host GEMM: not the reference's chain. Each element sums its K products in four interleaved partial sums
// (k mod 4, a vector unit's / split-K order) combined pairwise, ((s0 + s1) + (s2 + s3)), then added to C when
// accumulating; OpenMP over the rows of C. (Eigen's product, tried first, gave the reference's bits on every golden case:
// its kernel keeps one chain per element, without FMA here, which would test nothing.) Operands copied (bf16: rounded).
struct SplitKGemm {
  template <class T>
  static std::vector<T> op(bool bf, bool trans, int64_t rows, int64_t cols, const T* X, int64_t ld) {
    std::vector<T> m(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const T x = trans ? X[c * ld + r] : X[r * ld + c];
        m[static_cast<size_t>(r * cols + c)] = ref::operand(x, bf);
      }
    return m;
  }
  template <class T, class Ex>
  void operator()(Ex&, bool bf, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda,
                  const T* B, int64_t ldb, bool accumulate, T* C, int64_t ldc) const {
    const std::vector<T> a = op(bf, trans_a, M, K, A, lda), bt = op(bf, !trans_b, N, K, B, ldb);  // bt: op(B)^T
#pragma omp parallel for schedule(static) if (M * N * K > (1 << 16))
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        const T s = fast::dot4<T>(K, a.data() + m * K, 1, bt.data() + n * K, 1, false);
        C[m * ldc + n] = accumulate ? C[m * ldc + n] + s : s;
      }
  }
};

}  // namespace

template <class T>
std::unique_ptr<Kernels<T>> make_fast_host_kernels(Device& dev) {
  return std::make_unique<fast::FastKernels<T, ref::HostLaunch, SplitKGemm>>(ref::HostLaunch{&dev}, SplitKGemm{});
}
template std::unique_ptr<Kernels<float>> make_fast_host_kernels<float>(Device&);
template std::unique_ptr<Kernels<double>> make_fast_host_kernels<double>(Device&);

}  // namespace trident::gpu
