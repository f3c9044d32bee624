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
struct CoreDims {
  int64_t H = 0, G = 1, Dq = 0, Dv = 0, P = 0, val_base = 0;
  double scale = 1.0;
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
// The RoPE position of each row: pos - doc (positions restart in every document) or pos (one document).
std::vector<int64_t> rope_positions(const TokenRows& rows);

template <class T>
struct AttnW {  // pointers into (gathered) weights; unused ones null
  const T *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr;             // GQA (wq, wo also MLA)
  const T *wdkv = nullptr, *kv_norm = nullptr, *wuk = nullptr, *wuv = nullptr;    // MLA
};
template <class T>
struct AttnG {  // gradient accumulators, same layout as the weights
  ExactAcc<T> *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr;
  ExactAcc<T> *wdkv = nullptr, *kv_norm = nullptr, *wuk = nullptr, *wuv = nullptr;
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
};
struct AttnActSizes {
  int64_t q = 0, qc = 0, c = 0, kv_rinv = 0, payload = 0, o = 0, stats = 0, ocat = 0;
  int64_t total() const { return q + qc + c + kv_rinv + payload + o + stats + ocat; }
  static AttnActSizes of(const Config& cfg, int64_t N);
};
// Host storage of the activations (single-rank reference).
template <class T>
struct AttnActs {
  std::vector<T> q, qc, c, kv_rinv, payload, o, stats, ocat;  // as AttnBufs
  // The ops read and write through the view; a const AttnActs is only read by the backward ops.
  AttnBufs<T> bufs() const {
    auto p = [](const std::vector<T>& v) { return const_cast<T*>(v.data()); };
    return {p(q), p(qc), p(c), p(kv_rinv), p(payload), p(o), p(stats), p(ocat)};
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
