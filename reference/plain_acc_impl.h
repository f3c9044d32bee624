// BENCHMARK ONLY: the plain-sum stand-in for ExactAcc<T>, compiled instead of reference/exact_acc_impl.h's
// superaccumulator when TRIDENT_PLAIN_ACC is defined. Nothing in the product defines it: CMake builds it only
// into the benchmark twins of the libraries (the *_plain targets) that bench_step_plain links, to measure what
// the exact reductions of the numerics contract cost against the obvious alternative.
//
// Same interface as the exact accumulator, so every kernel, the step and the emulator's exact_sum compile
// unchanged: add() and merge() are plain T additions in call order (tile partials, then ranks in rank order),
// round() returns the running sum, and the object (the wire format) is one T: 4 / 8 bytes per element instead
// of 56 / 552. Results depend on the summation order: this breaks the bit-identity contract by design.
#pragma once
#include <cstddef>
#include <cstdint>

namespace trident {

template <class T>
class PlainAcc {
 public:
  static constexpr size_t kBytes = sizeof(T);
  PlainAcc() = default;
  inline void add(T x) { v_ = v_ + x; }
  inline void add_unchecked(T x) { v_ = v_ + x; }
  void reserve_adds(uint32_t) {}
  void merge(const PlainAcc& o) { v_ = v_ + o.v_; }
  T round() const { return v_; }
  bool is_zero() const { return v_ == T(0); }

 private:
  T v_ = T(0);
};

template <>
class ExactAcc<float> : public PlainAcc<float> {
 public:
  void merge(const ExactAcc& o) { PlainAcc::merge(o); }
};

template <>
class ExactAcc<double> : public PlainAcc<double> {
 public:
  using PlainAcc::add;
  inline void add(float x) { add(static_cast<double>(x)); }
  void merge(const ExactAcc& o) { PlainAcc::merge(o); }
};

static_assert(sizeof(ExactAcc<float>) == 4 && sizeof(ExactAcc<double>) == 8);

}  // namespace trident
