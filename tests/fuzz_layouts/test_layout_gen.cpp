// The layout generator of `trident fuzz` (fuzz/layout.h) on its own, without running a step: every drawn layout is
// valid for its model (the mesh rules of parallel/layout.h, the run config's rules) within --max-world, a seed
// replays the same layouts, and over many draws every dimension and feature is drawn (docs/fuzz.md section 1).
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "fuzz/layout.h"

namespace trident {
namespace {

fuzz::GenOptions options(const std::string& preset, int64_t max_world) {
  fuzz::GenOptions o;
  o.models = {{model::Config::preset(preset), preset, ""}};
  o.max_world = max_world;
  return o;
}

TEST(FuzzLayouts, EveryDrawIsValidWithinMaxWorld) {
  for (const std::string& preset : model::Config::preset_names())
    for (int64_t max_world : {1, 2, 3, 4, 8, 64, 256}) {
      const fuzz::GenOptions o = options(preset, max_world);
      for (uint64_t seed = 0; seed < 300; ++seed) {
        fuzz::SeededChoices c(seed);
        const fuzz::Layout l = fuzz::draw(c, o);
        const emu::EmulateSpec& s = l.spec;
        SCOPED_TRACE(l.repro());
        ASSERT_LE(s.mesh.world(), max_world);
        ASSERT_EQ(s.mesh.e_fsdp * s.mesh.ep, s.mesh.world());
        ASSERT_NO_THROW(validate(s.mesh, {.experts = s.cfg.experts,
                                          .sequences = s.run.sequences,
                                          .seq_len = s.run.seq_len,
                                          .tile = s.cfg.tile,
                                          .ep_chunks = s.ep_chunks,
                                          .nvl = s.nvl}));
        ASSERT_NO_THROW(s.run.validate());
        ASSERT_NO_THROW(s.run.validate_for(s.cfg));
        ASSERT_NO_THROW(s.cfg.validate());
        if (l.resume) {
          const MeshShape& r = l.resume_mesh;
          ASSERT_LE(r.world(), max_world);
          ASSERT_NO_THROW(validate(r, {.experts = s.cfg.experts,
                                       .sequences = s.run.sequences,
                                       .seq_len = s.run.seq_len,
                                       .tile = s.cfg.tile,
                                       .ep_chunks = l.resume_chunks,
                                       .nvl = 8}));
        }
        fuzz::Layout again = l;  // normalize() keeps a valid layout as it is
        ASSERT_TRUE(fuzz::normalize(again));
        ASSERT_EQ(again.key(), l.key());
      }
    }
}

TEST(FuzzLayouts, SeedsReplayAndDiffer) {
  const fuzz::GenOptions o = options("tiny", 8);
  std::set<std::string> keys;
  for (uint64_t seed = 0; seed < 100; ++seed) {
    fuzz::SeededChoices a(seed), b(seed);
    const fuzz::Layout x = fuzz::draw(a, o), y = fuzz::draw(b, o);
    EXPECT_EQ(x.repro(), y.repro());
    EXPECT_EQ(x.seed2, y.seed2);
    keys.insert(x.key());
  }
  EXPECT_GE(keys.size(), 90u);  // not a handful of layouts drawn again and again
}

TEST(FuzzLayouts, EveryFeatureAndDimensionIsDrawn) {
  const fuzz::GenOptions o = options("tiny-dsa", 8);
  std::map<std::string, int64_t> seen;
  std::set<int64_t> worlds;
  for (uint64_t seed = 0; seed < 2000; ++seed) {
    fuzz::SeededChoices c(seed);
    const fuzz::Layout l = fuzz::draw(c, o);
    for (const std::string& f : l.features()) seen[f]++;
    worlds.insert(l.spec.mesh.world());
  }
  for (const char* f : {"d_rep > 1", "fsdp > 1", "cp > 1", "e_fsdp > 1", "ep > 1", "2D CP", "EP chunks > 1",
                        "vocab slices", "recompute", "packed documents", "DSA", "steps > 1", "sequences per group > 1",
                        "tiles per chunk > 1", "policy fp32", "policy bf16", "policy fp64", "deferred device",
                        "eager device, hazards checked", "fake NCCL", "lowered exact sums", "cuda-ref-host kernels",
                        "checkpoint resumed on another mesh"})
    EXPECT_GT(seen[f], 0) << f << " never drawn in 2000 layouts";
  for (int64_t w = 1; w <= 8; ++w) {
    if (w != 5 && w != 7) {
      EXPECT_TRUE(worlds.count(w)) << "world " << w << " never drawn";
    }
  }
}

TEST(FuzzLayouts, FixedChoicesAreKept) {
  fuzz::GenOptions o = options("tiny", 4);
  o.kernels = "cpu-ulp:attn_core_forward";
  o.comm = "emu-drop:all_reduce:1";
  o.plant = StepPlant::chunk_drops_token;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    fuzz::SeededChoices c(seed);
    const fuzz::Layout l = fuzz::draw(c, o);
    EXPECT_EQ(l.kernels, o.kernels);
    EXPECT_EQ(l.spec.comm, emu::CommBackend::emu);
    EXPECT_EQ(l.spec.drop_count, 1u);
    EXPECT_EQ(l.spec.plant, StepPlant::chunk_drops_token);
    EXPECT_NE(l.repro().find("--comm emu-drop:all_reduce:1"), std::string::npos);
    EXPECT_NE(l.repro().find("--plant chunk-drops-token"), std::string::npos);
    EXPECT_NE(l.repro().find("--kernels cpu-ulp:attn_core_forward"), std::string::npos);
  }
  EXPECT_THROW(fuzz::parse_kernels("cpu-ulp:no_such_op"), Error);
  EXPECT_THROW(fuzz::parse_kernels("cuda-fast-host"), Error);
  EXPECT_THROW(emu::parse_comm_drop("emu-drop:all_reduce:0"), Error);
  EXPECT_THROW(emu::parse_plant("off-by-two"), Error);
}

}  // namespace
}  // namespace trident
