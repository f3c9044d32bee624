// The step's FSDP part (parallel/step_impl.h): parameter shards, the per-unit all-gather with prefetch, the gradient
// accumulator arena, the exact reduce-scatter of every gradient as soon as it is complete, vocabulary slices.
#include <algorithm>

#include "parallel/shard.h"
#include "parallel/step_impl.h"

#include <cmath>

namespace trident {

namespace md = trident::model;

template <class T>
StepImpl<T>::StepImpl(const StepShared<T>& s, Communicator& w, MeshComms& c, Device& dv, Kernels<T>& k)
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
  std::vector<T> part, host;
  // A shard's initial values: the rank's part of a full tensor (parallel/shard.h), padded as the step stores it.
  data = dev.has_data();
  TD_CHECK(data || sh.init_m == nullptr, "step: a shapes-only run cannot resume from a checkpoint (it has no data)");
  TD_CHECK(data || sh.routing != nullptr || [&] {
             for (int64_t i = 0; i < cfg.layers; ++i)
               if (cfg.is_moe_layer(i)) return false;
             return true;
           }(),
           "step: a shapes-only run of a MoE model needs routing counts (--routing)");
  auto upload_part = [&](const ParamPlacement& pl, const T* src, Buf<T>& dst) {
    if (!data) {  // shapes only: the same allocation and upload, no bytes
      dst = Buf<T>(dev, pl.padded_elems(), CS);
      dev.upload(dst.data(), nullptr, dst.bytes(), CS);
      return;
    }
    part.resize(sz(pl.valid_elems()));
    host.resize(sz(pl.padded_elems()));
    take_part(pl, src, part.data());
    pad_part(pl, part.data(), host.data());
    dst = Buf<T>(dev, pl.padded_elems(), CS);
    dev.upload(dst.data(), host.data(), dst.bytes(), CS);
  };
  TD_CHECK((sh.init_m == nullptr) == (sh.init_v == nullptr), "StepShared: init_m and init_v go together");
  step_count = sh.init_step;
  for (size_t p = 0; p < init.info.size(); ++p) {
    const md::ParamInfo& in = init.info[p];
    const ParamPlacement pl = place(in, sh.mesh, E, rank);
    PState st;
    st.p = p;
    st.trainable = in.trainable;
    st.expert = pl.kind == ShardKind::expert;
    if (in.name == "embed") st.unit = 0;
    else if (in.name.rfind("layers.", 0) == 0) st.unit = 1 + std::stoll(in.name.substr(7));
    else st.unit = L + 1;
    if (st.trainable) {
      st.spec = pl.spec;
      st.shard = pl.shard;
      if (st.expert) TD_CHECK_EQ(pl.e0, e0, "expert placement of {}", in.name);
    }
    st.nsh = pl.padded_elems();
    upload_part(pl, data ? init.t[p].ptr() : nullptr, st.w);
    if (st.trainable) {
      if (sh.init_m) {  // resumed: the AdamW moments of a checkpoint
        upload_part(pl, sh.init_m->t[p].ptr(), st.m);
        upload_part(pl, sh.init_v->t[p].ptr(), st.v);
      } else {
        st.m = zeros(st.nsh, CS);
        st.v = zeros(st.nsh, CS);
      }
      st.g = zeros(st.nsh, CS);
      unit_params[sz(st.unit)].push_back(ps.size());
    }
    mem.add(st.w.bytes() + st.m.bytes() + st.v.bytes() + st.g.bytes());
    ps.push_back(std::move(st));
  }
  full.resize(ps.size());
  acc.assign(ps.size(), {});
  gathered.assign(sz(L + 2), false);
  for (int64_t u = 0; u < L + 2; ++u) ev_gather.push_back(dev.create_event());
  for (int64_t c = 0; c < sh.ep_chunks; ++c) {
    ev_disp.push_back(dev.create_event());
    ev_comp.push_back(dev.create_event());
    ev_comb.push_back(dev.create_event());
    ev_pack.push_back(dev.create_event());
  }
  ev_route.push_back(dev.create_event());
  // The comm stream may use everything allocated so far (the shards it all-gathers).
  dev.record(ev_route[0], CS);
  dev.wait(XS, ev_route[0]);
}

template <class T>
Buf<T> StepImpl<T>::zeros(int64_t n, Stream s) {
  Buf<T> b(dev, n, s);
  if (n > 0) dev.memset(b.data(), 0, b.bytes(), s);
  return b;
}

// ---- FSDP: gather / free per unit ---------------------------------------------------------------------------------
// All-gathers every trainable parameter of unit u (one call per dense tensor over fsdp*cp, one per tensor and local
// expert over e_fsdp) on stream s into buffers allocated there, then records ev_gather[u].
template <class T>
void StepImpl<T>::gather(int64_t u, Stream s, const std::string& ph) {
  TD_CHECK(!gathered[sz(u)], "FSDP: unit {} gathered twice", u);
  for (size_t i : unit_params[sz(u)]) {
    PState& st = ps[i];
    Buf<T>& f = full[i];  // allocated on the gathering stream, freed on the compute stream
    if (!st.expert) {
      f = Buf<T>(dev, st.full_elems(), s);
      mc.fsdp_cp->all_gather(st.w.data(), f.data(), sz(st.spec.shard_elems()), dt<T>(), s);
      note(ph, *mc.fsdp_cp, CollOp::all_gather);
    } else {
      const int64_t stride = st.full_elems(), se = st.spec.shard_elems();
      f = Buf<T>(dev, Eloc * stride, s);
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
template <class T>
void StepImpl<T>::wait_gather(int64_t u) {
  if (sh.skip_wait != "fsdp_gather") dev.wait(CS, ev_gather[sz(u)]);
}

template <class T>
void StepImpl<T>::release(int64_t u) {
  for (size_t i : unit_params[sz(u)]) {
    mem.sub(full[i].bytes());
    full[i].reset(CS);
  }
  gathered[sz(u)] = false;
}

template <class T>
const T* StepImpl<T>::W(const std::string& name) const {
  const size_t p = idx(name);
  if (!ps[p].trainable) return ps[p].w.data();  // buffers: the replicated copy
  TD_CHECK(!full[p].empty(), "FSDP: parameter {} used while not gathered", name);
  return full[p].data();
}

template <class T>
md::AttnW<T> StepImpl<T>::attn_w(int64_t i) const {
  md::AttnW<T> w;
  md::attn_view(cfg, i, [&](const std::string& n) { return W(n); }, w);
  return w;
}
template <class T>
md::AttnG<T> StepImpl<T>::attn_g(int64_t i) {
  md::AttnG<T> g;
  md::attn_view(cfg, i, [&](const std::string& n) { return G(n); }, g);
  return g;
}

template <class T>
std::vector<size_t> StepImpl<T>::names(int64_t i, std::initializer_list<const char*> suffixes) const {
  std::vector<size_t> out;
  for (const char* s : suffixes) out.push_back(idx(fmt::format("layers.{}.{}", i, s)));
  return out;
}

// ---- gradient accumulators ---------------------------------------------------------------------------------------
template <class T>
void StepImpl<T>::grow_arena(size_t n) {
  if (n <= sz(arena.size())) return;
  TD_CHECK(arena_live == 0, "accumulator arena must grow while {} views are live", arena_live);
  mem.sub(arena.bytes());
  arena = Buf<Acc>(dev, static_cast<int64_t>(n), CS);  // the old one is freed on the compute stream
  mem.add(arena.bytes());
}

// Takes n accumulators from the arena, zeroed (or as they are, for a buffer its first user writes whole); growing it
// is only allowed while nothing is live.
template <class T>
typename StepImpl<T>::Acc* StepImpl<T>::arena_take(size_t n, bool zero) {
  if (arena_used + n > sz(arena.size())) grow_arena(arena_used + n);
  Acc* p = arena.data() + arena_used;
  // the zero accumulator is all-zero bytes (reference/exact_acc_impl.h wire format)
  if (n > 0 && zero) dev.memset(p, 0, static_cast<int64_t>(n * sizeof(Acc)), CS);
  arena_used += n;
  ++arena_live;
  return p;
}

template <class T>
void StepImpl<T>::arena_give() {
  TD_CHECK(arena_live > 0, "accumulator arena: nothing live");
  if (--arena_live == 0) arena_used = 0;
}

// Gives back the n accumulators at p, the view taken last: its space is free for the next take at once (a partial
// receive buffer, whose successor in a group of tensors reuses it; later work on it is ordered on the compute stream).
template <class T>
void StepImpl<T>::arena_give_top(const Acc* p, size_t n) {
  TD_CHECK(p + n == arena.data() + arena_used, "accumulator arena: the view given back is not the last taken");
  arena_used -= n;
  arena_give();
}

template <class T>
void StepImpl<T>::alloc_grads(const std::vector<size_t>& list) {
  TD_CHECK(arena_live == 0, "gradient groups overlap");
  size_t total = 0;
  for (size_t i : list) total += sz(ps[i].expert ? Eloc * ps[i].full_elems() : ps[i].full_elems());
  grow_arena(total);  // once for the whole group (nothing live)
  for (size_t i : list) {
    const PState& st = ps[i];
    TD_CHECK(acc[i].empty(), "gradient accumulator of {} allocated twice", sh.init->info[i].name);
    const size_t n = sz(st.expert ? Eloc * st.full_elems() : st.full_elems());
    acc[i] = AccView{arena_take(n), n};
  }
}

// As soon as a tensor's gradient is complete: its accumulator is merged across ranks, rounded, freed.
template <class T>
void StepImpl<T>::reduce_grads(const std::vector<size_t>& list, const std::string& ph) {
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
template <class T>
void StepImpl<T>::merge_dense(const Acc* a, int64_t se, T* out, const std::string& ph) {
  Buf<Acc> part(dev, se, CS);
  mem.add(part.bytes());
  mc.fsdp_cp->reduce_scatter(a, part.data(), sz(se), dt_exact<T>(), ReduceOp::exact_sum, CS);
  note(ph, *mc.fsdp_cp, CollOp::reduce_scatter);
  mc.d_rep->all_reduce(part.data(), part.data(), sz(se), dt_exact<T>(), ReduceOp::exact_sum, CS);
  note(ph, *mc.d_rep, CollOp::all_reduce);
  K.exact_round(part.data(), out, se, CS);
  mem.sub(part.bytes());
}

// One local expert's accumulator (e_fsdp blocks of se): reduce-scatter over e_fsdp, rounded into out.
template <class T>
void StepImpl<T>::merge_expert(const Acc* a, int64_t se, T* out, const std::string& ph) {
  Buf<Acc> part(dev, se, CS);
  mem.add(part.bytes());
  mc.e_fsdp->reduce_scatter(a, part.data(), sz(se), dt_exact<T>(), ReduceOp::exact_sum, CS);
  note(ph, *mc.e_fsdp, CollOp::reduce_scatter);
  K.exact_round(part.data(), out, se, CS);
  mem.sub(part.bytes());
}

// The nt tile partials per element a dense weight gradient is exchanged as (docs/parallel.md section 4), or 0 where
// the step reduce-scatters accumulators (dense_grad_partials; the same on every rank).
template <class T>
int64_t StepImpl<T>::dense_partial_tiles() const {
  if (!dense_grad_partials(sh.mesh, sh.run.sequences, S, cfg.tile, sizeof(T), sizeof(Acc))) return 0;
  const int64_t nt = dense_grad_tiles(sh.mesh, sh.run.sequences, S, cfg.tile);
  TD_CHECK_EQ(static_cast<int64_t>(rows.segs.size()) - 1, nt, "dense gradient partials: the rank's tiles");
  return nt;
}

// Accumulators' worth of arena for `values` values of T (partial buffers are raw bytes carved from the arena).
template <class T>
size_t StepImpl<T>::partial_accs(int64_t values) {
  return (sz(values) * sizeof(T) + sizeof(Acc) - 1) / sizeof(Acc);
}

// The send buffer of a tensor (or vocabulary slice) of `rows` rows of `row` values exchanged as nt tile partials per
// element (docs/parallel.md section 4): fsdp*cp blocks of block_rows rows (TilePartials; +0 in padding rows), from
// the accumulator arena as raw bytes. The arena must also hold its receive buffer (merge_partials): grown here if
// nothing is live, else beforehand (partials_need; growing is only allowed while nothing is live).
template <class T>
TilePartials<T> StepImpl<T>::partials_send(int64_t rows, int64_t row, int64_t block_rows, int64_t nt) {
  TilePartials<T> tp{nullptr, row, block_rows, nfc, nt, 0};
  const size_t pa = partial_accs(tp.size());
  if (arena_used + 2 * pa > sz(arena.size())) grow_arena(arena_used + 2 * pa);
  tp.base = reinterpret_cast<T*>(arena_take(pa, false));
  if (rows < nfc * block_rows) dev.memset(tp.base, 0, tp.size() * static_cast<int64_t>(sizeof(T)), CS);
  return tp;
}

// The arena the send buffers of the dense tensors of `list` take, plus the largest receive buffer (merged one tensor
// at a time, each receive buffer given back before the next is taken: merge_partials), in accumulators.
template <class T>
size_t StepImpl<T>::partials_need(const std::vector<size_t>& list, int64_t nt) const {
  size_t total = 0, recv = 0;
  for (size_t i : list) {
    const size_t a = partial_accs(nt * ps[i].spec.n * ps[i].spec.shard_elems());
    total += a;
    recv = std::max(recv, a);
  }
  return total + recv;
}

// Send buffers for the dense tensors of `list` (partials_send), the arena grown once for all of them.
template <class T>
std::vector<TilePartials<T>> StepImpl<T>::partials_take(const std::vector<size_t>& list, int64_t nt) {
  if (arena_used + partials_need(list, nt) > sz(arena.size())) grow_arena(arena_used + partials_need(list, nt));
  std::vector<TilePartials<T>> out;
  for (size_t i : list) {
    const PState& st = ps[i];
    TD_CHECK(!st.expert, "dense gradient partials of the expert tensor {}", sh.init->info[i].name);
    TD_CHECK_EQ(st.spec.n, nfc, "dense gradient partials: shards against fsdp*cp ranks");
    out.push_back(partials_send(st.spec.rows, st.spec.row_elems, st.spec.rows_per_shard(), nt));
  }
  return out;
}

// Tensor i's partials (written by the kernel set into tp) to its rounded gradient shard: one fsdp*cp all-to-all of
// nt * se values per peer gives each rank the fsdp*cp * nt partials of every element of its shard; their exact sum
// (sum_acc over one-row tiles into zeroed accumulators), all-reduced over d_rep and rounded once, is the exact sum the
// accumulators' reduce-scatter would have formed of the same partials: the same bits.
template <class T>
void StepImpl<T>::partials_merge(size_t i, const TilePartials<T>& tp, const std::string& ph) {
  reduced[i]++;
  merge_partials(tp, ps[i].spec.shard_elems(), ps[i].g.data(), ph);
}

// The partials of tp (fsdp*cp blocks of nt x se values) to this rank's rounded se values in out (partials_merge).
template <class T>
void StepImpl<T>::merge_partials(const TilePartials<T>& tp, int64_t se, T* out, const std::string& ph) {
  const int64_t nb = tp.blocks, nt = tp.n_tiles;
  TD_CHECK_EQ(tp.block_elems(), se, "dense gradient partials: block size");
  const size_t ra = partial_accs(tp.size());
  Acc* ra_p = arena_take(ra, false);
  T* recv = reinterpret_cast<T*>(ra_p);
  mc.fsdp_cp->all_to_all(tp.base, recv, sz(nt * se), dt<T>(), CS);
  note(ph, *mc.fsdp_cp, CollOp::all_to_all);
  Buf<Acc> part(dev, se, CS);
  mem.add(part.bytes());
  dev.memset(part.data(), 0, se * static_cast<int64_t>(sizeof(Acc)), CS);
  K.sum_acc(recv, se, uniform_segments(nb * nt, 1), part.data(), CS);  // (nb * nt rows): source rank, then tile
  mc.d_rep->all_reduce(part.data(), part.data(), sz(se), dt_exact<T>(), ReduceOp::exact_sum, CS);
  note(ph, *mc.d_rep, CollOp::all_reduce);
  K.exact_round(part.data(), out, se, CS);
  mem.sub(part.bytes());
  arena_give_top(ra_p, ra);
}

// Dense tensor i's gradient X^T dY (its only contribution) exchanged as tile partials. Returns false, issuing
// nothing, where not taken (the rule, or a kernel set without wgrad_partials).
template <class T>
bool StepImpl<T>::wgrad_exchange(size_t i, const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K_, int64_t M,
                                 const std::string& ph) {
  const int64_t nt = ps[i].expert ? 0 : dense_partial_tiles();
  if (nt == 0) return false;
  TD_CHECK(ps[i].spec.rows == K_ && ps[i].spec.row_elems == M,
           "dense gradient partials: {} is {}x{}, the op writes {}x{}", sh.init->info[i].name, ps[i].spec.rows,
           ps[i].spec.row_elems, K_, M);
  const std::vector<TilePartials<T>> tp = partials_take({i}, nt);
  const bool taken = K.wgrad_partials(pol, X, ldx, dY, ldy, K_, M, rows.segs, tp[0], CS);
  if (taken) partials_merge(i, tp[0], ph);
  arena_give();
  return taken;
}

// embed (V, d): shard-local rows [a, b) of every fsdp*cp shard; token rows outside the slice get slot -1.
template <class T>
void StepImpl<T>::reduce_embed_slices(const std::string& ph, const T* dx) {
  const size_t i = idx("embed");
  PState& st = ps[i];
  const int64_t rps = st.spec.rows_per_shard(), vr = st.spec.end_row(st.shard) - st.spec.begin_row(st.shard);
  std::vector<int32_t> slot(sz(N));
  const int64_t nt = dense_partial_tiles();
  for (const Range& r : vslices.embed_rows) {
    const int64_t h = r.end - r.begin;
    for (int64_t t = 0; t < N; ++t) {
      const int64_t v = tokens_h[sz(t)], o = v % rps;
      slot[sz(t)] = o >= r.begin && o < r.end ? static_cast<int32_t>(v / rps * h + (o - r.begin)) : -1;
    }
    Buf<int32_t> slot_d(dev, N, CS);
    dev.upload(slot_d.data(), slot.data(), slot_d.bytes(), CS);
    Buf<T> part(dev, h * d, CS);
    bool done = false;
    if (nt > 0) {  // the slice's rows as tile partials (section 4): fsdp*cp blocks of nt x h x d values
      const TilePartials<T> tp = partials_send(nfc * h, d, h, nt);  // no padding: the op writes every place
      done = K.embedding_backward_partials(tp, slot_d.data(), dx, N, d, rows.segs, CS);
      if (done) merge_partials(tp, h * d, part.data(), ph);
      arena_give();
    }
    if (!done) {
      Acc* a = arena_take(sz(nfc * h * d));
      K.embedding_backward(a, slot_d.data(), dx, N, d, rows.segs, CS);
      merge_dense(a, h * d, part.data(), ph);
      arena_give();
    }
    const int64_t k1 = std::min(r.end, vr);
    if (k1 > r.begin)
      dev.copy(st.g.data() + r.begin * d, part.data(), (k1 - r.begin) * d * static_cast<int64_t>(sizeof(T)), CS);
  }
  reduced[i]++;
}

// The three weight gradients of SwiGLU blocks (the dense MLP, the shared expert, or the local experts' row blocks),
// one tensor at a time. The reference's swiglu_backward_wgrad is exactly wgrad_acc(x, dug) -> wg,
// wgrad_acc(x, duu) -> wu, wgrad_acc(h, dy) -> wd; every tile partial is added exactly, so producing, merging and
// freeing each tensor before the next, and a local expert's rows in several blocks, change no bit.
template <class T>
void StepImpl<T>::swiglu_wgrad(const std::string& prefix, int64_t F, const std::string& ph,
                               const std::vector<SwigluRows>& blocks) {
  for (const char* w : {"wg", "wu", "wd"}) {
    const std::string name = prefix + w;
    const std::vector<size_t> g{idx(name)};
    if (blocks.size() == 1 && blocks[0].segs.data() == rows.segs.data()) {  // a dense tensor of all the rank's rows
      const SwigluRows& b = blocks[0];
      const bool done = w[1] == 'g'   ? wgrad_exchange(g[0], b.x, d, b.dug, F, d, F, ph)
                        : w[1] == 'u' ? wgrad_exchange(g[0], b.x, d, b.duu, F, d, F, ph)
                                      : wgrad_exchange(g[0], b.h, F, b.dy, d, F, d, ph);
      if (done) continue;
    }
    alloc_grads(g);
    for (const SwigluRows& b : blocks) {
      Acc* a = G(name) + b.el * expert_stride(name);
      if (w[1] == 'g') K.wgrad_acc(pol, b.x, d, b.dug, F, d, F, b.segs, a, CS);
      else if (w[1] == 'u') K.wgrad_acc(pol, b.x, d, b.duu, F, d, F, b.segs, a, CS);
      else K.wgrad_acc(pol, b.h, F, b.dy, d, F, d, b.segs, a, CS);
    }
    reduce_grads(g, ph);
  }
}

// ---- checking -------------------------------------------------------------------------------------------------------
template <class T>
void StepImpl<T>::write(md::ParamSet<T>& out, bool grads) const {
  for (const PState& st : ps) {
    T* dst = out.t[st.p].ptr();
    if (!st.trainable) {
      if (!grads && rank == 0) {
        const std::vector<T> h = dev.fetch(st.w.data(), st.w.size(), CS);
        std::copy(h.begin(), h.end(), dst);
      }
      continue;
    }
    if (!st.expert && dc.d != 0) continue;
    const std::vector<T> src = dev.fetch(grads ? st.g.data() : st.w.data(), st.nsh, CS);  // host sync (checking)
    if (!st.expert) {
      std::copy_n(src.data(), st.spec.valid_elems(st.shard), dst + st.spec.begin_row(st.shard) * st.spec.row_elems);
    } else {
      const int64_t per = st.spec.rows * st.spec.row_elems;
      for (int64_t el = 0; el < Eloc; ++el)
        std::copy_n(src.data() + el * st.spec.shard_elems(), st.spec.valid_elems(st.shard),
                    dst + (e0 + el) * per + st.spec.begin_row(st.shard) * st.spec.row_elems);
    }
  }
}

// The rank's optimizer state for a checkpoint: its valid part of every parameter it owns (parallel/shard.h).
template <class T>
std::string StepImpl<T>::first_nonfinite_gradient() const {
  for (const PState& st : ps) {
    if (!st.trainable || st.nsh == 0) continue;
    const std::vector<T> h = dev.fetch(st.g.data(), st.nsh, CS);  // host sync (an error path)
    for (size_t i = 0; i < h.size(); ++i)
      if (!std::isfinite(static_cast<double>(h[i])))
        return fmt::format(": the gradient of {} is {} at element {} of rank {}'s shard", sh.init->info[st.p].name,
                           h[i], i, rank);
  }
  return {};
}

template <class T>
std::string StepImpl<T>::first_nonfinite_state() const {
  if (!dev.immediate()) return {};  // device memory: not read here (no host sync, the trace unchanged)
  for (const PState& st : ps) {
    if (st.nsh == 0) continue;
    const std::pair<const Buf<T>*, const char*> sets[3] = {{&st.w, "params"}, {&st.m, "exp_avg"},
                                                           {&st.v, "exp_avg_sq"}};
    for (const auto& [buf, group] : sets) {
      if (buf != &st.w && !st.trainable) continue;
      const T* x = buf->data();  // host memory on an immediate device
      for (int64_t i = 0; i < st.nsh; ++i)
        if (!std::isfinite(static_cast<double>(x[i])))
          return fmt::format("{} of {} {} at element {} of rank {}'s shard", group, sh.init->info[st.p].name, x[i], i,
                             rank);
    }
  }
  return {};
}

template <class T>
ShardState<T> StepImpl<T>::state() const {
  ShardState<T> out;
  out.step = step_count;
  out.w.resize(ps.size());
  out.m.resize(ps.size());
  out.v.resize(ps.size());
  for (const PState& st : ps) {
    const ParamPlacement pl = place(sh.init->info[st.p], sh.mesh, E, rank);
    if (!pl.owner) continue;
    auto get = [&](const Buf<T>& b, std::vector<T>& dst, const char* group) {
      const std::vector<T> h = dev.fetch(b.data(), st.nsh, CS);  // host sync (checkpoint)
      dst.resize(sz(pl.valid_elems()));
      unpad_part(pl, h.data(), dst.data());
      // Every device's values are on the host here: a non-finite one (an update that overflowed on a device whose
      // memory the step does not scan) is never saved.
      for (size_t i = 0; i < dst.size(); ++i)
        if (!std::isfinite(static_cast<double>(dst[i])))
          fail(fmt::format("step {}: the update made {} of {} {} at element {} of rank {}'s part (diverged: lower "
                           "--lr?)",
                           step_count, group, sh.init->info[st.p].name, dst[i], i, rank));
    };
    get(st.w, out.w[st.p], "params");
    if (st.trainable) {
      get(st.m, out.m[st.p], "exp_avg");
      get(st.v, out.v[st.p], "exp_avg_sq");
    }
  }
  return out;
}

#define TD_STEP_FSDP(T)                                                                                            \
  template StepImpl<T>::StepImpl(const StepShared<T>&, Communicator&, MeshComms&, Device&, Kernels<T>&);           \
  template Buf<T> StepImpl<T>::zeros(int64_t, Stream);                                                             \
  template void StepImpl<T>::gather(int64_t, Stream, const std::string&);                                          \
  template void StepImpl<T>::wait_gather(int64_t);                                                                 \
  template void StepImpl<T>::release(int64_t);                                                                     \
  template const T* StepImpl<T>::W(const std::string&) const;                                                      \
  template md::AttnW<T> StepImpl<T>::attn_w(int64_t) const;                                                        \
  template md::AttnG<T> StepImpl<T>::attn_g(int64_t);                                                              \
  template std::vector<size_t> StepImpl<T>::names(int64_t, std::initializer_list<const char*>) const;              \
  template void StepImpl<T>::grow_arena(size_t);                                                                   \
  template StepImpl<T>::Acc* StepImpl<T>::arena_take(size_t, bool);                                                \
  template void StepImpl<T>::arena_give();                                                                         \
  template void StepImpl<T>::arena_give_top(const StepImpl<T>::Acc*, size_t);                                      \
  template void StepImpl<T>::alloc_grads(const std::vector<size_t>&);                                              \
  template void StepImpl<T>::reduce_grads(const std::vector<size_t>&, const std::string&);                         \
  template void StepImpl<T>::merge_dense(const Acc*, int64_t, T*, const std::string&);                             \
  template void StepImpl<T>::merge_expert(const Acc*, int64_t, T*, const std::string&);                            \
  template int64_t StepImpl<T>::dense_partial_tiles() const;                                                        \
  template bool StepImpl<T>::wgrad_exchange(size_t, const T*, int64_t, const T*, int64_t, int64_t, int64_t,         \
                                            const std::string&);                                                   \
  template size_t StepImpl<T>::partial_accs(int64_t);                                                             \
  template TilePartials<T> StepImpl<T>::partials_send(int64_t, int64_t, int64_t, int64_t);                          \
  template size_t StepImpl<T>::partials_need(const std::vector<size_t>&, int64_t) const;                           \
  template std::vector<TilePartials<T>> StepImpl<T>::partials_take(const std::vector<size_t>&, int64_t);            \
  template void StepImpl<T>::partials_merge(size_t, const TilePartials<T>&, const std::string&);                   \
  template void StepImpl<T>::merge_partials(const TilePartials<T>&, int64_t, T*, const std::string&);              \
  template void StepImpl<T>::reduce_embed_slices(const std::string&, const T*);                                    \
  template void StepImpl<T>::swiglu_wgrad(const std::string&, int64_t, const std::string&,                         \
                                          const std::vector<SwigluRows>&);                                         \
  template void StepImpl<T>::write(md::ParamSet<T>&, bool) const;                                                 \
  template ShardState<T> StepImpl<T>::state() const;                                                             \
  template std::string StepImpl<T>::first_nonfinite_gradient() const;                                             \
  template std::string StepImpl<T>::first_nonfinite_state() const;
TD_STEP_FSDP(float)
TD_STEP_FSDP(double)
#undef TD_STEP_FSDP

}  // namespace trident
