// Internals of reference/dmath exposed for tests: the fast plain-double stage of the correctly rounded float
// functions (docs/numerics.md, "Float algorithms"). The float function returns RN_float(stage1(x)) only when
// stage1(x) is more than 256 double ulps (>= 2^-45 relative) from a float rounding midpoint; that is correct
// because every stage-1 function has a relative error below kFastRelErr = 2^-47 (64 double ulps) on its domain.
// tests/dmath measures these errors against MPFR. Not for use outside reference/dmath.
#pragma once

namespace trident::dm::detail {

inline constexpr double kFastRelErr = 0x1p-47;

double exp_fast(double x);      // float x, -104 < x < 89
double expm1_fast(double x);    // |x| <= 1
double log_fast(double x);      // float x, 0 < x <= FLT_MAX
double tanh_fast(double x);     // float x, 2^-20 <= |x| <= 9.5
double sigmoid_fast(double x);  // float x, |x| <= 104
double silu_fast(double x);     // float x, |x| <= 104
double rsqrt_fast(double x);    // float x, 0 < x <= FLT_MAX

}  // namespace trident::dm::detail
