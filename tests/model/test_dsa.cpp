// DSA in the reference (docs/model.md "Sparse attention (DSA)"): the selection is the top-k of the index scores with
// ties to the lower position (checked against a full sort), selecting every key gives the dense core's bits, a kept
// selection is attended as given (full recompute never selects again), the indexer loss's KL terms are those of an
// fp64 evaluation, and bad selections, NaN scores and bad configs are one clear error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "reference/check.h"
#include "reference/model/attention.h"
#include "reference/model/model.h"

using namespace trident;
using namespace trident::model;

namespace {

struct Case {
  CoreDims cd;
  int64_t S = 0;
  std::vector<int64_t> qpos, qdoc;
};

// A DSA core of the tiny-dsa shapes on S keys, queries at every position; values in [-1, 1) from the seed.
template <class T>
struct Data {
  std::vector<T> q, iq, kv, dO;
};
Case make_case(int64_t S, int64_t topk, bool docs) {
  Config c = Config::preset("tiny-dsa");
  c.dsa_topk = topk;
  Case k;
  k.cd = CoreDims::from(c);
  k.S = S;
  for (int64_t p = 0; p < S; ++p) {
    k.qpos.push_back(p);
    k.qdoc.push_back(docs ? (p / 7) * 7 : 0);  // documents of 7 tokens
  }
  return k;
}
template <class T>
Data<T> make_data(const Case& k, uint64_t seed) {
  const CoreDims& cd = k.cd;
  Data<T> d;
  auto fill = [&](std::vector<T>& v, int64_t n, uint64_t stream) {
    v.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<T>(uniform_pm1(seed, stream, static_cast<uint64_t>(i)));
  };
  fill(d.q, k.S * cd.H * cd.Dq, 1);
  fill(d.iq, k.S * (cd.Hi * cd.Di + cd.Hi), 2);
  fill(d.kv, k.S * cd.P, 3);
  fill(d.dO, k.S * cd.H * cd.Dv, 4);
  return d;
}

// The index score in long double, for the naive selection (same order of the key set; rounding differences only
// matter at near-ties, which the random data does not produce... except where the test makes exact ties on purpose).
template <class T>
std::vector<int32_t> naive_select(const Case& k, const Data<T>& d, Policy pol, int64_t r) {
  // Scores through the reference's own single-query path (one-row dsa_select can't be used: it is what is tested), so
  // recompute with the documented formula in T.
  const CoreDims& cd = k.cd;
  const int64_t Iw = cd.Hi * cd.Di + cd.Hi;
  auto rnd = [&](T x) -> T {
    if constexpr (std::is_same_v<T, float>)
      if (pol == Policy::bf16) {
        uint32_t u;
        std::memcpy(&u, &x, 4);
        u += 0x7FFF + ((u >> 16) & 1);
        u &= 0xFFFF0000u;
        std::memcpy(&x, &u, 4);
      }
    return x;
  };
  std::vector<std::pair<T, int32_t>> s;
  for (int64_t j = k.qdoc[r]; j <= k.qpos[r]; ++j) {
    T I = T(0);
    for (int64_t t = 0; t < cd.Hi; ++t) {
      T z = T(0);
      for (int64_t c = 0; c < cd.Di; ++c)
        z = z + rnd(d.iq[r * Iw + t * cd.Di + c]) * rnd(d.kv[j * cd.P + cd.ikey + c]);
      I = I + d.iq[r * Iw + cd.Hi * cd.Di + t] * (z > T(0) ? z : T(0));
    }
    s.push_back({I, static_cast<int32_t>(j)});
  }
  std::sort(s.begin(), s.end(), [](auto a, auto b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  std::vector<int32_t> out;
  for (int64_t i = 0; i < std::min<int64_t>(cd.topk, static_cast<int64_t>(s.size())); ++i) out.push_back(s[i].second);
  std::sort(out.begin(), out.end());
  while (static_cast<int64_t>(out.size()) < cd.topk) out.push_back(-1);
  return out;
}

template <class T>
void selection_case(Policy pol, bool docs, bool ties) {
  const Case k = make_case(29, 5, docs);
  Data<T> d = make_data<T>(k, 11);
  const int64_t Iw = k.cd.Hi * k.cd.Di + k.cd.Hi;
  if (ties)  // zero indexer weights: every score is +0, so the selection is the lowest positions of the range
    for (int64_t r = 0; r < k.S; ++r)
      for (int64_t t = 0; t < k.cd.Hi; ++t) d.iq[r * Iw + k.cd.Hi * k.cd.Di + t] = T(0);
  std::vector<int32_t> sel(static_cast<size_t>(k.S * k.cd.topk), 7);
  dsa_select<T>(pol, k.cd, d.iq.data(), k.qpos.data(), docs ? k.qdoc.data() : nullptr, k.S, d.kv.data(), k.S,
                sel.data());
  Case kk = k;
  if (!docs) std::fill(kk.qdoc.begin(), kk.qdoc.end(), 0);
  for (int64_t r = 0; r < k.S; ++r) {
    const std::vector<int32_t> got(sel.begin() + r * k.cd.topk, sel.begin() + (r + 1) * k.cd.topk);
    std::vector<int32_t> want = naive_select<T>(kk, d, pol, r);
    if (ties) {
      want.assign(static_cast<size_t>(k.cd.topk), -1);
      for (int64_t i = 0; i < k.cd.topk && kk.qdoc[r] + i <= r; ++i) want[static_cast<size_t>(i)] = static_cast<int32_t>(kk.qdoc[r] + i);
    }
    EXPECT_EQ(got, want) << "repro: query " << r << " policy " << to_string(pol) << (docs ? " docs" : "")
                         << (ties ? " ties" : "");
  }
}

template <class T>
void dense_case(Policy pol, bool docs) {
  const Case k = make_case(24, 24, docs);  // topk >= every range: the selection is the whole causal (document) range
  const Data<T> d = make_data<T>(k, 5);
  const CoreDims& cd = k.cd;
  const int64_t S = k.S, Iw = cd.Hi * cd.Di + cd.Hi;
  const int64_t* qdoc = docs ? k.qdoc.data() : nullptr;
  std::vector<int32_t> sel(static_cast<size_t>(S * cd.topk));
  dsa_select<T>(pol, cd, d.iq.data(), k.qpos.data(), qdoc, S, d.kv.data(), S, sel.data());
  std::vector<T> o1(static_cast<size_t>(S * cd.H * cd.Dv)), o2 = o1, st1(static_cast<size_t>(S * cd.H * 2)), st2 = st1,
      ikl(static_cast<size_t>(S));
  dsa_core_forward<T>(pol, cd, d.q.data(), d.iq.data(), k.qpos.data(), S, d.kv.data(), S, sel.data(), o1.data(),
                      st1.data(), ikl.data());
  if (docs)
    attn_doc_core_forward<T>(pol, cd, d.q.data(), k.qpos.data(), qdoc, S, d.kv.data(), S, o2.data(), st2.data());
  else
    attn_core_forward<T>(pol, cd, d.q.data(), k.qpos.data(), S, d.kv.data(), S, o2.data(), st2.data());
  const std::string repro = std::string("repro: policy ") + std::string(to_string(pol)) + (docs ? " docs" : "");
  EXPECT_EQ(std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(T)), 0) << repro;
  EXPECT_EQ(std::memcmp(st1.data(), st2.data(), st1.size() * sizeof(T)), 0) << repro;
  const std::vector<int64_t> segs = {0, 8, 16, 24};
  std::vector<T> dq1(static_cast<size_t>(S * cd.H * cd.Dq)), dq2 = dq1, diq(static_cast<size_t>(S * Iw));
  std::vector<ExactAcc<T>> a1(static_cast<size_t>(S * cd.P)), a2 = a1;
  dsa_core_backward<T>(pol, cd, d.q.data(), d.iq.data(), k.qpos.data(), S, d.kv.data(), S, sel.data(), o1.data(),
                       st1.data(), d.dO.data(), T(0.25), segs, dq1.data(), diq.data(), a1.data());
  if (docs)
    attn_doc_core_backward<T>(pol, cd, d.q.data(), k.qpos.data(), qdoc, S, d.kv.data(), S, o2.data(), st2.data(),
                              d.dO.data(), segs, dq2.data(), a2.data());
  else
    attn_core_backward<T>(pol, cd, d.q.data(), k.qpos.data(), S, d.kv.data(), S, o2.data(), st2.data(), d.dO.data(),
                          segs, dq2.data(), a2.data());
  EXPECT_EQ(std::memcmp(dq1.data(), dq2.data(), dq1.size() * sizeof(T)), 0) << repro;
  int64_t differ = 0, indexer_nonzero = 0;
  for (int64_t j = 0; j < S; ++j)
    for (int64_t c = 0; c < cd.P; ++c) {
      const T x = a1[static_cast<size_t>(j * cd.P + c)].round(), y = a2[static_cast<size_t>(j * cd.P + c)].round();
      if (c < cd.ikey) differ += std::memcmp(&x, &y, sizeof(T)) != 0;
      else indexer_nonzero += x != T(0);
    }
  EXPECT_EQ(differ, 0) << "the key/value slots of the payload gradient differ from the dense core's; " << repro;
  EXPECT_GT(indexer_nonzero, 0) << "the indexer key receives no gradient; " << repro;
}

}  // namespace

TEST(ModelDsa, SelectionIsTopKWithTiesToTheLowerPosition) {
  for (bool docs : {false, true})
    for (bool ties : {false, true}) {
      selection_case<float>(Policy::fp32, docs, ties);
      selection_case<float>(Policy::bf16, docs, ties);
      selection_case<double>(Policy::fp64, docs, ties);
    }
}

TEST(ModelDsa, SelectingEveryKeyGivesTheDenseCoresBits) {
  for (bool docs : {false, true}) {
    dense_case<float>(Policy::fp32, docs);
    dense_case<float>(Policy::bf16, docs);
    dense_case<double>(Policy::fp64, docs);
  }
}

// The indexer's KL term of each query against an fp64 evaluation of its definition (p: the heads' attention
// probabilities averaged over heads; q: the softmax of the index scores over the selected keys).
TEST(ModelDsa, IndexerKlMatchesItsDefinition) {
  const Case k = make_case(20, 6, false);
  const Data<double> d = make_data<double>(k, 3);
  const CoreDims& cd = k.cd;
  const int64_t S = k.S, Iw = cd.Hi * cd.Di + cd.Hi;
  std::vector<int32_t> sel(static_cast<size_t>(S * cd.topk));
  dsa_select<double>(Policy::fp64, cd, d.iq.data(), k.qpos.data(), nullptr, S, d.kv.data(), S, sel.data());
  std::vector<double> o(static_cast<size_t>(S * cd.H * cd.Dv)), st(static_cast<size_t>(S * cd.H * 2)),
      ikl(static_cast<size_t>(S));
  dsa_core_forward<double>(Policy::fp64, cd, d.q.data(), d.iq.data(), k.qpos.data(), S, d.kv.data(), S, sel.data(),
                           o.data(), st.data(), ikl.data());
  for (int64_t r = 0; r < S; ++r) {
    std::vector<int32_t> js;
    for (int64_t i = 0; i < cd.topk && sel[static_cast<size_t>(r * cd.topk + i)] >= 0; ++i)
      js.push_back(sel[static_cast<size_t>(r * cd.topk + i)]);
    const size_t n = js.size();
    std::vector<long double> p(n, 0), I(n, 0);
    for (int64_t h = 0; h < cd.H; ++h) {
      std::vector<long double> s(n);
      long double m = -1e300L, l = 0;
      for (size_t i = 0; i < n; ++i) {
        long double dot = 0;
        for (int64_t c = 0; c < cd.Dq; ++c) dot += d.q[(r * cd.H + h) * cd.Dq + c] * d.kv[js[i] * cd.P + c];
        s[i] = dot * cd.scale;
        m = std::max(m, s[i]);
      }
      for (size_t i = 0; i < n; ++i) l += std::exp(s[i] - m);
      for (size_t i = 0; i < n; ++i) p[i] += std::exp(s[i] - m) / l / cd.H;
    }
    long double mI = -1e300L, lI = 0, kl = 0;
    for (size_t i = 0; i < n; ++i) {
      for (int64_t t = 0; t < cd.Hi; ++t) {
        long double z = 0;
        for (int64_t c = 0; c < cd.Di; ++c) z += d.iq[r * Iw + t * cd.Di + c] * d.kv[js[i] * cd.P + cd.ikey + c];
        I[i] += d.iq[r * Iw + cd.Hi * cd.Di + t] * std::max<long double>(z, 0);
      }
      mI = std::max(mI, I[i]);
    }
    for (size_t i = 0; i < n; ++i) lI += std::exp(I[i] - mI);
    for (size_t i = 0; i < n; ++i) kl += p[i] * (std::log(p[i]) - (I[i] - mI - std::log(lI)));
    EXPECT_NEAR(ikl[static_cast<size_t>(r)], static_cast<double>(kl), 1e-12) << "repro: query " << r;
    EXPECT_GE(ikl[static_cast<size_t>(r)], -1e-15) << "a KL divergence is >= 0; query " << r;
  }
}

// A kept selection is what the layer attends (full recompute reuses the first forward's selection, never selects
// again), and the model keeps each layer's selection in its result.
TEST(ModelDsa, KeptSelectionIsAttendedAsGiven) {
  const Config c = Config::preset("tiny-dsa");
  const ParamSet<float> p = ParamSet<float>::init(c, 3);
  const LayerW<float> W = layer_weights<float>(c, p, 0);
  const TokenRows rows = TokenRows::contiguous(1, 24, c.tile);
  const RopeTable<float> rope = rope_table<float>(24, c.rope_width(), c.rope_theta);
  std::vector<float> a(static_cast<size_t>(24 * c.d_model));
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(uniform_pm1(9, 1, i));
  AttnActs<float> acts;
  std::vector<float> y1(a.size()), y2(a.size());
  attention_forward<float>(c.policy, c, W.attn, a.data(), rows, rope, acts, y1.data());
  const std::vector<int32_t> chosen = acts.sel;
  // Another valid selection: the first min(k, p+1) positions of each query.
  for (int64_t r = 0; r < 24; ++r)
    for (int64_t i = 0; i < c.dsa_topk; ++i) acts.sel[static_cast<size_t>(r * c.dsa_topk + i)] = i <= r ? static_cast<int32_t>(i) : -1;
  const std::vector<int32_t> mine = acts.sel;
  ASSERT_NE(mine, chosen) << "the indexer happened to select the first positions; pick another seed";
  acts.keep_sel = true;
  attention_forward<float>(c.policy, c, W.attn, a.data(), rows, rope, acts, y2.data());
  EXPECT_EQ(acts.sel, mine) << "a kept selection was selected again";
  EXPECT_NE(std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)), 0);
  acts.keep_sel = false;
  attention_forward<float>(c.policy, c, W.attn, a.data(), rows, rope, acts, y2.data());
  EXPECT_EQ(acts.sel, chosen);
  EXPECT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)), 0);
}

TEST(ModelDsa, BadSelectionsScoresAndConfigsAreErrors) {
  const Case k = make_case(10, 3, false);
  Data<float> d = make_data<float>(k, 2);
  const CoreDims& cd = k.cd;
  std::vector<float> o(static_cast<size_t>(k.S * cd.H * cd.Dv)), st(static_cast<size_t>(k.S * cd.H * 2));
  auto forward_error = [&](std::vector<int32_t> sel) {
    try {
      dsa_core_forward<float>(Policy::fp32, cd, d.q.data(), d.iq.data(), k.qpos.data(), k.S, d.kv.data(), k.S,
                              sel.data(), o.data(), st.data(), nullptr);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::vector<int32_t> good(static_cast<size_t>(k.S * cd.topk), -1);
  for (int64_t r = 0; r < k.S; ++r) good[static_cast<size_t>(r * cd.topk)] = static_cast<int32_t>(r);
  EXPECT_EQ(forward_error(good), "no error");
  auto bad = good;
  bad[static_cast<size_t>(2 * cd.topk)] = 5;  // query 2 attends a future key
  EXPECT_NE(forward_error(bad).find("dsa_core_forward: selection of query 2 (position 2) is not ascending inside [0, 2]"),
            std::string::npos) << forward_error(bad);
  bad = good;
  bad[static_cast<size_t>(3 * cd.topk)] = -1;  // no key at all
  EXPECT_NE(forward_error(bad).find("query 3 (position 3) has no selected key"), std::string::npos);
  bad = good;
  bad[static_cast<size_t>(4 * cd.topk + 2)] = 1;  // an entry after the end marker
  EXPECT_NE(forward_error(bad).find("has entry 2 = 1 after its end"), std::string::npos);
  d.iq[0] = std::nanf("");
  std::vector<int32_t> sel(good.size());
  try {
    dsa_select<float>(Policy::fp32, cd, d.iq.data(), k.qpos.data(), nullptr, k.S, d.kv.data(), k.S, sel.data());
    ADD_FAILURE() << "a NaN index score was selected by";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dsa_select: the index score of query 0 (position 0) for key 0 is NaN"),
              std::string::npos) << e.what();
  }
  Config c = Config::preset("tiny-dsa");
  c.attn = AttnKind::gqa;
  c.kv_heads = 2;
  c.head_dim = 16;
  EXPECT_THROW(c.validate(), Error);
  Config c2 = Config::preset("tiny");
  c2.index_heads = 2;
  EXPECT_THROW(c2.validate(), Error);
  // JSON: the dsa block round-trips; topk 0 inside it is refused (leave the block out for dense attention).
  const Config c3 = Config::preset("tiny-dsa");
  EXPECT_EQ(Config::from_json(c3.to_json()).to_json(), c3.to_json());
  auto j = c3.to_json();
  j["attention"]["dsa"]["topk"] = 0;
  try {
    Config::from_json(j);
    ADD_FAILURE() << "topk 0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("topk must be > 0"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(Config::preset("tiny").to_json()["attention"].contains("dsa"));
}
