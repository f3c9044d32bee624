// Search and recipe: enumeration counted independently, ranking order, seed meshes recovered.
#include <gtest/gtest.h>

#include <numeric>

#include "planner/config.h"
#include "planner/plan.h"
#include "planner/run.h"
#include "reference/check.h"

using namespace trident::planner;
using trident::MeshShape;

namespace {
std::string ex(const std::string& name) { return std::string(TRIDENT_PLANNER_EXAMPLES) + "/" + name; }
PlanInput without_mesh(const std::string& name) {
  PlanInput in = load_config(ex(name));
  in.mesh.reset();
  return in;
}

// The strict rules written out here, independently of check_mesh: products, experts % ep, ep <= NVL,
// context % (2 cp), fsdp*cp <= NVL, and one NVLink domain holds whole EP and dense groups (lcm <= NVL).
bool strict_valid(const PlanInput& in, int64_t d_rep, int64_t fsdp, int64_t cp, int64_t e_fsdp, int64_t ep) {
  const int64_t nvl = in.cluster.nvl;
  return d_rep * fsdp * cp == e_fsdp * ep && in.model.experts % ep == 0 && ep <= nvl &&
         in.workload.context % (2 * cp) == 0 && fsdp * cp <= nvl && std::lcm(ep, fsdp * cp) <= nvl;
}
}  // namespace

TEST(PlannerSearch, CountsMatchBruteForce) {
  for (const char* name : {"nvl72_1m.json", "nvl8_256k_b.json"}) {
    const PlanInput in = without_mesh(name);
    for (int64_t world : {1, 8, 12, 64, 96, 256, 288}) {
      int64_t expect = 0;
      for (int64_t d = 1; d <= world; ++d)
        for (int64_t f = 1; f <= world; ++f)
          for (int64_t c = 1; c <= world; ++c) {
            if (d * f * c != world) continue;
            for (int64_t ep = 1; ep <= world; ++ep)
              if (world % ep == 0 && strict_valid(in, d, f, c, world / ep, ep)) ++expect;
          }
      Candidate best;
      EXPECT_EQ(search_count(in, world, &best), expect) << name << " world " << world;
      const SearchResult s = search(in, world, world);
      int64_t strict_in_result = 0, rejected = 0;
      for (int64_t r : s.rejected) rejected += r;
      for (const auto& c : s.ranked) strict_in_result += c.check.nvlink_ok();
      if (!s.relaxed) {
        EXPECT_EQ(s.considered - rejected, expect) << name << " world " << world;
      }
      if (expect > 0 && expect <= 64 && !s.relaxed) {
        EXPECT_EQ(strict_in_result, expect) << name << " world " << world;
      }
    }
  }
}

TEST(PlannerSearch, RankedInObjectiveOrder) {
  const PlanInput in = without_mesh("nvl72_1m.json");
  const SearchResult s = search(in, 256, 256);
  ASSERT_GT(s.ranked.size(), 5u);
  for (size_t i = 0; i + 1 < s.ranked.size(); ++i) {
    EXPECT_FALSE(better(in, s.ranked[i + 1], s.ranked[i])) << "rank " << i + 2 << " beats rank " << i + 1;
    EXPECT_FALSE(s.ranked[i].check.hard());
    EXPECT_EQ(s.ranked[i].mesh.world(), s.ranked[i].mesh.e_fsdp * s.ranked[i].mesh.ep);
  }
  // fits before not-fits, then hidden before not hidden
  bool seen_unfit = false;
  for (const auto& c : s.ranked) {
    if (!c.plan.fits) seen_unfit = true;
    else EXPECT_FALSE(seen_unfit) << "a fitting mesh ranked after one that does not fit";
  }
  // Seed 000's choice for 256 GB200 at 1M context is the winner.
  EXPECT_EQ(s.ranked[0].mesh, (MeshShape{4, 1, 64, 4, 64}));
  EXPECT_NE(wins_on(in, s.ranked[0], s.ranked[1]), "");
  // search_count agrees on the best
  Candidate best;
  search_count(in, 256, &best);
  EXPECT_EQ(best.mesh, s.ranked[0].mesh);
}

TEST(PlannerSearch, MemoryForcesTwoDimensionalCpOnNvl8AtOneMillion) {
  const PlanInput in = without_mesh("nvl8_2dcp_1m.json");
  const SearchResult s = search(in, 256, 256);
  // Seed 000: "考虑一百万上下文长度的话，这个方案就不行了，光是动态显存就不够" -- no mesh keeping cp inside
  // an 8-GPU node fits. Check that independently: every strict mesh's total exceeds 309 GB.
  for (int64_t cp = 1; cp <= 8; cp *= 2)
    for (int64_t fsdp = 1; fsdp * cp <= 8; fsdp *= 2)
      for (int64_t ep = 1; ep <= 8; ep *= 2) {
        const MeshShape m{256 / (fsdp * cp), fsdp, cp, 256 / ep, ep};
        if (!check_mesh(in, m).nvlink_ok()) continue;
        EXPECT_FALSE(evaluate(in, m).fits) << "strict mesh fits: cp " << cp << " fsdp " << fsdp << " ep " << ep;
      }
  EXPECT_TRUE(s.relaxed);
  ASSERT_FALSE(s.ranked.empty());
  EXPECT_TRUE(s.ranked[0].plan.fits);
  EXPECT_GT(s.ranked[0].check.cp_outer, 1);  // the winner is a 2D CP mesh
  const Recommendation r = recommend(in, 256);
  EXPECT_TRUE(r.found);
  EXPECT_TRUE(r.memory_forced);
  EXPECT_EQ(r.ep, 8);
  EXPECT_GT(r.mesh.cp, 8);
}

TEST(PlannerSearch, WorldRange) {
  const PlanInput in = without_mesh("nvl72_1m.json");
  const SearchResult s = search(in, 250, 260);
  EXPECT_EQ(s.worlds.size(), 11u);
  ASSERT_FALSE(s.ranked.empty());
  for (const auto& c : s.ranked) {
    EXPECT_GE(c.mesh.world(), 250);
    EXPECT_LE(c.mesh.world(), 260);
  }
  int64_t lo = 0, hi = 0;
  parse_world_range("250:260", lo, hi);
  EXPECT_EQ(lo, 250);
  EXPECT_EQ(hi, 260);
  for (const char* bad : {"250", "a:b", "260:250", "0:5", "1:2:3", "-1:4", ""})
    EXPECT_THROW(parse_world_range(bad, lo, hi), trident::Error) << bad;
}

TEST(PlannerRecipe, SeedMeshes) {
  // NVL8, 256k: EP fixed at 8; CP = 8 gives a 32K local sequence; nothing else: (32,1,8) x (32,8).
  const Recommendation a = recommend(without_mesh("nvl8_256k_a.json"), 256);
  ASSERT_TRUE(a.found);
  EXPECT_EQ(a.ep, 8);
  EXPECT_EQ(a.mesh, (MeshShape{32, 1, 8, 32, 8}));
  EXPECT_FALSE(a.memory_forced);
  // NVL72, 1M: EP 64 (largest divisor of 256 experts inside 72); CP 32 does not fit 200 GB, CP 64 does.
  const Recommendation b = recommend(without_mesh("nvl72_1m.json"), 256);
  ASSERT_TRUE(b.found);
  EXPECT_EQ(b.mesh, (MeshShape{4, 1, 64, 4, 64}));
  bool says_tp = false, says_pp = false, says_cp32 = false;
  for (const auto& l : b.lines) {
    says_tp |= l.rfind("TP: not used", 0) == 0;
    says_pp |= l.rfind("PP: not used", 0) == 0;
    says_cp32 |= l.find("CP = 32") != std::string::npos && l.find("does not fit") != std::string::npos;
  }
  EXPECT_TRUE(says_tp);
  EXPECT_TRUE(says_pp);
  EXPECT_TRUE(says_cp32);
  // recipe.ep overrides the default
  PlanInput told = without_mesh("nvl72_1m.json");
  told.recipe.ep = 32;
  EXPECT_EQ(recommend(told, 256).ep, 32);
}

TEST(PlannerRecipe, SaysWhenNothingFits) {
  PlanInput in = without_mesh("nvl8_256k_b.json");
  in.cluster.gpu_memory_gb = 10;
  const Recommendation r = recommend(in, 256);
  EXPECT_FALSE(r.found);
  EXPECT_TRUE(r.memory_forced);
  bool pp = false;
  for (const auto& l : r.lines) pp |= l.find("PP=2") != std::string::npos;
  EXPECT_TRUE(pp);
}
