#include "emulator/reduce.h"

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "reference/bf16.h"
#include "reference/check.h"
#include "reference/exact_acc.h"

namespace trident::emu {
namespace {

template <class T>
T nan_max(T a, T b) {  // floating: NaN propagates; integers: plain max
  if constexpr (std::is_floating_point_v<T>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return b > a ? b : a;
}
template <class T>
T nan_min(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return b < a ? b : a;
}
template <class T>
T wrap_add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));  // integer sums wrap
  } else {
    return a + b;
  }
}

// acc[i] = f(acc[i], load(s[i])) for i < len. Full blocks use the compile-time length B so that the loop is
// vectorised at -O2 (GCC's default "very cheap" cost model skips loops that need a scalar epilogue).
template <size_t B, class Acc, class Elem, class F, class Load>
inline void combine_block(Acc* acc, const Elem* s, size_t len, F f, Load load) {
  if (len == B) {
    for (size_t i = 0; i < B; ++i) acc[i] = f(acc[i], load(s[i]));
  } else {
    for (size_t i = 0; i < len; ++i) acc[i] = f(acc[i], load(s[i]));
  }
}

// Acc: accumulation type (float for bf16), Load/Store convert from/to the element type.
template <class Elem, class Acc, class Load, class Store>
void reduce_typed(ReduceOp op, void* dst, const void* const* srcs, int n, size_t count, Load load, Store store) {
  constexpr size_t B = 4096;  // block: sources are read block by block, the result written after (in place safe)
  Acc acc[B];
  for (size_t b0 = 0; b0 < count; b0 += B) {
    const size_t len = count - b0 < B ? count - b0 : B;
    const Elem* s0 = static_cast<const Elem*>(srcs[0]) + b0;
    for (size_t i = 0; i < len; ++i) acc[i] = load(s0[i]);
    for (int j = 1; j < n; ++j) {  // rank order: deterministic
      const Elem* s = static_cast<const Elem*>(srcs[j]) + b0;
      switch (op) {
        case ReduceOp::sum: combine_block<B>(acc, s, len, [](Acc a, Acc b) { return wrap_add<Acc>(a, b); }, load); break;
        case ReduceOp::max: combine_block<B>(acc, s, len, [](Acc a, Acc b) { return nan_max<Acc>(a, b); }, load); break;
        case ReduceOp::min: combine_block<B>(acc, s, len, [](Acc a, Acc b) { return nan_min<Acc>(a, b); }, load); break;
        case ReduceOp::exact_sum: fail("reduce_into: exact_sum on a non-exact dtype");
      }
    }
    Elem* d = static_cast<Elem*>(dst) + b0;
    for (size_t i = 0; i < len; ++i) d[i] = store(acc[i]);
  }
}

template <class T>
void reduce_plain(ReduceOp op, void* dst, const void* const* srcs, int n, size_t count) {
  reduce_typed<T, T>(op, dst, srcs, n, count, [](T x) { return x; }, [](T x) { return x; });
}

template <class T>
void reduce_exact(void* dst, const void* const* srcs, int n, size_t count) {
  using A = ExactAcc<T>;
  // Block of accumulators kept in L1 while every source is merged into it in rank order (per element the same
  // merge sequence as an exact_merge per source, so the same bytes); merge() is inlined here, no call per block.
  // The loads from the other ranks' buffers miss the cache, and most calls are short (a reduce-scatter block of a
  // few hundred accumulators per source), so the sources are walked as one stream - source 1's block, then source
  // 2's, ... - with a prefetch kDist cache lines ahead in that stream, across the sources' boundaries (a whole
  // source prefetched at once asks for more lines than the core can have in flight, and the hardware prefetcher
  // does not follow a stream that jumps between 2..n buffers every few hundred lines).
  constexpr size_t B = 256;
  constexpr size_t kLine = 64;
  constexpr size_t kDist = 128;  // cache lines ahead (8 KiB: 24 left half the misses exposed, 64-512 measure alike)
  A acc[B];
  for (size_t b0 = 0; b0 < count; b0 += B) {
    const size_t len = count - b0 < B ? count - b0 : B;
    const size_t bytes = len * sizeof(A);
    // The stream position kDist lines ahead: source pj, byte offset po within its block.
    int pj = 1;
    size_t po = 0;
    auto advance = [&](size_t k) {
      for (size_t q = 0; q < k && pj < n; ++q) {
        __builtin_prefetch(reinterpret_cast<const char*>(static_cast<const A*>(srcs[pj]) + b0) + po);
        po += kLine;
        if (po >= bytes) po = 0, ++pj;
      }
    };
    advance(kDist);
    std::memcpy(static_cast<void*>(acc), static_cast<const A*>(srcs[0]) + b0, bytes);
    for (int j = 1; j < n; ++j) {
      const A* s = static_cast<const A*>(srcs[j]) + b0;
      for (size_t i = 0; i < len; ++i) {
        if ((i * sizeof(A)) % kLine < sizeof(A)) advance(1);  // one line ahead per line consumed
        acc[i].merge(s[i]);
      }
    }
    std::memcpy(static_cast<void*>(static_cast<A*>(dst) + b0), acc, bytes);
  }
}

}  // namespace

void reduce_into(DataType t, ReduceOp op, void* dst, const void* const* srcs, int n, size_t count) {
  if (count == 0) return;
  if (n == 1) {
    if (dst != srcs[0]) std::memcpy(dst, srcs[0], count * dtype_size(t));
    return;
  }
  check_reduce_op(t, op, std::source_location::current());
  switch (t) {
    case DataType::f64: return reduce_plain<double>(op, dst, srcs, n, count);
    case DataType::f32: return reduce_plain<float>(op, dst, srcs, n, count);
    case DataType::i32: return reduce_plain<int32_t>(op, dst, srcs, n, count);
    case DataType::i64: return reduce_plain<int64_t>(op, dst, srcs, n, count);
    case DataType::u8: return reduce_plain<uint8_t>(op, dst, srcs, n, count);
    case DataType::bf16:  // fp32 accumulation in rank order, one rounding at the end
      return reduce_typed<bf16, float>(op, dst, srcs, n, count, [](bf16 x) { return to_float(x); },
                                       [](float x) { return to_bf16(x); });
    case DataType::exact_f32: return reduce_exact<float>(dst, srcs, n, count);
    case DataType::exact_f64: return reduce_exact<double>(dst, srcs, n, count);
  }
}

}  // namespace trident::emu
