// One training step of the `tiny` preset (forward, backward, clip, AdamW, router bias), with full recompute
// and with stored activations, per policy. Counters: ms per step, share of the step spent in the exact tile
// reductions (weight/norm/embedding gradients, the attention key side incl. its rounding, loss sum: the op profile's
// tile_reduce, reference/profile.h) and in rounding every gradient accumulator once (measured on a full GradAcc after
// the step: the Trainer's streaming accumulators round inside the step, block by block). Not in tile_reduce: the
// linear-CE dW tile reduction inside linear_ce_backward (owned by that primitive). No pass/fail on time.
// All times are process CPU time (immune to other processes on a shared machine); run with OMP_NUM_THREADS=1
// for numbers that are compute time (with more threads, OpenMP spin-waits count too).
#include <benchmark/benchmark.h>
#include "bench/bench_reporter.h"

#include <chrono>
#include <ctime>
#include <cstdio>
#include <map>
#include <string>
#include <type_traits>

#include "reference/model/model.h"
#include "reference/model/train.h"
#include "reference/profile.h"

using namespace trident;
using namespace trident::model;

namespace {

double cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Result {
  double ms = 0, reduce_share = 0, finalize_share = 0;
};
std::map<std::string, Result>& results() {
  static std::map<std::string, Result> r;
  return r;
}

void BM_TrainStep(benchmark::State& st) {
  const Policy pol = static_cast<Policy>(st.range(0));
  const bool recompute = st.range(1) != 0;
  Config c = Config::preset("tiny");
  c.policy = pol;
  c.tile = st.range(2);
  RunConfig rc;
  rc.sequences = 4;
  rc.seq_len = 64;
  rc.recompute = recompute;
  const Batch b = synthetic_batch(c, rc, 0);
  double total = 0, red = 0, fin = 0;
  int64_t n = 0;
  auto body = [&](auto& tr) {
    using T = std::decay_t<decltype(tr.params.t[0].data[0])>;
    // The rounding measurement's accumulators: one backward's real sums, kept.
    GradAcc<T> full = GradAcc<T>::zeros(tr.params.info);
    StepOptions opt;
    opt.token_chunk = rc.token_chunk;
    opt.recompute = recompute;
    model_forward_backward<T>(c, tr.params, b, opt, full);
    tr.step(b);  // warm-up
    prof::enable(true);
    for (auto _ : st) {
      prof::reset();
      const double t0 = cpu_s();
      tr.step(b);
      total += cpu_s() - t0;
      red += prof::snapshot()[prof::Op::tile_reduce].seconds;
      // rounding every gradient once, on full accumulators of the same size
      const double f0 = cpu_s();
      full.finalize(tr.grads);
      fin += cpu_s() - f0;
      ++n;
    }
    prof::enable(false);
  };
  if (pol == Policy::fp64) {
    Trainer<double> tr(c, rc);
    body(tr);
  } else {
    Trainer<float> tr(c, rc);
    body(tr);
  }
  Result r;
  r.ms = 1e3 * total / static_cast<double>(n);
  r.reduce_share = red / total;
  r.finalize_share = fin / total;
  st.counters["cpu_ms_per_step"] = r.ms;
  st.counters["tile_reduction_share"] = r.reduce_share;
  st.counters["finalize_share"] = r.finalize_share;
  results()[std::string(to_string(pol)) + (recompute ? "/recompute" : "/stored") + "/T" + std::to_string(c.tile)] = r;
}

}  // namespace

BENCHMARK(BM_TrainStep)
    ->ArgsProduct({{static_cast<int64_t>(Policy::fp32), static_cast<int64_t>(Policy::bf16),
                    static_cast<int64_t>(Policy::fp64)},
                   {0, 1},
                   {8, 64}})
    ->ArgNames({"policy", "recompute", "tile"})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.5);

int main(int argc, char** argv) {
  trident::bench::Reporter rep(argc, argv);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks(&rep);
  benchmark::Shutdown();
  std::printf("\nbench_model summary: one step of `tiny`, 4 x 64 tokens (process CPU time)\n");
  for (const char* t : {"/T8", "/T64"})
    for (const char* p : {"fp32", "bf16", "fp64"}) {
      const auto it_r = results().find(std::string(p) + "/recompute" + t);
      const auto it_s = results().find(std::string(p) + "/stored" + t);
      if (it_r == results().end() || it_s == results().end()) continue;
      const Result& r = it_r->second;
      const Result& s = it_s->second;
      std::printf("  tile %-3s %s: recompute %.2f ms/step (x%.2f vs stored %.2f ms); tile reductions %.1f%% of "
                  "the step, finalize (one rounding per gradient) +%.1f%%\n",
                  t + 2, p, r.ms, r.ms / s.ms, s.ms, 100 * r.reduce_share, 100 * r.finalize_share);
    }
  return 0;
}
