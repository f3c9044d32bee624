// Array helpers of reference/exact_acc.h.
#include "reference/exact_acc.h"

namespace trident {

// Short arrays take a plain loop: an OpenMP region with a false if-clause still sets up (allocates) a team.
template <class T>
void exact_merge(ExactAcc<T>* dst, const ExactAcc<T>* src, int64_t n) {
  if (n < 4096) {
    for (int64_t i = 0; i < n; ++i) dst[i].merge(src[i]);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i].merge(src[i]);
}

template <class T>
void exact_round(const ExactAcc<T>* acc, T* out, int64_t n) {
  if (n < 4096) {
    for (int64_t i = 0; i < n; ++i) out[i] = acc[i].round();
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = acc[i].round();
}

template <class T>
void exact_round_clear(ExactAcc<T>* acc, T* out, int64_t n) {
  auto one = [&](int64_t i) {
    out[i] = acc[i].round();
    acc[i] = ExactAcc<T>();
  };
  if (n < 4096) {
    for (int64_t i = 0; i < n; ++i) one(i);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) one(i);
}

template void exact_round_clear<float>(ExactAcc<float>*, float*, int64_t);
template void exact_round_clear<double>(ExactAcc<double>*, double*, int64_t);
template void exact_merge<float>(ExactAcc<float>*, const ExactAcc<float>*, int64_t);
template void exact_merge<double>(ExactAcc<double>*, const ExactAcc<double>*, int64_t);
template void exact_round<float>(const ExactAcc<float>*, float*, int64_t);
template void exact_round<double>(const ExactAcc<double>*, double*, int64_t);

}  // namespace trident
