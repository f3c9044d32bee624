// The whole step with the fast tier against the single-rank reference (`trident emulate --kernels cuda-fast-host
// --check-reference`, docs/gpu.md "cuda-fast"): not bitwise but under the tolerance table's step rows
// (reference/tolerances.h "step_grad"/"step_loss", direction "gpu"): per step, the loss's relative difference and
// every gradient tensor's norm-wise relative difference ||g_fast - g_ref|| / ||g_ref||.
#pragma once
#include <string>
#include <vector>

#include "emulator/run_step.h"

namespace trident::gpu::fast {

struct StepTensorCheck {
  int64_t step = 0;
  std::string what;  // "loss" or "grad"
  std::string name;
  double rel = 0;    // relative difference (norm-wise for a gradient)
  double bound = 0;
  bool ok() const { return rel <= bound; }
};
struct StepCheckReport {
  std::vector<StepTensorCheck> checks;
  double grad_bound = 0, loss_bound = 0;
  int64_t n_terms = 0;  // the step's longest reduction
  bool ok() const;
  std::string summary() const;  // one line
};

// The step rows' n_terms: the longest reduction of the step (vocabulary, model width, FFN widths, reduction tile,
// sequence length).
int64_t step_n_terms(const model::Config& cfg, const model::RunConfig& run);

template <class T>
StepCheckReport check_step_tolerance(const emu::EmulateSpec& spec, const emu::EmulateResult<T>& got,
                                     const model::TrainState<T>* resume = nullptr);

}  // namespace trident::gpu::fast
