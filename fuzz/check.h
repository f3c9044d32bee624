// The properties `trident fuzz` checks on every layout (docs/fuzz.md section 2), and the shrinker that reduces a
// failing layout to a minimal one (fewest ranks, steps, tokens and features) failing the same way.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fuzz/layout.h"
#include "planner/plan.h"

namespace trident::fuzz {

// The planner's input for an emulated 2D-CP run (values of value_bytes each): the model's layers, width, experts and
// latent KV, the run's context and sequences per CP group, an NVLink domain of cp_inner ranks. The planner's CP
// traffic for it equals what the run records (the planner property; tests/step Step2dCp).
planner::PlanInput plan_input(const emu::EmulateSpec& s, size_t value_bytes);

enum class Property : uint8_t {
  runs,       // the run completes (no error, no watchdog, no non-finite loss)
  bits,       // loss, every gradient and every parameter equal the single-rank reference's bits
  scheduler,  // a second deferred run with another scheduler seed gives the same bits and the same trace
  hazards,    // no stream hazard (deferred device, or the eager device's checker)
  memory,     // the memory estimate (emulator/memory.h) is at or above every rank's measured device peak
  planner,    // the planner's 2D-CP traffic (planner/plan.h cp_traffic) equals the recorded bytes
  timeline,   // the traces replay into a complete simulated timeline (sim/timeline.h)
  resume,     // a checkpoint saved after the run, resumed on another mesh, continues with the reference's bits
};
inline constexpr int kNumProperties = 8;
const char* to_string(Property p);

struct CaseResult {
  bool ok = true;
  Property failed = Property::runs;  // when !ok: the first property that failed
  std::string detail;                // when !ok: what differs
  std::string repro;                 // when !ok: the command line(s) that show the failure alone
  bool second_seed = false;          // when !ok: the failure came from the second scheduler seed's run
  bool backend_lost = false;         // when !ok: an MPI run failed; MPI is unusable for more runs (no shrinking)
  std::vector<Property> checked;     // the properties this case checked (planner: only where it applies)
  double seconds = 0;
  double property_seconds[kNumProperties] = {};  // the wall time of each property's runs and checks
};

// The MPI backend as the fuzzer sees it: `trident fuzz` under mpirun provides it (cli/cmd_fuzz.cpp, over mpi/run.h;
// this library does not link MPI). Every process calls every function in the same order with the same layout.
struct MpiBackend {
  // Runs the spec on every process, ranks_per_process ranks each. Process 0 gets the gathered result (returns
  // true), the others false. Throws on failure, on every surviving process; MPI is unusable afterwards.
  std::function<bool(const emu::EmulateSpec&, int64_t ranks_per_process, emu::EmulateResult<float>&)> run_f32;
  std::function<bool(const emu::EmulateSpec&, int64_t ranks_per_process, emu::EmulateResult<double>&)> run_f64;
  // Process 0's string on every process (its verdict: every process goes on the same way).
  std::function<std::string(const std::string&)> share;
};

// Runs the layout and checks every property (only >= 0: that one alone, and what it needs; the shrinker's mode).
// Never throws for a failing run: an error inside the run is the `runs` (or `hazards`) property failing.
// A layout for the MPI backend (Layout::processes > 0) needs `mpi` and checks what that backend gives: runs, bits
// and memory (process 0 checks; its verdict is every process's).
CaseResult check_layout(const Layout& l, int only = -1, const MpiBackend* mpi = nullptr);

struct ShrinkResult {
  Layout layout;      // the smallest layout found that fails the same property
  CaseResult result;  // its failure
  int64_t tries = 0, accepted = 0;
  bool backend_lost = false;  // an MPI run failed while shrinking: no more MPI runs in this process
};
// For a process that checks many layouts one after another (`trident fuzz`, bench_fuzz): freed memory stays in the
// process (glibc: no mmap for blocks below 256 MiB, no trimming below 2 GiB) instead of going back to the kernel and
// coming back as fresh pages, which every run would fault in and zero again (a fifth of a tiny layout's time).
// Changes how memory is reused, never a value.
void keep_freed_memory();

// Greedy shrinking: tries simplifications of the layout (fewer steps, no resume, smaller mesh dimensions, fewer
// sequences and tokens, features off: EP chunks, vocabulary slices, recompute, packed documents, 2D CP, the
// device, the communicator, lowered sums, drawn kernels, the policy, fewer layers), keeps each one that still fails
// the same property, until none does or max_tries runs were spent. `fixed` holds what the user fixed (kernels,
// comm): never simplified away. on_try is called after every try (progress).
ShrinkResult shrink(const Layout& failing, const CaseResult& failure, const GenOptions& fixed, int64_t max_tries = 300,
                    const std::function<void(const ShrinkResult&)>& on_try = nullptr,
                    const MpiBackend* mpi = nullptr);

}  // namespace trident::fuzz
