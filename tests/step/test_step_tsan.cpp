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

}  // namespace
}  // namespace trident
