// Planner input: model, cluster, workload and (optional) mesh, read from a JSON or TOML file.
// Units are in the key names; 1 GB = 1e9 B, 1 MB = 1e6 B. Every key is documented in docs/planner.md.
// Parsing validates everything up front (types, ranges, unknown keys) and throws trident::Error naming the key.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "parallel/layout.h"

namespace trident::planner {

// Largest GPU count the planner accepts for any mesh axis, nvl or world (keeps every product inside int64).
inline constexpr int64_t kMaxGpus = int64_t(1) << 24;
// Upper bounds of the other inputs (docs/planner.md section 1): far beyond any real model or cluster, and small
// enough that every product the planner forms stays finite and its outputs (text, JSON, SVG) stay bounded.
inline constexpr double kMaxParams = 1e16;              // parameters
inline constexpr int64_t kMaxLayers = int64_t(1) << 16;  // 65,536 layers
inline constexpr int64_t kMaxHidden = int64_t(1) << 24;
inline constexpr int64_t kMaxExperts = int64_t(1) << 20;
inline constexpr int64_t kMaxContext = int64_t(1) << 40;  // tokens (also sparse_topk, recipe local_seq_*)
inline constexpr int64_t kMaxSequences = int64_t(1) << 30;
inline constexpr int64_t kMaxVocab = int64_t(1) << 31;
inline constexpr double kMaxBytesPerToken = 1e9;       // kv_latent_bytes_per_token
inline constexpr double kMaxBytesPerParam = 1e3;       // static_bytes_per_param
inline constexpr double kMaxGpuMemoryGB = 1e6;         // 1 PB of HBM per GPU
inline constexpr double kMaxGBps = 1e6;                // rdma_GBps, nvlink_GBps
inline constexpr double kMaxTflops = 1e7;
inline constexpr double kMaxMBPerToken = 1e6;          // recompute_bwd_mb_per_token
inline constexpr double kMaxRatio = 1e6;               // attn_to_linear

struct ModelSpec {
  double params = 0;                     // total parameters (count), e.g. 753e9
  int64_t layers = 0;                    // transformer layers
  int64_t hidden = 0;                    // d_model
  int64_t experts = 0;                   // routed experts per MoE layer (E)
  int64_t top_k = 0;                     // experts per token (K)
  double dense_fraction = 0;             // share of params that are not routed-expert weights, in [0,1]
  int64_t sparse_index_layers = 0;       // layers whose DSA indexer top-k is saved for backward (default 0)
  int64_t sparse_topk = 0;               // indices saved per token per such layer (default 0)
  double kv_latent_bytes_per_token = 0;  // bytes per token per layer that CP all-gathers (default 0: not given)
  int64_t vocab = 0;                     // vocabulary size for the linear-CE note (default 0: not given)
  double static_bytes_per_param = 18;    // fp32 master 4 + Adam 4+4 + fp32 grad 4 + bf16 weight 2
};

struct ClusterSpec {
  std::string name;                      // free text, echoed (default "")
  double gpu_memory_gb = 0;              // HBM per GPU
  int64_t nvl = 0;                       // GPUs per NVLink domain (72 for NVL72, 8 for an 8-GPU node)
  double rdma_GBps = 0;                  // per-GPU RDMA bandwidth, GB/s
  double nvlink_GBps = 900;              // per-GPU NVLink bandwidth, GB/s (default 900)
  double peak_tflops = 0;                // dense bf16 peak per GPU, TFLOP/s
  double mfu = 0.8;                      // achieved fraction of peak, in (0,1] (default 0.8)
  int64_t world = 0;                     // GPUs to plan for when there is no mesh (default 0: --world)
};

struct WorkloadSpec {
  int64_t context = 0;                       // tokens per sequence
  int64_t sequences_per_cp_group = 1;        // sequences one CP group holds per microbatch (default 1)
  double recompute_bwd_mb_per_token = 2.5;   // recompute + backward transient per token, MB (default 2.5)
  double attn_to_linear = 2;                 // attention time / linear-layer time (default 2; seed: 4 at 1M)
};

struct RecipeSpec {
  int64_t ep = 0;                 // EP to fix (default 0: 8 on 8-GPU domains, else the largest divisor of
                                  // experts that fits one domain)
  int64_t local_seq_min = 16384;  // target local sequence per GPU, tokens (seed 002: 16K-32K)
  int64_t local_seq_max = 32768;
};

struct PlanInput {
  ModelSpec model;
  ClusterSpec cluster;
  WorkloadSpec workload;
  RecipeSpec recipe;
  std::optional<MeshShape> mesh;  // checked with violations (the rules of trident emulate)
};

// The names of the planner's inputs in mesh-rule messages ("use workload.context = 1048576", "use mesh.ep = 32").
InputNames config_names();
// The shared mesh rules' inputs from a config: experts and context (as seq_len); `world` when given.
LayoutInputs layout_inputs(const PlanInput& in, std::optional<int64_t> world = std::nullopt);

// Parses and validates a config object. `source` names the file in error messages. A mesh that breaks a rule of
// violations is an error listing every broken rule; NVLink placement rules are warnings (plan.h).
PlanInput parse_config(const nlohmann::json& j, const std::string& source = "config");
// Reads a .json or .toml file (by extension; anything else is tried as JSON).
PlanInput load_config(const std::string& path);
// TOML text -> the same JSON shape (tables -> objects). Exposed for tests.
nlohmann::json toml_text_to_json(const std::string& text, const std::string& source = "config.toml");
// Every input with its defaults filled in (the "inputs" echo of the output).
nlohmann::json echo_config(const PlanInput& in);

}  // namespace trident::planner
