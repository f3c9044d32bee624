// The timeline simulator (sim/): hardware models and their sources, the replay rules on a hand-built trace
// (a collective starts when its last member arrives, a wait when its event is recorded), determinism and
// consistency on an emulated step, the Perfetto trace-event format, and the collectives table.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <set>
#include <tuple>

#include "emulator/device.h"
#include "emulator/run_step.h"
#include "parallel/step_kernels.h"
#include "reference/exact_acc.h"
#include "reference/check.h"
#include "sim/collectives.h"
#include "sim/export.h"
#include "sim/hardware.h"
#include "sim/timeline.h"

using namespace trident;
using namespace trident::sim;

namespace {

TEST(Hardware, FourModelsWithEverySourced) {
  for (const char* n : {"h100", "h200", "gb200-nvl72", "gb300-nvl72"}) {
    const Hardware& h = hardware_model(n);
    EXPECT_EQ(h.name, n);
    for (const char* k : {"nvl_domain", "gemm_tflops", "attention_tflops", "hbm_GBps", "nvlink_GBps",
                          "nvlink_latency_us", "ib_GBps", "ib_latency_us", "launch_us"})
      EXPECT_FALSE(h.sources.at(k).empty()) << n << " " << k;
    EXPECT_GT(h.gemm_flops("bf16"), h.gemm_flops("f64"));
  }
  EXPECT_EQ(hardware_model("h100").nvl_domain, 8);
  EXPECT_EQ(hardware_model("GB200-NVL72").nvl_domain, 72);
  try {
    (void)hardware_model("a100");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--hardware"), std::string::npos) << e.what();
  }
}

TEST(Hardware, ParseRejectsAModelWithoutSources) {
  const std::string j = R"({"models": [{"name": "x", "nvl_domain": 8, "gemm_tflops": {"bf16": 1, "f32": 1,
    "f64": 1}, "attention_tflops": {"bf16": 1, "f32": 1, "f64": 1}, "hbm_GBps": 1, "nvlink_GBps": 1,
    "nvlink_latency_us": 1, "ib_GBps": 1, "ib_latency_us": 1, "launch_us": 1, "sources": {"gemm_tflops": "a"}}]})";
  EXPECT_THROW((void)parse_hardware(j, "test"), Error);
  EXPECT_THROW((void)parse_hardware("{", "test"), Error);
}

TraceEntry compute(double flops, int64_t bytes) {
  TraceEntry e;
  e.kind = TraceEntry::Kind::compute;
  e.name = "mm";
  e.flops = flops;
  e.bytes = bytes;
  return e;
}
TraceEntry record(int event) {
  TraceEntry e;
  e.kind = TraceEntry::Kind::record;
  e.name = "record";
  e.event = event;
  return e;
}
TraceEntry wait(int event, int stream, int64_t index) {
  TraceEntry e;
  e.kind = TraceEntry::Kind::wait;
  e.name = "wait";
  e.event = event;
  e.event_stream = stream;
  e.event_index = index;
  return e;
}
TraceEntry coll(CollOp op, std::string_view comm, int64_t id, uint64_t seq, int64_t bytes) {
  TraceEntry e;
  e.kind = TraceEntry::Kind::collective;
  e.name = to_string(op);
  e.op = op;
  e.comm = comm;
  e.comm_id = id;
  e.seq = seq;
  e.bytes = bytes;
  return e;
}

// Two ranks: compute (rank 1 twice as long), record, the comm stream waits and all-reduces; rank 0 then computes
// again on its compute stream while the all-reduce runs.
std::vector<RankTrace> two_ranks(double flops, int64_t bytes) {
  std::vector<RankTrace> t(2);
  for (int r = 0; r < 2; ++r) {
    t[r].resize(2);
    t[r][0].name = "compute";
    t[r][1].name = "comm";
    t[r][0].entries = {compute(flops * (r + 1), 0), record(0)};
    if (r == 0) t[r][0].entries.push_back(compute(flops, 0));
    t[r][1].entries = {wait(0, 0, 1), coll(CollOp::all_reduce, "fsdp", 7, 0, bytes)};
  }
  return t;
}

TEST(Timeline, CollectiveStartsWhenItsLastMemberArrives) {
  const Hardware& h = hardware_model("h100");
  const double F = 4e9;
  const int64_t B = 1 << 24;
  const Timeline tl = simulate(two_ranks(F, B), h, {.dtype = "bf16"});
  const double k1 = h.launch_us * 1e-6 + F / h.gemm_flops("bf16");
  const double k2 = h.launch_us * 1e-6 + 2 * F / h.gemm_flops("bf16");
  EXPECT_EQ(tl.spans[0][0][0].end, k1);
  EXPECT_EQ(tl.spans[1][0][0].end, k2);
  EXPECT_EQ(tl.spans[0][1][0].end, k1);  // rank 0's wait: its record
  const double ar = collective_seconds(CollOp::all_reduce, B, 2, h.nvlink_GBps * 1e9, h.nvlink_latency_us * 1e-6);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(tl.spans[r][1][1].start, k2) << r;  // both start when rank 1 arrives
    EXPECT_EQ(tl.spans[r][1][1].end, k2 + ar) << r;
  }
  EXPECT_EQ(tl.makespan, k2 + ar);
  // rank 0's second kernel [k1, 2 k1 - launch...] overlaps the start of nothing: the all-reduce starts at k2 > 2 k1?
  const Span& second = tl.spans[0][0][2];
  EXPECT_EQ(second.start, k1);
  // exposed on rank 0 = the all-reduce minus its overlap with the second kernel
  const double ov = std::max(0.0, std::min(second.end, k2 + ar) - std::max(second.start, k2));
  EXPECT_DOUBLE_EQ(tl.exposed_s[0].at("fsdp"), ar - ov);
  EXPECT_EQ(tl.exposed_s[1].at("fsdp"), ar);  // rank 1 computes nothing meanwhile
  EXPECT_EQ(tl.coll.at({"fsdp", CollOp::all_reduce}).calls, 2);
}

TEST(Timeline, FormulasOfTheCollectives) {
  const double bw = 100e9, lat = 5e-6, S = 1e9;
  EXPECT_EQ(collective_seconds(CollOp::all_gather, S, 1, bw, lat), 0);  // a group of one rank: a no-op
  EXPECT_DOUBLE_EQ(collective_seconds(CollOp::all_gather, S, 4, bw, lat), 3 * lat + S * 0.75 / bw);
  EXPECT_DOUBLE_EQ(collective_seconds(CollOp::all_reduce, S, 4, bw, lat), 6 * lat + 2 * S * 0.75 / bw);
  // a small all-reduce over many ranks: the tree (2 log2 n latencies) beats the ring (2 (n-1) latencies)
  EXPECT_DOUBLE_EQ(collective_seconds(CollOp::all_reduce, 8, 1024, bw, lat), 20 * lat + 2 * 8 / bw);
  EXPECT_DOUBLE_EQ(collective_seconds(CollOp::all_to_allv, S, 4, bw, lat), lat + S * 0.75 / bw);
  EXPECT_DOUBLE_EQ(busbw_factor(CollOp::all_reduce, 8), 2 * 7.0 / 8);
  EXPECT_DOUBLE_EQ(busbw_factor(CollOp::broadcast, 8), 1.0);
}

TEST(Timeline, InconsistentTraceIsAnErrorNotAHang) {
  auto t = two_ranks(1e9, 1024);
  TraceEntry last = t[1][1].entries.back();
  last.seq = 1;
  t[1][1].entries.set(t[1][1].entries.size() - 1, last);  // rank 1 calls the communicator's second all-reduce, rank 0 its first
  EXPECT_THROW((void)simulate(t, hardware_model("h100")), Error);
  auto u = two_ranks(1e9, 1024);
  u[1][1].entries.pop_back();  // rank 1 never calls the all-reduce: with the mesh, its group is known to be 2
  const MeshShape m = parse_mesh("fsdp=2,e_fsdp=2");
  EXPECT_NO_THROW((void)simulate(u, hardware_model("h100")));  // (without: a group of one, a no-op)
  EXPECT_THROW((void)simulate(u, hardware_model("h100"), {.mesh = &m}), Error);
}

emu::EmulateResult<float> traced_run(const std::string& mesh, int64_t chunks, const char* preset = "tiny",
                                     int64_t seqs = 4, int64_t seq_len = 32) {
  emu::EmulateSpec spec;
  spec.cfg = model::Config::preset(preset);
  spec.preset = preset;
  spec.mesh = parse_mesh(mesh);
  spec.ep_chunks = chunks;
  spec.run.sequences = seqs;
  spec.run.seq_len = seq_len;
  spec.run.steps = 1;
  spec.keep_tensors = false;
  spec.record_trace = true;
  return emu::emulate<float>(spec);
}

TEST(Timeline, EmulatedStepIsDeterministicAndConsistent) {
  const auto r = traced_run("d_rep=1,fsdp=2,cp=2,e_fsdp=2,ep=2", 2);
  const Hardware& h = hardware_model("h100");
  const Timeline a = simulate(r.traces, h), b = simulate(r.traces, h);
  ASSERT_EQ(a.spans.size(), 4u);
  // determinism: every time bit for bit
  for (size_t x = 0; x < a.spans.size(); ++x)
    for (size_t s = 0; s < a.spans[x].size(); ++s)
      for (size_t i = 0; i < a.spans[x][s].size(); ++i) {
        ASSERT_EQ(std::memcmp(&a.spans[x][s][i].start, &b.spans[x][s][i].start, sizeof(double)), 0);
        ASSERT_EQ(std::memcmp(&a.spans[x][s][i].end, &b.spans[x][s][i].end, sizeof(double)), 0);
      }
  // per stream: nondecreasing; every collective instance has one interval on all its members
  std::map<std::tuple<int64_t, uint64_t, bool>, std::pair<double, double>> inst;
  int64_t collectives = 0;
  for (size_t x = 0; x < r.traces.size(); ++x)
    for (size_t s = 0; s < r.traces[x].size(); ++s) {
      double t = 0;
      for (size_t i = 0; i < r.traces[x][s].entries.size(); ++i) {
        const TraceEntry& e = r.traces[x][s].entries[i];
        const Span& sp = a.spans[x][s][i];
        EXPECT_GE(sp.start, t);
        EXPECT_GE(sp.end, sp.start);
        t = sp.end;
        if (e.kind != TraceEntry::Kind::collective) continue;
        ++collectives;
        const auto key = std::make_tuple(e.comm_id, e.seq,
                                         e.op == CollOp::all_to_all || e.op == CollOp::all_to_allv);
        const auto [it, fresh] = inst.emplace(key, std::make_pair(sp.start, sp.end));
        if (!fresh) {
          EXPECT_EQ(it->second.first, sp.start) << e.comm << " #" << e.seq;
          EXPECT_EQ(it->second.second, sp.end) << e.comm << " #" << e.seq;
        }
      }
    }
  EXPECT_GT(collectives, 100);
  // the critical path: a chain from time 0 to the makespan, each start the end of its predecessor
  int rk = 0, st = 0;
  int64_t ix = 0;
  double last_end = -1;
  int64_t p = -1;
  for (size_t s = 0; s < a.spans[a.critical_rank].size(); ++s)
    if (!a.spans[a.critical_rank][s].empty() && a.spans[a.critical_rank][s].back().end == a.makespan)
      p = pack_entry(a.critical_rank, static_cast<int>(s), static_cast<int64_t>(a.spans[a.critical_rank][s].size()) - 1);
  ASSERT_GE(p, 0);
  int64_t n = 0;
  while (p >= 0) {
    unpack_entry(p, rk, st, ix);
    const Span& sp = a.spans[rk][st][ix];
    if (last_end >= 0) {
      EXPECT_EQ(sp.end, last_end);
    }
    last_end = sp.start;
    p = sp.pred;
    ++n;
  }
  EXPECT_EQ(n, a.path_entries);
  // exposed <= busy per communicator
  for (size_t x = 0; x < a.exposed_s.size(); ++x)
    for (const auto& [name, v] : a.exposed_s[x]) EXPECT_LE(v, a.comm_busy_s[x].at(name));
}

// The trace-event format (Chrome/Perfetto): required keys per phase, known phases, timestamps nondecreasing on every
// track (pid, tid) in file order, every flow id started once and finished at least once, never before its start.
void validate_trace_events(const nlohmann::json& j, size_t ranks) {
  ASSERT_TRUE(j.contains("traceEvents") && j["traceEvents"].is_array());
  std::map<std::pair<int, int>, double> last;
  std::map<int64_t, double> flow_start;
  std::map<int64_t, int> flow_finish;
  std::set<int> pids;
  std::vector<std::pair<int64_t, double>> finishes;
  for (const auto& e : j["traceEvents"]) {
    for (const char* k : {"ph", "pid", "tid", "name"}) ASSERT_TRUE(e.contains(k)) << e.dump();
    const std::string ph = e["ph"];
    ASSERT_TRUE(ph == "X" || ph == "M" || ph == "s" || ph == "f") << ph;
    if (ph == "M") continue;
    ASSERT_TRUE(e.contains("ts") && e["ts"].is_number()) << e.dump();
    const double ts = e["ts"];
    const auto track = std::make_pair(e["pid"].get<int>(), e["tid"].get<int>());
    if (ph == "X") {
      ASSERT_TRUE(e.contains("dur") && e["dur"].get<double>() >= 0) << e.dump();
      ASSERT_TRUE(e.contains("cat"));
      if (last.count(track)) {
        EXPECT_GE(ts, last[track]) << e.dump();
      }
      last[track] = ts;
      pids.insert(track.first);
    } else {
      ASSERT_TRUE(e.contains("id") && e.contains("cat")) << e.dump();
      const int64_t id = e["id"];
      if (ph == "s") {
        EXPECT_FALSE(flow_start.count(id)) << "flow id started twice: " << id;
        flow_start[id] = ts;
      } else {
        EXPECT_EQ(e.value("bp", ""), "e");
        flow_finish[id]++;
        finishes.emplace_back(id, ts);
      }
    }
  }
  EXPECT_EQ(pids.size(), ranks);
  EXPECT_FALSE(flow_start.empty());
  for (const auto& [id, ts] : flow_start) EXPECT_GE(flow_finish[id], 1) << "flow " << id << " never finished";
  for (const auto& [id, ts] : finishes) {
    ASSERT_TRUE(flow_start.count(id)) << "flow " << id << " finished but never started";
    EXPECT_GE(ts, flow_start[id]);
  }
}

TEST(Timeline, PerfettoTraceOfTheReadmeDemoIsValid) {
  const auto r = traced_run("d_rep=1,fsdp=2,cp=2,e_fsdp=2,ep=2", 2);
  const Timeline tl = simulate(r.traces, hardware_model("h100"));
  const nlohmann::json j = nlohmann::json::parse(trace_events(r.traces, tl, "test").dump());
  validate_trace_events(j, 4);
  const std::string svg = timeline_svg(r.traces, tl, {0, 1}, "test");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

TEST(Collectives, NoOpGroupsExactBytesAndBandwidth) {
  const auto r = traced_run("d_rep=1,fsdp=2,cp=2,e_fsdp=2,ep=2", 1);
  const MeshShape m = parse_mesh("d_rep=1,fsdp=2,cp=2,e_fsdp=2,ep=2");
  EXPECT_EQ(comm_group_size(m, "fsdp*cp"), 4);
  EXPECT_EQ(comm_group_size(m, "d_rep"), 1);
  EXPECT_EQ(comm_group_size(m, "world"), 4);
  const Timeline tl = simulate(r.traces, hardware_model("h100"));
  const auto rows = collective_rows(r.total(), m, &tl);
  bool saw_noop = false, saw_exact = false, saw_real = false;
  for (const CollRow& row : rows) {
    EXPECT_EQ(row.noop, row.group_ranks == 1) << row.comm;
    saw_noop = saw_noop || row.noop;
    if (row.noop) {
      EXPECT_EQ(row.seconds, 0) << row.comm;  // a group of one rank takes no simulated time
    }
    // reduce-scatters of the gradients move exact accumulators; gathers of the weights the real dtype
    if (row.op == CollOp::reduce_scatter && row.comm == "fsdp*cp") saw_exact = row.exact_bytes > 0 && row.bytes == 0;
    if (row.op == CollOp::all_gather && row.comm == "fsdp*cp") saw_real = row.bytes > 0 && row.exact_bytes == 0;
    if (!row.noop && row.seconds > 0) {
      EXPECT_DOUBLE_EQ(row.algbw_GBps, static_cast<double>(row.bytes + row.exact_bytes) / row.seconds / 1e9);
      EXPECT_DOUBLE_EQ(row.busbw_GBps, row.algbw_GBps * busbw_factor(row.op, static_cast<int>(row.group_ranks)));
    }
  }
  EXPECT_TRUE(saw_noop);
  EXPECT_TRUE(saw_exact);
  EXPECT_TRUE(saw_real);
  const std::string text = format_collectives(rows, 1);
  EXPECT_NE(text.find("no-op"), std::string::npos);
  EXPECT_NE(text.find("busbw"), std::string::npos);
}

}  // namespace

namespace {

// The chunked-EP effect at small scale (docs/timeline.md section 7): on a tiny-e64 mesh with the H100 model, the
// exposed EP all-to-all window falls as the chunks go 1 -> 2 -> 4. The model is tiny-e64 with a 512-wide expert FFN
// (sim/examples/tiny-e64-wide.json: flops per byte dispatched near a production model's) and the simulation drops
// the fixed costs (a production step's transfers are megabytes, bandwidth-bound; a tiny model's are latency-bound).
TEST(Timeline, ChunkedEpShrinksTheExposedAllToAllWindow) {
  double prev_max = 0, prev_crit = 0;
  for (int64_t chunks : {1, 2, 4}) {
    emu::EmulateSpec spec;
    spec.cfg = model::Config::load(std::string(TRIDENT_SIM_EXAMPLES) + "/tiny-e64-wide.json");
    spec.config_path = "tiny-e64-wide.json";
    spec.mesh = parse_mesh("d_rep=1,fsdp=2,cp=4,e_fsdp=1,ep=8");
    spec.ep_chunks = chunks;
    spec.run.sequences = 4;
    spec.run.seq_len = 512;
    spec.run.steps = 1;
    spec.keep_tensors = false;
    spec.record_trace = true;
    const auto r = emu::emulate<float>(spec);
    const Timeline tl = simulate(r.traces, hardware_model("h100"),
                                 {.dtype = "f32", .mesh = &spec.mesh, .fixed_costs = false});
    const double mx = tl.max_exposed("ep"), crit = tl.exposed_s[static_cast<size_t>(tl.critical_rank)].at("ep");
    EXPECT_GT(mx, 0);
    if (chunks > 1) {
      EXPECT_LT(mx, prev_max) << chunks << " chunks";
      EXPECT_LT(crit, prev_crit) << chunks << " chunks";
    }
    prev_max = mx;
    prev_crit = crit;
  }
}

}  // namespace

namespace {

// ---- the scale fixes (docs/timeline.md section 2) ------------------------------------------------------------

TraceEntry kernel(const std::string& name, double flops) {
  TraceEntry e = compute(flops, 0);
  e.name = name;
  return e;
}

// The causal core's FLOPs count the (query, key) pairs it visits: on a zig-zag mesh every rank's two chunks hold
// S(S+1)/(2 cp) of them, (S+1)/(2S) of the all-keys count Nq S (about half). The backward visits the same pairs as
// the forward, twice the FLOPs per pair; where the key side goes as tile partials it runs one call per query tile
// (docs/parallel.md section 5), whose pairs add up to the sequence's.
TEST(TraceMetadata, CausalCoreFlopsCountTheVisitedPairs) {
  const int64_t S = 32, cp = 2;
  const auto r = traced_run("d_rep=1,fsdp=2,cp=2,e_fsdp=2,ep=2", 1, "tiny", 4, S);
  const model::Config cfg = model::Config::preset("tiny");
  const model::CoreDims cd = model::CoreDims::from(cfg);
  const double Nq = static_cast<double>(S / cp), per = static_cast<double>(cd.H * (cd.Dq + cd.Dv));
  const double ratio = static_cast<double>(S + 1) / (2.0 * S);
  int64_t fwd = 0, bwd = 0;
  for (const RankTrace& rt : r.traces) {
    double fwd_flops = 0, bwd_flops = 0;
    for (const StreamTrace& st : rt)
      for (const TraceEntry& e : st.entries) {
        if (e.kind != TraceEntry::Kind::compute) continue;
        if (e.name == "attn_core_forward") {
          ++fwd;
          fwd_flops += e.flops;
          EXPECT_DOUBLE_EQ(e.flops, ratio * 2.0 * Nq * S * per);
          EXPECT_LT(e.flops, 0.6 * 2.0 * Nq * S * per);
        } else if (e.name.rfind("attn_core_backward", 0) == 0) {
          ++bwd;
          bwd_flops += e.flops;
          EXPECT_LE(e.flops, ratio * 4.0 * Nq * S * per) << e.name;
        }
      }
    EXPECT_DOUBLE_EQ(bwd_flops, 2.0 * fwd_flops);
  }
  EXPECT_GT(fwd, 0);
  EXPECT_GT(bwd, 0);
}

// Every access of a kernel is in its trace bytes: weights (mm's B, a SwiGLU's three) and accumulators (wgrad_acc's)
// at their exact sizes; and every compute entry of a traced step moves some bytes.
TEST(TraceMetadata, KernelBytesCountEveryAccess) {
  RankTrace tr;
  {
    emu::EmuDevice emu_dev(0, tr, emu::DeviceOptions{});
    Device& dev = emu_dev;  // the base's default call-site arguments
    CpuKernels<float> k(dev);
    const Stream cs = dev.compute_stream();
    const int64_t M = 3, N = 5, K = 7, d = 4, F = 6, rows = 8;
    auto buf = [&](int64_t n) {
      auto* p = static_cast<float*>(dev.allocate(n * 4, cs));
      dev.memset(p, 0, n * 4, cs);
      return p;
    };
    float *A = buf(M * K), *B = buf(K * N), *C = buf(M * N);
    k.mm(Policy::fp32, M, N, K, A, K, B, N, false, C, N, cs);
    float *X = buf(rows * K), *dY = buf(rows * M);
    auto* acc = static_cast<ExactAcc<float>*>(dev.allocate(K * M * int64_t(sizeof(ExactAcc<float>)), cs));
    dev.memset(acc, 0, K * M * int64_t(sizeof(ExactAcc<float>)), cs);
    const std::vector<int64_t> segs = {0, rows};
    k.wgrad_acc(Policy::fp32, X, K, dY, M, K, M, segs, acc, cs);
    float *x = buf(N * d), *wg = buf(d * F), *wu = buf(d * F), *wd = buf(F * d), *ug = buf(N * F), *uu = buf(N * F),
          *h = buf(N * F), *y = buf(N * d);
    k.swiglu_forward(Policy::fp32, x, wg, wu, wd, N, d, F, ug, uu, h, y, cs);
    dev.synchronize(cs);
    std::map<std::string, int64_t> bytes;
    for (const TraceEntry& e : tr[0].entries)
      if (e.kind == TraceEntry::Kind::compute) bytes[std::string(e.name)] = e.bytes;
    EXPECT_EQ(bytes.at("mm"), 4 * (M * K + K * N + M * N));
    EXPECT_EQ(bytes.at("wgrad_acc"), 4 * (rows * K + rows * M) + K * M * int64_t(sizeof(ExactAcc<float>)));
    EXPECT_EQ(bytes.at("swiglu_forward"), 4 * (2 * N * d + 3 * d * F + 3 * N * F));
    for (void* p : {(void*)A, (void*)B, (void*)C, (void*)X, (void*)dY, (void*)acc, (void*)x, (void*)wg, (void*)wu,
                    (void*)wd, (void*)ug, (void*)uu, (void*)h, (void*)y})
      dev.free(p, cs);
  }
  const auto r = traced_run("d_rep=1,fsdp=2,cp=2,e_fsdp=2,ep=2", 1, "tiny-dsa");
  int64_t n = 0;
  for (const RankTrace& rt : r.traces)
    for (const StreamTrace& st : rt)
      for (const TraceEntry& e : st.entries)
        if (e.kind == TraceEntry::Kind::compute) {
          ++n;
          EXPECT_GT(e.bytes, 0) << e.name << " at " << e.file << ":" << e.line;
        }
  EXPECT_GT(n, 100);
}

// Every attention core runs at the attention throughput, the rest at the GEMM's.
TEST(Timeline, EveryAttentionCoreGetsTheAttentionThroughput) {
  const Hardware& h = hardware_model("h100");
  const double F = 1e12;
  const std::vector<std::string> names = {"attn_core_forward",     "attn_core_backward_gather", "attn_doc_core_forward",
                                          "attn_doc_core_backward", "dsa_core_forward",          "dsa_core_backward",
                                          "dsa_select",            "mm"};
  std::vector<RankTrace> t(1);
  t[0].resize(1);
  for (const std::string& n : names) t[0][0].entries.push_back(kernel(n, F));
  const Timeline tl = simulate(t, h);
  for (size_t i = 0; i < names.size(); ++i) {
    const bool attn = names[i] != "mm";
    EXPECT_EQ(is_attention_core(names[i]), attn) << names[i];
    const double want = h.launch_us * 1e-6 + F / (attn ? h.attention_flops("bf16") : h.gemm_flops("bf16"));
    EXPECT_DOUBLE_EQ(tl.spans[0][0][i].end - tl.spans[0][0][i].start, want) << names[i];
  }
}

// ranks_per_domain: 64 GPUs of each NVL72 rack put ranks 63 and 64 in different domains (InfiniBand between them).
TEST(Timeline, RanksPerDomainSplitsTheDomains) {
  const Hardware& h = hardware_model("gb200-nvl72");
  const int64_t B = 1 << 20;
  std::vector<RankTrace> t(65);
  for (auto& rt : t) rt.resize(1);
  for (int r : {63, 64}) t[static_cast<size_t>(r)][0].entries = {coll(CollOp::all_gather, "x", 3, 0, B)};
  const double nvl = collective_seconds(CollOp::all_gather, B, 2, h.nvlink_GBps * 1e9, h.nvlink_latency_us * 1e-6);
  const double ib = collective_seconds(CollOp::all_gather, B, 2, h.ib_GBps * 1e9, h.ib_latency_us * 1e-6);
  EXPECT_DOUBLE_EQ(simulate(t, h).spans[63][0][0].end, nvl);  // one domain of 72
  const Timeline tl = simulate(t, h, {.ranks_per_domain = 64});
  EXPECT_DOUBLE_EQ(tl.spans[63][0][0].end, ib);
  EXPECT_DOUBLE_EQ(tl.spans[64][0][0].end, ib);
  EXPECT_GT(ib, nvl);
  EXPECT_THROW((void)simulate(t, h, {.ranks_per_domain = -1}), Error);
}

// all_to_allv is timed by the busiest member, sending or receiving: a receiver of 3 B while all send B.
TEST(Timeline, HotReceiverSlowsTheAllToAllv) {
  const Hardware& h = hardware_model("h100");
  const int64_t B = 1 << 20;
  auto make = [&](bool hot) {
    std::vector<RankTrace> t(4);
    for (int r = 0; r < 4; ++r) {
      t[static_cast<size_t>(r)].resize(1);
      TraceEntry e = coll(CollOp::all_to_allv, "ep", 5, 0, B);
      e.recv_bytes = hot ? (r == 0 ? 3 * B : B / 3) : B;
      t[static_cast<size_t>(r)][0].entries = {e};
    }
    return simulate(t, h).spans[1][0][0].end;
  };
  const double bw = h.nvlink_GBps * 1e9, lat = h.nvlink_latency_us * 1e-6;
  EXPECT_DOUBLE_EQ(make(false), collective_seconds(CollOp::all_to_allv, B, 4, bw, lat));
  EXPECT_DOUBLE_EQ(make(true), collective_seconds(CollOp::all_to_allv, 3 * B, 4, bw, lat));
  EXPECT_GT(make(true), make(false));
}

// --planner-dtypes: an fp32 all-gather is timed as bf16 (half the bytes), an exact_f32 reduce-scatter as fp32
// (4 of its 56 bytes per element), an fp32 all-reduce as itself; the trace is unchanged.
TEST(Timeline, PlannerDtypesTimeTheWireDtypes) {
  const Hardware& h = hardware_model("h100");
  const double bw = h.nvlink_GBps * 1e9, lat = h.nvlink_latency_us * 1e-6;
  const int64_t n = 1 << 18;  // elements per member
  const auto one = [&](CollOp op, DataType dt, bool planner) {
    std::vector<RankTrace> t(2);
    for (auto& rt : t) {
      rt.resize(1);
      TraceEntry e = coll(op, "fsdp", 4, 0, n * static_cast<int64_t>(dtype_size(dt)));
      e.dtype = dt;
      rt[0].entries = {e};
    }
    return simulate(t, h, {.planner_dtypes = planner}).spans[0][0][0].end;
  };
  const auto want = [&](CollOp op, DataType dt) { return collective_seconds(op, double(n * dtype_size(dt)), 2, bw, lat); };
  EXPECT_DOUBLE_EQ(one(CollOp::all_gather, DataType::f32, false), want(CollOp::all_gather, DataType::f32));
  EXPECT_DOUBLE_EQ(one(CollOp::all_gather, DataType::f32, true), want(CollOp::all_gather, DataType::bf16));
  EXPECT_DOUBLE_EQ(one(CollOp::reduce_scatter, DataType::exact_f32, false),
                   want(CollOp::reduce_scatter, DataType::exact_f32));
  EXPECT_DOUBLE_EQ(one(CollOp::reduce_scatter, DataType::exact_f32, true), want(CollOp::reduce_scatter, DataType::f32));
  EXPECT_DOUBLE_EQ(one(CollOp::all_reduce, DataType::exact_f64, true), want(CollOp::all_reduce, DataType::f64));
  EXPECT_DOUBLE_EQ(one(CollOp::all_reduce, DataType::f32, true), want(CollOp::all_reduce, DataType::f32));
  EXPECT_DOUBLE_EQ(one(CollOp::all_to_allv, DataType::f32, true), want(CollOp::all_to_allv, DataType::bf16));
  EXPECT_DOUBLE_EQ(one(CollOp::all_gather, DataType::i64, true), want(CollOp::all_gather, DataType::i64));
}

// Memory over simulated time: on one stream the peak is the device's (allocs and frees in stream order).
TEST(Timeline, MemoryPeakOverTimeIsTheDevicePeakOnOneStream) {
  RankTrace tr;
  int64_t device_peak = 0;
  {
    emu::EmuDevice emu_dev(0, tr, emu::DeviceOptions{});
    Device& dev = emu_dev;  // the base's default call-site arguments
    CpuKernels<float> k(dev);
    const Stream cs = dev.compute_stream();
    auto* a = static_cast<float*>(dev.allocate(4000, cs));
    auto* b = static_cast<float*>(dev.allocate(2000, cs));
    k.residual_forward(b, a, a, 500, cs);
    dev.free(a, cs);
    auto* c = static_cast<float*>(dev.allocate(3000, cs));
    k.residual_forward(c, b, b, 500, cs);
    dev.free(b, cs);
    auto* e = static_cast<float*>(dev.allocate(1000, cs));
    dev.free(c, cs);
    dev.free(e, cs);
    dev.synchronize(cs);
    device_peak = dev.memory().peak;
  }
  EXPECT_EQ(device_peak, 6000);
  const Timeline tl = simulate({tr}, hardware_model("h100"));
  ASSERT_EQ(tl.mem_peak.size(), 1u);
  EXPECT_EQ(tl.mem_peak[0], device_peak);
  EXPECT_EQ(simulate({tr}, hardware_model("h100"), {.mem_start = {100}}).mem_peak[0], device_peak + 100);
}

}  // namespace
