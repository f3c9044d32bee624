// MpiCommunicator against the emulator's communicator, bitwise, under mpirun: every process runs the same table
// of calls (every collective, in place and out of place, every dtype and reduce op, counts 0/1/5/1031, random
// floats with NaNs and signed zeros, exact_sum, all_to_allv with random counts, grouped send/recv, split) once on
// its MPI ranks (fibers, Fabric::run_ranks) and once on an emulated world of the same size (emu::spawn, exact sums
// merged natively, or lowered onto i64 on both sides with TRIDENT_TEST_LOWER), and compares every output byte of
// its own ranks. Run with TRIDENT_TEST_RPP=k ranks per process and TRIDENT_TEST_CHUNK=b (MPI message chunk bytes,
// so large messages split).
#include <gtest/gtest.h>
#include <pthread.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "emulator/world.h"
#include "mpi/comm.h"
#include "reference/bf16.h"
#include "reference/exact_acc.h"

namespace trident {
namespace {

mpi::Fabric* g_fabric = nullptr;

uint64_t mixbits(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Rank r's input of case c: random values of dtype t (floats: mixed magnitudes, signed zeros, NaN when nan).
std::vector<char> input(uint64_t c, int r, DataType t, size_t count, bool nan) {
  std::vector<char> b(count * dtype_size(t));
  for (size_t i = 0; i < count; ++i) {
    const uint64_t h = mixbits(c * 1000003 + static_cast<uint64_t>(r) * 7919 + i);
    const double v = (static_cast<double>(h % 2000001) - 1e6) * std::ldexp(1.0, static_cast<int>((h >> 40) % 40) - 30);
    const double x = nan && (h >> 60) == 0 ? std::nan("") : ((h >> 56) & 0xf) == 1 ? -0.0 : v;
    char* p = b.data() + i * dtype_size(t);
    switch (t) {
      case DataType::f64: std::memcpy(p, &x, 8); break;
      case DataType::f32: { const float f = static_cast<float>(x); std::memcpy(p, &f, 4); break; }
      case DataType::bf16: { const bf16 f = to_bf16(static_cast<float>(x)); std::memcpy(p, &f, sizeof f); break; }
      case DataType::i32: case DataType::i64: case DataType::u8: std::memcpy(p, &h, dtype_size(t)); break;
      case DataType::exact_f32: {
        ExactAcc<float> a;
        for (int k = 0; k < 3; ++k) a.add(static_cast<float>(v * (k + 1)));
        std::memcpy(p, &a, sizeof a);
        break;
      }
      case DataType::exact_f64: {
        ExactAcc<double> a;
        for (int k = 0; k < 3; ++k) a.add(v * (k + 1));
        std::memcpy(p, &a, sizeof a);
        break;
      }
    }
  }
  return b;
}

// The table: runs every case on communicator c (rank r of world n), appends each output buffer to out.
void run_table(Communicator& c, std::vector<std::vector<char>>& out) {
  const int n = c.size(), r = c.rank();
  uint64_t id = 0;
  const std::vector<size_t> counts = {0, 1, 5, 1031};
  for (DataType t : {DataType::f64, DataType::f32, DataType::bf16, DataType::i32, DataType::i64, DataType::u8,
                     DataType::exact_f32, DataType::exact_f64}) {
    const size_t es = dtype_size(t);
    const std::vector<ReduceOp> ops = is_exact(t) ? std::vector<ReduceOp>{ReduceOp::exact_sum}
                                                  : std::vector<ReduceOp>{ReduceOp::sum, ReduceOp::max, ReduceOp::min};
    for (size_t count : counts) {
      if (is_exact(t) && count > 5) continue;
      for (bool in_place : {false, true}) {
        for (ReduceOp op : ops) {
          const bool nan = op != ReduceOp::sum && !is_exact(t);
          {  // all_reduce
            std::vector<char> in = input(++id, r, t, count, nan), res(count * es);
            c.all_reduce(in.data(), in_place ? in.data() : res.data(), count, t, op);
            out.push_back(in_place ? in : res);
          }
          {  // reduce_scatter
            std::vector<char> in = input(++id, r, t, count * static_cast<size_t>(n), nan), res(count * es);
            char* dst = in_place ? in.data() + static_cast<size_t>(r) * count * es : res.data();
            c.reduce_scatter(in.data(), dst, count, t, op);
            out.emplace_back(dst, dst + count * es);
          }
          {  // reduce, root n-1
            const int root = n - 1;
            std::vector<char> in = input(++id, r, t, count, nan), res(count * es);
            c.reduce(in.data(), in_place ? in.data() : res.data(), count, t, op, root);
            if (r == root) out.push_back(in_place ? in : res);
          }
        }
        {  // all_gather
          std::vector<char> in = input(++id, r, t, count, false), res(count * es * static_cast<size_t>(n));
          if (in_place) std::memcpy(res.data() + static_cast<size_t>(r) * count * es, in.data(), in.size());
          c.all_gather(in_place ? res.data() + static_cast<size_t>(r) * count * es : in.data(), res.data(), count, t);
          out.push_back(res);
        }
        {  // broadcast, root 1 % n
          const int root = 1 % n;
          std::vector<char> in = input(++id, r, t, count, false), res(count * es);
          c.broadcast(in.data(), in_place ? in.data() : res.data(), count, t, root);
          out.push_back(in_place ? in : res);
        }
      }
    }
  }
  {  // all_to_allv with random counts (same table on every rank)
    auto cnt = [&](int from, int to) { return static_cast<size_t>(mixbits(static_cast<uint64_t>(from * 131 + to)) % 7); };
    std::vector<size_t> sc(static_cast<size_t>(n)), sd(static_cast<size_t>(n)), rc(static_cast<size_t>(n)),
        rd(static_cast<size_t>(n));
    size_t st = 0, rt = 0;
    for (int j = 0; j < n; ++j) {
      sc[static_cast<size_t>(j)] = cnt(r, j), sd[static_cast<size_t>(j)] = st, st += sc[static_cast<size_t>(j)];
      rc[static_cast<size_t>(j)] = cnt(j, r), rd[static_cast<size_t>(j)] = rt, rt += rc[static_cast<size_t>(j)];
    }
    std::vector<char> in = input(++id, r, DataType::f32, st, false), res(rt * 4);
    c.all_to_allv(in.data(), sc.data(), sd.data(), res.data(), rc.data(), rd.data(), DataType::f32);
    out.push_back(res);
  }
  {  // grouped ring send/recv, two messages per neighbour pair
    std::vector<char> a = input(++id, r, DataType::i64, 9, false), b = input(++id, r, DataType::i64, 3, false);
    std::vector<char> ra(a.size()), rb(b.size());
    c.group_start();
    c.send(a.data(), 9, DataType::i64, (r + 1) % n);
    c.send(b.data(), 3, DataType::i64, (r + 1) % n);
    c.recv(ra.data(), 9, DataType::i64, (r + n - 1) % n);
    c.recv(rb.data(), 3, DataType::i64, (r + n - 1) % n);
    c.group_end();
    out.push_back(ra);
    out.push_back(rb);
  }
  {  // split into odd/even (reversed keys), rank 0 left out; all_reduce on the part
    auto sub = c.split(r == 0 ? Communicator::kNoColor : r % 2, -r, "part");
    std::vector<char> res(4, 0);
    if (sub) {
      std::vector<char> in = input(++id, r, DataType::f32, 1, false);
      sub->all_reduce(in.data(), res.data(), 1, DataType::f32, ReduceOp::sum);
      const int32_t shape[2] = {sub->rank(), sub->size()};
      out.emplace_back(reinterpret_cast<const char*>(shape), reinterpret_cast<const char*>(shape) + 8);
    }
    out.push_back(res);
  }
}

// Runs fn(g) on a thread per local rank of this process; returns the first error.
std::string on_local_ranks(const std::function<void(int)>& fn) {
  std::mutex m;
  std::string err;
  g_fabric->run_ranks([&](int g) {  // the ranks as fibers, as run_mpi runs them
    try {
      fn(g);
    } catch (const std::exception& e) {
      std::lock_guard lk(m);
      if (err.empty()) err = e.what();
      g_fabric->fail(e.what());
    }
  });
  return err;
}

TEST(MpiComm, TableBitwiseEqualsEmulator) {
  const int W = g_fabric->world(), k = g_fabric->ranks_per_process(), first = g_fabric->first_rank();
  std::vector<std::vector<std::vector<char>>> want(static_cast<size_t>(W)), got(static_cast<size_t>(k));
  emu::SpawnOptions so;
  so.lower_exact_sum = g_fabric->options().lower_exact_sum;  // native merge or i64 lowering, as the MPI ranks
  // Every process of this test shares the accumulator format: the merge is native unless asked to lower.
  ASSERT_EQ(g_fabric->native_exact_sum(), !g_fabric->options().lower_exact_sum);
  emu::spawn(
      W, [&](emu::RankContext& ctx) { run_table(ctx.world(), want[static_cast<size_t>(ctx.rank())]); }, so);
  const std::string err = on_local_ranks([&](int g) {
    auto world = mpi::MpiCommunicator::world(*g_fabric, g);
    run_table(*world, got[static_cast<size_t>(g - first)]);
  });
  ASSERT_EQ(err, "");
  for (int i = 0; i < k; ++i) {
    const auto& a = got[static_cast<size_t>(i)];
    const auto& b = want[static_cast<size_t>(first + i)];
    ASSERT_EQ(a.size(), b.size()) << "rank " << first + i;
    for (size_t j = 0; j < a.size(); ++j)
      ASSERT_TRUE(a[j] == b[j]) << "rank " << first + i << " output " << j << " of " << a.size()
                                << " differs from the emulator (repro: mpirun -np " << g_fabric->processes()
                                << " with TRIDENT_TEST_RPP=" << k << ")";
  }
}

TEST(MpiComm, MismatchedCallsFailNamingBothRanks) {
  // Rank 0 sends i64, its neighbour expects f64 of the same size: the receiver names both ranks and both calls.
  if (g_fabric->world() < 2) GTEST_SKIP() << "needs 2 ranks";
  std::vector<std::string> errs(static_cast<size_t>(g_fabric->ranks_per_process()));
  on_local_ranks([&](int g) {
    auto world = mpi::MpiCommunicator::world(*g_fabric, g);
    auto sub = world->split(g < 2 ? 0 : Communicator::kNoColor, g, "pair");
    if (!sub) return;
    std::vector<char> buf(8 * 4);
    try {
      if (g == 0) sub->send(buf.data(), 4, DataType::i64, 1);
      else sub->recv(buf.data(), 4, DataType::f64, 0);
    } catch (const std::exception& e) {
      errs[static_cast<size_t>(g - g_fabric->first_rank())] = e.what();
    }
  });
  if (g_fabric->first_rank() <= 1 && 1 < g_fabric->first_rank() + g_fabric->ranks_per_process()) {
    const std::string& e = errs[static_cast<size_t>(1 - g_fabric->first_rank())];
    EXPECT_NE(e.find("expected send (f64)"), std::string::npos) << e;
    EXPECT_NE(e.find("received send (i64)"), std::string::npos) << e;
    EXPECT_NE(e.find("'pair' rank 0 (rank 0)"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace trident

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int rc = 1;
  {
    trident::mpi::FabricOptions fo;
    if (const char* s = std::getenv("TRIDENT_TEST_RPP")) fo.ranks_per_process = std::atoi(s);
    if (const char* s = std::getenv("TRIDENT_TEST_CHUNK")) fo.chunk_bytes = static_cast<size_t>(std::atoll(s));
    fo.lower_exact_sum = std::getenv("TRIDENT_TEST_LOWER") != nullptr;
    fo.wait_timeout_s = 60;
    trident::mpi::Fabric f(fo);
    trident::g_fabric = &f;
    rc = RUN_ALL_TESTS();
    if (f.failed()) {
      std::fprintf(stderr, "trident: error: %s\n", f.failure().c_str());
      return 1;
    }
    f.shutdown();
  }
  MPI_Finalize();
  return rc;
}
