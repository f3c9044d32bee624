// One rank of the step, wherever the rank lives: a process of its own on a GPU (`trident emulate --backend nccl`,
// one process per GPU under `trident launch` or torchrun) or an emulated rank (tests). It runs spec.run.steps
// optimizer steps on the given world communicator, device and kernel set, and with `check` compares this rank's
// part of every gradient and parameter (RankStep::write_grads / write_params: dense tensors from d_rep coordinate
// 0, expert tensors from every rank, buffers from world rank 0) bit for bit with the single-rank reference, which
// every rank computes itself: nothing is gathered. The parts of all ranks are disjoint and must cover every element
// once; each rank counts the elements it wrote and the mismatches it found, and one i64 all-reduce over `world`
// gives every rank the same verdict (docs/gpu.md "Multi-process launch").
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "emulator/run_step.h"
#include "parallel/comm.h"
#include "parallel/device.h"
#include "parallel/step.h"
#include "parallel/step_kernels.h"

namespace trident::emu {

struct RankRunOptions {
  bool check = false;  // compare this rank's parts with the reference, count coverage over world
  // Called after each step (every rank; the CLI prints on rank 0).
  std::function<void(int64_t step, const RankStepStats&)> progress;
};

struct RankRunResult {
  std::vector<RankStepStats> steps;
  int64_t peak_bytes = 0;         // the step's tracked buffers on this rank
  int64_t device_peak_bytes = 0;  // every device allocation of this rank
  double seconds = 0;             // wall time of the steps on this rank
  // check only:
  bool checked = false;
  int64_t rank_elements = 0;       // elements this rank wrote, all steps
  int64_t world_elements = 0;      // summed over world (must equal expected_elements)
  int64_t expected_elements = 0;   // every element of every gradient and parameter, all steps
  int64_t world_mismatches = 0;    // tensor parts with a differing element, summed over world's ranks
  int64_t world_loss_mismatches = 0;
  std::vector<TensorCheck> mismatches;  // this rank's: the loss, and the first element of each differing part
  bool ok() const;
  std::string summary() const;  // one line
};

template <class T>
RankRunResult run_rank(const EmulateSpec& spec, Communicator& world, Device& dev, Kernels<T>& kernels,
                       const RankRunOptions& opt = {});

extern template RankRunResult run_rank<float>(const EmulateSpec&, Communicator&, Device&, Kernels<float>&,
                                              const RankRunOptions&);
extern template RankRunResult run_rank<double>(const EmulateSpec&, Communicator&, Device&, Kernels<double>&,
                                               const RankRunOptions&);

}  // namespace trident::emu
