// The library call: read a primitive golden, look at a case through the xtensor views, and check every case with
// ExampleKernels (golden::check_primitives, the checker `trident check` runs).
//
//   check_kernels GOLDEN [--tolerance] [--op OP]
//
// Exit 0 when every checked case passes, 1 with a FAIL and a repro line per failing case, 2 on bad input.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <xtensor/xarray.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xview.hpp>

#include "example_kernels.h"
#include "golden/primitives/primitives.h"
#include "golden/primitives/xview.h"

namespace golden = trident::golden;
namespace xv = trident::golden::xview;

namespace {

// The first f32 mm case seen through the xtensor views: its tensors' shapes and dtypes, and C against A @ op(B)
// summed in fp64 here, relative to the stored sum of |terms|.
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
    double worst = 0;
    for (const golden::NamedTensor& t : c.sum_abs)
      if (t.name == "C") {
        const auto S = xt::view(xv::view<float>(t), xt::all(), xt::range(0, N));
        worst = xt::amax(xt::abs(xt::cast<double>(Cv) - ref) / xt::maximum(xt::cast<double>(S), 1e-30))();
      }
    std::printf("xview: mm/%s max |C - A@B in fp64| / sum|terms| = %.3g (u = 2^-24 = 5.96e-08)\n", c.name.c_str(),
                worst);
    return;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string path, op;
  bool tolerance = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--tolerance")) tolerance = true;
    else if (!std::strcmp(argv[i], "--op") && i + 1 < argc) op = argv[++i];
    else if (argv[i][0] != '-' && path.empty()) path = argv[i];
    else {
      std::fprintf(stderr, "usage: check_kernels GOLDEN [--tolerance] [--op OP]\n");
      return 2;
    }
  }
  if (path.empty()) {
    std::fprintf(stderr, "usage: check_kernels GOLDEN [--tolerance] [--op OP]\n");
    return 2;
  }
  try {
    const std::string file = path + "/primitives.h5";
    const golden::PrimitivesFile f = golden::read_primitives(file);
    golden::validate_cases(f);
    show_mm_case(f);

    golden::CheckOptions co;
    co.bitwise = !tolerance;
    co.only_op = op;
    // Named in the repro lines: `trident check` with the plugin built from the same sources.
    co.backend = std::string("plugin:") + EXAMPLE_PLUGIN_PATH + (tolerance ? " --tolerance" : "");
    golden::CheckSummary sum;
    for (const golden::CheckSummary& part :
         {golden::check_primitives<float>(
              f, [](trident::Device& d) { return std::make_unique<example::ExampleKernels<float>>(d); }, co, path),
          golden::check_primitives<double>(
              f, [](trident::Device& d) { return std::make_unique<example::ExampleKernels<double>>(d); }, co,
              path)}) {
      sum.cases += part.cases;
      sum.passed += part.passed;
      sum.failures.insert(sum.failures.end(), part.failures.begin(), part.failures.end());
      sum.ops_checked.insert(sum.ops_checked.end(), part.ops_checked.begin(), part.ops_checked.end());
    }
    if (sum.cases == 0) {
      std::fprintf(stderr, "check_kernels: error: %s: no case matches\n", path.c_str());
      return 2;
    }
    for (const golden::CaseFailure& fl : sum.failures) {
      std::printf("FAIL %s\n", fl.message.c_str());
      std::printf("  repro: %s\n", fl.repro.c_str());
    }
    std::printf("check_kernels %s: %lld/%lld cases of %zu ops passed with ExampleKernels (%s)\n", path.c_str(),
                static_cast<long long>(sum.passed), static_cast<long long>(sum.cases), sum.ops_checked.size(),
                tolerance ? "stored bounds where the golden has them, else bitwise" : "bitwise");
    return sum.failures.empty() ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "check_kernels: error: %s\n", e.what());
    return 2;
  }
}
