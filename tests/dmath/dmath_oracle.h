// Test support for reference/dmath: MPFR oracle (200 bits), ulp error measurement, and the input samplers.
//
// Error measure (the one reference/dmath_bounds.h promises): err = |ours - exact| / ulp_T(exact), where exact
// is the MPFR value at 200 bits and ulp_T(y) = 2^(max(floor(log2|y|), emin_T) - p_T + 1) (p = 24/53, emin =
// -126/-1022, so subnormal results have the fixed ulp 2^-149 / 2^-1074). A correctly rounded result has
// err <= 0.5. Results that are or should be +-Inf / NaN / zero are compared bitwise with the correctly rounded
// target (mpfr_get_flt / mpfr_get_d, round to nearest, gradual underflow), err = 0 if equal, +Inf otherwise.
#pragma once
#include <mpfr.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "reference/dmath.h"

namespace dmtest {

constexpr mpfr_prec_t kPrec = 200;

enum class Fn { exp, expm1, log, log1p, tanh, sigmoid, silu, rsqrt, sin, cos, pow };
inline const char* name(Fn f) {
  switch (f) {
    case Fn::exp: return "exp";
    case Fn::expm1: return "expm1";
    case Fn::log: return "log";
    case Fn::log1p: return "log1p";
    case Fn::tanh: return "tanh";
    case Fn::sigmoid: return "sigmoid";
    case Fn::silu: return "silu";
    case Fn::rsqrt: return "rsqrt";
    case Fn::sin: return "sin";
    case Fn::cos: return "cos";
    case Fn::pow: return "pow";
  }
  return "?";
}

template <class T>
T ours(Fn f, T x, T y) {
  namespace dm = trident::dm;
  switch (f) {
    case Fn::exp: return dm::exp(x);
    case Fn::expm1: return dm::expm1(x);
    case Fn::log: return dm::log(x);
    case Fn::log1p: return dm::log1p(x);
    case Fn::tanh: return dm::tanh(x);
    case Fn::sigmoid: return dm::sigmoid(x);
    case Fn::silu: return dm::silu(x);
    case Fn::rsqrt: return dm::rsqrt(x);
    default: break;
  }
  if constexpr (std::is_same_v<T, double>) {
    switch (f) {
      case Fn::sin: return dm::sin(x);
      case Fn::cos: return dm::cos(x);
      case Fn::pow: return dm::pow(x, y);
      default: break;
    }
  }
  return std::numeric_limits<T>::quiet_NaN();
}

// Per-thread MPFR scratch.
struct Mp {
  mpfr_t x, y, r, t;
  Mp() {
    mpfr_inits2(kPrec, x, y, r, t, static_cast<mpfr_ptr>(nullptr));
  }
  ~Mp() { mpfr_clears(x, y, r, t, static_cast<mpfr_ptr>(nullptr)); }
  Mp(const Mp&) = delete;
  Mp& operator=(const Mp&) = delete;
};

// r = f(x[, y]) at 200 bits (sigmoid/silu from exp with 3-4 roundings at 2^-200: far below what we measure).
inline void exact(Fn f, Mp& m, double xv, double yv) {
  if (mpfr_get_prec(m.r) != kPrec) mpfr_set_prec(m.r, kPrec);
  mpfr_set_d(m.x, xv, MPFR_RNDN);
  mpfr_set_d(m.y, yv, MPFR_RNDN);
  switch (f) {
    case Fn::exp: mpfr_exp(m.r, m.x, MPFR_RNDN); break;
    case Fn::expm1: mpfr_expm1(m.r, m.x, MPFR_RNDN); break;
    case Fn::log: mpfr_log(m.r, m.x, MPFR_RNDN); break;
    case Fn::log1p: mpfr_log1p(m.r, m.x, MPFR_RNDN); break;
    case Fn::tanh: mpfr_tanh(m.r, m.x, MPFR_RNDN); break;
    case Fn::sigmoid:
    case Fn::silu:
      if (xv != 0 && std::fabs(xv) < 0x1p-100) {
        // 1 + e^-x would round to 1 at 200 bits: use sigmoid = 1/2 + x/4 (- x^3/48 ...), silu = x sigmoid, at
        // a precision that holds 1/2 + x/4 exactly (x >= 2^-1074), so the tie-breaking x^2/4 of silu survives.
        mpfr_set_prec(m.r, 2600);
        mpfr_div_2ui(m.r, m.x, 2, MPFR_RNDN);
        mpfr_add_d(m.r, m.r, 0.5, MPFR_RNDN);
        if (f == Fn::silu) mpfr_mul(m.r, m.r, m.x, MPFR_RNDN);
        break;
      }
      mpfr_neg(m.t, m.x, MPFR_RNDN);
      mpfr_exp(m.t, m.t, MPFR_RNDN);
      mpfr_add_ui(m.t, m.t, 1, MPFR_RNDN);
      mpfr_ui_div(m.r, 1, m.t, MPFR_RNDN);  // sigmoid
      if (f == Fn::silu) {
        if (mpfr_inf_p(m.x) && mpfr_sgn(m.x) < 0) {
          mpfr_set_zero(m.r, -1);  // silu(-inf) := -0 (the limit; -inf * 0 is NaN)
        } else {
          mpfr_mul(m.r, m.r, m.x, MPFR_RNDN);
        }
      }
      break;
    case Fn::rsqrt:
      mpfr_rec_sqrt(m.r, m.x, MPFR_RNDN);
      if (mpfr_zero_p(m.x) && mpfr_signbit(m.x)) mpfr_set_inf(m.r, -1);  // IEEE 754 rSqrt(-0) = -Inf (MPFR: +Inf)
      break;
    case Fn::sin: mpfr_sin(m.r, m.x, MPFR_RNDN); break;
    case Fn::cos: mpfr_cos(m.r, m.x, MPFR_RNDN); break;
    case Fn::pow: mpfr_pow(m.r, m.x, m.y, MPFR_RNDN); break;
  }
}

template <class T>
T round_to(mpfr_srcptr r) {
  if constexpr (std::is_same_v<T, float>) {
    return mpfr_get_flt(r, MPFR_RNDN);
  } else {
    return mpfr_get_d(r, MPFR_RNDN);
  }
}

template <class T>
using Bits = std::conditional_t<std::is_same_v<T, float>, uint32_t, uint64_t>;

// Position of a value on the ordered line of T values (-0 and +0 are 0), for ulp distances.
template <class T>
int64_t ordinal(T v) {
  const auto b = std::bit_cast<Bits<T>>(v);
  constexpr Bits<T> sign = Bits<T>(1) << (sizeof(T) * 8 - 1);
  const auto mag = static_cast<int64_t>(b & ~sign);
  return (b & sign) ? -mag : mag;
}

template <class T>
bool same_bits_or_both_nan(T a, T b) {
  if (a != a && b != b) return true;
  return std::bit_cast<Bits<T>>(a) == std::bit_cast<Bits<T>>(b);
}

struct Measure {
  double err;        // |ours - exact| / ulp(exact); 0 if both special and equal; +inf if mismatch
  int64_t cr_dist;   // |ordinal(ours) - ordinal(correctly rounded)| (huge for NaN/Inf mismatches)
};

template <class T>
Measure measure(T got, Mp& m) {
  constexpr int p = std::numeric_limits<T>::digits;
  constexpr int emin = std::numeric_limits<T>::min_exponent - 1;  // -126 / -1022
  const T cr = round_to<T>(m.r);
  constexpr double kBad = std::numeric_limits<double>::infinity();
  constexpr int64_t kFar = std::numeric_limits<int64_t>::max();
  const bool special = mpfr_nan_p(m.r) || mpfr_inf_p(m.r) || mpfr_zero_p(m.r) || got != got || cr != cr ||
                       std::isinf(got) || std::isinf(cr);
  if (special) return same_bits_or_both_nan(got, cr) ? Measure{0.0, 0} : Measure{kBad, kFar};
  if (got == 0 && std::signbit(got) != (mpfr_sgn(m.r) < 0)) return {kBad, kFar};  // underflow to the wrong zero
  long E = mpfr_get_exp(m.r) - 1;  // |exact| in [2^E, 2^(E+1))
  if (E < emin) E = emin;
  mpfr_set_d(m.t, static_cast<double>(got), MPFR_RNDN);
  mpfr_sub(m.t, m.t, m.r, MPFR_RNDN);  // exact enough: 200 bits
  mpfr_mul_2si(m.t, m.t, -(E - p + 1), MPFR_RNDN);
  const double err = std::fabs(mpfr_get_d(m.t, MPFR_RNDN));
  const int64_t d = ordinal(got) - ordinal(cr);
  return {err, d < 0 ? -d : d};
}

// ------------------------------------------------------------------------------------------------------------
// Deterministic per-sample random numbers (independent of thread count and evaluation order).
inline uint64_t splitmix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
struct Rng {
  uint64_t s;
  uint64_t next() { return s = splitmix(s); }
  double unit() { return static_cast<double>(next() >> 11) * 0x1p-53; }  // [0, 1)
};

// One component of an input distribution.
struct Comp {
  enum Kind { kReal, kBits, kNearUlps } kind;
  double a, b;     // kReal: [a, b]; kBits: magnitudes [a, b] (a > 0) uniform in bit patterns; kNearUlps: center a, b ulps
  bool both_signs;
  int weight;
};

template <class T>
T sample_comp(const Comp& c, Rng& g) {
  switch (c.kind) {
    case Comp::kReal: {
      const double v = c.a + (c.b - c.a) * g.unit();
      return static_cast<T>(v);
    }
    case Comp::kBits: {
      const auto lo = std::bit_cast<Bits<T>>(static_cast<T>(c.a));
      const auto hi = std::bit_cast<Bits<T>>(static_cast<T>(c.b));
      const auto v = static_cast<Bits<T>>(lo + g.next() % (static_cast<uint64_t>(hi - lo) + 1));
      T t = std::bit_cast<T>(v);
      if (c.both_signs && (g.next() & 1)) t = -t;
      return t;
    }
    case Comp::kNearUlps: {
      const auto center = ordinal(static_cast<T>(c.a));
      const auto span = static_cast<int64_t>(c.b);
      const int64_t o = center + static_cast<int64_t>(g.next() % static_cast<uint64_t>(2 * span + 1)) - span;
      const auto mag = static_cast<Bits<T>>(o < 0 ? -o : o);
      T t = std::bit_cast<T>(mag);
      return o < 0 ? -t : t;
    }
  }
  return T(0);
}

}  // namespace dmtest
