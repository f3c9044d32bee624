#include "sim/collectives.h"

#include <fmt/format.h>

#include "reference/counted.h"
#include "reference/check.h"

namespace trident::sim {

std::vector<CollRow> collective_rows(const CommStats& total, const MeshShape& mesh, const Timeline* tl) {
  std::vector<CollRow> rows;
  for (const auto& [name, tab] : total)
    for (int o = 0; o < kNumCollOps; ++o) {
      const OpStats& s = tab[static_cast<size_t>(o)];
      if (s.calls == 0) continue;
      CollRow r;
      r.comm = name;
      r.op = static_cast<CollOp>(o);
      r.group_ranks = comm_group_size(mesh, name);
      r.calls = s.calls;
      r.bytes = s.bytes - s.exact_bytes;
      r.exact_bytes = s.exact_bytes;
      r.noop = r.group_ranks == 1;
      if (tl) {
        const auto it = tl->coll.find({name, r.op});
        r.timed = true;
        if (it != tl->coll.end()) r.seconds = it->second.seconds;
        if (r.seconds > 0) {
          r.algbw_GBps = static_cast<double>(s.bytes) / r.seconds / 1e9;
          r.busbw_GBps = r.algbw_GBps * busbw_factor(r.op, static_cast<int>(r.group_ranks));
        }
      }
      rows.push_back(std::move(r));
    }
  return rows;
}

namespace {
std::string mib(int64_t b) { return fmt::format("{:.2f} MiB", static_cast<double>(b) / (1024.0 * 1024.0)); }
}  // namespace

std::string format_collectives(const std::vector<CollRow>& rows, int64_t steps) {
  bool timed = false;
  for (const CollRow& r : rows) timed = timed || r.timed;
  std::string out = fmt::format(
      "collectives (all ranks, {}; bytes: the nccl-tests size per call, exact: exact-accumulator elements)\n",
      counted(steps, "step"));
  out += fmt::format("  {:<10} {:<16} {:>5} {:>10} {:>14} {:>14}", "comm", "op", "ranks", "calls", "bytes",
                     "exact bytes");
  if (timed) out += fmt::format(" {:>12} {:>11} {:>11}", "sim time", "algbw GB/s", "busbw GB/s");
  out += "\n";
  for (const CollRow& r : rows) {
    out += fmt::format("  {:<10} {:<16} {:>5} {:>10} {:>14} {:>14}", r.comm, to_string(r.op), r.group_ranks, r.calls,
                       mib(r.bytes), mib(r.exact_bytes));
    if (r.noop && r.op != CollOp::split) out += "  no-op (groups of one rank)";
    else if (r.timed && r.seconds > 0)
      out += fmt::format(" {:>9.3f} ms {:>11.2f} {:>11.2f}", r.seconds * 1e3, r.algbw_GBps, r.busbw_GBps);
    out += "\n";
  }
  return out;
}

nlohmann::json collectives_json(const std::vector<CollRow>& rows) {
  nlohmann::json a = nlohmann::json::array();
  for (const CollRow& r : rows) {
    nlohmann::json j = {{"comm", r.comm},   {"op", std::string(to_string(r.op))},
                        {"ranks", r.group_ranks}, {"calls", r.calls},
                        {"bytes", r.bytes}, {"exact_bytes", r.exact_bytes},
                        {"noop", r.noop}};
    if (r.timed) {
      j["sim_seconds"] = r.seconds;
      j["algbw_GBps"] = r.algbw_GBps;
      j["busbw_GBps"] = r.busbw_GBps;
    }
    a.push_back(std::move(j));
  }
  return a;
}

}  // namespace trident::sim
