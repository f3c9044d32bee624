// The distributed step (parallel/step.h, docs/parallel.md). Mirrors reference/model/model.cpp operation by
// operation; every cross-rank sum is an exact_sum of ExactAcc arrays, rounded once where the reference rounds.
#include "parallel/step.h"

#include <algorithm>
#include <span>
#include <cmath>
#include <type_traits>

#include "reference/check.h"
#include "reference/model/linear_ce.h"
#include "reference/model/train.h"

namespace trident::parallel {

namespace md = trident::model;

template <class T>
void StepShared<T>::validate() const {
  cfg.validate();
  run.validate();
  TD_CHECK(init != nullptr, "StepShared: initial parameters missing");
  if (std::is_same_v<T, double> != (cfg.policy == Policy::fp64))
    fail(fmt::format("step: policy {} needs {} parameters", to_string(cfg.policy),
                     cfg.policy == Policy::fp64 ? "double" : "float"));
  validate_layout(mesh, cfg.experts, run.sequences, run.seq_len, cfg.tile, ep_chunks);
  (void)parallel::vocab_slices(cfg.vocab, cfg.vocab_chunk, mesh.fsdp * mesh.cp, vocab_slices);
  TD_CHECK(rope.max_pos >= run.seq_len, "StepShared: rope table of {} positions for seq_len {}", rope.max_pos,
           run.seq_len);
}

namespace {

template <class T>
constexpr DataType dt() {
  return std::is_same_v<T, double> ? DataType::f64 : DataType::f32;
}
template <class T>
constexpr DataType dt_exact() {
  return std::is_same_v<T, double> ? DataType::exact_f64 : DataType::exact_f32;
}
template <class V>
int64_t vbytes(const V& v) {
  return static_cast<int64_t>(v.capacity() * sizeof(typename V::value_type));
}
template <class T>
int64_t attn_bytes(const md::AttnActs<T>& a) {
  return vbytes(a.q) + vbytes(a.qc) + vbytes(a.c) + vbytes(a.kv_rinv) + vbytes(a.payload) + vbytes(a.o) +
         vbytes(a.stats) + vbytes(a.ocat);
}
size_t sz(int64_t n) { return static_cast<size_t>(n); }

}  // namespace

template <class T>
struct RankStep<T>::Impl {
  using Acc = ExactAcc<T>;
  const StepShared<T>& sh;
  const md::Config& cfg;
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
  int64_t nfc;                      // fsdp*cp
  MemTracker mem;
  PhaseCounts counts;
  VocabSlices vslices;

  // ---- parameters -------------------------------------------------------------------------------------------
  struct PState {
    size_t p = 0;          // index in the ParamSet layout
    bool expert = false;   // moe.experts.*: per local expert, sharded over e_fsdp
    bool trainable = true;
    ShardSpec spec;        // dense: over fsdp*cp; expert: one expert's tensor over e_fsdp
    int64_t shard = 0;     // this rank's shard index
    int64_t unit = 0;      // 0 embed, 1+i layer i, L+1 head
    int64_t nsh = 0;       // elements stored: shard_elems (dense), Eloc * shard_elems (expert), numel (buffer)
    std::vector<T> w, m, v, g;
    int64_t full_elems() const { return spec.rows_per_shard() * spec.n * spec.row_elems; }  // padded gather
  };
  std::vector<PState> ps;
  std::vector<std::vector<size_t>> unit_params;  // per unit: indices into ps (trainable only)
  std::vector<DeviceBuffer<T>> full;              // gathered (padded) parameters by ps index; empty when freed
  // Gradient accumulators live in one per-rank arena of ExactAcc (grown between groups, never freed): a group of
  // tensors whose gradients complete together is carved from it, reduced, and the arena is reused by the next
  // group (groups never overlap), so the big full-shape accumulators cost no allocation or page faults per use.
  struct AccView {
    Acc* p = nullptr;
    size_t n = 0;
    bool empty() const { return p == nullptr; }
    Acc* data() const { return p; }
    size_t size() const { return n; }
  };
  std::vector<AccView> acc;  // by ps index; empty when not live
  std::vector<Acc> arena;
  size_t arena_used = 0, arena_live = 0;
  // Takes n zeroed accumulators from the arena; growing it is only allowed while nothing is live.
  Acc* arena_take(size_t n) {
    if (arena_used + n > arena.size()) {
      TD_CHECK(arena_live == 0, "accumulator arena must grow while {} views are live", arena_live);
      mem.sub(vbytes(arena));
      std::vector<Acc>().swap(arena);
      arena.resize(arena_used + n);
      mem.add(vbytes(arena));
    }
    Acc* p = arena.data() + arena_used;
    std::fill_n(p, n, Acc());
    arena_used += n;
    ++arena_live;
    return p;
  }
  void arena_give() {
    TD_CHECK(arena_live > 0, "accumulator arena: nothing live");
    if (--arena_live == 0) arena_used = 0;
  }
  std::vector<bool> gathered;                     // per unit
  std::vector<Event> ev_gather;                   // per unit
  std::vector<Event> ev_disp, ev_comp, ev_comb;   // per EP chunk
  int64_t step_count = 0;

  // ---- data of the current step -------------------------------------------------------------------------------
  int64_t N = 0, nseq = 0, ch = 0, S = 0, cp = 1;  // local rows, local sequences, zig-zag chunk, seq_len, cp
  std::vector<int32_t> tokens, targets;
  md::TokenRows rows;
  std::vector<int64_t> chunk_tile;  // EP chunk k holds local tiles [chunk_tile[k], chunk_tile[k+1])
  std::vector<int64_t> load;        // (L * E) local routed counts (MoE layers)
  std::string phase;

  Impl(const StepShared<T>& s, Communicator& w, MeshComms& c, Device& dv, Kernels<T>& k)
      : sh(s), cfg(s.cfg), world(w), mc(c), dev(dv), K(k), CS(dv.compute_stream()), XS(dv.comm_stream()),
        pol(s.cfg.policy), rank(w.rank()) {
    sh.validate();
    TD_CHECK(sh.skip_wait.empty() || sh.skip_wait == "fsdp_gather", "step: unknown skip_wait '{}'", sh.skip_wait);
    TD_CHECK_EQ(static_cast<int64_t>(world.size()), sh.mesh.world(), "RankStep: world size vs mesh");
    dc = dense_coord(sh.mesh, rank);
    ec = expert_coord(sh.mesh, rank);
    L = cfg.layers;
    d = cfg.d_model;
    V = cfg.vocab;
    E = cfg.experts;
    Kt = cfg.top_k;
    Eloc = E / sh.mesh.ep;
    e0 = ec.p * Eloc;
    nfc = sh.mesh.fsdp * sh.mesh.cp;
    vslices = vocab_slices(V, cfg.vocab_chunk, nfc, sh.vocab_slices);
    TD_CHECK_EQ(static_cast<int64_t>(mc.fsdp_cp->rank()), dc.f * sh.mesh.cp + dc.c, "fsdp*cp communicator rank");
    TD_CHECK_EQ(static_cast<int64_t>(mc.cp->rank()), dc.c, "cp communicator rank");
    TD_CHECK_EQ(static_cast<int64_t>(mc.ep->rank()), ec.p, "ep communicator rank");
    TD_CHECK_EQ(static_cast<int64_t>(mc.e_fsdp->rank()), ec.ef, "e_fsdp communicator rank");
    TD_CHECK_EQ(static_cast<int64_t>(mc.d_rep->rank()), dc.d, "d_rep communicator rank");
    const md::ParamSet<T>& init = *sh.init;
    unit_params.assign(sz(L + 2), {});
    for (size_t p = 0; p < init.size(); ++p) {
      const md::ParamInfo& in = init.info[p];
      PState s;
      s.p = p;
      s.trainable = in.trainable;
      s.expert = in.name.find(".moe.experts.") != std::string::npos;
      if (in.name == "embed") s.unit = 0;
      else if (in.name.rfind("layers.", 0) == 0) s.unit = 1 + std::stoll(in.name.substr(7));
      else s.unit = L + 1;
      const T* src = init.t[p].ptr();
      if (!s.trainable) {  // buffer: replicated, updated identically everywhere
        s.nsh = init.t[p].size();
        s.w.assign(src, src + s.nsh);
      } else if (s.expert) {
        s.spec = ShardSpec{in.shape[1], in.shape[2], sh.mesh.e_fsdp};
        s.shard = ec.ef;
        const int64_t se = s.spec.shard_elems(), per = in.shape[1] * in.shape[2];
        s.nsh = Eloc * se;
        s.w.assign(sz(s.nsh), T(0));
        for (int64_t el = 0; el < Eloc; ++el) {
          const T* e = src + (e0 + el) * per + s.spec.begin_row(s.shard) * s.spec.row_elems;
          std::copy_n(e, s.spec.valid_elems(s.shard), s.w.data() + el * se);
        }
      } else {
        const int64_t rows = in.shape[0];
        s.spec = ShardSpec{rows, init.t[p].size() / rows, nfc};
        s.shard = mc.fsdp_cp->rank();
        s.nsh = s.spec.shard_elems();
        s.w.assign(sz(s.nsh), T(0));
        std::copy_n(src + s.spec.begin_row(s.shard) * s.spec.row_elems, s.spec.valid_elems(s.shard), s.w.data());
      }
      if (s.trainable) {
        s.m.assign(sz(s.nsh), T(0));
        s.v.assign(sz(s.nsh), T(0));
        s.g.assign(sz(s.nsh), T(0));
        unit_params[sz(s.unit)].push_back(ps.size());
      }
      mem.add(vbytes(s.w) + vbytes(s.m) + vbytes(s.v) + vbytes(s.g));
      ps.push_back(std::move(s));
    }
    full.clear();
    full.resize(ps.size());
    acc.assign(ps.size(), {});
    gathered.assign(sz(L + 2), false);
    for (int64_t u = 0; u < L + 2; ++u) ev_gather.push_back(dev.create_event());
    for (int64_t c = 0; c < sh.ep_chunks; ++c) {
      ev_disp.push_back(dev.create_event());
      ev_comp.push_back(dev.create_event());
      ev_comb.push_back(dev.create_event());
    }
  }

  // ---- collective accounting ---------------------------------------------------------------------------------
  void note(const std::string& ph, const Communicator& c, CollOp op) { counts[ph][c.name()][static_cast<int>(op)]++; }

  // ---- FSDP: gather / free / reduce-scatter per unit -----------------------------------------------------------
  // All-gathers every trainable parameter of unit u (one call per dense tensor over fsdp*cp, one per tensor and
  // local expert over e_fsdp) on stream s, then records ev_gather[u] there.
  void gather(int64_t u, Stream s, const std::string& ph) {
    TD_CHECK(!gathered[sz(u)], "FSDP: unit {} gathered twice", u);
    for (size_t i : unit_params[sz(u)]) {
      PState& st = ps[i];
      DeviceBuffer<T>& f = full[i];  // allocated on the gathering stream, freed on the compute stream
      if (!st.expert) {
        f = DeviceBuffer<T>(dev, st.full_elems(), s);
        mc.fsdp_cp->all_gather(st.w.data(), f.data(), sz(st.spec.shard_elems()), dt<T>(), s);
        note(ph, *mc.fsdp_cp, CollOp::all_gather);
      } else {
        const int64_t stride = st.full_elems(), se = st.spec.shard_elems();
        f = DeviceBuffer<T>(dev, Eloc * stride, s);
        for (int64_t el = 0; el < Eloc; ++el) {
          mc.e_fsdp->all_gather(st.w.data() + el * se, f.data() + el * stride, sz(se), dt<T>(), s);
          note(ph, *mc.e_fsdp, CollOp::all_gather);
        }
      }
      mem.add(f.bytes());
    }
    gathered[sz(u)] = true;
    dev.record(ev_gather[sz(u)], s);
  }
  // The compute stream waits for unit u's gathered parameters.
  void wait_gather(int64_t u) {
    if (sh.skip_wait != "fsdp_gather") dev.wait(CS, ev_gather[sz(u)]);
  }
  void release(int64_t u) {
    for (size_t i : unit_params[sz(u)]) {
      mem.sub(full[i].bytes());
      full[i].reset(CS);
    }
    gathered[sz(u)] = false;
  }
  void alloc_grads(const std::vector<size_t>& list) {
    TD_CHECK(arena_live == 0, "gradient groups overlap");
    size_t total = 0;
    for (size_t i : list) total += sz(ps[i].expert ? Eloc * ps[i].full_elems() : ps[i].full_elems());
    if (total > arena.size()) {  // grow once for the whole group (nothing live)
      mem.sub(vbytes(arena));
      std::vector<Acc>().swap(arena);
      arena.resize(total);
      mem.add(vbytes(arena));
    }
    for (size_t i : list) {
      const PState& st = ps[i];
      TD_CHECK(acc[i].empty(), "gradient accumulator of {} allocated twice", sh.init->info[i].name);
      const size_t n = sz(st.expert ? Eloc * st.full_elems() : st.full_elems());
      acc[i] = AccView{arena_take(n), n};
    }
  }
  std::vector<size_t> names(int64_t i, std::initializer_list<const char*> suffixes) const {
    std::vector<size_t> out;
    for (const char* s : suffixes) out.push_back(idx(fmt::format("layers.{}.{}", i, s)));
    return out;
  }
  std::vector<int> reduced;  // per ps index: reductions this step (each trainable tensor exactly once)
  // As soon as a tensor's gradient is complete: its accumulator is merged across ranks, rounded, freed.
  void reduce_grads(const std::vector<size_t>& list, const std::string& ph) {
    for (size_t i : list) {
      PState& st = ps[i];
      reduced[i]++;
      const int64_t se = st.spec.shard_elems();
      if (!st.expert) {
        merge_dense(acc[i].data(), se, st.g.data(), ph);
      } else {
        const int64_t stride = st.full_elems();
        for (int64_t el = 0; el < Eloc; ++el) merge_expert(acc[i].data() + el * stride, se, st.g.data() + el * se, ph);
      }
      acc[i] = AccView();
      arena_give();
    }
  }
  // A dense accumulator laid out as fsdp*cp blocks of `se` values (block s belongs to fsdp*cp rank s): exact
  // reduce-scatter over fsdp*cp, exact all-reduce over d_rep, this rank's block rounded into out (se values).
  void merge_dense(const Acc* a, int64_t se, T* out, const std::string& ph) {
    std::vector<Acc> part(sz(se));
    mem.add(vbytes(part));
    mc.fsdp_cp->reduce_scatter(a, part.data(), sz(se), dt_exact<T>(), ReduceOp::exact_sum);
    note(ph, *mc.fsdp_cp, CollOp::reduce_scatter);
    mc.d_rep->all_reduce(part.data(), part.data(), sz(se), dt_exact<T>(), ReduceOp::exact_sum);
    note(ph, *mc.d_rep, CollOp::all_reduce);
    K.exact_round(part.data(), out, se, CS);
    mem.sub(vbytes(part));
  }
  // One local expert's accumulator (e_fsdp blocks of se): reduce-scatter over e_fsdp, rounded into out.
  void merge_expert(const Acc* a, int64_t se, T* out, const std::string& ph) {
    std::vector<Acc> part(sz(se));
    mem.add(vbytes(part));
    mc.e_fsdp->reduce_scatter(a, part.data(), sz(se), dt_exact<T>(), ReduceOp::exact_sum);
    note(ph, *mc.e_fsdp, CollOp::reduce_scatter);
    K.exact_round(part.data(), out, se, CS);
    mem.sub(vbytes(part));
  }
  // Vocabulary slices (layout.h vocab_slices, docs/parallel.md section 4): each slice's accumulator is taken
  // from the arena, filled by `fill`, merged like a dense tensor, rounded into the shard and given back.
  // lm_head (d, V): columns [j0, j1) of every row; the accumulator is (padded rows, j1 - j0).
  template <class Fill>
  void reduce_head_slices(const std::string& ph, Fill&& fill) {
    const size_t i = idx("lm_head");
    PState& st = ps[i];
    const int64_t rps = st.spec.rows_per_shard(), vr = st.spec.end_row(st.shard) - st.spec.begin_row(st.shard);
    for (const Range& r : vslices.head_cols) {
      const int64_t w = r.end - r.begin;
      Acc* a = arena_take(sz(nfc * rps * w));
      fill(r, a);
      std::vector<T> part(sz(rps * w));
      merge_dense(a, rps * w, part.data(), ph);
      arena_give();
      for (int64_t k = 0; k < vr; ++k) std::copy_n(part.data() + k * w, w, st.g.data() + k * V + r.begin);
    }
    reduced[i]++;
  }
  // embed (V, d): shard-local rows [a, b) of every fsdp*cp shard; token rows outside the slice get slot -1.
  void reduce_embed_slices(const std::string& ph, const T* dx) {
    const size_t i = idx("embed");
    PState& st = ps[i];
    const int64_t rps = st.spec.rows_per_shard(), vr = st.spec.end_row(st.shard) - st.spec.begin_row(st.shard);
    std::vector<int32_t> slot(sz(N));
    for (const Range& r : vslices.embed_rows) {
      const int64_t h = r.end - r.begin;
      for (int64_t t = 0; t < N; ++t) {
        const int64_t v = tokens[sz(t)], o = v % rps;
        slot[sz(t)] = o >= r.begin && o < r.end ? static_cast<int32_t>(v / rps * h + (o - r.begin)) : -1;
      }
      Acc* a = arena_take(sz(nfc * h * d));
      K.embedding_backward(a, slot.data(), dx, N, d, rows.segs, CS);
      std::vector<T> part(sz(h * d));
      merge_dense(a, h * d, part.data(), ph);
      arena_give();
      for (int64_t k = r.begin; k < std::min(r.end, vr); ++k)
        std::copy_n(part.data() + (k - r.begin) * d, d, st.g.data() + k * d);
    }
    reduced[i]++;
  }
  // The three weight gradients of SwiGLU blocks (the dense MLP, the shared expert, or the local experts: one block
  // of rows each), one tensor at a time. The reference's swiglu_backward_wgrad is exactly wgrad_acc(x, dug) -> wg,
  // wgrad_acc(x, duu) -> wu, wgrad_acc(h, dy) -> wd, so producing, merging and freeing each tensor before the next
  // changes no bit and no collective count, and keeps one tensor's accumulator live instead of three.
  struct SwigluRows {
    const T *x, *h, *dy, *dug, *duu;  // (n, d), (n, F), (n, d), (n, F), (n, F)
    std::span<const int64_t> segs;
  };
  void swiglu_wgrad(const std::string& prefix, int64_t F, const std::string& ph,
                    const std::vector<SwigluRows>& blocks) {
    for (const char* w : {"wg", "wu", "wd"}) {
      const std::string name = prefix + w;
      const std::vector<size_t> g{idx(name)};
      alloc_grads(g);
      for (size_t el = 0; el < blocks.size(); ++el) {  // local expert el (one block for dense tensors)
        const SwigluRows& b = blocks[el];
        Acc* a = G(name) + static_cast<int64_t>(el) * expert_stride(name);
        if (w[1] == 'g') K.wgrad_acc(pol, b.x, d, b.dug, F, d, F, b.segs, a, CS);
        else if (w[1] == 'u') K.wgrad_acc(pol, b.x, d, b.duu, F, d, F, b.segs, a, CS);
        else K.wgrad_acc(pol, b.h, F, b.dy, d, F, d, b.segs, a, CS);
      }
      reduce_grads(g, ph);
    }
  }
  // Pointers into the gathered / accumulating buffers by parameter name suffix of unit u.
  size_t idx(const std::string& name) const { return sh.init->find(name); }
  const T* W(const std::string& name) const {
    const size_t p = idx(name);
    if (!ps[p].trainable) return ps[p].w.data();  // buffers: the replicated copy
    TD_CHECK(!full[p].empty(), "FSDP: parameter {} used while not gathered", name);
    return full[p].data();
  }
  Acc* G(const std::string& name) { return acc[idx(name)].data(); }
  int64_t expert_stride(const std::string& name) const { return ps[idx(name)].full_elems(); }

  // ---- per layer -------------------------------------------------------------------------------------------------
  struct OwnerExpert {  // the rows one local expert served in this layer (all chunks, all sources)
    std::vector<T> x, ug, uu, h, dy, dug, duu;
    std::vector<int64_t> segs{0};      // tile segments over all rows
    std::vector<int64_t> chunk_begin;  // first row of each chunk
  };
  struct EpChunk {
    std::vector<int64_t> send_tk;           // (row*K + k) per sent row, in send order
    std::vector<size_t> scnt, sdis, rcnt, rdis;  // rows per ep peer
    std::vector<std::pair<int32_t, int64_t>> recv_at;  // per received row: (local expert, row in its list)
  };
  struct LayerState {
    bool moe = false;
    std::vector<T> a1, rinv1, h, a2, rinv2, ug, uu, hh;
    md::AttnActs<T> attn;
    std::vector<std::vector<T>> kv;  // per local sequence (S, P), ascending positions
    std::vector<T> logits, scores, gates, yk, sug, suu, sh, sy;
    std::vector<int32_t> sel;
    std::vector<EpChunk> chunks;
    std::vector<OwnerExpert> ex;
    int64_t bytes() const {
      int64_t b = vbytes(a1) + vbytes(rinv1) + vbytes(h) + vbytes(a2) + vbytes(rinv2) + vbytes(ug) + vbytes(uu) +
                  vbytes(hh) + attn_bytes(attn) + vbytes(logits) + vbytes(scores) + vbytes(gates) + vbytes(yk) +
                  vbytes(sug) + vbytes(suu) + vbytes(sh) + vbytes(sy) + vbytes(sel);
      for (const auto& k : kv) b += vbytes(k);
      for (const auto& e : ex)
        b += vbytes(e.x) + vbytes(e.ug) + vbytes(e.uu) + vbytes(e.h) + vbytes(e.dy) + vbytes(e.dug) + vbytes(e.duu);
      return b;
    }
  };

  md::AttnW<T> attn_w(int64_t i) const {
    md::AttnW<T> w;
    md::attn_view(cfg, i, [&](const std::string& n) { return W(n); }, w);
    return w;
  }
  md::AttnG<T> attn_g(int64_t i) {
    md::AttnG<T> g;
    md::attn_view(cfg, i, [&](const std::string& n) { return G(n); }, g);
    return g;
  }

  // CP attention forward on the local rows: payload all-gather per local sequence, core on local queries.
  void attention_fwd(int64_t i, const md::AttnW<T>& w, LayerState& st, T* y, const std::string& ph) {
    const md::CoreDims cd = md::CoreDims::from(cfg);
    const int64_t P = cd.P;
    K.attn_qkv_forward(pol, cfg, w, st.a1.data(), rows.pos.data(), N, sh.rope, st.attn, CS);
    st.attn.o.assign(sz(N * cd.H * cd.Dv), T(0));
    st.attn.stats.assign(sz(N * cd.H * 2), T(0));
    st.kv.assign(sz(nseq), {});
    std::vector<T> gbuf(sz(S * P));
    for (int64_t j = 0; j < nseq; ++j) {
      const int64_t r0 = j * 2 * ch;
      mc.cp->all_gather(st.attn.payload.data() + r0 * P, gbuf.data(), sz(2 * ch * P), dt<T>());
      note(ph, *mc.cp, CollOp::all_gather);
      std::vector<T>& kv = st.kv[sz(j)];
      kv.assign(sz(S * P), T(0));
      K.kv_zigzag_reorder(kv.data(), gbuf.data(), cp, ch * P, /*to_gather=*/false, CS);  // ascending positions
      K.attn_core_forward(pol, cd, st.attn.qc.data() + r0 * cd.H * cd.Dq, rows.pos.data() + r0, 2 * ch, kv.data(), S,
                          st.attn.o.data() + r0 * cd.H * cd.Dv, st.attn.stats.data() + r0 * cd.H * 2, CS);
    }
    K.attn_out_forward(pol, cfg, w, N, st.attn, y, CS);
  }

  // CP attention core backward per local sequence: dq of the local queries, and the key-side payload gradient
  // (exact, over the full sequence) reduce-scattered over cp to the keys' owners, rounded once into dpay.
  void core_backward_cp(LayerState& st, const T* dO, T* dqc, T* dpay, const std::string& ph) {
    const md::CoreDims cd = md::CoreDims::from(cfg);
    const int64_t P = cd.P;
    TD_CHECK(arena_live == 0, "key-side accumulators overlap a gradient group");
    const size_t nk = sz(S * P), nb = sz(ch * P), nm = sz(2 * ch * P);
    if (nk + nb + nm > arena.size()) {
      mem.sub(vbytes(arena));
      std::vector<Acc>().swap(arena);
      arena.resize(nk + nb + nm);
      mem.add(vbytes(arena));
    }
    std::span<Acc> kacc(arena_take(nk), nk), blk(arena_take(nb), nb), mine(arena_take(nm), nm);
    for (int64_t j = 0; j < nseq; ++j) {
      const int64_t r0 = j * 2 * ch;
      if (j > 0) std::fill(kacc.begin(), kacc.end(), Acc());
      const std::vector<int64_t> qsegs = rows.segs_in(r0, r0 + 2 * ch);
      K.attn_core_backward(pol, cd, st.attn.qc.data() + r0 * cd.H * cd.Dq, rows.pos.data() + r0, 2 * ch,
                           st.kv[sz(j)].data(), S, st.attn.o.data() + r0 * cd.H * cd.Dv,
                           st.attn.stats.data() + r0 * cd.H * 2, dO + r0 * cd.H * cd.Dv, qsegs,
                           dqc + r0 * cd.H * cd.Dq, kacc.data(), CS);
      // Position order -> gather order, in place, then the exact reduce-scatter: each cp rank receives the
      // key-side sums of its own rows, unrounded.
      K.kv_zigzag_to_gather_acc(kacc.data(), blk.data(), cp, ch * P, CS);
      mc.cp->reduce_scatter(kacc.data(), mine.data(), sz(2 * ch * P), dt_exact<T>(), ReduceOp::exact_sum);
      note(ph, *mc.cp, CollOp::reduce_scatter);
      K.exact_round(mine.data(), dpay + r0 * P, 2 * ch * P, CS);  // the single rounding of the key side
    }
    arena_give();
    arena_give();
    arena_give();
  }

  void attention_bwd(int64_t i, const md::AttnW<T>& w, LayerState& st, const T* dy, T* da, const std::string& ph) {
    const md::CoreDims cd = md::CoreDims::from(cfg);
    const int64_t P = cd.P;
    const bool gqa = cfg.attn == md::AttnKind::gqa;
    std::vector<T> dO(sz(N * cd.H * cd.Dv)), dqc(sz(N * cd.H * cd.Dq)), dpay(sz(N * P));
    const std::vector<size_t> out_g = gqa ? names(i, {"attn.wo"}) : names(i, {"attn.wo", "attn.wuv"});
    alloc_grads(out_g);
    K.attn_out_backward(pol, cfg, w, attn_g(i), N, st.attn, dy, rows.segs, dO.data(), CS);
    reduce_grads(out_g, ph);
    core_backward_cp(st, dO.data(), dqc.data(), dpay.data(), ph);  // key-side accumulators freed inside
    const std::vector<size_t> qkv_g = gqa ? names(i, {"attn.wq", "attn.wk", "attn.wv"})
                                          : names(i, {"attn.wq", "attn.wdkv", "attn.kv_norm", "attn.wuk"});
    alloc_grads(qkv_g);
    K.attn_qkv_backward(pol, cfg, w, attn_g(i), st.a1.data(), rows.pos.data(), N, sh.rope, st.attn, dqc.data(),
                        dpay.data(), rows.segs, da, CS);
    reduce_grads(qkv_g, ph);
  }

  // ---- EP ------------------------------------------------------------------------------------------------------
  struct ExpertW {
    const T *wg, *wu, *wd;
  };
  ExpertW expert_w(int64_t i, int64_t el) const {
    auto n = [&](const char* s) { return fmt::format("layers.{}.moe.experts.{}", i, s); };
    return {W(n("wg")) + el * expert_stride(n("wg")), W(n("wu")) + el * expert_stride(n("wu")),
            W(n("wd")) + el * expert_stride(n("wd"))};
  }

  // Dispatch of chunk c (on stream s): counts per (peer, local expert, tile) with all_to_all, the input rows with
  // all_to_allv. Rows to each peer in (local expert, tile, row) order; the owner appends them per expert in
  // (source, tile, row) order. Fills the chunk's bookkeeping and the owner's x rows.
  // One AlltoAllv of rows of width d over ep with a chunk's row counts: to_owners sends the source rows to the
  // expert owners (send scnt/sdis, receive rcnt/rdis); otherwise the owners' rows go back to their sources.
  void exchange_rows(const EpChunk& C, bool to_owners, const T* send, T* recv, Stream s, const std::string& ph) {
    const auto& snd_c = to_owners ? C.scnt : C.rcnt;
    const auto& snd_d = to_owners ? C.sdis : C.rdis;
    const auto& rcv_c = to_owners ? C.rcnt : C.scnt;
    const auto& rcv_d = to_owners ? C.rdis : C.sdis;
    const int64_t ep = sh.mesh.ep;
    std::vector<size_t> sc(sz(ep)), sd(sz(ep)), rc(sz(ep)), rd(sz(ep));
    for (int64_t q = 0; q < ep; ++q) {
      sc[sz(q)] = snd_c[sz(q)] * sz(d);
      sd[sz(q)] = snd_d[sz(q)] * sz(d);
      rc[sz(q)] = rcv_c[sz(q)] * sz(d);
      rd[sz(q)] = rcv_d[sz(q)] * sz(d);
    }
    mc.ep->all_to_allv(send, sc.data(), sd.data(), recv, rc.data(), rd.data(), dt<T>(), s);
    note(ph, *mc.ep, CollOp::all_to_allv);
  }

  void ep_dispatch(int64_t c, LayerState& st, Stream s, const std::string& ph) {
    const int64_t ep = sh.mesh.ep, t0 = chunk_tile[sz(c)], t1 = chunk_tile[sz(c + 1)], nt = t1 - t0;
    EpChunk& C = st.chunks[sz(c)];
    std::vector<int64_t> cs(sz(ep * Eloc * nt), 0), cr(sz(ep * Eloc * nt), 0);
    dev.synchronize(CS);  // host sync point 1: the routing (sel, from router_forward) builds the send lists
    std::vector<std::vector<int64_t>> lists(sz(E * nt));  // (expert, tile) -> (row*K + k)
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t r = rows.segs[sz(t)]; r < rows.segs[sz(t + 1)]; ++r)
        for (int64_t k = 0; k < Kt; ++k) lists[sz(st.sel[sz(r * Kt + k)] * nt + (t - t0))].push_back(r * Kt + k);
    C.scnt.assign(sz(ep), 0);
    C.sdis.assign(sz(ep), 0);
    C.rcnt.assign(sz(ep), 0);
    C.rdis.assign(sz(ep), 0);
    C.send_tk.clear();
    for (int64_t q = 0; q < ep; ++q) {
      C.sdis[sz(q)] = C.send_tk.size();
      for (int64_t el = 0; el < Eloc; ++el)
        for (int64_t t = 0; t < nt; ++t) {
          const auto& l = lists[sz((q * Eloc + el) * nt + t)];
          cs[sz((q * Eloc + el) * nt + t)] = static_cast<int64_t>(l.size());
          C.send_tk.insert(C.send_tk.end(), l.begin(), l.end());
        }
      C.scnt[sz(q)] = C.send_tk.size() - C.sdis[sz(q)];
    }
    mc.ep->all_to_all(cs.data(), cr.data(), sz(Eloc * nt), DataType::i64, s);
    dev.synchronize(s);  // host sync point 2: the received counts size the receive buffers
    note(ph, *mc.ep, CollOp::all_to_all);
    size_t nr = 0;
    for (int64_t q = 0; q < ep; ++q) {
      C.rdis[sz(q)] = nr;
      for (int64_t j = 0; j < Eloc * nt; ++j) nr += sz(cr[sz(q * Eloc * nt + j)]);
      C.rcnt[sz(q)] = nr - C.rdis[sz(q)];
    }
    std::vector<T> sbuf(C.send_tk.size() * sz(d)), rbuf(nr * sz(d));
    std::vector<int64_t> src_rows(C.send_tk.size());
    for (size_t j = 0; j < C.send_tk.size(); ++j) src_rows[j] = C.send_tk[j] / Kt;
    K.gather_rows(sbuf.data(), st.a2.data(), src_rows, d, s);
    mem.add(vbytes(sbuf) + vbytes(rbuf));
    exchange_rows(C, /*to_owners=*/true, sbuf.data(), rbuf.data(), s, ph);
    // Owner: append per local expert in (source, tile, row) order; tile segments per (source, tile).
    C.recv_at.assign(nr, {0, 0});
    for (int64_t el = 0; el < Eloc; ++el) st.ex[sz(el)].chunk_begin.push_back(
        static_cast<int64_t>(st.ex[sz(el)].x.size()) / d);
    std::vector<size_t> pos_in_src(sz(ep), 0);
    for (int64_t el = 0; el < Eloc; ++el) {
      OwnerExpert& X = st.ex[sz(el)];
      for (int64_t q = 0; q < ep; ++q) {
        size_t off = C.rdis[sz(q)];
        for (int64_t e2 = 0; e2 < el; ++e2)
          for (int64_t t = 0; t < nt; ++t) off += sz(cr[sz((q * Eloc + e2) * nt + t)]);
        for (int64_t t = 0; t < nt; ++t) {
          const int64_t n = cr[sz((q * Eloc + el) * nt + t)];
          for (int64_t r = 0; r < n; ++r) {
            const int64_t at = static_cast<int64_t>(X.x.size()) / d;
            X.x.insert(X.x.end(), rbuf.begin() + static_cast<std::ptrdiff_t>((off + sz(r)) * sz(d)),
                       rbuf.begin() + static_cast<std::ptrdiff_t>((off + sz(r) + 1) * sz(d)));
            C.recv_at[off + sz(r)] = {static_cast<int32_t>(el), at};
          }
          off += sz(n);
          if (n > 0) X.segs.push_back(static_cast<int64_t>(X.x.size()) / d);
        }
      }
    }
    mem.sub(vbytes(sbuf) + vbytes(rbuf));
  }

  // Expert forward of chunk c's rows (owner) on the compute stream.
  void ep_compute(int64_t i, int64_t c, LayerState& st) {
    const int64_t F = cfg.expert_ffn;
    for (int64_t el = 0; el < Eloc; ++el) {
      OwnerExpert& X = st.ex[sz(el)];
      const int64_t b = X.chunk_begin[sz(c)], n = static_cast<int64_t>(X.x.size()) / d - b;
      X.ug.resize(sz((b + n) * F));
      X.uu.resize(sz((b + n) * F));
      X.h.resize(sz((b + n) * F));
      std::vector<T> y(sz(n * d));
      const ExpertW w = expert_w(i, el);
      K.expert_forward(pol, X.x.data() + b * d, w.wg, w.wu, w.wd, n, d, F, X.ug.data() + b * F, X.uu.data() + b * F,
                       X.h.data() + b * F, y.data(), CS);
      ybuf[sz(el)] = std::move(y);
    }
  }
  std::vector<std::vector<T>> ybuf;  // per local expert: this chunk's outputs

  // Return of chunk c's outputs (reverse all_to_allv) into yk (row*K + k, d) at the source.
  void ep_combine(int64_t c, LayerState& st, Stream s, const std::string& ph) {
    EpChunk& C = st.chunks[sz(c)];
    const size_t nr = C.recv_at.size();
    std::vector<T> sbuf(nr * sz(d)), rbuf(C.send_tk.size() * sz(d));
    for (size_t j = 0; j < nr; ++j) {
      const auto [el, at] = C.recv_at[j];
      const int64_t b = st.ex[sz(el)].chunk_begin[sz(c)];
      std::copy_n(ybuf[sz(el)].data() + (at - b) * d, d, sbuf.data() + j * sz(d));
    }
    mem.add(vbytes(sbuf) + vbytes(rbuf));
    exchange_rows(C, /*to_owners=*/false, sbuf.data(), rbuf.data(), s, ph);
    K.scatter_rows(st.yk.data(), rbuf.data(), C.send_tk, d, s);
    mem.sub(vbytes(sbuf) + vbytes(rbuf));
  }

  void moe_fwd(int64_t i, LayerState& st, T* out, const std::string& ph) {
    const int64_t Fs = cfg.shared_ffn, n = sh.ep_chunks;
    auto nm = [&](const char* s) { return fmt::format("layers.{}.moe.{}", i, s); };
    st.logits.assign(sz(N * E), T(0));
    st.scores.assign(sz(N * E), T(0));
    st.sel.assign(sz(N * Kt), 0);
    st.gates.assign(sz(N * Kt), T(0));
    K.router_forward(pol, st.a2.data(), W(nm("router")), W(nm("router_bias")), N, d, E, Kt, cfg.routed_scale,
                     st.logits.data(), st.scores.data(), st.sel.data(), st.gates.data(), CS);
    st.yk.assign(sz(N * Kt * d), T(0));
    st.chunks.assign(sz(n), {});
    st.ex.assign(sz(Eloc), {});
    ybuf.assign(sz(Eloc), {});
    // Chunked EP: chunk c+1's dispatch is issued on the comm stream before chunk c's expert GEMMs run on the
    // compute stream; each chunk's combine waits for its GEMMs.
    const Stream cs = dev.compute_stream(), xs = dev.comm_stream();
    ep_dispatch(0, st, xs, ph);
    dev.record(ev_disp[0], xs);
    for (int64_t c = 0; c < n; ++c) {
      dev.wait(cs, ev_disp[sz(c)]);
      if (c + 1 < n) {
        ep_dispatch(c + 1, st, xs, ph);
        dev.record(ev_disp[sz(c + 1)], xs);
      }
      ep_compute(i, c, st);
      dev.record(ev_comp[sz(c)], cs);
      dev.wait(xs, ev_comp[sz(c)]);
      ep_combine(c, st, xs, ph);
      dev.record(ev_comb[sz(c)], xs);
    }
    dev.wait(cs, ev_comb[sz(n - 1)]);
    ybuf.assign(sz(Eloc), {});
    K.moe_combine_forward(out, st.gates.data(), st.yk.data(), N, d, Kt, CS);  // as moe_forward
    K.on_moe_combined(i, st.a2.data(), st.gates.data(), st.sel.data(), out, N, d, Kt, CS);
    if (Fs > 0) {
      st.sug.assign(sz(N * Fs), T(0));
      st.suu.assign(sz(N * Fs), T(0));
      st.sh.assign(sz(N * Fs), T(0));
      st.sy.assign(sz(N * d), T(0));
      K.swiglu_forward(pol, st.a2.data(), W(nm("shared.wg")), W(nm("shared.wu")), W(nm("shared.wd")), N, d, Fs,
                       st.sug.data(), st.suu.data(), st.sh.data(), st.sy.data(), CS);
      K.residual_forward(out, out, st.sy.data(), N * d, CS);
    }
  }

  void moe_bwd(int64_t i, LayerState& st, const T* dout, T* da, const std::string& ph) {
    const int64_t Fs = cfg.shared_ffn, F = cfg.expert_ffn, n = sh.ep_chunks;
    auto nm = [&](const char* s) { return fmt::format("layers.{}.moe.{}", i, s); };
    std::vector<T> dgates(sz(N * Kt), T(0)), dxk(sz(N * Kt * d), T(0));
    for (auto& X : st.ex) {
      const size_t nr = X.x.size() / sz(d);
      X.dy.assign(nr * sz(d), T(0));
      X.dug.assign(nr * sz(F), T(0));
      X.duu.assign(nr * sz(F), T(0));
    }
    const Stream cs = dev.compute_stream(), xs = dev.comm_stream();
    // Chunked EP backward, overlapped like the forward: chunk c+1's dy dispatch is issued on the comm stream before
    // chunk c's dgrad runs on the compute stream; chunk c's dx combine waits only for that dgrad, and the compute
    // stream waits for the combines once, after the last chunk.
    // Per chunk, alive until the layer's backward ends (a stream may still read a send buffer after the call is
    // issued): dy sent / received, dx sent / returned.
    std::vector<std::vector<T>> dy_send(sz(n)), dy_recv(sz(n)), dx_send(sz(n)), dx_recv(sz(n));
    auto send_dy = [&](int64_t c) {  // source: dgate = dout . y (ascending c), dy = gate * dout, forward's order
      EpChunk& C = st.chunks[sz(c)];
      std::vector<T>& sbuf = dy_send[sz(c)];
      sbuf.assign(C.send_tk.size() * sz(d), T(0));
      dy_recv[sz(c)].assign(C.recv_at.size() * sz(d), T(0));
      K.moe_combine_backward(dout, st.gates.data(), st.yk.data(), C.send_tk, d, Kt, dgates.data(), sbuf.data(), CS);
      mem.add(vbytes(sbuf) + vbytes(dy_recv[sz(c)]));
      exchange_rows(C, /*to_owners=*/true, sbuf.data(), dy_recv[sz(c)].data(), xs, ph);
      dev.record(ev_disp[sz(c)], xs);
    };
    send_dy(0);
    for (int64_t c = 0; c < n; ++c) {
      EpChunk& C = st.chunks[sz(c)];
      dev.wait(cs, ev_disp[sz(c)]);
      for (size_t j = 0; j < C.recv_at.size(); ++j) {
        const auto [el, at] = C.recv_at[j];
        std::copy_n(dy_recv[sz(c)].data() + j * sz(d), d, st.ex[sz(el)].dy.data() + at * d);
      }
      if (c + 1 < n) send_dy(c + 1);
      // owner: dgrad of this chunk's rows (wgrad delayed)
      std::vector<std::vector<T>> dx(sz(Eloc));
      {
        for (int64_t el = 0; el < Eloc; ++el) {
          OwnerExpert& X = st.ex[sz(el)];
          const int64_t b = X.chunk_begin[sz(c)];
          const int64_t e = c + 1 < n ? X.chunk_begin[sz(c + 1)] : static_cast<int64_t>(X.x.size()) / d;
          const ExpertW w = expert_w(i, el);
          dx[sz(el)].assign(sz((e - b) * d), T(0));
          K.expert_backward_dgrad(pol, X.dy.data() + b * d, w.wg, w.wu, w.wd, X.ug.data() + b * F,
                                  X.uu.data() + b * F, e - b, d, F, X.dug.data() + b * F, X.duu.data() + b * F,
                                  dx[sz(el)].data(), CS);
        }
      }
      dev.record(ev_comp[sz(c)], cs);
      dev.wait(xs, ev_comp[sz(c)]);
      std::vector<T>& s2 = dx_send[sz(c)];
      s2.assign(C.recv_at.size() * sz(d), T(0));
      dx_recv[sz(c)].assign(C.send_tk.size() * sz(d), T(0));
      mem.add(vbytes(s2) + vbytes(dx_recv[sz(c)]));
      for (size_t j = 0; j < C.recv_at.size(); ++j) {
        const auto [el, at] = C.recv_at[j];
        const int64_t b = st.ex[sz(el)].chunk_begin[sz(c)];
        std::copy_n(dx[sz(el)].data() + (at - b) * d, d, s2.data() + j * sz(d));
      }
      exchange_rows(C, /*to_owners=*/false, s2.data(), dx_recv[sz(c)].data(), xs, ph);
      dev.record(ev_comb[sz(c)], xs);
    }
    dev.wait(cs, ev_comb[sz(n - 1)]);  // the comm stream is in order: every chunk's combine is done
    for (int64_t c = 0; c < n; ++c) {
      const EpChunk& C = st.chunks[sz(c)];
      K.scatter_rows(dxk.data(), dx_recv[sz(c)].data(), C.send_tk, d, CS);
      mem.sub(vbytes(dy_send[sz(c)]) + vbytes(dy_recv[sz(c)]) + vbytes(dx_send[sz(c)]) + vbytes(dx_recv[sz(c)]));
    }
    // Delayed wgrad: one pass per local expert over all chunks' rows (tiles never split by a chunk).
    std::vector<SwigluRows> owned;
    for (int64_t el = 0; el < Eloc; ++el) {
      const OwnerExpert& X = st.ex[sz(el)];
      owned.push_back({X.x.data(), X.h.data(), X.dy.data(), X.dug.data(), X.duu.data(), X.segs});
    }
    swiglu_wgrad(nm("experts."), F, ph, owned);
    // da = +0, += expert dx (selected e ascending), += shared dx, += router dx (as moe_backward)
    K.moe_dx_sum(da, dxk.data(), N, d, Kt, CS);
    std::vector<T> tmp(sz(N * d));
    if (Fs > 0) {
      std::vector<T> dug(sz(N * Fs)), duu(sz(N * Fs));
      K.swiglu_backward_dgrad(pol, dout, W(nm("shared.wg")), W(nm("shared.wu")), W(nm("shared.wd")), st.sug.data(),
                              st.suu.data(), N, d, Fs, dug.data(), duu.data(), tmp.data(), CS);
      swiglu_wgrad(nm("shared."), Fs, ph, {{st.a2.data(), st.sh.data(), dout, dug.data(), duu.data(), rows.segs}});
      K.residual_forward(da, da, tmp.data(), N * d, CS);
    }
    std::vector<T> dlogits(sz(N * E));
    K.router_backward(dgates.data(), st.scores.data(), st.sel.data(), N, E, Kt, cfg.routed_scale, dlogits.data(), CS);
    const std::vector<size_t> rg = names(i, {"moe.router"});
    alloc_grads(rg);
    K.wgrad_acc(pol, st.a2.data(), d, dlogits.data(), E, d, E, rows.segs, G(nm("router")), CS);
    reduce_grads(rg, ph);
    K.mm(pol, N, d, E, dlogits.data(), E, W(nm("router")), E, true, tmp.data(), d, CS);
    K.residual_forward(da, da, tmp.data(), N * d, CS);
  }

  // ---- layer forward / backward (reference layer_forward / layer_backward) ----------------------------------------
  void layer_fwd(int64_t i, const T* x, LayerState& st, T* out, const std::string& ph) {
    auto nm = [&](const char* s) { return fmt::format("layers.{}.{}", i, s); };
    st.moe = cfg.is_moe_layer(i);
    st.a1.assign(sz(N * d), T(0));
    st.rinv1.assign(sz(N), T(0));
    K.rmsnorm_forward(x, d, W(nm("attn_norm")), N, d, cfg.norm_eps, st.a1.data(), d, st.rinv1.data(), CS);
    std::vector<T> y(sz(N * d));
    attention_fwd(i, attn_w(i), st, y.data(), ph);
    st.h.assign(sz(N * d), T(0));
    K.residual_forward(st.h.data(), x, y.data(), N * d, CS);
    st.a2.assign(sz(N * d), T(0));
    st.rinv2.assign(sz(N), T(0));
    K.rmsnorm_forward(st.h.data(), d, W(nm("ffn_norm")), N, d, cfg.norm_eps, st.a2.data(), d, st.rinv2.data(), CS);
    if (!st.moe) {
      const int64_t F = cfg.dense_ffn;
      st.ug.assign(sz(N * F), T(0));
      st.uu.assign(sz(N * F), T(0));
      st.hh.assign(sz(N * F), T(0));
      K.swiglu_forward(pol, st.a2.data(), W(nm("mlp.wg")), W(nm("mlp.wu")), W(nm("mlp.wd")), N, d, F, st.ug.data(),
                       st.uu.data(), st.hh.data(), y.data(), CS);
    } else {
      moe_fwd(i, st, y.data(), ph);
    }
    K.residual_forward(out, st.h.data(), y.data(), N * d, CS);
  }

  void layer_bwd(int64_t i, const T* x, LayerState& st, const T* dout, T* dx, const std::string& ph) {
    auto nm = [&](const char* s) { return fmt::format("layers.{}.{}", i, s); };
    std::vector<T> da(sz(N * d)), dn(sz(N * d)), dh(sz(N * d));
    if (!st.moe) {
      const int64_t F = cfg.dense_ffn;
      std::vector<T> dug(sz(N * F)), duu(sz(N * F));
      K.swiglu_backward_dgrad(pol, dout, W(nm("mlp.wg")), W(nm("mlp.wu")), W(nm("mlp.wd")), st.ug.data(),
                              st.uu.data(), N, d, F, dug.data(), duu.data(), da.data(), CS);
      swiglu_wgrad(nm("mlp."), F, ph, {{st.a2.data(), st.hh.data(), dout, dug.data(), duu.data(), rows.segs}});
    } else {
      moe_bwd(i, st, dout, da.data(), ph);
    }
    const std::vector<size_t> n2 = names(i, {"ffn_norm"}), n1 = names(i, {"attn_norm"});
    alloc_grads(n2);
    K.rmsnorm_backward(da.data(), d, st.h.data(), d, st.rinv2.data(), W(nm("ffn_norm")), N, d, rows.segs, dn.data(), d,
                       G(nm("ffn_norm")), CS);
    reduce_grads(n2, ph);
    K.residual_forward(dh.data(), dout, dn.data(), N * d, CS);
    attention_bwd(i, attn_w(i), st, dh.data(), da.data(), ph);
    alloc_grads(n1);
    K.rmsnorm_backward(da.data(), d, x, d, st.rinv1.data(), W(nm("attn_norm")), N, d, rows.segs, dn.data(), d,
                       G(nm("attn_norm")), CS);
    reduce_grads(n1, ph);
    K.residual_forward(dx, dh.data(), dn.data(), N * d, CS);
  }

  void count_load(int64_t i, const LayerState& st) {
    for (int64_t j = 0; j < N * Kt; ++j) load[sz(i * E + st.sel[sz(j)])]++;
  }

  // ---- the step ----------------------------------------------------------------------------------------------------
  void take_rows(const md::Batch& b) {
    TD_CHECK(b.B == sh.run.sequences && b.S == sh.run.seq_len, "step: batch {}x{} but the run expects {}x{}", b.B,
             b.S, sh.run.sequences, sh.run.seq_len);
    S = b.S;
    cp = sh.mesh.cp;
    ch = S / (2 * cp);
    const auto ranges = local_tokens(sh.mesh, rank, b.B, b.S);
    nseq = static_cast<int64_t>(ranges.size()) / 2;
    N = nseq * 2 * ch;
    rows = md::TokenRows();
    rows.n = N;
    rows.segs = {0};
    tokens.clear();
    targets.clear();
    for (const TokenRange& r : ranges) {
      for (int64_t p = r.begin; p < r.end; ++p) {
        rows.seq.push_back(r.seq);
        rows.pos.push_back(p);
        tokens.push_back(b.tokens[sz(r.seq * S + p)]);
        targets.push_back(b.targets[sz(r.seq * S + p)]);
        const int64_t n = static_cast<int64_t>(rows.pos.size());
        if ((p + 1) % cfg.tile == 0 || p + 1 == r.end) rows.segs.push_back(n);  // tiles of T positions
      }
    }
    const int64_t nt = static_cast<int64_t>(rows.segs.size()) - 1, n = sh.ep_chunks;
    chunk_tile.assign(sz(n + 1), 0);
    for (int64_t k = 0; k <= n; ++k) chunk_tile[sz(k)] = k * nt / n;
  }

  RankStepStats step(const md::Batch& batch) {
    counts.clear();
    reduced.assign(ps.size(), 0);
    take_rows(batch);
    const bool rec = sh.run.recompute;
    load.assign(sz(L * E), 0);
    const Stream cs = dev.compute_stream(), xs = dev.comm_stream();
    auto fwd = [](int64_t u) { return u == 0 ? std::string("fwd.embed") : fmt::format("fwd.layer.{}", u - 1); };
    auto bwd = [&](int64_t u) {
      return u == 0 ? std::string("bwd.embed") : u == L + 1 ? std::string("bwd.head") : fmt::format("bwd.layer.{}", u - 1);
    };
    // ---- forward: unit u's gather was issued (prefetched) while unit u-1 computed
    std::vector<std::vector<T>> xsave(sz(L + 1));
    std::vector<LayerState> states(sz(L));
    std::vector<int64_t> st_bytes(sz(L), 0);
    gather(0, xs, "fwd.embed");
    wait_gather(0);
    gather(1, xs, fwd(1));
    xsave[0].assign(sz(N * d), T(0));
    mem.add(vbytes(xsave[0]));
    K.embedding_forward(xsave[0].data(), tokens.data(), W("embed"), N, d, V, CS);
    release(0);
    for (int64_t i = 0; i < L; ++i) {
      const int64_t u = 1 + i;
      wait_gather(u);
      gather(u + 1, xs, u + 1 == L + 1 ? std::string("fwd.head") : fwd(u + 1));
      xsave[sz(i + 1)].assign(sz(N * d), T(0));
      mem.add(vbytes(xsave[sz(i + 1)]));
      LayerState& st = states[sz(i)];
      layer_fwd(i, xsave[sz(i)].data(), st, xsave[sz(i + 1)].data(), fwd(u));
      if (st.moe) count_load(i, st);
      if (rec) st = LayerState();  // full recompute: keep only the layer input
      else mem.add(st_bytes[sz(i)] = st.bytes());
      release(u);
    }
    // ---- head: final norm, linear CE, global loss
    wait_gather(L + 1);
    std::vector<T> hidden(sz(N * d)), rinvf(sz(N)), token_loss(sz(N), T(0)), lse(sz(N));
    mem.add(vbytes(hidden) + vbytes(token_loss) + vbytes(lse));
    K.rmsnorm_forward(xsave[sz(L)].data(), d, W("final_norm"), N, d, cfg.norm_eps, hidden.data(), d, rinvf.data(), CS);
    K.linear_ce_forward(pol, hidden.data(), W("lm_head"), targets.data(), N, d, V, cfg.vocab_chunk, sh.run.token_chunk, token_loss.data(), lse.data(), CS);
    int64_t nvalid = 0;
    for (int32_t t : targets) nvalid += t != md::kIgnoreIndex ? 1 : 0;
    Acc loss_acc;
    K.sum_acc(token_loss.data(), 1, rows.segs, &loss_acc, CS);
    world.all_reduce(&nvalid, &nvalid, 1, DataType::i64, ReduceOp::sum);
    note("loss", world, CollOp::all_reduce);
    world.all_reduce(&loss_acc, &loss_acc, 1, dt_exact<T>(), ReduceOp::exact_sum);
    dev.synchronize(CS);  // host sync point 3: the loss and the gradient scale
    note("loss", world, CollOp::all_reduce);
    RankStepStats res;
    const T loss = nvalid > 0 ? loss_acc.round() / static_cast<T>(nvalid) : T(0);
    res.loss = static_cast<double>(loss);
    res.n_valid = nvalid;
    const T scale = nvalid > 0 ? T(1) / static_cast<T>(nvalid) : T(0);

    // ---- backward: head (kept gathered), layers (re-gathered, prefetched one ahead), embedding
    gather(L, xs, bwd(L));  // prefetch the last layer while the head runs
    const std::vector<size_t> fn_g{idx("final_norm")};
    std::vector<T> dhidden(sz(N * d)), dx(sz(N * d)), dprev(sz(N * d));
    mem.add(3 * vbytes(dx));
    reduce_head_slices("bwd.head", [&](const Range& r, Acc* a) {  // ascending: dhidden's in-order sum continues
      K.linear_ce_backward(pol, hidden.data(), W("lm_head"), targets.data(), lse.data(), N, d, V, cfg.vocab_chunk, sh.run.token_chunk, scale, rows.segs, r.begin, r.end, dhidden.data(), a, CS);
    });
    alloc_grads(fn_g);
    K.rmsnorm_backward(dhidden.data(), d, xsave[sz(L)].data(), d, rinvf.data(), W("final_norm"), N, d, rows.segs,
                       dx.data(), d, G("final_norm"), CS);
    release(L + 1);
    reduce_grads(fn_g, "bwd.head");
    mem.sub(vbytes(hidden) + vbytes(token_loss) + vbytes(lse));
    for (int64_t i = L - 1; i >= 0; --i) {
      const int64_t u = 1 + i;
      wait_gather(u);
      if (u - 1 >= 1) gather(u - 1, xs, bwd(u - 1));
      LayerState& st = states[sz(i)];
      if (rec) {  // full recompute: re-run the layer forward (CP gather and EP dispatch included)
        std::vector<T> out(sz(N * d));
        layer_fwd(i, xsave[sz(i)].data(), st, out.data(), bwd(u));
        mem.add(st_bytes[sz(i)] = st.bytes());
      }
      layer_bwd(i, xsave[sz(i)].data(), st, dx.data(), dprev.data(), bwd(u));
      std::swap(dx, dprev);
      mem.add(st.bytes() - st_bytes[sz(i)]);  // backward buffers of the owner experts
      mem.sub(st.bytes());
      st = LayerState();
      release(u);
      mem.sub(vbytes(xsave[sz(i + 1)]));
      std::vector<T>().swap(xsave[sz(i + 1)]);
    }
    reduce_embed_slices("bwd.embed", dx.data());
    mem.sub(3 * vbytes(dx) + vbytes(xsave[0]));

    for (size_t j = 0; j < ps.size(); ++j)  // every trainable tensor reduced exactly once
      TD_CHECK_EQ(reduced[j], ps[j].trainable ? 1 : 0, "gradient reductions of {}", sh.init->info[j].name);
    // ---- optimizer: exact global grad norm (dense shards counted on d_rep coordinate 0 only), AdamW on shards,
    // router bias from global loads.
    ExactAcc<double> sq;
    for (const PState& st : ps) {
      if (!st.trainable) continue;
      if (!st.expert && dc.d != 0) continue;
      if (!st.expert) {
        K.grad_sq_acc(st.g.data(), st.spec.valid_elems(st.shard), &sq, CS);
      } else {
        for (int64_t el = 0; el < Eloc; ++el)
          K.grad_sq_acc(st.g.data() + el * st.spec.shard_elems(), st.spec.valid_elems(st.shard), &sq, CS);
      }
    }
    world.all_reduce(&sq, &sq, 1, DataType::exact_f64, ReduceOp::exact_sum);
    dev.synchronize(CS);  // host sync point 4: the grad norm and the clip coefficient
    note("opt", world, CollOp::all_reduce);
    const md::AdamWHyper hy = md::adamw_hyper(sh.run);
    res.grad_norm = std::sqrt(sq.round());
    res.clip = md::clip_coef(sq, hy.max_grad_norm);
    ++step_count;
    for (PState& st : ps) {
      if (!st.trainable) continue;
      const bool decay = sh.init->info[st.p].is_matrix;
      const int64_t se = st.spec.shard_elems(), ve = st.spec.valid_elems(st.shard);
      const int64_t reps = st.expert ? Eloc : 1;
      for (int64_t el = 0; el < reps; ++el)
        K.adamw_step(st.w.data() + el * se, st.g.data() + el * se, st.m.data() + el * se, st.v.data() + el * se, ve,
                     hy, step_count, res.clip, decay, CS);
    }
    bool any_moe = false;
    for (int64_t i = 0; i < L; ++i) any_moe = any_moe || cfg.is_moe_layer(i);
    if (any_moe) {
      world.all_reduce(load.data(), load.data(), load.size(), DataType::i64, ReduceOp::sum);
      note("opt", world, CollOp::all_reduce);
      for (int64_t i = 0; i < L; ++i) {
        if (!cfg.is_moe_layer(i)) continue;
        PState& b = ps[idx(fmt::format("layers.{}.moe.router_bias", i))];
        K.router_bias_update(b.w.data(), load.data() + i * E, E, cfg.bias_rate, CS);
      }
    }
    dev.synchronize(cs);
    dev.synchronize(xs);
    return res;
  }

  // ---- checking ----------------------------------------------------------------------------------------------------
  void write(md::ParamSet<T>& out, bool grads) const {
    for (const PState& st : ps) {
      T* dst = out.t[st.p].ptr();
      if (!st.trainable) {
        if (!grads && rank == 0) std::copy(st.w.begin(), st.w.end(), dst);
        continue;
      }
      const std::vector<T>& src = grads ? st.g : st.w;
      if (!st.expert) {
        if (dc.d != 0) continue;
        std::copy_n(src.data(), st.spec.valid_elems(st.shard), dst + st.spec.begin_row(st.shard) * st.spec.row_elems);
      } else {
        const int64_t per = st.spec.rows * st.spec.row_elems;
        for (int64_t el = 0; el < Eloc; ++el)
          std::copy_n(src.data() + el * st.spec.shard_elems(), st.spec.valid_elems(st.shard),
                      dst + (e0 + el) * per + st.spec.begin_row(st.shard) * st.spec.row_elems);
      }
    }
  }
};

template <class T>
RankStep<T>::RankStep(const StepShared<T>& sh, Communicator& world, MeshComms& comms, Device& dev, Kernels<T>& k)
    : impl_(std::make_unique<Impl>(sh, world, comms, dev, k)) {}
template <class T>
RankStep<T>::~RankStep() = default;
template <class T>
RankStepStats RankStep<T>::step(const md::Batch& b) {
  return impl_->step(b);
}
template <class T>
void RankStep<T>::write_params(md::ParamSet<T>& full) const {
  impl_->write(full, false);
}
template <class T>
void RankStep<T>::write_grads(md::ParamSet<T>& full) const {
  impl_->write(full, true);
}
template <class T>
const MemTracker& RankStep<T>::memory() const {
  return impl_->mem;
}
template <class T>
const PhaseCounts& RankStep<T>::phase_counts() const {
  return impl_->counts;
}

template struct StepShared<float>;
template struct StepShared<double>;
template class RankStep<float>;
template class RankStep<double>;

}  // namespace trident::parallel
