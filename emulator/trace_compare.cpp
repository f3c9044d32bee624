// emulator/trace_compare.h
#include "emulator/trace_compare.h"

#include <fmt/format.h>

namespace trident::emu {

std::string trace_difference(const std::vector<RankTrace>& a, const std::vector<RankTrace>& b, bool hashes) {
  if (a.size() != b.size()) return fmt::format("{} vs {} ranks traced", a.size(), b.size());
  for (size_t r = 0; r < a.size(); ++r) {
    if (a[r].size() != b[r].size()) return fmt::format("rank {}: {} vs {} streams", r, a[r].size(), b[r].size());
    for (size_t s = 0; s < a[r].size(); ++s) {
      const auto& x = a[r][s].entries;
      const auto& y = b[r][s].entries;
      if (a[r][s].name != b[r][s].name)
        return fmt::format("rank {} stream {}: '{}' vs '{}'", r, s, a[r][s].name, b[r][s].name);
      for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
        const TraceEntry& p = x[i];
        const TraceEntry& q = y[i];
        const bool same = p.kind == q.kind && p.name == q.name && p.comm == q.comm && p.seq == q.seq &&
                          p.op == q.op && p.dtype == q.dtype && p.redop == q.redop && p.count == q.count &&
                          p.peer == q.peer && (!hashes || p.recv_hash == q.recv_hash) && p.bytes == q.bytes &&
                          p.flops == q.flops && p.event == q.event && p.event_stream == q.event_stream &&
                          p.event_index == q.event_index && p.issue == q.issue;
        if (!same)
          return fmt::format("rank {} stream '{}' entry {}: '{}' ({} {} bytes, {} flops, received hash {:x}, {}:{}) "
                             "vs '{}' ({} {} bytes, {} flops, received hash {:x}, {}:{})",
                             r, a[r][s].name, i, p.name, p.comm, p.bytes, p.flops, p.recv_hash, p.file, p.line,
                             q.name, q.comm, q.bytes, q.flops, q.recv_hash, q.file, q.line);
      }
      if (x.size() != y.size())
        return fmt::format("rank {} stream '{}': {} vs {} entries", r, a[r][s].name, x.size(), y.size());
    }
  }
  return "";
}

}  // namespace trident::emu
