// The ref tier on a GPU (gpu/ref/cuda_kernels.h): every op recomputed on the device from every case of the
// checked-in primitive goldens (golden/data/primitives: tiny, tiny-gqa, tiny-e64; fp32 and fp64 kernel sets),
// inputs uploaded and outputs downloaded through a CudaDevice, compared bitwise with the reference's outputs.
// Skips with a message without a CUDA device.
#include <gtest/gtest.h>

#include "gpu/cuda_device.h"
#include "gpu/gemm.h"
#include "gpu/ref/cuda_kernels.h"
#include "tests/gpu/ref_goldens.h"

namespace trident {
namespace {

TEST(CudaRef, EveryOpBitwiseOnTheCheckedInGoldens) {
  if (gpu::device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU tests skipped";
  gpu::CudaDevice dev(0);
  reftest::check_goldens_bitwise(
      "cuda-ref", [&](Device&) { return gpu::make_cuda_ref_kernels<float>(dev); },
      [&](Device&) { return gpu::make_cuda_ref_kernels<double>(dev); }, &dev);
}

}  // namespace
}  // namespace trident
