// The library call: read a primitive golden, look at a case through the xtensor views, and check every case with
// ExampleKernels (golden::check_primitives, the checker `trident check` runs).
//
//   check_kernels GOLDEN [--bitwise] [--op OP]
//
// A kernel set written outside this tree does not promise the reference's bits, so by default every output is
// judged by the golden's acceptance rule (docs/golden.md "The acceptance rule": the stored fp64 oracle and
// per-element bound where the golden has them, bits for exact outputs and outputs without a derived rule), as
// `trident check --backend plugin:...` judges it; the per-(op, output) report table is printed. --bitwise compares
// every output bit for bit. --tolerance is accepted as an alias of the default (trident check's flag that forces
// the rule); with --bitwise it is an error.
//
// Exit 0 when every checked case passes, 1 with a FAIL and a repro line per failing case, 2 on bad input.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <xtensor/xarray.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xview.hpp>

#include "example_kernels.h"
#include "golden/primitives/accept.h"
#include "golden/primitives/primitives.h"
#include "golden/primitives/xview.h"

namespace golden = trident::golden;
namespace xv = trident::golden::xview;

namespace {

// The first f32 mm case seen through the xtensor views: its tensors' shapes and dtypes, and C against A @ op(B)
// summed in fp64 here, relative to the stored sum of |terms| (where the golden has it); and C against the acceptance
// rule's stored fp64 oracle, relative to its per-element bound (the rule's first test).
void show_mm_case(const golden::PrimitivesFile& f) {
  for (const golden::PrimCase& c : f.cases) {
    if (c.op != "mm" || c.dtype != "f32") continue;
    for (const auto* list : {&c.inputs, &c.outputs})
      for (const golden::NamedTensor& t : *list)
        xv::visit(t, [&](const auto& v) {
          std::string shape;
          for (size_t d : v.shape()) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
          std::printf("xview: mm/%s %-6s %s [%s]\n", c.name.c_str(), t.name.c_str(), t.dtype.c_str(), shape.c_str());
        });
    const auto M = c.shapes.at("M").get<size_t>(), N = c.shapes.at("N").get<size_t>(),
               K = c.shapes.at("K").get<size_t>();
    const bool trans_b = c.shapes.at("trans_b").get<bool>();
    const auto A = xv::input<float>(c, "A");
    const auto B = xv::input<float>(c, "B");
    const auto C = xv::output<float>(c, "C");
    xt::xarray<double> ref = xt::zeros<double>({M, N});
    for (size_t i = 0; i < M; ++i)
      for (size_t j = 0; j < N; ++j)
        for (size_t k = 0; k < K; ++k)
          ref(i, j) += double(A(i, k)) * double(trans_b ? B(j, k) : B(k, j));
    const auto Cv = xt::view(C, xt::all(), xt::range(0, N));
    for (const golden::NamedTensor& t : c.sum_abs)  // the sum of |terms| (the older error bound's data), if stored
      if (t.name == "C") {
        const auto S = xt::view(xv::view<float>(t), xt::all(), xt::range(0, N));
        const double worst =
            xt::amax(xt::abs(xt::cast<double>(Cv) - ref) / xt::maximum(xt::cast<double>(S), 1e-30))();
        std::printf("xview: mm/%s max |C - A@B in fp64| / sum|terms| = %.3g (u = 2^-24 = 5.96e-08)\n",
                    c.name.c_str(), worst);
      }
    // The acceptance rule's data for C: the fp64 oracle and the per-element bound (f64, C's device shape).
    const golden::NamedTensor *oracle = nullptr, *bound = nullptr;
    for (const golden::NamedTensor& t : c.oracle)
      if (t.name == "C") oracle = &t;
    for (const golden::NamedTensor& t : c.bound)
      if (t.name == "C") bound = &t;
    if (oracle && bound) {
      const auto O = xt::view(xv::view<double>(*oracle), xt::all(), xt::range(0, N));
      const auto E = xt::view(xv::view<double>(*bound), xt::all(), xt::range(0, N));
      const double r = xt::amax(xt::abs(xt::cast<double>(Cv) - O) / xt::maximum(E, 1e-300))();
      std::printf("xview: mm/%s max |C - oracle| / bound = %.3g (policy %s)\n", c.name.c_str(), r,
                  c.policy.c_str());
    }
    return;
  }
}

// Adds one dtype's summary to the whole check's.
void merge(golden::CheckSummary& sum, const golden::CheckSummary& part) {
  sum.cases += part.cases;
  sum.passed += part.passed;
  sum.failures.insert(sum.failures.end(), part.failures.begin(), part.failures.end());
  sum.ops_checked.insert(sum.ops_checked.end(), part.ops_checked.begin(), part.ops_checked.end());
  for (const auto& [key, s] : part.report) {
    golden::OutputStat& r = sum.report[key];
    if (r.cases == 0) r.rule = s.rule;
    r.cases += s.cases;
    r.passed += s.passed;
    r.worst_ratio = std::max(r.worst_ratio, s.worst_ratio);
    r.worst_rel = std::max(r.worst_rel, s.worst_rel);
  }
}

int usage() {
  std::fprintf(stderr, "usage: check_kernels GOLDEN [--bitwise] [--op OP]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path, op;
  bool bitwise = false, tolerance = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--bitwise")) bitwise = true;
    else if (!std::strcmp(argv[i], "--tolerance")) tolerance = true;  // the default; kept as trident check's flag
    else if (!std::strcmp(argv[i], "--op") && i + 1 < argc) op = argv[++i];
    else if (argv[i][0] != '-' && path.empty()) path = argv[i];
    else return usage();
  }
  if (path.empty()) return usage();
  if (bitwise && tolerance) {
    std::fprintf(stderr, "check_kernels: error: --tolerance and --bitwise: choose one\n");
    return 2;
  }
  try {
    const std::string file = path + "/primitives.h5";
    const golden::PrimitivesFile f = golden::read_primitives(file);
    golden::validate_cases(f);
    show_mm_case(f);

    golden::CheckOptions co;
    co.bitwise = bitwise;  // else the golden's acceptance rule, as trident check judges a plugin
    co.only_op = op;
    // Named in the repro lines: `trident check` with the plugin built from the same sources (the rule is its default
    // for a plugin too).
    co.backend = std::string("plugin:") + EXAMPLE_PLUGIN_PATH + (bitwise ? " --bitwise" : "");
    golden::CheckSummary sum;
    merge(sum, golden::check_primitives<float>(
                   f, [](trident::Device& d) { return std::make_unique<example::ExampleKernels<float>>(d); }, co,
                   path));
    merge(sum, golden::check_primitives<double>(
                   f, [](trident::Device& d) { return std::make_unique<example::ExampleKernels<double>>(d); }, co,
                   path));
    if (sum.cases == 0) {
      std::fprintf(stderr, "check_kernels: error: %s: no case matches\n", path.c_str());
      return 2;
    }
    if (!bitwise) std::printf("%s", golden::report_text(sum.report).c_str());
    for (const golden::CaseFailure& fl : sum.failures) {
      std::printf("FAIL %s\n", fl.message.c_str());
      std::printf("  repro: %s\n", fl.repro.c_str());
    }
    std::printf("check_kernels %s: %lld/%lld cases of %zu ops passed with ExampleKernels (%s)\n", path.c_str(),
                static_cast<long long>(sum.passed), static_cast<long long>(sum.cases), sum.ops_checked.size(),
                bitwise ? "bitwise" : "the golden's acceptance rule: derived bounds where stored, else bits");
    return sum.failures.empty() ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "check_kernels: error: %s\n", e.what());
    return 2;
  }
}
