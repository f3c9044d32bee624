// The example's CUDA kernel set and its plugin entry points: `trident check GOLDEN --backend
// plugin:libexample_cuda_kernels.so`. CudaExampleKernels is ExampleKernels<float> with mm run on the GPU
// (cuda_mm.cu); rmsnorm_forward is the CPU example's, every other op the reference's. The f64 cases take the CPU
// example's kernel set.
#include <memory>
#include <string>

#include "cuda_mm.h"
#include "example_kernels.h"
#include "golden/plugin.h"
#include "reference/check.h"

namespace example {

namespace {

int64_t span_of(int64_t rows, int64_t w, int64_t ld) { return rows > 0 ? (rows - 1) * ld + w : 0; }

class CudaExampleKernels : public ExampleKernels<float> {
 public:
  explicit CudaExampleKernels(trident::Device& dev) : ExampleKernels<float>(dev) {}

  // The operands are in host memory (the emulator's device): the op copies them to the GPU, runs the kernel and
  // copies C back, inside the launched function. A CUDA error is a trident::Error naming the call.
  void mm(trident::Policy pol, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
          int64_t ldb, bool trans_b, float* C, int64_t ldc, trident::Stream s,
          loc_t loc = loc_t::current()) override {
    const bool bf16 = pol == trident::Policy::bf16;
    auto fn = [=] {
      const std::string err = cuda::mm_f32(bf16, M, N, K, A, lda, B, ldb, trans_b, C, ldc);
      if (!err.empty()) throw trident::Error(err);
    };
    if (this->dev_.immediate()) {
      fn();
      return;
    }
    const int64_t b_elems = trans_b ? span_of(N, K, ldb) : span_of(K, N, ldb);
    this->dev_.launch(s, "mm",
                      {trident::reads(A, span_of(M, K, lda)), trident::reads(B, b_elems),
                       trident::writes(C, span_of(M, N, ldc))},
                      2.0 * double(M) * double(N) * double(K), std::function<void()>(fn), loc);
  }
};

}  // namespace

}  // namespace example

TRIDENT_PLUGIN_ABI()

// Refuses, with one line, where this process sees no CUDA device.
extern "C" TRIDENT_PLUGIN_EXPORT void trident_kernels_v1(trident::golden::PluginKernels* out) {
  const std::string missing = example::cuda::device_missing();
  if (!missing.empty())
    throw trident::Error("the example CUDA kernels need a CUDA device: none found (" + missing + ")");
  out->name = "example-cuda";
  out->f32 = [](trident::Device& d) { return std::make_unique<example::CudaExampleKernels>(d); };
  out->f64 = [](trident::Device& d) { return std::make_unique<example::ExampleKernels<double>>(d); };
}
