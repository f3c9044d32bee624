// The step's layer forward / backward and the driver (parallel/step_impl.h): the reference's layer_forward /
// layer_backward on the local rows (same ops, same order), FSDP gathers prefetched one unit ahead, the loss over
// the global batch, full recompute.
#include <chrono>
#include <cmath>
#include <thread>

#include <limits>

#include "parallel/step_impl.h"
#include "reference/model/linear_ce.h"

namespace trident {

namespace md = trident::model;

template <class T>
int64_t StepImpl<T>::LayerState::bytes() const {
  int64_t b = a1.bytes() + rinv1.bytes() + h.bytes() + a2.bytes() + rinv2.bytes() + ug.bytes() + uu.bytes() +
              hh.bytes() + kv.bytes() + logits.bytes() + scores.bytes() + gates.bytes() + yk.bytes() + sug.bytes() +
              suu.bytes() + sh.bytes() + sy.bytes() + sel.bytes() + attn_mem.bytes() + dsa_sel.bytes() + ikl.bytes();
  for (const EpChunk& C : chunks)
    for (const ExBlock& X : C.ex)
      b += X.x.bytes() + X.ug.bytes() + X.uu.bytes() + X.h.bytes() + X.y.bytes() + X.dy.bytes() + X.dug.bytes() +
           X.duu.bytes() + X.dx.bytes();
  return b;
}

template <class T>
void StepImpl<T>::retire(LayerState& st, bool keep_dsa_sel) {
  for (Buf<T>* b : {&st.a1, &st.rinv1, &st.h, &st.a2, &st.rinv2, &st.ug, &st.uu, &st.hh, &st.attn_mem, &st.kv,
                    &st.logits, &st.scores, &st.gates, &st.yk, &st.sug, &st.suu, &st.sh, &st.sy})
    b->reset(CS);
  st.sel.reset(CS);
  st.ikl.reset(CS);
  for (EpChunk& C : st.chunks)
    for (ExBlock& X : C.ex)
      for (Buf<T>* b : {&X.x, &X.ug, &X.uu, &X.h, &X.y, &X.dy, &X.dug, &X.duu, &X.dx}) b->reset(CS);
  Buf<int32_t> dsa_sel = std::move(st.dsa_sel);  // DSA: the selection outlives the recompute's retire
  st = LayerState();
  if (!keep_dsa_sel) dsa_sel.reset(CS);
  st.dsa_sel = std::move(dsa_sel);
}

// Test hook (StepShared::fault): the failures a real run can meet, inside the real step.
template <class T>
void StepImpl<T>::inject_fault(int64_t i) {
  using Kind = StepFault::Kind;
  const auto& f = sh.fault;
  if (f.kind == Kind::none || fault_done || f.rank != rank || f.layer != i) return;
  fault_done = true;
  switch (f.kind) {
    case Kind::throw_error: fail(fmt::format("injected fault: rank {} throws in layer {}'s forward", rank, i));
    case Kind::stall: std::this_thread::sleep_for(std::chrono::milliseconds(f.stall_ms)); break;
    case Kind::wrong_collective: {  // a collective the other ranks do not make at this point
      double one = 1;
      world.all_reduce(&one, &one, 1, DataType::f64, ReduceOp::sum, CS);
      break;
    }
    case Kind::none: break;
  }
}

template <class T>
void StepImpl<T>::layer_fwd(int64_t i, const T* x, LayerState& st, T* out, const std::string& ph) {
  auto nm = [&](const char* s) { return fmt::format("layers.{}.{}", i, s); };
  inject_fault(i);
  st.moe = cfg.is_moe_layer(i);
  st.a1 = zeros(N * d, CS);
  st.rinv1 = zeros(N, CS);
  K.rmsnorm_forward(x, d, W(nm("attn_norm")), N, d, cfg.norm_eps, st.a1.data(), d, st.rinv1.data(), CS);
  Buf<T> y = zeros(N * d, CS);
  attention_fwd(i, attn_w(i), st, y.data(), ph);
  st.h = zeros(N * d, CS);
  K.residual_forward(st.h.data(), x, y.data(), N * d, CS);
  st.a2 = zeros(N * d, CS);
  st.rinv2 = zeros(N, CS);
  K.rmsnorm_forward(st.h.data(), d, W(nm("ffn_norm")), N, d, cfg.norm_eps, st.a2.data(), d, st.rinv2.data(), CS);
  if (!st.moe) {
    const int64_t F = cfg.dense_ffn;
    st.ug = zeros(N * F, CS);
    st.uu = zeros(N * F, CS);
    st.hh = zeros(N * F, CS);
    K.swiglu_forward(pol, st.a2.data(), W(nm("mlp.wg")), W(nm("mlp.wu")), W(nm("mlp.wd")), N, d, F, st.ug.data(),
                     st.uu.data(), st.hh.data(), y.data(), CS);
  } else {
    moe_fwd(i, st, y.data(), ph);
  }
  K.residual_forward(out, st.h.data(), y.data(), N * d, CS);
}

template <class T>
void StepImpl<T>::layer_bwd(int64_t i, const T* x, LayerState& st, const T* dout, T* dx, const std::string& ph) {
  auto nm = [&](const char* s) { return fmt::format("layers.{}.{}", i, s); };
  Buf<T> da = zeros(N * d, CS), dn = zeros(N * d, CS), dh = zeros(N * d, CS);
  if (!st.moe) {
    const int64_t F = cfg.dense_ffn;
    Buf<T> dug = zeros(N * F, CS), duu = zeros(N * F, CS);
    K.swiglu_backward_dgrad(pol, dout, W(nm("mlp.wg")), W(nm("mlp.wu")), W(nm("mlp.wd")), st.ug.data(),
                            st.uu.data(), N, d, F, dug.data(), duu.data(), da.data(), CS);
    swiglu_wgrad(nm("mlp."), F, ph, {{0, st.a2.data(), st.hh.data(), dout, dug.data(), duu.data(), rows.segs}});
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

template <class T>
void StepImpl<T>::count_load(int64_t i, const LayerState& st) {
  if (!data) {  // shapes only: the routing counts of the layer's chunks (slots filled by the dispatch)
    for (int64_t c = 0; c < sh.ep_chunks; ++c) {
      const int32_t* n = sh.routing->slot(run_step, i, rank, c);
      for (int64_t e = 0; e < E; ++e) load[sz(i * E + e)] += n[e];
    }
    return;
  }
  for (int64_t j = 0; j < N * Kt; ++j) load[sz(i * E + st.sel_h[sz(j)])]++;
}

template <class T>
void StepImpl<T>::take_rows(const md::Batch& b) {
  TD_CHECK(b.B == sh.run.sequences && b.S == sh.run.seq_len, "step: batch {}x{} but the run expects {}x{}", b.B, b.S,
           sh.run.sequences, sh.run.seq_len);
  S = b.S;
  cp = sh.mesh.cp;
  ch = S / (2 * cp);
  auto ranges = local_tokens(sh.mesh, rank, b.B, b.S);
  if (sh.plant == StepPlant::zigzag_off_by_one && cp > 1 && dense_coord(sh.mesh, rank).c > 0)  // test hook (step.h)
    for (size_t i = 1; i < ranges.size(); i += 2) {  // the mirror chunk 2cp-c instead of 2cp-1-c
      ranges[i].begin += ch;
      ranges[i].end += ch;
    }
  nseq = static_cast<int64_t>(ranges.size()) / 2;
  N = nseq * 2 * ch;
  rows = md::TokenRows();
  rows.n = N;
  rows.segs = {0};
  tokens_h.clear();
  targets_h.clear();
  packed = !b.doc_start.empty();
  for (const TokenRange& r : ranges) {
    for (int64_t p = r.begin; p < r.end; ++p) {
      rows.seq.push_back(r.seq);
      rows.pos.push_back(p);
      if (packed) rows.doc.push_back(b.doc_start[sz(r.seq * S + p)]);
      tokens_h.push_back(b.tokens[sz(r.seq * S + p)]);
      targets_h.push_back(b.targets[sz(r.seq * S + p)]);
      const int64_t n = static_cast<int64_t>(rows.pos.size());
      if ((p + 1) % cfg.tile == 0 || p + 1 == r.end) rows.segs.push_back(n);  // tiles of T positions
    }
  }
  core_pairs.assign(sz(nseq), 0);
  select_pairs.assign(sz(nseq), 0);
  const int64_t topk = cfg.dsa() ? cfg.dsa_topk : 0;
  for (int64_t r = 0; r < N; ++r) {
    const int64_t vis = rows.pos[sz(r)] - (packed ? rows.doc[sz(r)] : 0) + 1, j = r / (2 * ch);
    select_pairs[sz(j)] += vis;
    core_pairs[sz(j)] += topk > 0 ? std::min(topk, vis) : vis;
  }
  tokens = Buf<int32_t>(dev, N, CS);
  targets = Buf<int32_t>(dev, N, CS);
  pos = Buf<int64_t>(dev, N, CS);
  dev.upload(tokens.data(), tokens_h.data(), tokens.bytes(), CS);
  dev.upload(targets.data(), targets_h.data(), targets.bytes(), CS);
  dev.upload(pos.data(), rows.pos.data(), pos.bytes(), CS);
  if (packed) {
    const std::vector<int64_t> rp = md::rope_positions(rows);
    docs = Buf<int64_t>(dev, N, CS);
    rpos = Buf<int64_t>(dev, N, CS);
    dev.upload(docs.data(), rows.doc.data(), docs.bytes(), CS);
    dev.upload(rpos.data(), rp.data(), rpos.bytes(), CS);
  } else {
    docs = Buf<int64_t>();
    rpos = Buf<int64_t>();
  }
  const int64_t nt = static_cast<int64_t>(rows.segs.size()) - 1, n = sh.ep_chunks;
  chunk_tile.assign(sz(n + 1), 0);
  for (int64_t k = 0; k <= n; ++k) chunk_tile[sz(k)] = k * nt / n;
}

template <class T>
RankStepStats StepImpl<T>::step(const md::Batch& batch) {
  counts.clear();
  reduced.assign(ps.size(), 0);
  take_rows(batch);
  const bool rec = sh.run.recompute;
  load.assign(sz(L * E), 0);
  auto fwd = [](int64_t u) { return u == 0 ? std::string("fwd.embed") : fmt::format("fwd.layer.{}", u - 1); };
  auto bwd = [&](int64_t u) {
    if (u == 0) return std::string("bwd.embed");
    return u == L + 1 ? std::string("bwd.head") : fmt::format("bwd.layer.{}", u - 1);
  };
  auto at = [&](StepProgress::Stage s, int64_t i = -1) {  // world rank 0 says where it is (progress lines)
    if (sh.progress && rank == 0) sh.progress->set(s, i, L);
  };
  // ---- forward: unit u's gather was issued (prefetched) while unit u-1 computed
  std::vector<Buf<T>> xsave(sz(L + 1));
  std::vector<LayerState> states(sz(L));
  if (cfg.dsa()) {
    ikl_acc = Buf<Acc>(dev, 1, CS);
    dev.memset(ikl_acc.data(), 0, ikl_acc.bytes(), CS);
  }
  std::vector<int64_t> st_bytes(sz(L), 0);
  gather(0, XS, "fwd.embed");
  wait_gather(0);
  gather(1, XS, fwd(1));
  xsave[0] = zeros(N * d, CS);
  mem.add(xsave[0].bytes());
  K.embedding_forward(xsave[0].data(), tokens.data(), W("embed"), N, d, V, CS);
  release(0);
  for (int64_t i = 0; i < L; ++i) {
    const int64_t u = 1 + i;
    at(StepProgress::Stage::forward, i);
    wait_gather(u);
    gather(u + 1, XS, u + 1 == L + 1 ? std::string("fwd.head") : fwd(u + 1));
    xsave[sz(i + 1)] = zeros(N * d, CS);
    mem.add(xsave[sz(i + 1)].bytes());
    LayerState& st = states[sz(i)];
    md::in_layer(i, [&] { layer_fwd(i, xsave[sz(i)].data(), st, xsave[sz(i + 1)].data(), fwd(u)); });
    if (st.moe) count_load(i, st);
    if (rec) retire(st, /*keep_dsa_sel=*/true);  // full recompute: keep only the layer input (and DSA selection)
    else mem.add(st_bytes[sz(i)] = st.bytes());
    release(u);
  }
  // ---- head: final norm, linear CE, global loss
  at(StepProgress::Stage::head);
  wait_gather(L + 1);
  Buf<T> hidden = zeros(N * d, CS), rinvf = zeros(N, CS), token_loss = zeros(N, CS), lse = zeros(N, CS);
  mem.add(hidden.bytes() + token_loss.bytes() + lse.bytes());
  K.rmsnorm_forward(xsave[sz(L)].data(), d, W("final_norm"), N, d, cfg.norm_eps, hidden.data(), d, rinvf.data(), CS);
  K.linear_ce_forward(pol, hidden.data(), W("lm_head"), targets.data(), N, d, V, cfg.vocab_chunk, sh.run.token_chunk,
                      token_loss.data(), lse.data(), CS);
  int64_t nvalid = 0;
  for (int32_t t : targets_h) nvalid += t != md::kIgnoreIndex ? 1 : 0;
  Buf<Acc> loss_acc(dev, 1, CS);
  dev.memset(loss_acc.data(), 0, loss_acc.bytes(), CS);
  K.sum_acc(token_loss.data(), 1, rows.segs, loss_acc.data(), CS);
  Buf<int64_t> nv(dev, 1, CS);
  dev.upload(nv.data(), &nvalid, nv.bytes(), CS);
  world.all_reduce(nv.data(), nv.data(), 1, DataType::i64, ReduceOp::sum, CS);
  note("loss", world, CollOp::all_reduce);
  world.all_reduce(loss_acc.data(), loss_acc.data(), 1, dt_exact<T>(), ReduceOp::exact_sum, CS);
  note("loss", world, CollOp::all_reduce);
  if (cfg.dsa()) {  // the indexer loss: every rank's KL terms (each row counted once: d_rep replicas hold other rows)
    world.all_reduce(ikl_acc.data(), ikl_acc.data(), 1, dt_exact<T>(), ReduceOp::exact_sum, CS);
    note("loss", world, CollOp::all_reduce);
  }
  RankStepStats res;
  if (data) {
    nvalid = dev.fetch_one(nv.data(), CS);  // host sync point 3: the loss and the gradient scale
    const Acc loss_sum = dev.fetch_one(loss_acc.data(), CS);
    const T loss = nvalid > 0 ? loss_sum.round() / static_cast<T>(nvalid) : T(0);
    res.loss = static_cast<double>(loss);
    res.n_valid = nvalid;
    if (cfg.dsa()) {
      const Acc ikl_sum = dev.fetch_one(ikl_acc.data(), CS);
      res.indexer_loss = static_cast<double>(ikl_sum.round() / static_cast<T>(sh.run.sequences * sh.run.seq_len));
    }
  } else {  // shapes only: the same reads, no values (the loss is NaN; the gradient scale is any value)
    dev.download_known(nullptr, nv.data(), nv.bytes(), CS);
    dev.synchronize(CS);
    dev.download_known(nullptr, loss_acc.data(), loss_acc.bytes(), CS);
    dev.synchronize(CS);
    if (cfg.dsa()) {
      dev.download_known(nullptr, ikl_acc.data(), ikl_acc.bytes(), CS);
      dev.synchronize(CS);
    }
    res.loss = res.indexer_loss = std::numeric_limits<double>::quiet_NaN();
    res.n_valid = -1;
    nvalid = 1;
  }
  const T scale = nvalid > 0 ? T(1) / static_cast<T>(nvalid) : T(0);

  // ---- backward: head (kept gathered), layers (re-gathered, prefetched one ahead), embedding
  gather(L, XS, bwd(L));  // prefetch the last layer while the head runs
  const std::vector<size_t> fn_g{idx("final_norm")};
  Buf<T> dhidden = zeros(N * d, CS), dx = zeros(N * d, CS), dprev = zeros(N * d, CS);
  mem.add(3 * dx.bytes());
  reduce_head_slices(  // ascending: dhidden's in-order sum continues
      "bwd.head",
      [&](const Range& r, Acc* a) {
        K.linear_ce_backward(pol, hidden.data(), W("lm_head"), targets.data(), lse.data(), N, d, V, cfg.vocab_chunk,
                             sh.run.token_chunk, scale, rows.segs, r.begin, r.end, dhidden.data(), a, CS);
      },
      [&](const Range& r, const TilePartials<T>& tp) {
        return K.linear_ce_backward_partials(pol, hidden.data(), W("lm_head"), targets.data(), lse.data(), N, d, V,
                                             cfg.vocab_chunk, sh.run.token_chunk, scale, rows.segs, r.begin, r.end,
                                             dhidden.data(), tp, CS);
      });
  alloc_grads(fn_g);
  K.rmsnorm_backward(dhidden.data(), d, xsave[sz(L)].data(), d, rinvf.data(), W("final_norm"), N, d, rows.segs,
                     dx.data(), d, G("final_norm"), CS);
  release(L + 1);
  reduce_grads(fn_g, "bwd.head");
  mem.sub(hidden.bytes() + token_loss.bytes() + lse.bytes());
  for (int64_t i = L - 1; i >= 0; --i) {
    const int64_t u = 1 + i;
    at(StepProgress::Stage::backward, i);
    wait_gather(u);
    if (u - 1 >= 1) gather(u - 1, XS, bwd(u - 1));
    LayerState& st = states[sz(i)];
    if (rec) {  // full recompute: re-run the layer forward (CP gather and EP dispatch included)
      Buf<T> out = zeros(N * d, CS);
      md::in_layer(i, [&] { layer_fwd(i, xsave[sz(i)].data(), st, out.data(), bwd(u)); });
      mem.add(st_bytes[sz(i)] = st.bytes());
    }
    layer_bwd(i, xsave[sz(i)].data(), st, dx.data(), dprev.data(), bwd(u));
    std::swap(dx, dprev);
    mem.add(st.bytes() - st_bytes[sz(i)]);  // backward buffers of the owner experts
    mem.sub(st.bytes());
    retire(st);
    release(u);
    mem.sub(xsave[sz(i + 1)].bytes());
    xsave[sz(i + 1)].reset(CS);
  }
  at(StepProgress::Stage::embedding);
  reduce_embed_slices("bwd.embed", dx.data());
  mem.sub(3 * dx.bytes() + xsave[0].bytes());
  // The accumulator arena is given back until the next backward: kept, its full size would be live from the start
  // of the next backward on, under the last layer's MoE buffers, where the step does not need it yet.
  mem.sub(arena.bytes());
  arena.reset(CS);

  for (size_t j = 0; j < ps.size(); ++j)  // every trainable tensor reduced exactly once
    TD_CHECK_EQ(reduced[j], ps[j].trainable ? 1 : 0, "gradient reductions of {}", sh.init->info[j].name);
  at(StepProgress::Stage::optimizer);
  optimizer(res);
  dev.synchronize(CS);
  dev.synchronize(XS);
  ++run_step;
  at(StepProgress::Stage::idle);
  return res;
}

#define TD_STEP_LAYERS(T)                                                                                          \
  template int64_t StepImpl<T>::LayerState::bytes() const;                                                         \
  template void StepImpl<T>::retire(LayerState&, bool);                                                                  \
  template void StepImpl<T>::inject_fault(int64_t);                                                                \
  template void StepImpl<T>::layer_fwd(int64_t, const T*, LayerState&, T*, const std::string&);                    \
  template void StepImpl<T>::layer_bwd(int64_t, const T*, LayerState&, const T*, T*, const std::string&);          \
  template void StepImpl<T>::count_load(int64_t, const LayerState&);                                               \
  template void StepImpl<T>::take_rows(const md::Batch&);                                                          \
  template RankStepStats StepImpl<T>::step(const md::Batch&);
TD_STEP_LAYERS(float)
TD_STEP_LAYERS(double)
#undef TD_STEP_LAYERS

}  // namespace trident
