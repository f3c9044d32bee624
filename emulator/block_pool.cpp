// BlockPool (emulator/block_pool.h): best fit over slabs mapped once, free ranges coalesced within a slab, small and
// large blocks on separate slabs, empty slabs kept as spares.
#include "emulator/block_pool.h"

#include <sys/mman.h>

#include <new>

namespace trident::emu {

namespace {
// A private anonymous mapping of `bytes` (a multiple of 2 MiB) aligned to 2 MiB, offered to transparent huge pages;
// nullptr when the system has no memory for it.
void* map_slab(size_t bytes) {
  const size_t extra = BlockPool::kHugePage;
  void* m = mmap(nullptr, bytes + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  const auto a = reinterpret_cast<uintptr_t>(m);
  const uintptr_t base = (a + extra - 1) & ~(uintptr_t{extra} - 1);
  if (base > a) munmap(m, base - a);
  const uintptr_t end = a + bytes + extra;
  if (end > base + bytes) munmap(reinterpret_cast<void*>(base + bytes), end - base - bytes);
#ifdef MADV_HUGEPAGE
  madvise(reinterpret_cast<void*>(base), bytes, MADV_HUGEPAGE);  // a hint: where refused, 4 KiB pages
#endif
  return reinterpret_cast<void*>(base);
}
}  // namespace

void BlockPool::Heap::insert(uintptr_t p, size_t n) {
  auto it = by_addr.emplace(p, n).first;
  try {
    by_size.emplace(n, p);
  } catch (...) {
    by_addr.erase(it);
    throw;
  }
}

void BlockPool::Heap::erase(std::map<uintptr_t, size_t>::iterator it) {
  by_size.erase({it->second, it->first});
  by_addr.erase(it);
}

BlockPool::~BlockPool() {
  for (const Slab& s : slabs_) munmap(reinterpret_cast<void*>(s.base), s.bytes);
}

BlockPool::Slab& BlockPool::slab_of(uintptr_t p) {
  auto it = std::upper_bound(slabs_.begin(), slabs_.end(), p, [](uintptr_t b, const Slab& s) { return b < s.base; });
  return *std::prev(it);
}

// Gives `kind` a slab that holds `need` bytes: a spare one, or a new mapping.
bool BlockPool::add_slab(int kind, size_t need) {
  if (need <= kSlabBytes && !spare_.empty()) {
    Slab& s = slab_of(spare_.back());
    heaps_[kind].insert(s.base, s.bytes);  // may throw: then the slab stays spare
    s.kind = kind;
    spare_.pop_back();
    return true;
  }
  const size_t bytes = std::max(kSlabBytes, (need + kHugePage - 1) & ~(kHugePage - 1));
  void* m = map_slab(bytes);
  if (m == nullptr) return false;
  const auto base = reinterpret_cast<uintptr_t>(m);
  auto it = std::upper_bound(slabs_.begin(), slabs_.end(), base, [](uintptr_t b, const Slab& s) { return b < s.base; });
  try {
    it = slabs_.insert(it, Slab{base, bytes, kind});
  } catch (...) {
    munmap(m, bytes);
    throw;
  }
  try {
    heaps_[kind].insert(base, bytes);
  } catch (...) {
    slabs_.erase(it);
    munmap(m, bytes);
    throw;
  }
  reserved_ += static_cast<int64_t>(bytes);
  reserved_peak_ = std::max(reserved_peak_, reserved_);
  return true;
}

void* BlockPool::allocate(size_t bytes) {
  const size_t need = block_bytes(bytes);
  const int kind = need >= kLarge ? 1 : 0;
  Heap& h = heaps_[kind];
  try {
    auto fit = h.by_size.lower_bound({need, 0});
    if (fit == h.by_size.end()) {
      if (!add_slab(kind, need)) return nullptr;
      fit = h.by_size.lower_bound({need, 0});
    }
    const size_t have = fit->first;
    const uintptr_t p = fit->second;
    auto it = h.by_addr.find(p);
    if (have > need) {  // the rest stays free: both nodes are reused, so nothing can fail here
      auto a = h.by_addr.extract(it);
      a.key() = p + need;
      a.mapped() = have - need;
      h.by_addr.insert(std::move(a));
      auto b = h.by_size.extract(fit);
      b.value() = {have - need, p + need};
      h.by_size.insert(std::move(b));
    } else {
      h.by_size.erase(fit);
      h.by_addr.erase(it);
    }
    used_ += static_cast<int64_t>(need);
    used_peak_ = std::max(used_peak_, used_);
    return reinterpret_cast<void*>(p);
  } catch (const std::bad_alloc&) {  // no memory for the bookkeeping
    return nullptr;
  }
}

void BlockPool::release(void* ptr, size_t bytes) noexcept {
  uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  size_t n = block_bytes(bytes);
  used_ -= static_cast<int64_t>(n);
  Slab& s = slab_of(p);
  Heap& h = heaps_[s.kind];
  const uintptr_t lo = s.base, hi = s.base + s.bytes;
  auto next = h.by_addr.lower_bound(p);
  if (next != h.by_addr.end() && next->first == p + n && next->first < hi) {
    n += next->second;
    auto after = std::next(next);
    h.erase(next);
    next = after;
  }
  if (next != h.by_addr.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == p && prev->first >= lo) {
      p = prev->first;
      n += prev->second;
      h.erase(prev);
    }
  }
  if (p == lo && n == s.bytes) {  // the slab is empty
    if (s.bytes == kSlabBytes) {
      try {
        spare_.push_back(s.base);
        s.kind = -1;
        return;
      } catch (...) {  // no memory for the list: it stays with its kind
      }
    } else {  // a request's own slab: unmapped
      munmap(reinterpret_cast<void*>(s.base), s.bytes);
      reserved_ -= static_cast<int64_t>(s.bytes);
      slabs_.erase(slabs_.begin() + (&s - slabs_.data()));
      return;
    }
  }
  try {
    h.insert(p, n);
  } catch (...) {  // no memory for a tree node: the range stays unused until the pool goes away
  }
}

}  // namespace trident::emu
