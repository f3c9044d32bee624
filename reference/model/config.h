// The reference model's typed, validated configuration (DESIGN.md section 3; docs/model.md "Config").
//
// Config is the model (and its numerics: tile T, vocab chunk, policy); RunConfig is how one run uses it
// (batch shape, steps, optimizer hyper-parameters, data). Both load from JSON; Config also from a .json or
// .toml file. Every key is required and unknown keys are rejected: a config file says everything it means.
// Every value has documented bounds (namespace limits below; docs/model.md "Limits"), and every size derived from
// the config (parameter counts, activation sizes) is computed with overflow checks, so an oversized value is one
// clear error naming the key, its value and the bound, never a wrapped size.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "reference/policy.h"

namespace trident::model {

// Inclusive upper bounds of the config values (lower bounds are in the rules of validate()). They keep every
// derived size far from int64 overflow and every token id inside int32; they are far above any model the CPU
// reference can run. docs/model.md "Limits" is the table.
namespace limits {
inline constexpr int64_t vocab = int64_t{1} << 24;         // 16,777,216 (token ids are int32)
inline constexpr int64_t d_model = int64_t{1} << 16;       // 65,536
inline constexpr int64_t layers = int64_t{1} << 10;        // 1,024
inline constexpr int64_t heads = int64_t{1} << 10;         // attention.heads and attention.kv_heads
inline constexpr int64_t head_dim = int64_t{1} << 12;      // 4,096: head_dim, nope_dim, rope_dim, v_dim
inline constexpr int64_t kv_lora_rank = int64_t{1} << 14;  // 16,384
inline constexpr int64_t dsa_topk = int64_t{1} << 20;      // 1,048,576 (at most seq_len keys exist)
inline constexpr int64_t experts = int64_t{1} << 12;       // 4,096 (top_k <= experts)
inline constexpr int64_t expert_ffn = int64_t{1} << 17;    // 131,072: expert_ffn and shared_ffn
inline constexpr int64_t dense_ffn = int64_t{1} << 18;     // 262,144
inline constexpr int64_t tile = int64_t{1} << 20;          // 1,048,576 tokens
inline constexpr int64_t vocab_chunk = int64_t{1} << 24;   // 16,777,216
inline constexpr double routed_scale = 1e6;
inline constexpr double bias_rate = 1.0;
inline constexpr double rope_theta = 1e12;
inline constexpr int64_t params = int64_t{1} << 40;        // total parameter elements (1.1e12)
// RunConfig
inline constexpr int64_t sequences = int64_t{1} << 20;
inline constexpr int64_t seq_len = int64_t{1} << 20;
inline constexpr int64_t tokens = int64_t{1} << 28;        // sequences * seq_len, tokens of one step (268 M: the
                                                           // seeds' 1 M context on 2,048+ ranks is 32 M)
inline constexpr int64_t steps = int64_t{1} << 30;
inline constexpr int64_t token_chunk = int64_t{1} << 24;
inline constexpr int64_t activation = int64_t{1} << 45;    // elements of the widest per-step activation
inline constexpr double lr = 1e3;
inline constexpr double eps = 1.0;
inline constexpr double weight_decay = 1e3;
inline constexpr double max_grad_norm = 1e30;
}  // namespace limits

// int64 arithmetic that throws trident::Error ("<what> overflows int64: a * b") instead of wrapping.
int64_t checked_mul(int64_t a, int64_t b, std::string_view what);
int64_t checked_add(int64_t a, int64_t b, std::string_view what);

enum class AttnKind { mla, gqa };
std::string_view to_string(AttnKind k);

struct Config {
  int64_t vocab = 512;         // V
  int64_t d_model = 64;        // d
  int64_t layers = 3;          // L
  int64_t dense_layers = 1;    // L0: layers 0..L0-1 use the dense SwiGLU MLP, the rest MoE
  AttnKind attn = AttnKind::mla;
  int64_t heads = 4;           // H
  // GQA
  int64_t kv_heads = 0;        // Hkv
  int64_t head_dim = 0;        // Dh
  // MLA
  int64_t nope_dim = 16;       // Dn
  int64_t rope_dim = 8;        // Dr
  int64_t v_dim = 16;          // Dv
  int64_t kv_lora_rank = 32;   // r
  // DSA (MLA only; docs/model.md "Sparse attention (DSA)"): dsa_topk > 0 turns it on. The lightning indexer has
  // index_heads heads of index_dim; each query attends the dsa_topk keys of its causal (document) range with the
  // highest index scores. Optional in JSON (attention.dsa); 0 = dense attention.
  int64_t dsa_topk = 0;        // k
  int64_t index_heads = 0;     // Hi
  int64_t index_dim = 0;       // Di
  // MoE
  int64_t experts = 8;         // E
  int64_t top_k = 2;           // K
  int64_t expert_ffn = 32;     // Fe
  int64_t shared_ffn = 32;     // Fs (0 = no shared expert)
  int64_t dense_ffn = 128;     // F (dense layers)
  double routed_scale = 1.0;   // alpha
  double bias_rate = 1e-3;     // gamma (0 disables the router bias update)
  // numerics
  int64_t tile = 8;            // T: reduction tile, tokens of one sequence
  int64_t vocab_chunk = 128;   // linear-CE vocabulary chunk (part of the numerics)
  Policy policy = Policy::fp32;
  double rope_theta = 10000.0;
  double norm_eps = 1e-6;
  uint64_t seed = 1234;        // parameter init

  // derived
  bool is_moe_layer(int64_t i) const { return i >= dense_layers; }
  int64_t q_head_dim() const { return attn == AttnKind::mla ? nope_dim + rope_dim : head_dim; }
  int64_t rope_width() const { return attn == AttnKind::mla ? rope_dim : head_dim; }
  // Attention core dims: the per-token KV payload width P, per-head query width Dq, core value width Dvc,
  // number of KV groups G (MLA: 1 latent shared by all heads).
  // DSA appends the indexer key (Di) to the MLA payload: [latent (r), rope key (Dr), indexer key (Di)], so the CP
  // all-gather carries it with the latent KV (seed 000).
  bool dsa() const { return dsa_topk > 0; }
  int64_t payload_dim() const {
    return attn == AttnKind::mla ? kv_lora_rank + rope_dim + (dsa() ? index_dim : 0) : 2 * kv_heads * head_dim;
  }
  // Per token, the indexer's queries and weights: (Hi*Di + Hi) values (DSA), else 0.
  int64_t index_q_width() const { return dsa() ? index_heads * index_dim + index_heads : 0; }
  int64_t core_q_dim() const { return attn == AttnKind::mla ? kv_lora_rank + rope_dim : head_dim; }
  int64_t core_v_dim() const { return attn == AttnKind::mla ? kv_lora_rank : head_dim; }
  int64_t kv_groups() const { return attn == AttnKind::mla ? 1 : kv_heads; }

  void validate() const;  // throws trident::Error naming the rule (or the key, its value and its bound) that fails
  // Total parameter elements (every tensor of params.h's layout, buffers included), computed with overflow
  // checks; validate() bounds it by limits::params.
  int64_t param_count() const;
  nlohmann::json to_json() const;
  static Config from_json(const nlohmann::json& j);  // validates
  static Config load(const std::string& path);       // .json or .toml, validates
  static Config preset(std::string_view name);       // tiny*, small; plan-sized: kimi-k2, qwen35-a3b
  static std::vector<std::string> preset_names();
};

// How one run uses the model (not model config). All keys required in from_json except docs_per_seq.
struct RunConfig {
  int64_t sequences = 4;     // B sequences per step
  int64_t seq_len = 32;      // S tokens per sequence
  int64_t steps = 10;
  int64_t token_chunk = 64;  // linear-CE token chunk (results are independent of it, bitwise)
  bool recompute = false;    // full recompute: keep each layer's input only
  double lr = 3e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, max_grad_norm = 1.0;
  uint64_t data_seed = 7;    // synthetic data
  // Packed sequences: documents per sequence (synthetic_batch cuts each sequence at docs_per_seq-1 distinct
  // positions drawn from data_seed; 1 = one document per sequence, the default). Optional in JSON.
  int64_t docs_per_seq = 1;
  void validate() const;
  // validate() plus the sizes this run derives from `model` (tokens per step, the widest activation, the
  // linear-CE chunk), computed with overflow checks and bounded by limits::tokens / limits::activation.
  void validate_for(const Config& model) const;
  nlohmann::json to_json() const;
  static RunConfig from_json(const nlohmann::json& j);
};

// TOML document -> JSON (tables -> objects, arrays, int/float/bool/string kept as such). Out-of-range numbers
// are errors naming the key (reference/toml_json.h).
nlohmann::json toml_file_to_json(const std::string& path);
// A JSON file, strictly: duplicate keys are errors naming the key (reference/toml_json.h).
nlohmann::json json_file_to_json(const std::string& path);

}  // namespace trident::model
