// rapidcheck properties of the CUDA ref tier run on the host (gpu/ref/host_kernels.h, docs/gpu.md "The ref tier"):
// on random shapes (including 1-element and empty dimensions), random tile segments (with empty tiles), the three
// policies and random values, each op of the ref tier gives the CPU kernels' bits (CpuKernels = the reference ops).
// A failure prints rapidcheck's seed and the shrunk case.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "emulator/device.h"
#include "gpu/ref/host_kernels.h"
#include "property_tests/gpu/policies.h"

namespace trident {
namespace {

template <class T>
std::vector<T> values(int64_t n) {
  // small integers scaled by powers of two (ties and cancellations) mixed with arbitrary finite values
  std::vector<T> v(static_cast<size_t>(n));
  for (auto& x : v)
    x = *rc::gen::weightedOneOf<T>(
        {{2, rc::gen::map(rc::gen::pair(rc::gen::inRange(-64, 65), rc::gen::inRange(-6, 3)),
                          [](std::pair<int, int> p) { return std::ldexp(static_cast<T>(p.first), p.second); })},
         {3, rc::gen::map(rc::gen::inRange(-1000000, 1000001),
                          [](int i) { return static_cast<T>(i) / static_cast<T>(262144); })}});
  return v;
}
std::vector<int64_t> segments(int64_t rows) {  // non-decreasing cuts of [0, rows], empty tiles allowed
  std::vector<int64_t> s = {0};
  const int cuts = *rc::gen::inRange(0, 5);
  for (int i = 0; i < cuts; ++i) s.push_back(*rc::gen::inRange<int64_t>(0, rows + 1));
  s.push_back(rows);
  std::sort(s.begin(), s.end());
  return s;
}
template <class U>
bool same_bits(const std::vector<U>& a, const std::vector<U>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(U)) == 0);
}
template <class T>
std::vector<T> rounded(const std::vector<ExactAcc<T>>& acc) {
  std::vector<T> out(acc.size());
  exact_round<T>(acc.data(), out.data(), static_cast<int64_t>(acc.size()));
  return out;
}

struct Sets {
  RankTrace trace;
  emu::EmuDevice dev{0, trace, emu::DeviceOptions{}};
};

template <class T>
void gemm_like(Policy pol) {
  Sets z;
  CpuKernels<T> cpu(z.dev);
  auto ref = gpu::make_ref_host_kernels<T>(z.dev);
  const Stream s = z.dev.compute_stream();
  const int64_t M = *rc::gen::inRange(0, 9), N = *rc::gen::inRange(1, 9), K = *rc::gen::inRange(0, 40);
  const bool tb = *rc::gen::arbitrary<bool>();
  const auto A = values<T>(M * K), B = values<T>(K * N);
  std::vector<T> c1(M * N), c2(M * N);
  cpu.mm(pol, M, N, K, A.data(), K, B.data(), tb ? K : N, tb, c1.data(), N, s);
  ref->mm(pol, M, N, K, A.data(), K, B.data(), tb ? K : N, tb, c2.data(), N, s);
  RC_ASSERT(same_bits(c1, c2));
  // wgrad_acc / sum_acc: X (rows, K), dY (rows, N) over random tiles
  const int64_t rows = *rc::gen::inRange(0, 30);
  const auto segs = segments(rows);
  const auto X = values<T>(rows * std::max<int64_t>(K, 1)), dY = values<T>(rows * N);
  std::vector<ExactAcc<T>> a1(K * N), a2(K * N), s1(N), s2(N);
  cpu.wgrad_acc(pol, X.data(), std::max<int64_t>(K, 1), dY.data(), N, K, N, segs, a1.data(), s);
  ref->wgrad_acc(pol, X.data(), std::max<int64_t>(K, 1), dY.data(), N, K, N, segs, a2.data(), s);
  RC_ASSERT(same_bits(rounded(a1), rounded(a2)));
  cpu.sum_acc(dY.data(), N, segs, s1.data(), s);
  ref->sum_acc(dY.data(), N, segs, s2.data(), s);
  RC_ASSERT(same_bits(rounded(s1), rounded(s2)));
  // rmsnorm forward and backward on those rows
  const int64_t d = N;
  const auto g = values<T>(d);
  std::vector<T> y1(rows * d), y2(rows * d), r1(rows), r2(rows), dx1(rows * d), dx2(rows * d);
  cpu.rmsnorm_forward(dY.data(), d, g.data(), rows, d, 1e-6, y1.data(), d, r1.data(), s);
  ref->rmsnorm_forward(dY.data(), d, g.data(), rows, d, 1e-6, y2.data(), d, r2.data(), s);
  RC_ASSERT(same_bits(y1, y2));
  RC_ASSERT(same_bits(r1, r2));
  const auto dy = values<T>(rows * d);
  std::vector<ExactAcc<T>> dg1(d), dg2(d);
  cpu.rmsnorm_backward(dy.data(), d, dY.data(), d, r1.data(), g.data(), rows, d, segs, dx1.data(), d, dg1.data(), s);
  ref->rmsnorm_backward(dy.data(), d, dY.data(), d, r1.data(), g.data(), rows, d, segs, dx2.data(), d, dg2.data(), s);
  RC_ASSERT(same_bits(dx1, dx2));
  RC_ASSERT(same_bits(rounded(dg1), rounded(dg2)));
}

template <class T>
void attention_core(Policy pol) {
  Sets z;
  CpuKernels<T> cpu(z.dev);
  auto ref = gpu::make_ref_host_kernels<T>(z.dev);
  const Stream s = z.dev.compute_stream();
  model::CoreDims cd = proptest::random_core_dims(6, 5);
  cd.scale = 0.5;
  const int64_t S = *rc::gen::inRange(1, 12), Nq = *rc::gen::inRange(1, 10);
  std::vector<int64_t> qpos(static_cast<size_t>(Nq));
  for (auto& p : qpos) p = *rc::gen::inRange<int64_t>(0, S);
  const auto q = values<T>(Nq * cd.H * cd.Dq), kv = values<T>(S * cd.P), dO = values<T>(Nq * cd.H * cd.Dv);
  std::vector<T> o1(Nq * cd.H * cd.Dv), o2(o1.size()), st1(Nq * cd.H * 2), st2(st1.size());
  cpu.attn_core_forward(pol, cd, q.data(), qpos.data(), Nq, kv.data(), S, o1.data(), st1.data(), s);
  ref->attn_core_forward(pol, cd, q.data(), qpos.data(), Nq, kv.data(), S, o2.data(), st2.data(), s);
  RC_ASSERT(same_bits(o1, o2));
  RC_ASSERT(same_bits(st1, st2));
  const auto qsegs = segments(Nq);
  std::vector<T> dq1(q.size()), dq2(q.size());
  std::vector<ExactAcc<T>> k1(kv.size()), k2(kv.size());
  cpu.attn_core_backward(pol, cd, q.data(), qpos.data(), Nq, kv.data(), S, o1.data(), st1.data(), dO.data(), qsegs,
                         dq1.data(), k1.data(), s);
  ref->attn_core_backward(pol, cd, q.data(), qpos.data(), Nq, kv.data(), S, o1.data(), st1.data(), dO.data(), qsegs,
                          dq2.data(), k2.data(), s);
  RC_ASSERT(same_bits(dq1, dq2));
  RC_ASSERT(same_bits(rounded(k1), rounded(k2)));
}

// DSA: selection (ties are frequent: the values are small integers scaled by powers of two), the sparse core with
// the indexer's KL terms, and its backward, on random MLA shapes, indexer shapes, top-k and document starts.
template <class T>
void dsa_ops(Policy pol) {
  Sets z;
  CpuKernels<T> cpu(z.dev);
  auto ref = gpu::make_ref_host_kernels<T>(z.dev);
  const Stream s = z.dev.compute_stream();
  model::CoreDims cd;
  cd.G = 1;
  cd.H = *rc::gen::inRange(1, 4);
  cd.Dq = *rc::gen::inRange(1, 6);
  cd.Dv = *rc::gen::inRange<int64_t>(1, cd.Dq + 1);
  cd.Hi = *rc::gen::inRange(1, 4);
  cd.Di = *rc::gen::inRange(1, 5);
  cd.topk = *rc::gen::inRange(1, 7);
  cd.ikey = cd.Dq;
  cd.P = cd.Dq + cd.Di;
  cd.scale = 0.5;
  const int64_t S = *rc::gen::inRange(1, 14), Nq = *rc::gen::inRange(1, 10), Iw = cd.Hi * cd.Di + cd.Hi;
  std::vector<int64_t> qpos(static_cast<size_t>(Nq)), qdoc(static_cast<size_t>(Nq));
  for (size_t r = 0; r < qpos.size(); ++r) {
    qpos[r] = *rc::gen::inRange<int64_t>(0, S);
    qdoc[r] = *rc::gen::inRange<int64_t>(0, qpos[r] + 1);
  }
  const bool docs = *rc::gen::arbitrary<bool>();
  const auto q = values<T>(Nq * cd.H * cd.Dq), iq = values<T>(Nq * Iw), kv = values<T>(S * cd.P),
             dO = values<T>(Nq * cd.H * cd.Dv);
  std::vector<int32_t> sel1(static_cast<size_t>(Nq * cd.topk)), sel2(sel1.size());
  cpu.dsa_select(pol, cd, iq.data(), qpos.data(), docs ? qdoc.data() : nullptr, Nq, kv.data(), S, sel1.data(), s);
  ref->dsa_select(pol, cd, iq.data(), qpos.data(), docs ? qdoc.data() : nullptr, Nq, kv.data(), S, sel2.data(), s);
  RC_ASSERT(sel1 == sel2);
  std::vector<T> o1(Nq * cd.H * cd.Dv), o2(o1.size()), st1(Nq * cd.H * 2), st2(st1.size()), kl1(Nq), kl2(Nq);
  cpu.dsa_core_forward(pol, cd, q.data(), iq.data(), qpos.data(), Nq, kv.data(), S, sel1.data(), o1.data(), st1.data(),
                       kl1.data(), s);
  ref->dsa_core_forward(pol, cd, q.data(), iq.data(), qpos.data(), Nq, kv.data(), S, sel1.data(), o2.data(),
                        st2.data(), kl2.data(), s);
  RC_ASSERT(same_bits(o1, o2));
  RC_ASSERT(same_bits(st1, st2));
  RC_ASSERT(same_bits(kl1, kl2));
  const auto qsegs = segments(Nq);
  const T iscale = static_cast<T>(1) / static_cast<T>(*rc::gen::inRange(1, 100));
  std::vector<T> dq1(q.size()), dq2(q.size()), di1(iq.size()), di2(iq.size());
  std::vector<ExactAcc<T>> k1(kv.size()), k2(kv.size());
  cpu.dsa_core_backward(pol, cd, q.data(), iq.data(), qpos.data(), Nq, kv.data(), S, sel1.data(), o1.data(),
                        st1.data(), dO.data(), iscale, qsegs, dq1.data(), di1.data(), k1.data(), s);
  ref->dsa_core_backward(pol, cd, q.data(), iq.data(), qpos.data(), Nq, kv.data(), S, sel1.data(), o1.data(),
                         st1.data(), dO.data(), iscale, qsegs, dq2.data(), di2.data(), k2.data(), s);
  RC_ASSERT(same_bits(dq1, dq2));
  RC_ASSERT(same_bits(di1, di2));
  RC_ASSERT(same_bits(rounded(k1), rounded(k2)));
}

template <class T>
void loss_router_optimizer(Policy pol) {
  Sets z;
  CpuKernels<T> cpu(z.dev);
  auto ref = gpu::make_ref_host_kernels<T>(z.dev);
  const Stream s = z.dev.compute_stream();
  // linear CE: vocab chunks, ignored targets, the backward in two column ranges of whole chunks
  const int64_t N = *rc::gen::inRange(1, 8), d = *rc::gen::inRange(1, 6), vc = *rc::gen::inRange(1, 5);
  const int64_t V = *rc::gen::inRange(1, 16);
  std::vector<int32_t> tgt(static_cast<size_t>(N));
  for (auto& t : tgt) t = *rc::gen::weightedOneOf<int32_t>({{4, rc::gen::inRange<int32_t>(0, static_cast<int32_t>(V))},
                                                           {1, rc::gen::just<int32_t>(-100)}});
  const auto h = values<T>(N * d), W = values<T>(d * V);
  std::vector<T> l1(N), l2(N), z1(N), z2(N), dh1(N * d), dh2(N * d);
  cpu.linear_ce_forward(pol, h.data(), W.data(), tgt.data(), N, d, V, vc, 3, l1.data(), z1.data(), s);
  ref->linear_ce_forward(pol, h.data(), W.data(), tgt.data(), N, d, V, vc, 3, l2.data(), z2.data(), s);
  RC_ASSERT(same_bits(l1, l2));
  RC_ASSERT(same_bits(z1, z2));
  const auto segs = segments(N);
  const int64_t cut = std::min(V, vc * *rc::gen::inRange<int64_t>(1, 4));
  for (auto [j0, j1] : {std::pair<int64_t, int64_t>{0, cut}, {cut, V}}) {
    if (j0 == j1) continue;
    std::vector<ExactAcc<T>> a1(d * (j1 - j0)), a2(a1.size());
    cpu.linear_ce_backward(pol, h.data(), W.data(), tgt.data(), z1.data(), N, d, V, vc, 3, T(0.125), segs, j0, j1,
                           dh1.data(), a1.data(), s);
    ref->linear_ce_backward(pol, h.data(), W.data(), tgt.data(), z1.data(), N, d, V, vc, 3, T(0.125), segs, j0, j1,
                            dh2.data(), a2.data(), s);
    RC_ASSERT(same_bits(rounded(a1), rounded(a2)));
    RC_ASSERT(same_bits(dh1, dh2));
  }
  // router: top-K of E by biased sigmoid scores (ties from repeated values), its backward
  const int64_t E = *rc::gen::inRange(1, 9), K = *rc::gen::inRange<int64_t>(1, E + 1);
  const auto wr = values<T>(d * E), bias = values<T>(E);
  std::vector<T> lg1(N * E), lg2(N * E), sc1(N * E), sc2(N * E), g1(N * K), g2(N * K);
  std::vector<int32_t> sel1(N * K), sel2(N * K);
  cpu.router_forward(pol, h.data(), wr.data(), bias.data(), N, d, E, K, 2.5, lg1.data(), sc1.data(), sel1.data(),
                     g1.data(), s);
  ref->router_forward(pol, h.data(), wr.data(), bias.data(), N, d, E, K, 2.5, lg2.data(), sc2.data(), sel2.data(),
                      g2.data(), s);
  RC_ASSERT(sel1 == sel2);
  RC_ASSERT(same_bits(g1, g2));
  const auto dgate = values<T>(N * K);
  std::vector<T> dl1(N * E), dl2(N * E);
  cpu.router_backward(dgate.data(), sc1.data(), sel1.data(), N, E, K, 2.5, dl1.data(), s);
  ref->router_backward(dgate.data(), sc1.data(), sel1.data(), N, E, K, 2.5, dl2.data(), s);
  RC_ASSERT(same_bits(dl1, dl2));
  // AdamW at a random step, with and without decay
  const int64_t n = *rc::gen::inRange(0, 20), step = *rc::gen::inRange(1, 50);
  const bool decay = *rc::gen::arbitrary<bool>();
  auto w1 = values<T>(n), m1 = values<T>(n), v1 = values<T>(n);
  for (auto& x : v1) x = x * x;
  auto w2 = w1, m2 = m1, v2 = v1;
  const auto grad = values<T>(n);
  const model::AdamWHyper hy;
  cpu.adamw_step(w1.data(), grad.data(), m1.data(), v1.data(), n, hy, step, 0.75, decay, s);
  ref->adamw_step(w2.data(), grad.data(), m2.data(), v2.data(), n, hy, step, 0.75, decay, s);
  RC_ASSERT(same_bits(w1, w2));
  RC_ASSERT(same_bits(m1, m2));
  RC_ASSERT(same_bits(v1, v2));
}

RC_GTEST_PROP(CudaRefHostProp, GemmTileSumsAndNormsBitwise, ()) {
  proptest::with_random_policy([](auto t, Policy pol) { gemm_like<decltype(t)>(pol); });
}
RC_GTEST_PROP(CudaRefHostProp, AttentionCoreBitwise, ()) {
  proptest::with_random_policy([](auto t, Policy pol) { attention_core<decltype(t)>(pol); });
}
RC_GTEST_PROP(CudaRefHostProp, DsaSelectionCoreAndBackwardBitwise, ()) {
  proptest::with_random_policy([](auto t, Policy pol) { dsa_ops<decltype(t)>(pol); });
}
RC_GTEST_PROP(CudaRefHostProp, LinearCeRouterAdamwBitwise, ()) {
  proptest::with_random_policy([](auto t, Policy pol) { loss_router_optimizer<decltype(t)>(pol); });
}

}  // namespace
}  // namespace trident
