// The one repro builder (reference/repro.h) and the command lines built with it: EmulateSpec::repro() and the
// model/run flags train shares (reference/model/repro.h). The round trip through the binary is
// tests/docs/repro_roundtrip.py; this pins the lines themselves.
#include <gtest/gtest.h>

#include <string>

#include "emulator/run_step.h"
#include "reference/model/repro.h"
#include "reference/repro.h"

namespace {

using trident::ReproLine;

TEST(ReproLine, QuotesOnlyWhatAShellWouldSplit) {
  EXPECT_EQ(ReproLine::quote("planner/examples/nvl72_1m.json"), "planner/examples/nvl72_1m.json");
  EXPECT_EQ(ReproLine::quote("d_rep=1,fsdp=2,cp=2"), "d_rep=1,fsdp=2,cp=2");
  EXPECT_EQ(ReproLine::quote("my config.json"), "'my config.json'");
  EXPECT_EQ(ReproLine::quote("it's"), "'it'\\''s'");
  EXPECT_EQ(ReproLine::quote("$HOME"), "'$HOME'");
  EXPECT_EQ(ReproLine::quote(""), "''");
}

TEST(ReproLine, NonDefaultFlagsOnlyAndDoublesRoundTrip) {
  ReproLine r("trident x");
  r.arg("a b").opt("--n", 3).opt_if("--lr", 3e-3, 3e-3).opt_if("--lr2", 0.1 + 0.2, 3e-3).flag("--on", true)
      .flag("--off", false).opt_nonempty("--dump", "").opt_nonempty("--svg", "o.svg");
  EXPECT_EQ(r.str(), "trident x 'a b' --n 3 --lr2 0.30000000000000004 --on --svg o.svg");
  EXPECT_EQ(std::stod("0.30000000000000004"), 0.1 + 0.2);  // the printed double is the same double
}

trident::emu::EmulateSpec spec_2ranks() {
  trident::emu::EmulateSpec s;
  s.cfg = trident::model::Config::preset("tiny");
  s.mesh = trident::parse_mesh("cp=2,ep=2");
  s.run.steps = 2;
  return s;
}

TEST(EmulateRepro, DefaultsGiveTheShortestLine) {
  const auto s = spec_2ranks();
  EXPECT_EQ(s.repro(), "trident emulate --preset tiny --mesh d_rep=1,fsdp=1,cp=2,e_fsdp=1,ep=2 --steps 2 --check-reference");
  EXPECT_EQ(s.repro(false), "trident emulate --preset tiny --mesh d_rep=1,fsdp=1,cp=2,e_fsdp=1,ep=2 --steps 2");
}

// The flags EmulateSpec::repro() used to drop: --config, --lr, --data-seed, --token-chunk (and the model seed).
TEST(EmulateRepro, ConfigFileAndEveryRunFlag) {
  auto s = spec_2ranks();
  s.config_path = TRIDENT_MICRO_CONFIG;
  s.preset = "";
  s.cfg = trident::model::Config::load(s.config_path);
  s.cfg.seed = 9;
  s.cfg.tile = 4;
  s.run.lr = 1e-3;
  s.run.data_seed = 5;
  s.run.token_chunk = 8;
  s.run.sequences = 2;
  s.run.seq_len = 16;
  s.run.recompute = true;
  s.ep_chunks = 2;
  s.device.mode = trident::emu::DeviceMode::deferred;
  s.device.seed = 3;
  EXPECT_EQ(s.repro(), std::string("trident emulate --config ") + TRIDENT_MICRO_CONFIG +
                           " --seed 9 --tile 4 --mesh d_rep=1,fsdp=1,cp=2,e_fsdp=1,ep=2 --steps 2 --seqs 2 "
                           "--seq-len 16 --lr 0.001 --data-seed 5 --token-chunk 8 --recompute --chunks 2 "
                           "--device deferred --device-seed 3 --check-reference");
}

// train and emulate share the model and run flags: the same values give the same words.
TEST(ModelRunFlags, SharedByTrainAndEmulate) {
  auto cfg = trident::model::Config::preset("tiny-gqa");
  cfg.policy = trident::Policy::bf16;
  trident::model::RunConfig run;
  run.steps = 4;
  run.lr = 2e-3;
  ReproLine r("trident train");
  trident::model::add_model_flags(r, "tiny-gqa", "", cfg);
  trident::model::add_run_flags(r, run);
  EXPECT_EQ(r.str(), "trident train --preset tiny-gqa --policy bf16 --steps 4 --lr 0.002");
}

}  // namespace
