// Config parsing: JSON and TOML agree, optional keys default and are echoed, bad input names the key.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <sstream>

#include "planner/config.h"
#include "planner/plan.h"
#include "planner/report.h"
#include "planner/run.h"
#include "reference/check.h"
#include "tests/error_of.h"

using namespace trident::planner;
using trident::MeshShape;
using nlohmann::json;

namespace {
std::string ex(const std::string& name) { return std::string(TRIDENT_PLANNER_EXAMPLES) + "/" + name; }
json example(const std::string& name) {
  std::ifstream f(ex(name));
  return json::parse(f);
}
using trident::test::error_of;
}  // namespace

TEST(PlannerConfig, TomlEqualsJson) {
  const std::string toml = R"(
[model]
params = 753e9
layers = 78
hidden = 6144
experts = 256
top_k = 8
dense_fraction = 0.02
sparse_index_layers = 21
sparse_topk = 2048
kv_latent_bytes_per_token = 1408
[cluster]
name = "GB200 NVL72"
gpu_memory_gb = 200
nvl = 72
rdma_GBps = 45
peak_tflops = 2500
mfu = 0.8
[workload]
context = 1048576
sequences_per_cp_group = 1
recompute_bwd_mb_per_token = 2.5
attn_to_linear = 2
[mesh]
d_rep = 4
fsdp = 1
cp = 64
e_fsdp = 4
ep = 64
)";
  const PlanInput a = parse_config(toml_text_to_json(toml), "inline.toml");
  const PlanInput b = load_config(ex("nvl72_1m.json"));
  EXPECT_EQ(echo_config(a), echo_config(b));
  const Plan pa = evaluate(a, *a.mesh), pb = evaluate(b, *b.mesh);
  EXPECT_EQ(pa.total, pb.total);  // same inputs, same arithmetic: bitwise
  EXPECT_EQ(pa.min_tokens_to_hide, pb.min_tokens_to_hide);
  EXPECT_GT(pa.total, 0.0);
}

TEST(PlannerConfig, OptionalKeysDefaultAndEcho) {
  json j = example("nvl72_1m.json");
  j["model"].erase("sparse_index_layers");
  j["model"].erase("sparse_topk");
  j["model"].erase("kv_latent_bytes_per_token");
  j["cluster"].erase("mfu");
  j["cluster"].erase("name");
  j["workload"].erase("sequences_per_cp_group");
  j["workload"].erase("recompute_bwd_mb_per_token");
  j["workload"].erase("attn_to_linear");
  const PlanInput in = parse_config(j, "minimal");
  const json e = echo_config(in);
  EXPECT_EQ(e["cluster"]["mfu"], 0.8);
  EXPECT_EQ(e["cluster"]["nvlink_GBps"], 900.0);
  EXPECT_EQ(e["workload"]["sequences_per_cp_group"], 1);
  EXPECT_EQ(e["workload"]["recompute_bwd_mb_per_token"], 2.5);
  EXPECT_EQ(e["workload"]["attn_to_linear"], 2.0);
  EXPECT_EQ(e["model"]["sparse_index_layers"], 0);
  EXPECT_EQ(e["model"]["static_bytes_per_param"], 18.0);
  EXPECT_EQ(e["recipe"]["local_seq_min"], 16384);
  EXPECT_EQ(e["recipe"]["local_seq_max"], 32768);
  // every echoed value is a number/bool/string, never a missing key
  for (auto& [sec, obj] : e.items())
    for (auto& [k, v] : obj.items()) EXPECT_FALSE(v.is_null()) << sec << "." << k;
  // without the indexer the per-token sum drops by exactly 21 x 2048 x 4 B
  const Plan p = evaluate(in, *in.mesh);
  EXPECT_EQ(p.indexer_bytes_per_token, 0.0);
  EXPECT_EQ(p.dynamic_bytes_per_token, 78.0 * 6144 * 2 + 13312.0 * 64 + 2.5e6);
}

struct BadCase {
  const char* what;
  std::function<void(json&)> mutate;
  const char* expect;  // substring of the error (names the key)
};

TEST(PlannerConfig, BadInputNamesTheKey) {
  const std::vector<BadCase> cases = {
      {"missing key", [](json& j) { j["model"].erase("layers"); }, "model.layers: missing"},
      {"missing section", [](json& j) { j.erase("cluster"); }, "missing section 'cluster'"},
      {"unknown key", [](json& j) { j["model"]["layerz"] = 3; }, "model.layerz: unknown key"},
      {"unknown section", [](json& j) { j["optimizer"] = json::object(); }, "optimizer: unknown key"},
      {"string for int", [](json& j) { j["model"]["layers"] = "78"; }, "model.layers: expected an integer, got a string"},
      {"bool for number", [](json& j) { j["cluster"]["rdma_GBps"] = true; }, "cluster.rdma_GBps: expected a number, got a bool"},
      {"fractional int", [](json& j) { j["model"]["layers"] = 78.5; }, "model.layers: expected an integer"},
      {"negative size", [](json& j) { j["model"]["hidden"] = -1; }, "model.hidden: must be a positive integer"},
      {"zero size", [](json& j) { j["workload"]["context"] = 0; }, "workload.context: must be a positive integer"},
      {"zero memory", [](json& j) { j["cluster"]["gpu_memory_gb"] = 0; }, "cluster.gpu_memory_gb: must be > 0"},
      {"negative recompute", [](json& j) { j["workload"]["recompute_bwd_mb_per_token"] = -1; },
       "workload.recompute_bwd_mb_per_token: must be >= 0"},
      {"fraction > 1", [](json& j) { j["model"]["dense_fraction"] = 1.5; }, "model.dense_fraction: must be a fraction in [0,1]"},
      {"fraction < 0", [](json& j) { j["model"]["dense_fraction"] = -0.1; }, "model.dense_fraction: must be a fraction"},
      {"mfu > 1", [](json& j) { j["cluster"]["mfu"] = 1.2; }, "cluster.mfu: must be a fraction in [0,1]"},
      {"mfu 0", [](json& j) { j["cluster"]["mfu"] = 0; }, "cluster.mfu: must be in (0,1]"},
      {"section not an object", [](json& j) { j["mesh"] = 5; }, "'mesh' must be a table/object"},
      {"top_k > experts", [](json& j) { j["model"]["top_k"] = 300; }, "model.top_k: must be <= experts"},
      // The mesh rules are violations (shared with trident emulate), with the fix in config keys.
      {"mesh products", [](json& j) { j["mesh"]["e_fsdp"] = 2; },
       "invalid mesh (d_rep,fsdp,cp)x(e_fsdp,ep) = (4,1,64)x(2,64): d_rep*fsdp*cp = 256 but e_fsdp*ep = 128 (both "
       "must be the world size): use mesh.e_fsdp = 4"},
      {"experts % ep", [](json& j) { j["mesh"]["ep"] = 48; j["mesh"]["e_fsdp"] = 1; j["mesh"]["d_rep"] = 3; j["mesh"]["cp"] = 16; },
       "experts 256 is not a multiple of ep = 48 (each ep rank owns experts/ep whole experts): use mesh.e_fsdp = 3, "
       "mesh.ep = 16 or model.experts = 288"},
      {"zig-zag", [](json& j) { j["workload"]["context"] = 1000000; j["mesh"]["cp"] = 64; },
       "seq_len 1000000 is not a multiple of 2*cp = 128 (each sequence is cut into 2*cp zig-zag chunks): use "
       "workload.context = 1000064"},
      {"mesh key missing", [](json& j) { j["mesh"].erase("ep"); }, "mesh.ep: missing"},
      {"world mismatch", [](json& j) { j["cluster"]["world"] = 128; },
       "d_rep*fsdp*cp = 256 but the world size is 128: use cluster.world = 256 or a mesh of 128 ranks"},
      {"huge mesh axis", [](json& j) { j["mesh"]["fsdp"] = 9e15; }, "mesh.fsdp: must be <= 16777216"},
      {"huge nvl", [](json& j) { j["cluster"]["nvl"] = 1e12; }, "cluster.nvl: must be <= 16777216"},
      {"recipe range", [](json& j) { j["recipe"] = {{"local_seq_min", 65536}}; }, "recipe.local_seq_min: must be <="},
  };
  for (const auto& c : cases) {
    json j = example("nvl72_1m.json");
    c.mutate(j);
    const std::string err = error_of([&] { parse_config(j, "bad.json"); });
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.what << ": got '" << err << "', expected '" << c.expect << "'";
    EXPECT_EQ(err.find('\n'), std::string::npos) << c.what << ": one line expected: " << err;
    EXPECT_EQ(err.rfind("bad.json: ", 0), 0u) << c.what << ": the file is named first: " << err;
  }
}

TEST(PlannerConfig, BadFiles) {
  EXPECT_NE(error_of([] { load_config("/nonexistent/x.json"); }).find("cannot open"), std::string::npos);
  // Any other extension is refused before the file is read, with the formats that are accepted.
  for (const char* f : {"state.h5", "plan.yaml", "plan"})
    EXPECT_NE(error_of([&] { load_config(f); }).find("plan reads .json or .toml files"), std::string::npos) << f;
  const std::string dir = TRIDENT_PLANNER_BAD;
  EXPECT_NE(error_of([&] { load_config(dir + "/zero_context.toml"); }).find("workload.context"), std::string::npos);
  EXPECT_NE(error_of([] { toml_text_to_json("[model\nparams = 1"); }).find("TOML syntax error"), std::string::npos);
  EXPECT_NE(error_of([] { parse_config(json::array(), "x"); }).find("top level"), std::string::npos);
}

TEST(PlannerConfig, SeveralMeshViolationsAtOnce) {
  json j = example("nvl72_1m.json");
  j["mesh"]["e_fsdp"] = 2;
  j["workload"]["context"] = 1000000;
  j["cluster"]["world"] = 512;
  const std::string err = error_of([&] { parse_config(j, "bad.json"); });
  EXPECT_EQ(err,
            "bad.json: invalid mesh (d_rep,fsdp,cp)x(e_fsdp,ep) = (4,1,64)x(2,64), 3 problems:\n"
            "  d_rep*fsdp*cp = 256 but e_fsdp*ep = 128 (both must be the world size): use mesh.e_fsdp = 4\n"
            "  d_rep*fsdp*cp = 256 but the world size is 512: use cluster.world = 256 or a mesh of 512 ranks\n"
            "  seq_len 1000000 is not a multiple of 2*cp = 128 (each sequence is cut into 2*cp zig-zag chunks): use "
            "workload.context = 1000064");
}

TEST(PlannerConfig, SameRulesAsTheEmulator) {
  // check_mesh's layout bits are broken_rules of the config's inputs, for valid and invalid meshes.
  const PlanInput in = load_config(ex("nvl72_1m.json"));
  for (const MeshShape& m : {MeshShape{4, 1, 64, 4, 64}, MeshShape{4, 1, 64, 2, 64}, MeshShape{1, 3, 16, 1, 48},
                             MeshShape{2, 1, 3, 3, 2}})
    EXPECT_EQ(check_mesh(in, m).layout,
              trident::broken_rules(m, {.experts = in.model.experts, .seq_len = in.workload.context}))
        << m.str();
  EXPECT_EQ(check_mesh(in, MeshShape{2, 1, 3, 3, 2}).layout,
            trident::rule_bit(trident::LayoutRule::zigzag));  // 2^20 % 6 != 0
}

TEST(PlannerConfig, PlacementRulesAreWarnings) {
  // check_mesh names each NVLink placement rule; a mesh that breaks one is parsed and evaluated, with a warning.
  const PlanInput in = load_config(ex("nvl8_256k_a.json"));
  const MeshShape dense_wide{1, 32, 8, 32, 8};
  const MeshCheck c = check_mesh(in, dense_wide);
  EXPECT_EQ(c.layout, 0u);
  EXPECT_EQ(c.placement, uint32_t(kPlaceFsdpCpNvl));
  EXPECT_TRUE(c.ranked());
  const auto w = placement_warnings(in, dense_wide, c);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0], "fsdp*cp <= NVL broken: fsdp*cp = 256 > NVL = 8: dense FSDP traffic crosses RDMA (costed below)");
  // ep = 16 on 8-GPU nodes: a warning for a config mesh, dropped by the search
  const MeshShape ep16{32, 1, 8, 16, 16};
  const MeshCheck e = check_mesh(in, ep16);
  EXPECT_EQ(e.layout, 0u);
  EXPECT_TRUE(e.placement & kPlaceEpNvl);
  EXPECT_FALSE(e.ranked());
  const auto we = placement_warnings(in, ep16, e);
  ASSERT_FALSE(we.empty());
  EXPECT_EQ(we[0].rfind("ep <= NVL broken: ep = 16 > NVL = 8: the EP all-to-all crosses RDMA", 0), 0u) << we[0];
  json j = example("nvl8_256k_a.json");
  j["mesh"] = {{"d_rep", 32}, {"fsdp", 1}, {"cp", 8}, {"e_fsdp", 16}, {"ep", 16}};
  PlanInput parsed;
  EXPECT_NO_THROW(parsed = parse_config(j, "ep16.json"));
  ASSERT_TRUE(parsed.mesh);
  EXPECT_EQ(*parsed.mesh, ep16);
  RunOptions opt;
  std::ostringstream out, warn;
  EXPECT_EQ(run_plan(parsed, opt, out, warn), 0);
  EXPECT_EQ(warn.str().rfind("warning: ep <= NVL broken: ep = 16 > NVL = 8", 0), 0u) << warn.str();
  EXPECT_EQ(out.str().find("warning:"), std::string::npos);
  EXPECT_NE(out.str().find("NVLink placement rule(s) broken, see the warnings: ep <= NVL"), std::string::npos);
  // fsdp*cp = 6 and ep = 8 cannot share 8-GPU domains: lcm(6, 8) = 24 > 8
  PlanInput odd = in;
  odd.workload.context = 262144 * 3;
  const MeshCheck s = check_mesh(odd, MeshShape{8, 1, 6, 6, 8});
  EXPECT_EQ(s.layout, 0u);
  EXPECT_TRUE(s.placement & kPlaceStraddle);
  EXPECT_FALSE(s.ranked());
  // NVL72 hosts 64 GPUs of a (.., 64) x (.., 64) mesh per domain (no group straddles)
  const PlanInput n72 = load_config(ex("nvl72_1m.json"));
  const MeshCheck c72 = check_mesh(n72, *n72.mesh);
  EXPECT_TRUE(c72.nvlink_ok());
  EXPECT_EQ(c72.gpus_per_domain, 64);
  EXPECT_EQ(c72.domains, 4);
  EXPECT_TRUE(placement_warnings(n72, *n72.mesh, c72).empty());
}

// Values beyond the integer type are refused, never clamped; every input has an upper bound; zero sizes are errors.
TEST(PlannerConfig, ValuesBeyondTheTypeOrTheBoundAreRefusedNotClamped) {
  auto with = [](const std::string& sec, const std::string& key, const json& v) {
    json j = example("nvl72_1m.json");
    j[sec][key] = v;
    return error_of([&] { parse_config(j, "x.json"); });
  };
  const json big = json::parse("9223372036854775808");  // 2^63: an unsigned JSON integer
  EXPECT_NE(with("model", "layers", big).find("model.layers: must be <= 65536, got 9223372036854775808 (beyond the "
                                              "64-bit integer range)"),
            std::string::npos)
      << with("model", "layers", big);
  EXPECT_NE(with("model", "layers", json::parse("18446744073709551615")).find("beyond the 64-bit integer range"),
            std::string::npos);
  EXPECT_NE(with("model", "layers", INT64_MAX).find("model.layers: must be <= 65536"), std::string::npos);
  EXPECT_NE(with("model", "experts", int64_t{1} << 31).find("model.experts: must be <= 1048576"), std::string::npos);
  EXPECT_NE(with("cluster", "gpu_memory_gb", 1e20).find("cluster.gpu_memory_gb: must be <= 1e+06"), std::string::npos);
  EXPECT_NE(with("model", "params", 1.7e308).find("model.params: must be <= 1e+16"), std::string::npos);
  EXPECT_NE(with("workload", "attn_to_linear", 1e300).find("workload.attn_to_linear: must be <="), std::string::npos);
  EXPECT_NE(with("model", "kv_latent_bytes_per_token", 0).find("model.kv_latent_bytes_per_token: must be > 0, got 0"),
            std::string::npos);
  EXPECT_NE(with("model", "kv_latent_bytes_per_token", -0.0).find("must be > 0, got 0"), std::string::npos);
  EXPECT_NE(with("model", "vocab", 0).find("model.vocab: must be a positive integer, got 0"), std::string::npos);
  EXPECT_NE(with("mesh", "cp", 1e300).find("mesh.cp: expected an integer"), std::string::npos);
  // At the bounds: accepted.
  EXPECT_EQ(with("cluster", "gpu_memory_gb", 1e6), "");
}

// The chart's size does not grow with a value: a 1 PB GPU gives an SVG as small as a 200 GB one.
TEST(PlannerConfig, SvgSizeIsBounded) {
  json j = example("nvl72_1m.json");
  j["cluster"]["gpu_memory_gb"] = 1e6;
  const PlanInput in = parse_config(j, "x.json");
  const std::string svg = render_svg(in, *in.mesh, evaluate(in, *in.mesh));
  EXPECT_LT(svg.size(), 16000u);
  const PlanInput small = load_config(ex("nvl72_1m.json"));
  EXPECT_LT(svg.size(), render_svg(small, *small.mesh, evaluate(small, *small.mesh)).size() + 2000);
}
