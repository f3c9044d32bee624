// A simulated timeline as files: Chrome/Perfetto trace-event JSON (one process per rank, one thread per stream,
// flow arrows from each event record to its waits) and an SVG picture of a few ranks' streams.
// docs/timeline.md section 4.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "parallel/trace.h"
#include "sim/timeline.h"

namespace trident::sim {

// The trace-event JSON object ({"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}); timestamps in
// microseconds of simulated time. Kernels and collectives are complete events ("X"), records and waits zero-length
// "X" events bound to flow events ("s" at the record, "f" at each wait, one id per record).
nlohmann::json trace_events(const std::vector<RankTrace>& traces, const Timeline& tl, const std::string& title);

// An SVG of the streams of `ranks` (world ranks) on one time axis: kernels by kind, collectives coloured by
// communicator, the makespan and the exposed communication of each rank in the row label.
std::string timeline_svg(const std::vector<RankTrace>& traces, const Timeline& tl, const std::vector<int>& ranks,
                         const std::string& title);

// Fails now (trident::Error naming `flag`) when `path` cannot be written, so a long run does not end in an error.
void check_writable_file(const std::string& path, const std::string& flag);
// Writes text to a file through a private staging folder and a rename (reference/atomic_write.h: a link
// planted at any name is never followed); throws trident::Error naming `flag` when it cannot.
void write_text_file(const std::string& path, const std::string& text, const std::string& flag);

}  // namespace trident::sim
