// The timeline simulator: replays the per-rank, per-stream trace of an emulated run (parallel/trace.h) through a
// hardware model (sim/hardware.h) and gives every kernel and collective a start and end time, the critical path,
// and the communication each rank leaves exposed (not overlapped by compute) per mesh dimension. Deterministic:
// the times are a function of the trace and the model only. Formulas: docs/timeline.md section 2.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "parallel/layout.h"
#include "parallel/trace.h"
#include "sim/hardware.h"

namespace trident::sim {

// One trace entry's simulated interval, in seconds from the start of the run.
struct Span {
  double start = 0, end = 0;
  int64_t pred = -1;  // the entry whose end fixed this start (pack(rank, stream, index)), -1: none
};

// (rank, stream, index) packed into one integer, for Span::pred.
int64_t pack_entry(int rank, int stream, int64_t index);
void unpack_entry(int64_t p, int& rank, int& stream, int64_t& index);

struct SimOptions {
  std::string dtype = "bf16";  // the compute dtype key of the hardware model (the run's precision policy)
  // The run's mesh: when set, every mesh communicator must be called by as many ranks as it has (else a rank that
  // never reaches a collective would make its group look smaller instead of being reported).
  const MeshShape* mesh = nullptr;
  // false: drop the fixed costs (kernel launch, collective latency) and keep the model's throughputs and
  // bandwidths. A tiny model moves kilobytes per call, so on real hardware its step is latency-bound; a production
  // model moves megabytes and is bandwidth-bound. Without the fixed costs, a tiny model whose flops per byte match
  // the production one (e.g. a wider expert FFN) shows the production overlap at small scale (docs/timeline.md 7).
  bool fixed_costs = true;
  // World ranks per NVLink domain: rank r sits in domain r / ranks_per_domain (0: the hardware's nvl_domain). A job
  // may use fewer GPUs of a domain than it has (e.g. 64 of an NVL72 rack's 72).
  int ranks_per_domain = 0;
  // Per rank: device bytes allocated before the trace's first entry (empty: none; the emulator traces every
  // allocation of its devices, so 0). The base of Timeline::mem_peak.
  std::vector<int64_t> mem_start = {};
  // true: time every collective at the planner's wire dtypes instead of the run's (docs/timeline.md section 2,
  // "Wire dtypes"): fp32 data movement (all_gather, broadcast, all_to_all(v), send/recv) as bf16, exact-accumulator
  // reductions as reductions of their element type (exact_f32 -> fp32, exact_f64 -> fp64). The trace is unchanged.
  bool planner_dtypes = false;
};

// The bytes a collective entry of `dtype` and `op` moves at the planner's wire dtypes, for `bytes` as recorded.
double planner_wire_bytes(CollOp op, DataType dtype, double bytes);

// The throughput class of a kernel name: true for the attention cores (attn_core*, attn_doc_core*, dsa_core*,
// dsa_select), which run at the model's attention throughput; every other kernel at the GEMM throughput.
bool is_attention_core(std::string_view kernel_name);

// Ranks in the communicator called `name` ("world" or mesh dimensions joined by '*', parallel/mesh.h); 0 for a
// name that is not a mesh communicator.
int64_t comm_group_size(const MeshShape& mesh, std::string_view name);

// Per (communicator name, op): the simulated seconds of every rank's calls, summed.
struct CollTime {
  double seconds = 0;
  int64_t calls = 0;
};

struct Timeline {
  std::vector<std::vector<std::vector<Span>>> spans;  // [rank][stream][entry], as the trace
  double makespan = 0;      // the latest end over all ranks and streams
  int critical_rank = 0;    // the rank whose stream ends last (lowest rank on a tie)
  // The critical path: walking back from the last-ending entry along Span::pred; its time split into compute and
  // communication per communicator name (sums to makespan).
  double path_compute_s = 0;
  std::map<std::string, double> path_comm_s;
  int64_t path_entries = 0;
  // Per rank: seconds some stream computes (union of kernel intervals), and per communicator name the union of its
  // collectives' intervals and the part of it no kernel overlaps (exposed).
  std::vector<double> compute_busy_s;
  std::vector<std::map<std::string, double>> comm_busy_s, exposed_s;
  std::map<std::pair<std::string, CollOp>, CollTime> coll;  // every rank's calls
  // Per rank: the peak device bytes over simulated time, SimOptions::mem_start plus the trace's allocs minus its
  // frees (an alloc counts from its span's start, a free from its span's end; at equal times frees first).
  std::vector<int64_t> mem_peak;
  // The largest exposed time of a communicator name over ranks, and the rank (lowest on a tie).
  double max_exposed(const std::string& comm, int* rank = nullptr) const;
};

// Replays `traces` (one RankTrace per world rank, as EmulateResult::traces). World rank r sits in NVLink domain
// r / (opt.ranks_per_domain, or hw.nvl_domain when 0); a communicator whose members share one domain runs at NVLink
// speed, else at the NIC's.
// Throws trident::Error on an inconsistent trace (a collective some member never reaches, a wait on an event
// recorded nowhere).
Timeline simulate(const std::vector<RankTrace>& traces, const Hardware& hw, const SimOptions& opt = {});

// The simulated duration of one collective: op, bytes (the nccl-tests size, the largest over its members; for
// all_to_all(v) the largest of every member's sent and received bytes), group
// size n, link bandwidth (bytes/s) and latency (s). n == 1: 0 (a no-op).
double collective_seconds(CollOp op, double bytes, int n, double bw, double latency);

// Time intervals [begin, end) in seconds: the exposure arithmetic (docs/timeline.md section 2).
using Intervals = std::vector<std::pair<double, double>>;
Intervals merge(Intervals v);                          // sorted, overlapping ones joined
double length(const Intervals& v);                     // total length of merged intervals
double overlap(const Intervals& x, const Intervals& y);  // length of the intersection of two merged lists
// nccl-tests' bus bandwidth factor: all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all(v) (n-1)/n; else 1.
double busbw_factor(CollOp op, int n);

}  // namespace trident::sim
