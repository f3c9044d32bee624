// Fault injection: every kind of disagreement between ranks is detected, reported once with each rank's call
// and call site (file:line), within 2 s, and the process keeps working afterwards.
#include <gtest/gtest.h>

#include <chrono>
#include <source_location>
#include <stdexcept>
#include <thread>

#include "emulator/world.h"

namespace trident {
namespace {

using Clock = std::chrono::steady_clock;
using std::source_location;

std::string at(const source_location& l) { return fmt::format("{}:{}", l.file_name(), l.line()); }

// Runs fn on n ranks, expects a RankError; returns its message and checks the 2 s bound.
std::string expect_failure(int n, const std::function<void(emu::RankContext&)>& fn, emu::SpawnOptions opts = {}) {
  const auto t0 = Clock::now();
  std::string msg;
  try {
    emu::spawn(n, fn, opts);
    ADD_FAILURE() << "spawn did not fail";
  } catch (const emu::RankError& e) {
    msg = e.what();
  }
  std::cout << "report: " << msg << "\n";
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LT(s, 2.0) << "detection took " << s << " s";
  // The process continues normally: a fresh world works.
  std::vector<float> out(3, 0.f);
  emu::spawn(3, [&](emu::RankContext& ctx) {
    float x = static_cast<float>(ctx.rank() + 1);
    float y = 0;
    ctx.world().all_reduce(&x, &y, 1, DataType::f32, ReduceOp::sum);
    out[static_cast<size_t>(ctx.rank())] = y;
  });
  EXPECT_EQ(out, std::vector<float>(3, 6.f));
  return msg;
}

#define EXPECT_HAS(msg, s) EXPECT_NE((msg).find(s), std::string::npos) << "missing '" << (s) << "' in:\n" << (msg)

TEST(Faults, WrongReduceOp) {
  const auto l_sum = source_location::current();
  const auto l_max = source_location::current();
  const auto msg = expect_failure(4, [&](emu::RankContext& ctx) {
    float x[8] = {}, y[8];
    const bool odd = ctx.rank() == 2;
    ctx.world().all_reduce(x, y, 8, DataType::f32, odd ? ReduceOp::max : ReduceOp::sum, {}, odd ? l_max : l_sum);
  });
  EXPECT_HAS(msg, "collective mismatch on communicator 'world'");
  EXPECT_HAS(msg, "disagree on reduce op");
  EXPECT_HAS(msg, "rank 2 (world rank 2): all_reduce(count=8, f32, max) #0 at " + at(l_max));
  for (int r : {0, 1, 3})
    EXPECT_HAS(msg, fmt::format("rank {} (world rank {}): all_reduce(count=8, f32, sum) #0 at {}", r, r, at(l_sum)));
}

TEST(Faults, WrongCount) {
  const auto l_a = source_location::current();
  const auto l_b = source_location::current();
  const auto msg = expect_failure(3, [&](emu::RankContext& ctx) {
    float x[10] = {}, y[30];
    const bool odd = ctx.rank() == 1;
    ctx.world().all_gather(x, y, odd ? 9 : 10, DataType::f32, {}, odd ? l_b : l_a);
  });
  EXPECT_HAS(msg, "disagree on count");
  EXPECT_HAS(msg, "rank 1 (world rank 1): all_gather(count=9, f32) #0 at " + at(l_b));
  EXPECT_HAS(msg, "rank 0 (world rank 0): all_gather(count=10, f32) #0 at " + at(l_a));
  EXPECT_HAS(msg, "rank 2 (world rank 2): all_gather(count=10, f32) #0 at " + at(l_a));
}

TEST(Faults, WrongDtype) {
  const auto l_a = source_location::current();
  const auto l_b = source_location::current();
  const auto msg = expect_failure(4, [&](emu::RankContext& ctx) {
    int32_t x[4] = {}, y[4];
    const bool odd = ctx.rank() == 3;
    ctx.world().all_reduce(x, y, 4, odd ? DataType::i32 : DataType::f32, ReduceOp::sum, {}, odd ? l_b : l_a);
  });
  EXPECT_HAS(msg, "disagree on dtype");
  EXPECT_HAS(msg, "rank 3 (world rank 3): all_reduce(count=4, i32, sum) #0 at " + at(l_b));
  EXPECT_HAS(msg, "rank 0 (world rank 0): all_reduce(count=4, f32, sum) #0 at " + at(l_a));
}

TEST(Faults, WrongRoot) {
  const auto l_a = source_location::current();
  const auto l_b = source_location::current();
  const auto msg = expect_failure(4, [&](emu::RankContext& ctx) {
    double x[2] = {};
    const bool odd = ctx.rank() == 1;
    ctx.world().broadcast(x, x, 2, DataType::f64, odd ? 1 : 0, {}, odd ? l_b : l_a);
  });
  EXPECT_HAS(msg, "disagree on root");
  EXPECT_HAS(msg, "rank 1 (world rank 1): broadcast(count=2, f64, root=1) #0 at " + at(l_b));
  EXPECT_HAS(msg, "rank 2 (world rank 2): broadcast(count=2, f64, root=0) #0 at " + at(l_a));
}

TEST(Faults, SwappedOrder) {
  const auto l_ar = source_location::current();
  const auto l_ag = source_location::current();
  const auto msg = expect_failure(3, [&](emu::RankContext& ctx) {
    float x[6] = {}, y[6];
    auto ar = [&] { ctx.world().all_reduce(x, y, 2, DataType::f32, ReduceOp::sum, {}, l_ar); };
    auto ag = [&] { ctx.world().all_gather(x, y, 2, DataType::f32, {}, l_ag); };
    if (ctx.rank() == 0) {
      ag();
      ar();
    } else {
      ar();
      ag();
    }
  });
  EXPECT_HAS(msg, "disagree on operation");
  EXPECT_HAS(msg, "rank 0 (world rank 0): all_gather(count=2, f32) #0 at " + at(l_ag));
  EXPECT_HAS(msg, "rank 1 (world rank 1): all_reduce(count=2, f32, sum) #0 at " + at(l_ar));
}

TEST(Faults, SkippedCollectiveThenFinished) {
  const auto l_ar = source_location::current();
  const auto msg = expect_failure(4, [&](emu::RankContext& ctx) {
    float x = 1, y;
    if (ctx.rank() != 3) ctx.world().all_reduce(&x, &y, 1, DataType::f32, ReduceOp::sum, {}, l_ar);
  });
  EXPECT_HAS(msg, "deadlock");
  for (int r : {0, 1, 2}) EXPECT_HAS(msg, fmt::format("rank {}: all_reduce(count=1, f32, sum) #0 at {}", r, at(l_ar)));
  EXPECT_HAS(msg, "rank 3: finished");
}

TEST(Faults, SkippedCollectiveWaitingElsewhere) {
  const auto l_world = source_location::current();
  const auto l_pair = source_location::current();
  const auto msg = expect_failure(4, [&](emu::RankContext& ctx) {
    const int r = ctx.rank();
    auto pair = ctx.world().split(r / 2, r, "pair");
    float x = 1, y;
    if (r != 3) ctx.world().all_reduce(&x, &y, 1, DataType::f32, ReduceOp::sum, {}, l_world);  // rank 3 skips it
    pair->all_reduce(&x, &y, 1, DataType::f32, ReduceOp::sum, {}, l_pair);
  });
  EXPECT_HAS(msg, "deadlock");
  EXPECT_HAS(msg, "rank 2: all_reduce(count=1, f32, sum) #1 at " + at(l_world));
  EXPECT_HAS(msg, "rank 3: all_reduce(count=1, f32, sum) #0 at " + at(l_pair) + " on communicator 'pair'");
}

TEST(Faults, UnmatchedSendRecv) {
  const auto l_send = source_location::current();
  const auto l_recv = source_location::current();
  const auto msg = expect_failure(3, [&](emu::RankContext& ctx) {
    float b[4] = {};
    if (ctx.rank() == 0) ctx.world().send(b, 4, DataType::f32, 1, {}, l_send);
    if (ctx.rank() == 1) ctx.world().recv(b, 4, DataType::f32, 2, {}, l_recv);  // expects rank 2, which sends nothing
  });
  EXPECT_HAS(msg, "deadlock");
  EXPECT_HAS(msg, "rank 0: 1 unmatched in a group of 1 send/recv on communicator 'world'");
  EXPECT_HAS(msg, "send(count=4, f32, to 1) #0 at " + at(l_send));
  EXPECT_HAS(msg, "recv(count=4, f32, from 2) #0 at " + at(l_recv));
  EXPECT_HAS(msg, "rank 2: finished");
}

TEST(Faults, SendRecvCountMismatch) {
  const auto l_send = source_location::current();
  const auto l_recv = source_location::current();
  const auto msg = expect_failure(2, [&](emu::RankContext& ctx) {
    float b[12] = {};
    if (ctx.rank() == 0) ctx.world().send(b, 10, DataType::f32, 1, {}, l_send);
    if (ctx.rank() == 1) ctx.world().recv(b, 12, DataType::f32, 0, {}, l_recv);
  });
  EXPECT_HAS(msg, "send/recv mismatch");
  EXPECT_HAS(msg, "disagree on count");
  EXPECT_HAS(msg, "rank 0 (world rank 0): send(count=10, f32, to 1) #0 at " + at(l_send));
  EXPECT_HAS(msg, "rank 1 (world rank 1): recv(count=12, f32, from 0) #0 at " + at(l_recv));
}

// all_to_all is one collective on the emulator (Communicator::do_all_to_all): a count that differs, or another call in
// its place, is the collective mismatch report (naming the call site of each rank), not a hang.
TEST(Faults, AllToAllCountMismatch) {
  const auto l_a = source_location::current();
  const auto l_b = source_location::current();
  const auto msg = expect_failure(3, [&](emu::RankContext& ctx) {
    std::vector<float> s(9, 1.f), d(9);
    const bool odd = ctx.rank() == 1;
    ctx.world().all_to_all(s.data(), d.data(), odd ? 2 : 3, DataType::f32, {}, odd ? l_b : l_a);
  });
  EXPECT_HAS(msg, "collective mismatch on communicator 'world'");
  EXPECT_HAS(msg, "disagree on count");
  EXPECT_HAS(msg, "rank 1 (world rank 1): all_to_all(count=2, f32) #0 at " + at(l_b));
  EXPECT_HAS(msg, "rank 0 (world rank 0): all_to_all(count=3, f32) #0 at " + at(l_a));
}

TEST(Faults, AllToAllAgainstAllGather) {
  const auto l_a2a = source_location::current();
  const auto l_ag = source_location::current();
  const auto msg = expect_failure(4, [&](emu::RankContext& ctx) {
    std::vector<float> s(8, 1.f), d(8);
    if (ctx.rank() == 2) ctx.world().all_gather(s.data(), d.data(), 2, DataType::f32, {}, l_ag);
    else ctx.world().all_to_all(s.data(), d.data(), 2, DataType::f32, {}, l_a2a);
  });
  EXPECT_HAS(msg, "collective mismatch on communicator 'world'");
  EXPECT_HAS(msg, "disagree on operation");
  EXPECT_HAS(msg, "rank 2 (world rank 2): all_gather(count=2, f32) #0 at " + at(l_ag));
  EXPECT_HAS(msg, "rank 3 (world rank 3): all_to_all(count=2, f32) #0 at " + at(l_a2a));
}

TEST(Faults, AllToAllvInconsistentCounts) {
  // Rank 1 expects 3 elements from rank 2, which sends 2: the grouped send/recv pair disagrees.
  const auto l_a2a = source_location::current();
  const auto msg = expect_failure(3, [&](emu::RankContext& ctx) {
    const int r = ctx.rank();
    std::vector<size_t> sc(3, 2), sd = {0, 2, 4}, rc(3, 2), rd = {0, 3, 6};
    if (r == 1) rc[2] = 3;
    std::vector<float> s(6, 1.f), d(9);
    ctx.world().all_to_allv(s.data(), sc.data(), sd.data(), d.data(), rc.data(), rd.data(), DataType::f32, {},
                            l_a2a);
  });
  EXPECT_HAS(msg, "send/recv mismatch");
  EXPECT_HAS(msg, "rank 2 (world rank 2): send(count=2, f32, to 1) #0 at " + at(l_a2a));
  EXPECT_HAS(msg, "rank 1 (world rank 1): recv(count=3, f32, from 2) #0 at " + at(l_a2a));
}

TEST(Faults, RankThrows) {
  int aborted = 0;
  std::mutex mu;
  emu::RankError* none = nullptr;
  (void)none;
  const auto t0 = Clock::now();
  try {
    emu::spawn(8, [&](emu::RankContext& ctx) {
      float x = 1, y;
      if (ctx.rank() == 5) throw std::runtime_error("boom 42");
      try {
        ctx.world().all_reduce(&x, &y, 1, DataType::f32, ReduceOp::sum);
      } catch (const Error& e) {
        std::lock_guard lk(mu);
        aborted += std::string(e.what()).find("aborted: rank 5 failed: boom 42") != std::string::npos;
        throw;
      }
    });
    ADD_FAILURE() << "spawn did not fail";
  } catch (const emu::RankError& e) {
    EXPECT_EQ(e.rank, 5);
    EXPECT_EQ(e.original, "boom 42");
    EXPECT_EQ(e.failed_ranks, 8);
    EXPECT_HAS(std::string(e.what()), "rank 5: boom 42");
  }
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 2.0);
  EXPECT_EQ(aborted, 7);
  expect_failure(2, [](emu::RankContext& ctx) {
    if (ctx.rank() == 0) throw Error("second");
  });
}

TEST(Faults, ThrowAbortsOnlyItsCommunicators) {
  // Rank 0 fails; ranks 2,3 share a communicator without it and finish their work there.
  std::atomic<int> pair_done{0};
  expect_failure(4, [&](emu::RankContext& ctx) {
    const int r = ctx.rank();
    auto pair = ctx.world().split(r / 2, r, "pair");
    if (r == 0) throw Error("rank zero fails");
    float x = 1, y = 0;
    pair->all_reduce(&x, &y, 1, DataType::f32, ReduceOp::sum);
    if (r >= 2 && y == 2.f) ++pair_done;
  });
  EXPECT_EQ(pair_done.load(), 2);
}

TEST(Faults, WatchdogStuckCompute) {
  emu::SpawnOptions o;
  o.watchdog = std::chrono::milliseconds(300);
  std::atomic<double> detected{-1};
  const auto t0 = Clock::now();
  std::string msg;
  const auto l_ar = source_location::current();
  try {
    emu::spawn(3, [&](emu::RankContext& ctx) {
      float x = 1, y;
      if (ctx.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // "stuck" in compute
      try {
        ctx.world().all_reduce(&x, &y, 1, DataType::f32, ReduceOp::sum, {}, l_ar);
      } catch (const Error&) {
        if (ctx.rank() == 0) detected = std::chrono::duration<double>(Clock::now() - t0).count();
        throw;
      }
    }, o);
  } catch (const emu::RankError& e) {
    msg = e.what();
  }
  EXPECT_HAS(msg, "watchdog: no progress for 300 ms");
  EXPECT_HAS(msg, "rank 1: running, not in a communicator call");
  EXPECT_HAS(msg, "rank 0: blocked in all_reduce(count=1, f32, sum) #0 at " + at(l_ar));
  EXPECT_GT(detected.load(), 0.2);
  EXPECT_LT(detected.load(), 2.0);
}

TEST(Faults, UseAfterAbortFailsFast) {
  const auto msg = expect_failure(2, [](emu::RankContext& ctx) {
    float x = 1, y;
    if (ctx.rank() == 0) throw Error("first");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ctx.world().all_reduce(&x, &y, 1, DataType::f32, ReduceOp::sum);  // world is aborted by now
  });
  EXPECT_HAS(msg, "rank 0: first");
}

TEST(Faults, CaughtFaultPoisonsCommunicator) {
  // Both ranks receive first: deadlock. They catch it and try to go on with the same communicator, which is
  // aborted: the next call fails at once with the original report attached.
  std::vector<std::string> second(2);
  expect_failure(2, [&](emu::RankContext& ctx) {
    float b = 0;
    try {
      ctx.world().recv(&b, 1, DataType::f32, 1 - ctx.rank());
    } catch (const Error&) {
    }
    try {
      ctx.world().all_reduce(&b, &b, 1, DataType::f32, ReduceOp::sum);
    } catch (const Error& e) {
      second[static_cast<size_t>(ctx.rank())] = e.what();
      throw;
    }
  });
  for (const auto& m : second) {
    EXPECT_HAS(m, "communicator 'world' (id 0, world ranks 0,1) was aborted by an earlier failure");
    EXPECT_HAS(m, "deadlock");
  }
}

TEST(Faults, InvalidArguments) {
  expect_failure(2, [](emu::RankContext& ctx) {
    float x = 1;
    ctx.world().all_reduce(&x, &x, 1, DataType::f32, ReduceOp::exact_sum);
  });
  const auto msg = expect_failure(2, [](emu::RankContext& ctx) {
    float x = 1;
    ctx.world().all_reduce(&x, &x, 1, DataType::exact_f32, ReduceOp::sum);
  });
  EXPECT_HAS(msg, "reduce op sum is not valid with dtype exact_f32");
  const auto m2 = expect_failure(2, [](emu::RankContext& ctx) {
    float x[4];
    ctx.world().all_gather(x + 1, x, 2, DataType::f32);  // overlapping, not NCCL in-place on rank 0
  });
  EXPECT_HAS(m2, "not NCCL in-place");
  const auto m3 = expect_failure(2, [](emu::RankContext& ctx) {
    float x[2];
    ctx.world().group_start();
    ctx.world().all_reduce(x, x, 2, DataType::f32, ReduceOp::sum);
  });
  EXPECT_HAS(m3, "only send/recv may be grouped");
}

// group_start() without group_end() never drops sends silently: the rank fails at its exit (or at its next call
// outside the group), naming where the group started; its peer is released with the same report.
TEST(Faults, GroupStartWithoutGroupEndAtExit) {
  const auto l_start = source_location::current();
  const auto msg = expect_failure(2, [&](emu::RankContext& ctx) {
    float x[4] = {1, 2, 3, 4};
    if (ctx.rank() == 0) {
      ctx.world().group_start(l_start);
      ctx.world().send(x, 4, DataType::f32, 1);
      return;  // no group_end: the send was never issued
    }
    ctx.world().recv(x, 4, DataType::f32, 0);
  });
  EXPECT_HAS(msg, "rank 0: the rank returned while group_start() at " + at(l_start));
  EXPECT_HAS(msg, "has no group_end()");
  EXPECT_HAS(msg, "never issued");
}

TEST(Faults, GroupStartWithoutGroupEndOnDestroyedCommunicator) {
  const auto l_start = source_location::current();
  const auto msg = expect_failure(4, [&](emu::RankContext& ctx) {
    auto sub = ctx.world().split(ctx.rank() % 2, ctx.rank(), "pairs");
    float x = 1;
    if (ctx.rank() == 1) {
      sub->group_start(l_start);
      sub->send(&x, 1, DataType::f32, 1);  // to world rank 3
      sub.reset();  // destroyed with its group open
      return;
    }
    if (ctx.rank() == 3) sub->recv(&x, 1, DataType::f32, 0);
  });
  EXPECT_HAS(msg, "rank 1: the rank returned while group_start() at " + at(l_start));
  EXPECT_HAS(msg, "communicator 'pairs'");
  EXPECT_HAS(msg, "(communicator destroyed)");
}

TEST(Faults, GroupStartWithoutGroupEndAtNextCall) {
  const auto l_start = source_location::current();
  const auto l_next = source_location::current();
  const auto msg = expect_failure(4, [&](emu::RankContext& ctx) {
    auto sub = ctx.world().split(0, ctx.rank(), "all");
    float x = 1;
    if (ctx.rank() == 2) {
      ctx.world().group_start(l_start);
      ctx.world().send(&x, 1, DataType::f32, 3);
    }
    // rank 2's next call is on another communicator while its world group is open
    sub->all_reduce(&x, &x, 1, DataType::f32, ReduceOp::sum, {}, l_next);
  });
  EXPECT_HAS(msg, "rank 2: a call at " + at(l_next));
  EXPECT_HAS(msg, "group_start() at " + at(l_start));
  // on the same communicator the call inside the group names both sites too
  const auto m2 = expect_failure(2, [&](emu::RankContext& ctx) {
    float x = 1;
    ctx.world().group_start(l_start);
    ctx.world().all_reduce(&x, &x, 1, DataType::f32, ReduceOp::sum, {}, l_next);
  });
  EXPECT_HAS(m2, "at " + at(l_next) + " (group_start() at " + at(l_start) + ")");
}

// Out of memory in a rank: one error naming the rank, the other ranks released, no exception escaping a destructor
// (communicators and device buffers are destroyed while the bad_alloc unwinds), and the process keeps working.
TEST(Faults, BadAllocInRankIsOneError) {
  const auto msg = expect_failure(4, [](emu::RankContext& ctx) {
    auto sub = ctx.world().split(0, ctx.rank(), "sub");
    DeviceBuffer<float> buf(ctx.device(), 1024, ctx.compute_stream());
    float x = 1;
    sub->all_reduce(&x, &x, 1, DataType::f32, ReduceOp::sum);
    if (ctx.rank() == 3) throw std::bad_alloc();  // what a failed host allocation throws
    sub->all_reduce(&x, &x, 1, DataType::f32, ReduceOp::sum);
  });
  EXPECT_HAS(msg, "rank 3: out of memory (std::bad_alloc)");
}

TEST(Faults, DeviceMemoryLimitIsOneError) {
  emu::SpawnOptions o;
  o.device.max_bytes = 1 << 20;
  const auto msg = expect_failure(
      3,
      [](emu::RankContext& ctx) {
        std::vector<DeviceBuffer<float>> keep;
        float x = 1;
        for (int i = 0; i < 8; ++i) {  // rank 1 asks for 4 x 512 KiB: the third allocation fails
          if (ctx.rank() == 1 && i < 4) keep.push_back(DeviceBuffer<float>(ctx.device(), 128 * 1024, ctx.compute_stream()));
          ctx.world().all_reduce(&x, &x, 1, DataType::f32, ReduceOp::sum);
        }
      },
      o);
  EXPECT_HAS(msg, "rank 1: out of memory allocating 524288 bytes of emulated device memory (1048576 bytes in use, "
                  "device limit 1048576) at test_faults.cpp:");
  EXPECT_EQ(msg.find("terminate"), std::string::npos);
}

}  // namespace
}  // namespace trident
