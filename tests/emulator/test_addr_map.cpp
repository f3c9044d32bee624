// AddrMap (emulator/addr_map.h): a random workload of inserts, look-ups and erases against std::unordered_map,
// with addresses that collide in their home slots (64-byte multiples of a few bases), growth from empty and
// deletions that must shift later entries of a probe run back.
#include <gtest/gtest.h>

#include <random>
#include <unordered_map>
#include <vector>

#include "emulator/addr_map.h"

namespace trident::emu {
namespace {

TEST(AddrMap, MatchesAHashMapUnderRandomInsertsAndErases) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    std::mt19937_64 rng(seed);
    AddrMap m;
    std::unordered_map<uintptr_t, int64_t> want;
    std::vector<uintptr_t> keys;
    for (int op = 0; op < 200000; ++op) {
      const int what = static_cast<int>(rng() % 8);
      if (what < 4 || keys.empty()) {  // insert: new keys, now and then one already present
        const uintptr_t k = 0x10000 + 64 * (rng() % 5000);
        const auto v = static_cast<int64_t>(rng() % 1000000);
        const bool fresh = want.emplace(k, v).second;
        ASSERT_EQ(m.insert(k, v), fresh) << "repro: seed " << seed << " op " << op;
        if (fresh) keys.push_back(k);
      } else if (what < 7) {  // erase a present key
        const size_t i = rng() % keys.size();
        m.erase(keys[i]);
        want.erase(keys[i]);
        keys[i] = keys.back();
        keys.pop_back();
      } else {  // erase an absent one: nothing changes
        m.erase(0x7000000 + 64 * (rng() % 100));
      }
      if (op % 97 == 0) {
        ASSERT_EQ(m.size(), want.size()) << "repro: seed " << seed << " op " << op;
        for (uintptr_t k : keys) {
          const int64_t* v = m.find(k);
          ASSERT_NE(v, nullptr) << "repro: seed " << seed << " op " << op << " key " << k;
          ASSERT_EQ(*v, want[k]) << "repro: seed " << seed << " op " << op;
        }
        ASSERT_EQ(m.find(0x7000000), nullptr);
      }
    }
    size_t seen = 0;
    m.for_each([&](uintptr_t k, int64_t v) {
      ++seen;
      EXPECT_EQ(want.at(k), v);
    });
    EXPECT_EQ(seen, want.size());
  }
}

}  // namespace
}  // namespace trident::emu
