// User-space fibers for the emulator's ranks (SpawnOptions::exec = RankExec::fibers, docs/emulator.md section 4).
//
// A Scheduler runs fibers on a few worker threads. Each fiber is pinned to one worker (no migration: a thread_local
// read by a fiber always belongs to the thread it started on) and runs until it blocks; blocking is
// wait(word, old), a futex in user space: the fiber parks and its worker resumes the next runnable fiber of its
// own FIFO queue (deterministic order per worker). wake(word, n) makes up to n fibers parked on that word
// runnable again, from a fiber or any other thread (it wakes the worker thread, platform/wait.h, if it sleeps).
//
// Switching is platform/context.h: a hand-written x86-64 register swap (callee-saved registers, MXCSR and the x87
// control word; no system call) on Linux x86-64, Boost.Context with TRIDENT_PORTABLE (macOS, arm64). The C++
// runtime's per-thread exception state (__cxa_get_globals: caught exceptions, uncaught count) is saved and restored
// per fiber, so a fiber may block inside a catch block.
// ThreadSanitizer and AddressSanitizer are told about every switch (__tsan_switch_to_fiber,
// __sanitizer_start/finish_switch_fiber).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace trident::emu::fiber {

struct Fiber;
struct Worker;

class Scheduler {
 public:
  Scheduler(int workers, size_t fibers);  // fibers: how many will be added (sizes the futex table)
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  int workers() const { return static_cast<int>(workers_.size()); }
  // A fiber that will run fn(arg) on worker `worker` with a stack of stack_bytes (plus a guard page). Before
  // run() only. Returns an error message ("" on success: the stack could not be mapped).
  std::string add(int worker, size_t stack_bytes, void (*fn)(void*), void* arg);
  // Starts the worker threads and returns when every fiber has returned. Throws Error only if not even one
  // worker thread could start (then no fiber ran); fibers of a worker whose thread did not start run on
  // worker 0.
  void run();

  // From a fiber of this scheduler: parks until word != old (spurious returns are possible: callers loop). Throws
  // Error on any other thread.
  void wait(std::atomic<uint32_t>& word, uint32_t old);
  // From anywhere: makes up to n fibers parked on word runnable.
  void wake(std::atomic<uint32_t>& word, int n);

  // The argument of the fiber running on this thread (nullptr outside a fiber).
  static void* current_arg();

 private:
  friend struct Worker;
  struct Bucket;
  void stop_all();  // the last fiber finished: every worker thread ends
  Bucket& bucket(const void* addr);
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<std::unique_ptr<Fiber>> fibers_;
  std::unique_ptr<Bucket[]> buckets_;
  size_t nbuckets_ = 0;
  std::atomic<int64_t> remaining_{0};
};

}  // namespace trident::emu::fiber
