// The layout generator of `trident fuzz` (fuzz/layout.h) on its own, without running a step: every drawn layout is
// valid for its model (the mesh rules of parallel/layout.h, the run config's rules) within --max-world, a seed
// replays the same layouts, and over many draws every dimension and feature is drawn (docs/fuzz.md section 1).
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "emulator/trace_hash.h"
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
      if (model::Config::preset(preset).param_count() > (int64_t{1} << 30)) break;  // plan-sized: never run
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

// Under mpirun (GenOptions::processes): every world a multiple of the processes within --max-world, ranks per
// process = world / processes (every value up to max_world / processes drawn), what the MPI backend runs (the eager
// device without checks, its own communicator, the CPU kernels, no checkpoint), and the repro line the `mpirun -np P
// trident emulate ... --backend mpi --ranks-per-process k` form.
TEST(FuzzLayouts, MpiDrawsRanksPerProcess) {
  for (int64_t np : {1, 2, 3, 4})
    for (int64_t max_world : {4, 8, 12}) {
      fuzz::GenOptions o = options("tiny", max_world);
      o.processes = np;
      std::set<int64_t> rpps;
      for (uint64_t seed = 0; seed < 300; ++seed) {
        fuzz::SeededChoices c(seed);
        const fuzz::Layout l = fuzz::draw(c, o);
        const emu::EmulateSpec& s = l.spec;
        SCOPED_TRACE(l.repro());
        ASSERT_EQ(l.processes, np);
        ASSERT_LE(s.mesh.world(), max_world);
        ASSERT_EQ(s.mesh.world() % np, 0);
        ASSERT_EQ(l.ranks_per_process * np, s.mesh.world());
        ASSERT_NO_THROW(validate(s.mesh, {.experts = s.cfg.experts,
                                          .sequences = s.run.sequences,
                                          .seq_len = s.run.seq_len,
                                          .tile = s.cfg.tile,
                                          .ep_chunks = s.ep_chunks,
                                          .nvl = s.nvl}));
        ASSERT_EQ(s.device.mode, emu::DeviceMode::eager);
        ASSERT_FALSE(s.device.check_hazards);
        ASSERT_EQ(s.comm, emu::CommBackend::emu);
        ASSERT_FALSE(s.lower_exact_sum);
        ASSERT_EQ(l.kernels, "cpu");
        ASSERT_FALSE(l.resume);
        const std::string want = fmt::format("mpirun -np {} trident emulate ", np);
        ASSERT_EQ(l.repro().rfind(want, 0), 0u);
        ASSERT_NE(l.repro().find(" --check-reference --backend mpi"), std::string::npos);
        ASSERT_EQ(l.repro().find("--ranks-per-process") != std::string::npos, l.ranks_per_process > 1);
        fuzz::Layout again = l;
        ASSERT_TRUE(fuzz::normalize(again));
        ASSERT_EQ(again.key(), l.key());
        fuzz::Layout odd = l;  // a world that is not a multiple of the processes is refused (the shrinker skips it)
        odd.spec.mesh.cp = 1, odd.spec.mesh.fsdp = 1, odd.spec.mesh.d_rep = 1, odd.spec.mesh.ep = 1;
        odd.spec.mesh.cp_inner = 1;
        ASSERT_EQ(fuzz::normalize(odd), np == 1);
        rpps.insert(l.ranks_per_process);
      }
      // every ranks-per-process value whose world factors (cp <= 8 a power of two, fsdp <= 4, d_rep <= 3)
      for (int64_t k = 1; k * np <= max_world; ++k) {
        const int64_t W = k * np;
        bool factors = false;
        for (int64_t cp = 1; cp <= 8; cp *= 2)
          for (int64_t f = 1; f <= 4; ++f)
            factors |= W % (cp * f) == 0 && W / (cp * f) <= 3;
        EXPECT_EQ(rpps.count(k), factors ? 1u : 0u) << "np " << np << " max_world " << max_world << " k " << k;
      }
    }
}

// The traces' received-bytes hashes (emulator/trace_hash.h): FNV-1a 64, the goldens' value, and XXH64, the fuzzer's
// (the specification's test values).
TEST(FuzzLayouts, TraceHashes) {
  EXPECT_EQ(emu::fnv1a64("", 0), 0xcbf29ce484222325ull);
  EXPECT_EQ(emu::fnv1a64("a", 1), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(emu::xxh64("", 0), 0xef46db3751d8e999ull);
  EXPECT_EQ(emu::xxh64("abc", 3), 0x44bc2cf5ad770999ull);
  std::vector<unsigned char> b(1000);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<unsigned char>(i * 7);
  const uint64_t h = emu::xxh64(b.data(), b.size());
  for (size_t n : {size_t{31}, size_t{32}, size_t{33}, size_t{999}}) EXPECT_NE(emu::xxh64(b.data(), n), h);
  b[517] ^= 1;  // one bit anywhere changes it
  EXPECT_NE(emu::xxh64(b.data(), b.size()), h);
  EXPECT_EQ(emu::recv_hash(emu::RecvHash::fnv1a64, "a", 1), emu::fnv1a64("a", 1));
  EXPECT_EQ(emu::recv_hash(emu::RecvHash::xxh64, "abc", 3), emu::xxh64("abc", 3));
}

}  // namespace
}  // namespace trident
