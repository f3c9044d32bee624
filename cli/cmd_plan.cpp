// trident plan CONFIG: memory / communication / overlap arithmetic of the design documents (docs/planner.md).
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include "cli/command.h"
#include "planner/run.h"
#include "reference/repro.h"

namespace {
struct Opts {
  trident::planner::RunOptions run;
  std::string world_range;
};
}  // namespace

TRIDENT_COMMAND({"plan", "size a cluster: per-GPU memory, eFSDP/CP traffic and overlap; recommend and search meshes",
                 [](CLI::App& sub) -> trident::cli::Action {
                   auto o = std::make_shared<Opts>();
                   sub.add_option("config", o->run.config_path,
                                  "config file (.json or .toml): model, cluster, workload, optional recipe and mesh")
                       ->required();
                   sub.add_flag("--json", o->run.json, "print one JSON object (numbers and bools) instead of text");
                   sub.add_flag("--search", o->run.search,
                                "enumerate every valid (d_rep,fsdp,cp) x (e_fsdp,ep) and rank them (implied when the "
                                "config has no mesh)");
                   sub.add_option("--world", o->run.world, "world size (GPUs) to search when the config has no mesh")
                       ->check(trident::cli::positive_int());
                   CLI::Option* range =
                       sub.add_option("--world-range", o->world_range, "search every world size A..B (inclusive), as A:B");
                   sub.add_option("--svg", o->run.svg_path, "write a stacked-bar SVG of the per-GPU memory here");
                   sub.add_option("--top", o->run.top, "how many ranked meshes to print")
                       ->check(trident::cli::positive_int())
                       ->capture_default_str();
                   return [o, range]() -> int {
                     if (range->count() > 0)  // given, even empty: '' is an error, not "no range"
                       trident::planner::parse_world_range(o->world_range, o->run.world_lo, o->run.world_hi);
                     std::ostringstream warn;  // NVLink placement warnings: after the report, on stderr
                     const int rc = trident::planner::run_plan(o->run, std::cout, warn);
                     // The exact command (the one repro builder, reference/repro.h); not in --json output, which
                     // holds numbers and bools only.
                     if (!o->run.json) {
                       trident::ReproLine r("trident plan");
                       r.arg(o->run.config_path)
                           .opt_if("--world", o->run.world, 0)
                           .opt_nonempty("--world-range", o->world_range)
                           .flag("--search", o->run.search)
                           .opt_nonempty("--svg", o->run.svg_path)
                           .opt_if("--top", o->run.top, trident::planner::RunOptions{}.top);
                       std::cout << "repro: " << r.str() << "\n";
                     }
                     std::cout.flush();
                     std::istringstream lines(warn.str());
                     for (std::string l; std::getline(lines, l);) std::cerr << "trident: " << l << "\n";
                     return rc;
                   };
                 }});
