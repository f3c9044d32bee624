// The ref tier on a GPU (gpu/ref/cuda_kernels.h): every op recomputed on the device from every case of the
// checked-in primitive goldens (golden/data/primitives: tiny, tiny-gqa, tiny-e64, tiny-dsa, tiny-packed; fp32 and
// fp64 kernel sets),
// inputs uploaded and outputs downloaded through a CudaDevice, compared bitwise with the reference's outputs.
// Skips with a message without a CUDA device.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpu/cuda_device.h"
#include "gpu/gemm.h"
#include "gpu/ref/cuda_kernels.h"
#include "tests/gpu/ref_goldens.h"

namespace trident {
namespace {

TEST(CudaRef, EveryOpBitwiseOnTheCheckedInGoldens) {
  if (gpu::device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU tests skipped (" << gpu::device_status() << ")";
  gpu::CudaDevice dev(0);
  reftest::check_goldens_bitwise(
      "cuda-ref", [&](Device&) { return gpu::make_cuda_ref_kernels<float>(dev); },
      [&](Device&) { return gpu::make_cuda_ref_kernels<double>(dev); }, &dev);
}

// Bad data found by a kernel: the op throws after its kernels, naming the rule.
TEST(CudaRef, BadTokenIdIsAnErrorNotAWrongRead) {
  if (gpu::device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU tests skipped (" << gpu::device_status() << ")";
  gpu::CudaDevice dev(0);
  auto k = gpu::make_cuda_ref_kernels<float>(dev);
  const Stream s = dev.compute_stream();
  const std::vector<int32_t> tok = {1, 3};
  DeviceBuffer<int32_t> t(dev, 2, s);
  DeviceBuffer<float> e(dev, 12, s), out(dev, 8, s);
  dev.upload(t.data(), tok.data(), 8, s);
  try {
    k->embedding_forward(out.data(), t.data(), e.data(), 2, 4, 3, s);
    ADD_FAILURE() << "a token id of 3 with V = 3 was accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("embedding_forward: a token id is out of range"), std::string::npos)
        << err.what();
  }
}

}  // namespace
}  // namespace trident
