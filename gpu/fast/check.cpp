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

namespace {

using golden::NamedTensor;
using golden::PrimCase;

const NamedTensor& input(const PrimCase& c, const std::string& name) {
  for (const NamedTensor& t : c.inputs)
    if (t.name == name) return t;
  fail(fmt::format("primitive case {}/{}: no input '{}'", c.op, c.name, name));
}
bool has_input(const PrimCase& c, const std::string& name) {
  return std::any_of(c.inputs.begin(), c.inputs.end(), [&](const NamedTensor& t) { return t.name == name; });
}
// The GEMM operands of an op: rounded to bf16 under the bf16 policy on both sides (and so in the bounds and the
// fp64 oracle).
bool is_operand(const std::string& op, const std::string& name) {
  if (op == "mm") return name == "A" || name == "B";
  if (op == "wgrad_acc") return name == "X" || name == "dY";
  if (op.rfind("linear_ce", 0) == 0) return name == "hidden" || name == "W";
  if (op.find("core_") != std::string::npos) return name == "q" || name == "kv";
  return false;
}
std::vector<double> values(const PrimCase& c, const std::string& name) {
  std::vector<double> v = golden::values_as_double(input(c, name));
  if (c.policy == "bf16" && is_operand(c.op, name))
    for (double& x : v) x = static_cast<double>(round_bf16(static_cast<float>(x)));
  return v;
}
std::vector<int64_t> ints64(const PrimCase& c, const std::string& name) {
  const NamedTensor& t = input(c, name);
  std::vector<int64_t> v(static_cast<size_t>(t.numel()));
  if (t.dtype != "i64") fail(fmt::format("primitive case {}/{}: input '{}' is not i64", c.op, c.name, name));
  if (!v.empty()) std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
  return v;
}
int64_t shape_i(const PrimCase& c, const char* k) { return c.shapes.at(k).get<int64_t>(); }
model::CoreDims core_dims(const PrimCase& c) {
  model::CoreDims cd;
  cd.H = shape_i(c, "H"), cd.G = shape_i(c, "G"), cd.Dq = shape_i(c, "Dq"), cd.Dv = shape_i(c, "Dv");
  cd.P = shape_i(c, "P"), cd.val_base = shape_i(c, "val_base");
  cd.scale = c.shapes.at("scale").get<double>();
  return cd;
}

// The case in fp64: every f32 input widened (GEMM operands of a bf16-policy case rounded to bf16 first), the policy
// fp64; its reference outputs are the oracle of the relative test.
PrimCase widened(const PrimCase& c) {
  PrimCase w = c;
  w.dtype = "f64";
  if (!w.policy.empty()) w.policy = "fp64";
  for (NamedTensor& t : w.inputs) {
    if (t.dtype != "f32") continue;
    const std::vector<double> v = values(c, t.name);
    t = golden::make_tensor(t.name, t.shape, std::span<const double>(v));
  }
  return w;
}

double rms_diff(const NamedTensor& a, const NamedTensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = golden::element_as_double(a, i) - golden::element_as_double(b, i);
    s += d * d;
  }
  return a.numel() > 0 ? std::sqrt(s / static_cast<double>(a.numel())) : 0.0;
}
double rms_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return v.empty() ? 0.0 : std::sqrt(s / static_cast<double>(v.size()));
}

}  // namespace

std::map<std::string, ElemBounds> case_bounds(const PrimCase& c) {
  std::map<std::string, ElemBounds> out;
  const bool bf = c.policy == "bf16";
  if (c.op == "mm") {
    const std::vector<double> A = values(c, "A"), B = values(c, "B");
    out.emplace("C", mm_bounds(shape_i(c, "M"), shape_i(c, "N"), shape_i(c, "K"), A.data(), shape_i(c, "lda"),
                               B.data(), shape_i(c, "ldb"), c.shapes.at("trans_b").get<bool>(), shape_i(c, "ldc")));
  } else if (c.op == "wgrad_acc") {
    const std::vector<double> X = values(c, "X"), dY = values(c, "dY");
    const std::vector<int64_t> segs = ints64(c, "segs");
    out.emplace("acc", wgrad_bounds(X.data(), shape_i(c, "ldx"), dY.data(), shape_i(c, "ldy"), shape_i(c, "K"),
                                    shape_i(c, "M"), segs));
  } else if (c.op == "attn_core_forward" || c.op == "attn_doc_core_forward") {
    const std::vector<double> q = values(c, "q"), kv = values(c, "kv");
    const std::vector<int64_t> qpos = ints64(c, "qpos");
    const std::vector<int64_t> qdoc = has_input(c, "qdoc") ? ints64(c, "qdoc") : std::vector<int64_t>{};
    AttnFwdBounds b = attn_forward_bounds(core_dims(c), bf, q.data(), qpos.data(), qdoc.empty() ? nullptr : qdoc.data(),
                                          shape_i(c, "Nq"), kv.data());
    out.emplace("o", std::move(b.o));
    out.emplace("stats", std::move(b.stats));
  } else if (c.op == "attn_core_backward" || c.op == "attn_doc_core_backward") {
    const std::vector<double> q = values(c, "q"), kv = values(c, "kv"), o = values(c, "o"),
                              st = values(c, "stats"), dO = values(c, "dO");
    const std::vector<int64_t> qpos = ints64(c, "qpos"), qsegs = ints64(c, "qsegs");
    const std::vector<int64_t> qdoc = has_input(c, "qdoc") ? ints64(c, "qdoc") : std::vector<int64_t>{};
    AttnBwdBounds b = attn_backward_bounds(core_dims(c), bf, q.data(), qpos.data(),
                                           qdoc.empty() ? nullptr : qdoc.data(), shape_i(c, "Nq"), kv.data(),
                                           shape_i(c, "S"), o.data(), st.data(), dO.data(), qsegs);
    out.emplace("dq", std::move(b.dq));
    out.emplace("dkv", std::move(b.dkv));
  } else if (c.op == "linear_ce_forward") {
    const std::vector<double> h = values(c, "hidden"), W = values(c, "W");
    const std::vector<int32_t> t = golden::values_i32(input(c, "targets"));
    CeFwdBounds b = linear_ce_forward_bounds(h.data(), W.data(), t.data(), shape_i(c, "N"), shape_i(c, "d"),
                                             shape_i(c, "V"), shape_i(c, "vocab_chunk"));
    out.emplace("token_loss", std::move(b.token_loss));
    out.emplace("lse", std::move(b.lse));
  } else if (c.op == "linear_ce_backward") {
    const std::vector<double> h = values(c, "hidden"), W = values(c, "W"), lse = values(c, "lse"),
                              dh = values(c, "dhidden");
    const std::vector<int32_t> t = golden::values_i32(input(c, "targets"));
    const std::vector<int64_t> segs = ints64(c, "segs");
    CeBwdBounds b = linear_ce_backward_bounds(bf, h.data(), W.data(), t.data(), lse.data(), shape_i(c, "N"),
                                              shape_i(c, "d"), shape_i(c, "V"), c.shapes.at("grad_scale").get<double>(),
                                              segs, shape_i(c, "j_begin"), shape_i(c, "j_end"), dh.data());
    out.emplace("dhidden", std::move(b.dhidden));
    out.emplace("dW", std::move(b.dW));
  }
  return out;
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
  golden::CheckSummary& sum = out.sum;
  RankTrace trace;
  emu::EmuDevice emu_dev(0, trace, emu::DeviceOptions{.record_trace = false});
  Device& dev = device ? *device : emu_dev;
  std::unique_ptr<Kernels<T>> k = factory(dev);
  const std::string want_dtype = sizeof(T) == 8 ? "f64" : "f32", acc = sizeof(T) == 8 ? "fp64" : "fp32";
  const Tolerance& rel = tolerance("fast_vs_fp64", "fp32", "gpu");
  for (const PrimCase& c : f.cases) {
    if (!golden::case_selected(c, opt, want_dtype, sum)) continue;
    OpStat& st = out.ops[c.op];
    ++st.cases;
    st.tolerance = is_fast_op(c.op);
    golden::CaseFailure fl = golden::case_failure(c, opt, golden_path);
    std::vector<NamedTensor> got;
    if (!golden::run_checked<T>(c, *k, dev, fl, sum, got)) continue;
    std::map<std::string, ElemBounds> bounds;
    std::vector<NamedTensor> oracle;
    if (st.tolerance) {
      bounds = case_bounds(c);
      if (sizeof(T) == 4) oracle = golden::reference_outputs<double>(widened(c));
    }
    bool ok = true;
    for (const NamedTensor& want : c.outputs) {
      const NamedTensor* it = golden::matching_output(got, want, c, fl);
      if (!it) {
        ok = false;
        break;
      }
      const auto b = bounds.find(want.name);
      const int64_t n = want.numel();
      int64_t bad = -1;
      double worst = 0, bound_at = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double x = golden::element_as_double(*it, i), y = golden::element_as_double(want, i);
        if (std::memcmp(it->bytes.data() + i * sizeof(T), want.bytes.data() + i * sizeof(T), sizeof(T)) == 0 ||
            (std::isnan(x) && std::isnan(y)))
          continue;
        if (b == bounds.end()) {  // bitwise op
          bad = i, worst = std::numeric_limits<double>::infinity();
          break;
        }
        const double bound = b->second.bound(i, acc), err = std::fabs(x - y);
        const double ratio = bound > 0 ? err / bound : std::numeric_limits<double>::infinity();
        st.max_err_over_bound = std::max(st.max_err_over_bound, std::isnan(ratio) ? INFINITY : ratio);
        if (!(err <= bound) && (bad < 0 || ratio > worst || std::isnan(ratio))) bad = i, worst = ratio, bound_at = bound;
      }
      if (b == bounds.end() && bad >= 0) st.max_err_over_bound = std::numeric_limits<double>::infinity();
      if (bad >= 0) {
        fl.index = bad;
        fl.got = golden::element_as_double(*it, bad);
        fl.want = golden::element_as_double(want, bad);
        fl.bound = bound_at;
        fl.message = b == bounds.end()
                          ? fmt::format("{}/{} (rank {}): output '{}' differs at element {}: got {}, golden {} "
                                        "(bitwise: the fast tier runs the ref tier's body for this op)",
                                        c.op, c.name, c.rank, want.name, bad, fl.got, fl.want)
                          : fmt::format("{}/{} (rank {}): output '{}' element {}: got {}, golden {}, |err| {:.3g} > "
                                        "bound {:.3g} ({}/gpu rows)",
                                        c.op, c.name, c.rank, want.name, bad, fl.got, fl.want,
                                        std::fabs(fl.got - fl.want), bound_at, b->second.primitive);
        ok = false;
        break;
      }
      // The relative test against the fp64 oracle (fp32 kernel sets).
      if (b != bounds.end() && !oracle.empty()) {
        auto o = std::find_if(oracle.begin(), oracle.end(), [&](const NamedTensor& t) { return t.name == want.name; });
        if (o == oracle.end()) continue;
        const double ef = rms_diff(*it, *o), er = rms_diff(want, *o);
        // floor: k_per_term roundings of the terms' magnitude (the scale rounding errors live at; the output's own
        // value is no scale under cancellation), in fp32's u and, for the bf16 roundings inside the op, bf16's
        const double floor = rel.k_per_term * (unit_roundoff("fp32") * rms_of(b->second.sum_abs) +
                                               unit_roundoff("bf16") * rms_of(b->second.sum_abs_bf16));
        const double limit = rel.k_const * er + floor;
        const double r = limit > 0 ? ef / limit : (ef > 0 ? INFINITY : 0.0);
        st.max_rel = std::max(st.max_rel, r);
        ++st.rel_outputs;
        if (!(r <= 1)) {
          fl.message = fmt::format("{}/{} (rank {}): output '{}': rms error vs fp64 {:.3g} > {} x the reference's "
                                   "{:.3g} + floor {:.3g} (fast_vs_fp64/gpu)",
                                   c.op, c.name, c.rank, want.name, ef, rel.k_const, er, floor);
          ok = false;
          break;
        }
      }
    }
    if (ok) {
      ++sum.passed;
      ++st.passed;
    } else {
      sum.failures.push_back(fl);
    }
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
