// ExactAcc<float/double> against MPFR (an independent arbitrary-precision oracle): exact sums with heavy
// cancellation, correct rounding (ties to even, subnormals, overflow to Inf), specials, merge, wire format.
#include <gtest/gtest.h>
#include <mpfr.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "reference/exact_acc.h"

namespace trident {
namespace {

template <class T>
struct Fmt;
template <>
struct Fmt<float> {
  static constexpr int prec = 24, emin = -148, emax = 128;
};
template <>
struct Fmt<double> {
  static constexpr int prec = 53, emin = -1073, emax = 1024;
};

// Exact sum in MPFR (2400 bits covers 2^-1074 .. 2^1300), then one correctly rounded (RNE) conversion with
// T's exponent range and gradual underflow (mpfr_subnormalize).
template <class T>
T mpfr_sum(const std::vector<T>& xs) {
  mpfr_t acc, r;
  mpfr_init2(acc, 2400);
  mpfr_set_zero(acc, +1);
  for (T x : xs) {
    int inexact = mpfr_add_d(acc, acc, static_cast<double>(x), MPFR_RNDN);
    EXPECT_EQ(inexact, 0) << "oracle lost exactness";
  }
  const mpfr_exp_t old_min = mpfr_get_emin(), old_max = mpfr_get_emax();
  mpfr_set_emin(Fmt<T>::emin);
  mpfr_set_emax(Fmt<T>::emax);
  mpfr_init2(r, Fmt<T>::prec);
  int t = mpfr_set(r, acc, MPFR_RNDN);
  t = mpfr_check_range(r, t, MPFR_RNDN);
  mpfr_subnormalize(r, t, MPFR_RNDN);
  T out = static_cast<T>(mpfr_get_d(r, MPFR_RNDN));  // exact: r already has T's precision and range
  mpfr_set_emin(old_min);
  mpfr_set_emax(old_max);
  mpfr_clear(acc);
  mpfr_clear(r);
  if (out == 0) out = T(0);  // the contract: an exact zero is +0
  return out;
}

template <class T>
T acc_sum(const std::vector<T>& xs) {
  ExactAcc<T> a;
  for (T x : xs) a.add(x);
  return a.round();
}

template <class T>
auto bits(T x) {
  if constexpr (sizeof(T) == 4) return std::bit_cast<uint32_t>(x);
  else return std::bit_cast<uint64_t>(x);
}

// Random finite T with a random exponent over the whole range (incl. subnormals) and random sign.
template <class T>
T random_finite(std::mt19937_64& rng, int max_biased_exp) {
  using B = decltype(bits(T{}));
  constexpr int mant = std::numeric_limits<T>::digits - 1;
  B m = static_cast<B>(rng()) & ((B{1} << mant) - 1);
  B e = static_cast<B>(rng() % static_cast<uint64_t>(max_biased_exp + 1));
  B s = static_cast<B>(rng() & 1);
  return std::bit_cast<T>(static_cast<B>((s << (sizeof(T) * 8 - 1)) | (e << mant) | m));
}

template <class T>
class ExactAccTest : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(ExactAccTest, Types);

TYPED_TEST(ExactAccTest, HeavyCancellation) {
  using T = TypeParam;
  std::vector<T> xs = {T(1e30), T(1), T(-1e30)};
  EXPECT_EQ(bits(acc_sum(xs)), bits(T(1)));
  EXPECT_EQ(bits(mpfr_sum(xs)), bits(T(1)));
  const T big = std::numeric_limits<T>::max();
  const T tiny = std::numeric_limits<T>::denorm_min();
  xs = {big, tiny, -big, tiny};
  EXPECT_EQ(bits(acc_sum(xs)), bits(T(2) * tiny));
  xs = {big, big, -big, -big, T(3) * tiny};  // intermediate beyond max: still exact
  EXPECT_EQ(bits(acc_sum(xs)), bits(T(3) * tiny));
}

TYPED_TEST(ExactAccTest, RandomSumsMatchMpfr) {
  using T = TypeParam;
  const uint64_t seed = 20261129;
  std::mt19937_64 rng(seed);
  const int emax = sizeof(T) == 4 ? 254 : 2046;
  int nonzero = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 200);
    std::vector<T> xs;
    const int mode = trial % 4;
    // mode 0: full range; 1: narrow exponent band (many carries); 2: subnormal/tiny; 3: cancelling pairs
    int band = static_cast<int>(rng() % static_cast<uint64_t>(emax - 10));
    for (int i = 0; i < n; ++i) {
      T x;
      if (mode == 0) {
        x = random_finite<T>(rng, emax);
      } else if (mode == 1 || mode == 3) {
        x = random_finite<T>(rng, 10);
        using B = decltype(bits(T{}));
        constexpr int mant = std::numeric_limits<T>::digits - 1;
        B b = bits(x);
        B e = ((b >> mant) & ((B{1} << (sizeof(T) * 8 - 1 - mant)) - 1)) + static_cast<B>(band);
        b = (b & ~(((B{1} << (sizeof(T) * 8 - 1 - mant)) - 1) << mant)) | (e << mant);
        x = std::bit_cast<T>(b);
      } else {
        x = random_finite<T>(rng, 2);
      }
      xs.push_back(x);
      if (mode == 3 && rng() % 2) xs.push_back(-x);
    }
    if (mode == 3) {
      xs.push_back(random_finite<T>(rng, emax));
      std::shuffle(xs.begin(), xs.end(), rng);
    }
    const T want = mpfr_sum(xs), got = acc_sum(xs);
    ASSERT_EQ(bits(got), bits(want)) << "repro: seed=" << seed << " trial=" << trial << " n=" << xs.size()
                                     << " got=" << got << " want=" << want;
    nonzero += want != 0;
  }
  EXPECT_GT(nonzero, 2000);  // not vacuous
}

// Exact halfway cases: a + half an ulp of a. RNE picks the neighbour with an even significand.
TYPED_TEST(ExactAccTest, TiesToEven) {
  using T = TypeParam;
  std::mt19937_64 rng(7);
  const int emax = sizeof(T) == 4 ? 253 : 2045;
  int ups = 0, downs = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    T a = random_finite<T>(rng, emax);
    if (std::fabs(a) < std::numeric_limits<T>::min()) continue;
    const T up = std::nextafter(a, a > 0 ? std::numeric_limits<T>::infinity() : -std::numeric_limits<T>::infinity());
    const T ulp = up - a;                                          // exact (Sterbenz), sign of a
    const T half = ulp / 2;                                        // exact power of two (maybe subnormal)
    if (half == 0 || std::isinf(up)) continue;
    const bool even = (bits(a) & 1) == 0;
    const T want = even ? a : up;
    std::vector<T> xs = {a, half};
    ASSERT_EQ(bits(acc_sum(xs)), bits(want)) << "tie a=" << a << " trial=" << trial;
    ASSERT_EQ(bits(mpfr_sum(xs)), bits(want)) << "oracle disagrees, a=" << a;
    even ? ++downs : ++ups;
    // A hair above / below the tie decides by the sticky bits.
    const T tiny = std::numeric_limits<T>::denorm_min();
    if (std::fabs(half) > T(4) * std::numeric_limits<T>::min()) {
      std::vector<T> above = {a, half, std::copysign(tiny, a)};
      std::vector<T> below = {a, half, -std::copysign(tiny, a)};
      ASSERT_EQ(bits(acc_sum(above)), bits(up)) << "a=" << a;
      ASSERT_EQ(bits(acc_sum(below)), bits(a)) << "a=" << a;
    }
  }
  EXPECT_GT(ups, 1000);
  EXPECT_GT(downs, 1000);
}

TYPED_TEST(ExactAccTest, SubnormalResults) {
  using T = TypeParam;
  const T mn = std::numeric_limits<T>::min();
  const T d = std::numeric_limits<T>::denorm_min();
  EXPECT_EQ(bits(acc_sum<T>({mn, -d})), bits(mn - d));                      // normal - tiny = subnormal
  EXPECT_EQ(bits(acc_sum<T>({d, d, d})), bits(T(3) * d));
  EXPECT_EQ(bits(acc_sum<T>({T(1), d, T(-1)})), bits(d));
  EXPECT_EQ(bits(acc_sum<T>({-mn, mn / 2})), bits(-mn / 2));
  EXPECT_EQ(bits(acc_sum<T>({T(-0.0), T(-0.0)})), bits(T(0)));             // exact zero -> +0
  EXPECT_EQ(bits(ExactAcc<T>().round()), bits(T(0)));
}

TYPED_TEST(ExactAccTest, OverflowOnRounding) {
  using T = TypeParam;
  const T big = std::numeric_limits<T>::max();
  const T inf = std::numeric_limits<T>::infinity();
  const T half_ulp = (big - std::nextafter(big, T(0))) / 2;
  EXPECT_EQ(bits(acc_sum<T>({big, big})), bits(inf));
  EXPECT_EQ(bits(acc_sum<T>({-big, -big})), bits(-inf));
  EXPECT_EQ(bits(acc_sum<T>({big, half_ulp})), bits(inf));        // tie, max is odd -> up -> overflow
  EXPECT_EQ(bits(acc_sum<T>({big, half_ulp / 2})), bits(big));    // below the tie
  EXPECT_EQ(bits(acc_sum<T>({-big, -half_ulp})), bits(-inf));
  EXPECT_EQ(bits(mpfr_sum<T>({big, half_ulp})), bits(inf));
  std::vector<T> many(5000, big);                                   // far beyond the range, still exact
  for (int i = 0; i < 5000; ++i) many.push_back(-big);
  many.push_back(T(1));
  EXPECT_EQ(bits(acc_sum(many)), bits(T(1)));
}

TYPED_TEST(ExactAccTest, SpecialValues) {
  using T = TypeParam;
  const T inf = std::numeric_limits<T>::infinity();
  const T nan = std::numeric_limits<T>::quiet_NaN();
  EXPECT_TRUE(std::isnan(acc_sum<T>({T(1), nan, T(2)})));
  EXPECT_TRUE(std::isnan(acc_sum<T>({inf, -inf})));
  EXPECT_TRUE(std::isnan(acc_sum<T>({inf, nan})));
  EXPECT_EQ(bits(acc_sum<T>({inf, T(1), inf, -std::numeric_limits<T>::max()})), bits(inf));
  EXPECT_EQ(bits(acc_sum<T>({T(-5), -inf})), bits(-inf));
  ExactAcc<T> a, b;
  a.add(inf);
  b.add(-inf);
  a.merge(b);
  EXPECT_TRUE(std::isnan(a.round()));
  EXPECT_FALSE(a.is_zero());
  ExactAcc<T> z;
  z.add(T(3));
  z.add(T(-3));
  EXPECT_TRUE(z.is_zero());
}

TYPED_TEST(ExactAccTest, MergeAndWireFormat) {
  using T = TypeParam;
  std::mt19937_64 rng(11);
  const int emax = sizeof(T) == 4 ? 254 : 2046;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<T> xs;
    for (int i = 0; i < 300; ++i) xs.push_back(random_finite<T>(rng, trial % 2 ? 40 : emax));
    const int parts = 1 + static_cast<int>(rng() % 17);
    std::vector<ExactAcc<T>> acc(parts);
    for (T x : xs) acc[rng() % parts].add(x);
    // Ship every part through the wire format, then merge in a random order.
    std::vector<std::byte> wire(parts * ExactAcc<T>::kBytes);
    exact_serialize(acc.data(), parts, wire.data());
    std::vector<ExactAcc<T>> back(parts);
    exact_deserialize(wire.data(), parts, back.data());
    std::shuffle(back.begin(), back.end(), rng);
    ExactAcc<T> total;
    for (auto& p : back) total.merge(p);
    ASSERT_EQ(bits(total.round()), bits(mpfr_sum(xs))) << "trial " << trial << " parts " << parts;
    // exact_merge / exact_round over arrays.
    std::vector<ExactAcc<T>> dst(1), src(1);
    for (auto& p : acc) {
      src[0] = p;
      exact_merge(dst.data(), src.data(), 1);
    }
    T r;
    exact_round(dst.data(), &r, 1);
    ASSERT_EQ(bits(r), bits(total.round()));
  }
}

// The documented byte layout (docs/numerics.md "Wire format"), which readers of raw accumulator bytes rely on:
// float: 6 int64 digit limbs of 48 bits, then the int64 head top * 2^24 + count * 2^3 + flags.
TEST(ExactAccLayout, FloatWireFormat) {
  static_assert(ExactAcc<float>::kBytes == 56 && ExactAcc<float>::kLimbs == 7 && ExactAcc<float>::kDigit == 48);
  auto words = [](const ExactAcc<float>& a) {
    std::vector<int64_t> w(7);
    exact_serialize(&a, 1, reinterpret_cast<std::byte*>(w.data()));
    return w;
  };
  ExactAcc<float> a;
  EXPECT_EQ(words(a), std::vector<int64_t>(7, 0)) << "the empty accumulator is all-zero bytes";
  a.add(0x1p-149f);  // one unit: digit 0, count 1
  EXPECT_EQ(words(a), (std::vector<int64_t>{1, 0, 0, 0, 0, 0, int64_t{1} << 3}));
  a.add(0x1p-101f);  // 2^48 units: digit 1 (an add never carries)
  a.add(std::numeric_limits<float>::infinity());
  EXPECT_EQ(words(a), (std::vector<int64_t>{1, 1, 0, 0, 0, 0, (int64_t{3} << 3) | 2}));
  // -1 unit, normalised: every digit 2^48 - 1 and the top limb -1 (two's complement), count 1.
  ExactAcc<float> b;
  b.add(-0x1p-149f);
  b.normalize();
  const int64_t d = (int64_t{1} << 48) - 1;
  EXPECT_EQ(words(b), (std::vector<int64_t>{d, d, d, d, d, d, static_cast<int64_t>(~uint64_t{0} << 24) | (1 << 3)}));
  EXPECT_EQ(b.limb(6), -1);
  EXPECT_EQ(bits(b.round()), bits(-0x1p-149f));
  // A merge adds the top limbs and the counters in their fields and ORs the flags.
  ExactAcc<float> c = b;
  c.add(-std::numeric_limits<float>::infinity());
  c.merge(a);
  EXPECT_EQ(c.limb(6), -1);
  EXPECT_EQ(c.flags(), 2u | 4u);
  EXPECT_EQ(words(c)[6] & 7, 6);
  EXPECT_EQ((words(c)[6] >> 3) & ((1 << 21) - 1), 2 + 3);
  EXPECT_TRUE(std::isnan(c.round()));
  // The largest float magnitude reaches the top limb (the upper piece of an add at digit 5 goes there).
  ExactAcc<float> m;
  for (int k = 0; k < 3000; ++k) m.add(-std::numeric_limits<float>::max());
  m.normalize();
  EXPECT_LT(m.limb(6), 0);
  EXPECT_EQ(bits(m.round()), bits(-std::numeric_limits<float>::infinity()));
}

// add_unchecked_wide (a double that is an exact sum of floats, one add): the same value as adding the floats one by
// one (canonical limbs equal after normalisation, so every later merge and rounding agrees), at every position of
// the 48-bit digits (subnormal units up to 32 FLT_MAX; the upper piece in the third limb), both signs,
// cancellation to zero, and across the normalisation limit. Groups of n = 2..32 floats inside the window that
// tile_reduce's grouped partials use (29 - ceil(log2 n) binades), so their double sum is exact.
TEST(ExactAccWide, MatchesFloatAdds) {
  std::mt19937_64 rng(29);
  auto canonical = [](ExactAcc<float> a) {
    a.normalize();
    std::vector<int64_t> l;
    for (int i = 0; i < ExactAcc<float>::kLimbs; ++i) l.push_back(a.limb(i));
    return l;
  };
  ExactAcc<float> run_f, run_w;  // long runs: 4,000 groups, past 2^14 adds of reserved counts
  int n_high = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    const int n = 2 + static_cast<int>(rng() % 31);
    const int span = 29 - std::bit_width(static_cast<unsigned>(n - 1));
    const int base = static_cast<int>(rng() % 255);  // biased exponent of the window's top
    std::vector<float> xs;
    double sum = 0;
    for (int k = 0; k < n; ++k) {
      // biased exponent in [base - span, base] (0, a subnormal, where that is in the window), random significand
      const int lo = std::max(base - span, 0);
      const uint32_t e = static_cast<uint32_t>(lo + static_cast<int>(rng() % static_cast<uint64_t>(base - lo + 1)));
      float x = std::bit_cast<float>(static_cast<uint32_t>(rng() & 1) << 31 | e << 23 |
                                     static_cast<uint32_t>(rng() & 0x7fffff));
      if (trial % 5 == 0 && k % 2) x = -xs.back();  // cancelling pairs
      xs.push_back(x);
      sum += static_cast<double>(x);
    }
    ExactAcc<float> f, w;
    for (float x : xs) f.add(x);
    w.reserve_adds(static_cast<uint32_t>(n));
    w.add_unchecked_wide(sum);
    ASSERT_EQ(canonical(f), canonical(w)) << "repro: seed=29 trial=" << trial << " sum=" << sum;
    ASSERT_EQ(bits(w.round()), bits(mpfr_sum(xs))) << "repro: seed=29 trial=" << trial;
    for (float x : xs) run_f.add(x);
    run_w.reserve_adds(static_cast<uint32_t>(n));
    run_w.add_unchecked_wide(sum);
    n_high += std::fabs(sum) >= 0x1p95;  // at digit 4 and up (the highest digit an exact group reaches)
  }
  EXPECT_EQ(canonical(run_f), canonical(run_w));
  EXPECT_GT(n_high, 100);
  // Edges: 8 and 32 FLT_MAX (the largest sums of groups), just below 2^139 (the bound), the smallest subnormal, +-0,
  // (2^53 - 1) units, (2^53 - 1) * 2^44 units (its upper piece, 2^49 and up, in the third limb).
  for (double x : {8.0 * FLT_MAX, -8.0 * FLT_MAX, 32.0 * FLT_MAX, 0x1.fffffffffffffp138, 0x1p-149, -0x1p-149, 0.0,
                   -0.0, 0x1.fffffffffffffp-97, -0x1.fffffffffffffp-53}) {
    ExactAcc<float> w;
    w.add_unchecked_wide(x);
    mpfr_t m, r;
    mpfr_init2(m, 200);
    mpfr_set_d(m, x, MPFR_RNDN);
    mpfr_init2(r, 24);
    const mpfr_exp_t old_max = mpfr_get_emax();
    mpfr_set_emax(128);
    int t = mpfr_set(r, m, MPFR_RNDN);
    t = mpfr_check_range(r, t, MPFR_RNDN);
    mpfr_set_emax(old_max);
    const float want = mpfr_get_flt(r, MPFR_RNDN);
    mpfr_clear(m);
    mpfr_clear(r);
    EXPECT_EQ(bits(w.round()), bits(want == 0 ? 0.0f : want)) << x;
  }
}

// Intermediate normalisations (carry propagation) never change the value.
TYPED_TEST(ExactAccTest, NormalizeKeepsValue) {
  using T = TypeParam;
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<T> xs;
    ExactAcc<T> a, b;
    for (int i = 0; i < 200; ++i) {
      T x = random_finite<T>(rng, sizeof(T) == 4 ? 254 : 2046);
      xs.push_back(x);
      a.add(x);
      b.add(x);
      if (rng() % 7 == 0) b.normalize();
    }
    ASSERT_EQ(bits(a.round()), bits(b.round()));
    ASSERT_EQ(bits(b.round()), bits(mpfr_sum(xs)));
  }
}

// reserve_adds + add_unchecked (the hot-loop form) equals add(), including across the normalisation limit.
TYPED_TEST(ExactAccTest, ReservedAddsMatchAdd) {
  using T = TypeParam;
  std::mt19937_64 rng(13);
  ExactAcc<T> a, b;
  std::vector<T> xs;
  // 1100 * kMaxReserve reserved > the normalisation limit (2^14 float, 2^29 double)
  for (int round = 0; round < 1100; ++round) {
    a.reserve_adds(ExactAcc<T>::kMaxReserve);
    for (int i = 0; i < 3; ++i) {
      const T x = random_finite<T>(rng, sizeof(T) == 4 ? 254 : 2046);
      a.add_unchecked(x);
      b.add(x);
      xs.push_back(x);
    }
  }
  EXPECT_EQ(bits(a.round()), bits(b.round()));
  EXPECT_EQ(bits(a.round()), bits(mpfr_sum(xs)));
}

// Enough adds to force the automatic normalisation, with the largest possible low digit each time.
TEST(ExactAccLong, HeadroomFloat) {
  // M = 2^24-1 at position 24: the low digit of every add is 0xffffff000000, close to 2^48 (float's digit width).
  const float x = std::ldexp(static_cast<float>(0xffffff), -125);
  const int64_t n = (int64_t{1} << 30) + 5;
  ExactAcc<float> a;
  for (int64_t i = 0; i < n; ++i) a.add(x);
  mpfr_t m, r;
  mpfr_init2(m, 200);
  mpfr_set_d(m, x, MPFR_RNDN);
  mpfr_mul_si(m, m, n, MPFR_RNDN);
  mpfr_init2(r, 24);
  mpfr_set(r, m, MPFR_RNDN);
  const float want = mpfr_get_flt(r, MPFR_RNDN);
  mpfr_clear(m);
  mpfr_clear(r);
  EXPECT_EQ(bits(a.round()), bits(want)) << a.round() << " vs " << want;
}

TEST(ExactAccLong, HeadroomDoubleWidening) {
  // Worst middle digit for double; plus add(float) widening on ExactAcc<double>.
  const double x = std::ldexp(static_cast<double>((uint64_t{1} << 53) - 1), -1074 + 31);
  const int64_t n = (int64_t{1} << 29) + 3;
  ExactAcc<double> a;
  for (int64_t i = 0; i < n; ++i) a.add(x);
  a.add(1.5f);
  mpfr_t m, r;
  mpfr_init2(m, 300);
  mpfr_set_d(m, x, MPFR_RNDN);
  mpfr_mul_si(m, m, n, MPFR_RNDN);
  mpfr_add_d(m, m, 1.5, MPFR_RNDN);
  mpfr_init2(r, 53);
  mpfr_set(r, m, MPFR_RNDN);
  const double want = mpfr_get_d(r, MPFR_RNDN);
  mpfr_clear(m);
  mpfr_clear(r);
  EXPECT_EQ(bits(a.round()), bits(want));
}

}  // namespace
}  // namespace trident
