// Internal to golden/primitives: the calculus of the derived acceptance rule's chains (accept.cpp, accept_attn.cpp):
// a case's inputs in fp64, and first-order absolute error bounds of a formula's steps (docs/numerics.md "Acceptance
// rule").
#pragma once
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "golden/primitives/bounds.h"
#include "golden/primitives/primitives.h"
#include "reference/bf16.h"
#include "reference/check.h"
#include "reference/tolerances.h"

namespace trident::golden::accept_detail {


// ---- the case's data ----------------------------------------------------------------------------------------------
inline const NamedTensor* find(const std::vector<NamedTensor>& v, const std::string& name) {
  for (const NamedTensor& t : v)
    if (t.name == name) return &t;
  return nullptr;
}
inline const NamedTensor& input(const PrimCase& c, const std::string& name) {
  const NamedTensor* t = find(c.inputs, name);
  if (!t) fail(fmt::format("primitive case {}/{}: no input '{}'", c.op, c.name, name));
  return *t;
}
inline bool has_input(const PrimCase& c, const std::string& name) { return find(c.inputs, name) != nullptr; }
// The GEMM operands of an op: rounded to bf16 under the bf16 policy on both sides (and so in the bounds and the
// fp64 oracle).
inline bool is_operand(const std::string& op, const std::string& name) {
  if (op == "mm") return name == "A" || name == "B";
  if (op == "wgrad_acc") return name == "X" || name == "dY";
  if (op.rfind("linear_ce", 0) == 0) return name == "hidden" || name == "W";
  if (op.find("core_") != std::string::npos) return name == "q" || name == "kv";
  if (op == "swiglu_forward" || op == "expert_forward") return name == "x" || name == "wg" || name == "wu" || name == "wd";
  if (op == "swiglu_backward_dgrad" || op == "expert_backward_dgrad")
    return name == "dy" || name == "wg" || name == "wu" || name == "wd";
  if (op == "router_forward") return name == "a" || name == "wr";
  // the attention projections: every use of these inputs is a GEMM operand (reference/model/attention.cpp); not
  // W.kv_norm, acts.c, acts.kv_rinv (fp32 kv_norm), dqc, dpayload (partly through RoPE unrounded: bf16 terms in the
  // chains, accept_attn.cpp)
  const bool weight = name == "W.wq" || name == "W.wk" || name == "W.wv" || name == "W.wdkv" || name == "W.wuk" ||
                      name == "W.wuv" || name == "W.wo";
  if (op == "attn_qkv_forward") return name == "a" || weight;
  if (op == "attn_qkv_backward") return name == "a" || name == "acts.q" || weight;
  if (op == "attn_out_forward") return name == "acts.o" || weight;
  if (op == "attn_out_backward") return name == "acts.o" || name == "acts.ocat" || name == "dy" || weight;
  return false;
}
inline std::vector<double> values(const PrimCase& c, const std::string& name) {
  std::vector<double> v = values_as_double(input(c, name));
  if (c.policy == "bf16" && is_operand(c.op, name))
    for (double& x : v) x = static_cast<double>(round_bf16(static_cast<float>(x)));
  return v;
}
inline std::vector<int64_t> ints64(const PrimCase& c, const std::string& name) {
  const NamedTensor& t = input(c, name);
  if (t.dtype != "i64") fail(fmt::format("primitive case {}/{}: input '{}' is not i64", c.op, c.name, name));
  std::vector<int64_t> v(static_cast<size_t>(t.numel()));
  if (!v.empty()) std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
  return v;
}
inline int64_t si(const PrimCase& c, const char* k) { return c.shapes.at(k).get<int64_t>(); }
inline double sf(const PrimCase& c, const char* k) { return c.shapes.at(k).get<double>(); }
inline model::CoreDims core_dims(const PrimCase& c) {
  model::CoreDims cd;
  cd.H = si(c, "H"), cd.G = si(c, "G"), cd.Dq = si(c, "Dq"), cd.Dv = si(c, "Dv");
  cd.P = si(c, "P"), cd.val_base = si(c, "val_base");
  cd.scale = sf(c, "scale");
  return cd;
}

inline double rms(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return v.empty() ? 0.0 : std::sqrt(s / static_cast<double>(v.size()));
}

// ---- one output's rule data ---------------------------------------------------------------------------------------
struct Rule {
  std::string row;              // the tolerance table's row ("gemm", "sum", "composite", ...)
  std::vector<double> bound;    // per element, absolute
  std::vector<double> mag;      // per element: the terms' magnitude (the relative test's floor)
  double u_bf16_floor = 0;      // the bf16 part of the floor (rms of the bf16 magnitudes, times u_bf16)
};
using Rules = std::map<std::string, Rule>;

// From the fast tier's per-element magnitudes (golden/primitives/bounds.h).
inline Rule from_elem(const ElemBounds& e, const std::string& acc) {
  Rule r;
  r.row = e.primitive;
  r.bound.resize(e.sum_abs.size());
  for (size_t i = 0; i < e.sum_abs.size(); ++i) r.bound[i] = e.bound(static_cast<int64_t>(i), acc);
  r.mag = e.sum_abs;
  if (!e.sum_abs_bf16.empty()) r.u_bf16_floor = unit_roundoff("bf16") * rms(e.sum_abs_bf16);
  return r;
}

// A sum-like output: (k_const + k_per_term n) u sum|terms|, sum|terms| from the op replayed in fp64 on |inputs|.
inline Rule sum_rule(const std::vector<double>& sum_abs, double n, const std::string& acc) {
  const Tolerance& t = tolerance("sum", acc, "accept");
  Rule r;
  r.row = "sum";
  r.mag = sum_abs;
  r.bound.resize(sum_abs.size());
  for (size_t i = 0; i < sum_abs.size(); ++i)
    r.bound[i] = (t.k_const + t.k_per_term * n) * unit_roundoff(acc) * sum_abs[i];
  return r;
}

// The composite rows' calculus: first-order absolute error bounds of a formula evaluated in fp64 from the inputs.
// Each helper returns the bound of its result from its operands' values and bounds; u the accumulation type's unit
// roundoff, phi the elementary functions' budget in ulps (the composite row's k_per_term).
struct Calc {
  double u, phi;
  double rnd(double z) const { return u * std::fabs(z); }
  double mul(double x, double bx, double y, double by) const { return std::fabs(y) * bx + std::fabs(x) * by + rnd(x * y); }
  double add(double x, double bx, double y, double by) const { return bx + by + rnd(x + y); }
  double div(double x, double bx, double y, double by) const {
    return bx / std::fabs(y) + std::fabs(x) * by / (y * y) + phi * rnd(x / y);
  }
  // f(x) with |f'(x)| = dfx: the argument's bound through the derivative, plus the function's own ulps
  double fn(double fx, double dfx, double bx) const { return std::fabs(dfx) * bx + phi * u * std::fabs(fx); }
  // a sum (or dot product) of n terms in any order, its terms' magnitude s and the terms' own bounds bt
  double sum(double n, double s, double bt) const { return bt + 2.0 * (n + 1) * u * s; }
};
inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline std::string fmtd(double v) { return fmt::format("{:.9g}", v); }

// C = A @ B (row-major, plain leading dimensions): values, magnitudes sum|a b|, bounds (inputs exact)
struct Mat {
  std::vector<double> v, s, b;
};
inline Mat gemm(const Calc& k, const double* A, const double* bA, int64_t M, int64_t K, const double* B, const double* bB,
         int64_t N, bool trans_b) {
  Mat m;
  m.v.assign(static_cast<size_t>(M * N), 0.0), m.s = m.v, m.b = m.v;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double v = 0, s = 0, bt = 0;
      for (int64_t q = 0; q < K; ++q) {
        const double a = A[i * K + q], b = trans_b ? B[j * K + q] : B[q * N + j];
        v += a * b, s += std::fabs(a * b);
        bt += (bA ? bA[i * K + q] * std::fabs(b) : 0.0) + (bB ? std::fabs(a) * (trans_b ? bB[j * K + q] : bB[q * N + j]) : 0.0);
      }
      const size_t o = static_cast<size_t>(i * N + j);
      m.v[o] = v, m.s[o] = s, m.b[o] = k.sum(static_cast<double>(K), s, bt);
    }
  return m;
}

inline Rule composite(std::vector<double> bound, std::vector<double> mag, const std::string& acc) {
  const Tolerance& t = tolerance("composite", acc, "accept");
  for (double& x : bound) x *= t.k_const;
  return Rule{"composite", std::move(bound), std::move(mag), 0.0};
}

// The chains of the attention projections (attn_qkv_*, attn_out_*) and of the DSA core (accept_attn.cpp), by output
// name; empty where none is derived (the outputs keep the bitwise comparison).
Rules attn_rules(const PrimCase& c, const Calc& k, const std::string& acc, const std::vector<NamedTensor>& ref);

}  // namespace trident::golden::accept_detail
