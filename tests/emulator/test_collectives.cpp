// One table of collective cases (nccl-tests style): every collective, in place and out of place, over world
// sizes {1,2,3,4,7,8,16,64,256}, counts including 0 and sizes not divisible by the world, every dtype, every
// reduce op. Inputs are small integers, so every expected value is exact and the check is bitwise.
// Each failing case prints a one-line repro (world size + case string).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "emulator/world.h"
#include "tests/emulator/values.h"

namespace trident {
namespace {

using emutest::GuardedBuf;
using emutest::put;
using emutest::val;

struct Case {
  CollOp op;
  size_t count;
  DataType dt;
  ReduceOp rop;
  bool in_place;
  int root;
  std::string str() const {
    return fmt::format("op={} count={} dtype={} redop={} in_place={} root={}", to_string(op), count, to_string(dt),
                       to_string(rop), in_place, root);
  }
};

// Big worlds get fewer, smaller cases (runtime, also under ThreadSanitizer); small worlds get everything.
std::vector<Case> cases_for(int n) {
  const bool small = n <= 8, huge = n > 64;
  std::vector<size_t> counts = small ? std::vector<size_t>{0, 1, 5, 1031}
                                     : huge ? std::vector<size_t>{0, 5} : std::vector<size_t>{0, 3, 37};
  std::vector<DataType> dts = small ? std::vector<DataType>{DataType::f64, DataType::f32, DataType::bf16,
                                                            DataType::i32, DataType::i64, DataType::u8}
                                    : huge ? std::vector<DataType>{DataType::f32, DataType::u8}
                                           : std::vector<DataType>{DataType::f32, DataType::bf16, DataType::i64,
                                                                   DataType::u8};
  std::vector<Case> cs;
  int root_pick = 0;
  for (size_t c : counts)
    for (DataType dt : dts) {
      std::vector<ReduceOp> rops = {ReduceOp::sum};
      if (small || dt == DataType::f32) rops = {ReduceOp::sum, ReduceOp::max, ReduceOp::min};
      for (bool ip : {false, true}) {
        const int root = (root_pick++ % 2) ? n - 1 : n / 2;
        cs.push_back({CollOp::all_gather, c, dt, ReduceOp::sum, ip, -1});
        cs.push_back({CollOp::broadcast, c, dt, ReduceOp::sum, ip, root});
        for (ReduceOp r : rops) {
          cs.push_back({CollOp::reduce_scatter, c, dt, r, ip, -1});
          cs.push_back({CollOp::all_reduce, c, dt, r, ip, -1});
          cs.push_back({CollOp::reduce, c, dt, r, ip, root});
        }
      }
      cs.push_back({CollOp::all_to_all, c, dt, ReduceOp::sum, false, -1});
      cs.push_back({CollOp::all_to_allv, c, dt, ReduceOp::sum, false, -1});
      cs.push_back({CollOp::send, c, dt, ReduceOp::sum, false, -1});  // grouped ring + blocking pairwise exchange
    }
  return cs;
}

int64_t combine(ReduceOp op, int64_t a, int64_t b) {
  switch (op) {
    case ReduceOp::sum: return a + b;
    case ReduceOp::max: return std::max(a, b);
    case ReduceOp::min: return std::min(a, b);
    default: return 0;
  }
}
// Reduction over ranks of val(q, i).
int64_t reduced(ReduceOp op, int n, uint64_t i) {
  int64_t acc = val(0, i);
  for (int q = 1; q < n; ++q) acc = combine(op, acc, val(q, i));
  return acc;
}

// Per-rank checker: records the first few differences.
struct Checker {
  DataType dt;
  std::vector<std::string>* errs;
  const std::string* what;
  int rank;
  int64_t nonzero = 0;
  void expect(const char* got, int64_t want, size_t idx) {
    char tmp[16] = {};
    put(dt, tmp, 0, want);
    const size_t es = dtype_size(dt);
    nonzero += want != 0;
    if (std::memcmp(got, tmp, es) != 0 && errs->size() < 5)
      errs->push_back(fmt::format("rank {}: {}: element {} differs (want {})", rank, *what, idx, want));
  }
  void guards(const GuardedBuf& b, const char* name) {
    if (!b.guards_ok() && errs->size() < 5)
      errs->push_back(fmt::format("rank {}: {}: guard bytes of {} overwritten", rank, *what, name));
  }
};

// Ring exchange with grouped send/recv, then a blocking pairwise exchange (even ranks send first).
void run_p2p(Communicator& comm, const Case& k, Checker& ck) {
  const int n = comm.size(), r = comm.rank();
  const size_t c = k.count, es = dtype_size(k.dt);
  GuardedBuf s(k.dt, c), d(k.dt, c);
  for (size_t i = 0; i < c; ++i) put(k.dt, s.at(i), 0, val(r, i));
  comm.group_start();
  comm.send(s.data(), c, k.dt, (r + 1) % n);
  comm.recv(d.data(), c, k.dt, (r + n - 1) % n);
  comm.group_end();
  for (size_t i = 0; i < c; ++i) ck.expect(d.at(i), val((r + n - 1) % n, i), i);
  ck.guards(d, "ring recv");
  const int partner = r ^ 1;
  if (partner < n) {
    std::vector<char> back(c * es);
    if (r % 2 == 0) {
      comm.send(s.data(), c, k.dt, partner);
      comm.recv(back.data(), c, k.dt, partner);
    } else {
      comm.recv(back.data(), c, k.dt, partner);
      comm.send(s.data(), c, k.dt, partner);
    }
    for (size_t i = 0; i < c; ++i) ck.expect(back.data() + i * es, val(partner, i), i);
  }
}

void run_case(Communicator& comm, const Case& k, Checker& ck) {
  const int n = comm.size(), r = comm.rank();
  const size_t c = k.count, nn = static_cast<size_t>(n);
  switch (k.op) {
    case CollOp::all_gather: {
      GuardedBuf recv(k.dt, nn * c), send(k.dt, c);
      char* sp = k.in_place ? recv.at(static_cast<size_t>(r) * c) : send.at(0);
      for (size_t i = 0; i < c; ++i) put(k.dt, sp + i * send.es, 0, val(r, i));
      comm.all_gather(sp, recv.data(), c, k.dt);
      for (int j = 0; j < n; ++j)
        for (size_t i = 0; i < c; ++i) ck.expect(recv.at(static_cast<size_t>(j) * c + i), val(j, i), i);
      ck.guards(recv, "recv");
      break;
    }
    case CollOp::reduce_scatter: {
      GuardedBuf send(k.dt, nn * c), recv(k.dt, c);
      for (size_t i = 0; i < nn * c; ++i) put(k.dt, send.at(i), 0, val(r, i));
      void* rp = k.in_place ? send.at(static_cast<size_t>(r) * c) : recv.data();
      comm.reduce_scatter(send.data(), rp, c, k.dt, k.rop);
      for (size_t i = 0; i < c; ++i)
        ck.expect(static_cast<char*>(rp) + i * send.es, reduced(k.rop, n, static_cast<size_t>(r) * c + i), i);
      ck.guards(send, "send");
      ck.guards(recv, "recv");
      break;
    }
    case CollOp::all_reduce: {
      GuardedBuf send(k.dt, c), recv(k.dt, c);
      for (size_t i = 0; i < c; ++i) put(k.dt, send.at(i), 0, val(r, i));
      void* rp = k.in_place ? send.data() : recv.data();
      comm.all_reduce(send.data(), rp, c, k.dt, k.rop);
      for (size_t i = 0; i < c; ++i) ck.expect(static_cast<char*>(rp) + i * send.es, reduced(k.rop, n, i), i);
      ck.guards(send, "send");
      ck.guards(recv, "recv");
      break;
    }
    case CollOp::broadcast: {
      GuardedBuf send(k.dt, c), recv(k.dt, c);
      void* rp = k.in_place ? send.data() : recv.data();
      for (size_t i = 0; i < c; ++i) put(k.dt, send.at(i), 0, val(r, i));  // every rank fills; root's wins
      comm.broadcast(send.data(), rp, c, k.dt, k.root);
      for (size_t i = 0; i < c; ++i) ck.expect(static_cast<char*>(rp) + i * send.es, val(k.root, i), i);
      ck.guards(send, "send");
      ck.guards(recv, "recv");
      break;
    }
    case CollOp::reduce: {
      GuardedBuf send(k.dt, c), recv(k.dt, c);
      for (size_t i = 0; i < c; ++i) put(k.dt, send.at(i), 0, val(r, i));
      void* rp = k.in_place ? send.data() : recv.data();
      comm.reduce(send.data(), rp, c, k.dt, k.rop, k.root);
      if (r == k.root)
        for (size_t i = 0; i < c; ++i) ck.expect(static_cast<char*>(rp) + i * send.es, reduced(k.rop, n, i), i);
      if (r != k.root || !k.in_place)  // non-root send buffers are not modified
        for (size_t i = 0; i < c; ++i) ck.expect(send.at(i), val(r, i), i);
      ck.guards(send, "send");
      ck.guards(recv, "recv");
      break;
    }
    case CollOp::all_to_all: {
      GuardedBuf send(k.dt, nn * c), recv(k.dt, nn * c);
      for (size_t i = 0; i < nn * c; ++i) put(k.dt, send.at(i), 0, val(r, i));
      comm.all_to_all(send.data(), recv.data(), c, k.dt);
      for (int j = 0; j < n; ++j)
        for (size_t i = 0; i < c; ++i)
          ck.expect(recv.at(static_cast<size_t>(j) * c + i), val(j, static_cast<size_t>(r) * c + i), i);
      ck.guards(recv, "recv");
      break;
    }
    case CollOp::all_to_allv: {
      // Uneven splits (including empty blocks), with a one-element gap between blocks to exercise displacements.
      auto cnt = [&](int from, int to) { return static_cast<size_t>((from * 3 + to * 5 + static_cast<int>(c)) % 4); };
      std::vector<size_t> sc(nn), sd(nn), rc(nn), rd(nn);
      size_t so = 0, ro = 0;
      for (int j = 0; j < n; ++j) {
        sc[static_cast<size_t>(j)] = cnt(r, j), sd[static_cast<size_t>(j)] = so, so += sc[static_cast<size_t>(j)] + 1;
        rc[static_cast<size_t>(j)] = cnt(j, r), rd[static_cast<size_t>(j)] = ro, ro += rc[static_cast<size_t>(j)] + 1;
      }
      GuardedBuf send(k.dt, so), recv(k.dt, ro);
      for (int j = 0; j < n; ++j)
        for (size_t i = 0; i < sc[static_cast<size_t>(j)]; ++i)
          put(k.dt, send.at(sd[static_cast<size_t>(j)] + i), 0, val(r, static_cast<size_t>(j) * 1000 + i));
      comm.all_to_allv(send.data(), sc.data(), sd.data(), recv.data(), rc.data(), rd.data(), k.dt);
      for (int j = 0; j < n; ++j)
        for (size_t i = 0; i < rc[static_cast<size_t>(j)]; ++i)
          ck.expect(recv.at(rd[static_cast<size_t>(j)] + i), val(j, static_cast<size_t>(r) * 1000 + i), i);
      ck.guards(recv, "recv");
      break;
    }
    case CollOp::send: run_p2p(comm, k, ck); break;
    default: break;
  }
}

// (world size, eager_bytes): 0 forces the direct path (ranks read each other's buffers, completion barrier);
// the default sends small calls through the eager path (staged inputs).
class Collectives : public ::testing::TestWithParam<std::tuple<int, size_t>> {};

TEST_P(Collectives, Table) {
  const int n = std::get<0>(GetParam());
  emu::SpawnOptions opts;
  opts.eager_bytes = std::get<1>(GetParam());
  const auto cases = cases_for(n);
  std::vector<std::vector<std::string>> errs(static_cast<size_t>(n));
  std::vector<int64_t> nonzero(static_cast<size_t>(n));
  std::vector<std::string> names;
  for (const auto& k : cases) names.push_back(k.str());
  auto res = emu::spawn(n, [&](emu::RankContext& ctx) {
    const auto r = static_cast<size_t>(ctx.rank());
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      Checker ck{cases[ci].dt, &errs[r], &names[ci], ctx.rank()};
      run_case(ctx.world(), cases[ci], ck);
      nonzero[r] += ck.nonzero;
    }
  }, opts);
  for (int r = 0; r < n; ++r) {
    for (const auto& e : errs[static_cast<size_t>(r)]) ADD_FAILURE() << "repro: world=" << n << " eager_bytes=" << opts.eager_bytes << " " << e;
    EXPECT_GT(nonzero[static_cast<size_t>(r)], 0) << "vacuous: rank " << r << " checked no nonzero value";
  }
  // Accounting: each rank counted each of its calls once.
  const auto total = res.total();
  int64_t ar = 0, a2a = 0;
  for (const auto& k : cases) ar += k.op == CollOp::all_reduce, a2a += k.op == CollOp::all_to_all;
  EXPECT_EQ(total.at("world")[static_cast<size_t>(CollOp::all_reduce)].calls, ar * n);
  EXPECT_EQ(total.at("world")[static_cast<size_t>(CollOp::all_to_all)].calls, a2a * n);
  std::cout << "world " << n << ": " << cases.size() << " cases per rank\n";
}

INSTANTIATE_TEST_SUITE_P(Worlds, Collectives,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 7, 8, 16, 64, 256),
                                            ::testing::Values(size_t{0}, emu::SpawnOptions{}.eager_bytes)),
                         [](const auto& info) {
                           return fmt::format("n{}_eager{}", std::get<0>(info.param), std::get<1>(info.param));
                         });

// CommSplit with several colours (and ranks that opt out): sizes, ranks (ordered by key), and a reduction
// inside each new communicator that names its members.
class Split : public ::testing::TestWithParam<int> {};

TEST_P(Split, Colours) {
  const int n = GetParam();
  std::vector<std::string> errs(static_cast<size_t>(n));
  emu::spawn(n, [&](emu::RankContext& ctx) {
    const int r = ctx.rank();
    std::string& e = errs[static_cast<size_t>(r)];
    for (int k : {1, 2, 3}) {
      const bool out = (r % 5 == 4);  // opts out: kNoColor
      auto sub = ctx.world().split(out ? Communicator::kNoColor : r % k, -r, fmt::format("mod{}", k));
      if (out) {
        if (sub) e += "opted-out rank got a communicator; ";
        continue;
      }
      std::vector<int> members;
      for (int q = n - 1; q >= 0; --q)  // key -r: descending world rank
        if (q % 5 != 4 && q % k == r % k) members.push_back(q);
      if (!sub || sub->size() != static_cast<int>(members.size())) {
        e += fmt::format("k={} size {} != {}; ", k, sub ? sub->size() : -1, members.size());
        continue;
      }
      const auto pos = std::find(members.begin(), members.end(), r) - members.begin();
      if (sub->rank() != pos) e += fmt::format("k={} rank {} != {}; ", k, sub->rank(), pos);
      if (sub->name() != fmt::format("mod{}", k)) e += "name; ";
      std::vector<int64_t> ids(members.size());
      int64_t mine = r;
      sub->all_gather(&mine, ids.data(), 1, DataType::i64);
      for (size_t i = 0; i < members.size(); ++i)
        if (ids[i] != members[i]) e += fmt::format("k={} member {} is {} not {}; ", k, i, ids[i], members[i]);
    }
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errs[static_cast<size_t>(r)], "") << "repro: world=" << n << " rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Worlds, Split, ::testing::Values(1, 2, 3, 7, 16, 64),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

}  // namespace
}  // namespace trident
