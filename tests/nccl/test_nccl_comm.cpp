// NcclCommunicator (the CUDA path's communicator) over the emulator's fake NCCL: every operation gives the same bits
// as the emulator's own communicator; errors, the deadline checker, the watchdog and the id exchanges report
// clearly and never hang.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "emulator/fake_nccl.h"
#include "reference/bf16.h"
#include "reference/exact_acc.h"

namespace trident {
namespace {

using emu::FakeNcclScope;
using emu::FakeNcclWorld;
using emu::RankContext;

// Values that make rounding order matter: mixed magnitudes and signs, seeded per rank.
std::vector<float> values(int rank, size_t n, uint64_t seed) {
  std::mt19937_64 g(seed * 1000003 + static_cast<uint64_t>(rank));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::ldexp(u(g), static_cast<int>(g() % 40) - 20);
  return v;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Runs every operation once through `c` and returns all outputs concatenated as bytes.
std::vector<uint8_t> exercise(Communicator& c, uint64_t seed) {
  const int r = c.rank(), n = c.size();
  const size_t k = 37;
  std::vector<uint8_t> out;
  auto put = [&](const void* p, size_t bytes) {
    const auto* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + bytes);
  };
  const std::vector<float> x = values(r, k * static_cast<size_t>(n), seed);
  {  // f32 sum / max / min all_reduce, reduce_scatter, all_gather, broadcast, reduce
    std::vector<float> y(x.size());
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
      c.all_reduce(x.data(), y.data(), x.size(), DataType::f32, op);
      put(y.data(), y.size() * 4);
    }
    std::vector<float> rs(k);
    c.reduce_scatter(x.data(), rs.data(), k, DataType::f32, ReduceOp::sum);
    put(rs.data(), rs.size() * 4);
    std::vector<float> ag(x.size());
    c.all_gather(x.data(), ag.data(), k, DataType::f32);
    put(ag.data(), ag.size() * 4);
    std::vector<float> bc(k, 0.f);
    c.broadcast(x.data(), bc.data(), k, DataType::f32, n - 1);
    put(bc.data(), bc.size() * 4);
    std::vector<float> rd(k, 0.f);
    c.reduce(x.data(), rd.data(), k, DataType::f32, ReduceOp::sum, 0);
    if (r == 0) put(rd.data(), rd.size() * 4);
  }
  {  // f64 and bf16 sums, i64 sum
    std::vector<double> d(k), dy(k);
    for (size_t i = 0; i < k; ++i) d[i] = static_cast<double>(x[i]) * 1e-3 + r;
    c.all_reduce(d.data(), dy.data(), k, DataType::f64, ReduceOp::sum);
    put(dy.data(), dy.size() * 8);
    std::vector<bf16> b(k), by(k);
    for (size_t i = 0; i < k; ++i) b[i] = to_bf16(x[i]);
    c.all_reduce(b.data(), by.data(), k, DataType::bf16, ReduceOp::sum);
    put(by.data(), by.size() * 2);
    std::vector<int64_t> q(k), qy(k);
    for (size_t i = 0; i < k; ++i) q[i] = static_cast<int64_t>(i) * (r + 1) - 7;
    c.all_reduce(q.data(), qy.data(), k, DataType::i64, ReduceOp::sum);
    put(qy.data(), qy.size() * 8);
  }
  {  // exact sums (lowered onto i64 on NCCL) and exact all_gather (opaque bytes)
    std::vector<ExactAcc<float>> e(k), ey(k);
    for (size_t i = 0; i < k; ++i) e[i].add(x[i]);
    c.all_reduce(e.data(), ey.data(), k, DataType::exact_f32, ReduceOp::exact_sum);
    std::vector<float> rounded(k);
    for (size_t i = 0; i < k; ++i) rounded[i] = ey[i].round();
    put(rounded.data(), rounded.size() * 4);
  }
  {  // all_to_allv with uneven counts, and a send/recv ring
    std::vector<size_t> sc(static_cast<size_t>(n)), sd(static_cast<size_t>(n)), rc(static_cast<size_t>(n)),
        rdsp(static_cast<size_t>(n));
    size_t st = 0, rt = 0;
    for (int j = 0; j < n; ++j) {
      sc[static_cast<size_t>(j)] = static_cast<size_t>((r + 2 * j) % 4);
      rc[static_cast<size_t>(j)] = static_cast<size_t>((j + 2 * r) % 4);
      sd[static_cast<size_t>(j)] = st;
      rdsp[static_cast<size_t>(j)] = rt;
      st += sc[static_cast<size_t>(j)];
      rt += rc[static_cast<size_t>(j)];
    }
    std::vector<float> av(rt, -1.f);
    c.all_to_allv(x.data(), sc.data(), sd.data(), av.data(), rc.data(), rdsp.data(), DataType::f32);
    put(av.data(), av.size() * 4);
    std::vector<float> got(k);
    c.group_start();
    c.send(x.data(), k, DataType::f32, (r + 1) % n);
    c.recv(got.data(), k, DataType::f32, (r + n - 1) % n);
    c.group_end();
    put(got.data(), got.size() * 4);
  }
  {  // split into odd/even, reversed order, and reduce there
    auto sub = c.split(r % 2, -r, "parity");
    std::vector<float> y(k);
    sub->all_reduce(x.data(), y.data(), k, DataType::f32, ReduceOp::sum);
    put(y.data(), y.size() * 4);
    auto none = c.split(r == 0 ? Communicator::kNoColor : 1, r, "not0");
    EXPECT_EQ(none == nullptr, r == 0);
  }
  return out;
}

class FakeNcclOps : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(FakeNcclOps, SameBitsAsTheEmulatorsCommunicator) {
  const auto [W, blocking] = GetParam();
  const uint64_t seed = 20261201;
  std::vector<std::vector<uint8_t>> emu_out(static_cast<size_t>(W)), nccl_out(static_cast<size_t>(W));
  NcclOptions o;
  o.blocking = blocking;
  FakeNcclWorld fw(o);
  const emu::FakeNcclStats s0 = emu::fake_nccl_stats();
  emu::spawn(W, [&](RankContext& ctx) {
    emu_out[static_cast<size_t>(ctx.rank())] = exercise(ctx.world(), seed);
    FakeNcclScope scope(ctx);
    auto w = fw.world(ctx);
    EXPECT_EQ(w->rank(), ctx.rank());
    EXPECT_EQ(w->size(), W);
    nccl_out[static_cast<size_t>(ctx.rank())] = exercise(*w, seed);
  });
  for (int r = 0; r < W; ++r) {
    EXPECT_GT(emu_out[static_cast<size_t>(r)].size(), size_t{1000});
    EXPECT_TRUE(same_bits(emu_out[static_cast<size_t>(r)], nccl_out[static_cast<size_t>(r)]))
        << "rank " << r << " of " << W << (blocking ? " (blocking)" : " (non-blocking)") << "; repro: seed " << seed;
  }
  // every communicator was finalized and destroyed (none aborted), none used after it was freed
  EXPECT_EQ(emu::fake_nccl_stats().aborted - s0.aborted, 0);
  EXPECT_EQ(emu::fake_nccl_stats().unsafe_uses - s0.unsafe_uses, 0);
}
INSTANTIATE_TEST_SUITE_P(Worlds, FakeNcclOps,
                         ::testing::Combine(::testing::Values(2, 3, 5, 8), ::testing::Values(true, false)));

// The mesh names given to ncclCommSplit reach the emulator's statistics, and the lowered exact sum counts i64 bytes.
TEST(FakeNccl, StatsCarryTheSplitNames) {
  FakeNcclWorld fw;
  auto res = emu::spawn(4, [&](RankContext& ctx) {
    FakeNcclScope scope(ctx);
    auto w = fw.world(ctx);
    auto sub = w->split(ctx.rank() / 2, ctx.rank(), "pairs");
    float x = 1.f, y = 0.f;
    sub->all_reduce(&x, &y, 1, DataType::f32, ReduceOp::sum);
    EXPECT_EQ(y, 2.f);
  });
  const CommStats t = res.total();
  ASSERT_TRUE(t.count("pairs")) << "split name lost";
  EXPECT_EQ(t.at("pairs")[static_cast<size_t>(CollOp::all_reduce)].calls, 4);
}

// A mismatch between ranks (different counts) is the emulator's report, carried through NCCL's error path, with
// the step's call site (not the fake's) and the ring of recent operations.
TEST(FakeNccl, MismatchReportNamesCallSitesAndRecentOps) {
  FakeNcclWorld fw;
  try {
    emu::spawn(2, [&](RankContext& ctx) {
      FakeNcclScope scope(ctx);
      auto w = fw.world(ctx);
      std::vector<float> x(8), y(8);
      w->all_reduce(x.data(), y.data(), 4, DataType::f32, ReduceOp::sum);
      w->all_reduce(x.data(), y.data(), ctx.rank() == 0 ? 8 : 4, DataType::f32, ReduceOp::sum);  // mismatch
    });
    FAIL() << "mismatch not detected";
  } catch (const emu::RankError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("NCCL communicator 'world'"), std::string::npos) << m;
    EXPECT_NE(m.find("ncclAllReduce failed"), std::string::npos) << m;
    EXPECT_NE(m.find("test_nccl_comm.cpp"), std::string::npos) << m;
    EXPECT_NE(m.find("last operations"), std::string::npos) << m;
    EXPECT_EQ(m.find("fake_nccl.cpp"), std::string::npos) << "call site of the fake instead of the caller: " << m;
  }
}

// The watchdog sees an asynchronous error and aborts the communicator; the next call throws within a second.
TEST(FakeNccl, WatchdogAbortsOnAsyncError) {
  const int64_t u0 = emu::fake_nccl_stats().unsafe_uses;
  FakeNcclWorld fw(NcclOptions{.blocking = false, .deadline = std::chrono::seconds(5),
                               .watchdog_period = std::chrono::milliseconds(10)});
  emu::spawn(1, [&](RankContext& ctx) {
    FakeNcclScope scope(ctx);
    auto w = fw.world(ctx);
    float x = 1.f, y = 0.f;
    w->all_reduce(&x, &y, 1, DataType::f32, ReduceOp::sum);
    emu::fake_nccl_inject(w->handle(), emu::FakeFault::async_error);
    const auto t0 = std::chrono::steady_clock::now();
    while (!w->aborted() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2))
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_TRUE(w->aborted()) << "watchdog did not abort within 2 s";
    try {
      w->all_reduce(&x, &y, 1, DataType::f32, ReduceOp::sum);
      ADD_FAILURE() << "call on an aborted communicator succeeded";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("watchdog saw an asynchronous error: ncclRemoteError"), std::string::npos) << m;
      EXPECT_NE(m.find("#1 all_reduce 1 x f32"), std::string::npos) << m;
    }
  });
  EXPECT_EQ(emu::fake_nccl_stats().unsafe_uses - u0, 0);
}

// An operation that never completes on a non-blocking communicator fails at the deadline (never a hang).
TEST(FakeNccl, DeadlineAbortsAStuckOperation) {
  FakeNcclWorld fw(NcclOptions{.blocking = false, .deadline = std::chrono::milliseconds(300),
                               .watchdog_period = std::chrono::milliseconds(0)});
  emu::spawn(1, [&](RankContext& ctx) {
    FakeNcclScope scope(ctx);
    auto w = fw.world(ctx);
    emu::fake_nccl_inject(w->handle(), emu::FakeFault::stuck);
    float x = 1.f, y = 0.f;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      w->all_reduce(&x, &y, 1, DataType::f32, ReduceOp::sum);
      ADD_FAILURE() << "stuck operation returned";
    } catch (const Error& e) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      EXPECT_LT(s, 2.0);
      EXPECT_NE(std::string(e.what()).find("ncclAllReduce still in progress after 300 ms"), std::string::npos)
          << e.what();
    }
    EXPECT_TRUE(w->aborted());
  });
}

TEST(FakeNccl, InitRefusesAForeignIdAndAPartialWorld) {
  emu::spawn(2, [&](RankContext& ctx) {
    FakeNcclScope scope(ctx);
    nccl::UniqueId bogus{};
    EXPECT_THROW(NcclCommunicator::init(emu::fake_nccl(), bogus, 2, ctx.rank(), ctx.device(), "w"), Error);
    nccl::UniqueId id{};
    emu::fake_nccl().get_unique_id(&id);
    try {
      NcclCommunicator::init(emu::fake_nccl(), id, 1, 0, ctx.device(), "w");
      ADD_FAILURE() << "partial world accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("whole emulated world only"), std::string::npos) << e.what();
    }
  });
}

// Like the real library, the fake serves one ncclCommInitRank per rank and id: a second init with the same id is
// refused (a test that reuses an id would pass on counters and fail on NCCL's bootstrap).
TEST(FakeNccl, ReusedIdIsRefused) {
  emu::spawn(1, [&](RankContext& ctx) {
    FakeNcclScope scope(ctx);
    nccl::UniqueId id{};
    ASSERT_EQ(emu::fake_nccl().get_unique_id(&id), nccl::kSuccess);
    auto first = NcclCommunicator::init(emu::fake_nccl(), id, 1, 0, ctx.device(), "first");
    try {
      auto again = NcclCommunicator::init(emu::fake_nccl(), id, 1, 0, ctx.device(), "again");
      ADD_FAILURE() << "a reused unique id was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("already initialised a communicator with this unique id"),
                std::string::npos) << e.what();
    }
    ASSERT_EQ(emu::fake_nccl().get_unique_id(&id), nccl::kSuccess);
    EXPECT_NO_THROW(NcclCommunicator::init(emu::fake_nccl(), id, 1, 0, ctx.device(), "fresh"));
  });
}

// A communicator that ends normally is finalized and destroyed, never aborted, in both modes: ncclCommFinalize of
// a non-blocking communicator answers ncclInProgress and must be polled to completion, not taken for a failure.
TEST(FakeNccl, EndedCommunicatorsAreFinalizedNotAborted) {
  for (const bool blocking : {true, false}) {
    SCOPED_TRACE(blocking ? "blocking" : "non-blocking");
    const emu::FakeNcclStats before = emu::fake_nccl_stats();
    FakeNcclWorld fw(NcclOptions{.blocking = blocking});
    emu::spawn(2, [&](RankContext& ctx) {
      FakeNcclScope scope(ctx);
      auto w = fw.world(ctx);
      auto sub = w->split(0, ctx.rank(), "sub");
      float x = 1.f, y = 0.f;
      sub->all_reduce(&x, &y, 1, DataType::f32, ReduceOp::sum);
      EXPECT_EQ(y, 2.f);
    });
    const emu::FakeNcclStats after = emu::fake_nccl_stats();
    EXPECT_EQ(after.destroyed - before.destroyed, 4) << "2 ranks x (world + split)";
    EXPECT_EQ(after.aborted - before.aborted, 0);
    EXPECT_EQ(after.unsafe_uses - before.unsafe_uses, 0);
  }
}

// The fake treats ncclCommAbort as the real library does (it frees the communicator): a later call on the handle,
// or a second abort, is refused and counted.
TEST(FakeNccl, CallsAfterAnAbortAreCounted) {
  emu::spawn(1, [&](RankContext& ctx) {
    FakeNcclScope scope(ctx);
    const nccl::Api& api = emu::fake_nccl();
    nccl::UniqueId id{};
    ASSERT_EQ(api.get_unique_id(&id), nccl::kSuccess);
    nccl::Comm c = nullptr;
    ASSERT_EQ(api.comm_init_rank(&c, 1, id, 0, 1), nccl::kSuccess);
    const int64_t u0 = emu::fake_nccl_stats().unsafe_uses;
    int n = 0;
    EXPECT_EQ(api.comm_count(c, &n), nccl::kSuccess);
    EXPECT_EQ(emu::fake_nccl_stats().unsafe_uses, u0);
    EXPECT_EQ(api.comm_abort(c), nccl::kSuccess);
    EXPECT_EQ(api.comm_count(c, &n), nccl::kInvalidUsage);
    EXPECT_EQ(api.comm_abort(c), nccl::kSuccess);
    EXPECT_EQ(emu::fake_nccl_stats().unsafe_uses, u0 + 2);
  });
}

// The watchdog and the owning thread share the call lock: an error NCCL finds while the owner is inside a call is
// acted on after the call returns, never by freeing the communicator under it (the fake's call takes 50 ms after
// raising the error; the watchdog polls every 2 ms). Run under ThreadSanitizer too (label tsan).
TEST(FakeNccl, WatchdogNeverAbortsDuringACall) {
  const int64_t u0 = emu::fake_nccl_stats().unsafe_uses;
  FakeNcclWorld fw(NcclOptions{.blocking = false, .deadline = std::chrono::seconds(5),
                               .watchdog_period = std::chrono::milliseconds(2)});
  emu::spawn(1, [&](RankContext& ctx) {
    FakeNcclScope scope(ctx);
    auto w = fw.world(ctx);
    float x = 1.f, y = 0.f;
    w->all_reduce(&x, &y, 1, DataType::f32, ReduceOp::sum);
    emu::fake_nccl_inject(w->handle(), emu::FakeFault::error_during_call);
    EXPECT_THROW(w->all_reduce(&x, &y, 1, DataType::f32, ReduceOp::sum), Error);
    const auto t0 = std::chrono::steady_clock::now();
    while (!w->aborted() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2))
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_TRUE(w->aborted());
    EXPECT_THROW(w->all_reduce(&x, &y, 1, DataType::f32, ReduceOp::sum), Error);
  });
  EXPECT_EQ(emu::fake_nccl_stats().unsafe_uses - u0, 0) << "the communicator was used after (or aborted during) a call";
}

// ---- unique-id exchanges ----------------------------------------------------------------------------------------
nccl::UniqueId test_id(char c) {
  nccl::UniqueId id;
  std::memset(id.internal, c, sizeof(id.internal));
  return id;
}

void exchange_on_threads(nccl::IdExchange& x, int n) {
  std::vector<nccl::UniqueId> got(static_cast<size_t>(n));
  std::vector<std::string> errs(static_cast<size_t>(n));
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      try {
        got[static_cast<size_t>(r)] = x.exchange(r, n, [] { return test_id('q'); });
      } catch (const std::exception& e) {
        errs[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(errs[static_cast<size_t>(r)], "") << "rank " << r;
    EXPECT_EQ(std::memcmp(got[static_cast<size_t>(r)].internal, test_id('q').internal, nccl::kUniqueIdBytes), 0)
        << "rank " << r;
  }
}

TEST(NcclBootstrap, InProcess) {
  nccl::InProcessExchange x;
  exchange_on_threads(x, 6);
}

TEST(NcclBootstrap, File) {
  const std::string p =
      (std::filesystem::temp_directory_path() / ("trident-nccl-id-" + std::to_string(::getpid()))).string();
  std::filesystem::remove(p);
  nccl::FileExchange x(p, std::chrono::seconds(10));
  exchange_on_threads(x, 4);
  std::filesystem::remove(p);
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

TEST(NcclBootstrap, Tcp) {
  nccl::TcpExchange x("127.0.0.1", free_port(), std::chrono::seconds(10));
  exchange_on_threads(x, 5);
}

TEST(NcclBootstrap, TimeoutsNameWhatWasAwaited) {
  const auto t0 = std::chrono::steady_clock::now();
  nccl::FileExchange f("/nonexistent-dir/trident-id", std::chrono::milliseconds(200));
  try {
    f.exchange(1, 2, [] { return test_id('x'); });
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("waited 200 ms for rank 0 to write /nonexistent-dir/trident-id"),
              std::string::npos)
        << e.what();
  }
  nccl::TcpExchange t("127.0.0.1", free_port(), std::chrono::milliseconds(200));
  try {
    t.exchange(3, 4, [] { return test_id('x'); });
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 3 could not reach rank 0 at 127.0.0.1"), std::string::npos) << e.what();
  }
  nccl::InProcessExchange ip(std::chrono::milliseconds(200));
  EXPECT_THROW(ip.exchange(1, 2, [] { return test_id('x'); }), Error);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 3.0);
}

TEST(NcclBootstrap, EnvironmentSelectsTheExchange) {
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", "70000", 1);
  EXPECT_THROW(nccl::exchange_from_env(), Error);
  ::setenv("MASTER_PORT", "29500", 1);
  EXPECT_NE(dynamic_cast<nccl::TcpExchange*>(nccl::exchange_from_env().get()), nullptr);
  ::setenv("TRIDENT_NCCL_ID_FILE", "/tmp/x", 1);
  EXPECT_NE(dynamic_cast<nccl::FileExchange*>(nccl::exchange_from_env().get()), nullptr);
  ::unsetenv("TRIDENT_NCCL_ID_FILE");
  ::unsetenv("MASTER_ADDR");
  ::unsetenv("MASTER_PORT");
  EXPECT_EQ(nccl::exchange_from_env(), nullptr);
}

// The real library: loaded through the same table where it is installed (no GPU needed to load it).
TEST(NcclLoad, RealLibraryOrAClearReason) {
  std::string why;
  const nccl::Api* api = nccl::load_nccl("", &why);
  if (!api) {
    EXPECT_NE(why.find("NCCL"), std::string::npos) << why;
    GTEST_SKIP() << why;
  }
  EXPECT_GE(api->version, 21800) << api->name;
  std::string why2;
  EXPECT_EQ(nccl::load_nccl("/nonexistent/libnccl.so", &why2), api) << "a loaded table is reused";
}

}  // namespace
}  // namespace trident
