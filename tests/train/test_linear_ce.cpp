// Linear cross-entropy: agreement with a naive materialised oracle (long double) within the documented bound,
// bitwise invariances (token chunk, batch size, thread count, fused vs split), ignore_index, all-ignored
// batches, and input validation.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <random>
#include <vector>

#include "reference/bf16.h"
#include "reference/model/linear_ce.h"
#include "reference/tile_reduce.h"
#include "reference/tolerances.h"

using namespace trident;
using namespace trident::model;

namespace {

constexpr uint64_t kSeed = 0x7ce5eed;

// One linear-CE problem; repro() is the one line printed on failure.
template <class T>
struct Problem {
  int64_t N, d, V, vocab_chunk, tile;
  Policy policy;
  uint64_t seed;
  double scale = 3.0;  // logit spread: softmax far from uniform
  std::vector<T> hidden{}, W{};
  std::vector<int32_t> targets{};
  std::vector<int64_t> segs{};

  std::string repro() const {
    return fmt::format("linear_ce N={} d={} V={} vocab_chunk={} tile={} policy={} seed={:#x}", N, d, V, vocab_chunk,
                       tile, to_string(policy), seed);
  }
  void init(double ignore_frac = 0.2) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> nd;
    std::uniform_real_distribution<double> ud;
    hidden.resize(N * d);
    W.resize(d * V);
    targets.resize(N);
    for (auto& x : hidden) x = static_cast<T>(nd(rng));
    for (auto& x : W) x = static_cast<T>(nd(rng) * scale / std::sqrt(double(d)));
    for (auto& t : targets) t = ud(rng) < ignore_frac ? kIgnoreIndex : static_cast<int32_t>(rng() % V);
    // Tiles of `tile` rows, except a short one in the middle (sequence boundary) and the ragged end.
    segs = {0};
    for (int64_t r = 0; r < N;) {
      int64_t len = std::min(tile, N - r);
      if (segs.size() == 3 && len > 1) len -= 1;
      r += len;
      segs.push_back(r);
    }
  }
  T grad_scale() const {
    const int64_t n = count_valid_targets(targets.data(), N);
    return static_cast<T>(1.0 / static_cast<double>(std::max<int64_t>(n, 1)));
  }
};

template <class T>
struct Result {
  std::vector<T> loss, lse, dhidden, dW;
};

// A fresh Result, outputs pre-filled with junk so an unwritten value shows.
template <class T>
Result<T> fresh_result(const Problem<T>& p) {
  Result<T> r;
  r.loss.assign(p.N, T(-1));
  r.lse.assign(p.N, T(-1));
  r.dhidden.assign(p.N * p.d, T(-7));
  return r;
}

// The forward into a fresh Result.
template <class T>
Result<T> run_forward(const Problem<T>& p, int64_t token_chunk) {
  Result<T> r = fresh_result(p);
  linear_ce_forward<T>(p.hidden.data(), p.W.data(), p.targets.data(), p.N, p.d, p.V, p.vocab_chunk, p.policy,
                       token_chunk, r.loss.data(), r.lse.data());
  return r;
}

template <class T>
Result<T> run_split(const Problem<T>& p, int64_t token_chunk) {
  Result<T> r = run_forward(p, token_chunk);
  std::vector<ExactAcc<T>> acc(p.d * p.V);
  linear_ce_backward<T>(p.hidden.data(), p.W.data(), p.targets.data(), r.lse.data(), p.N, p.d, p.V, p.vocab_chunk,
                        p.policy, token_chunk, p.grad_scale(), p.segs, r.dhidden.data(), acc.data());
  r.dW.resize(p.d * p.V);
  exact_round<T>(acc.data(), r.dW.data(), p.d * p.V);
  return r;
}

template <class T>
Result<T> run_fused(const Problem<T>& p, int64_t token_chunk) {
  Result<T> r = fresh_result(p);
  std::vector<ExactAcc<T>> acc(p.d * p.V);
  linear_ce_fused<T>(p.hidden.data(), p.W.data(), p.targets.data(), p.N, p.d, p.V, p.vocab_chunk, p.policy,
                     token_chunk, p.grad_scale(), p.segs, r.loss.data(), r.lse.data(), r.dhidden.data(), acc.data());
  r.dW.resize(p.d * p.V);
  exact_round<T>(acc.data(), r.dW.data(), p.d * p.V);
  return r;
}

// The backward in column slices (cuts: vocab-chunk multiples, ascending, ending at V), each slice's dW in its own
// (d, width) accumulator, rounded and placed into the full dW; or (rounded) each slice's dW rounded straight into its
// (d, width) block by linear_ce_backward_cols_round.
template <class T>
Result<T> run_sliced(const Problem<T>& p, int64_t token_chunk, const std::vector<int64_t>& cuts, bool rounded = false,
                     bool partials = false) {
  Result<T> r = run_forward(p, token_chunk);
  r.dW.assign(p.d * p.V, T(-7));
  int64_t j0 = 0;
  for (int64_t j1 : cuts) {
    const int64_t w = j1 - j0;
    std::vector<T> part(p.d * w, T(-7));
    if (partials) {  // the tile partials in a send layout of blocks of 3 rows, summed exactly per element, rounded
      const int64_t nt = static_cast<int64_t>(p.segs.size()) - 1, br = 3, nb = (p.d + br - 1) / br;
      std::vector<T> buf(static_cast<size_t>(nb * nt * br * w), T(-7));
      const TilePartials<T> tp{buf.data(), w, br, nb, nt, 0};
      linear_ce_backward_cols_partials<T>(p.hidden.data(), p.W.data(), p.targets.data(), r.lse.data(), p.N, p.d, p.V,
                                          p.vocab_chunk, p.policy, token_chunk, p.grad_scale(), p.segs, j0, j1,
                                          r.dhidden.data(), tp);
      for (int64_t e = 0; e < p.d * w; ++e) {
        ExactAcc<T> a;
        for (int64_t t = 0; t < nt; ++t) a.add(*tp.at(t, e));
        part[static_cast<size_t>(e)] = a.round();
      }
    } else if (rounded) {
      linear_ce_backward_cols_round<T>(p.hidden.data(), p.W.data(), p.targets.data(), r.lse.data(), p.N, p.d, p.V,
                                       p.vocab_chunk, p.policy, token_chunk, p.grad_scale(), p.segs, j0, j1,
                                       r.dhidden.data(), part.data());
    } else {
      std::vector<ExactAcc<T>> acc(p.d * w);
      linear_ce_backward_cols<T>(p.hidden.data(), p.W.data(), p.targets.data(), r.lse.data(), p.N, p.d, p.V,
                                 p.vocab_chunk, p.policy, token_chunk, p.grad_scale(), p.segs, j0, j1,
                                 r.dhidden.data(), acc.data());
      exact_round<T>(acc.data(), part.data(), p.d * w);
    }
    for (int64_t k = 0; k < p.d; ++k) std::copy_n(part.data() + k * w, w, r.dW.data() + k * p.V + j0);
    j0 = j1;
  }
  return r;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}
template <class T>
void expect_same(const Result<T>& a, const Result<T>& b, const std::string& what) {
  EXPECT_TRUE(same_bits(a.loss, b.loss)) << what << ": loss";
  EXPECT_TRUE(same_bits(a.lse, b.lse)) << what << ": lse";
  EXPECT_TRUE(same_bits(a.dhidden, b.dhidden)) << what << ": dhidden";
  EXPECT_TRUE(same_bits(a.dW, b.dW)) << what << ": dW";
}

double l1(const auto& v) {
  double s = 0;
  for (auto x : v) s += std::fabs(static_cast<double>(x));
  return s;
}

// ---------------------------------------------------------------------------------------------------------------
// The naive oracle: materialised logits in long double from the policy's GEMM operands (bf16: rounded inputs),
// plus the per-element error bounds of docs/optimizer_and_loss.md built from reference/tolerances.h.
template <class T>
void check_against_oracle(const Problem<T>& p) {
  SCOPED_TRACE("repro: " + p.repro());
  using LD = long double;
  const bool bf = p.policy == Policy::bf16;
  const std::string acc_dt = p.policy == Policy::fp64 ? "fp64" : "fp32";  // accumulation dtype
  const std::string dl_dt = bf ? "bf16" : acc_dt;                         // dlogit storage dtype
  const double u = unit_roundoff(acc_dt);
  const int64_t N = p.N, d = p.d, V = p.V;
  const int64_t n_chunks = (V + p.vocab_chunk - 1) / p.vocab_chunk;
  auto op = [&](T x) -> LD { return bf ? static_cast<LD>(round_bf16(static_cast<float>(x))) : static_cast<LD>(x); };

  const Result<T> r = run_split(p, 5);
  const double gs = static_cast<double>(p.grad_scale());

  std::vector<LD> lo(N * V), dlo(N * V), dlo_bound(N * V), dlo_abs(N * V);
  double max_ratio = 0;
  auto track = [&](double err, double bound, const char* what, int64_t i) {
    if (bound > 0) max_ratio = std::max(max_ratio, err / bound);
    EXPECT_LE(err, bound) << what << " element " << i;
  };
  for (int64_t i = 0; i < N; ++i) {
    std::vector<double> lbound(V);
    LD mx = -INFINITY;
    for (int64_t j = 0; j < V; ++j) {
      LD s = 0, a = 0;
      for (int64_t k = 0; k < d; ++k) {
        s += op(p.hidden[i * d + k]) * op(p.W[k * V + j]);
        a += std::fabs(op(p.hidden[i * d + k]) * op(p.W[k * V + j]));
      }
      lo[i * V + j] = s;
      lbound[j] = tolerance_bound("linear_ce_logits", acc_dt, "vs_fp64", d, static_cast<double>(a));
      mx = std::max(mx, s);
    }
    LD se = 0;
    for (int64_t j = 0; j < V; ++j) se += std::exp(lo[i * V + j] - mx);
    const LD lse = mx + std::log(se);
    const double max_lb = *std::max_element(lbound.begin(), lbound.end());
    const double lse_bound =
        max_lb + tolerance_bound("linear_ce_lse", acc_dt, "vs_fp64", V + 2 * n_chunks, 1.0 + std::fabs(double(lse)));
    track(std::fabs(double(r.lse[i] - lse)), lse_bound, "lse", i);
    const int32_t t = p.targets[i];
    if (t == kIgnoreIndex) {
      EXPECT_EQ(r.loss[i], T(0)) << "ignored row " << i;
    } else {
      const LD loss = lse - lo[i * V + t];
      const double b = lse_bound + lbound[t] + u * std::fabs(double(loss));
      track(std::fabs(double(r.loss[i] - loss)), b, "loss", i);
    }
    for (int64_t j = 0; j < V; ++j) {
      if (t == kIgnoreIndex) {
        dlo[i * V + j] = 0;
        dlo_bound[i * V + j] = 0;
        dlo_abs[i * V + j] = 0;
        continue;
      }
      const LD pj = std::exp(lo[i * V + j] - lse);
      dlo[i * V + j] = (pj - (j == t ? 1 : 0)) * gs;
      // exp of an argument off by (logit err + lse err): relative error of the same size, then the documented
      // rounding of p, p - 1, the scaling (and bf16's dlogit rounding) from the dlogit entry.
      const double pa = double(pj) * std::fabs(gs);
      dlo_bound[i * V + j] = pa * (lbound[j] + lse_bound) * 1.01 +
                             tolerance_bound("linear_ce_dlogit", dl_dt, "vs_fp64", 0,
                                             pa * (1.0 + std::fabs(double(lo[i * V + j] - lse))) +
                                                 std::fabs(double(dlo[i * V + j])));
      dlo_abs[i * V + j] = std::fabs(dlo[i * V + j]) + dlo_bound[i * V + j];
    }
  }
  // dhidden[i, k] = sum_j dlogit[i, j] W[k, j]
  for (int64_t i = 0; i < N; ++i)
    for (int64_t k = 0; k < d; ++k) {
      LD s = 0;
      double prop = 0, a = 0;
      for (int64_t j = 0; j < V; ++j) {
        const LD w = op(p.W[k * V + j]);
        s += dlo[i * V + j] * w;
        prop += double(dlo_bound[i * V + j] * std::fabs(w));
        a += double(dlo_abs[i * V + j] * std::fabs(w));
      }
      const double b = prop + tolerance_bound("linear_ce_dhidden", acc_dt, "vs_fp64", V, a);
      track(std::fabs(double(r.dhidden[i * d + k] - s)), b, "dhidden", i * d + k);
    }
  // dW[k, j] = sum_i hidden[i, k] dlogit[i, j]
  for (int64_t k = 0; k < d; ++k)
    for (int64_t j = 0; j < V; ++j) {
      LD s = 0;
      double prop = 0, a = 0;
      for (int64_t i = 0; i < N; ++i) {
        const LD h = op(p.hidden[i * d + k]);
        s += h * dlo[i * V + j];
        prop += double(std::fabs(h) * dlo_bound[i * V + j]);
        a += double(std::fabs(h) * dlo_abs[i * V + j]);
      }
      const double b = prop + tolerance_bound("linear_ce_dw", acc_dt, "vs_fp64", p.tile, a);
      track(std::fabs(double(r.dW[k * V + j] - s)), b, "dW", k * V + j);
    }
  // Not vacuous: real gradients, and the bound is not absurdly loose for the forward.
  EXPECT_GT(l1(r.dhidden), 0);
  EXPECT_GT(l1(r.dW), 0);
  EXPECT_GT(l1(r.loss), 0);
  std::printf("[ oracle ] %s: max err/bound = %.3g\n", p.repro().c_str(), max_ratio);
}

template <class T>
Problem<T> small_problem(Policy pol, uint64_t seed = kSeed) {
  Problem<T> p{.N = 29, .d = 13, .V = 71, .vocab_chunk = 16, .tile = 4, .policy = pol, .seed = seed};
  p.init();
  return p;
}

}  // namespace

TEST(LinearCE, MatchesNaiveOracleFp64) { check_against_oracle(small_problem<double>(Policy::fp64)); }
TEST(LinearCE, MatchesNaiveOracleFp32) { check_against_oracle(small_problem<float>(Policy::fp32)); }
TEST(LinearCE, MatchesNaiveOracleBf16) { check_against_oracle(small_problem<float>(Policy::bf16)); }
TEST(LinearCE, MatchesNaiveOracleOneChunkAndChunkOfOne) {
  for (int64_t vc : {1, 71, 1000}) {
    auto p = small_problem<float>(Policy::fp32, kSeed + vc);
    p.vocab_chunk = vc;
    check_against_oracle(p);
  }
}

TEST(LinearCE, TokenChunkInvarianceBitwise) {
  auto check = [](auto p) {
    SCOPED_TRACE("repro: " + p.repro());
    const auto ref = run_split(p, p.N);
    for (int64_t tc : {int64_t(1), int64_t(3), int64_t(7)}) expect_same(run_split(p, tc), ref, fmt::format("split token_chunk {}", tc));
    for (int64_t tc : {int64_t(1), int64_t(3), int64_t(7), p.N}) expect_same(run_fused(p, tc), ref, fmt::format("fused token_chunk {}", tc));
    EXPECT_GT(l1(ref.dW), 0);
  };
  check(small_problem<double>(Policy::fp64));
  check(small_problem<float>(Policy::fp32));
  check(small_problem<float>(Policy::bf16));
}

// Vocabulary column slices (the distributed step's lm_head slices): ascending slices of whole vocab chunks give
// linear_ce_backward's bits, for one slice per chunk, uneven groupings and a short last chunk; 1 and 2 threads.
TEST(LinearCE, ColumnSlicesBitwise) {
  auto check = [](auto p) {
    SCOPED_TRACE("repro: " + p.repro());
    const auto ref = run_split(p, 5);
    const int64_t vc = p.vocab_chunk, V = p.V;
    ASSERT_GT(V % vc, 0);  // a short last chunk
    std::vector<int64_t> every;
    for (int64_t j = vc; j < V; j += vc) every.push_back(j);
    every.push_back(V);
    ASSERT_GE(every.size(), size_t{3});
    const int saved = omp_get_max_threads();
    for (int th : {1, 2}) {
      omp_set_num_threads(th);
      expect_same(run_sliced(p, 5, every), ref, fmt::format("one slice per chunk, {} threads", th));
      expect_same(run_sliced(p, 3, {vc, V}), ref, fmt::format("slices [0,vc) [vc,V), {} threads", th));
      expect_same(run_sliced(p, 5, {V - V % vc, V}), ref, fmt::format("all but the short chunk, {} threads", th));
    }
    omp_set_num_threads(saved);
    EXPECT_GT(l1(ref.dW), 0);
  };
  check(small_problem<double>(Policy::fp64));
  check(small_problem<float>(Policy::fp32));
  check(small_problem<float>(Policy::bf16));
  Problem<float> big{.N = 300, .d = 64, .V = 1500, .vocab_chunk = 256, .tile = 32, .policy = Policy::fp32,
                     .seed = kSeed + 2};  // large enough for the parallel regions
  big.init();
  check(big);
}

// The rounded form (the single-rank reference's head): linear_ce_backward's bits rounded, whole and in column slices,
// on 1-3 threads, with tiles summed in cache (up to 32 tiles, an empty one included) and through accumulators (more).
// The whole vocabulary and two column slices, rounded per slice (rounded) or summed from the slices' tile partials
// (partials), against the unsliced backward, on 1 to 3 threads.
template <class T>
void expect_slices_bitwise(const Problem<T>& p, bool rounded, bool partials) {
  SCOPED_TRACE("repro: " + p.repro());
  const auto ref = run_split(p, 5);
  const int64_t vc = p.vocab_chunk, V = p.V;
  const int saved = omp_get_max_threads();
  for (int th : {1, 2, 3}) {
    omp_set_num_threads(th);
    expect_same(run_sliced(p, 5, {V}, rounded, partials), ref, fmt::format("whole, {} threads", th));
    expect_same(run_sliced(p, 3, {vc, V}, rounded, partials), ref,
                fmt::format("slices [0,vc) [vc,V), {} threads", th));
  }
  omp_set_num_threads(saved);
  EXPECT_GT(l1(ref.dW), 0);
}

TEST(LinearCE, RoundedColumnsBitwise) {
  auto check = [](auto p) { expect_slices_bitwise(p, true, false); };
  check(small_problem<double>(Policy::fp64));
  check(small_problem<float>(Policy::fp32));
  check(small_problem<float>(Policy::bf16));
  for (int64_t tile : {32, 8}) {  // 10 tiles (in cache), 38 tiles (accumulators)
    Problem<float> big{.N = 300, .d = 64, .V = 1500, .vocab_chunk = 256, .tile = tile, .policy = Policy::fp32,
                       .seed = kSeed + 3};
    big.init();
    check(big);
  }
  Problem<float> gaps{.N = 200, .d = 48, .V = 700, .vocab_chunk = 128, .tile = 25, .policy = Policy::bf16,
                      .seed = kSeed + 4};
  gaps.init();
  gaps.segs.insert(gaps.segs.begin() + 2, gaps.segs[1]);  // an empty tile
  gaps.segs.insert(gaps.segs.end() - 1, gaps.segs[gaps.segs.size() - 2]);
  check(gaps);
  // No rows: dW is all +0.
  Problem<float> none{.N = 0, .d = 8, .V = 40, .vocab_chunk = 16, .tile = 4, .policy = Policy::fp32, .seed = 1};
  none.init();
  std::vector<float> dW(8 * 40, -7.0f);
  linear_ce_backward_cols_round<float>(nullptr, none.W.data(), nullptr, nullptr, 0, 8, 40, 16, Policy::fp32, 4, 1.0f,
                                       none.segs, 0, 40, nullptr, dW.data());
  for (float x : dW) ASSERT_EQ(std::bit_cast<uint32_t>(x), 0u);
}

// The distributed step's lm_head slices as tile partials (docs/parallel.md section 4): each slice's partials, summed
// exactly per element and rounded, give the unsliced backward's bits, on 1 to 3 threads.
TEST(LinearCE, ColumnPartialsSumToTheColumns) {
  auto check = [](auto p) { expect_slices_bitwise(p, false, true); };
  check(small_problem<double>(Policy::fp64));
  check(small_problem<float>(Policy::fp32));
  check(small_problem<float>(Policy::bf16));
  Problem<float> big{.N = 300, .d = 64, .V = 1500, .vocab_chunk = 256, .tile = 32, .policy = Policy::fp32,
                     .seed = kSeed + 3};
  big.init();
  check(big);
  // no rows: every partial +0; more tiles than the direct path holds: refused
  Problem<float> none{.N = 0, .d = 8, .V = 40, .vocab_chunk = 16, .tile = 4, .policy = Policy::fp32, .seed = 1};
  none.init();
  std::vector<float> buf(static_cast<size_t>(8 * 40), -7.0f);
  const std::vector<int64_t> segs{0, 0};
  linear_ce_backward_cols_partials<float>(nullptr, none.W.data(), nullptr, nullptr, 0, 8, 40, 16, Policy::fp32, 4, 1.0f,
                                          segs, 0, 40, nullptr, TilePartials<float>{buf.data(), 40, 8, 1, 1, 0});
  for (float x : buf) ASSERT_EQ(std::bit_cast<uint32_t>(x), 0u);
  std::vector<int64_t> many(40);
  for (size_t i = 0; i < many.size(); ++i) many[i] = 0;
  std::vector<float> big_buf(static_cast<size_t>(39 * 8 * 40));
  EXPECT_THROW(linear_ce_backward_cols_partials<float>(nullptr, none.W.data(), nullptr, nullptr, 0, 8, 40, 16,
                                                       Policy::fp32, 4, 1.0f, many, 0, 40, nullptr,
                                                       TilePartials<float>{big_buf.data(), 40, 8, 1, 39, 0}),
               Error);
}

TEST(LinearCE, ColumnSliceMustBeWholeChunks) {
  auto p = small_problem<float>(Policy::fp32);
  std::vector<float> loss(p.N), lse(p.N), dh(p.N * p.d);
  std::vector<ExactAcc<float>> acc(p.d * p.V);
  auto msg = [&](int64_t j0, int64_t j1) {
    try {
      linear_ce_backward_cols<float>(p.hidden.data(), p.W.data(), p.targets.data(), lse.data(), p.N, p.d, p.V,
                                     p.vocab_chunk, p.policy, 4, 1.0f, p.segs, j0, j1, dh.data(), acc.data());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg(1, p.vocab_chunk).find("whole vocab chunks"), std::string::npos);
  EXPECT_NE(msg(0, p.vocab_chunk + 1).find("whole vocab chunks"), std::string::npos);
  EXPECT_NE(msg(p.vocab_chunk, p.vocab_chunk).find("non-empty range"), std::string::npos);
  EXPECT_NE(msg(0, p.V + 1).find("non-empty range"), std::string::npos);
}

TEST(LinearCE, ThreadCountInvarianceBitwise) {
  // Big enough that the OpenMP regions really run in parallel.
  Problem<float> p{.N = 300, .d = 64, .V = 1500, .vocab_chunk = 256, .tile = 32, .policy = Policy::bf16,
                   .seed = kSeed + 1};
  p.init();
  SCOPED_TRACE("repro: " + p.repro());
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto one = run_split(p, 64);
  const auto one_fused = run_fused(p, 64);
  expect_same(one_fused, one, "fused vs split");
  for (int th : {2, 3, 5}) {  // uneven per-thread tile ranges, more threads than cores
    omp_set_num_threads(th);
    expect_same(run_split(p, 100), one, fmt::format("threads 1 vs {}", th));
  }
  omp_set_num_threads(saved);
  EXPECT_GT(l1(one.dW), 0);
}

TEST(LinearCE, BatchInvariantPerRow) {
  auto p = small_problem<float>(Policy::bf16);
  SCOPED_TRACE("repro: " + p.repro());
  const auto all = run_split(p, 8);
  for (int64_t i : {0L, 5L, p.N - 1}) {
    float loss = -1, lse = -1;
    linear_ce_forward<float>(p.hidden.data() + i * p.d, p.W.data(), p.targets.data() + i, 1, p.d, p.V,
                             p.vocab_chunk, p.policy, 1, &loss, &lse);
    EXPECT_EQ(std::bit_cast<uint32_t>(lse), std::bit_cast<uint32_t>(all.lse[i])) << "row " << i;
    EXPECT_EQ(std::bit_cast<uint32_t>(loss), std::bit_cast<uint32_t>(all.loss[i])) << "row " << i;
  }
}

TEST(LinearCE, IgnoredRowsContributeNothing) {
  // dW with ignored rows == dW of the same tiles with those rows removed (bitwise: +0 products change no
  // in-tile sum); dhidden rows of ignored targets are +0; their loss is 0.
  auto p = small_problem<float>(Policy::fp32);
  p.init(0.35);
  SCOPED_TRACE("repro: " + p.repro());
  const auto r = run_split(p, 6);
  Problem<float> q = p;
  q.hidden.clear();
  q.targets.clear();
  q.segs = {0};
  for (size_t t = 0; t + 1 < p.segs.size(); ++t) {
    for (int64_t i = p.segs[t]; i < p.segs[t + 1]; ++i)
      if (p.targets[i] != kIgnoreIndex) {
        q.targets.push_back(p.targets[i]);
        q.hidden.insert(q.hidden.end(), p.hidden.begin() + i * p.d, p.hidden.begin() + (i + 1) * p.d);
      }
    q.segs.push_back(static_cast<int64_t>(q.targets.size()));
  }
  q.N = static_cast<int64_t>(q.targets.size());
  ASSERT_LT(q.N, p.N);
  ASSERT_GT(q.N, 0);
  const auto s = run_split(q, 6);
  EXPECT_TRUE(same_bits(r.dW, s.dW));
  for (int64_t i = 0, k = 0; i < p.N; ++i) {
    if (p.targets[i] == kIgnoreIndex) {
      EXPECT_EQ(r.loss[i], 0.0f);
      for (int64_t c = 0; c < p.d; ++c) EXPECT_EQ(std::bit_cast<uint32_t>(r.dhidden[i * p.d + c]), 0u);
    } else {
      EXPECT_EQ(r.loss[i], s.loss[k]);
      EXPECT_EQ(r.lse[i], s.lse[k]);
      ++k;
    }
  }
}

TEST(LinearCE, AllIgnoredGivesZerosNotNaN) {
  auto p = small_problem<float>(Policy::bf16);
  std::fill(p.targets.begin(), p.targets.end(), kIgnoreIndex);
  SCOPED_TRACE("repro: " + p.repro());
  EXPECT_EQ(count_valid_targets(p.targets.data(), p.N), 0);
  std::vector<float> loss(p.N), lse(p.N), dh(p.N * p.d, 5.0f);
  std::vector<ExactAcc<float>> acc(p.d * p.V);
  // 1 / N_valid = +Inf for an all-ignored batch: still no NaN anywhere (ignored rows are never scaled).
  const float inf = std::numeric_limits<float>::infinity();
  linear_ce_forward<float>(p.hidden.data(), p.W.data(), p.targets.data(), p.N, p.d, p.V, p.vocab_chunk, p.policy, 4,
                           loss.data(), lse.data());
  linear_ce_backward<float>(p.hidden.data(), p.W.data(), p.targets.data(), lse.data(), p.N, p.d, p.V, p.vocab_chunk,
                            p.policy, 4, inf, p.segs, dh.data(), acc.data());
  for (float x : loss) EXPECT_EQ(x, 0.0f);
  for (float x : lse) EXPECT_TRUE(std::isfinite(x));
  for (float x : dh) EXPECT_EQ(std::bit_cast<uint32_t>(x), 0u);
  for (const auto& a : acc) EXPECT_TRUE(a.is_zero());
}

TEST(LinearCE, RejectsBadInput) {
  auto p = small_problem<float>(Policy::fp32);
  std::vector<float> loss(p.N), lse(p.N);
  p.targets[3] = static_cast<int32_t>(p.V);
  try {
    linear_ce_forward<float>(p.hidden.data(), p.W.data(), p.targets.data(), p.N, p.d, p.V, p.vocab_chunk, p.policy,
                             4, loss.data(), lse.data());
    ADD_FAILURE() << "out-of-range target accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 3"), std::string::npos) << e.what();
  }
  p.targets[3] = -1;
  EXPECT_THROW(linear_ce_forward<float>(p.hidden.data(), p.W.data(), p.targets.data(), p.N, p.d, p.V, p.vocab_chunk,
                                        p.policy, 4, loss.data(), lse.data()),
               Error);
  p.targets[3] = 0;
  EXPECT_THROW(linear_ce_forward<float>(p.hidden.data(), p.W.data(), p.targets.data(), p.N, p.d, p.V, 0, p.policy, 4,
                                        loss.data(), lse.data()),
               Error);
  EXPECT_THROW(linear_ce_forward<float>(p.hidden.data(), p.W.data(), p.targets.data(), p.N, p.d, p.V, p.vocab_chunk,
                                        Policy::fp64, 4, loss.data(), lse.data()),
               Error);
  std::vector<float> dh(p.N * p.d);
  std::vector<ExactAcc<float>> acc(p.d * p.V);
  const std::vector<int64_t> bad_segs = {0, 5, 3, p.N};
  EXPECT_THROW(linear_ce_backward<float>(p.hidden.data(), p.W.data(), p.targets.data(), lse.data(), p.N, p.d, p.V,
                                         p.vocab_chunk, p.policy, 4, 1.0f, bad_segs, dh.data(), acc.data()),
               Error);
  const std::vector<int64_t> short_segs = {0, 5};
  EXPECT_THROW(linear_ce_backward<float>(p.hidden.data(), p.W.data(), p.targets.data(), lse.data(), p.N, p.d, p.V,
                                         p.vocab_chunk, p.policy, 4, 1.0f, short_segs, dh.data(), acc.data()),
               Error);
}
