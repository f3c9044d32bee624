// Numerics benchmarks (ratios measured in the same run; never pass/fail on time):
//  - batch-invariant gemm vs Eigen's GEMM (same shapes, same thread counts), GFLOP/s;
//  - tile-reduced dW = X^T dY (exact merge across tiles) vs plain fp32 X^T dY (the same in-order kernel over all
//    rows without tiles, and Eigen), per tile size T.
#include <benchmark/benchmark.h>
#include "bench/bench_reporter.h"
#include <omp.h>

#include <Eigen/Dense>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "reference/exact_acc.h"
#include "reference/gemm.h"
#include "reference/tile_reduce.h"

namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

std::vector<float> rand_vec(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = nd(rng);
  return v;
}

void set_threads(int t) {
  omp_set_num_threads(t);
  Eigen::setNbThreads(t);
}

void BM_gemm_trident(benchmark::State& st) {
  const int64_t M = st.range(0), N = st.range(1), K = st.range(2);
  set_threads(static_cast<int>(st.range(3)));
  auto A = rand_vec(M * K, 1), B = rand_vec(K * N, 2);
  std::vector<float> C(M * N);
  for (auto _ : st) {
    trident::gemm<float>(M, N, K, A.data(), K, B.data(), N, false, C.data(), N);
    benchmark::DoNotOptimize(C.data());
  }
  st.counters["GFLOPs"] = benchmark::Counter(2.0 * M * N * K, benchmark::Counter::kIsIterationInvariantRate,
                                             benchmark::Counter::kIs1000);
}

void BM_gemm_eigen(benchmark::State& st) {
  const int64_t M = st.range(0), N = st.range(1), K = st.range(2);
  set_threads(static_cast<int>(st.range(3)));
  auto A = rand_vec(M * K, 1), B = rand_vec(K * N, 2);
  std::vector<float> C(M * N);
  Eigen::Map<const RowMat> a(A.data(), M, K), b(B.data(), K, N);
  Eigen::Map<RowMat> c(C.data(), M, N);
  for (auto _ : st) {
    c.noalias() = a * b;
    benchmark::DoNotOptimize(C.data());
  }
  st.counters["GFLOPs"] = benchmark::Counter(2.0 * M * N * K, benchmark::Counter::kIsIterationInvariantRate,
                                             benchmark::Counter::kIs1000);
}

constexpr int64_t kTok = 8192, kK = 256, kM = 256;

// Tile-reduced weight gradient: dW = X^T dY with tiles of T rows (range 0), threads (range 1).
void BM_wgrad_tile(benchmark::State& st) {
  const int64_t T = st.range(0);
  set_threads(static_cast<int>(st.range(1)));
  auto X = rand_vec(kTok * kK, 3), dY = rand_vec(kTok * kM, 4);
  auto segs = trident::uniform_segments(kTok, T);
  std::vector<float> dW(kK * kM);
  for (auto _ : st) {
    trident::tile_wgrad<float>(X.data(), kK, dY.data(), kM, kK, kM, segs, dW.data());
    benchmark::DoNotOptimize(dW.data());
  }
  st.counters["GFLOPs"] = benchmark::Counter(2.0 * kTok * kK * kM, benchmark::Counter::kIsIterationInvariantRate,
                                             benchmark::Counter::kIs1000);
}

// Plain fp32 X^T dY with the same in-order kernel (one running sum over all rows, no tiles, no exact merge).
void BM_wgrad_plain(benchmark::State& st) {
  set_threads(static_cast<int>(st.range(0)));
  auto X = rand_vec(kTok * kK, 3), dY = rand_vec(kTok * kM, 4);
  std::vector<float> dW(kK * kM);
  for (auto _ : st) {
#pragma omp parallel for schedule(static)
    for (int64_t k0 = 0; k0 < kK; k0 += 48) {
      const int64_t kb = std::min<int64_t>(48, kK - k0);
      trident::gemm_serial<float>(kb, kM, kTok, X.data() + k0, 1, kK, dY.data(), kM, false, dW.data() + k0 * kM,
                                  kM, false);
    }
    benchmark::DoNotOptimize(dW.data());
  }
  st.counters["GFLOPs"] = benchmark::Counter(2.0 * kTok * kK * kM, benchmark::Counter::kIsIterationInvariantRate,
                                             benchmark::Counter::kIs1000);
}

void BM_wgrad_eigen(benchmark::State& st) {
  set_threads(static_cast<int>(st.range(0)));
  auto X = rand_vec(kTok * kK, 3), dY = rand_vec(kTok * kM, 4);
  std::vector<float> dW(kK * kM);
  Eigen::Map<const RowMat> x(X.data(), kTok, kK), dy(dY.data(), kTok, kM);
  Eigen::Map<RowMat> dw(dW.data(), kK, kM);
  for (auto _ : st) {
    dw.noalias() = x.transpose() * dy;
    benchmark::DoNotOptimize(dW.data());
  }
  st.counters["GFLOPs"] = benchmark::Counter(2.0 * kTok * kK * kM, benchmark::Counter::kIsIterationInvariantRate,
                                             benchmark::Counter::kIs1000);
}

// Captures real time per benchmark name for the ratio table.
class Capture : public trident::bench::Reporter {
 public:
  using Reporter::Reporter;
  std::map<std::string, double> t, cpu;
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& r : runs) t[r.benchmark_name()] = r.GetAdjustedRealTime(), cpu[r.benchmark_name()] = r.GetAdjustedCPUTime();
    Reporter::ReportRuns(runs);
  }
};

}  // namespace

int main(int argc, char** argv) {
  const int64_t shapes[][3] = {{512, 512, 512}, {4096, 1024, 1024}, {16384, 64, 64}};
  for (auto& s : shapes)
    for (int th : {1, 2}) {
      benchmark::RegisterBenchmark("gemm_trident", BM_gemm_trident)->Args({s[0], s[1], s[2], th})->UseRealTime()
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark("gemm_eigen", BM_gemm_eigen)->Args({s[0], s[1], s[2], th})->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  for (int th : {1, 2}) {
    benchmark::RegisterBenchmark("wgrad_plain", BM_wgrad_plain)->Args({th})->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("wgrad_eigen", BM_wgrad_eigen)->Args({th})->UseRealTime()->Unit(benchmark::kMillisecond);
    for (int T : {16, 32, 64, 128, 256})
      benchmark::RegisterBenchmark("wgrad_tile", BM_wgrad_tile)->Args({T, th})->UseRealTime()
          ->Unit(benchmark::kMillisecond);
  }
  Capture rep(argc, argv);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks(&rep);
  auto get = [&](const std::string& n) { auto it = rep.t.find(n); return it == rep.t.end() ? 0.0 : it->second; };
  // Process CPU time (all threads): less sensitive than wall time to other processes on a shared machine.
  auto getc = [&](const std::string& n) { auto it = rep.cpu.find(n); return it == rep.cpu.end() ? 0.0 : it->second; };
  std::printf("\nGEMM (fp32): trident GFLOP/s as a fraction of Eigen (target >= 0.50); wall time, (cpu time)\n");
  for (auto& s : shapes)
    for (int th : {1, 2}) {
      const std::string a = "/" + std::to_string(s[0]) + "/" + std::to_string(s[1]) + "/" + std::to_string(s[2]) +
                            "/" + std::to_string(th) + "/real_time";
      const double tt = get("gemm_trident" + a), te = get("gemm_eigen" + a);
      const double ct = getc("gemm_trident" + a), ce = getc("gemm_eigen" + a);
      if (tt > 0 && te > 0)
        std::printf("  %5lldx%5lldx%5lld threads=%d  ratio=%.2f  (cpu %.2f)\n", (long long)s[0], (long long)s[1],
                    (long long)s[2], th, te / tt, ce / ct);
    }
  std::printf("\ndW = X^T dY (N=%lld, K=%lld, M=%lld): tile-reduced time / plain time (target <= 1.3 at T>=128)\n",
              (long long)kTok, (long long)kK, (long long)kM);
  for (int th : {1, 2}) {
    const double tp = get("wgrad_plain/" + std::to_string(th) + "/real_time");
    const double te = get("wgrad_eigen/" + std::to_string(th) + "/real_time");
    const double cp = getc("wgrad_plain/" + std::to_string(th) + "/real_time");
    const double ce = getc("wgrad_eigen/" + std::to_string(th) + "/real_time");
    for (int T : {16, 32, 64, 128, 256}) {
      const std::string n = "wgrad_tile/" + std::to_string(T) + "/" + std::to_string(th) + "/real_time";
      const double tt = get(n), ct = getc(n);
      if (tt > 0 && tp > 0 && te > 0)
        std::printf("  threads=%d T=%3d  vs same-kernel plain: %.2fx (cpu %.2fx)   vs Eigen: %.2fx (cpu %.2fx)\n", th,
                    T, tt / tp, ct / cp, tt / te, ct / ce);
    }
  }
  benchmark::Shutdown();
  return 0;
}
