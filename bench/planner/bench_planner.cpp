// Planner throughput: how many meshes per second the search evaluates on one core.
// The issue's reference point is Calculon (a Python analytic model, ~500 configurations/s); the same-run
// baseline is the naive path a script would take per mesh: build the JSON config, parse and validate it,
// evaluate, and render the JSON result.
#include <benchmark/benchmark.h>
#include "bench/bench_reporter.h"

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "planner/config.h"
#include "planner/plan.h"
#include "planner/report.h"

using namespace trident::planner;
using trident::MeshShape;

namespace {

// Seed 000's NVL72 case without a mesh (the search decides it).
nlohmann::json base_config() {
  return nlohmann::json::parse(R"({
    "model":    {"params": 753e9, "layers": 78, "hidden": 6144, "experts": 256, "top_k": 8,
                 "dense_fraction": 0.02, "sparse_index_layers": 21, "sparse_topk": 2048,
                 "kv_latent_bytes_per_token": 1408},
    "cluster":  {"gpu_memory_gb": 200, "nvl": 72, "rdma_GBps": 45, "peak_tflops": 2500, "mfu": 0.8},
    "workload": {"context": 1048576, "recompute_bwd_mb_per_token": 2.5, "attn_to_linear": 2}})");
}
const PlanInput& input() {
  static const PlanInput in = parse_config(base_config(), "bench");
  return in;
}
std::vector<MeshShape> valid_meshes(int64_t world) {
  std::vector<MeshShape> out;
  for (int64_t cp = 1; cp <= world; ++cp)
    for (int64_t fsdp = 1; fsdp * cp <= world; ++fsdp)
      for (int64_t ep = 1; ep <= world; ++ep)
        if (world % (cp * fsdp) == 0 && world % ep == 0) {
          MeshShape m{world / (cp * fsdp), fsdp, cp, world / ep, ep};
          if (check_mesh(input(), m).ranked()) out.push_back(m);
        }
  return out;
}

// check_mesh + evaluate over the world-256 meshes: the inner kernel of the search.
void BM_evaluate(benchmark::State& st) {
  const PlanInput& in = input();
  const std::vector<MeshShape> meshes = valid_meshes(256);
  int64_t n = 0;
  for (auto _ : st) {
    for (const MeshShape& m : meshes) {
      const MeshCheck c = check_mesh(in, m);
      Plan p = evaluate(in, m, c);
      benchmark::DoNotOptimize(p);
    }
    n += int64_t(meshes.size());
  }
  st.SetItemsProcessed(n);
}

// The search as run: enumerate every factorisation, apply the rules, evaluate, keep the best (world 256).
void BM_search_count(benchmark::State& st) {
  const PlanInput& in = input();
  int64_t n = 0;
  for (auto _ : st) {
    Candidate best;
    n += search_count(in, st.range(0), &best);
    benchmark::DoNotOptimize(best);
  }
  st.SetItemsProcessed(n);
}

// The ranked search `trident plan --search` prints (world range, kept candidates sorted by the objective).
void BM_search_ranked(benchmark::State& st) {
  const PlanInput& in = input();
  int64_t n = 0;
  for (auto _ : st) {
    SearchResult r = search(in, st.range(0), st.range(1));
    int64_t rej = 0;
    for (int64_t x : r.rejected) rej += x;
    n += r.considered - rej;  // meshes evaluated (those the search drops are only checked)
    benchmark::DoNotOptimize(r);
  }
  st.SetItemsProcessed(n);
}

// Same-run baseline: JSON config in, validate, evaluate, JSON out, per mesh.
void BM_naive_json(benchmark::State& st) {
  const std::vector<MeshShape> meshes = valid_meshes(256);
  nlohmann::json cfg = base_config();
  int64_t n = 0;
  for (auto _ : st) {
    for (const MeshShape& m : meshes) {
      cfg["mesh"] = {{"d_rep", m.d_rep}, {"fsdp", m.fsdp}, {"cp", m.cp}, {"e_fsdp", m.e_fsdp}, {"ep", m.ep}};
      const PlanInput in = parse_config(nlohmann::json::parse(cfg.dump()), "bench");
      const MeshCheck c = check_mesh(in, *in.mesh);
      std::string out = plan_json(in, *in.mesh, c, evaluate(in, *in.mesh, c)).dump();
      benchmark::DoNotOptimize(out);
    }
    n += int64_t(meshes.size());
  }
  st.SetItemsProcessed(n);
}

class Capture : public trident::bench::Reporter {
 public:
  using Reporter::Reporter;
  std::map<std::string, double> rate;
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& r : runs) {
      auto it = r.counters.find("items_per_second");
      if (it != r.counters.end()) rate[r.benchmark_name()] = it->second.value;
    }
    Reporter::ReportRuns(runs);
  }
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::RegisterBenchmark("evaluate", BM_evaluate);
  benchmark::RegisterBenchmark("search_count", BM_search_count)->Arg(256);
  benchmark::RegisterBenchmark("search_ranked", BM_search_ranked)->Args({256, 256})->Args({1, 1024});
  benchmark::RegisterBenchmark("naive_json", BM_naive_json);
  Capture rep(argc, argv);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks(&rep);
  const double calculon = 500.0;  // configurations/s (the issue's figure for Calculon)
  const double naive = rep.rate["naive_json"];
  std::printf("\nMesh evaluations per second, one core (target >= 1,000,000/s; Calculon ~500/s)\n");
  for (const auto& [name, r] : rep.rate)
    std::printf("  %-26s %14.0f /s   x%9.0f vs Calculon 500/s   x%7.1f vs naive JSON path (same run)\n",
                name.c_str(), r, r / calculon, naive > 0 ? r / naive : 0.0);
  return 0;
}
