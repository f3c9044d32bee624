// Ranks as fibers (SpawnOptions::exec = RankExec::fibers, the default) against ranks as threads: the same bits
// and traces for every worker count, per-rank state that survives switches (rank_local_slot, the C++ exception
// being handled), fault detection when ranks share a worker, and bad options.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <thread>

#include "emulator/world.h"

namespace trident {
namespace {

using Clock = std::chrono::steady_clock;

emu::SpawnOptions with(emu::RankExec e, int workers = 0) {
  emu::SpawnOptions o;
  o.exec = e;
  o.workers = workers;
  return o;
}

// A mix of every path: eager and direct collectives, a split, all_to_all, a ring of grouped send/recv, a blocking
// pairwise exchange. Returns every rank's outputs.
std::vector<std::vector<float>> workload(int n, const emu::SpawnOptions& o, std::vector<uint64_t>* hashes) {
  std::vector<std::vector<float>> out(static_cast<size_t>(n));
  auto res = emu::spawn(n, [&](emu::RankContext& ctx) {
    const int r = ctx.rank();
    auto& w = ctx.world();
    std::vector<float> v;
    for (size_t count : {size_t{1}, size_t{37}, size_t{9000}}) {  // 9000 floats (36 KB): the direct path
      std::vector<float> x(count), y(count);
      for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>((r * 7 + static_cast<int>(i)) % 13) * 0.25f;
      w.all_reduce(x.data(), y.data(), count, DataType::f32, ReduceOp::sum);
      v.insert(v.end(), y.begin(), y.end());
      std::vector<float> g(count * static_cast<size_t>(n));
      w.all_gather(x.data(), g.data(), count, DataType::f32);
      v.push_back(g[count * static_cast<size_t>((r + 1) % n)]);
    }
    auto sub = w.split(r % 3, r, "sub");
    std::vector<float> s(static_cast<size_t>(sub->size()) * 4), d(s.size());
    for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<float>(r * 100 + static_cast<int>(i));
    sub->all_to_all(s.data(), d.data(), 4, DataType::f32);
    v.insert(v.end(), d.begin(), d.end());
    float tok = static_cast<float>(r), got = -1;
    w.group_start();
    w.send(&tok, 1, DataType::f32, (r + 1) % n);
    w.recv(&got, 1, DataType::f32, (r + n - 1) % n);
    w.group_end();
    v.push_back(got);
    const int peer = r ^ 1;
    if (peer < n) {
      float mine = static_cast<float>(r) + 0.5f, theirs = -1;
      if (r % 2 == 0) {
        w.send(&mine, 1, DataType::f32, peer);
        w.recv(&theirs, 1, DataType::f32, peer);
      } else {
        w.recv(&theirs, 1, DataType::f32, peer);
        w.send(&mine, 1, DataType::f32, peer);
      }
      v.push_back(theirs);
    }
    out[static_cast<size_t>(r)] = std::move(v);
  }, o);
  if (hashes) {
    hashes->clear();
    for (const auto& rr : res.ranks)
      for (const auto& s : rr.trace)
        for (const auto& t : s.entries) hashes->push_back(t.recv_hash);
  }
  return out;
}

TEST(Fibers, SameBitsAsThreadsForEveryWorkerCount) {
  for (int n : {1, 2, 7, 64}) {
    std::vector<uint64_t> h_threads;
    const auto want = workload(n, with(emu::RankExec::threads), &h_threads);
    for (int workers : {0, 1, 3, n + 1}) {  // n + 1: more workers than ranks (one per rank)
      std::vector<uint64_t> h;
      const auto got = workload(n, with(emu::RankExec::fibers, workers), &h);
      ASSERT_EQ(got.size(), want.size());
      for (size_t r = 0; r < got.size(); ++r) {
        ASSERT_EQ(got[r].size(), want[r].size()) << "n " << n << " workers " << workers << " rank " << r;
        EXPECT_EQ(std::memcmp(got[r].data(), want[r].data(), got[r].size() * sizeof(float)), 0)
            << "n " << n << " workers " << workers << " rank " << r;
      }
      EXPECT_EQ(h, h_threads) << "n " << n << " workers " << workers;
      EXPECT_FALSE(h.empty());
    }
  }
}

// A thread_local set by one rank would be another rank's after a switch; the rank-local slot follows the rank.
TEST(Fibers, RankLocalSlotFollowsTheRank) {
  EXPECT_EQ(emu::rank_local_slot(), nullptr);  // outside a rank
  for (auto exec : {emu::RankExec::fibers, emu::RankExec::threads}) {
    std::atomic<int> bad{0};
    emu::spawn(16, [&](emu::RankContext& ctx) {
      void** slot = emu::rank_local_slot();
      ASSERT_NE(slot, nullptr);
      int mine = ctx.rank();
      *slot = &mine;
      for (int i = 0; i < 50; ++i) {
        float x = 1, y = 0;
        ctx.world().all_reduce(&x, &y, 1, DataType::f32, ReduceOp::sum);  // every rank switches out here
        if (emu::rank_local_slot() != slot || *emu::rank_local_slot() != &mine) ++bad;
      }
      *slot = nullptr;
    }, with(exec, 1));
    EXPECT_EQ(bad.load(), 0);
  }
}

// A rank that blocks while handling an exception (inside a catch block) keeps its own exception: `throw;` after
// the collective rethrows it, although other ranks on the same worker threw and caught theirs meanwhile.
TEST(Fibers, ExceptionBeingHandledSurvivesASwitch) {
  std::atomic<int> ok{0};
  emu::spawn(8, [&](emu::RankContext& ctx) {
    const int r = ctx.rank();
    try {
      try {
        throw std::runtime_error(fmt::format("rank {} error", r));
      } catch (const std::exception&) {
        float x = 1, y = 0;
        for (int i = 0; i < 3; ++i) ctx.world().all_reduce(&x, &y, 1, DataType::f32, ReduceOp::sum);
        throw;  // the exception this rank is handling
      }
    } catch (const std::runtime_error& e) {
      if (std::string(e.what()) == fmt::format("rank {} error", r)) ++ok;
    }
    EXPECT_EQ(std::uncaught_exceptions(), 0);
  }, with(emu::RankExec::fibers, 1));
  EXPECT_EQ(ok.load(), 8);
}

// Every rank on one worker: deadlocks and mismatches are still reported at once.
TEST(Fibers, DeadlockAndMismatchOnOneWorker) {
  try {
    emu::spawn(4, [](emu::RankContext& ctx) {
      float b = 0;
      ctx.world().recv(&b, 1, DataType::f32, (ctx.rank() + 1) % 4);
    }, with(emu::RankExec::fibers, 1));
    ADD_FAILURE() << "no deadlock reported";
  } catch (const emu::RankError& e) {
    EXPECT_NE(std::string(e.what()).find("deadlock: all 4 live rank(s) are blocked"), std::string::npos) << e.what();
  }
  try {
    emu::spawn(3, [](emu::RankContext& ctx) {
      float x = 1, y = 0;
      ctx.world().all_reduce(&x, &y, 1, DataType::f32, ctx.rank() == 2 ? ReduceOp::max : ReduceOp::sum);
    }, with(emu::RankExec::fibers, 1));
    ADD_FAILURE() << "no mismatch reported";
  } catch (const emu::RankError& e) {
    EXPECT_NE(std::string(e.what()).find("ranks disagree on reduce op"), std::string::npos) << e.what();
  }
}

// A rank stuck in compute holds its worker. Ranks on other workers are failed by the watchdog as with threads;
// a blocked rank sharing the stuck rank's worker gets the same report once the stuck rank lets go. Never a hang.
TEST(Fibers, StuckComputeOnASharedWorker) {
  for (int workers : {1, 2}) {
    emu::SpawnOptions o = with(emu::RankExec::fibers, workers);
    o.watchdog = std::chrono::milliseconds(200);
    const auto t0 = Clock::now();
    std::string msg;
    std::atomic<int> reports{0};
    try {
      emu::spawn(4, [&](emu::RankContext& ctx) {
        float x = 1, y = 0;
        if (ctx.rank() == 3) std::this_thread::sleep_for(std::chrono::milliseconds(800));  // runs last on its worker
        try {
          ctx.world().all_reduce(&x, &y, 1, DataType::f32, ReduceOp::sum);
        } catch (const Error& e) {
          // the blocked ranks get the report; the stuck one finds the communicator aborted with it attached
          if (std::string(e.what()).starts_with("watchdog: no progress for 200 ms")) ++reports;
          throw;
        }
      }, o);
      ADD_FAILURE() << "spawn did not fail";
    } catch (const emu::RankError& e) {
      msg = e.what();
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    EXPECT_NE(msg.find("rank 3: running, not in a communicator call"), std::string::npos) << msg;
    EXPECT_EQ(reports.load(), 3) << msg;
    EXPECT_LT(s, 2.0);
  }
}

TEST(Fibers, ManyRanksFewWorkers) {
  std::atomic<int64_t> sum{0};
  emu::SpawnOptions o = with(emu::RankExec::fibers, 3);
  o.stack_bytes = 64 * 1024;
  emu::spawn(1100, [&](emu::RankContext& ctx) {
    float x = 1, y = 0;
    for (int i = 0; i < 3; ++i) ctx.world().all_reduce(&x, &y, 1, DataType::f32, ReduceOp::sum);
    sum += static_cast<int64_t>(y);
  }, o);
  EXPECT_EQ(sum.load(), int64_t{1100} * 1100);
}

TEST(Fibers, BadWorkerCountIsOneError) {
  try {
    emu::spawn(2, [](emu::RankContext&) {}, with(emu::RankExec::fibers, -1));
    ADD_FAILURE() << "accepted workers = -1";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("spawn: workers must be >= 0"), std::string::npos) << e.what();
  }
  // more workers than ranks: one per rank
  int ran = 0;
  emu::spawn(1, [&](emu::RankContext&) { ++ran; }, with(emu::RankExec::fibers, 16));
  EXPECT_EQ(ran, 1);
}

}  // namespace
}  // namespace trident
