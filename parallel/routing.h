// Routing counts: how many of a rank's token rows each expert receives, per step, MoE layer, source rank and EP
// chunk (docs/emulator.md "Shapes-only runs"). A data run records them from its router (StepShared::routing); a
// shapes-only run, which has no router output, takes them from here: replayed from a recorded run (file:PATH) or
// drawn from a seeded distribution (uniform, zipf:S, dirichlet:A). Every size of the EP exchange follows from
// them, so a shapes-only run of recorded counts issues the data run's exact schedule.
#pragma once
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "parallel/layout.h"
#include "reference/model/config.h"

namespace trident {

struct RoutingSpec {
  enum class Kind : uint8_t { uniform, zipf, dirichlet, file } kind = Kind::uniform;
  double param = 0;  // zipf: the exponent S > 0; dirichlet: the concentration A > 0
  std::string path;  // file
  std::string text;  // as given ("zipf:1.2")
};
// "uniform", "zipf:S", "dirichlet:A" or "file:PATH"; throws trident::Error (one line naming the forms) otherwise.
RoutingSpec parse_routing(const std::string& s);

// counts[step][moe layer][world rank][chunk][expert], int32 (a chunk has at most limits::tokens rows).
struct RoutingCounts {
  int64_t steps = 0, ranks = 0, chunks = 0, experts = 0, top_k = 0;
  std::vector<int64_t> layers;  // model layer index of each MoE layer, ascending
  std::vector<int32_t> n;
  // A drawn spec (uniform, zipf, dirichlet) fills a slot when its rank reaches it (steps == 1: the slots are
  // reused by every step; the draw depends on the step); a recorded or replayed table has one slot per step.
  bool drawn = false;
  RoutingSpec spec;
  uint64_t seed = 0;

  // Empty counts for a run (every slot zero): for recording (steps = the run's steps) or drawing (steps = 1).
  static RoutingCounts empty(const model::Config& cfg, int64_t world, int64_t chunks, int64_t steps);
  // The counts a spec gives a run: drawn (filled lazily by fill()) or read from its file, which must match the run
  // (layers, world, chunks, experts, top_k; steps >= the run's). Throws one line on a mismatch or a bad file.
  static RoutingCounts from_spec(const RoutingSpec& spec, const model::Config& cfg, int64_t world, int64_t chunks,
                                 int64_t steps, uint64_t seed);
  int64_t moe_index(int64_t layer) const;  // position of a model layer in `layers`; throws if not a MoE layer
  // The `experts` counts of one slot.
  int32_t* slot(int64_t step, int64_t layer, int64_t rank, int64_t chunk);
  const int32_t* slot(int64_t step, int64_t layer, int64_t rank, int64_t chunk) const;
  // A drawn spec: writes the slot's counts for a chunk of `rows` token rows (sum rows * top_k, each at most rows:
  // a token picks top_k distinct experts); deterministic in (seed, step, layer, rank, chunk). A replayed table:
  // checks the slot against `rows` (one line naming the slot on a mismatch). Returns the slot.
  const int32_t* fill(int64_t step, int64_t layer, int64_t rank, int64_t chunk, int64_t rows);

  std::string to_json() const;  // the file format of file:PATH (docs/emulator.md)
  void save(const std::string& path) const;
};

// n never-read row indices: a span of n entries over an address range no one maps (a stray read faults). A
// shapes-only step passes it where a data run passes a row list whose length is all a kernel's trace needs.
std::span<const int64_t> unread_rows(int64_t n);

}  // namespace trident
