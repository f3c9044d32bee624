// Documented accuracy promise of reference/dmath (one entry per function and type).
//
// The bound is on err = |result - exact| / ulp(exact) with the exact value from MPFR and ulp(y) the spacing of
// the target format at y (fixed 2^-149 / 2^-1074 for subnormal results), i.e. a correctly rounded function has
// err <= 0.5. Every function is in addition faithful: at most 1 ulp away from the correctly rounded result
// (and special values -- NaN, +-Inf, signed zeros -- equal bit for bit). The bounds were set from the
// measurements in tests/dmath (>= 10^7 sampled inputs per type, edge cases) plus the error analysis in
// docs/numerics.md; tests/dmath fails if any measured error exceeds them. Never widen one to hide a bug.
#pragma once
#include <string_view>

namespace trident::dm {

struct UlpBound {
  std::string_view fn;
  double f32;  // bound for the float overload (< 0: no float overload)
  double f64;  // bound for the double overload
};

inline constexpr UlpBound kUlpBounds[] = {
    // fn, float, double
    {"exp", 0.5001, 0.502},   {"expm1", 0.5001, 0.502},   {"log", 0.5001, 0.502},  {"log1p", 0.5001, 0.502},
    {"tanh", 0.5001, 0.502},  {"sigmoid", 0.5001, 0.502}, {"silu", 0.5001, 0.502}, {"rsqrt", 0.5001, 0.502},
    {"sin", -1.0, 0.502},     {"cos", -1.0, 0.502},       {"pow", -1.0, 0.502},
};

// The bound for `fn` (float if !is_double); -1 if there is no such function.
constexpr double ulp_bound(std::string_view fn, bool is_double) {
  for (const auto& b : kUlpBounds)
    if (b.fn == fn) return is_double ? b.f64 : b.f32;
  return -1.0;
}

}  // namespace trident::dm
