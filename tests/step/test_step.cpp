// The FSDP x CP x EP step on emulated meshes is bit-identical to the single-rank reference (docs/parallel.md).
#include <gtest/gtest.h>

#include "emulator/run_step.h"
#include "reference/check.h"

namespace trident {
namespace {

using parallel::MeshShape;

struct Case {
  std::string preset = "tiny";
  MeshShape mesh;
  int64_t chunks = 1;
  bool recompute = false;
  std::string policy = "fp32";
  int64_t seqs = 4, seq_len = 32, steps = 3;
};

emu::EmulateSpec make_spec(const Case& c) {
  emu::EmulateSpec s;
  s.preset = c.preset;
  s.cfg = model::Config::preset(c.preset);
  s.cfg.policy = parse_policy(c.policy);
  s.run.sequences = c.seqs;
  s.run.seq_len = c.seq_len;
  s.run.steps = c.steps;
  s.run.recompute = c.recompute;
  s.mesh = c.mesh;
  s.ep_chunks = c.chunks;
  return s;
}

template <class T>
void expect_equal(const emu::EmulateSpec& s) {
  const emu::EmulateResult<T> r = emu::emulate<T>(s);
  const emu::CheckReport rep = emu::check_reference<T>(s, r);
  EXPECT_TRUE(rep.ok()) << rep.summary() << "\nrepro: " << s.repro();
  // vacuous-pass guards: a real loss and nonzero gradients
  EXPECT_GT(r.steps[0].loss, 0.0);
  EXPECT_GT(r.steps[0].grad_norm, 0.0);
}

void run_case(const Case& c) {
  const emu::EmulateSpec s = make_spec(c);
  if (s.cfg.policy == Policy::fp64) expect_equal<double>(s);
  else expect_equal<float>(s);
}

MeshShape M(int64_t dr, int64_t f, int64_t cp, int64_t ef, int64_t ep) { return MeshShape{dr, f, cp, ef, ep}; }

TEST(StepEquality, OneRank) { run_case({.mesh = M(1, 1, 1, 1, 1)}); }
TEST(StepEquality, Cp2Ep2) { run_case({.mesh = M(1, 1, 2, 1, 2)}); }

}  // namespace
}  // namespace trident
