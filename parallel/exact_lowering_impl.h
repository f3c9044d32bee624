// One element of the i64 lowering of exact_sum (parallel/exact_lowering.h), header-inline and TD_HD so that the
// host (parallel/exact_lowering.cpp) and a CUDA device (gpu/exact_lowering.cu) pack and unpack the same words.
#pragma once
#include <cstdint>

#include "reference/exact_acc.h"
#include "reference/hd.h"

namespace trident::exact_lowering::elem {

inline constexpr int64_t kRadix = int64_t{1} << 32;  // of the packed words' digits
inline constexpr int kFlagBits = 21;
inline constexpr int64_t kFlagMask = (int64_t{1} << kFlagBits) - 1;
inline constexpr int64_t kContributions = (int64_t{1} << 21) - 1;  // exact_lowering::kMaxContributions
// Bounds of the words of a sum of at most kContributions packed elements (checked on unpack; any larger magnitude
// means the buffer is not such a sum).
inline constexpr int64_t kDigitSumMax = kContributions * (kRadix - 1);  // < 2^53
inline constexpr int64_t kTopSumMax = kContributions * (kRadix / 2);    // < 2^52
// The flag bits of ExactAccCore (1 NaN, 2 +Inf, 4 -Inf) and their counter fields.
inline constexpr uint32_t kNaN = 1, kPosInf = 2, kNegInf = 4;

// The packed words' digits are 32 bits wide whatever the accumulator's digit width D (48 for float, 32 for double):
// the (L - 1) D low bits of the normalised accumulator are exactly kWordDigits<T> 32-bit digits, and its top limb
// sits at 2^(32 kWordDigits) units in both forms.
template <class T>
inline constexpr int kWordDigits = (ExactAcc<T>::kLimbs - 1) * ExactAcc<T>::kDigit / 32;

template <class T>
TD_HD constexpr int words() {
  return kWordDigits<T> + 3;
}

// Bits [32 w, 32 w + 32) of the non-negative integer whose D-bit digits are lim[0..n-1] (each in [0, 2^D)).
template <int D>
TD_HD inline int64_t digit32(const int64_t* lim, int n, int w) {
  const int i = 32 * w / D, s = 32 * w % D;
  uint64_t v = static_cast<uint64_t>(lim[i]) >> s;
  if (D - s < 32 && i + 1 < n) v |= static_cast<uint64_t>(lim[i + 1]) << (D - s);
  return static_cast<int64_t>(v & (kRadix - 1));
}

template <class T>
TD_HD inline void pack(const ExactAcc<T>& in, int64_t* out) {
  constexpr int L = ExactAcc<T>::kLimbs, N = kWordDigits<T>;
  static_assert((L - 1) * ExactAcc<T>::kDigit == 32 * N && ExactAcc<T>::kDigit % 16 == 0);
  ExactAcc<T> a = in;
  a.normalize();  // limbs 0..L-2 in [0, 2^D), the top limb signed
  int64_t lim[L - 1];
  for (int i = 0; i < L - 1; ++i) lim[i] = a.limb(i);
  for (int w = 0; w < N; ++w) out[w] = digit32<ExactAcc<T>::kDigit>(lim, L - 1, w);
  const int64_t top = a.limb(L - 1);
  out[N] = top & (kRadix - 1);  // t mod 2^32
  out[N + 1] = top >> 32;       // floor(t / 2^32): arithmetic shift
  const uint32_t f = a.flags();
  out[N + 2] = ((f & kNaN) ? 1 : 0) | ((f & kPosInf) ? int64_t{1} << kFlagBits : 0) |
               ((f & kNegInf) ? int64_t{1} << (2 * kFlagBits) : 0);
}

// What is wrong with a word sum (0: nothing); `word` is the index of the bad word.
enum Bad : int { kOk = 0, kDigitRange = 1, kTopRange = 2, kOverflow = 3, kFlagWord = 4 };

// in: one element's word sum; out: the canonical accumulator (count 1, as normalize() leaves it).
template <class T>
TD_HD inline int unpack(const int64_t* in, ExactAcc<T>& out, int& word) {
  constexpr int L = ExactAcc<T>::kLimbs, N = kWordDigits<T>, D = ExactAcc<T>::kDigit;
  int64_t dig[N + 1];  // canonical 32-bit digits; dig[N]: the top limb's low half
  int64_t c = 0;       // carry into digit i, in [0, 2^22)
  for (int i = 0; i <= N; ++i) {
    const int64_t d = in[i];
    if (d < 0 || d > kDigitSumMax) return word = i, kDigitRange;
    const int64_t t = d + c;
    dig[i] = t & (kRadix - 1);
    c = t >> 32;
  }
  const int64_t hs = in[N + 1];
  if (hs < -kTopSumMax || hs > kTopSumMax) return word = N + 1, kTopRange;
  const int64_t hi = hs + c;  // top limb = hi * 2^32 + dig[N]
  if (hi < -(kRadix / 2) || hi >= kRadix / 2) return word = N + 1, kOverflow;
  const int64_t top = dig[N] + static_cast<int64_t>(static_cast<uint64_t>(hi) << 32);
  if (top < ExactAcc<T>::kTopMin || top > ExactAcc<T>::kTopMax) return word = N + 1, kOverflow;
  // The 32-bit digits regrouped into D-bit limbs (D a multiple of 16: a limb takes whole 16-bit halves).
  int64_t limb[L - 1];
  for (int i = 0; i < L - 1; ++i) {
    uint64_t v = 0;
    for (int b = 0; b < D; b += 16) {
      const int pos = D * i + b;  // bit position of this half
      v |= ((static_cast<uint64_t>(dig[pos / 32]) >> (pos % 32)) & 0xffffu) << b;
    }
    limb[i] = static_cast<int64_t>(v);
  }
  const int64_t f = in[N + 2];
  if (f < 0) return word = N + 2, kFlagWord;  // three 21-bit fields fill bits 0..62
  out.set_canonical(limb, top,
                    ((f & kFlagMask) ? kNaN : 0) | (((f >> kFlagBits) & kFlagMask) ? kPosInf : 0) |
                        (((f >> (2 * kFlagBits)) & kFlagMask) ? kNegInf : 0));
  return kOk;
}

}  // namespace trident::exact_lowering::elem
