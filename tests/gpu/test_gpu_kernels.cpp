// GPU kernels vs the reference. The simple kernels run the reference's order with --fmad=false, so the
// comparison is bitwise. Skips (with a message) when no CUDA device is present.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include <cuda_runtime_api.h>

#include "gpu/gemm.h"
#include "reference/bf16.h"
#include "reference/gemm.h"

namespace {

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (trident::gpu::device_count() == 0)
      GTEST_SKIP() << "no CUDA device: GPU tests skipped (" << trident::gpu::device_status() << ")";
  }
};

template <class T>
T* to_device(const std::vector<T>& h) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), h.size() * sizeof(T) + 1), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

template <class T>
void gemm_case(int64_t M, int64_t N, int64_t K, bool trans_b, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<T> A(M * K), B(K * N), C(M * N), Cg(M * N);
  for (auto& x : A) x = static_cast<T>(u(rng));
  for (auto& x : B) x = static_cast<T>(u(rng));
  const int64_t ldb = trans_b ? K : N;
  trident::gemm<T>(M, N, K, A.data(), K, B.data(), ldb, trans_b, C.data(), N);
  T *dA = to_device(A), *dB = to_device(B), *dC = to_device(Cg);
  trident::gpu::gemm<T>(M, N, K, dA, K, dB, ldb, trans_b, dC, N, nullptr);
  ASSERT_EQ(cudaMemcpy(Cg.data(), dC, Cg.size() * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(dA), cudaFree(dB), cudaFree(dC);
  ASSERT_EQ(std::memcmp(C.data(), Cg.data(), C.size() * sizeof(T)), 0)
      << "repro: gemm M=" << M << " N=" << N << " K=" << K << " trans_b=" << trans_b << " seed=" << seed;
}

}  // namespace

TEST_F(Gpu, GemmBitwiseVsReference) {
  for (bool tb : {false, true}) {
    gemm_case<float>(37, 129, 77, tb, 1);
    gemm_case<double>(16, 33, 64, tb, 2);
    gemm_case<float>(1, 1, 1, tb, 3);
  }
  // more rows than 65,535 blocks of 8 (the grid's height limit): rows stride by the grid
  gemm_case<float>(600'000, 3, 2, false, 4);
}

// No device is a skip; a driver that is present but fails is an error (never a skip).
TEST(DeviceCount, ABrokenSetupIsNotASkip) {
  using trident::gpu::detail::DeviceCountVerdict;
  using trident::gpu::detail::classify_device_count;
  EXPECT_EQ(classify_device_count(cudaSuccess, true), DeviceCountVerdict::ok);
  EXPECT_EQ(classify_device_count(cudaErrorNoDevice, true), DeviceCountVerdict::none);
  EXPECT_EQ(classify_device_count(cudaErrorInsufficientDriver, false), DeviceCountVerdict::none);
  EXPECT_EQ(classify_device_count(cudaErrorStubLibrary, true), DeviceCountVerdict::none);
  EXPECT_EQ(classify_device_count(cudaErrorInsufficientDriver, true), DeviceCountVerdict::broken);
  EXPECT_EQ(classify_device_count(cudaErrorSystemDriverMismatch, true), DeviceCountVerdict::broken);
  EXPECT_EQ(classify_device_count(cudaErrorInitializationError, true), DeviceCountVerdict::broken);
  EXPECT_EQ(classify_device_count(cudaErrorDevicesUnavailable, false), DeviceCountVerdict::broken);
  // on this machine: a count or an error, and a status line either way
  int n = -1;
  try {
    n = trident::gpu::device_count();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "CUDA setup broken: " << e.what();
  }
  EXPECT_GE(n, 0);
  EXPECT_FALSE(trident::gpu::device_status().empty());
  std::printf("CUDA: %s\n", trident::gpu::device_status().c_str());
}

TEST_F(Gpu, RoundBf16BitwiseVsReference) {
  std::vector<float> x;
  std::mt19937 rng(7);
  for (int i = 0; i < 1 << 20; ++i) {
    uint32_t u = rng();
    float f;
    std::memcpy(&f, &u, 4);
    x.push_back(f);
  }
  float* d = to_device(x);
  trident::gpu::round_bf16_inplace(d, static_cast<long>(x.size()), nullptr);
  std::vector<float> g(x.size());
  ASSERT_EQ(cudaMemcpy(g.data(), d, g.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d);
  trident::round_bf16_inplace(x.data(), static_cast<long>(x.size()));
  ASSERT_EQ(std::memcmp(x.data(), g.data(), 4 * x.size()), 0) << "repro: RoundBf16BitwiseVsReference seed=7";
}
