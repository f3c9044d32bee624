// Exact accumulation (numerics contract, section "Exact cross-token reductions").
//
// ExactAcc<T> holds the exact sum of any number of finite T values (T = float or double) as a fixed-point
// integer covering T's whole range (smallest subnormal bit to the largest exponent, plus carry headroom),
// plus flags for NaN / +Inf / -Inf. Integer addition is associative and commutative, so the result is
// independent of order and of how the terms were partitioned before merge(). round() rounds once,
// correctly (round-to-nearest, ties to even), to T.
//
// Special values: any NaN -> NaN; +Inf and -Inf both seen -> NaN; only +Inf (-Inf) -> +Inf (-Inf);
// a finite exact sum whose rounding overflows T -> +-Inf. An exact zero rounds to +0.
//
// ExactAcc<T> is trivially copyable and has no pointers: an array of them is its own serialisation
// (kBytes each), which is how ranks exchange partial sums (emulator ReduceOp::exact_sum).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace trident {

template <class T>
class ExactAcc;  // specialised for float and double in reference/exact_acc_impl.h

}  // namespace trident

#ifdef TRIDENT_PLAIN_ACC  // benchmark twins only (bench/step): plain sums, see reference/plain_acc_impl.h
#include "reference/plain_acc_impl.h"
#else
#include "reference/exact_acc_impl.h"
#endif

namespace trident {

static_assert(std::is_trivially_copyable_v<ExactAcc<float>>);
static_assert(std::is_trivially_copyable_v<ExactAcc<double>>);

// Elementwise helpers over arrays of accumulators.
template <class T>
void exact_merge(ExactAcc<T>* dst, const ExactAcc<T>* src, int64_t n);  // dst[i].merge(src[i])
template <class T>
void exact_round(const ExactAcc<T>* acc, T* out, int64_t n);            // out[i] = acc[i].round()
// out[i] = acc[i].round(), then acc[i] = ExactAcc<T>() (empty), in one parallel pass while the accumulator is in
// cache (the streaming gradient accumulators' close: half the memory traffic of a round and a separate clear).
template <class T>
void exact_round_clear(ExactAcc<T>* acc, T* out, int64_t n);

// Serialisation: bytes of n accumulators (n * ExactAcc<T>::kBytes). Identity copy, kept as functions so the
// wire format is one place.
template <class T>
inline void exact_serialize(const ExactAcc<T>* acc, int64_t n, std::byte* out) {
  std::memcpy(out, acc, static_cast<size_t>(n) * sizeof(ExactAcc<T>));
}
template <class T>
inline void exact_deserialize(const std::byte* in, int64_t n, ExactAcc<T>* acc) {
  std::memcpy(acc, in, static_cast<size_t>(n) * sizeof(ExactAcc<T>));
}

}  // namespace trident
