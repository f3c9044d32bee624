// bfloat16: storage type and the one conversion the numerics contract uses.
// fp32 -> bf16 rounds to nearest, ties to even; NaN stays NaN (quiet, sign kept); overflow rounds to +-Inf.
// bf16 -> fp32 is exact (the 16 bits become the high half).
#pragma once
#include <bit>
#include <cstdint>
#include <cstring>

#include "reference/hd.h"

namespace trident {

struct bf16 {
  uint16_t bits = 0;
  friend bool operator==(bf16, bf16) = default;
};

TD_HD inline bf16 to_bf16(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x0040u)};  // NaN: quiet
  // Round to nearest even: add 0x7fff plus the lowest kept bit; carries into the exponent are correct
  // (mantissa overflow bumps the exponent; the largest finite values round up to Inf).
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}

TD_HD inline float to_float(bf16 h) { return std::bit_cast<float>(static_cast<uint32_t>(h.bits) << 16); }

// x rounded to the nearest bf16 value, returned as fp32 (how bf16 GEMM operands are formed).
TD_HD inline float round_bf16(float x) { return to_float(to_bf16(x)); }

void round_bf16_inplace(float* x, long n);  // x[i] = round_bf16(x[i])

}  // namespace trident
