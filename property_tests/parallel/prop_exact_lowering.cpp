// rapidcheck properties of the i64 lowering of exact_sum (parallel/exact_lowering.h, docs/numerics.md "Exact sums
// over integer collectives"): a random multiset of float/double terms (any bit pattern: huge and tiny exponents,
// subnormals, signed zeros, NaN, +-Inf; and runs of +-max that carry into the top limbs) is partitioned into
// contributions; the contributions are merged in a random tree, each merge being pack -> wordwise int64 sum in a
// random order -> unpack. The result rounds to the bits of one accumulator over all terms and has the canonical
// bytes of the native merge (normalised). The same through emulated all_reduce / reduce_scatter / reduce with the
// lowering forced. A failure prints rapidcheck's seed, the shrunk case and the logged repro line.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

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

// Any bit pattern, named extremes, values at random exponents over the whole range, and small integers (so that
// cancellations and carries between limbs happen).
template <class T>
rc::Gen<T> any_value() {
  using B = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  using L = std::numeric_limits<T>;
  const int emin = sizeof(T) == 4 ? -149 : -1074, emax = sizeof(T) == 4 ? 104 : 971;
  return rc::gen::weightedOneOf<T>({
      {5, rc::gen::map(rc::gen::arbitrary<B>(), [](B b) { return std::bit_cast<T>(b); })},
      {3, rc::gen::map(rc::gen::pair(rc::gen::inRange(-(1 << 23), 1 << 23), rc::gen::inRange(emin, emax)),
                       [](std::pair<int, int> p) { return std::ldexp(static_cast<T>(p.first), p.second); })},
      {2, rc::gen::map(rc::gen::inRange(-1000, 1000), [](int i) { return static_cast<T>(i); })},
      {2, rc::gen::element<T>(T(0), -T(0), L::infinity(), -L::infinity(), L::quiet_NaN(), -L::quiet_NaN(),
                              L::denorm_min(), -L::denorm_min(), L::min(), -L::min(), L::min() - L::denorm_min(),
                              L::max(), -L::max())},
  });
}

// Terms: any values, sometimes with a long run of +-max (float: > 2^11 copies reach the top limb).
template <class T>
std::vector<T> gen_terms() {
  std::vector<T> xs = *rc::gen::container<std::vector<T>>(any_value<T>());
  if (*rc::gen::weightedElement<bool>({{3, false}, {1, true}})) {
    const int copies = *rc::gen::inRange(1, 5000);
    const T m = *rc::gen::element<T>(std::numeric_limits<T>::max(), -std::numeric_limits<T>::max());
    xs.insert(xs.end(), static_cast<size_t>(copies), m);
  }
  return xs;
}

template <class T>
T single_sum(const std::vector<T>& xs) {
  ExactAcc<T> a;
  for (T x : xs) a.add(x);
  return a.round();
}

template <class T>
std::vector<std::byte> bytes_of(const ExactAcc<T>& a) {
  std::vector<std::byte> b(sizeof(a));
  std::memcpy(b.data(), &a, sizeof(a));
  return b;
}
template <class T>
std::vector<std::byte> canonical(ExactAcc<T> a) {
  a.normalize();
  return bytes_of(a);
}

// Merges nodes in a random tree; every inner node packs its k children, sums their words as int64 (wrapping
// adds, as a backend would; the bound says they never wrap) in a random order, and unpacks.
template <class T>
ExactAcc<T> lowered_tree(std::vector<ExactAcc<T>> nodes, std::mt19937_64& rng) {
  const size_t W = xl::words_per_element(dt_of<T>());
  bool first = true;
  while (nodes.size() > 1 || first) {
    first = false;
    std::shuffle(nodes.begin(), nodes.end(), rng);
    const size_t k = nodes.size() == 1 ? 1 : 2 + rng() % std::min<size_t>(nodes.size() - 1, 7);
    std::vector<std::vector<int64_t>> packed(k, std::vector<int64_t>(W));
    for (size_t j = 0; j < k; ++j) xl::pack(dt_of<T>(), &nodes[nodes.size() - k + j], 1, packed[j].data());
    std::vector<size_t> order(k);
    for (size_t j = 0; j < k; ++j) order[j] = j;
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<uint64_t> sum(W, 0);
    for (size_t j : order)
      for (size_t w = 0; w < W; ++w) sum[w] += static_cast<uint64_t>(packed[j][w]);
    std::vector<int64_t> s(W);
    for (size_t w = 0; w < W; ++w) s[w] = static_cast<int64_t>(sum[w]);
    ExactAcc<T> merged;
    xl::unpack(dt_of<T>(), s.data(), 1, &merged);
    nodes.resize(nodes.size() - k);
    nodes.push_back(merged);
  }
  return nodes[0];
}

template <class T>
void tree_property() {
  const std::vector<T> xs = gen_terms<T>();
  const int parts = *rc::gen::inRange(1, 65);
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  RC_LOG() << "repro: " << xs.size() << " terms in " << parts << " parts, seed " << seed << "\n";
  std::mt19937_64 rng(seed);
  std::vector<ExactAcc<T>> part(static_cast<size_t>(parts));
  for (T x : xs) part[rng() % static_cast<size_t>(parts)].add(x);
  ExactAcc<T> native;
  for (const auto& p : part) native.merge(p);
  const ExactAcc<T> low = lowered_tree(part, rng);
  const T want = single_sum(xs);
  RC_ASSERT(bits(low.round()) == bits(want));
  RC_ASSERT(bits(native.round()) == bits(want));
  RC_ASSERT(bytes_of(low) == canonical(native));  // the canonical state of the native merge
  RC_ASSERT(canonical(low) == bytes_of(low));     // unpack's result is already normalised
}

RC_GTEST_PROP(ExactLoweringProp, AnyPartitionAndTreeEqualsExactMergeFloat, ()) { tree_property<float>(); }
RC_GTEST_PROP(ExactLoweringProp, AnyPartitionAndTreeEqualsExactMergeDouble, ()) { tree_property<double>(); }

// One contribution's packed form is canonical: any words in the packed ranges (digits in [0, 2^32), the top word
// in the top limb's range - [-2^7, 2^7) float, [-2^31, 2^31) double -, flag fields 0/1) unpack to an accumulator
// that packs back to the same words; this covers top limbs far beyond what adding terms can reach in a test.
template <class T>
void roundtrip_property() {
  const size_t W = xl::words_per_element(dt_of<T>());
  std::vector<int64_t> w(W);
  for (size_t i = 0; i + 2 < W; ++i) {
    const int64_t d = *rc::gen::weightedOneOf<int64_t>({{3, rc::gen::inRange<int64_t>(0, int64_t{1} << 32)},
                                                         {1, rc::gen::element<int64_t>(0, (int64_t{1} << 32) - 1)}});
    w[i] = d;
  }
  const int64_t hb = (ExactAcc<T>::kTopMax >> 32) + 1;  // the top word's range [-hb, hb): 2^7 float, 2^31 double
  w[W - 2] = *rc::gen::weightedOneOf<int64_t>(
      {{3, rc::gen::inRange<int64_t>(-hb, hb)}, {1, rc::gen::element<int64_t>(0, -1, -hb, hb - 1)}});
  const int64_t nan = *rc::gen::inRange(0, 2), pinf = *rc::gen::inRange(0, 2), ninf = *rc::gen::inRange(0, 2);
  w[W - 1] = nan + (pinf << 21) + (ninf << 42);
  ExactAcc<T> a;
  xl::unpack(dt_of<T>(), w.data(), 1, &a);
  std::vector<int64_t> back(W);
  xl::pack(dt_of<T>(), &a, 1, back.data());
  RC_ASSERT(back == w);
  RC_ASSERT(canonical(a) == bytes_of(a));
}
RC_GTEST_PROP(ExactLoweringProp, PackedFormRoundTripsFloat, ()) { roundtrip_property<float>(); }
RC_GTEST_PROP(ExactLoweringProp, PackedFormRoundTripsDouble, ()) { roundtrip_property<double>(); }

// Through emulated collectives with SpawnOptions::lower_exact_sum: the terms of each element are dealt to random
// ranks; every rank's result (all_reduce, reduce_scatter, reduce at a random root; in or out of place; eager or
// direct protocol) has the canonical bytes of the native merge and rounds to the single-accumulator bits.
template <class T>
void collective_property() {
  const int n = *rc::gen::inRange(1, 7);
  const int op = *rc::gen::inRange(0, 3);  // 0 all_reduce, 1 reduce_scatter, 2 reduce
  const size_t count = static_cast<size_t>(*rc::gen::inRange(0, 5));
  const bool in_place = *rc::gen::arbitrary<bool>();
  const bool eager = *rc::gen::arbitrary<bool>();
  const int root = *rc::gen::inRange(0, n);
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  const size_t elems = op == 1 ? static_cast<size_t>(n) * count : count;  // elements of each rank's send buffer
  std::vector<std::vector<T>> terms(elems);
  for (auto& t : terms) t = *rc::gen::container<std::vector<T>>(*rc::gen::inRange(0, 12), any_value<T>());
  RC_LOG() << "repro: n=" << n << " op=" << op << " count=" << count << " in_place=" << in_place
           << " eager=" << eager << " root=" << root << " seed=" << seed << "\n";
  std::mt19937_64 rng(seed);
  // contributions[r][e]
  std::vector<std::vector<ExactAcc<T>>> contrib(static_cast<size_t>(n), std::vector<ExactAcc<T>>(elems));
  for (size_t e = 0; e < elems; ++e)
    for (T x : terms[e]) contrib[rng() % static_cast<size_t>(n)][e].add(x);
  std::vector<std::vector<ExactAcc<T>>> got(static_cast<size_t>(n));
  std::vector<int64_t> counted(static_cast<size_t>(n), -1);  // stats bytes of the call: the lowering ran
  emu::SpawnOptions so;
  so.lower_exact_sum = true;
  so.eager_bytes = eager ? size_t{1} << 20 : 0;
  emu::spawn(
      n,
      [&](emu::RankContext& ctx) {
        const auto r = static_cast<size_t>(ctx.rank());
        std::vector<ExactAcc<T>> send = contrib[r];
        std::vector<ExactAcc<T>>& out = got[r];
        out.assign(count, ExactAcc<T>());
        Communicator& w = ctx.world();
        if (op == 0) {
          if (in_place) {
            w.all_reduce(send.data(), send.data(), count, dt_of<T>(), ReduceOp::exact_sum);
            out = send;
          } else {
            w.all_reduce(send.data(), out.data(), count, dt_of<T>(), ReduceOp::exact_sum);
          }
        } else if (op == 1) {
          if (in_place) {
            w.reduce_scatter(send.data(), send.data() + r * count, count, dt_of<T>(), ReduceOp::exact_sum);
            out.assign(send.begin() + static_cast<ptrdiff_t>(r * count),
                       send.begin() + static_cast<ptrdiff_t>((r + 1) * count));
          } else {
            w.reduce_scatter(send.data(), out.data(), count, dt_of<T>(), ReduceOp::exact_sum);
          }
        } else {
          if (in_place) {
            w.reduce(send.data(), send.data(), count, dt_of<T>(), ReduceOp::exact_sum, root);
            if (static_cast<int>(r) == root) out = send;
          } else {
            w.reduce(send.data(), out.data(), count, dt_of<T>(), ReduceOp::exact_sum, root);
          }
        }
        const CollOp cop = op == 0 ? CollOp::all_reduce : op == 1 ? CollOp::reduce_scatter : CollOp::reduce;
        counted[r] = w.stats()[static_cast<size_t>(cop)].bytes;
      },
      so);
  const size_t W = xl::words_per_element(dt_of<T>());
  for (int r = 0; r < n; ++r) {
    RC_ASSERT(counted[static_cast<size_t>(r)] == static_cast<int64_t>(elems * W * sizeof(int64_t)));
    if (op == 2 && r != root) continue;
    for (size_t i = 0; i < count; ++i) {
      const size_t e = op == 1 ? static_cast<size_t>(r) * count + i : i;
      ExactAcc<T> native;
      for (int q = 0; q < n; ++q) native.merge(contrib[static_cast<size_t>(q)][e]);
      const ExactAcc<T>& g = got[static_cast<size_t>(r)][i];
      RC_ASSERT(bytes_of(g) == canonical(native));
      RC_ASSERT(bits(g.round()) == bits(single_sum(terms[e])));
    }
  }
}
RC_GTEST_PROP(ExactLoweringProp, EmulatedCollectivesEqualExactMergeFloat, ()) { collective_property<float>(); }
RC_GTEST_PROP(ExactLoweringProp, EmulatedCollectivesEqualExactMergeDouble, ()) { collective_property<double>(); }

}  // namespace
}  // namespace trident
