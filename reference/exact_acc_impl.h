// Implementation detail of reference/exact_acc.h: the fixed-point superaccumulator.
//
// Representation (docs/numerics.md, "Exact accumulator"). A value v is the integer
//     sum_i limb[i] * 2^(D i)      in units of the smallest subnormal of T (2^-149 float, 2^-1074 double),
// with int64 limbs that nominally hold D-bit digits (D = 48 for float, 32 for double) and the rest of the int64 as
// carry headroom, the top limb signed and holding carries only. add(x) splits x = +-M * 2^p (M the integer
// significand, p >= 0 its position in those units) into D-bit digit pieces and adds them to 2 (float) or 3 (double)
// limbs: one shift and a few integer adds, no carry chain. A counter normalises (propagates carries, leaving limbs
// 0..n-2 in [0, 2^D)) before any limb could overflow; normalisation never changes the value. round() normalises a
// copy, takes the magnitude and rounds it once, correctly (RNE), to T.
//
// Required interface (both T): kBytes, ExactAcc(), add(T), merge(const ExactAcc&), round(), is_zero();
// ExactAcc<double> additionally add(float) (exact widening).
// Wire format: the object's bytes (little-endian x86-64): the digit limbs limb[kLimbs-1] (int64), then double: the
// top limb (int64), count (uint32), flags (uint32); float: one int64 head = top * 2^24 + count * 2^3 + flags.
#pragma once
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "reference/hd.h"

// Full unrolling of the short fixed-length carry loops of round() (GCC leaves them rolled at -O2); the same
// operations in the same order, so the same bits. Not for nvcc or clang, whose pragmas differ.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define TD_EXACT_UNROLL _Pragma("GCC unroll 16")
#else
#define TD_EXACT_UNROLL
#endif

namespace trident {
namespace detail {

template <class T>
struct ExactAccTraits;
template <>
struct ExactAccTraits<float> {
  using Bits = uint32_t;
  static constexpr int kMant = 24;        // significand bits incl. the implicit one
  static constexpr int kExpBits = 8;
  static constexpr int kDigit = 48;       // digit bits per limb
  // Positions 0..253 (+ a 71-bit shifted significand) -> digit limbs 0..5 receive adds (limb 5's upper piece is 0 or
  // -1: there the shift is <= 13); the top limb (2^288 units and up) holds carries only. It shares one int64 with
  // the counter and the flags (kPackedHead): top limb * 2^24 + count * 2^3 + flags, so the top limb has 40 bits
  // and the sum of up to ~2^50 maximal terms stays representable.
  static constexpr int kLimbs = 7;
  static constexpr bool kPackedHead = true;
  static constexpr uint32_t kNormEvery = 1u << 14;  // each add moves a limb by < 2^48; 2^14 * 2^48 < 2^63
  static constexpr uint32_t kMaxReserve = 1u << 12;  // reserve_adds(n): n at most this
};
template <>
struct ExactAccTraits<double> {
  using Bits = uint64_t;
  static constexpr int kMant = 53;
  static constexpr int kExpBits = 11;
  static constexpr int kDigit = 32;
  // Positions 0..2045 (+ 84-bit shifted significand) -> limbs 0..65 receive adds; 66..67 carries only.
  static constexpr int kLimbs = 68;
  static constexpr bool kPackedHead = false;  // the top limb a whole int64, then count and flags (uint32 each)
  static constexpr uint32_t kNormEvery = 1u << 29;  // the middle digit of an add is < 2^33
  static constexpr uint32_t kMaxReserve = 1u << 20;
};

// The accumulator's words: the digit limbs 0..kLimbs-2, then its head: the top limb, the add counter and the special
// flags, either as three fields (int64, uint32, uint32) or packed into one int64 (kPackedHead).
template <class T, bool kPacked = ExactAccTraits<T>::kPackedHead>
struct ExactAccWords;
template <class T>
struct ExactAccWords<T, false> {
  static constexpr int64_t kTopMin = std::numeric_limits<int64_t>::min(), kTopMax = std::numeric_limits<int64_t>::max();
  int64_t limb_[ExactAccTraits<T>::kLimbs - 1] = {};
  int64_t top_ = 0;
  uint32_t count_ = 0;
  uint32_t flags_ = 0;
  TD_HD int64_t top() const { return top_; }
  TD_HD void add_top(int64_t c) { top_ += c; }
  TD_HD uint32_t count() const { return count_; }
  TD_HD void add_count(uint32_t n) { count_ += n; }
  TD_HD void set_count(uint32_t n) { count_ = n; }
  TD_HD uint32_t flag_bits() const { return flags_; }
  TD_HD void or_flags(uint32_t f) { flags_ |= f; }
  TD_HD void set_head(int64_t top, uint32_t count, uint32_t flags) { top_ = top, count_ = count, flags_ = flags; }
  TD_HD void merge_head(const ExactAccWords& o) {  // top limbs and counters added, flags or-ed
    top_ += o.top_;
    count_ += o.count_;
    flags_ |= o.flags_;
  }
};
template <class T>
struct ExactAccWords<T, true> {
  // head_ = top * 2^24 + count * 2^3 + flags: top in [-2^39, 2^39), count < 2^21 (in use: < 2^15), flags < 8.
  static constexpr int kTopShift = 24, kCountShift = 3;
  static constexpr int64_t kTopMin = -(int64_t{1} << 39), kTopMax = (int64_t{1} << 39) - 1;
  static constexpr int64_t kCountMask = ((int64_t{1} << 21) - 1) << kCountShift;
  int64_t limb_[ExactAccTraits<T>::kLimbs - 1] = {};
  int64_t head_ = 0;
  TD_HD int64_t top() const { return head_ >> kTopShift; }  // arithmetic shift
  TD_HD void add_top(int64_t c) { head_ += static_cast<int64_t>(static_cast<uint64_t>(c) << kTopShift); }
  TD_HD uint32_t count() const { return static_cast<uint32_t>((head_ & kCountMask) >> kCountShift); }
  TD_HD void add_count(uint32_t n) { head_ += static_cast<int64_t>(n) << kCountShift; }
  TD_HD void set_count(uint32_t n) { head_ = (head_ & ~kCountMask) | (static_cast<int64_t>(n) << kCountShift); }
  TD_HD uint32_t flag_bits() const { return static_cast<uint32_t>(head_ & 7); }
  TD_HD void or_flags(uint32_t f) { head_ |= static_cast<int64_t>(f); }
  TD_HD void set_head(int64_t top, uint32_t count, uint32_t flags) {
    head_ = static_cast<int64_t>(static_cast<uint64_t>(top) << kTopShift) |
            (static_cast<int64_t>(count) << kCountShift) | static_cast<int64_t>(flags);
  }
  TD_HD void merge_head(const ExactAccWords& o) {  // top and count fields add without carrying out; flags or-ed
    head_ = ((head_ & ~int64_t{7}) + (o.head_ & ~int64_t{7})) | ((head_ | o.head_) & 7);
  }
};

template <class T>
class ExactAccCore : protected ExactAccWords<T> {
  using W = ExactAccWords<T>;

 public:
  using Tr = ExactAccTraits<T>;
  using Bits = typename Tr::Bits;
  static constexpr int kLimbs = Tr::kLimbs;
  static constexpr int kDigit = Tr::kDigit;
  static constexpr uint32_t kMaxReserve = Tr::kMaxReserve;
  // The top limb's range (the accumulator's range is [kTopMin, kTopMax + 1) * 2^(D (kLimbs-1)) units).
  static constexpr int64_t kTopMin = W::kTopMin, kTopMax = W::kTopMax;
  static constexpr uint32_t kNaN = 1, kPosInf = 2, kNegInf = 4;

  // Becomes the canonical accumulator (count 1, as normalize() leaves it) of digit limbs dig[0..kLimbs-2] in
  // [0, 2^D), the top limb top (in [kTopMin, kTopMax]) and the flags.
  TD_HD void set_canonical(const int64_t* dig, int64_t top, uint32_t flags) {
    for (int i = 0; i < kLimbs - 1; ++i) this->limb_[i] = dig[i];
    this->set_head(top, 1, flags);
  }

  // Exact merge: limbwise integer addition (associative, commutative).
  TD_HD void merge(const ExactAccCore& o) {
    if (this->count() + uint64_t{o.count()} >= Tr::kNormEvery) [[unlikely]] {
      ExactAccCore t = o;
      t.normalize();
      normalize();
      add_words(t);  // count 1 + 1
      return;
    }
    add_words(o);
  }

  // Correctly rounded (RNE) value; specials per exact_acc.h.
  TD_HD T round() const {
    const uint32_t flags = this->flag_bits();
    if (flags != 0) [[unlikely]] {
      if (round_is_nan())
        return std::numeric_limits<T>::quiet_NaN();
      return (flags & kPosInf) ? std::numeric_limits<T>::infinity() : -std::numeric_limits<T>::infinity();
    }
    if constexpr (kLimbs <= 32) {
      return round_small();
    } else {
      // All limbs (the digits, then the top) in one array.
      int64_t t[kLimbs];
      for (int i = 0; i < kLimbs - 1; ++i) t[i] = this->limb_[i];
      t[kLimbs - 1] = this->top();
      normalize_array(t);
      const bool neg = t[kLimbs - 1] < 0;
      if (neg) {
        for (int i = 0; i < kLimbs; ++i) t[i] = -t[i];
        normalize_array(t);
      }
      // Magnitude: digits t[0..n-2] in [0, 2^D), top limb >= 0.
      int top = kLimbs - 1;
      while (top >= 0 && t[top] == 0) --top;
      if (top < 0) return T(0);  // exact zero -> +0
      const T inf = neg ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity();
      const uint64_t topd = static_cast<uint64_t>(t[top]);
      if (top == kLimbs - 1 && topd >> kDigit != 0) return inf;
      const int P = kDigit * top + (63 - std::countl_zero(topd));  // position of the leading one
      return round_magnitude([&](int j) -> uint64_t { return j < kLimbs ? static_cast<uint64_t>(t[j]) : 0; }, P, neg,
                             [&](int hi) {
                               for (int i = 0; i < hi; ++i)
                                 if (t[i] != 0) return true;
                               return false;
                             });
    }
  }

  // True when no special value was seen and the exact sum is zero.
  TD_HD bool is_zero() const {
    if (this->flag_bits() != 0) return false;
    ExactAccCore t = *this;
    t.normalize();
    for (int i = 0; i < kLimbs; ++i)
      if (t.limb(i) != 0) return false;
    return true;
  }

  // Special-value flags seen so far (kNaN | kPosInf | kNegInf).
  TD_HD uint32_t flags() const { return this->flag_bits(); }

  // Announces n (<= kMaxReserve: 2^12 float, 2^20 double) following add_unchecked() calls: normalises first if the
  // limbs could overflow.
  TD_HD void reserve_adds(uint32_t n) {
    if (this->count() + uint64_t{n} >= Tr::kNormEvery) [[unlikely]] normalize();
    this->add_count(n);
  }

  // Carry propagation; keeps the value, leaves limbs 0..n-2 in [0, 2^D).
  TD_HD void normalize() {
    int64_t c = 0;
    for (int i = 0; i < kLimbs - 1; ++i) {
      const int64_t u = this->limb_[i] + c;
      c = u >> kDigit;  // arithmetic shift (floor)
      this->limb_[i] = u - c * (int64_t{1} << kDigit);
    }
    this->add_top(c);
    this->set_count(1);
  }

  // Limb access for tests and docs (value = sum limb(i) * 2^(D i) units; limb kLimbs-1 is the top limb).
  TD_HD int64_t limb(int i) const { return i < kLimbs - 1 ? this->limb_[i] : this->top(); }

 protected:
  TD_HD void add_words(const ExactAccCore& o) {
    for (int i = 0; i < kLimbs - 1; ++i) this->limb_[i] += o.limb_[i];
    this->merge_head(o);
  }
  TD_HD static void normalize_array(int64_t* t) {
    for (int i = 0; i < kLimbs - 1; ++i) {
      const int64_t c = t[i] >> kDigit;  // arithmetic shift (floor)
      t[i] -= c * (int64_t{1} << kDigit);
      t[i + 1] += c;
    }
  }
  // round() for finite sums of the narrow accumulator (float: 7 limbs with the top), with its branches taken out:
  // the magnitude comes from one normalisation and a two's-complement negation selected by a mask (not a second
  // normalisation behind a sign branch that gradients take at random), and a bit mask of the nonzero digits gives
  // the leading digit and the sticky bit (no scans). The magnitude's digits are the same canonical digits as in
  // round()'s general path (the normalised form is unique), so the bits are the same.
  TD_HD T round_small() const {
    constexpr int64_t kLo = (int64_t{1} << kDigit) - 1;
    // Normalise: digits d[0..n-2] in [0, 2^D), d[n-1] signed (normalize()'s carries, on a copy).
    int64_t d[kLimbs];
    int64_t c = 0;
    TD_EXACT_UNROLL
    for (int i = 0; i < kLimbs - 1; ++i) {
      const int64_t u = this->limb_[i] + c;
      d[i] = u & kLo;
      c = u >> kDigit;  // arithmetic shift (floor)
    }
    d[kLimbs - 1] = this->top() + c;
    // |V|: V itself, or -V = ~V + 1 (each low digit 2^D-1-d, the top ~d, then +1 carried up), by the sign mask.
    const int64_t s = d[kLimbs - 1] >> 63;  // 0, or -1 when V < 0
    uint64_t m[kLimbs];
    uint32_t nz = 0;  // bit i: digit i of |V| is nonzero
    int64_t cy = s & 1;
    TD_EXACT_UNROLL
    for (int i = 0; i < kLimbs - 1; ++i) {
      const int64_t u = (d[i] ^ (s & kLo)) + cy;
      m[i] = static_cast<uint64_t>(u & kLo);
      cy = u >> kDigit;
      nz |= static_cast<uint32_t>(m[i] != 0) << i;
    }
    m[kLimbs - 1] = static_cast<uint64_t>((d[kLimbs - 1] ^ s) + cy);
    nz |= static_cast<uint32_t>(m[kLimbs - 1] != 0) << (kLimbs - 1);
    const bool neg = s != 0;
    if (nz == 0) return T(0);  // exact zero -> +0
    const T inf = neg ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity();
    const int top = 31 - std::countl_zero(nz);
    if (top == kLimbs - 1 && m[top] >> kDigit != 0) return inf;
    const int P = kDigit * top + (63 - std::countl_zero(m[top]));  // position of the leading one
    return round_magnitude([&](int j) -> uint64_t { return j < kLimbs ? m[j] : 0; }, P, neg,
                           [&](int hi) { return (nz & ((1u << hi) - 1)) != 0; });
  }
  // The correctly rounded (RNE) T of +-|V| (sign neg), |V| != 0 given by its canonical D-bit digits dig(j) (0 beyond
  // the top) with its leading one at position P; below(hi): whether any digit below digit hi is nonzero.
  template <class Dig, class Below>
  TD_HD static T round_magnitude(Dig dig, int P, bool neg, Below below) {
    constexpr Bits kInfBits = std::bit_cast<Bits>(std::numeric_limits<T>::infinity());
    constexpr Bits kSign = Bits{1} << (sizeof(T) * 8 - 1);
    const T inf = neg ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity();
    Bits bits;
    if (P < Tr::kMant) {
      // Fewer than kMant significant bits: exactly representable; for these the integer in units of the
      // smallest subnormal IS the bit pattern (subnormals, and biased exponent 1 with the implicit bit).
      bits = static_cast<Bits>(window_of(dig, 0));
    } else {
      const int shift = P - (Tr::kMant - 1);  // >= 1
      if (shift >= (1 << Tr::kExpBits)) return inf;
      uint64_t q = window_of(dig, shift) & ((uint64_t{1} << Tr::kMant) - 1);
      const int hpos = shift - 1, hi = hpos / kDigit, hb = hpos % kDigit;
      const bool half = (dig(hi) >> hb) & 1;
      const bool sticky = (dig(hi) & ((uint64_t{1} << hb) - 1)) != 0 || below(hi);
      q += (half && (sticky || (q & 1))) ? 1 : 0;
      // (shift << (kMant-1)) + q encodes q * 2^shift units; a rounding carry to 2^kMant bumps the exponent.
      const uint64_t b = (static_cast<uint64_t>(shift) << (Tr::kMant - 1)) + q;
      if (b >= kInfBits) return inf;
      bits = static_cast<Bits>(b);
    }
    if (neg) bits |= kSign;
    return std::bit_cast<T>(bits);
  }
  TD_HD bool round_is_nan() const {
    const uint32_t f = this->flag_bits();
    return (f & kNaN) || (f & (kPosInf | kNegInf)) == (kPosInf | kNegInf);
  }
  // Special operand (exponent all ones): record its flag.
  TD_HD void add_special(Bits u, Bits mant) {
    constexpr Bits kSign = Bits{1} << (sizeof(T) * 8 - 1);
    this->or_flags(mant ? kNaN : ((u & kSign) ? kNegInf : kPosInf));
  }
  TD_HD void bump() {
    this->add_count(1);
    if (this->count() >= Tr::kNormEvery) [[unlikely]] normalize();
  }
  // The bits of a magnitude given by its canonical D-bit digits dig(j) (0 beyond the top), from bit `pos` up: 64 of
  // them (truncated), of which round() uses the low kMant (<= 53).
  template <class Dig>
  TD_HD static uint64_t window_of(Dig dig, int pos) {
    const int i = pos / kDigit, s = pos % kDigit;
    uint64_t w = dig(i) >> s;
    if (kDigit - s < 64) w |= dig(i + 1) << (kDigit - s);
    if (2 * kDigit - s < 64) w |= dig(i + 2) << (2 * kDigit - s);
    return w;
  }
};

}  // namespace detail

template <>
class ExactAcc<float> : public detail::ExactAccCore<float> {
 public:
  static constexpr size_t kBytes = sizeof(detail::ExactAccCore<float>);
  ExactAcc() = default;

  // Exact: x = +-M * 2^p units (M < 2^24, p = biased exponent - 1, or 0 for subnormals).
  TD_HD inline void add(float x) {
    add_unchecked(x);
    bump();
  }
  // Hot-loop form: reserve_adds(n) once, then at most n add_unchecked() calls; same value as n add() calls.
  TD_HD inline void add_unchecked(float x) {
    const uint32_t u = std::bit_cast<uint32_t>(x);
    const uint32_t e = (u >> 23) & 0xffu;
    const uint32_t mant = u & 0x7fffffu;
    if (e == 0xffu) [[unlikely]] {
      add_special(u, mant);
      return;
    }
    const int64_t M = static_cast<int64_t>(mant | (e != 0 ? 0x800000u : 0u));
    const uint32_t p = e - (e != 0 ? 1u : 0u);                      // <= 253
    const uint32_t i = p / 48u, sh = p - 48u * i;                   // limb i <= 5, shift < 48
    const int64_t s = -static_cast<int64_t>(u >> 31);              // 0 or -1
    const int64_t v = (M ^ s) - s;                                  // the signed significand, |v| < 2^24
    // v * 2^sh (|.| < 2^71) = hi * 2^48 + lo with lo in [0, 2^48): lo from the product mod 2^64, hi by an arithmetic
    // shift (floor); hi is 0 or -1 for i = 5 (there sh <= 13), so limb 6 receives carries only.
    limb_[i] += static_cast<int64_t>((static_cast<uint64_t>(v) << sh) & 0xffffffffffffull);
    const int64_t hi = v >> (48u - sh);
    if (i + 1 < kLimbs - 1) [[likely]]
      limb_[i + 1] += hi;
    else
      add_top(hi);  // i = 5 (|x| >= 2^91): hi is 0 or -1
  }
  // Exact add of a double x that is an integer multiple of 2^-149 with |x| < 2^139: the exact sum of up to 32 floats
  // when that sum was formed exactly in double (tile_reduce's grouped partials). Counts as one add (reserve_adds).
  // x = +-M * 2^q units (M < 2^53, q <= 235) = +-(lo + mid * 2^48 + hi * 2^96) * 2^(48 i) with lo, mid < 2^48 and
  // hi < 2^5: three digit pieces, each moving its limb by < 2^48 as add_unchecked's two do.
  TD_HD inline void add_unchecked_wide(double x) {
    constexpr uint64_t kLo = (uint64_t{1} << 48) - 1;
    const uint64_t u = std::bit_cast<uint64_t>(x);
    const int e = static_cast<int>((u >> 52) & 0x7ffu);
    if (e == 0) return;  // +-0 (a nonzero multiple of 2^-149 is a normal double)
    uint64_t M = (u & 0xfffffffffffffull) | (uint64_t{1} << 52);
    int q = e - 926;  // x = M * 2^(e - 1075) = M * 2^(e - 926) units of 2^-149
    if (q < 0) {      // below the unit: those low bits of M are zero (x is a multiple of 2^-149)
      M >>= -q;
      q = 0;
    }
    // i <= 4; hi != 0 needs sh >= 44, so for i = 4 (sh <= 43) hi is 0 and the top limb gets nothing.
    const uint32_t i = static_cast<uint32_t>(q) / 48u, sh = static_cast<uint32_t>(q) - 48u * i;
    const int64_t s = -static_cast<int64_t>(u >> 63);  // 0 or -1
    const int64_t lo = static_cast<int64_t>((M << sh) & kLo);
    const uint64_t up = M >> (48u - sh);  // (M * 2^sh) >> 48, < 2^53
    const int64_t mid = static_cast<int64_t>(up & kLo);
    const int64_t hi = static_cast<int64_t>(up >> 48);
    limb_[i] += (lo ^ s) - s;
    limb_[i + 1] += (mid ^ s) - s;
    if (i + 2 < kLimbs - 1)
      limb_[i + 2] += (hi ^ s) - s;
    else
      add_top((hi ^ s) - s);  // i = 4: hi is 0 (kept in bounds)
  }
  TD_HD void merge(const ExactAcc& o) { ExactAccCore::merge(o); }
};

template <>
class ExactAcc<double> : public detail::ExactAccCore<double> {
 public:
  static constexpr size_t kBytes = sizeof(detail::ExactAccCore<double>);
  ExactAcc() = default;

  // Exact: x = +-M * 2^p units (M < 2^53, p = biased exponent - 1, or 0 for subnormals).
  TD_HD inline void add(double x) {
    add_unchecked(x);
    bump();
  }
  // Hot-loop form: reserve_adds(n) once, then at most n add_unchecked() calls; same value as n add() calls.
  TD_HD inline void add_unchecked(double x) {
    const uint64_t u = std::bit_cast<uint64_t>(x);
    const uint64_t e = (u >> 52) & 0x7ffu;
    const uint64_t mant = u & 0xfffffffffffffull;
    if (e == 0x7ffu) [[unlikely]] {
      add_special(u, mant);
      return;
    }
    const uint64_t M = mant | (e != 0 ? (uint64_t{1} << 52) : 0u);
    const uint32_t p = static_cast<uint32_t>(e - (e != 0 ? 1u : 0u));
    const uint32_t sh = p & 31;
    const uint64_t lo = (M & 0xffffffffu) << sh;  // < 2^63
    const uint64_t hi = (M >> 32) << sh;          // < 2^52
    const int64_t d0 = static_cast<int64_t>(lo & 0xffffffffu);
    const int64_t d1 = static_cast<int64_t>((lo >> 32) + (hi & 0xffffffffu));  // < 2^33
    const int64_t d2 = static_cast<int64_t>(hi >> 32);
    const int64_t s = -static_cast<int64_t>(u >> 63);
    const int i = static_cast<int>(p >> 5);
    limb_[i] += (d0 ^ s) - s;
    limb_[i + 1] += (d1 ^ s) - s;
    limb_[i + 2] += (d2 ^ s) - s;
  }
  // Exact widening of a float term.
  TD_HD inline void add(float x) { add(static_cast<double>(x)); }
  TD_HD void merge(const ExactAcc& o) { ExactAccCore::merge(o); }
};

static_assert(sizeof(ExactAcc<float>) == ExactAcc<float>::kBytes && ExactAcc<float>::kBytes == 56);
static_assert(sizeof(ExactAcc<double>) == ExactAcc<double>::kBytes && ExactAcc<double>::kBytes == 552);

}  // namespace trident
