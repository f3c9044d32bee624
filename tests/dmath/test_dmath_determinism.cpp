// reference/dmath results are identical bit for bit whatever the OpenMP thread count and schedule, and
// whatever the evaluation order (the functions are pure: no state, no tables filled lazily, no libm).
#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <vector>

#include "reference/dmath.h"
#include "tests/dmath/dmath_oracle.h"

namespace {

constexpr uint64_t kSeed = 0x5eedd37e2026ull;
constexpr long kN = 1 << 18;

// Inputs: every finite/special bit pattern class (uniform over all bit patterns) mixed with the useful ranges.
template <class T>
std::vector<T> inputs(int fn) {
  std::vector<T> v(kN);
  for (long i = 0; i < kN; ++i) {
    dmtest::Rng g{dmtest::splitmix(kSeed + static_cast<uint64_t>(fn) * 0x100000000ull + static_cast<uint64_t>(i))};
    const uint64_t r = g.next();
    if (r % 3 == 0) {
      v[i] = std::bit_cast<T>(static_cast<dmtest::Bits<T>>(g.next()));  // any pattern, NaN and Inf included
    } else {
      v[i] = static_cast<T>(-200.0 + 400.0 * g.unit());
    }
  }
  return v;
}

template <class T>
std::vector<T> eval(dmtest::Fn f, const std::vector<T>& x, int threads, bool dynamic, bool reverse) {
  std::vector<T> y(x.size());
  omp_set_num_threads(threads);
  const long n = static_cast<long>(x.size());
  if (dynamic) {
#pragma omp parallel for schedule(dynamic, 37)
    for (long i = 0; i < n; ++i) {
      const long j = reverse ? n - 1 - i : i;
      y[j] = dmtest::ours<T>(f, x[j], T(0.37));
    }
  } else {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; ++i) {
      const long j = reverse ? n - 1 - i : i;
      y[j] = dmtest::ours<T>(f, x[j], T(0.37));
    }
  }
  return y;
}

template <class T>
void check(dmtest::Fn f) {
  const auto x = inputs<T>(static_cast<int>(f));
  const auto ref = eval<T>(f, x, 1, false, false);
  long finite = 0;
  for (T v : ref) finite += (v == v && v - v == 0) ? 1 : 0;
  EXPECT_GT(finite, kN / 4) << "vacuous: too few finite results";
  for (int threads : {2, 4}) {
    for (bool dyn : {false, true}) {
      const auto y = eval<T>(f, x, threads, dyn, dyn);
      EXPECT_EQ(std::memcmp(y.data(), ref.data(), ref.size() * sizeof(T)), 0)
          << dmtest::name(f) << (sizeof(T) == 4 ? " float" : " double") << " differs with " << threads
          << " threads, dynamic=" << dyn << " (seed " << kSeed << ")";
    }
  }
}

TEST(DmathDeterminism, FloatAcrossThreadCounts) {
  for (auto f : {dmtest::Fn::exp, dmtest::Fn::expm1, dmtest::Fn::log, dmtest::Fn::log1p, dmtest::Fn::tanh,
                 dmtest::Fn::sigmoid, dmtest::Fn::silu, dmtest::Fn::rsqrt})
    check<float>(f);
}

TEST(DmathDeterminism, DoubleAcrossThreadCounts) {
  for (auto f : {dmtest::Fn::exp, dmtest::Fn::expm1, dmtest::Fn::log, dmtest::Fn::log1p, dmtest::Fn::tanh,
                 dmtest::Fn::sigmoid, dmtest::Fn::silu, dmtest::Fn::rsqrt, dmtest::Fn::sin, dmtest::Fn::cos,
                 dmtest::Fn::pow})
    check<double>(f);
}

}  // namespace
