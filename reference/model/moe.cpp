#include "reference/model/moe.h"

#include <algorithm>

#include "reference/check.h"
#include "reference/profile.h"
#include "reference/model/rows.h"

namespace trident::model {

std::vector<ExpertRows> route_rows(const int32_t* sel, int64_t N, int64_t K, int64_t E, std::span<const int64_t> segs) {
  prof::OpSection prof_section(prof::Op::moe_dispatch);
  std::vector<ExpertRows> out(static_cast<size_t>(E));
  for (auto& x : out) x.segs.push_back(0);
  TD_CHECK(!segs.empty() && segs.front() == 0 && segs.back() == N, "route_rows: segments must cover [0, {})", N);
  for (size_t t = 0; t + 1 < segs.size(); ++t) {
    for (int64_t r = segs[t]; r < segs[t + 1]; ++r)
      for (int64_t k = 0; k < K; ++k) {
        const int32_t e = sel[r * K + k];
        TD_CHECK(e >= 0 && e < E, "route_rows: expert id {} outside [0, {})", e, E);
        out[static_cast<size_t>(e)].row.push_back(r);
        out[static_cast<size_t>(e)].slot.push_back(static_cast<int32_t>(k));
      }
    for (auto& x : out) x.segs.push_back(static_cast<int64_t>(x.row.size()));
  }
  return out;
}

namespace {
// The (token, slot) pair t*K + k of each of an expert's rows, in its row order.
std::vector<int64_t> slots_of(const ExpertRows& R, int64_t K) {
  std::vector<int64_t> tk(R.row.size());
  for (size_t i = 0; i < tk.size(); ++i) tk[i] = R.row[i] * K + R.slot[i];
  return tk;
}
}  // namespace

template <class T>
void expert_forward(Policy pol, const Config& cfg, const MoeW<T>& W, int64_t e, int64_t n, ExpertActs<T>& A) {
  const int64_t d = cfg.d_model, F = cfg.expert_ffn;
  A.ug.assign(static_cast<size_t>(n * F), T(0));
  A.uu.assign(static_cast<size_t>(n * F), T(0));
  A.h.assign(static_cast<size_t>(n * F), T(0));
  A.y.assign(static_cast<size_t>(n * d), T(0));
  swiglu_forward<T>(pol, A.x.data(), W.wg + e * d * F, W.wu + e * d * F, W.wd + e * F * d, n, d, F, A.ug.data(),
                    A.uu.data(), A.h.data(), A.y.data());
}

template <class T>
void expert_backward_dgrad(Policy pol, const Config& cfg, const MoeW<T>& W, int64_t e, int64_t n,
                           const ExpertActs<T>& A, const T* dy, T* dug, T* duu, T* dx) {
  const int64_t d = cfg.d_model, F = cfg.expert_ffn;
  swiglu_backward_dgrad<T>(pol, dy, W.wg + e * d * F, W.wu + e * d * F, W.wd + e * F * d, A.ug.data(), A.uu.data(),
                           n, d, F, dug, duu, dx);
}

template <class T>
void expert_backward_wgrad(Policy pol, const Config& cfg, const MoeG<T>& G, int64_t e, const ExpertActs<T>& A,
                           const T* dy, const T* dug, const T* duu, std::span<const int64_t> segs) {
  const int64_t d = cfg.d_model, F = cfg.expert_ffn;
  swiglu_backward_wgrad<T>(pol, A.x.data(), A.h.data(), dy, dug, duu, d, F, segs, G.wg + e * d * F,
                           G.wu + e * d * F, G.wd + e * F * d);
}

template <class T>
void moe_forward(Policy pol, const Config& cfg, const MoeW<T>& W, const T* a, int64_t N,
                 std::span<const int64_t> segs, MoeActs<T>& A, T* out) {
  prof::OpSection prof_section(prof::Op::moe_dispatch);  // what its nested ops (router, experts, combine) leave
  const int64_t d = cfg.d_model, E = cfg.experts, K = cfg.top_k, Fs = cfg.shared_ffn;
  A.logits.assign(static_cast<size_t>(N * E), T(0));
  A.scores.assign(static_cast<size_t>(N * E), T(0));
  A.sel.assign(static_cast<size_t>(N * K), 0);
  A.gates.assign(static_cast<size_t>(N * K), T(0));
  router_forward<T>(pol, a, W.router, W.bias, N, d, E, K, cfg.routed_scale, A.logits.data(), A.scores.data(),
                    A.sel.data(), A.gates.data());
  A.rows = route_rows(A.sel.data(), N, K, E, segs);
  A.ex.assign(static_cast<size_t>(E), ExpertActs<T>());
  A.load.assign(static_cast<size_t>(E), 0);
  A.yk.assign(static_cast<size_t>(N * K * d), T(0));
  for (int64_t e = 0; e < E; ++e) {
    const ExpertRows& R = A.rows[e];
    const int64_t n = static_cast<int64_t>(R.row.size());
    A.load[e] = n;
    ExpertActs<T>& X = A.ex[e];
    X.x.assign(static_cast<size_t>(n * d), T(0));
    gather_rows<T>(X.x.data(), a, R.row, d);
    expert_forward<T>(pol, cfg, W, e, n, X);
    scatter_rows<T>(A.yk.data(), X.y.data(), slots_of(R, K), d);
  }
  {
    prof::OpSection combine(prof::Op::moe_combine);
    moe_combine_forward<T>(out, A.gates.data(), A.yk.data(), N, d, K);  // selected experts ascending
  }
  if (Fs > 0) {
    A.sug.assign(static_cast<size_t>(N * Fs), T(0));
    A.suu.assign(static_cast<size_t>(N * Fs), T(0));
    A.sh.assign(static_cast<size_t>(N * Fs), T(0));
    A.sy.assign(static_cast<size_t>(N * d), T(0));
    swiglu_forward<T>(pol, a, W.swg, W.swu, W.swd, N, d, Fs, A.sug.data(), A.suu.data(), A.sh.data(), A.sy.data());
    residual_forward<T>(out, out, A.sy.data(), N * d);
  }
}

template <class T>
void moe_backward(Policy pol, const Config& cfg, const MoeW<T>& W, const MoeG<T>& G, const T* a, int64_t N,
                  std::span<const int64_t> segs, const MoeActs<T>& A, const T* dout, T* da) {
  prof::OpSection prof_section(prof::Op::moe_dispatch);  // what its nested ops (router, experts, combine) leave
  const int64_t d = cfg.d_model, E = cfg.experts, K = cfg.top_k, Fs = cfg.shared_ffn, F = cfg.expert_ffn;
  std::vector<T> dgates(static_cast<size_t>(N * K), T(0)), dxk(static_cast<size_t>(N * K * d), T(0));
  for (int64_t e = 0; e < E; ++e) {
    const ExpertRows& R = A.rows[e];
    const ExpertActs<T>& X = A.ex[e];
    const int64_t n = static_cast<int64_t>(R.row.size());
    std::vector<T> dy(static_cast<size_t>(n * d)), dug(static_cast<size_t>(n * F)), duu(static_cast<size_t>(n * F));
    std::vector<T> dx(static_cast<size_t>(n * d));
    const std::vector<int64_t> tk = slots_of(R, K);
    {
      prof::OpSection combine(prof::Op::moe_combine);
      moe_combine_backward<T>(dout, A.gates.data(), A.yk.data(), tk.data(), n, d, K, dgates.data(), dy.data());
    }
    expert_backward_dgrad<T>(pol, cfg, W, e, n, X, dy.data(), dug.data(), duu.data(), dx.data());
    const auto dr = G.experts ? G.experts->direct(e) : typename ExpertGradBlocks<T>::Direct{};
    if (dr.wg) {  // expert e's gradients rounded where they are formed (same bits)
      swiglu_backward_wgrad_round<T>(pol, X.x.data(), X.h.data(), dy.data(), dug.data(), duu.data(), d, F, R.segs,
                                     dr.wg, dr.wu, dr.wd);
    } else if (G.experts) {  // expert e's accumulators only while its contributions arrive (same bits)
      const auto sl = G.experts->open(e);
      MoeG<T> Ge;
      Ge.wg = sl.wg;
      Ge.wu = sl.wu;
      Ge.wd = sl.wd;
      expert_backward_wgrad<T>(pol, cfg, Ge, 0, X, dy.data(), dug.data(), duu.data(), R.segs);
      G.experts->close();
    } else {
      expert_backward_wgrad<T>(pol, cfg, G, e, X, dy.data(), dug.data(), duu.data(), R.segs);
    }
    scatter_rows<T>(dxk.data(), dx.data(), tk, d);
  }
  {
    prof::OpSection combine(prof::Op::moe_combine);
    moe_dx_sum<T>(da, dxk.data(), N, d, K);
  }
  std::vector<T> tmp(static_cast<size_t>(N * d));
  if (Fs > 0) {
    std::vector<T> dug(static_cast<size_t>(N * Fs)), duu(static_cast<size_t>(N * Fs));
    swiglu_backward_dgrad<T>(pol, dout, W.swg, W.swu, W.swd, A.sug.data(), A.suu.data(), N, d, Fs, dug.data(),
                             duu.data(), tmp.data());
    if (G.sdwg)
      swiglu_backward_wgrad_round<T>(pol, a, A.sh.data(), dout, dug.data(), duu.data(), d, Fs, segs, G.sdwg, G.sdwu,
                                     G.sdwd);
    else
      swiglu_backward_wgrad<T>(pol, a, A.sh.data(), dout, dug.data(), duu.data(), d, Fs, segs, G.swg, G.swu, G.swd);
    residual_forward<T>(da, da, tmp.data(), N * d);
  }
  std::vector<T> dlogits(static_cast<size_t>(N * E));
  router_backward<T>(dgates.data(), A.scores.data(), A.sel.data(), N, E, K, cfg.routed_scale, dlogits.data());
  wgrad_acc<T>(pol, a, d, dlogits.data(), E, d, E, segs, G.router);
  mm<T>(pol, N, d, E, dlogits.data(), E, W.router, E, true, tmp.data(), d);
  residual_forward<T>(da, da, tmp.data(), N * d);
}

#define TD_MOE(T)                                                                                                  \
  template void expert_forward<T>(Policy, const Config&, const MoeW<T>&, int64_t, int64_t, ExpertActs<T>&);        \
  template void expert_backward_dgrad<T>(Policy, const Config&, const MoeW<T>&, int64_t, int64_t,                  \
                                         const ExpertActs<T>&, const T*, T*, T*, T*);                              \
  template void expert_backward_wgrad<T>(Policy, const Config&, const MoeG<T>&, int64_t, const ExpertActs<T>&,     \
                                         const T*, const T*, const T*, std::span<const int64_t>);                  \
  template void moe_forward<T>(Policy, const Config&, const MoeW<T>&, const T*, int64_t, std::span<const int64_t>, \
                               MoeActs<T>&, T*);                                                                   \
  template void moe_backward<T>(Policy, const Config&, const MoeW<T>&, const MoeG<T>&, const T*, int64_t,          \
                                std::span<const int64_t>, const MoeActs<T>&, const T*, T*);
TD_MOE(float)
TD_MOE(double)
#undef TD_MOE

}  // namespace trident::model
