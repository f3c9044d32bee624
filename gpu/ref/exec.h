// The ref tier of the CUDA kernels (docs/gpu.md "cuda-ref"): one source for the kernel bodies, two compilers.
//
// Every op of gpu/ref/ops.h is written as host code that issues *bodies*: a lambda over one flat index (one output
// element, row or column), run for every index of a range by an executor:
//   - HostExec (this file): a plain loop on the calling thread. g++ compiles the bodies as ordinary host code, so
//     the same bodies run on every CPU machine ("cuda-ref on host", gpu/ref/host_kernels.h);
//   - CudaExec (gpu/ref/cuda_exec.cuh): a CUDA kernel launch (<<<grid, 256, 0, stream>>>), one thread per index;
//     nvcc compiles the bodies as device lambdas (TD_REF_LAMBDA = __device__, --extended-lambda).
// Bodies use only the arithmetic below (fmul/fadd/fsub/fdiv/fsqrt: __fmul_rn etc. on the device, so nothing is
// contracted into an FMA; plain IEEE operations on the host, where the project compiles with -ffp-contract=off),
// the dm:: functions through `dmx` (gpu/ref/math.h) and ExactAcc's adds. Each index runs its reductions as one
// sequential chain in the reference's order, and exact sums go through ExactAcc (order-free), so a body gives the
// reference's bits whatever the grid, the thread count or the device.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "reference/check.h"
#include "reference/hd.h"

#if defined(__CUDACC__)
#define TD_REF __device__         // a helper of the bodies: device code under nvcc
#define TD_REF_LAMBDA __device__  // a body (nvcc extended lambda)
#else
#define TD_REF
#define TD_REF_LAMBDA
#endif

namespace trident::gpu::ref {

// ---- arithmetic: one rounding per operation, never fused -----------------------------------------------------
// fmul, fadd, fsub, fdiv: the round-to-nearest device intrinsic under nvcc's device pass, the IEEE operator on the
// host. fsqrt: __fsqrt_rn / __dsqrt_rn, or the correctly rounded builtin (what std::sqrt is in the reference).
#ifdef __CUDA_ARCH__
#define TD_REF_BINARY(name, op, f32, f64)                             \
  TD_REF inline float name(float a, float b) { return f32(a, b); }   \
  TD_REF inline double name(double a, double b) { return f64(a, b); }
#define TD_REF_SQRT(f32, f64)                                \
  TD_REF inline float fsqrt(float a) { return f32(a); }     \
  TD_REF inline double fsqrt(double a) { return f64(a); }
#else
#define TD_REF_BINARY(name, op, f32, f64)                             \
  TD_REF inline float name(float a, float b) { return a op b; }      \
  TD_REF inline double name(double a, double b) { return a op b; }
#define TD_REF_SQRT(f32, f64)                                             \
  TD_REF inline float fsqrt(float a) { return __builtin_sqrtf(a); }      \
  TD_REF inline double fsqrt(double a) { return __builtin_sqrt(a); }
#endif
TD_REF_BINARY(fmul, *, __fmul_rn, __dmul_rn)
TD_REF_BINARY(fadd, +, __fadd_rn, __dadd_rn)
TD_REF_BINARY(fsub, -, __fsub_rn, __dsub_rn)
TD_REF_BINARY(fdiv, /, __fdiv_rn, __ddiv_rn)
TD_REF_SQRT(__fsqrt_rn, __dsqrt_rn)
#undef TD_REF_BINARY
#undef TD_REF_SQRT

// ---- the host executor ---------------------------------------------------------------------------------------
// Runs bodies in a loop on the calling thread; scratch lives until the executor is destroyed (after the op).
class HostExec {
 public:
  static constexpr bool kHost = true;
  template <class F>
  void for_each(int64_t n, const F& f) {
    for (int64_t i = 0; i < n; ++i) f(i);
  }
  // n elements of U, zero bytes (an ExactAcc of zero bytes is an empty accumulator).
  template <class U>
  U* scratch(int64_t n) {
    const size_t bytes = static_cast<size_t>(n > 0 ? n : 1) * sizeof(U);
    bufs_.push_back(std::make_unique<std::max_align_t[]>((bytes + sizeof(std::max_align_t) - 1) /
                                                          sizeof(std::max_align_t)));
    std::memset(bufs_.back().get(), 0, bytes);
    return reinterpret_cast<U*>(bufs_.back().get());
  }
  // Host metadata (tile segments, row lists) as the bodies read it: here, the caller's memory.
  template <class U>
  const U* meta(std::span<const U> v) {
    return v.data();
  }
  // A constant table read by the bodies (the RoPE table): here, the caller's memory; the CUDA executor keeps one
  // device copy per table.
  template <class U>
  const U* table(std::span<const U> v) {
    return v.data();
  }
  // A flag bodies set when the data breaks a rule the reference checks; check_flag throws naming the rule. (On the
  // host the ops check the data first, with the reference's messages, so the flag stays 0 here.)
  int* flag() { return &flag_; }
  void check_flag(const char* rule) const {
    if (flag_ != 0) fail(std::string("cuda-ref: ") + rule);
  }

 private:
  std::vector<std::unique_ptr<std::max_align_t[]>> bufs_;
  int flag_ = 0;
};

}  // namespace trident::gpu::ref
