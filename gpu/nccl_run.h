// The step as one process per GPU (`trident emulate --backend nccl`, docs/gpu.md "Multi-process launch"): this
// process is rank RANK of WORLD_SIZE, on GPU LOCAL_RANK (a CudaDevice), its world an NcclCommunicator over the real
// NCCL (loaded with dlopen) whose unique id comes through TRIDENT_NCCL_ID_FILE or MASTER_ADDR/MASTER_PORT (what
// `trident launch` and torchrun set), its kernels the ref or the fast tier (CudaKernels), and the step the same
// RankStep every backend runs, driven by emu::run_rank (emulator/rank_run.h): with `check`, every rank compares its
// own part of every gradient and parameter with the reference bit for bit and one all-reduce gives all the verdict.
#pragma once
#include <chrono>
#include <functional>
#include <string>

#include "emulator/rank_run.h"
#include "emulator/run_step.h"

namespace trident::gpu {

// The process's place in the job, from the environment: RANK and WORLD_SIZE (required), LOCAL_RANK (the GPU;
// default RANK). Bad or missing values are one error naming the variable.
struct ProcessPlace {
  int rank = 0, world = 1, local_rank = 0;
};
ProcessPlace process_place_from_env();

struct NcclRunOptions {
  std::string kernels = "cuda-ref";  // or cuda-fast
  bool check = false;                // bitwise, cuda-ref only
  bool blocking = false;             // NCCL communicators (default non-blocking, polled against the deadline)
  std::chrono::milliseconds timeout{300'000};  // the unique-id exchange and every NCCL operation
  std::string nccl_library;          // "" : libnccl.so.2, then libnccl.so
  // Called on every rank once the communicator is up (the CLI prints its header on rank 0): the GPU's name.
  std::function<void(const ProcessPlace&, const std::string& gpu)> on_start;
  std::function<void(int64_t step, const RankStepStats&)> progress;
};

template <class T>
emu::RankRunResult run_nccl_process(const emu::EmulateSpec& spec, const NcclRunOptions& opt);

extern template emu::RankRunResult run_nccl_process<float>(const emu::EmulateSpec&, const NcclRunOptions&);
extern template emu::RankRunResult run_nccl_process<double>(const emu::EmulateSpec&, const NcclRunOptions&);

}  // namespace trident::gpu
