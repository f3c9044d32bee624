// The MPI transport under MpiCommunicator (docs/mpi.md): byte messages between emulated ranks that live in one or
// several MPI processes.
//
// Layout: process p of P hosts the k = ranks_per_process consecutive global ranks [p*k, p*k + k), one thread each.
// A message is (context, source rank, destination rank, signature, bytes). Messages to a rank of the same process
// go straight into its mailbox (memory); messages to another process are queued to this process's progress thread,
// which alone calls MPI (MPI_THREAD_SERIALIZED is enough): it sends them with MPI_Isend in chunks of at most
// chunk_bytes (counts above INT_MAX split), receives with MPI_Improbe/MPI_Mrecv, reassembles and delivers them to
// the destination's mailbox. Mailboxes are FIFO per (context, source): with every rank issuing its calls on one
// communicator in the same order, that is the matching rule (as MPI's non-overtaking rule).
//
// Sends are buffered (the bytes are copied when posted), receives wait. Nothing waits without a deadline:
//  - the progress thread sends a heartbeat to every other process every heartbeat_s and fails the run when a
//    process was silent for peer_timeout_s (it died, was stopped or is unreachable): every waiting rank throws an
//    error naming the silent process's ranks;
//  - a process that fails (a rank's error, a silent process, an MPI error) sends its error once to every other
//    process, which fail at once with it (so one detection is enough, whatever the others saw);
//  - a rank waiting longer than wait_timeout_s for one message fails naming what it waited for.
// Every arriving message is checked before use (mpi/wire.h): a malformed one fails the run naming its process.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include "mpi/wire.h"

namespace trident::mpi {

struct FabricOptions {
  int ranks_per_process = 1;
  double heartbeat_s = 0.5;       // heartbeat period
  double peer_timeout_s = 6.0;    // a process silent this long is reported dead
  double wait_timeout_s = 600.0;  // one receive waiting longer fails (a rank stuck in compute, a lost message)
  size_t chunk_bytes = 0;         // largest MPI message payload; 0: INT_MAX - 64 (tests use small values)
};

// The MPI side of this process. MPI must be initialised (MpiSession) before and finalised after.
class Fabric {
 public:
  explicit Fabric(const FabricOptions& opt);
  ~Fabric();  // stops the progress thread (no MPI calls from other threads afterwards)
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;

  int process() const { return proc_; }
  int processes() const { return nproc_; }
  int ranks_per_process() const { return k_; }
  int world() const { return nproc_ * k_; }
  int first_rank() const { return proc_ * k_; }
  int process_of(int g) const { return g / k_; }
  std::string describe_process(int p) const;  // "process 3 (ranks 24..31)"

  // Posts `bytes` from src (a rank of this process) to dst; returns at once (the bytes are copied).
  void post(uint64_t ctx, int src, int dst, uint32_t sig, const void* data, size_t bytes);
  // The next message on (ctx, src) for dst (a rank of this process); throws trident::Error on failure/timeout.
  Msg take(uint64_t ctx, int src, int dst, const std::string& what);

  // This process failed with `msg` (a rank threw): wakes every waiter here and tells the other processes.
  void fail(const std::string& msg);
  bool failed() const { return failed_.load(); }
  std::string failure() const;
  // Normal end: waits (with the liveness checks still running) until every process got here and every send
  // completed, then stops the progress thread. Throws on failure.
  void shutdown();
  // Error end: flushes this process's failure notice (at most ~1 s) and stops the progress thread.
  void stop_after_failure();

  // Peak resident set of this process (VmHWM), bytes.
  static int64_t peak_rss();

 private:
  struct Mailbox {
    std::mutex m;
    std::condition_variable cv;
    std::map<std::pair<uint64_t, int>, std::deque<Msg>> q;
    // What the rank's thread waits for: deliver() wakes it only for that (a collective over n ranks would
    // otherwise wake its receivers n times). Another waiter would still see its message within the 50 ms poll.
    bool waiting = false;
    std::pair<uint64_t, int> want{};
  };
  struct Out {
    uint64_t ctx;
    int src, dst;
    uint32_t sig;
    std::vector<char> data;
  };
  void deliver(uint64_t ctx, int src, int dst, Msg&& m);
  void progress_main();
  void set_failure(const std::string& msg, bool tell_others);

  FabricOptions opt_;
  int proc_ = 0, nproc_ = 1, k_ = 1;
  size_t chunk_ = 0;
  MPI_Comm comm_ = MPI_COMM_NULL;  // a duplicate of MPI_COMM_WORLD: our messages only
  std::vector<std::unique_ptr<Mailbox>> boxes_;  // per local rank

  std::mutex out_m_;
  std::condition_variable out_cv_;
  std::deque<Out> outq_;

  std::atomic<bool> failed_{false};
  mutable std::mutex fail_m_;
  std::string failure_;
  bool tell_others_ = false;

  std::atomic<int> mode_{0};  // 0 running, 1 shutdown requested, 2 stop after failure
  std::atomic<bool> done_{false};
  std::string shutdown_error_;
  std::thread progress_;
};

}  // namespace trident::mpi
