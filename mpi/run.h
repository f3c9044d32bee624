// `trident emulate --backend mpi`: the distributed step (parallel/step.h) on MPI processes, each running
// ranks_per_process emulated ranks as threads with an eager EmuDevice and an MpiCommunicator (docs/mpi.md).
// Every process calls run_mpi with the same spec; process 0 gets the gathered result (losses, per-rank peak memory,
// collective tables, phases and, with keep_tensors, the assembled gradients and parameters), which
// emu::check_reference compares bit for bit with the single-rank reference like an emulated run.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "emulator/run_step.h"
#include "mpi/fabric.h"

namespace trident::mpi {

template <class T>
struct MpiRunResult {
  bool root = false;                 // this is process 0 and `res` is filled
  int processes = 1;
  int ranks_per_process = 1;
  emu::EmulateResult<T> res;         // root only
  std::vector<int64_t> process_rss;  // root only: peak resident set per process (VmHWM), bytes
};

// Initialises MPI (MPI_THREAD_SERIALIZED: the fabric's progress thread is the only caller while it runs), runs the
// spec and finalises MPI. A failure anywhere (a rank's error, a dead or silent process, a timeout) throws
// trident::Error on every surviving process, naming the rank; MPI is then left unfinalised and the caller must exit
// with a non-zero status.
// on_start(process, processes) runs on every process once MPI is up, before the steps (the CLI prints its header
// on process 0).
using OnStart = std::function<void(int process, int processes)>;
template <class T>
MpiRunResult<T> run_mpi(const emu::EmulateSpec& spec, const FabricOptions& opt, const OnStart& on_start = nullptr);

extern template MpiRunResult<float> run_mpi<float>(const emu::EmulateSpec&, const FabricOptions&, const OnStart&);
extern template MpiRunResult<double> run_mpi<double>(const emu::EmulateSpec&, const FabricOptions&,
                                                     const OnStart&);

}  // namespace trident::mpi
