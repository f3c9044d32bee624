// Emulator bandwidth and latency (docs/emulator.md, "Measured numbers").
//  * Bus bandwidth, nccl-tests definitions: size S = the largest buffer of one rank (16 MiB here);
//    algbw = S / time; busbw = algbw * f, f = (n-1)/n for all_gather / reduce_scatter / all_to_all and
//    2(n-1)/n for all_reduce. The baseline is single-thread memcpy bandwidth (bytes copied / time), measured in
//    the same run. Since n fake ranks share this machine's cores, the printed table also shows the aggregate
//    bus bandwidth n * busbw (all ranks' traffic per second), which is what a machine with fewer cores than
//    ranks can be compared with.
//  * Latency: 1,000 tiny all_reduce at 1,024 ranks (rendezvous cost).
//  Every case runs with the ranks as fibers (the default) and as threads in the same run; the tables print the
//  ratio fibers / threads (the machine is noisy: only ratios from one run are comparable).
#include <benchmark/benchmark.h>
#include "bench/bench_reporter.h"

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "emulator/world.h"

namespace {

using namespace trident;
using Clock = std::chrono::steady_clock;
constexpr size_t kSize = size_t{16} << 20;  // bytes per rank (largest buffer)

double g_memcpy_bw = 0;       // bytes/s, 16 MiB (the baseline of the ratios)
double g_memcpy_dram_bw = 0;  // bytes/s, 256 MiB (does not fit in any cache; context only)
const char* exec_name(long e) { return e == 0 ? "fibers" : "threads"; }
emu::RankExec exec_of(long e) { return e == 0 ? emu::RankExec::fibers : emu::RankExec::threads; }
struct Row {
  std::string op;
  int n;
  long exec;
  double sec, algbw, busbw;
};
std::vector<Row> g_rows;
struct TinyRow {
  int n;
  bool trace;
  long exec;
  double us;
};
std::vector<TinyRow> g_tiny;
struct A2ARow {
  int n, group;
  long exec;
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
  const long ex = st.range(2);
  const int reps = n <= 8 ? 5 : 3;
  const size_t floats = kSize / 4, chunk = floats / static_cast<size_t>(n);
  for (auto _ : st) {
    double sec = 0;
    emu::SpawnOptions o;
    o.record_trace = false;
    o.exec = exec_of(ex);
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
    g_rows.push_back({op_name(op), n, ex, sec, algbw, algbw * f});
    st.counters["busbw_GBps"] = algbw * f / 1e9;
    st.counters["busbw_vs_memcpy"] = algbw * f / g_memcpy_bw;
    st.counters["aggregate_vs_memcpy"] = n * algbw * f / g_memcpy_bw;
  }
}

void BM_tiny(benchmark::State& st) {
  const int n = static_cast<int>(st.range(0));
  const bool trace = st.range(1) != 0;
  const long ex = st.range(2);
  const int calls = 1000;
  for (auto _ : st) {
    double sec = 0;
    emu::SpawnOptions o;
    o.record_trace = trace;
    o.exec = exec_of(ex);
    emu::spawn(n, [&](emu::RankContext& ctx) {
      float x = 1.f, y = 0.f;
      ctx.world().all_reduce(&x, &y, 1, DataType::f32, ReduceOp::sum);
      const auto t0 = Clock::now();
      for (int i = 0; i < calls; ++i) ctx.world().all_reduce(&x, &y, 1, DataType::f32, ReduceOp::sum);
      if (ctx.rank() == 0) sec = std::chrono::duration<double>(Clock::now() - t0).count();
    }, o);
    st.SetIterationTime(sec);
    g_tiny.push_back({n, trace, ex, sec / calls * 1e6});
    st.counters["us_per_collective"] = sec / calls * 1e6;
  }
}

// EP-style all_to_all: 16 floats per peer inside groups of `group` consecutive ranks (split), 100 calls.
void BM_a2a(benchmark::State& st) {
  const int n = static_cast<int>(st.range(0)), group = static_cast<int>(st.range(1));
  const long ex = st.range(2);
  const int calls = 100;
  for (auto _ : st) {
    double sec = 0;
    emu::SpawnOptions o;
    o.exec = exec_of(ex);
    emu::spawn(n, [&](emu::RankContext& ctx) {
      auto g = ctx.world().split(ctx.rank() / group, ctx.rank(), "ep");
      std::vector<float> s(static_cast<size_t>(group) * 16, 1.f), d(s.size());
      g->all_to_all(s.data(), d.data(), 16, DataType::f32);
      const auto t0 = Clock::now();
      for (int i = 0; i < calls; ++i) g->all_to_all(s.data(), d.data(), 16, DataType::f32);
      if (ctx.rank() == 0) sec = std::chrono::duration<double>(Clock::now() - t0).count();
    }, o);
    st.SetIterationTime(sec);
    g_a2a.push_back({n, group, ex, sec / calls * 1e6});
    st.counters["us_per_all_to_all"] = sec / calls * 1e6;
  }
}

BENCHMARK(BM_memcpy)->Arg(16)->Arg(256)->UseManualTime()->Iterations(20)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_coll)
    ->ArgsProduct({{AG, RS, AR, A2A}, {8, 64}, {0, 1}})
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_a2a)
    ->ArgsProduct({{64}, {64}, {0, 1}})
    ->ArgsProduct({{256}, {64}, {0, 1}})
    ->ArgsProduct({{1024}, {64, 256}, {0, 1}})
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_tiny)
    ->ArgsProduct({{8, 64, 1024}, {1}, {0, 1}})
    ->Args({1024, 0, 0})
    ->Args({1024, 0, 1})
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  trident::bench::Reporter rep(argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks(&rep);
  benchmark::Shutdown();
  std::printf("\nsingle-thread memcpy, best of 20: 16 MiB %.2f GB/s (baseline), 256 MiB %.2f GB/s (DRAM, context)\n",
              g_memcpy_bw / 1e9, g_memcpy_dram_bw / 1e9);
  std::printf("%-15s %5s %-8s %9s %11s %11s %13s %15s %15s %16s\n", "collective", "ranks", "ranks as", "time ms",
              "algbw GB/s", "busbw GB/s", "busbw/memcpy", "n*busbw/memcpy", "n*busbw/DRAMcp", "time fib/thr");
  auto time_of = [](const auto& rows, auto same) {
    for (const auto& o : rows)
      if (same(o)) return o.sec;
    return 0.0;
  };
  for (const auto& r : g_rows) {
    std::string ratio;
    if (r.exec == 0) {
      const double thr = time_of(g_rows, [&](const Row& o) { return o.op == r.op && o.n == r.n && o.exec == 1; });
      if (thr > 0) ratio = fmt::format("{:.2f}", r.sec / thr);
    }
    std::printf("%-15s %5d %-8s %9.2f %11.3f %11.3f %12.1f%% %14.1f%% %14.1f%% %16s\n", r.op.c_str(), r.n,
                exec_name(r.exec), r.sec * 1e3, r.algbw / 1e9, r.busbw / 1e9, 100 * r.busbw / g_memcpy_bw,
                100 * r.n * r.busbw / g_memcpy_bw, 100 * r.n * r.busbw / g_memcpy_dram_bw, ratio.c_str());
  }
  std::printf("\ntiny all_reduce (1 float), 1,000 calls:\n");
  for (const auto& t : g_tiny) {
    std::string ratio;
    for (const auto& o : g_tiny)
      if (t.exec == 0 && o.exec == 1 && o.n == t.n && o.trace == t.trace && o.us > 0)
        ratio = fmt::format("  fibers/threads {:.3f} (threads/fibers {:.1f}x)", t.us / o.us, o.us / t.us);
    std::printf("  %5d ranks, trace %-3s, %-7s: %9.1f us per collective (%.2f s total)%s\n", t.n,
                t.trace ? "on" : "off", exec_name(t.exec), t.us, t.us * 1e-3, ratio.c_str());
  }
  std::printf("\nall_to_all (16 floats per peer) inside groups, 100 calls (all groups at once):\n");
  for (const auto& a : g_a2a) {
    std::string ratio;
    for (const auto& o : g_a2a)
      if (a.exec == 0 && o.exec == 1 && o.n == a.n && o.group == a.group && o.us > 0)
        ratio = fmt::format("  fibers/threads {:.3f}", a.us / o.us);
    std::printf("  %5d ranks, groups of %4d, %-7s: %9.1f us per all_to_all%s\n", a.n, a.group, exec_name(a.exec),
                a.us, ratio.c_str());
  }
  return 0;
}
