// Shared by the ref tier's tests (host and GPU): every op of the kernel set recomputed from every case of the
// checked-in primitive goldens (golden/data/primitives: tiny, tiny-gqa, tiny-e64, tiny-dsa, tiny-packed; fp32 and
// fp64 kernel sets) and compared bitwise; each failing case is a test failure with its repro line. Returns the
// cases checked per op.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "golden/primitives/primitives.h"
#include "tests/gpu/golden_dir.h"

namespace trident::reftest {

inline std::map<std::string, int64_t> check_goldens_bitwise(const std::string& backend,
                                                            const golden::KernelsFactory<float>& f32,
                                                            const golden::KernelsFactory<double>& f64,
                                                            Device* device = nullptr) {
  std::map<std::string, int64_t> cases;
  // $TRIDENT_GOLDEN_PRESETS (a comma list) narrows the presets, e.g. to `tiny` under compute-sanitizer
  // (scripts/device-check); the check that every op was covered then does not apply.
  std::vector<std::string> presets = {"tiny", "tiny-gqa", "tiny-e64", "tiny-dsa", "tiny-packed"};
  const char* only = std::getenv("TRIDENT_GOLDEN_PRESETS");
  const bool all = !(only && *only);
  if (!all) {
    presets.clear();
    std::string l = only;
    for (size_t b = 0, e; b <= l.size(); b = e + 1) {
      e = l.find(',', b);
      if (e == std::string::npos) e = l.size();
      if (e > b) presets.push_back(l.substr(b, e - b));
    }
  }
  for (const std::string& preset : presets) {
    const std::string dir = gputest::golden_data_dir() + "/primitives/" + preset;
    const golden::PrimitivesFile f = golden::read_primitives(dir + "/primitives.h5");
    for (const std::string& op : golden::kernel_ops()) {
      golden::CheckOptions o;
      o.only_op = op;
      o.backend = backend;
      const golden::CheckSummary s32 = golden::check_primitives<float>(f, f32, o, dir, device);
      const golden::CheckSummary s64 = golden::check_primitives<double>(f, f64, o, dir, device);
      for (const auto* s : {&s32, &s64}) {
        for (const auto& fl : s->failures) ADD_FAILURE() << preset << ": " << fl.message << "\n  repro: " << fl.repro;
        EXPECT_EQ(s->passed, s->cases) << preset << " " << op;
        cases[op] += s->cases;
      }
    }
  }
  // Between them the checked-in goldens hold every op (tiny-packed: the document-mask ops; tiny-dsa: DSA's).
  for (const std::string& op : golden::kernel_ops()) {
    std::printf("  %-26s %4lld golden cases bitwise (%s)\n", op.c_str(), static_cast<long long>(cases[op]),
                backend.c_str());
    if (all) {
      EXPECT_GT(cases[op], 0) << op << ": no golden case checked it";
    }
  }
  return cases;
}

}  // namespace trident::reftest
