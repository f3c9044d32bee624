#include "reference/model/flops.h"

#include <algorithm>

namespace trident::model {

namespace {
double mm(double M, double N, double K) { return 2.0 * M * N * K; }  // one product (M x K) (K x N)
}  // namespace

StepFlops step_flops(const Config& c, const RunConfig& run) {
  const double B = static_cast<double>(run.sequences), S = static_cast<double>(run.seq_len);
  const double N = B * S;                         // tokens of the step
  const double pairs = B * S * (S + 1.0) / 2.0;  // causal (query, key) pairs
  const double d = static_cast<double>(c.d_model), H = static_cast<double>(c.heads);
  // Per layer: the products of the forward (their backward is twice as much) and the attention core.
  double proj = 0, core_fwd = 0, core_bwd = 0, score = 0;
  double indexer_proj = 0, indexer_select = 0, indexer_fwd = 0, indexer_bwd = 0;  // DSA (0 otherwise)
  if (c.attn == AttnKind::gqa) {
    const double Dh = static_cast<double>(c.head_dim), G = static_cast<double>(c.kv_heads);
    proj = mm(N, H * Dh, d) + 2 * mm(N, G * Dh, d) + mm(N, d, H * Dh);
    score = 2.0 * pairs * H * Dh;
    core_fwd = score + 2.0 * pairs * H * Dh;  // q.k, then p.v
    // scores again, dp = dO.v, dq += dsc k, dk += dsc q, dv += p dO
    core_bwd = score + 2.0 * pairs * H * (Dh + Dh + Dh + Dh);
  } else {
    const double Dn = static_cast<double>(c.nope_dim), Dr = static_cast<double>(c.rope_dim);
    const double Dv = static_cast<double>(c.v_dim), r = static_cast<double>(c.kv_lora_rank);
    const double Dq = r + Dr, Dvl = r;  // the core works in the latent space: key [c_kv, k_rope], value c_kv
    proj = mm(N, H * (Dn + Dr), d) + mm(N, r + Dr, d)  // W_q, W_dkv
           + mm(N * H, r, Dn)                           // q_nope W_uk^T (absorbed into the query)
           + mm(N * H, Dv, r) + mm(N, d, H * Dv);       // W_uv, W_o
    // DSA: the core runs over the selected pairs (min(k, p+1) keys for the query at position p); the indexer scores
    // every causal pair to select (Hi dots of Di, Hi weights), the selected pairs again for its KL term, and again in
    // the backward with dq_I, dk_I and dw; its projections get a weight gradient only (the input is detached).
    double sel_pairs = pairs;
    if (c.dsa()) {
      const double k = static_cast<double>(c.dsa_topk), Hi = static_cast<double>(c.index_heads);
      const double Di = static_cast<double>(c.index_dim), kk = std::min(k, S);
      sel_pairs = B * (kk * (kk + 1.0) / 2.0 + (S - kk) * kk);
      indexer_proj = mm(N, Hi * Di + Hi + Di, d);
      proj += indexer_proj;
      const double iscore = 2.0 * Hi * (Di + 1.0);
      indexer_select = iscore * pairs;
      indexer_fwd = indexer_select + iscore * sel_pairs;
      indexer_bwd = iscore * sel_pairs + 2.0 * sel_pairs * Hi * (2.0 * Di + 1.0);
    }
    score = 2.0 * sel_pairs * H * Dq;
    core_fwd = score + 2.0 * sel_pairs * H * Dvl + indexer_fwd;
    core_bwd = score + 2.0 * sel_pairs * H * (Dvl + Dq + Dq + Dvl) + indexer_bwd;
  }
  auto ffn = [&](double rows, double F) { return 3 * mm(rows, F, d); };  // gate, up, down
  const double dense = ffn(N, static_cast<double>(c.dense_ffn));
  double moe = mm(N, static_cast<double>(c.experts), d)  // router
               + ffn(N * static_cast<double>(c.top_k), static_cast<double>(c.expert_ffn));
  if (c.shared_ffn > 0) moe += ffn(N, static_cast<double>(c.shared_ffn));
  const double L0 = static_cast<double>(c.dense_layers), L1 = static_cast<double>(c.layers - c.dense_layers);
  const double layers_prod = (L0 + L1) * proj + L0 * dense + L1 * moe;  // products of all layers
  const double layers_core_fwd = (L0 + L1) * core_fwd;
  const double head = mm(N, static_cast<double>(c.vocab), d);

  StepFlops f;
  f.forward = layers_prod + layers_core_fwd + head;
  f.attn_core_forward = layers_core_fwd;
  f.attn_score_recompute = (L0 + L1) * score;
  f.lm_head_recompute = head;
  f.backward = 2 * layers_prod - (L0 + L1) * indexer_proj + (L0 + L1) * core_bwd + 3 * head;
  // Full recompute re-runs every layer but not the DSA selection (it is kept).
  f.recompute = run.recompute ? layers_prod + layers_core_fwd - (L0 + L1) * indexer_select : 0;
  return f;
}

}  // namespace trident::model
