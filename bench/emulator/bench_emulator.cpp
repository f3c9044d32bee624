// Emulator bandwidth and latency (docs/emulator.md, "Measured numbers").
//  * Bus bandwidth, nccl-tests definitions: size S = the largest buffer of one rank (16 MiB here);
//    algbw = S / time; busbw = algbw * f, f = (n-1)/n for all_gather / reduce_scatter / all_to_all and
//    2(n-1)/n for all_reduce. The baseline is single-thread memcpy bandwidth (bytes copied / time), measured in
//    the same run. Since n fake ranks share this machine's cores, the printed table also shows the aggregate
//    bus bandwidth n * busbw (all ranks' traffic per second), which is what a machine with fewer cores than
//    ranks can be compared with.
//  * Latency: 1,000 tiny all_reduce at 1,024 ranks (rendezvous cost).
#include <benchmark/benchmark.h>
#include "bench/bench_reporter.h"

#include <chrono>
#include <cstring>
#include <vector>

#include "emulator/world.h"

namespace {

using namespace trident;
using Clock = std::chrono::steady_clock;
constexpr size_t kSize = size_t{16} << 20;  // bytes per rank (largest buffer)

double g_memcpy_bw = 0;       // bytes/s, 16 MiB (the baseline of the ratios)
double g_memcpy_dram_bw = 0;  // bytes/s, 256 MiB (does not fit in any cache; context only)
struct Row {
  std::string op;
  int n;
  double sec, algbw, busbw;
};
std::vector<Row> g_rows;
struct TinyRow {
  int n;
  bool trace;
  double us;
};
std::vector<TinyRow> g_tiny;
struct A2ARow {
  int n, group;
  double us;
};
std::vector<A2ARow> g_a2a;

void BM_memcpy(benchmark::State& st) {
  const size_t size = static_cast<size_t>(st.range(0)) << 20;
  std::vector<char> a(size, 1), b(size, 2);
  double best = 1e30;
  for (auto _ : st) {
    const auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), size);
    benchmark::ClobberMemory();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    st.SetIterationTime(s);
    best = std::min(best, s);
  }
  (size == kSize ? g_memcpy_bw : g_memcpy_dram_bw) = static_cast<double>(size) / best;
  st.counters["GBps"] = static_cast<double>(size) / best / 1e9;
}

enum Op { AG, RS, AR, A2A };
const char* op_name(Op o) { return o == AG ? "all_gather" : o == RS ? "reduce_scatter" : o == AR ? "all_reduce" : "all_to_all"; }

void BM_coll(benchmark::State& st) {
  const Op op = static_cast<Op>(st.range(0));
  const int n = static_cast<int>(st.range(1));
  const int reps = n <= 8 ? 5 : 3;
  const size_t floats = kSize / 4, chunk = floats / static_cast<size_t>(n);
  for (auto _ : st) {
    double sec = 0;
    emu::SpawnOptions o;
    o.record_trace = false;
    emu::spawn(n, [&](emu::RankContext& ctx) {
      auto& w = ctx.world();
      std::vector<float> send(op == AG ? chunk : floats, 1.f), recv(op == RS ? chunk : floats, 0.f);  // touched
      auto run = [&] {
        switch (op) {
          case AG: w.all_gather(send.data(), recv.data(), chunk, DataType::f32); break;
          case RS: w.reduce_scatter(send.data(), recv.data(), chunk, DataType::f32, ReduceOp::sum); break;
          case AR: w.all_reduce(send.data(), recv.data(), floats, DataType::f32, ReduceOp::sum); break;
          case A2A: w.all_to_all(send.data(), recv.data(), chunk, DataType::f32); break;
        }
      };
      run();  // warm-up
      float z = 0;
      w.all_reduce(&z, &z, 1, DataType::f32, ReduceOp::sum);  // start together
      const auto t0 = Clock::now();
      for (int i = 0; i < reps; ++i) run();
      w.all_reduce(&z, &z, 1, DataType::f32, ReduceOp::sum);  // everyone done
      if (ctx.rank() == 0) sec = std::chrono::duration<double>(Clock::now() - t0).count() / reps;
    }, o);
    st.SetIterationTime(sec);
    const double algbw = static_cast<double>(kSize) / sec;
    const double f = op == AR ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
    g_rows.push_back({op_name(op), n, sec, algbw, algbw * f});
    st.counters["busbw_GBps"] = algbw * f / 1e9;
    st.counters["busbw_vs_memcpy"] = algbw * f / g_memcpy_bw;
    st.counters["aggregate_vs_memcpy"] = n * algbw * f / g_memcpy_bw;
  }
}

void BM_tiny(benchmark::State& st) {
  const int n = static_cast<int>(st.range(0));
  const bool trace = st.range(1) != 0;
  const int calls = 1000;
  for (auto _ : st) {
    double sec = 0;
    emu::SpawnOptions o;
    o.record_trace = trace;
    emu::spawn(n, [&](emu::RankContext& ctx) {
      float x = 1.f, y = 0.f;
      ctx.world().all_reduce(&x, &y, 1, DataType::f32, ReduceOp::sum);
      const auto t0 = Clock::now();
      for (int i = 0; i < calls; ++i) ctx.world().all_reduce(&x, &y, 1, DataType::f32, ReduceOp::sum);
      if (ctx.rank() == 0) sec = std::chrono::duration<double>(Clock::now() - t0).count();
    }, o);
    st.SetIterationTime(sec);
    g_tiny.push_back({n, trace, sec / calls * 1e6});
    st.counters["us_per_collective"] = sec / calls * 1e6;
  }
}

// EP-style all_to_all: 16 floats per peer inside groups of `group` consecutive ranks (split), 100 calls.
void BM_a2a(benchmark::State& st) {
  const int n = static_cast<int>(st.range(0)), group = static_cast<int>(st.range(1));
  const int calls = 100;
  for (auto _ : st) {
    double sec = 0;
    emu::spawn(n, [&](emu::RankContext& ctx) {
      auto g = ctx.world().split(ctx.rank() / group, ctx.rank(), "ep");
      std::vector<float> s(static_cast<size_t>(group) * 16, 1.f), d(s.size());
      g->all_to_all(s.data(), d.data(), 16, DataType::f32);
      const auto t0 = Clock::now();
      for (int i = 0; i < calls; ++i) g->all_to_all(s.data(), d.data(), 16, DataType::f32);
      if (ctx.rank() == 0) sec = std::chrono::duration<double>(Clock::now() - t0).count();
    });
    st.SetIterationTime(sec);
    g_a2a.push_back({n, group, sec / calls * 1e6});
    st.counters["us_per_all_to_all"] = sec / calls * 1e6;
  }
}

BENCHMARK(BM_memcpy)->Arg(16)->Arg(256)->UseManualTime()->Iterations(20)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_coll)
    ->ArgsProduct({{AG, RS, AR, A2A}, {8, 64}})
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_a2a)->Args({64, 64})->Args({256, 64})->Args({1024, 64})->Args({1024, 256})->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_tiny)->Args({8, 1})->Args({64, 1})->Args({1024, 1})->Args({1024, 0})->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  trident::bench::Reporter rep(argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks(&rep);
  benchmark::Shutdown();
  std::printf("\nsingle-thread memcpy, best of 20: 16 MiB %.2f GB/s (baseline), 256 MiB %.2f GB/s (DRAM, context)\n",
              g_memcpy_bw / 1e9, g_memcpy_dram_bw / 1e9);
  std::printf("%-15s %5s %9s %11s %11s %13s %15s %15s\n", "collective", "ranks", "time ms", "algbw GB/s",
              "busbw GB/s", "busbw/memcpy", "n*busbw/memcpy", "n*busbw/DRAMcp");
  for (const auto& r : g_rows)
    std::printf("%-15s %5d %9.2f %11.3f %11.3f %12.1f%% %14.1f%% %14.1f%%\n", r.op.c_str(), r.n, r.sec * 1e3,
                r.algbw / 1e9, r.busbw / 1e9, 100 * r.busbw / g_memcpy_bw, 100 * r.n * r.busbw / g_memcpy_bw,
                100 * r.n * r.busbw / g_memcpy_dram_bw);
  std::printf("\ntiny all_reduce (1 float), 1,000 calls:\n");
  for (const auto& t : g_tiny)
    std::printf("  %5d ranks, trace %-3s: %9.1f us per collective (%.2f s total)\n", t.n, t.trace ? "on" : "off", t.us,
                t.us * 1e-3);
  std::printf("\nall_to_all (16 floats per peer) inside groups, 100 calls (all groups at once):\n");
  for (const auto& a : g_a2a)
    std::printf("  %5d ranks, groups of %4d: %9.1f us per all_to_all\n", a.n, a.group, a.us);
  return 0;
}
