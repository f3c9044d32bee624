// Config parsing: one validation path for JSON and TOML (TOML is converted to the same JSON shape first).
#include "planner/config.h"

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <string_view>
#include <toml.hpp>

#include "reference/toml_json.h"
#include "reference/check.h"

namespace trident::planner {
namespace {

using nlohmann::json;

std::string type_name(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a bool";
  if (v.is_string()) return fmt::format("a string (\"{}\")", v.get<std::string>());
  if (v.is_array()) return "an array";
  if (v.is_object()) return "a table/object";
  return "a number";
}

// Reads one section, remembering which keys were consumed so the rest can be reported as unknown.
class Section {
 public:
  Section(const json& root, const std::string& name, const std::string& source, bool required)
      : name_(name), source_(source) {
    auto it = root.find(name);
    if (it == root.end()) {
      if (required) fail("missing section '{}' (required)", name);
      present_ = false;
      return;
    }
    if (!it->is_object()) fail("'{}' must be a table/object, got {}", name, type_name(*it));
    obj_ = &*it;
  }
  bool present() const { return present_; }

  template <class... A>
  [[noreturn]] void fail(fmt::format_string<A...> f, A&&... a) const {
    throw Error(fmt::format("{}: {}", source_, fmt::format(f, std::forward<A>(a)...)));
  }
  template <class... A>
  [[noreturn]] void fail_key(const std::string& key, fmt::format_string<A...> f, A&&... a) const {
    throw Error(fmt::format("{}: {}.{}: {}", source_, name_, key, fmt::format(f, std::forward<A>(a)...)));
  }

  const json* get(const std::string& key, bool required) {
    used_.insert(key);
    if (!obj_) return nullptr;
    auto it = obj_->find(key);
    if (it == obj_->end()) {
      if (required) fail_key(key, "missing (required)");
      return nullptr;
    }
    return &*it;
  }

  // Real number in (0, max] (`positive`) or [0, max]; -0.0 reads as 0 (an error where > 0 is required).
  void number(const std::string& key, double& out, bool required, bool positive, double max) {
    const json* v = get(key, required);
    if (!v) return;
    if (!v->is_number()) fail_key(key, "expected a number, got {}", type_name(*v));
    double x = v->get<double>();
    if (!std::isfinite(x)) fail_key(key, "expected a finite number, got {}", x);
    if (x == 0) x = 0;  // -0.0
    if (positive && !(x > 0)) fail_key(key, "must be > 0, got {}", x);
    if (!positive && x < 0) fail_key(key, "must be >= 0, got {}", x);
    if (x > max) fail_key(key, "must be <= {:g}, got {:g}", max, x);
    out = x;
  }
  void fraction(const std::string& key, double& out, bool required, bool allow_zero) {
    const json* v = get(key, required);
    if (!v) return;
    if (!v->is_number()) fail_key(key, "expected a number in [0,1], got {}", type_name(*v));
    double x = v->get<double>();
    if (!(x >= 0 && x <= 1)) fail_key(key, "must be a fraction in [0,1], got {}", x);
    if (!allow_zero && x == 0) fail_key(key, "must be in (0,1], got 0");
    out = x;
  }
  // Integer in [1, max] (`positive`) or [0, max]. A value beyond the integer type (an unsigned JSON integer past
  // 2^63 - 1, a float past 2^53) is refused, never clamped.
  void integer(const std::string& key, int64_t& out, bool required, bool positive, int64_t max) {
    const json* v = get(key, required);
    if (!v) return;
    if (!v->is_number()) fail_key(key, "expected an integer, got {}", type_name(*v));
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      fail_key(key, "must be <= {}, got {} (beyond the 64-bit integer range)", max, v->get<uint64_t>());
    double x = v->get<double>();
    if (v->is_number_float() && (!std::isfinite(x) || std::floor(x) != x || std::fabs(x) > 9.0e15))
      fail_key(key, "expected an integer (at most 9e15 as a float), got {}", x);
    int64_t i = v->is_number_float() ? static_cast<int64_t>(x) : v->get<int64_t>();
    if (positive && i <= 0) fail_key(key, "must be a positive integer, got {}", i);
    if (!positive && i < 0) fail_key(key, "must be >= 0, got {}", i);
    if (i > max) fail_key(key, "must be <= {}, got {}", max, i);
    out = i;
  }
  void string(const std::string& key, std::string& out) {
    const json* v = get(key, false);
    if (!v) return;
    if (!v->is_string()) fail_key(key, "expected a string, got {}", type_name(*v));
    out = v->get<std::string>();
  }
  void no_unknown_keys() const {
    if (!obj_) return;
    for (auto it = obj_->begin(); it != obj_->end(); ++it) {
      if (used_.count(it.key())) continue;
      std::string allowed;
      for (const auto& k : used_) allowed += (allowed.empty() ? "" : ", ") + k;
      fail_key(it.key(), "unknown key (allowed in '{}': {})", name_, allowed);
    }
  }

 private:
  std::string name_, source_;
  const json* obj_ = nullptr;
  bool present_ = true;
  std::set<std::string> used_;
};

}  // namespace

nlohmann::json toml_text_to_json(const std::string& text, const std::string& source) {
  check_toml_text(text, source);  // nesting and literals toml11 cannot take
  std::istringstream is(text);
  toml::value v;
  try {
    v = toml::parse(is, source);
  } catch (const std::exception& e) {
    throw Error(fmt::format("{}: TOML syntax error: {}", source, e.what()));
  }
  return toml_to_json(v);
}

InputNames config_names() {
  InputNames n;
  n.config_keys = true;
  n.mesh = "mesh";
  n.world = "cluster.world";
  n.experts = "model.experts";
  n.sequences = "";  // workload.sequences_per_cp_group counts per data group: always whole
  n.seq_len = "workload.context";
  n.tile = "";
  n.ep_chunks = "";
  return n;
}

LayoutInputs layout_inputs(const PlanInput& in, std::optional<int64_t> world) {
  return LayoutInputs{.world = world, .experts = in.model.experts, .seq_len = in.workload.context};
}

PlanInput parse_config(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) throw Error(fmt::format("{}: the config must be an object/table at the top level", source));
  static const std::set<std::string> sections = {"model", "cluster", "workload", "recipe", "mesh"};
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!sections.count(it.key()))
      throw Error(fmt::format("{}: {}: unknown key (allowed at the top level: model, cluster, workload, recipe, mesh)",
                              source, it.key()));
  PlanInput in;

  Section m(j, "model", source, true);
  auto& mo = in.model;
  m.number("params", mo.params, true, true, kMaxParams);
  m.integer("layers", mo.layers, true, true, kMaxLayers);
  m.integer("hidden", mo.hidden, true, true, kMaxHidden);
  m.integer("experts", mo.experts, true, true, kMaxExperts);
  m.integer("top_k", mo.top_k, true, true, kMaxExperts);
  m.fraction("dense_fraction", mo.dense_fraction, true, true);
  m.integer("sparse_index_layers", mo.sparse_index_layers, false, false, kMaxLayers);
  m.integer("sparse_topk", mo.sparse_topk, false, false, kMaxContext);
  // Optional sizes: omitted means "not given"; given, they are sizes and must be > 0 (0 is an error, not "off").
  m.number("kv_latent_bytes_per_token", mo.kv_latent_bytes_per_token, false, true, kMaxBytesPerToken);
  m.integer("vocab", mo.vocab, false, true, kMaxVocab);
  m.number("static_bytes_per_param", mo.static_bytes_per_param, false, true, kMaxBytesPerParam);
  m.no_unknown_keys();
  if (mo.top_k > mo.experts) m.fail_key("top_k", "must be <= experts ({}), got {}", mo.experts, mo.top_k);
  if (mo.sparse_index_layers > mo.layers)
    m.fail_key("sparse_index_layers", "must be <= layers ({}), got {}", mo.layers, mo.sparse_index_layers);

  Section c(j, "cluster", source, true);
  auto& cl = in.cluster;
  c.string("name", cl.name);
  c.number("gpu_memory_gb", cl.gpu_memory_gb, true, true, kMaxGpuMemoryGB);
  c.integer("nvl", cl.nvl, true, true, kMaxGpus);
  c.number("rdma_GBps", cl.rdma_GBps, true, true, kMaxGBps);
  c.number("nvlink_GBps", cl.nvlink_GBps, false, true, kMaxGBps);
  c.number("peak_tflops", cl.peak_tflops, true, true, kMaxTflops);
  c.fraction("mfu", cl.mfu, false, false);
  c.integer("world", cl.world, false, true, kMaxGpus);
  c.no_unknown_keys();
  if (cl.nvl > kMaxGpus) c.fail_key("nvl", "must be <= {} GPUs, got {}", kMaxGpus, cl.nvl);
  if (cl.world > kMaxGpus) c.fail_key("world", "must be <= {} GPUs, got {}", kMaxGpus, cl.world);

  Section w(j, "workload", source, true);
  auto& wl = in.workload;
  w.integer("context", wl.context, true, true, kMaxContext);
  w.integer("sequences_per_cp_group", wl.sequences_per_cp_group, false, true, kMaxSequences);
  w.number("recompute_bwd_mb_per_token", wl.recompute_bwd_mb_per_token, false, false, kMaxMBPerToken);
  w.number("attn_to_linear", wl.attn_to_linear, false, false, kMaxRatio);
  w.no_unknown_keys();
  if (wl.context > (int64_t(1) << 40)) w.fail_key("context", "must be <= 2^40 tokens, got {}", wl.context);
  if (wl.sequences_per_cp_group > (int64_t(1) << 30))
    w.fail_key("sequences_per_cp_group", "must be <= 2^30, got {}", wl.sequences_per_cp_group);

  Section r(j, "recipe", source, false);
  r.integer("ep", in.recipe.ep, false, true, kMaxGpus);
  r.integer("local_seq_min", in.recipe.local_seq_min, false, true, kMaxContext);
  r.integer("local_seq_max", in.recipe.local_seq_max, false, true, kMaxContext);
  r.no_unknown_keys();
  if (in.recipe.local_seq_min > in.recipe.local_seq_max)
    r.fail_key("local_seq_min", "must be <= recipe.local_seq_max ({}), got {}", in.recipe.local_seq_max,
               in.recipe.local_seq_min);
  if (in.recipe.ep > in.cluster.nvl)
    r.fail_key("ep", "ep <= NVL fails (ep = {}, NVL = {})", in.recipe.ep, in.cluster.nvl);
  if (in.recipe.ep && in.model.experts % in.recipe.ep != 0)
    r.fail_key("ep", "experts % ep == 0 fails (experts = {}, ep = {})", in.model.experts, in.recipe.ep);

  Section s(j, "mesh", source, false);
  if (s.present()) {
    MeshShape mesh;
    s.integer("d_rep", mesh.d_rep, true, true, kMaxGpus);
    s.integer("fsdp", mesh.fsdp, true, true, kMaxGpus);
    s.integer("cp", mesh.cp, true, true, kMaxGpus);
    s.integer("e_fsdp", mesh.e_fsdp, true, true, kMaxGpus);
    s.integer("ep", mesh.ep, true, true, kMaxGpus);
    s.no_unknown_keys();
    for (auto [key, v] : {std::pair<const char*, int64_t>{"d_rep", mesh.d_rep}, {"fsdp", mesh.fsdp}, {"cp", mesh.cp},
                          {"e_fsdp", mesh.e_fsdp}, {"ep", mesh.ep}})
      if (v > kMaxGpus) s.fail_key(key, "must be <= {} GPUs, got {}", kMaxGpus, v);
    // The layout rules shared with `trident emulate` are errors, every broken one listed; the NVLink placement
    // rules are warnings (plan.h: placement_warnings).
    try {
      validate(
          mesh, layout_inputs(in, in.cluster.world ? std::optional<int64_t>(in.cluster.world) : std::nullopt),
          config_names());
    } catch (const Error& e) {
      throw Error(fmt::format("{}: {}", source, e.what()));
    }
    in.mesh = mesh;
  }
  return in;
}

PlanInput load_config(const std::string& path) {
  const auto ends_with = [&](std::string_view ext) {
    return path.size() >= ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0;
  };
  if (!ends_with(".json") && !ends_with(".toml"))
    throw Error(fmt::format("{}: not a plan config: plan reads .json or .toml files (e.g. planner/examples/"
                            "nvl72_1m.json)",
                            path));
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(fmt::format("{}: cannot open the config file", path));
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  const bool is_toml = ends_with(".toml");
  nlohmann::json j;
  if (is_toml) {
    j = toml_text_to_json(text, path);
  } else {
    j = parse_json_strict(text, path);  // duplicate keys and deep nesting are errors
  }
  return parse_config(j, path);
}

nlohmann::json echo_config(const PlanInput& in) {
  nlohmann::json j;
  const auto& m = in.model;
  j["model"] = {{"params", m.params},
                {"layers", m.layers},
                {"hidden", m.hidden},
                {"experts", m.experts},
                {"top_k", m.top_k},
                {"dense_fraction", m.dense_fraction},
                {"sparse_index_layers", m.sparse_index_layers},
                {"sparse_topk", m.sparse_topk},
                {"kv_latent_bytes_per_token", m.kv_latent_bytes_per_token},
                {"vocab", m.vocab},
                {"static_bytes_per_param", m.static_bytes_per_param}};
  const auto& c = in.cluster;
  j["cluster"] = {{"name", c.name},           {"gpu_memory_gb", c.gpu_memory_gb}, {"nvl", c.nvl},
                  {"rdma_GBps", c.rdma_GBps}, {"nvlink_GBps", c.nvlink_GBps},     {"peak_tflops", c.peak_tflops},
                  {"mfu", c.mfu},             {"world", c.world}};
  const auto& w = in.workload;
  j["workload"] = {{"context", w.context},
                   {"sequences_per_cp_group", w.sequences_per_cp_group},
                   {"recompute_bwd_mb_per_token", w.recompute_bwd_mb_per_token},
                   {"attn_to_linear", w.attn_to_linear}};
  j["recipe"] = {{"ep", in.recipe.ep},
                 {"local_seq_min", in.recipe.local_seq_min},
                 {"local_seq_max", in.recipe.local_seq_max}};
  if (in.mesh)
    j["mesh"] = {{"d_rep", in.mesh->d_rep},
                 {"fsdp", in.mesh->fsdp},
                 {"cp", in.mesh->cp},
                 {"e_fsdp", in.mesh->e_fsdp},
                 {"ep", in.mesh->ep}};
  return j;
}

}  // namespace trident::planner
