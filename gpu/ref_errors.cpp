// The ref tier's CUDA error path (gpu/ref/cuda_exec.cuh), compiled by the host compiler.
#include <fmt/format.h>

#include "reference/check.h"

namespace trident::gpu::ref {

[[noreturn]] void cuda_ref_fail(const char* call, int error, const char* error_string) {
  fail(fmt::format("cuda-ref: {} failed: {} (CUDA error {})", call, error_string, error));
}

}  // namespace trident::gpu::ref
