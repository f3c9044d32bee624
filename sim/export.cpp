#include "sim/export.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "reference/atomic_write.h"
#include "reference/check.h"
#include "reference/xml_escape.h"

namespace trident::sim {
namespace {

using Kind = TraceEntry::Kind;

bool is_comm(Kind k) { return k == Kind::collective || k == Kind::send || k == Kind::recv; }

// The category of a kernel (its colour in the SVG): the attention cores by the timeline's throughput class, then the
// other attention kernels (projections, KV reorders) by name.
const char* kernel_kind(std::string_view n) {
  if (is_attention_core(n) || n.find("attn") != std::string_view::npos || n.find("kv_") != std::string_view::npos)
    return "attention";
  if (n.find("expert") != std::string_view::npos || n.find("swiglu") != std::string_view::npos) return "experts";
  if (n == "mm" || n.find("wgrad") != std::string_view::npos || n.find("linear_ce") != std::string_view::npos) return "gemm";
  return "other";
}

}  // namespace

nlohmann::json trace_events(const std::vector<RankTrace>& traces, const Timeline& tl, const std::string& title) {
  nlohmann::json ev = nlohmann::json::array();
  int64_t next_flow = 1;
  for (size_t r = 0; r < traces.size(); ++r) {
    const int pid = static_cast<int>(r);
    ev.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 0},
                  {"args", {{"name", fmt::format("rank {}", r)}}}});
    ev.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"tid", 0},
                  {"args", {{"sort_index", pid}}}});
    // flow ids: one per record entry that some wait refers to
    std::map<std::pair<int, int64_t>, int64_t> flow;
    for (const StreamTrace& st : traces[r])
      for (const TraceEntry& e : st.entries)
        if (e.kind == Kind::wait && e.event_index >= 0 && !flow.count({e.event_stream, e.event_index}))
          flow[{e.event_stream, e.event_index}] = next_flow++;
    for (size_t s = 0; s < traces[r].size(); ++s) {
      const StreamTrace& st = traces[r][s];
      const int tid = static_cast<int>(s);
      ev.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", st.name}}}});
      for (size_t i = 0; i < st.entries.size(); ++i) {
        const TraceEntry& e = st.entries[i];
        const Span& sp = tl.spans[r][s][i];
        const double ts = sp.start * 1e6, dur = (sp.end - sp.start) * 1e6;
        nlohmann::json x = {{"ph", "X"}, {"pid", pid}, {"tid", tid}, {"ts", ts}, {"dur", dur}};
        if (e.kind == Kind::compute) {
          x["name"] = e.name;
          x["cat"] = kernel_kind(e.name);
          x["args"] = {{"flops", e.flops}, {"bytes", e.bytes}, {"site", fmt::format("{}:{}", e.file, e.line)}};
        } else if (is_comm(e.kind)) {
          x["name"] = fmt::format("{} {}", e.name, e.comm);
          x["cat"] = "comm," + std::string(e.comm);
          x["args"] = {{"comm", e.comm}, {"op", e.name}, {"bytes", e.bytes}, {"seq", e.seq},
                       {"dtype", std::string(to_string(e.dtype))}, {"site", fmt::format("{}:{}", e.file, e.line)}};
        } else {
          x["name"] = fmt::format("{} e{}", e.name, e.event);
          x["cat"] = "event";
          x["ts"] = sp.end * 1e6;
          x["dur"] = 0;
        }
        ev.push_back(std::move(x));
        if (e.kind == Kind::record) {
          const auto it = flow.find({tid, static_cast<int64_t>(i)});
          if (it != flow.end())
            ev.push_back({{"name", "event"}, {"cat", "event"}, {"ph", "s"}, {"id", it->second}, {"pid", pid},
                          {"tid", tid}, {"ts", sp.end * 1e6}});
        } else if (e.kind == Kind::wait && e.event_index >= 0) {
          ev.push_back({{"name", "event"}, {"cat", "event"}, {"ph", "f"}, {"bp", "e"},
                        {"id", flow.at({e.event_stream, e.event_index})}, {"pid", pid}, {"tid", tid},
                        {"ts", sp.end * 1e6}});
        }
      }
    }
  }
  return {{"traceEvents", std::move(ev)},
          {"displayTimeUnit", "ns"},
          {"otherData", {{"title", title}, {"makespan_us", tl.makespan * 1e6}, {"critical_rank", tl.critical_rank}}}};
}

std::string timeline_svg(const std::vector<RankTrace>& traces, const Timeline& tl, const std::vector<int>& ranks,
                         const std::string& title) {
  const double left = 270, right = 20, top = 50, row_h = 22, gap = 10, width = 1480;
  const double plot_w = width - left - right, span = std::max(tl.makespan, 1e-12);
  auto x_of = [&](double t) { return left + plot_w * t / span; };
  static const std::map<std::string, std::string> kernel_colour = {
      {"attention", "#4c78a8"}, {"experts", "#54a24b"}, {"gemm", "#72b7b2"}, {"other", "#bab0ac"}};
  static const char* comm_palette[] = {"#e45756", "#f58518", "#b279a2", "#eeca3b", "#9d755d", "#ff9da6", "#d67195"};
  std::map<std::string, std::string> comm_colour;
  for (const auto& [key, ct] : tl.coll)
    if (!comm_colour.count(key.first))
      comm_colour[key.first] = comm_palette[comm_colour.size() % (sizeof comm_palette / sizeof *comm_palette)];
  int rows = 0;
  for (int r : ranks) rows += static_cast<int>(traces[static_cast<size_t>(r)].size());
  const double height = top + rows * row_h + static_cast<double>(ranks.size()) * gap + 90;
  std::string o = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" font-family=\"sans-serif\" "
      "font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{:.0f}\" y=\"20\" font-size=\"14\">{}</text>\n"
      "<text x=\"{:.0f}\" y=\"36\">simulated time 0 .. {:.3f} ms; critical rank {}</text>\n",
      width, height, left, xml_escape(title), left, tl.makespan * 1e3, tl.critical_rank);
  double y = top;
  for (int r : ranks) {
    const RankTrace& rt = traces[static_cast<size_t>(r)];
    double exposed = 0;
    for (const auto& [n, v] : tl.exposed_s[static_cast<size_t>(r)]) exposed += v;
    for (size_t s = 0; s < rt.size(); ++s) {
      o += fmt::format("<text x=\"4\" y=\"{:.1f}\">rank {} {}{}</text>\n", y + row_h * 0.7, r,
                       xml_escape(rt[s].name),
                       s == 0 ? fmt::format(" (exposed comm {:.3f} ms)", exposed * 1e3) : "");
      o += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"#f4f4f4\"/>\n", left,
                       y + 1, plot_w, row_h - 2);
      for (size_t i = 0; i < rt[s].entries.size(); ++i) {
        const TraceEntry& e = rt[s].entries[i];
        const Span& sp = tl.spans[static_cast<size_t>(r)][s][i];
        if (sp.end <= sp.start || !(e.kind == Kind::compute || is_comm(e.kind))) continue;
        const std::string& fill =
            e.kind == Kind::compute ? kernel_colour.at(kernel_kind(e.name)) : comm_colour[std::string(e.comm)];
        o += fmt::format(
            "<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"{}\"><title>{}{}{} "
            "{:.2f}-{:.2f} us</title></rect>\n",
            x_of(sp.start), y + 2, std::max(0.3, x_of(sp.end) - x_of(sp.start)), row_h - 4, fill, xml_escape(e.name),
            e.comm.empty() ? "" : " ", xml_escape(e.comm), sp.start * 1e6, sp.end * 1e6);
      }
      y += row_h;
    }
    y += gap;
  }
  // axis and legend
  for (int k = 0; k <= 10; ++k) {
    const double t = span * k / 10, x = x_of(t);
    o += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#999\"/>"
                     "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{:.3f} ms</text>\n",
                     x, y, x, y + 5, x, y + 18, t * 1e3);
  }
  double lx = left;
  const double ly = y + 40;
  auto legend = [&](const std::string& label, const std::string& colour) {
    o += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{:.1f}\" "
                     "y=\"{:.1f}\">{}</text>\n",
                     lx, ly, colour, lx + 16, ly + 10, xml_escape(label));
    lx += 30 + 7.0 * static_cast<double>(label.size());
  };
  for (const auto& [k, c] : kernel_colour) legend("kernel: " + k, c);
  for (const auto& [k, c] : comm_colour) legend("comm: " + k, c);
  o += "</svg>\n";
  return o;
}

void check_writable_file(const std::string& path, const std::string& flag) { io::check_writable(path, flag); }

void write_text_file(const std::string& path, const std::string& text, const std::string& flag) {
  io::write_file(path, text, flag);
}

}  // namespace trident::sim
