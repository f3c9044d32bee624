// The source document's 256-rank mesh (d_rep,fsdp,cp)x(e_fsdp,ep) = (4,1,64)x(4,64) with a 64-expert model
// (preset tiny-e64), bit-identical to the single-rank reference over 3 AdamW steps. Tile T = 2 keeps the
// sequence short: seq_len = 2*cp*T = 256, one zig-zag chunk = one tile per cp rank.
#include <gtest/gtest.h>

#include "tests/step/step_cases.h"

namespace trident {
namespace {

using namespace steptest;

// The 256-rank case: `steps` AdamW steps on the given communicator.
Case mesh256(int64_t steps, emu::CommBackend comm) {
  return {.preset = "tiny-e64", .mesh = M(4, 1, 64, 4, 64), .chunks = 2, .recompute = true, .seqs = 4,
          .seq_len = 256, .steps = steps, .tile = 2, .comm = comm};
}

TEST(StepLong, Mesh256_E64) {
  const emu::EmulateSpec s = make_spec(mesh256(3, emu::CommBackend::emu));
  const auto r = expect_equal<float>(s);
  // every rank ran the documented schedule
  const Counts want = expected_schedule(s);
  for (size_t rank = 0; rank < r.phases.size(); ++rank) ASSERT_EQ(r.phases[rank], want) << "rank " << rank;
  std::printf("256 ranks, 3 steps: %.2f s emulated\n", r.seconds);
}

// The same mesh with the CUDA path's NcclCommunicator over the fake NCCL.
TEST(StepLong, Mesh256_E64_FakeNccl) {
  const auto r = expect_equal<float>(make_spec(mesh256(2, emu::CommBackend::nccl_fake)));
  std::printf("256 ranks over NcclCommunicator + fake NCCL, 2 steps: %.2f s emulated\n", r.seconds);
}

}  // namespace
}  // namespace trident
