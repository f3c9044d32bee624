// 1,024 fake ranks on a small machine: a few collectives, a split and an all-to-all, with closed-form results.
#include <gtest/gtest.h>

#include <chrono>

#include "emulator/world.h"

namespace trident {
namespace {

TEST(Scale, ThousandTwentyFourRanks) {
  const int n = 1024;
  std::vector<std::string> errs(n);
  const auto t0 = std::chrono::steady_clock::now();
  emu::spawn(n, [&](emu::RankContext& ctx) {
    const int r = ctx.rank();
    std::string& e = errs[static_cast<size_t>(r)];
    int64_t x = r, sum = 0;
    ctx.world().all_reduce(&x, &sum, 1, DataType::i64, ReduceOp::sum);
    if (sum != int64_t{n} * (n - 1) / 2) e += fmt::format("sum {}; ", sum);
    std::vector<int32_t> all(n);
    const int32_t me = r;
    ctx.world().all_gather(&me, all.data(), 1, DataType::i32);
    for (int q = 0; q < n; ++q)
      if (all[static_cast<size_t>(q)] != q) { e += "gather; "; break; }
    auto g = ctx.world().split(r / 64, r, "block64");
    std::vector<int32_t> s(64), d(64);
    for (int j = 0; j < 64; ++j) s[static_cast<size_t>(j)] = r * 1000 + j;
    g->all_to_all(s.data(), d.data(), 1, DataType::i32);
    for (int j = 0; j < 64; ++j)
      if (d[static_cast<size_t>(j)] != ((r / 64) * 64 + j) * 1000 + g->rank()) { e += "a2a; "; break; }
    int64_t root_val = r == 777 ? 4242 : 0;
    ctx.world().broadcast(&root_val, &root_val, 1, DataType::i64, 777);
    if (root_val != 4242) e += "bcast; ";
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int r = 0; r < n; ++r) ASSERT_EQ(errs[static_cast<size_t>(r)], "") << "rank " << r;
  std::cout << "1024 ranks, 5 collectives + split: " << s << " s\n";
}

}  // namespace
}  // namespace trident
