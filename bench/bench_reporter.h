// The console reporter of every Google Benchmark binary in bench/ (derive from it to capture results).
//  - No "***WARNING*** Library was built as DEBUG" line: libbenchmark prints it whenever the library itself was
//    compiled without NDEBUG (Debian's libbenchmark1 is), which says nothing about the code measured here: the
//    benchmarks build with the project's release flags. The rest of the context (CPU, caches, load) is kept.
//  - Colour codes only when asked: --benchmark_color=auto (the default) colours only a terminal, =true/false force
//    it. (A ConsoleReporter constructed in code colours by default even into a file or a pipe.)
// Use: `trident::bench::Reporter rep(argc, argv);` before benchmark::Initialize, then RunSpecifiedBenchmarks(&rep).
#pragma once
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>

namespace trident::bench {

// The colour choice of the command line (--benchmark_color=X, default auto) for this process's stdout.
inline bool want_color(int argc, char** argv) {
  std::string v = "auto";
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--benchmark_color=", 18) == 0) v = argv[i] + 18;
  if (v == "auto") {
    const char* term = std::getenv("TERM");
    return isatty(STDOUT_FILENO) && term && std::strcmp(term, "dumb") != 0;
  }
  return v == "true" || v == "yes" || v == "1" || v == "on";
}

class Reporter : public benchmark::ConsoleReporter {
 public:
  Reporter(int argc, char** argv)
      : benchmark::ConsoleReporter(want_color(argc, argv) ? OO_ColorTabular : OO_Tabular) {}

  bool ReportContext(const Context& context) override {
    std::ostream& err = GetErrorStream();
    std::ostringstream ctx;
    SetErrorStream(&ctx);
    const bool ok = benchmark::ConsoleReporter::ReportContext(context);
    SetErrorStream(&err);
    std::istringstream lines(ctx.str());
    for (std::string l; std::getline(lines, l);)
      if (l.find("Library was built as DEBUG") == std::string::npos) err << l << "\n";
    // What matters for the timings is how this binary was compiled (the release preset: -O2, asserts on).
#ifdef __OPTIMIZE__
    err << "benchmark binary: optimised build";
#else
    err << "***WARNING*** benchmark binary built without optimisation: timings are not meaningful";
#endif
#ifdef NDEBUG
    err << ", asserts off\n";
#else
    err << ", asserts on\n";
#endif
    return ok;
  }
};

}  // namespace trident::bench
