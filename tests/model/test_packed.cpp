// Packed sequences in the reference (docs/model.md "Packed sequences"): a document inside a packed sequence computes
// exactly what it computes as a sequence of its own (attention never crosses a document boundary, RoPE positions
// restart), one explicit document is the default path, the synthetic packing and its run-config key, bad batches.
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "reference/check.h"
#include "reference/model/linear_ce.h"
#include "reference/model/model.h"
#include "reference/model/train.h"

using namespace trident;
using namespace trident::model;

namespace {

template <class T>
bool same_bits(const T* a, const T* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(T)) == 0;
}

Batch random_batch(const Config& c, int64_t B, int64_t S, uint64_t seed) {
  Batch b;
  b.B = B;
  b.S = S;
  for (int64_t i = 0; i < B * S; ++i) {
    b.tokens.push_back(static_cast<int32_t>(hash3(seed, 1, static_cast<uint64_t>(i)) % static_cast<uint64_t>(c.vocab)));
    b.targets.push_back(static_cast<int32_t>(hash3(seed, 2, static_cast<uint64_t>(i)) % static_cast<uint64_t>(c.vocab)));
  }
  return b;
}

// One packed sequence of documents with the given lengths vs each document as a sequence of its own: the per-token
// losses and final hidden rows are bitwise equal (per-token results are batch-invariant, and the mask and the RoPE
// restart make a document's tokens see exactly what they see alone). Lengths include 1 and lengths that are not
// multiples of the tile (so documents straddle reduction tiles).
TEST(ModelPacked, DocumentEqualsItsOwnSequence) {
  for (Policy pol : {Policy::fp32, Policy::bf16, Policy::fp64})
    for (const char* preset : {"tiny", "tiny-gqa"}) {
      Config c = Config::preset(preset);
      c.policy = pol;
      const std::vector<int64_t> lens = {5, 1, 11, 3, 12};
      int64_t S = 0;
      for (int64_t l : lens) S += l;
      const Batch packed_nodocs = random_batch(c, 1, S, 17);
      Batch packed = packed_nodocs;
      for (int64_t l : lens)
        for (int64_t p = 0, s0 = static_cast<int64_t>(packed.doc_start.size()); p < l; ++p) packed.doc_start.push_back(s0);
      StepOptions opt;
      opt.keep_hidden = true;
      auto check = [&]<class T>(T) {
        const auto p = ParamSet<T>::init(c, 5);
        const auto fp = model_forward<T>(c, p, packed, opt);
        const auto fn = model_forward<T>(c, p, packed_nodocs, opt);
        int64_t s0 = 0, differs = 0;
        for (int64_t l : lens) {
          Batch one;
          one.B = 1;
          one.S = l;
          one.tokens.assign(packed.tokens.begin() + s0, packed.tokens.begin() + s0 + l);
          one.targets.assign(packed.targets.begin() + s0, packed.targets.begin() + s0 + l);
          const auto fo = model_forward<T>(c, p, one, opt);
          EXPECT_TRUE(same_bits(fp.token_loss.data() + s0, fo.token_loss.data(), static_cast<size_t>(l)))
              << preset << " " << to_string(pol) << ": document at " << s0 << " (length " << l << ") per-token loss";
          EXPECT_TRUE(same_bits(fp.hidden.data() + s0 * c.d_model, fo.hidden.data(), static_cast<size_t>(l * c.d_model)))
              << preset << " " << to_string(pol) << ": document at " << s0 << " final hidden";
          if (s0 > 0) differs += !same_bits(fp.token_loss.data() + s0, fn.token_loss.data() + s0, static_cast<size_t>(l));
          s0 += l;
        }
        EXPECT_GT(differs, 0) << "the document mask changed nothing (vacuous)";
      };
      if (pol == Policy::fp64) check(double{});
      else check(float{});
    }
}

// doc_start all 0 takes the document-mask kernels and the RoPE-position path and must give the default's bits:
// loss and every gradient.
TEST(ModelPacked, ExplicitSingleDocumentIsBitwiseTheDefault) {
  for (const char* preset : {"tiny", "tiny-gqa"}) {
    Config c = Config::preset(preset);
    const auto p = ParamSet<float>::init(c, 8);
    Batch b = random_batch(c, 2, 24, 3);
    StepOptions opt;
    opt.recompute = true;
    GradAcc<float> a0 = GradAcc<float>::zeros(p.info), a1 = GradAcc<float>::zeros(p.info);
    const auto r0 = model_forward_backward<float>(c, p, b, opt, a0);
    b.doc_start.assign(b.tokens.size(), 0);
    const auto r1 = model_forward_backward<float>(c, p, b, opt, a1);
    EXPECT_EQ(std::memcmp(&r0.loss, &r1.loss, sizeof(float)), 0) << preset;
    ParamSet<float> g0 = ParamSet<float>::zeros(c), g1 = ParamSet<float>::zeros(c);
    a0.finalize(g0);
    a1.finalize(g1);
    for (size_t t = 0; t < g0.size(); ++t) EXPECT_EQ(g0.t[t].data, g1.t[t].data) << preset << " " << g0.info[t].name;
  }
}

TEST(ModelPacked, SyntheticBatchCutsDocuments) {
  const Config c = Config::preset("tiny");
  RunConfig r;
  r.seq_len = 32;
  r.docs_per_seq = 6;
  const Batch a = synthetic_batch(c, r, 2), b2 = synthetic_batch(c, r, 2), other = synthetic_batch(c, r, 3);
  EXPECT_EQ(a.doc_start, b2.doc_start);  // deterministic in (data_seed, step)
  EXPECT_NE(a.doc_start, other.doc_start);
  validate_batch(c, a);
  for (int64_t q = 0; q < a.B; ++q) {
    std::set<int64_t> starts;
    for (int64_t p = 0; p < a.S; ++p) {
      const size_t i = static_cast<size_t>(q * a.S + p);
      starts.insert(a.doc_start[i]);
      const bool last_of_doc = p + 1 < a.S && a.doc_start[i + 1] == p + 1;
      if (last_of_doc) {
        EXPECT_EQ(a.targets[i], kIgnoreIndex) << "no prediction across a document boundary";
      } else {
        EXPECT_NE(a.targets[i], kIgnoreIndex);
        if (p + 1 < a.S) {
          EXPECT_EQ(a.targets[i], a.tokens[i + 1]);
        }
      }
    }
    EXPECT_EQ(starts.size(), 6u);
  }
  r.docs_per_seq = 1;
  EXPECT_TRUE(synthetic_batch(c, r, 2).doc_start.empty());  // the default batch is unchanged
}

TEST(ModelPacked, RunConfigKey) {
  RunConfig r;
  EXPECT_FALSE(r.to_json().contains("docs_per_seq"));  // absent by default: every existing config and dump unchanged
  r.docs_per_seq = 4;
  EXPECT_EQ(RunConfig::from_json(r.to_json()).docs_per_seq, 4);
  r.docs_per_seq = 33;
  try {
    r.validate();
    ADD_FAILURE() << "docs_per_seq > seq_len accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("docs_per_seq 33 exceeds seq_len 32"), std::string::npos) << e.what();
  }
  r.docs_per_seq = 0;
  EXPECT_THROW(r.validate(), Error);
}

TEST(ModelPacked, BadDocumentStartsAreRejected) {
  const Config c = Config::preset("tiny");
  Batch b = random_batch(c, 1, 8, 1);
  b.doc_start = {0, 0, 0, 3, 3, 2, 2, 2};  // 2 at position 5: neither 5 nor the previous start
  try {
    validate_batch(c, b);
    ADD_FAILURE() << "bad doc_start accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("doc_start 2 at (sequence 0, position 5)"), std::string::npos) << e.what();
  }
  b.doc_start = {0, 0, 0};
  EXPECT_THROW(validate_batch(c, b), Error);
}

}  // namespace
