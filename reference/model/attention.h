// Attention of the reference model in three pieces (docs/model.md "Attention"), so the context-parallel step
// can put its all-gather and reduce-scatter between them:
//   (a) attn_qkv_forward: per token, the queries for the core and the KV payload
//       MLA: core query per head [q_nope_h W_uk_h^T (r), rope(q_rope_h) (Dr)]; payload [rmsnorm(c_kv) (r), rope(k_rope) (Dr)]
//       GQA: core query = rope(q) per head (Dh); payload [rope(k) (Hkv*Dh), v (Hkv*Dh)]
//   (b) attn_core_forward/backward: local queries (global positions) against the full payload of their sequence
//       (rows = positions 0..S-1 ascending), causal by global position. Backward returns dq per token and the
//       KEY-SIDE payload gradient as ExactAcc<T> (S, P), unrounded (sum over (query, head) rows, tiles = query
//       tiles, in-tile order token-major / head-minor).
//   (c) attn_qkv_backward: the payload gradient, ROUNDED, back through rope / kv_norm / W_dkv (or Wk, Wv), per token.
//   Output projection: attn_out_forward/backward (MLA: per-head W_uv then W_o; GQA: W_o).
// The single-rank reference rounds the payload gradient right after (b); the CP step reduce-scatters first.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "reference/exact_acc.h"
#include "reference/model/config.h"
#include "reference/model/ops.h"

namespace trident::model {

// Shapes of the core. Head h reads KV group g = h / (H/G): key at payload[g*Dq .. +Dq), value at
// payload[val_base + g*Dv .. +Dv). MLA: G = 1, Dq = r+Dr, Dv = r, val_base = 0 (the value is the latent part
// of the key). GQA: G = Hkv, Dq = Dv = Dh, val_base = Hkv*Dh. scale = 1/sqrt(Dn+Dr) (MLA) or 1/sqrt(Dh) (GQA),
// computed in double and rounded to T.
// DSA (Config::dsa): Hi indexer heads of Di, topk keys per query, the indexer key at payload[ikey .. +Di).
struct CoreDims {
  int64_t H = 0, G = 1, Dq = 0, Dv = 0, P = 0, val_base = 0;
  double scale = 1.0;
  int64_t Hi = 0, Di = 0, topk = 0, ikey = 0;  // DSA only (0 otherwise)
  // Host metadata for cost accounting only (never read by the arithmetic): the (query, key) pairs one call visits
  // over its Nq queries (causal: qpos + 1 keys per query; packed: qpos - qdoc + 1; DSA core: min(topk, visible);
  // dsa_select: the visible keys). 0: unknown (a kernel's FLOPs then count all S keys per query).
  int64_t pairs = 0;
  static CoreDims from(const Config& cfg);
};

// Forward. q: (Nq, H, Dq); qpos: (Nq) global positions (< S); kv: (S, P), row j = position j.
// Per (row, head), keys j = 0..qpos ascending: s_j = (q . k_j) * scale (dot ascending c);
// m = max_j s_j; e_j = exp(s_j - m); l = sum_j e_j (ascending); p_j = e_j / l; o[c] = sum_j p_j * v_j[c].
// stats (Nq, H, 2) = (m, l). bf16: q, k, v and p rounded to bf16 as dot/GEMM operands.
template <class T>
void attn_core_forward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq, const T* kv,
                       int64_t S, T* o /*(Nq,H,Dv)*/, T* stats /*(Nq,H,2)*/);

// Backward. dO: (Nq, H, Dv). qsegs: tile segments of the Nq query rows. dq (Nq, H, Dq) written;
// dkv (S, P) accumulated (exact). Per (row, head): p_j recomputed bit-identically from stats;
// dp_j = dO . v_j; D = dO . o (ascending c, unrounded operands); dsc_j = (p_j * (dp_j - D)) * scale;
// dq[c] = sum_j dsc_j * k_j[c] (ascending j). Key side, per query tile and key j: a partial in T over the
// tile's rows in order (token major, head minor), each row adding dsc_j * q[c] to the key slots and then
// p_j * dO[c] to the value slots; masked pairs add nothing; the partial is added exactly into dkv[j].
template <class T>
void attn_core_backward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq, const T* kv,
                        int64_t S, const T* o, const T* stats, const T* dO, std::span<const int64_t> qsegs, T* dq,
                        ExactAcc<T>* dkv);
// The same with the key side written, not added, in a row order of the caller's: krow (S) a permutation of [0, S)
// (checked); row krow[j] of dkv (S rows of P) = the exact sums of key j's terms (empty, zero, for a key no query
// reaches). The bits of zeroing dkv, attn_core_backward into it, then moving row j to row krow[j]; no row of dkv is
// read (a key's first tile stores its accumulators, the keys without terms are cleared), so dkv need not be zeroed.
template <class T>
void attn_core_backward_rows(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq,
                             const T* kv, int64_t S, const T* o, const T* stats, const T* dO,
                             std::span<const int64_t> qsegs, T* dq, ExactAcc<T>* dkv, std::span<const int64_t> krow);
// The key side as tile partials instead of sums (an exchange of partials, docs/parallel.md section 5): for each key j
// and each tile t of qsegs (nt = qsegs.size() - 1), the tile's partial for key j (P values in T, as attn_core_backward
// forms it before its exact add; +0 where the tile has no term for the key) at row (krow[j] / blk * nt + t) * blk +
// krow[j] % blk of part (S * nt rows of P): blocks of blk rows in krow's order, each block's nt tiles together. krow
// (S) is a permutation of [0, S) and blk divides S (both checked). The exact sum over t of key j's rows, rounded once,
// is attn_core_backward's key side for a zeroed dkv, rounded: the same bits.
template <class T>
void attn_core_backward_partials(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq,
                                 const T* kv, int64_t S, const T* o, const T* stats, const T* dO,
                                 std::span<const int64_t> qsegs, T* dq, T* part, std::span<const int64_t> krow,
                                 int64_t blk);

// Packed sequences (docs/model.md "Packed sequences"): the core under a document mask. qdoc (Nq): the global
// position of each query's document start (0 <= qdoc[r] <= qpos[r]); query r attends keys j in [qdoc[r], qpos[r]]
// only, ascending, with attn_core_forward/backward's arithmetic over that range (so qdoc = 0 everywhere gives their
// bits). Backward: a key outside every row's range receives no term (its accumulator is left as it was).
template <class T>
void attn_doc_core_forward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, const int64_t* qdoc,
                           int64_t Nq, const T* kv, int64_t S, T* o /*(Nq,H,Dv)*/, T* stats /*(Nq,H,2)*/);
template <class T>
void attn_doc_core_backward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, const int64_t* qdoc,
                            int64_t Nq, const T* kv, int64_t S, const T* o, const T* stats, const T* dO,
                            std::span<const int64_t> qsegs, T* dq, ExactAcc<T>* dkv);
// ---- DSA: DeepSeek sparse attention (docs/model.md "Sparse attention (DSA)") ------------------------------------
// iq (Nq, Hi*Di + Hi): per query the Hi indexer queries (Di each) then the Hi indexer weights; the indexer key of
// position j is kv[j*P + ikey .. +Di). Index score of query r and key j:
//   I(r, j) = +0 + w_0 relu(z_0) + ... + w_{Hi-1} relu(z_{Hi-1}),  z_t = dot(iq_t, k_j) ascending c from +0
// (bf16: the dot operands rounded to bf16), relu(z) = z > 0 ? z : +0 (NaN stays NaN, so it is reported).
// dsa_select: sel (Nq, topk) int32 = the positions j in [qdoc[r] (0 without qdoc), qpos[r]] of the topk highest
// I(r, j), ties to the lower position, listed ascending; a query with fewer candidates takes them all, then -1.
// A NaN score is an error. The selection is saved for backward and never recomputed (full recompute reuses it).
template <class T>
void dsa_select(Policy pol, const CoreDims& cd, const T* iq, const int64_t* qpos, const int64_t* qdoc, int64_t Nq,
                const T* kv, int64_t S, int32_t* sel /*(Nq, topk)*/);
// Checks a selection against the queries (every op reading one does): per query, n >= 1 ascending entries in
// [0, qpos[r]], then -1 up to topk. Throws naming the op, the query and the entry.
void dsa_check_selection(const CoreDims& cd, const int32_t* sel, const int64_t* qpos, int64_t Nq, const char* op);
// Sparse attention over the selected keys: attn_core_forward's arithmetic with the keys j = sel[r][0..n) in that
// (ascending) order instead of 0..qpos[r] (so selecting every key of the range gives its bits). ikl (Nq), when
// not null: the indexer's KL term of each query (its loss, docs/model.md):
//   p_j = (+0 + e^0_j/l^0 + ... + e^{H-1}_j/l^{H-1}) / H   (the heads' probabilities, unrounded, ascending heads)
//   mI = max_j I(r, j); eI_j = exp(I_j - mI); lI = +0 + eI_j... (ascending j); lq_j = (I_j - mI) - log(lI)
//   ikl[r] = +0 + sum over j ascending of (p_j > 0 ? p_j * (log(p_j) - lq_j) : +0)
template <class T>
void dsa_core_forward(Policy pol, const CoreDims& cd, const T* q, const T* iq, const int64_t* qpos, int64_t Nq,
                      const T* kv, int64_t S, const int32_t* sel, T* o /*(Nq,H,Dv)*/, T* stats /*(Nq,H,2)*/,
                      T* ikl /*(Nq) or null*/);
// Backward: attn_core_backward's arithmetic over the selected keys (dq written; key/value slots of dkv accumulated),
// plus the indexer loss's gradient with the main attention detached (iscale: the loss's weight per query, e.g.
// 1 / tokens of the global batch): dI_j = (eI_j / lI - p_j) * iscale; per indexer head t and key j ascending:
// dw_t = dw_t + dI_j * relu(z_tj); dz_tj = z_tj > 0 ? dI_j * w_t : +0; diq_t[c] = diq_t[c] + dz_tj * k_j[c];
// the key side adds dz_tj * iq_t[c] into dkv[j][ikey + c] within the same tile partial (rows in order, then the
// attention heads, then the indexer heads; bf16: dz and the operands rounded). diq (Nq, Hi*Di + Hi) written.
template <class T>
void dsa_core_backward(Policy pol, const CoreDims& cd, const T* q, const T* iq, const int64_t* qpos, int64_t Nq,
                       const T* kv, int64_t S, const int32_t* sel, const T* o, const T* stats, const T* dO, T iscale,
                       std::span<const int64_t> qsegs, T* dq, T* diq, ExactAcc<T>* dkv);

// The RoPE position of each row: pos - doc (positions restart in every document) or pos (one document).
std::vector<int64_t> rope_positions(const TokenRows& rows);

template <class T>
struct AttnW {  // pointers into (gathered) weights; unused ones null
  const T *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr;             // GQA (wq, wo also MLA)
  const T *wdkv = nullptr, *kv_norm = nullptr, *wuk = nullptr, *wuv = nullptr;    // MLA
  const T *wiq = nullptr, *wiw = nullptr, *wik = nullptr;                          // DSA indexer
};
template <class T>
struct AttnG {  // gradient accumulators, same layout as the weights
  ExactAcc<T> *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr;
  ExactAcc<T> *wdkv = nullptr, *kv_norm = nullptr, *wuk = nullptr, *wuv = nullptr;
  ExactAcc<T> *wiq = nullptr, *wiw = nullptr, *wik = nullptr;
};
// The projections' gradients as tile partials (reference/tile_reduce.h TilePartials; the distributed step's exchange,
// docs/parallel.md section 4) for attn_out_backward / attn_qkv_backward; kv_norm stays an accumulator.
template <class T>
struct AttnGP {
  TilePartials<T> wq, wk, wv, wo, wdkv, wuk, wuv;
  ExactAcc<T>* kv_norm = nullptr;
};

// Points the fields of an attention view (AttnW<T> or AttnG<T>) of layer i at `at(name)` for each of the layer's
// attention parameters ("layers.{i}.attn.wq", ...): one place that knows which tensors each kind has.
template <class View, class At>
void attn_view(const Config& cfg, int64_t i, At&& at, View& v) {
  const std::string pre = "layers." + std::to_string(i) + ".attn.";
  v.wq = at(pre + "wq");
  v.wo = at(pre + "wo");
  if (cfg.attn == AttnKind::gqa) {
    v.wk = at(pre + "wk");
    v.wv = at(pre + "wv");
  } else {
    v.wdkv = at(pre + "wdkv");
    v.kv_norm = at(pre + "kv_norm");
    v.wuk = at(pre + "wuk");
    v.wuv = at(pre + "wuv");
    if (cfg.dsa()) {
      v.wiq = at(pre + "wiq");
      v.wiw = at(pre + "wiw");
      v.wik = at(pre + "wik");
    }
  }
}

// The activation buffers of attention for N rows, as pointers: host vectors (AttnActs) or device memory (the
// distributed step). Sizes (elements) in AttnActSizes; unused ones (GQA: q, c, kv_rinv, ocat) 0 / null.
template <class T>
struct AttnBufs {
  T* q = nullptr;        // MLA: (N, H*(Dn+Dr)) raw projection a Wq (q_nope needed for the W_uk gradient)
  T* qc = nullptr;       // (N, H, Dq) core query
  T* c = nullptr;        // MLA: (N, r+Dr) raw a W_dkv
  T* kv_rinv = nullptr;  // MLA: (N) rinv of the kv_norm
  T* payload = nullptr;  // (N, P) per-token KV payload
  T* o = nullptr;        // (N, H, Dv_core) core output
  T* stats = nullptr;    // (N, H, 2)
  T* ocat = nullptr;     // MLA: (N, H*Dv) per-head o_h W_uv_h; GQA: unused (o is the W_o input)
  T* iq = nullptr;       // DSA: (N, Hi*Di + Hi) indexer queries and weights
};
struct AttnActSizes {
  int64_t q = 0, qc = 0, c = 0, kv_rinv = 0, payload = 0, o = 0, stats = 0, ocat = 0, iq = 0;
  int64_t total() const { return q + qc + c + kv_rinv + payload + o + stats + ocat + iq; }
  static AttnActSizes of(const Config& cfg, int64_t N);
};
// Host storage of the activations (single-rank reference).
template <class T>
struct AttnActs {
  std::vector<T> q, qc, c, kv_rinv, payload, o, stats, ocat, iq;  // as AttnBufs
  // DSA: (N, topk) the selection (dsa_select). keep_sel: attention_forward reuses it instead of selecting again
  // (full recompute); attn_acts_size leaves it alone.
  std::vector<int32_t> sel;
  bool keep_sel = false;
  std::vector<T> ikl;  // DSA: (N) each query's indexer KL term (dsa_core_forward)
  // The ops read and write through the view; a const AttnActs is only read by the backward ops.
  AttnBufs<T> bufs() const {
    auto p = [](const std::vector<T>& v) { return const_cast<T*>(v.data()); };
    return {p(q), p(qc), p(c), p(kv_rinv), p(payload), p(o), p(stats), p(ocat), p(iq)};
  }
};
// Sizes every activation buffer for N rows (zero-filled). The ops below fill the buffers and never resize them.
template <class T>
void attn_acts_size(const Config& cfg, int64_t N, AttnActs<T>& acts);
// (a) a: (N, d) normed layer input; pos (N). Fills acts.q/qc/c/kv_rinv/payload.
template <class T>
void attn_qkv_forward(Policy pol, const Config& cfg, const AttnW<T>& W, const T* a, const int64_t* pos, int64_t N,
                      const RopeTable<T>& rope, const AttnBufs<T>& acts);
// Output projection: acts.o -> y (N, d) (fills acts.ocat for MLA).
template <class T>
void attn_out_forward(Policy pol, const Config& cfg, const AttnW<T>& W, int64_t N, const AttnBufs<T>& acts, T* y);
// dy (N, d) -> dO (N, H, Dv_core); accumulates wo (and wuv) gradients over segs.
template <class T>
void attn_out_backward(Policy pol, const Config& cfg, const AttnW<T>& W, const AttnG<T>& G, int64_t N,
                       const AttnBufs<T>& acts, const T* dy, std::span<const int64_t> segs, T* dO);
// (c) dqc (N, H, Dq) and the rounded payload gradient dpayload (N, P) of the same rows -> da (N, d) written;
// accumulates wq, wk, wv / wdkv, kv_norm, wuk gradients. da = (dq Wq^T) + (dkv-side dgrad), in that order.
template <class T>
void attn_qkv_backward(Policy pol, const Config& cfg, const AttnW<T>& W, const AttnG<T>& G, const T* a,
                       const int64_t* pos, int64_t N, const RopeTable<T>& rope, const AttnBufs<T>& acts,
                       const T* dqc, const T* dpayload, std::span<const int64_t> segs, T* da);
// The same two with the projections' tile partials written (AttnGP) instead of added: the same partials.
template <class T>
void attn_out_backward(Policy pol, const Config& cfg, const AttnW<T>& W, const AttnGP<T>& G, int64_t N,
                       const AttnBufs<T>& acts, const T* dy, std::span<const int64_t> segs, T* dO);
template <class T>
void attn_qkv_backward(Policy pol, const Config& cfg, const AttnW<T>& W, const AttnGP<T>& G, const T* a,
                       const int64_t* pos, int64_t N, const RopeTable<T>& rope, const AttnBufs<T>& acts,
                       const T* dqc, const T* dpayload, std::span<const int64_t> segs, T* da);

// DSA indexer projections from the layer's normed input a (N, d), detached (no gradient reaches a): iq = [a W_iq,
// a W_iw] (N, Hi*Di + Hi); the indexer key a W_ik (N, Di) into payload[.., ikey ..) (stride P). Three mm.
template <class T>
void dsa_index_forward(Policy pol, const Config& cfg, const AttnW<T>& W, const T* a, int64_t N, const AttnBufs<T>& acts);
// Their weight gradients from diq (N, Hi*Di + Hi) and the payload gradient's indexer slots (stride P): three
// wgrad_acc over segs (W_iq, W_iw, W_ik).
template <class T>
void dsa_index_wgrad(Policy pol, const Config& cfg, const AttnG<T>& G, const T* a, int64_t N, const T* diq,
                     const T* dpayload, std::span<const int64_t> segs);

// Single-rank composition: (a), core per sequence (each sequence's rows must be positions 0..S-1 in order),
// output projection. Backward rounds each sequence's payload gradient right after the core.
template <class T>
void attention_forward(Policy pol, const Config& cfg, const AttnW<T>& W, const T* a, const TokenRows& rows,
                       const RopeTable<T>& rope, AttnActs<T>& acts, T* y);
template <class T>
void attention_backward(Policy pol, const Config& cfg, const AttnW<T>& W, const AttnG<T>& G, const T* a,
                        const TokenRows& rows, const RopeTable<T>& rope, const AttnActs<T>& acts, const T* dy,
                        T* da);

}  // namespace trident::model
