// BlockPool (emulator/block_pool.h): the fiber workers' device memory. Alignment, no overlap, best fit and coalescing
// (memory is reused instead of mapped again), small and large blocks on separate slabs with empty slabs shared as
// spares, a request above the slab size on a slab of its own, and a random workload checked against a model.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "emulator/block_pool.h"

namespace trident::emu {
namespace {

constexpr size_t kSlab = BlockPool::kSlabBytes;

TEST(BlockPool, BlocksAreAlignedDisjointAndWritable) {
  BlockPool pool;
  std::vector<std::pair<char*, size_t>> got;
  for (size_t n : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{1000}, size_t{4096},
                   size_t{70000}, size_t{1} << 20}) {
    auto* p = static_cast<char*>(pool.allocate(n));
    ASSERT_NE(p, nullptr) << n;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % BlockPool::kAlign, 0u) << n;
    std::memset(p, static_cast<int>(got.size()), std::max<size_t>(n, 1));
    got.push_back({p, std::max<size_t>(n, 1)});
  }
  for (size_t i = 0; i < got.size(); ++i) {
    for (size_t k = 0; k < got[i].second; ++k) ASSERT_EQ(got[i].first[k], static_cast<char>(i));
    for (size_t j = i + 1; j < got.size(); ++j) {
      const auto a = reinterpret_cast<uintptr_t>(got[i].first), b = reinterpret_cast<uintptr_t>(got[j].first);
      EXPECT_TRUE(a + got[i].second <= b || b + got[j].second <= a) << i << " overlaps " << j;
    }
  }
  EXPECT_EQ(pool.used(), [&] {
    int64_t u = 0;
    for (auto& [p, n] : got) u += static_cast<int64_t>(BlockPool::block_bytes(n));
    return u;
  }());
  for (auto& [p, n] : got) pool.release(p, n);
  EXPECT_EQ(pool.used(), 0);
}

TEST(BlockPool, FreedMemoryIsReusedNotMappedAgain) {
  BlockPool pool;
  for (int step = 0; step < 100; ++step) {  // a step's buffers, freed in another order than allocated
    std::vector<std::pair<void*, size_t>> live;
    for (size_t k = 0; k < 50; ++k) {
      const size_t n = 100 + 997 * k % 20000;
      live.push_back({pool.allocate(n), n});
    }
    for (size_t k = 0; k < live.size(); k += 2) pool.release(live[k].first, live[k].second);
    for (size_t k = 1; k < live.size(); k += 2) pool.release(live[k].first, live[k].second);
  }
  EXPECT_EQ(pool.used(), 0);
  EXPECT_EQ(pool.reserved_peak(), static_cast<int64_t>(kSlab)) << "one slab serves every step";
}

TEST(BlockPool, NeighboursCoalesce) {
  BlockPool pool;
  void* pin = pool.allocate(100);  // keeps the slab in use
  std::vector<void*> small;
  for (int k = 0; k < 63; ++k) small.push_back(pool.allocate(1000));  // 63 x 1024 bytes
  std::mt19937 rng(3);
  std::shuffle(small.begin(), small.end(), rng);
  for (void* p : small) pool.release(p, 1000);
  // Only if the freed neighbours coalesced is there one free range of 63 KiB.
  std::vector<void*> more;
  for (int k = 0; k < 20; ++k) more.push_back(pool.allocate(63 * 1024));
  EXPECT_EQ(pool.reserved(), static_cast<int64_t>(kSlab)) << "one slab holds them all";
  for (void* p : more) pool.release(p, 63 * 1024);
  pool.release(pin, 100);
  EXPECT_EQ(pool.spare_slabs(), 1u);
}

TEST(BlockPool, EmptySlabsAreSparesForEitherKind) {
  BlockPool pool;
  std::vector<void*> large;
  for (size_t used = 0; used + (size_t{512} << 10) <= 3 * kSlab; used += size_t{512} << 10)
    large.push_back(pool.allocate(size_t{512} << 10));
  EXPECT_EQ(pool.reserved(), static_cast<int64_t>(3 * kSlab));
  for (void* p : large) pool.release(p, size_t{512} << 10);
  EXPECT_EQ(pool.spare_slabs(), 3u);
  std::vector<void*> small;
  for (size_t used = 0; used + 4096 <= 3 * kSlab; used += 4096) small.push_back(pool.allocate(4096));
  EXPECT_EQ(pool.reserved(), static_cast<int64_t>(3 * kSlab)) << "small blocks took the spares";
  EXPECT_EQ(pool.spare_slabs(), 0u);
  for (void* p : small) pool.release(p, 4096);
  EXPECT_EQ(pool.spare_slabs(), 3u);
  EXPECT_EQ(pool.reserved_peak(), static_cast<int64_t>(3 * kSlab));
}

TEST(BlockPool, ARequestAboveTheSlabSizeHasItsOwnSlab) {
  BlockPool pool;
  void* a = pool.allocate(100);
  const size_t big = kSlab + 12345;
  auto* b = static_cast<char*>(pool.allocate(big));
  ASSERT_NE(b, nullptr);
  b[0] = 1, b[big - 1] = 2;
  const size_t rounded = (big + BlockPool::kHugePage - 1) & ~(BlockPool::kHugePage - 1);
  EXPECT_EQ(pool.reserved(), static_cast<int64_t>(kSlab + rounded));
  pool.release(b, big);
  EXPECT_EQ(pool.reserved(), static_cast<int64_t>(kSlab)) << "unmapped when freed";
  EXPECT_EQ(pool.reserved_peak(), static_cast<int64_t>(kSlab + rounded));
  pool.release(a, 100);
}

TEST(BlockPool, RandomWorkloadMatchesAModel) {
  BlockPool pool;
  std::mt19937_64 rng(12345);
  std::map<uintptr_t, std::pair<size_t, uint8_t>> live;  // start -> (bytes, fill)
  int64_t used = 0;
  for (int op = 0; op < 20000; ++op) {
    if (live.size() < 300 || rng() % 2 == 0) {  // about 300 blocks live, 1 in 16 a large one
      const size_t n = rng() % 16 == 0 ? rng() % (size_t{1} << 20) : rng() % 5000;
      auto* p = static_cast<uint8_t*>(pool.allocate(n));
      ASSERT_NE(p, nullptr);
      const auto a = reinterpret_cast<uintptr_t>(p);
      auto next = live.lower_bound(a);
      if (next != live.end()) {
        ASSERT_LE(a + std::max<size_t>(n, 1), next->first) << "overlaps the next block";
      }
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second.first, a) << "overlaps the previous block";
      }
      const auto fill = static_cast<uint8_t>(rng());
      for (size_t k = 0; k < std::max<size_t>(n, 1); k += 61) p[k] = fill;
      live[a] = {std::max<size_t>(n, 1), fill};
      used += static_cast<int64_t>(BlockPool::block_bytes(n));
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      const auto* p = reinterpret_cast<const uint8_t*>(it->first);
      for (size_t k = 0; k < it->second.first; k += 61) {
        ASSERT_EQ(p[k], it->second.second) << "a block was overwritten";
      }
      pool.release(reinterpret_cast<void*>(it->first), it->second.first);
      used -= static_cast<int64_t>(BlockPool::block_bytes(it->second.first));
      live.erase(it);
    }
    ASSERT_EQ(pool.used(), used);
  }
  for (auto& [a, v] : live) pool.release(reinterpret_cast<void*>(a), v.first);
  EXPECT_EQ(pool.used(), 0);
  EXPECT_EQ(pool.spare_slabs(), pool.slabs()) << "every standard slab is empty again";
}

}  // namespace
}  // namespace trident::emu
