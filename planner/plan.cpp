// The planner's arithmetic (docs/planner.md gives every formula with its seed section).
#include "planner/plan.h"

#include <algorithm>
#include <numeric>

#include "reference/check.h"

namespace trident::planner {


const char* rule_text(PlacementRule r) {
  switch (r) {
    case kPlaceEpNvl: return "ep <= NVL";
    case kPlaceStraddle: return "groups do not straddle NVLink domains";
    case kPlaceFsdpCpNvl: return "fsdp*cp <= NVL";
  }
  return "?";
}

namespace {
// The search rules: {layout rule bit, 0} or {0, placement bit}, with the text the report and the JSON's "rejected"
// use (the layout rules in the planner's words: the world is fixed by the enumeration, seq_len is the context).
struct SearchRule {
  uint32_t layout, placement;
  const char* text;
};
constexpr SearchRule kSearchRules[kNumSearchRules] = {
    {rule_bit(LayoutRule::products), 0, "d_rep*fsdp*cp == e_fsdp*ep == world"},
    {rule_bit(LayoutRule::experts), 0, "experts % ep == 0"},
    {0, kPlaceEpNvl, "ep <= NVL"},
    {rule_bit(LayoutRule::zigzag), 0, "context % (2*cp) == 0"},
    {0, kPlaceStraddle, "groups do not straddle NVLink domains"},
    {0, kPlaceFsdpCpNvl, "fsdp*cp <= NVL"}};

// The first search rule `c` breaks among those that drop a mesh from the search (-1: none).
int first_search_rule(const MeshCheck& c, uint32_t placement_mask) {
  for (int i = 0; i < kNumSearchRules; ++i)
    if ((c.layout & kSearchRules[i].layout) || (c.placement & placement_mask & kSearchRules[i].placement)) return i;
  return -1;
}
}  // namespace

const char* search_rule_text(int i) { return kSearchRules[i].text; }

std::vector<std::string> failed_rule_texts(const MeshCheck& c) {
  std::vector<std::string> out;
  for (int i = 0; i < kNumLayoutRules; ++i)
    if (c.layout & rule_bit(LayoutRule(i))) out.push_back(rule_text(LayoutRule(i)));
  for (int i = 0; i < kNumPlacementRules; ++i)
    if (c.placement & (1u << i)) out.push_back(rule_text(PlacementRule(1u << i)));
  return out;
}

std::vector<std::string> placement_warnings(const PlanInput& in, const MeshShape& m, const MeshCheck& c) {
  std::vector<std::string> out;
  const int64_t nvl = in.cluster.nvl, fc = m.fsdp * m.cp;
  if (c.placement & kPlaceEpNvl)
    out.push_back(fmt::format("{} broken: ep = {} > NVL = {}: the EP all-to-all crosses RDMA, which the planner "
                              "does not model (its time is missing below; mesh.ep <= {} keeps it inside a domain)",
                              rule_text(kPlaceEpNvl), m.ep, nvl, nvl));
  if (c.placement & kPlaceStraddle)
    out.push_back(fmt::format(
        "{} broken: ep = {}, fsdp*cp = {}, cp = {}, NVL = {}: an NVLink domain must hold whole EP and dense groups, "
        "and a CP group wider than a domain must cover whole domains; groups cross domains in ways the planner "
        "does not model ({} GPUs used per domain; CP costed as {} in-domain x {} domains)",
        rule_text(kPlaceStraddle), m.ep, fc, m.cp, nvl, c.gpus_per_domain, c.cp_inner, c.cp_outer));
  if (c.placement & kPlaceFsdpCpNvl)
    out.push_back(fmt::format("{} broken: fsdp*cp = {} > NVL = {}: dense FSDP traffic crosses RDMA{} (costed below)",
                              rule_text(kPlaceFsdpCpNvl), fc, nvl,
                              c.cp_outer > 1 ? fmt::format(" and CP spans {} domains (2D CP {}x{}: KV all-gather "
                                                           "crosses RDMA on the critical path)",
                                                           c.cp_outer, c.cp_inner, c.cp_outer)
                                             : ""));
  return out;
}

MeshCheck check_mesh(const PlanInput& in, const MeshShape& m) {
  MeshCheck c;
  c.layout = broken_rules(m, layout_inputs(in));
  const int64_t nvl = in.cluster.nvl;
  const int64_t dense = m.fsdp * m.cp;
  const int64_t world = m.d_rep * dense;
  if (m.ep > nvl) c.placement |= kPlaceEpNvl;
  if (dense > nvl) c.placement |= kPlaceFsdpCpNvl;
  // Ranks fill domains in order (cp innermost, ep innermost). A domain holds gpus_per_domain ranks: the largest
  // multiple of every group that must stay inside it (ep; fsdp*cp, or cp, when they fit a domain).
  const int64_t unit = dense <= nvl ? dense : (m.cp <= nvl ? m.cp : 1);
  const int64_t l = std::lcm(std::min(m.ep, nvl), unit);
  c.gpus_per_domain = l <= nvl ? (nvl / l) * l : nvl;
  if (l > nvl) c.placement |= kPlaceStraddle;
  c.domains = (world + c.gpus_per_domain - 1) / c.gpus_per_domain;
  if (m.cp > nvl) {
    if (m.cp % c.gpus_per_domain != 0) {
      // CP groups straddle domains: costed (approximately) as if each spanned ceil(cp / gpus_per_domain) domains.
      c.placement |= kPlaceStraddle;
      c.cp_inner = c.gpus_per_domain;
      c.cp_outer = (m.cp + c.gpus_per_domain - 1) / c.gpus_per_domain;
    } else {
      c.cp_inner = c.gpus_per_domain;
      c.cp_outer = m.cp / c.gpus_per_domain;
    }
  } else {
    c.cp_inner = m.cp;
  }
  c.dense_spans = dense > nvl;
  c.expert_spans = m.e_fsdp > 1 && c.domains > 1;
  return c;
}

CpTraffic cp_traffic(double kv_bytes, int64_t cp, int64_t cp_inner, int64_t cp_outer, double passes) {
  CpTraffic t;
  t.rdma = kv_bytes * double(cp_outer - 1) / double(cp) * passes;
  t.nvlink = kv_bytes * double(cp_inner - 1) / double(cp_inner) * passes;
  return t;
}

Plan evaluate(const PlanInput& in, const MeshShape& m, const MeshCheck& chk) {
  const auto& mo = in.model;
  const auto& cl = in.cluster;
  const auto& wl = in.workload;
  const double P = mo.params, L = double(mo.layers), d = double(mo.hidden), E = double(mo.experts);
  const double f = mo.dense_fraction;
  const double ep = double(m.ep), efsdp = double(m.e_fsdp), dense_group = double(m.fsdp * m.cp);
  Plan p;
  p.tokens_per_gpu = double(wl.context) * double(wl.sequences_per_cp_group) / double(m.cp);

  // Dynamic memory per token (seed 000, "接下来算算动态显存占用").
  p.ckpt_bytes_per_token = L * d * 2.0;
  p.indexer_bytes_per_token = double(mo.sparse_index_layers) * double(mo.sparse_topk) * 4.0;
  p.ep_buffer_bytes_per_token = (2.0 * d + 4.0 * E) * ep;
  p.recompute_bytes_per_token = wl.recompute_bwd_mb_per_token * 1e6;
  p.dynamic_bytes_per_token =
      p.ckpt_bytes_per_token + p.indexer_bytes_per_token + p.ep_buffer_bytes_per_token + p.recompute_bytes_per_token;

  // Static memory (18 B/param) and FSDP buffers (bf16 current + bf16 prefetch + fp32 grad = 8 B/param of a layer).
  p.static_dense = P * f * mo.static_bytes_per_param / dense_group;
  p.static_expert = P * (1.0 - f) * mo.static_bytes_per_param / (efsdp * ep);
  p.static_total = p.static_dense + p.static_expert;
  p.activations = p.tokens_per_gpu * p.dynamic_bytes_per_token;
  p.params_per_layer = P / L;
  p.fsdp_buffers = p.params_per_layer * (f + (1.0 - f) / ep) * (2.0 + 2.0 + 4.0);
  p.dynamic = p.activations + p.fsdp_buffers;
  p.total = p.static_total + p.dynamic;
  p.capacity = cl.gpu_memory_gb * 1e9;
  p.headroom = p.capacity - p.total;
  p.fits = p.total <= p.capacity;

  // eFSDP communication per layer (seed 000, "eFSDP 通信掩盖"): worst case (n-1)/n -> 1.
  p.expert_layer_bytes = p.params_per_layer * (1.0 - f) * 2.0 / ep;
  p.expert_traffic = m.e_fsdp > 1 ? p.expert_layer_bytes * (1.0 + 1.0 + 2.0) : 0.0;
  p.dense_traffic = m.fsdp * m.cp > 1 ? p.params_per_layer * f * (2.0 + 2.0 + 4.0) : 0.0;
  const double expert_ring = (efsdp - 1.0) / efsdp, dense_ring = (dense_group - 1.0) / dense_group;
  p.efsdp_rdma_bytes = (chk.expert_spans ? p.expert_traffic : 0.0) + (chk.dense_spans ? p.dense_traffic : 0.0);
  p.efsdp_rdma_bytes_ring = (chk.expert_spans ? p.expert_traffic * expert_ring : 0.0) +
                            (chk.dense_spans ? p.dense_traffic * dense_ring : 0.0);
  p.fsdp_nvlink_bytes = (chk.expert_spans ? 0.0 : p.expert_traffic) + (chk.dense_spans ? 0.0 : p.dense_traffic);
  const double rdma_Bps = cl.rdma_GBps * 1e9, nvlink_Bps = cl.nvlink_GBps * 1e9;
  p.efsdp_rdma_s = p.efsdp_rdma_bytes / rdma_Bps;
  p.efsdp_rdma_s_ring = p.efsdp_rdma_bytes_ring / rdma_Bps;
  p.fsdp_nvlink_s = p.fsdp_nvlink_bytes / nvlink_Bps;

  // Compute per layer: 8 FLOP per active parameter per token with full recompute.
  p.active_params_per_layer = p.params_per_layer * (f + (1.0 - f) * double(mo.top_k) / E);
  p.flops_per_token = 8.0 * p.active_params_per_layer;
  p.flops_per_token_with_attn = p.flops_per_token * (1.0 + wl.attn_to_linear);
  p.achieved_flops = cl.peak_tflops * 1e12 * cl.mfu;
  p.layer_compute_s = p.tokens_per_gpu * p.flops_per_token_with_attn / p.achieved_flops;
  const double comm_s = std::max(p.efsdp_rdma_s, p.fsdp_nvlink_s);
  p.min_tokens_to_hide = p.achieved_flops * comm_s / p.flops_per_token_with_attn;
  p.hidden = p.tokens_per_gpu >= p.min_tokens_to_hide;

  // All-gather-KV CP (seed 000, "2D CP"): AG fwd + AG bwd (bf16) + RS bwd (fp32) = 1 + 1 + 2.
  p.kv_bytes = double(wl.context) * double(wl.sequences_per_cp_group) * mo.kv_latent_bytes_per_token;
  const CpTraffic cpt = cp_traffic(p.kv_bytes, m.cp, chk.cp_inner, chk.cp_outer, kCpPasses);
  p.cp_rdma_bytes = cpt.rdma;
  p.cp_nvlink_bytes = cpt.nvlink;
  p.cp_rdma_s = p.cp_rdma_bytes / rdma_Bps;
  p.cp_rdma_share = p.layer_compute_s > 0 ? p.cp_rdma_s / p.layer_compute_s : 0.0;
  p.rdma_bytes_per_layer = p.efsdp_rdma_bytes + p.cp_rdma_bytes;
  // EP all-to-all (planner addition): every local token's hidden row goes to each of its top-k experts (dispatch)
  // and comes back (combine) in the forward and again in the recomputed forward (full recompute, as the FLOP count
  // assumes), and the backward moves the gradients of both: 6 passes of T x K x d bf16.
  p.ep_a2a_bytes = p.tokens_per_gpu * double(mo.top_k) * double(mo.hidden) * 2.0 * 6.0;

  p.naive_logits_bytes = naive_logits_bytes(p.tokens_per_gpu, double(mo.vocab));
  return p;
}

// ---- search ---------------------------------------------------------------------------------------------------
namespace {

bool in_range(const PlanInput& in, const Plan& p) {
  return p.tokens_per_gpu >= double(in.recipe.local_seq_min) && p.tokens_per_gpu <= double(in.recipe.local_seq_max);
}

void divisors(int64_t n, std::vector<int64_t>& out) {
  out.clear();
  std::vector<int64_t> hi;
  for (int64_t i = 1; i * i <= n; ++i)
    if (n % i == 0) {
      out.push_back(i);
      if (i != n / i) hi.push_back(n / i);
    }
  out.insert(out.end(), hi.rbegin(), hi.rend());
}

}  // namespace

bool better(const PlanInput& in, const Candidate& a, const Candidate& b) {
  const Plan &x = a.plan, &y = b.plan;
  if (x.fits != y.fits) return x.fits;
  if (!x.fits && x.total != y.total) return x.total < y.total;  // neither fits: closest to fitting first
  if (x.hidden != y.hidden) return x.hidden;
  if (x.rdma_bytes_per_layer != y.rdma_bytes_per_layer) return x.rdma_bytes_per_layer < y.rdma_bytes_per_layer;
  const bool rx = in_range(in, x), ry = in_range(in, y);
  if (rx != ry) return rx;
  if (a.mesh.world() != b.mesh.world()) return a.mesh.world() < b.mesh.world();
  if (x.headroom != y.headroom) return x.headroom > y.headroom;
  if (a.mesh.cp != b.mesh.cp) return a.mesh.cp < b.mesh.cp;
  if (a.mesh.ep != b.mesh.ep) return a.mesh.ep < b.mesh.ep;
  return a.mesh.fsdp < b.mesh.fsdp;
}

std::string wins_on(const PlanInput& in, const Candidate& a, const Candidate& b) {
  const Plan &x = a.plan, &y = b.plan;
  if (x.fits != y.fits) return x.fits ? "fits memory" : "";
  if (!x.fits && x.total != y.total)
    return x.total < y.total ? fmt::format("needs less memory ({:.2f} vs {:.2f} GB)", x.total / 1e9, y.total / 1e9)
                             : "";
  if (x.hidden != y.hidden) return x.hidden ? "eFSDP hidden" : "";
  if (x.rdma_bytes_per_layer != y.rdma_bytes_per_layer)
    return x.rdma_bytes_per_layer < y.rdma_bytes_per_layer
               ? fmt::format("fewer RDMA bytes per layer ({:.3f} vs {:.3f} GB)", x.rdma_bytes_per_layer / 1e9,
                             y.rdma_bytes_per_layer / 1e9)
               : "";
  const bool rx = in_range(in, x), ry = in_range(in, y);
  if (rx != ry) return rx ? "local sequence inside the recipe range" : "";
  if (a.mesh.world() != b.mesh.world()) return a.mesh.world() < b.mesh.world() ? "fewer GPUs" : "";
  if (x.headroom != y.headroom)
    return x.headroom > y.headroom
               ? fmt::format("more headroom ({:.2f} vs {:.2f} GB)", x.headroom / 1e9, y.headroom / 1e9)
               : "";
  return better(in, a, b) ? "tie-break (smaller cp, ep, fsdp)" : "";
}

SearchResult search(const PlanInput& in, int64_t world_lo, int64_t world_hi) {
  TD_CHECK(world_lo >= 1 && world_lo <= world_hi, "world range {}:{} is empty or not positive", world_lo, world_hi);
  TD_CHECK(world_hi - world_lo <= 1'000'000, "world range {}:{} is too wide (at most 1,000,000 sizes)", world_lo,
           world_hi);
  SearchResult r;
  std::vector<Candidate> strict, relaxed;
  std::vector<int64_t> divs, sub;
  const size_t keep = 64;  // candidates kept per list (the report prints the top few)
  auto cmp = [&](const Candidate& a, const Candidate& b) { return better(in, a, b); };
  auto push = [&](std::vector<Candidate>& v, Candidate&& c) {
    v.push_back(std::move(c));
    if (v.size() >= 8 * keep) {
      std::partial_sort(v.begin(), v.begin() + keep, v.end(), cmp);
      v.resize(keep);
    }
  };
  for (int64_t w = world_lo; w <= world_hi; ++w) {
    r.worlds.push_back(w);
    divisors(w, divs);
    for (int64_t cp : divs) {
      divisors(w / cp, sub);
      for (int64_t fsdp : sub) {
        const int64_t d_rep = w / (cp * fsdp);
        for (int64_t ep : divs) {
          const MeshShape m{d_rep, fsdp, cp, w / ep, ep};
          ++r.considered;
          MeshCheck chk = check_mesh(in, m);
          if (!chk.ranked()) {
            const int rule = first_search_rule(chk, kUnrankedPlacement);
            TD_CHECK(rule >= 0, "search: mesh {} breaks layout rules {:#x} the planner does not check", m.str(),
                     chk.layout);
            ++r.rejected[rule];
            continue;
          }
          Candidate c{m, chk, evaluate(in, m, chk)};
          push(chk.nvlink_ok() ? strict : relaxed, std::move(c));
        }
      }
    }
  }
  const bool strict_fits = std::any_of(strict.begin(), strict.end(), [](const Candidate& c) { return c.plan.fits; });
  const bool relaxed_fits =
      std::any_of(relaxed.begin(), relaxed.end(), [](const Candidate& c) { return c.plan.fits; });
  r.ranked = std::move(strict);
  if (!strict_fits && relaxed_fits) {
    r.relaxed = true;
    r.ranked.insert(r.ranked.end(), relaxed.begin(), relaxed.end());
  } else {
    r.rejected[kNumSearchRules - 1] += int64_t(relaxed.size());  // fsdp*cp <= NVL
  }
  std::sort(r.ranked.begin(), r.ranked.end(), cmp);
  if (r.ranked.size() > keep) r.ranked.resize(keep);
  return r;
}

int64_t search_count(const PlanInput& in, int64_t world, Candidate* best) {
  std::vector<int64_t> divs, sub;
  divisors(world, divs);
  int64_t n = 0;
  bool have = false;
  for (int64_t cp : divs) {
    divisors(world / cp, sub);
    for (int64_t fsdp : sub) {
      const int64_t d_rep = world / (cp * fsdp);
      for (int64_t ep : divs) {
        Candidate c;
        c.mesh = MeshShape{d_rep, fsdp, cp, world / ep, ep};
        c.check = check_mesh(in, c.mesh);
        if (!c.check.nvlink_ok()) continue;  // every rule, strictly
        c.plan = evaluate(in, c.mesh, c.check);
        ++n;
        if (!have || better(in, c, *best)) {
          *best = c;
          have = true;
        }
      }
    }
  }
  return n;
}

// ---- recipe ---------------------------------------------------------------------------------------------------
int64_t default_recipe_ep(const PlanInput& in, int64_t world) {
  const int64_t nvl = in.cluster.nvl, E = in.model.experts;
  if (nvl == 8 && E % 8 == 0 && world % 8 == 0) return 8;
  for (int64_t e = std::min(nvl, world); e >= 1; --e)
    if (E % e == 0 && world % e == 0) return e;
  return 1;
}

Recommendation recommend(const PlanInput& in, int64_t world) {
  Recommendation rec;
  const int64_t nvl = in.cluster.nvl;
  const int64_t ep = in.recipe.ep ? in.recipe.ep : default_recipe_ep(in, world);
  rec.ep = ep;
  rec.lines.push_back(
      in.recipe.ep ? fmt::format("EP = {}: fixed first, as told (recipe.ep)", ep)
                   : fmt::format("EP = {}: fixed first (recipe step 1: {}); the all-to-all stays inside one "
                                 "NVLink domain of {}",
                                 ep, nvl == 8 ? "8 on 8-GPU nodes" : "the largest divisor of experts that fits one domain",
                                 nvl));
  if (world % ep != 0) {
    rec.lines.push_back(fmt::format("world = {} is not a multiple of EP = {}: no recipe mesh", world, ep));
    return rec;
  }
  const double seq_tokens = double(in.workload.context) * double(in.workload.sequences_per_cp_group);
  std::vector<int64_t> divs, sub;
  divisors(world, divs);
  const int64_t lo = in.recipe.local_seq_min, hi = in.recipe.local_seq_max;
  auto local = [&](int64_t cp) { return seq_tokens / double(cp); };
  // Phases: 0 = CP in range, NVLink rules kept; 1 = CP beyond range (local < min), rules kept;
  // 2 = fsdp*cp > NVL allowed (dense FSDP / 2D CP over RDMA), CP in range; 3 = same, any CP.
  for (int phase = 0; phase < 4 && !rec.found; ++phase) {
    for (int64_t cp : divs) {
      const double ls = local(cp);
      const bool ok_range = ls >= double(lo) && ls <= double(hi);
      if ((phase == 0 || phase == 2) && !ok_range) continue;
      if ((phase == 1) && !(ls < double(lo))) continue;
      divisors(world / cp, sub);
      double least = -1;  // smallest total among this CP's meshes that break no rule of this phase
      for (int64_t fsdp : sub) {
        const MeshShape m{world / (cp * fsdp), fsdp, cp, world / ep, ep};
        MeshCheck chk = check_mesh(in, m);
        if (!chk.ranked()) continue;
        if (phase < 2 && !chk.nvlink_ok()) continue;
        Plan p = evaluate(in, m, chk);
        if (least < 0 || p.total < least) least = p.total;
        if (!p.fits) continue;
        rec.found = true;
        rec.mesh = m;
        rec.lines.push_back(fmt::format("CP = {}: local sequence {:.0f} tokens per GPU (target {}-{}){}", cp, ls, lo,
                                        hi, ok_range ? "" : ", outside the target"));
        if (phase == 1) {
          rec.memory_forced = true;
          rec.lines.push_back(fmt::format(
              "memory forces CP beyond the target: no CP with a {}-{} local sequence fits {:.0f} GB", lo, hi,
              in.cluster.gpu_memory_gb));
        }
        if (phase >= 2) {
          rec.memory_forced = true;
          rec.lines.push_back(fmt::format(
              "memory forces fsdp*cp = {} > NVL = {}: {} (no mesh that keeps fsdp*cp <= NVL fits)", fsdp * cp, nvl,
              chk.cp_outer > 1 ? fmt::format("2D CP {}x{} (KV all-gather crosses RDMA: +{:.1f} ms per layer, "
                                             "{:.1f}% of layer compute)",
                                             chk.cp_inner, chk.cp_outer, p.cp_rdma_s * 1e3, p.cp_rdma_share * 100)
                               : "dense FSDP traffic crosses RDMA"));
        }
        rec.lines.push_back(fmt::format(
            "FSDP = {}, d_rep = {}: dense params sharded over fsdp x cp = {}{}; expert mesh (e_fsdp, ep) = ({}, {})",
            fsdp, m.d_rep, fsdp * cp, fsdp > 1 ? " (fsdp > 1 because memory needs it)" : "", m.e_fsdp, ep));
        rec.lines.push_back(fmt::format("memory: {:.2f} of {:.0f} GB ({:.2f} GB headroom)", p.total / 1e9,
                                        in.cluster.gpu_memory_gb, p.headroom / 1e9));
        rec.lines.push_back(
            p.hidden ? fmt::format("eFSDP hidden: {:.0f} tokens per GPU >= {:.0f} needed", p.tokens_per_gpu,
                                   p.min_tokens_to_hide)
                     : fmt::format("eFSDP NOT hidden: {:.0f} tokens per GPU < {:.0f} needed (raise "
                                   "sequences_per_cp_group or use a smaller CP)",
                                   p.tokens_per_gpu, p.min_tokens_to_hide));
        break;
      }
      if (!rec.found && phase == 0 && least >= 0)
        rec.lines.push_back(fmt::format("CP = {} (local sequence {:.0f}) does not fit: needs at least {:.2f} GB > {:.0f} GB",
                                        cp, ls, least / 1e9, in.cluster.gpu_memory_gb));
      if (rec.found) break;
    }
  }
  rec.lines.push_back("TP: not used (the recipe: off unless a model or hardware constraint needs it)");
  if (rec.found) {
    rec.lines.push_back("PP: not used (the recipe: PP=2 only when memory needs headroom; it does not here)");
  } else {
    rec.memory_forced = true;
    rec.lines.push_back(fmt::format(
        "no mesh of {} GPUs with EP = {} fits {:.0f} GB: memory would force something else (the recipe: PP=2 for "
        "headroom, or more GPUs, or a shorter recompute transient)",
        world, ep, in.cluster.gpu_memory_gb));
    rec.lines.push_back("PP: would be needed (PP=2) unless the cluster grows");
  }
  return rec;
}

}  // namespace trident::planner
