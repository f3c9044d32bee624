// The step's context-parallel attention (parallel/step_impl.h, docs/parallel.md section 5): the per-token KV payload
// all-gathered over cp per local sequence and reordered from zig-zag gather order into positions; the key-side
// payload gradient (exact, over the full sequence) reordered back and reduce-scattered to the keys' owners, or its
// tile partials exchanged over an all-to-all and summed by the owners.
#include <utility>

#include "parallel/layout.h"
#include "parallel/step_impl.h"
#include "reference/tile_reduce.h"

namespace trident {

namespace md = trident::model;

// CP attention forward on the local rows: payload all-gather per local sequence, core on the local queries.
template <class T>
void StepImpl<T>::attention_fwd(int64_t i, const md::AttnW<T>& w, LayerState& st, T* y, const std::string& ph) {
  (void)i;
  const md::CoreDims cd = md::CoreDims::from(cfg);
  const int64_t P = cd.P;
  // The activations in one zero-filled allocation, carved as AttnActSizes says.
  const md::AttnActSizes z = md::AttnActSizes::of(cfg, N);
  st.attn_mem = zeros(z.total(), CS);
  T* p = st.attn_mem.data();
  const auto take = [&p](int64_t n) { return std::exchange(p, p + n); };
  st.attn = md::AttnBufs<T>{take(z.q), take(z.qc), take(z.c), take(z.kv_rinv), take(z.payload), take(z.o),
                            take(z.stats), take(z.ocat), take(z.iq)};
  const md::AttnBufs<T>& A = st.attn;
  K.attn_qkv_forward(pol, cfg, w, st.a1.data(), rope_pos(), N, sh.rope, A, CS);
  const bool dsa = cfg.dsa();
  const int64_t Iw = cfg.index_q_width(), tk = cd.topk;
  const bool select = dsa && st.dsa_sel.data() == nullptr;  // a full recompute attends the saved selection
  if (dsa) {
    // The indexer projections (model::dsa_index_forward's three GEMMs): its key rides in the payload's last Di slots.
    const int64_t d = cfg.d_model, Hi = cfg.index_heads, Di = cfg.index_dim;
    K.mm(pol, N, Hi * Di, d, st.a1.data(), d, w.wiq, Hi * Di, false, A.iq, Iw, CS);
    K.mm(pol, N, Hi, d, st.a1.data(), d, w.wiw, Hi, false, A.iq + Hi * Di, Iw, CS);
    K.mm(pol, N, Di, d, st.a1.data(), d, w.wik, Di, false, A.payload + cd.ikey, P, CS);
    if (select) st.dsa_sel = Buf<int32_t>(dev, N * tk, CS);
    st.ikl = zeros(N, CS);
  }
  st.kv = Buf<T>(dev, nseq * S * P, CS);
  Buf<T> gbuf(dev, S * P, CS);
  const bool two_d = mc.cp_inner != nullptr;
  const int64_t blk = 2 * ch * P, no = two_d ? sh.mesh.cp_outer() : 1, ni = two_d ? sh.mesh.cp_inner : 1;
  Buf<T> obuf = two_d ? Buf<T>(dev, no * blk, CS) : Buf<T>(), ibuf = two_d ? Buf<T>(dev, S * P, CS) : Buf<T>();
  for (int64_t j = 0; j < nseq; ++j) {
    const int64_t r0 = j * 2 * ch;
    T* kv = st.kv.data() + j * S * P;
    if (two_d) {
      // 2D CP (seed 000): across domains first (each rank receives only its counterparts' blocks over RDMA:
      // obuf (no, blk), block o' = cp rank o'*ni + i), then inside the domain (NVLink: ibuf (ni, no, blk)), then
      // the (ni, no) block grid transposed into cp order (no, ni) = the 1D all-gather's bytes.
      mc.cp_outer->all_gather(A.payload + r0 * P, obuf.data(), sz(blk), dt<T>(), CS);
      note(ph, *mc.cp_outer, CollOp::all_gather);
      mc.cp_inner->all_gather(obuf.data(), ibuf.data(), sz(no * blk), dt<T>(), CS);
      note(ph, *mc.cp_inner, CollOp::all_gather);
      transpose_blocks(gbuf.data(), ibuf.data(), ni, no, blk * static_cast<int64_t>(sizeof(T)));
    } else {
      mc.cp->all_gather(A.payload + r0 * P, gbuf.data(), sz(blk), dt<T>(), CS);
      note(ph, *mc.cp, CollOp::all_gather);
    }
    K.kv_zigzag_reorder(kv, gbuf.data(), cp, ch * P, /*to_gather=*/false, CS);  // ascending positions
    md::CoreDims cdj = cd, cds = cd;  // this sequence's visited pairs (FLOPs metadata)
    cdj.pairs = core_pairs[sz(j)];
    cds.pairs = select_pairs[sz(j)];
    if (dsa) {  // sparse attention over the indexer's top-k keys (document-masked when packed)
      int32_t* sel = st.dsa_sel.data() + r0 * tk;
      if (select)
        K.dsa_select(pol, cds, A.iq + r0 * Iw, pos.data() + r0, packed ? docs.data() + r0 : nullptr, 2 * ch, kv, S, sel,
                     CS);
      K.dsa_core_forward(pol, cdj, A.qc + r0 * cd.H * cd.Dq, A.iq + r0 * Iw, pos.data() + r0, 2 * ch, kv, S, sel,
                         A.o + r0 * cd.H * cd.Dv, A.stats + r0 * cd.H * 2, st.ikl.data() + r0, CS);
    } else if (packed)  // document mask: each query attends its own document's keys only
      K.attn_doc_core_forward(pol, cdj, A.qc + r0 * cd.H * cd.Dq, pos.data() + r0, docs.data() + r0, 2 * ch, kv, S,
                              A.o + r0 * cd.H * cd.Dv, A.stats + r0 * cd.H * 2, CS);
    else
      K.attn_core_forward(pol, cdj, A.qc + r0 * cd.H * cd.Dq, pos.data() + r0, 2 * ch, kv, S,
                          A.o + r0 * cd.H * cd.Dv, A.stats + r0 * cd.H * 2, CS);
  }
  if (select) K.sum_acc(st.ikl.data(), 1, rows.segs, ikl_acc.data(), CS);  // once per layer (not in the recompute)
  K.attn_out_forward(pol, cfg, w, N, A, y, CS);
}

// The causal core's key side exchanged as tile partials (docs/parallel.md section 5), where that moves fewer bytes than
// accumulators: each of a rank's nt = 2ch/T query tiles gives every key one partial of P values in T, so the
// all-to-alls send nt * S * P values of T against the reduce-scatter's S * P accumulators; taken where
// key_side_partials says so (1D CP, causal core, nt * sizeof(T) < sizeof(Acc): exact float nt <= 13; never in the
// plain-sum twin, whose accumulator is one float) and the kernel set has the op. One query tile at a time: the kernel
// writes the tile's S partial rows (cp blocks of the keys' owners), one all-to-all of S / cp rows per rank sends them,
// and the owner adds the cp received rows of each of its keys into its accumulators (sum_acc over one-row tiles), so
// the buffers hold one tile's partials, not nt. After the last tile it rounds once: the exact sum of the same tile
// partials as the reduce-scatter's, so the same bits. Returns false, issuing nothing, when not taken (the same on every
// cp rank: it depends on the layout and the kernel set only).
template <class T>
bool StepImpl<T>::key_partials(LayerState& st, const T* dO, T* dqc, T* dpay, const std::string& ph) {
  const md::CoreDims cd = md::CoreDims::from(cfg);
  const int64_t P = cd.P, nt = 2 * ch / cfg.tile;  // tiles per local sequence (layout rule 7: T divides ch)
  if (!key_side_partials(sh.mesh, S, cfg.tile, !cfg.dsa() && !packed, sizeof(T), sizeof(Acc))) return false;
  const md::AttnBufs<T>& A = st.attn;
  const int64_t n = S * P, nm = 2 * ch * P;  // one tile's partials sent (and received); this rank's key-side values
  // All three from the accumulator arena (free between gradient groups; no memory of their own): the partial buffers
  // as raw bytes, in whole accumulators.
  const size_t pa = (sz(n) * sizeof(T) + sizeof(Acc) - 1) / sizeof(Acc);
  grow_arena(sz(nm) + 2 * pa);
  Acc* mine = arena_take(sz(nm), false);
  T* send = reinterpret_cast<T*>(arena_take(pa, false));
  T* recv = reinterpret_cast<T*>(arena_take(pa, false));
  const std::vector<int64_t> one_row = uniform_segments(cp, 1);  // every received row its own tile
  bool taken = true;
  for (int64_t j = 0; j < nseq && taken; ++j) {
    const int64_t r0 = j * 2 * ch;
    const std::vector<int64_t> qsegs = rows.segs_in(r0, r0 + 2 * ch);
    TD_CHECK_EQ(static_cast<int64_t>(qsegs.size()) - 1, nt, "key-side partials: the local sequence's query tiles");
    for (int64_t t = 0; t < nt; ++t) {
      const int64_t q0 = r0 + qsegs[sz(t)], nq = qsegs[sz(t) + 1] - qsegs[sz(t)];
      const int64_t tile[2] = {0, nq};  // the one tile (the kernel set copies the segments at issue)
      md::CoreDims cdt = cd;  // the tile's (query, key) pairs, for the cost model: the causal core's pos + 1 each
      for (int64_t r = q0; r < q0 + nq; ++r) cdt.pairs += rows.pos[sz(r)] + 1;
      taken = K.attn_core_backward_partials(pol, cdt, A.qc + q0 * cd.H * cd.Dq, pos.data() + q0, nq,
                                            st.kv.data() + j * S * P, S, A.o + q0 * cd.H * cd.Dv,
                                            A.stats + q0 * cd.H * 2, dO + q0 * cd.H * cd.Dv, tile,
                                            dqc + q0 * cd.H * cd.Dq, send, cp, CS);
      if (!taken) {
        TD_CHECK(j == 0 && t == 0, "key-side partials: the kernel set declined after the first tile");
        break;
      }
      if (t == 0) dev.memset(mine, 0, static_cast<int64_t>(sz(nm) * sizeof(Acc)), CS);  // after the op was taken
      mc.cp->all_to_all(send, recv, sz(2 * ch * P), dt<T>(), CS);
      note(ph, *mc.cp, CollOp::all_to_all);
      K.sum_acc(recv, nm, one_row, mine, CS);  // (cp rows of nm): source rank major
    }
    if (taken) K.exact_round(mine, dpay + r0 * P, nm, CS);  // the single rounding of the key side
  }
  for (int k = 0; k < 3; ++k) arena_give();
  return taken;
}

// CP attention core backward per local sequence: dq of the local queries, and the key-side payload gradient
// (exact, over the full sequence) reduce-scattered over cp to the keys' owners, rounded once into dpay (or its
// tile partials exchanged instead: key_partials).
template <class T>
void StepImpl<T>::core_backward_cp(LayerState& st, const T* dO, T* dqc, T* dpay, T* diq, const std::string& ph) {
  const md::CoreDims cd = md::CoreDims::from(cfg);
  const int64_t P = cd.P;
  const md::AttnBufs<T>& A = st.attn;
  TD_CHECK(arena_live == 0, "key-side accumulators overlap a gradient group");
  const bool two_d = mc.cp_inner != nullptr;
  if (key_partials(st, dO, dqc, dpay, ph)) return;
  const int64_t no = two_d ? sh.mesh.cp_outer() : 1, ni = two_d ? sh.mesh.cp_inner : 1;
  const size_t nk = sz(S * P), nb = sz(ch * P), nm = sz(2 * ch * P), nt = two_d ? nk : 0, np = two_d ? sz(no) * nm : 0;
  grow_arena(nk + nb + nm + nt + np);
  // None zeroed here: kacc is zeroed per sequence where the kernel adds into it; the others are written whole.
  Acc* kacc = arena_take(nk, false);
  Acc* blk = arena_take(nb, false);
  Acc* mine = arena_take(nm, false);
  Acc* tacc = two_d ? arena_take(nt, false) : nullptr;  // 2D: kacc's blocks in (inner, outer) order
  Acc* part = two_d ? arena_take(np, false) : nullptr;  // 2D: the domain's sums of this inner index's blocks
                                                        // (no, 2ch, P)
  for (int64_t j = 0; j < nseq; ++j) {
    const int64_t r0 = j * 2 * ch;
    const std::vector<int64_t> qsegs = rows.segs_in(r0, r0 + 2 * ch);
    md::CoreDims cdj = cd;
    cdj.pairs = core_pairs[sz(j)];
    // The causal core (no documents, no DSA): the kernel set's fused op writes the key side in gather order, where it
    // has one (no zeroing, no reorder; the same bits).
    const bool fused =
        !cfg.dsa() && !packed &&
        K.attn_core_backward_gather(pol, cdj, A.qc + r0 * cd.H * cd.Dq, pos.data() + r0, 2 * ch,
                                    st.kv.data() + j * S * P, S, A.o + r0 * cd.H * cd.Dv, A.stats + r0 * cd.H * 2,
                                    dO + r0 * cd.H * cd.Dv, qsegs, dqc + r0 * cd.H * cd.Dq, kacc, cp, CS);
    if (!fused) {  // zeroed accumulators, the kernel's key side added in position order, then reordered in place
      dev.memset(kacc, 0, static_cast<int64_t>(nk * sizeof(Acc)), CS);
      if (cfg.dsa())  // the indexer loss's weight per query: 1 / the global batch's tokens (as the reference)
        K.dsa_core_backward(pol, cdj, A.qc + r0 * cd.H * cd.Dq, A.iq + r0 * cfg.index_q_width(), pos.data() + r0,
                            2 * ch, st.kv.data() + j * S * P, S, st.dsa_sel.data() + r0 * cd.topk,
                            A.o + r0 * cd.H * cd.Dv, A.stats + r0 * cd.H * 2, dO + r0 * cd.H * cd.Dv,
                            T(1) / static_cast<T>(sh.run.sequences * sh.run.seq_len), qsegs,
                            dqc + r0 * cd.H * cd.Dq, diq + r0 * cfg.index_q_width(), kacc, CS);
      else if (packed)
        K.attn_doc_core_backward(pol, cdj, A.qc + r0 * cd.H * cd.Dq, pos.data() + r0, docs.data() + r0, 2 * ch,
                                 st.kv.data() + j * S * P, S, A.o + r0 * cd.H * cd.Dv, A.stats + r0 * cd.H * 2,
                                 dO + r0 * cd.H * cd.Dv, qsegs, dqc + r0 * cd.H * cd.Dq, kacc, CS);
      else
        K.attn_core_backward(pol, cdj, A.qc + r0 * cd.H * cd.Dq, pos.data() + r0, 2 * ch,
                             st.kv.data() + j * S * P, S, A.o + r0 * cd.H * cd.Dv, A.stats + r0 * cd.H * 2,
                             dO + r0 * cd.H * cd.Dv, qsegs, dqc + r0 * cd.H * cd.Dq, kacc, CS);
      K.kv_zigzag_to_gather_acc(kacc, blk, cp, ch * P, CS);
    }
    // kacc in gather order: the exact reduce-scatter gives each cp rank the key-side sums of its own rows, unrounded.
    if (two_d) {
      // 2D CP, the all-gather reversed (seed 000: NVLink first, then RDMA): cp order (no, ni) -> (ni, no), the
      // exact reduce-scatter inside the domain, then across domains. Exact sums: the order never changes a bit.
      transpose_blocks(tacc, kacc, no, ni, static_cast<int64_t>(nm * sizeof(Acc)));
      mc.cp_inner->reduce_scatter(tacc, part, np, dt_exact<T>(), ReduceOp::exact_sum, CS);
      note(ph, *mc.cp_inner, CollOp::reduce_scatter);
      mc.cp_outer->reduce_scatter(part, mine, nm, dt_exact<T>(), ReduceOp::exact_sum, CS);
      note(ph, *mc.cp_outer, CollOp::reduce_scatter);
    } else {
      mc.cp->reduce_scatter(kacc, mine, nm, dt_exact<T>(), ReduceOp::exact_sum, CS);
      note(ph, *mc.cp, CollOp::reduce_scatter);
    }
    K.exact_round(mine, dpay + r0 * P, 2 * ch * P, CS);  // the single rounding of the key side
  }
  for (int k = two_d ? 5 : 3; k > 0; --k) arena_give();
}

// dst (cols, rows) blocks = src (rows, cols) blocks transposed; a block is `bytes` bytes. One strided copy per
// source row: block (r, c) of src goes to block (c, r) of dst.
template <class T>
void StepImpl<T>::transpose_blocks(void* dst, const void* src, int64_t rows, int64_t cols, int64_t bytes) {
  for (int64_t r = 0; r < rows; ++r)
    dev.copy_2d(static_cast<char*>(dst) + r * bytes, rows * bytes, static_cast<const char*>(src) + r * cols * bytes,
                bytes, bytes, cols, CS);
}

template <class T>
void StepImpl<T>::attention_bwd(int64_t i, const md::AttnW<T>& w, LayerState& st, const T* dy, T* da,
                                const std::string& ph) {
  const md::CoreDims cd = md::CoreDims::from(cfg);
  const int64_t P = cd.P;
  const bool gqa = cfg.attn == md::AttnKind::gqa;
  Buf<T> dO = zeros(N * cd.H * cd.Dv, CS), dqc = zeros(N * cd.H * cd.Dq, CS), dpay = zeros(N * P, CS);
  Buf<T> diq = cfg.dsa() ? zeros(N * cfg.index_q_width(), CS) : Buf<T>();
  const std::vector<size_t> out_g = gqa ? names(i, {"attn.wo"}) : names(i, {"attn.wo", "attn.wuv"});
  if (!attn_out_partials(i, w, st, dy, dO.data(), out_g, ph)) {
    alloc_grads(out_g);
    K.attn_out_backward(pol, cfg, w, attn_g(i), N, st.attn, dy, rows.segs, dO.data(), CS);
    reduce_grads(out_g, ph);
  }
  core_backward_cp(st, dO.data(), dqc.data(), dpay.data(), diq.data(), ph);  // key-side accumulators given back inside
  // The gathered KV and dO are used up: freed before the projections' gradient accumulators are taken (the step's
  // peak) rather than at the layer's retire.
  st.kv.reset(CS);
  dO.reset(CS);
  std::vector<size_t> qkv_g = gqa ? names(i, {"attn.wq", "attn.wk", "attn.wv"})
                                  : names(i, {"attn.wq", "attn.wdkv", "attn.kv_norm", "attn.wuk"});
  if (cfg.dsa())
    for (size_t p : names(i, {"attn.wiq", "attn.wiw", "attn.wik"})) qkv_g.push_back(p);
  // The projections' gradients as tile partials where the rule and the kernel set allow (kv_norm and the indexer's
  // stay accumulators), else all of them accumulators.
  std::vector<size_t> part_g, acc_g;
  md::AttnGP<T> gp;
  const int64_t nt = dense_partial_tiles();
  for (size_t p : qkv_g) (nt > 0 && gp_field(p, &gp) ? part_g : acc_g).push_back(p);
  bool taken = false;
  if (!part_g.empty()) {
    size_t accs = 0;
    for (size_t p : acc_g) accs += sz(ps[p].expert ? Eloc * ps[p].full_elems() : ps[p].full_elems());
    grow_arena(accs + partials_need(part_g, nt));  // nothing live yet
    alloc_grads(acc_g);
    const std::vector<TilePartials<T>> tp = partials_take(part_g, nt);
    for (size_t k = 0; k < part_g.size(); ++k) *gp_field(part_g[k], &gp) = tp[k];
    if (!acc_g.empty() && !gqa) gp.kv_norm = G(fmt::format("layers.{}.attn.kv_norm", i));
    taken = K.attn_qkv_backward_partials(pol, cfg, w, gp, st.a1.data(), rope_pos(), N, sh.rope, st.attn, dqc.data(),
                                         dpay.data(), rows.segs, da, CS);
    if (taken) {
      for (size_t k = 0; k < part_g.size(); ++k) partials_merge(part_g[k], tp[k], ph);
      for (size_t k = 0; k < part_g.size(); ++k) arena_give();
      qkv_g = acc_g;
    } else {  // the kernel set has no such op: everything back, accumulators for all
      for (size_t p : acc_g) acc[p] = AccView();
      for (size_t k = 0; k < part_g.size() + acc_g.size(); ++k) arena_give();
    }
  }
  if (!taken) alloc_grads(qkv_g);
  const md::AttnG<T> g = attn_g(i);
  if (!taken)
    K.attn_qkv_backward(pol, cfg, w, g, st.a1.data(), rope_pos(), N, sh.rope, st.attn, dqc.data(), dpay.data(),
                        rows.segs, da, CS);
  if (cfg.dsa()) {  // the indexer's weight gradients (model::dsa_index_wgrad's three, the input detached)
    const int64_t d = cfg.d_model, Hi = cfg.index_heads, Di = cfg.index_dim, Iw = cfg.index_q_width();
    K.wgrad_acc(pol, st.a1.data(), d, diq.data(), Iw, d, Hi * Di, rows.segs, g.wiq, CS);
    K.wgrad_acc(pol, st.a1.data(), d, diq.data() + Hi * Di, Iw, d, Hi, rows.segs, g.wiw, CS);
    K.wgrad_acc(pol, st.a1.data(), d, dpay.data() + cd.ikey, P, d, Di, rows.segs, g.wik, CS);
  }
  reduce_grads(qkv_g, ph);
}

// The field of the partials view gp that dense tensor p fills (nullptr: p is not one of the projections it holds).
template <class T>
TilePartials<T>* StepImpl<T>::gp_field(size_t p, md::AttnGP<T>* gp) const {
  md::AttnGP<T>& v = *gp;
  const std::string& name = sh.init->info[p].name;
  const size_t dot = name.rfind('.');
  const std::string w = name.substr(dot + 1);
  if (name.find(".attn.") == std::string::npos) return nullptr;
  if (w == "wq") return &v.wq;
  if (w == "wk") return &v.wk;
  if (w == "wv") return &v.wv;
  if (w == "wo") return &v.wo;
  if (w == "wdkv") return &v.wdkv;
  if (w == "wuk") return &v.wuk;
  if (w == "wuv") return &v.wuv;
  return nullptr;
}

// attn_out_backward with wo (and wuv) exchanged as tile partials (docs/parallel.md section 4). Returns false, issuing
// nothing, where not taken (the rule, or a kernel set without attn_out_backward_partials).
template <class T>
bool StepImpl<T>::attn_out_partials(int64_t i, const md::AttnW<T>& w, LayerState& st, const T* dy, T* dO,
                                    const std::vector<size_t>& out_g, const std::string& ph) {
  const int64_t nt = dense_partial_tiles();
  if (nt == 0) return false;
  const std::vector<TilePartials<T>> tp = partials_take(out_g, nt);
  md::AttnGP<T> gp;
  for (size_t k = 0; k < out_g.size(); ++k) {
    TilePartials<T>* f = gp_field(out_g[k], &gp);
    TD_CHECK(f != nullptr, "layer {}: {} has no partials field", i, sh.init->info[out_g[k]].name);
    *f = tp[k];
  }
  const bool taken = K.attn_out_backward_partials(pol, cfg, w, gp, N, st.attn, dy, rows.segs, dO, CS);
  if (taken)
    for (size_t k = 0; k < out_g.size(); ++k) partials_merge(out_g[k], tp[k], ph);
  for (size_t k = 0; k < out_g.size(); ++k) arena_give();
  return taken;
}

#define TD_STEP_ATTN(T)                                                                                            \
  template void StepImpl<T>::attention_fwd(int64_t, const md::AttnW<T>&, LayerState&, T*, const std::string&);     \
  template void StepImpl<T>::core_backward_cp(LayerState&, const T*, T*, T*, T*, const std::string&);              \
  template bool StepImpl<T>::key_partials(LayerState&, const T*, T*, T*, const std::string&);                       \
  template void StepImpl<T>::transpose_blocks(void*, const void*, int64_t, int64_t, int64_t);                      \
  template void StepImpl<T>::attention_bwd(int64_t, const md::AttnW<T>&, LayerState&, const T*, T*,                \
                                           const std::string&);                                                    \
  template TilePartials<T>* StepImpl<T>::gp_field(size_t, md::AttnGP<T>*) const;                                   \
  template bool StepImpl<T>::attn_out_partials(int64_t, const md::AttnW<T>&, LayerState&, const T*, T*,            \
                                               const std::vector<size_t>&, const std::string&);
TD_STEP_ATTN(float)
TD_STEP_ATTN(double)
#undef TD_STEP_ATTN

}  // namespace trident
