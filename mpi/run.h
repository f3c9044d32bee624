// `trident emulate --backend mpi`: the distributed step (parallel/step.h) on MPI processes, each running
// ranks_per_process emulated ranks as fibers on a few worker threads (spec.exec, spec.workers: as the emulator
// runs its ranks) with an eager EmuDevice and an MpiCommunicator (docs/mpi.md). Exact sums are merged natively
// unless spec.lower_exact_sum (or FabricOptions::lower_exact_sum) asks for the i64 lowering.
// Every process calls run_mpi with the same spec; process 0 gets the gathered result (losses, per-rank peak memory (step buffers and device),
// collective tables, phases and, with keep_tensors, the assembled gradients and parameters), which
// emu::check_reference compares bit for bit with the single-rank reference like an emulated run.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
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
  // root only: per process, its resident pages other processes may share (program, libraries, MPI's shared-memory
  // segments: platform::shared_rss_bytes) at the end of the run, bytes
  std::vector<int64_t> process_shared_rss;
  // root only: messages and payload bytes between processes (over MPI), summed over processes; the results and
  // tensors gathered to process 0 after the steps included
  int64_t remote_messages = 0, remote_bytes = 0;
  // root only: the MPI messages (bundles) that carried them, summed over processes
  int64_t mpi_messages = 0;
};

// MPI for this process (MPI_THREAD_SERIALIZED: the fabric's progress thread is the only caller while a run is on).
// MPI can be initialised once per process and finalised once, so a command that runs several steps under one mpirun
// (`trident fuzz`) holds a Session for its whole life; run_mpi uses it, and only when there is none opens its own
// for the one call (`trident emulate`). The Session that initialised MPI finalises it when it ends, unless a run
// failed (a peer may be gone: MPI is left to process exit, and the caller must exit with a non-zero status).
// Sessions nest: an inner one finds MPI initialised and leaves it to the outer one.
class Session {
 public:
  Session();
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  int process() const { return process_; }      // this process's rank in MPI_COMM_WORLD
  int processes() const { return processes_; }  // the processes mpirun started
  static bool active();                         // a Session of this process holds MPI
  static void mark_failed();                    // a run failed: nothing finalises MPI any more

 private:
  bool owner_ = false;
  int process_ = 0, processes_ = 1;
};

// True when this process was started by mpirun (or another MPI launcher): the launcher's environment variables.
bool launched_by_mpi();

// Process 0's bytes on every process (a broadcast on MPI_COMM_WORLD between runs, from the calling thread; the others'
// `value` is ignored). Waits at most timeout_s for process 0 (then fails: it died or is stuck), sleeping between
// polls so a waiting process leaves the cores to the others. Needs an active Session and no run in progress.
std::string share_from_root(const std::string& value, double timeout_s = 600);

// Runs the spec on this process's ranks (MPI initialised by the active Session, or for this call only). A failure
// anywhere (a rank's error, a dead or silent process, a timeout) throws trident::Error on every surviving process,
// naming the rank; MPI is then left unfinalised (Session::mark_failed) and the caller must exit with a non-zero
// status.
// on_start(process, processes) runs on every process once MPI is up, before the steps (the CLI prints its header
// on process 0).
using OnStart = std::function<void(int process, int processes)>;
template <class T>
MpiRunResult<T> run_mpi(const emu::EmulateSpec& spec, const FabricOptions& opt, const OnStart& on_start = nullptr);

extern template MpiRunResult<float> run_mpi<float>(const emu::EmulateSpec&, const FabricOptions&, const OnStart&);
extern template MpiRunResult<double> run_mpi<double>(const emu::EmulateSpec&, const FabricOptions&,
                                                     const OnStart&);

}  // namespace trident::mpi
