// The fast tier on the host (gpu/fast/host_kernels.h, docs/gpu.md "cuda-fast"): on every case of the checked-in
// primitive goldens its own ops are within the golden's acceptance rule (the tolerance table's accept rows and the
// relative test vs fp64) and every other op keeps the reference's bits; the rows are tighter than llm.c's and TE's tolerances; and the check catches
// real bugs (operands silently rounded to bf16 where fp32 was asked, an off-by-one in a reduction, a wrong scale).
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <map>
#include <string>

#include "emulator/device.h"
#include "gpu/fast/check.h"
#include "gpu/fast/cublas_args.h"
#include "gpu/fast/host_kernels.h"
#include "gpu/fast/kernels_impl.h"
#include "gpu/fast/step_check.h"
#include "reference/tolerances.h"

namespace trident {
namespace {

const char* const kPresets[] = {"tiny",      "tiny-gqa",      "tiny-e64",        "tiny-dsa",
                                "tiny-packed", "tiny-bf16", "tiny-dsa-bf16", "tiny-packed-bf16"};

golden::PrimitivesFile golden_file(const std::string& preset) {
  return golden::read_primitives(std::string(TRIDENT_GOLDEN_DATA) + "/primitives/" + preset + "/primitives.h5");
}

template <class T>
gpu::fast::FastCheckSummary check_with(const golden::PrimitivesFile& f, const golden::KernelsFactory<T>& k,
                                       const std::string& only_op = {}) {
  golden::CheckOptions o;
  o.only_op = only_op;
  o.backend = "cuda-fast-host";
  return gpu::fast::check_fast_primitives<T>(f, k, o, "golden");
}

TEST(CudaFastHost, GoldensWithinTheGpuRows) {
  std::map<std::string, gpu::fast::OpStat> all;
  for (const char* preset : kPresets) {
    const golden::PrimitivesFile f = golden_file(preset);
    const auto s32 = check_with<float>(f, [](Device& d) { return gpu::make_fast_host_kernels<float>(d); });
    const auto s64 = check_with<double>(f, [](Device& d) { return gpu::make_fast_host_kernels<double>(d); });
    for (const auto* s : {&s32, &s64}) {
      for (const auto& fl : s->sum.failures) ADD_FAILURE() << preset << ": " << fl.message << "\n  repro: " << fl.repro;
      EXPECT_EQ(s->sum.passed, s->sum.cases) << preset;
      for (const auto& [op, st] : s->ops) {
        auto& a = all[op];
        a.cases += st.cases, a.tolerance = st.tolerance, a.rel_outputs += st.rel_outputs;
        a.max_err_over_bound = std::max(a.max_err_over_bound, st.max_err_over_bound);
        a.max_rel = std::max(a.max_rel, st.max_rel);
      }
    }
  }
  std::printf("  %-24s %6s %16s %16s\n", "fast op", "cases", "max |err|/bound", "max rel vs fp64");
  for (const char* op : gpu::fast::kFastOps) {
    const auto& st = all[op];
    std::printf("  %-24s %6lld %16.3g %16.3g\n", op, static_cast<long long>(st.cases), st.max_err_over_bound,
                st.max_rel);
    EXPECT_GT(st.cases, 0) << op;  // (the document-mask ops: from tiny-packed)
    EXPECT_TRUE(st.tolerance) << op;
    EXPECT_GT(st.rel_outputs, 0) << op << ": the relative test never ran";
  }
  // Every other op runs the ref tier's bodies: the reference's bits, whatever rule the golden stores for it.
  for (const char* preset : kPresets) {
    const golden::PrimitivesFile f = golden_file(preset);
    for (const std::string& op : golden::kernel_ops()) {
      if (gpu::fast::is_fast_op(op) || !all.count(op)) continue;
      golden::CheckOptions o;
      o.only_op = op;
      o.backend = "cuda-fast-host --bitwise";
      const auto s = golden::check_primitives<float>(
          f, [](Device& d) { return gpu::make_fast_host_kernels<float>(d); }, o, "golden");
      for (const auto& fl : s.failures) ADD_FAILURE() << preset << ": " << fl.message;
    }
  }
}

// The rows' relative width, against llm.c's bf16 check (0.079 relative) and Transformer Engine's (2.5e-2): every gpu
// row at a reduction of 4096 terms (fp32 rows: (k_const + 4096 k_per_term) u; bf16 rows: k_const u_bf16 relative to
// the rounded terms' magnitude), and the step rows at the presets' n_terms.
TEST(CudaFastHost, RowsTighterThanLlmcAndTransformerEngine) {
  int rows = 0;
  for (const Tolerance& t : kTolerances) {
    if ((t.direction != "gpu" && t.direction != "accept") || t.primitive == "relative") continue;
    ++rows;
    const double n = t.primitive.rfind("step_", 0) == 0 ? 512.0 : 4096.0;
    const double rel = (t.k_const + t.k_per_term * n) * unit_roundoff(t.dtype);
    EXPECT_LT(rel, 2.5e-2) << t.primitive << "/" << t.dtype;
    EXPECT_LT(rel, 0.079) << t.primitive << "/" << t.dtype;
    EXPECT_FALSE(t.reason.empty());
  }
  EXPECT_GE(rows, 16);
}

// ---- the check catches real bugs --------------------------------------------------------------------------------
struct Now {  // the host executor, at once (the test's device is immediate)
  template <class F>
  void operator()(Stream, const char*, std::source_location, F&& f) const {
    gpu::ref::HostExec ex;
    f(ex);
  }
};

// A kernel set with the ref tier's bodies everywhere and one deliberately wrong fast op.
enum class Bug { bf16_operands, drop_last_term, scale };
template <class T>
class Buggy final : public gpu::ref::RefKernels<T, Now> {
 public:
  using typename Kernels<T>::CoreDims;
  using typename Kernels<T>::Segs;
  using typename Kernels<T>::loc_t;
  explicit Buggy(Bug b) : gpu::ref::RefKernels<T, Now>(Now{}), bug_(b) {}
  Policy wrong(Policy p) const { return bug_ == Bug::bf16_operands && p == Policy::fp32 ? Policy::bf16 : p; }
  void mm(Policy pol, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, bool tb, T* C,
          int64_t ldc, Stream s, loc_t loc) override {
    gpu::ref::HostExec ex;
    gpu::ref::mm<T>(ex, wrong(pol), M, N, bug_ == Bug::drop_last_term && K > 0 ? K - 1 : K, A, lda, B, ldb, tb, C, ldc);
    if (bug_ == Bug::scale)
      for (int64_t i = 0; i < M * N; ++i) C[(i / N) * ldc + i % N] *= T(1) + T(1) / T(4096);
  }
  void wgrad_acc(Policy pol, const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M, Segs segs,
                 ExactAcc<T>* acc, Stream s, loc_t loc) override {
    gpu::ref::HostExec ex;
    std::vector<int64_t> sg(segs.begin(), segs.end());
    if (bug_ == Bug::drop_last_term && sg.size() > 1 && sg[sg.size() - 1] > sg[sg.size() - 2]) --sg.back();
    gpu::ref::wgrad_acc<T>(ex, wrong(pol), X, ldx, dY, ldy, K, M, sg, acc);
  }
  void attn_core_forward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq, const T* kv,
                         int64_t S, T* o, T* stats, Stream s, loc_t loc) override {
    CoreDims c = cd;
    if (bug_ == Bug::scale) c.scale *= 1.0 + 1.0 / 4096;
    gpu::ref::HostExec ex;
    gpu::fast::attn_doc_core_forward<T>(ex, wrong(pol), c, q, qpos, nullptr, Nq, kv, S, o, stats);
  }
  void linear_ce_forward(Policy pol, const T* hidden, const T* W, const int32_t* targets, int64_t N, int64_t d,
                         int64_t V, int64_t vocab_chunk, int64_t token_chunk, T* token_loss, T* lse, Stream s,
                         loc_t loc) override {
    gpu::ref::HostExec ex;
    gpu::ref::linear_ce_forward<T>(ex, wrong(pol), hidden, W, targets, N, bug_ == Bug::drop_last_term ? d - 1 : d, V,
                                   vocab_chunk, token_chunk, token_loss, lse);
  }

 private:
  Bug bug_;
};

TEST(CudaFastHost, CatchesRealBugs) {
  const golden::PrimitivesFile f = golden_file("tiny");
  struct Case {
    Bug bug;
    const char* op;
    const char* what;
  };
  // Each bug is far smaller than llm.c's or TE's tolerances would notice in most elements (bf16 operands: 2^-9
  // relative; one dropped term of K; a 2^-12 relative scale), and each must fail the check.
  const Case cases[] = {{Bug::bf16_operands, "mm", "operands rounded to bf16 where fp32 was asked"},
                        {Bug::bf16_operands, "wgrad_acc", "operands rounded to bf16 where fp32 was asked"},
                        {Bug::bf16_operands, "attn_core_forward", "operands rounded to bf16 where fp32 was asked"},
                        {Bug::bf16_operands, "linear_ce_forward", "operands rounded to bf16 where fp32 was asked"},
                        {Bug::drop_last_term, "mm", "the last of K products dropped"},
                        {Bug::drop_last_term, "wgrad_acc", "the last row of the last tile dropped"},
                        {Bug::drop_last_term, "linear_ce_forward", "the hidden width off by one (a stride bug)"},
                        {Bug::scale, "mm", "C scaled by 1 + 2^-12"},
                        {Bug::scale, "attn_core_forward", "the softmax scale off by 2^-12 relative"}};
  for (const Case& c : cases) {
    const auto s = check_with<float>(f, [&](Device&) { return std::make_unique<Buggy<float>>(c.bug); }, c.op);
    EXPECT_GT(s.sum.cases, 0) << c.op;
    EXPECT_FALSE(s.sum.failures.empty()) << c.op << ": not caught: " << c.what;
    if (!s.sum.failures.empty())
      std::printf("  caught (%s): %s\n", c.what, s.sum.failures.front().message.c_str());
  }
  // An op the buggy set leaves alone (the ref tier's body) passes the same check.
  const auto ok = check_with<float>(f, [](Device&) { return std::make_unique<Buggy<float>>(Bug::bf16_operands); },
                                    "attn_core_backward");
  EXPECT_TRUE(ok.sum.failures.empty());
}

// A bf16-policy case: the bf16 rows add to the fp32 ones, and the fast bodies stay within them; an fp32 case's bound
// has no bf16 part.
TEST(CudaFastHost, Bf16RowsApplyOnlyToTheBf16Policy) {
  const golden::PrimitivesFile f = golden_file("tiny");
  for (const golden::PrimCase& c : f.cases) {
    if (c.op != "attn_core_forward" || c.dtype != "f32") continue;
    golden::PrimCase b = c;
    b.policy = "bf16";
    const auto fp32 = golden::elem_bounds(c).at("o");
    const auto bf16 = golden::elem_bounds(b).at("o");
    EXPECT_TRUE(fp32.sum_abs_bf16.empty());
    ASSERT_FALSE(bf16.sum_abs_bf16.empty());
    double r = 0;
    for (int64_t i = 0; i < static_cast<int64_t>(bf16.sum_abs.size()); ++i)
      if (fp32.bound(i, "fp32") > 0) r = std::max(r, bf16.bound(i, "fp32") / fp32.bound(i, "fp32"));
    EXPECT_GT(r, 10.0);  // the bf16 roundings dominate
    // the case itself, rerun under the bf16 policy with the reference as golden: within the rows
    golden::PrimitivesFile g;
    g.cases.push_back(b);
    g.cases.back().outputs = golden::reference_outputs<float>(b);
    golden::complete_accept(g.cases.back());  // the rule of the bf16 case (oracle on bf16 operands, bf16 rows)
    const auto s = check_with<float>(g, [](Device& d) { return gpu::make_fast_host_kernels<float>(d); });
    for (const auto& fl : s.sum.failures) ADD_FAILURE() << fl.message;
    EXPECT_EQ(s.sum.passed, 1);
  }
}

// The device GEMM's call (gpu/fast/cublas_args.h), against cuBLAS's documented column-major semantics emulated here:
// C_c (m x n, ldc) = op(F) (m x k) op(S) (k x n) [+ C_c], op(X)(i, l) = X[i + l ld] (N) or X[l + i ld] (T), with
// cuBLAS's leading-dimension rules; every trans_a / trans_b, padded leading dimensions, accumulation, and the bf16
// path's dense copies of the stored shapes. Integer values in double: every sum exact, compared exactly with the
// row-major definition.
TEST(CudaFastHost, CublasArgumentsMatchTheRowMajorGemm) {
  std::mt19937_64 rng(20261201);
  auto uni = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  for (int it = 0; it < 400; ++it) {
    const bool ta = it & 1, tb = it & 2, acc = it & 4, dense = it & 8;
    const int64_t M = uni(1, 7), N = uni(1, 7), K = uni(1, 9);
    const gpu::fast::StoredShape sa = gpu::fast::stored_shape(ta, M, K), sb = gpu::fast::stored_shape(tb, K, N);
    int64_t lda = sa.cols + uni(0, 3), ldb = sb.cols + uni(0, 3);
    const int64_t ldc = N + uni(0, 3);
    std::vector<double> A(static_cast<size_t>(sa.rows * lda)), B(static_cast<size_t>(sb.rows * ldb));
    std::vector<double> C(static_cast<size_t>(M * ldc));
    for (double& x : A) x = static_cast<double>(uni(-9, 9));
    for (double& x : B) x = static_cast<double>(uni(-9, 9));
    for (double& x : C) x = static_cast<double>(uni(-9, 9));
    std::vector<double> want = C;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k)
          s += (ta ? A[k * lda + m] : A[m * lda + k]) * (tb ? B[n * ldb + k] : B[k * ldb + n]);
        want[m * ldc + n] = (acc ? C[m * ldc + n] : 0.0) + s;
      }
    if (dense) {  // the bf16 path: operands copied into dense buffers of their stored shape, ld = cols
      std::vector<double> a2(static_cast<size_t>(sa.rows * sa.cols)), b2(static_cast<size_t>(sb.rows * sb.cols));
      for (int64_t r = 0; r < sa.rows; ++r)
        for (int64_t c = 0; c < sa.cols; ++c) a2[r * sa.cols + c] = A[r * lda + c];
      for (int64_t r = 0; r < sb.rows; ++r)
        for (int64_t c = 0; c < sb.cols; ++c) b2[r * sb.cols + c] = B[r * ldb + c];
      A = a2, B = b2, lda = sa.cols, ldb = sb.cols;
    }
    const gpu::fast::CublasGemmArgs g = gpu::fast::cublas_gemm_args(ta, tb, M, N, K, lda, ldb, ldc);
    // cuBLAS's argument rules (cublasGemmEx: lda >= max(1, transa ? k : m), ldb >= max(1, transb ? n : k), ldc >= m)
    ASSERT_GE(g.ld_first, std::max<int64_t>(1, g.op_first_t ? g.k : g.m));
    ASSERT_GE(g.ld_second, std::max<int64_t>(1, g.op_second_t ? g.n : g.k));
    ASSERT_GE(g.ldc, std::max<int64_t>(1, g.m));
    const double* F = B.data();  // cuBLAS's first operand: our B
    const double* Sx = A.data();
    for (int64_t j = 0; j < g.n; ++j)
      for (int64_t i = 0; i < g.m; ++i) {
        double s = 0;
        for (int64_t l = 0; l < g.k; ++l) {
          const double f = g.op_first_t ? F[l + i * g.ld_first] : F[i + l * g.ld_first];
          const double x = g.op_second_t ? Sx[j + l * g.ld_second] : Sx[l + j * g.ld_second];
          s += f * x;
        }
        double& c = C[i + j * g.ldc];
        c = (acc ? c : 0.0) + s;
      }
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n)
        ASSERT_EQ(C[m * ldc + n], want[m * ldc + n]) << "trans_a " << ta << " trans_b " << tb << " M " << M << " N "
                                                     << N << " K " << K << " dense " << dense;
  }
}

}  // namespace
}  // namespace trident
