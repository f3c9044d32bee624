// Shapes-only runs (docs/emulator.md "Shapes-only runs"): a data run records its routing counts; the shapes-only
// run of the same spec replays them and must issue the same schedule: traces equal entry for entry on every field
// but the received-data hash and the call site, the same device peaks, the same simulated timeline.
#include <gtest/gtest.h>

#include <cmath>

#include "emulator/trace_compare.h"
#include "sim/hardware.h"
#include "sim/timeline.h"
#include "step_cases.h"

namespace trident::steptest {
namespace {

std::string trace_diff(const std::vector<RankTrace>& a, const std::vector<RankTrace>& b) {
  return emu::trace_difference(a, b, /*hashes=*/false);
}

size_t entries(const std::vector<RankTrace>& t) {
  size_t n = 0;
  for (const RankTrace& r : t)
    for (const StreamTrace& s : r) n += s.entries.size();
  return n;
}

template <class T>
void expect_replay_equal(emu::EmulateSpec s) {
  s.record_trace = true;
  s.keep_tensors = false;
  s.record_routing = true;
  const emu::EmulateResult<T> data = emu::emulate<T>(s);
  emu::EmulateSpec z = s;
  z.record_routing = false;
  z.shapes_only = true;
  z.replay = data.routing.n.empty() ? nullptr : &data.routing;
  const emu::EmulateResult<T> shp = emu::emulate<T>(z);
  const std::string repro = z.repro(false);
  ASSERT_GT(entries(data.traces), size_t{100}) << repro;
  EXPECT_EQ(trace_diff(data.traces, shp.traces), "") << repro;
  EXPECT_EQ(data.device_peak_bytes, shp.device_peak_bytes) << repro;
  EXPECT_EQ(data.peak_bytes, shp.peak_bytes) << repro;
  // the counters per communicator: calls and bytes
  const CommStats a = data.total(), b = shp.total();
  ASSERT_EQ(a.size(), b.size()) << repro;
  for (const auto& [name, tab] : a)
    for (size_t op = 0; op < tab.size(); ++op) {
      EXPECT_EQ(tab[op].calls, b.at(name)[op].calls) << name << " op " << op << "\n" << repro;
      EXPECT_EQ(tab[op].bytes, b.at(name)[op].bytes) << name << " op " << op << "\n" << repro;
    }
  // every shapes-only step has no values; the data run had real ones
  for (const RankStepStats& st : shp.steps) EXPECT_TRUE(std::isnan(st.loss)) << repro;
  for (const RankStepStats& st : data.steps) EXPECT_GT(st.loss, 0.0) << repro;
  // the simulated timelines are the same, span for span
  const sim::Timeline ta = sim::simulate(data.traces, sim::hardware_model("h100"), {.mesh = &s.mesh});
  const sim::Timeline tb = sim::simulate(shp.traces, sim::hardware_model("h100"), {.mesh = &s.mesh});
  EXPECT_GT(ta.makespan, 0.0) << repro;
  EXPECT_EQ(ta.makespan, tb.makespan) << repro;
  EXPECT_EQ(ta.critical_rank, tb.critical_rank) << repro;
  ASSERT_EQ(ta.spans.size(), tb.spans.size());
  for (size_t r = 0; r < ta.spans.size(); ++r)
    for (size_t st = 0; st < ta.spans[r].size(); ++st)
      for (size_t i = 0; i < ta.spans[r][st].size(); ++i)
        ASSERT_TRUE(ta.spans[r][st][i].start == tb.spans[r][st][i].start &&
                    ta.spans[r][st][i].end == tb.spans[r][st][i].end)
            << "rank " << r << " stream " << st << " entry " << i << "\n"
            << repro;
}

void replay_case(const Case& c) {
  const emu::EmulateSpec s = make_spec(c);
  if (s.cfg.policy == Policy::fp64) expect_replay_equal<double>(s);
  else expect_replay_equal<float>(s);
}

TEST(ShapesOnly, ReplayEqualsDataRun1dCp) { replay_case({.mesh = M(1, 1, 2, 1, 2), .steps = 2}); }
TEST(ShapesOnly, ReplayEqualsDataRunChunksRecompute) {
  replay_case({.mesh = M(2, 1, 2, 2, 2), .chunks = 2, .recompute = true, .steps = 2});
}
TEST(ShapesOnly, ReplayEqualsDataRunThreeChunksSlices) {
  replay_case({.mesh = M(1, 2, 2, 1, 4), .chunks = 3, .vocab_slices = 3, .seqs = 2, .seq_len = 96, .steps = 1});
}
TEST(ShapesOnly, ReplayEqualsDataRun2dCp) {
  replay_case({.mesh = M2(1, 1, 4, 1, 4, 2), .chunks = 2, .seqs = 2, .seq_len = 64, .steps = 1});
}
TEST(ShapesOnly, ReplayEqualsDataRunDsa) {
  replay_case({.preset = "tiny-dsa", .mesh = M(1, 1, 2, 1, 2), .chunks = 2, .recompute = true, .steps = 1});
}
TEST(ShapesOnly, ReplayEqualsDataRunPacked) {
  replay_case({.mesh = M(1, 2, 2, 2, 2), .chunks = 2, .steps = 1, .docs_per_seq = 3});
}
TEST(ShapesOnly, ReplayEqualsDataRunGqaFp64) {
  replay_case({.preset = "tiny-gqa", .mesh = M(1, 2, 1, 1, 2), .policy = "fp64", .steps = 1});
}
TEST(ShapesOnly, ReplayEqualsDataRunManyExperts) {
  replay_case({.preset = "tiny-e64", .mesh = M(1, 1, 4, 1, 4), .chunks = 2, .seqs = 2, .seq_len = 64, .steps = 1});
}

// A drawn routing: the same seed gives the same trace; the routing shapes the EP bytes.
TEST(ShapesOnly, DrawnRoutingIsSeeded) {
  emu::EmulateSpec s = make_spec({.preset = "tiny-e64", .mesh = M(1, 1, 4, 1, 4), .chunks = 2, .seqs = 2,
                                  .seq_len = 64, .steps = 1});
  s.shapes_only = true;
  s.keep_tensors = false;
  s.record_trace = true;
  s.routing = "zipf:1.5";
  const auto a = emu::emulate<float>(s), b = emu::emulate<float>(s);
  EXPECT_EQ(trace_diff(a.traces, b.traces), "");
  EXPECT_EQ(a.routing.n, b.routing.n);
  s.routing = "uniform";
  const auto u = emu::emulate<float>(s);
  EXPECT_NE(trace_diff(a.traces, u.traces), "");
  // zipf makes the hottest rank receive more than uniform does: the peaks differ, the dense part does not
  EXPECT_GT(*std::max_element(a.device_peak_bytes.begin(), a.device_peak_bytes.end()),
            *std::max_element(u.device_peak_bytes.begin(), u.device_peak_bytes.end()));
  // every chunk's counts: rows * top_k in all, at most the chunk's rows per expert
  for (const auto& r : {a.routing, u.routing}) {
    int64_t total = 0;
    for (int32_t n : r.n) total += n;
    EXPECT_EQ(total, 128 * 4 * 2);  // tokens x top_k x MoE layers (tiny-e64: 3 layers, the first dense)
  }
}

// A shapes-only device refuses host reads that would need data, naming the call site.
TEST(ShapesOnly, DownloadIsAnError) {
  try {
    emu::spawn(1, [&](emu::RankContext& ctx) {
      Device& dev = ctx.device();
      DeviceBuffer<float> b(dev, 4, dev.compute_stream());
      EXPECT_FALSE(dev.has_data());
      (void)dev.fetch(b.data(), 4, dev.compute_stream());
    }, {.device = {.shapes_only = true}});
    FAIL() << "download on a shapes-only device did not fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shapes-only run: the host reads 16 bytes"), std::string::npos) << e.what();
  }
}

TEST(ShapesOnly, RoutingSpecs) {
  EXPECT_EQ(parse_routing("uniform").kind, RoutingSpec::Kind::uniform);
  EXPECT_EQ(parse_routing("zipf:1.2").param, 1.2);
  EXPECT_EQ(parse_routing("dirichlet:0.3").kind, RoutingSpec::Kind::dirichlet);
  EXPECT_EQ(parse_routing("file:/x.json").path, "/x.json");
  for (const char* bad : {"", "zipf", "zipf:", "zipf:-1", "zipf:abc", "dirichlet:0", "file:", "normal:1", "uniform:2"})
    EXPECT_THROW(parse_routing(bad), Error) << bad;
}

}  // namespace
}  // namespace trident::steptest
