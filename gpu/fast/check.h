// `trident check --backend cuda-fast-host|cuda-fast` (docs/gpu.md "cuda-fast"): every case of a primitive golden
// recomputed with the fast tier and judged by the rule the golden stores (golden/primitives/accept.h: per element
// |fast - oracle| <= bound and the relative test against the fp64 oracle), the rule every outside kernel meets. Per
// op: the largest |err| / bound and the largest relative-test ratio.
#pragma once
#include <map>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "golden/primitives/primitives.h"
#include "golden/primitives/accept.h"

namespace trident::gpu::fast {

bool is_fast_op(std::string_view op);

struct OpStat {
  int64_t cases = 0, passed = 0;
  bool tolerance = false;          // some output has the bound rule; else bits (exact or no rule)
  double max_err_over_bound = 0;   // max over elements of |fast - oracle| / bound (bits: 0, or inf on a diff)
  double max_rel = 0;              // max over outputs of rms(fast - oracle) / (c rms(ref - oracle) + floor)
  int64_t rel_outputs = 0;         // outputs the relative test ran on
};
struct FastCheckSummary {
  golden::CheckSummary sum;
  std::map<std::string, OpStat> ops;
  nlohmann::json to_json() const;
};

template <class T>
FastCheckSummary check_fast_primitives(const golden::PrimitivesFile& f, const golden::KernelsFactory<T>& factory,
                                       const golden::CheckOptions& opt, const std::string& golden_path,
                                       Device* device = nullptr);

}  // namespace trident::gpu::fast
