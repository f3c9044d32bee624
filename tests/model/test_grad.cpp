// fp64 finite differences on every trainable parameter tensor of `tiny` (MLA), `tiny-gqa` (issue 3) and `tiny-dsa`
// (DSA: the indexer's weights against the indexer loss, the others against the LM loss), also with packed sequences
// (document masks and restarting RoPE positions, docs/model.md "Packed sequences").
//
// For sampled entries w[k]: Richardson-extrapolated central differences
//   D(h) = (L(w+h) - L(w-h)) / (2h),  FD = (4 D(h/2) - D(h)) / 3,  h = 1e-3,
// against the manual backward (GradAcc finalized). Entries are drawn from a fixed hash sequence; an entry
// is used only if its gradient is not tiny (|g| >= 1e-5), up to 2 per tensor, and every tensor must yield
// at least one (no vacuous pass). The router's top-k selection must not flip under the perturbation:
// an entry whose perturbed forward selects different experts (or DSA keys) anywhere is skipped (and counted; the test
// fails if more than half of the drawn entries had to be skipped, or a tensor keeps no entry).
#include <gtest/gtest.h>

#include <cmath>

#include "reference/model/model.h"
#include "reference/tolerances.h"

using namespace trident;
using namespace trident::model;

namespace {

Batch fd_batch(const Config& c, uint64_t seed) {
  Batch b;
  b.B = 2;
  b.S = 10;  // tiles of 4: 4 + 4 + 2 per sequence
  for (int64_t i = 0; i < b.B * b.S; ++i) {
    b.tokens.push_back(static_cast<int32_t>(hash3(seed, 1, static_cast<uint64_t>(i)) % static_cast<uint64_t>(c.vocab)));
    const bool ignore = i % 7 == 3;
    b.targets.push_back(ignore ? -100
                               : static_cast<int32_t>(hash3(seed, 2, static_cast<uint64_t>(i)) %
                                                      static_cast<uint64_t>(c.vocab)));
  }
  return b;
}

// Packed sequences: document starts of the FD batch (sequence 0: documents [0,3) [3,4) [4,10); sequence 1: [0,6)
// [6,10)), so the masked attention (keys of the query's document only, RoPE positions restarting) is what is checked.
void pack_fd_batch(Batch& b) {
  const int64_t starts[2][10] = {{0, 0, 0, 3, 4, 4, 4, 4, 4, 4}, {0, 0, 0, 0, 0, 0, 6, 6, 6, 6}};
  for (int64_t q = 0; q < b.B; ++q)
    for (int64_t p = 0; p < b.S; ++p) b.doc_start.push_back(starts[q][p]);
}

void run_fd(const std::string& preset, bool packed = false) {
  Config c = Config::preset(preset);
  if (c.dsa()) c.dsa_topk = 4;  // most of the 10-token sequences' queries select 4 of their keys
  c.policy = Policy::fp64;
  c.tile = 4;
  c.vocab_chunk = 100;  // several chunks and a short last one
  const uint64_t seed = 2024;
  ParamSet<double> p = ParamSet<double>::init(c, seed);
  // Non-trivial gains and router bias so those paths are exercised.
  for (size_t i = 0; i < p.size(); ++i) {
    const auto& n = p.info[i].name;
    if (n.find("norm") != std::string::npos || n.find("router_bias") != std::string::npos)
      for (int64_t k = 0; k < p.t[i].size(); ++k) p.t[i][k] += 0.2 * uniform_pm1(seed, 777 + i, static_cast<uint64_t>(k));
  }
  Batch b = fd_batch(c, seed);
  if (packed) pack_fd_batch(b);
  StepOptions opt;
  opt.token_chunk = 5;
  GradAcc<double> acc = GradAcc<double>::zeros(p.info);
  const ForwardResult<double> base = model_forward_backward<double>(c, p, b, opt, acc);
  ParamSet<double> g = ParamSet<double>::zeros(c);
  acc.finalize(g);
  ASSERT_TRUE(std::isfinite(base.loss) && base.loss > 0);

  const double h = 1e-3;
  int checked = 0, skipped = 0, drawn_total = 0, kinks = 0;
  double worst = 0;
  for (size_t t = 0; t < p.size(); ++t) {
    if (!p.info[t].trainable) continue;
    const std::string& name = p.info[t].name;
    int used = 0;
    for (uint64_t draw = 0; draw < 400 && used < 2; ++draw) {
      const int64_t k = static_cast<int64_t>(hash3(seed, 1000 + t, draw) % static_cast<uint64_t>(p.t[t].size()));
      const double gk = g.t[t][k];
      if (std::abs(gk) < 1e-5) continue;
      ++drawn_total;
      const double w0 = p.t[t][k];
      bool flipped = false;
      // DSA: the indexer's weights are trained by the indexer loss alone (its input detached), the rest by the LM
      // loss alone (the main attention detached from the indexer loss), so each is differentiated against its loss.
      const bool indexer = name.find(".attn.wi") != std::string::npos;
      auto L = [&](double step) {
        p.t[t][k] = w0 + step;
        const double actual = p.t[t][k] - w0;
        const ForwardResult<double> r = model_forward<double>(c, p, b, opt);
        if (r.sel != base.sel || r.dsa_sel != base.dsa_sel) flipped = true;
        p.t[t][k] = w0;
        return std::pair<double, double>(indexer ? r.indexer_loss : r.loss, actual);
      };
      const auto [lp1, hp1] = L(h);
      const auto [lm1, hm1] = L(-h);
      const auto [lp2, hp2] = L(h / 2);
      const auto [lm2, hm2] = L(-h / 2);
      if (flipped) {
        ++skipped;
        continue;
      }
      const double D1 = (lp1 - lm1) / (hp1 - hm1), D2 = (lp2 - lm2) / (hp2 - hm2);
      // A ReLU kink inside [w-h, w+h] (the DSA indexer's heads) makes the two central differences disagree at first
      // order, where a smooth loss has them agree to O(h^2) (~1e-7 relative): such an entry is skipped like a top-k
      // flip. The rule only reads the loss, never the backward, so it cannot hide a wrong gradient.
      if (std::abs(D1 - D2) > 1e-3 * std::max(std::abs(D2), 1e-5)) {
        ++skipped;
        ++kinks;
        continue;
      }
      const double fd = (4 * D2 - D1) / 3;
      const double sum_abs = std::max(std::abs(gk), 1e-5);
      const double bound = tolerance_bound("model_grad", "fp64", "vs_fd", 0, sum_abs);
      worst = std::max(worst, std::abs(fd - gk) / sum_abs);
      EXPECT_LE(std::abs(fd - gk), bound)
          << "repro: preset " << preset << " fp64 seed " << seed << " param " << name << " index " << k
          << ": backward " << gk << " vs finite difference " << fd << " (rel " << std::abs(fd - gk) / sum_abs << ")";
      ++used;
      ++checked;
    }
    EXPECT_GE(used, 1) << "no usable (non-tiny, non-flipping) entry for " << name << " (" << preset << ")";
  }
  std::printf("[fd %s%s] %d entries checked, %d skipped (top-k flip or ReLU kink: %d), worst relative error %.3g\n",
              preset.c_str(), packed ? " packed" : "", checked, skipped, kinks, worst);
  EXPECT_GE(checked, 40);
  EXPECT_LE(2 * skipped, drawn_total) << "too many top-k flips under the FD perturbation";
}

}  // namespace

TEST(ModelGrad, FiniteDifferencesTinyMla) { run_fd("tiny"); }
TEST(ModelGrad, FiniteDifferencesTinyGqa) { run_fd("tiny-gqa"); }
TEST(ModelGrad, FiniteDifferencesPackedMla) { run_fd("tiny", true); }
TEST(ModelGrad, FiniteDifferencesPackedGqa) { run_fd("tiny-gqa", true); }
TEST(ModelGrad, FiniteDifferencesDsa) { run_fd("tiny-dsa"); }
TEST(ModelGrad, FiniteDifferencesPackedDsa) { run_fd("tiny-dsa", true); }
