// reference/dmath results are identical bit for bit whatever the OpenMP thread count and schedule, and
// whatever the evaluation order (the functions are pure: no state, no tables filled lazily, no libm); the array
// form exp_n gives exp()'s bits on every instruction-set copy.
#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "reference/dmath.h"
#include "reference/gemm.h"
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

namespace {

// exp_n against exp, bit for bit: a stride through all 2^32 float patterns (NaN, Inf, subnormals, both signs), the
// fast stage's domain edges (-104, 89) and a dense sweep of [-110, 95] where the fast stage decides most elements;
// lengths that end mid-block, in place and not.
std::vector<float> exp_inputs() {
  std::vector<float> v;
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 4093) v.push_back(std::bit_cast<float>(static_cast<uint32_t>(b)));
  for (int i = 0; i < (1 << 20); ++i) v.push_back(-110.0f + 205.0f * static_cast<float>(i) / (1 << 20));
  for (float e : {-104.0f, 89.0f, 88.72283f, 88.72284f, -103.97208f, -103.97209f, -87.33655f, 0.0f, -0.0f,
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::denorm_min()})
    for (float d : {0.0f, 1.0f, -1.0f})
      v.push_back(d == 0.0f ? e : std::nextafter(e, d * std::numeric_limits<float>::infinity()));
  return v;
}

// Runs f(isa) on every instruction-set copy this CPU and build run (printing the ones skipped), then restores the
// copy that was chosen.
template <class F>
void on_every_copy(F f) {
  const trident::GemmIsa saved = trident::gemm_isa();
  for (trident::GemmIsa isa : {trident::GemmIsa::baseline, trident::GemmIsa::avx2, trident::GemmIsa::avx512}) {
    if (!trident::gemm_isa_supported(isa)) {
      std::printf("copy %s: not run by this CPU or build\n", trident::gemm_isa_name(isa));
      continue;
    }
    trident::set_gemm_isa(isa);
    f(isa);
  }
  trident::set_gemm_isa(saved);
}

TEST(DmathArrays, ExpNIsExpBitwiseOnEveryCopy) {
  const std::vector<float> x = exp_inputs();
  std::vector<uint32_t> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = std::bit_cast<uint32_t>(trident::dm::exp(x[i]));
  on_every_copy([&](trident::GemmIsa isa) {
    for (const int64_t len : {int64_t{1}, int64_t{63}, int64_t{65}, static_cast<int64_t>(x.size())}) {
      std::vector<float> y(x.size(), -1.0f), z(x.begin(), x.end());
      trident::dm::exp_n(x.data(), y.data(), len);
      trident::dm::exp_n(z.data(), z.data(), len);  // in place
      for (int64_t i = 0; i < len; ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(y[i]), want[i]) << "repro: copy=" << trident::gemm_isa_name(isa)
                                                          << " len=" << len << " i=" << i << " x=" << x[i];
        ASSERT_EQ(std::bit_cast<uint32_t>(z[i]), want[i]) << "in place, repro: copy=" << trident::gemm_isa_name(isa)
                                                          << " len=" << len << " i=" << i << " x=" << x[i];
      }
      if (len < static_cast<int64_t>(y.size())) {
        EXPECT_EQ(y[static_cast<size_t>(len)], -1.0f) << "exp_n wrote past n";
      }
    }
  });
  std::vector<double> xd = {-800.0, -1.5, 0.0, 0.5, 700.0, std::numeric_limits<double>::quiet_NaN()}, yd(xd.size());
  trident::dm::exp_n(xd.data(), yd.data(), static_cast<int64_t>(xd.size()));
  for (size_t i = 0; i < xd.size(); ++i)
    EXPECT_EQ(std::bit_cast<uint64_t>(yd[i]), std::bit_cast<uint64_t>(trident::dm::exp(xd[i]))) << "x=" << xd[i];
}

// sigmoid_silu_n against sigmoid and silu, bit for bit, on every copy: the same stride through all float patterns,
// a dense sweep of [-110, 110] (the fast stage's domain is |x| <= 104), the domain edges; both outputs, one of them,
// in place and not, lengths that end mid-block.
TEST(DmathArrays, SigmoidSiluNAreTheScalarFunctionsBitwiseOnEveryCopy) {
  std::vector<float> x;
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 4093) x.push_back(std::bit_cast<float>(static_cast<uint32_t>(b)));
  for (int i = 0; i < (1 << 20); ++i) x.push_back(-110.0f + 220.0f * static_cast<float>(i) / (1 << 20));
  for (float e : {-104.0f, 104.0f, 0.0f, -0.0f, 88.72284f, -87.33655f, std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                  std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min()})
    for (float d : {0.0f, 1.0f, -1.0f})
      x.push_back(d == 0.0f ? e : std::nextafter(e, d * std::numeric_limits<float>::infinity()));
  std::vector<uint32_t> want_sg(x.size()), want_si(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    want_sg[i] = std::bit_cast<uint32_t>(trident::dm::sigmoid(x[i]));
    want_si[i] = std::bit_cast<uint32_t>(trident::dm::silu(x[i]));
  }
  on_every_copy([&](trident::GemmIsa isa) {
    for (const int64_t len : {int64_t{1}, int64_t{63}, int64_t{65}, static_cast<int64_t>(x.size())}) {
      std::vector<float> sg(x.size(), -1.0f), si(x.size(), -1.0f), z(x.begin(), x.end()), only(x.size(), -1.0f);
      trident::dm::sigmoid_silu_n(x.data(), sg.data(), si.data(), len);
      trident::dm::sigmoid_silu_n(z.data(), static_cast<float*>(nullptr), z.data(), len);  // silu in place
      trident::dm::sigmoid_silu_n(x.data(), only.data(), static_cast<float*>(nullptr), len);
      for (int64_t i = 0; i < len; ++i) {
        const std::string repro = std::string("repro: copy=") + trident::gemm_isa_name(isa) +
                                  " len=" + std::to_string(len) + " i=" + std::to_string(i);
        ASSERT_EQ(std::bit_cast<uint32_t>(sg[i]), want_sg[i]) << "sigmoid x=" << x[i] << " " << repro;
        ASSERT_EQ(std::bit_cast<uint32_t>(si[i]), want_si[i]) << "silu x=" << x[i] << " " << repro;
        ASSERT_EQ(std::bit_cast<uint32_t>(z[i]), want_si[i]) << "silu in place x=" << x[i] << " " << repro;
        ASSERT_EQ(std::bit_cast<uint32_t>(only[i]), want_sg[i]) << "sigmoid alone x=" << x[i] << " " << repro;
      }
      if (len < static_cast<int64_t>(x.size())) {
        EXPECT_EQ(sg[static_cast<size_t>(len)], -1.0f) << "wrote past n";
        EXPECT_EQ(si[static_cast<size_t>(len)], -1.0f) << "wrote past n";
      }
    }
  });
  std::vector<double> xd = {-800.0, -1.5, -0.0, 0.0, 0.5, 700.0, std::numeric_limits<double>::quiet_NaN()};
  std::vector<double> sd(xd.size()), ld(xd.size());
  trident::dm::sigmoid_silu_n(xd.data(), sd.data(), ld.data(), static_cast<int64_t>(xd.size()));
  for (size_t i = 0; i < xd.size(); ++i) {
    EXPECT_EQ(std::bit_cast<uint64_t>(sd[i]), std::bit_cast<uint64_t>(trident::dm::sigmoid(xd[i]))) << "x=" << xd[i];
    EXPECT_EQ(std::bit_cast<uint64_t>(ld[i]), std::bit_cast<uint64_t>(trident::dm::silu(xd[i]))) << "x=" << xd[i];
  }
}

}  // namespace
