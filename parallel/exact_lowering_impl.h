// One element of the i64 lowering of exact_sum (parallel/exact_lowering.h), header-inline and TD_HD so that the
// host (parallel/exact_lowering.cpp) and a CUDA device (gpu/exact_lowering.cu) pack and unpack the same words.
#pragma once
#include <cstdint>

#include "reference/exact_acc.h"
#include "reference/hd.h"

namespace trident::exact_lowering::elem {

inline constexpr int64_t kDigit = int64_t{1} << 32;
inline constexpr int kFlagBits = 21;
inline constexpr int64_t kFlagMask = (int64_t{1} << kFlagBits) - 1;
inline constexpr int64_t kContributions = (int64_t{1} << 21) - 1;  // exact_lowering::kMaxContributions
// Bounds of the words of a sum of at most kContributions packed elements (checked on unpack; any larger magnitude
// means the buffer is not such a sum).
inline constexpr int64_t kDigitSumMax = kContributions * (kDigit - 1);  // < 2^53
inline constexpr int64_t kTopSumMax = kContributions * (kDigit / 2);    // < 2^52
// The flag bits of ExactAccCore (1 NaN, 2 +Inf, 4 -Inf) and their counter fields.
inline constexpr uint32_t kNaN = 1, kPosInf = 2, kNegInf = 4;

template <class T>
TD_HD constexpr int words() {
  return ExactAcc<T>::kLimbs + 2;
}

template <class T>
TD_HD inline void pack(const ExactAcc<T>& in, int64_t* out) {
  constexpr int L = ExactAcc<T>::kLimbs;
  ExactAcc<T> a = in;
  a.normalize();  // limbs 0..L-2 in [0, 2^32), the top limb signed
  for (int i = 0; i < L - 1; ++i) out[i] = a.limb(i);
  const int64_t top = a.limb(L - 1);
  out[L - 1] = top & (kDigit - 1);  // t mod 2^32
  out[L] = top >> 32;               // floor(t / 2^32): arithmetic shift
  const uint32_t f = a.flags();
  out[L + 1] = ((f & kNaN) ? 1 : 0) | ((f & kPosInf) ? int64_t{1} << kFlagBits : 0) |
               ((f & kNegInf) ? int64_t{1} << (2 * kFlagBits) : 0);
}

// The wire format of exact_acc_impl.h: limb[L] (int64), count (uint32), flags (uint32), no padding.
template <class T>
struct Image {
  int64_t limb[ExactAcc<T>::kLimbs];
  uint32_t count;
  uint32_t flags;
};

// What is wrong with a word sum (0: nothing); `word` is the index of the bad word.
enum Bad : int { kOk = 0, kDigitRange = 1, kTopRange = 2, kOverflow = 3, kFlagWord = 4 };

// in: one element's word sum; out: the canonical accumulator's bytes (count 1, as normalize() leaves it).
template <class T>
TD_HD inline int unpack(const int64_t* in, Image<T>& im, int& word) {
  constexpr int L = ExactAcc<T>::kLimbs;
  int64_t c = 0;  // carry into digit i, in [0, 2^22)
  for (int i = 0; i < L; ++i) {
    const int64_t d = in[i];
    if (d < 0 || d > kDigitSumMax) return word = i, kDigitRange;
    const int64_t t = d + c;
    im.limb[i] = t & (kDigit - 1);
    c = t >> 32;
  }
  const int64_t hs = in[L];
  if (hs < -kTopSumMax || hs > kTopSumMax) return word = L, kTopRange;
  const int64_t hi = hs + c;  // top limb = hi * 2^32 + (t mod 2^32)
  if (hi < -(kDigit / 2) || hi >= kDigit / 2) return word = L, kOverflow;
  im.limb[L - 1] += static_cast<int64_t>(static_cast<uint64_t>(hi) << 32);
  const int64_t f = in[L + 1];
  if (f < 0) return word = L + 1, kFlagWord;  // three 21-bit fields fill bits 0..62
  im.flags = ((f & kFlagMask) ? kNaN : 0) | (((f >> kFlagBits) & kFlagMask) ? kPosInf : 0) |
             (((f >> (2 * kFlagBits)) & kFlagMask) ? kNegInf : 0);
  im.count = 1;
  return kOk;
}

}  // namespace trident::exact_lowering::elem
