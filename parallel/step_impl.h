// The distributed step's per-rank state and its parts (parallel/step.h, docs/parallel.md). One struct; its member
// functions are defined by part:
//   step_fsdp.cpp       parameter shards, FSDP gather / release, gradient accumulators and their reduction
//                       (dense, expert, vocabulary slices), writing shards out for checking
//   step_attention.cpp  context-parallel attention: payload all-gather, zig-zag reorder, key-side reduce-scatter
//   step_ep.cpp         chunked expert parallelism: dispatch, expert compute, combine, and their backward
//   step_layers.cpp     the layer forward / backward and the step driver (forward, loss, backward)
//   step_optimizer.cpp  exact grad norm, AdamW on the shards, router bias update
// Every buffer a kernel or a collective touches is device memory (DeviceBuffer, parallel/device.h) allocated on the
// stream that first writes it and freed on the compute stream once every use is ordered before; the host reads
// device results only at the named sync points (docs/architecture.md "The device seam"). Every cross-rank sum is an
// exact_sum of ExactAcc arrays, rounded once where the single-rank reference rounds.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "parallel/step.h"
#include "reference/check.h"

namespace trident {

template <class T>
using Buf = DeviceBuffer<T>;

template <class T>
constexpr DataType dt() {
  return std::is_same_v<T, double> ? DataType::f64 : DataType::f32;
}
template <class T>
constexpr DataType dt_exact() {
  return std::is_same_v<T, double> ? DataType::exact_f64 : DataType::exact_f32;
}
inline size_t sz(int64_t n) { return static_cast<size_t>(n); }

template <class T>
struct StepImpl {
  using Acc = ExactAcc<T>;
  const StepShared<T>& sh;
  const model::Config& cfg;
  Communicator& world;
  MeshComms& mc;
  Device& dev;
  Kernels<T>& K;
  Stream CS, XS;  // the compute and the communication stream
  Policy pol;
  int rank;
  DenseCoord dc;
  ExpertCoord ec;
  int64_t L, d, V, E, Kt, Eloc, e0;  // e0: first local expert
  int64_t nfc;                       // fsdp*cp
  MemTracker mem;
  PhaseCounts counts;
  VocabSlices vslices;

  // ---- parameters (step_fsdp.cpp) --------------------------------------------------------------------------------
  struct PState {
    size_t p = 0;          // index in the ParamSet layout
    bool expert = false;   // moe.experts.*: per local expert, sharded over e_fsdp
    bool trainable = true;
    ShardSpec spec;        // dense: over fsdp*cp; expert: one expert's tensor over e_fsdp
    int64_t shard = 0;     // this rank's shard index
    int64_t unit = 0;      // 0 embed, 1+i layer i, L+1 head
    int64_t nsh = 0;       // elements stored: shard_elems (dense), Eloc * shard_elems (expert), numel (buffer)
    Buf<T> w, m, v, g;
    int64_t full_elems() const { return spec.rows_per_shard() * spec.n * spec.row_elems; }  // padded gather
  };
  std::vector<PState> ps;
  std::vector<std::vector<size_t>> unit_params;  // per unit: indices into ps (trainable only)
  std::vector<Buf<T>> full;                       // gathered (padded) parameters by ps index; empty when freed
  std::vector<bool> gathered;                     // per unit
  std::vector<Event> ev_gather;                   // per unit
  // Gradient accumulators live in one per-rank arena of ExactAcc (grown between groups, freed after the backward): a
  // group of tensors whose gradients complete together is carved from it, reduced, and the arena is reused by the
  // next group (groups never overlap), so the big full-shape accumulators cost no allocation per use.
  struct AccView {
    Acc* p = nullptr;
    size_t n = 0;
    bool empty() const { return p == nullptr; }
    Acc* data() const { return p; }
  };
  std::vector<AccView> acc;  // by ps index; empty when not live
  Buf<Acc> arena;
  size_t arena_used = 0, arena_live = 0;
  std::vector<int> reduced;  // per ps index: reductions this step (each trainable tensor exactly once)

  StepImpl(const StepShared<T>& s, Communicator& w, MeshComms& c, Device& dv, Kernels<T>& k);
  void note(const std::string& ph, const Communicator& c, CollOp op) { counts[ph][c.name()][static_cast<int>(op)]++; }
  Buf<T> zeros(int64_t n, Stream s);                 // allocated on s and zero-filled there
  void gather(int64_t u, Stream s, const std::string& ph);
  void wait_gather(int64_t u);
  void release(int64_t u);
  void grow_arena(size_t n);
  Acc* arena_take(size_t n, bool zero = true);
  void arena_give();
  void arena_give_top(const Acc* p, size_t n);
  void alloc_grads(const std::vector<size_t>& list);
  void reduce_grads(const std::vector<size_t>& list, const std::string& ph);
  void merge_dense(const Acc* a, int64_t se, T* out, const std::string& ph);
  void merge_expert(const Acc* a, int64_t se, T* out, const std::string& ph);
  int64_t dense_partial_tiles() const;
  static size_t partial_accs(int64_t values);
  TilePartials<T> partials_send(int64_t rows, int64_t row, int64_t block_rows, int64_t nt);
  size_t partials_need(const std::vector<size_t>& list, int64_t nt) const;
  std::vector<TilePartials<T>> partials_take(const std::vector<size_t>& list, int64_t nt);
  void partials_merge(size_t i, const TilePartials<T>& tp, const std::string& ph);
  void merge_partials(const TilePartials<T>& tp, int64_t se, T* out, const std::string& ph);
  bool wgrad_exchange(size_t i, const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K_, int64_t M,
                      const std::string& ph);
  template <class Fill, class FillPartials>
  void reduce_head_slices(const std::string& ph, Fill&& fill, FillPartials&& fill_partials);
  void reduce_embed_slices(const std::string& ph, const T* dx);
  struct SwigluRows {  // one block of rows of a SwiGLU weight gradient: local expert el (0 for dense tensors)
    int64_t el;
    const T *x, *h, *dy, *dug, *duu;  // (n, d), (n, F), (n, d), (n, F), (n, F)
    std::span<const int64_t> segs;
  };
  void swiglu_wgrad(const std::string& prefix, int64_t F, const std::string& ph, const std::vector<SwigluRows>& blocks);
  std::vector<size_t> names(int64_t i, std::initializer_list<const char*> suffixes) const;
  size_t idx(const std::string& name) const { return sh.init->find(name); }
  const T* W(const std::string& name) const;
  Acc* G(const std::string& name) { return acc[idx(name)].data(); }
  int64_t expert_stride(const std::string& name) const { return ps[idx(name)].full_elems(); }
  model::AttnW<T> attn_w(int64_t i) const;
  model::AttnG<T> attn_g(int64_t i);
  void write(model::ParamSet<T>& out, bool grads) const;
  ShardState<T> state() const;
  // After a step whose loss or grad norm is not finite: ": the gradient of NAME is X at element I of rank R's
  // shard" for the first such value of this rank's gradient shards ("" when they are all finite). Host sync.
  std::string first_nonfinite_gradient() const;
  // After the update: "GROUP of NAME is X at element I of rank R's shard" for the first non-finite value of this
  // rank's parameter and moment shards ("" when all are finite). Reads host memory on an immediate device (the
  // emulator's eager device: no sync, no trace entry); "" on others, where the next step's loss or router stops it.
  std::string first_nonfinite_state() const;

  // ---- the current step's rows (step_layers.cpp) -----------------------------------------------------------------
  int64_t N = 0, nseq = 0, ch = 0, S = 0, cp = 1;  // local rows, local sequences, zig-zag chunk, seq_len, cp
  std::vector<int32_t> tokens_h, targets_h;        // host copies (EP lists, embedding slots, valid count)
  Buf<int32_t> tokens, targets;                    // (N)
  Buf<int64_t> pos;                                // (N) global positions
  // Packed sequences (batch.doc_start non-empty): (N) each row's document start and RoPE position (pos - doc).
  bool packed = false;
  Buf<int64_t> docs, rpos;
  const int64_t* rope_pos() const { return packed ? rpos.data() : pos.data(); }
  model::TokenRows rows;                           // host metadata: tile segments (rows.pos: host copy of pos)
  // Per local sequence (rows [2ch j, 2ch (j+1))), from rows.pos / rows.doc once per step: the (query, key) pairs its
  // attention core visits (model::CoreDims::pairs, FLOPs metadata only): causal pos+1 keys per query, packed
  // pos-doc+1, DSA min(topk, those); dsa_select's are the visible keys (core_pairs without the top-k cap).
  std::vector<int64_t> core_pairs, select_pairs;
  std::vector<int64_t> chunk_tile;  // EP chunk k holds local tiles [chunk_tile[k], chunk_tile[k+1])
  std::vector<int64_t> load;        // (L * E) local routed counts (MoE layers), host
  int64_t step_count = 0;
  int64_t run_step = 0;             // steps this RankStep took (the routing counts' step index)
  bool data = true;                 // dev.has_data(): false in a shapes-only run
  // Shapes only: this rank's routing counts of MoE layer i, EP chunk c (E values; drawn or replayed, checked
  // against the chunk's rows).
  const int32_t* routed(int64_t i, int64_t c);

  // ---- per layer ----------------------------------------------------------------------------------------------------
  // One local expert's rows of one EP chunk (owner side): rows from every source in (source, tile, row) order.
  // Shapes only (count-only EP, !dev.has_data()): the row lists are not built; `rows` / `ns` give their lengths,
  // and the kernels get never-read lists of those lengths (unread_rows), segs {0, rows}.
  struct ExBlock {
    std::vector<int64_t> recv_idx;   // row of the chunk's receive buffer for each of the block's rows
    std::vector<int64_t> segs{0};    // tile segments of the block's rows
    int64_t rows = 0;                // recv_idx.size()
    Buf<T> x, ug, uu, h, y;          // forward (n, d), (n, F) x3, (n, d)
    Buf<T> dy, dug, duu, dx;         // backward (n, d), (n, F) x2, (n, d)
    int64_t n() const { return rows; }
    std::span<const int64_t> idx() const { return recv_idx.empty() ? unread_rows(rows) : std::span(recv_idx); }
  };
  struct EpChunk {
    std::vector<int64_t> send_tk;                // (row*K + k) per sent row, in send order
    int64_t ns = 0;                              // send_tk.size()
    std::vector<size_t> scnt, sdis, rcnt, rdis;  // rows per ep peer
    std::vector<ExBlock> ex;                     // per local expert
    std::span<const int64_t> tk() const { return send_tk.empty() ? unread_rows(ns) : std::span(send_tk); }
  };
  struct LayerState {
    bool moe = false;
    Buf<T> a1, rinv1, h, a2, rinv2, ug, uu, hh;
    Buf<T> attn_mem;                            // the attention activations (model::AttnActSizes), one allocation
    model::AttnBufs<T> attn;                    // pointers into attn_mem
    Buf<T> kv;                                  // (nseq, S, P) per local sequence, ascending positions
    Buf<T> logits, scores, gates, yk, sug, suu, sh, sy;
    Buf<int32_t> sel;
    std::vector<int32_t> sel_h;                 // host copy of sel (EP send lists, loads)
    // DSA: (N, topk) each local query's selected keys, made by the first forward and kept (not retired) until the
    // layer's backward, so a full recompute attends the same keys; ikl (N) the queries' indexer KL terms.
    Buf<int32_t> dsa_sel;
    Buf<T> ikl;
    std::vector<EpChunk> chunks;
    int64_t bytes() const;
  };
  std::vector<Event> ev_route, ev_disp, ev_comp, ev_comb, ev_pack;  // per EP chunk (ev_route: per layer use)
  // Frees a layer's buffers on the compute stream (every use on the comm stream is ordered before by the layer's
  // last combine wait).
  void retire(LayerState& st, bool keep_dsa_sel = false);
  // DSA: the exact sum of this rank's indexer KL terms over the step's layers (the indexer loss's numerator).
  Buf<Acc> ikl_acc;

  void attention_fwd(int64_t i, const model::AttnW<T>& w, LayerState& st, T* y, const std::string& ph);
  void core_backward_cp(LayerState& st, const T* dO, T* dqc, T* dpay, T* diq, const std::string& ph);
  bool key_partials(LayerState& st, const T* dO, T* dqc, T* dpay, const std::string& ph);
  TilePartials<T>* gp_field(size_t p, model::AttnGP<T>* gp) const;
  bool attn_out_partials(int64_t i, const model::AttnW<T>& w, LayerState& st, const T* dy, T* dO,
                         const std::vector<size_t>& out_g, const std::string& ph);
  void transpose_blocks(void* dst, const void* src, int64_t rows, int64_t cols, int64_t bytes);  // 2D CP
  void attention_bwd(int64_t i, const model::AttnW<T>& w, LayerState& st, const T* dy, T* da, const std::string& ph);

  struct ExpertW {
    const T *wg, *wu, *wd;
  };
  ExpertW expert_w(int64_t i, int64_t el) const;
  void exchange_rows(const EpChunk& C, bool to_owners, const T* send, T* recv, Stream s, const std::string& ph);
  void ep_dispatch(int64_t i, int64_t c, LayerState& st, Stream s, const std::string& ph);
  void ep_dispatch_counts(int64_t i, int64_t c, LayerState& st, Stream s, const std::string& ph);
  void send_rows(EpChunk& C, LayerState& st, std::span<const int64_t> src_rows, int64_t nr, Stream s,
                 const std::string& ph);
  void ep_compute(int64_t i, int64_t c, LayerState& st);
  void ep_combine(int64_t c, LayerState& st, Stream s, const std::string& ph);
  void moe_fwd(int64_t i, LayerState& st, T* out, const std::string& ph);
  void moe_bwd(int64_t i, LayerState& st, const T* dout, T* da, const std::string& ph);

  void inject_fault(int64_t i);  // StepShared::fault (test hook), once per rank
  bool fault_done = false;
  void layer_fwd(int64_t i, const T* x, LayerState& st, T* out, const std::string& ph);
  void layer_bwd(int64_t i, const T* x, LayerState& st, const T* dout, T* dx, const std::string& ph);
  void count_load(int64_t i, const LayerState& st);
  void take_rows(const model::Batch& b);
  RankStepStats step(const model::Batch& batch);
  void optimizer(RankStepStats& res);
};

// The vocabulary slices of the head (step_fsdp.cpp keeps the merge; the driver passes the fill).
// fill(r, a) adds the slice's dW into accumulators a; fill_partials(r, tp) writes its tile partials into tp's send
// layout (section 4's exchange, where dense_partial_tiles() > 0) or returns false where the kernel set cannot.
template <class T>
template <class Fill, class FillPartials>
void StepImpl<T>::reduce_head_slices(const std::string& ph, Fill&& fill, FillPartials&& fill_partials) {
  const size_t i = idx("lm_head");
  PState& st = ps[i];
  const int64_t rps = st.spec.rows_per_shard(), vr = st.spec.end_row(st.shard) - st.spec.begin_row(st.shard);
  const int64_t nt = dense_partial_tiles();
  for (const Range& r : vslices.head_cols) {
    const int64_t w = r.end - r.begin;
    Buf<T> part(dev, rps * w, CS);
    bool done = false;
    if (nt > 0) {  // the slice's (d, w) gradient as tile partials: fsdp*cp blocks of nt x rps x w values
      const TilePartials<T> tp = partials_send(d, w, rps, nt);
      done = fill_partials(r, tp);
      if (done) merge_partials(tp, rps * w, part.data(), ph);
      arena_give();
    }
    if (!done) {
      Acc* a = arena_take(sz(nfc * rps * w));
      fill(r, a);
      merge_dense(a, rps * w, part.data(), ph);
      arena_give();
    }
    // rows [0, vr) of the slice's columns into the (vr, V) shard: a strided copy
    if (vr > 0)
      dev.copy_2d(st.g.data() + r.begin, V * static_cast<int64_t>(sizeof(T)), part.data(),
                  w * static_cast<int64_t>(sizeof(T)), w * static_cast<int64_t>(sizeof(T)), vr, CS);
  }
  reduced[i]++;
}

}  // namespace trident
