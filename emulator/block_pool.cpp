// BlockPool (emulator/block_pool.h): two-level segregated fit over slabs mapped once, free ranges coalesced within a
// slab through per-granule start and end bits, small and large blocks on separate slabs, empty slabs kept as spares.
#include "emulator/block_pool.h"

#include <sys/mman.h>

#include <bit>
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

inline void set_bit(std::vector<uint64_t>& w, size_t g) { w[g >> 6] |= uint64_t{1} << (g & 63); }
inline void clear_bit(std::vector<uint64_t>& w, size_t g) { w[g >> 6] &= ~(uint64_t{1} << (g & 63)); }
inline bool test_bit(const std::vector<uint64_t>& w, size_t g) { return (w[g >> 6] >> (g & 63)) & 1; }
}  // namespace

BlockPool::~BlockPool() {
  for (const Slab& s : slabs_) munmap(reinterpret_cast<void*>(s.base), s.bytes);
}

BlockPool::Slab& BlockPool::slab_of(uintptr_t p) {
  auto it = std::upper_bound(slabs_.begin(), slabs_.end(), p, [](uintptr_t b, const Slab& s) { return b < s.base; });
  return *std::prev(it);
}

// The class of a free range of `granules` 64-byte granules: below 8 one class each (band 0), else band
// floor(log2 granules) - 2 split into kSL classes by the three bits below the leading one.
void BlockPool::class_of(size_t granules, int& fl, int& sl) {
  if (granules < kSL) {
    fl = 0, sl = static_cast<int>(granules);
    return;
  }
  const int b = std::bit_width(granules) - 1;
  fl = b - 2, sl = static_cast<int>((granules >> (b - 3)) & (kSL - 1));
}

void BlockPool::link(int kind, Free* f) {
  int fl, sl;
  class_of(f->bytes / kAlign, fl, sl);
  Lists& l = lists_[kind];
  f->prev = nullptr;
  f->next = l.head[fl][sl];
  if (f->next) f->next->prev = f;
  l.head[fl][sl] = f;
  l.sl_map[fl] |= 1u << sl;
  l.fl_map |= uint64_t{1} << fl;
}

void BlockPool::unlink(int kind, Free* f) {
  int fl, sl;
  class_of(f->bytes / kAlign, fl, sl);
  Lists& l = lists_[kind];
  if (f->prev) f->prev->next = f->next;
  else l.head[fl][sl] = f->next;
  if (f->next) f->next->prev = f->prev;
  if (!l.head[fl][sl]) {
    l.sl_map[fl] &= ~(1u << sl);
    if (!l.sl_map[fl]) l.fl_map &= ~(uint64_t{1} << fl);
  }
}

// The smallest non-empty class whose every range holds `need` bytes: the request's own class when it is exact
// (band 0) or the request is the class's lower bound, else the next one up; its first range, unlinked.
BlockPool::Free* BlockPool::take(int kind, size_t need) {
  size_t g = need / kAlign;
  if (g >= kSL) g += (size_t{1} << (std::bit_width(g) - 1 - 3)) - 1;  // round up to a class's lower bound
  int fl, sl;
  class_of(g, fl, sl);
  if (fl >= kFL) return nullptr;
  Lists& l = lists_[kind];
  uint32_t sm = l.sl_map[fl] & (~0u << sl);
  if (!sm) {
    const uint64_t fm = fl + 1 < kFL ? l.fl_map & (~uint64_t{0} << (fl + 1)) : 0;
    if (!fm) return nullptr;
    fl = std::countr_zero(fm);
    sm = l.sl_map[fl];
  }
  Free* f = l.head[fl][std::countr_zero(sm)];
  unlink(kind, f);
  return f;
}

void BlockPool::make_free(Slab& s, uintptr_t p, size_t n) {
  const size_t g0 = (p - s.base) / kAlign, g1 = g0 + n / kAlign - 1;
  set_bit(s.start, g0);
  set_bit(s.end, g1);
  Free* f = reinterpret_cast<Free*>(p);
  f->bytes = n;
  if (p + n < s.base + s.bytes) *reinterpret_cast<size_t*>(p + n - sizeof(size_t)) = n;  // read by the next block
  link(s.kind, f);
}

// Gives `kind` a slab that holds `need` bytes: a spare one, or a new mapping.
bool BlockPool::add_slab(int kind, size_t need) {
  if (need <= kSlabBytes && !spare_.empty()) {
    Slab& s = slab_of(spare_.back());
    spare_.pop_back();
    s.kind = kind;
    make_free(s, s.base, s.bytes);
    return true;
  }
  const size_t bytes = std::max(kSlabBytes, (need + kHugePage - 1) & ~(kHugePage - 1));
  const size_t words = (bytes / kAlign + 63) / 64;
  Slab slab{0, bytes, kind, {}, {}};
  slab.start.assign(words, 0);  // may throw: nothing mapped yet
  slab.end.assign(words, 0);
  void* m = map_slab(bytes);
  if (m == nullptr) return false;
  slab.base = reinterpret_cast<uintptr_t>(m);
  auto it = std::upper_bound(slabs_.begin(), slabs_.end(), slab.base,
                             [](uintptr_t b, const Slab& s) { return b < s.base; });
  try {
    it = slabs_.insert(it, std::move(slab));
  } catch (...) {
    munmap(m, bytes);
    throw;
  }
  make_free(*it, it->base, it->bytes);
  reserved_ += static_cast<int64_t>(bytes);
  reserved_peak_ = std::max(reserved_peak_, reserved_);
  return true;
}

void* BlockPool::allocate(size_t bytes) {
  const size_t need = block_bytes(bytes);
  const int kind = need >= kLarge ? 1 : 0;
  try {
    Free* f = take(kind, need);
    if (f == nullptr) {
      if (!add_slab(kind, need)) return nullptr;
      f = take(kind, need);
      if (f == nullptr) return nullptr;
    }
    const auto p = reinterpret_cast<uintptr_t>(f);
    const size_t have = f->bytes;
    Slab& s = slab_of(p);
    clear_bit(s.start, (p - s.base) / kAlign);
    if (have > need) make_free(s, p + need, have - need);  // the rest stays free (its end bit is already set)
    else clear_bit(s.end, (p + need - s.base) / kAlign - 1);
    used_ += static_cast<int64_t>(need);
    used_peak_ = std::max(used_peak_, used_);
    return f;
  } catch (const std::bad_alloc&) {  // no memory for a new slab's bits
    return nullptr;
  }
}

void BlockPool::release(void* ptr, size_t bytes) noexcept {
  uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  size_t n = block_bytes(bytes);
  used_ -= static_cast<int64_t>(n);
  Slab& s = slab_of(p);
  const uintptr_t hi = s.base + s.bytes;
  if (p + n < hi && test_bit(s.start, (p + n - s.base) / kAlign)) {  // a free range follows: absorb it
    Free* next = reinterpret_cast<Free*>(p + n);
    const size_t nb = next->bytes;
    unlink(s.kind, next);
    clear_bit(s.start, (p + n - s.base) / kAlign);
    clear_bit(s.end, (p + n + nb - s.base) / kAlign - 1);
    n += nb;
  }
  if (p > s.base && test_bit(s.end, (p - s.base) / kAlign - 1)) {  // a free range precedes: join it
    const size_t pb = *reinterpret_cast<const size_t*>(p - sizeof(size_t));
    Free* prev = reinterpret_cast<Free*>(p - pb);
    unlink(s.kind, prev);
    clear_bit(s.start, (p - pb - s.base) / kAlign);
    clear_bit(s.end, (p - s.base) / kAlign - 1);
    p -= pb;
    n += pb;
  }
  if (p == s.base && n == s.bytes) {  // the slab is empty
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
  make_free(s, p, n);
}

}  // namespace trident::emu
