// AddrMap: a rank's live device allocations, address -> bytes, in one flat open-addressing table (linear probing,
// deletion by backward shift, at most half full). The step allocates and frees a buffer per tensor and layer; with a
// node-based hash map each look-up walked a bucket and a node that were cold in the cache after the other ranks ran,
// where the table is one probe of a slot in the common case. Keys are non-null addresses (0 marks an empty slot).
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace trident::emu {

class AddrMap {
 public:
  // Inserts key -> value unless key is present; returns false then (the value is left as it was).
  bool insert(uintptr_t key, int64_t value) {
    if (2 * (n_ + 1) > slots_.size()) grow();
    size_t i = home(key);
    for (; slots_[i].key != 0; i = (i + 1) & mask_)
      if (slots_[i].key == key) return false;
    slots_[i] = {key, value};
    ++n_;
    return true;
  }
  // The value of key, or nullptr.
  const int64_t* find(uintptr_t key) const {
    if (slots_.empty()) return nullptr;
    for (size_t i = home(key); slots_[i].key != 0; i = (i + 1) & mask_)
      if (slots_[i].key == key) return &slots_[i].value;
    return nullptr;
  }
  // Removes key (present or not).
  void erase(uintptr_t key) {
    if (slots_.empty()) return;
    size_t i = home(key);
    for (; slots_[i].key != key; i = (i + 1) & mask_)
      if (slots_[i].key == 0) return;
    // Backward shift: pull each later entry of the run into the hole when the hole lies on its probe path.
    for (size_t j = (i + 1) & mask_; slots_[j].key != 0; j = (j + 1) & mask_) {
      const size_t h = home(slots_[j].key);
      if (((j - h) & mask_) >= ((j - i) & mask_)) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = {};
    --n_;
  }
  size_t size() const { return n_; }
  template <class F>
  void for_each(F&& f) const {
    for (const Slot& s : slots_)
      if (s.key != 0) f(s.key, s.value);
  }

 private:
  struct Slot {
    uintptr_t key = 0;
    int64_t value = 0;
  };
  size_t home(uintptr_t key) const { return static_cast<size_t>(((key >> 6) * 0x9E3779B97F4A7C15ull) >> shift_); }
  void grow() {
    const size_t cap = slots_.empty() ? 64 : 2 * slots_.size();
    std::vector<Slot> old(cap);  // may throw: the map is unchanged
    std::swap(old, slots_);
    mask_ = cap - 1;
    shift_ = 64 - __builtin_ctzll(cap);
    n_ = 0;
    for (const Slot& s : old)
      if (s.key != 0) insert(s.key, s.value);  // fits: no further growth
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0, n_ = 0;
  int shift_ = 64;
};

}  // namespace trident::emu
