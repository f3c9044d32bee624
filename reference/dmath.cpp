// Deterministic elementary functions (see reference/dmath.h and docs/numerics.md, section "Elementary functions").
//
// Only IEEE-754 binary64 +, -, *, / and sqrt (all correctly rounded), integer bit manipulation and constants are
// used; no libm, no FMA (the project compiles with -ffp-contract=off), so the bits are the same on every
// x86-64 build. The double functions carry their intermediate results as unevaluated double-double sums
// (hi + lo, ~106 bits) built from exact error-free transformations (TwoSum, Dekker's split product) and round
// once at the end (double: to nearest, within 0.501 ulp). The float functions are correctly rounded: a fast
// plain-double evaluation when its result is safely away from a float rounding boundary, otherwise the
// double-double algorithm rounded to odd, then to float (see the float section at the end).
// Polynomials are truncated Taylor / atanh series (coefficients 1/n! and 1/(2k+1), no fitted constants).
#include "reference/dmath.h"
#include "reference/dmath_detail.h"

// TD_DM / TD_DM_TABLE: empty here. The CUDA ref tier (gpu/ref/dmath_device.cuh) includes this file a second time,
// inside its own namespace, with both defined as __device__: the same source gives the device dm:: functions.
#ifndef TD_DM
#define TD_DM
#define TRIDENT_DM_HOST 1  // this is the host build: the array forms (exp_n) are defined at the end
#endif
#ifndef TD_DM_TABLE
#define TD_DM_TABLE
#endif
// exp's fast-stage polynomial loop unrolled on the host (GCC leaves it rolled at -O2; exp_n runs it on vectors); the
// same operations in the same order.
#if defined(TRIDENT_DM_HOST) && defined(__GNUC__) && !defined(__clang__)
#define TD_DM_UNROLL _Pragma("GCC unroll 16")
#else
#define TD_DM_UNROLL
#endif
// exp_n's vector form of exp_fast_reduced inlined into each instruction set's copy (never called across them).
#ifdef TRIDENT_DM_HOST
#define TD_DM_FORCE_INLINE __attribute__((always_inline))
#if defined(__GNUC__)
// Its 64-byte vector return would change the ABI between instruction sets if it were ever called; it never is.
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
#else
#define TD_DM_FORCE_INLINE
#endif

#include <bit>
#include <cmath>  // std::sqrt only (correctly rounded IEEE operation)
#include <cstdint>
#include <limits>

#ifdef TRIDENT_DM_HOST
#include <cstring>
#include "reference/gemm.h"  // gemm_isa(): exp_n follows the GEMM's instruction set
#endif

namespace trident::dm {
namespace {

// ------------------------------------------------------------------------------------------------------------
// Error-free transformations and double-double arithmetic.
struct DD {
  double h, l;  // value = h + l, |l| <= ulp(h)/2 after normalisation
};

TD_DM inline DD two_sum(double a, double b) {  // a + b = s + e exactly
  const double s = a + b;
  const double bb = s - a;
  const double e = (a - (s - bb)) + (b - bb);
  return {s, e};
}
TD_DM inline DD fast_two_sum(double a, double b) {  // requires |a| >= |b| (or a == 0)
  const double s = a + b;
  return {s, b - (s - a)};
}
TD_DM inline void split(double a, double& hi, double& lo) {  // Veltkamp split, |a| < 2^995
  const double c = 134217729.0 * a;                    // 2^27 + 1
  hi = c - (c - a);
  lo = a - hi;
}
TD_DM inline DD two_prod(double a, double b) {  // a * b = p + e exactly (no overflow/underflow)
  const double p = a * b;
  double ah, al, bh, bl;
  split(a, ah, al);
  split(b, bh, bl);
  const double e = ((ah * bh - p) + ah * bl + al * bh) + al * bl;
  return {p, e};
}
TD_DM inline DD dd_neg(DD a) { return {-a.h, -a.l}; }
TD_DM inline DD dd_add(DD a, DD b) {
  DD s = two_sum(a.h, b.h);
  const DD t = two_sum(a.l, b.l);
  s.l += t.h;
  s = fast_two_sum(s.h, s.l);
  s.l += t.l;
  return fast_two_sum(s.h, s.l);
}
TD_DM inline DD dd_add_d(DD a, double b) {
  DD s = two_sum(a.h, b);
  s.l += a.l;
  return fast_two_sum(s.h, s.l);
}
TD_DM inline DD dd_mul(DD a, DD b) {
  DD p = two_prod(a.h, b.h);
  p.l += a.h * b.l + a.l * b.h;
  return fast_two_sum(p.h, p.l);
}
TD_DM inline DD dd_mul_d(DD a, double b) {
  DD p = two_prod(a.h, b);
  p.l += a.l * b;
  return fast_two_sum(p.h, p.l);
}
TD_DM inline DD dd_div(DD a, DD b) {
  const double q1 = a.h / b.h;
  const DD p = two_prod(q1, b.h);
  const double rem = (((a.h - p.h) - p.l) + a.l) - q1 * b.l;
  return fast_two_sum(q1, rem / b.h);
}
TD_DM inline DD dd_div_d(DD a, double d) {  // d a small exact integer
  const double q1 = a.h / d;
  const DD p = two_prod(q1, d);
  const double rem = ((a.h - p.h) - p.l) + a.l;
  return fast_two_sum(q1, rem / d);
}

// ------------------------------------------------------------------------------------------------------------
// Bit helpers.
TD_DM inline uint64_t bits(double x) { return std::bit_cast<uint64_t>(x); }
TD_DM inline double from_bits(uint64_t u) { return std::bit_cast<double>(u); }
TD_DM inline double pow2(int k) {  // 2^k for -1074 <= k <= 1023, exact
  if (k < -1022) return from_bits(1ull << (k + 1074));
  return from_bits(static_cast<uint64_t>(k + 1023) << 52);
}
TD_DM inline bool is_nan(double x) { return x != x; }
TD_DM inline double copysign_(double mag, double sgn) {
  return from_bits((bits(mag) & ~(1ull << 63)) | (bits(sgn) & (1ull << 63)));
}
TD_DM inline double fabs_(double x) { return from_bits(bits(x) & ~(1ull << 63)); }
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Round-to-nearest integer (ties to even) of |t| < 2^51, as a double.
TD_DM inline double nearest_int(double t) {
  const double big = 0x1.8p52;
  return (t + big) - big;
}

// How a double-double result is rounded to double: to nearest (the double functions), or to odd (the float
// functions: rounding the exact value to odd in double, then to nearest float, equals rounding it to nearest
// float directly, because double carries more than 24 + 2 bits -- so no double-rounding error).
enum class Rnd { kNearest, kOdd };

// (h, l) normalised (h = RN(h + l)): the double next to h + l on the side of l whose last bit is 1, or h if exact.
TD_DM inline double round_odd(double h, double l) {
  if (l == 0 || !(fabs_(h) <= std::numeric_limits<double>::max())) return h;
  uint64_t b = bits(h);
  if (!(b & 1)) b = ((l > 0) == (h > 0)) ? b + 1 : b - 1;  // magnitude one ulp up / down
  return from_bits(b);
}

template <Rnd R>
TD_DM inline double finish(DD v) {
  if constexpr (R == Rnd::kNearest) {
    return v.h + v.l;
  } else {
    const DD n = fast_two_sum(v.h, v.l);
    return round_odd(n.h, n.l);
  }
}

// (h + l) * 2^k rounded once to double (round to nearest even), including gradual underflow and overflow.
// (h, l) is a normalised double-double with h normal or zero.
template <Rnd R>
TD_DM double round_scaled(double h, double l, int k) {
  if (h == 0) return h;
  const bool neg = h < 0;
  double a = fabs_(h), b = neg ? -l : l;
  int e = static_cast<int>((bits(a) >> 52) & 0x7ff);
  if (e == 0) {  // subnormal h: renormalise
    a *= 0x1p54;
    b *= 0x1p54;
    k -= 54;
    e = static_cast<int>((bits(a) >> 52) & 0x7ff);
  }
  e -= 1023;  // a = 2^e * [1, 2)
  a *= pow2(-e);
  b *= pow2(-e);
  k += e;  // value = (a + b) * 2^k, a in [1, 2)
  double r;
  if (k >= -1022) {
    if (k > 1023) return neg ? -kInf : kInf;
    const double s = finish<R>(DD{a, b});  // in [1, 2]; scaling below is exact or overflows correctly
    r = s * pow2(k);
  } else if (k < -1075) {
    r = 0.0;  // value < 2^-1075: rounds to zero
  } else {
    // Subnormal double result (round to nearest also for Rnd::kOdd: float results are never this small).
    // Granularity g = 2^-1074 corresponds to 2^(-1074-k) in a's scale.
    const double ginv = pow2(1074 + k);  // 1/g, 2^-1 .. 2^51
    const double q = a * ginv;           // exact, < 2^52
    const auto fi = static_cast<uint64_t>(q);
    const double f = q - static_cast<double>(fi);  // exact fraction
    const double d = f - 0.5;                      // exact: |d| < 1/2, f has <= 52 fraction bits
    const double s = d + b * ginv;                 // sign of s == sign of the exact remainder - 1/2
    const bool up = s > 0 || (s == 0 && (fi & 1));
    r = from_bits(fi + (up ? 1 : 0));
  }
  return neg ? -r : r;
}

// ------------------------------------------------------------------------------------------------------------
// ln 2 in three parts: the first two have 42 significant bits, so k * part is exact for |k| < 2^11.
constexpr double kLn2_0 = 0x1.62e42fefa38p-1;
constexpr double kLn2_1 = 0x1.ef35793c768p-45;
constexpr double kLn2_2 = -0x1.9ff0342542fc3p-90;
constexpr double kInvLn2 = 0x1.71547652b82fep+0;

// Inverse factorials 1/n!, n = 0..17, rounded to double (Taylor coefficients of exp).
TD_DM_TABLE constexpr double kInvFact[18] = {
    1.0,
    1.0,
    1.0 / 2,
    1.0 / 6,
    1.0 / 24,
    1.0 / 120,
    1.0 / 720,
    1.0 / 5040,
    1.0 / 40320,
    1.0 / 362880,
    1.0 / 3628800,
    1.0 / 39916800,
    1.0 / 479001600,
    1.0 / 6227020800.0,
    1.0 / 87178291200.0,
    1.0 / 1307674368000.0,
    1.0 / 20922789888000.0,
    1.0 / 355687428096000.0,
};

struct ExpRed {
  int k;  // x = k ln2 + r
  DD r;   // |r| <= ~0.3466
};

// Cody-Waite reduction of x = xh + xl (|xh| < 1000).
TD_DM ExpRed exp_reduce(double xh, double xl) {
  const double kd = nearest_int(xh * kInvLn2);
  const double r1 = xh - kd * kLn2_0;  // exact (Sterbenz-like: see docs)
  DD s = two_sum(r1, -(kd * kLn2_1));  // product exact
  s.l += xl - kd * kLn2_2;
  s = fast_two_sum(s.h, s.l);
  return {static_cast<int>(kd), s};
}

// expm1(r) as a double-double with small relative error, |r| <= 0.35.
TD_DM DD expm1_kernel(DD r) {
  // r + r^2/2! + ... + r^5/5! in double-double, r^6 (1/6! + r/7! + ... + r^11/17!) in double (< 2^-17 of the sum)
  const DD r2 = dd_mul(r, r);
  const DD r3 = dd_mul(r2, r);
  const DD r4 = dd_mul(r2, r2);
  const DD r5 = dd_mul(r4, r);
  const double rh = r.h;
  double p = kInvFact[17];
  for (int n = 16; n >= 6; --n) p = p * rh + kInvFact[n];
  const double tail = (r3.h * r3.h) * p;
  DD s = dd_add(r, DD{r2.h * 0.5, r2.l * 0.5});
  s = dd_add(s, dd_div_d(r3, 6.0));
  s = dd_add(s, dd_div_d(r4, 24.0));
  s = dd_add(s, dd_div_d(r5, 120.0));
  return dd_add_d(s, tail);
}

// exp(r) = 1 + expm1(r) as a double-double in [0.7, 1.42].
TD_DM inline DD exp_kernel(DD r) { return dd_add_d(expm1_kernel(r), 1.0); }

// expm1(x) as an unrounded double-double for 2^-60 <= |x| <= 45 (tanh helper).
TD_DM DD expm1_dd(double x) {
  const ExpRed red = exp_reduce(x, 0.0);
  const DD em = expm1_kernel(red.r);
  if (red.k == 0) return em;
  // 2^k (1 + em) - 1 = 2^k ((1 - 2^-k) + em)
  const DD c = two_sum(1.0, -pow2(-red.k));
  const DD y = dd_add(c, em);
  const double s = pow2(red.k);
  return {y.h * s, y.l * s};
}

// ------------------------------------------------------------------------------------------------------------
// log: x = 2^e m, m in [sqrt(1/2), sqrt(2)), log m = 2 atanh(s), s = f / (2 + f), f = m - 1.
// Returns log(x) as a double-double for finite x > 0 (relative error ~2^-70).
TD_DM DD log_dd(double x) {
  uint64_t u = bits(x);
  int e = 0;
  if ((u >> 52) == 0) {  // subnormal
    x *= 0x1p54;
    u = bits(x);
    e = -54;
  }
  e += static_cast<int>(u >> 52) - 1023;
  uint64_t mant = u & ((1ull << 52) - 1);
  double m;
  if (mant > 0x6a09e667f3bcdull) {  // m > sqrt(2): use m/2, e + 1
    m = from_bits(mant | (1022ull << 52));
    e += 1;
  } else {
    m = from_bits(mant | (1023ull << 52));
  }
  const double f = m - 1.0;  // exact
  const DD den = two_sum(2.0, f);
  const DD s = dd_div({f, 0.0}, den);
  const DD s2 = dd_mul(s, s);
  const DD s3 = dd_mul(s2, s);
  const DD s5 = dd_mul(s3, s2);
  const DD s7 = dd_mul(s5, s2);
  // s + s^3/3 + s^5/5 + s^7/7 in double-double, s^9 (1/9 + s^2/11 + ... + s^16/25) in double
  const double z = s2.h;
  double p = 1.0 / 25;
  for (int d = 23; d >= 9; d -= 2) p = p * z + 1.0 / d;
  const double tail = (s7.h * z) * p;
  DD sum = dd_add(s, dd_div_d(s3, 3.0));
  sum = dd_add(sum, dd_div_d(s5, 5.0));
  sum = dd_add(sum, dd_div_d(s7, 7.0));
  sum = dd_add_d(sum, tail);
  const DD logm = {sum.h * 2.0, sum.l * 2.0};
  if (e == 0) return logm;
  const double ed = e;
  DD eln2 = two_sum(ed * kLn2_0, ed * kLn2_1);  // both products exact
  eln2.l += ed * kLn2_2;
  eln2 = fast_two_sum(eln2.h, eln2.l);
  return dd_add(eln2, logm);
}

// ------------------------------------------------------------------------------------------------------------
// sin / cos: reduction x = n pi/2 + r, |r| <= pi/4, by Payne-Hanek with an exact integer product against the
// bits of 2/pi (valid for every finite x).
constexpr double kPio2_0 = 0x1.921fb54442d18p+0;
constexpr double kPio2_1 = 0x1.1a62633145c07p-54;
// Bits of 2/pi after the binary point: word i holds bits 64i+1 .. 64i+64.
TD_DM_TABLE constexpr uint64_t kTwoOverPi[20] = {
    0xa2f9836e4e441529ULL, 0xfc2757d1f534ddc0ULL, 0xdb6295993c439041ULL, 0xfe5163abdebbc561ULL,
    0xb7246e3a424dd2e0ULL, 0x06492eea09d1921cULL, 0xfe1deb1cb129a73eULL, 0xe88235f52ebb4484ULL,
    0xe99c7026b45f7e41ULL, 0x3991d639835339f4ULL, 0x9c845f8bbdf9283bULL, 0x1ff897ffde05980fULL,
    0xef2f118b5a0a6d1fULL, 0x6d367ecf27cb09b7ULL, 0x4f463f669e5fea2dULL, 0x7527bac7ebe5f17bULL,
    0x3d0739f78a5292eaULL, 0x6bfb5fb11f8d5d08ULL, 0x56033046fc7b6babULL, 0xf0cfbc209af4361dULL,
};
__extension__ typedef unsigned __int128 u128;

TD_DM inline uint64_t tw_bits(int off) {  // 64 bits of 2/pi starting after bit position `off` (bits off+1..off+64)
  const int w = off / 64, o = off % 64;
  if (o == 0) return kTwoOverPi[w];
  return (kTwoOverPi[w] << o) | (kTwoOverPi[w + 1] >> (64 - o));
}

// |x| >= pi/4, finite. Returns n mod 4 and r = x - n pi/2 as a double-double.
TD_DM int reduce_pio2(double x, DD& r) {
  const uint64_t u = bits(x);
  const int be = static_cast<int>((u >> 52) & 0x7ff);
  const uint64_t M = (u & ((1ull << 52) - 1)) | (1ull << 52);
  const int E = be - 1075;  // |x| = M 2^E, E >= -53 here
  // Bits of 2/pi at positions <= E-2 contribute multiples of 4 (whole turns): skip them.
  const int j0 = E - 2 > 0 ? E - 2 : 0;
  const uint64_t B0 = tw_bits(j0), B1 = tw_bits(j0 + 64), B2 = tw_bits(j0 + 128);
  // P = M * B (256 bits, p[0] least significant); |x| 2/pi mod 4 = P 2^-s.
  uint64_t p[4];
  u128 t = static_cast<u128>(M) * B2;
  p[0] = static_cast<uint64_t>(t);
  t = static_cast<u128>(M) * B1 + (t >> 64);
  p[1] = static_cast<uint64_t>(t);
  t = static_cast<u128>(M) * B0 + (t >> 64);
  p[2] = static_cast<uint64_t>(t);
  p[3] = static_cast<uint64_t>(t >> 64);
  const int s = 192 + j0 - E;  // 190 .. 245
  auto bit = [&](int i) -> unsigned { return i >= 256 ? 0u : static_cast<unsigned>((p[i / 64] >> (i % 64)) & 1u); };
  unsigned n = bit(s) | (bit(s + 1) << 1);
  // The 128 fraction bits below position s.
  const int q = s - 128, w = q / 64, o = q % 64;
  uint64_t flo, fhi;
  if (o == 0) {
    flo = p[w];
    fhi = p[w + 1];
  } else {
    flo = (p[w] >> o) | (p[w + 1] << (64 - o));
    fhi = (p[w + 1] >> o) | ((w + 2 < 4 ? p[w + 2] : 0) << (64 - o));
  }
  u128 F = (static_cast<u128>(fhi) << 64) | flo;
  bool negf = false;
  if (fhi >> 63) {  // fraction >= 1/2: round the quadrant up, r negative
    n += 1;
    F = -F;  // 2^128 - F
    negf = true;
  }
  if (F == 0) {
    r = {0.0, 0.0};
  } else {
    const auto fh = static_cast<uint64_t>(F >> 64);
    const int lz = fh != 0 ? std::countl_zero(fh) : 64 + std::countl_zero(static_cast<uint64_t>(F));
    F <<= lz;
    const auto hi53 = static_cast<uint64_t>(F >> 75);
    const auto lo53 = static_cast<uint64_t>(F >> 22) & ((1ull << 53) - 1);
    // fraction = hi53 2^(-53-lz) + lo53 2^(-106-lz) (+ < 2^(-128-lz)), lz <= ~70 for doubles
    const DD f = fast_two_sum(static_cast<double>(hi53) * pow2(-53 - lz), static_cast<double>(lo53) * pow2(-106 - lz));
    r = dd_mul(f, DD{kPio2_0, kPio2_1});
  }
  if (negf) r = dd_neg(r);
  if (x < 0) {
    r = dd_neg(r);
    n = 0u - n;
  }
  return static_cast<int>(n & 3u);
}

// sin(r), |r| <= pi/4 (+ rounding), rounded to double.
// r - r^3/3! + r^5/5! - r^7/7! in double-double, r^9 (1/9! - r^2/11! + ... + r^12/21!) in double (< 2^-21 of
// the sum).
TD_DM double sin_kernel(DD r) {
  const DD r2 = dd_mul(r, r);
  const DD r3 = dd_mul(r2, r);
  const DD r5 = dd_mul(r3, r2);
  const DD r7 = dd_mul(r5, r2);
  const double z = r2.h;
  double p = 1.0 / 51090942171709440000.0;  // 1/21!
  p = p * z - 1.0 / 121645100408832000.0;    // 1/19!
  p = p * z + 1.0 / 355687428096000.0;       // 1/17!
  p = p * z - 1.0 / 1307674368000.0;         // 1/15!
  p = p * z + 1.0 / 6227020800.0;            // 1/13!
  p = p * z - 1.0 / 39916800.0;              // 1/11!
  p = p * z + 1.0 / 362880.0;                // 1/9!
  const double tail = (r7.h * z) * p;
  DD s = dd_add(r, dd_neg(dd_div_d(r3, 6.0)));
  s = dd_add(s, dd_div_d(r5, 120.0));
  s = dd_add(s, dd_neg(dd_div_d(r7, 5040.0)));
  s = dd_add_d(s, tail);
  return s.h + s.l;
}

// cos(r), |r| <= pi/4 (+ rounding), rounded to double.
// 1 - r^2/2! + r^4/4! - r^6/6! in double-double, r^8 (1/8! - r^2/10! + ... - r^14/22!) in double (< 2^-18 of
// the sum).
TD_DM double cos_kernel(DD r) {
  const DD r2 = dd_mul(r, r);
  const DD r4 = dd_mul(r2, r2);
  const DD r6 = dd_mul(r4, r2);
  const double z = r2.h;
  double p = -1.0 / 1124000727777607680000.0;  // -1/22!
  p = p * z + 1.0 / 2432902008176640000.0;      // 1/20!
  p = p * z - 1.0 / 6402373705728000.0;         // 1/18!
  p = p * z + 1.0 / 20922789888000.0;           // 1/16!
  p = p * z - 1.0 / 87178291200.0;              // 1/14!
  p = p * z + 1.0 / 479001600.0;                // 1/12!
  p = p * z - 1.0 / 3628800.0;                  // 1/10!
  p = p * z + 1.0 / 40320.0;                    // 1/8!
  const double tail = (r6.h * z) * p;
  DD s = dd_add_d(DD{-r2.h * 0.5, -r2.l * 0.5}, 1.0);
  s = dd_add(s, dd_div_d(r4, 24.0));
  s = dd_add(s, dd_neg(dd_div_d(r6, 720.0)));
  s = dd_add_d(s, tail);
  return s.h + s.l;
}

TD_DM inline bool is_integer(double y) {  // y finite
  if (fabs_(y) >= 0x1p52) return true;
  return static_cast<double>(static_cast<int64_t>(y)) == y;
}
TD_DM inline bool is_odd_integer(double y) {  // y finite
  if (fabs_(y) >= 0x1p53) return false;
  const auto t = static_cast<int64_t>(y);
  return static_cast<double>(t) == y && (t & 1);
}

}  // namespace

// ============================================================================================================
// double

template <Rnd R>
TD_DM double exp_impl(double x) {
  if (is_nan(x)) return x + x;
  if (x > 709.8) return kInf;
  if (x < -745.2) return 0.0;
  const ExpRed red = exp_reduce(x, 0.0);
  const DD y = exp_kernel(red.r);
  return round_scaled<R>(y.h, y.l, red.k);
}

template <Rnd R>
TD_DM double expm1_impl(double x) {
  if (is_nan(x)) return x + x;
  if (x == 0) return x;
  if (x > 709.8) return kInf;
  if (x < -38.0) return -1.0;  // e^x < 2^-54.8: -1 + e^x rounds to -1
  if (fabs_(x) < 0x1p-60) return x;
  const ExpRed red = exp_reduce(x, 0.0);
  const DD em = expm1_kernel(red.r);
  if (red.k == 0) return finish<R>(em);
  const DD c = two_sum(1.0, -pow2(-red.k));  // 1 - 2^-k exactly, |k| <= 1024
  const DD y = dd_add(c, em);
  return round_scaled<R>(y.h, y.l, red.k);
}

template <Rnd R>
TD_DM double log_impl(double x) {
  if (is_nan(x)) return x + x;
  if (x < 0) return kNaN;
  if (x == 0) return -kInf;
  if (x == kInf) return x;
  const DD r = log_dd(x);
  return finish<R>(r);
}

template <Rnd R>
TD_DM double log1p_impl(double x) {
  if (is_nan(x)) return x + x;
  if (x == -1.0) return -kInf;
  if (x < -1.0) return kNaN;
  if (x == kInf) return x;
  if (fabs_(x) < 0x1p-60) return x;
  if (x > 0x1p60) {  // log(x) + log1p(1/x), 1/x < 2^-60
    const DD r = dd_add_d(log_dd(x), 1.0 / x);
    return finish<R>(r);
  }
  const DD uu = two_sum(1.0, x);  // 1 + x exactly
  const DD L = log_dd(uu.h);
  // log(1 + x) = log(uh) + log(1 + c), c = ul / uh, |c| <= 2^-53
  const double ch = uu.l / uu.h;
  const DD pc = two_prod(ch, uu.h);
  const double cl = ((uu.l - pc.h) - pc.l) / uu.h;
  const DD c = fast_two_sum(ch, cl - 0.5 * ch * ch);
  const DD r = dd_add(L, c);
  return finish<R>(r);
}

template <Rnd R>
TD_DM double tanh_impl(double x) {
  if (is_nan(x)) return x + x;
  const double a = fabs_(x);
  if (a > 22.0) return copysign_(1.0, x);  // 1 - tanh(22) < 2^-62
  if (a < 0x1p-28) return x;               // a - a^3/3 rounds to a
  const DD E = expm1_dd(2.0 * a);          // tanh a = E / (E + 2)
  const DD q = dd_div(E, dd_add_d(E, 2.0));
  return copysign_(finish<R>(q), x);
}

template <Rnd R>
TD_DM double sigmoid_impl(double x) {
  if (is_nan(x)) return x + x;
  if (x > 40.0) return 1.0;  // e^-40 < 2^-57
  if (fabs_(x) < 0x1p-60) return 0.5;
  if (x >= 0) {
    const ExpRed red = exp_reduce(-x, 0.0);
    const DD y = exp_kernel(red.r);
    const double s = pow2(red.k);  // k in [-58, 0]
    const DD den = dd_add_d(DD{y.h * s, y.l * s}, 1.0);
    const DD q = dd_div(DD{1.0, 0.0}, den);
    return finish<R>(q);
  }
  if (x < -746.0) return 0.0;
  // x < 0: e^x / (1 + e^x) = 2^k y / (1 + 2^k y)
  const ExpRed red = exp_reduce(x, 0.0);
  const DD y = exp_kernel(red.r);
  DD den{1.0, 0.0};
  if (red.k > -120) {
    const double s = pow2(red.k);
    den = dd_add_d(DD{y.h * s, y.l * s}, 1.0);
  }
  const DD z = dd_div(y, den);
  return round_scaled<R>(z.h, z.l, red.k);
}

template <Rnd R>
TD_DM double silu_impl(double x) {
  if (is_nan(x)) return x + x;
  if (x == 0) return x;
  if (x == -kInf) return -0.0;
  if (x > 40.0) return x;  // x (1 - e^-x) rounds to x
  if (x < -760.0) return -0.0;
  if (fabs_(x) < 0x1p-60) {
    // x/2 + x^2/4: the positive correction only breaks ties of x/2 (subnormal x); scale to keep it visible.
    const double h = x * 0x1p1000 * 0.5;
    return round_scaled<R>(h, fabs_(h) * 0x1p-70, -1000);
  }
  if (x > 0) {
    const ExpRed red = exp_reduce(-x, 0.0);
    const DD y = exp_kernel(red.r);
    const double s = pow2(red.k);
    const DD den = dd_add_d(DD{y.h * s, y.l * s}, 1.0);
    const DD q = dd_div(DD{x, 0.0}, den);
    return finish<R>(q);
  }
  const ExpRed red = exp_reduce(x, 0.0);
  const DD y = exp_kernel(red.r);
  DD den{1.0, 0.0};
  if (red.k > -120) {
    const double s = pow2(red.k);
    den = dd_add_d(DD{y.h * s, y.l * s}, 1.0);
  }
  const DD z = dd_div(dd_mul_d(y, x), den);
  return round_scaled<R>(z.h, z.l, red.k);
}

template <Rnd R>
TD_DM double rsqrt_impl(double x) {
  if (is_nan(x)) return x + x;
  if (x == 0) return 1.0 / x;  // +-inf
  if (x < 0) return kNaN;
  if (x == kInf) return 0.0;
  // Scale into [2^-900, 2^900] by an even power of two so the exact products below cannot under/overflow.
  int sc = 0;
  if (x < 0x1p-900) {
    x *= 0x1p1000;
    sc = 500;
  } else if (x > 0x1p900) {
    x *= 0x1p-1000;
    sc = -500;
  }
  const double s = std::sqrt(x);
  const DD ss = two_prod(s, s);
  const double sl = ((x - ss.h) - ss.l) / (2.0 * s);  // sqrt(x) = s + sl (to ~2^-106)
  const DD q = dd_div(DD{1.0, 0.0}, DD{s, sl});
  const double r = finish<R>(q);
  return sc == 0 ? r : r * pow2(sc);
}

TD_DM double sin(double x) {
  if (is_nan(x)) return x + x;
  if (x == kInf || x == -kInf) return kNaN;
  const double a = fabs_(x);
  if (a < 0x1p-26) return x;
  if (a < 0.78539816339744828) return sin_kernel(DD{x, 0.0});
  DD r;
  switch (reduce_pio2(x, r)) {
    case 0: return sin_kernel(r);
    case 1: return cos_kernel(r);
    case 2: return -sin_kernel(r);
    default: return -cos_kernel(r);
  }
}

TD_DM double cos(double x) {
  if (is_nan(x)) return x + x;
  if (x == kInf || x == -kInf) return kNaN;
  const double a = fabs_(x);
  if (a < 0x1p-27) return 1.0;
  if (a < 0.78539816339744828) return cos_kernel(DD{x, 0.0});
  DD r;
  switch (reduce_pio2(x, r)) {
    case 0: return cos_kernel(r);
    case 1: return -sin_kernel(r);
    case 2: return -cos_kernel(r);
    default: return sin_kernel(r);
  }
}

TD_DM double pow(double b, double e) {
  // C99 Annex F special cases.
  if (e == 0) return 1.0;
  if (b == 1.0) return 1.0;
  if (is_nan(b) || is_nan(e)) return b + e;
  const bool e_inf = e == kInf || e == -kInf;
  if (e_inf) {
    const double ab = fabs_(b);
    if (ab == 1.0) return 1.0;
    return ((ab > 1.0) == (e > 0)) ? kInf : 0.0;
  }
  const bool odd = is_odd_integer(e);
  if (b == 0) {
    if (e < 0) return odd ? copysign_(kInf, b) : kInf;
    return odd ? b : 0.0;
  }
  if (b == -kInf) {
    if (e < 0) return odd ? -0.0 : 0.0;
    return odd ? -kInf : kInf;
  }
  if (b == kInf) return e < 0 ? 0.0 : kInf;
  double sign = 1.0;
  if (b < 0) {
    if (!is_integer(e)) return kNaN;
    if (odd) sign = -1.0;
    b = -b;
    if (b == 1.0) return sign;  // (-1)^integer
  }
  const DD L = log_dd(b);
  if (fabs_(e) > 0x1p64) {  // |log b| >= ~2^-53 for b != 1: |e log b| > 2^11, certain over/underflow
    return sign * (((L.h > 0) == (e > 0)) ? kInf : 0.0);
  }
  DD y = two_prod(e, L.h);
  y.l += e * L.l;
  y = fast_two_sum(y.h, y.l);
  if (y.h > 709.8) return sign * kInf;
  if (y.h < -745.2) return sign * 0.0;
  const ExpRed red = exp_reduce(y.h, y.l);
  const DD z = exp_kernel(red.r);
  return sign * round_scaled<Rnd::kNearest>(z.h, z.l, red.k);
}

TD_DM double exp(double x) { return exp_impl<Rnd::kNearest>(x); }
TD_DM double expm1(double x) { return expm1_impl<Rnd::kNearest>(x); }
TD_DM double log(double x) { return log_impl<Rnd::kNearest>(x); }
TD_DM double log1p(double x) { return log1p_impl<Rnd::kNearest>(x); }
TD_DM double tanh(double x) { return tanh_impl<Rnd::kNearest>(x); }
TD_DM double sigmoid(double x) { return sigmoid_impl<Rnd::kNearest>(x); }
TD_DM double silu(double x) { return silu_impl<Rnd::kNearest>(x); }
TD_DM double rsqrt(double x) { return rsqrt_impl<Rnd::kNearest>(x); }

// ============================================================================================================
// float. Correctly rounded, in two stages (Ziv's strategy):
//  1. a fast plain-double evaluation with a relative error < 2^-47 (bounds in docs/numerics.md); if that double
//     is more than 256 double ulps (>= 2^-45 relative) away from every float rounding boundary, the exact value
//     rounds to the same float, so rounding the double is the correctly rounded result;
//  2. otherwise (about 2^-20 of the inputs, and every special / subnormal case) the double-double algorithm
//     above, rounded to odd in double and then to float (see Rnd), which is correctly rounded as well.
// Both stages give the correctly rounded float, so the result does not depend on which stage answered.

namespace {

// True if d (a normal double with |d| >= 2^-126) is more than 256 double ulps from a float midpoint.
TD_DM inline bool float_rounding_safe(double d) {
  if (!(fabs_(d) >= 0x1p-126)) return false;  // float subnormal range (other rounding position), zero, NaN
  const auto low = static_cast<int64_t>(bits(d) & ((1ull << 29) - 1));  // the 29 bits a float drops
  const int64_t dist = low - (int64_t{1} << 28);                      // distance to the midpoint pattern
  return dist > 256 || dist < -256;
}

// exp_fast without its last step: exp(x) = y * 2^kd, returns y and sets kd (an integer, as a double). D is double, or
// on the host a GCC vector of doubles (exp_n): the same operations per lane.
template <class D>
TD_DM TD_DM_FORCE_INLINE inline D exp_fast_reduced(D x, D& kd) {
  const D t = x * kInvLn2;
  kd = (t + 0x1.8p52) - 0x1.8p52;  // nearest_int(t)
  const D r = (x - kd * kLn2_0) - kd * kLn2_1;  // first difference exact; |r| <= 0.3466
  D p = D{} + kInvFact[13];  // kInvFact[13] (in D's shape)
  TD_DM_UNROLL
  for (int n = 12; n >= 2; --n) p = p * r + kInvFact[n];  // truncation < 2^-57
  return 1.0 + (r + (r * r) * p);
}

}  // namespace

// Stage 1 (plain double); domains and error bounds in reference/dmath_detail.h.
namespace detail {

TD_DM double exp_fast(double x) {  // relative error < 2^-51
  double kd;
  const double y = exp_fast_reduced(x, kd);
  return y * pow2(static_cast<int>(kd));
}

TD_DM double expm1_fast(double x) {  // relative error < 2^-50
  const double kd = nearest_int(x * kInvLn2);  // -1, 0 or 1
  const double r = (x - kd * kLn2_0) - kd * kLn2_1;
  double p = kInvFact[13];
  for (int n = 12; n >= 2; --n) p = p * r + kInvFact[n];
  const double em = r + (r * r) * p;
  if (kd == 0) return em;
  const double s = pow2(static_cast<int>(kd));
  return s * (em + (1.0 - 1.0 / s));  // 2^k (1 + em) - 1, |em + 1 - 2^-k| >= 0.2
}

TD_DM double log_fast(double x) {  // relative error < 2^-50.5
  const uint64_t u = bits(x);  // float inputs are normal doubles
  int e = static_cast<int>(u >> 52) - 1023;
  const uint64_t mant = u & ((1ull << 52) - 1);
  double m;
  if (mant > 0x6a09e667f3bcdull) {
    m = from_bits(mant | (1022ull << 52));
    e += 1;
  } else {
    m = from_bits(mant | (1023ull << 52));
  }
  const double f = m - 1.0;        // exact
  const double s = f / (2.0 + f);  // relative error < 2^-52
  const double z = s * s;          // |s| <= 0.1716, z <= 0.0295
  double p = 1.0 / 23;             // truncation after s^23 / 23: < 2^-58 relative
  for (int d = 21; d >= 3; d -= 2) p = p * z + 1.0 / d;
  const double s2 = 2.0 * s;
  const double logm = s2 + s2 * (z * p);  // 2 atanh(s)
  const double ed = e;
  return ed * kLn2_0 + (ed * kLn2_1 + logm);  // e ln2 exact in its first part; |result| >= 0.34 if e != 0
}

TD_DM double tanh_fast(double x) {  // relative error < 2^-49.5
  const double a = fabs_(x);
  double t;
  if (a <= 0.5) {
    const double E = expm1_fast(2.0 * a);
    t = E / (E + 2.0);
  } else {
    const double e = exp_fast(-2.0 * a);  // <= 0.37: no cancellation in 1 - e
    t = (1.0 - e) / (1.0 + e);
  }
  return copysign_(t, x);
}

TD_DM double sigmoid_fast(double x) {  // relative error < 2^-50
  if (x >= 0) return 1.0 / (1.0 + exp_fast(-x));
  const double e = exp_fast(x);
  return e / (1.0 + e);
}

TD_DM double silu_fast(double x) { return x * sigmoid_fast(x); }  // relative error < 2^-49.5

TD_DM double rsqrt_fast(double x) { return 1.0 / std::sqrt(x); }  // two roundings: relative error < 2^-52

}  // namespace detail

TD_DM float exp(float xf) {
  const double x = xf;
  if (x > -104.0 && x < 89.0) {
    const double d = detail::exp_fast(x);
    if (float_rounding_safe(d)) return static_cast<float>(d);
  }
  return static_cast<float>(exp_impl<Rnd::kOdd>(x));
}

TD_DM float expm1(float x) { return static_cast<float>(expm1_impl<Rnd::kOdd>(static_cast<double>(x))); }

TD_DM float log(float xf) {
  const double x = xf;
  if (x > 0 && x <= 0x1.fffffep127) {
    const double d = detail::log_fast(x);
    if (float_rounding_safe(d)) return static_cast<float>(d);
  }
  return static_cast<float>(log_impl<Rnd::kOdd>(x));
}

TD_DM float log1p(float x) { return static_cast<float>(log1p_impl<Rnd::kOdd>(static_cast<double>(x))); }

TD_DM float tanh(float xf) {
  const double x = xf;
  const double a = fabs_(x);
  if (a >= 0x1p-20 && a <= 9.5) {
    const double t = detail::tanh_fast(x);
    if (float_rounding_safe(t)) return static_cast<float>(t);
  }
  return static_cast<float>(tanh_impl<Rnd::kOdd>(x));
}

TD_DM float sigmoid(float xf) {
  const double x = xf;
  if (fabs_(x) <= 104.0) {
    const double d = detail::sigmoid_fast(x);
    if (float_rounding_safe(d)) return static_cast<float>(d);
  }
  return static_cast<float>(sigmoid_impl<Rnd::kOdd>(x));
}

TD_DM float silu(float xf) {
  const double x = xf;
  if (fabs_(x) <= 104.0) {
    const double d = detail::silu_fast(x);
    if (float_rounding_safe(d)) return static_cast<float>(d);
  }
  return static_cast<float>(silu_impl<Rnd::kOdd>(x));
}

TD_DM float rsqrt(float xf) {
  const double x = xf;
  if (x > 0 && x <= 0x1.fffffep127) {
    const double d = detail::rsqrt_fast(x);
    if (float_rounding_safe(d)) return static_cast<float>(d);
  }
  return static_cast<float>(rsqrt_impl<Rnd::kOdd>(x));
}

#ifdef TRIDENT_DM_HOST
// ------------------------------------------------------------------------------------------------------------
// Array forms (host only). exp_n: per block of 64 elements, the fast stage of exp(float) for every element at once
// (SIMD across elements; each element the same operations as exp_fast, whose last step, the exact scaling by 2^kd,
// takes the power of two from kd's bits instead of pow2's branch: the same double for every kd of the domain), then
// exp() itself for each element the fast stage does not settle (outside the domain, or too near a rounding
// boundary). So every element gets exp()'s bits. Compiled for the baseline ISA and, on x86-64, for AVX2 and
// AVX-512F (target attributes, no FMA: -ffp-contract=off), following the GEMM's choice (gemm_isa()). GCC only (its
// vector extensions); other compilers call exp() per element.
namespace {

#if defined(__GNUC__) && !defined(__clang__)
// 8 lanes of GCC vectors: the compiler maps them onto the target's registers (4 SSE2, 2 AVX2 or 1 AVX-512
// register); every lane is one element's own computation. The lane helpers take and give vectors by reference (a
// vector argument or result would change the baseline copy's ABI).
typedef double VD __attribute__((vector_size(64)));
typedef int64_t VI __attribute__((vector_size(64)));
typedef float VF __attribute__((vector_size(32)));

// y = exp_fast(x) per lane: exp_fast_reduced, then 2^kd from kd's bits (kd + 1.5 * 2^52 holds kd in its low
// mantissa bits; + 1023 and << 52 leave the biased exponent).
[[gnu::always_inline]] inline void exp_fast_lanes(const VD& x, VD& y) {
  VD kd;
  const VD r = exp_fast_reduced(x, kd);
  y = r * (VD)((((VI)(kd + 0x1.8p52)) + 1023) << 52);
}

// ok = dom & float_rounding_safe(d) per lane: |d| >= 2^-126 and the 29 bits a float drops more than 256 away from
// the midpoint pattern.
[[gnu::always_inline]] inline void settles(const VD& d, const VI& dom, VI& ok) {
  const VI db = (VI)d;
  const VI normal = (VD)(db & INT64_MAX) >= 0x1p-126;
  const VI dist = (db & ((int64_t{1} << 29) - 1)) - (int64_t{1} << 28);
  ok = dom & normal & ((dist > 256) | (dist < -256));
}

[[gnu::always_inline]] inline void exp_n_body(const float* x, float* y, int64_t n) {
  constexpr int64_t kB = 64, kL = 8;
  float in[kB], out[kB];
  int64_t settled[kB];
  for (int64_t b0 = 0; b0 < n; b0 += kB) {
    const int64_t len = n - b0 < kB ? n - b0 : kB;
    for (int64_t i = 0; i < len; ++i) in[i] = x[b0 + i];  // y may be x
    for (int64_t i = len; i < (len + kL - 1) / kL * kL; ++i) in[i] = 0.0f;
    for (int64_t i = 0; i < len; i += kL) {
      VF xf;
      std::memcpy(&xf, in + i, sizeof xf);
      const VD v = __builtin_convertvector(xf, VD);
      const VI dom = (v > -104.0) & (v < 89.0);
      // Outside the domain (NaN too) the lane runs the fast stage on a clamped value; its result is not used.
      const VD lo = v < -104.0 ? VD{} - 104.0 : v;
      const VD vs = lo > 89.0 ? VD{} + 89.0 : lo;
      VD d;
      exp_fast_lanes(vs, d);
      VI ok;
      settles(d, dom, ok);
      const VF f = __builtin_convertvector(d, VF);
      std::memcpy(out + i, &f, sizeof f);
      std::memcpy(settled + i, &ok, sizeof ok);
    }
    for (int64_t i = 0; i < len; ++i) y[b0 + i] = settled[i] ? out[i] : exp(in[i]);
  }
}

// sigmoid_n, silu_n and their fused form: per block of 64 elements, sigmoid_fast and silu_fast for every element at
// once, each lane the same double operations as the scalar functions (exp_fast(-|x|) as in exp_n, then
// 1 / (1 + e) for x >= 0 and e / (1 + e) otherwise, silu x times that), then sigmoid() / silu() itself for each
// element the fast stage does not settle (|x| > 104, NaN, or too near a rounding boundary). So every element gets the
// scalar function's bits. sg or si may be null (not wanted); either may be x.
[[gnu::always_inline]] inline void sigmoid_silu_n_body(const float* x, float* sg, float* si, int64_t n) {
  constexpr int64_t kB = 64, kL = 8;
  float in[kB], out_sg[kB], out_si[kB];
  int64_t ok_sg[kB], ok_si[kB];
  for (int64_t b0 = 0; b0 < n; b0 += kB) {
    const int64_t len = n - b0 < kB ? n - b0 : kB;
    for (int64_t i = 0; i < len; ++i) in[i] = x[b0 + i];  // the outputs may be x
    for (int64_t i = len; i < (len + kL - 1) / kL * kL; ++i) in[i] = 0.0f;
    for (int64_t i = 0; i < len; i += kL) {
      VF xf;
      std::memcpy(&xf, in + i, sizeof xf);
      const VD v = __builtin_convertvector(xf, VD);
      const VD a = (VD)((VI)v & INT64_MAX);  // |x|
      const VI dom = a <= 104.0;             // NaN: not in the domain
      const VD na = -(a <= 104.0 ? a : VD{} + 104.0);  // outside the domain a clamped value; its result is not used
      VD e;
      exp_fast_lanes(na, e);  // exp_fast(-|x|)
      const VD one = VD{} + 1.0;
      const VD d = v >= 0.0 ? one / (one + e) : e / (one + e);  // sigmoid_fast(x)
      VI ok;
      if (sg) {
        settles(d, dom, ok);
        const VF f = __builtin_convertvector(d, VF);
        std::memcpy(out_sg + i, &f, sizeof f);
        std::memcpy(ok_sg + i, &ok, sizeof ok);
      }
      if (si) {
        const VD dl = v * d;  // silu_fast(x)
        settles(dl, dom, ok);
        const VF f = __builtin_convertvector(dl, VF);
        std::memcpy(out_si + i, &f, sizeof f);
        std::memcpy(ok_si + i, &ok, sizeof ok);
      }
    }
    if (sg)
      for (int64_t i = 0; i < len; ++i) sg[b0 + i] = ok_sg[i] ? out_sg[i] : sigmoid(in[i]);
    if (si)
      for (int64_t i = 0; i < len; ++i) si[b0 + i] = ok_si[i] ? out_si[i] : silu(in[i]);
  }
}
#else  // other compilers: element by element
inline void exp_n_body(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = exp(x[i]);
}
inline void sigmoid_silu_n_body(const float* x, float* sg, float* si, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float xi = x[i];
    if (sg) sg[i] = sigmoid(xi);
    if (si) si[i] = silu(xi);
  }
}
#endif

void exp_n_baseline(const float* x, float* y, int64_t n) { exp_n_body(x, y, n); }
void sigmoid_silu_n_baseline(const float* x, float* sg, float* si, int64_t n) { sigmoid_silu_n_body(x, sg, si, n); }
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TRIDENT_DM_DISPATCH 1
[[gnu::target("avx2")]] void exp_n_avx2(const float* x, float* y, int64_t n) { exp_n_body(x, y, n); }
[[gnu::target("avx512f")]] void exp_n_avx512(const float* x, float* y, int64_t n) { exp_n_body(x, y, n); }
[[gnu::target("avx2")]] void sigmoid_silu_n_avx2(const float* x, float* sg, float* si, int64_t n) {
  sigmoid_silu_n_body(x, sg, si, n);
}
[[gnu::target("avx512f")]] void sigmoid_silu_n_avx512(const float* x, float* sg, float* si, int64_t n) {
  sigmoid_silu_n_body(x, sg, si, n);
}
#endif

}  // namespace

void exp_n(const float* x, float* y, int64_t n) {
#ifdef TRIDENT_DM_DISPATCH
  switch (gemm_isa()) {
    case GemmIsa::avx512: return exp_n_avx512(x, y, n);
    case GemmIsa::avx2: return exp_n_avx2(x, y, n);
    case GemmIsa::baseline: break;
  }
#endif
  exp_n_baseline(x, y, n);
}

void exp_n(const double* x, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = exp(x[i]);
}

void sigmoid_silu_n(const float* x, float* sg, float* si, int64_t n) {
#ifdef TRIDENT_DM_DISPATCH
  switch (gemm_isa()) {
    case GemmIsa::avx512: return sigmoid_silu_n_avx512(x, sg, si, n);
    case GemmIsa::avx2: return sigmoid_silu_n_avx2(x, sg, si, n);
    case GemmIsa::baseline: break;
  }
#endif
  sigmoid_silu_n_baseline(x, sg, si, n);
}

void sigmoid_silu_n(const double* x, double* sg, double* si, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double xi = x[i];
    if (sg) sg[i] = sigmoid(xi);
    if (si) si[i] = silu(xi);
  }
}
#endif  // TRIDENT_DM_HOST

}  // namespace trident::dm
