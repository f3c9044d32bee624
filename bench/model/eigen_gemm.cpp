// bench_eigen_gemm_<isa> M N K: Eigen's fp32 GEMM (M x K times K x N, row-major) on the OpenMP threads, repeated for
// at least 1 s; prints "GFLOP-per-wall-second GFLOP-per-CPU-second". Built for the wide ISAs the reference GEMM
// dispatches to (bench/model/CMakeLists.txt: -mavx2 without FMA, as the reference multiplies and adds; -mavx512f,
// which Eigen accepts only with -mfma), as separate programs: Eigen's templates compiled for two ISAs must not meet
// in one binary. bench_small runs those the CPU can.
#include <omp.h>

#include <Eigen/Dense>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>

namespace {
double cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s M N K\n", argv[0]);
    return 2;
  }
  const long M = std::atol(argv[1]), N = std::atol(argv[2]), K = std::atol(argv[3]);
  if (M <= 0 || N <= 0 || K <= 0 || M > 65536 || N > 65536 || K > 65536) {
    std::fprintf(stderr, "%s: M, N, K must be in [1, 65536]\n", argv[0]);
    return 2;
  }
  using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Eigen::setNbThreads(omp_get_max_threads());
  RowMat a = RowMat::Random(M, K), b = RowMat::Random(K, N), c(M, N);
  c.noalias() = a * b;  // warm-up
  long reps = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const double c0 = cpu_s();
  double s = 0;
  do {
    c.noalias() = a * b;
    ++reps;
    s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (s < 1.0);
  const double cs = cpu_s() - c0;
  volatile float sink = c(0, 0);
  (void)sink;
  const double g = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) *
                   static_cast<double>(reps) / 1e9;
  std::printf("%.4f %.4f\n", g / s, g / cs);
  return 0;
}
