#include "reference/model/config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <toml.hpp>

#include "reference/check.h"
#include "reference/toml_json.h"

namespace trident::model {

using json = nlohmann::json;

std::string_view to_string(AttnKind k) { return k == AttnKind::mla ? "mla" : "gqa"; }

namespace {

// Strict reader over one JSON object: every key must be read exactly once; leftovers are unknown keys.
class Reader {
 public:
  Reader(const json& j, std::string where) : j_(j), where_(std::move(where)) {
    if (!j.is_object()) fail(fmt::format("{}: expected an object, got {}", where_, j.type_name()));
  }
  const json& get(const std::string& key) {
    if (!j_.contains(key)) fail(fmt::format("{}: missing key '{}'", where_, key));
    seen_.insert(key);
    return j_.at(key);
  }
  bool has(const std::string& key) const { return j_.contains(key); }
  int64_t i64(const std::string& key) {
    const json& v = get(key);
    if (!v.is_number_integer())
      fail(fmt::format("{}: key '{}' must be an integer, got {} ({})", where_, key, v.type_name(), v.dump()));
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail(fmt::format("{}: key '{}' = {} is out of range (int64)", where_, key, v.dump()));
    return v.get<int64_t>();
  }
  uint64_t u64(const std::string& key) {
    const json& v = get(key);
    if (!v.is_number_integer() || (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0))
      fail(fmt::format("{}: key '{}' must be a non-negative integer, got {} ({})", where_, key, v.type_name(),
                       v.dump()));
    return v.get<uint64_t>();
  }
  double f64(const std::string& key) {
    const json& v = get(key);
    if (!v.is_number())
      fail(fmt::format("{}: key '{}' must be a number, got {} ({})", where_, key, v.type_name(), v.dump()));
    return v.get<double>();
  }
  bool boolean(const std::string& key) {
    const json& v = get(key);
    if (!v.is_boolean()) fail(fmt::format("{}: key '{}' must be true or false, got {}", where_, key, v.dump()));
    return v.get<bool>();
  }
  std::string str(const std::string& key) {
    const json& v = get(key);
    if (!v.is_string()) fail(fmt::format("{}: key '{}' must be a string, got {} ({})", where_, key, v.type_name(), v.dump()));
    return v.get<std::string>();
  }
  void finish() const {
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (!seen_.count(it.key())) fail(fmt::format("{}: unknown key '{}'", where_, it.key()));
  }

 private:
  const json& j_;
  std::string where_;
  std::set<std::string> seen_;
};

void require(bool ok, const std::string& rule) {
  if (!ok) fail("invalid model config: " + rule);
}

// The upper bound of one value: "attention.v_dim = 2305843009213693953 exceeds its bound 4096 (docs/model.md ...)".
void bounded(const char* prefix, const char* key, int64_t v, int64_t bound) {
  if (v > bound)
    fail(fmt::format("{}: {} = {} exceeds its bound {} (docs/model.md \"Limits\")", prefix, key, v, bound));
}
void bounded(const char* prefix, const char* key, double v, double bound) {
  if (v > bound)
    fail(fmt::format("{}: {} = {} exceeds its bound {} (docs/model.md \"Limits\")", prefix, key, v, bound));
}
constexpr const char* kModel = "invalid model config";
constexpr const char* kRun = "invalid run config";

}  // namespace

int64_t checked_mul(int64_t a, int64_t b, std::string_view what) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) fail(fmt::format("{} overflows int64: {} * {}", what, a, b));
  return r;
}

int64_t checked_add(int64_t a, int64_t b, std::string_view what) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) fail(fmt::format("{} overflows int64: {} + {}", what, a, b));
  return r;
}

void Config::validate() const {
  // Lower bounds and rules, then each value's upper bound (limits::), before any arithmetic on the values.
  auto pos = [](int64_t v, const char* name, int64_t bound) {
    require(v > 0, fmt::format("{} must be > 0 (got {})", name, v));
    bounded(kModel, name, v, bound);
  };
  pos(vocab, "vocab", limits::vocab);
  pos(d_model, "d_model", limits::d_model);
  pos(layers, "layers", limits::layers);
  require(dense_layers >= 0 && dense_layers <= layers,
          fmt::format("dense_layers must be in [0, layers] (got {}, layers = {})", dense_layers, layers));
  pos(heads, "attention.heads", limits::heads);
  if (attn == AttnKind::gqa) {
    pos(kv_heads, "attention.kv_heads", limits::heads);
    pos(head_dim, "attention.head_dim", limits::head_dim);
    require(heads % kv_heads == 0,
            fmt::format("attention.heads % attention.kv_heads must be 0 (got {} % {})", heads, kv_heads));
    require(head_dim % 2 == 0, fmt::format("attention.head_dim must be even for RoPE (got {})", head_dim));
  } else {
    pos(nope_dim, "attention.nope_dim", limits::head_dim);
    pos(rope_dim, "attention.rope_dim", limits::head_dim);
    pos(v_dim, "attention.v_dim", limits::head_dim);
    pos(kv_lora_rank, "attention.kv_lora_rank", limits::kv_lora_rank);
    require(rope_dim % 2 == 0, fmt::format("attention.rope_dim must be even for RoPE (got {})", rope_dim));
  }
  require(dsa_topk >= 0, fmt::format("attention.dsa.topk must be >= 0 (0 = dense attention; got {})", dsa_topk));
  bounded(kModel, "attention.dsa.topk", dsa_topk, limits::dsa_topk);
  if (dsa()) {
    require(attn == AttnKind::mla, "attention.dsa needs attention.kind \"mla\" (the indexer key rides in the latent "
                                   "KV payload)");
    pos(index_heads, "attention.dsa.index_heads", limits::heads);
    pos(index_dim, "attention.dsa.index_dim", limits::head_dim);
  } else {
    require(index_heads == 0 && index_dim == 0,
            fmt::format("attention.dsa: index_heads and index_dim need topk > 0 (got {}, {})", index_heads, index_dim));
  }
  if (dense_layers < layers) {
    pos(experts, "experts", limits::experts);
    pos(top_k, "top_k", limits::experts);
    require(top_k <= experts, fmt::format("top_k must be <= experts (got top_k = {}, experts = {})", top_k, experts));
    pos(expert_ffn, "expert_ffn", limits::expert_ffn);
    require(shared_ffn >= 0, fmt::format("shared_ffn must be >= 0 (0 = no shared expert; got {})", shared_ffn));
    bounded(kModel, "shared_ffn", shared_ffn, limits::expert_ffn);
    require(routed_scale > 0 && std::isfinite(routed_scale),
            fmt::format("routed_scale must be finite and > 0 (got {})", routed_scale));
    bounded(kModel, "routed_scale", routed_scale, limits::routed_scale);
    require(bias_rate >= 0 && std::isfinite(bias_rate),
            fmt::format("bias_rate must be finite and >= 0 (got {})", bias_rate));
    bounded(kModel, "bias_rate", bias_rate, limits::bias_rate);
  }
  if (dense_layers > 0) pos(dense_ffn, "dense_ffn", limits::dense_ffn);
  pos(tile, "tile", limits::tile);
  require(vocab_chunk > 0, fmt::format("vocab_chunk must be > 0 (got {})", vocab_chunk));
  bounded(kModel, "vocab_chunk", vocab_chunk, limits::vocab_chunk);
  require(rope_theta > 1 && std::isfinite(rope_theta), fmt::format("rope_theta must be finite and > 1 (got {})", rope_theta));
  bounded(kModel, "rope_theta", rope_theta, limits::rope_theta);
  require(norm_eps > 0 && norm_eps < 1, fmt::format("norm_eps must be in (0, 1) (got {})", norm_eps));
  // Keys a config does not use (experts without MoE layers, dense_ffn without dense layers) are still stored and
  // compared: they too are >= 0 and bounded.
  auto unused = [](int64_t v, const char* name, int64_t bound) {
    require(v >= 0, fmt::format("{} must be >= 0 (got {})", name, v));
    bounded(kModel, name, v, bound);
  };
  unused(experts, "experts", limits::experts);
  unused(top_k, "top_k", limits::experts);
  unused(expert_ffn, "expert_ffn", limits::expert_ffn);
  unused(shared_ffn, "shared_ffn", limits::expert_ffn);
  unused(dense_ffn, "dense_ffn", limits::dense_ffn);
  const int64_t n = param_count();
  if (n > limits::params)
    fail(fmt::format("{}: the model has {} parameters, more than the bound {} (docs/model.md \"Limits\"; from vocab, "
                     "d_model, layers, attention, experts, expert_ffn, shared_ffn, dense_ffn)",
                     kModel, n, limits::params));
}

int64_t Config::param_count() const {
  // The layout of params.h (param_layout), every product and sum checked.
  const std::string what = "model config: parameter count";
  auto mul = [&](std::initializer_list<int64_t> xs) {
    int64_t r = 1;
    for (int64_t x : xs) r = checked_mul(r, x, what);
    return r;
  };
  auto add = [&](int64_t a, int64_t b) { return checked_add(a, b, what); };
  const int64_t d = d_model, H = heads;
  int64_t attn_n = 0;
  if (attn == AttnKind::gqa) {
    attn_n = add(add(mul({d, H, head_dim}), mul({2, d, kv_heads, head_dim})), mul({H, head_dim, d}));
  } else {
    attn_n = add(mul({d, H, add(nope_dim, rope_dim)}), mul({d, add(kv_lora_rank, rope_dim)}));
    attn_n = add(attn_n, kv_lora_rank);
    attn_n = add(attn_n, add(mul({kv_lora_rank, H, nope_dim}), mul({kv_lora_rank, H, v_dim})));
    attn_n = add(attn_n, mul({H, v_dim, d}));
    if (dsa()) attn_n = add(attn_n, mul({d, add(add(mul({index_heads, index_dim}), index_heads), index_dim)}));
  }
  const int64_t norms = mul({2, d});
  const int64_t dense_n = mul({3, d, dense_ffn});
  int64_t moe_n = add(mul({d, experts}), experts);
  moe_n = add(moe_n, mul({3, experts, d, expert_ffn}));
  if (shared_ffn > 0) moe_n = add(moe_n, mul({3, d, shared_ffn}));
  const int64_t per_dense = add(add(norms, attn_n), dense_n);
  const int64_t per_moe = add(add(norms, attn_n), moe_n);
  int64_t n = mul({2, vocab, d});  // embed, lm_head
  n = add(n, d);                   // final_norm
  n = add(n, mul({dense_layers, per_dense}));
  n = add(n, mul({layers - dense_layers, per_moe}));
  return n;
}

json Config::to_json() const {
  json a;
  a["kind"] = std::string(to_string(attn));
  a["heads"] = heads;
  if (attn == AttnKind::gqa) {
    a["kv_heads"] = kv_heads;
    a["head_dim"] = head_dim;
  } else {
    a["nope_dim"] = nope_dim;
    a["rope_dim"] = rope_dim;
    a["v_dim"] = v_dim;
    a["kv_lora_rank"] = kv_lora_rank;
    if (dsa()) a["dsa"] = json{{"topk", dsa_topk}, {"index_heads", index_heads}, {"index_dim", index_dim}};
  }
  return json{{"vocab", vocab},         {"d_model", d_model},       {"layers", layers},
              {"dense_layers", dense_layers}, {"attention", a},    {"experts", experts},
              {"top_k", top_k},         {"expert_ffn", expert_ffn}, {"shared_ffn", shared_ffn},
              {"dense_ffn", dense_ffn}, {"routed_scale", routed_scale}, {"bias_rate", bias_rate},
              {"tile", tile},           {"vocab_chunk", vocab_chunk}, {"policy", std::string(trident::to_string(policy))},
              {"rope_theta", rope_theta}, {"norm_eps", norm_eps}, {"seed", seed}};
}

Config Config::from_json(const json& j) {
  Reader r(j, "model config");
  Config c;
  c.vocab = r.i64("vocab");
  c.d_model = r.i64("d_model");
  c.layers = r.i64("layers");
  c.dense_layers = r.i64("dense_layers");
  {
    Reader a(r.get("attention"), "model config 'attention'");
    const std::string kind = a.str("kind");
    if (kind == "mla") {
      c.attn = AttnKind::mla;
      c.heads = a.i64("heads");
      c.nope_dim = a.i64("nope_dim");
      c.rope_dim = a.i64("rope_dim");
      c.v_dim = a.i64("v_dim");
      c.kv_lora_rank = a.i64("kv_lora_rank");
      if (a.has("dsa")) {  // optional: absent = dense attention
        Reader ds(a.get("dsa"), "model config 'attention.dsa'");
        c.dsa_topk = ds.i64("topk");
        c.index_heads = ds.i64("index_heads");
        c.index_dim = ds.i64("index_dim");
        ds.finish();
        if (c.dsa_topk <= 0)
          fail(fmt::format("model config 'attention.dsa': topk must be > 0 (got {}; leave 'dsa' out for dense "
                           "attention)", c.dsa_topk));
      }
      c.kv_heads = 0;
      c.head_dim = 0;
    } else if (kind == "gqa") {
      if (a.has("dsa"))
        fail("model config 'attention': 'dsa' needs kind \"mla\" (the indexer key rides in the latent KV payload)");
      c.attn = AttnKind::gqa;
      c.heads = a.i64("heads");
      c.kv_heads = a.i64("kv_heads");
      c.head_dim = a.i64("head_dim");
      c.nope_dim = c.rope_dim = c.v_dim = c.kv_lora_rank = 0;
    } else {
      fail(fmt::format("model config 'attention': key 'kind' must be \"mla\" or \"gqa\" (got \"{}\")", kind));
    }
    a.finish();
  }
  c.experts = r.i64("experts");
  c.top_k = r.i64("top_k");
  c.expert_ffn = r.i64("expert_ffn");
  c.shared_ffn = r.i64("shared_ffn");
  c.dense_ffn = r.i64("dense_ffn");
  c.routed_scale = r.f64("routed_scale");
  c.bias_rate = r.f64("bias_rate");
  c.tile = r.i64("tile");
  c.vocab_chunk = r.i64("vocab_chunk");
  c.policy = parse_policy(r.str("policy"));
  c.rope_theta = r.f64("rope_theta");
  c.norm_eps = r.f64("norm_eps");
  c.seed = r.u64("seed");
  r.finish();
  c.validate();
  return c;
}

namespace {
// Config files are small: a bigger one is a mistake (and would only feed the parsers more to chew on).
constexpr std::uintmax_t kMaxConfigFileBytes = 1 << 20;

std::string read_text_file(const std::string& path, const char* kind) {
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) fail(fmt::format("cannot read {} file '{}': {}", kind, path, ec.message()));
  if (size > kMaxConfigFileBytes)
    fail(fmt::format("{} file '{}' is {} bytes, more than the {} bytes a config may have", kind, path, size,
                     kMaxConfigFileBytes));
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(fmt::format("cannot open {} file '{}'", kind, path));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail(fmt::format("cannot read {} file '{}'", kind, path));
  return text;
}
}  // namespace

json toml_file_to_json(const std::string& path) {
  const std::string text = read_text_file(path, "TOML");
  check_toml_text(text, path);
  toml::value v;
  try {
    std::istringstream is(text);
    v = toml::parse(is, path);
  } catch (const std::exception& e) {
    fail(fmt::format("cannot parse TOML file '{}': {}", path, one_line(e.what())));
  }
  try {
    return toml_to_json(v);
  } catch (const trident::Error& e) {
    fail(fmt::format("{}: {}", path, e.what()));
  }
}

json json_file_to_json(const std::string& path) {
  return parse_json_strict(read_text_file(path, "JSON"), path);
}

Config Config::load(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::exists(path)) fail(fmt::format("config file '{}' does not exist", path));
  const std::string ext = fs::path(path).extension().string();
  json j;
  if (ext == ".toml") {
    j = toml_file_to_json(path);
  } else if (ext == ".json") {
    j = json_file_to_json(path);
  } else {
    fail(fmt::format("config file '{}': unknown extension '{}' (expected .json or .toml)", path, ext));
  }
  try {
    return from_json(j);
  } catch (const trident::Error& e) {
    fail(fmt::format("{}: {}", path, e.what()));
  }
}

Config Config::preset(std::string_view name) {
  Config c;  // defaults are `tiny`
  c.vocab = 512;
  c.d_model = 64;
  c.layers = 3;
  c.dense_layers = 1;
  c.attn = AttnKind::mla;
  c.heads = 4;
  c.nope_dim = 16;
  c.rope_dim = 8;
  c.v_dim = 16;
  c.kv_lora_rank = 32;
  c.kv_heads = 0;
  c.head_dim = 0;
  c.experts = 8;
  c.top_k = 2;
  c.expert_ffn = 32;
  c.shared_ffn = 32;
  c.dense_ffn = 128;
  c.routed_scale = 1.0;
  c.bias_rate = 1e-3;
  c.tile = 8;
  c.vocab_chunk = 128;
  c.policy = Policy::fp32;
  if (name == "tiny") {
  } else if (name == "tiny-gqa") {
    c.attn = AttnKind::gqa;
    c.heads = 4;
    c.kv_heads = 2;
    c.head_dim = 16;
    c.nope_dim = c.rope_dim = c.v_dim = c.kv_lora_rank = 0;
  } else if (name == "tiny-e64") {
    c.experts = 64;
    c.top_k = 4;
    c.expert_ffn = 16;
  } else if (name == "tiny-dsa") {  // tiny with DeepSeek sparse attention: 8 of up to 32 keys per query
    c.dsa_topk = 8;
    c.index_heads = 2;
    c.index_dim = 8;
  } else if (name == "small") {  // 55.9 M parameters: the speed and memory benchmark's model (bench/model)
    c.vocab = 8192;
    c.d_model = 512;
    c.layers = 4;
    c.dense_layers = 1;
    c.heads = 8;
    c.nope_dim = 64;
    c.rope_dim = 32;
    c.v_dim = 64;
    c.kv_lora_rank = 256;
    c.experts = 16;
    c.top_k = 2;
    c.expert_ffn = 512;
    c.shared_ffn = 512;
    c.dense_ffn = 2048;
    c.tile = 128;
    c.vocab_chunk = 1024;
  } else if (name == "kimi-k2") {
    // A Kimi-K2-like 1 T MoE (seed 000's scale: 1T+ parameters at 1M context on NVL72), 1,029,958,092,800 parameters.
    // Public (Kimi K2 technical report / config.json): d, L, first dense layer, E, K, Fe, one shared expert, F, MLA
    // heads and widths, kv_lora_rank, vocabulary, rope theta, routed scaling factor. Not modelled: q low-rank
    // (q_lora_rank 1536; here q = a Wq), YaRN. Assumed here: tile, vocab_chunk, policy, bias_rate. docs/model.md
    // "Presets". Plan-sized: a data run needs terabytes and is refused by the memory estimate.
    c.vocab = 163840;
    c.d_model = 7168;
    c.layers = 61;
    c.dense_layers = 1;
    c.heads = 64;
    c.nope_dim = 128;
    c.rope_dim = 64;
    c.v_dim = 128;
    c.kv_lora_rank = 512;
    c.experts = 384;
    c.top_k = 8;
    c.expert_ffn = 2048;
    c.shared_ffn = 2048;
    c.dense_ffn = 18432;
    c.routed_scale = 2.827;
    c.rope_theta = 50000.0;
    c.tile = 128;
    c.vocab_chunk = 8192;
    c.policy = Policy::bf16;
  } else if (name == "qwen35-a3b") {
    // A Qwen3.5-35B-A3B-like MoE as seed 002 uses it (32 H100, 128K global sequence, EP 8, CP 4), 34,131,324,928
    // parameters (about 2.9 B active per token, embedding and head included). From the seeds: vocabulary 248,320
    // (seed 002's logits example, TP=1), 2 KV heads (seed 000). From the public model card: d 2048, 40 layers, 256
    // experts top-8. Assumed (Qwen3-Next / Qwen3-30B-A3B style): every layer MoE, Fe 512, one shared expert of 512,
    // 16 query heads of 256, rope theta 1e6, routed_scale 1, bias_rate 1e-3 (in place of the auxiliary loss); tile,
    // vocab_chunk, policy. Every layer is modelled as GQA attention: the 30 linear-attention (Gated DeltaNet) layers
    // are not modelled (all-gather KV does not apply to them). docs/model.md "Presets". Plan-sized.
    c.vocab = 248320;
    c.d_model = 2048;
    c.layers = 40;
    c.dense_layers = 0;
    c.attn = AttnKind::gqa;
    c.heads = 16;
    c.kv_heads = 2;
    c.head_dim = 256;
    c.nope_dim = c.rope_dim = c.v_dim = c.kv_lora_rank = 0;
    c.experts = 256;
    c.top_k = 8;
    c.expert_ffn = 512;
    c.shared_ffn = 512;
    c.dense_ffn = 0;
    c.routed_scale = 1.0;
    c.rope_theta = 1e6;
    c.tile = 128;
    c.vocab_chunk = 8192;
    c.policy = Policy::bf16;
  } else {
    fail(fmt::format("unknown preset '{}' (known: {})", name, fmt::join(preset_names(), ", ")));
  }
  c.validate();
  return c;
}

std::vector<std::string> Config::preset_names() {
  return {"tiny", "tiny-gqa", "tiny-e64", "tiny-dsa", "small", "kimi-k2", "qwen35-a3b"};
}

void RunConfig::validate() const {
  auto req = [](bool ok, const std::string& rule) {
    if (!ok) fail("invalid run config: " + rule);
  };
  req(sequences > 0, fmt::format("sequences must be > 0 (got {})", sequences));
  bounded(kRun, "sequences", sequences, limits::sequences);
  req(seq_len > 1, fmt::format("seq_len must be > 1 (got {})", seq_len));
  bounded(kRun, "seq_len", seq_len, limits::seq_len);
  req(steps >= 0, fmt::format("steps must be >= 0 (got {})", steps));
  bounded(kRun, "steps", steps, limits::steps);
  req(token_chunk > 0, fmt::format("token_chunk must be > 0 (got {})", token_chunk));
  bounded(kRun, "token_chunk", token_chunk, limits::token_chunk);
  req(lr >= 0 && std::isfinite(lr), fmt::format("lr must be finite and >= 0 (got {})", lr));
  bounded(kRun, "lr", lr, limits::lr);
  req(beta1 >= 0 && beta1 < 1, fmt::format("beta1 must be in [0, 1) (got {})", beta1));
  req(beta2 >= 0 && beta2 < 1, fmt::format("beta2 must be in [0, 1) (got {})", beta2));
  req(eps > 0 && std::isfinite(eps), fmt::format("eps must be finite and > 0 (got {})", eps));
  bounded(kRun, "eps", eps, limits::eps);
  req(weight_decay >= 0 && std::isfinite(weight_decay),
      fmt::format("weight_decay must be finite and >= 0 (got {})", weight_decay));
  bounded(kRun, "weight_decay", weight_decay, limits::weight_decay);
  req(max_grad_norm > 0 && std::isfinite(max_grad_norm),
      fmt::format("max_grad_norm must be finite and > 0 (got {})", max_grad_norm));
  bounded(kRun, "max_grad_norm", max_grad_norm, limits::max_grad_norm);
  req(docs_per_seq >= 1, fmt::format("docs_per_seq must be >= 1 (got {})", docs_per_seq));
  req(docs_per_seq <= seq_len,
      fmt::format("docs_per_seq {} exceeds seq_len {} (each document holds at least one token): use --docs-per-seq {}",
                  docs_per_seq, seq_len, seq_len));
}

void RunConfig::validate_for(const Config& m) const {
  validate();
  m.validate();
  const std::string what = "run config: activation size";
  const int64_t n = checked_mul(sequences, seq_len, "run config: tokens per step (sequences * seq_len)");
  if (n > limits::tokens)
    fail(fmt::format("{}: sequences * seq_len = {} * {} = {} tokens per step exceeds its bound {} (docs/model.md "
                     "\"Limits\")", kRun, sequences, seq_len, n, limits::tokens));
  // The widest per-token activation: hidden, query, KV payload, attention output, dense/expert/shared FFN,
  // router scores, the linear-CE vocabulary chunk.
  int64_t width = m.d_model;
  auto widen = [&](int64_t w) { width = std::max(width, w); };
  widen(checked_mul(m.heads, m.q_head_dim(), what));
  widen(checked_mul(m.heads, m.core_q_dim(), what));
  widen(checked_mul(m.heads, m.attn == AttnKind::mla ? m.v_dim : m.head_dim, what));
  widen(m.payload_dim());
  if (m.dense_layers > 0) widen(m.dense_ffn);
  if (m.dense_layers < m.layers) {
    widen(checked_mul(m.top_k, m.expert_ffn, what));
    widen(m.shared_ffn);
    widen(m.experts);
  }
  widen(std::min(m.vocab_chunk, m.vocab));
  const int64_t act = checked_mul(n, width, what);
  if (act > limits::activation)
    fail(fmt::format("{}: {} tokens x {} (the widest activation row) = {} elements exceeds the activation bound {} "
                     "(docs/model.md \"Limits\")", kRun, n, width, act, limits::activation));
  const int64_t ce = checked_mul(std::min(token_chunk, n), std::min(m.vocab_chunk, m.vocab), what);
  if (ce > limits::activation)
    fail(fmt::format("{}: the linear-CE chunk min(token_chunk, tokens) x min(vocab_chunk, vocab) = {} elements "
                     "exceeds the activation bound {}", kRun, ce, limits::activation));
}

json RunConfig::to_json() const {
  json j{{"sequences", sequences}, {"seq_len", seq_len}, {"steps", steps},     {"token_chunk", token_chunk},
              {"recompute", recompute}, {"lr", lr},           {"beta1", beta1},     {"beta2", beta2},
              {"eps", eps},             {"weight_decay", weight_decay}, {"max_grad_norm", max_grad_norm},
              {"data_seed", data_seed}};
  if (docs_per_seq != 1) j["docs_per_seq"] = docs_per_seq;  // optional key: absent = one document per sequence
  return j;
}

RunConfig RunConfig::from_json(const json& j) {
  Reader r(j, "run config");
  RunConfig c;
  c.sequences = r.i64("sequences");
  c.seq_len = r.i64("seq_len");
  c.steps = r.i64("steps");
  c.token_chunk = r.i64("token_chunk");
  c.recompute = r.boolean("recompute");
  c.lr = r.f64("lr");
  c.beta1 = r.f64("beta1");
  c.beta2 = r.f64("beta2");
  c.eps = r.f64("eps");
  c.weight_decay = r.f64("weight_decay");
  c.max_grad_norm = r.f64("max_grad_norm");
  c.data_seed = r.u64("data_seed");
  if (r.has("docs_per_seq")) c.docs_per_seq = r.i64("docs_per_seq");
  r.finish();
  c.validate();
  return c;
}

}  // namespace trident::model
