// An outside kernel set: two ops written here (mm, rmsnorm_forward), every other op inherited from Trident's CPU
// reference kernel set (CpuKernels<T>). Built twice: into the check_kernels executable (linked against Trident's
// libraries) and into the plugin libexample_kernels.so that `trident check --backend plugin:...` loads.
#pragma once
#include <cstdint>

#include "parallel/step_kernels.h"

namespace example {

template <class T>
class ExampleKernels : public trident::CpuKernels<T> {
 public:
  using loc_t = typename trident::CpuKernels<T>::loc_t;
  explicit ExampleKernels(trident::Device& dev) : trident::CpuKernels<T>(dev) {}

  // C (M,N) = A (M,K) @ op(B): four interleaved fp32 partial sums per element (k mod 4), as a vectorised kernel
  // would add them: another summation order than the reference's single in-order sum.
  void mm(trident::Policy pol, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
          bool trans_b, T* C, int64_t ldc, trident::Stream s, loc_t loc = loc_t::current()) override;
  // y = x / sqrt(mean(x^2) + eps) * g per row; rinv = 1 / sqrt(mean(x^2) + eps).
  void rmsnorm_forward(const T* x, int64_t ldx, const T* g, int64_t N, int64_t d, double eps, T* y, int64_t ldy,
                       T* rinv, trident::Stream s, loc_t loc = loc_t::current()) override;
};

extern template class ExampleKernels<float>;
extern template class ExampleKernels<double>;

}  // namespace example
