// Property: for random valid meshes of up to 64 ranks (TRIDENT_PROP_MAX_WORLD=n: up to n, with wider ranges of
// d_rep, fsdp and cp when n > 64; the `long` configuration prop_step_long uses 256), random EP chunk counts, vocabulary slices, recompute flags
// and devices (eager, or deferred with a random scheduler seed), the emulated step is bit-identical to the
// single-rank reference (docs/parallel.md). Generated numbers are raw choices mapped onto a valid layout, so
// shrinking moves toward small meshes; a failure logs the repro command.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>

#include "emulator/run_step.h"
#include "reference/check.h"

namespace trident {
namespace {

int64_t max_world() {
  const char* e = std::getenv("TRIDENT_PROP_MAX_WORLD");
  return e ? std::clamp<int64_t>(std::atoll(e), 1, 1024) : 64;
}

emu::EmulateSpec random_spec() {
  const int64_t max_w = max_world();
  const bool big = max_w > 64;  // wider draws (the default draws are unchanged: same meshes for the fixed seed)
  const bool gqa = *rc::gen::arbitrary<bool>();
  const bool bf16 = *rc::gen::weightedElement<bool>({{4, false}, {1, true}});
  int64_t cp = int64_t{1} << *rc::gen::inRange(0, big ? 5 : 4);  // 1..8 (big: 1..16)
  int64_t fsdp = *rc::gen::inRange(1, big ? 9 : 5);
  int64_t d_rep = *rc::gen::inRange(1, big ? 5 : 4);
  while (cp > max_w) cp /= 2;
  while (d_rep * fsdp * cp > max_w) {
    if (d_rep > 1) --d_rep;
    else --fsdp;
  }
  const int64_t W = d_rep * fsdp * cp;
  emu::EmulateSpec s;
  s.preset = gqa ? "tiny-gqa" : "tiny";
  s.cfg = model::Config::preset(s.preset);
  if (bf16) s.cfg.policy = Policy::bf16;
  std::vector<int64_t> eps;  // ep | gcd(W, E)
  for (int64_t e = 1; e <= W; ++e)
    if (W % e == 0 && s.cfg.experts % e == 0) eps.push_back(e);
  const int64_t ep = eps[static_cast<size_t>(*rc::gen::inRange<int64_t>(0, static_cast<int64_t>(eps.size())))];
  s.mesh = MeshShape{d_rep, fsdp, cp, W / ep, ep};
  const int64_t groups = d_rep * fsdp, per = *rc::gen::inRange(1, 3), m = *rc::gen::inRange(1, 3);
  s.run.sequences = groups * per;
  s.run.seq_len = 2 * cp * s.cfg.tile * m;
  s.run.steps = *rc::gen::inRange(1, 3);
  s.run.recompute = *rc::gen::arbitrary<bool>();
  const int64_t local_tiles = per * 2 * m;
  s.ep_chunks = std::min<int64_t>(*rc::gen::inRange(1, 5), local_tiles);
  // vocabulary slices: 0 (default: one per vocab chunk), or 1..6 (beyond tiny's 4 vocab chunks: clamped)
  s.vocab_slices = *rc::gen::inRange(0, 7);
  // the device: eager, or deferred with a drawn scheduler seed (queued per stream, hazards checked; same bits)
  if (*rc::gen::arbitrary<bool>()) {
    s.device.mode = emu::DeviceMode::deferred;
    s.device.seed = *rc::gen::inRange<uint64_t>(0, 1000);
  }
  return s;
}

RC_GTEST_PROP(StepProps, MeshInvariantBits, ()) {
  const emu::EmulateSpec s = random_spec();
  RC_LOG() << "repro: " << s.repro() << "\n";
  const emu::EmulateResult<float> r = emu::emulate<float>(s);
  const emu::CheckReport rep = emu::check_reference<float>(s, r);
  RC_LOG() << rep.summary() << "\n";
  RC_ASSERT(rep.ok());
  RC_ASSERT(r.steps[0].grad_norm > 0.0);  // not vacuous
}

}  // namespace
}  // namespace trident
