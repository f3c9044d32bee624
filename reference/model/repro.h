// The model and run flags of a repro line, shared by `trident train` and `trident emulate` (and the tests that
// print their command lines), built with the one ReproLine builder (reference/repro.h).
#pragma once
#include <string>

#include "reference/model/config.h"
#include "reference/repro.h"

namespace trident::model {

// "--preset P" or "--config FILE" (exactly one: the flags are exclusive), then every model value that differs from
// that source: --policy, --seed, --experts, --top-k, --tile, --layers, --vocab-chunk. Other fields of `cfg` have
// no flag: a config that changes them is reproduced only through --config.
void add_model_flags(ReproLine& r, const std::string& preset, const std::string& config_path, const Config& cfg);
// "--steps N" (always: each command has its own default), then every run value that differs from RunConfig's
// defaults (the commands' defaults): --seqs, --seq-len, --lr, --data-seed, --token-chunk, --recompute.
void add_run_flags(ReproLine& r, const RunConfig& run);

}  // namespace trident::model
