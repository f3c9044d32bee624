// The smallest model config with every part (MLA, one dense and one MoE layer, 4 experts top-2): the golden and
// fuzz tests build dumps the reader checks against its parameter layout.
#pragma once
#include <cstdint>

#include "reference/model/config.h"

namespace trident::goldentest {

inline model::Config micro_config(int64_t vocab, int64_t shared_ffn) {
  model::Config c = model::Config::preset("tiny");
  c.vocab = vocab;
  c.d_model = 8;
  c.layers = 2;
  c.dense_layers = 1;
  c.heads = 2;
  c.nope_dim = 4;
  c.rope_dim = 2;
  c.v_dim = 4;
  c.kv_lora_rank = 6;
  c.experts = 4;
  c.top_k = 2;
  c.expert_ffn = 4;
  c.shared_ffn = shared_ffn;
  c.dense_ffn = 8;
  return c;
}

}  // namespace trident::goldentest
