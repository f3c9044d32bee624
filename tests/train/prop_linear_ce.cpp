// rapidcheck: for random shapes, chunk sizes, tile segmentations (including empty and ragged tiles), ignored
// targets and all three policies, the linear CE's results are bitwise independent of token_chunk, and the fused
// API equals forward + backward bitwise.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "reference/model/linear_ce.h"

using namespace trident;
using namespace trident::model;

namespace {

template <class T>
struct Out {
  std::vector<T> loss, lse, dh, dW;
  bool operator==(const Out& o) const {
    auto eq = [](const std::vector<T>& a, const std::vector<T>& b) {
      return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
    };
    return eq(loss, o.loss) && eq(lse, o.lse) && eq(dh, o.dh) && eq(dW, o.dW);
  }
};

template <class T>
void check(Policy pol) {
  const int64_t N = *rc::gen::inRange<int64_t>(1, 40);
  const int64_t d = *rc::gen::inRange<int64_t>(1, 12);
  const int64_t V = *rc::gen::inRange<int64_t>(1, 50);
  const int64_t vc = *rc::gen::inRange<int64_t>(1, 60);
  const int64_t tc = *rc::gen::inRange<int64_t>(1, 50);
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd;
  std::vector<T> h(N * d), W(d * V);
  for (auto& x : h) x = static_cast<T>(nd(rng));
  for (auto& x : W) x = static_cast<T>(nd(rng));
  std::vector<int32_t> tg(N);
  for (auto& t : tg) t = rng() % 5 == 0 ? kIgnoreIndex : static_cast<int32_t>(rng() % V);
  std::vector<int64_t> segs = {0};  // random tile lengths 0..6
  while (segs.back() < N) segs.push_back(std::min<int64_t>(N, segs.back() + static_cast<int64_t>(rng() % 7)));
  RC_TAG(to_string(pol));
  const int64_t nv = count_valid_targets(tg.data(), N);
  const T gs = static_cast<T>(1.0 / static_cast<double>(nv > 0 ? nv : 1));
  auto split = [&](int64_t chunk) {
    Out<T> o{std::vector<T>(N), std::vector<T>(N), std::vector<T>(N * d), std::vector<T>(d * V)};
    linear_ce_forward<T>(h.data(), W.data(), tg.data(), N, d, V, vc, pol, chunk, o.loss.data(), o.lse.data());
    std::vector<ExactAcc<T>> acc(d * V);
    linear_ce_backward<T>(h.data(), W.data(), tg.data(), o.lse.data(), N, d, V, vc, pol, chunk, gs, segs, o.dh.data(),
                          acc.data());
    exact_round<T>(acc.data(), o.dW.data(), d * V);
    return o;
  };
  auto fused = [&](int64_t chunk) {
    Out<T> o{std::vector<T>(N), std::vector<T>(N), std::vector<T>(N * d), std::vector<T>(d * V)};
    std::vector<ExactAcc<T>> acc(d * V);
    linear_ce_fused<T>(h.data(), W.data(), tg.data(), N, d, V, vc, pol, chunk, gs, segs, o.loss.data(), o.lse.data(),
                       o.dh.data(), acc.data());
    exact_round<T>(acc.data(), o.dW.data(), d * V);
    return o;
  };
  const Out<T> ref = split(N);
  RC_ASSERT(split(tc) == ref);
  RC_ASSERT(fused(tc) == ref);
  for (T x : ref.lse) RC_ASSERT(std::isfinite(static_cast<double>(x)));
}

}  // namespace

RC_GTEST_PROP(LinearCEProp, TokenChunkInvariantAndFusedEqualsSplitFp64, ()) { check<double>(Policy::fp64); }
RC_GTEST_PROP(LinearCEProp, TokenChunkInvariantAndFusedEqualsSplitFp32, ()) { check<float>(Policy::fp32); }
RC_GTEST_PROP(LinearCEProp, TokenChunkInvariantAndFusedEqualsSplitBf16, ()) { check<float>(Policy::bf16); }
