// The ref tier on a GPU (gpu/ref/cuda_kernels.h): every covered op recomputed on the device from every case of the
// checked-in primitive goldens (golden/data/primitives: tiny, tiny-gqa, tiny-e64; fp32 and fp64 kernel sets),
// inputs uploaded and outputs downloaded through a CudaDevice, compared bitwise with the reference's outputs.
// Skips with a message without a CUDA device.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "golden/primitives/primitives.h"
#include "gpu/cuda_device.h"
#include "gpu/gemm.h"
#include "gpu/ref/cuda_kernels.h"
#include "gpu/ref/host_kernels.h"

namespace trident {
namespace {

TEST(CudaRef, EveryCoveredOpBitwiseOnTheCheckedInGoldens) {
  if (gpu::device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU tests skipped";
  gpu::CudaDevice dev(0);
  std::map<std::string, int64_t> cases;
  for (const char* preset : {"tiny", "tiny-gqa", "tiny-e64"}) {
    const std::string dir = std::string(TRIDENT_GOLDEN_DATA) + "/primitives/" + preset;
    const golden::PrimitivesFile f = golden::read_primitives(dir + "/primitives.h5");
    for (const std::string& op : gpu::ref_covered_ops()) {
      golden::CheckOptions o;
      o.only_op = op;
      o.backend = "cuda-ref";
      const golden::CheckSummary s32 = golden::check_primitives<float>(
          f, [&](Device&) { return gpu::make_cuda_ref_kernels<float>(dev); }, o, dir, &dev);
      const golden::CheckSummary s64 = golden::check_primitives<double>(
          f, [&](Device&) { return gpu::make_cuda_ref_kernels<double>(dev); }, o, dir, &dev);
      for (const auto* s : {&s32, &s64}) {
        for (const auto& fl : s->failures) ADD_FAILURE() << preset << ": " << fl.message << "\n  repro: " << fl.repro;
        cases[op] += s->cases;
      }
    }
  }
  for (const std::string& op : gpu::ref_covered_ops()) {
    std::printf("  %-26s %4lld golden cases bitwise on the GPU\n", op.c_str(), static_cast<long long>(cases[op]));
    EXPECT_GT(cases[op], 0) << op;
  }
}

}  // namespace
}  // namespace trident
