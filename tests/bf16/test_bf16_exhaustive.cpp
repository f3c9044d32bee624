// fp32 -> bf16 round-to-nearest-even (reference/bf16.h) against two independent oracles, over all 2^32 fp32
// bit patterns, plus bf16 -> fp32 -> bf16 round trips for all 2^16 bf16 patterns.
//
// Oracle A (bit decision): keep the high 16 bits; the discarded low 16 bits decide: > 0x8000 up,
//   < 0x8000 down, == 0x8000 up only if the kept half is odd. NaN inputs are checked separately.
// Oracle B (values): the two bf16 neighbours of x are formed explicitly (truncation and truncation + one
//   bf16 ulp; above the largest finite bf16 the upper neighbour is 2^128, i.e. overflow); the distances are
//   computed exactly in double and the nearer one wins, ties to the even significand.
#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "reference/bf16.h"

namespace {

using trident::bf16;

bool is_nan32(uint32_t u) { return (u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0; }

uint16_t oracle_bits(uint32_t u) {
  const auto kept = static_cast<uint16_t>(u >> 16);
  const uint32_t dropped = u & 0xffffu;
  if (dropped > 0x8000u) return static_cast<uint16_t>(kept + 1);
  if (dropped < 0x8000u) return kept;
  return (kept & 1u) ? static_cast<uint16_t>(kept + 1) : kept;
}

uint16_t oracle_values(uint32_t u) {
  const float x = std::bit_cast<float>(u);
  const double ax = std::fabs(static_cast<double>(x));
  const uint32_t mag = u & 0x7fffffffu;
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  if (std::isinf(x)) return static_cast<uint16_t>(sign | 0x7f80u);
  const auto lo_b = static_cast<uint16_t>(mag >> 16);  // truncation toward zero (a bf16 magnitude)
  const double lo = std::bit_cast<float>(static_cast<uint32_t>(lo_b) << 16);
  const auto hi_b = static_cast<uint16_t>(lo_b + 1);
  // upper neighbour; for lo_b = 0x7f7f it is 2^128 (not a float: rounding there means overflow)
  const double hi = (lo_b == 0x7f7fu) ? 0x1p128 : static_cast<double>(std::bit_cast<float>(static_cast<uint32_t>(hi_b) << 16));
  const double dlo = ax - lo, dhi = hi - ax;  // exact in double
  uint16_t r;
  if (dlo < dhi) r = lo_b;
  else if (dhi < dlo) r = hi_b;
  else r = (lo_b & 1u) ? hi_b : lo_b;
  if (r == 0x7f80u || (lo_b == 0x7f7fu && r == hi_b)) r = 0x7f80u;  // overflow -> Inf
  return static_cast<uint16_t>(sign | r);
}

TEST(Bf16, AllFp32PatternsAgainstTwoOracles) {
  constexpr uint64_t N = 1ull << 32;
  uint64_t bad_a = 0, bad_b = 0, bad_nan = 0, n_nan = 0, n_up = 0, n_tie = 0, n_inf = 0;
  uint64_t first_bad = N;
#pragma omp parallel for schedule(static, 1 << 20) reduction(+ : bad_a, bad_b, bad_nan, n_nan, n_up, n_tie, n_inf) \
    reduction(min : first_bad)
  for (uint64_t i = 0; i < N; ++i) {
    const auto u = static_cast<uint32_t>(i);
    const uint16_t got = trident::to_bf16(std::bit_cast<float>(u)).bits;
    if (is_nan32(u)) {
      ++n_nan;
      // NaN stays NaN, quiet bit set, sign and the top payload bits kept
      const bool ok = (got & 0x7f80u) == 0x7f80u && (got & 0x0040u) != 0 && (got & 0x8000u) == ((u >> 16) & 0x8000u) &&
                      (got & 0x003fu) == ((u >> 16) & 0x003fu);
      if (!ok) {
        ++bad_nan;
        first_bad = std::min<uint64_t>(first_bad, i);
      }
      continue;
    }
    const uint16_t a = oracle_bits(u), b = oracle_values(u);
    if (got != a) {
      ++bad_a;
      first_bad = std::min<uint64_t>(first_bad, i);
    }
    if (got != b) {
      ++bad_b;
      first_bad = std::min<uint64_t>(first_bad, i);
    }
    if (got != static_cast<uint16_t>(u >> 16)) ++n_up;
    if ((u & 0xffffu) == 0x8000u) ++n_tie;
    if ((got & 0x7fffu) == 0x7f80u) ++n_inf;
  }
  std::printf("bf16: 2^32 patterns: %llu NaN, %llu rounded up, %llu ties, %llu Inf results; mismatches: bit oracle %llu, "
              "value oracle %llu, NaN rule %llu\n",
              (unsigned long long)n_nan, (unsigned long long)n_up, (unsigned long long)n_tie,
              (unsigned long long)n_inf, (unsigned long long)bad_a, (unsigned long long)bad_b,
              (unsigned long long)bad_nan);
  // guards against a vacuous pass
  EXPECT_GT(n_up, 0u);
  EXPECT_EQ(n_tie, (1ull << 16) - 256);  // exact ties: every kept half except the 256 NaN ones
  EXPECT_EQ(n_inf, 2 + 2 * 0x8000ull);   // +-Inf inputs, and [0x7f7f8000, 0x7f7fffff] of both signs overflow
  EXPECT_EQ(n_nan, 2ull * ((1ull << 23) - 1));
  EXPECT_EQ(bad_a, 0u) << "first mismatch at fp32 bits 0x" << std::hex << first_bad;
  EXPECT_EQ(bad_b, 0u) << "first mismatch at fp32 bits 0x" << std::hex << first_bad;
  EXPECT_EQ(bad_nan, 0u) << "first mismatch at fp32 bits 0x" << std::hex << first_bad;
}

TEST(Bf16, RoundTripAllBf16Patterns) {
  int checked = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const bf16 b{static_cast<uint16_t>(h)};
    const float f = trident::to_float(b);
    EXPECT_EQ(std::bit_cast<uint32_t>(f), h << 16);  // widening is exact: the bits become the high half
    const uint16_t back = trident::to_bf16(f).bits;
    if ((h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0) {
      EXPECT_EQ(back, h | 0x0040u) << std::hex << h;  // NaN stays NaN (quietened)
      EXPECT_TRUE(std::isnan(trident::to_float(bf16{back})));
    } else {
      EXPECT_EQ(back, h) << std::hex << h;
      EXPECT_EQ(std::bit_cast<uint32_t>(trident::round_bf16(f)), std::bit_cast<uint32_t>(f));
    }
    ++checked;
  }
  EXPECT_EQ(checked, 65536);
}

TEST(Bf16, NamedCases) {
  auto cv = [](uint32_t u) { return trident::to_bf16(std::bit_cast<float>(u)).bits; };
  EXPECT_EQ(cv(0x7f7fffffu), 0x7f80u);  // FLT_MAX overflows to +Inf
  EXPECT_EQ(cv(0xff7fffffu), 0xff80u);  // -FLT_MAX to -Inf
  EXPECT_EQ(cv(0x7f7f0000u), 0x7f7fu);  // largest finite bf16 stays
  EXPECT_EQ(cv(0x7f7f7fffu), 0x7f7fu);  // below the midpoint to Inf: stays finite
  EXPECT_EQ(cv(0x7f7f8000u), 0x7f80u);  // tie at the top, odd significand: to Inf
  EXPECT_EQ(cv(0x7f800000u), 0x7f80u);  // Inf stays
  EXPECT_EQ(cv(0xff800000u), 0xff80u);
  EXPECT_EQ(cv(0x7f800001u), 0x7fc0u);  // signalling NaN becomes quiet NaN
  EXPECT_EQ(cv(0xffc00000u), 0xffc0u);  // quiet NaN keeps its sign
  EXPECT_EQ(cv(0x3f808000u), 0x3f80u);  // tie, even kept half: down
  EXPECT_EQ(cv(0x3f818000u), 0x3f82u);  // tie, odd kept half: up
  EXPECT_EQ(cv(0x3f808001u), 0x3f81u);  // just above the tie: up
  EXPECT_EQ(cv(0x00000001u), 0x0000u);  // smallest subnormal to +0
  EXPECT_EQ(cv(0x80000001u), 0x8000u);  // ... and to -0
  EXPECT_EQ(cv(0x00018000u), 0x0002u);  // subnormal tie, odd: up
  EXPECT_EQ(cv(0x007fffffu), 0x0080u);  // largest subnormal rounds up to the smallest normal
  std::vector<float> v = {std::bit_cast<float>(0x3f818000u), std::bit_cast<float>(0x7f7fffffu), 1.0f};
  trident::round_bf16_inplace(v.data(), static_cast<long>(v.size()));
  EXPECT_EQ(std::bit_cast<uint32_t>(v[0]), 0x3f820000u);
  EXPECT_TRUE(std::isinf(v[1]));
  EXPECT_EQ(v[2], 1.0f);
}

}  // namespace
