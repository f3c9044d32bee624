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
