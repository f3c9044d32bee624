// The fast tier's golden check (gpu/fast/check.h).
#include "gpu/fast/check.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "emulator/device.h"
#include "gpu/fast/kernels_impl.h"
#include "reference/bf16.h"
#include "reference/check.h"

namespace trident::gpu::fast {

bool is_fast_op(std::string_view op) {
  for (const char* o : kFastOps)
    if (op == o) return true;
  return false;
}

nlohmann::json FastCheckSummary::to_json() const {
  nlohmann::json j = sum.to_json();
  nlohmann::json ops_j = nlohmann::json::object();
  for (const auto& [op, s] : ops) {
    auto num = [](double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json("inf"); };
    ops_j[op] = {{"cases", s.cases},
                 {"passed", s.passed},
                 {"mode", s.tolerance ? "tolerance" : "bitwise"},
                 {"max_err_over_bound", num(s.max_err_over_bound)},
                 {"max_rel_vs_fp64", num(s.max_rel)},
                 {"rel_outputs", s.rel_outputs}};
  }
  j["per_op"] = ops_j;
  return j;
}

template <class T>
FastCheckSummary check_fast_primitives(const golden::PrimitivesFile& f, const golden::KernelsFactory<T>& factory,
                                       const golden::CheckOptions& opt, const std::string& golden_path,
                                       Device* device) {
  FastCheckSummary out;
  golden::CheckOptions o = opt;
  o.bitwise = false;
  out.sum = golden::check_primitives<T>(f, factory, o, golden_path, device);
  for (const auto& [key, s] : out.sum.report) {
    OpStat& st = out.ops[key.first];
    st.cases = std::max(st.cases, s.cases);
    st.tolerance |= s.rule.find("bound") != std::string::npos || s.rule.find("sum_abs") != std::string::npos;
    const bool bits = s.rule == "exact" || s.rule == "bitwise";
    st.max_err_over_bound = std::max(st.max_err_over_bound, bits ? (s.worst_ratio > 0 ? INFINITY : 0.0) : s.worst_ratio);
    if (s.worst_rel >= 0) st.max_rel = std::max(st.max_rel, s.worst_rel), st.rel_outputs += s.cases;
  }
  for (auto& [op, st] : out.ops) {
    int64_t failed = 0;
    for (const golden::CaseFailure& fl : out.sum.failures) failed += fl.op == op ? 1 : 0;
    st.passed = st.cases - failed;
  }
  return out;
}

template FastCheckSummary check_fast_primitives<float>(const golden::PrimitivesFile&,
                                                       const golden::KernelsFactory<float>&,
                                                       const golden::CheckOptions&, const std::string&, Device*);
template FastCheckSummary check_fast_primitives<double>(const golden::PrimitivesFile&,
                                                        const golden::KernelsFactory<double>&,
                                                        const golden::CheckOptions&, const std::string&, Device*);

}  // namespace trident::gpu::fast
