// Throughput of `trident fuzz` in layouts per minute (docs/fuzz.md section 6): for each preset, draws and checks
// layouts (fuzz/layout.h, fuzz/check.h: every property, as the command does) for --seconds, and prints the layouts
// per minute and where the time went. Usage: bench_fuzz [--seconds S | --cases N] [--max-world W] [--seed N]
// [PRESET...] (default: 60 s of tiny, max-world 8). --cases N: exactly the first N layouts of the seed (the same
// layouts on every run: the way to compare two builds).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz/check.h"
#include "fuzz/layout.h"

using namespace trident;

int main(int argc, char** argv) {
  fuzz::keep_freed_memory();  // as `trident fuzz` does
  double seconds = 60;
  int64_t max_cases = 0;  // > 0: exactly this many layouts, however long they take
  int64_t max_world = 8;
  uint64_t seed = 1;
  std::vector<std::string> presets;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc) seconds = std::atof(argv[++i]);
    else if (a == "--cases" && i + 1 < argc) max_cases = std::atoll(argv[++i]);
    else if (a == "--max-world" && i + 1 < argc) max_world = std::atoll(argv[++i]);
    else if (a == "--seed" && i + 1 < argc) seed = std::strtoull(argv[++i], nullptr, 10);
    else if (a.starts_with("--")) {
      std::fprintf(stderr, "usage: bench_fuzz [--seconds S | --cases N] [--max-world W] [--seed N] [PRESET...]\n");
      return 2;
    } else presets.push_back(a);
  }
  if (presets.empty()) presets = {"tiny"};
  std::printf("%-10s %9s %6s %9s %9s %12s  %s\n", "preset", "max-world", "cases", "failures", "seconds",
              "layouts/min", "seconds per property");
  for (const std::string& p : presets) {
    fuzz::GenOptions g;
    g.models = {{model::Config::preset(p), p, ""}};
    g.max_world = max_world;
    int64_t cases = 0, failures = 0;
    double prop[fuzz::kNumProperties] = {};
    const auto t0 = std::chrono::steady_clock::now();
    auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    while (max_cases > 0 ? cases < max_cases : elapsed() < seconds) {
      fuzz::SeededChoices c(seed * 1000003 + static_cast<uint64_t>(cases));
      const fuzz::CaseResult r = fuzz::check_layout(fuzz::draw(c, g));
      ++cases;
      failures += r.ok ? 0 : 1;
      for (int k = 0; k < fuzz::kNumProperties; ++k) prop[k] += r.property_seconds[k];
    }
    const double s = elapsed();
    std::string parts;
    for (int k = 0; k < fuzz::kNumProperties; ++k)
      if (prop[k] >= 0.05)
        parts += std::string(parts.empty() ? "" : ", ") + fuzz::to_string(static_cast<fuzz::Property>(k)) + " " +
                 std::to_string(prop[k]).substr(0, std::to_string(prop[k]).find('.') + 2);
    std::printf("%-10s %9lld %6lld %9lld %9.1f %12.1f  %s\n", p.c_str(), static_cast<long long>(max_world),
                static_cast<long long>(cases), static_cast<long long>(failures), s, cases * 60.0 / s, parts.c_str());
    std::fflush(stdout);
  }
  return 0;
}
