// Test values whose reductions are exact: element values are small integers, expectations are computed in
// int64 and converted once to the dtype (bf16: one RNE rounding of the exact sum, as the contract says).
#pragma once
#include <bit>
#include <cstdint>
#include <cstring>
#include <vector>

#include "parallel/comm.h"
#include "reference/bf16.h"

namespace trident::emutest {

// The exact_* dtype of ExactAcc<T>, and a float's bits (for bitwise comparisons of exact sums).
template <class T>
constexpr DataType exact_dtype_of() {
  return sizeof(T) == 4 ? DataType::exact_f32 : DataType::exact_f64;
}
template <class T>
auto bits(T x) {
  if constexpr (sizeof(T) == 4) return std::bit_cast<uint32_t>(x);
  else return std::bit_cast<uint64_t>(x);
}

// Rank r's value at index i: small non-negative integers (0..10), never all zero over 11 consecutive i.
inline int64_t val(int r, uint64_t i) { return static_cast<int64_t>((static_cast<uint64_t>(r) * 7 + i * 3) % 11); }

inline void put(DataType t, void* buf, size_t i, int64_t v) {
  switch (t) {
    case DataType::f64: static_cast<double*>(buf)[i] = static_cast<double>(v); break;
    case DataType::f32: static_cast<float*>(buf)[i] = static_cast<float>(v); break;
    case DataType::bf16: static_cast<bf16*>(buf)[i] = to_bf16(static_cast<float>(v)); break;
    case DataType::i32: static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v); break;
    case DataType::i64: static_cast<int64_t*>(buf)[i] = v; break;
    case DataType::u8: static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(static_cast<uint64_t>(v) & 0xffu); break;
    default: break;
  }
}

// A buffer of `count` elements with guard bytes on both sides (checked for out-of-bounds writes).
struct GuardedBuf {
  static constexpr size_t kGuard = 64;
  static constexpr unsigned char kPattern = 0xA5;
  GuardedBuf(DataType t, size_t count) : es(dtype_size(t)), n(count), bytes(kGuard * 2 + count * es, kPattern) {}
  void* data() { return bytes.data() + kGuard; }
  char* at(size_t i) { return bytes.data() + kGuard + i * es; }
  bool guards_ok() const {
    for (size_t i = 0; i < kGuard; ++i)
      if (static_cast<unsigned char>(bytes[i]) != kPattern ||
          static_cast<unsigned char>(bytes[kGuard + n * es + i]) != kPattern)
        return false;
    return true;
  }
  size_t es, n;
  std::vector<char> bytes;
};

}  // namespace trident::emutest
