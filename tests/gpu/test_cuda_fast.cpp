// The fast tier on a GPU (gpu/fast/cuda_kernels.h: cuBLAS GEMMs, the fused attention and linear-CE bodies as CUDA
// kernels): every case of the checked-in primitive goldens recomputed on the device (inputs uploaded and outputs
// downloaded through a CudaDevice); the fast ops within the acceptance rule's bounds and the relative test vs
// fp64, every other op bitwise. Prints the largest |err| / bound per op. Skips with a message without a CUDA device.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "gpu/cuda_device.h"
#include "gpu/gemm.h"
#include "gpu/fast/check.h"
#include "gpu/fast/cuda_kernels.h"
#include "gpu/fast/kernels_impl.h"
#include "tests/gpu/golden_dir.h"

namespace trident {
namespace {

TEST(CudaFast, GoldensWithinTheGpuRows) {
  if (gpu::device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU tests skipped (" << gpu::device_status() << ")";
  gpu::CudaDevice dev(0);
  for (const char* preset : {"tiny", "tiny-gqa", "tiny-e64", "tiny-dsa", "tiny-packed"}) {
    const std::string dir = gputest::golden_data_dir() + "/primitives/" + preset;
    const golden::PrimitivesFile f = golden::read_primitives(dir + "/primitives.h5");
    golden::CheckOptions o;
    o.backend = "cuda-fast";
    const auto s32 = gpu::fast::check_fast_primitives<float>(
        f, [&](Device&) { return gpu::make_cuda_fast_kernels<float>(dev); }, o, dir, &dev);
    const auto s64 = gpu::fast::check_fast_primitives<double>(
        f, [&](Device&) { return gpu::make_cuda_fast_kernels<double>(dev); }, o, dir, &dev);
    for (const auto* s : {&s32, &s64}) {
      for (const auto& fl : s->sum.failures) ADD_FAILURE() << preset << ": " << fl.message << "\n  repro: " << fl.repro;
      EXPECT_EQ(s->sum.passed, s->sum.cases) << preset;
      for (const auto& [op, st] : s->ops)
        if (st.tolerance)
          std::printf("  %-10s %-24s %3lld cases, max |err|/bound %.3g, max rel vs fp64 %.3g\n", preset, op.c_str(),
                      static_cast<long long>(st.cases), st.max_err_over_bound, st.max_rel);
    }
  }
}

}  // namespace
}  // namespace trident
