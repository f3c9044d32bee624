// ReduceOp::exact_sum lowered onto ReduceOp::sum over DataType::i64 (docs/numerics.md, "Exact sums over integer
// collectives"). A backend without a native exact_sum (NCCL, MPI: only integer/float sums) gets the same bits
// as the emulator's native merge: Communicator's public reduce_scatter / all_reduce / reduce pack every
// accumulator into words, run the backend's ordinary wrap-free int64 sum over them, and unpack the sums into
// canonical accumulators.
//
// Packed element (W = N + 3 int64 words: float N = 9, W = 12; double N = 67, W = 70), from the accumulator
// normalised (limbs 0..K-2 in [0, 2^D) for K = ExactAcc<T>::kLimbs limbs of D = ExactAcc<T>::kDigit bits - float
// K = 7, D = 48; double K = 68, D = 32 - whose (K-1) D = 32 N low bits are N 32-bit digits; signed top limb t):
//   word[i], i < N   : bits [32 i, 32 i + 32)          in [0, 2^32)
//   word[N]          : t mod 2^32                      in [0, 2^32)
//   word[N+1]        : floor(t / 2^32)                 in [-2^31, 2^31)
//   word[N+2]        : nan + pinf * 2^21 + ninf * 2^42 (each 0 or 1: the accumulator's NaN / +Inf / -Inf flag)
// so the value is V = sum_{i <= N+1} word[i] * 2^(32 i) units. The wordwise int64 sum of n <= kMaxContributions
// packed elements cannot wrap (|each word sum| < 2^53) and its flag fields count contributors per flag without
// carrying into each other; unpack() carry-propagates it back into a normalised accumulator (count 1, flag set
// iff its counter > 0): the same bytes as the native merge of the same accumulators followed by normalize().
#pragma once
#include <cstddef>
#include <cstdint>

#include "parallel/comm.h"

namespace trident::exact_lowering {

// Most contributions (communicator ranks, or packed buffers summed by any other means) one lowered sum may
// combine: the flag counters are 21-bit fields. Communicator checks size() against it.
inline constexpr int64_t kMaxContributions = (int64_t{1} << 21) - 1;

// i64 words per element of an exact dtype (exact_f32: 12, exact_f64: 70). Throws for other dtypes.
size_t words_per_element(DataType t);

// acc: `count` accumulators of exact dtype t (ExactAcc<float> / ExactAcc<double>); out: count *
// words_per_element(t) words. acc and out must not overlap.
void pack(DataType t, const void* acc, size_t count, int64_t* out);

// in: the wordwise int64 sum of at most kMaxContributions packed buffers (one packed buffer is a valid sum of
// one); acc: `count` canonical accumulators. Throws trident::Error when the exact sum leaves the accumulator's
// range (its top limb would overflow int64; the native merge is undefined there) or a word is out of the
// range such a sum can have. in and acc must not overlap.
void unpack(DataType t, const int64_t* in, size_t count, void* acc);

// The error of a word sum that unpack() refuses (bad: exact_lowering_impl.h elem::Bad; value: the bad word), for a
// backend that finds it elsewhere (a CUDA device's unpack kernel).
[[noreturn]] void unpack_failed(int bad, int64_t element, int word, int64_t value);

}  // namespace trident::exact_lowering
