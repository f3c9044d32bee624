// Rendering: text breakdown, JSON and SVG. Units: 1 GB = 1e9 B, 1 MB = 1e6 B, times in ms.
#include "planner/report.h"
#include "reference/xml_escape.h"

#include <algorithm>
#include <cmath>

#include "reference/check.h"

namespace trident::planner {
namespace {

std::string grouped(double v) {  // 16384 -> "16,384"
  const bool neg = v < 0;
  auto n = static_cast<long long>(std::llround(std::fabs(v)));
  std::string s = std::to_string(n), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return neg ? "-" + out : out;
}
std::string gb(double b) { return fmt::format("{:.3f} GB", b / 1e9); }
std::string mb(double b) { return fmt::format("{:.3f} MB", b / 1e6); }
std::string ms(double s) { return fmt::format("{:.2f} ms", s * 1e3); }
std::string num(double v) {  // compact number for formulas: 753e9 -> 753e9, 0.02 -> 0.02
  if (v >= 1e6 && std::fabs(v / 1e9 - std::round(v / 1e9)) < 1e-9) return fmt::format("{}e9", std::round(v / 1e9));
  return fmt::format("{}", v);
}

struct Table {
  std::string out;
  void head(const std::string& h) { out += "\n" + h + "\n"; }
  void row(const std::string& name, const std::string& formula, const std::string& value) {
    out += fmt::format("  {:<26} {:<72} {:>14}\n", name, formula, value);
  }
  void note(const std::string& s) { out += "  " + s + "\n"; }
};

}  // namespace

std::string mesh_str(const MeshShape& m) {
  return fmt::format("(d_rep,fsdp,cp)=({},{},{}) x (e_fsdp,ep)=({},{})", m.d_rep, m.fsdp, m.cp, m.e_fsdp, m.ep);
}

std::string render_text(const PlanInput& in, const MeshShape& m, const MeshCheck& chk, const Plan& p) {
  const auto& mo = in.model;
  const auto& cl = in.cluster;
  const auto& wl = in.workload;
  Table t;
  t.out = fmt::format("trident plan{}: {} params, {} layers, hidden {}, {} experts top-{}, dense {}; context {}\n",
                      cl.name.empty() ? "" : " [" + cl.name + "]", num(mo.params), mo.layers, mo.hidden, mo.experts,
                      mo.top_k, mo.dense_fraction, grouped(double(wl.context)));
  t.out += fmt::format("mesh {} on {} GPUs: {} NVLink domain(s) of {}, {} GPUs used per domain\n", mesh_str(m),
                       m.world(), chk.domains, cl.nvl, chk.gpus_per_domain);
  if (chk.nvlink_ok()) {
    t.out += "NVLink rules hold: ep <= NVL, fsdp*cp <= NVL, no group straddles a domain\n";
  } else {
    std::vector<std::string> broken;
    for (int i = 0; i < kNumPlacementRules; ++i)
      if (chk.placement & (1u << i)) broken.push_back(rule_text(PlacementRule(1u << i)));
    t.out += fmt::format("NVLink placement rule(s) broken, see the warnings: {} (costed below where modelled)\n",
                         fmt::join(broken, ", "));
  }

  t.head("Per-GPU dynamic memory per token");
  t.row("tokens per GPU", fmt::format("context x sequences_per_cp_group / cp = {} x {} / {}", wl.context,
                                      wl.sequences_per_cp_group, m.cp),
        grouped(p.tokens_per_gpu));
  t.row("layer checkpoints", fmt::format("layers x hidden x 2 B (bf16) = {} x {} x 2", mo.layers, mo.hidden),
        mb(p.ckpt_bytes_per_token));
  t.row("saved indexer top-k", fmt::format("sparse_index_layers x sparse_topk x 4 B (int32) = {} x {} x 4",
                                           mo.sparse_index_layers, mo.sparse_topk),
        mb(p.indexer_bytes_per_token));
  t.row("EP buffer (worst case)",
        fmt::format("(2 x hidden + 4 x experts) B x ep = {} B x {} (all EP ranks send here)",
                    grouped(2.0 * double(mo.hidden) + 4.0 * double(mo.experts)), m.ep),
        mb(p.ep_buffer_bytes_per_token));
  t.row("recompute + backward", "input: recompute_bwd_mb_per_token", mb(p.recompute_bytes_per_token));
  t.row("sum per token", "", mb(p.dynamic_bytes_per_token));

  t.head("Per-GPU memory (1 GB = 1e9 B)");
  t.row("activations", fmt::format("tokens per GPU x sum per token = {} x {}", grouped(p.tokens_per_gpu),
                                   mb(p.dynamic_bytes_per_token)),
        gb(p.activations));
  t.row("FSDP buffers", fmt::format("params/layers x (dense + expert/ep) x (2+2+4) B = {:.4g} x ({} + {}/{}) x 8",
                                    p.params_per_layer, mo.dense_fraction, 1 - mo.dense_fraction, m.ep),
        gb(p.fsdp_buffers));
  t.row("dynamic", "activations + FSDP buffers", gb(p.dynamic));
  t.row("static, dense share", fmt::format("params x dense x {} B / (fsdp x cp) = {} x {} x {} / {}",
                                           mo.static_bytes_per_param, num(mo.params), mo.dense_fraction,
                                           mo.static_bytes_per_param, m.fsdp * m.cp),
        gb(p.static_dense));
  t.row("static, expert share", fmt::format("params x (1 - dense) x {} B / (e_fsdp x ep) = ... / {}",
                                            mo.static_bytes_per_param, m.e_fsdp * m.ep),
        gb(p.static_expert));
  t.row("static", "fp32 master 4 + Adam 4+4 + fp32 grad 4 + bf16 weight 2 B/param", gb(p.static_total));
  t.row("total", "static + dynamic", gb(p.total));
  t.row("headroom", fmt::format("gpu_memory - total = {} GB - total", cl.gpu_memory_gb), gb(p.headroom));
  t.note(p.fits ? "-> fits" : "-> DOES NOT FIT");

  t.head("FSDP communication per layer (eFSDP overlap; worst case (n-1)/n -> 1, ring volume beside it)");
  t.row("expert layer, this rank", fmt::format("params/layers x (1 - dense) x 2 B / ep = ... / {}", m.ep),
        gb(p.expert_layer_bytes));
  t.row("expert traffic", fmt::format("x (1 AG fwd + 1 AG bwd + 2 fp32 RS){}", m.e_fsdp > 1 ? "" : " (e_fsdp = 1: none)"),
        gb(p.expert_traffic));
  t.row("dense traffic", "params/layers x dense x (2+2+4) B", gb(p.dense_traffic));
  t.note(fmt::format("expert FSDP group (e_fsdp = {}) {}; dense group (fsdp x cp = {}) {}", m.e_fsdp,
                     chk.expert_spans ? "spans NVLink domains -> RDMA" : "stays inside NVLink", m.fsdp * m.cp,
                     chk.dense_spans ? "spans NVLink domains -> RDMA" : "stays inside NVLink"));
  t.row("RDMA bytes (worst case)", "traffic of the groups that span domains", gb(p.efsdp_rdma_bytes));
  t.row("RDMA bytes (ring)", fmt::format("same x (n-1)/n: expert ({}-1)/{}, dense ({}-1)/{}", m.e_fsdp, m.e_fsdp,
                                         m.fsdp * m.cp, m.fsdp * m.cp),
        gb(p.efsdp_rdma_bytes_ring));
  t.row("eFSDP RDMA time", fmt::format("RDMA bytes / {} GB/s (ring: {})", cl.rdma_GBps, ms(p.efsdp_rdma_s_ring)),
        ms(p.efsdp_rdma_s));
  t.row("FSDP NVLink time", fmt::format("in-domain traffic {} / {} GB/s (concurrent with RDMA)",
                                        gb(p.fsdp_nvlink_bytes), cl.nvlink_GBps),
        ms(p.fsdp_nvlink_s));

  t.head("Compute and overlap per layer");
  t.row("active params per layer", fmt::format("params/layers x (dense + (1-dense) x top_k/experts) = ... x {}/{}",
                                               mo.top_k, mo.experts),
        grouped(p.active_params_per_layer));
  t.row("FLOP per token", "8 x active (fwd 2 + recompute 2 + dgrad 2 + wgrad 2)",
        fmt::format("{:.3f} GFLOP", p.flops_per_token / 1e9));
  t.row("with attention", fmt::format("x (1 + attn_to_linear) = x (1 + {})", wl.attn_to_linear),
        fmt::format("{:.3f} GFLOP", p.flops_per_token_with_attn / 1e9));
  t.row("achieved FLOP/s", fmt::format("peak x mfu = {} TFLOP/s x {}", cl.peak_tflops, cl.mfu),
        fmt::format("{:.3f} PFLOP/s", p.achieved_flops / 1e15));
  t.row("layer compute time", "tokens per GPU x FLOP per token (with attention) / achieved", ms(p.layer_compute_s));
  t.row("min tokens to hide eFSDP", "achieved x max(RDMA time, NVLink time) / FLOP per token (with attention)",
        grouped(p.min_tokens_to_hide));
  t.note(p.hidden ? fmt::format("-> eFSDP hidden: {} tokens per GPU >= {}", grouped(p.tokens_per_gpu),
                                grouped(p.min_tokens_to_hide))
                  : fmt::format("-> eFSDP NOT hidden: {} tokens per GPU < {}", grouped(p.tokens_per_gpu),
                                grouped(p.min_tokens_to_hide)));

  t.head("Context parallel (all-gather KV) per layer (2D CP when cp spans several NVLink domains)");
  if (mo.kv_latent_bytes_per_token <= 0) {
    t.note("model.kv_latent_bytes_per_token not given: CP traffic not computed");
  } else {
    t.row("KV of the sequence", fmt::format("context x sequences x {} B/token", mo.kv_latent_bytes_per_token),
          gb(p.kv_bytes));
    t.note(chk.cp_outer > 1
               ? fmt::format("2D CP: cp = {} = {} in-domain x {} domains", m.cp, chk.cp_inner, chk.cp_outer)
               : fmt::format("cp = {} inside one NVLink domain: no CP traffic on RDMA", m.cp));
    t.row("CP RDMA bytes", fmt::format("KV x (cp_outer-1)/cp x (1+1+2) = KV x {}/{} x 4", chk.cp_outer - 1, m.cp),
          gb(p.cp_rdma_bytes));
    t.row("CP RDMA time", fmt::format("CP RDMA bytes / {} GB/s (on the critical path)", cl.rdma_GBps), ms(p.cp_rdma_s));
    t.row("share of layer time", "CP RDMA time / layer compute time", fmt::format("{:.2f}%", p.cp_rdma_share * 100));
    t.row("CP NVLink bytes", fmt::format("KV x (cp_inner-1)/cp_inner x 4 = KV x {}/{} x 4", chk.cp_inner - 1,
                                         chk.cp_inner),
          gb(p.cp_nvlink_bytes));
  }
  t.row("RDMA bytes per layer", "eFSDP RDMA + CP RDMA (what the search minimises)", gb(p.rdma_bytes_per_layer));

  if (mo.vocab > 0) {
    t.head("Linear cross-entropy (logits never materialised)");
    t.row("naive fp32 logits", fmt::format("tokens per GPU x vocab x 4 B = {} x {} x 4", grouped(p.tokens_per_gpu),
                                           grouped(double(mo.vocab))),
          gb(p.naive_logits_bytes));
    t.note("linear CE never materialises these logits (vocab and token chunks with an online log-sum-exp)");
  }
  return t.out;
}

nlohmann::json plan_json(const PlanInput& in, const MeshShape& m, const MeshCheck& chk, const Plan& p) {
  nlohmann::json j;
  j["mesh"] = {{"d_rep", m.d_rep}, {"fsdp", m.fsdp}, {"cp", m.cp}, {"e_fsdp", m.e_fsdp}, {"ep", m.ep}};
  j["world"] = m.world();
  j["nvlink_rules_ok"] = chk.nvlink_ok();
  j["rules_failed"] = failed_rule_texts(chk);
  j["warnings"] = placement_warnings(in, m, chk);
  j["gpus_per_domain"] = chk.gpus_per_domain;
  j["domains"] = chk.domains;
  j["cp_inner"] = chk.cp_inner;
  j["cp_outer"] = chk.cp_outer;
  j["two_d_cp"] = chk.cp_outer > 1;
  j["tokens_per_gpu"] = p.tokens_per_gpu;
  j["per_token_mb"] = {{"layer_checkpoints", p.ckpt_bytes_per_token / 1e6},
                       {"indexer_topk", p.indexer_bytes_per_token / 1e6},
                       {"ep_buffer_worst_case", p.ep_buffer_bytes_per_token / 1e6},
                       {"recompute_bwd", p.recompute_bytes_per_token / 1e6},
                       {"sum", p.dynamic_bytes_per_token / 1e6}};
  j["static_gb"] = p.static_total / 1e9;
  j["static_dense_gb"] = p.static_dense / 1e9;
  j["static_expert_gb"] = p.static_expert / 1e9;
  j["activations_gb"] = p.activations / 1e9;
  j["fsdp_buffers_gb"] = p.fsdp_buffers / 1e9;
  j["dynamic_gb"] = p.dynamic / 1e9;
  j["total_gb"] = p.total / 1e9;
  j["gpu_memory_gb"] = p.capacity / 1e9;
  j["headroom_gb"] = p.headroom / 1e9;
  j["fits"] = p.fits;
  j["params_per_layer"] = p.params_per_layer;
  j["active_params_per_layer"] = p.active_params_per_layer;
  j["flops_per_token_per_layer"] = p.flops_per_token;
  j["expert_layer_gb_per_rank"] = p.expert_layer_bytes / 1e9;
  j["expert_traffic_gb_per_layer"] = p.expert_traffic / 1e9;
  j["dense_traffic_gb_per_layer"] = p.dense_traffic / 1e9;
  j["expert_fsdp_crosses_rdma"] = chk.expert_spans;
  j["dense_fsdp_crosses_rdma"] = chk.dense_spans;
  j["efsdp_rdma_gb_per_layer"] = p.efsdp_rdma_bytes / 1e9;
  j["efsdp_rdma_gb_per_layer_ring"] = p.efsdp_rdma_bytes_ring / 1e9;
  j["efsdp_ms_per_layer"] = p.efsdp_rdma_s * 1e3;
  j["efsdp_ms_per_layer_ring"] = p.efsdp_rdma_s_ring * 1e3;
  j["fsdp_nvlink_gb_per_layer"] = p.fsdp_nvlink_bytes / 1e9;
  j["fsdp_nvlink_ms_per_layer"] = p.fsdp_nvlink_s * 1e3;
  j["layer_compute_ms"] = p.layer_compute_s * 1e3;
  j["min_tokens_to_hide"] = p.min_tokens_to_hide;
  j["hidden"] = p.hidden;
  j["cp_kv_gb_per_layer"] = p.kv_bytes / 1e9;
  j["cp_rdma_gb_per_layer"] = p.cp_rdma_bytes / 1e9;
  j["cp_rdma_ms_per_layer"] = p.cp_rdma_s * 1e3;
  j["cp_rdma_share"] = p.cp_rdma_share;
  j["cp_nvlink_gb_per_layer"] = p.cp_nvlink_bytes / 1e9;
  j["rdma_gb_per_layer"] = p.rdma_bytes_per_layer / 1e9;
  j["ep_a2a_gb_per_layer"] = p.ep_a2a_bytes / 1e9;
  if (in.model.vocab > 0)
    j["linear_ce"] = {{"vocab", in.model.vocab},
                      {"local_tokens", p.tokens_per_gpu},
                      {"naive_fp32_logits_gb", p.naive_logits_bytes / 1e9}};
  else
    j["linear_ce"] = nullptr;
  return j;
}

std::string render_recipe_text(const Recommendation& r, int64_t world) {
  std::string out = fmt::format("\nRecipe (EP -> CP -> PP: fix EP, CP for a 16K-32K local sequence, nothing else unless "
                                "memory says so) for {} GPUs\n",
                                world);
  if (r.found) out += fmt::format("  recommended mesh {}\n", mesh_str(r.mesh));
  for (const auto& l : r.lines) out += "  - " + l + "\n";
  return out;
}

nlohmann::json recipe_json(const Recommendation& r) {
  nlohmann::json j;
  j["found"] = r.found;
  j["ep"] = r.ep;
  if (r.found)
    j["mesh"] = {{"d_rep", r.mesh.d_rep}, {"fsdp", r.mesh.fsdp}, {"cp", r.mesh.cp}, {"e_fsdp", r.mesh.e_fsdp},
                 {"ep", r.mesh.ep}};
  else
    j["mesh"] = nullptr;
  j["memory_forced"] = r.memory_forced;
  j["tp"] = "not used";
  j["pp"] = r.found ? "not used" : "needed (PP=2) unless the cluster grows";
  j["advice"] = r.lines;
  return j;
}

namespace {
std::string why_line(const PlanInput& in, const Candidate& c) {
  const Plan& p = c.plan;
  std::string s = p.fits ? fmt::format("fits ({:.1f} of {:.0f} GB, {:.1f} free)", p.total / 1e9, p.capacity / 1e9,
                                       p.headroom / 1e9)
                         : fmt::format("FAILS memory ({:.1f} > {:.0f} GB)", p.total / 1e9, p.capacity / 1e9);
  s += p.hidden ? fmt::format("; eFSDP hidden ({} >= {} tokens)", grouped(p.tokens_per_gpu), grouped(p.min_tokens_to_hide))
                : fmt::format("; eFSDP NOT hidden ({} < {} tokens)", grouped(p.tokens_per_gpu),
                              grouped(p.min_tokens_to_hide));
  s += fmt::format("; {:.3f} GB RDMA/layer ({:.1f} ms)", p.rdma_bytes_per_layer / 1e9,
                   (p.efsdp_rdma_s + p.cp_rdma_s) * 1e3);
  s += fmt::format("; local seq {}", grouped(p.tokens_per_gpu));
  if (c.check.cp_outer > 1)
    s += fmt::format("; 2D CP {}x{} (+{:.1f} ms/layer, {:.1f}%)", c.check.cp_inner, c.check.cp_outer,
                     p.cp_rdma_s * 1e3, p.cp_rdma_share * 100);
  else if (c.check.dense_spans)
    s += "; dense FSDP over RDMA (fsdp*cp > NVL)";
  return s;
}
}  // namespace

std::string render_search_text(const PlanInput& in, const SearchResult& s, int top) {
  std::string out;
  const int64_t lo = s.worlds.empty() ? 0 : s.worlds.front(), hi = s.worlds.empty() ? 0 : s.worlds.back();
  out += fmt::format("\nSearch over world {}: {} meshes (d_rep,fsdp,cp) x (e_fsdp,ep) enumerated\n",
                     lo == hi ? fmt::format("{}", lo) : fmt::format("{}..{}", lo, hi), grouped(double(s.considered)));
  out += "  objective (lexicographic): fits memory > eFSDP hidden > fewest RDMA bytes per layer > local sequence in "
         "the recipe range > fewer GPUs > most headroom\n";
  for (int i = 0; i < kNumSearchRules; ++i)
    if (s.rejected[i])
      out += fmt::format("  rejected by rule {}: {}\n", search_rule_text(i), grouped(double(s.rejected[i])));
  if (s.relaxed)
    out += "  no mesh that keeps fsdp*cp <= NVL fits memory: memory forces dense FSDP / 2D CP across NVLink "
           "domains; those meshes are ranked below\n";
  if (s.ranked.empty()) {
    out += "  no valid mesh\n";
    return out;
  }
  const int n = std::min<int>(top, int(s.ranked.size()));
  for (int i = 0; i < n; ++i) {
    const auto& c = s.ranked[i];
    out += fmt::format("  #{} {}  world {}\n      {}\n", i + 1, mesh_str(c.mesh), c.mesh.world(), why_line(in, c));
    if (i == 0) {
      if (s.ranked.size() > 1) {
        std::string w = wins_on(in, c, s.ranked[1]);
        out += fmt::format("      wins: {}\n", w.empty() ? "equal on every criterion" : "beats #2 on " + w);
      }
    } else {
      std::string w = wins_on(in, s.ranked[0], c);
      out += fmt::format("      loses to #1 on: {}\n", w.empty() ? "nothing (tie)" : w);
    }
  }
  return out;
}

nlohmann::json search_json(const PlanInput& in, const SearchResult& s, int top) {
  nlohmann::json j;
  j["worlds"] = s.worlds.size() == 1 ? nlohmann::json(s.worlds[0])
                                     : nlohmann::json::array({s.worlds.front(), s.worlds.back()});
  j["considered"] = s.considered;
  j["relaxed"] = s.relaxed;
  nlohmann::json rej = nlohmann::json::object();
  for (int i = 0; i < kNumSearchRules; ++i) rej[search_rule_text(i)] = s.rejected[i];
  j["rejected"] = rej;
  j["objective"] = {"fits", "hidden", "fewest rdma bytes per layer", "local sequence in recipe range", "fewer gpus",
                    "most headroom"};
  nlohmann::json arr = nlohmann::json::array();
  const int n = std::min<int>(top, int(s.ranked.size()));
  for (int i = 0; i < n; ++i) {
    const auto& c = s.ranked[i];
    nlohmann::json e = plan_json(in, c.mesh, c.check, c.plan);
    e["rank"] = i + 1;
    e["why"] = why_line(in, c);
    if (i > 0) e["loses_to_first_on"] = wins_on(in, s.ranked[0], c);
    arr.push_back(std::move(e));
  }
  j["top"] = arr;
  return j;
}

// ---- SVG --------------------------------------------------------------------------------------------------------
namespace {
std::string esc(const std::string& s) { return xml_escape(s); }
}  // namespace

std::string render_svg(const PlanInput& in, const MeshShape& m, const Plan& p) {
  struct Seg {
    std::string name;
    double bytes;
    const char* color;
  };
  const std::vector<Seg> segs = {
      {"static: dense share", p.static_dense, "#1f4e79"},
      {"static: expert share", p.static_expert, "#2e75b6"},
      {"FSDP buffers", p.fsdp_buffers, "#7030a0"},
      {"layer checkpoints", p.tokens_per_gpu * p.ckpt_bytes_per_token, "#c55a11"},
      {"indexer top-k", p.tokens_per_gpu * p.indexer_bytes_per_token, "#ed7d31"},
      {"EP buffer (worst case)", p.tokens_per_gpu * p.ep_buffer_bytes_per_token, "#f4b183"},
      {"recompute + backward", p.tokens_per_gpu * p.recompute_bytes_per_token, "#bf9000"},
  };
  const double W = 820, H = 560, top = 90, bottom = 500, bar_x = 110, bar_w = 170;
  const double vmax = std::max(p.capacity, p.total) * 1.08;
  auto y_of = [&](double bytes) { return bottom - (bottom - top) * bytes / vmax; };
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "font-family=\"DejaVu Sans, Arial, sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      W, H, W, H);
  s += fmt::format("<text x=\"20\" y=\"30\" font-size=\"18\" font-weight=\"bold\">Per-GPU memory{}</text>\n",
                   esc(in.cluster.name.empty() ? "" : " - " + in.cluster.name));
  s += fmt::format("<text x=\"20\" y=\"52\" font-size=\"13\">{}, context {}, {} tokens per GPU</text>\n",
                   esc(mesh_str(m)), in.workload.context, grouped(p.tokens_per_gpu));
  s += fmt::format("<text x=\"20\" y=\"72\" font-size=\"14\" font-weight=\"bold\" fill=\"{}\">total {:.1f} GB of "
                   "{:.0f} GB: {} ({:.1f} GB {})</text>\n",
                   p.fits ? "#2e7d32" : "#c00000", p.total / 1e9, p.capacity / 1e9, p.fits ? "fits" : "DOES NOT FIT",
                   std::fabs(p.headroom) / 1e9, p.fits ? "headroom" : "over");
  // axis with ticks
  // At most about 12 ticks whatever the sizes (the file's size never grows with a value): 10, 20, 50 or 100 GB as
  // before for real GPUs, the next 1-2-5 step beyond.
  double step_gb = vmax / 1e9 > 400 ? 100 : vmax / 1e9 > 160 ? 50 : vmax / 1e9 > 60 ? 20 : 10;
  while (vmax / 1e9 / step_gb > 12) {
    const double mant = step_gb / std::pow(10.0, std::floor(std::log10(step_gb)));
    step_gb *= mant < 1.5 ? 2 : mant < 3 ? 2.5 : 2;
  }
  s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#444\"/>\n", bar_x - 20, top, bar_x - 20,
                   bottom);
  for (int t = 0; t <= 100 && static_cast<double>(t) * step_gb * 1e9 <= vmax; ++t) {
    const double g = static_cast<double>(t) * step_gb;
    const double y = y_of(g * 1e9);
    s += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#444\"/>", bar_x - 25, y,
                     bar_x - 20, y);
    s += fmt::format("<text x=\"{}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"end\">{:.0f} GB</text>\n",
                     bar_x - 28, y + 4, g);
  }
  // segments
  struct Label {
    double want, y;
    std::string text;
  };
  std::vector<Label> labels;
  double acc = 0;
  for (const auto& g : segs) {
    if (g.bytes <= 0) continue;
    const double y0 = y_of(acc), y1 = y_of(acc + g.bytes);
    s += fmt::format("<rect x=\"{}\" y=\"{:.1f}\" width=\"{}\" height=\"{:.1f}\" fill=\"{}\" stroke=\"white\" "
                     "stroke-width=\"0.5\"/>\n",
                     bar_x, y1, bar_w, y0 - y1, g.color);
    labels.push_back({(y0 + y1) / 2, 0, fmt::format("{}: {:.2f} GB", g.name, g.bytes / 1e9)});
    acc += g.bytes;
  }
  if (p.fits) {
    const double y0 = y_of(acc), y1 = y_of(p.capacity);
    s += fmt::format("<rect x=\"{}\" y=\"{:.1f}\" width=\"{}\" height=\"{:.1f}\" fill=\"#e8f5e9\" stroke=\"#2e7d32\" "
                     "stroke-dasharray=\"3,3\"/>\n",
                     bar_x, y1, bar_w, y0 - y1);
    labels.push_back({(y0 + y1) / 2, 0, fmt::format("headroom: {:.2f} GB", p.headroom / 1e9)});
  }
  // spread labels: at least 17 px apart, bottom-up, then pushed down if they leave the top
  const double gap = 17;
  for (size_t i = 0; i < labels.size(); ++i) {
    labels[i].y = labels[i].want;
    if (i && labels[i].y > labels[i - 1].y - gap) labels[i].y = labels[i - 1].y - gap;
  }
  if (!labels.empty() && labels.back().y < top)
    for (size_t i = labels.size(); i-- > 0;) {
      const double lim = (i + 1 < labels.size() ? labels[i + 1].y + gap : top);
      if (labels[i].y < lim) labels[i].y = lim;
    }
  const double lx = bar_x + bar_w + 60;
  for (const auto& l : labels) {
    s += fmt::format("<polyline points=\"{},{:.1f} {},{:.1f} {},{:.1f}\" fill=\"none\" stroke=\"#888\"/>", bar_x + bar_w,
                     l.want, lx - 20, l.want, lx - 4, l.y);
    s += fmt::format("<text x=\"{}\" y=\"{:.1f}\" font-size=\"13\">{}</text>\n", lx, l.y + 4, esc(l.text));
  }
  // group brackets: static | dynamic (FSDP buffers + activations)
  auto bracket = [&](double from, double to, const std::string& text) {
    const double x = W - 150, ya = y_of(from), yb = y_of(to);
    s += fmt::format("<polyline points=\"{},{:.1f} {},{:.1f} {},{:.1f} {},{:.1f}\" fill=\"none\" stroke=\"#333\" "
                     "stroke-width=\"1.5\"/>",
                     x - 6, ya - 1, x, ya - 1, x, yb + 1, x - 6, yb + 1);
    s += fmt::format("<text x=\"{}\" y=\"{:.1f}\" font-size=\"13\" font-weight=\"bold\">{}</text>\n", x + 6,
                     (ya + yb) / 2 + 4, esc(text));
  };
  bracket(0, p.static_total, fmt::format("static {:.1f} GB", p.static_total / 1e9));
  bracket(p.static_total, p.total, fmt::format("dynamic {:.1f} GB", p.dynamic / 1e9));
  // capacity line
  const double yc = y_of(p.capacity);
  s += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#c00000\" stroke-width=\"2.5\" "
                   "stroke-dasharray=\"8,4\"/>\n",
                   bar_x - 20, yc, W - 160, yc);
  s += fmt::format("<text x=\"{}\" y=\"{:.1f}\" font-size=\"13\" fill=\"#c00000\" text-anchor=\"end\" "
                   "font-weight=\"bold\">GPU capacity {:.0f} GB</text>\n",
                   W - 162, yc - 6, p.capacity / 1e9);
  s += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"12\" text-anchor=\"middle\">per GPU</text>\n",
                   bar_x + bar_w / 2, bottom + 20);
  s += "</svg>\n";
  return s;
}

}  // namespace trident::planner
