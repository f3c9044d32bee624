// Semantics beyond the table: exact_sum over serialised superaccumulators, rank-order reductions of values
// whose sum depends on order, streams/events and the recorded trace, per-communicator stats.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <random>

#include "emulator/world.h"
#include "parallel/mesh.h"
#include "parallel/mesh_comm.h"
#include "reference/exact_acc.h"

namespace trident {
namespace {

// Values spanning many binades and signs: plain fp32 sums of them depend on the order.
template <class T>
std::vector<T> wild_values(uint64_t seed, size_t n) {
  std::mt19937_64 g(seed);
  std::vector<T> v(n);
  for (auto& x : v) {
    const double m = static_cast<double>(g() >> 11) / 9007199254740992.0 - 0.5;  // [-0.5, 0.5)
    const int e = static_cast<int>(g() % 60) - 30;
    x = static_cast<T>(std::ldexp(m, e));
  }
  return v;
}

template <class T>
void exact_case(int n, size_t count, uint64_t seed) {
  SCOPED_TRACE(fmt::format("repro: exact_case<{}>(n={}, count={}, seed={})", sizeof(T) == 4 ? "float" : "double", n,
                           count, seed));
  constexpr size_t kPerRank = 5;  // terms each rank adds into each element's partial
  const DataType dt = sizeof(T) == 4 ? DataType::exact_f32 : DataType::exact_f64;
  // values[r][i * kPerRank + k]
  std::vector<std::vector<T>> values;
  for (int r = 0; r < n; ++r) values.push_back(wild_values<T>(seed + static_cast<uint64_t>(r), count * kPerRank));
  // The single-accumulator reference: every term of element i in one ExactAcc, rounded once.
  std::vector<T> want(count);
  double norm = 0;
  for (size_t i = 0; i < count; ++i) {
    ExactAcc<T> a;
    for (int r = 0; r < n; ++r)
      for (size_t k = 0; k < kPerRank; ++k) a.add(values[static_cast<size_t>(r)][i * kPerRank + k]);
    want[i] = a.round();
    norm += std::abs(static_cast<double>(want[i]));
  }
  ASSERT_GT(norm, 0);
  const size_t rs_count = count / static_cast<size_t>(n);  // reduce_scatter: the first n*rs_count elements
  std::vector<std::vector<T>> got_ar(static_cast<size_t>(n)), got_rs(static_cast<size_t>(n)), got_red(1);
  emu::spawn(n, [&](emu::RankContext& ctx) {
    const auto r = static_cast<size_t>(ctx.rank());
    std::vector<ExactAcc<T>> part(count);
    for (size_t i = 0; i < count; ++i)
      for (size_t k = 0; k < kPerRank; ++k) part[i].add(values[r][i * kPerRank + k]);
    std::vector<ExactAcc<T>> sum(count), sum_rs(rs_count);
    ctx.world().all_reduce(part.data(), sum.data(), count, dt, ReduceOp::exact_sum);
    got_ar[r].resize(count);
    exact_round(sum.data(), got_ar[r].data(), static_cast<int64_t>(count));
    ctx.world().reduce_scatter(part.data(), sum_rs.data(), rs_count, dt, ReduceOp::exact_sum);
    got_rs[r].resize(rs_count);
    exact_round(sum_rs.data(), got_rs[r].data(), static_cast<int64_t>(rs_count));
    ctx.world().reduce(part.data(), part.data(), count, dt, ReduceOp::exact_sum, n - 1);  // in place at the root
    if (static_cast<int>(r) == n - 1) {
      got_red[0].resize(count);
      exact_round(part.data(), got_red[0].data(), static_cast<int64_t>(count));
    }
  });
  auto bits_eq = [](T a, T b) {
    using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
    return std::bit_cast<U>(a) == std::bit_cast<U>(b);
  };
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i)
      ASSERT_TRUE(bits_eq(got_ar[static_cast<size_t>(r)][i], want[i])) << "all_reduce rank " << r << " elem " << i;
    for (size_t i = 0; i < rs_count; ++i)
      ASSERT_TRUE(bits_eq(got_rs[static_cast<size_t>(r)][i], want[static_cast<size_t>(r) * rs_count + i]))
          << "reduce_scatter rank " << r << " elem " << i;
  }
  for (size_t i = 0; i < count; ++i) ASSERT_TRUE(bits_eq(got_red[0][i], want[i])) << "reduce elem " << i;
}

TEST(ExactSum, MatchesSingleAccumulatorFloat) {
  for (int n : {1, 2, 3, 8}) exact_case<float>(n, 37, 1000 + static_cast<uint64_t>(n));
}
TEST(ExactSum, MatchesSingleAccumulatorDouble) {
  for (int n : {1, 2, 5}) exact_case<double>(n, 11, 2000 + static_cast<uint64_t>(n));
}

// Plain fp32 sums follow rank order exactly: ((c0 + c1) + c2) + ...
TEST(RankOrder, Fp32SumIsLeftFoldInRankOrder) {
  const int n = 7;
  const size_t count = 257;
  const uint64_t seed = 77;
  SCOPED_TRACE(fmt::format("repro: n={} count={} seed={}", n, count, seed));
  std::vector<std::vector<float>> v;
  for (int r = 0; r < n; ++r) v.push_back(wild_values<float>(seed + static_cast<uint64_t>(r), count));
  std::vector<float> want(count);
  size_t order_matters = 0;
  for (size_t i = 0; i < count; ++i) {
    float acc = v[0][i], rev = v[static_cast<size_t>(n - 1)][i];
    for (int r = 1; r < n; ++r) acc = acc + v[static_cast<size_t>(r)][i];
    for (int r = n - 2; r >= 0; --r) rev = rev + v[static_cast<size_t>(r)][i];
    want[i] = acc;
    order_matters += std::bit_cast<uint32_t>(acc) != std::bit_cast<uint32_t>(rev);
  }
  ASSERT_GT(order_matters, 10u) << "inputs too tame: the test could not see a wrong order";
  std::vector<std::vector<float>> got(static_cast<size_t>(n));
  emu::spawn(n, [&](emu::RankContext& ctx) {
    auto& g = got[static_cast<size_t>(ctx.rank())];
    g = v[static_cast<size_t>(ctx.rank())];
    ctx.world().all_reduce(g.data(), g.data(), count, DataType::f32, ReduceOp::sum);
  });
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(got[static_cast<size_t>(r)][i]), std::bit_cast<uint32_t>(want[i]))
          << "rank " << r << " elem " << i;
}

TEST(Streams, RecordWaitAndTrace) {
  auto res = emu::spawn(2, [](emu::RankContext& ctx) {
    Device& d = ctx.device();
    const Stream comp = ctx.compute_stream(), comm = ctx.comm_stream();
    const Stream extra = d.create_stream("aux");
    EXPECT_EQ(extra.id, 2);
    Event gathered = d.create_event(), computed = d.create_event();
    std::vector<float> x(16, 1.f), y(32);
    ctx.world().all_gather(x.data(), y.data(), 16, DataType::f32, comm);  // "dispatch chunk c+1"
    d.record(gathered, comm);
    // overlaps with the gather
    d.launch(comp, "gemm chunk 0", {Access{x.data(), 1024, true}}, 2048.0, [&] { x[0] += 1; });
    d.wait(comp, gathered);
    d.launch(comp, "gemm chunk 1", {Access{x.data(), 1024, true}}, 2048.0, [&] { x[1] += y[20]; });
    d.record(computed, comp);
    d.wait(comm, computed);
    ctx.world().all_reduce(x.data(), x.data(), 16, DataType::f32, ReduceOp::sum, comm);
    d.synchronize(comm);
    EXPECT_EQ(x[1], 4.f);  // (1 + y[20]=1) on both ranks
  });
  const RankTrace& t = res.ranks[0].trace;
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].name, "compute");
  EXPECT_EQ(t[1].name, "comm");
  EXPECT_EQ(t[2].name, "aux");
  using K = TraceEntry::Kind;
  const auto& comm = t[1].entries;
  const auto& comp = t[0].entries;
  ASSERT_EQ(comm.size(), 4u);
  EXPECT_EQ(comm[0].kind, K::collective);
  EXPECT_EQ(comm[0].op, CollOp::all_gather);
  EXPECT_EQ(comm[0].bytes, 2 * 16 * 4);
  EXPECT_EQ(comm[0].comm, "world");
  EXPECT_EQ(comm[0].seq, 0u);
  EXPECT_EQ(comm[1].kind, K::record);
  EXPECT_EQ(comm[2].kind, K::wait);
  EXPECT_EQ(comm[2].event_stream, 0);   // waits for the record on the compute stream ...
  EXPECT_EQ(comm[2].event_index, 3);    // ... at index 3 (gemm, wait, gemm, record)
  EXPECT_EQ(comm[3].op, CollOp::all_reduce);
  EXPECT_EQ(comm[3].seq, 1u);
  ASSERT_EQ(comp.size(), 4u);
  EXPECT_EQ(comp[0].name, "gemm chunk 0");
  EXPECT_EQ(comp[0].flops, 2048.0);
  EXPECT_EQ(comp[1].kind, K::wait);
  EXPECT_EQ(comp[1].event_stream, 1);
  EXPECT_EQ(comp[1].event_index, 1);
  EXPECT_NE(std::string(comp[1].file).find("test_semantics.cpp"), std::string::npos);
}

TEST(Streams, WaitOnUnrecordedEventIsAnError) {
  try {
    emu::spawn(1, [](emu::RankContext& ctx) {
      Event e = ctx.device().create_event();
      ctx.device().wait(ctx.compute_stream(), e);
    });
    ADD_FAILURE() << "no error";
  } catch (const emu::RankError& e) {
    EXPECT_NE(e.original.find("wait on event 0 that was never recorded"), std::string::npos) << e.what();
  }
  EXPECT_THROW(emu::spawn(1, [](emu::RankContext& ctx) {
                 float x = 0;
                 ctx.world().all_reduce(&x, &x, 1, DataType::f32, ReduceOp::sum, Stream{9});
               }),
               emu::RankError);
}

// Collective accounting: calls and bytes per communicator name and op (what the distributed step checks).
TEST(Stats, PerCommunicatorNameAndOp) {
  const MeshShape cfg{1, 2, 2, 2, 2};
  auto res = emu::spawn(4, [&](emu::RankContext& ctx) {
    auto mc = make_mesh_comms(ctx.world(), cfg);
    std::vector<float> a(8, 1.f), b(16);
    mc.cp->all_gather(a.data(), b.data(), 8, DataType::f32);
    mc.cp->all_gather(a.data(), b.data(), 8, DataType::f32);
    mc.fsdp_cp->reduce_scatter(b.data(), a.data(), 4, DataType::f32, ReduceOp::sum);
    mc.ep->all_to_all(a.data(), b.data(), 4, DataType::f32);
    const CommStats s = ctx.stats();  // live communicators included
    EXPECT_EQ(s.at("cp")[static_cast<size_t>(CollOp::all_gather)].calls, 2);
  });
  const CommStats tot = res.total();
  auto at = [&](const char* name, CollOp op) { return tot.at(name)[static_cast<size_t>(op)]; };
  EXPECT_EQ(at("cp", CollOp::all_gather), (OpStats{8, 8 * 2 * 8 * 4}));  // 4 ranks x 2 calls, bytes 2*8*4 each
  EXPECT_EQ(at("fsdp*cp", CollOp::reduce_scatter), (OpStats{4, 4 * 4 * 4 * 4}));
  EXPECT_EQ(at("ep", CollOp::all_to_all), (OpStats{4, 4 * 2 * 4 * 4}));
  EXPECT_EQ(at("ep", CollOp::send).calls, 0);  // all_to_all's inner sends are not counted separately
  EXPECT_EQ(at("world", CollOp::split).calls, 4 * 6);
  EXPECT_EQ(at("d_rep", CollOp::all_reduce).calls, 0);
  // The trace has one entry per call; all_to_all is one entry (not 2*size() send/recv entries).
  const auto& e = res.ranks[1].trace[0].entries;
  ASSERT_EQ(e.size(), 4u);
  EXPECT_EQ(e[3].kind, TraceEntry::Kind::collective);
  EXPECT_EQ(e[3].op, CollOp::all_to_all);
  EXPECT_EQ(e[3].comm, "ep");
  EXPECT_EQ(e[3].bytes, 2 * 4 * 4);
}

}  // namespace
}  // namespace trident
