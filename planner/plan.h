// The planner's arithmetic: memory, eFSDP / CP communication and overlap for one mesh (evaluate), the mesh
// rules (check_mesh: parallel/layout.h's shared rules plus NVLink placement), the search over all meshes of a
// world size, and seed 002's recipe (recommend).
// Pure arithmetic: no allocation in check_mesh/evaluate, no threads. Formulas and sources: docs/planner.md.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "planner/config.h"

namespace trident::planner {

// Mesh rules, two kinds.
// 1. The layout rules of parallel/layout.h (violations / broken_rules), shared with `trident emulate`:
//    products, experts % ep, seq_len (= workload.context) % (2*cp). A mesh that breaks one is invalid: an error
//    for a config mesh, dropped by the search.
// 2. NVLink placement rules, the planner's own (a cluster's NVLink domains): a mesh that breaks one still runs,
//    only slower. A config mesh that breaks one is evaluated and each broken rule is a warning
//    (placement_warnings). The search drops meshes that break ep <= NVL or straddle a domain (their cost is not
//    modelled) and ranks meshes that break only fsdp*cp <= NVL (dense FSDP / 2D CP over RDMA, costed) when no mesh
//    that keeps every rule fits memory: seed 000's NVL8 (1,32,8) mesh and its 2D CP.
enum PlacementRule : uint32_t {
  kPlaceEpNvl = 1u << 0,      // ep <= NVL (EP all-to-all over RDMA is not modelled)
  kPlaceStraddle = 1u << 1,   // groups do not straddle NVLink domains
  kPlaceFsdpCpNvl = 1u << 2,  // fsdp*cp <= NVL (costed: dense FSDP traffic and, when cp > NVL, 2D CP over RDMA)
};
inline constexpr int kNumPlacementRules = 3;
inline constexpr uint32_t kUnrankedPlacement = kPlaceEpNvl | kPlaceStraddle;  // the search drops these meshes
const char* rule_text(PlacementRule r);  // "ep <= NVL", ...

struct MeshCheck {
  uint32_t layout = 0;          // rule_bit bits of the broken layout rules (invalid mesh)
  uint32_t placement = 0;       // PlacementRule bits (warnings)
  int64_t gpus_per_domain = 0;  // GPUs used in each NVLink domain (a multiple of every in-domain group)
  int64_t domains = 0;          // NVLink domains the world occupies
  int64_t cp_inner = 1;         // CP ranks per domain (cp when cp fits a domain)
  int64_t cp_outer = 1;         // domains one CP group spans (> 1: 2D CP)
  bool dense_spans = false;     // the fsdp x cp group spans domains: dense FSDP traffic crosses RDMA
  bool expert_spans = false;    // the e_fsdp group spans domains: eFSDP traffic crosses RDMA
  bool hard() const { return layout != 0; }  // invalid anywhere
  bool ranked() const { return layout == 0 && (placement & kUnrankedPlacement) == 0; }  // the search may rank it
  bool nvlink_ok() const { return layout == 0 && placement == 0; }
};

MeshCheck check_mesh(const PlanInput& in, const MeshShape& m);
// One line per broken placement rule, with the numbers and what the evaluation does about it (empty: none).
std::vector<std::string> placement_warnings(const PlanInput& in, const MeshShape& m, const MeshCheck& c);
// The texts of every broken rule (layout rules first), for the JSON "rules_failed".
std::vector<std::string> failed_rule_texts(const MeshCheck& c);

// The rules the search counts its dropped meshes under, in order (a mesh counts under the first it breaks):
// products ("d_rep*fsdp*cp == e_fsdp*ep == world"), experts ("experts % ep == 0"), "ep <= NVL", zigzag
// ("context % (2*cp) == 0"), "groups do not straddle NVLink domains", "fsdp*cp <= NVL" (the last only when no mesh
// that keeps it fits). The order and texts are those of the reports and JSON keys before the rules were shared.
inline constexpr int kNumSearchRules = 6;
const char* search_rule_text(int i);

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
  // expert parallel: per layer and GPU
  double ep_a2a_bytes = 0;              // tokens_per_gpu * top_k * hidden * 2 (bf16) * 6: dispatch and combine in
                                        // the forward, the recomputed forward and (their gradients) the backward
                                        // (the nccl-tests size: what the GPU sends)
  // linear cross-entropy note
  double naive_logits_bytes = 0;        // tokens_per_gpu * vocab * 4 (fp32) when a vocab is given
};

// All-gather-KV CP traffic of one layer, bytes one GPU receives (seed 000, "2D CP"), for a CP group of cp = cp_outer x
// cp_inner ranks (cp_inner per NVLink domain) holding kv_bytes of KV per layer. The KV is gathered across domains
// first (a rank receives one 1/cp block from its counterpart in each other domain: kv_bytes * (cp_outer-1)/cp over
// RDMA), then inside the domain (kv_bytes * (cp_inner-1)/cp_inner over NVLink); the key-side reduce-scatter is the
// reverse with the same shapes. `passes` counts the collectives in units of one all-gather's bytes: the planner's
// 1 + 1 + 2 (bf16 all-gather forward, again in the recompute, fp32 reduce-scatter); the emulator's step moves fp32
// payloads and 56-byte exact accumulators, so it is 1 (+ 1 with recompute) + 14 there (tests/step).
struct CpTraffic {
  double rdma = 0, nvlink = 0;
};
CpTraffic cp_traffic(double kv_bytes, int64_t cp, int64_t cp_inner, int64_t cp_outer, double passes);
inline constexpr double kCpPasses = 1.0 + 1.0 + 2.0;

// Evaluates one mesh. `chk` must come from check_mesh(in, m); hard-invalid meshes are evaluated anyway.
Plan evaluate(const PlanInput& in, const MeshShape& m, const MeshCheck& chk);
inline Plan evaluate(const PlanInput& in, const MeshShape& m) { return evaluate(in, m, check_mesh(in, m)); }

// Seed 002's logits example: local tokens x vocab partition x 4 B.
constexpr double naive_logits_bytes(double local_tokens, double vocab) { return local_tokens * vocab * 4.0; }

// ---- search -------------------------------------------------------------------------------------------------
struct Candidate {
  MeshShape mesh;
  MeshCheck check;
  Plan plan;
};

struct SearchResult {
  std::vector<Candidate> ranked;           // best first (valid meshes that break no unranked placement rule)
  int64_t considered = 0;                  // every (d_rep,fsdp,cp) x (e_fsdp,ep) factorisation enumerated
  int64_t rejected[kNumSearchRules] = {};  // per search rule (a mesh counts under its first broken rule)
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
  MeshShape mesh;
  int64_t ep = 0;                  // the fixed EP
  std::vector<std::string> lines;  // the advice, one line each (EP, CP, FSDP, TP, PP, memory notes)
  bool memory_forced = false;      // memory forced something beyond EP + CP-in-range
};
Recommendation recommend(const PlanInput& in, int64_t world);
int64_t default_recipe_ep(const PlanInput& in, int64_t world);

}  // namespace trident::planner
