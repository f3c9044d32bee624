// The step over NcclCommunicator (the CUDA path's communicator, gpu/nccl/nccl_comm.h) on the emulator's fake NCCL
// (emulator/fake_nccl.h) is bit-identical to the single-rank reference, as on the emulator's own communicator.
#include <gtest/gtest.h>

#include "tests/step/step_cases.h"

namespace trident {
namespace {

using namespace steptest;

// ---- the step over NcclCommunicator + the fake NCCL (gpu/nccl/, emulator/fake_nccl.h): same bits ---------------
TEST(StepFakeNccl, TheStepMeshes) {
  const auto nccl = emu::CommBackend::nccl_fake;
  for (const Case& c : {Case{.mesh = M(1, 1, 1, 1, 1), .steps = 2, .comm = nccl},
                        Case{.mesh = M(1, 1, 2, 1, 2), .steps = 2, .comm = nccl},
                        Case{.mesh = M(2, 1, 2, 2, 2), .steps = 2, .comm = nccl},
                        Case{.mesh = M(1, 2, 2, 2, 2), .chunks = 2, .recompute = true, .steps = 2, .comm = nccl},
                        Case{.mesh = M(3, 1, 1, 1, 3), .seqs = 3, .steps = 2, .experts = 6, .comm = nccl},
                        Case{.mesh = M(1, 1, 4, 2, 2), .chunks = 3, .seq_len = 64, .steps = 2, .comm = nccl},
                        Case{.preset = "tiny-gqa", .mesh = M(1, 2, 2, 2, 2), .chunks = 2, .steps = 2, .comm = nccl},
                        Case{.mesh = M(1, 2, 2, 2, 2), .chunks = 2, .policy = "bf16", .steps = 2, .comm = nccl},
                        Case{.mesh = M(1, 1, 2, 1, 2), .chunks = 2, .policy = "fp64", .steps = 2, .comm = nccl},
                        Case{.mesh = M(1, 8, 1, 1, 8), .seqs = 8, .steps = 2, .comm = nccl}})
    run_case(c);
}
TEST(StepFakeNccl, BlockingCommunicators) {
  emu::EmulateSpec s = make_spec({.mesh = M(1, 2, 2, 2, 2), .chunks = 2, .steps = 2,
                                  .comm = emu::CommBackend::nccl_fake});
  s.nccl_blocking = true;
  expect_equal<float>(s);
}
// The deferred device under the fake NCCL: the i64 lowering of every exact sum packs and unpacks as work on the
// collective's stream (Device::exact_pack / exact_unpack), in order with the queued kernels that wrote the
// accumulators. (Packing on the host at issue read poisoned, not yet computed, accumulators: a NaN gradient norm.)
TEST(StepFakeNccl, DeferredDevice) {
  for (const uint64_t seed : {1u, 5u}) {
    emu::EmulateSpec s = make_spec({.mesh = M(1, 2, 2, 2, 2), .chunks = 2, .recompute = true, .steps = 2,
                                    .comm = emu::CommBackend::nccl_fake});
    s.device.mode = emu::DeviceMode::deferred;
    s.device.seed = seed;
    SCOPED_TRACE(s.repro());
    expect_equal<float>(s);
  }
  emu::EmulateSpec s = make_spec({.preset = "tiny-gqa", .mesh = M(2, 1, 2, 1, 4), .policy = "fp64", .steps = 1,
                                  .comm = emu::CommBackend::nccl_fake});
  s.device.mode = emu::DeviceMode::deferred;
  s.device.seed = 2;
  SCOPED_TRACE(s.repro());
  expect_equal<double>(s);
}
// >= 64 ranks in every CI run: (2,1,32)x(1,64) with 64 experts, tile 2 (seq_len = 2*cp*T = 128).
TEST(StepFakeNccl, Mesh64_E64) {
  run_case({.preset = "tiny-e64", .mesh = M(2, 1, 32, 1, 64), .chunks = 2, .seqs = 2, .seq_len = 128, .steps = 1,
            .tile = 2, .comm = emu::CommBackend::nccl_fake});
}

}  // namespace
}  // namespace trident
