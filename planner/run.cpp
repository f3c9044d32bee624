// `trident plan` entry: evaluate the config's mesh (or the search's best), print the breakdown, the recipe,
// the ranked search and the linear-CE note; optionally write the SVG chart.
#include "planner/run.h"

#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>

#include "planner/plan.h"
#include "planner/report.h"
#include "reference/atomic_write.h"
#include "reference/check.h"

namespace trident::planner {

void parse_world_range(const std::string& s, int64_t& lo, int64_t& hi) {
  const auto colon = s.find(':');
  auto parse = [&](const std::string& t, int64_t& v) {
    auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    return ec == std::errc() && ptr == t.data() + t.size() && v > 0;
  };
  if (colon == std::string::npos || !parse(s.substr(0, colon), lo) || !parse(s.substr(colon + 1), hi))
    throw Error(fmt::format("--world-range: expected A:B with positive integers A <= B, got '{}'", s));
  if (lo > hi) throw Error(fmt::format("--world-range: A must be <= B, got {}:{}", lo, hi));
  if (hi - lo > 100000) throw Error(fmt::format("--world-range: at most 100,000 sizes, got {}:{}", lo, hi));
}

// A value that overflowed to inf (or became NaN: inf - inf, 0 * inf) is one error naming it, never a printed "inf".
static void check_finite(const Plan& p, const MeshShape& m) {
#define F(x) std::pair<const char*, double>{#x, p.x}
  const std::pair<const char*, double> vals[] = {
      F(tokens_per_gpu),
      F(ckpt_bytes_per_token),
      F(indexer_bytes_per_token),
      F(ep_buffer_bytes_per_token),
      F(recompute_bytes_per_token),
      F(dynamic_bytes_per_token),
      F(static_dense),
      F(static_expert),
      F(static_total),
      F(activations),
      F(fsdp_buffers),
      F(dynamic),
      F(total),
      F(capacity),
      F(headroom),
      F(params_per_layer),
      F(expert_layer_bytes),
      F(expert_traffic),
      F(dense_traffic),
      F(efsdp_rdma_bytes),
      F(efsdp_rdma_bytes_ring),
      F(fsdp_nvlink_bytes),
      F(efsdp_rdma_s),
      F(efsdp_rdma_s_ring),
      F(fsdp_nvlink_s),
      F(active_params_per_layer),
      F(flops_per_token),
      F(flops_per_token_with_attn),
      F(achieved_flops),
      F(layer_compute_s),
      F(min_tokens_to_hide),
      F(kv_bytes),
      F(cp_rdma_bytes),
      F(cp_nvlink_bytes),
      F(cp_rdma_s),
      F(cp_rdma_share),
      F(rdma_bytes_per_layer),
      F(ep_a2a_bytes),
      F(naive_logits_bytes)};
#undef F
  for (const auto& [name, v] : vals)
    if (!std::isfinite(v))
      throw Error(fmt::format("plan for mesh {}: {} is {} (the config's values overflow double arithmetic; "
                              "check the model, cluster and workload sizes)", m.str(), name, v));
}

int run_plan(const PlanInput& in, const RunOptions& opt, std::ostream& out, std::ostream& warn) {
  if (opt.top < 1) throw Error(fmt::format("--top: must be >= 1, got {}", opt.top));
  if (opt.world < 0 || opt.world > kMaxGpus)
    throw Error(fmt::format("--world: must be in 1..{}, got {}", kMaxGpus, opt.world));
  if (opt.world_hi > kMaxGpus) throw Error(fmt::format("--world-range: B must be <= {}, got {}", kMaxGpus, opt.world_hi));
  const bool range = opt.world_lo > 0;
  if (range && opt.world) throw Error("--world and --world-range are exclusive: give one");
  if (in.mesh && opt.world && opt.world != in.mesh->world())
    throw Error(fmt::format("--world: {} differs from the config mesh's world d_rep*fsdp*cp = {} (drop the mesh to "
                            "search another world size)",
                            opt.world, in.mesh->world()));
  int64_t lo = range ? opt.world_lo : opt.world ? opt.world : in.mesh ? in.mesh->world() : in.cluster.world;
  int64_t hi = range ? opt.world_hi : lo;
  const bool do_search = opt.search || !in.mesh;
  if (do_search && lo <= 0)
    throw Error("the config has no mesh and no world size: give --world N, --world-range A:B or cluster.world");

  SearchResult sr;
  if (do_search) sr = search(in, lo, hi);
  MeshShape shown;
  if (in.mesh) {
    shown = *in.mesh;
  } else if (!sr.ranked.empty()) {
    shown = sr.ranked[0].mesh;
  } else {
    std::string why;
    for (int i = 0; i < kNumSearchRules; ++i)
      if (sr.rejected[i]) why += fmt::format("{}{}: {}", why.empty() ? "" : ", ", search_rule_text(i), sr.rejected[i]);
    throw Error(fmt::format("no valid mesh for world {}{}: every one of the {} meshes breaks a rule ({})", lo,
                            hi != lo ? fmt::format("..{}", hi) : "", sr.considered, why));
  }
  const MeshCheck chk = check_mesh(in, shown);
  const Plan p = evaluate(in, shown, chk);
  check_finite(p, shown);
  for (size_t k = 0; k < sr.ranked.size() && k < static_cast<size_t>(opt.top); ++k)
    check_finite(sr.ranked[k].plan, sr.ranked[k].mesh);
  for (const std::string& w : placement_warnings(in, shown, chk)) warn << "warning: " << w << "\n";
  const Recommendation rec = recommend(in, shown.world());

  if (!opt.svg_path.empty()) {
    io::write_file(opt.svg_path, render_svg(in, shown, p), "--svg");
  }

  if (opt.json) {
    nlohmann::json j = plan_json(in, shown, chk, p);
    j["inputs"] = echo_config(in);
    j["mesh_source"] = in.mesh ? "config" : "search";
    j["recipe"] = recipe_json(rec);
    j["search"] = do_search ? search_json(in, sr, opt.top) : nlohmann::json(nullptr);
    out << j.dump(2) << "\n";
    return 0;
  }
  out << "inputs (defaults filled in):\n";
  const nlohmann::json echo = echo_config(in);
  for (const auto& [section, obj] : echo.items()) {
    out << "  [" << section << "]";
    for (const auto& [key, v] : obj.items()) out << " " << key << "=" << v.dump();
    out << "\n";
  }
  out << "\n";
  if (!in.mesh) out << "no mesh in the config: showing the search's best mesh\n";
  out << render_text(in, shown, chk, p);
  out << render_recipe_text(rec, shown.world());
  if (do_search) out << render_search_text(in, sr, opt.top);
  if (!opt.svg_path.empty()) out << "\nmemory chart written to " << opt.svg_path << "\n";
  return 0;
}

int run_plan(const PlanInput& in, const RunOptions& opt, std::ostream& out) {
  std::ostringstream dropped;  // JSON: the warnings are its "warnings"
  return run_plan(in, opt, out, opt.json ? static_cast<std::ostream&>(dropped) : out);
}

int run_plan(const RunOptions& opt, std::ostream& out, std::ostream& warn) {
  return run_plan(load_config(opt.config_path), opt, out, warn);
}

int run_plan(const RunOptions& opt, std::ostream& out) { return run_plan(load_config(opt.config_path), opt, out); }

}  // namespace trident::planner
