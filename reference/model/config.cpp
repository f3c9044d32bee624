#include "reference/model/config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
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
  int64_t i64(const std::string& key) {
    const json& v = get(key);
    if (!v.is_number_integer())
      fail(fmt::format("{}: key '{}' must be an integer, got {} ({})", where_, key, v.type_name(), v.dump()));
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

}  // namespace

void Config::validate() const {
  auto pos = [](int64_t v, const char* name) {
    require(v > 0, fmt::format("{} must be > 0 (got {})", name, v));
  };
  pos(vocab, "vocab");
  pos(d_model, "d_model");
  pos(layers, "layers");
  require(dense_layers >= 0 && dense_layers <= layers,
          fmt::format("dense_layers must be in [0, layers] (got {}, layers = {})", dense_layers, layers));
  pos(heads, "attention.heads");
  if (attn == AttnKind::gqa) {
    pos(kv_heads, "attention.kv_heads");
    pos(head_dim, "attention.head_dim");
    require(heads % kv_heads == 0,
            fmt::format("attention.heads % attention.kv_heads must be 0 (got {} % {})", heads, kv_heads));
    require(head_dim % 2 == 0, fmt::format("attention.head_dim must be even for RoPE (got {})", head_dim));
  } else {
    pos(nope_dim, "attention.nope_dim");
    pos(rope_dim, "attention.rope_dim");
    pos(v_dim, "attention.v_dim");
    pos(kv_lora_rank, "attention.kv_lora_rank");
    require(rope_dim % 2 == 0, fmt::format("attention.rope_dim must be even for RoPE (got {})", rope_dim));
  }
  if (dense_layers < layers) {
    pos(experts, "experts");
    pos(top_k, "top_k");
    require(top_k <= experts, fmt::format("top_k must be <= experts (got top_k = {}, experts = {})", top_k, experts));
    pos(expert_ffn, "expert_ffn");
    require(shared_ffn >= 0, fmt::format("shared_ffn must be >= 0 (0 = no shared expert; got {})", shared_ffn));
    require(routed_scale > 0 && std::isfinite(routed_scale),
            fmt::format("routed_scale must be finite and > 0 (got {})", routed_scale));
    require(bias_rate >= 0 && std::isfinite(bias_rate),
            fmt::format("bias_rate must be finite and >= 0 (got {})", bias_rate));
  }
  if (dense_layers > 0) pos(dense_ffn, "dense_ffn");
  pos(tile, "tile");
  require(vocab_chunk > 0, fmt::format("vocab_chunk must be > 0 (got {})", vocab_chunk));
  require(rope_theta > 1 && std::isfinite(rope_theta), fmt::format("rope_theta must be finite and > 1 (got {})", rope_theta));
  require(norm_eps > 0 && norm_eps < 1, fmt::format("norm_eps must be in (0, 1) (got {})", norm_eps));
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
      c.kv_heads = 0;
      c.head_dim = 0;
    } else if (kind == "gqa") {
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

json toml_file_to_json(const std::string& path) {
  try {
    return toml_to_json(toml::parse(path));
  } catch (const trident::Error&) {
    throw;
  } catch (const std::exception& e) {
    fail(fmt::format("cannot parse TOML file '{}': {}", path, e.what()));
  }
}

Config Config::load(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::exists(path)) fail(fmt::format("config file '{}' does not exist", path));
  const std::string ext = fs::path(path).extension().string();
  json j;
  if (ext == ".toml") {
    j = toml_file_to_json(path);
  } else if (ext == ".json") {
    std::ifstream in(path);
    if (!in) fail(fmt::format("cannot open config file '{}'", path));
    try {
      j = json::parse(in);
    } catch (const std::exception& e) {
      fail(fmt::format("cannot parse JSON file '{}': {}", path, e.what()));
    }
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
  } else {
    fail(fmt::format("unknown preset '{}' (known: {})", name, fmt::join(preset_names(), ", ")));
  }
  c.validate();
  return c;
}

std::vector<std::string> Config::preset_names() { return {"tiny", "tiny-gqa", "tiny-e64"}; }

void RunConfig::validate() const {
  auto req = [](bool ok, const std::string& rule) {
    if (!ok) fail("invalid run config: " + rule);
  };
  req(sequences > 0, fmt::format("sequences must be > 0 (got {})", sequences));
  req(seq_len > 1, fmt::format("seq_len must be > 1 (got {})", seq_len));
  req(steps >= 0, fmt::format("steps must be >= 0 (got {})", steps));
  req(token_chunk > 0, fmt::format("token_chunk must be > 0 (got {})", token_chunk));
  req(lr >= 0 && std::isfinite(lr), fmt::format("lr must be finite and >= 0 (got {})", lr));
  req(beta1 >= 0 && beta1 < 1, fmt::format("beta1 must be in [0, 1) (got {})", beta1));
  req(beta2 >= 0 && beta2 < 1, fmt::format("beta2 must be in [0, 1) (got {})", beta2));
  req(eps > 0, fmt::format("eps must be > 0 (got {})", eps));
  req(weight_decay >= 0, fmt::format("weight_decay must be >= 0 (got {})", weight_decay));
  req(max_grad_norm > 0, fmt::format("max_grad_norm must be > 0 (got {})", max_grad_norm));
}

json RunConfig::to_json() const {
  return json{{"sequences", sequences}, {"seq_len", seq_len}, {"steps", steps},     {"token_chunk", token_chunk},
              {"recompute", recompute}, {"lr", lr},           {"beta1", beta1},     {"beta2", beta2},
              {"eps", eps},             {"weight_decay", weight_decay}, {"max_grad_norm", max_grad_norm},
              {"data_seed", data_seed}};
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
  r.finish();
  c.validate();
  return c;
}

}  // namespace trident::model
