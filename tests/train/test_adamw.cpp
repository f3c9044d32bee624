// AdamW (torch formulas, decay on matrices only), the exact gradient norm (vs MPFR), the clip coefficient and the
// router bias update (signs, exact ties, gamma 0).
#include <gmp.h>
#include <gtest/gtest.h>
#include <mpfr.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "reference/check.h"
#include "reference/model/adamw.h"

using namespace trident;
using namespace trident::model;

namespace {

constexpr uint64_t kSeed = 0xadab;

// torch.optim.AdamW (_single_tensor_adamw, foreach=False) for one element, written out as the scalar ops torch
// performs on an fp32/fp64 tensor with Python-float hyper-parameters (each Python scalar cast once to the tensor
// dtype), preceded by clip_grad_norm_'s in-place g *= clip_coef:
//   param.mul_(1 - lr*wd); exp_avg.mul_(b1).add_(g, alpha=1-b1); exp_avg_sq.mul_(b2).addcmul_(g, g, value=1-b2)
//   denom = (exp_avg_sq.sqrt() / sqrt(bc2)).add_(eps); param.addcdiv_(exp_avg, denom, value=-lr/bc1)
template <class T>
void torch_adamw_scalar(T& p, T g, T& m, T& v, const AdamWHyper& h, int step, double coef, bool decay) {
  double b1p = 1, b2p = 1;
  for (int i = 0; i < step; ++i) b1p *= h.beta1, b2p *= h.beta2;
  const double bc1 = 1 - b1p, bc2 = 1 - b2p;
  g = g * static_cast<T>(coef);
  if (decay) p = p * static_cast<T>(1 - h.lr * h.weight_decay);
  m = m * static_cast<T>(h.beta1);
  m = m + static_cast<T>(1 - h.beta1) * g;
  v = v * static_cast<T>(h.beta2);
  v = v + static_cast<T>(1 - h.beta2) * g * g;
  T denom = std::sqrt(v) / static_cast<T>(std::sqrt(bc2));
  denom = denom + static_cast<T>(h.eps);
  p = p + static_cast<T>(-h.lr / bc1) * m / denom;
}

template <class T>
void check_adamw_vs_torch_formulas() {
  std::mt19937_64 rng(kSeed);
  std::normal_distribution<double> nd;
  const int64_t n = 257;
  AdamWHyper h;
  h.lr = 3e-3;
  for (bool decay : {true, false}) {
    std::vector<T> w(n), m(n, T(0)), v(n, T(0));
    for (auto& x : w) x = static_cast<T>(nd(rng));
    std::vector<T> w2 = w, m2 = m, v2 = v;
    for (int step = 1; step <= 4; ++step) {
      std::vector<T> g(n);
      for (auto& x : g) x = static_cast<T>(nd(rng) * 0.1);
      const double coef = step == 2 ? 0.37 : 1.0;
      adamw_step<T>(w.data(), g.data(), m.data(), v.data(), n, h, step, coef, decay);
      for (int64_t i = 0; i < n; ++i) torch_adamw_scalar<T>(w2[i], g[i], m2[i], v2[i], h, step, coef, decay);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(w[i], w2[i]) << "w, step " << step << " i " << i << " decay " << decay << " seed " << kSeed;
        ASSERT_EQ(m[i], m2[i]) << "m, step " << step << " i " << i;
        ASSERT_EQ(v[i], v2[i]) << "v, step " << step << " i " << i;
      }
    }
  }
}

}  // namespace

TEST(AdamW, MatchesTorchFormulasBitwiseFloat) { check_adamw_vs_torch_formulas<float>(); }
TEST(AdamW, MatchesTorchFormulasBitwiseDouble) { check_adamw_vs_torch_formulas<double>(); }

TEST(AdamW, FirstStepIsLrTimesSign) {
  // Mathematical check independent of the operation order: after one step from m = v = 0 the update is
  // lr * g / (|g| + eps) (bias corrections cancel), i.e. ~lr * sign(g) for |g| >> eps.
  AdamWHyper h;
  h.weight_decay = 0;
  std::vector<double> w = {1.0, -2.0, 0.5}, g = {0.3, -1e-3, 2.0}, m(3, 0.0), v(3, 0.0);
  const std::vector<double> w0 = w;
  adamw_step<double>(w.data(), g.data(), m.data(), v.data(), 3, h, 1, 1.0, true);
  for (int i = 0; i < 3; ++i) {
    const double want = w0[i] - h.lr * g[i] / (std::fabs(g[i]) + h.eps);
    EXPECT_NEAR(w[i], want, 1e-15) << i;
    EXPECT_GT(std::fabs(w[i] - w0[i]), 0.99 * h.lr);
  }
}

TEST(AdamW, DecayOnlyWhereRequested) {
  AdamWHyper h;
  h.lr = 0.01;
  h.weight_decay = 0.5;
  std::vector<float> w = {1.0f, -3.0f}, g = {0.0f, 0.0f}, m(2, 0.0f), v(2, 0.0f);
  std::vector<float> w_nd = w, m2 = m, v2 = v;
  adamw_step<float>(w.data(), g.data(), m.data(), v.data(), 2, h, 1, 1.0, /*decay=*/true);
  adamw_step<float>(w_nd.data(), g.data(), m2.data(), v2.data(), 2, h, 1, 1.0, /*decay=*/false);
  const float dec = static_cast<float>(1.0 - 0.01 * 0.5);
  EXPECT_EQ(w[0], 1.0f * dec);
  EXPECT_EQ(w[1], -3.0f * dec);
  EXPECT_EQ(w_nd[0], 1.0f);  // zero gradient, no decay: unchanged
  EXPECT_EQ(w_nd[1], -3.0f);
  EXPECT_THROW(adamw_step<float>(w.data(), g.data(), m.data(), v.data(), 2, h, 0, 1.0, true), Error);
}

TEST(AdamW, HyperJsonRoundTrip) {
  AdamWHyper h;
  h.lr = 2.5e-4;
  h.max_grad_norm = 0.5;
  const AdamWHyper r = AdamWHyper::from_json(h.to_json());
  EXPECT_EQ(r.lr, h.lr);
  EXPECT_EQ(r.beta1, h.beta1);
  EXPECT_EQ(r.beta2, h.beta2);
  EXPECT_EQ(r.eps, h.eps);
  EXPECT_EQ(r.weight_decay, h.weight_decay);
  EXPECT_EQ(r.max_grad_norm, h.max_grad_norm);
  EXPECT_THROW(AdamWHyper::from_json({{"lr", 1e-3}, {"momentum", 0.9}}), Error);
  EXPECT_THROW(AdamWHyper::from_json({{"lr", "fast"}}), Error);
}

TEST(ClipCoef, KnownNorms) {
  ExactAcc<double> acc;
  const std::vector<float> g = {3.0f, 4.0f};  // norm 5
  grad_sq_acc<float>(g.data(), 2, acc);
  EXPECT_EQ(clip_coef(acc, 1.0), 1.0 / (5.0 + 1e-6));
  EXPECT_EQ(clip_coef(acc, 10.0), 1.0);  // below the limit: no clipping
  EXPECT_EQ(clip_coef(acc, 0.0), 1.0);   // disabled
  ExactAcc<double> zero;
  EXPECT_EQ(clip_coef(zero, 1.0), 1.0);
  ExactAcc<double> nan_acc;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  grad_sq_acc<double>(&nan, 1, nan_acc);
  EXPECT_TRUE(std::isnan(clip_coef(nan_acc, 1.0)));
  ExactAcc<double> big;
  const double huge = 1e300;
  grad_sq_acc<double>(&huge, 1, big);
  EXPECT_EQ(clip_coef(big, 1.0), 0.0);  // +Inf norm -> coefficient 0
}

namespace {
// Exact sum of squares in MPFR (4400 bits cover 2^-1100 .. 2^1100 plus the count), rounded once to double.
template <class T>
double mpfr_sum_sq(const std::vector<T>& g) {
  mpfr_t s, x;
  mpfr_init2(s, 4400);
  mpfr_init2(x, 4400);
  mpfr_set_zero(s, 1);
  for (T v : g) {
    mpfr_set_d(x, static_cast<double>(v), MPFR_RNDN);  // exact
    mpfr_sqr(x, x, MPFR_RNDN);                           // exact at this precision
    mpfr_add(s, s, x, MPFR_RNDN);                        // exact
  }
  const double r = mpfr_get_d(s, MPFR_RNDN);
  mpfr_clear(s);
  mpfr_clear(x);
  return r;
}
}  // namespace

TEST(GradSqAcc, ExactVsMpfrFloat) {
  std::mt19937_64 rng(kSeed);
  std::uniform_int_distribution<int> ex(-149, 127);
  std::normal_distribution<double> nd;
  for (int rep = 0; rep < 20; ++rep) {
    std::vector<float> g(500);
    for (auto& x : g) x = static_cast<float>(std::ldexp(nd(rng), rep % 2 ? ex(rng) / 2 : ex(rng) % 8));
    g[0] = std::numeric_limits<float>::denorm_min();
    g[1] = -std::numeric_limits<float>::max();
    ExactAcc<double> acc;
    grad_sq_acc<float>(g.data(), static_cast<int64_t>(g.size()), acc);
    const double want = mpfr_sum_sq(g);
    ASSERT_GT(want, 0);
    EXPECT_EQ(std::bit_cast<uint64_t>(acc.round()), std::bit_cast<uint64_t>(want)) << "rep " << rep << " seed "
                                                                                     << kSeed;
  }
}

TEST(GradSqAcc, ExactVsMpfrDouble) {
  // |g| in [2^-480, 2^500]: the documented exact range of the Dekker two-square without FMA.
  std::mt19937_64 rng(kSeed + 1);
  std::uniform_int_distribution<int> ex(-470, 500);
  std::normal_distribution<double> nd;
  for (int rep = 0; rep < 20; ++rep) {
    std::vector<double> g(400);
    for (auto& x : g) x = std::ldexp(nd(rng), rep % 2 ? ex(rng) : ex(rng) % 4);
    // Sums of squares whose rounding depends on the low parts: many equal large terms and tiny ones.
    ExactAcc<double> acc;
    grad_sq_acc<double>(g.data(), static_cast<int64_t>(g.size()), acc);
    const double want = mpfr_sum_sq(g);
    EXPECT_EQ(std::bit_cast<uint64_t>(acc.round()), std::bit_cast<uint64_t>(want)) << "rep " << rep;
  }
  // A case that needs Dekker's low part: a = 1 + 2^-30, a^2 = 1 + 2^-29 + 2^-60. With two (2^-27)^2 = 2^-54
  // terms the exact sum is 1 + 2^-29 + 2^-53 + 2^-60: just above a rounding tie, so it rounds up to
  // 1 + 2^-29 + 2^-52; without the 2^-60 (or with a naive running sum) the result is 1 + 2^-29.
  const std::vector<double> g = {1.0 + std::ldexp(1.0, -30), std::ldexp(1.0, -27), std::ldexp(1.0, -27)};
  ExactAcc<double> acc;
  grad_sq_acc<double>(g.data(), 3, acc);
  const double want = 1.0 + std::ldexp(1.0, -29) + std::ldexp(1.0, -52);
  EXPECT_EQ(acc.round(), want);
  EXPECT_EQ(mpfr_sum_sq(g), want);
  double naive = 0;
  for (double x : g) naive += x * x;
  EXPECT_NE(naive, want) << "the input must separate exact and naive sums";
}

TEST(RouterBias, SignsTiesAndGammaZero) {
  {
    std::vector<float> b = {0.0f, 0.5f, -0.25f, 1.0f};
    const std::vector<int64_t> load = {1, 2, 3, 2};  // total 8, mean exactly 2
    router_bias_update(b.data(), load.data(), 4, 1e-3);
    const float g = static_cast<float>(1e-3);
    EXPECT_EQ(b[0], 0.0f + g);   // below the mean
    EXPECT_EQ(b[1], 0.5f);       // tie: unchanged
    EXPECT_EQ(b[2], -0.25f - g); // above
    EXPECT_EQ(b[3], 1.0f);       // tie
  }
  {
    std::vector<double> b = {0.0, 0.0, 0.0};
    const std::vector<int64_t> load = {1, 1, 2};  // mean 4/3: not an integer, compared exactly
    router_bias_update(b.data(), load.data(), 3, 0.01);
    EXPECT_EQ(b[0], 0.01);
    EXPECT_EQ(b[1], 0.01);
    EXPECT_EQ(b[2], -0.01);
  }
  {
    std::vector<double> b = {-0.0, 3.0};
    const std::vector<int64_t> load = {0, 10};
    router_bias_update(b.data(), load.data(), 2, 0.0);  // gamma 0 disables: bits unchanged
    EXPECT_TRUE(std::signbit(b[0]));
    EXPECT_EQ(b[1], 3.0);
  }
  {
    std::vector<float> b = {0.0f, 0.0f};
    const std::vector<int64_t> load = {5, 5};  // all equal: nothing moves
    router_bias_update(b.data(), load.data(), 2, 1e-3);
    EXPECT_EQ(b[0], 0.0f);
    EXPECT_EQ(b[1], 0.0f);
    const std::vector<int64_t> bad = {-1, 3};
    EXPECT_THROW(router_bias_update(b.data(), bad.data(), 2, 1e-3), Error);
  }
}

// Floats' squares are summed by exponent buckets in chunks of 2^15 elements: the same exact value as one add per
// square (normalised limbs and flags equal, so every merge and rounding too), over several chunks and a ragged end,
// with every exponent, subnormals, zeros, buckets filled near their limit (a chunk of FLT_MAX) and Inf / NaN.
TEST(GradSqAcc, FloatBucketsEqualOneAddPerSquare) {
  std::mt19937_64 rng(kSeed + 2);
  std::uniform_int_distribution<int> ex(-149, 127);
  std::normal_distribution<double> nd;
  const int64_t n = 3 * (int64_t{1} << 15) + 17;
  for (int variant = 0; variant < 4; ++variant) {
    std::vector<float> g(static_cast<size_t>(n));
    for (auto& x : g) x = static_cast<float>(std::ldexp(nd(rng), ex(rng)));
    if (variant == 1) std::fill(g.begin(), g.begin() + (int64_t{1} << 15), -std::numeric_limits<float>::max());
    if (variant == 2)
      for (auto& x : g) x = rng() % 3 == 0 ? 0.0f : rng() % 2 ? -std::numeric_limits<float>::denorm_min() : x;
    if (variant == 3) {
      g[5] = std::numeric_limits<float>::infinity();
      g[70000] = -std::numeric_limits<float>::infinity();
      g[n - 1] = std::numeric_limits<float>::quiet_NaN();
    }
    ExactAcc<double> want, got;
    for (float x : g) want.add(static_cast<double>(x) * static_cast<double>(x));
    grad_sq_acc<float>(g.data(), n, got);
    want.normalize();
    got.normalize();
    for (int i = 0; i < ExactAcc<double>::kLimbs; ++i)
      ASSERT_EQ(got.limb(i), want.limb(i)) << "limb " << i << "; repro: seed=" << kSeed + 2 << " variant=" << variant;
    ASSERT_EQ(got.flags(), want.flags()) << "variant " << variant;
    const double a = got.round(), b = want.round();
    ASSERT_EQ(std::bit_cast<uint64_t>(a), std::bit_cast<uint64_t>(b)) << "variant " << variant;
  }
}
