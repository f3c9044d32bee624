// One rank of the step with its own reference check (emulator/rank_run.h), the driver of a process per GPU
// (`trident emulate --backend nccl`): run here on emulated ranks, over the emulator's communicator and over
// NcclCommunicator on the fake NCCL (the per-process code path without CudaDevice and the real library). Every rank
// reaches the same verdict; the ranks' parts cover every element exactly once; a wrong kernel is found by the ranks
// that own the element and reported on all of them.
#include <gtest/gtest.h>

#include <mutex>
#include <optional>

#include "emulator/fake_nccl.h"
#include "emulator/rank_run.h"
#include "emulator/world.h"
#include "golden/primitives/primitives.h"
#include "tests/step/step_cases.h"

namespace trident {
namespace {

using namespace steptest;

struct Verdicts {
  std::mutex mu;
  std::vector<emu::RankRunResult> by_rank;
};

// Runs run_rank on every rank of s; `perturb`: every rank's kernels flip one ulp of op's first output element.
template <class T>
std::vector<emu::RankRunResult> run_ranks(const emu::EmulateSpec& s, bool fake_nccl, const std::string& perturb = "") {
  const int W = static_cast<int>(s.mesh.world());
  Verdicts v;
  v.by_rank.resize(static_cast<size_t>(W));
  emu::FakeNcclWorld fake;
  emu::SpawnOptions so;
  so.stack_bytes = 1 << 20;
  emu::spawn(
      W,
      [&](emu::RankContext& ctx) {
        std::optional<emu::FakeNcclScope> scope;
        std::unique_ptr<NcclCommunicator> nw;
        if (fake_nccl) {
          scope.emplace(ctx);
          nw = fake.world(ctx);
        }
        Communicator& world = nw ? static_cast<Communicator&>(*nw) : ctx.world();
        std::unique_ptr<Kernels<T>> k = std::make_unique<CpuKernels<T>>(ctx.device());
        if (!perturb.empty()) k = golden::make_perturbed_kernels<T>(std::move(k), ctx.device(), perturb, 0);
        emu::RankRunResult r = emu::run_rank<T>(s, world, ctx.device(), *k, {.check = true, .progress = nullptr});
        std::lock_guard lk(v.mu);
        v.by_rank[static_cast<size_t>(ctx.rank())] = std::move(r);
      },
      so);
  return std::move(v.by_rank);
}

TEST(RankRun, EveryRankChecksItsPartBitwise) {
  for (const bool nccl : {false, true})
    for (const Case& c : {Case{.mesh = M(2, 1, 2, 2, 2), .steps = 2},
                          Case{.mesh = M(1, 2, 2, 2, 2), .chunks = 2, .recompute = true, .steps = 2},
                          Case{.preset = "tiny-dsa", .mesh = M(1, 2, 2, 1, 4), .steps = 2}}) {
      const emu::EmulateSpec s = make_spec(c);
      SCOPED_TRACE(s.repro() + (nccl ? " (NcclCommunicator on the fake NCCL)" : ""));
      const std::vector<emu::RankRunResult> rs = run_ranks<float>(s, nccl);
      int64_t sum = 0;
      for (const emu::RankRunResult& r : rs) {
        EXPECT_TRUE(r.ok()) << r.summary();
        EXPECT_EQ(r.world_elements, r.expected_elements);
        EXPECT_EQ(r.expected_elements, rs[0].expected_elements);
        EXPECT_EQ(r.steps.size(), static_cast<size_t>(c.steps));
        sum += r.rank_elements;
      }
      EXPECT_EQ(sum, rs[0].expected_elements) << "the ranks' parts are not disjoint or do not cover every element";
      EXPECT_GT(rs[0].expected_elements, 0);
    }
}

TEST(RankRun, Fp64) {
  const emu::EmulateSpec s = make_spec({.preset = "tiny-gqa", .mesh = M(1, 2, 2, 2, 2), .policy = "fp64", .steps = 2});
  for (const emu::RankRunResult& r : run_ranks<double>(s, true)) EXPECT_TRUE(r.ok()) << r.summary();
}

// A kernel one ulp off: every rank reports the mismatch (counted over world), the owners name the tensor.
TEST(RankRun, AWrongKernelFailsOnEveryRank) {
  const emu::EmulateSpec s = make_spec({.mesh = M(1, 2, 2, 2, 2), .steps = 1});
  const std::vector<emu::RankRunResult> rs = run_ranks<float>(s, false, "adamw_step");
  int64_t named = 0;
  for (const emu::RankRunResult& r : rs) {
    EXPECT_FALSE(r.ok());
    EXPECT_GT(r.world_mismatches, 0);
    EXPECT_NE(r.summary().find("MISMATCH"), std::string::npos) << r.summary();
    for (const emu::TensorCheck& m : r.mismatches) named += m.what == "param" ? 1 : 0;
  }
  EXPECT_GT(named, 0);
}

}  // namespace
}  // namespace trident
