// `trident plan`: the entry function (the CLI in cli/cmd_plan.cpp only parses flags and calls this).
#pragma once
#include <cstdint>
#include <ostream>
#include <string>

#include "planner/config.h"

namespace trident::planner {

struct RunOptions {
  std::string config_path;  // .json or .toml
  bool json = false;        // one JSON object instead of the readable breakdown
  bool search = false;      // enumerate and rank every valid mesh (also implied when the config has no mesh)
  int64_t world = 0;        // world size for the search/recipe (0: the mesh's, or cluster.world)
  int64_t world_lo = 0;     // --world-range A:B (both 0: not given)
  int64_t world_hi = 0;
  std::string svg_path;     // write the memory chart here ("" : none)
  int top = 5;              // ranked meshes to print
};

// Parses "A:B" into lo/hi; throws trident::Error naming --world-range.
void parse_world_range(const std::string& s, int64_t& lo, int64_t& hi);

// Runs the planner on a loaded config and writes the report to `out` and one "warning: ..." line per broken NVLink
// placement rule of the shown mesh to `warn` (the CLI passes stderr; they are also in the JSON's "warnings").
// Returns the exit code (0). Throws trident::Error on bad input (the CLI prints it and exits 1).
int run_plan(const PlanInput& in, const RunOptions& opt, std::ostream& out, std::ostream& warn);
// Without a warning stream: the warnings go to `out` before the text report, or only into the JSON.
int run_plan(const PlanInput& in, const RunOptions& opt, std::ostream& out);
// Loads opt.config_path, then as above.
int run_plan(const RunOptions& opt, std::ostream& out, std::ostream& warn);
int run_plan(const RunOptions& opt, std::ostream& out);

}  // namespace trident::planner
