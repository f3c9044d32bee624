// Special values (C99 Annex F) and overflow/underflow thresholds of reference/dmath.
// Expected values here are written from the standard (not produced by the code under test); thresholds are
// located with MPFR and the functions must switch to Inf / 0 at exactly the correctly rounded place.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "reference/dmath.h"
#include "reference/dmath_bounds.h"
#include "tests/dmath/dmath_oracle.h"

namespace dm = trident::dm;

namespace {

template <class T>
bool same(T a, T b) {
  return dmtest::same_bits_or_both_nan(a, b);
}

#define EXPECT_SAME(got, want)                                                                          \
  EXPECT_TRUE(same(got, want)) << #got << " = " << (got) << " (bits differ from " << (want) << ", signbit " \
                               << std::signbit(got) << ")"

template <class T>
void annex_f_common() {
  using L = std::numeric_limits<T>;
  const T inf = L::infinity(), nan = L::quiet_NaN(), z = T(0), nz = -T(0);
  // NaN in -> NaN out
  for (T r : {dm::exp(nan), dm::expm1(nan), dm::log(nan), dm::log1p(nan), dm::tanh(nan), dm::sigmoid(nan),
              dm::silu(nan), dm::rsqrt(nan)})
    EXPECT_TRUE(r != r);
  // exp
  EXPECT_SAME(dm::exp(inf), inf);
  EXPECT_SAME(dm::exp(-inf), z);
  EXPECT_SAME(dm::exp(z), T(1));
  EXPECT_SAME(dm::exp(nz), T(1));
  EXPECT_SAME(dm::exp(L::max()), inf);
  EXPECT_SAME(dm::exp(-L::max()), z);
  // expm1
  EXPECT_SAME(dm::expm1(inf), inf);
  EXPECT_SAME(dm::expm1(-inf), T(-1));
  EXPECT_SAME(dm::expm1(z), z);
  EXPECT_SAME(dm::expm1(nz), nz);
  EXPECT_SAME(dm::expm1(L::denorm_min()), L::denorm_min());
  EXPECT_SAME(dm::expm1(-L::denorm_min()), -L::denorm_min());
  // log
  EXPECT_SAME(dm::log(z), -inf);
  EXPECT_SAME(dm::log(nz), -inf);
  EXPECT_SAME(dm::log(T(1)), z);
  EXPECT_SAME(dm::log(inf), inf);
  EXPECT_TRUE(std::isnan(dm::log(T(-1))));
  EXPECT_TRUE(std::isnan(dm::log(-inf)));
  EXPECT_TRUE(std::isnan(dm::log(-L::denorm_min())));
  // log1p
  EXPECT_SAME(dm::log1p(z), z);
  EXPECT_SAME(dm::log1p(nz), nz);
  EXPECT_SAME(dm::log1p(T(-1)), -inf);
  EXPECT_SAME(dm::log1p(inf), inf);
  EXPECT_TRUE(std::isnan(dm::log1p(T(-2))));
  EXPECT_TRUE(std::isnan(dm::log1p(-inf)));
  EXPECT_SAME(dm::log1p(L::denorm_min()), L::denorm_min());
  // tanh
  EXPECT_SAME(dm::tanh(inf), T(1));
  EXPECT_SAME(dm::tanh(-inf), T(-1));
  EXPECT_SAME(dm::tanh(z), z);
  EXPECT_SAME(dm::tanh(nz), nz);
  EXPECT_SAME(dm::tanh(L::max()), T(1));
  EXPECT_SAME(dm::tanh(-L::denorm_min()), -L::denorm_min());
  // sigmoid (limits of 1/(1+e^-x))
  EXPECT_SAME(dm::sigmoid(-inf), z);
  EXPECT_SAME(dm::sigmoid(inf), T(1));
  EXPECT_SAME(dm::sigmoid(z), T(0.5));
  EXPECT_SAME(dm::sigmoid(nz), T(0.5));
  EXPECT_SAME(dm::sigmoid(-L::max()), z);
  // silu = x sigmoid(x): sign of zero follows x; silu(-inf) is the limit -0
  EXPECT_SAME(dm::silu(z), z);
  EXPECT_SAME(dm::silu(nz), nz);
  EXPECT_SAME(dm::silu(inf), inf);
  EXPECT_SAME(dm::silu(-inf), nz);
  EXPECT_SAME(dm::silu(-L::max()), nz);
  EXPECT_SAME(dm::silu(L::max()), L::max());
  // rsqrt = 1/sqrt(x)
  EXPECT_SAME(dm::rsqrt(z), inf);
  EXPECT_SAME(dm::rsqrt(nz), -inf);
  EXPECT_SAME(dm::rsqrt(inf), z);
  EXPECT_SAME(dm::rsqrt(T(1)), T(1));
  EXPECT_SAME(dm::rsqrt(T(4)), T(0.5));
  EXPECT_TRUE(std::isnan(dm::rsqrt(T(-1))));
  EXPECT_TRUE(std::isnan(dm::rsqrt(-inf)));
}

TEST(DmathSpecial, AnnexFFloat) { annex_f_common<float>(); }
TEST(DmathSpecial, AnnexFDouble) { annex_f_common<double>(); }

TEST(DmathSpecial, AnnexFTrigDouble) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_SAME(dm::sin(0.0), 0.0);
  EXPECT_SAME(dm::sin(-0.0), -0.0);
  EXPECT_SAME(dm::cos(0.0), 1.0);
  EXPECT_SAME(dm::cos(-0.0), 1.0);
  EXPECT_SAME(dm::sin(0x1p-1074), 0x1p-1074);
  EXPECT_SAME(dm::sin(-0x1p-1074), -0x1p-1074);
  for (double r : {dm::sin(inf), dm::sin(-inf), dm::cos(inf), dm::cos(-inf), dm::sin(nan), dm::cos(nan)})
    EXPECT_TRUE(r != r);
}

TEST(DmathSpecial, AnnexFPowDouble) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  // pow(x, +-0) = 1 for any x, even NaN; pow(+1, y) = 1 for any y, even NaN
  for (double x : {0.0, -0.0, 1.0, -1.0, 2.5, -3.0, inf, -inf, nan}) {
    EXPECT_SAME(dm::pow(x, 0.0), 1.0);
    EXPECT_SAME(dm::pow(x, -0.0), 1.0);
    EXPECT_SAME(dm::pow(1.0, x), 1.0);
  }
  EXPECT_TRUE(std::isnan(dm::pow(nan, 1.0)));
  EXPECT_TRUE(std::isnan(dm::pow(2.0, nan)));
  // pow(+-0, y)
  EXPECT_SAME(dm::pow(0.0, -3.0), inf);
  EXPECT_SAME(dm::pow(-0.0, -3.0), -inf);
  EXPECT_SAME(dm::pow(0.0, -2.0), inf);
  EXPECT_SAME(dm::pow(-0.0, -2.5), inf);
  EXPECT_SAME(dm::pow(-0.0, -inf), inf);
  EXPECT_SAME(dm::pow(0.0, 3.0), 0.0);
  EXPECT_SAME(dm::pow(-0.0, 3.0), -0.0);
  EXPECT_SAME(dm::pow(-0.0, 2.0), 0.0);
  EXPECT_SAME(dm::pow(-0.0, 0.5), 0.0);
  // pow(-1, +-inf) = 1; |x| < 1 / > 1 with +-inf
  EXPECT_SAME(dm::pow(-1.0, inf), 1.0);
  EXPECT_SAME(dm::pow(-1.0, -inf), 1.0);
  EXPECT_SAME(dm::pow(0.5, -inf), inf);
  EXPECT_SAME(dm::pow(-0.5, -inf), inf);
  EXPECT_SAME(dm::pow(2.0, -inf), 0.0);
  EXPECT_SAME(dm::pow(0.5, inf), 0.0);
  EXPECT_SAME(dm::pow(2.0, inf), inf);
  EXPECT_SAME(dm::pow(-2.0, inf), inf);
  // pow(-inf, y), pow(+inf, y)
  EXPECT_SAME(dm::pow(-inf, -3.0), -0.0);
  EXPECT_SAME(dm::pow(-inf, -2.0), 0.0);
  EXPECT_SAME(dm::pow(-inf, 3.0), -inf);
  EXPECT_SAME(dm::pow(-inf, 2.5), inf);
  EXPECT_SAME(dm::pow(inf, -0.5), 0.0);
  EXPECT_SAME(dm::pow(inf, 0.5), inf);
  // negative finite base: integer exponents keep the parity sign, others are NaN
  EXPECT_TRUE(std::isnan(dm::pow(-2.0, 0.5)));
  EXPECT_SAME(dm::pow(-2.0, 3.0), -8.0);
  EXPECT_SAME(dm::pow(-2.0, 2.0), 4.0);
  EXPECT_SAME(dm::pow(-2.0, -1.0), -0.5);
  // exact powers of two are exact
  EXPECT_SAME(dm::pow(2.0, 10.0), 1024.0);
  EXPECT_SAME(dm::pow(2.0, -1074.0), 0x1p-1074);
  EXPECT_SAME(dm::pow(2.0, -1075.0), 0.0);
  EXPECT_SAME(dm::pow(2.0, 1024.0), inf);
  EXPECT_SAME(dm::pow(4.0, 0.5), 2.0);
}

// Every special input of pow agrees with MPFR's (ISO C99) pow bit for bit.
TEST(DmathSpecial, PowSpecialGridAgainstMpfr) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  const double xs[] = {0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, inf, -inf, nan, 0x1p-1074, -0x1p-1074,
                       0x1.fffffffffffffp1023};
  const double ys[] = {0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 3.0, -3.0, 0.5, -0.5, inf, -inf, nan, 0x1p60, 1e300};
  dmtest::Mp m;
  for (double x : xs)
    for (double y : ys) {
      dmtest::exact(dmtest::Fn::pow, m, x, y);
      const double cr = mpfr_get_d(m.r, MPFR_RNDN);
      const double got = dm::pow(x, y);
      // specials bit for bit; finite results within the documented bound (pow(DBL_MAX, 0.5) is a hard case)
      const auto ms = dmtest::measure<double>(got, m);
      EXPECT_LE(ms.err, trident::dm::ulp_bound("pow", true)) << "pow(" << x << ", " << y << ") = " << got
                                                             << ", MPFR " << cr;
    }
}

// Overflow / underflow thresholds: scan the ordered values around the threshold (located by bisection with
// MPFR) and require the finite/Inf and zero/nonzero switch at exactly the correctly rounded place.
template <class T>
T locate(dmtest::Fn f, double lo, double hi, bool (*pred)(T)) {
  // pred(CR f(lo)) false, pred(CR f(hi)) true; returns the smallest T with pred true.
  dmtest::Mp m;
  auto cr = [&](T x) {
    dmtest::exact(f, m, static_cast<double>(x), 0.0);
    return dmtest::round_to<T>(m.r);
  };
  auto a = dmtest::ordinal(static_cast<T>(lo)), b = dmtest::ordinal(static_cast<T>(hi));
  auto val = [](int64_t o) {
    const T t = std::bit_cast<T>(static_cast<dmtest::Bits<T>>(o < 0 ? -o : o));
    return o < 0 ? -t : t;
  };
  EXPECT_FALSE(pred(cr(val(a))));
  EXPECT_TRUE(pred(cr(val(b))));
  while (b - a > 1) {
    const int64_t c = a + (b - a) / 2;
    (pred(cr(val(c))) ? b : a) = c;
  }
  return val(b);
}

template <class T>
void thresholds() {
  using dmtest::Fn;
  const bool dbl = std::is_same_v<T, double>;
  auto is_inf = [](T v) { return std::isinf(v); };
  auto nonzero = [](T v) { return v != 0; };
  struct Case {
    Fn f;
    double lo, hi;
    bool (*pred)(T);
    const char* what;
  };
  const Case cases[] = {
      {Fn::exp, dbl ? 709.0 : 88.0, dbl ? 710.0 : 89.0, +is_inf, "exp overflow"},
      {Fn::expm1, dbl ? 709.0 : 88.0, dbl ? 710.0 : 89.0, +is_inf, "expm1 overflow"},
      {Fn::exp, dbl ? -746.0 : -104.5, dbl ? -745.0 : -103.0, +nonzero, "exp underflow to 0"},
      {Fn::sigmoid, dbl ? -746.0 : -104.5, dbl ? -745.0 : -103.0, +nonzero, "sigmoid underflow to 0"},
  };
  for (const auto& c : cases) {
    const T t = locate<T>(c.f, c.lo, c.hi, c.pred);
    std::printf("%s %s threshold: %a\n", dbl ? "double" : "float", c.what, static_cast<double>(t));
    for (int d = -64; d <= 64; ++d) {
      const auto o = dmtest::ordinal(t) + d;
      const T x0 = std::bit_cast<T>(static_cast<dmtest::Bits<T>>(o < 0 ? -o : o));
      const T x = o < 0 ? -x0 : x0;
      const T got = dmtest::ours<T>(c.f, x, T(0));
      EXPECT_EQ(c.pred(got), d >= 0) << c.what << " at x=" << static_cast<double>(x) << " got " << got;
    }
  }
}

TEST(DmathSpecial, ThresholdsFloat) { thresholds<float>(); }
TEST(DmathSpecial, ThresholdsDouble) { thresholds<double>(); }

// The documented float overflow point of exp: exp(88.72283905206835f) < FLT_MAX + ulp/2 <= exp(next float).
TEST(DmathSpecial, FloatExpOverflowPoint) {
  const float x = std::bit_cast<float>(0x42b17217u);  // 0x1.62e42ep+6 = 88.72283172607421875 < ln(FLT_MAX)
  const float next = std::nextafter(x, 100.0f);
  EXPECT_TRUE(std::isfinite(dm::exp(x))) << dm::exp(x);
  EXPECT_TRUE(std::isinf(dm::exp(next))) << dm::exp(next);
}

}  // namespace
