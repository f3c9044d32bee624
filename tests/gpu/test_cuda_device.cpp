// CudaDevice (the Device seam on a GPU) and NcclCommunicator over the real NCCL on one GPU (and on two when the
// machine has them). Skips with a message without a CUDA device or without libnccl.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "gpu/cuda_device.h"
#include "gpu/cuda_memory.h"
#include "gpu/fast/cuda_kernels.h"
#include "gpu/gemm.h"
#include "gpu/nccl/nccl_bootstrap.h"
#include "gpu/nccl/nccl_comm.h"
#include "reference/check.h"
#include "parallel/exact_lowering.h"
#include "reference/exact_acc.h"

namespace trident {
namespace {

class Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (gpu::device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU tests skipped (" << gpu::device_status() << ")";
  }
};

TEST_F(Cuda, MemoryCopiesEventsAndPeak) {
  gpu::CudaDevice dev(0);
  const Stream c = dev.compute_stream(), m = dev.comm_stream();
  std::vector<float> h(1024);
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<float>(i) * 0.5f - 7.f;
  DeviceBuffer<float> a(dev, 1024, c), b(dev, 1024, c), t(dev, 1024, c);
  dev.upload(a.data(), h.data(), 4096, c);
  dev.copy(b.data(), a.data(), 4096, c);
  const Event e = dev.create_event();
  dev.record(e, c);
  dev.wait(m, e);
  dev.memset(t.data(), 0, 4096, m);
  // 2D: 32 rows of 16 floats from a (pitch 32 floats) into t (pitch 16)
  dev.copy_2d(t.data(), 64, a.data(), 128, 64, 32, m);
  std::vector<float> got_b = dev.fetch(b.data(), 1024, c);
  std::vector<float> got_t = dev.fetch(t.data(), 1024, m);
  EXPECT_EQ(std::memcmp(got_b.data(), h.data(), 4096), 0);
  for (int r = 0; r < 32; ++r)
    for (int k = 0; k < 16; ++k) ASSERT_EQ(got_t[static_cast<size_t>(r * 16 + k)], h[static_cast<size_t>(r * 32 + k)]);
  for (size_t i = 512; i < 1024; ++i) ASSERT_EQ(got_t[i], 0.f);
  EXPECT_EQ(dev.memory().cur, 3 * 4096);
  EXPECT_GE(dev.memory().peak, 3 * 4096);
}

// The i64 lowering of exact_sum as CUDA kernels (CudaDevice::exact_pack / exact_unpack, gpu/exact_lowering.cu): the
// same words and accumulator bytes as the host's functions, for exact_f32 and exact_f64, with Inf/NaN flags; a word
// sum that no sum of packed accumulators can be is the host's error line.
template <class T>
void lowering_matches_host(gpu::CudaDevice& dev, DataType t) {
  const Stream s = dev.compute_stream();
  const size_t n = 1000, W = exact_lowering::words_per_element(t);
  std::vector<ExactAcc<T>> acc(n);
  uint64_t x = 12345;
  for (size_t i = 0; i < n; ++i)
    for (int k = 0; k < 1 + static_cast<int>(i % 7); ++k) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const double mag = std::ldexp(static_cast<double>(x >> 11) / 9007199254740992.0, static_cast<int>(i % 90) - 45);
      acc[i].add(static_cast<T>((x & 1) ? -mag : mag));
    }
  acc[3].add(std::numeric_limits<T>::infinity());
  acc[4].add(std::numeric_limits<T>::quiet_NaN());
  std::vector<int64_t> want(n * W);
  exact_lowering::pack(t, acc.data(), n, want.data());
  DeviceBuffer<ExactAcc<T>> d_acc(dev, static_cast<int64_t>(n), s);
  DeviceBuffer<int64_t> d_w(dev, static_cast<int64_t>(n * W), s);
  dev.upload(d_acc.data(), acc.data(), static_cast<int64_t>(n * sizeof(ExactAcc<T>)), s);
  dev.exact_pack(t, d_acc.data(), n, d_w.data(), s);
  EXPECT_EQ(dev.fetch(d_w.data(), static_cast<int64_t>(n * W), s), want);
  std::vector<ExactAcc<T>> back(n);
  exact_lowering::unpack(t, want.data(), n, back.data());
  dev.memset(d_acc.data(), 0, static_cast<int64_t>(n * sizeof(ExactAcc<T>)), s);
  dev.exact_unpack(t, d_w.data(), n, d_acc.data(), s);
  const std::vector<ExactAcc<T>> got = dev.fetch(d_acc.data(), static_cast<int64_t>(n), s);
  EXPECT_EQ(std::memcmp(got.data(), back.data(), n * sizeof(ExactAcc<T>)), 0);
  std::vector<int64_t> bad = want;
  bad[5 * W] = -1;    // a digit word below zero
  bad[900 * W] = -2;  // another, in a later block: the error names the first failing element, whatever the race
  dev.upload(d_w.data(), bad.data(), static_cast<int64_t>(bad.size() * 8), s);
  for (int rep = 0; rep < 20; ++rep) {
    try {
      dev.exact_unpack(t, d_w.data(), n, d_acc.data(), s);
      ADD_FAILURE() << "a negative digit word was unpacked";
    } catch (const Error& e) {
      ASSERT_NE(std::string(e.what()).find("word 0 of element 5 is -1"), std::string::npos) << e.what();
    }
  }
}
TEST_F(Cuda, ExactLoweringKernelsMatchTheHost) {
  gpu::CudaDevice dev(0);
  lowering_matches_host<float>(dev, DataType::exact_f32);
  lowering_matches_host<double>(dev, DataType::exact_f64);
}

// The fallback for devices without memory pools (cudaMalloc / cudaFree), forced on this one: the same results.
TEST_F(Cuda, MemoryWithoutPools) {
  gpu::set_memory_pools(false);
  struct Restore {
    ~Restore() { gpu::set_memory_pools(true); }
  } restore;
  {
    gpu::CudaDevice dev(0);
    EXPECT_FALSE(gpu::memory_pools_in_use());
    const Stream c = dev.compute_stream();
    std::vector<double> h(333);
    for (size_t i = 0; i < h.size(); ++i) h[i] = 1.0 / static_cast<double>(i + 3);
    DeviceBuffer<double> a(dev, 333, c), b(dev, 333, c);
    dev.upload(a.data(), h.data(), 333 * 8, c);
    dev.copy(b.data(), a.data(), 333 * 8, c);
    EXPECT_EQ(dev.fetch(b.data(), 333, c), h);
    lowering_matches_host<float>(dev, DataType::exact_f32);  // allocates scratch through the same path
  }
}

// A constant table (the RoPE table) is uploaded once per content, and again when its bytes change.
TEST_F(Cuda, ConstantTablesUploadOnce) {
  gpu::CudaDevice dev(0);
  std::vector<float> tab(1000);
  for (size_t i = 0; i < tab.size(); ++i) tab[i] = static_cast<float>(i) * 0.25f;
  const size_t n0 = gpu::device_table_uploads();
  const void* d1 = gpu::device_table(tab.data(), tab.size() * 4);
  const void* d2 = gpu::device_table(tab.data(), tab.size() * 4);
  EXPECT_EQ(d1, d2);
  EXPECT_EQ(gpu::device_table_uploads(), n0 + 1);
  std::vector<float> back(tab.size());
  ASSERT_EQ(cudaMemcpy(back.data(), d1, tab.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, tab);
  tab[7] = -1.f;  // new contents at the same address
  const void* d3 = gpu::device_table(tab.data(), tab.size() * 4);
  EXPECT_EQ(gpu::device_table_uploads(), n0 + 2);
  ASSERT_EQ(cudaMemcpy(back.data(), d3, tab.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, tab);
}

TEST_F(Cuda, ErrorsNameTheCall) {
  gpu::CudaDevice dev(0);
  EXPECT_THROW(gpu::CudaDevice bad(1 << 20), Error);
  try {
    (void)dev.allocate(int64_t{1} << 50, dev.compute_stream());
    ADD_FAILURE() << "a 1 PiB allocation succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory allocating"), std::string::npos) << e.what();
  }
}

// Which NCCL and cuBLAS this process loads (path and version), printed for the device check's summary; needs no
// GPU. A library that cannot be loaded is a line saying why (the tests that need it skip or fail on their own).
TEST(Libraries, NcclAndCublasLoaded) {
  std::string why;
  if (const nccl::Api* api = nccl::load_nccl("", &why))
    std::printf("loaded NCCL: %s\n", api->name);
  else
    std::printf("loaded NCCL: none (%s)\n", why.c_str());
  try {
    std::printf("loaded cuBLAS: %s\n", gpu::cublas_library().c_str());
  } catch (const Error& e) {
    std::printf("loaded cuBLAS: none (%s)\n", e.what());
  }
  std::printf("CUDA: %s\n", gpu::device_status().c_str());
}

const nccl::Api* real_nccl() {
  std::string why;
  const nccl::Api* api = nccl::load_nccl("", &why);
  if (!api) std::printf("NCCL not loadable: %s\n", why.c_str());
  return api;
}

// One rank: every operation through the real library on device memory (sums of one contribution are the input).
TEST_F(Cuda, NcclOneRank) {
  const nccl::Api* api = real_nccl();
  if (!api) GTEST_SKIP() << "libnccl not found";
  gpu::CudaDevice dev(0);
  for (bool blocking : {true, false}) {
    NcclOptions o;
    o.blocking = blocking;
    // a fresh id per communicator: NCCL's bootstrap root serves one ncclCommInitRank per rank and id
    nccl::UniqueId id;
    ASSERT_EQ(api->get_unique_id(&id), nccl::kSuccess);
    auto w = NcclCommunicator::init(*api, id, 1, 0, dev, "world", o);
    const Stream s = dev.comm_stream();
    std::vector<float> h(257);
    for (size_t i = 0; i < h.size(); ++i) h[i] = 1.f / static_cast<float>(i + 1);
    DeviceBuffer<float> x(dev, 257, s), y(dev, 257, s);
    dev.upload(x.data(), h.data(), 257 * 4, s);
    w->all_reduce(x.data(), y.data(), 257, DataType::f32, ReduceOp::sum, s);
    EXPECT_EQ(std::memcmp(dev.fetch(y.data(), 257, s).data(), h.data(), 257 * 4), 0);
    // exact sums, lowered onto ncclInt64
    std::vector<ExactAcc<float>> acc(5);
    for (size_t i = 0; i < acc.size(); ++i) acc[i].add(h[i]);
    DeviceBuffer<ExactAcc<float>> ea(dev, 5, s);
    dev.upload(ea.data(), acc.data(), static_cast<int64_t>(5 * sizeof(ExactAcc<float>)), s);
    w->all_reduce(ea.data(), ea.data(), 5, DataType::exact_f32, ReduceOp::exact_sum, s);
    const std::vector<ExactAcc<float>> back = dev.fetch(ea.data(), 5, s);
    for (size_t i = 0; i < 5; ++i) EXPECT_EQ(back[i].round(), h[i]);
    // all_to_allv to itself (grouped send/recv) and a split
    const size_t cnt = 257, disp = 0;
    w->all_to_allv(x.data(), &cnt, &disp, y.data(), &cnt, &disp, DataType::f32, s);
    EXPECT_EQ(std::memcmp(dev.fetch(y.data(), 257, s).data(), h.data(), 257 * 4), 0);
    auto sub = w->split(0, 0, "self");
    ASSERT_NE(sub, nullptr);
    sub->all_gather(x.data(), y.data(), 257, DataType::f32, s);
    EXPECT_EQ(std::memcmp(dev.fetch(y.data(), 257, s).data(), h.data(), 257 * 4), 0);
    std::printf("%s, %s communicator: ok\n", api->name, blocking ? "blocking" : "non-blocking");
  }
}

// Two GPUs in one process (one thread each): an all-reduce of two contributions, checked against the host sum.
TEST_F(Cuda, NcclTwoGpus) {
  if (gpu::device_count() < 2) GTEST_SKIP() << "one CUDA device: the two-GPU check needs two";
  const nccl::Api* api = real_nccl();
  if (!api) GTEST_SKIP() << "libnccl not found";
  nccl::InProcessExchange ids;
  std::vector<std::vector<float>> out(2);
  std::vector<std::string> errs(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      try {
        gpu::CudaDevice dev(r);
        const nccl::UniqueId id = ids.exchange(r, 2, [&] {
          nccl::UniqueId u;
          api->get_unique_id(&u);
          return u;
        });
        auto w = NcclCommunicator::init(*api, id, 2, r, dev, "world");
        const Stream s = dev.comm_stream();
        std::vector<float> h(64, static_cast<float>(r + 1));
        DeviceBuffer<float> x(dev, 64, s);
        dev.upload(x.data(), h.data(), 256, s);
        w->all_reduce(x.data(), x.data(), 64, DataType::f32, ReduceOp::sum, s);
        out[static_cast<size_t>(r)] = dev.fetch(x.data(), 64, s);
      } catch (const std::exception& e) {
        errs[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(errs[static_cast<size_t>(r)], "");
    for (float v : out[static_cast<size_t>(r)]) ASSERT_EQ(v, 3.f);
  }
}

}  // namespace
}  // namespace trident
