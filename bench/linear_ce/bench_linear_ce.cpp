// Linear cross-entropy vs a naive materialised cross-entropy (forward + backward), fp32, default shape
// tokens 8192, vocab 32768, d 256 (issue 3). Reported, never pass/fail:
//   - peak extra memory: bytes allocated inside the call above what was live before it (inputs and the
//     caller-owned outputs loss/lse/dhidden/dW accumulators are allocated beforehand and not counted), measured by
//     counting every operator new in this process; compared with N*V*4 (the naive's materialised logits);
//     target <= 1/32;
//   - time ratio linear / naive (target <= 1.2), for the split API (forward, then backward recomputing the
//     logits: 4 GEMMs) and the fused one (3 GEMMs, token_chunk x V logits kept per chunk).
// The naive path uses the same primitives (batch-invariant gemm, dm::exp/log, tile_wgrad_acc with the same tiles),
// so the ratio measures the chunking, not different kernels.
//
// Usage: bench_linear_ce [--tokens N] [--vocab V] [--d D] [--vocab-chunk C] [--token-chunk C] [--tile T]
//        [--reps R] [--fused 1] [--fused-token-chunk C] [benchmark flags]
// The fused API keeps token_chunk x V logits, so under the 1/32 memory target its token chunks are small and every
// dW accumulator is streamed from memory once per token chunk: it is slower here (reported with --fused 1).
#include <benchmark/benchmark.h>
#include "bench/bench_reporter.h"
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "reference/dmath.h"
#include "reference/exact_acc.h"
#include "reference/gemm.h"
#include "reference/model/linear_ce.h"
#include "reference/tile_reduce.h"

// ---------------------------------------------------------------------------------------------------------------
// Allocation accounting: every operator new in the process (std::vector, OpenMP-free code paths) goes through
// here; a 64-byte header keeps the size (and alignment) so delete can subtract it.
namespace {
std::atomic<int64_t> g_live{0}, g_peak{0};
constexpr size_t kHdr = 64;
void* counted_alloc(size_t n, size_t align) {
  align = std::max(align, kHdr);
  void* raw = std::aligned_alloc(align, ((n + align + align - 1) / align) * align);
  if (!raw) throw std::bad_alloc();
  char* p = static_cast<char*>(raw) + align;
  std::memcpy(p - 16, &n, sizeof(n));
  std::memcpy(p - 8, &align, sizeof(align));
  const int64_t live = g_live.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
  int64_t pk = g_peak.load();
  while (live > pk && !g_peak.compare_exchange_weak(pk, live)) {
  }
  return p;
}
void counted_free(void* p) noexcept {
  if (!p) return;
  size_t n, align;
  std::memcpy(&n, static_cast<char*>(p) - 16, sizeof(n));
  std::memcpy(&align, static_cast<char*>(p) - 8, sizeof(align));
  g_live.fetch_sub(static_cast<int64_t>(n));
  std::free(static_cast<char*>(p) - align);
}
}  // namespace

void* operator new(size_t n) { return counted_alloc(n, kHdr); }
void* operator new[](size_t n) { return counted_alloc(n, kHdr); }
void* operator new(size_t n, std::align_val_t a) { return counted_alloc(n, static_cast<size_t>(a)); }
void* operator new[](size_t n, std::align_val_t a) { return counted_alloc(n, static_cast<size_t>(a)); }
void operator delete(void* p) noexcept { counted_free(p); }
void operator delete[](void* p) noexcept { counted_free(p); }
void operator delete(void* p, size_t) noexcept { counted_free(p); }
void operator delete[](void* p, size_t) noexcept { counted_free(p); }
void operator delete(void* p, std::align_val_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { counted_free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { counted_free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { counted_free(p); }

namespace {

using namespace trident;
using namespace trident::model;

struct Shape {
  // token_chunk = N and a small vocab chunk: the backward then walks every dW accumulator once per vocab chunk per
  // thread (all of the thread's tiles at once, cache-resident); scratch per thread: (N/threads) x vocab_chunk
  // floats of dlogit + d x vocab_chunk thread-local dW accumulators.
  int64_t N = 8192, V = 32768, d = 256, vocab_chunk = 256, token_chunk = 8192, tile = 128, fused_token_chunk = 128;
  int64_t reps = 2;   // --reps R: variants run interleaved R times; the summary uses each variant's fastest run
  int64_t fused = 0;  // --fused 1: also run the fused API (slow at small fused_token_chunk: see the summary)
} g_shape;

struct Data {
  std::vector<float> hidden, W, loss, lse, dhidden;
  std::vector<int32_t> targets;
  std::vector<int64_t> segs;
  std::vector<ExactAcc<float>> dW_acc;
  float grad_scale = 0;
};

Data& data() {
  static Data D = [] {
    Data x;
    const Shape& s = g_shape;
    std::mt19937_64 rng(20261129);
    std::normal_distribution<float> nd;
    x.hidden.resize(s.N * s.d);
    x.W.resize(s.d * s.V);
    x.targets.resize(s.N);
    for (auto& v : x.hidden) v = nd(rng);
    for (auto& v : x.W) v = nd(rng) * 0.1f;
    for (auto& t : x.targets) t = (rng() % 16 == 0) ? kIgnoreIndex : static_cast<int32_t>(rng() % s.V);
    x.segs = uniform_segments(s.N, s.tile);
    x.loss.resize(s.N);
    x.lse.resize(s.N);
    x.dhidden.resize(s.N * s.d);
    x.dW_acc.resize(s.d * s.V);
    x.grad_scale = 1.0f / static_cast<float>(count_valid_targets(x.targets.data(), s.N));
    return x;
  }();
  return D;
}

// The naive oracle: logits materialised (N x V), same primitives.
void naive_ce(Data& x) {
  const Shape& s = g_shape;
  std::vector<float> L(s.N * s.V);
  gemm<float>(s.N, s.V, s.d, x.hidden.data(), s.d, x.W.data(), s.V, false, L.data(), s.V);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < s.N; ++i) {
    const float* l = L.data() + i * s.V;
    float m = l[0];
    for (int64_t j = 1; j < s.V; ++j) m = l[j] > m ? l[j] : m;
    float sum = 0;
    for (int64_t j = 0; j < s.V; ++j) sum = sum + dm::exp(l[j] - m);
    x.lse[i] = m + dm::log(sum);
    x.loss[i] = x.targets[i] == kIgnoreIndex ? 0.0f : x.lse[i] - l[x.targets[i]];
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < s.N; ++i) {
    float* l = L.data() + i * s.V;
    const int32_t t = x.targets[i];
    for (int64_t j = 0; j < s.V; ++j)
      l[j] = t == kIgnoreIndex ? 0.0f : (dm::exp(l[j] - x.lse[i]) - (j == t ? 1.0f : 0.0f)) * x.grad_scale;
  }
  gemm<float>(s.N, s.d, s.V, L.data(), s.V, x.W.data(), s.V, true, x.dhidden.data(), s.d);
  tile_wgrad_acc<float>(x.hidden.data(), s.d, L.data(), s.V, s.d, s.V, x.segs, x.dW_acc.data());
}

void linear_split(Data& x) {
  const Shape& s = g_shape;
  linear_ce_forward<float>(x.hidden.data(), x.W.data(), x.targets.data(), s.N, s.d, s.V, s.vocab_chunk, Policy::fp32,
                           s.token_chunk, x.loss.data(), x.lse.data());
  linear_ce_backward<float>(x.hidden.data(), x.W.data(), x.targets.data(), x.lse.data(), s.N, s.d, s.V,
                            s.vocab_chunk, Policy::fp32, s.token_chunk, x.grad_scale, x.segs, x.dhidden.data(),
                            x.dW_acc.data());
}

void linear_fused(Data& x) {
  const Shape& s = g_shape;
  linear_ce_fused<float>(x.hidden.data(), x.W.data(), x.targets.data(), s.N, s.d, s.V, s.vocab_chunk, Policy::fp32,
                         s.fused_token_chunk, x.grad_scale, x.segs, x.loss.data(), x.lse.data(), x.dhidden.data(),
                         x.dW_acc.data());
}

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Measured {
  double cpu = 1e300;      // process CPU seconds of the fastest-CPU run (all threads; includes OpenMP spinning)
  double seconds = 1e300;  // fastest run
  int64_t peak_extra = 0;  // largest peak
  std::vector<double> runs;
};
std::map<std::string, Measured> g_results;

template <void (*F)(Data&)>
void BM_ce(benchmark::State& st, const char* name) {
  Data& x = data();
  Measured& m = g_results[name];
  for (auto _ : st) {
    const int64_t base = g_live.load();
    g_peak.store(base);
    const double t0 = omp_get_wtime(), c0 = process_cpu_seconds();
    F(x);
    const double t = omp_get_wtime() - t0, c = process_cpu_seconds() - c0;
    m.cpu = std::min(m.cpu, c);
    const int64_t peak = g_peak.load() - base;
    m.seconds = std::min(m.seconds, t);
    m.runs.push_back(t);
    m.peak_extra = std::max(m.peak_extra, peak);
    benchmark::DoNotOptimize(x.dhidden.data());
    st.counters["peak_extra_MiB"] = static_cast<double>(peak) / (1 << 20);
    st.counters["seconds"] = t;
    st.counters["cpu_seconds"] = c;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    auto opt = [&](const char* flag, int64_t& dst) {
      if (std::strcmp(argv[i], flag) == 0 && i + 1 < argc) {
        dst = std::atoll(argv[++i]);
        return true;
      }
      return false;
    };
    if (opt("--tokens", g_shape.N) || opt("--vocab", g_shape.V) || opt("--d", g_shape.d) ||
        opt("--vocab-chunk", g_shape.vocab_chunk) || opt("--token-chunk", g_shape.token_chunk) ||
        opt("--tile", g_shape.tile) || opt("--fused-token-chunk", g_shape.fused_token_chunk) ||
        opt("--fused", g_shape.fused) || opt("--reps", g_shape.reps))
      continue;
    rest.push_back(argv[i]);
  }
  int rc = static_cast<int>(rest.size());
  trident::bench::Reporter rep(rc, rest.data());
  benchmark::Initialize(&rc, rest.data());
  const Shape& s = g_shape;
  std::printf("linear CE bench: tokens %ld, vocab %ld, d %ld, vocab_chunk %ld, token_chunk %ld (fused %ld), tile %ld, "
              "fp32, %d threads\n",
              s.N, s.V, s.d, s.vocab_chunk, s.token_chunk, s.fused_token_chunk, s.tile, omp_get_max_threads());
  data();  // inputs and outputs allocated before any measurement
  for (int64_t r = 0; r < s.reps; ++r) {  // interleaved, so load changes hit every variant alike
    benchmark::RegisterBenchmark("naive_ce", BM_ce<naive_ce>, "naive")->Iterations(1)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("linear_ce_split", BM_ce<linear_split>, "split")
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
    if (s.fused)
      benchmark::RegisterBenchmark("linear_ce_fused", BM_ce<linear_fused>, "fused")
          ->Iterations(1)
          ->Unit(benchmark::kMillisecond);
  }
  benchmark::RunSpecifiedBenchmarks(&rep);
  benchmark::Shutdown();

  const double logits_bytes = static_cast<double>(s.N) * static_cast<double>(s.V) * 4.0;
  if (g_results.count("naive")) {
    const Measured& nv = g_results["naive"];
    std::printf("\nsummary (fastest of %ld interleaved runs each; materialised logits N*V*4 = %.1f MiB; targets: "
                "memory <= 1/32 = 0.03125, time <= 1.2)\n",
                s.reps, logits_bytes / (1 << 20));
    std::printf("  %-16s %9.3f s (cpu %9.3f s)  peak extra %9.1f MiB  memory ratio vs N*V*4 %.4f\n", "naive",
                nv.seconds, nv.cpu, nv.peak_extra / double(1 << 20), nv.peak_extra / logits_bytes);
    for (const char* k : {"split", "fused"}) {
      if (!g_results.count(k)) continue;
      const Measured& m = g_results[k];
      std::printf("  %-16s %9.3f s (cpu %9.3f s)  peak extra %9.1f MiB  memory ratio vs N*V*4 %.4f   "
                  "time ratio vs naive %.3f (cpu %.3f)\n",
                  (std::string("linear_ce_") + k).c_str(), m.seconds, m.cpu, m.peak_extra / double(1 << 20),
                  m.peak_extra / logits_bytes, m.seconds / nv.seconds, m.cpu / nv.cpu);
    }
    std::printf("  (caller-owned outputs, not counted: dW accumulators d*V*%zu B = %.1f MiB, dhidden %.1f MiB)\n",
                sizeof(ExactAcc<float>), double(s.d * s.V * sizeof(ExactAcc<float>)) / (1 << 20),
                double(s.N * s.d * 4) / (1 << 20));
  }
  return 0;
}
