// The planner's arithmetic: memory, eFSDP / CP communication and overlap for one mesh (evaluate), the mesh
// rules (check_mesh), the search over all meshes of a world size, and seed 002's recipe (recommend).
// Pure arithmetic: no allocation in check_mesh/evaluate, no threads. Formulas and sources: docs/planner.md.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "planner/config.h"

namespace trident::planner {

// Mesh rules. The wording matches parallel/mesh.h. "Hard" rules make a mesh invalid; kFsdpCpNvl is an NVLink
// placement rule the planner can still cost (dense FSDP traffic and, when cp > NVL, CP traffic cross RDMA:
// seed 000's NVL8 (1,32,8) mesh and its 2D CP), so an explicit mesh that breaks it is evaluated with a warning
// and the search only uses such meshes when no mesh that keeps the rule fits memory.
enum MeshRule : uint32_t {
  kRuleProduct = 1u << 0,    // d_rep*fsdp*cp == e_fsdp*ep == world
  kRuleExperts = 1u << 1,    // experts % ep == 0
  kRuleEpNvl = 1u << 2,      // ep <= NVL
  kRuleZigzag = 1u << 3,     // context % (2*cp) == 0 (zig-zag: 2*cp chunks per sequence)
  kRuleStraddle = 1u << 4,   // groups do not straddle NVLink domains
  kRuleFsdpCpNvl = 1u << 5,  // fsdp*cp <= NVL (soft: costed as RDMA traffic)
};
constexpr uint32_t kHardRules = kRuleProduct | kRuleExperts | kRuleEpNvl | kRuleZigzag | kRuleStraddle;
constexpr int kNumRules = 6;
const char* rule_text(MeshRule r);  // "ep <= NVL", ...

struct MeshCheck {
  uint32_t failed = 0;        // MeshRule bits
  int64_t gpus_per_domain = 0;  // GPUs used in each NVLink domain (a multiple of every in-domain group)
  int64_t domains = 0;        // NVLink domains the world occupies
  int64_t cp_inner = 1;       // CP ranks per domain (cp when cp fits a domain)
  int64_t cp_outer = 1;       // domains one CP group spans (> 1: 2D CP)
  bool dense_spans = false;   // the fsdp x cp group spans domains: dense FSDP traffic crosses RDMA
  bool expert_spans = false;  // the e_fsdp group spans domains: eFSDP traffic crosses RDMA
  bool hard() const { return failed & kHardRules; }
  bool nvlink_ok() const { return failed == 0; }
  std::string first_hard_key() const;  // the mesh key to name in an error ("ep", "cp", ...)
  // One line per failed rule with the numbers; hard_only: only the hard rules.
  std::string describe(const PlanInput& in, const Mesh& m, bool hard_only) const;
};

MeshCheck check_mesh(const PlanInput& in, const Mesh& m);

// Everything the planner computes for one mesh. Bytes are bytes (B), times are seconds unless named _ms.
struct Plan {
  // tokens
  double tokens_per_gpu = 0;  // context * sequences_per_cp_group / cp
  // per-token dynamic memory (B / token)
  double ckpt_bytes_per_token = 0;       // layers * hidden * 2 (bf16 layer input kept for full recompute)
  double indexer_bytes_per_token = 0;    // sparse_index_layers * sparse_topk * 4 (int32)
  double ep_buffer_bytes_per_token = 0;  // (2*hidden + 4*experts) * ep (worst case: every EP rank sends here)
  double recompute_bytes_per_token = 0;  // recompute_bwd_mb_per_token * 1e6
  double dynamic_bytes_per_token = 0;    // the sum of the four
  // per-GPU memory (B)
  double static_dense = 0;     // params * dense_fraction * 18 / (fsdp*cp)
  double static_expert = 0;    // params * (1 - dense_fraction) * 18 / (e_fsdp*ep)
  double static_total = 0;
  double activations = 0;      // tokens_per_gpu * dynamic_bytes_per_token
  double fsdp_buffers = 0;     // params/layers * (dense + expert/ep) * (2 + 2 + 4)
  double dynamic = 0;          // activations + fsdp_buffers
  double total = 0;
  double capacity = 0;
  double headroom = 0;         // capacity - total
  bool fits = false;
  // communication per layer (B)
  double params_per_layer = 0;          // params / layers
  double expert_layer_bytes = 0;        // params/layers * (1-dense) * 2 / ep: one layer of this rank's experts, bf16
  double expert_traffic = 0;            // expert_layer_bytes * (1 + 1 + 2): AG fwd + AG bwd + fp32 RS (worst case)
  double dense_traffic = 0;             // params/layers * dense * (2 + 2 + 4)
  double efsdp_rdma_bytes = 0;          // the parts of the two above whose groups span NVLink domains
  double efsdp_rdma_bytes_ring = 0;     // same with the ring factor (n-1)/n of each group
  double fsdp_nvlink_bytes = 0;         // the parts that stay inside a domain (worst case)
  double efsdp_rdma_s = 0;              // efsdp_rdma_bytes / rdma bandwidth
  double efsdp_rdma_s_ring = 0;
  double fsdp_nvlink_s = 0;             // fsdp_nvlink_bytes / nvlink bandwidth (runs concurrently with RDMA)
  // compute per layer
  double active_params_per_layer = 0;   // params/layers * (dense + (1-dense) * top_k / experts)
  double flops_per_token = 0;           // 8 * active: fwd 2 + recompute 2 + dgrad 2 + wgrad 2 (linear layers)
  double flops_per_token_with_attn = 0; // flops_per_token * (1 + attn_to_linear)
  double achieved_flops = 0;            // peak * mfu (FLOP/s)
  double layer_compute_s = 0;           // tokens_per_gpu * flops_per_token_with_attn / achieved_flops
  double min_tokens_to_hide = 0;        // achieved_flops * max(efsdp_rdma_s, fsdp_nvlink_s) / flops_per_token_with_attn
  bool hidden = false;                  // tokens_per_gpu >= min_tokens_to_hide
  // context parallel (all-gather KV): per layer
  double kv_bytes = 0;                  // context * sequences_per_cp_group * kv_latent_bytes_per_token
  double cp_rdma_bytes = 0;             // kv_bytes * (cp_outer-1)/cp * (1 + 1 + 2)   (2D CP only)
  double cp_nvlink_bytes = 0;           // kv_bytes * (cp_inner-1)/cp_inner * (1 + 1 + 2)
  double cp_rdma_s = 0;                 // on the critical path
  double cp_rdma_share = 0;             // cp_rdma_s / layer_compute_s
  double rdma_bytes_per_layer = 0;      // efsdp_rdma_bytes + cp_rdma_bytes (the search's byte count)
  // linear cross-entropy note
  double naive_logits_bytes = 0;        // tokens_per_gpu * vocab * 4 (fp32) when a vocab is given
};

// Evaluates one mesh. `chk` must come from check_mesh(in, m); hard-invalid meshes are evaluated anyway.
Plan evaluate(const PlanInput& in, const Mesh& m, const MeshCheck& chk);
inline Plan evaluate(const PlanInput& in, const Mesh& m) { return evaluate(in, m, check_mesh(in, m)); }

// Seed 002's logits example: local tokens x vocab partition x 4 B.
constexpr double naive_logits_bytes(double local_tokens, double vocab) { return local_tokens * vocab * 4.0; }

// ---- search -------------------------------------------------------------------------------------------------
struct Candidate {
  Mesh mesh;
  MeshCheck check;
  Plan plan;
};

struct SearchResult {
  std::vector<Candidate> ranked;           // best first (only meshes without hard-rule failures)
  int64_t considered = 0;                  // every (d_rep,fsdp,cp) x (e_fsdp,ep) factorisation enumerated
  int64_t rejected[kNumRules] = {};        // per rule (a mesh counts under its first failed rule)
  bool relaxed = false;                    // true: no mesh keeping fsdp*cp <= NVL fits, so meshes that cost
                                           // dense FSDP / CP traffic over RDMA are included
  std::vector<int64_t> worlds;
};

// The objective, lexicographic: fits memory; eFSDP hidden; fewest RDMA bytes per layer; local sequence inside
// the recipe range; most headroom; then the smaller (cp, ep, fsdp) so the order is total and deterministic.
bool better(const PlanInput& in, const Candidate& a, const Candidate& b);
// The first objective criterion on which `a` beats `b` (for "why it wins"), or "" if none.
std::string wins_on(const PlanInput& in, const Candidate& a, const Candidate& b);

SearchResult search(const PlanInput& in, int64_t world_lo, int64_t world_hi);
// Counts evaluations only (benchmark kernel): enumerates, checks, evaluates; returns the number of meshes
// evaluated and the best one in *best (no ranking list, no allocation beyond the divisor list).
int64_t search_count(const PlanInput& in, int64_t world, Candidate* best);

// ---- recipe (seed 002) ----------------------------------------------------------------------------------------
struct Recommendation {
  bool found = false;
  Mesh mesh;
  int64_t ep = 0;                  // the fixed EP
  std::vector<std::string> lines;  // the advice, one line each (EP, CP, FSDP, TP, PP, memory notes)
  bool memory_forced = false;      // memory forced something beyond EP + CP-in-range
};
Recommendation recommend(const PlanInput& in, int64_t world);
int64_t default_recipe_ep(const PlanInput& in, int64_t world);

}  // namespace trident::planner
