// Eigen's fp32 GEMM speed on one shape (M x K times K x N, row-major, the OpenMP threads), repeated for at least 1 s:
// GFLOP per wall-clock second and per process-CPU second. Shared by bench_small (Eigen at the build's ISA) and
// bench_eigen_gemm_* (Eigen built for a wider ISA, one program each: eigen_gemm.cpp).
#pragma once
#include <omp.h>

#include <Eigen/Dense>
#include <chrono>
#include <cstdint>
#include <ctime>

namespace trident::bench {

struct Rate {
  double wall = 0, cpu = 0;  // GFLOP per wall-clock second and per process-CPU second
};

inline double process_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

inline Rate eigen_gflops(int64_t M, int64_t N, int64_t K) {
  using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Eigen::setNbThreads(omp_get_max_threads());
  RowMat a = RowMat::Random(M, K), b = RowMat::Random(K, N), c(M, N);
  c.noalias() = a * b;  // warm-up
  int64_t reps = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const double c0 = process_cpu_s();
  double s = 0;
  do {
    c.noalias() = a * b;
    ++reps;
    s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (s < 1.0);
  const double cs = process_cpu_s() - c0;
  volatile float sink = c(0, 0);
  (void)sink;
  const double g = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) *
                   static_cast<double>(reps) / 1e9;
  return {g / s, g / cs};
}

}  // namespace trident::bench
