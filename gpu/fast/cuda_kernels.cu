// The fast tier on the device (gpu/fast/cuda_kernels.h): the fused bodies of gpu/fast/ops.h as CUDA kernels (the
// CUDA executor of the ref tier) and cuBLAS for the GEMMs. Compiled with the ref tier's flags (--fmad=false for the
// bodies); cuBLAS's own kernels use FMA and tensor cores, which is what the "gpu" tolerance rows allow for.
// The device build of dm:: (gpu/ref/dmath_device.cuh) defines reference/dmath.cpp's functions with external
// linkage in the namespace trident::gpu::devdm, once per translation unit that includes it; gpu/ref/cuda_kernels.cu
// already does. This file gets its own copy under another namespace name (the same source and bits), so the two
// objects link together.
#define devdm devdm_fast
#include "gpu/fast/cuda_kernels.h"

#include "gpu/emu_cuda.h"

#include <cublas_v2.h>
#include <dlfcn.h>

#include <climits>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "gpu/fast/cublas_args.h"
#include "gpu/nccl/nvidia_libs.h"
#include "gpu/fast/kernels_impl.h"
#include "gpu/ref/cuda_exec.cuh"

namespace trident::gpu {
namespace {

// ---- cuBLAS through dlopen: the entry points the fast tier calls, typed from cublas_v2.h ----------------------
struct Cublas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  // (cublasGemmEx is overloaded in C++ (a cudaDataType/computeType form): the C entry point's type, spelled out)
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
  decltype(&cublasGetProperty) get_property = nullptr;
  std::string path;  // the file loaded
};

const Cublas& cublas() {
  static Cublas api;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    std::string tried;
    // the loader's search, then the wheel folders (site-packages/nvidia/cublas/lib) where images install cuBLAS
    void* h = nccl::dlopen_nvidia({"libcublas.so.13", "libcublas.so.12", "libcublas.so"}, "cublas", &tried);
    if (!h) {
      error = "cuda-fast: cuBLAS is not available: dlopen failed for " + tried;
      return;
    }
    auto sym = [&](auto& f, const char* n) {
      f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(h, n));
      if (!f && error.empty()) error = fmt::format("cuda-fast: cuBLAS has no symbol {}", n);
    };
    sym(api.create, "cublasCreate_v2");
    sym(api.destroy, "cublasDestroy_v2");
    sym(api.set_stream, "cublasSetStream_v2");
    sym(api.set_math_mode, "cublasSetMathMode");
    sym(api.gemm_ex, "cublasGemmEx");
    sym(api.status_string, "cublasGetStatusString");
    sym(api.get_property, "cublasGetProperty");
    api.path = nccl::library_path(h);
  });
  if (!error.empty()) fail(error);
  return api;
}

void check_cublas(cublasStatus_t st, const char* call) {
  if (st != CUBLAS_STATUS_SUCCESS)
    fail(fmt::format("cuda-fast: {} failed: {} ({})", call, cublas().status_string(st), static_cast<int>(st)));
}

// One cuBLAS handle per kernel set (created on first use, never destroyed: process lifetime, as cuBLAS's own
// handles usually are; destroying it at exit races the driver's teardown).
struct Handle {  // one per kernel set (per emulated rank on one GPU), destroyed with it
  cublasHandle_t h = nullptr;
  Handle() = default;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() {
    if (h) (void)cublas().destroy(h);
  }
  cublasHandle_t get() {
    if (!h) {
      check_cublas(cublas().create(&h), "cublasCreate");
      // CUBLAS_DEFAULT_MATH with CUBLAS_COMPUTE_32F: fp32 operands are not rounded to TF32 (that takes
      // CUBLAS_TF32_TENSOR_OP_MATH or CUBLAS_COMPUTE_32F_FAST_TF32); bf16 operands run on tensor cores.
      check_cublas(cublas().set_math_mode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    }
    return h;
  }
};

// The device GEMM: row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, one cublasGemmEx.
struct CublasGemm {
  std::shared_ptr<Handle> handle;
  template <class T>
  void operator()(ref::CudaExec& ex, bool bf, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const T* A,
                  int64_t lda, const T* B, int64_t ldb, bool accumulate, T* C, int64_t ldc) const {
    for (const int64_t v : {M, N, K, lda, ldb, ldc})
      if (v > INT_MAX)
        fail(fmt::format("cuda-fast: a GEMM dimension or leading dimension of {} exceeds cublasGemmEx's int range", v));
    const cublasHandle_t h = handle->get();
    check_cublas(cublas().set_stream(h, ex.stream()), "cublasSetStream");
    const void* a = A;
    const void* b = B;
    cudaDataType_t ab_type = std::is_same_v<T, double> ? CUDA_R_64F : CUDA_R_32F;
    if constexpr (std::is_same_v<T, float>) {
      if (bf) {  // operands rounded to bf16 (RNE, the reference's to_bf16) into dense copies of their stored shape
        const fast::StoredShape sa = fast::stored_shape(trans_a, M, K), sb = fast::stored_shape(trans_b, K, N);
        const int64_t ac = sa.cols, bc = sb.cols;
        uint16_t* a16 = ex.scratch<uint16_t>(sa.rows * sa.cols);
        uint16_t* b16 = ex.scratch<uint16_t>(sb.rows * sb.cols);
        ex.for_each(sa.rows * ac, [=] __device__(int64_t i) { a16[i] = to_bf16(A[(i / ac) * lda + i % ac]).bits; });
        ex.for_each(sb.rows * bc, [=] __device__(int64_t i) { b16[i] = to_bf16(B[(i / bc) * ldb + i % bc]).bits; });
        a = a16, b = b16, lda = ac, ldb = bc, ab_type = CUDA_R_16BF;
      }
    }
    const fast::CublasGemmArgs g = fast::cublas_gemm_args(trans_a, trans_b, M, N, K, lda, ldb, ldc);
    const T one = T(1), zero = T(0);
    const cublasComputeType_t ct = std::is_same_v<T, double> ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
    auto op = [](bool t) { return t ? CUBLAS_OP_T : CUBLAS_OP_N; };
    check_cublas(cublas().gemm_ex(h, op(g.op_first_t), op(g.op_second_t), static_cast<int>(g.m), static_cast<int>(g.n),
                                  static_cast<int>(g.k), &one, b, ab_type, static_cast<int>(g.ld_first), a, ab_type,
                                  static_cast<int>(g.ld_second), accumulate ? &one : &zero, C,
                                  std::is_same_v<T, double> ? CUDA_R_64F : CUDA_R_32F, static_cast<int>(g.ldc), ct,
                                  CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
  }
};

}  // namespace

void load_cublas() { (void)cublas(); }

std::string cublas_library() {
  const Cublas& c = cublas();
  int v[3] = {0, 0, 0};
  const libraryPropertyType props[3] = {MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL};
  for (int i = 0; i < 3; ++i) (void)c.get_property(props[i], &v[i]);
  return fmt::format("cuBLAS {}.{}.{} ({})", v[0], v[1], v[2], c.path.empty() ? "path unknown" : c.path);
}

template <class T>
std::unique_ptr<Kernels<T>> make_cuda_fast_kernels(CudaDevice& dev) {
  load_cublas();
  return std::make_unique<fast::FastKernels<T, ref::CudaLaunch, CublasGemm>>(ref::CudaLaunch{&dev, nullptr, nullptr},
                                                                         CublasGemm{std::make_shared<Handle>()});
}
template std::unique_ptr<Kernels<float>> make_cuda_fast_kernels<float>(CudaDevice&);
template std::unique_ptr<Kernels<double>> make_cuda_fast_kernels<double>(CudaDevice&);

// An emulated rank on the GPU (gpu/emu_cuda.h): the same class, the same bodies; its own CUDA stream and cuBLAS
// handle.
template <class T>
std::unique_ptr<Kernels<T>> make_emu_cuda_fast_kernels(Device& dev) {
  load_cublas();
  return std::make_unique<fast::FastKernels<T, ref::CudaLaunch, CublasGemm>>(
      ref::CudaLaunch{nullptr, &dev, std::make_shared<RankStream>()}, CublasGemm{std::make_shared<Handle>()});
}
template std::unique_ptr<Kernels<float>> make_emu_cuda_fast_kernels<float>(Device&);
template std::unique_ptr<Kernels<double>> make_emu_cuda_fast_kernels<double>(Device&);

}  // namespace trident::gpu
