// Accuracy of reference/dmath against MPFR (200 bits) on sampled inputs plus edge cases.
// Compiled twice: DMATH_T = float (test_dmath_accuracy_f32) and DMATH_T = double (test_dmath_accuracy_f64).
//
// Per type >= 10^7 sampled inputs in total (kSamplesPerType split evenly over the functions), drawn from a
// fixed seed (printed) by a per-sample counter-based generator, so the inputs do not depend on the OpenMP
// thread count. Each function's max error must be <= its bound in reference/dmath_bounds.h, and every result
// must be within 1 ulp of the correctly rounded value (0 ulp where the bound is 0.5, i.e. where correct rounding
// is promised; special values: bitwise equal).
// DMATH_SAMPLE_SCALE=<x> in the environment scales the sample count (for quick local runs; ctest uses 1).
#include <gtest/gtest.h>
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "reference/dmath_bounds.h"
#include "reference/dmath_detail.h"
#include "tests/dmath/dmath_oracle.h"

#ifndef DMATH_T
#define DMATH_T double
#endif

namespace {

using T = DMATH_T;
using dmtest::Comp;
using dmtest::Fn;
constexpr bool kIsDouble = std::is_same_v<T, double>;
constexpr uint64_t kSeed = 0x7d3a11ce2026ull;
constexpr long kSamplesPerType = 10'000'000;

constexpr double kPi = 3.141592653589793;
constexpr double kRope = 0x1p20 * kPi;  // the documented sin/cos range the RoPE tables need (~3.3e6)

std::vector<Comp> domain(Fn f) {
  const double dmin = kIsDouble ? 0x1p-1074 : 0x1p-149;
  const double dmax = static_cast<double>(std::numeric_limits<T>::max());
  const double ovf = kIsDouble ? 709.782712893384 : 88.72283905206835;  // exp overflow threshold
  const double unf = kIsDouble ? -745.1332191019412 : -103.97207708399179;  // exp rounds to 0 below
  const double sub = kIsDouble ? -708.3964185322641 : -87.33654475055310;  // exp subnormal below
  switch (f) {
    case Fn::exp:
      return {{Comp::kReal, unf - 0.1, ovf + 0.1, false, 4}, {Comp::kBits, 0x1p-60, -unf, true, 3},
              {Comp::kNearUlps, ovf, 1e5, false, 1}, {Comp::kReal, unf - 0.1, sub + 0.5, false, 1},
              {Comp::kNearUlps, unf, 1e5, false, 1}, {Comp::kBits, dmin, 0x1p-60, true, 1}};
    case Fn::expm1:
      return {{Comp::kReal, kIsDouble ? -40 : -20, ovf + 0.1, false, 3}, {Comp::kBits, 0x1p-70, 1.0, true, 3},
              {Comp::kReal, -1, 1, false, 2}, {Comp::kNearUlps, ovf, 1e5, false, 1},
              {Comp::kBits, dmin, 0x1p-70, true, 1}};
    case Fn::log:
      return {{Comp::kBits, dmin, dmax, false, 4}, {Comp::kReal, 0.5, 2.0, false, 2},
              {Comp::kNearUlps, 1.0, 1e6, false, 2}, {Comp::kReal, 0.99, 1.01, false, 1},
              {Comp::kBits, dmin, kIsDouble ? 0x1p-1022 : 0x1p-126, false, 1}};
    case Fn::log1p:
      return {{Comp::kBits, dmin, dmax, false, 2}, {Comp::kBits, 0x1p-70, 1.0, true, 3},
              {Comp::kReal, -1, 1, false, 2}, {Comp::kReal, -1, -0.999, false, 1}, {Comp::kReal, 0, 10, false, 1},
              {Comp::kBits, dmin, 0x1p-70, true, 1}};
    case Fn::tanh:
      return {{Comp::kBits, 0x1p-60, kIsDouble ? 23.0 : 10.0, true, 4}, {Comp::kReal, -5, 5, false, 3},
              {Comp::kReal, -25, 25, false, 2}, {Comp::kBits, dmin, 0x1p-60, true, 1}};
    case Fn::sigmoid:
    case Fn::silu:
      return {{Comp::kReal, kIsDouble ? -760 : -110, 45, false, 2}, {Comp::kReal, -40, 40, false, 3},
              {Comp::kBits, 0x1p-70, kIsDouble ? 760.0 : 110.0, true, 3},
              {Comp::kReal, kIsDouble ? -760 : -110, kIsDouble ? -700 : -85, false, 1},
              {Comp::kBits, dmin, 0x1p-70, true, 1}};
    case Fn::rsqrt:
      return {{Comp::kBits, dmin, dmax, false, 6}, {Comp::kReal, 0.25, 4, false, 2},
              {Comp::kNearUlps, 1.0, 1e6, false, 2}};
    case Fn::sin:
    case Fn::cos:
      return {{Comp::kReal, -4, 4, false, 3}, {Comp::kReal, -1e3, 1e3, false, 2},
              {Comp::kBits, 0x1p-30, kRope, true, 3}, {Comp::kReal, -kRope, kRope, false, 2},
              {Comp::kBits, kRope, dmax, true, 1}, {Comp::kBits, dmin, 0x1p-30, true, 1}};
    case Fn::pow: return {};  // own sampler
  }
  return {};
}

struct Input {
  T x, y;
};

Input sample(Fn f, const std::vector<Comp>& comps, int total_w, long i) {
  dmtest::Rng g{dmtest::splitmix(kSeed ^ (static_cast<uint64_t>(f) << 56) ^ static_cast<uint64_t>(i))};
  if constexpr (kIsDouble) {
    if (f == Fn::pow) {
      auto mk = [](double u, double v) { return Input{static_cast<T>(u), static_cast<T>(v)}; };
      const uint64_t c = g.next() % 12;
      if (c < 4) {  // any positive base, exponent chosen so the result lands anywhere in range
        const double b = dmtest::sample_comp<double>({Comp::kBits, 0x1p-1074, 0x1.fffffffffffffp1023, false, 1}, g);
        const double t = -746.0 + 1456.0 * g.unit();
        const double lb = trident::dm::log(b);
        return mk(b, lb == 0 ? t : t / lb);
      }
      if (c < 6) return mk(1e3 + (1e6 - 1e3) * g.unit(), -g.unit());  // RoPE: theta^(-2i/D)
      if (c < 7) {
        const double D = (g.next() & 1) ? 128.0 : 64.0;
        return mk(1e4 + (1e6 - 1e4) * g.unit(), -2.0 * static_cast<double>(g.next() % 64) / D);
      }
      if (c < 8) {  // base near 1, huge exponents
        const double b = dmtest::sample_comp<double>({Comp::kNearUlps, 1.0, 1e6, false, 1}, g);
        return mk(b, dmtest::sample_comp<double>({Comp::kBits, 1.0, 0x1p62, true, 1}, g));
      }
      if (c < 10) return mk(10.0 * g.unit(), -50.0 + 100.0 * g.unit());
      return mk(0.5 + 1.5 * g.unit(), static_cast<double>(static_cast<int>(g.next() % 401) - 200));
    }
  }
  int w = static_cast<int>(g.next() % static_cast<uint64_t>(total_w));
  size_t k = 0;
  while (w >= comps[k].weight) w -= comps[k++].weight;
  return {dmtest::sample_comp<T>(comps[k], g), T(0)};
}

// Edge cases for every function (evaluated like samples).
std::vector<T> edge_inputs(Fn f) {
  using L = std::numeric_limits<T>;
  std::vector<T> v = {T(0),          -T(0),          L::denorm_min(), -L::denorm_min(), L::min(),     -L::min(),
                      L::max(),      -L::max(),      L::infinity(),   -L::infinity(),   L::quiet_NaN(), T(1),
                      T(-1),         T(0.5),         T(-0.5),         T(2),             T(-2),        L::epsilon(),
                      -L::epsilon(), T(100),         T(-100),         T(1000),          T(-1000)};
  v.push_back(std::bit_cast<T>(std::bit_cast<dmtest::Bits<T>>(L::min()) - 1));  // largest subnormal
  const double ovf = kIsDouble ? 709.782712893384 : 88.72283905206835;
  const double unf = kIsDouble ? -745.1332191019412 : -103.97207708399179;
  for (double c : {ovf, unf, kIsDouble ? -708.3964185322641 : -87.33654475055310, 1.0, -1.0}) {
    for (int d = -3; d <= 3; ++d) {
      const auto o = dmtest::ordinal(static_cast<T>(c)) + d;
      const T t = std::bit_cast<T>(static_cast<dmtest::Bits<T>>(o < 0 ? -o : o));
      v.push_back(o < 0 ? -t : t);
    }
  }
  if (kIsDouble && (f == Fn::sin || f == Fn::cos)) {
    // The double closest to a multiple of pi/2 (6381956970095103 * 2^797), and values near n*pi/2.
    v.push_back(static_cast<T>(0x1.6ac5b262ca1ffp+849));
    v.push_back(static_cast<T>(-0x1.6ac5b262ca1ffp+849));
    for (double n : {1.0, 2.0, 3.0, 4.0, 1e3, 65536.0, 1048576.0, 3e6, 1e10}) {
      const double c = n * (kPi / 2);
      for (int d = -2; d <= 2; ++d)
        v.push_back(static_cast<T>(std::bit_cast<double>(std::bit_cast<uint64_t>(c) + static_cast<uint64_t>(d))));
    }
  }
  return v;
}

struct Stat {
  double max_err = 0;
  long worst = -1;  // sample index (edge cases: -2 - edge index)
  Input worst_in{};
  T worst_out{};
  int64_t max_cr = 0;
  long not_cr = 0;
  void take(double err, int64_t crd, long idx, Input in, T out) {
    if (crd != 0) ++not_cr;
    if (crd > max_cr) max_cr = crd;
    if (worst == -1 || err > max_err || (err == max_err && idx < worst)) {
      max_err = err;
      worst = idx;
      worst_in = in;
      worst_out = out;
    }
  }
};

long samples_per_fn(int n_fns) {
  double scale = 1.0;
  if (const char* s = std::getenv("DMATH_SAMPLE_SCALE")) scale = std::atof(s);
  const long n = (kSamplesPerType + n_fns - 1) / n_fns;
  return static_cast<long>(static_cast<double>(n) * scale);
}

constexpr Fn kFns[] = {Fn::exp,  Fn::expm1, Fn::log, Fn::log1p, Fn::tanh, Fn::sigmoid,
                       Fn::silu, Fn::rsqrt, Fn::sin, Fn::cos,   Fn::pow};
constexpr int kNumFns = kIsDouble ? 11 : 8;

void run(Fn f) {
  const auto comps = domain(f);
  int total_w = 0;
  for (auto& c : comps) total_w += c.weight;
  const long n = samples_per_fn(kNumFns);
  const auto t0 = std::chrono::steady_clock::now();
  Stat total;
  long nonfinite_inputs = 0;
#pragma omp parallel
  {
    dmtest::Mp m;
    Stat st;
    long nf = 0;
#pragma omp for schedule(dynamic, 4096)
    for (long i = 0; i < n; ++i) {
      const Input in = sample(f, comps, total_w, i);
      if (!std::isfinite(in.x)) ++nf;
      const T got = dmtest::ours<T>(f, in.x, in.y);
      dmtest::exact(f, m, static_cast<double>(in.x), static_cast<double>(in.y));
      const auto ms = dmtest::measure<T>(got, m);
      st.take(ms.err, ms.cr_dist, i, in, got);
    }
#pragma omp critical
    {
      total.not_cr += st.not_cr;
      if (st.max_cr > total.max_cr) total.max_cr = st.max_cr;
      nonfinite_inputs += nf;
      if (st.worst >= 0 && (total.worst == -1 || st.max_err > total.max_err ||
                            (st.max_err == total.max_err && st.worst < total.worst))) {
        total.max_err = st.max_err;
        total.worst = st.worst;
        total.worst_in = st.worst_in;
        total.worst_out = st.worst_out;
      }
    }
  }
  const double bound = trident::dm::ulp_bound(name(f), kIsDouble);
  // Edge cases (after the samples so the sample statistics stay separate in the report).
  Stat edge;
  {
    dmtest::Mp m;
    const auto ev = edge_inputs(f);
    for (size_t j = 0; j < ev.size(); ++j) {
      Input in{ev[j], T(0)};
      if (f == Fn::pow) in = {T(2), ev[j]};  // pow specials are in test_dmath_special
      const T got = dmtest::ours<T>(f, in.x, in.y);
      dmtest::exact(f, m, static_cast<double>(in.x), static_cast<double>(in.y));
      const auto ms = dmtest::measure<T>(got, m);
      edge.take(ms.err, ms.cr_dist, static_cast<long>(j), in, got);
      EXPECT_LE(ms.cr_dist, bound <= 0.5 ? 0 : 1) << name(f) << " edge x=" << static_cast<double>(in.x) << " got " << got;
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "dmath %-7s %-6s samples=%ld seed=0x%llx max_err=%.9f ulp (bound %.4f) at x=%a y=%a -> %a; "
      "not correctly rounded: %ld (max %lld ulp from CR); edge max_err=%.9f; %.1fs, %d threads\n",
      name(f), kIsDouble ? "double" : "float", n, static_cast<unsigned long long>(kSeed), total.max_err, bound,
      static_cast<double>(total.worst_in.x), static_cast<double>(total.worst_in.y),
      static_cast<double>(total.worst_out), total.not_cr, static_cast<long long>(total.max_cr), edge.max_err, secs,
      omp_get_max_threads());
  std::fflush(stdout);
  ASSERT_GT(n, 0);
  EXPECT_EQ(nonfinite_inputs, 0) << "sampler produced non-finite inputs";
  EXPECT_GT(total.max_err, 0.0) << "vacuous: no rounding error observed at all";
  EXPECT_LE(total.max_err, bound) << "repro: " << name(f) << "(" << static_cast<double>(total.worst_in.x) << ", "
                                  << static_cast<double>(total.worst_in.y) << ") sample " << total.worst
                                  << " seed " << kSeed;
  EXPECT_LE(total.max_cr, bound <= 0.5 ? 0 : 1) << name(f) << ": distance from the correctly rounded result";
  EXPECT_LE(edge.max_err, bound) << name(f) << " edge input " << static_cast<double>(edge.worst_in.x);
}

class DmathAccuracy : public ::testing::TestWithParam<Fn> {};
TEST_P(DmathAccuracy, MaxUlpWithinBound) { run(GetParam()); }

std::vector<Fn> fns() { return std::vector<Fn>(kFns, kFns + kNumFns); }
INSTANTIATE_TEST_SUITE_P(All, DmathAccuracy, ::testing::ValuesIn(fns()),
                         [](const ::testing::TestParamInfo<Fn>& i) { return std::string(dmtest::name(i.param)); });

TEST(DmathAccuracy, TotalSampleCount) {
  const long total = samples_per_fn(kNumFns) * kNumFns;
  std::printf("dmath %s: %ld sampled inputs in total over %d functions\n", kIsDouble ? "double" : "float", total,
              kNumFns);
  if (!std::getenv("DMATH_SAMPLE_SCALE")) {
    EXPECT_GE(total, 10'000'000);
  }
}

// The float functions' fast stage: its relative error must stay below the 2^-47 the rounding test relies on
// (reference/dmath_detail.h). 5 x 10^5 samples per function from the same distributions, restricted to the
// stage's domain; the max is printed in double ulps (64 = the promise).
TEST(DmathFastStage, RelativeErrorBelowPromise) {
  if constexpr (kIsDouble) {
    GTEST_SKIP() << "float-only";
  } else {
    namespace dd = trident::dm::detail;
    struct Stage {
      Fn f;
      double (*fast)(double);
      bool (*in_domain)(double);
    };
    const Stage stages[] = {
        {Fn::exp, dd::exp_fast, [](double x) { return x > -104.0 && x < 89.0; }},
        {Fn::expm1, dd::expm1_fast, [](double x) { return x >= -1.0 && x <= 1.0 && x != 0; }},
        {Fn::log, dd::log_fast, [](double x) { return x > 0 && x <= 0x1.fffffep127 && x != 1.0; }},
        {Fn::tanh, dd::tanh_fast, [](double x) { return std::fabs(x) >= 0x1p-20 && std::fabs(x) <= 9.5; }},
        {Fn::sigmoid, dd::sigmoid_fast, [](double x) { return std::fabs(x) <= 104.0; }},
        {Fn::silu, dd::silu_fast, [](double x) { return std::fabs(x) <= 104.0 && x != 0; }},
        {Fn::rsqrt, dd::rsqrt_fast, [](double x) { return x > 0 && x <= 0x1.fffffep127; }},
    };
    long n = static_cast<long>(500000 * (std::getenv("DMATH_SAMPLE_SCALE") ? std::atof(std::getenv("DMATH_SAMPLE_SCALE")) : 1.0));
    for (const auto& st : stages) {
      const auto comps = domain(st.f);
      int total_w = 0;
      for (auto& c : comps) total_w += c.weight;
      double max_rel = 0, worst = 0;
      long used = 0;
#pragma omp parallel
      {
        dmtest::Mp m;
        double mx = 0, wx = 0;
        long u = 0;
#pragma omp for schedule(dynamic, 4096)
        for (long i = 0; i < n; ++i) {
          const double x = static_cast<double>(sample(st.f, comps, total_w, i + (1L << 40)).x);
          if (!st.in_domain(x)) continue;
          ++u;
          const double d = st.fast(x);
          dmtest::exact(st.f, m, x, 0.0);
          mpfr_set_d(m.t, d, MPFR_RNDN);
          mpfr_sub(m.t, m.t, m.r, MPFR_RNDN);
          mpfr_div(m.t, m.t, m.r, MPFR_RNDN);
          const double rel = std::fabs(mpfr_get_d(m.t, MPFR_RNDN));
          if (rel > mx || (rel == mx && x < wx)) {
            mx = rel;
            wx = x;
          }
        }
#pragma omp critical
        {
          used += u;
          if (mx > max_rel || (mx == max_rel && wx < worst)) {
            max_rel = mx;
            worst = wx;
          }
        }
      }
      std::printf("dmath fast stage %-7s samples=%ld max relative error=%.3g = %.2f double ulps (promise %.0f) at x=%a\n",
                  name(st.f), used, max_rel, max_rel * 0x1p53, dd::kFastRelErr * 0x1p53, worst);
      EXPECT_GT(used, n / 4) << name(st.f);
      EXPECT_GT(max_rel, 0.0) << name(st.f);
      EXPECT_LE(max_rel, dd::kFastRelErr) << "repro: " << name(st.f) << "_fast(" << worst << ")";
    }
  }
}

}  // namespace
