// The fast tier's step-level check (gpu/fast/step_check.h).
#include "gpu/fast/step_check.h"

#include <algorithm>
#include <cmath>

#include "reference/check.h"
#include "reference/model/train.h"
#include "reference/tolerances.h"

namespace trident::gpu::fast {

bool StepCheckReport::ok() const {
  return std::all_of(checks.begin(), checks.end(), [](const StepTensorCheck& c) { return c.ok(); });
}

std::string StepCheckReport::summary() const {
  double worst = 0;
  const StepTensorCheck* w = nullptr;
  for (const auto& c : checks)
    if (c.bound > 0 && c.rel / c.bound >= worst) worst = c.rel / c.bound, w = &c;
  std::string s = fmt::format("{} {} tensors within the step rows (loss bound {:.3g}, gradient bound {:.3g}, n_terms {})",
                              ok() ? "all" : "NOT all", checks.size(), loss_bound, grad_bound, n_terms);
  if (w)
    s += fmt::format("; largest relative difference / bound {:.3g} ({} {} step {}: {:.3g})", worst, w->what,
                     w->name.empty() ? "-" : w->name, w->step + 1, w->rel);
  return s;
}

int64_t step_n_terms(const model::Config& cfg, const model::RunConfig& run) {
  return std::max({cfg.vocab, cfg.d_model, cfg.dense_ffn, cfg.expert_ffn, cfg.shared_ffn, cfg.tile, run.seq_len});
}

template <class T>
StepCheckReport check_step_tolerance(const emu::EmulateSpec& spec, const emu::EmulateResult<T>& got,
                                     const model::TrainState<T>* resume) {
  TD_CHECK(spec.keep_tensors, "check_step_tolerance: the run must keep tensors");
  StepCheckReport rep;
  const std::string acc = sizeof(T) == 8 ? "fp64" : "fp32";
  rep.n_terms = step_n_terms(spec.cfg, spec.run);
  rep.grad_bound = tolerance_bound("step_grad", acc, "gpu", rep.n_terms, 1.0);
  rep.loss_bound = tolerance_bound("step_loss", acc, "gpu", rep.n_terms, 1.0);
  if (spec.cfg.policy == Policy::bf16) {
    rep.grad_bound += tolerance_bound("step_grad", "bf16", "gpu", 0, 1.0);
    rep.loss_bound += tolerance_bound("step_loss", "bf16", "gpu", 0, 1.0);
  }
  model::Trainer<T> tr(spec.cfg, spec.run);
  if (resume) tr.restore(*resume);
  else tr.params = emu::spec_init<T>(spec);
  const std::vector<model::Batch> batches = emu::spec_batches(spec);
  for (int64_t s = 0; s < spec.run.steps; ++s) {
    const model::StepStats st = tr.step(batches[static_cast<size_t>(s)]);
    const double gl = got.steps[static_cast<size_t>(s)].loss;
    rep.checks.push_back({s, "loss", "", std::fabs(gl - st.loss) / std::max(std::fabs(st.loss), 1e-30), rep.loss_bound});
    const model::ParamSet<T>& g = got.grads[static_cast<size_t>(s)];
    for (size_t i = 0; i < tr.params.size(); ++i) {
      if (!tr.params.info[i].trainable) continue;
      double nd = 0, nr = 0;
      const T* a = g.t[i].ptr();
      const T* b = tr.grads.t[i].ptr();
      for (int64_t k = 0; k < tr.grads.t[i].size(); ++k) {
        const double d = static_cast<double>(a[k]) - static_cast<double>(b[k]);
        nd += d * d, nr += static_cast<double>(b[k]) * static_cast<double>(b[k]);
      }
      const double rel = nr > 0 ? std::sqrt(nd / nr) : (nd > 0 ? INFINITY : 0.0);
      rep.checks.push_back({s, "grad", tr.params.info[i].name, std::isnan(rel) ? INFINITY : rel, rep.grad_bound});
    }
    // Later steps start from the fast run's own parameters: the reference takes the same parameters, so each step's
    // comparison measures that step's difference alone (not the drift of the earlier steps).
    tr.params = got.params[static_cast<size_t>(s)];
  }
  return rep;
}

template StepCheckReport check_step_tolerance<float>(const emu::EmulateSpec&, const emu::EmulateResult<float>&,
                                                     const model::TrainState<float>*);
template StepCheckReport check_step_tolerance<double>(const emu::EmulateSpec&, const emu::EmulateResult<double>&,
                                                      const model::TrainState<double>*);

}  // namespace trident::gpu::fast
