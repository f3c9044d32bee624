// `trident check --backend cuda-fast-host|cuda-fast` (docs/gpu.md "cuda-fast"): every case of a primitive golden
// recomputed with the fast tier. The fast tier's own ops (kFastOps) are compared with the reference's outputs under
// the tolerance table's "gpu" rows (per element |fast - ref| <= bound, gpu/fast/bounds.h) and, for fp32 kernel sets,
// the relative test against an fp64 evaluation (rms(fast - oracle) <= c * rms(ref - oracle) + floor, row
// fast_vs_fp64); every other op must give the reference's bits (it runs the ref tier's bodies). Per op: the largest
// |err| / bound and the largest relative-test ratio.
#pragma once
#include <map>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "golden/primitives/primitives.h"
#include "gpu/fast/bounds.h"

namespace trident::gpu::fast {

bool is_fast_op(std::string_view op);

struct OpStat {
  int64_t cases = 0, passed = 0;
  bool tolerance = false;          // checked with bounds (a fast op); else bitwise
  double max_err_over_bound = 0;   // max over elements of |fast - ref| / bound (bitwise ops: 0, or inf on a diff)
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

// The per-element bounds of one case of a fast op, by output name (fp64, from the case's inputs).
std::map<std::string, ElemBounds> case_bounds(const golden::PrimCase& c);

}  // namespace trident::gpu::fast
