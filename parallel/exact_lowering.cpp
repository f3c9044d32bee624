// exact_sum lowered onto i64 sums (parallel/exact_lowering.h), and the Communicator wrappers' use of it.
#include "parallel/exact_lowering.h"

#include <cstring>
#include <memory>

#include "reference/check.h"
#include "parallel/exact_lowering_impl.h"
#include "reference/exact_acc.h"

namespace trident {
namespace exact_lowering {

#ifndef TRIDENT_PLAIN_ACC
namespace {

template <class T>
constexpr size_t words() {
  return static_cast<size_t>(elem::words<T>());
}

template <class T>
void pack_typed(const ExactAcc<T>* acc, size_t count, int64_t* out) {
  for (size_t e = 0; e < count; ++e, out += words<T>()) elem::pack(acc[e], out);
}

}  // namespace

// The one error line of a bad word sum (also for a CUDA device's unpack, which finds it on the device).
[[noreturn]] void unpack_failed(int bad, int64_t element, int word, int64_t value) {
  using namespace elem;
  if (bad == kDigitRange)
    fail(fmt::format("exact_sum lowering: word {} of element {} is {}, outside [0, {}]: not a sum of at most {} "
                     "packed accumulators",
                     word, element, value, kDigitSumMax, kMaxContributions));
  if (bad == kTopRange)
    fail(fmt::format("exact_sum lowering: word {} of element {} is {}, outside [-{}, {}]: not a sum of at most {} "
                     "packed accumulators",
                     word, element, value, kTopSumMax, kTopSumMax, kMaxContributions));
  if (bad == kOverflow)
    fail(fmt::format("exact_sum lowering: element {}: the exact sum leaves the accumulator's range (its top limb "
                     "would not fit: 40 signed bits for exact_f32, int64 for exact_f64; top word sum {})",
                     element, value));
  fail(fmt::format("exact_sum lowering: flag word of element {} is {}: not a sum of at most {} packed accumulators",
                   element, value, kMaxContributions));
}

namespace {
template <class T>
void unpack_typed(const int64_t* in, size_t count, ExactAcc<T>* acc) {
  for (size_t e = 0; e < count; ++e, in += words<T>()) {
    int word = 0;
    if (const int bad = elem::unpack<T>(in, acc[e], word))
      unpack_failed(bad, static_cast<int64_t>(e), word, in[word]);
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
void unpack_failed(int, int64_t, int, int64_t) { no_lowering(); }

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
  const size_t mine_at = op == CollOp::reduce_scatter ? static_cast<size_t>(r) * count_ * W : 0;
  const bool unpack = op != CollOp::reduce || r == root;
  // One scratch buffer: packed in place, summed in place (NCCL in-place forms), unpacked from this rank's part.
  if (Device* dev = lowering_device()) {  // device work on s, in order with the collective (and with what
                                          // produced `send`: a deferred or GPU stream has not run it yet)
    DeviceBuffer<int64_t> buf(*dev, static_cast<int64_t>(elems * W), s, loc);
    dev->exact_pack(t, send, elems, buf.data(), s, loc);
    do_collective({op, buf.data(), buf.data() + mine_at, count_ * W, DataType::i64, ReduceOp::sum, root}, s, loc);
    if (unpack) dev->exact_unpack(t, buf.data() + mine_at, count_, recv, s, loc);
    return elems * W * sizeof(int64_t);  // buf is freed on s, after the unpack
  }
  auto buf = std::make_unique_for_overwrite<int64_t[]>(elems * W);  // host memory, at once (eager backends)
  exact_lowering::pack(t, send, elems, buf.get());
  do_collective({op, buf.get(), buf.get() + mine_at, count_ * W, DataType::i64, ReduceOp::sum, root}, s, loc);
  if (unpack) exact_lowering::unpack(t, buf.get() + mine_at, count_, recv);
  return elems * W * sizeof(int64_t);
}

// ---- Device: the lowering's pack and unpack as host work on a stream ---------------------------------------------
void Device::exact_pack(DataType t, const void* acc, size_t count, int64_t* out, Stream s, loc_t loc) {
  const auto W = static_cast<int64_t>(exact_lowering::words_per_element(t));
  const auto n = static_cast<int64_t>(count);
  launch(s, "exact_pack", {Access{acc, n * static_cast<int64_t>(dtype_size(t)), false}, writes(out, n * W)}, 0,
         [=] { exact_lowering::pack(t, acc, count, out); }, loc);
}

void Device::exact_unpack(DataType t, const int64_t* in, size_t count, void* acc, Stream s, loc_t loc) {
  const auto W = static_cast<int64_t>(exact_lowering::words_per_element(t));
  const auto n = static_cast<int64_t>(count);
  launch(s, "exact_unpack", {reads(in, n * W), Access{acc, n * static_cast<int64_t>(dtype_size(t)), true}}, 0,
         [=] { exact_lowering::unpack(t, in, count, acc); }, loc);
}

}  // namespace trident
