// The ref tier of the CUDA kernels run on the host ("cuda-ref on host", gpu/ref/host_kernels.h): the same kernel
// bodies nvcc compiles for sm_90, looped by g++, for every op of Kernels<T>. Checked bitwise against the reference
//   - op by op on every case of the checked-in primitive goldens (golden/data/primitives: tiny, tiny-gqa,
//     tiny-e64; MLA and GQA; fp32 and fp64 kernel sets) for every op,
//   - op by op on edge inputs the goldens may not hold (empty tiles, repeated token ids in a tile, tied router
//     scores, a non-identity zig-zag), against CpuKernels,
//   - over whole emulated steps (fp32, bf16 and fp64 policies; GQA with recompute; the deferred device; 4 ranks,
//     fsdp x cp x ep, 2 EP chunks) against the single-rank reference.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "emulator/device.h"
#include "emulator/run_step.h"
#include "golden/primitives/primitives.h"
#include "gpu/ref/host_kernels.h"
#include "tests/gpu/ref_goldens.h"

namespace trident {
namespace {

TEST(CudaRefHost, EveryOpBitwiseOnTheCheckedInGoldens) {
  reftest::check_goldens_bitwise(
      "cuda-ref-host", [](Device& d) { return gpu::make_ref_host_kernels<float>(d); },
      [](Device& d) { return gpu::make_ref_host_kernels<double>(d); });
}

// ---- edge inputs, against CpuKernels on an eager emulator device ----------------------------------------------
template <class T>
std::vector<T> randv(size_t n, uint64_t seed, double lo = -1, double hi = 1) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(u(rng));
  return v;
}
template <class T>
void expect_bits(const std::vector<T>& a, const std::vector<T>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_EQ(std::memcmp(&a[i], &b[i], sizeof(T)), 0) << what << ": element " << i << " " << a[i] << " vs " << b[i];
}
template <class T>
std::vector<T> rounded(const std::vector<ExactAcc<T>>& acc) {
  std::vector<T> out(acc.size());
  exact_round<T>(acc.data(), out.data(), static_cast<int64_t>(acc.size()));
  return out;
}

template <class T>
void edge_cases(Policy pol) {
  RankTrace trace;
  emu::EmuDevice dev(0, trace, emu::DeviceOptions{});
  CpuKernels<T> cpu(dev);
  auto ref = gpu::make_ref_host_kernels<T>(dev);
  const Stream s = dev.compute_stream();
  const std::string tag = std::string(to_string(pol)) + " ";
  // tiles with an empty one in the middle and one row
  const std::vector<int64_t> segs = {0, 3, 3, 7, 8};
  const int64_t rows = 8, K = 5, M = 6;
  const auto X = randv<T>(rows * K, 1), dY = randv<T>(rows * M, 2);
  {
    std::vector<ExactAcc<T>> a(K * M), b(K * M);
    cpu.wgrad_acc(pol, X.data(), K, dY.data(), M, K, M, segs, a.data(), s);
    ref->wgrad_acc(pol, X.data(), K, dY.data(), M, K, M, segs, b.data(), s);
    expect_bits(rounded(a), rounded(b), tag + "wgrad_acc");
    std::vector<ExactAcc<T>> c(M), d(M);
    cpu.sum_acc(dY.data(), M, segs, c.data(), s);
    ref->sum_acc(dY.data(), M, segs, d.data(), s);
    expect_bits(rounded(c), rounded(d), tag + "sum_acc");
  }
  {  // repeated ids inside a tile, a skipped row (-1), the same id in two tiles
    const std::vector<int32_t> tok = {2, 0, 2, 2, -1, 1, 0, 2};
    const int64_t d = 4, V = 3;
    const auto dout = randv<T>(rows * d, 3);
    std::vector<ExactAcc<T>> a(V * d), b(V * d);
    cpu.embedding_backward(a.data(), tok.data(), dout.data(), rows, d, segs, s);
    ref->embedding_backward(b.data(), tok.data(), dout.data(), rows, d, segs, s);
    expect_bits(rounded(a), rounded(b), tag + "embedding_backward");
  }
  {  // router ties: equal biased scores (equal logits and biases) must pick the lower expert ids
    const int64_t N = 3, d = 4, E = 8, Kt = 3;
    std::vector<T> a = randv<T>(N * d, 4), wr(d * E, T(0.25)), bias(E, T(0));
    bias[5] = T(0.5);
    for (int64_t k = 0; k < d; ++k) wr[k * E + 6] = T(0.75);
    std::vector<T> l1(N * E), s1(N * E), g1(N * Kt), l2(N * E), s2(N * E), g2(N * Kt);
    std::vector<int32_t> sel1(N * Kt), sel2(N * Kt);
    cpu.router_forward(pol, a.data(), wr.data(), bias.data(), N, d, E, Kt, 2.5, l1.data(), s1.data(), sel1.data(),
                       g1.data(), s);
    ref->router_forward(pol, a.data(), wr.data(), bias.data(), N, d, E, Kt, 2.5, l2.data(), s2.data(), sel2.data(),
                        g2.data(), s);
    EXPECT_EQ(sel1, sel2) << tag << "router_forward sel";
    expect_bits(g1, g2, tag + "router_forward gates");
    expect_bits(s1, s2, tag + "router_forward scores");
  }
  {  // zig-zag moves with cp = 3 (every block moves but the first)
    const int64_t cp = 3, block = 5;
    const auto src = randv<T>(2 * cp * block, 5);
    for (bool to_gather : {false, true}) {
      std::vector<T> a(src.size()), b(src.size());
      cpu.kv_zigzag_reorder(a.data(), src.data(), cp, block, to_gather, s);
      ref->kv_zigzag_reorder(b.data(), src.data(), cp, block, to_gather, s);
      expect_bits(a, b, tag + "kv_zigzag_reorder");
    }
    std::vector<ExactAcc<T>> xa(2 * cp * block), xb(2 * cp * block), sa(block), sb(block);
    for (size_t i = 0; i < xa.size(); ++i) xa[i].add(src[i]), xb[i].add(src[i]);
    cpu.kv_zigzag_to_gather_acc(xa.data(), sa.data(), cp, block, s);
    ref->kv_zigzag_to_gather_acc(xb.data(), sb.data(), cp, block, s);
    expect_bits(rounded(xa), rounded(xb), tag + "kv_zigzag_to_gather_acc");
  }
  {  // linear CE: an ignored target, a short last vocab chunk, the backward in two column ranges
    const int64_t N = 5, d = 6, V = 13, vc = 4;
    const std::vector<int32_t> tgt = {3, -100, 12, 0, 7};
    const std::vector<int64_t> ls = {0, 2, 2, 5};
    const auto h = randv<T>(N * d, 7, -2, 2), W = randv<T>(d * V, 8, -2, 2);
    std::vector<T> l1(N), z1(N), l2(N), z2(N), dh1(N * d), dh2(N * d);
    cpu.linear_ce_forward(pol, h.data(), W.data(), tgt.data(), N, d, V, vc, 2, l1.data(), z1.data(), s);
    ref->linear_ce_forward(pol, h.data(), W.data(), tgt.data(), N, d, V, vc, 2, l2.data(), z2.data(), s);
    expect_bits(l1, l2, tag + "linear_ce_forward loss");
    expect_bits(z1, z2, tag + "linear_ce_forward lse");
    for (auto [j0, j1] : {std::pair<int64_t, int64_t>{0, 8}, {8, 13}}) {
      std::vector<ExactAcc<T>> a(d * (j1 - j0)), b(d * (j1 - j0));
      cpu.linear_ce_backward(pol, h.data(), W.data(), tgt.data(), z1.data(), N, d, V, vc, 2, T(0.25), ls, j0, j1,
                             dh1.data(), a.data(), s);
      ref->linear_ce_backward(pol, h.data(), W.data(), tgt.data(), z1.data(), N, d, V, vc, 2, T(0.25), ls, j0, j1,
                              dh2.data(), b.data(), s);
      expect_bits(rounded(a), rounded(b), tag + "linear_ce_backward dW");
      expect_bits(dh1, dh2, tag + "linear_ce_backward dhidden");
    }
  }
  {  // grad_sq_acc over more than one chunk, with a huge value (fp64: the non-finite square branch)
    auto g = randv<T>(9000, 6, -3, 3);
    if constexpr (std::is_same_v<T, double>) g[17] = 1e300;
    ExactAcc<double> a, b;
    cpu.grad_sq_acc(g.data(), static_cast<int64_t>(g.size()), &a, s);
    ref->grad_sq_acc(g.data(), static_cast<int64_t>(g.size()), &b, s);
    const double ra = a.round(), rb = b.round();
    EXPECT_EQ(std::memcmp(&ra, &rb, 8), 0) << tag << "grad_sq_acc " << ra << " vs " << rb;
  }
}

TEST(CudaRefHost, EdgeInputsBitwiseFp32) { edge_cases<float>(Policy::fp32); }
TEST(CudaRefHost, EdgeInputsBitwiseBf16) { edge_cases<float>(Policy::bf16); }
TEST(CudaRefHost, EdgeInputsBitwiseFp64) { edge_cases<double>(Policy::fp64); }

// Bad data: the same error (type and message) as the reference's op.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    std::string m = e.what();  // without the check site "(file:line: check '...' failed)", which differs
    const size_t c = m.find(": check '");
    return c == std::string::npos ? m : m.substr(0, m.rfind(" (", c));
  }
  return "(no error)";
}
TEST(CudaRefHost, BadDataGivesTheReferencesErrors) {
  RankTrace trace;
  emu::EmuDevice dev(0, trace, emu::DeviceOptions{});
  CpuKernels<float> cpu(dev);
  auto ref = gpu::make_ref_host_kernels<float>(dev);
  const Stream s = dev.compute_stream();
  std::vector<float> e(3 * 4, 1.f), out(2 * 4), h(2 * 4, 0.5f), w(4 * 3, 0.25f), l(2), z(2);
  const std::vector<int32_t> tok = {1, 3}, tgt = {2, 5};
  auto both = [&](auto&& op) {
    const std::string a = error_of([&] { op(static_cast<Kernels<float>&>(cpu)); });
    const std::string b = error_of([&] { op(*ref); });
    EXPECT_NE(a, "(no error)");
    EXPECT_EQ(a, b);
  };
  both([&](Kernels<float>& k) { k.embedding_forward(out.data(), tok.data(), e.data(), 2, 4, 3, s); });
  both([&](Kernels<float>& k) {
    k.linear_ce_forward(Policy::fp32, h.data(), w.data(), tgt.data(), 2, 4, 3, 2, 4, l.data(), z.data(), s);
  });
  const int64_t qpos[1] = {4};
  model::CoreDims cd{.H = 1, .G = 1, .Dq = 2, .Dv = 2, .P = 2, .val_base = 0, .scale = 1.0};
  std::vector<float> q(2, 1.f), kv(4 * 2, 1.f), o(2), st(2);
  both([&](Kernels<float>& k) {
    k.attn_core_forward(Policy::fp32, cd, q.data(), qpos, 1, kv.data(), 4, o.data(), st.data(), s);
  });
  const int64_t load[2] = {3, -1};
  std::vector<float> b(2);
  both([&](Kernels<float>& k) { k.router_bias_update(b.data(), load, 2, 0.5, s); });
}

// ---- whole steps ------------------------------------------------------------------------------------------------
template <class T>
void whole_step(const std::string& policy, const std::string& preset = "tiny", bool deferred = false,
                int64_t docs_per_seq = 1, const char* mesh = "d_rep=1,fsdp=2,cp=2,e_fsdp=2,ep=2") {
  emu::EmulateSpec s;
  s.preset = preset;
  s.cfg = model::Config::preset(preset);
  s.cfg.policy = parse_policy(policy);
  s.cfg.validate();
  s.run.sequences = 4;
  s.run.seq_len = 32;
  s.run.steps = 2;
  s.run.docs_per_seq = docs_per_seq;
  s.mesh = parse_mesh(mesh);
  if (s.mesh.cp > 2) s.run.seq_len = 64;
  s.ep_chunks = 2;
  s.run.recompute = preset != "tiny";
  if (deferred) s.device = emu::DeviceOptions{.mode = emu::DeviceMode::deferred, .seed = 7};
  const emu::EmulateResult<T> r =
      emu::emulate<T>(s, [](int, Device& dev) { return gpu::make_ref_host_kernels<T>(dev); });
  const emu::CheckReport rep = emu::check_reference<T>(s, r);
  EXPECT_TRUE(rep.ok()) << rep.summary() << "\nrepro: " << s.repro() << " (with the cuda-ref-host kernel set)";
  EXPECT_GT(rep.checks.size(), size_t{10});
  for (const auto& st : r.steps) EXPECT_GT(st.loss, 0.0);
}

TEST(CudaRefHost, WholeStepBitwiseFp32) { whole_step<float>("fp32"); }
TEST(CudaRefHost, WholeStepBitwiseBf16) { whole_step<float>("bf16"); }
TEST(CudaRefHost, WholeStepBitwiseFp64) { whole_step<double>("fp64"); }
TEST(CudaRefHost, WholeStepBitwiseGqaRecompute) { whole_step<float>("fp32", "tiny-gqa"); }
TEST(CudaRefHost, WholeStepBitwiseDeferredDevice) { whole_step<float>("fp32", "tiny", true); }
// Packed sequences (attn_doc_core_*) and 2D CP (docs/parallel.md sections 2 and 5) with the ref tier's bodies.
TEST(CudaRefHost, WholeStepBitwisePacked2dCp) {
  whole_step<float>("fp32", "tiny", false, 5, "d_rep=1,fsdp=2,cp=4,e_fsdp=2,ep=4,cp_inner=2");
  whole_step<float>("bf16", "tiny-gqa", false, 7);
}

}  // namespace
}  // namespace trident
