// The collectives table in nccl-tests style (docs/timeline.md section 5): per communicator (mesh dimension) and
// op, the calls and bytes of every rank, the exact-accumulator bytes apart from the real-dtype bytes, the group
// size (a group of one rank moves nothing: a no-op), and with a simulated timeline the time, algbw and busbw.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "parallel/comm.h"
#include "parallel/layout.h"
#include "sim/timeline.h"

namespace trident::sim {

struct CollRow {
  std::string comm;          // "fsdp*cp", "ep", ...
  CollOp op = CollOp::all_gather;
  int64_t group_ranks = 0;   // ranks per communicator of this name
  int64_t calls = 0;         // all ranks
  int64_t bytes = 0;         // all ranks, real dtype (bf16 / f32 / f64 / integer elements)
  int64_t exact_bytes = 0;   // all ranks, exact-accumulator elements (exact_f32/f64 or their i64 lowering)
  bool noop = false;         // group of one rank: nothing crosses a link
  bool timed = false;        // the fields below come from a simulated timeline
  double seconds = 0;        // simulated time of all ranks' calls, summed
  double algbw_GBps = 0;     // (bytes + exact_bytes) / seconds, 1e9 bytes/s
  double busbw_GBps = 0;     // algbw x busbw_factor(op, group_ranks)
};

// One row per (communicator name, op) with calls, in name then op order; `tl` (may be null) adds the times.
std::vector<CollRow> collective_rows(const CommStats& total, const MeshShape& mesh, const Timeline* tl);
// The text table (a header line and one line per row).
std::string format_collectives(const std::vector<CollRow>& rows, int64_t steps);
nlohmann::json collectives_json(const std::vector<CollRow>& rows);

}  // namespace trident::sim
