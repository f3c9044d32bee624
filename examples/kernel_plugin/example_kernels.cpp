// The two ops of ExampleKernels, as plain loops. Each is launched on the device's stream with the byte ranges it
// reads and writes (Device::launch), as Trident's own kernels are, so the emulator's stream checker sees them.
#include "example_kernels.h"

#include <cmath>
#include <cstring>

namespace example {

namespace {

// fp32 -> bf16 -> fp32, round to nearest even (the bf16 policy rounds GEMM inputs to bf16 first).
float round_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return x;  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  std::memcpy(&x, &u, 4);
  return x;
}

template <class T>
T operand(trident::Policy pol, T v) {
  if constexpr (sizeof(T) == 4) {
    if (pol == trident::Policy::bf16) return round_bf16(v);
  }
  return v;
}

// Runs fn now on an immediate device, else launches it with its accesses.
template <class F>
void run(trident::Device& dev, trident::Stream s, const char* name, trident::Accesses acc, double flops, F fn,
         std::source_location loc) {
  if (dev.immediate()) {
    fn();
    return;
  }
  dev.launch(s, name, std::move(acc), flops, std::function<void()>(std::move(fn)), loc);
}

int64_t span_of(int64_t rows, int64_t w, int64_t ld) { return rows > 0 ? (rows - 1) * ld + w : 0; }

}  // namespace

template <class T>
void ExampleKernels<T>::mm(trident::Policy pol, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B,
                           int64_t ldb, bool trans_b, T* C, int64_t ldc, trident::Stream s, loc_t loc) {
  const int64_t b_elems = trans_b ? span_of(N, K, ldb) : span_of(K, N, ldb);
  run(this->dev_, s, "mm", {trident::reads(A, span_of(M, K, lda)), trident::reads(B, b_elems),
                            trident::writes(C, span_of(M, N, ldc))},
      2.0 * double(M) * double(N) * double(K),
      [=] {
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j) {
            T part[4] = {T(0), T(0), T(0), T(0)};
            for (int64_t k = 0; k < K; ++k) {
              const T b = trans_b ? B[j * ldb + k] : B[k * ldb + j];
              part[k % 4] = part[k % 4] + operand(pol, A[i * lda + k]) * operand(pol, b);
            }
            T c = (part[0] + part[1]) + (part[2] + part[3]);
#ifdef EXAMPLE_PERTURB_MM
            c = c * T(1.01);  // the deliberately wrong build: 1% relative error
#endif
            C[i * ldc + j] = c;
          }
      },
      loc);
}

template <class T>
void ExampleKernels<T>::rmsnorm_forward(const T* x, int64_t ldx, const T* g, int64_t N, int64_t d, double eps, T* y,
                                        int64_t ldy, T* rinv, trident::Stream s, loc_t loc) {
  run(this->dev_, s, "rmsnorm_forward",
      {trident::reads(x, span_of(N, d, ldx)), trident::reads(g, d), trident::writes(y, span_of(N, d, ldy)),
       trident::writes(rinv, N)},
      4.0 * double(N) * double(d),
      [=] {
        for (int64_t r = 0; r < N; ++r) {
          T ss = T(0);
          for (int64_t i = 0; i < d; ++i) ss = ss + x[r * ldx + i] * x[r * ldx + i];
          const T ri = T(1) / std::sqrt(ss / T(d) + T(eps));
          rinv[r] = ri;
          for (int64_t i = 0; i < d; ++i) y[r * ldy + i] = (x[r * ldx + i] * ri) * g[i];
        }
      },
      loc);
}

template class ExampleKernels<float>;
template class ExampleKernels<double>;

}  // namespace example
