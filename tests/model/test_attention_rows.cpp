// attn_core_backward_rows (reference/model/attention.h): the key side written, not added, in a caller's row order
// (the step's zig-zag gather order) is exactly zeroed accumulators + attn_core_backward + the rows moved: same dq
// bits, same accumulator values (normalised limbs) row by row, whatever dkv held before (it is never read), for a
// CP rank's two zig-zag chunks and for whole sequences, several tiles (one empty), every policy. The key side as tile
// partials (attn_core_backward_partials, the step's all-to-all form) sums exactly to the same accumulators, with +0
// rows where a tile has no term. Bad row maps and blocks are one clear error.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <type_traits>
#include <cstring>
#include <numeric>
#include <random>
#include <string>

#include "reference/check.h"
#include "reference/model/attention.h"
#include "reference/model/params.h"
#include "reference/model/rows.h"

using namespace trident;
using namespace trident::model;

namespace {

template <class T>
void rows_case(Policy pol, bool zigzag_rank, bool random_rows, uint64_t seed) {
  const Config cfg = Config::preset("tiny");
  const CoreDims cd = CoreDims::from(cfg);
  const int64_t cp = 3, ch = 8, S = 2 * cp * ch;
  std::vector<int64_t> qpos;
  if (zigzag_rank) {  // cp rank 1 of 3: position blocks 1 and 4 (its queries reach keys up to 39 of 48)
    for (int64_t b : {int64_t{1}, 2 * cp - 1 - 1})
      for (int64_t w = 0; w < ch; ++w) qpos.push_back(b * ch + w);
  } else {
    for (int64_t p = 0; p < S; ++p) qpos.push_back(p);
  }
  const int64_t Nq = static_cast<int64_t>(qpos.size());
  std::vector<int64_t> qsegs = {0};
  for (int64_t r = ch; r < Nq; r += ch) qsegs.push_back(r);
  qsegs.push_back(Nq);
  qsegs.insert(qsegs.begin() + 1, 0);  // an empty tile first
  auto fill = [&](int64_t n, uint64_t stream) {
    std::vector<T> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      v[static_cast<size_t>(i)] = static_cast<T>(uniform_pm1(seed, stream, static_cast<uint64_t>(i)));
    return v;
  };
  const std::vector<T> q = fill(Nq * cd.H * cd.Dq, 1), kv = fill(S * cd.P, 2), dO = fill(Nq * cd.H * cd.Dv, 3);
  std::vector<T> o(static_cast<size_t>(Nq * cd.H * cd.Dv)), st(static_cast<size_t>(Nq * cd.H * 2));
  attn_core_forward<T>(pol, cd, q.data(), qpos.data(), Nq, kv.data(), S, o.data(), st.data());

  std::vector<int64_t> krow = zigzag_gather_rows(cp, ch);
  if (random_rows) {
    std::iota(krow.begin(), krow.end(), 0);
    std::shuffle(krow.begin(), krow.end(), std::mt19937_64(seed));
  }
  std::vector<T> dq1(static_cast<size_t>(Nq * cd.H * cd.Dq)), dq2 = dq1;
  std::vector<ExactAcc<T>> zeroed(static_cast<size_t>(S * cd.P)), written(zeroed.size());
  for (auto& a : written) a.add(T(3));  // what dkv held before: never read
  attn_core_backward<T>(pol, cd, q.data(), qpos.data(), Nq, kv.data(), S, o.data(), st.data(), dO.data(), qsegs,
                        dq1.data(), zeroed.data());
  attn_core_backward_rows<T>(pol, cd, q.data(), qpos.data(), Nq, kv.data(), S, o.data(), st.data(), dO.data(), qsegs,
                             dq2.data(), written.data(), krow);
  const std::string repro = "repro: policy " + std::string(to_string(pol)) + (zigzag_rank ? " zig-zag rank" : " all") +
                            (random_rows ? " random rows" : " gather rows") + " seed " + std::to_string(seed);
  EXPECT_EQ(std::memcmp(dq1.data(), dq2.data(), dq1.size() * sizeof(T)), 0) << repro;
  int64_t nonzero = 0, zero_rows = 0;
  for (int64_t j = 0; j < S; ++j) {
    bool any = false;
    for (int64_t c = 0; c < cd.P; ++c) {
      ExactAcc<T> a = zeroed[static_cast<size_t>(j * cd.P + c)], b = written[static_cast<size_t>(krow[j] * cd.P + c)];
      a.normalize();
      b.normalize();
      for (int i = 0; i < ExactAcc<T>::kLimbs; ++i)
        ASSERT_EQ(a.limb(i), b.limb(i)) << "key " << j << " slot " << c << "; " << repro;
      ASSERT_EQ(a.flags(), b.flags()) << repro;
      any = any || !a.is_zero();
    }
    nonzero += any;
    zero_rows += !any;
  }
  EXPECT_GT(nonzero, 0) << repro;
  if (zigzag_rank) {
    EXPECT_EQ(zero_rows, ch) << "keys past the rank's last query get no term; " << repro;
  }

  // The key side as tile partials in blocks of blk rows (the step's cp blocks of 2ch): every row written (part starts
  // as NaN), dq the same bits, each key's nt partial rows summing exactly to its accumulators, +0 rows for the tiles
  // that have no term for the key.
  const int64_t nt = static_cast<int64_t>(qsegs.size()) - 1, blk = 2 * ch;
  std::vector<T> part(static_cast<size_t>(nt * S * cd.P), std::numeric_limits<T>::quiet_NaN());
  std::vector<T> dq3(dq1.size());
  attn_core_backward_partials<T>(pol, cd, q.data(), qpos.data(), Nq, kv.data(), S, o.data(), st.data(), dO.data(),
                                 qsegs, dq3.data(), part.data(), krow, blk);
  EXPECT_EQ(std::memcmp(dq1.data(), dq3.data(), dq1.size() * sizeof(T)), 0) << repro;
  int64_t zero_parts = 0;
  for (int64_t j = 0; j < S; ++j) {
    const int64_t r = krow[static_cast<size_t>(j)];
    for (int64_t c = 0; c < cd.P; ++c) {
      ExactAcc<T> sum;
      for (int64_t t = 0; t < nt; ++t) {
        const T x = part[static_cast<size_t>(((r / blk * nt + t) * blk + r % blk) * cd.P + c)];
        ASSERT_FALSE(std::isnan(x)) << "key " << j << " tile " << t << " slot " << c << " not written; " << repro;
        const int64_t t0 = qsegs[static_cast<size_t>(t)], t1 = qsegs[static_cast<size_t>(t) + 1];
        const bool reached = std::any_of(qpos.begin() + t0, qpos.begin() + t1, [&](int64_t p) { return p >= j; });
        if (!reached) {
          using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
          ASSERT_EQ(std::bit_cast<Bits>(x), Bits{0})
              << "key " << j << " tile " << t << ": no term, +0; " << repro;
          ++zero_parts;
        }
        sum.add(x);
      }
      ExactAcc<T> a = zeroed[static_cast<size_t>(j * cd.P + c)];
      a.normalize();
      sum.normalize();
      for (int i = 0; i < ExactAcc<T>::kLimbs; ++i)
        ASSERT_EQ(a.limb(i), sum.limb(i)) << "partials of key " << j << " slot " << c << "; " << repro;
      ASSERT_EQ(a.flags(), sum.flags()) << repro;
    }
  }
  EXPECT_GT(zero_parts, 0) << repro;  // the empty tile's rows at least
}

}  // namespace

TEST(ModelAttention, BackwardRowsIsZeroedAddThenRowsMoved) {
  for (bool zz : {true, false})
    for (bool rnd : {false, true}) {
      rows_case<float>(Policy::fp32, zz, rnd, 41);
      rows_case<float>(Policy::bf16, zz, rnd, 42);
      rows_case<double>(Policy::fp64, zz, rnd, 43);
    }
}

TEST(ModelAttention, BackwardRowsRejectsBadRowMaps) {
  const Config cfg = Config::preset("tiny");
  const CoreDims cd = CoreDims::from(cfg);
  const int64_t S = 4, Nq = 1;
  const std::vector<int64_t> qpos = {3}, segs = {0, 1};
  std::vector<float> q(static_cast<size_t>(cd.H * cd.Dq), 0.5f), kv(static_cast<size_t>(S * cd.P), 0.25f),
      o(static_cast<size_t>(cd.H * cd.Dv)), st(static_cast<size_t>(cd.H * 2)), dO(o.size(), 1.0f), dq(q.size());
  attn_core_forward<float>(Policy::fp32, cd, q.data(), qpos.data(), Nq, kv.data(), S, o.data(), st.data());
  std::vector<ExactAcc<float>> acc(static_cast<size_t>(S * cd.P));
  auto run = [&](std::vector<int64_t> rows) {
    attn_core_backward_rows<float>(Policy::fp32, cd, q.data(), qpos.data(), Nq, kv.data(), S, o.data(), st.data(),
                                   dO.data(), segs, dq.data(), acc.data(), rows);
  };
  EXPECT_THROW(run({0, 1, 2}), Error);        // one row short
  EXPECT_THROW(run({0, 1, 1, 3}), Error);     // a row twice
  EXPECT_THROW(run({0, 1, 2, 4}), Error);     // a row outside [0, S)
  EXPECT_THROW(run({0, -1, 2, 3}), Error);
  EXPECT_NO_THROW(run({3, 2, 1, 0}));
  std::vector<float> part(static_cast<size_t>(S * cd.P));
  auto run_parts = [&](std::vector<int64_t> rows, int64_t blk) {
    attn_core_backward_partials<float>(Policy::fp32, cd, q.data(), qpos.data(), Nq, kv.data(), S, o.data(),
                                       st.data(), dO.data(), segs, dq.data(), part.data(), rows, blk);
  };
  EXPECT_THROW(run_parts({0, 1, 1, 3}, 2), Error);  // a row twice
  EXPECT_THROW(run_parts({0, 1, 2, 3}, 3), Error);  // blocks of 3 do not divide 4 keys
  EXPECT_THROW(run_parts({0, 1, 2, 3}, 0), Error);
  EXPECT_NO_THROW(run_parts({3, 2, 1, 0}, 2));
}
