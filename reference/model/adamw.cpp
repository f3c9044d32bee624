// AdamW, exact gradient norm, clip coefficient, router bias update (reference/model/adamw.h).
#include "reference/model/adamw.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <cmath>  // std::sqrt (correctly rounded), std::isnan, std::isfinite
#include <limits>
#include <type_traits>

#include "reference/check.h"
#include "reference/profile.h"

namespace trident::model {

nlohmann::json AdamWHyper::to_json() const {
  return {{"name", "adamw"},   {"lr", lr},
          {"beta1", beta1},    {"beta2", beta2},
          {"eps", eps},        {"weight_decay", weight_decay},
          {"max_grad_norm", max_grad_norm}};
}

AdamWHyper AdamWHyper::from_json(const nlohmann::json& j) {
  TD_CHECK(j.is_object(), "AdamW hyper-parameters must be a JSON object");
  AdamWHyper h;
  for (const auto& [k, val] : j.items()) {
    if (k == "name") {
      TD_CHECK(val == "adamw", "optimizer name must be 'adamw', got {}", val.dump());
      continue;
    }
    double* dst = k == "lr" ? &h.lr
                  : k == "beta1" ? &h.beta1
                  : k == "beta2" ? &h.beta2
                  : k == "eps" ? &h.eps
                  : k == "weight_decay" ? &h.weight_decay
                  : k == "max_grad_norm" ? &h.max_grad_norm
                                         : nullptr;
    if (!dst) fail(fmt::format("unknown AdamW hyper-parameter '{}'", k));
    if (!val.is_number()) fail(fmt::format("AdamW hyper-parameter '{}' must be a number, got {}", k, val.dump()));
    *dst = val.get<double>();
  }
  return h;
}

#ifndef TRIDENT_PLAIN_ACC
namespace {

// Sum of squares of floats, exactly, by exponent buckets: x = M * 2^(q - 150) with M < 2^24 its significand (the
// implicit bit included) and q = max(E, 1) from its biased exponent E, so x^2 = M^2 * 2^(2q - 300) with M^2 < 2^48.
// The M^2 of one q add up as integers in bucket q (four interleaved bucket sets, so neighbouring elements do not wait
// on each other); after at most 2^15 elements (a bucket stays below 2^63) every bucket goes into acc as two doubles
// (its high and low 32 bits, times 2^(2q - 300): exact, in [2^-298, 2^271]). The value added is the exact sum of the
// squares, as adding each square (a double, exact) would give: the same rounding. Inf and NaN add their square
// (+Inf or NaN) to acc directly.
void float_sq_acc(const float* g, int64_t n, ExactAcc<double>& acc) {
  constexpr int64_t kChunk = int64_t{1} << 15;
  uint64_t b[4][256];
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int64_t c1 = std::min(n, c0 + kChunk);
    std::memset(b, 0, sizeof(b));
    for (int64_t i = c0; i < c1; ++i) {
      const uint32_t u = std::bit_cast<uint32_t>(g[i]);
      const uint32_t e = (u >> 23) & 0xffu;
      const uint64_t m = (u & 0x7fffffu) | (e != 0 ? 0x800000u : 0u);
      b[i & 3][e] += m * m;  // e == 255: Inf or NaN (m >= 2^23, so its bucket is then nonzero), taken below
    }
    if (b[0][255] | b[1][255] | b[2][255] | b[3][255])  // only a chunk with an Inf or NaN is read again
      for (int64_t i = c0; i < c1; ++i)
        if (((std::bit_cast<uint32_t>(g[i]) >> 23) & 0xffu) == 0xffu) {
          const double x = g[i];
          acc.add(x * x);
        }
    for (int q = 0; q < 255; ++q) {
      const uint64_t v = b[0][q] + b[1][q] + b[2][q] + b[3][q];  // each < 2^61
      if (v == 0) continue;
      const int sc = 2 * std::max(q, 1) - 300;
      acc.add(std::ldexp(static_cast<double>(v >> 32 << 32), sc));
      acc.add(std::ldexp(static_cast<double>(v & 0xffffffffu), sc));
    }
  }
}

}  // namespace
#endif

template <class T>
void grad_sq_acc(const T* g, int64_t n, ExactAcc<double>& acc) {
  prof::OpSection prof_section(prof::Op::grad_norm);
  if constexpr (std::is_same_v<T, float>) {
#ifndef TRIDENT_PLAIN_ACC
    float_sq_acc(g, n, acc);
#else  // the plain-sum benchmark twin (reference/plain_acc_impl.h) adds each square
    for (int64_t i = 0; i < n; ++i) {
      const double x = g[i];
      acc.add(x * x);
    }
#endif
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const double a = g[i];
      const double p = a * a;
      if (!std::isfinite(p)) {  // |a| >= 2^512 (or Inf/NaN): the square is +Inf or NaN anyway
        acc.add(p);
        continue;
      }
      // Veltkamp split a = hi + lo (26 + 26 significant bits), then Dekker's two-square: a*a - p exactly,
      // without FMA (every product below is exact, and so is each sum, barring underflow).
      const double c = 134217729.0 * a;  // 2^27 + 1
      const double hi = c - (c - a);
      const double lo = a - hi;
      const double err = ((hi * hi - p) + 2.0 * hi * lo) + lo * lo;
      acc.add(p);
      acc.add(err);
    }
  }
}
template void grad_sq_acc<float>(const float*, int64_t, ExactAcc<double>&);
template void grad_sq_acc<double>(const double*, int64_t, ExactAcc<double>&);

double clip_coef(const ExactAcc<double>& sq, double max_grad_norm) {
  prof::OpSection prof_section(prof::Op::grad_norm);
  if (!(max_grad_norm > 0)) return 1.0;
  const double s = sq.round();
  const double norm = std::sqrt(s);
  if (std::isnan(norm)) return std::numeric_limits<double>::quiet_NaN();
  const double c = max_grad_norm / (norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

template <class T>
void adamw_step(T* w, const T* g, T* m, T* v, int64_t n, const AdamWHyper& h, int64_t step, double clip,
                bool decay) {
  prof::OpSection prof_section(prof::Op::adamw);
  TD_CHECK_GE(step, int64_t(1), "adamw_step: step is 1-based");
  double p1 = 1.0, p2 = 1.0;
  for (int64_t s = 0; s < step; ++s) {  // beta^step by repeated multiplication (no libm pow)
    p1 = p1 * h.beta1;
    p2 = p2 * h.beta2;
  }
  const double bc1 = 1.0 - p1, bc2 = 1.0 - p2;
  const T c = static_cast<T>(clip);
  const T dec = static_cast<T>(1.0 - h.lr * h.weight_decay);
  const T b1 = static_cast<T>(h.beta1), ob1 = static_cast<T>(1.0 - h.beta1);
  const T b2 = static_cast<T>(h.beta2), ob2 = static_cast<T>(1.0 - h.beta2);
  const T ss = static_cast<T>(h.lr / bc1);
  const T bc2s = static_cast<T>(std::sqrt(bc2));
  const T e = static_cast<T>(h.eps);
#pragma omp parallel for schedule(static) if (n >= 65536)
  for (int64_t i = 0; i < n; ++i) {
    const T gc = g[i] * c;
    T wi = w[i];
    if (decay) wi = wi * dec;
    const T mi = b1 * m[i] + ob1 * gc;
    const T vi = b2 * v[i] + (ob2 * gc) * gc;
    const T den = std::sqrt(vi) / bc2s + e;
    wi = wi - (ss * mi) / den;
    w[i] = wi;
    m[i] = mi;
    v[i] = vi;
  }
}

namespace {
template <class T>
void bias_update(T* b, const int64_t* load, int64_t E, double gamma) {
  prof::OpSection prof_section(prof::Op::adamw);
  TD_CHECK_GT(E, int64_t(0), "router_bias_update: E");
  if (gamma == 0) return;
  int64_t total = 0;
  for (int64_t e = 0; e < E; ++e) {
    TD_CHECK_GE(load[e], int64_t(0), "router_bias_update: load of expert {}", e);
    total += load[e];
  }
  const T step = static_cast<T>(gamma);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t scaled = load[e] * E;  // compare load_e with total/E exactly
    if (scaled < total) b[e] = b[e] + step;
    else if (scaled > total) b[e] = b[e] - step;
  }
}
}  // namespace

void router_bias_update(float* b, const int64_t* load, int64_t E, double gamma) { bias_update(b, load, E, gamma); }
void router_bias_update(double* b, const int64_t* load, int64_t E, double gamma) { bias_update(b, load, E, gamma); }

template void adamw_step<float>(float*, const float*, float*, float*, int64_t, const AdamWHyper&, int64_t, double,
                                bool);
template void adamw_step<double>(double*, const double*, double*, double*, int64_t, const AdamWHyper&, int64_t,
                                 double, bool);

}  // namespace trident::model
