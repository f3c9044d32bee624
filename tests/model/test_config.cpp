// Model config: presets, JSON/TOML loading, and one clear error per bad input (issue 3 "Bad input").
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "reference/check.h"
#include "reference/model/config.h"
#include "reference/model/model.h"
#include "reference/model/params.h"
#include "reference/toml_json.h"

using namespace trident;
using namespace trident::model;
using json = nlohmann::json;

namespace {

std::string src(const std::string& rel) { return std::string(TRIDENT_SOURCE_DIR) + "/" + rel; }

std::string tmpfile(const std::string& name, const std::string& text) {
  auto dir = std::filesystem::temp_directory_path() / ("trident_model_cfg_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto p = (dir / name).string();
  std::ofstream(p) << text;
  return p;
}

// Expect trident::Error whose message contains `needle`.
template <class F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected an error containing '" << needle << "'";
  } catch (const trident::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
  }
}

json tiny_json() { return Config::preset("tiny").to_json(); }

// Presets above this many parameters are plan-sized (kimi-k2, qwen35-a3b): tests never allocate their parameters.
constexpr int64_t kCpuParams = int64_t{1} << 30;

// Elements of the parameter layout, from the shapes alone (no allocation).
int64_t layout_elems(const Config& c) {
  int64_t n = 0;
  for (const ParamInfo& in : param_layout(c)) {
    int64_t k = 1;
    for (int64_t s : in.shape) k *= s;
    n += k;
  }
  return n;
}

}  // namespace

TEST(ModelConfig, PresetsValidAndRoundTrip) {
  for (const auto& name : Config::preset_names()) {
    const Config c = Config::preset(name);
    const Config d = Config::from_json(c.to_json());
    EXPECT_EQ(c.to_json(), d.to_json()) << name;
  }
  EXPECT_EQ(Config::preset("tiny").attn, AttnKind::mla);
  EXPECT_EQ(Config::preset("tiny-gqa").attn, AttnKind::gqa);
  expect_error([] { Config::preset("huge"); }, "unknown preset 'huge'");
}

// The source documents' systems (docs/model.md "Presets"): their dimensions, their parameter counts (from the layout's
// shapes, never allocated) and the bound they sit under.
TEST(ModelConfig, PlanSizedPresets) {
  const Config k = Config::preset("kimi-k2");
  EXPECT_EQ(k.attn, AttnKind::mla);
  EXPECT_EQ(k.d_model, 7168);
  EXPECT_EQ(k.layers, 61);
  EXPECT_EQ(k.dense_layers, 1);
  EXPECT_EQ(k.experts, 384);
  EXPECT_EQ(k.top_k, 8);
  EXPECT_EQ(k.payload_dim(), 576);  // the latent KV CP gathers: kv_lora_rank 512 + rope 64
  EXPECT_FALSE(k.dsa());
  EXPECT_EQ(k.param_count(), layout_elems(k));
  EXPECT_EQ(k.param_count(), 1029958092800);  // about 1.03e12
  EXPECT_LT(k.param_count(), limits::params);
  const Config q = Config::preset("qwen35-a3b");
  EXPECT_EQ(q.attn, AttnKind::gqa);
  EXPECT_EQ(q.vocab, 248320);  // seed 002's logits example
  EXPECT_EQ(q.kv_heads, 2);    // seed 000
  EXPECT_EQ(q.dense_layers, 0);
  EXPECT_EQ(q.payload_dim(), 1024);
  EXPECT_EQ(q.param_count(), layout_elems(q));
  EXPECT_EQ(q.param_count(), 34131324928);  // about 34 B
  for (const Config& c : {k, q}) EXPECT_GT(c.param_count(), kCpuParams);
}

TEST(ModelConfig, ExampleFilesMatchPresets) {
  EXPECT_EQ(Config::load(src("reference/model/configs/tiny.json")).to_json(), tiny_json());
  EXPECT_EQ(Config::load(src("reference/model/configs/tiny.toml")).to_json(), tiny_json());
  EXPECT_EQ(Config::load(src("reference/model/configs/tiny-gqa.toml")).to_json(), Config::preset("tiny-gqa").to_json());
}

TEST(ModelConfig, MissingUnknownWrongType) {
  {
    json j = tiny_json();
    j.erase("top_k");
    expect_error([&] { Config::from_json(j); }, "missing key 'top_k'");
  }
  {
    json j = tiny_json();
    j["topk"] = 2;
    expect_error([&] { Config::from_json(j); }, "unknown key 'topk'");
  }
  {
    json j = tiny_json();
    j["attention"]["head_dim"] = 16;  // a GQA key in an MLA block
    expect_error([&] { Config::from_json(j); }, "unknown key 'head_dim'");
  }
  {
    json j = tiny_json();
    j["d_model"] = "64";
    expect_error([&] { Config::from_json(j); }, "'d_model' must be an integer");
  }
  {
    json j = tiny_json();
    j["d_model"] = 64.5;
    expect_error([&] { Config::from_json(j); }, "'d_model' must be an integer");
  }
  {
    json j = tiny_json();
    j["policy"] = "fp16";
    expect_error([&] { Config::from_json(j); }, "unknown precision policy 'fp16'");
  }
  {
    json j = tiny_json();
    j["attention"]["kind"] = "mha";
    expect_error([&] { Config::from_json(j); }, "\"mla\" or \"gqa\"");
  }
  {
    json j = tiny_json();
    j["seed"] = -1;
    expect_error([&] { Config::from_json(j); }, "'seed' must be a non-negative integer");
  }
}

TEST(ModelConfig, InvalidCombinations) {
  auto gqa = Config::preset("tiny-gqa").to_json();
  auto with = [](json j, const std::string& k, json v) {
    j[k] = v;
    return j;
  };
  auto attn = [](json j, const std::string& k, json v) {
    j["attention"][k] = v;
    return j;
  };
  expect_error([&] { Config::from_json(attn(gqa, "kv_heads", 3)); }, "attention.heads % attention.kv_heads must be 0");
  expect_error([&] { Config::from_json(attn(gqa, "head_dim", 15)); }, "head_dim must be even");
  expect_error([&] { Config::from_json(attn(tiny_json(), "rope_dim", 7)); }, "rope_dim must be even");
  expect_error([&] { Config::from_json(with(tiny_json(), "top_k", 9)); }, "top_k must be <= experts");
  expect_error([&] { Config::from_json(with(tiny_json(), "dense_layers", 4)); }, "dense_layers must be in [0, layers]");
  expect_error([&] { Config::from_json(with(tiny_json(), "d_model", 0)); }, "d_model must be > 0");
  expect_error([&] { Config::from_json(with(tiny_json(), "vocab_chunk", 0)); }, "vocab_chunk must be > 0");
  expect_error([&] { Config::from_json(with(tiny_json(), "tile", -1)); }, "tile must be > 0");
  expect_error([&] { Config::from_json(with(tiny_json(), "shared_ffn", -1)); }, "shared_ffn must be >= 0");
  expect_error([&] { Config::from_json(with(tiny_json(), "norm_eps", 0.0)); }, "norm_eps must be in (0, 1)");
  expect_error([&] { Config::from_json(attn(tiny_json(), "kv_lora_rank", 0)); }, "kv_lora_rank must be > 0");
}

TEST(ModelConfig, FileErrors) {
  expect_error([] { Config::load("/nonexistent/x.json"); }, "does not exist");
  expect_error([] { Config::load(tmpfile("c.yaml", "a: 1")); }, "unknown extension");
  expect_error([] { Config::load(tmpfile("bad.json", "{\"vocab\": ")); }, "cannot parse JSON");
  expect_error([] { Config::load(tmpfile("bad.toml", "vocab = = 3")); }, "cannot parse TOML");
  // A TOML file with a wrong type names the file and the key.
  std::string t;
  {
    std::ifstream in(src("reference/model/configs/tiny.toml"));
    t.assign(std::istreambuf_iterator<char>(in), {});
  }
  const auto pos = t.find("top_k = 2");
  ASSERT_NE(pos, std::string::npos);
  std::string t2 = t;
  t2.replace(pos, 9, "top_k = \"2\"");
  expect_error([&] { Config::load(tmpfile("wrongtype.toml", t2)); }, "'top_k' must be an integer");
  std::string t3 = t;
  t3.replace(pos, 9, "top_k = 2\nexperts_typo = 3");
  expect_error([&] { Config::load(tmpfile("unknown.toml", t3)); }, "unknown key 'experts_typo'");
}

TEST(ModelConfig, RunConfig) {
  RunConfig r;
  EXPECT_EQ(RunConfig::from_json(r.to_json()).to_json(), r.to_json());
  json j = r.to_json();
  j["seq_len"] = 1;
  expect_error([&] { RunConfig::from_json(j); }, "seq_len must be > 1");
  j = r.to_json();
  j.erase("lr");
  expect_error([&] { RunConfig::from_json(j); }, "missing key 'lr'");
}

TEST(ModelParams, LayoutNamesAndShapes) {
  const Config c = Config::preset("tiny");
  const auto ps = ParamSet<float>::zeros(c);
  EXPECT_EQ(ps["embed"].shape, (Shape{512, 64}));
  EXPECT_EQ(ps["layers.0.attn.wq"].shape, (Shape{64, 4 * 24}));
  EXPECT_EQ(ps["layers.0.attn.wdkv"].shape, (Shape{64, 40}));
  EXPECT_EQ(ps["layers.0.attn.wuk"].shape, (Shape{32, 64}));
  EXPECT_EQ(ps["layers.0.mlp.wd"].shape, (Shape{128, 64}));
  EXPECT_EQ(ps["layers.1.moe.experts.wg"].shape, (Shape{8, 64, 32}));
  EXPECT_EQ(ps["layers.2.moe.experts.wd"].shape, (Shape{8, 32, 64}));
  EXPECT_FALSE(ps.info[ps.find("layers.1.moe.router_bias")].trainable);
  EXPECT_TRUE(ps.info[ps.find("lm_head")].is_matrix);
  EXPECT_FALSE(ps.info[ps.find("final_norm")].is_matrix);
  expect_error([&] { ps.find("layers.0.moe.router"); }, "no parameter named 'layers.0.moe.router'");
  const auto g = ParamSet<float>::zeros(Config::preset("tiny-gqa"));
  EXPECT_EQ(g["layers.1.attn.wk"].shape, (Shape{64, 32}));
  EXPECT_EQ(g["layers.1.attn.wo"].shape, (Shape{64, 64}));
  // init is deterministic and not degenerate
  const auto a = ParamSet<float>::init(c, 5), b = ParamSet<float>::init(c, 5), d = ParamSet<float>::init(c, 6);
  EXPECT_EQ(a["lm_head"].data, b["lm_head"].data);
  EXPECT_NE(a["lm_head"].data, d["lm_head"].data);
  EXPECT_EQ(a["final_norm"].data, std::vector<float>(64, 1.0f));
}

TEST(ModelBadInput, TokenAndTargetIds) {
  const Config c = Config::preset("tiny");
  const auto ps = ParamSet<float>::init(c, 1);
  Batch b;
  b.B = 1;
  b.S = 4;
  b.tokens = {1, 2, 512, 3};
  b.targets = {2, 3, 4, 5};
  expect_error([&] { model_forward<float>(c, ps, b, {}); }, "token id 512 at (sequence 0, position 2) is out of range");
  b.tokens = {1, 2, -1, 3};
  expect_error([&] { model_forward<float>(c, ps, b, {}); }, "token id -1");
  b.tokens = {1, 2, 3, 4};
  b.targets = {2, 3, -5, 5};
  expect_error([&] { model_forward<float>(c, ps, b, {}); }, "target -5 at (sequence 0, position 2)");
  b.targets = {2, 3};
  expect_error([&] { model_forward<float>(c, ps, b, {}); }, "must hold 1 x 4 = 4 values");
  // a policy that does not match the parameter type
  Config c64 = c;
  c64.policy = Policy::fp64;
  b.targets = {2, 3, 4, 5};
  expect_error([&] { model_forward<float>(c64, ps, b, {}); }, "policy fp64 needs double parameters");
}

// ---------------------------------------------------------------------------------------------------------------
// Hardening (issue 15): bounds of every value, checked size arithmetic, strict TOML/JSON.

namespace {

// Each oversized value is one error naming the key, its value and its bound.
void expect_bound_error(const json& j, const std::string& key, const std::string& value, int64_t bound) {
  expect_error([&] { Config::from_json(j); }, fmt::format("{} = {} exceeds its bound {}", key, value, bound));
}

}  // namespace

TEST(ModelConfigLimits, OversizedValuesNameKeyValueAndBound) {
  const json mla = tiny_json(), gqa = Config::preset("tiny-gqa").to_json();
  // The measured crashes: a wrapped parameter count and a SIGSEGV (v_dim), a vector of -2^63 elements
  // (expert_ffn), a malloc assertion (heads).
  for (int64_t huge : {(int64_t{1} << 61) + 1, (int64_t{1} << 62) + 1, std::numeric_limits<int64_t>::max()}) {
    const std::string v = std::to_string(huge);
    json j = mla;
    j["attention"]["v_dim"] = huge;
    expect_bound_error(j, "attention.v_dim", v, limits::head_dim);
    j = mla;
    j["expert_ffn"] = huge;
    expect_bound_error(j, "expert_ffn", v, limits::expert_ffn);
    j = mla;
    j["attention"]["heads"] = huge;
    expect_bound_error(j, "attention.heads", v, limits::heads);
  }
  struct Case {
    const char* key;  // dotted: attention.* inside the attention block
    int64_t bound;
    bool gqa = false;
  };
  const Case cases[] = {{"vocab", limits::vocab},
                        {"d_model", limits::d_model},
                        {"layers", limits::layers},
                        {"attention.heads", limits::heads},
                        {"attention.nope_dim", limits::head_dim},
                        {"attention.rope_dim", limits::head_dim},
                        {"attention.v_dim", limits::head_dim},
                        {"attention.kv_lora_rank", limits::kv_lora_rank},
                        {"attention.kv_heads", limits::heads, true},
                        {"attention.head_dim", limits::head_dim, true},
                        {"experts", limits::experts},
                        {"top_k", limits::experts},
                        {"expert_ffn", limits::expert_ffn},
                        {"shared_ffn", limits::expert_ffn},
                        {"dense_ffn", limits::dense_ffn},
                        {"tile", limits::tile},
                        {"vocab_chunk", limits::vocab_chunk}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key);
    const std::string k = c.key;
    for (int64_t v : {c.bound + 2, (int64_t{1} << 61) + 2}) {  // even: the RoPE widths must be even
      json j = c.gqa ? gqa : mla;
      if (k.rfind("attention.", 0) == 0) j["attention"][k.substr(10)] = v;
      else j[k] = v;
      expect_bound_error(j, k, std::to_string(v), c.bound);
    }
  }
  // Doubles.
  auto with = [](json j, const std::string& k, json v) {
    j[k] = v;
    return j;
  };
  expect_error([&] { Config::from_json(with(mla, "routed_scale", 1e300)); }, "routed_scale = 1e+300 exceeds its bound");
  expect_error([&] { Config::from_json(with(mla, "bias_rate", 2.0)); }, "bias_rate = 2 exceeds its bound 1");
  expect_error([&] { Config::from_json(with(mla, "rope_theta", 1e300)); }, "rope_theta = 1e+300 exceeds its bound");
  // A JSON integer above int64 (nlohmann stores it unsigned) is not wrapped to a negative value.
  expect_error([&] { Config::from_json(with(mla, "vocab", std::numeric_limits<uint64_t>::max())); },
               "key 'vocab' = 18446744073709551615 is out of range");
  // Keys the config does not use are bounded too (experts of an all-dense model).
  json dense = with(mla, "dense_layers", 3);
  dense["experts"] = (int64_t{1} << 61) + 1;
  expect_bound_error(dense, "experts", std::to_string((int64_t{1} << 61) + 1), limits::experts);
  // Values at their bounds are accepted (vocab: 2 * 2^24 * 64 parameters in embed and lm_head).
  EXPECT_NO_THROW(Config::from_json(with(mla, "vocab", limits::vocab)));
  EXPECT_NO_THROW(Config::from_json(with(mla, "tile", limits::tile)));
}

TEST(ModelConfigLimits, ParamCountIsCheckedAndMatchesTheLayout) {
  for (const auto& name : Config::preset_names()) {
    const Config c = Config::preset(name);
    if (c.param_count() > kCpuParams) continue;  // plan-sized presets: PlanSizedPresets below, never allocated
    EXPECT_EQ(c.param_count(), ParamSet<float>::zeros(c).numel()) << name;
  }
  // Variants: no shared expert, all dense, all MoE, GQA with kv_heads == heads.
  Config c = Config::preset("tiny");
  c.shared_ffn = 0;
  EXPECT_EQ(c.param_count(), ParamSet<float>::zeros(c).numel());
  c.dense_layers = c.layers;
  EXPECT_EQ(c.param_count(), ParamSet<float>::zeros(c).numel());
  c.dense_layers = 0;
  EXPECT_EQ(c.param_count(), ParamSet<float>::zeros(c).numel());
  Config g = Config::preset("tiny-gqa");
  g.kv_heads = g.heads;
  EXPECT_EQ(g.param_count(), ParamSet<float>::zeros(g).numel());
  // Every value within its bound, the total beyond limits::params: one error with the count and the bound.
  Config big = Config::preset("tiny");
  big.layers = limits::layers;
  big.dense_layers = 0;
  big.d_model = limits::d_model;
  big.experts = limits::experts;
  big.expert_ffn = limits::expert_ffn;
  const int64_t n = big.param_count();  // ~3 * 2^55: fits int64, far beyond the bound
  EXPECT_GT(n, limits::params);
  expect_error([&] { big.validate(); }, fmt::format("the model has {} parameters, more than the bound {}", n,
                                                    limits::params));
  // The checked arithmetic itself (unreachable through validate, which bounds each value first).
  Config wrap = Config::preset("tiny");
  wrap.attn = AttnKind::mla;
  wrap.v_dim = (int64_t{1} << 61) + 1;
  expect_error([&] { (void)wrap.param_count(); }, "parameter count overflows int64");
  expect_error([] { checked_mul(int64_t{1} << 62, 4, "x"); }, "x overflows int64: 4611686018427387904 * 4");
  expect_error([] { checked_add(std::numeric_limits<int64_t>::max(), 1, "y"); }, "y overflows int64");
}

TEST(ModelConfigLimits, RunConfigBoundsAndSizes) {
  const Config c = Config::preset("tiny");
  RunConfig r;
  EXPECT_NO_THROW(r.validate_for(c));
  auto bad = [&](auto set, const std::string& needle) {
    RunConfig x;
    set(x);
    expect_error([&] { x.validate_for(c); }, needle);
  };
  bad([](RunConfig& x) { x.sequences = (int64_t{1} << 62) + 1; }, "sequences = 4611686018427387905 exceeds its bound");
  bad([](RunConfig& x) { x.seq_len = int64_t{1} << 40; }, "seq_len = 1099511627776 exceeds its bound");
  bad([](RunConfig& x) { x.steps = int64_t{1} << 40; }, "steps = 1099511627776 exceeds its bound");
  bad([](RunConfig& x) { x.token_chunk = int64_t{1} << 40; }, "token_chunk = 1099511627776 exceeds its bound");
  bad([](RunConfig& x) { x.lr = 1e9; }, "lr = 1000000000 exceeds its bound");
  bad([](RunConfig& x) { x.eps = std::numeric_limits<double>::infinity(); }, "eps must be finite and > 0");
  bad([](RunConfig& x) { x.weight_decay = std::numeric_limits<double>::infinity(); }, "weight_decay must be finite");
  bad([](RunConfig& x) { x.max_grad_norm = std::numeric_limits<double>::infinity(); }, "max_grad_norm must be finite");
  // Each value within its bound, the product beyond: tokens per step.
  bad(
      [](RunConfig& x) {
        x.sequences = limits::sequences;
        x.seq_len = limits::seq_len;
      },
      "sequences * seq_len = 1048576 * 1048576 = 1099511627776 tokens per step exceeds its bound 268435456");
  // The widest activation: 2^28 tokens x a 2^18-wide dense FFN row.
  Config wide = c;
  wide.dense_ffn = limits::dense_ffn;
  RunConfig x;
  x.sequences = 1 << 14;
  x.seq_len = 1 << 14;
  expect_error([&] { x.validate_for(wide); }, "262144 (the widest activation row)");
  // RunConfig::from_json: a JSON integer above int64 is an error, not a wrapped negative number.
  json j = r.to_json();
  j["steps"] = std::numeric_limits<uint64_t>::max();
  expect_error([&] { RunConfig::from_json(j); }, "key 'steps' = 18446744073709551615 is out of range");
}

TEST(ModelConfigStrictText, DuplicateJsonKeys) {
  std::string t;
  {
    std::ifstream in(src("reference/model/configs/tiny.json"));
    t.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::string top = t;
  top.replace(top.find("\"vocab\": 512,"), 13, "\"vocab\": 512, \"vocab\": 7,");
  expect_error([&] { Config::load(tmpfile("dup.json", top)); }, "duplicate JSON key 'vocab'");
  std::string nested = t;
  nested.replace(nested.find("\"heads\": 4,"), 11, "\"heads\": 4, \"heads\": 8,");
  expect_error([&] { Config::load(tmpfile("dupnested.json", nested)); }, "duplicate JSON key 'attention.heads'");
  // The same key in two different objects is fine.
  EXPECT_NO_THROW(parse_json_strict(R"({"a": {"x": 1}, "b": {"x": 2}, "x": [{"x": 1}, {"x": 2}]})", "t"));
  expect_error([] { parse_json_strict(R"({"a": [{"x": 1, "x": 2}]})", "t"); }, "duplicate JSON key 'a.x'");
  // Deep nesting is refused before anything recursive sees it.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  expect_error([&] { parse_json_strict(deep, "deep"); }, "JSON nesting deeper than 64 levels");
  expect_error([&] { Config::load(tmpfile("deep.json", "{\"vocab\": " + deep + "}")); }, "JSON nesting deeper");
  expect_error([&] { Config::load(tmpfile("trunc.json", t.substr(0, t.size() / 2))); }, "cannot parse JSON");
}

TEST(ModelConfigStrictText, TomlNumbersOutOfRange) {
  std::string t;
  {
    std::ifstream in(src("reference/model/configs/tiny.toml"));
    t.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto edit = [&](const std::string& from, const std::string& to) {
    std::string s = t;
    const auto pos = s.find(from);
    EXPECT_NE(pos, std::string::npos) << from;
    s.replace(pos, from.size(), to);
    return s;
  };
  // The measured bug: toml11 clamps this to 2^63-1 and the run went ahead with that tile.
  expect_error([&] { Config::load(tmpfile("tile.toml", edit("tile = 8", "tile = 99999999999999999999"))); },
               "TOML key 'tile' (");
  expect_error([&] { Config::load(tmpfile("tile.toml", edit("tile = 8", "tile = 99999999999999999999"))); },
               "integer 99999999999999999999 is out of range");
  expect_error([&] { Config::load(tmpfile("neg.toml", edit("tile = 8", "tile = -9_223_372_036_854_775_809"))); },
               "integer -9_223_372_036_854_775_809 is out of range");
  expect_error([&] { Config::load(tmpfile("hex.toml", edit("tile = 8", "tile = 0xFFFFFFFFFFFFFFFFF"))); },
               "integer 0xFFFFFFFFFFFFFFFFF is out of range");
  expect_error([&] { Config::load(tmpfile("nested.toml", edit("heads = 4", "heads = 18446744073709551616"))); },
               "TOML key 'attention.heads'");
  expect_error([&] { Config::load(tmpfile("float.toml", edit("rope_theta = 10000.0", "rope_theta = 1e999"))); },
               "TOML key 'rope_theta'");
  // The extremes themselves are in range: they reach the config bounds (one clear error, the real value).
  expect_error([&] { Config::load(tmpfile("max.toml", edit("tile = 8", "tile = 9223372036854775807"))); },
               "tile = 9223372036854775807 exceeds its bound");
  expect_error([&] { Config::load(tmpfile("min.toml", edit("tile = 8", "tile = -9223372036854775808"))); },
               "tile must be > 0 (got -9223372036854775808)");
  // Deep nesting (toml11 parses and destroys recursively) is refused first.
  expect_error([&] { Config::load(tmpfile("deep.toml", edit("tile = 8", "tile = " + std::string(100000, '[')))); },
               "TOML nesting deeper than 64 levels");
  std::string dotted = "a";
  for (int i = 0; i < 100000; ++i) dotted += ".a";
  expect_error([&] { Config::load(tmpfile("dotted.toml", dotted + " = 1\n")); }, "TOML nesting deeper");
  // Brackets inside strings and comments do not count.
  EXPECT_NO_THROW(check_toml_text("a = \"" + std::string(1000, '[') + "\" # " + std::string(1000, '{') + "\n",
                                  "strings"));
  // Binary literals: toml11 accumulates them in an int64 (overflowing at 63 digits: a silently wrapped value).
  expect_error([&] { Config::load(tmpfile("bin.toml", edit("tile = 8", "tile = 0b1" + std::string(64, '0') + "1000"))); },
               "TOML key 'tile' (");
  expect_error([&] { Config::load(tmpfile("bin.toml", edit("heads = 4", "heads = 0b" + std::string(63, '1')))); },
               "binary integer 0b111");
  EXPECT_NO_THROW(check_toml_text("a = 0b" + std::string(62, '1') + "\nb = \"0b" + std::string(70, '1') + "\"\n",
                                  "binary"));
  EXPECT_EQ(Config::load(tmpfile("bin8.toml", edit("tile = 8", "tile = 0b1_000"))).tile, 8);
  // Bigger than any config: refused before parsing.
  expect_error([&] { Config::load(tmpfile("big.toml", t + std::string(2 << 20, '#'))); }, "more than the");
}
