// exact_sum lowered onto i64 sums (parallel/exact_lowering.h), and the Communicator wrappers' use of it.
#include "parallel/exact_lowering.h"

#include <cstring>
#include <memory>

#include "reference/check.h"
#include "reference/exact_acc.h"

namespace trident {
namespace exact_lowering {

#ifndef TRIDENT_PLAIN_ACC
namespace {

constexpr int64_t kDigit = int64_t{1} << 32;
constexpr int kFlagBits = 21;
constexpr int64_t kFlagMask = (int64_t{1} << kFlagBits) - 1;
// Bounds of the words of a sum of at most kMaxContributions packed elements (checked on unpack; any larger
// magnitude means the buffer is not such a sum).
constexpr int64_t kDigitSumMax = kMaxContributions * (kDigit - 1);  // < 2^53
constexpr int64_t kTopSumMax = kMaxContributions * (kDigit / 2);    // < 2^52

// The flag bits of ExactAccCore (1 NaN, 2 +Inf, 4 -Inf) and their counter fields.
constexpr uint32_t kNaN = 1, kPosInf = 2, kNegInf = 4;

template <class T>
constexpr size_t words() {
  return static_cast<size_t>(ExactAcc<T>::kLimbs) + 2;
}

template <class T>
void pack_typed(const ExactAcc<T>* acc, size_t count, int64_t* out) {
  constexpr int L = ExactAcc<T>::kLimbs;
  for (size_t e = 0; e < count; ++e, out += words<T>()) {
    ExactAcc<T> a = acc[e];
    a.normalize();  // limbs 0..L-2 in [0, 2^32), the top limb signed
    for (int i = 0; i < L - 1; ++i) out[i] = a.limb(i);
    const int64_t top = a.limb(L - 1);
    out[L - 1] = top & (kDigit - 1);  // t mod 2^32
    out[L] = top >> 32;               // floor(t / 2^32): arithmetic shift
    const uint32_t f = a.flags();
    out[L + 1] = ((f & kNaN) ? 1 : 0) | ((f & kPosInf) ? int64_t{1} << kFlagBits : 0) |
                 ((f & kNegInf) ? int64_t{1} << (2 * kFlagBits) : 0);
  }
}

template <class T>
void unpack_typed(const int64_t* in, size_t count, ExactAcc<T>* acc) {
  constexpr int L = ExactAcc<T>::kLimbs;
  // The wire format of exact_acc_impl.h: limb[L] (int64), count (uint32), flags (uint32), no padding.
  static_assert(sizeof(ExactAcc<T>) == static_cast<size_t>(L) * 8 + 8);
  struct Image {
    int64_t limb[L];
    uint32_t count;
    uint32_t flags;
  };
  static_assert(sizeof(Image) == sizeof(ExactAcc<T>));
  for (size_t e = 0; e < count; ++e, in += words<T>()) {
    Image im;
    int64_t c = 0;  // carry into digit i, in [0, 2^22)
    for (int i = 0; i < L; ++i) {
      const int64_t d = in[i];
      if (d < 0 || d > kDigitSumMax)
        fail(fmt::format("exact_sum lowering: word {} of element {} is {}, outside [0, {}]: not a sum of at most {} "
                         "packed accumulators",
                         i, e, d, kDigitSumMax, kMaxContributions));
      const int64_t t = d + c;
      im.limb[i] = t & (kDigit - 1);
      c = t >> 32;
    }
    const int64_t hs = in[L];
    if (hs < -kTopSumMax || hs > kTopSumMax)
      fail(fmt::format("exact_sum lowering: word {} of element {} is {}, outside [-{}, {}]: not a sum of at most {} "
                       "packed accumulators",
                       L, e, hs, kTopSumMax, kTopSumMax, kMaxContributions));
    const int64_t hi = hs + c;  // top limb = hi * 2^32 + (t mod 2^32)
    if (hi < -(kDigit / 2) || hi >= kDigit / 2)
      fail(fmt::format("exact_sum lowering: element {}: the exact sum leaves the accumulator's range (its top limb "
                       "would be {} * 2^32 + {}, beyond int64)",
                       e, hi, im.limb[L - 1]));
    im.limb[L - 1] += static_cast<int64_t>(static_cast<uint64_t>(hi) << 32);
    const int64_t f = in[L + 1];
    if (f < 0)  // three 21-bit fields fill bits 0..62
      fail(fmt::format("exact_sum lowering: flag word of element {} is {}: not a sum of at most {} packed "
                       "accumulators",
                       e, f, kMaxContributions));
    im.flags = ((f & kFlagMask) ? kNaN : 0) | (((f >> kFlagBits) & kFlagMask) ? kPosInf : 0) |
               (((f >> (2 * kFlagBits)) & kFlagMask) ? kNegInf : 0);
    im.count = 1;  // what normalize() leaves
    exact_deserialize(reinterpret_cast<const std::byte*>(&im), 1, acc + e);
  }
}

}  // namespace

size_t words_per_element(DataType t) {
  if (t == DataType::exact_f32) return words<float>();
  if (t == DataType::exact_f64) return words<double>();
  fail(fmt::format("exact_sum lowering: {} is not an exact dtype", to_string(t)));
}

void pack(DataType t, const void* acc, size_t count, int64_t* out) {
  if (t == DataType::exact_f32) return pack_typed(static_cast<const ExactAcc<float>*>(acc), count, out);
  if (t == DataType::exact_f64) return pack_typed(static_cast<const ExactAcc<double>*>(acc), count, out);
  fail(fmt::format("exact_sum lowering: {} is not an exact dtype", to_string(t)));
}

void unpack(DataType t, const int64_t* in, size_t count, void* acc) {
  if (t == DataType::exact_f32) return unpack_typed(in, count, static_cast<ExactAcc<float>*>(acc));
  if (t == DataType::exact_f64) return unpack_typed(in, count, static_cast<ExactAcc<double>*>(acc));
  fail(fmt::format("exact_sum lowering: {} is not an exact dtype", to_string(t)));
}

#else  // TRIDENT_PLAIN_ACC (benchmark twins): ExactAcc is a plain running sum, there is nothing exact to lower.

[[noreturn]] static void no_lowering() {
  fail("exact_sum lowering is not available in the TRIDENT_PLAIN_ACC benchmark build");
}
size_t words_per_element(DataType) { no_lowering(); }
void pack(DataType, const void*, size_t, int64_t*) { no_lowering(); }
void unpack(DataType, const int64_t*, size_t, void*) { no_lowering(); }

#endif

}  // namespace exact_lowering

// ---- Communicator: exact_sum on a backend without a native one ---------------------------------------------------
size_t Communicator::lower_exact_sum(CollOp op, const void* send, void* recv, size_t count_, DataType t, int root,
                                     Stream s, loc_t loc) {
  const int n = size(), r = rank();
  TD_CHECK(n <= exact_lowering::kMaxContributions,
           "{} with exact_sum on '{}' at {}:{}: {} ranks, but the i64 lowering of exact_sum combines at most {} "
           "(docs/numerics.md)",
           to_string(op), name(), loc.file_name(), loc.line(), n, exact_lowering::kMaxContributions);
  const size_t W = exact_lowering::words_per_element(t);
  const size_t elems = op == CollOp::reduce_scatter ? static_cast<size_t>(n) * count_ : count_;
  // One scratch buffer: packed in place, summed in place (NCCL in-place forms), unpacked from this rank's part.
  auto buf = std::make_unique_for_overwrite<int64_t[]>(elems * W);
  exact_lowering::pack(t, send, elems, buf.get());
  int64_t* mine = buf.get() + (op == CollOp::reduce_scatter ? static_cast<size_t>(r) * count_ * W : 0);
  do_collective({op, buf.get(), mine, count_ * W, DataType::i64, ReduceOp::sum, root}, s, loc);
  if (op != CollOp::reduce || r == root) exact_lowering::unpack(t, mine, count_, recv);
  return elems * W * sizeof(int64_t);
}

}  // namespace trident
