// BlockPool: the emulated device memory of the ranks that share one fiber worker (docs/emulator.md "Device memory:
// the worker's pool").
//
// The step allocates and frees a few hundred device buffers per rank and step. From the host's allocator, shared by
// the 500-odd ranks of a worker thread, each cost a search of its bins, and their pages went back to the system and
// were faulted in again step after step. The pool keeps them: blocks are carved from slabs of 16 MiB that it maps
// once (2 MiB aligned and offered to transparent huge pages, so a first touch faults in 2 MiB at once), best fit
// (the smallest free range that holds the request, the lowest address among equal sizes), and a returned block is
// coalesced with the free ranges beside it. Small blocks (< 64 KiB) and large ones come from separate slabs, so a
// long-lived large buffer never pins a slab of short-lived small ones; a slab that becomes empty is kept as a spare
// that either kind takes before a new slab is mapped (a request above 16 MiB gets a slab of its own, unmapped when
// freed). The pool's host memory is therefore the largest total its slabs reached (reserved_peak()): what its ranks
// had live at their common peak, plus fragmentation.
//
// Blocks are 64-byte aligned, their sizes rounded up to 64 bytes (allocate(0) gives 64). Not thread-safe: the ranks
// of one worker run one at a time on its thread.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <utility>
#include <vector>

namespace trident::emu {

// Whether fiber ranks take their device memory from their worker's pool (the emulator's spawn and the MPI backend's
// processes): not under AddressSanitizer, where every device buffer is its own heap allocation, so that an access past
// its end or after its free is reported.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kDevicePools = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kDevicePools = false;
#else
inline constexpr bool kDevicePools = true;
#endif
#else
inline constexpr bool kDevicePools = true;
#endif

class BlockPool {
 public:
  static constexpr size_t kAlign = 64;
  static constexpr size_t kHugePage = size_t{2} << 20;
  static constexpr size_t kSlabBytes = size_t{16} << 20;
  static constexpr size_t kLarge = size_t{64} << 10;  // blocks of at least this many bytes come from large slabs

  BlockPool() = default;
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // A block of at least `bytes` bytes; nullptr when a new slab was needed and the system had no memory for it.
  void* allocate(size_t bytes);
  // Returns a block; `bytes` as given to allocate.
  void release(void* p, size_t bytes) noexcept;

  static size_t block_bytes(size_t bytes) { return (std::max<size_t>(bytes, 1) + kAlign - 1) & ~(kAlign - 1); }
  int64_t used() const { return used_; }                    // bytes of live blocks (block sizes)
  int64_t used_peak() const { return used_peak_; }          // largest used() so far
  int64_t reserved() const { return reserved_; }            // bytes of mapped slabs
  int64_t reserved_peak() const { return reserved_peak_; }  // largest reserved() so far
  size_t slabs() const { return slabs_.size(); }
  size_t spare_slabs() const { return spare_.size(); }

 private:
  struct Slab {
    uintptr_t base;
    size_t bytes;
    int kind;  // 0 small, 1 large, -1 spare (empty)
  };
  struct Heap {  // the free ranges of one kind's slabs
    std::map<uintptr_t, size_t> by_addr;                 // start -> bytes (coalescing)
    std::set<std::pair<size_t, uintptr_t>> by_size;      // (bytes, start) (best fit)
    void insert(uintptr_t p, size_t n);                  // strong guarantee
    void erase(std::map<uintptr_t, size_t>::iterator it);
  };
  bool add_slab(int kind, size_t need);
  Slab& slab_of(uintptr_t p);

  std::vector<Slab> slabs_;      // by base address
  std::vector<uintptr_t> spare_;  // bases of empty kSlabBytes slabs
  Heap heaps_[2];
  int64_t used_ = 0, used_peak_ = 0, reserved_ = 0, reserved_peak_ = 0;
};

// The pools of a run's fiber workers, one per worker: rank i runs on worker i % workers (the emulator's spawn and
// the MPI backend's processes place ranks so), and takes its device memory from that worker's pool. None when
// kDevicePools is off (AddressSanitizer): of() is then nullptr, the host's allocator.
class WorkerPools {
 public:
  void make(int workers) {
    if (kDevicePools)
      for (int k = 0; k < workers; ++k) pools_.push_back(std::make_unique<BlockPool>());
  }
  BlockPool* of(int64_t i) const {
    return pools_.empty() ? nullptr : pools_[static_cast<size_t>(i) % pools_.size()].get();
  }
  void clear() { pools_.clear(); }

 private:
  std::vector<std::unique_ptr<BlockPool>> pools_;
};

}  // namespace trident::emu
