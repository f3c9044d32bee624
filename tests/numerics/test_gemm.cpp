// Batch-invariant GEMM: bitwise equal to the documented-order loop, row invariance (whatever M and the other
// rows), thread invariance (1, 2, 4 OpenMP threads), trans_b, odd shapes, strides, and an error bound vs fp64.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "reference/bf16.h"
#include "reference/check.h"
#include "reference/gemm.h"
#include "reference/tolerances.h"

namespace trident {
namespace {

// Values with spread magnitudes so that a different summation order changes bits.
template <class T>
std::vector<T> random_matrix(int64_t n, std::mt19937_64& rng) {
  std::normal_distribution<double> nd(0.0, 1.0);
  std::uniform_int_distribution<int> ex(-6, 6);
  std::vector<T> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<T>(std::ldexp(nd(rng), ex(rng)));
  return v;
}

// The documented order, written as plainly as possible.
template <class T>
void naive_gemm(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, bool tb, T* C,
                int64_t ldc) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      T s = T(0);
      for (int64_t k = 0; k < K; ++k) {
        const T prod = A[m * lda + k] * (tb ? B[n * ldb + k] : B[k * ldb + n]);
        s = s + prod;
      }
      C[m * ldc + n] = s;
    }
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

struct Shape {
  int64_t M, N, K;
  bool tb;
  std::string repro() const {
    return "M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
           " trans_b=" + std::to_string(tb);
  }
};

template <class T>
class GemmTest : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(GemmTest, Types);

TYPED_TEST(GemmTest, MatchesDocumentedOrderBitwise) {
  using T = TypeParam;
  const uint64_t seed = 42;
  std::mt19937_64 rng(seed);
  const int64_t Ms[] = {0, 1, 2, 5, 7, 13, 97, 200};
  const int64_t Ns[] = {0, 1, 3, 8, 17, 130, 257};
  const int64_t Ks[] = {0, 1, 2, 255, 256, 257, 600};
  int checked = 0;
  for (int64_t M : Ms)
    for (int64_t N : Ns)
      for (int64_t K : Ks)
        for (bool tb : {false, true}) {
          if (M * N * K > 3000000) continue;
          const Shape s{M, N, K, tb};
          // Strided: lda = K + 3, ldb = width + 5, ldc = N + 2, guard values around C.
          const int64_t lda = K + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
          auto A = random_matrix<T>(M * lda, rng);
          auto B = random_matrix<T>((tb ? N : K) * ldb + 1, rng);
          const T guard = T(-12345.5);
          std::vector<T> C(static_cast<size_t>(M * ldc + 1), guard), R(C.size(), guard);
          gemm<T>(M, N, K, A.data(), lda, B.data(), ldb, tb, C.data(), ldc);
          naive_gemm<T>(M, N, K, A.data(), lda, B.data(), ldb, tb, R.data(), ldc);
          ASSERT_TRUE(same_bits(C, R)) << "repro: seed=" << seed << " " << s.repro();
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = N; n < ldc; ++n) ASSERT_EQ(C[m * ldc + n], guard) << "wrote outside C " << s.repro();
          ++checked;
        }
  EXPECT_GT(checked, 500);
}

TYPED_TEST(GemmTest, RowInvariance) {
  using T = TypeParam;
  std::mt19937_64 rng(7);
  for (bool tb : {false, true}) {
    const int64_t M = 257, N = 300, K = 520;
    auto A = random_matrix<T>(M * K, rng);
    auto B = random_matrix<T>(N * K, rng);
    std::vector<T> C(M * N);
    gemm<T>(M, N, K, A.data(), K, B.data(), tb ? K : N, tb, C.data(), N);
    for (int64_t m : {0L, 1L, 5L, 96L, 100L, 191L, 256L}) {
      // Row m alone (a 1-row call).
      std::vector<T> c1(N);
      gemm<T>(1, N, K, A.data() + m * K, K, B.data(), tb ? K : N, tb, c1.data(), N);
      ASSERT_EQ(std::memcmp(c1.data(), C.data() + m * N, N * sizeof(T)), 0) << "row " << m << " 1-row call";
      // Row m at a different position of a call of another size, surrounded by other values.
      const int64_t M2 = 1 + (m * 7) % 23, pos = M2 / 2;
      auto A2 = random_matrix<T>(M2 * K, rng);
      std::memcpy(A2.data() + pos * K, A.data() + m * K, K * sizeof(T));
      std::vector<T> C2(M2 * N);
      gemm<T>(M2, N, K, A2.data(), K, B.data(), tb ? K : N, tb, C2.data(), N);
      ASSERT_EQ(std::memcmp(C2.data() + pos * N, C.data() + m * N, N * sizeof(T)), 0)
          << "row " << m << " at position " << pos << " of M=" << M2 << " trans_b=" << tb;
    }
  }
}

TYPED_TEST(GemmTest, ThreadInvariance) {
  using T = TypeParam;
  std::mt19937_64 rng(9);
  const Shape shapes[] = {{513, 257, 300, false}, {200, 1000, 64, true}, {1000, 64, 64, false}, {7, 5, 3, false}};
  const int saved = omp_get_max_threads();
  for (const Shape& s : shapes) {
    auto A = random_matrix<T>(s.M * s.K, rng);
    auto B = random_matrix<T>(s.N * s.K, rng);
    std::vector<T> ref;
    for (int threads : {1, 2, 4}) {
      omp_set_num_threads(threads);
      std::vector<T> C(s.M * s.N);
      gemm<T>(s.M, s.N, s.K, A.data(), s.K, B.data(), s.tb ? s.K : s.N, s.tb, C.data(), s.N);
      if (ref.empty()) ref = C;
      ASSERT_TRUE(same_bits(C, ref)) << "threads=" << threads << " " << s.repro();
    }
  }
  omp_set_num_threads(saved);
}

TYPED_TEST(GemmTest, SerialAccumulateContinuesTheSum) {
  using T = TypeParam;
  std::mt19937_64 rng(5);
  const int64_t M = 37, N = 45, K1 = 300, K2 = 77, K = K1 + K2;
  auto A = random_matrix<T>(M * K, rng);
  auto B = random_matrix<T>(K * N, rng);
  std::vector<T> whole(M * N), split(M * N);
  gemm<T>(M, N, K, A.data(), K, B.data(), N, false, whole.data(), N);
  gemm_serial<T>(M, N, K1, A.data(), K, 1, B.data(), N, false, split.data(), N, false);
  gemm_serial<T>(M, N, K2, A.data() + K1, K, 1, B.data() + K1 * N, N, false, split.data(), N, true);
  EXPECT_TRUE(same_bits(whole, split));
  // Transposed A addressing (a_rs = 1, a_ks = lda): X^T B.
  std::vector<T> At(K * M);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) At[k * M + m] = A[m * K + k];
  std::vector<T> viaT(M * N);
  gemm_serial<T>(M, N, K, At.data(), 1, M, B.data(), N, false, viaT.data(), N, false);
  EXPECT_TRUE(same_bits(whole, viaT));
}

// Every kernel copy this CPU runs (baseline, AVX2, AVX-512F: reference/gemm_kernel.h) gives the documented order's
// bits, special values included (NaN, +-Inf, -0, subnormal products, overflow), through gemm and gemm_serial.
TYPED_TEST(GemmTest, EveryKernelMatchesDocumentedOrderBitwise) {
  using T = TypeParam;
  const GemmIsa saved = gemm_isa();
  const uint64_t seed = 4242;
  int kernels = 0;
  for (GemmIsa isa : {GemmIsa::baseline, GemmIsa::avx2, GemmIsa::avx512}) {
    if (!gemm_isa_supported(isa)) {
      std::printf("kernel %s: not run by this CPU or build\n", gemm_isa_name(isa));
      continue;
    }
    set_gemm_isa(isa);
    ASSERT_EQ(gemm_isa(), isa);
    ++kernels;
    std::mt19937_64 rng(seed);
    const int64_t Ms[] = {1, 5, 6, 7, 13, 97, 130};
    const int64_t Ns[] = {1, 3, 8, 15, 16, 17, 31, 32, 33, 130, 257};
    const int64_t Ks[] = {0, 1, 255, 256, 257, 600};
    for (int64_t M : Ms)
      for (int64_t N : Ns)
        for (int64_t K : Ks)
          for (bool tb : {false, true}) {
            if (M * N * K > 2000000) continue;
            const Shape s{M, N, K, tb};
            const int64_t lda = K + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
            auto A = random_matrix<T>(M * lda, rng);
            auto B = random_matrix<T>((tb ? N : K) * ldb + 1, rng);
            // Special values in a few places: each poisons or saturates its own row / column only.
            const T specials[] = {std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity(),
                                  -std::numeric_limits<T>::infinity(), T(-0.0),
                                  std::numeric_limits<T>::denorm_min(), std::numeric_limits<T>::max(),
                                  std::numeric_limits<T>::min()};
            for (const T x : specials) {
              if (!A.empty()) A[rng() % A.size()] = x;
              B[rng() % B.size()] = x;
            }
            const T guard = T(-12345.5);
            std::vector<T> C(static_cast<size_t>(M * ldc + 1), guard), R(C.size(), guard);
            gemm<T>(M, N, K, A.data(), lda, B.data(), ldb, tb, C.data(), ldc);
            naive_gemm<T>(M, N, K, A.data(), lda, B.data(), ldb, tb, R.data(), ldc);
            ASSERT_TRUE(same_bits(C, R)) << "repro: seed=" << seed << " kernel=" << gemm_isa_name(isa) << " "
                                         << s.repro();
            // gemm_serial in two K pieces (accumulate) is the same chain.
            if (K >= 2) {
              std::vector<T> S(C.size(), guard);
              const int64_t K1 = K / 2;
              gemm_serial<T>(M, N, K1, A.data(), lda, 1, B.data(), ldb, tb, S.data(), ldc, false);
              gemm_serial<T>(M, N, K - K1, A.data() + K1, lda, 1, B.data() + (tb ? K1 : K1 * ldb), ldb, tb, S.data(),
                             ldc, true);
              ASSERT_TRUE(same_bits(S, R)) << "repro: seed=" << seed << " kernel=" << gemm_isa_name(isa)
                                           << " gemm_serial split at " << K1 << " " << s.repro();
            }
          }
  }
  set_gemm_isa(saved);
  EXPECT_GE(kernels, 1);
}

TEST(GemmIsa, NamesAndErrors) {
  GemmIsa isa{};
  EXPECT_TRUE(parse_gemm_isa("avx2", &isa));
  EXPECT_EQ(isa, GemmIsa::avx2);
  EXPECT_TRUE(parse_gemm_isa("baseline", &isa));
  EXPECT_EQ(isa, GemmIsa::baseline);
  EXPECT_FALSE(parse_gemm_isa("avx", &isa));
  EXPECT_FALSE(parse_gemm_isa("", &isa));
  EXPECT_TRUE(gemm_isa_supported(GemmIsa::baseline));
  EXPECT_NE(gemm_isa_list().find("baseline"), std::string::npos);
  for (GemmIsa i : {GemmIsa::avx2, GemmIsa::avx512}) {
    if (!gemm_isa_supported(i)) {
      EXPECT_THROW(set_gemm_isa(i), Error) << gemm_isa_name(i);
    }
  }
}

// bf16 policy: operands rounded RNE to bf16, products exact in fp32, fp32 in-order accumulation.
TEST(GemmBf16, RoundsOperandsThenFloatGemm) {
  std::mt19937_64 rng(21);
  for (bool tb : {false, true}) {
    const int64_t M = 33, N = 70, K = 129, lda = K + 1, ldb = (tb ? K : N) + 2;
    auto A = random_matrix<float>(M * lda, rng);
    auto B = random_matrix<float>((tb ? N : K) * ldb, rng);
    std::vector<float> C(M * N), R(M * N);
    gemm_bf16(M, N, K, A.data(), lda, B.data(), ldb, tb, C.data(), N);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        float s = 0.0f;
        for (int64_t k = 0; k < K; ++k) {
          const float a = to_float(to_bf16(A[m * lda + k]));
          const float b = to_float(to_bf16(tb ? B[n * ldb + k] : B[k * ldb + n]));
          const float prod = a * b;
          ASSERT_EQ(double(prod), double(a) * double(b));  // bf16 x bf16 is exact in fp32
          s = s + prod;
        }
        R[m * N + n] = s;
      }
    ASSERT_TRUE(same_bits(C, R)) << "trans_b=" << tb;
    std::vector<float> F(M * N);  // and it is not the plain fp32 GEMM (the rounding happened)
    gemm<float>(M, N, K, A.data(), lda, B.data(), ldb, tb, F.data(), N);
    EXPECT_FALSE(same_bits(C, F));
  }
}

TEST(GemmBound, Fp32WithinErrorBoundOfFp64) {
  std::mt19937_64 rng(11);
  const int64_t M = 64, N = 96, K = 777;
  auto A = random_matrix<float>(M * K, rng);
  auto B = random_matrix<float>(K * N, rng);
  std::vector<float> C(M * N);
  gemm<float>(M, N, K, A.data(), K, B.data(), N, false, C.data(), N);
  double max_ratio = 0, norm = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double exact = 0, sum_abs = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(A[m * K + k]) * double(B[k * N + n]);  // exact in fp64
        exact += p;
        sum_abs += std::fabs(p);
      }
      const double bound = tolerance_bound("gemm", "fp32", "vs_fp64", K, sum_abs);
      const double err = std::fabs(double(C[m * N + n]) - exact);
      ASSERT_LE(err, bound) << "m=" << m << " n=" << n;
      max_ratio = std::max(max_ratio, err / bound);
      norm += exact * exact;
    }
  EXPECT_GT(norm, 1.0);          // not vacuous
  EXPECT_GT(max_ratio, 0.0);     // fp32 really rounded something
}

}  // namespace
}  // namespace trident
