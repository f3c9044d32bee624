#include "reference/model/model.h"

#include <optional>
#include <type_traits>

#include "reference/check.h"
#include "reference/profile.h"
#include "reference/model/linear_ce.h"
#include "reference/model/rows.h"

namespace trident::model {

namespace {
std::string lname(int64_t i, const char* suffix) { return fmt::format("layers.{}.{}", i, suffix); }
}  // namespace

template <class T>
LayerW<T> layer_weights(const Config& cfg, const ParamSet<T>& p, int64_t i) {
  LayerW<T> w;
  auto P = [&](const char* s) { return p[lname(i, s)].ptr(); };
  w.moe = cfg.is_moe_layer(i);
  w.attn_norm = P("attn_norm");
  w.ffn_norm = P("ffn_norm");
  attn_view(cfg, i, [&](const std::string& n) { return p[n].ptr(); }, w.attn);
  if (!w.moe) {
    w.mlp_wg = P("mlp.wg");
    w.mlp_wu = P("mlp.wu");
    w.mlp_wd = P("mlp.wd");
  } else {
    w.moe_w.router = P("moe.router");
    w.moe_w.bias = P("moe.router_bias");
    w.moe_w.wg = P("moe.experts.wg");
    w.moe_w.wu = P("moe.experts.wu");
    w.moe_w.wd = P("moe.experts.wd");
    if (cfg.shared_ffn > 0) {
      w.moe_w.swg = P("moe.shared.wg");
      w.moe_w.swu = P("moe.shared.wu");
      w.moe_w.swd = P("moe.shared.wd");
    }
  }
  return w;
}

template <class T>
LayerG<T> layer_grads(const Config& cfg, const ParamSet<T>& p, GradAcc<T>& g, int64_t i) {
  LayerG<T> w;
  auto P = [&](const char* s) { return g.ptr(p.find(lname(i, s))); };
  w.attn_norm = P("attn_norm");
  w.ffn_norm = P("ffn_norm");
  attn_view(cfg, i, [&](const std::string& n) { return g.ptr(p.find(n)); }, w.attn);
  // Streaming accumulators hand out the routed experts one expert at a time (MoeG::experts) and leave out what the
  // backward rounds where it forms it (the FFN weights: run's backward); full ones give every pointer.
  auto O = [&](const char* s) { return g.is_open(p.find(lname(i, s))) ? P(s) : nullptr; };
  if (!cfg.is_moe_layer(i)) {
    w.mlp_wg = O("mlp.wg");
    w.mlp_wu = O("mlp.wu");
    w.mlp_wd = O("mlp.wd");
  } else {
    w.moe_g.router = P("moe.router");
    w.moe_g.wg = O("moe.experts.wg");
    w.moe_g.wu = O("moe.experts.wu");
    w.moe_g.wd = O("moe.experts.wd");
    if (cfg.shared_ffn > 0) {
      w.moe_g.swg = O("moe.shared.wg");
      w.moe_g.swu = O("moe.shared.wu");
      w.moe_g.swd = O("moe.shared.wd");
    }
  }
  return w;
}

template <class T>
void layer_forward(Policy pol, const Config& cfg, const LayerW<T>& W, const T* x, const TokenRows& rows,
                   const RopeTable<T>& rope, LayerActs<T>& A, T* out) {
  const int64_t N = rows.n, d = cfg.d_model;
  A.a1.assign(static_cast<size_t>(N * d), T(0));
  A.rinv1.assign(static_cast<size_t>(N), T(0));
  rmsnorm_forward<T>(x, d, W.attn_norm, N, d, cfg.norm_eps, A.a1.data(), d, A.rinv1.data());
  std::vector<T> y(static_cast<size_t>(N * d));
  attention_forward<T>(pol, cfg, W.attn, A.a1.data(), rows, rope, A.attn, y.data());
  A.h.assign(static_cast<size_t>(N * d), T(0));
  residual_forward<T>(A.h.data(), x, y.data(), N * d);
  A.a2.assign(static_cast<size_t>(N * d), T(0));
  A.rinv2.assign(static_cast<size_t>(N), T(0));
  rmsnorm_forward<T>(A.h.data(), d, W.ffn_norm, N, d, cfg.norm_eps, A.a2.data(), d, A.rinv2.data());
  if (!W.moe) {
    const int64_t F = cfg.dense_ffn;
    A.ug.assign(static_cast<size_t>(N * F), T(0));
    A.uu.assign(static_cast<size_t>(N * F), T(0));
    A.hh.assign(static_cast<size_t>(N * F), T(0));
    swiglu_forward<T>(pol, A.a2.data(), W.mlp_wg, W.mlp_wu, W.mlp_wd, N, d, F, A.ug.data(), A.uu.data(), A.hh.data(),
                      y.data());
  } else {
    moe_forward<T>(pol, cfg, W.moe_w, A.a2.data(), N, rows.segs, A.moe, y.data());
  }
  residual_forward<T>(out, A.h.data(), y.data(), N * d);
}

template <class T>
void layer_backward(Policy pol, const Config& cfg, const LayerW<T>& W, const LayerG<T>& G, const T* x,
                    const TokenRows& rows, const RopeTable<T>& rope, const LayerActs<T>& A, const T* dout, T* dx) {
  const int64_t N = rows.n, d = cfg.d_model;
  std::vector<T> da(static_cast<size_t>(N * d)), dn(static_cast<size_t>(N * d)), dh(static_cast<size_t>(N * d));
  if (!W.moe) {
    const int64_t F = cfg.dense_ffn;
    std::vector<T> dug(static_cast<size_t>(N * F)), duu(static_cast<size_t>(N * F));
    swiglu_backward_dgrad<T>(pol, dout, W.mlp_wg, W.mlp_wu, W.mlp_wd, A.ug.data(), A.uu.data(), N, d, F, dug.data(),
                             duu.data(), da.data());
    if (G.mlp_dwg)
      swiglu_backward_wgrad_round<T>(pol, A.a2.data(), A.hh.data(), dout, dug.data(), duu.data(), d, F, rows.segs,
                                     G.mlp_dwg, G.mlp_dwu, G.mlp_dwd);
    else
      swiglu_backward_wgrad<T>(pol, A.a2.data(), A.hh.data(), dout, dug.data(), duu.data(), d, F, rows.segs, G.mlp_wg,
                               G.mlp_wu, G.mlp_wd);
  } else {
    moe_backward<T>(pol, cfg, W.moe_w, G.moe_g, A.a2.data(), N, rows.segs, A.moe, dout, da.data());
  }
  rmsnorm_backward<T>(da.data(), d, A.h.data(), d, A.rinv2.data(), W.ffn_norm, N, d, rows.segs, dn.data(), d,
                      G.ffn_norm);
  residual_forward<T>(dh.data(), dout, dn.data(), N * d);
  attention_backward<T>(pol, cfg, W.attn, G.attn, A.a1.data(), rows, rope, A.attn, dh.data(), da.data());
  rmsnorm_backward<T>(da.data(), d, x, d, A.rinv1.data(), W.attn_norm, N, d, rows.segs, dn.data(), d, G.attn_norm);
  residual_forward<T>(dx, dh.data(), dn.data(), N * d);
}

void validate_batch(const Config& cfg, const Batch& b) {
  if (b.B <= 0 || b.S <= 0) fail(fmt::format("batch: sequences and seq_len must be > 0 (got {} x {})", b.B, b.S));
  const size_t n = static_cast<size_t>(b.B * b.S);
  if (b.tokens.size() != n || b.targets.size() != n)
    fail(fmt::format("batch: tokens/targets must hold {} x {} = {} values (got {} and {})", b.B, b.S, n,
                     b.tokens.size(), b.targets.size()));
  for (size_t i = 0; i < n; ++i) {
    if (b.tokens[i] < 0 || b.tokens[i] >= cfg.vocab)
      fail(fmt::format("batch: token id {} at (sequence {}, position {}) is out of range [0, {})", b.tokens[i],
                       static_cast<int64_t>(i) / b.S, static_cast<int64_t>(i) % b.S, cfg.vocab));
    if (b.targets[i] != kIgnoreIndex && (b.targets[i] < 0 || b.targets[i] >= cfg.vocab))
      fail(fmt::format("batch: target {} at (sequence {}, position {}) is out of range [0, {}) and not -100",
                       b.targets[i], static_cast<int64_t>(i) / b.S, static_cast<int64_t>(i) % b.S, cfg.vocab));
  }
  if (b.doc_start.empty()) return;
  if (b.doc_start.size() != n)
    fail(fmt::format("batch: doc_start must hold {} x {} = {} values or none (got {})", b.B, b.S, n,
                     b.doc_start.size()));
  for (size_t i = 0; i < n; ++i) {
    const int64_t p = static_cast<int64_t>(i) % b.S, ds = b.doc_start[i];
    if (ds != p && (p == 0 || ds != b.doc_start[i - 1]))
      fail(fmt::format("batch: doc_start {} at (sequence {}, position {}) is neither the position itself nor the "
                       "previous token's document start (documents are runs of consecutive positions)",
                       ds, static_cast<int64_t>(i) / b.S, p));
  }
}

namespace {

template <class T>
void check_policy(const Config& cfg) {
  const bool dbl = std::is_same_v<T, double>;
  if (dbl != (cfg.policy == Policy::fp64))
    fail(fmt::format("model: policy {} needs {} parameters", to_string(cfg.policy),
                     cfg.policy == Policy::fp64 ? "double" : "float"));
}

// Expert e's slices of layer i's wg, wu, wd as one streaming block (MoeG::experts).
template <class T>
class ExpertSlicesOf final : public ExpertGradBlocks<T> {
 public:
  ExpertSlicesOf(GradAcc<T>& g, const ParamSet<T>& p, const Config& cfg, int64_t i)
      : g_(g), wg_(p.find(lname(i, "moe.experts.wg"))), wu_(p.find(lname(i, "moe.experts.wu"))),
        wd_(p.find(lname(i, "moe.experts.wd"))), n_(cfg.d_model * cfg.expert_ffn) {}
  typename ExpertGradBlocks<T>::Slices open(int64_t e) override {
    g_.open_slices({{wg_, e * n_, n_}, {wu_, e * n_, n_}, {wd_, e * n_, n_}});
    return {g_.ptr(wg_), g_.ptr(wu_), g_.ptr(wd_)};
  }
  void close() override { g_.close(); }
  typename ExpertGradBlocks<T>::Direct direct(int64_t e) override {
    const std::vector<T*> d = g_.direct({{wg_, e * n_, n_}, {wu_, e * n_, n_}, {wd_, e * n_, n_}});
    if (d.size() != 3) return {};
    return {d[0], d[1], d[2]};
  }

 private:
  GradAcc<T>& g_;
  size_t wg_, wu_, wd_;
  int64_t n_;  // elements of one expert's slice of each tensor (d * Fe = Fe * d)
};

// The shared driver. grads == nullptr: forward only.
template <class T>
ForwardResult<T> run(const Config& cfg, const ParamSet<T>& params, const Batch& batch, const StepOptions& opt,
                     GradAcc<T>* grads) {
  prof::OpSection prof_section(prof::Op::other);  // the time outside the ops' sections
  check_policy<T>(cfg);
  validate_batch(cfg, batch);
  const Policy pol = cfg.policy;
  TokenRows rows = TokenRows::contiguous(batch.B, batch.S, cfg.tile);
  rows.doc = batch.doc_start;  // contiguous rows are in (sequence, position) order, as doc_start
  const int64_t N = rows.n, d = cfg.d_model, L = cfg.layers, V = cfg.vocab;
  const RopeTable<T> rope = rope_table<T>(batch.S, cfg.rope_width(), cfg.rope_theta);
  const bool store = grads != nullptr && !opt.recompute;

  std::vector<std::vector<T>> xs(static_cast<size_t>(L + 1), std::vector<T>(static_cast<size_t>(N * d)));
  std::vector<LayerActs<T>> acts(static_cast<size_t>(store ? L : 1));
  std::vector<LayerW<T>> W;
  for (int64_t i = 0; i < L; ++i) W.push_back(layer_weights<T>(cfg, params, i));

  ForwardResult<T> res;
  res.load.resize(static_cast<size_t>(L));
  res.sel.resize(static_cast<size_t>(L));
  embedding_forward<T>(xs[0].data(), batch.tokens.data(), params["embed"].ptr(), N, d, V);
  ExactAcc<T> ikl_sum;
  if (cfg.dsa()) res.dsa_sel.resize(static_cast<size_t>(L));
  auto at = [&](StepProgress::Stage s, int64_t i = -1) {
    if (opt.progress) opt.progress->set(s, i, L);
  };
  for (int64_t i = 0; i < L; ++i) {
    at(StepProgress::Stage::forward, i);
    LayerActs<T>& A = acts[static_cast<size_t>(store ? i : 0)];
    A.attn.keep_sel = false;
    in_layer(i, [&] { layer_forward<T>(pol, cfg, W[i], xs[i].data(), rows, rope, A, xs[i + 1].data()); });
    if (W[i].moe) {
      res.load[i] = A.moe.load;
      res.sel[i] = A.moe.sel;
    }
    if (cfg.dsa()) {  // the selection is saved: full recompute reuses it
      res.dsa_sel[static_cast<size_t>(i)] = A.attn.sel;
      sum_acc<T>(A.attn.ikl.data(), 1, rows.segs, &ikl_sum);
    }
  }
  res.indexer_loss = ikl_sum.round() / static_cast<T>(N);
  at(StepProgress::Stage::head);
  std::vector<T> hidden(static_cast<size_t>(N * d)), rinvf(static_cast<size_t>(N));
  const T* gf = params["final_norm"].ptr();
  rmsnorm_forward<T>(xs[L].data(), d, gf, N, d, cfg.norm_eps, hidden.data(), d, rinvf.data());
  res.token_loss.assign(static_cast<size_t>(N), T(0));
  std::vector<T> lse(static_cast<size_t>(N));
  const T* head = params["lm_head"].ptr();
  linear_ce_forward<T>(hidden.data(), head, batch.targets.data(), N, d, V, cfg.vocab_chunk, pol, opt.token_chunk,
                       res.token_loss.data(), lse.data());
  res.n_valid = count_valid_targets(batch.targets.data(), N);
  sum_acc<T>(res.token_loss.data(), 1, rows.segs, &res.loss_sum);
  // Loss: the exact sum of token losses rounded once, divided by the valid count. An all-ignored batch has a
  // defined result: loss 0 and zero gradients (grad_scale 0), never 0/0.
  res.loss = res.n_valid > 0 ? res.loss_sum.round() / static_cast<T>(res.n_valid) : T(0);
  if (opt.keep_hidden) res.hidden = hidden;
  if (!grads) return res;

  // ---- backward ----
  GradAcc<T>& g = *grads;
  // Blocks of parameters whose contributions all arrive together (grad_block, params.h; streaming accumulators
  // open and close them, full accumulators ignore it).
  using BK = GradBlock::Kind;
  std::vector<GradBlock> blocks;
  for (const ParamInfo& x : params.info) blocks.push_back(grad_block(x.name));
  auto block = [&](BK kind, int64_t i) {
    std::vector<size_t> ps;
    for (size_t p = 0; p < params.size(); ++p)
      if (blocks[p].kind == kind && blocks[p].layer == i) ps.push_back(p);
    return ps;
  };
  const T scale = res.n_valid > 0 ? T(1) / static_cast<T>(res.n_valid) : T(0);
  std::vector<T> dhidden(static_cast<size_t>(N * d)), dx(static_cast<size_t>(N * d)), dprev(static_cast<size_t>(N * d));
  // Opens the block of `kind` without parameter p where p's whole gradient is one call's and streaming accumulators
  // hand out its place in the gradients (GradAcc::direct; returned, else null and p stays in the block).
  auto open_direct = [&](BK kind, size_t p) -> T* {
    const std::vector<T*> dst = g.direct({{p, 0, params.t[p].size()}});
    std::vector<size_t> ps = block(kind, -1);
    if (!dst.empty()) std::erase(ps, p);
    g.open(ps);
    return dst.empty() ? nullptr : dst[0];
  };
  // The head's gradient rounded as it forms (linear_ce_backward_cols_round: the same bits, without the (d, V)
  // accumulators); the rest of the head block (the final norm) accumulates.
  const size_t p_head = params.find("lm_head");
  T* const head_direct = open_direct(BK::head, p_head);
  if (!head_direct)
    linear_ce_backward<T>(hidden.data(), head, batch.targets.data(), lse.data(), N, d, V, cfg.vocab_chunk, pol,
                          opt.token_chunk, scale, rows.segs, dhidden.data(), g.ptr(p_head));
  else
    linear_ce_backward_cols_round<T>(hidden.data(), head, batch.targets.data(), lse.data(), N, d, V, cfg.vocab_chunk,
                                     pol, opt.token_chunk, scale, rows.segs, 0, V, dhidden.data(), head_direct);
  rmsnorm_backward<T>(dhidden.data(), d, xs[L].data(), d, rinvf.data(), gf, N, d, rows.segs, dx.data(), d,
                      g.ptr(params.find("final_norm")));
  g.close();
  for (int64_t i = L - 1; i >= 0; --i) {
    at(StepProgress::Stage::backward, i);
    LayerActs<T>& A = acts[static_cast<size_t>(store ? i : 0)];
    if (!store) {  // full recompute: re-run the layer forward from its saved input (and DSA selection)
      std::vector<T> out(static_cast<size_t>(N * d));
      if (cfg.dsa()) {
        A.attn.sel = res.dsa_sel[static_cast<size_t>(i)];
        A.attn.keep_sel = true;
      }
      in_layer(i, [&] { layer_forward<T>(pol, cfg, W[i], xs[i].data(), rows, rope, A, out.data()); });
    }
    // Streaming: the layer's block without its routed experts, whose slices open one expert at a time inside it.
    const bool split = cfg.is_moe_layer(i) && g.is_streaming();
    std::vector<size_t> ps = block(BK::layer, i);
    if (!split) {
      const std::vector<size_t> e = block(BK::experts, i);
      ps.insert(ps.end(), e.begin(), e.end());
    }
    // Streaming, the dense MLP's and the shared expert's weights get their whole gradient from one wgrad each: rounded
    // where they are formed (GradAcc::direct), out of the block.
    const bool moe = cfg.is_moe_layer(i), ffn = !moe || cfg.shared_ffn > 0;
    std::vector<T*> ffn_direct;
    if (ffn) {
      std::vector<typename GradAcc<T>::Slice> sl;
      for (const char* w : {"wg", "wu", "wd"}) {
        const size_t p = params.find(lname(i, ((moe ? "moe.shared." : "mlp.") + std::string(w)).c_str()));
        sl.push_back({p, 0, params.t[p].size()});
      }
      ffn_direct = g.direct(sl);
      if (!ffn_direct.empty())
        for (const auto& x : sl) std::erase(ps, x.p);
    }
    g.open(ps);
    LayerG<T> G = layer_grads<T>(cfg, params, g, i);
    if (!ffn_direct.empty()) {
      (moe ? G.moe_g.sdwg : G.mlp_dwg) = ffn_direct[0];
      (moe ? G.moe_g.sdwu : G.mlp_dwu) = ffn_direct[1];
      (moe ? G.moe_g.sdwd : G.mlp_dwd) = ffn_direct[2];
    }
    std::optional<ExpertSlicesOf<T>> experts;
    if (split) G.moe_g.experts = &experts.emplace(g, params, cfg, i);
    layer_backward<T>(pol, cfg, W[i], G, xs[i].data(), rows, rope, A, dx.data(), dprev.data());
    g.close();
    std::swap(dx, dprev);
  }
  at(StepProgress::Stage::embedding);
  // The embedding's gradient rounded row by row (embedding_backward_round).
  const size_t p_embed = params.find("embed");
  T* const embed_direct = open_direct(BK::embed, p_embed);
  if (!embed_direct)
    embedding_backward<T>(g.ptr(p_embed), batch.tokens.data(), dx.data(), N, d, rows.segs);
  else
    embedding_backward_round<T>(embed_direct, batch.tokens.data(), dx.data(), N, d, V, rows.segs);
  g.close();
  return res;
}

}  // namespace

template <class T>
ForwardResult<T> model_forward(const Config& cfg, const ParamSet<T>& params, const Batch& batch,
                               const StepOptions& opt) {
  return run<T>(cfg, params, batch, opt, nullptr);
}

template <class T>
ForwardResult<T> model_forward_backward(const Config& cfg, const ParamSet<T>& params, const Batch& batch,
                                        const StepOptions& opt, GradAcc<T>& grads) {
  TD_CHECK_EQ(grads.acc.size(), params.size(), "model_forward_backward: GradAcc layout does not match the params");
  return run<T>(cfg, params, batch, opt, &grads);
}

#define TD_MODEL(T)                                                                                                \
  template LayerW<T> layer_weights<T>(const Config&, const ParamSet<T>&, int64_t);                                 \
  template LayerG<T> layer_grads<T>(const Config&, const ParamSet<T>&, GradAcc<T>&, int64_t);                      \
  template void layer_forward<T>(Policy, const Config&, const LayerW<T>&, const T*, const TokenRows&,              \
                                 const RopeTable<T>&, LayerActs<T>&, T*);                                          \
  template void layer_backward<T>(Policy, const Config&, const LayerW<T>&, const LayerG<T>&, const T*,             \
                                  const TokenRows&, const RopeTable<T>&, const LayerActs<T>&, const T*, T*);       \
  template ForwardResult<T> model_forward<T>(const Config&, const ParamSet<T>&, const Batch&, const StepOptions&); \
  template ForwardResult<T> model_forward_backward<T>(const Config&, const ParamSet<T>&, const Batch&,             \
                                                      const StepOptions&, GradAcc<T>&);
TD_MODEL(float)
TD_MODEL(double)
#undef TD_MODEL

}  // namespace trident::model
