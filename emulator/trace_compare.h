// Comparing two runs' traces (parallel/trace.h) entry by entry: a backend or device mode must not change them
// (`trident fuzz`), and a shapes-only run must issue its data run's schedule (docs/emulator.md "Shapes-only runs").
#pragma once
#include <string>
#include <vector>

#include "parallel/trace.h"

namespace trident::emu {

// The first difference between two runs' traces, or "". Every field but the call site is compared: kind, name,
// communicator, sequence, op, dtype, reduce op, count, peer, bytes, FLOPs, event links and issue order, and the
// received-data hash when `hashes` (a shapes-only run receives no data).
std::string trace_difference(const std::vector<RankTrace>& a, const std::vector<RankTrace>& b, bool hashes = true);

}  // namespace trident::emu
