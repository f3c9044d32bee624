#include "sim/timeline.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <unordered_map>
#include <unordered_set>

#include "reference/check.h"

namespace trident::sim {

Intervals merge(Intervals v) {
  std::sort(v.begin(), v.end());
  Intervals out;
  for (const auto& iv : v) {
    if (!out.empty() && iv.first <= out.back().second) out.back().second = std::max(out.back().second, iv.second);
    else out.push_back(iv);
  }
  return out;
}
double length(const Intervals& v) {
  double s = 0;
  for (const auto& [a, b] : v) s += b - a;
  return s;
}
double overlap(const Intervals& x, const Intervals& y) {
  double s = 0;
  size_t i = 0, j = 0;
  while (i < x.size() && j < y.size()) {
    const double a = std::max(x[i].first, y[j].first), b = std::min(x[i].second, y[j].second);
    if (b > a) s += b - a;
    (x[i].second < y[j].second) ? ++i : ++j;
  }
  return s;
}

int64_t pack_entry(int rank, int stream, int64_t index) {
  return (static_cast<int64_t>(rank) << 40) | (static_cast<int64_t>(stream) << 32) | index;
}
void unpack_entry(int64_t p, int& rank, int& stream, int64_t& index) {
  rank = static_cast<int>(p >> 40);
  stream = static_cast<int>((p >> 32) & 0xFF);
  index = p & 0xFFFFFFFFll;
}

int64_t comm_group_size(const MeshShape& m, std::string_view name) {
  if (name == "world") return m.world();
  int64_t n = 1;
  size_t b = 0;
  while (b <= name.size()) {
    const size_t e = std::min(name.find('*', b), name.size());
    const std::string_view d = name.substr(b, e - b);
    if (d == "d_rep") n *= m.d_rep;
    else if (d == "fsdp") n *= m.fsdp;
    else if (d == "cp") n *= m.cp;
    else if (d == "cp_outer") n *= m.cp_outer();  // 2D CP (docs/parallel.md section 5)
    else if (d == "cp_inner") n *= m.cp_inner;
    else if (d == "e_fsdp") n *= m.e_fsdp;
    else if (d == "ep") n *= m.ep;
    else return 0;  // not a mesh communicator (unknown size)
    b = e + 1;
  }
  return n;
}

double busbw_factor(CollOp op, int n) {
  if (n <= 1) return 0;
  const double f = static_cast<double>(n - 1) / n;
  switch (op) {
    case CollOp::all_reduce: return 2 * f;
    case CollOp::all_gather:
    case CollOp::reduce_scatter:
    case CollOp::all_to_all:
    case CollOp::all_to_allv: return f;
    default: return 1;
  }
}

double collective_seconds(CollOp op, double bytes, int n, double bw, double latency) {
  if (n <= 1 || op == CollOp::split) return 0;
  const double steps = op == CollOp::all_reduce                                   ? 2.0 * (n - 1)
                       : op == CollOp::all_gather || op == CollOp::reduce_scatter ? n - 1.0
                                                                                  : 1.0;
  const double ring = steps * latency + bytes * busbw_factor(op, n) / bw;
  if (op != CollOp::all_reduce) return ring;
  // NCCL's tree all-reduce (reduce up, broadcast down a binary tree): 2 ceil(log2 n) latencies and the whole
  // buffer twice; NCCL picks the faster of the two, so small all-reduces over many ranks are not ring-latency bound.
  const double tree = 2.0 * std::ceil(std::log2(static_cast<double>(n))) * latency + 2.0 * bytes / bw;
  return std::min(ring, tree);
}

bool is_attention_core(std::string_view n) {
  return n.find("attn_core") != std::string_view::npos || n.find("attn_doc_core") != std::string_view::npos ||
         n.find("dsa_core") != std::string_view::npos || n.find("dsa_select") != std::string_view::npos;
}

double Timeline::max_exposed(const std::string& comm, int* rank) const {
  double best = 0;
  int at = 0;
  for (size_t r = 0; r < exposed_s.size(); ++r) {
    const auto it = exposed_s[r].find(comm);
    if (it != exposed_s[r].end() && it->second > best) best = it->second, at = static_cast<int>(r);
  }
  if (rank) *rank = at;
  return best;
}

namespace {

using Kind = TraceEntry::Kind;

bool is_comm(Kind k) { return k == Kind::collective || k == Kind::send || k == Kind::recv; }
bool is_helper(CollOp op) { return op == CollOp::all_to_all || op == CollOp::all_to_allv; }

// A communicator as the trace shows it: its members (world ranks, ascending: the communicator's rank order for mesh
// groups) and the link it runs on.
struct CommInfo {
  std::vector<int> members;
  int n_local = 1;  // members in one NVLink domain (the largest count over domains)
  bool nvl = true;  // all members in one domain
};

// A collective instance waiting for its members.
struct Pending {
  int arrived = 0;
  double ready = 0;   // latest arrival
  int64_t pred = -1;  // the entry before the latest arrival
  double bytes = 0;   // largest over members (all_to_all(v): of their sent and received bytes)
  std::vector<std::pair<int, int>> at;  // (rank, stream) of the arrivals
};

struct Cursor {
  size_t idx = 0;
  double t = 0;
  bool arrived = false;  // registered at the pending collective of entries[idx]
};

class Replay {
 public:
  Replay(const std::vector<RankTrace>& tr, const Hardware& hw, const SimOptions& opt) : tr_(tr), hw_(hw) {
    if (!opt.fixed_costs) hw_.launch_us = hw_.nvlink_latency_us = hw_.ib_latency_us = 0;
    planner_dtypes_ = opt.planner_dtypes;
    gemm_ = hw_.gemm_flops(opt.dtype);
    attn_ = hw_.attention_flops(opt.dtype);
    const int W = static_cast<int>(tr.size());
    TD_CHECK(opt.ranks_per_domain >= 0, "timeline: ranks_per_domain {} (at least 1, or 0: the hardware's {})",
             opt.ranks_per_domain, hw.nvl_domain);
    const int domain = opt.ranks_per_domain > 0 ? opt.ranks_per_domain : hw.nvl_domain;
    TD_CHECK(opt.mem_start.empty() || opt.mem_start.size() == tr.size(),
             "timeline: mem_start has {} ranks, the trace {}", opt.mem_start.size(), tr.size());
    mem_start_ = opt.mem_start;
    out_.spans.resize(tr.size());
    cur_.resize(tr.size());
    for (int r = 0; r < W; ++r) {
      const RankTrace& rt = tr[static_cast<size_t>(r)];
      TD_CHECK(rt.size() <= 256, "timeline: rank {} has {} streams (at most 256)", r, rt.size());
      out_.spans[static_cast<size_t>(r)].resize(rt.size());
      cur_[static_cast<size_t>(r)].resize(rt.size());
      for (size_t s = 0; s < rt.size(); ++s) {
        TD_CHECK(rt[s].entries.size() < (int64_t{1} << 32), "timeline: rank {} stream {}: too many entries", r, s);
        out_.spans[static_cast<size_t>(r)][s].resize(rt[s].entries.size());
        for (const TraceEntry& e : rt[s].entries)
          if (is_comm(e.kind)) {
            comm_names_.try_emplace(e.comm_id, e.comm);  // no string built for a known id
            auto& m = comms_[e.comm_id].members;
            if (m.empty() || m.back() != r) m.push_back(r);
          }
      }
    }
    for (auto& [id, c] : comms_) {
      if (opt.mesh) {  // a member that never calls the communicator would make it look smaller
        const std::string& name = comm_names_.at(id);
        const int64_t want = comm_group_size(*opt.mesh, name);
        TD_CHECK(want == 0 || want == static_cast<int64_t>(c.members.size()),
                 "timeline: communicator '{}' (id {}) has {} ranks on mesh {} but {} ranks call it in the trace", name,
                 id, want, opt.mesh->spec(), c.members.size());
      }
      std::map<int, int> per;
      for (int r : c.members) per[r / domain]++;
      for (const auto& [d, k] : per) c.n_local = std::max(c.n_local, k);
      c.nvl = per.size() == 1;
    }
  }

  Timeline run() {
    for (int r = 0; r < static_cast<int>(tr_.size()); ++r)
      for (int s = 0; s < static_cast<int>(tr_[static_cast<size_t>(r)].size()); ++s) push(r, s);
    while (!queue_.empty()) {
      const auto [r, s] = queue_.front();
      queue_.pop_front();
      queued_.erase(pack_entry(r, s, 0));
      advance(r, s);
    }
    for (size_t r = 0; r < tr_.size(); ++r)
      for (size_t s = 0; s < tr_[r].size(); ++s) {
        const Cursor& c = cur_[r][s];
        if (c.idx < tr_[r][s].entries.size()) {
          const TraceEntry& e = tr_[r][s].entries[c.idx];
          fail(fmt::format("timeline: rank {} stream '{}' cannot pass entry {} ('{}'{}{} at {}:{}): the trace is "
                           "inconsistent (a collective not every member reaches, or a wait on an event recorded "
                           "after it)",
                           r, tr_[r][s].name, c.idx, e.name, e.comm.empty() ? "" : " on ", e.comm, e.file, e.line));
        }
      }
    summarize();
    return std::move(out_);
  }

 private:
  void push(int r, int s) {
    if (queued_.insert(pack_entry(r, s, 0)).second) queue_.emplace_back(r, s);
  }

  double wire(const TraceEntry& e, double bytes) const {
    return planner_dtypes_ && bytes > 0 ? planner_wire_bytes(e.op, e.dtype, bytes) : bytes;
  }

  double compute_seconds(const TraceEntry& e) const {
    const bool attn = is_attention_core(e.name);
    const double f = e.flops / (attn ? attn_ : gemm_);
    const double m = static_cast<double>(e.bytes) / (hw_.hbm_GBps * 1e9);
    return hw_.launch_us * 1e-6 + std::max(f, m);
  }

  double comm_seconds(const TraceEntry& e, const CommInfo& c, double bytes) const {
    const int n = static_cast<int>(c.members.size());
    const double nvl_bw = hw_.nvlink_GBps * 1e9, ib_bw = hw_.ib_GBps * 1e9;
    const double nvl_lat = hw_.nvlink_latency_us * 1e-6, ib_lat = hw_.ib_latency_us * 1e-6;
    if (e.kind != Kind::collective) {  // send/recv: one message over the pair's link
      return (c.nvl ? nvl_lat : ib_lat) + bytes / (c.nvl ? nvl_bw : ib_bw);
    }
    if (c.nvl || n <= 1) return collective_seconds(e.op, bytes, n, nvl_bw, nvl_lat);
    if (is_helper(e.op)) {  // all-to-all across domains: the local part over NVLink, the rest over the NICs, at once
      if (n <= 1) return 0;
      const double loc = bytes * (c.n_local - 1) / n / nvl_bw, rem = bytes * (n - c.n_local) / n / ib_bw;
      return ib_lat + std::max(loc, rem);
    }
    return collective_seconds(e.op, bytes, n, ib_bw, ib_lat);  // rings across domains: the NIC is the bottleneck
  }

  void advance(int r, int s) {
    const auto& entries = tr_[static_cast<size_t>(r)][static_cast<size_t>(s)].entries;
    auto& spans = out_.spans[static_cast<size_t>(r)][static_cast<size_t>(s)];
    Cursor& c = cur_[static_cast<size_t>(r)][static_cast<size_t>(s)];
    while (c.idx < entries.size()) {
      const TraceEntry& e = entries[c.idx];
      Span& sp = spans[c.idx];
      const int64_t prev = c.idx > 0 ? pack_entry(r, s, static_cast<int64_t>(c.idx) - 1) : -1;
      switch (e.kind) {
        case Kind::compute:
          sp = {c.t, c.t + compute_seconds(e), prev};
          break;
        case Kind::alloc:
        case Kind::free:
          sp = {c.t, c.t, prev};
          break;
        case Kind::record:
          sp = {c.t, c.t, prev};
          for (int o = 0; o < static_cast<int>(spans_of(r).size()); ++o)
            if (o != s) push(r, o);
          break;
        case Kind::wait: {
          TD_CHECK(e.event_stream >= 0 && e.event_stream < static_cast<int>(spans_of(r).size()),
                   "timeline: rank {}: wait on stream {} that does not exist", r, e.event_stream);
          const Cursor& o = cur_[static_cast<size_t>(r)][static_cast<size_t>(e.event_stream)];
          if (e.event_index >= 0 && static_cast<int64_t>(o.idx) <= e.event_index) return;  // not recorded yet
          double t = c.t;
          int64_t pred = prev;
          if (e.event_index >= 0) {
            const Span& rec = spans_of(r)[static_cast<size_t>(e.event_stream)][static_cast<size_t>(e.event_index)];
            if (rec.end > t) t = rec.end, pred = pack_entry(r, e.event_stream, e.event_index);
          }
          sp = {t, t, pred};
          break;
        }
        case Kind::send:
        case Kind::recv:
          sp = {c.t, c.t + comm_seconds(e, comms_.at(e.comm_id), wire(e, static_cast<double>(e.bytes))), prev};
          note_coll(e, sp);
          break;
        case Kind::collective: {
          const CommInfo& ci = comms_.at(e.comm_id);
          if (ci.members.size() == 1) {
            sp = {c.t, c.t, prev};  // a group of one rank: a no-op
            note_coll(e, sp);
            break;
          }
          const uint64_t key = (static_cast<uint64_t>(e.comm_id) << 34) ^ (e.seq << 1) ^ (is_helper(e.op) ? 1u : 0u);
          Pending& p = pending_[key];
          if (!c.arrived) {
            c.arrived = true;
            p.arrived++;
            // all_to_all(v): the busiest member's link, sending or receiving (a hot receiver; docs/timeline.md 2)
            p.bytes = std::max({p.bytes, wire(e, static_cast<double>(e.bytes)), wire(e, static_cast<double>(e.recv_bytes))});
            if (p.arrived == 1 || c.t > p.ready) p.ready = c.t, p.pred = prev;
            p.at.emplace_back(r, s);
          }
          if (p.arrived < static_cast<int>(ci.members.size())) return;  // blocked until every member arrives
          const double end = p.ready + comm_seconds(e, ci, p.bytes);
          for (const auto& [mr, ms] : p.at) {
            Cursor& mc = cur_[static_cast<size_t>(mr)][static_cast<size_t>(ms)];
            const size_t mi = mc.idx;
            const TraceEntry& me = tr_[static_cast<size_t>(mr)][static_cast<size_t>(ms)].entries[mi];
            TD_CHECK(me.op == e.op,
                     "timeline: collective #{} on '{}': rank {} calls {} where rank {} calls {}", e.seq, e.comm, mr,
                     to_string(me.op), r, to_string(e.op));
            out_.spans[static_cast<size_t>(mr)][static_cast<size_t>(ms)][mi] = {p.ready, end, p.pred};
            note_coll(me, {p.ready, end, p.pred});
            mc.arrived = false;
            mc.t = end;
            mc.idx++;
            if (mr != r || ms != s) push(mr, ms);
          }
          pending_.erase(key);
          continue;  // this cursor advanced above
        }
      }
      c.t = sp.end;
      c.idx++;
    }
  }

  const std::vector<std::vector<Span>>& spans_of(int r) const { return out_.spans[static_cast<size_t>(r)]; }

  void note_coll(const TraceEntry& e, const Span& sp) {
    CollTime& ct = out_.coll[{std::string(e.comm), e.op}];
    ct.seconds += sp.end - sp.start;
    ct.calls += 1;
  }

  void summarize() {
    const size_t W = tr_.size();
    int64_t last = -1;
    for (size_t r = 0; r < W; ++r)
      for (size_t s = 0; s < tr_[r].size(); ++s) {
        const auto& sp = out_.spans[r][s];
        if (!sp.empty() && (last < 0 || sp.back().end > out_.makespan)) {
          out_.makespan = sp.back().end;
          last = pack_entry(static_cast<int>(r), static_cast<int>(s), static_cast<int64_t>(sp.size()) - 1);
          out_.critical_rank = static_cast<int>(r);
        }
      }
    for (int64_t p = last; p >= 0;) {
      int r = 0, s = 0;
      int64_t i = 0;
      unpack_entry(p, r, s, i);
      const Span& sp = out_.spans[static_cast<size_t>(r)][static_cast<size_t>(s)][static_cast<size_t>(i)];
      const TraceEntry& e = tr_[static_cast<size_t>(r)][static_cast<size_t>(s)].entries[static_cast<size_t>(i)];
      const double d = sp.end - sp.start;
      if (is_comm(e.kind)) out_.path_comm_s[std::string(e.comm)] += d;
      else out_.path_compute_s += d;
      out_.path_entries++;
      p = sp.pred;
    }
    out_.compute_busy_s.assign(W, 0);
    out_.comm_busy_s.assign(W, {});
    out_.exposed_s.assign(W, {});
    for (size_t r = 0; r < W; ++r) {
      std::vector<std::pair<double, double>> comp;
      std::map<std::string, std::vector<std::pair<double, double>>> comm;
      for (size_t s = 0; s < tr_[r].size(); ++s)
        for (size_t i = 0; i < tr_[r][s].entries.size(); ++i) {
          const TraceEntry& e = tr_[r][s].entries[i];
          const Span& sp = out_.spans[r][s][i];
          if (is_comm(e.kind)) comm[std::string(e.comm)];  // listed even when a no-op
          if (sp.end <= sp.start) continue;
          if (e.kind == Kind::compute) comp.emplace_back(sp.start, sp.end);
          else if (is_comm(e.kind)) comm[std::string(e.comm)].emplace_back(sp.start, sp.end);
        }
      const auto c = merge(std::move(comp));
      out_.compute_busy_s[r] = length(c);
      for (auto& [name, iv] : comm) {
        const auto m = merge(std::move(iv));
        const double busy = length(m);
        out_.comm_busy_s[r][name] = busy;
        out_.exposed_s[r][name] = std::max(0.0, busy - overlap(m, c));
      }
    }
    // Memory over simulated time: allocs at their span's start, frees at their span's end, ties in the rank's issue
    // order (one stream: its own order, so the device's peak).
    out_.mem_peak.assign(W, 0);
    for (size_t r = 0; r < W; ++r) {
      struct Ev {
        double t;
        int64_t order, delta;
      };
      std::vector<Ev> ev;
      for (size_t s = 0; s < tr_[r].size(); ++s)
        for (size_t i = 0; i < tr_[r][s].entries.size(); ++i) {
          const TraceEntry& e = tr_[r][s].entries[i];
          if (e.kind != Kind::alloc && e.kind != Kind::free) continue;
          const Span& sp = out_.spans[r][s][i];
          const int64_t order = e.issue >= 0 ? e.issue : pack_entry(0, static_cast<int>(s), static_cast<int64_t>(i));
          ev.push_back(e.kind == Kind::alloc ? Ev{sp.start, order, e.bytes} : Ev{sp.end, order, -e.bytes});
        }
      std::sort(ev.begin(), ev.end(),
                [](const Ev& a, const Ev& b) { return a.t != b.t ? a.t < b.t : a.order < b.order; });
      int64_t cur = mem_start_.empty() ? 0 : mem_start_[r], peak = cur;
      for (const Ev& x : ev) peak = std::max(peak, cur += x.delta);
      out_.mem_peak[r] = peak;
    }
  }

  const std::vector<RankTrace>& tr_;
  Hardware hw_;  // a copy: SimOptions may change its fixed costs
  double gemm_ = 1, attn_ = 1;
  bool planner_dtypes_ = false;
  std::vector<int64_t> mem_start_;
  Timeline out_;
  std::vector<std::vector<Cursor>> cur_;
  std::map<int64_t, CommInfo> comms_;
  std::map<int64_t, std::string> comm_names_;
  std::unordered_map<uint64_t, Pending> pending_;
  std::deque<std::pair<int, int>> queue_;
  std::unordered_set<int64_t> queued_;
};

}  // namespace

double planner_wire_bytes(CollOp op, DataType dtype, double bytes) {
  switch (dtype) {
    case DataType::exact_f32:
      return bytes * static_cast<double>(dtype_size(DataType::f32)) / static_cast<double>(dtype_size(dtype));
    case DataType::exact_f64:
      return bytes * static_cast<double>(dtype_size(DataType::f64)) / static_cast<double>(dtype_size(dtype));
    case DataType::f32:
      switch (op) {
        case CollOp::all_gather:
        case CollOp::broadcast:
        case CollOp::all_to_all:
        case CollOp::all_to_allv:
        case CollOp::send:
        case CollOp::recv:
          return bytes * static_cast<double>(dtype_size(DataType::bf16)) / static_cast<double>(dtype_size(dtype));
        default:
          return bytes;  // fp32 reductions stay fp32
      }
    default:
      return bytes;
  }
}

Timeline simulate(const std::vector<RankTrace>& traces, const Hardware& hw, const SimOptions& opt) {
  return Replay(traces, hw, opt).run();
}

}  // namespace trident::sim
