// Property: for random valid meshes of up to 64 ranks (TRIDENT_PROP_MAX_WORLD=n: up to n, with wider ranges of
// d_rep, fsdp and cp when n > 64; the `long` configuration prop_step_long uses 256), random EP chunk counts,
// vocabulary slices, recompute flags and devices (eager, or deferred with a random scheduler seed), the emulated
// step is bit-identical to the single-rank reference (docs/parallel.md). The layouts come from `trident fuzz`'s
// generator (fuzz/layout.h, docs/fuzz.md) with its classic draws; RapidCheck supplies the raw choices, so shrinking
// moves toward small meshes; a failure logs the repro command.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "emulator/trace_compare.h"
#include "fuzz/layout.h"

namespace trident {
namespace {

int64_t max_world() {
  const char* e = std::getenv("TRIDENT_PROP_MAX_WORLD");
  return e ? std::clamp<int64_t>(std::atoll(e), 1, 1024) : 64;
}

// The generator's choices from RapidCheck (which shrinks each toward its lower bound).
class RcChoices final : public fuzz::Choices {
 public:
  int64_t in_range(int64_t lo, int64_t hi) override { return *rc::gen::inRange<int64_t>(lo, hi); }
};

RC_GTEST_PROP(StepProps, MeshInvariantBits, ()) {
  fuzz::GenOptions o;
  for (const char* p : {"tiny", "tiny-gqa"}) o.models.push_back({model::Config::preset(p), p, ""});
  o.max_world = max_world();
  o.all_features = false;
  RcChoices c;
  const emu::EmulateSpec s = fuzz::draw(c, o).spec;
  RC_LOG() << "repro: " << s.repro() << "\n";
  const emu::EmulateResult<float> r = emu::emulate<float>(s);
  const emu::CheckReport rep = emu::check_reference<float>(s, r);
  RC_LOG() << rep.summary() << "\n";
  RC_ASSERT(rep.ok());
  RC_ASSERT(r.steps[0].grad_norm > 0.0);  // not vacuous
}

// Property: on every drawn layout (DSA, packed sequences, 2D CP, chunks, recompute, vocabulary slices: all the
// generator's features), a shapes-only run replaying the data run's routing counts issues the same schedule: the
// traces are equal entry for entry but the received-data hashes and call sites, and so are the device peaks
// (docs/emulator.md "Shapes-only runs").
RC_GTEST_PROP(StepProps, ShapesOnlyReplaysTheSchedule, ()) {
  fuzz::GenOptions o;
  for (const char* p : {"tiny", "tiny-gqa", "tiny-dsa", "tiny-e64"}) o.models.push_back({model::Config::preset(p), p, ""});
  o.max_world = std::min<int64_t>(max_world(), 32);
  o.all_features = true;
  RcChoices c;
  emu::EmulateSpec s = fuzz::draw(c, o).spec;
  s.device = {};  // a shapes-only device is eager
  s.keep_tensors = false;
  s.record_trace = true;
  s.record_routing = true;
  s.comm = emu::CommBackend::emu;
  s.drop_count = 0;
  s.plant = StepPlant::none;
  s.lower_exact_sum = false;
  RC_LOG() << "repro: " << s.repro(false) << "\n";
  if (s.cfg.policy == Policy::fp64) RC_DISCARD("fp64 layouts run as double: covered by the fixed cases");
  const emu::EmulateResult<float> data = emu::emulate<float>(s);
  emu::EmulateSpec z = s;
  z.record_routing = false;
  z.shapes_only = true;
  z.replay = data.routing.n.empty() ? nullptr : &data.routing;
  const emu::EmulateResult<float> shp = emu::emulate<float>(z);
  const std::string d = emu::trace_difference(data.traces, shp.traces, /*hashes=*/false);
  RC_LOG() << d << "\n";
  RC_ASSERT(d.empty());
  RC_ASSERT(data.device_peak_bytes == shp.device_peak_bytes);
  RC_ASSERT(data.steps[0].grad_norm > 0.0);  // not vacuous
}

}  // namespace
}  // namespace trident
