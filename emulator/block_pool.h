// BlockPool: the emulated device memory of the ranks that share one fiber worker (docs/emulator.md "Device memory:
// the worker's pool").
//
// The step allocates and frees a few hundred device buffers per rank and step. From the host's allocator, shared by
// the 500-odd ranks of a worker thread, each cost a search of its bins, and their pages went back to the system and
// were faulted in again step after step. The pool keeps them: blocks are carved from slabs of 16 MiB that it maps
// once (2 MiB aligned and offered to transparent huge pages, so a first touch faults in 2 MiB at once), and a returned
// block is coalesced with the free ranges beside it. Small blocks (< 64 KiB) and large ones come from separate slabs,
// so a long-lived large buffer never pins a slab of short-lived small ones; a slab that becomes empty is kept as a
// spare that either kind takes before a new slab is mapped (a request above 16 MiB gets a slab of its own, unmapped
// when freed). The pool's host memory is therefore the largest total its slabs reached (reserved_peak()): what its
// ranks had live at their common peak, plus fragmentation.
//
// Free ranges are found in constant time, two-level segregated fit: per kind, lists of free ranges by size class (a
// power of two split into 8 classes; below 512 bytes one class per 64 bytes) with a bitmap of the non-empty lists, so
// a request takes the first range of the smallest non-empty class whose every range holds it (the lowest class that
// can, above the request's own class unless the request is a class's lower bound) and splits off the rest. A free
// range keeps its list links and size in its own first 64 bytes and its size again in its last 8 (unless it ends its
// slab); two bits per 64 bytes of slab (its first and its last granule) say where free ranges start and end, so a
// returned block finds its free neighbours without a search. The bookkeeping lives in memory that was free anyway
// and beside blocks in use: a slab's untouched tail is not written.
//
// Blocks are 64-byte aligned, their sizes rounded up to 64 bytes (allocate(0) gives 64). Not thread-safe: the ranks
// of one worker run one at a time on its thread.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
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
  static constexpr int kSL = 8;  // classes per power of two
  static constexpr int kFL = 48;  // power-of-two bands: granule counts below 2^50
  struct Slab {
    uintptr_t base;
    size_t bytes;
    int kind;                     // 0 small, 1 large, -1 spare (empty)
    std::vector<uint64_t> start;  // bit g: a free range starts at granule g
    std::vector<uint64_t> end;    // bit g: a free range ends at granule g (its last)
  };
  struct Free {  // the first bytes of a free range
    size_t bytes;
    Free* prev;
    Free* next;
  };
  struct Lists {  // one kind's free ranges by class
    uint64_t fl_map = 0;
    uint32_t sl_map[kFL] = {};
    Free* head[kFL][kSL] = {};
  };
  static void class_of(size_t granules, int& fl, int& sl);
  void link(int kind, Free* f);
  void unlink(int kind, Free* f);
  Free* take(int kind, size_t need);  // a free range of at least need bytes, unlinked; nullptr if none
  void make_free(Slab& s, uintptr_t p, size_t n);  // marks, links and tags [p, p+n) of s as a free range
  bool add_slab(int kind, size_t need);
  Slab& slab_of(uintptr_t p);

  std::vector<Slab> slabs_;       // by base address
  std::vector<uintptr_t> spare_;  // bases of empty kSlabBytes slabs
  Lists lists_[2];
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
