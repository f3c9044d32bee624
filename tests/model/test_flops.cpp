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
  EXPECT_DOUBLE_EQ(f.model(), 3 * f.forward);
  EXPECT_EQ(f.recompute > 0, rc.recompute);
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
