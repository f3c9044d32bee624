// Every number of DESIGN.md section 7 (seed 000's tables) and seed 002's logits example.
// Each expected value is computed here from the seed's inputs with the formula written out independently of
// planner/plan.cpp (within kFirstPrinciplesRel), then the seed's own rounded figure is checked (within
// kSeedRoundedRel). Nothing is compared against stored output of the planner.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "planner/config.h"
#include "planner/plan.h"
#include "reference/check.h"
#include "tests/planner/planner_tolerances.h"

using namespace trident::planner;
using trident::MeshShape;
using trident::planner::test::kFirstPrinciplesRel;
using trident::planner::test::kSeedRoundedRel;

namespace {

std::string ex(const std::string& name) { return std::string(TRIDENT_PLANNER_EXAMPLES) + "/" + name; }

// |actual - expected| <= rel * |expected|, with a one-line repro on failure.
void near_rel(double actual, double expected, double rel, const std::string& what, const std::string& repro) {
  ASSERT_NE(expected, 0.0) << what << ": vacuous expectation";
  const double err = std::fabs(actual - expected) / std::fabs(expected);
  EXPECT_LE(err, rel) << what << ": planner " << actual << " vs " << expected << " (rel err " << err << " > "
                      << rel << ")\n  repro: " << repro;
}

// The seed-000 model (GLM-5.2-like, 753B) written out once: these are the seed's inputs, not planner output.
constexpr double P = 753e9, L = 78, D = 6144, E = 256, K = 8, DENSE = 0.02;
constexpr double IDX_LAYERS = 21, IDX_TOPK = 2048;
constexpr double B_PER_PARAM = 4 + 4 + 4 + 4 + 2;  // fp32 master, Adam m, Adam v, fp32 grad, bf16 weight
constexpr double ACHIEVED = 2500e12 * 0.8;           // GB200/B300 paper 2.5 PFLOP/s x 80 %

double ckpt_per_token() { return L * D * 2; }                       // bf16 layer inputs
double idx_per_token() { return IDX_LAYERS * IDX_TOPK * 4; }       // int32 indices
double ep_buf_per_token(double ep) { return (D * 2 + E * 4) * ep; }  // bf16 hidden + fp32 probs, x ep
double fsdp_buffers(double ep) { return P / L * (DENSE + (1 - DENSE) / ep) * (2 + 2 + 4); }
double active_per_layer() { return P / L * (DENSE + (1 - DENSE) * K / E); }
double tokens_to_hide(double comm_seconds, double attn) { return ACHIEVED * comm_seconds / (8 * active_per_layer() * (1 + attn)); }

void check_inputs_are_the_seeds(const PlanInput& in) {
  ASSERT_EQ(in.model.params, P);
  ASSERT_EQ(in.model.layers, 78);
  ASSERT_EQ(in.model.hidden, 6144);
  ASSERT_EQ(in.model.experts, 256);
  ASSERT_EQ(in.model.top_k, 8);
  ASSERT_EQ(in.model.dense_fraction, DENSE);
  ASSERT_EQ(in.model.sparse_index_layers, 21);
  ASSERT_EQ(in.model.sparse_topk, 2048);
  ASSERT_EQ(in.cluster.peak_tflops * 1e12 * in.cluster.mfu, ACHIEVED);
}

}  // namespace

// Seed 000, NVL72: 753B, 1M context, (4,1,64) x (4,64), 256 GB200.
TEST(PlannerSeed000, Nvl72OneMillion) {
  const std::string repro = "trident plan planner/examples/nvl72_1m.json";
  const PlanInput in = load_config(ex("nvl72_1m.json"));
  check_inputs_are_the_seeds(in);
  ASSERT_TRUE(in.mesh.has_value());
  const MeshShape m = *in.mesh;
  ASSERT_EQ(m, (MeshShape{4, 1, 64, 4, 64}));
  const MeshCheck chk = check_mesh(in, m);
  EXPECT_TRUE(chk.nvlink_ok()) << fmt::format("{}", fmt::join(placement_warnings(in, m, chk), "; "));
  const Plan p = evaluate(in, m, chk);

  const double tokens = 1048576.0 * 1 / 64;
  EXPECT_EQ(p.tokens_per_gpu, tokens);
  // per-token terms (seed: 0.958, 0.172, 0.852, 2.5 MB/token)
  near_rel(p.ckpt_bytes_per_token, ckpt_per_token(), kFirstPrinciplesRel, "layer checkpoints B/token", repro);
  near_rel(p.ckpt_bytes_per_token, 0.958e6, kSeedRoundedRel, "checkpoints vs seed 0.958 MB", repro);
  near_rel(p.indexer_bytes_per_token, idx_per_token(), kFirstPrinciplesRel, "indexer B/token", repro);
  near_rel(p.indexer_bytes_per_token, 0.172e6, kSeedRoundedRel, "indexer vs seed 0.172 MB", repro);
  near_rel(p.ep_buffer_bytes_per_token, 13312.0 * 64, kFirstPrinciplesRel, "EP buffer B/token", repro);
  near_rel(p.ep_buffer_bytes_per_token, 0.852e6, kSeedRoundedRel, "EP buffer vs seed 0.852 MB", repro);
  // dynamic (activations) per GPU: seed 73.433 GB
  const double act = tokens * (ckpt_per_token() + idx_per_token() + ep_buf_per_token(64) + 2.5e6);
  near_rel(p.activations, act, kFirstPrinciplesRel, "activations", repro);
  near_rel(p.activations, 73.433e9, kSeedRoundedRel, "activations vs seed 73.433 GB", repro);
  // params per GPU: seed 56.122 GB
  const double stat = P * B_PER_PARAM * (DENSE / (1 * 64) + (1 - DENSE) / (4 * 64));
  near_rel(p.static_total, stat, kFirstPrinciplesRel, "static", repro);
  near_rel(p.static_total, 56.122e9, kSeedRoundedRel, "static vs seed 56.122 GB", repro);
  // FSDP buffers: seed 2.727 GB
  near_rel(p.fsdp_buffers, fsdp_buffers(64), kFirstPrinciplesRel, "FSDP buffers", repro);
  near_rel(p.fsdp_buffers, 2.727e9, kSeedRoundedRel, "FSDP buffers vs seed 2.727 GB", repro);
  // total ~133 GB, ~67 GB left of 200 GB
  near_rel(p.total, act + stat + fsdp_buffers(64), kFirstPrinciplesRel, "total", repro);
  near_rel(p.total, 133e9, kSeedRoundedRel, "total vs seed ~133 GB", repro);
  near_rel(p.headroom, 200e9 - (act + stat + fsdp_buffers(64)), kFirstPrinciplesRel, "headroom", repro);
  near_rel(p.headroom, 67e9, kSeedRoundedRel, "headroom vs seed 67 GB", repro);
  EXPECT_TRUE(p.fits);
  // eFSDP per layer: one layer of this rank's experts in bf16 (~300 MB) x (1 + 1 + 2) ~ 1200 MB, ~27 ms at 45 GB/s
  const double expert_layer = P / L * (1 - DENSE) * 2 / 64;
  near_rel(p.expert_layer_bytes, expert_layer, kFirstPrinciplesRel, "expert layer bf16 per rank", repro);
  near_rel(p.expert_layer_bytes, 300e6, kSeedRoundedRel + 0.0, "expert layer vs seed ~300 MB", repro);
  const double efsdp = expert_layer * 4;  // the dense group (fsdp x cp = 64) stays inside the NVL72 domain
  near_rel(p.efsdp_rdma_bytes, efsdp, kFirstPrinciplesRel, "eFSDP RDMA bytes/layer", repro);
  near_rel(p.efsdp_rdma_bytes, 1200e6, kSeedRoundedRel, "eFSDP vs seed ~1200 MB", repro);
  near_rel(p.efsdp_rdma_bytes_ring, efsdp * 3 / 4, kFirstPrinciplesRel, "eFSDP ring volume (e_fsdp-1)/e_fsdp", repro);
  near_rel(p.efsdp_rdma_s, efsdp / 45e9, kFirstPrinciplesRel, "eFSDP seconds", repro);
  near_rel(p.efsdp_rdma_s, 27e-3, kSeedRoundedRel, "eFSDP vs seed ~27 ms", repro);
  // compute: ~0.5B active params per layer, 4 GFLOP/token; tokens to hide ~4,500
  near_rel(p.active_params_per_layer, active_per_layer(), kFirstPrinciplesRel, "active params/layer", repro);
  near_rel(p.active_params_per_layer, 0.5e9, kSeedRoundedRel, "active params vs seed ~0.5B", repro);
  near_rel(p.flops_per_token, 4e9, kSeedRoundedRel, "FLOP/token vs seed 4 GFLOP", repro);
  near_rel(p.min_tokens_to_hide, tokens_to_hide(efsdp / 45e9, 2), kFirstPrinciplesRel, "tokens to hide", repro);
  near_rel(p.min_tokens_to_hide, 4500, kSeedRoundedRel, "tokens to hide vs seed ~4,500", repro);
  EXPECT_TRUE(p.hidden);
}

// Seed 000, B300 NVL8, 256k context, (e_fsdp, ep) = (32, 8), cp 8, recompute+bwd 1.5 MB/token.
TEST(PlannerSeed000, Nvl8TwoFiftySixK) {
  const std::string repro_a = "trident plan planner/examples/nvl8_256k_a.json";
  const std::string repro_b = "trident plan planner/examples/nvl8_256k_b.json";
  const PlanInput a = load_config(ex("nvl8_256k_a.json"));
  const PlanInput b = load_config(ex("nvl8_256k_b.json"));
  check_inputs_are_the_seeds(a);
  check_inputs_are_the_seeds(b);
  ASSERT_EQ(*a.mesh, (MeshShape{1, 32, 8, 32, 8}));
  ASSERT_EQ(*b.mesh, (MeshShape{32, 1, 8, 32, 8}));
  const MeshCheck ca = check_mesh(a, *a.mesh), cb = check_mesh(b, *b.mesh);
  // (1,32,8): the dense group of 256 spans 32 nodes: the seed's "dense FSDP also over RDMA" case.
  EXPECT_FALSE(ca.hard());
  EXPECT_TRUE(ca.placement & kPlaceFsdpCpNvl);
  EXPECT_TRUE(ca.dense_spans);
  EXPECT_TRUE(cb.nvlink_ok()) << fmt::format("{}", fmt::join(placement_warnings(b, *b.mesh, cb), "; "));
  const Plan pa = evaluate(a, *a.mesh, ca), pb = evaluate(b, *b.mesh, cb);

  const double tokens = 262144.0 * 32 / 256;  // the seed's per-GPU token count
  EXPECT_EQ(pa.tokens_per_gpu, tokens);
  near_rel(pa.ep_buffer_bytes_per_token, 0.106e6, kSeedRoundedRel, "EP buffer vs seed 0.106 MB", repro_a);
  // dynamic: seed 100.66 GB (includes the 11.005 GB FSDP buffers)
  near_rel(pa.fsdp_buffers, fsdp_buffers(8), kFirstPrinciplesRel, "FSDP buffers", repro_a);
  near_rel(pa.fsdp_buffers, 11.005e9, kSeedRoundedRel, "FSDP buffers vs seed 11.005 GB", repro_a);
  const double dyn = tokens * (ckpt_per_token() + idx_per_token() + ep_buf_per_token(8) + 1.5e6) + fsdp_buffers(8);
  near_rel(pa.dynamic, dyn, kFirstPrinciplesRel, "dynamic", repro_a);
  near_rel(pa.dynamic, 100.66e9, kSeedRoundedRel, "dynamic vs seed 100.66 GB", repro_a);
  near_rel(pb.dynamic, 100.66e9, kSeedRoundedRel, "dynamic (mesh b) vs seed 100.66 GB", repro_b);
  // params: 52.95 / 85.77 GB
  near_rel(pa.static_total, P * B_PER_PARAM / 256, kFirstPrinciplesRel, "static (1,32,8)", repro_a);
  near_rel(pa.static_total, 52.95e9, kSeedRoundedRel, "static (1,32,8) vs seed 52.95 GB", repro_a);
  near_rel(pb.static_total, P * B_PER_PARAM * (DENSE / 8 + (1 - DENSE) / 256), kFirstPrinciplesRel,
           "static (32,1,8)", repro_b);
  near_rel(pb.static_total, 85.77e9, kSeedRoundedRel, "static (32,1,8) vs seed 85.77 GB", repro_b);
  // comm per layer: experts 2.365 GB x 4 = 9.460 GB, + dense 1.544 GB over RDMA = 11.0 GB; 122 ms; ~20,300 tokens
  const double expert_layer = P / L * (1 - DENSE) * 2 / 8;
  near_rel(pa.expert_layer_bytes, 2.365e9, kSeedRoundedRel, "expert layer vs seed 2.365 GB", repro_a);
  near_rel(pa.expert_traffic, expert_layer * 4, kFirstPrinciplesRel, "expert traffic", repro_a);
  near_rel(pa.expert_traffic, 9.460e9, kSeedRoundedRel, "expert traffic vs seed 9.460 GB", repro_a);
  near_rel(pa.dense_traffic, P / L * DENSE * 8, kFirstPrinciplesRel, "dense traffic", repro_a);
  near_rel(pa.dense_traffic, 1.544e9, kSeedRoundedRel, "dense traffic vs seed 1.544 GB", repro_a);
  const double comm = expert_layer * 4 + P / L * DENSE * 8;
  near_rel(pa.efsdp_rdma_bytes, comm, kFirstPrinciplesRel, "RDMA bytes/layer (1,32,8)", repro_a);
  near_rel(pa.efsdp_rdma_bytes, 11.0e9, kSeedRoundedRel, "RDMA bytes vs seed 11.0 GB", repro_a);
  near_rel(pa.efsdp_rdma_bytes_ring, expert_layer * 4 * 31 / 32 + P / L * DENSE * 8 * 255 / 256, kFirstPrinciplesRel,
           "ring volume", repro_a);
  near_rel(pa.efsdp_rdma_s, comm / 90e9, kFirstPrinciplesRel, "RDMA seconds", repro_a);
  near_rel(pa.efsdp_rdma_s, 122e-3, kSeedRoundedRel, "RDMA time vs seed 122 ms", repro_a);
  near_rel(pa.min_tokens_to_hide, tokens_to_hide(comm / 90e9, 2), kFirstPrinciplesRel, "tokens to hide", repro_a);
  near_rel(pa.min_tokens_to_hide, 20300, kSeedRoundedRel, "tokens to hide vs seed ~20,300", repro_a);
  EXPECT_TRUE(pa.hidden);  // seed: 32,768 per GPU, "完全可以被盖住"
  EXPECT_TRUE(pa.fits);
  EXPECT_TRUE(pb.fits);
  // (32,1,8) keeps the dense group inside the node: only the experts' 9.460 GB crosses RDMA.
  near_rel(pb.efsdp_rdma_bytes, expert_layer * 4, kFirstPrinciplesRel, "RDMA bytes/layer (32,1,8)", repro_b);
  EXPECT_EQ(pb.fsdp_nvlink_bytes, pb.dense_traffic);
}

// Seed 000, NVL8 2D CP = 8 x 8, 1M context, latent 1408 B/token/layer, attention 4x linear at 1M.
TEST(PlannerSeed000, Nvl8TwoDimensionalCp) {
  const std::string repro = "trident plan planner/examples/nvl8_2dcp_1m.json";
  const PlanInput in = load_config(ex("nvl8_2dcp_1m.json"));
  check_inputs_are_the_seeds(in);
  ASSERT_EQ(in.model.kv_latent_bytes_per_token, 512 * 2 + 64 * 2 + 128 * 2);  // kv_lora + rope + indexer K, bf16
  const MeshShape m = *in.mesh;
  const MeshCheck chk = check_mesh(in, m);
  EXPECT_FALSE(chk.hard()) << chk.layout;
  ASSERT_EQ(chk.cp_inner, 8);
  ASSERT_EQ(chk.cp_outer, 8);
  const Plan p = evaluate(in, m, chk);
  EXPECT_EQ(p.tokens_per_gpu, 1048576.0 / 64);  // seed: 16,384
  const double kv = 1048576.0 * 1408;
  near_rel(p.kv_bytes, kv, kFirstPrinciplesRel, "KV per layer", repro);
  near_rel(p.kv_bytes, 1.476e9, kSeedRoundedRel, "KV vs seed 1.476 GB", repro);
  // step 1 (RDMA): 7 other nodes x 1/64 each; step 2 (NVLink): 7 node peers x 1/8 each
  near_rel(p.cp_rdma_bytes / 4, kv * 7 / 64, kFirstPrinciplesRel, "RDMA all-gather receive", repro);
  near_rel(p.cp_rdma_bytes / 4, 161.5e6, kSeedRoundedRel, "RDMA all-gather vs seed 161.5 MB", repro);
  near_rel(p.cp_nvlink_bytes / 4, 1.292e9, kSeedRoundedRel, "NVLink all-gather vs seed 1.292 GB", repro);
  const double cp_s = kv * 7 / 64 * (1 + 1 + 2) / 90e9;
  near_rel(p.cp_rdma_s, cp_s, kFirstPrinciplesRel, "CP RDMA seconds", repro);
  near_rel(p.cp_rdma_s, 7.2e-3, kSeedRoundedRel, "CP RDMA vs seed 7.2 ms", repro);
  const double layer_s = 8 * active_per_layer() * 16384 * (1 + 4) / ACHIEVED;
  near_rel(p.layer_compute_s, layer_s, kFirstPrinciplesRel, "layer compute", repro);
  near_rel(p.layer_compute_s, 164e-3, kSeedRoundedRel, "layer compute vs seed 164 ms", repro);
  near_rel(p.cp_rdma_share, cp_s / layer_s, kFirstPrinciplesRel, "CP share", repro);
  near_rel(p.cp_rdma_share, 0.044, kSeedRoundedRel, "CP share vs seed 4.4%", repro);
  // eFSDP is the 256k case's 122 ms (dense over RDMA since cp spans nodes): tokens to hide 12,200 < 16,384
  const double comm = P / L * (1 - DENSE) * 2 / 8 * 4 + P / L * DENSE * 8;
  near_rel(p.min_tokens_to_hide, tokens_to_hide(comm / 90e9, 4), kFirstPrinciplesRel, "tokens to hide", repro);
  near_rel(p.min_tokens_to_hide, 12200, kSeedRoundedRel, "tokens to hide vs seed 12,200", repro);
  EXPECT_TRUE(p.hidden);
}

// Seed 002: 65,536 local tokens x 124,160 vocab x 4 B = 32.55 GB, and 32,768 x 248,320 x 4 B the same.
TEST(PlannerSeed002, NaiveLogits) {
  near_rel(naive_logits_bytes(65536, 124160), 65536.0 * 124160 * 4, kFirstPrinciplesRel, "logits TP2 CP2", "-");
  near_rel(naive_logits_bytes(65536, 124160), 32.55e9, kSeedRoundedRel, "logits vs seed 32.55 GB", "-");
  // Through evaluate: 128K context on CP = 4 (TP = 1), vocab 248,320 -> 32,768 local tokens.
  PlanInput in = load_config(ex("nvl8_256k_b.json"));
  in.model.vocab = 248320;
  in.workload.context = 131072;
  const MeshShape m{1, 1, 4, 1, 4};
  const MeshCheck chk = check_mesh(in, m);
  ASSERT_FALSE(chk.hard()) << chk.layout;
  const Plan p = evaluate(in, m, chk);
  EXPECT_EQ(p.tokens_per_gpu, 32768);
  near_rel(p.naive_logits_bytes, 32768.0 * 248320 * 4, kFirstPrinciplesRel, "logits TP1 CP4", "-");
  near_rel(p.naive_logits_bytes, 32.55e9, kSeedRoundedRel, "logits TP1 CP4 vs seed 32.55 GB", "-");
}

// The byte counts must move with their inputs (guards against a formula that ignores a key).
TEST(PlannerSeed000, TermsRespondToInputs) {
  PlanInput in = load_config(ex("nvl72_1m.json"));
  const Plan base = evaluate(in, *in.mesh);
  in.workload.recompute_bwd_mb_per_token = 1.5;  // the seed's FA4 PR 2816 note: -1 MB/token
  const Plan less = evaluate(in, *in.mesh);
  near_rel(base.activations - less.activations, 16384 * 1e6, kFirstPrinciplesRel, "recompute delta", "-");
  in.cluster.rdma_GBps = 90;  // GB300's 800 Gbps: half the time
  const Plan fast = evaluate(in, *in.mesh);
  near_rel(fast.efsdp_rdma_s, base.efsdp_rdma_s / 2, kFirstPrinciplesRel, "rdma bandwidth", "-");
  in.workload.sequences_per_cp_group = 2;  // "microbatch from 1 to 2"
  const Plan two = evaluate(in, *in.mesh);
  EXPECT_EQ(two.tokens_per_gpu, 2 * base.tokens_per_gpu);
}
