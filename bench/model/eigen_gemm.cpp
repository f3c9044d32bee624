// bench_eigen_gemm_<isa> M N K: Eigen's fp32 GEMM (M x K times K x N, row-major) on the OpenMP threads, repeated for
// at least 1 s; prints "GFLOP-per-wall-second GFLOP-per-CPU-second". Built for the wide ISAs the reference GEMM
// dispatches to (bench/model/CMakeLists.txt: -mavx2 without FMA, as the reference multiplies and adds; -mavx512f,
// which Eigen accepts only with -mfma), as separate programs: Eigen's templates compiled for two ISAs must not meet
// in one binary. bench_small runs those the CPU can.
#include <cstdio>
#include <cstdlib>

#include "bench/model/eigen_rate.h"

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
  const trident::bench::Rate r = trident::bench::eigen_gflops(M, N, K);
  std::printf("%.4f %.4f\n", r.wall, r.cpu);
  return 0;
}
