// The attention core's instruction-set copies (reference/model/attn_core_kernel.h): every copy the CPU runs gives the
// baseline copy's bytes for every entry point (forward, backward into accumulators, the row and partial forms, the
// document-masked forms), in float and double, fp32 and bf16 policies, MLA and GQA, with -0, subnormals, huge values,
// Inf and NaN among the inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "reference/gemm.h"
#include "reference/model/attention.h"
#include "reference/model/config.h"

using namespace trident;
using namespace trident::model;

namespace {

template <class T>
struct Out {
  std::vector<T> o, st, dq, dq_rows, dq_part, part, o_doc, st_doc, dq_doc;
  std::vector<ExactAcc<T>> dkv, dkv_rows, dkv_doc;
};

template <class T>
bool same(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <class T>
void isa_case(const char* preset, Policy pol, bool specials, uint64_t seed) {
  const CoreDims cd = CoreDims::from(Config::preset(preset));
  const int64_t S = 37, Nq = 21;  // odd sizes: every vector loop has a remainder
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  auto fill = [&](int64_t n) {
    std::vector<T> v(static_cast<size_t>(n));
    for (T& x : v) x = static_cast<T>(u(rng));
    return v;
  };
  std::vector<T> q = fill(Nq * cd.H * cd.Dq), kv = fill(S * cd.P), dO = fill(Nq * cd.H * cd.Dv);
  if (specials) {  // one of each in the keys and values (the query rows that reach them see them)
    const T sp[] = {T(-0.0), std::numeric_limits<T>::denorm_min(), std::numeric_limits<T>::max() / T(4),
                    std::numeric_limits<T>::infinity(), std::numeric_limits<T>::quiet_NaN()};
    for (size_t i = 0; i < std::size(sp); ++i) kv[static_cast<size_t>((20 + 3 * i) * cd.P + i)] = sp[i];
    q[5] = T(-0.0), dO[7] = std::numeric_limits<T>::denorm_min();
  }
  std::vector<int64_t> qpos(static_cast<size_t>(Nq)), qdoc(static_cast<size_t>(Nq));
  for (int64_t r = 0; r < Nq; ++r) {
    qpos[static_cast<size_t>(r)] = (r * 7 + 3) % S;  // unordered positions, as a zig-zag rank's
    qdoc[static_cast<size_t>(r)] = qpos[static_cast<size_t>(r)] / 2;
  }
  const std::vector<int64_t> qsegs = {0, 8, 8, 16, Nq};  // an empty tile, a short last one
  std::vector<int64_t> krow(static_cast<size_t>(S));
  std::iota(krow.begin(), krow.end(), 0);
  std::shuffle(krow.begin(), krow.end(), std::mt19937_64(seed + 1));
  const int64_t nt = static_cast<int64_t>(qsegs.size()) - 1;
  auto run = [&] {
    Out<T> r;
    r.o.resize(static_cast<size_t>(Nq * cd.H * cd.Dv)), r.st.resize(static_cast<size_t>(Nq * cd.H * 2));
    attn_core_forward<T>(pol, cd, q.data(), qpos.data(), Nq, kv.data(), S, r.o.data(), r.st.data());
    r.dq.resize(static_cast<size_t>(Nq * cd.H * cd.Dq)), r.dq_rows = r.dq, r.dq_part = r.dq, r.dq_doc = r.dq;
    r.dkv.assign(static_cast<size_t>(S * cd.P), ExactAcc<T>()), r.dkv_rows = r.dkv, r.dkv_doc = r.dkv;
    attn_core_backward<T>(pol, cd, q.data(), qpos.data(), Nq, kv.data(), S, r.o.data(), r.st.data(), dO.data(), qsegs,
                          r.dq.data(), r.dkv.data());
    attn_core_backward_rows<T>(pol, cd, q.data(), qpos.data(), Nq, kv.data(), S, r.o.data(), r.st.data(), dO.data(),
                               qsegs, r.dq_rows.data(), r.dkv_rows.data(), krow);
    r.part.resize(static_cast<size_t>(nt * S * cd.P));
    attn_core_backward_partials<T>(pol, cd, q.data(), qpos.data(), Nq, kv.data(), S, r.o.data(), r.st.data(),
                                   dO.data(), qsegs, r.dq_part.data(), r.part.data(), krow, S);
    r.o_doc.resize(r.o.size()), r.st_doc.resize(r.st.size());
    attn_doc_core_forward<T>(pol, cd, q.data(), qpos.data(), qdoc.data(), Nq, kv.data(), S, r.o_doc.data(),
                             r.st_doc.data());
    attn_doc_core_backward<T>(pol, cd, q.data(), qpos.data(), qdoc.data(), Nq, kv.data(), S, r.o_doc.data(),
                              r.st_doc.data(), dO.data(), qsegs, r.dq_doc.data(), r.dkv_doc.data());
    return r;
  };
  const GemmIsa saved = gemm_isa();
  set_gemm_isa(GemmIsa::baseline);
  const Out<T> want = run();
  for (GemmIsa isa : {GemmIsa::avx2, GemmIsa::avx512}) {
    if (!gemm_isa_supported(isa)) {
      std::printf("copy %s: not run by this CPU or build\n", gemm_isa_name(isa));
      continue;
    }
    set_gemm_isa(isa);
    const Out<T> got = run();
    const std::string repro = std::string("repro: preset ") + preset + " policy " + std::string(to_string(pol)) +
                              (sizeof(T) == 4 ? " float" : " double") + (specials ? " specials" : "") + " seed " +
                              std::to_string(seed) + " copy " + gemm_isa_name(isa);
    EXPECT_TRUE(same(got.o, want.o) && same(got.st, want.st)) << "forward; " << repro;
    EXPECT_TRUE(same(got.dq, want.dq) && same(got.dkv, want.dkv)) << "backward; " << repro;
    EXPECT_TRUE(same(got.dq_rows, want.dq_rows) && same(got.dkv_rows, want.dkv_rows)) << "backward rows; " << repro;
    EXPECT_TRUE(same(got.dq_part, want.dq_part) && same(got.part, want.part)) << "backward partials; " << repro;
    EXPECT_TRUE(same(got.o_doc, want.o_doc) && same(got.st_doc, want.st_doc)) << "document forward; " << repro;
    EXPECT_TRUE(same(got.dq_doc, want.dq_doc) && same(got.dkv_doc, want.dkv_doc)) << "document backward; " << repro;
  }
  set_gemm_isa(saved);
}

}  // namespace

TEST(ModelAttention, EveryInstructionSetCopyGivesTheSameBytes) {
  for (const char* preset : {"tiny", "tiny-gqa"})
    for (bool specials : {false, true}) {
      isa_case<float>(preset, Policy::fp32, specials, 7);
      isa_case<float>(preset, Policy::bf16, specials, 8);
      isa_case<double>(preset, Policy::fp64, specials, 9);
    }
}
