// The hash of the bytes a rank received in a communication call (TraceEntry::recv_hash). Two functions, chosen per
// device (DeviceOptions::recv_hash):
//  - FNV-1a 64 (offset 0xcbf29ce484222325, prime 0x100000001b3), byte-serial: the default, and the value the
//    primitive goldens store (docs/golden.md), so their bits never change;
//  - XXH64 (seed 0): four independent 8-byte lanes, an order of magnitude faster on large buffers. `trident fuzz`
//    uses it: its scheduler property compares the hashes of two runs of one process, never a stored value.
#pragma once
#include <cstddef>
#include <cstdint>

namespace trident::emu {

enum class RecvHash : uint8_t { fnv1a64, xxh64 };

uint64_t fnv1a64(const void* p, size_t n);
uint64_t xxh64(const void* p, size_t n, uint64_t seed = 0);
inline uint64_t recv_hash(RecvHash h, const void* p, size_t n) {
  return h == RecvHash::xxh64 ? xxh64(p, n) : fnv1a64(p, n);
}

}  // namespace trident::emu
