// exact_sum lowered onto i64 sums (parallel/exact_lowering.h; docs/numerics.md "Exact sums over integer
// collectives"): all_reduce / reduce_scatter / reduce with SpawnOptions::lower_exact_sum give, on every rank, the
// canonical bytes of the native exact merge and the same rounded bits; the backend saw only i64 sums; stats count
// the packed bytes; out-of-range sums fail with a clear message.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "emulator/world.h"
#include "parallel/exact_lowering.h"
#include "reference/exact_acc.h"
#include "tests/emulator/values.h"

namespace trident {
namespace {

namespace xl = exact_lowering;

template <class T>
constexpr DataType dt_of() {
  return emutest::exact_dtype_of<T>();
}
using emutest::bits;
template <class T>
bool same_bytes(const ExactAcc<T>& a, const ExactAcc<T>& b) {
  return std::memcmp(&a, &b, sizeof(a)) == 0;
}

// Term k of element e on rank r: mostly values over many binades (both signs), with subnormals, zeros, +-max and
// (where `specials`) NaN / +-Inf sprinkled in.
template <class T>
T term(uint64_t seed, int r, size_t e, int k, bool specials) {
  std::mt19937_64 g(seed ^ (static_cast<uint64_t>(r) << 40) ^ (e << 8) ^ static_cast<uint64_t>(k));
  const uint64_t pick = g() % 64;
  using L = std::numeric_limits<T>;
  if (specials && pick == 0) return L::quiet_NaN();
  if (specials && pick == 1) return L::infinity();
  if (specials && pick == 2) return -L::infinity();
  if (pick == 3) return (g() & 1) ? L::max() : -L::max();
  if (pick == 4) return static_cast<T>(static_cast<int64_t>(g() % 1000) - 500) * L::denorm_min();
  if (pick == 5) return (g() & 1) ? T(0) : -T(0);
  const double m = static_cast<double>(g() >> 11) / 9007199254740992.0 - 0.5;
  const int span = sizeof(T) == 4 ? 250 : 2000;
  return static_cast<T>(std::ldexp(m, static_cast<int>(g() % static_cast<uint64_t>(span)) - span / 2));
}

struct Out {
  std::vector<std::vector<std::byte>> ar, rs, red;  // per rank: accumulator bytes of each collective's result
  std::vector<CommStats> stats;
  std::vector<RankTrace> traces;
};

// One spawn: all_reduce (count), reduce_scatter (recvcount = count) and reduce (count, root n-1), each rank's
// accumulators built from its terms.
template <class T>
Out run(int n, size_t count, bool in_place, size_t eager_bytes, bool lower, uint64_t seed, bool specials) {
  using A = ExactAcc<T>;
  constexpr int kTerms = 3;
  const size_t es = sizeof(A);
  Out o;
  o.ar.resize(static_cast<size_t>(n));
  o.rs.resize(static_cast<size_t>(n));
  o.red.resize(static_cast<size_t>(n));
  emu::SpawnOptions so;
  so.lower_exact_sum = lower;
  so.eager_bytes = eager_bytes;
  const emu::SpawnResult res = emu::spawn(
      n,
      [&](emu::RankContext& ctx) {
        const int r = ctx.rank();
        const size_t total = static_cast<size_t>(n) * count;
        std::vector<A> part(total);
        for (size_t e = 0; e < total; ++e)
          for (int k = 0; k < kTerms; ++k) part[e].add(term<T>(seed, r, e, k, specials));
        Communicator& w = ctx.world();
        auto keep = [&](std::vector<std::byte>& dst, const A* p, size_t c) {
          dst.resize(c * es);
          if (c) std::memcpy(dst.data(), p, c * es);
        };
        std::vector<A> buf = part, out(total);
        if (in_place) {
          w.all_reduce(buf.data(), buf.data(), count, dt_of<T>(), ReduceOp::exact_sum);
          keep(o.ar[static_cast<size_t>(r)], buf.data(), count);
          buf = part;
          w.reduce_scatter(buf.data(), buf.data() + static_cast<size_t>(r) * count, count, dt_of<T>(),
                           ReduceOp::exact_sum);
          keep(o.rs[static_cast<size_t>(r)], buf.data() + static_cast<size_t>(r) * count, count);
          buf = part;
          w.reduce(buf.data(), buf.data(), count, dt_of<T>(), ReduceOp::exact_sum, n - 1);
          if (r == n - 1) keep(o.red[static_cast<size_t>(r)], buf.data(), count);
        } else {
          w.all_reduce(part.data(), out.data(), count, dt_of<T>(), ReduceOp::exact_sum);
          keep(o.ar[static_cast<size_t>(r)], out.data(), count);
          w.reduce_scatter(part.data(), out.data(), count, dt_of<T>(), ReduceOp::exact_sum);
          keep(o.rs[static_cast<size_t>(r)], out.data(), count);
          w.reduce(part.data(), out.data(), count, dt_of<T>(), ReduceOp::exact_sum, n - 1);
          if (r == n - 1) keep(o.red[static_cast<size_t>(r)], out.data(), count);
        }
      },
      so);
  for (const auto& rr : res.ranks) {
    o.stats.push_back(rr.stats);
    o.traces.push_back(rr.trace);
  }
  return o;
}

template <class T>
ExactAcc<T> from_bytes(const std::byte* p) {
  ExactAcc<T> a;
  std::memcpy(static_cast<void*>(&a), p, sizeof(a));
  return a;
}

// Lowered vs native on one configuration: every rank's result bytes equal the native result normalised, both
// round to the bits of one accumulator over all terms; the lowered run's backend calls are i64 sums of
// count * words elements and its stats count the packed bytes.
template <class T>
void compare_case(int n, size_t count, bool in_place, size_t eager_bytes, uint64_t seed, bool specials,
                  int64_t* nonzero, int64_t* special_results) {
  SCOPED_TRACE(fmt::format("repro: compare_case<{}>(n={}, count={}, in_place={}, eager_bytes={}, seed={}, "
                           "specials={})",
                           sizeof(T) == 4 ? "float" : "double", n, count, in_place, eager_bytes, seed, specials));
  using A = ExactAcc<T>;
  const Out nat = run<T>(n, count, in_place, eager_bytes, false, seed, specials);
  const Out low = run<T>(n, count, in_place, eager_bytes, true, seed, specials);
  const size_t W = xl::words_per_element(dt_of<T>());
  // The single-accumulator reference of element e (all ranks' terms).
  auto want = [&](size_t e) {
    A a;
    for (int r = 0; r < n; ++r)
      for (int k = 0; k < 3; ++k) a.add(term<T>(seed, r, e, k, specials));
    return a.round();
  };
  auto check = [&](const std::vector<std::byte>& gn, const std::vector<std::byte>& gl, size_t e0, const char* what,
                   int r) {
    ASSERT_EQ(gn.size(), count * sizeof(A)) << what << " rank " << r;
    ASSERT_EQ(gl.size(), count * sizeof(A)) << what << " rank " << r;
    for (size_t i = 0; i < count; ++i) {
      A a_nat = from_bytes<T>(gn.data() + i * sizeof(A));
      const A a_low = from_bytes<T>(gl.data() + i * sizeof(A));
      const T w = want(e0 + i);
      ASSERT_EQ(bits(a_low.round()), bits(w)) << what << " rank " << r << " elem " << i;
      ASSERT_EQ(bits(a_nat.round()), bits(w)) << what << " rank " << r << " elem " << i;
      a_nat.normalize();
      ASSERT_TRUE(same_bytes(a_low, a_nat)) << what << " rank " << r << " elem " << i << ": not the canonical state";
      *nonzero += w != T(0) ? 1 : 0;
      *special_results += std::isfinite(w) ? 0 : 1;
    }
  };
  for (int r = 0; r < n; ++r) {
    const auto R = static_cast<size_t>(r);
    check(nat.ar[R], low.ar[R], 0, "all_reduce", r);
    check(nat.rs[R], low.rs[R], R * count, "reduce_scatter", r);
    if (r == n - 1) check(nat.red[R], low.red[R], 0, "reduce", r);
    // accounting: the same calls; bytes of the exact elements (native) or of the packed words (lowered)
    const OpStatsTable& sn = nat.stats[R].at("world");
    const OpStatsTable& sl = low.stats[R].at("world");
    const auto ix = [](CollOp op) { return static_cast<size_t>(op); };
    for (CollOp op : {CollOp::all_reduce, CollOp::reduce_scatter, CollOp::reduce}) {
      EXPECT_EQ(sn[ix(op)].calls, 1);
      EXPECT_EQ(sl[ix(op)].calls, 1);
    }
    const auto N = static_cast<int64_t>(n), C = static_cast<int64_t>(count), Wb = static_cast<int64_t>(W * 8);
    const auto Ab = static_cast<int64_t>(sizeof(A));
    EXPECT_EQ(sn[ix(CollOp::all_reduce)].bytes, C * Ab);
    EXPECT_EQ(sn[ix(CollOp::reduce_scatter)].bytes, N * C * Ab);
    EXPECT_EQ(sn[ix(CollOp::reduce)].bytes, C * Ab);
    EXPECT_EQ(sl[ix(CollOp::all_reduce)].bytes, C * Wb);
    EXPECT_EQ(sl[ix(CollOp::reduce_scatter)].bytes, N * C * Wb);
    EXPECT_EQ(sl[ix(CollOp::reduce)].bytes, C * Wb);
    // what the backend saw (trace of the default stream): exact dtypes natively, i64 sums lowered
    std::vector<TraceEntry> en, el;  // values: a TraceLog hands out entries by value
    for (const TraceEntry& t : nat.traces[R][0].entries)
      if (t.kind == TraceEntry::Kind::collective) en.push_back(t);
    for (const TraceEntry& t : low.traces[R][0].entries)
      if (t.kind == TraceEntry::Kind::collective) el.push_back(t);
    ASSERT_EQ(en.size(), size_t{3});
    ASSERT_EQ(el.size(), size_t{3});
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_EQ(en[k].dtype, dt_of<T>());
      EXPECT_EQ(en[k].redop, ReduceOp::exact_sum);
      EXPECT_EQ(en[k].count, count);
      EXPECT_EQ(el[k].op, en[k].op);
      EXPECT_EQ(el[k].dtype, DataType::i64);
      EXPECT_EQ(el[k].redop, ReduceOp::sum);
      EXPECT_EQ(el[k].count, count * W);
      EXPECT_EQ(el[k].bytes, sl[ix(el[k].op)].bytes);
    }
  }
}

// World sizes x counts x in/out of place x both protocols (eager: everything staged; 0: direct copies).
template <class T>
void table(std::initializer_list<int> worlds, std::initializer_list<size_t> counts) {
  int64_t nonzero = 0, special = 0, cases = 0;
  uint64_t seed = sizeof(T) == 4 ? 100 : 200;
  for (int n : worlds)
    for (size_t count : counts)
      for (bool in_place : {false, true})
        for (size_t eager : {size_t{0}, size_t{1} << 22}) {
          ++seed;
          compare_case<T>(n, count, in_place, eager, seed, (seed & 1) != 0, &nonzero, &special);
          if (::testing::Test::HasFatalFailure()) return;
          ++cases;
        }
  EXPECT_GT(cases, 0);
  EXPECT_GT(nonzero, 100) << "inputs too tame";
  EXPECT_GT(special, 10) << "no NaN/Inf results: the special flags went untested";
}

TEST(ExactLowering, MatchesNativeBitwiseFloat) { table<float>({1, 2, 3, 5, 8}, {0, 1, 7, 130}); }
TEST(ExactLowering, MatchesNativeBitwiseDouble) { table<double>({1, 2, 3, 7}, {0, 1, 9, 40}); }

// Sums that carry into the top limbs: 3 ranks x 2500 copies of FLT_MAX (> 2^11 maxima reach float's top limb),
// with and without an opposite -FLT_MAX run on one rank; a negative total (the top limb negative).
TEST(ExactLowering, CarriesIntoTheTopLimb) {
  constexpr float kMax = std::numeric_limits<float>::max();
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(fmt::format("variant {}", variant));
    auto fill = [&](int r) {
      ExactAcc<float> a;
      const float x = variant == 2 ? -kMax : (variant == 1 && r == 1) ? -kMax : kMax;
      for (int k = 0; k < 2500; ++k) a.add(x);
      a.add(0x1p-149f * static_cast<float>(r + 1));  // low digits too
      return a;
    };
    std::vector<ExactAcc<float>> got(3), nat(3);
    for (bool lower : {false, true}) {
      emu::SpawnOptions so;
      so.lower_exact_sum = lower;
      emu::spawn(
          3,
          [&](emu::RankContext& ctx) {
            ExactAcc<float> a = fill(ctx.rank());
            ctx.world().all_reduce(&a, &a, 1, DataType::exact_f32, ReduceOp::exact_sum);
            (lower ? got : nat)[static_cast<size_t>(ctx.rank())] = a;
          },
          so);
    }
    ExactAcc<float> want;
    for (int r = 0; r < 3; ++r) want.merge(fill(r));
    want.normalize();
    EXPECT_NE(want.limb(ExactAcc<float>::kLimbs - 1), 0) << "the case must reach the top limb";
    for (int r = 0; r < 3; ++r) {
      EXPECT_TRUE(same_bytes(got[static_cast<size_t>(r)], want)) << "rank " << r;
      EXPECT_EQ(bits(got[static_cast<size_t>(r)].round()), bits(want.round()));
      EXPECT_EQ(bits(nat[static_cast<size_t>(r)].round()), bits(want.round()));
    }
  }
}

// Mesh sub-communicators (split) lower too: an exact all_reduce over every group of a 2x3 split.
TEST(ExactLowering, SubCommunicators) {
  std::vector<float> got(6), want(6);
  emu::SpawnOptions so;
  so.lower_exact_sum = true;
  const emu::SpawnResult res = emu::spawn(
      6,
      [&](emu::RankContext& ctx) {
        const int r = ctx.rank();
        auto sub = ctx.world().split(r % 2, r, "pair");
        ExactAcc<float> a;
        a.add(0x1p100f * static_cast<float>(r + 1));
        a.add(-0x1p-140f * static_cast<float>(r));
        sub->all_reduce(&a, &a, 1, DataType::exact_f32, ReduceOp::exact_sum);
        got[static_cast<size_t>(r)] = a.round();
      },
      so);
  for (int r = 0; r < 6; ++r) {
    ExactAcc<float> a;
    for (int q = r % 2; q < 6; q += 2) {
      a.add(0x1p100f * static_cast<float>(q + 1));
      a.add(-0x1p-140f * static_cast<float>(q));
    }
    EXPECT_EQ(bits(got[static_cast<size_t>(r)]), bits(a.round())) << "rank " << r;
  }
  const OpStatsTable& st = res.ranks[0].stats.at("pair");
  EXPECT_EQ(st[static_cast<size_t>(CollOp::all_reduce)].bytes,
            static_cast<int64_t>(xl::words_per_element(DataType::exact_f32) * 8));
}

// The packed format of a few known accumulators (docs/numerics.md): digits, the split top limb, flag counters.
TEST(ExactLowering, PackedFormat) {
  ASSERT_EQ(xl::words_per_element(DataType::exact_f32), size_t{12});
  ASSERT_EQ(xl::words_per_element(DataType::exact_f64), size_t{70});
  std::vector<int64_t> w(12);
  ExactAcc<float> a;
  a.add(0x1p-149f);  // one unit
  xl::pack(DataType::exact_f32, &a, 1, w.data());
  EXPECT_EQ(w, (std::vector<int64_t>{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  ExactAcc<float> b;
  b.add(-0x1p-149f);  // -1: every digit 2^32 - 1, top word -1
  b.add(std::numeric_limits<float>::infinity());
  b.add(std::numeric_limits<float>::quiet_NaN());
  xl::pack(DataType::exact_f32, &b, 1, w.data());
  const int64_t d = (int64_t{1} << 32) - 1;
  EXPECT_EQ(w, (std::vector<int64_t>{d, d, d, d, d, d, d, d, d, d, -1, 1 + (int64_t{1} << 21)}));
  // unpack of their sum: 0, flags NaN|+Inf
  std::vector<int64_t> wa(12), s(12);
  xl::pack(DataType::exact_f32, &a, 1, wa.data());
  for (size_t i = 0; i < 12; ++i) s[i] = w[i] + wa[i];
  ExactAcc<float> c;
  xl::unpack(DataType::exact_f32, s.data(), 1, &c);
  for (int i = 0; i < ExactAcc<float>::kLimbs; ++i) EXPECT_EQ(c.limb(i), 0) << "limb " << i;
  EXPECT_EQ(c.flags(), 3u);
  EXPECT_TRUE(std::isnan(c.round()));
}

// Errors: a sum beyond the accumulator's range, words no sum of packed accumulators can have, wrong dtypes.
TEST(ExactLowering, Errors) {
  auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  std::vector<int64_t> w(12, 0);
  ExactAcc<float> a;
  w[10] = int64_t{1} << 31;  // top limb 2^63: beyond int64
  EXPECT_NE(message([&] { xl::unpack(DataType::exact_f32, w.data(), 1, &a); }).find("leaves the accumulator's range"),
            std::string::npos);
  // float's top limb has 40 bits (it shares its int64 with the counter and the flags): [-2^39, 2^39).
  static_assert(ExactAcc<float>::kTopMax == (int64_t{1} << 39) - 1 && ExactAcc<float>::kTopMin == -(int64_t{1} << 39));
  w[10] = (int64_t{1} << 7) - 1;  // the largest top limb's high half: fine
  w[9] = (int64_t{1} << 32) - 1;
  EXPECT_EQ(message([&] { xl::unpack(DataType::exact_f32, w.data(), 1, &a); }), "(no error)");
  EXPECT_EQ(a.limb(ExactAcc<float>::kLimbs - 1), ExactAcc<float>::kTopMax);
  w[8] = int64_t{1} << 32;  // ... but a carry into it overflows
  EXPECT_NE(message([&] { xl::unpack(DataType::exact_f32, w.data(), 1, &a); }).find("leaves the accumulator's range"),
            std::string::npos);
  w.assign(12, 0);
  w[10] = -(int64_t{1} << 7);  // the smallest top limb: fine
  EXPECT_EQ(message([&] { xl::unpack(DataType::exact_f32, w.data(), 1, &a); }), "(no error)");
  EXPECT_EQ(a.limb(ExactAcc<float>::kLimbs - 1), ExactAcc<float>::kTopMin);
  w[10] = -(int64_t{1} << 7) - 1;  // one below
  EXPECT_NE(message([&] { xl::unpack(DataType::exact_f32, w.data(), 1, &a); }).find("leaves the accumulator's range"),
            std::string::npos);
  {  // double's top limb is a whole int64: the largest high half is fine there
    std::vector<int64_t> wd(70, 0);
    wd[68] = (int64_t{1} << 31) - 1;
    ExactAcc<double> ad;
    EXPECT_EQ(message([&] { xl::unpack(DataType::exact_f64, wd.data(), 1, &ad); }), "(no error)");
  }
  w.assign(12, 0);
  w[3] = -1;  // a digit sum cannot be negative (a wrapped or foreign buffer)
  EXPECT_NE(message([&] { xl::unpack(DataType::exact_f32, w.data(), 1, &a); }).find("not a sum of at most 2097151"),
            std::string::npos);
  w.assign(12, 0);
  w[11] = -1;  // flag counters cannot be negative
  EXPECT_NE(message([&] { xl::unpack(DataType::exact_f32, w.data(), 1, &a); }).find("flag word"), std::string::npos);
  EXPECT_NE(message([] { xl::words_per_element(DataType::f32); }).find("not an exact dtype"), std::string::npos);
  // sum with an exact dtype stays invalid under the lowering (validated before lowering)
  emu::SpawnOptions so;
  so.lower_exact_sum = true;
  EXPECT_THROW(emu::spawn(
                   2,
                   [&](emu::RankContext& ctx) {
                     ExactAcc<float> x;
                     ctx.world().all_reduce(&x, &x, 1, DataType::exact_f32, ReduceOp::sum);
                   },
                   so),
               Error);
}

}  // namespace
}  // namespace trident
