#include "reference/model/train.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <type_traits>

#include "reference/check.h"
#include "reference/profile.h"
#include "reference/model/linear_ce.h"

namespace trident::model {

namespace {

// Packed sequences: cuts each sequence of b into k documents at k-1 distinct positions of [1, S) (a partial
// Fisher-Yates draw from the data seed, per step and sequence), so document lengths are random (length-1 documents
// included). Each document after the first restarts the chain at a hashed token; the last token of every document
// but the sequence's last has target -100 (no prediction crosses a document boundary).
void pack_documents(Batch& b, const std::vector<int32_t>& pi, uint64_t data_seed, int64_t step, int64_t k) {
  const int64_t V = static_cast<int64_t>(pi.size());
  const int64_t S = b.S;
  b.doc_start.assign(static_cast<size_t>(b.B * S), 0);
  std::vector<int64_t> cand(static_cast<size_t>(S - 1));
  for (int64_t s = 0; s < b.B; ++s) {
    const uint64_t stream = hash3(0xd0c5, 1 + static_cast<uint64_t>(step), static_cast<uint64_t>(s));
    std::iota(cand.begin(), cand.end(), int64_t{1});
    for (int64_t i = 0; i < k - 1; ++i) {
      const int64_t j = i + static_cast<int64_t>(hash3(data_seed, stream, static_cast<uint64_t>(i)) %
                                                 static_cast<uint64_t>(S - 1 - i));
      std::swap(cand[static_cast<size_t>(i)], cand[static_cast<size_t>(j)]);
    }
    std::vector<int64_t> cuts(cand.begin(), cand.begin() + (k - 1));
    std::sort(cuts.begin(), cuts.end());
    const size_t row0 = static_cast<size_t>(s * S);
    // Tokens: the chain t_{p+1} = pi(t_p), restarted at each cut.
    int64_t ds = 0;
    size_t ci = 0;
    for (int64_t p = 0; p < S; ++p) {
      if (ci < cuts.size() && cuts[ci] == p) {
        ds = p;
        ++ci;
        b.tokens[row0 + p] = static_cast<int32_t>(hash3(data_seed, stream ^ 0x5eed, static_cast<uint64_t>(ci)) %
                                                  static_cast<uint64_t>(V));
      } else if (p > 0) {
        b.tokens[row0 + p] = b.targets[row0 + p - 1];
      }
      b.doc_start[row0 + p] = ds;
      b.targets[row0 + p] = pi[static_cast<size_t>(b.tokens[row0 + p])];
      if (ci < cuts.size() && cuts[ci] == p + 1) b.targets[row0 + p] = kIgnoreIndex;
    }
  }
}

}  // namespace

Batch synthetic_batch(const Config& cfg, const RunConfig& run, int64_t step) {
  const int64_t V = cfg.vocab;
  std::vector<int32_t> pi(static_cast<size_t>(V));
  std::iota(pi.begin(), pi.end(), 0);
  for (int64_t i = V - 1; i > 0; --i) {  // Fisher-Yates with the counter-based hash
    const int64_t j = static_cast<int64_t>(hash3(run.data_seed, 0xfeed, static_cast<uint64_t>(i)) %
                                           static_cast<uint64_t>(i + 1));
    std::swap(pi[static_cast<size_t>(i)], pi[static_cast<size_t>(j)]);
  }
  Batch b;
  b.B = run.sequences;
  b.S = run.seq_len;
  b.tokens.resize(static_cast<size_t>(b.B * b.S));
  b.targets.resize(static_cast<size_t>(b.B * b.S));
  for (int64_t s = 0; s < b.B; ++s) {
    int32_t t = static_cast<int32_t>(hash3(run.data_seed, 1 + static_cast<uint64_t>(step), static_cast<uint64_t>(s)) %
                                     static_cast<uint64_t>(V));
    for (int64_t p = 0; p < b.S; ++p) {
      b.tokens[static_cast<size_t>(s * b.S + p)] = t;
      t = pi[static_cast<size_t>(t)];
      b.targets[static_cast<size_t>(s * b.S + p)] = t;
    }
  }
  if (run.docs_per_seq > 1) pack_documents(b, pi, run.data_seed, step, run.docs_per_seq);
  return b;
}

AdamWHyper adamw_hyper(const RunConfig& r) {
  AdamWHyper h;
  h.lr = r.lr;
  h.beta1 = r.beta1;
  h.beta2 = r.beta2;
  h.eps = r.eps;
  h.weight_decay = r.weight_decay;
  h.max_grad_norm = r.max_grad_norm;
  return h;
}

template <class T>
Trainer<T>::Trainer(const Config& c, const RunConfig& r) : cfg(c), run(r) {
  cfg.validate();
  run.validate();
  if (std::is_same_v<T, double> != (cfg.policy == Policy::fp64))
    fail(fmt::format("Trainer: policy {} needs {} parameters", to_string(cfg.policy),
                     cfg.policy == Policy::fp64 ? "double" : "float"));
  params = ParamSet<T>::init(cfg, cfg.seed);
  grads = ParamSet<T>::zeros(cfg);
  m = ParamSet<T>::zeros(cfg);
  v = ParamSet<T>::zeros(cfg);
  acc = GradAcc<T>::streaming(params.info);  // one layer's accumulators at a time (params.h)
}

template <class T>
StepStats Trainer<T>::step(const Batch& batch) {
  prof::OpSection prof_section(prof::Op::other);  // the step's time outside its ops' sections
  StepOptions opt;
  opt.token_chunk = run.token_chunk;
  opt.recompute = run.recompute;
  opt.progress = progress;
  acc.clear();
  acc.sink = &grads;
  const int64_t n = step_count + 1;  // the optimizer step this call takes (a resumed run continues its count)
  ForwardResult<T> fr;
  try {
    fr = model_forward_backward<T>(cfg, params, batch, opt, acc);
    acc.finalize(grads);
  } catch (const Error& e) {  // e.g. the router's NaN score: say at which step (and layer, when it says one)
    const std::string what = e.what();
    if (what.rfind("step ", 0) == 0) throw;
    fail(fmt::format("step {}{} {}", n, what.rfind("layer ", 0) == 0 ? "," : ":", what));
  }
  // Exact global grad norm over every trainable gradient (order-free), rounded once.
  ExactAcc<double> sq;
  for (size_t p = 0; p < params.size(); ++p)
    if (params.info[p].trainable) grad_sq_acc<T>(grads.t[p].ptr(), grads.t[p].size(), sq);
  const AdamWHyper h = adamw_hyper(run);
  StepStats st;
  st.loss = static_cast<double>(fr.loss);
  st.indexer_loss = static_cast<double>(fr.indexer_loss);
  st.n_valid = fr.n_valid;
  st.grad_norm = std::sqrt(sq.round());
  st.clip = clip_coef(sq, h.max_grad_norm);
  // A non-finite loss or gradient stops the run before the update (no NaN parameter is ever stored or saved),
  // naming the step and the first tensor that holds one.
  if (!std::isfinite(st.loss) || !std::isfinite(st.grad_norm)) {
    std::string where;
    for (size_t p = 0; p < grads.size() && where.empty(); ++p) {
      const T* g = grads.t[p].ptr();
      for (int64_t i = 0; i < static_cast<int64_t>(grads.t[p].size()); ++i)
        if (!std::isfinite(static_cast<double>(g[i]))) {
          where = fmt::format(": the gradient of {} is {} at element {}", params.info[p].name, g[i], i);
          break;
        }
    }
    fail(fmt::format("step {}: loss {} / grad norm {} is not finite{} (diverged: lower --lr?)", n, st.loss,
                     st.grad_norm, where));
  }
  if (progress) progress->set(StepProgress::Stage::optimizer);
  ++step_count;
  for (size_t p = 0; p < params.size(); ++p) {
    if (!params.info[p].trainable) continue;
    adamw_step<T>(params.t[p].ptr(), grads.t[p].ptr(), m.t[p].ptr(), v.t[p].ptr(), params.t[p].size(), h, step_count,
                  st.clip, params.info[p].is_matrix);
  }
  for (int64_t i = 0; i < cfg.layers; ++i) {
    if (!cfg.is_moe_layer(i)) continue;
    const auto& load = fr.load[static_cast<size_t>(i)];
    router_bias_update(params[fmt::format("layers.{}.moe.router_bias", i)].ptr(), load.data(), cfg.experts,
                       cfg.bias_rate);
  }
  // Finite gradients can still make the update overflow (a huge --lr): one pass over the parameters and moments
  // stops the run at the step that stored a non-finite value, naming it (read only: the bits are untouched).
  prof::OpSection check_section(prof::Op::finite_check);
  for (size_t p = 0; p < params.size(); ++p) {
    const std::pair<const ParamSet<T>*, const char*> sets[3] = {{&params, "params"}, {&m, "exp_avg"}, {&v, "exp_avg_sq"}};
    for (const auto& [set, group] : sets) {
      if (set != &params && !params.info[p].trainable) continue;
      const T* x = set->t[p].ptr();
      const int64_t ne = static_cast<int64_t>(set->t[p].size());
      for (int64_t i = 0; i < ne; ++i)
        if (!std::isfinite(static_cast<double>(x[i])))
          fail(fmt::format("step {}: the update made {} of {} {} at element {} (diverged: lower --lr?)", n, group,
                           params.info[p].name, x[i], i));
    }
  }
  if (progress) progress->set(StepProgress::Stage::idle);
  return st;
}

template <class T>
void Trainer<T>::restore(const TrainState<T>& s) {
  auto same = [&](const ParamSet<T>& a, const char* what) {
    TD_CHECK_EQ(a.size(), params.size(), "Trainer::restore: {} tensors", what);
    for (size_t p = 0; p < a.size(); ++p)
      TD_CHECK(a.info[p].name == params.info[p].name && a.t[p].shape == params.t[p].shape,
               "Trainer::restore: {} tensor {} is {} here", what, p, params.info[p].name);
  };
  same(s.params, "params");
  same(s.m, "m");
  same(s.v, "v");
  TD_CHECK(s.step >= 0, "Trainer::restore: step {} < 0", s.step);
  params = s.params;
  m = s.m;
  v = s.v;
  step_count = s.step;
}

template struct Trainer<float>;
template struct Trainer<double>;

}  // namespace trident::model
