// Tile reductions: the documented definition (in-order fp partials per tile, exact sum, one rounding) checked
// against an independent oracle (naive partials + MPFR exact sum); any partition of the tiles over 1..64 parts,
// each accumulated separately and merged exactly (also through the wire format), gives the single-part bits;
// thread invariance; error bound vs fp64; every instruction-set copy of the loops gives the same bytes.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <mpfr.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "reference/check.h"
#include "reference/gemm.h"
#include "reference/tile_reduce.h"
#include "reference/tolerances.h"

namespace trident {
namespace {

template <class T>
std::vector<T> random_matrix(int64_t n, std::mt19937_64& rng) {
  std::normal_distribution<double> nd(0.0, 1.0);
  std::uniform_int_distribution<int> ex(-8, 8);
  std::vector<T> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<T>(std::ldexp(nd(rng), ex(rng)));
  return v;
}

// Random segments over n rows: tile sizes in [0, max_tile] (empty tiles included).
std::vector<int64_t> random_segments(int64_t n, int64_t max_tile, std::mt19937_64& rng) {
  std::vector<int64_t> segs = {0};
  while (segs.back() < n) segs.push_back(std::min<int64_t>(n, segs.back() + static_cast<int64_t>(rng() % (max_tile + 1))));
  return segs;
}

// Oracle: naive in-tile partials (documented order), MPFR exact sum of the partials, one RNE rounding.
template <class T>
std::vector<T> oracle_wgrad(const std::vector<T>& X, const std::vector<T>& dY, int64_t K, int64_t M,
                            const std::vector<int64_t>& segs) {
  std::vector<T> out(K * M);
  mpfr_t acc, r;
  mpfr_init2(acc, 2400);
  mpfr_init2(r, std::numeric_limits<T>::digits);
  for (int64_t k = 0; k < K; ++k)
    for (int64_t m = 0; m < M; ++m) {
      mpfr_set_zero(acc, 1);
      for (size_t t = 0; t + 1 < segs.size(); ++t) {
        T s = T(0);
        for (int64_t row = segs[t]; row < segs[t + 1]; ++row) {
          const T prod = X[row * K + k] * dY[row * M + m];
          s = s + prod;
        }
        mpfr_add_d(acc, acc, static_cast<double>(s), MPFR_RNDN);
      }
      mpfr_set(r, acc, MPFR_RNDN);  // normal range only in these tests (values ~ 2^-16 .. 2^16)
      T v = static_cast<T>(mpfr_get_d(r, MPFR_RNDN));
      out[k * M + m] = v == 0 ? T(0) : v;
    }
  mpfr_clear(acc);
  mpfr_clear(r);
  return out;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <class T>
class TileTest : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(TileTest, Types);

TYPED_TEST(TileTest, WgradMatchesOracle) {
  using T = TypeParam;
  const uint64_t seed = 101;
  std::mt19937_64 rng(seed);
  struct Case { int64_t N, K, M, max_tile; };
  const Case cases[] = {{1, 1, 1, 1}, {37, 5, 3, 4}, {300, 13, 37, 16}, {500, 50, 70, 64}, {700, 25, 65, 300}};
  for (const Case& c : cases) {
    auto X = random_matrix<T>(c.N * c.K, rng);
    auto dY = random_matrix<T>(c.N * c.M, rng);
    auto segs = random_segments(c.N, c.max_tile, rng);
    std::vector<T> dW(c.K * c.M);
    tile_wgrad<T>(X.data(), c.K, dY.data(), c.M, c.K, c.M, segs, dW.data());
    auto want = oracle_wgrad(X, dY, c.K, c.M, segs);
    ASSERT_TRUE(same_bits(dW, want)) << "repro: seed=" << seed << " N=" << c.N << " K=" << c.K << " M=" << c.M
                                     << " max_tile=" << c.max_tile;
    double norm = 0;
    for (T v : dW) norm += double(v) * double(v);
    EXPECT_GT(norm, 0.0);
  }
}

// tile_wgrad forms and rounds each block's sums in cache: the bits of zeroed accumulators + tile_wgrad_acc +
// exact_round, for shapes off the block sizes, 0 tiles, only empty tiles, one and several tile groups, special
// values, and a wider output matrix whose other columns stay untouched.
TYPED_TEST(TileTest, WgradEqualsAccumulateThenRound) {
  using T = TypeParam;
  const uint64_t seed = 111;
  std::mt19937_64 rng(seed);
  struct Case { int64_t N, K, M, max_tile; int64_t pad; bool specials; };
  const Case cases[] = {{0, 3, 5, 4, 0, false},     {9, 7, 3, 0, 2, false},     {40, 49, 129, 8, 0, false},
                        {300, 97, 131, 16, 3, false}, {200, 50, 260, 300, 1, true}, {1000, 20, 30, 12, 0, true}};
  for (const Case& c : cases) {
    auto X = random_matrix<T>(c.N * c.K, rng);
    auto dY = random_matrix<T>(c.N * c.M, rng);
    if (c.specials && c.N > 3) {
      X[1] = std::numeric_limits<T>::infinity();
      dY[c.M + 2] = std::numeric_limits<T>::quiet_NaN();
      X[2 * c.K + 3] = -std::numeric_limits<T>::infinity();
    }
    std::vector<int64_t> segs = c.max_tile == 0 ? std::vector<int64_t>{0, 0, 0} : random_segments(c.N, c.max_tile, rng);
    std::vector<ExactAcc<T>> acc(c.K * c.M);
    tile_wgrad_acc<T>(X.data(), c.K, dY.data(), c.M, c.K, c.M, segs, acc.data());
    std::vector<T> want(c.K * c.M);
    exact_round<T>(acc.data(), want.data(), c.K * c.M);
    const int64_t ld = c.M + c.pad;
    std::vector<T> wide(c.K * ld, T(7));
    tile_wgrad<T>(X.data(), c.K, dY.data(), c.M, c.K, c.M, segs, wide.data(), ld);
    std::vector<T> got(c.K * c.M);
    for (int64_t k = 0; k < c.K; ++k) {
      for (int64_t m = 0; m < c.M; ++m) got[k * c.M + m] = wide[k * ld + m];
      for (int64_t m = c.M; m < ld; ++m) ASSERT_EQ(wide[k * ld + m], T(7)) << "column outside the block written";
    }
    ASSERT_TRUE(same_bits(got, want)) << "repro: seed=" << seed << " N=" << c.N << " K=" << c.K << " M=" << c.M
                                      << " tiles=" << segs.size() - 1;
  }
}

// Small tiles (0..2 rows, so groups of up to 8 one- or two-row partials) over rows of very different scales: the
// float path sums an element's group in double only when its exponent window makes that exact, and adds each partial
// otherwise (spans past 26 binades, subnormal products, zeros, Inf / NaN). Both paths against per-partial exact adds
// written out here (the documented partials, ExactAcc::add one by one) and, for finite data, the MPFR oracle.
TYPED_TEST(TileTest, SmallTilesWideRanges) {
  using T = TypeParam;
  const uint64_t seed = 121;
  std::mt19937_64 rng(seed);
  const int64_t N = 400, K = 19, M = 133;
  for (int variant = 0; variant < 3; ++variant) {
    auto X = random_matrix<T>(N * K, rng);
    auto dY = random_matrix<T>(N * M, rng);
    for (int64_t r = 0; r < N; ++r) {  // row scales 2^-60 .. 2^40 (variant 1: 2^-140, subnormal products)
      const int sc = static_cast<int>(rng() % 101) - 60 - (variant == 1 && r % 3 == 0 ? 80 : 0);
      for (int64_t k = 0; k < K; ++k) X[r * K + k] = std::ldexp(X[r * K + k], sc);
      if (r % 7 == 0) X[r * K + r % K] = T(0);
    }
    if (variant == 2) {
      X[5 * K + 2] = std::numeric_limits<T>::infinity();
      dY[9 * M + 4] = std::numeric_limits<T>::quiet_NaN();
      X[30 * K + 7] = -std::numeric_limits<T>::infinity();
    }
    auto segs = random_segments(N, 2, rng);
    std::vector<ExactAcc<T>> want_acc(K * M), acc(K * M);
    for (int64_t k = 0; k < K; ++k)
      for (int64_t m = 0; m < M; ++m)
        for (size_t t = 0; t + 1 < segs.size(); ++t) {
          if (segs[t] == segs[t + 1]) continue;
          T part = T(0);
          for (int64_t r = segs[t]; r < segs[t + 1]; ++r) part = part + X[r * K + k] * dY[r * M + m];
          want_acc[k * M + m].add(part);
        }
    std::vector<T> want(K * M), got(K * M), got_acc(K * M);
    exact_round<T>(want_acc.data(), want.data(), K * M);
    tile_wgrad_acc<T>(X.data(), K, dY.data(), M, K, M, segs, acc.data());
    for (int64_t e = 0; e < K * M; ++e) {  // the same exact values (canonical limbs), not only the same roundings
      ExactAcc<T> a = acc[e], b = want_acc[e];
      a.normalize();
      b.normalize();
      for (int i = 0; i < ExactAcc<T>::kLimbs; ++i)
        ASSERT_EQ(a.limb(i), b.limb(i)) << "repro: seed=" << seed << " variant=" << variant << " element " << e;
      ASSERT_EQ(a.flags(), b.flags());
    }
    exact_round<T>(acc.data(), got_acc.data(), K * M);
    tile_wgrad<T>(X.data(), K, dY.data(), M, K, M, segs, got.data());
    ASSERT_TRUE(same_bits(got_acc, want)) << "repro: seed=" << seed << " variant=" << variant << " (tile_wgrad_acc)";
    ASSERT_TRUE(same_bits(got, want)) << "repro: seed=" << seed << " variant=" << variant << " (tile_wgrad)";
    if (variant == 0) {
      ASSERT_TRUE(same_bits(got, oracle_wgrad(X, dY, K, M, segs))) << "repro: seed=" << seed;
    }
  }
}

// Blocks whose every tile fits one group (a few tiles) are rounded without an accumulator where the result is known
// directly: no partial (+0), one finite partial (itself, -0 -> +0), a group summed exactly in double (converted once).
// Against the documented partials added one by one into ExactAcc, with partials chosen to hit every branch: exact
// cancellation to zero, -0, subnormal and overflowing sums, windows too wide for the double, Inf, -Inf and NaN.
TYPED_TEST(TileTest, OneGroupRoundsLikeTheAccumulator) {
  using T = TypeParam;
  using lim = std::numeric_limits<T>;
  const uint64_t seed = 131;
  std::mt19937_64 rng(seed);
  const T pool[] = {T(0), -T(0), T(1), T(-1), lim::max(), -lim::max(), lim::denorm_min(), -lim::denorm_min(),
                    lim::min(), std::ldexp(T(1), lim::min_exponent - 20), std::ldexp(T(1), lim::max_exponent - 30),
                    T(0.75), T(-0.75), lim::infinity(), -lim::infinity(), lim::quiet_NaN()};
  const int64_t K = 13, M = 141;  // two column blocks, the second narrow
  for (int64_t n_tiles : {1, 2, 3, 5, 8}) {
    for (int variant = 0; variant < 4; ++variant) {  // 0: no specials, 1: pool values, 2: cancellation, 3: all
      const int64_t N = n_tiles;                       // one row per tile: the partials are the products
      std::vector<T> X(static_cast<size_t>(N * K)), dY(static_cast<size_t>(N * M));
      std::normal_distribution<double> nd(0.0, 1.0);
      for (auto& x : X) x = static_cast<T>(std::ldexp(nd(rng), static_cast<int>(rng() % 61) - 30));
      for (auto& y : dY) y = static_cast<T>(std::ldexp(nd(rng), static_cast<int>(rng() % 41) - 20));
      if (variant == 3)  // zeros: -0 products, and Inf * 0, a NaN whose sign bit x86 sets
        for (auto& y : dY)
          if (rng() % 8 == 0) y = rng() % 2 ? T(0) : -T(0);
      if (variant == 1 || variant == 3)
        for (auto& x : X)
          if (rng() % 4 == 0) x = pool[rng() % (variant == 1 ? 13 : std::size(pool))];
      if (variant == 3) X[0] = lim::infinity(), X[1] = -lim::infinity(), X[2] = lim::quiet_NaN();  // row 0
      if (variant >= 2 && N >= 2)  // row 1 = -row 0 on half the columns: partials that cancel exactly
        for (int64_t k = 0; k < K; ++k) X[K + k] = -X[k];
      if (variant >= 2 && N >= 2)
        for (int64_t m = 0; m < M; m += 2) dY[M + m] = dY[m];
      std::vector<int64_t> segs(static_cast<size_t>(N + 1));
      for (int64_t t = 0; t <= N; ++t) segs[static_cast<size_t>(t)] = t;
      std::vector<T> want(static_cast<size_t>(K * M)), got(static_cast<size_t>(K * M), T(7));
      for (int64_t k = 0; k < K; ++k)
        for (int64_t m = 0; m < M; ++m) {
          ExactAcc<T> a;
          for (int64_t r = 0; r < N; ++r) a.add(T(0) + X[r * K + k] * dY[r * M + m]);
          want[static_cast<size_t>(k * M + m)] = a.round();
        }
      tile_wgrad<T>(X.data(), K, dY.data(), M, K, M, segs, got.data());
      for (int64_t e = 0; e < K * M; ++e)
        ASSERT_EQ(std::memcmp(&got[static_cast<size_t>(e)], &want[static_cast<size_t>(e)], sizeof(T)), 0)
            << "element " << e << ": got " << got[static_cast<size_t>(e)] << ", want " << want[static_cast<size_t>(e)]
            << "; repro: seed=" << seed << " tiles=" << n_tiles << " variant=" << variant;
    }
  }
}

// tile_sum_round: tile_sum_acc's sums rounded into an array (rows of any stride), the bits of zeroed accumulators +
// tile_sum_acc + exact_round, for no tiles, one group (up to 32 tiles) and several, empty tiles, a width past one
// column block, cancellation, wide windows and Inf / NaN.
TYPED_TEST(TileTest, SumRoundEqualsAccumulateThenRound) {
  using T = TypeParam;
  const uint64_t seed = 141;
  std::mt19937_64 rng(seed);
  const int64_t J = 300, ldx = 311;
  for (int64_t n_rows : {0, 1, 9, 40, 150}) {
    for (int variant = 0; variant < 2; ++variant) {
      std::vector<T> x(static_cast<size_t>(std::max<int64_t>(n_rows, 1) * ldx));
      std::normal_distribution<double> nd(0.0, 1.0);
      for (auto& v : x) v = static_cast<T>(std::ldexp(nd(rng), static_cast<int>(rng() % 81) - 40));
      if (variant == 1 && n_rows >= 2) {
        for (int64_t j = 0; j < J; j += 3) x[static_cast<size_t>(ldx + j)] = -x[static_cast<size_t>(j)];
        x[5] = std::numeric_limits<T>::infinity();
        x[static_cast<size_t>(ldx + 7)] = std::numeric_limits<T>::quiet_NaN();
      }
      std::vector<int64_t> segs = {0};
      while (segs.back() < n_rows) segs.push_back(std::min<int64_t>(n_rows, segs.back() + static_cast<int64_t>(rng() % 3)));
      if (n_rows == 0) segs.push_back(0);
      std::vector<T> dense(static_cast<size_t>(std::max<int64_t>(n_rows, 1) * J));  // tile_sum_acc takes stride J
      for (int64_t r = 0; r < n_rows; ++r)
        std::copy_n(x.data() + r * ldx, J, dense.data() + r * J);
      std::vector<ExactAcc<T>> acc(static_cast<size_t>(J));
      tile_sum_acc<T>(dense.data(), J, segs, acc.data());
      std::vector<T> want(static_cast<size_t>(J)), got(static_cast<size_t>(J), T(7));
      exact_round<T>(acc.data(), want.data(), J);
      tile_sum_round<T>(x.data(), ldx, J, segs, got.data());
      ASSERT_TRUE(same_bits(got, want)) << "repro: seed=" << seed << " rows=" << n_rows << " tiles="
                                        << segs.size() - 1 << " variant=" << variant;
    }
  }
}

// One-row tiles (the exchanged partials' merge: uniform_segments(n, 1)) are summed from the rows in place: the
// accumulators' bytes equal those of adding every element one by one (ExactAcc::add), for groups that are all
// one-row tiles (1, 31, 32, 33 and 130 rows: partial and several groups), a group with a two-row tile (its rounded
// partial, the generic path), -0,
// subnormals, cancellation, wide windows (the one-by-one path), Inf and NaN.
TYPED_TEST(TileTest, OneRowTilesSumInPlaceAsAddedOneByOne) {
  using T = TypeParam;
  const uint64_t seed = 151;
  std::mt19937_64 rng(seed);
  const int64_t J = 300;
  for (int64_t n_rows : {1, 31, 32, 33, 130}) {
    for (int variant = 0; variant < 3; ++variant) {
      std::vector<T> x(static_cast<size_t>(n_rows * J));
      std::normal_distribution<double> nd(0.0, 1.0);
      const int span = variant == 2 ? 121 : 21;  // variant 2: windows too wide for the grouped double
      for (auto& v : x) v = static_cast<T>(std::ldexp(nd(rng), static_cast<int>(rng() % span) - span / 2));
      if (variant >= 1) {
        for (int64_t j = 0; j < J; j += 5) x[static_cast<size_t>(j)] = T(-0.0);
        if (n_rows >= 2)
          for (int64_t j = 1; j < J; j += 3) x[static_cast<size_t>(J + j)] = -x[static_cast<size_t>(j)];
        x[static_cast<size_t>(n_rows * J - 2)] = std::numeric_limits<T>::denorm_min();
        x[7] = std::numeric_limits<T>::infinity();
        x[static_cast<size_t>((n_rows - 1) * J + 9)] = std::numeric_limits<T>::quiet_NaN();
      }
      for (bool mixed : {false, true}) {
        if (mixed && n_rows < 3) continue;
        std::vector<int64_t> segs = uniform_segments(n_rows, 1);
        if (mixed) segs.erase(segs.begin() + 1);  // rows 0-1 one tile (its partial rounded): the generic path
        std::vector<ExactAcc<T>> want(static_cast<size_t>(J));
        for (int64_t j = 0; j < J; ++j) {
          const auto at = [&](int64_t r) { return x[static_cast<size_t>(r * J + j)]; };
          if (mixed) want[static_cast<size_t>(j)].add((T(0) + at(0)) + at(1));
          for (int64_t r = mixed ? 2 : 0; r < n_rows; ++r) want[static_cast<size_t>(j)].add(at(r));
        }
        std::vector<ExactAcc<T>> got(static_cast<size_t>(J));
        tile_sum_acc<T>(x.data(), J, segs, got.data());
        for (int64_t j = 0; j < J; ++j) {
          ExactAcc<T> a = got[static_cast<size_t>(j)], b = want[static_cast<size_t>(j)];
          a.normalize();
          b.normalize();
          ASSERT_EQ(std::memcmp(&a, &b, sizeof a), 0) << "repro: seed=" << seed << " rows=" << n_rows
                                                       << " variant=" << variant << " mixed=" << mixed << " j=" << j;
        }
      }
    }
  }
}

// Any partition of the tiles over P parts ("ranks"), each accumulated separately, merged exactly.
// tile_wgrad_partials: each partial at its documented place in the send layout (blocks of rows, then tile, then the
// block's rows), a column block of a wider tensor (off, ld) included, and padding rows untouched; the partials of each
// element, read back from the layout and summed as one-row tiles (tile_sum_acc) then rounded, equal tile_wgrad's bits
// (empty tiles give +0 partials, which add nothing).
TYPED_TEST(TileTest, PartialsInTheSendLayoutSumToTheWgrad) {
  using T = TypeParam;
  const uint64_t seed = 211;
  std::mt19937_64 rng(seed);
  struct Case { int64_t N, K, M, row, col0, block_rows, max_tile; };
  // row: the tensor's row width (M, or wider: a column block at col0); rows K padded up to a multiple of block_rows
  const Case cases[] = {{16, 8, 5, 5, 0, 3, 8}, {40, 13, 7, 21, 7, 4, 9}, {9, 1, 1, 1, 0, 1, 4}, {64, 6, 33, 33, 0, 6, 0}};
  for (const Case& c : cases) {
    const std::string repro = fmt::format("repro: seed={} N={} K={} M={} row={} col0={} block_rows={} max_tile={}",
                                          seed, c.N, c.K, c.M, c.row, c.col0, c.block_rows, c.max_tile);
    auto X = random_matrix<T>(c.N * c.K, rng);
    auto dY = random_matrix<T>(c.N * c.M, rng);
    std::vector<int64_t> segs = c.max_tile > 0 ? random_segments(c.N, c.max_tile, rng) : std::vector<int64_t>{0, 0, c.N};
    const int64_t nt = static_cast<int64_t>(segs.size()) - 1, blocks = (c.K + c.block_rows - 1) / c.block_rows;
    const T canary = T(-7.25);
    std::vector<T> buf(static_cast<size_t>(blocks * nt * c.block_rows * c.row), canary);
    const TilePartials<T> tp{buf.data(), c.row, c.block_rows, blocks, nt, 0};
    tile_wgrad_partials<T>(X.data(), c.K, dY.data(), c.M, c.K, c.M, segs, tp + c.col0, c.row);
    std::vector<T> want(static_cast<size_t>(c.K * c.M));
    tile_wgrad<T>(X.data(), c.K, dY.data(), c.M, c.K, c.M, segs, want.data());
    for (int64_t k = 0; k < c.K; ++k)
      for (int64_t m = 0; m < c.M; ++m) {
        std::vector<T> parts(static_cast<size_t>(nt));
        for (int64_t t = 0; t < nt; ++t) {
          const size_t at = static_cast<size_t>(((k / c.block_rows) * nt + t) * c.block_rows * c.row +
                                                (k % c.block_rows) * c.row + c.col0 + m);
          ASSERT_EQ(tp.at(t, c.col0 + k * c.row + m), buf.data() + at) << repro;
          parts[static_cast<size_t>(t)] = buf[at];
          buf[at] = canary;  // read: every other place must still hold the canary
        }
        ExactAcc<T> acc;
        tile_sum_acc<T>(parts.data(), 1, uniform_segments(nt, 1), &acc);
        const T got = acc.round();
        ASSERT_EQ(std::memcmp(&got, &want[static_cast<size_t>(k * c.M + m)], sizeof(T)), 0)
            << repro << " element (" << k << ", " << m << ")";
      }
    for (size_t i = 0; i < buf.size(); ++i) ASSERT_EQ(buf[i], canary) << repro << " wrote outside its places at " << i;
  }
  // a block straddling the tensor's rows, or segs with the wrong tile count: refused
  std::vector<T> X(8, T(1)), buf(64);
  const std::vector<int64_t> segs{0, 2, 4};
  EXPECT_THROW(tile_wgrad_partials<T>(X.data(), 2, X.data(), 2, 2, 2, segs, TilePartials<T>{buf.data(), 3, 2, 1, 2, 2}, 3),
               std::exception);
  EXPECT_THROW(tile_wgrad_partials<T>(X.data(), 2, X.data(), 2, 2, 2, segs, TilePartials<T>{buf.data(), 2, 2, 1, 3, 0}, 2),
               std::exception);
}

TYPED_TEST(TileTest, PartitionInvariance) {
  using T = TypeParam;
  const uint64_t seed = 202;
  std::mt19937_64 rng(seed);
  const int64_t N = 640, K = 30, M = 70;
  auto X = random_matrix<T>(N * K, rng);
  auto dY = random_matrix<T>(N * M, rng);
  auto segs = uniform_segments(N, 8);  // 80 tiles
  const int64_t n_tiles = static_cast<int64_t>(segs.size()) - 1;
  std::vector<T> ref(K * M);
  tile_wgrad<T>(X.data(), K, dY.data(), M, K, M, segs, ref.data());
  std::vector<T> ref_sum(M);
  {
    std::vector<ExactAcc<T>> a(M);
    tile_sum_acc<T>(dY.data(), M, segs, a.data());
    exact_round<T>(a.data(), ref_sum.data(), M);
  }
  for (int parts = 1; parts <= 64; ++parts) {
    const bool scattered = parts % 2 == 0;  // even: tiles dealt to random parts; odd: contiguous ranges
    std::vector<int> owner(n_tiles);
    if (scattered) {
      for (auto& o : owner) o = static_cast<int>(rng() % parts);
    } else {
      std::vector<int64_t> cuts(parts - 1);
      for (auto& c : cuts) c = static_cast<int64_t>(rng() % (n_tiles + 1));
      std::sort(cuts.begin(), cuts.end());
      for (int64_t t = 0; t < n_tiles; ++t)
        owner[t] = static_cast<int>(std::upper_bound(cuts.begin(), cuts.end(), t) - cuts.begin());
    }
    // Each part gathers its tiles' rows (as a rank would hold them) and accumulates them.
    std::vector<std::vector<ExactAcc<T>>> acc(parts, std::vector<ExactAcc<T>>(K * M));
    std::vector<std::vector<ExactAcc<T>>> sacc(parts, std::vector<ExactAcc<T>>(M));
    for (int p = 0; p < parts; ++p) {
      std::vector<T> Xp, dYp;
      std::vector<int64_t> sp = {0};
      for (int64_t t = 0; t < n_tiles; ++t) {
        if (owner[t] != p) continue;
        Xp.insert(Xp.end(), X.begin() + segs[t] * K, X.begin() + segs[t + 1] * K);
        dYp.insert(dYp.end(), dY.begin() + segs[t] * M, dY.begin() + segs[t + 1] * M);
        sp.push_back(sp.back() + segs[t + 1] - segs[t]);
      }
      tile_wgrad_acc<T>(Xp.data(), K, dYp.data(), M, K, M, sp, acc[p].data());
      tile_sum_acc<T>(dYp.data(), M, sp, sacc[p].data());
    }
    // Merge: odd parts through the wire format, in a shuffled order.
    std::vector<int> order(parts);
    for (int p = 0; p < parts; ++p) order[p] = p;
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<ExactAcc<T>> total(K * M), stotal(M);
    for (int p : order) {
      if (p % 2) {
        std::vector<std::byte> wire(K * M * ExactAcc<T>::kBytes);
        exact_serialize(acc[p].data(), K * M, wire.data());
        std::vector<ExactAcc<T>> back(K * M);
        exact_deserialize(wire.data(), K * M, back.data());
        exact_merge(total.data(), back.data(), K * M);
      } else {
        exact_merge(total.data(), acc[p].data(), K * M);
      }
      exact_merge(stotal.data(), sacc[p].data(), M);
    }
    std::vector<T> got(K * M), sgot(M);
    exact_round<T>(total.data(), got.data(), K * M);
    exact_round<T>(stotal.data(), sgot.data(), M);
    ASSERT_TRUE(same_bits(got, ref)) << "repro: seed=" << seed << " parts=" << parts << " scattered=" << scattered;
    ASSERT_TRUE(same_bits(sgot, ref_sum)) << "tile_sum parts=" << parts;
  }
}

// The tiles matter: a different tiling of the same rows gives (generally) different bits, so the partition
// test above cannot pass vacuously.
TEST(TileReduce, TilingIsPartOfTheDefinition) {
  std::mt19937_64 rng(303);
  const int64_t N = 512, K = 16, M = 16;
  auto X = random_matrix<float>(N * K, rng);
  auto dY = random_matrix<float>(N * M, rng);
  std::vector<float> a(K * M), b(K * M);
  tile_wgrad<float>(X.data(), K, dY.data(), M, K, M, uniform_segments(N, 16), a.data());
  tile_wgrad<float>(X.data(), K, dY.data(), M, K, M, uniform_segments(N, 64), b.data());
  EXPECT_FALSE(same_bits(a, b));
}

TYPED_TEST(TileTest, ThreadInvariance) {
  using T = TypeParam;
  std::mt19937_64 rng(404);
  const int64_t N = 1024, K = 100, M = 130;
  auto X = random_matrix<T>(N * K, rng);
  auto dY = random_matrix<T>(N * M, rng);
  auto segs = uniform_segments(N, 32);
  const int saved = omp_get_max_threads();
  std::vector<T> ref, sref;
  for (int th : {1, 2, 4}) {
    omp_set_num_threads(th);
    std::vector<T> dW(K * M), s(M);
    tile_wgrad<T>(X.data(), K, dY.data(), M, K, M, segs, dW.data());
    std::vector<ExactAcc<T>> a(M);
    tile_sum_acc<T>(dY.data(), M, segs, a.data());
    exact_round<T>(a.data(), s.data(), M);
    if (ref.empty()) ref = dW, sref = s;
    ASSERT_TRUE(same_bits(dW, ref)) << "threads=" << th;
    ASSERT_TRUE(same_bits(s, sref)) << "threads=" << th;
  }
  omp_set_num_threads(saved);
}

TEST(TileReduce, WithinErrorBoundOfFp64) {
  std::mt19937_64 rng(505);
  const int64_t N = 1000, K = 20, M = 30, tile = 128;
  auto X = random_matrix<float>(N * K, rng);
  auto dY = random_matrix<float>(N * M, rng);
  std::vector<float> dW(K * M);
  tile_wgrad<float>(X.data(), K, dY.data(), M, K, M, uniform_segments(N, tile), dW.data());
  double norm = 0;
  for (int64_t k = 0; k < K; ++k)
    for (int64_t m = 0; m < M; ++m) {
      double exact = 0, sum_abs = 0;
      for (int64_t r = 0; r < N; ++r) {
        const double p = double(X[r * K + k]) * double(dY[r * M + m]);
        exact += p;
        sum_abs += std::fabs(p);
      }
      ASSERT_LE(std::fabs(dW[k * M + m] - exact), tolerance_bound("tile_wgrad", "fp32", "vs_fp64", tile, sum_abs))
          << "k=" << k << " m=" << m;
      norm += exact * exact;
    }
  EXPECT_GT(norm, 1.0);
}

TEST(TileReduce, EdgeCases) {
  // Segments not starting at 0, empty tiles, negative zeros -> +0, bad segments rejected.
  std::vector<float> x = {-0.0f, -0.0f, 1.0f, 2.0f, -0.0f, -0.0f};  // (3, 2)
  std::vector<int64_t> segs = {2, 2, 3};                            // only row 2 (an empty tile first)
  std::vector<ExactAcc<float>> a(2);
  tile_sum_acc<float>(x.data(), 2, segs, a.data());
  EXPECT_EQ(std::bit_cast<uint32_t>(a[0].round()), 0u);  // -0 + ... from +0 is +0
  std::vector<int64_t> all = {0, 1, 3};
  std::vector<ExactAcc<float>> b(2);
  tile_sum_acc<float>(x.data(), 2, all, b.data());
  EXPECT_EQ(b[0].round(), 1.0f);
  EXPECT_EQ(b[1].round(), 2.0f);
  std::vector<int64_t> bad = {0, 2, 1};
  EXPECT_THROW(tile_sum_acc<float>(x.data(), 2, bad, b.data()), Error);
  EXPECT_THROW(uniform_segments(10, 0), Error);
  EXPECT_EQ(uniform_segments(10, 4), (std::vector<int64_t>{0, 4, 8, 10}));
  EXPECT_EQ(uniform_segments(0, 4), (std::vector<int64_t>{0}));
}

// The loops are compiled once per instruction set (reference/tile_reduce_kernel.h) and follow the GEMM's choice:
// every copy the CPU runs must give the baseline copy's bytes, accumulators included, on data that takes both the
// grouped double adds and the partial-by-partial path (exponents 2^-60..2^60 in one element's partials), special
// values, empty tiles and blocks cut at odd sizes.
template <class T>
void expect_copies_agree(uint64_t seed) {
  const GemmIsa saved = gemm_isa();
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::uniform_int_distribution<int> wide(-60, 60), narrow(-4, 4);
  const int64_t N = 300, K = 53, M = 141;  // blocks of 48 x 128 cut at odd sizes
  auto fill = [&](int64_t n, bool spread) {
    std::vector<T> v(static_cast<size_t>(n));
    for (auto& x : v) x = static_cast<T>(std::ldexp(nd(rng), spread ? wide(rng) : narrow(rng)));
    return v;
  };
  std::vector<T> X = fill(N * K, false), dY = fill(N * M, false), xs = fill(N * M, false);
  for (int64_t r = 0; r < N; r += 7) dY[static_cast<size_t>(r * M + r % M)] = fill(1, true)[0];  // spread elements
  for (int64_t i = 0; i < 40; ++i) xs[rng() % xs.size()] = fill(1, true)[0];
  const T specials[] = {std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity(),
                        -std::numeric_limits<T>::infinity(), T(-0.0), std::numeric_limits<T>::denorm_min(),
                        std::numeric_limits<T>::max()};
  for (const T v : specials) X[rng() % X.size()] = v, xs[rng() % xs.size()] = v;
  const std::vector<int64_t> segs = random_segments(N, 9, rng);  // up to 9 rows, empty tiles included
  struct Out {
    std::vector<T> dw;
    std::vector<ExactAcc<T>> wacc, sacc;
  };
  auto run = [&]() {
    Out o;
    o.dw.assign(static_cast<size_t>(K * (M + 3)), T(-7));
    tile_wgrad<T>(X.data(), K, dY.data(), M, K, M, segs, o.dw.data(), M + 3);
    o.wacc.assign(static_cast<size_t>(K * M), ExactAcc<T>());
    tile_wgrad_acc<T>(X.data(), K, dY.data(), M, K, M, segs, o.wacc.data());
    o.sacc.assign(static_cast<size_t>(M), ExactAcc<T>());
    tile_sum_acc<T>(xs.data(), M, segs, o.sacc.data());
    return o;
  };
  set_gemm_isa(GemmIsa::baseline);
  const Out want = run();
  for (GemmIsa isa : {GemmIsa::avx2, GemmIsa::avx512}) {
    if (!gemm_isa_supported(isa)) {
      std::printf("copy %s: not run by this CPU or build\n", gemm_isa_name(isa));
      continue;
    }
    set_gemm_isa(isa);
    const Out got = run();
    const std::string repro = fmt::format("repro: seed={} copy={}", seed, gemm_isa_name(isa));
    EXPECT_EQ(std::memcmp(got.dw.data(), want.dw.data(), want.dw.size() * sizeof(T)), 0) << "tile_wgrad " << repro;
    EXPECT_EQ(std::memcmp(got.wacc.data(), want.wacc.data(), want.wacc.size() * sizeof(ExactAcc<T>)), 0)
        << "tile_wgrad_acc " << repro;
    EXPECT_EQ(std::memcmp(got.sacc.data(), want.sacc.data(), want.sacc.size() * sizeof(ExactAcc<T>)), 0)
        << "tile_sum_acc " << repro;
  }
  set_gemm_isa(saved);
}

TEST(TileReduce, EveryInstructionSetCopyGivesTheSameBytes) {
  for (uint64_t seed : {11u, 12u, 13u}) {
    expect_copies_agree<float>(seed);
    expect_copies_agree<double>(seed);
  }
}

}  // namespace
}  // namespace trident
