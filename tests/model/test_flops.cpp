// step_flops (reference/model/flops.h) against the parameter layout: outside the attention core, one forward
// pass is 2 FLOPs per token per matrix weight it touches (MLA's absorbed W_uk and W_uv included: the latent
// query and the per-head value projection each use every element once per token), the experts' weights scaled
// by top_k / experts; the backward is twice the forward plus the core's and the LM head's recomputation.
#include <gtest/gtest.h>

#include "reference/model/flops.h"
#include "reference/model/params.h"

using namespace trident::model;

namespace {

// Matrix weights one token touches in one forward pass, from the parameter layout (param_layout): every
// 2-D tensor except the embedding table, the experts' tensors scaled by top_k / experts.
double touched_per_token(const Config& c) {
  double n = 0;
  for (const ParamInfo& info : param_layout(c)) {
    if (info.name == "embed" || info.shape.size() < 2) continue;
    double k = 1;
    for (int64_t x : info.shape) k *= static_cast<double>(x);
    if (info.shape.size() == 3) k *= static_cast<double>(c.top_k) / static_cast<double>(c.experts);  // experts
    n += k;
  }
  return n;
}

void check(const Config& c, const RunConfig& rc) {
  const StepFlops f = step_flops(c, rc);
  const double N = static_cast<double>(rc.sequences * rc.seq_len);
  SCOPED_TRACE(c.to_json().dump());
  EXPECT_DOUBLE_EQ(f.forward - f.attn_core_forward, 2 * N * touched_per_token(c));
  EXPECT_GT(f.attn_core_forward, 0);
  EXPECT_EQ(f.recompute > 0, rc.recompute);
  if (c.dsa()) return;  // the indexer breaks the 3x and recompute relations by design: StepFlops.Dsa below
  EXPECT_DOUBLE_EQ(f.model(), 3 * f.forward);
  if (rc.recompute) {
    EXPECT_DOUBLE_EQ(f.recompute, f.forward - f.lm_head_recompute);
  }
  EXPECT_DOUBLE_EQ(f.executed(), f.forward + f.backward + f.recompute);
}

}  // namespace

TEST(StepFlops, MatchesTheParameterLayout) {
  RunConfig rc;
  rc.sequences = 3;
  rc.seq_len = 40;
  for (const auto& name : Config::preset_names()) {
    Config c = Config::preset(name);
    check(c, rc);
    c.dense_layers = c.layers;  // all dense
    check(c, rc);
    c = Config::preset(name);
    c.shared_ffn = 0;
    rc.recompute = true;
    check(c, rc);
    rc.recompute = false;
  }
}

TEST(StepFlops, CausalPairsScaleTheCore) {
  // The core grows with S (S + 1) / 2 pairs per sequence: doubling S from 64 to 128 scales it by 129 / 65 * 2.
  const Config c = Config::preset("tiny");
  RunConfig a, b;
  a.sequences = b.sequences = 2;
  a.seq_len = 64;
  b.seq_len = 128;
  EXPECT_DOUBLE_EQ(step_flops(c, b).attn_core_forward / step_flops(c, a).attn_core_forward, 2.0 * 129.0 / 65.0);
}

// DSA: with topk >= S every causal pair is selected, so the core is the dense core plus the indexer's work; with
// topk = 1 the core sees one pair per query. The indexer's projections have a weight gradient and no input gradient.
TEST(StepFlops, Dsa) {
  RunConfig rc;
  rc.sequences = 2;
  rc.seq_len = 16;
  Config c = Config::preset("tiny-dsa");
  Config dense = c;
  dense.dsa_topk = dense.index_heads = dense.index_dim = 0;
  const double B = 2, S = 16, L = static_cast<double>(c.layers), Hi = static_cast<double>(c.index_heads);
  const double Di = static_cast<double>(c.index_dim), pairs = B * S * (S + 1) / 2, N = B * S, d = c.d_model;
  const double iw = Hi * Di + Hi + Di;  // indexer weights per token
  c.dsa_topk = 16;
  const StepFlops all = step_flops(c, rc), fd = step_flops(dense, rc);
  EXPECT_DOUBLE_EQ(all.attn_core_forward, fd.attn_core_forward + L * 2 * Hi * (Di + 1) * 2 * pairs);
  EXPECT_DOUBLE_EQ(all.forward - all.attn_core_forward, fd.forward - fd.attn_core_forward + L * 2 * N * iw * d);
  EXPECT_DOUBLE_EQ(all.backward - fd.backward,
                   L * (2 * N * iw * d + 2 * Hi * (Di + 1) * pairs + 2 * pairs * Hi * (2 * Di + 1)));
  c.dsa_topk = 1;
  const StepFlops one = step_flops(c, rc);
  const double H = static_cast<double>(c.heads), Dq = static_cast<double>(c.kv_lora_rank + c.rope_dim);
  const double Dv = static_cast<double>(c.kv_lora_rank);
  EXPECT_DOUBLE_EQ(one.attn_core_forward, L * (2 * N * H * (Dq + Dv) + 2 * Hi * (Di + 1) * (pairs + N)));
  rc.recompute = true;
  const StepFlops rec = step_flops(c, rc);
  EXPECT_DOUBLE_EQ(rec.recompute, rec.forward - rec.lm_head_recompute - L * 2 * Hi * (Di + 1) * pairs);
}
