// rapidcheck properties of the numerics core: the exact sum is invariant under permutation and partition
// (incl. NaN/Inf/subnormals, merged through the wire format), and tile reductions are invariant under any
// partition of the tiles over parts, and their grouped float adds equal one exact add per partial.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "reference/exact_acc.h"
#include "reference/tile_reduce.h"

namespace {

using trident::ExactAcc;

// Any bit pattern (NaN, Inf, subnormals, zeros included), specials with extra weight, and values in a narrow
// band (to force carries and cancellations).
template <class T>
rc::Gen<T> any_value() {
  using B = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  const T lim = std::numeric_limits<T>::max();
  return rc::gen::weightedOneOf<T>({
      {6, rc::gen::map(rc::gen::arbitrary<B>(), [](B b) { return std::bit_cast<T>(b); })},
      {3, rc::gen::map(rc::gen::inRange(-1000000, 1000000), [](int i) { return static_cast<T>(i) / T(1024); })},
      {1, rc::gen::element<T>(T(0), -T(0), std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity(),
                              std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::denorm_min(),
                              -std::numeric_limits<T>::denorm_min(), lim, -lim)},
  });
}

// Finite values only (for checks that also compare against a reference without specials).
template <class T>
rc::Gen<T> finite_value() {
  return rc::gen::suchThat(any_value<T>(), [](T x) { return std::isfinite(x); });
}

template <class T>
auto bits(T x) {
  if constexpr (sizeof(T) == 4) return std::bit_cast<uint32_t>(x);
  else return std::bit_cast<uint64_t>(x);
}

template <class T>
T sum_of(const std::vector<T>& xs) {
  ExactAcc<T> a;
  for (T x : xs) a.add(x);
  return a.round();
}

template <class T>
void permutation_invariance(const std::vector<T>& xs, uint64_t seed) {
  std::vector<T> ys = xs;
  std::mt19937_64 rng(seed);
  std::shuffle(ys.begin(), ys.end(), rng);
  RC_ASSERT(bits(sum_of(xs)) == bits(sum_of(ys)));
}

template <class T>
void partition_invariance(const std::vector<T>& xs, int parts, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<ExactAcc<T>> acc(parts);
  for (T x : xs) acc[rng() % parts].add(x);
  // Through the wire format, merged in a random tree order (pairwise, shuffled).
  std::vector<std::byte> wire(parts * ExactAcc<T>::kBytes);
  trident::exact_serialize(acc.data(), parts, wire.data());
  std::vector<ExactAcc<T>> back(parts);
  trident::exact_deserialize(wire.data(), parts, back.data());
  while (back.size() > 1) {
    std::shuffle(back.begin(), back.end(), rng);
    back[0].merge(back.back());
    back.pop_back();
  }
  RC_ASSERT(bits(back[0].round()) == bits(sum_of(xs)));
}

RC_GTEST_PROP(ExactAccProp, PermutationInvarianceFloat, ()) {
  const auto xs = *rc::gen::container<std::vector<float>>(any_value<float>());
  permutation_invariance(xs, *rc::gen::arbitrary<uint64_t>());
}
RC_GTEST_PROP(ExactAccProp, PermutationInvarianceDouble, ()) {
  const auto xs = *rc::gen::container<std::vector<double>>(any_value<double>());
  permutation_invariance(xs, *rc::gen::arbitrary<uint64_t>());
}
RC_GTEST_PROP(ExactAccProp, PartitionInvarianceFloat, ()) {
  const auto xs = *rc::gen::container<std::vector<float>>(any_value<float>());
  partition_invariance(xs, *rc::gen::inRange(1, 65), *rc::gen::arbitrary<uint64_t>());
}
RC_GTEST_PROP(ExactAccProp, PartitionInvarianceDouble, ()) {
  const auto xs = *rc::gen::container<std::vector<double>>(any_value<double>());
  partition_invariance(xs, *rc::gen::inRange(1, 65), *rc::gen::arbitrary<uint64_t>());
}

// Values from one random exponent band (so no huge term hides errors in low-order limbs after rounding).
template <class T>
std::vector<T> band_values() {
  const int lo = sizeof(T) == 4 ? -149 : -1074, hi = sizeof(T) == 4 ? 100 : 1000;
  const int e = *rc::gen::inRange(lo, hi);
  const auto ints = *rc::gen::container<std::vector<int>>(rc::gen::inRange(-(1 << 23), 1 << 23));
  std::vector<T> xs;
  for (int i : ints) xs.push_back(std::ldexp(static_cast<T>(i), e));
  return xs;
}
RC_GTEST_PROP(ExactAccProp, PartitionInvarianceBandFloat, ()) {
  partition_invariance(band_values<float>(), *rc::gen::inRange(1, 65), *rc::gen::arbitrary<uint64_t>());
}
RC_GTEST_PROP(ExactAccProp, PartitionInvarianceBandDouble, ()) {
  partition_invariance(band_values<double>(), *rc::gen::inRange(1, 65), *rc::gen::arbitrary<uint64_t>());
}
RC_GTEST_PROP(ExactAccProp, PermutationInvarianceBandFloat, ()) {
  permutation_invariance(band_values<float>(), *rc::gen::arbitrary<uint64_t>());
}

// x + (-x) terms cancel exactly whatever else is in the sum.
RC_GTEST_PROP(ExactAccProp, CancellingPairsVanish, ()) {
  const auto xs = *rc::gen::container<std::vector<float>>(finite_value<float>());
  const auto ys = *rc::gen::container<std::vector<float>>(finite_value<float>());
  std::vector<float> all = xs;
  for (float y : ys) all.push_back(y), all.push_back(-y);
  std::mt19937_64 rng(*rc::gen::arbitrary<uint64_t>());
  std::shuffle(all.begin(), all.end(), rng);
  RC_ASSERT(bits(sum_of(all)) == bits(sum_of(xs)));
}

// Widening: ExactAcc<double> fed floats equals ExactAcc<double> fed the same values as doubles.
RC_GTEST_PROP(ExactAccProp, DoubleAccOfFloatsIsExactWidening, ()) {
  const auto xs = *rc::gen::container<std::vector<float>>(any_value<float>());
  ExactAcc<double> a, b;
  for (float x : xs) a.add(x), b.add(static_cast<double>(x));
  RC_ASSERT(bits(a.round()) == bits(b.round()));
}

// Tile partition invariance: tiles dealt to any number of parts, each accumulated alone, merged exactly.
RC_GTEST_PROP(TileProp, PartitionInvariance, ()) {
  const int64_t K = *rc::gen::inRange<int64_t>(1, 30), M = *rc::gen::inRange<int64_t>(1, 70);
  const int64_t tile = *rc::gen::inRange<int64_t>(1, 40);
  const int64_t N = *rc::gen::inRange<int64_t>(0, 300);
  const int parts = *rc::gen::inRange(1, 65);
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  std::mt19937_64 rng(seed);
  auto val = [&] { return static_cast<float>(static_cast<int64_t>(rng() >> 40) - (1 << 23)) * 0x1p-20f; };
  std::vector<float> X(N * K), dY(N * M);
  for (auto& x : X) x = val();
  for (auto& y : dY) y = val();
  const auto segs = trident::uniform_segments(N, tile);
  const int64_t n_tiles = static_cast<int64_t>(segs.size()) - 1;
  std::vector<float> ref(K * M);
  trident::tile_wgrad<float>(X.data(), K, dY.data(), M, K, M, segs, ref.data());
  std::vector<int> owner(n_tiles);
  for (auto& o : owner) o = static_cast<int>(rng() % parts);
  std::vector<ExactAcc<float>> total(K * M);
  for (int p = 0; p < parts; ++p) {
    std::vector<float> Xp, dYp;
    std::vector<int64_t> sp = {0};
    for (int64_t t = 0; t < n_tiles; ++t) {
      if (owner[t] != p) continue;
      Xp.insert(Xp.end(), X.begin() + segs[t] * K, X.begin() + segs[t + 1] * K);
      dYp.insert(dYp.end(), dY.begin() + segs[t] * M, dY.begin() + segs[t + 1] * M);
      sp.push_back(sp.back() + segs[t + 1] - segs[t]);
    }
    std::vector<ExactAcc<float>> acc(K * M);
    trident::tile_wgrad_acc<float>(Xp.data(), K, dYp.data(), M, K, M, sp, acc.data());
    trident::exact_merge(total.data(), acc.data(), K * M);
  }
  std::vector<float> got(K * M);
  trident::exact_round(total.data(), got.data(), K * M);
  RC_ASSERT(std::memcmp(got.data(), ref.data(), got.size() * sizeof(float)) == 0);
}

// Grouped adds (docs/numerics.md "Tile reductions"): tile_wgrad_acc's float path sums a group's partials in double
// where its exponent test proves that exact. Against one ExactAcc::add per partial written out here, over any values
// (specials, subnormals, the largest finite), tiles of 0..3 rows (groups of up to 32 partials) and block shapes on
// both sides of the group-size switch: the same exact values (normalised limbs) and flags.
RC_GTEST_PROP(TileProp, GroupedAddsEqualOneAddPerPartial, ()) {
  const int64_t K = *rc::gen::inRange<int64_t>(1, 60), M = *rc::gen::inRange<int64_t>(1, 140);
  const int64_t N = *rc::gen::inRange<int64_t>(0, 80);
  const auto X = *rc::gen::container<std::vector<float>>(static_cast<size_t>(N * K), any_value<float>());
  const auto dY = *rc::gen::container<std::vector<float>>(static_cast<size_t>(N * M), any_value<float>());
  std::mt19937_64 rng(*rc::gen::arbitrary<uint64_t>());
  std::vector<int64_t> segs = {0};
  while (segs.back() < N) segs.push_back(std::min<int64_t>(N, segs.back() + static_cast<int64_t>(rng() % 4)));
  std::vector<ExactAcc<float>> got(static_cast<size_t>(K * M)), want(got.size());
  trident::tile_wgrad_acc<float>(X.data(), K, dY.data(), M, K, M, segs, got.data());
  for (int64_t k = 0; k < K; ++k)
    for (int64_t m = 0; m < M; ++m)
      for (size_t t = 0; t + 1 < segs.size(); ++t) {
        if (segs[t] == segs[t + 1]) continue;
        float part = 0.0f;
        for (int64_t r = segs[t]; r < segs[t + 1]; ++r) part = part + X[r * K + k] * dY[r * M + m];
        want[static_cast<size_t>(k * M + m)].add(part);
      }
  for (size_t e = 0; e < got.size(); ++e) {
    ExactAcc<float> a = got[e], b = want[e];
    a.normalize();
    b.normalize();
    RC_ASSERT(a.flags() == b.flags());
    for (int i = 0; i < ExactAcc<float>::kLimbs; ++i) RC_ASSERT(a.limb(i) == b.limb(i));
  }
}

}  // namespace
