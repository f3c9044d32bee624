// Documented accuracy promise of reference/dmath (one entry per function and type).
//
// The bound is on err = |result - exact| / ulp(exact) with the exact value from MPFR and ulp(y) the spacing of
// the target format at y (fixed 2^-149 / 2^-1074 for subnormal results), i.e. a correctly rounded function has
// err <= 0.5. A bound of 0.5 promises correct rounding (the float overloads); the double overloads promise
// 0.501 ulp and faithful rounding (at most 1 ulp from the correctly rounded result). Special values -- NaN,
// +-Inf, signed zeros -- equal the correctly rounded result bit for bit. The bounds were set from the
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
    // fn, float (0.5: correctly rounded), double
    {"exp", 0.5, 0.501},   {"expm1", 0.5, 0.501}, {"log", 0.5, 0.501},  {"log1p", 0.5, 0.501},
    {"tanh", 0.5, 0.501},  {"sigmoid", 0.5, 0.501}, {"silu", 0.5, 0.501}, {"rsqrt", 0.5, 0.501},
    {"sin", -1.0, 0.501},  {"cos", -1.0, 0.501},  {"pow", -1.0, 0.501},
};

// The bound for `fn` (float if !is_double); -1 if there is no such function.
constexpr double ulp_bound(std::string_view fn, bool is_double) {
  for (const auto& b : kUlpBounds)
    if (b.fn == fn) return is_double ? b.f64 : b.f32;
  return -1.0;
}

}  // namespace trident::dm
