// rapidcheck properties of the fast tier on the host (gpu/fast/host_kernels.h, docs/gpu.md "cuda-fast"): on random
// shapes (reductions longer than a key block / a GEMM's four partial sums, empty and single-row tiles, several vocab
// chunks, column ranges of the CE backward, document masks), the three policies and random values, every call of a
// fast op is captured as a primitive case (golden::Recorder around the CPU kernels: the reference's outputs) and
// checked like a golden: within the acceptance rule's bounds element-wise, and (fp32 kernel sets) the relative
// test against an fp64 oracle. A failure prints rapidcheck's seed, the shrunk case and the check's message.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "emulator/device.h"
#include "gpu/fast/check.h"
#include "gpu/fast/host_kernels.h"
#include "property_tests/gpu/policies.h"

namespace trident {
namespace {

template <class T>
std::vector<T> values(int64_t n, int scale_exp = 0) {
  // k / 2^9 in [-2, 2] (many exact products and ties) mixed with arbitrary values k / 2^18 in [-4, 4]
  std::vector<T> v(static_cast<size_t>(n));
  for (auto& x : v)
    x = std::ldexp(*rc::gen::weightedOneOf<T>(
                       {{1, rc::gen::map(rc::gen::inRange(-1024, 1025), [](int i) { return static_cast<T>(i) / 512; })},
                        {2, rc::gen::map(rc::gen::inRange(-1048576, 1048577),
                                         [](int i) { return static_cast<T>(i) / static_cast<T>(262144); })}}),
                   scale_exp);
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

struct Rig {
  RankTrace trace;
  emu::EmuDevice dev{0, trace, emu::DeviceOptions{}};
  golden::Recorder rec{8};
  Stream s = dev.compute_stream();
};

// Checks every case the recorder captured with the fast host kernels.
template <class T>
void check_recorded(Rig& r) {
  golden::PrimitivesFile f;
  f.cases = r.rec.take();
  RC_ASSERT(!f.cases.empty());
  golden::CheckOptions o;
  o.backend = "cuda-fast-host";
  const auto sum = gpu::fast::check_fast_primitives<T>(
      f, [](Device& d) { return gpu::make_fast_host_kernels<T>(d); }, o, "random");
  if (!sum.sum.failures.empty()) RC_FAIL(sum.sum.failures.front().message);
  RC_ASSERT(sum.sum.passed == sum.sum.cases);
}

template <class T>
void gemms(Policy pol) {
  Rig r;
  auto k = golden::make_recording_kernels<T>(std::make_unique<CpuKernels<T>>(r.dev), r.dev, 0, r.rec);
  const int64_t M = *rc::gen::inRange(1, 9), N = *rc::gen::inRange(1, 9), K = *rc::gen::inRange(0, 80);
  const bool tb = *rc::gen::arbitrary<bool>();
  const auto A = values<T>(M * K), B = values<T>(K * N);
  std::vector<T> C(M * N);
  k->mm(pol, M, N, K, A.data(), K, B.data(), tb ? K : N, tb, C.data(), N, r.s);
  const int64_t rows = *rc::gen::inRange(1, 60);
  const auto segs = segments(rows);
  const int64_t Kw = std::max<int64_t>(K % 9, 1);
  const auto X = values<T>(rows * Kw), dY = values<T>(rows * N);
  std::vector<ExactAcc<T>> acc(Kw * N);
  k->wgrad_acc(pol, X.data(), Kw, dY.data(), N, Kw, N, segs, acc.data(), r.s);
  check_recorded<T>(r);
}

template <class T>
void attention(Policy pol) {
  Rig r;
  auto k = golden::make_recording_kernels<T>(std::make_unique<CpuKernels<T>>(r.dev), r.dev, 0, r.rec);
  model::CoreDims cd = proptest::random_core_dims(12, 9);
  cd.scale = *rc::gen::element(0.125, 0.3535533905932738, 1.0);
  const int64_t S = *rc::gen::inRange(1, 80), Nq = *rc::gen::inRange(1, 10);
  std::vector<int64_t> qpos(static_cast<size_t>(Nq)), qdoc(static_cast<size_t>(Nq));
  for (size_t i = 0; i < qpos.size(); ++i) {
    qpos[i] = *rc::gen::inRange<int64_t>(0, S);
    qdoc[i] = *rc::gen::inRange<int64_t>(0, qpos[i] + 1);
  }
  const auto q = values<T>(Nq * cd.H * cd.Dq), kv = values<T>(S * cd.P), dO = values<T>(Nq * cd.H * cd.Dv);
  const bool doc = *rc::gen::arbitrary<bool>();
  std::vector<T> o(Nq * cd.H * cd.Dv), st(Nq * cd.H * 2), dq(q.size());
  std::vector<ExactAcc<T>> dkv(kv.size());
  const auto qsegs = segments(Nq);
  if (doc) {
    k->attn_doc_core_forward(pol, cd, q.data(), qpos.data(), qdoc.data(), Nq, kv.data(), S, o.data(), st.data(), r.s);
    k->attn_doc_core_backward(pol, cd, q.data(), qpos.data(), qdoc.data(), Nq, kv.data(), S, o.data(), st.data(),
                              dO.data(), qsegs, dq.data(), dkv.data(), r.s);
  } else {
    k->attn_core_forward(pol, cd, q.data(), qpos.data(), Nq, kv.data(), S, o.data(), st.data(), r.s);
    k->attn_core_backward(pol, cd, q.data(), qpos.data(), Nq, kv.data(), S, o.data(), st.data(), dO.data(), qsegs,
                          dq.data(), dkv.data(), r.s);
  }
  check_recorded<T>(r);
}

template <class T>
void linear_ce(Policy pol) {
  Rig r;
  auto k = golden::make_recording_kernels<T>(std::make_unique<CpuKernels<T>>(r.dev), r.dev, 0, r.rec);
  const int64_t N = *rc::gen::inRange(1, 12), d = *rc::gen::inRange(1, 40), vc = *rc::gen::inRange(1, 12);
  const int64_t V = *rc::gen::inRange(1, 48);
  std::vector<int32_t> tgt(static_cast<size_t>(N));
  for (auto& t : tgt)
    t = *rc::gen::weightedOneOf<int32_t>(
        {{4, rc::gen::inRange<int32_t>(0, static_cast<int32_t>(V))}, {1, rc::gen::just<int32_t>(-100)}});
  const auto h = values<T>(N * d), W = values<T>(d * V, -2);
  std::vector<T> loss(N), lse(N), dh(N * d);
  k->linear_ce_forward(pol, h.data(), W.data(), tgt.data(), N, d, V, vc, 3, loss.data(), lse.data(), r.s);
  const auto segs = segments(N);
  const int64_t cut = std::min(V, vc * *rc::gen::inRange<int64_t>(1, 4));
  for (auto [j0, j1] : {std::pair<int64_t, int64_t>{0, cut}, {cut, V}}) {
    if (j0 == j1) continue;
    std::vector<ExactAcc<T>> dW(d * (j1 - j0));
    k->linear_ce_backward(pol, h.data(), W.data(), tgt.data(), lse.data(), N, d, V, vc, 3, T(0.125), segs, j0, j1,
                          dh.data(), dW.data(), r.s);
  }
  check_recorded<T>(r);
}

RC_GTEST_PROP(CudaFastHostProp, GemmAndWgradWithinGpuRows, ()) {
  proptest::with_random_policy([](auto t, Policy pol) { gemms<decltype(t)>(pol); });
}
RC_GTEST_PROP(CudaFastHostProp, AttentionCoreWithinGpuRows, ()) {
  proptest::with_random_policy([](auto t, Policy pol) { attention<decltype(t)>(pol); });
}
RC_GTEST_PROP(CudaFastHostProp, LinearCeWithinGpuRows, ()) {
  proptest::with_random_policy([](auto t, Policy pol) { linear_ce<decltype(t)>(pol); });
}

}  // namespace
}  // namespace trident
