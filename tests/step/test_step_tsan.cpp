// A small mesh with every mechanism (FSDP, CP, chunked EP, recompute) for the ThreadSanitizer build
// (scripts/test rebuilds tests labelled tsan with -fsanitize=thread).
#include <gtest/gtest.h>

#include "tests/step/step_cases.h"

namespace trident {
namespace {

using namespace steptest;

TEST(StepTsan, Fsdp2Cp2Ep2_Chunks2_Recompute) {
  run_case({.mesh = M(1, 2, 2, 2, 2), .chunks = 2, .recompute = true, .seqs = 2, .steps = 2});
}

TEST(StepTsan, DeferredDevice) {
  emu::EmulateSpec s = make_spec({.mesh = M(1, 2, 2, 2, 2), .chunks = 2, .seqs = 2, .steps = 1});
  s.device.mode = emu::DeviceMode::deferred;
  s.device.seed = 9;
  expect_equal<float>(s);
}

}  // namespace
}  // namespace trident
