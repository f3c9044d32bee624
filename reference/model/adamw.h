// AdamW (torch semantics), global-norm gradient clipping with an exact norm, and the aux-loss-free router
// bias update (docs/optimizer_and_loss.md, "Linear cross-entropy and optimizer", states every operation).
#pragma once
#include <cstdint>

#include <nlohmann/json.hpp>

#include "reference/exact_acc.h"

namespace trident::model {

struct AdamWHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, max_grad_norm = 1.0;
  nlohmann::json to_json() const;
  static AdamWHyper from_json(const nlohmann::json& j);  // missing keys keep their defaults; unknown keys throw
};

// acc += exact sum of g[i]^2 (i < n). float: (double)g * (double)g is exact (48-bit product). double: Dekker's
// two-product without FMA (Veltkamp split): g*g = hi + lo exactly, both added. Exact for 2^-480 <= |g| < 2^511
// (or g == 0); smaller |g| may lose bits of lo below 2^-1074 (error < 2^-1020 per term); |g| >= 2^511 adds +Inf.
template <class T>
void grad_sq_acc(const T* g, int64_t n, ExactAcc<double>& acc);

// Clip coefficient from the exact sum of squares: sq = acc rounded once to double, norm = sqrt(sq) (IEEE),
// coef = min(1, max_grad_norm / (norm + 1e-6)) in double. NaN norm -> NaN; +Inf norm -> 0.
// max_grad_norm <= 0 disables clipping (returns 1).
double clip_coef(const ExactAcc<double>& sq, double max_grad_norm);

// One AdamW step on n elements, in T (float: fp32 master weights for the fp32 and bf16 policies; double: fp64).
// step is 1-based. Scalars are formed in double and cast once to T (torch passes Python floats to fp32 kernels):
//   c = T(clip_coef), dec = T(1 - lr*wd), b1 = T(beta1), ob1 = T(1 - beta1), b2 = T(beta2), ob2 = T(1 - beta2),
//   bc1 = 1 - beta1^step, bc2 = 1 - beta2^step (powers by repeated multiplication in double),
//   ss = T(lr / bc1), bc2s = T(sqrt(bc2)), e = T(eps)
// then per element, in T, in this order:
//   gc = g * c;  if decay: w = w * dec;  m = b1*m + ob1*gc;  v = b2*v + (ob2*gc)*gc;
//   den = sqrt(v) / bc2s + e;  w = w - (ss * m) / den
template <class T>
void adamw_step(T* w, const T* g, T* m, T* v, int64_t n, const AdamWHyper& h, int64_t step, double clip_coef,
                bool decay);

// Aux-loss-free bias update from global loads (counts of routed (token, expert) pairs per expert):
// total = sum load; sign_e = +1 if load_e * E < total (below the mean), -1 if above, 0 if equal (exact integer
// comparison); b_e = b_e + T(gamma) * sign_e (computed as b + g, b - g or unchanged). gamma == 0: no change.
void router_bias_update(float* b, const int64_t* load, int64_t E, double gamma);
void router_bias_update(double* b, const int64_t* load, int64_t E, double gamma);

}  // namespace trident::model
