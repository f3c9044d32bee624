// The step's chunked expert parallelism (parallel/step_impl.h, docs/parallel.md section 4). Per MoE layer the local
// token tiles are cut into ep_chunks chunks; chunk c+1's dispatch runs on the comm stream while chunk c's experts
// run on the compute stream. Rows travel in (local expert, tile, row) order per peer; the owner keeps, per chunk
// and local expert, its rows in (source, tile, row) order (ExBlock), so every expert sees its rows in the
// reference's order and its weight gradient adds the same tile partials.
#include "parallel/step_impl.h"

namespace trident {

namespace md = trident::model;

template <class T>
typename StepImpl<T>::ExpertW StepImpl<T>::expert_w(int64_t i, int64_t el) const {
  auto n = [&](const char* s) { return fmt::format("layers.{}.moe.experts.{}", i, s); };
  return {W(n("wg")) + el * expert_stride(n("wg")), W(n("wu")) + el * expert_stride(n("wu")),
          W(n("wd")) + el * expert_stride(n("wd"))};
}

// One AlltoAllv of rows of width d over ep with a chunk's row counts: to_owners sends the source rows to the expert
// owners (send scnt/sdis, receive rcnt/rdis); otherwise the owners' rows go back to their sources.
template <class T>
void StepImpl<T>::exchange_rows(const EpChunk& C, bool to_owners, const T* send, T* recv, Stream s,
                                const std::string& ph) {
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

// Dispatch of chunk c on stream s: counts per (peer, local expert, tile) with all_to_all, the input rows with
// all_to_allv, then each local expert's rows gathered into its block.
template <class T>
const int32_t* StepImpl<T>::routed(int64_t i, int64_t c) {
  const int64_t rows_c = rows.segs[sz(chunk_tile[sz(c + 1)])] - rows.segs[sz(chunk_tile[sz(c)])];
  return sh.routing->fill(run_step, i, rank, c, rows_c);
}

// Shapes only: chunk c's dispatch from the routing counts (every rank's slots), with the data path's calls, sizes
// and sync point, and no row lists.
template <class T>
void StepImpl<T>::ep_dispatch_counts(int64_t i, int64_t c, LayerState& st, Stream s, const std::string& ph) {
  const int64_t ep = sh.mesh.ep, nt = chunk_tile[sz(c + 1)] - chunk_tile[sz(c)], nc = ep * Eloc * nt;
  EpChunk& C = st.chunks[sz(c)];
  const int32_t* mine = routed(i, c);  // written before the counts' all_to_all: the peers read it after
  C.scnt.assign(sz(ep), 0);
  C.sdis.assign(sz(ep), 0);
  C.rcnt.assign(sz(ep), 0);
  C.rdis.assign(sz(ep), 0);
  C.send_tk.clear();
  C.ns = 0;
  for (int64_t q = 0; q < ep; ++q) {
    C.sdis[sz(q)] = sz(C.ns);
    for (int64_t el = 0; el < Eloc; ++el) C.ns += mine[q * Eloc + el];
    C.scnt[sz(q)] = sz(C.ns) - C.sdis[sz(q)];
  }
  Buf<int64_t> cnt(dev, 2 * nc, s);
  dev.upload(cnt.data(), nullptr, nc * static_cast<int64_t>(sizeof(int64_t)), s);
  mc.ep->all_to_all(cnt.data(), cnt.data() + nc, sz(Eloc * nt), DataType::i64, s);
  note(ph, *mc.ep, CollOp::all_to_all);
  dev.download_known(nullptr, cnt.data() + nc, nc * static_cast<int64_t>(sizeof(int64_t)), s);  // sync point 2
  dev.synchronize(s);
  C.ex.clear();
  C.ex.resize(sz(Eloc));
  size_t nr = 0;
  for (int64_t q = 0; q < ep; ++q) {  // ep peer q is world rank ef * ep + q (the expert mesh, ep innermost)
    const int32_t* theirs = sh.routing->slot(run_step, i, ec.ef * ep + q, c);
    C.rdis[sz(q)] = nr;
    for (int64_t el = 0; el < Eloc; ++el) {
      nr += sz(theirs[e0 + el]);
      C.ex[sz(el)].rows += theirs[e0 + el];
    }
    C.rcnt[sz(q)] = nr - C.rdis[sz(q)];
  }
  for (ExBlock& X : C.ex)
    if (X.rows > 0) X.segs = {0, X.rows};
  send_rows(C, st, unread_rows(C.ns), static_cast<int64_t>(nr), s, ph);
}

// The rows of chunk C to their owners: the source rows (src_rows of a2) packed, the all_to_allv, and each local
// expert's rows gathered into its block.
template <class T>
void StepImpl<T>::send_rows(EpChunk& C, LayerState& st, std::span<const int64_t> src_rows, int64_t nr, Stream s,
                            const std::string& ph) {
  Buf<T> sbuf(dev, C.ns * d, s), rbuf(dev, nr * d, s);
  mem.add(sbuf.bytes() + rbuf.bytes());
  K.gather_rows(sbuf.data(), st.a2.data(), src_rows, d, s);
  exchange_rows(C, /*to_owners=*/true, sbuf.data(), rbuf.data(), s, ph);
  for (ExBlock& X : C.ex) {
    X.x = Buf<T>(dev, X.n() * d, s);
    K.gather_rows(X.x.data(), rbuf.data(), X.idx(), d, s);
  }
  mem.sub(sbuf.bytes() + rbuf.bytes());
}

template <class T>
void StepImpl<T>::ep_dispatch(int64_t i, int64_t c, LayerState& st, Stream s, const std::string& ph) {
  if (!data) return ep_dispatch_counts(i, c, st, s, ph);
  const int64_t ep = sh.mesh.ep, t0 = chunk_tile[sz(c)], t1 = chunk_tile[sz(c + 1)], nt = t1 - t0;
  EpChunk& C = st.chunks[sz(c)];
  std::vector<std::vector<int64_t>> lists(sz(E * nt));  // (expert, tile) -> (row*K + k), from the host routing
  // test hook (StepShared::plant, step.h): every chunk but the last loses its last token row
  const int64_t lost = sh.plant == StepPlant::chunk_drops_token && c + 1 < sh.ep_chunks ? 1 : 0;
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t r = rows.segs[sz(t)]; r < rows.segs[sz(t + 1)] - (t + 1 == t1 ? lost : 0); ++r)
      for (int64_t k = 0; k < Kt; ++k) lists[sz(st.sel_h[sz(r * Kt + k)] * nt + (t - t0))].push_back(r * Kt + k);
  const int64_t nc = ep * Eloc * nt;
  std::vector<int64_t> cs(sz(nc), 0);
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
  Buf<int64_t> cnt(dev, 2 * nc, s);  // sent counts, then received counts
  dev.upload(cnt.data(), cs.data(), nc * static_cast<int64_t>(sizeof(int64_t)), s);
  mc.ep->all_to_all(cnt.data(), cnt.data() + nc, sz(Eloc * nt), DataType::i64, s);
  note(ph, *mc.ep, CollOp::all_to_all);
  if (sh.routing) {  // recording: this rank's counts per expert (its slot)
    int32_t* out = sh.routing->slot(run_step, i, rank, c);
    for (int64_t e = 0; e < E; ++e) {
      int64_t n = 0;
      for (int64_t t = 0; t < nt; ++t) n += static_cast<int64_t>(lists[sz(e * nt + t)].size());
      out[e] = static_cast<int32_t>(n);
    }
  }
  const std::vector<int64_t> cr = dev.fetch(cnt.data() + nc, nc, s);  // host sync point 2: counts size the buffers
  size_t nr = 0;
  for (int64_t q = 0; q < ep; ++q) {
    C.rdis[sz(q)] = nr;
    for (int64_t j = 0; j < Eloc * nt; ++j) nr += sz(cr[sz(q * Eloc * nt + j)]);
    C.rcnt[sz(q)] = nr - C.rdis[sz(q)];
  }
  // Owner: per local expert, the receive-buffer rows in (source, tile, row) order; tile segments per (source, tile).
  C.ex.clear();
  C.ex.resize(sz(Eloc));
  for (int64_t el = 0; el < Eloc; ++el) {
    ExBlock& X = C.ex[sz(el)];
    for (int64_t q = 0; q < ep; ++q) {
      int64_t off = static_cast<int64_t>(C.rdis[sz(q)]);
      for (int64_t e2 = 0; e2 < el; ++e2)
        for (int64_t t = 0; t < nt; ++t) off += cr[sz((q * Eloc + e2) * nt + t)];
      for (int64_t t = 0; t < nt; ++t) {
        const int64_t n = cr[sz((q * Eloc + el) * nt + t)];
        for (int64_t r = 0; r < n; ++r) X.recv_idx.push_back(off + r);
        off += n;
        if (n > 0) X.segs.push_back(static_cast<int64_t>(X.recv_idx.size()));
      }
    }
    X.rows = static_cast<int64_t>(X.recv_idx.size());
  }
  C.ns = static_cast<int64_t>(C.send_tk.size());
  const int64_t ns = static_cast<int64_t>(C.send_tk.size());
  std::vector<int64_t> src_rows(sz(ns));
  for (int64_t j = 0; j < ns; ++j) src_rows[sz(j)] = C.send_tk[sz(j)] / Kt;
  send_rows(C, st, src_rows, static_cast<int64_t>(nr), s, ph);
}

// Expert forward of chunk c's rows (owner) on the compute stream.
template <class T>
void StepImpl<T>::ep_compute(int64_t i, int64_t c, LayerState& st) {
  const int64_t F = cfg.expert_ffn;
  for (int64_t el = 0; el < Eloc; ++el) {
    ExBlock& X = st.chunks[sz(c)].ex[sz(el)];
    const int64_t n = X.n();
    X.ug = Buf<T>(dev, n * F, CS);
    X.uu = Buf<T>(dev, n * F, CS);
    X.h = Buf<T>(dev, n * F, CS);
    X.y = Buf<T>(dev, n * d, CS);
    const ExpertW w = expert_w(i, el);
    K.expert_forward(pol, X.x.data(), w.wg, w.wu, w.wd, n, d, F, X.ug.data(), X.uu.data(), X.h.data(), X.y.data(),
                     CS);
  }
}

// Return of chunk c's outputs (reverse all_to_allv) into yk (row*K + k, d) at the source, on stream s.
template <class T>
void StepImpl<T>::ep_combine(int64_t c, LayerState& st, Stream s, const std::string& ph) {
  EpChunk& C = st.chunks[sz(c)];
  const int64_t nr = static_cast<int64_t>(C.rdis.back() + C.rcnt.back()), ns = C.ns;
  Buf<T> sbuf(dev, nr * d, s), rbuf(dev, ns * d, s);
  mem.add(sbuf.bytes() + rbuf.bytes());
  for (const ExBlock& X : C.ex) K.scatter_rows(sbuf.data(), X.y.data(), X.idx(), d, s);
  exchange_rows(C, /*to_owners=*/false, sbuf.data(), rbuf.data(), s, ph);
  K.scatter_rows(st.yk.data(), rbuf.data(), C.tk(), d, s);
  mem.sub(sbuf.bytes() + rbuf.bytes());
}

template <class T>
void StepImpl<T>::moe_fwd(int64_t i, LayerState& st, T* out, const std::string& ph) {
  const int64_t Fs = cfg.shared_ffn, n = sh.ep_chunks;
  auto nm = [&](const char* s) { return fmt::format("layers.{}.moe.{}", i, s); };
  st.logits = zeros(N * E, CS);
  st.scores = zeros(N * E, CS);
  st.sel = Buf<int32_t>(dev, N * Kt, CS);
  st.gates = zeros(N * Kt, CS);
  K.router_forward(pol, st.a2.data(), W(nm("router")), W(nm("router_bias")), N, d, E, Kt, cfg.routed_scale,
                   st.logits.data(), st.scores.data(), st.sel.data(), st.gates.data(), CS);
  st.yk = zeros(N * Kt * d, CS);
  if (data) {
    st.sel_h = dev.fetch(st.sel.data(), N * Kt, CS);  // host sync point 1: the routing builds the send lists
  } else {  // shapes only: the routing counts stand for it
    dev.download_known(nullptr, st.sel.data(), N * Kt * static_cast<int64_t>(sizeof(int32_t)), CS);
    dev.synchronize(CS);
  }
  st.chunks.clear();
  st.chunks.resize(sz(n));
  // Chunked EP: chunk c+1's dispatch is issued on the comm stream before chunk c's expert GEMMs run on the compute
  // stream; each chunk's combine waits for its GEMMs. The comm stream first waits for the layer's inputs (a2) and
  // buffers (yk).
  dev.record(ev_route[0], CS);
  dev.wait(XS, ev_route[0]);
  ep_dispatch(i, 0, st, XS, ph);
  dev.record(ev_disp[0], XS);
  for (int64_t c = 0; c < n; ++c) {
    dev.wait(CS, ev_disp[sz(c)]);
    if (c + 1 < n) {
      ep_dispatch(i, c + 1, st, XS, ph);
      dev.record(ev_disp[sz(c + 1)], XS);
    }
    ep_compute(i, c, st);
    dev.record(ev_comp[sz(c)], CS);
    dev.wait(XS, ev_comp[sz(c)]);
    ep_combine(c, st, XS, ph);
    dev.record(ev_comb[sz(c)], XS);
  }
  dev.wait(CS, ev_comb[sz(n - 1)]);  // the comm stream is in order: every chunk's combine is done
  for (EpChunk& C : st.chunks)
    for (ExBlock& X : C.ex) X.y.reset(CS);  // the expert outputs live on in yk
  K.moe_combine_forward(out, st.gates.data(), st.yk.data(), N, d, Kt, CS);  // as moe_forward
  K.on_moe_combined(i, st.a2.data(), st.gates.data(), st.sel.data(), out, N, d, Kt, CS);
  if (Fs > 0) {
    st.sug = zeros(N * Fs, CS);
    st.suu = zeros(N * Fs, CS);
    st.sh = zeros(N * Fs, CS);
    st.sy = zeros(N * d, CS);
    K.swiglu_forward(pol, st.a2.data(), W(nm("shared.wg")), W(nm("shared.wu")), W(nm("shared.wd")), N, d, Fs,
                     st.sug.data(), st.suu.data(), st.sh.data(), st.sy.data(), CS);
    K.residual_forward(out, out, st.sy.data(), N * d, CS);
  }
}

template <class T>
void StepImpl<T>::moe_bwd(int64_t i, LayerState& st, const T* dout, T* da, const std::string& ph) {
  const int64_t Fs = cfg.shared_ffn, F = cfg.expert_ffn, n = sh.ep_chunks;
  auto nm = [&](const char* s) { return fmt::format("layers.{}.moe.{}", i, s); };
  Buf<T> dgates = zeros(N * Kt, CS), dxk = zeros(N * Kt * d, CS);
  // Chunked EP backward, overlapped like the forward: chunk c+1's dy dispatch is issued on the comm stream before
  // chunk c's dgrad runs on the compute stream; chunk c's dx combine waits only for that dgrad, and the compute
  // stream waits for the combines once, after the last chunk. Per chunk, alive until then: dy sent, dx returned.
  std::vector<Buf<T>> dy_send(sz(n)), dx_recv(sz(n));
  auto send_dy = [&](int64_t c) {  // source: dgate = dout . y (ascending c), dy = gate * dout, forward's order
    EpChunk& C = st.chunks[sz(c)];
    const int64_t ns = C.ns, nr = static_cast<int64_t>(C.rdis.back() + C.rcnt.back());
    dy_send[sz(c)] = Buf<T>(dev, ns * d, CS);
    K.moe_combine_backward(dout, st.gates.data(), st.yk.data(), C.tk(), d, Kt, dgates.data(),
                           dy_send[sz(c)].data(), CS);
    dev.record(ev_pack[sz(c)], CS);
    dev.wait(XS, ev_pack[sz(c)]);
    Buf<T> dy_recv(dev, nr * d, XS);
    mem.add(dy_send[sz(c)].bytes() + dy_recv.bytes());
    exchange_rows(C, /*to_owners=*/true, dy_send[sz(c)].data(), dy_recv.data(), XS, ph);
    for (ExBlock& X : C.ex) {
      X.dy = Buf<T>(dev, X.n() * d, XS);
      K.gather_rows(X.dy.data(), dy_recv.data(), X.idx(), d, XS);
    }
    mem.sub(dy_recv.bytes());
    dev.record(ev_disp[sz(c)], XS);
  };
  send_dy(0);
  for (int64_t c = 0; c < n; ++c) {
    EpChunk& C = st.chunks[sz(c)];
    dev.wait(CS, ev_disp[sz(c)]);
    if (c + 1 < n) send_dy(c + 1);
    for (int64_t el = 0; el < Eloc; ++el) {  // owner: dgrad of this chunk's rows (wgrad delayed)
      ExBlock& X = C.ex[sz(el)];
      const ExpertW w = expert_w(i, el);
      X.dug = Buf<T>(dev, X.n() * F, CS);
      X.duu = Buf<T>(dev, X.n() * F, CS);
      X.dx = Buf<T>(dev, X.n() * d, CS);
      K.expert_backward_dgrad(pol, X.dy.data(), w.wg, w.wu, w.wd, X.ug.data(), X.uu.data(), X.n(), d, F,
                              X.dug.data(), X.duu.data(), X.dx.data(), CS);
    }
    dev.record(ev_comp[sz(c)], CS);
    dev.wait(XS, ev_comp[sz(c)]);
    const int64_t ns = C.ns, nr = static_cast<int64_t>(C.rdis.back() + C.rcnt.back());
    Buf<T> dx_send(dev, nr * d, XS);
    dx_recv[sz(c)] = Buf<T>(dev, ns * d, XS);
    mem.add(dx_send.bytes() + dx_recv[sz(c)].bytes());
    for (const ExBlock& X : C.ex) K.scatter_rows(dx_send.data(), X.dx.data(), X.idx(), d, XS);
    exchange_rows(C, /*to_owners=*/false, dx_send.data(), dx_recv[sz(c)].data(), XS, ph);
    mem.sub(dx_send.bytes());
    dev.record(ev_comb[sz(c)], XS);
  }
  dev.wait(CS, ev_comb[sz(n - 1)]);  // the comm stream is in order: every chunk's combine is done
  for (int64_t c = 0; c < n; ++c) {
    K.scatter_rows(dxk.data(), dx_recv[sz(c)].data(), st.chunks[sz(c)].tk(), d, CS);
    mem.sub(dy_send[sz(c)].bytes() + dx_recv[sz(c)].bytes());
    dy_send[sz(c)].reset(CS);
    dx_recv[sz(c)].reset(CS);
  }
  // Delayed wgrad: per local expert, its row blocks of every chunk in order (tiles never split by a chunk).
  std::vector<SwigluRows> owned;
  for (int64_t el = 0; el < Eloc; ++el)
    for (const EpChunk& C : st.chunks) {
      const ExBlock& X = C.ex[sz(el)];
      if (X.n() > 0) owned.push_back({el, X.x.data(), X.h.data(), X.dy.data(), X.dug.data(), X.duu.data(), X.segs});
    }
  swiglu_wgrad(nm("experts."), F, ph, owned);
  // The owner-side rows are used up: freed now rather than at the layer's retire, so that they are not live under the
  // layer's attention backward (the step's peak). Every comm-stream use is ordered before (the last combine wait).
  for (EpChunk& C : st.chunks)
    for (ExBlock& X : C.ex)
      for (Buf<T>* b : {&X.x, &X.ug, &X.uu, &X.h, &X.y, &X.dy, &X.dug, &X.duu, &X.dx}) b->reset(CS);
  // da = +0, += expert dx (selected e ascending), += shared dx, += router dx (as moe_backward)
  K.moe_dx_sum(da, dxk.data(), N, d, Kt, CS);
  Buf<T> tmp = zeros(N * d, CS);
  if (Fs > 0) {
    Buf<T> dug = zeros(N * Fs, CS), duu = zeros(N * Fs, CS);
    K.swiglu_backward_dgrad(pol, dout, W(nm("shared.wg")), W(nm("shared.wu")), W(nm("shared.wd")), st.sug.data(),
                            st.suu.data(), N, d, Fs, dug.data(), duu.data(), tmp.data(), CS);
    swiglu_wgrad(nm("shared."), Fs, ph,
                 {{0, st.a2.data(), st.sh.data(), dout, dug.data(), duu.data(), rows.segs}});
    K.residual_forward(da, da, tmp.data(), N * d, CS);
    for (Buf<T>* b : {&st.sug, &st.suu, &st.sh, &st.sy}) b->reset(CS);  // used up (as the expert rows above)
  }
  Buf<T> dlogits = zeros(N * E, CS);
  K.router_backward(dgates.data(), st.scores.data(), st.sel.data(), N, E, Kt, cfg.routed_scale, dlogits.data(), CS);
  const std::vector<size_t> rg = names(i, {"moe.router"});
  if (!wgrad_exchange(rg[0], st.a2.data(), d, dlogits.data(), E, d, E, ph)) {  // as tile partials, or accumulated
    alloc_grads(rg);
    K.wgrad_acc(pol, st.a2.data(), d, dlogits.data(), E, d, E, rows.segs, G(nm("router")), CS);
    reduce_grads(rg, ph);
  }
  K.mm(pol, N, d, E, dlogits.data(), E, W(nm("router")), E, true, tmp.data(), d, CS);
  K.residual_forward(da, da, tmp.data(), N * d, CS);
  for (Buf<T>* b : {&st.logits, &st.scores, &st.gates, &st.yk}) b->reset(CS);  // the router's, used up
  st.sel.reset(CS);
}

#define TD_STEP_EP(T)                                                                                              \
  template StepImpl<T>::ExpertW StepImpl<T>::expert_w(int64_t, int64_t) const;                                     \
  template void StepImpl<T>::exchange_rows(const EpChunk&, bool, const T*, T*, Stream, const std::string&);        \
  template void StepImpl<T>::ep_dispatch(int64_t, int64_t, LayerState&, Stream, const std::string&);               \
  template void StepImpl<T>::ep_dispatch_counts(int64_t, int64_t, LayerState&, Stream, const std::string&);        \
  template const int32_t* StepImpl<T>::routed(int64_t, int64_t);                                                   \
  template void StepImpl<T>::send_rows(EpChunk&, LayerState&, std::span<const int64_t>, int64_t, Stream,            \
                                       const std::string&);                                                        \
  template void StepImpl<T>::ep_compute(int64_t, int64_t, LayerState&);                                            \
  template void StepImpl<T>::ep_combine(int64_t, LayerState&, Stream, const std::string&);                         \
  template void StepImpl<T>::moe_fwd(int64_t, LayerState&, T*, const std::string&);                                \
  template void StepImpl<T>::moe_bwd(int64_t, LayerState&, const T*, T*, const std::string&);
TD_STEP_EP(float)
TD_STEP_EP(double)
#undef TD_STEP_EP

}  // namespace trident
