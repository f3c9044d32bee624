// Up-front memory estimates (emulator/memory.h).
#include "emulator/memory.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "parallel/exact_lowering.h"
#include "platform/memory_info.h"
#include "reference/check.h"
#include "reference/exact_acc.h"
#include "reference/model/attention.h"
#include "reference/model/params.h"

namespace trident::emu {

namespace md = trident::model;

namespace {

// Program text, libraries, allocator arenas and the OpenMP runtime: measured at 10-25 MiB for the tiny presets.
constexpr double kProgramBytes = 32.0 * 1024 * 1024;

double sum(const std::vector<MemoryPart>& v) {
  double s = 0;
  for (const MemoryPart& p : v) s += p.bytes;
  return s;
}

size_t elem_bytes(const md::Config& cfg) { return cfg.policy == Policy::fp64 ? sizeof(double) : sizeof(float); }
size_t acc_bytes(const md::Config& cfg) {
  return cfg.policy == Policy::fp64 ? sizeof(ExactAcc<double>) : sizeof(ExactAcc<float>);
}

// Elements per token row of one layer's saved forward state (the step's LayerState, the reference's saved
// activations), excluding the routed expert rows and the gathered CP KV, which scale otherwise.
double layer_row_elems(const md::Config& cfg, int64_t i) {
  const double d = static_cast<double>(cfg.d_model);
  double w = 3 * d + 2 + static_cast<double>(md::AttnActSizes::of(cfg, 1).total());  // a1, h, a2, 2 rinv, attention
  if (cfg.dsa()) w += 1;  // the indexer's KL term per query
  if (!cfg.is_moe_layer(i)) return w + 3.0 * static_cast<double>(cfg.dense_ffn);     // ug, uu, hh
  const double E = static_cast<double>(cfg.experts), K = static_cast<double>(cfg.top_k);
  return w + 2 * E + 2 * K + K * d + d + 3.0 * static_cast<double>(cfg.shared_ffn);  // router, gates, yk, shared
}

struct ParamBytes {
  double params = 0;            // elements, full model
  double shards = 0;            // bytes on one rank: weights, AdamW m and v, rounded gradients, buffers
  std::vector<double> unit_full;  // per FSDP unit: gathered elements on one rank
  std::vector<double> unit_arena;  // per FSDP unit: its gradients' arena use, in accumulators
  double max_shard = 0;         // elements of the largest shard of one tensor (the merge buffer)
};

// part_scale: the arena's size per element of a tensor exchanged as tile partials (dense_grad_partial_tensor), in
// accumulators: 2 nt eb / ab where dense_grad_partials holds (send and receive buffers), else 1.
ParamBytes param_bytes(const md::Config& cfg, const MeshShape& m, size_t eb, double part_scale = 1) {
  ParamBytes r;
  const int64_t L = cfg.layers, nfc = m.fsdp * m.cp, Eloc = cfg.experts / std::max<int64_t>(m.ep, 1);
  r.unit_full.assign(static_cast<size_t>(L + 2), 0);
  r.unit_arena.assign(static_cast<size_t>(L + 2), 0);
  for (const md::ParamInfo& in : md::param_layout(cfg)) {
    double numel = 1;
    for (int64_t s : in.shape) numel *= static_cast<double>(s);
    r.params += numel;
    int64_t unit = L + 1;
    if (in.name == "embed") unit = 0;
    else if (in.name.rfind("layers.", 0) == 0) unit = 1 + std::stoll(in.name.substr(7));
    if (!in.trainable) {
      r.shards += numel * static_cast<double>(eb);
      continue;
    }
    double nsh = 0, full = 0;
    if (in.name.find(".moe.experts.") != std::string::npos) {
      const ShardSpec sp{in.shape[1], in.shape[2], m.e_fsdp};
      nsh = static_cast<double>(Eloc) * static_cast<double>(sp.shard_elems());
      full = nsh * static_cast<double>(m.e_fsdp);
      r.max_shard = std::max(r.max_shard, static_cast<double>(sp.shard_elems()));
    } else {
      const int64_t rows = in.shape[0];
      const ShardSpec sp{rows, static_cast<int64_t>(numel) / rows, nfc};
      nsh = static_cast<double>(sp.shard_elems());
      full = nsh * static_cast<double>(nfc);
      r.max_shard = std::max(r.max_shard, nsh);
    }
    r.shards += 4 * nsh * static_cast<double>(eb);  // w, m, v, g
    r.unit_full[static_cast<size_t>(unit)] += full;
    r.unit_arena[static_cast<size_t>(unit)] += full * (dense_grad_partial_tensor(in.name) ? part_scale : 1.0);
  }
  return r;
}

}  // namespace

double MemoryEstimate::rank_bytes() const { return sum(per_rank); }
double MemoryEstimate::host_bytes() const { return sum(host); }
double MemoryEstimate::total() const { return static_cast<double>(ranks) * rank_bytes() + host_bytes(); }
double MemoryEstimate::device_bytes() const {
  double s = 0;
  for (const MemoryPart& p : per_rank)
    if (p.what != "staging" && p.what != "stack") s += p.bytes;
  return s;
}

std::string MemoryEstimate::describe() const {
  auto parts = [](const std::vector<MemoryPart>& v) {
    std::string s;
    for (const MemoryPart& p : v) {
      if (p.bytes <= 0) continue;
      if (!s.empty()) s += ", ";
      s += fmt::format("{} {}", p.what, format_bytes(p.bytes));
    }
    return s;
  };
  if (ranks == 1)
    return fmt::format("{} = {} ({}) + host {} ({})", format_bytes(total()), format_bytes(rank_bytes()),
                       parts(per_rank), format_bytes(host_bytes()), parts(host));
  return fmt::format("{} = {} rank(s) x {} ({}) + host {} ({})", format_bytes(total()), ranks,
                     format_bytes(rank_bytes()), parts(per_rank), format_bytes(host_bytes()), parts(host));
}

std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (b >= 1024 && u < 6) b /= 1024, ++u;
  if (u == 0) return fmt::format("{:.0f} B", b);
  return fmt::format("{:.{}f} {}", b, b < 10 ? 2 : 1, units[u]);
}

MemoryEstimate estimate_train(const md::Config& cfg, const md::RunConfig& run, bool dump) {
  const size_t eb = elem_bytes(cfg);
  const double N = static_cast<double>(run.sequences) * static_cast<double>(run.seq_len);
  const double d = static_cast<double>(cfg.d_model), K = static_cast<double>(cfg.top_k);
  const ParamBytes pb = param_bytes(cfg, MeshShape{}, eb);
  const double P = pb.params;
  double acts = 0, widest = 0, routed = 0;
  for (int64_t i = 0; i < cfg.layers; ++i) {
    const double w = layer_row_elems(cfg, i);
    widest = std::max(widest, w);
    acts += w;
    if (cfg.is_moe_layer(i)) routed = std::max(routed, K * (4 * d + 5 * static_cast<double>(cfg.expert_ffn)));
  }
  const double L = static_cast<double>(cfg.layers);
  // saved: every layer's state, or (recompute) every layer's input plus the one layer being recomputed
  const double saved = run.recompute ? (L + 1) * d + widest + routed : acts + (L + 1) * d + L * routed;
  const double work = widest + routed + 4 * d;  // the backward of one layer (gradients of its activations)
  const double ce = std::min<double>(static_cast<double>(run.token_chunk), N) *
                    static_cast<double>(std::min(cfg.vocab_chunk, cfg.vocab)) * 2 + N * (d + 2);
  MemoryEstimate e;
  e.ranks = 1;
  e.per_rank = {
      {"weights+grads+AdamW", 4 * P * static_cast<double>(eb)},
      // streaming accumulators: one block (and one expert's slices inside it) at a time (reference/model/params.h)
      {"exact accumulators", static_cast<double>(md::streaming_peak_accumulators(cfg)) *
                                 static_cast<double>(acc_bytes(cfg))},
      {"activations", N * (saved + work) * static_cast<double>(eb) + ce * static_cast<double>(eb) +
                          (cfg.dsa() ? 4.0 * L * N * static_cast<double>(cfg.dsa_topk) : 0)},  // DSA selections
      {"batch", N * 8},
  };
  e.host = {{"program", kProgramBytes}};
  if (dump) e.host.push_back({"golden dump", 4 * P * static_cast<double>(eb)});
  return e;
}

CpKeySide cp_key_side(const EmulateMemoryInputs& in) {
  const md::Config& cfg = in.cfg;
  const MeshShape& m = in.mesh;
  CpKeySide k;  // cp = 1 takes the same path (a one-rank gather and reduce-scatter)
  const double ebd = static_cast<double>(elem_bytes(cfg)), abd = static_cast<double>(acc_bytes(cfg));
  const double S = static_cast<double>(in.run.seq_len), cp = static_cast<double>(m.cp);
  const double P = static_cast<double>(cfg.payload_dim()), ch = S / (2 * cp);
  const double nseq = static_cast<double>(in.run.sequences) / static_cast<double>(m.d_rep * m.fsdp);
  const double no = m.cp_2d() ? static_cast<double>(m.cp_outer()) : 1;
  k.kv = nseq * S * P * ebd;                                        // LayerState::kv
  k.gather = (S + (m.cp_2d() ? S + no * 2 * ch : 0)) * P * ebd;     // gbuf (2D: + ibuf, obuf)
  k.acc = (S + ch + 2 * ch + (m.cp_2d() ? S + no * 2 * ch : 0)) * P * abd;  // kacc, blk, mine (2D: + tacc, part)
  // 1D CP, causal core: the tile partials, sent and received (StepImpl::key_partials), where they are fewer bytes
  // than accumulators, carved from the arena with the owner's accumulators: one query tile's S * P values each way
  // (the tiles go one at a time), plus 2 S/cp * P accumulators.
  if (key_side_partials(m, in.run.seq_len, cfg.tile, !cfg.dsa() && in.run.docs_per_seq <= 1, elem_bytes(cfg),
                        acc_bytes(cfg)))
    k.acc = (2 * S * ebd / abd + 2 * S / cp) * P * abd;
  return k;
}

MemoryEstimate estimate_emulate(const EmulateMemoryInputs& in) {
  const md::Config& cfg = in.cfg;
  const md::RunConfig& run = in.run;
  const MeshShape& m = in.mesh;
  const size_t eb = elem_bytes(cfg), ab = acc_bytes(cfg);
  const double ebd = static_cast<double>(eb), abd = static_cast<double>(ab);
  const double groups = static_cast<double>(m.d_rep * m.fsdp);
  const double nseq = static_cast<double>(run.sequences) / groups;
  const double S = static_cast<double>(run.seq_len), cp = static_cast<double>(m.cp);
  const double N = nseq * S / cp;  // local token rows
  const double d = static_cast<double>(cfg.d_model), K = static_cast<double>(cfg.top_k);
  const double F = static_cast<double>(cfg.expert_ffn), L = static_cast<double>(cfg.layers);
  const double ep = static_cast<double>(m.ep);
  const double Eloc = static_cast<double>(cfg.experts) / ep;
  // dense weight gradients as tile partials (StepImpl::partials_take, the CPU kernel set, as the key side below)
  const double dnt = static_cast<double>(dense_grad_tiles(m, run.sequences, run.seq_len, cfg.tile));
  const ParamBytes pb = param_bytes(cfg, m, eb,
                                    dense_grad_partials(m, run.sequences, run.seq_len, cfg.tile, eb, ab)
                                        ? 2 * dnt * ebd / abd
                                        : 1.0);

  // gathered FSDP units: the unit in use, the next one prefetched, and the embedding or head around the loss
  std::vector<double> units = pb.unit_full;
  std::sort(units.rbegin(), units.rend());
  double gathered = 0;
  for (size_t k = 0; k < std::min<size_t>(3, units.size()); ++k) gathered += units[k];
  // The accumulator arena is one buffer that only grows (StepImpl::grow_arena) to its largest use: a gradient group
  // (the largest unit, plus one merge buffer) or the CP key side of an attention backward (cp_key_side). A growth
  // allocates the new buffer before it frees the old one, and the key side's first use comes between gradient groups
  // (the arena grows to it from a group's size, or from it to a larger group's): both are live at that moment, so
  // the key side is its own part, on top of the gradient groups'.
  const double group = pb.unit_arena.empty() ? 0 : *std::max_element(pb.unit_arena.begin(), pb.unit_arena.end()) +
                                                       pb.max_shard;
  const CpKeySide ks = cp_key_side(in);
  const double arena = std::max(group, ks.acc / abd);

  // routed rows an expert owner computes per MoE layer (capacity assumption, capped by what its ep group can send)
  const double R = std::min(ep * N * std::min(K, Eloc), kEpCapacity * N * K);
  const double P = static_cast<double>(cfg.payload_dim());
  double acts = 0, widest = 0, routed = 0;
  for (int64_t i = 0; i < cfg.layers; ++i) {
    double w = N * layer_row_elems(cfg, i);  // the gathered KV of the rank's sequences: cp_key_side
    if (cfg.is_moe_layer(i)) {
      const double r = R * (4 * d + 5 * F) + 2 * (N * K + R) * d;  // expert blocks, dispatch/combine buffers
      w += r;
      routed = std::max(routed, r);
    }
    widest = std::max(widest, w);
    acts += w;
  }
  const double xsave = (L + 1) * N * d;
  const double saved = run.recompute ? xsave + widest : xsave + acts;
  // one layer's backward (its activation gradients, at most half its saved state with its gathered KV) and the dx
  // buffers
  const double work = (widest + N * cp * P) / 2 + routed + 4 * N * d;
  const double ce = std::min<double>(static_cast<double>(run.token_chunk), N) *
                        static_cast<double>(std::min(cfg.vocab_chunk, cfg.vocab)) * 2 + N * (d + 2);

  MemoryEstimate e;
  e.ranks = m.world();
  e.per_rank = {
      {"shards+AdamW", pb.shards},
      {"gathered units", gathered * ebd},
      {"accumulators", group * abd},
      {"CP key side", ks.acc},
      // the gathered KV: every layer's (kept for its backward) or, with recompute, the recomputed layer's; and the
      // forward's gather buffer
      {"gathered KV", (run.recompute ? 1.0 : L) * ks.kv + ks.gather},
      // + document starts; DSA: every layer's selection, kept for the backward even under full recompute (int32)
      {"activations", (saved + work + ce) * ebd + N * (run.docs_per_seq > 1 ? 32 : 16) +
                          (cfg.dsa() ? 4.0 * static_cast<double>(L) * N * static_cast<double>(cfg.dsa_topk) : 0)},
      {"staging", 8.0 * 2 * static_cast<double>(in.eager_bytes) + N * 32 + 64 * 1024},
      {"stack", static_cast<double>(in.stack_bytes)},
  };
  if (in.lower_exact_sum)  // the packed words of the largest lowered reduction (the arena's accumulators)
    e.per_rank.push_back({"lowering scratch", arena * 8.0 * static_cast<double>(exact_lowering::words_per_element(
                                                                cfg.policy == Policy::fp64 ? DataType::exact_f64
                                                                                           : DataType::exact_f32))});
  const double steps = static_cast<double>(run.steps);
  e.host = {
      {"program", kProgramBytes},
      {"initial parameters", pb.params * ebd},
      {"batches", steps * static_cast<double>(run.sequences) * S * 8},
  };
  if (in.keep_tensors) e.host.push_back({"kept tensors", 2 * steps * pb.params * ebd});
  if (in.check_reference) {
    const MemoryEstimate ref = estimate_train(cfg, run, false);
    e.host.push_back({"reference check", ref.rank_bytes()});
  }
  return e;
}

double available_memory() { return platform::available_memory_bytes(); }

double parse_bytes(const std::string& s) {
  static const std::map<std::string, double> units = {
      {"", 1},          {"B", 1},         {"KiB", 1024.0},  {"MiB", 1024.0 * 1024},
      {"GiB", 1024.0 * 1024 * 1024},      {"TiB", 1024.0 * 1024 * 1024 * 1024},
      {"KB", 1e3},      {"MB", 1e6},      {"GB", 1e9},      {"TB", 1e12}};
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  std::string num = s.substr(0, i), unit = s.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  const auto u = units.find(unit);
  double v = 0;
  bool ok = !num.empty() && u != units.end() && std::count(num.begin(), num.end(), '.') <= 1 && num != ".";
  if (ok) {
    v = std::stod(num) * u->second;
    ok = std::isfinite(v) && v >= 1 && v < 1e21;
  }
  if (!ok)
    fail(fmt::format("--max-memory '{}': expected a byte count >= 1 with an optional unit B, KiB, MiB, GiB, TiB, KB, "
                     "MB, GB or TB (e.g. 8GiB)", s));
  return v;
}

void check_memory(const MemoryEstimate& est, double limit, const std::string& what) {
  const double need = est.total();
  if (limit > 0) {
    if (need > limit)
      fail(fmt::format("{}: the run needs an estimated {}, over --max-memory {} ({} bytes); estimate: {}", what,
                       format_bytes(need), format_bytes(limit), static_cast<long long>(limit), est.describe()));
    return;
  }
  const double avail = available_memory();
  if (avail > 0 && need > avail)
    fail(fmt::format("{}: the run needs an estimated {}, over the {} of memory available on this machine; estimate: "
                     "{} (a smaller batch, mesh or model fits; --max-memory sets the limit)",
                     what, format_bytes(need), format_bytes(avail), est.describe()));
}

}  // namespace trident::emu
