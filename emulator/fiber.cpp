// User-space fibers for the emulator's ranks (emulator/fiber.h).
//
// Park/wake protocol (no lock is held across a switch): a fiber that waits puts itself in the address's bucket
// (after re-checking the word under the bucket lock), releases the lock and switches to its worker. A waker takes
// it out of the bucket and makes it runnable: under the worker's lock, a fiber already switched out (`parked`) is
// queued; one still on its way out gets `wake_pending`, and its worker re-queues it right after the switch.
#include "emulator/fiber.h"

#include <climits>
#include <cxxabi.h>
#include <mutex>
#include <thread>

#include "platform/context.h"
#include "platform/wait.h"
#include "reference/check.h"

#if defined(__SANITIZE_THREAD__)
#define TD_FIBER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TD_FIBER_TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define TD_FIBER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TD_FIBER_ASAN 1
#endif
#endif
#ifdef TD_FIBER_TSAN
#include <sanitizer/tsan_interface.h>
#endif
#ifdef TD_FIBER_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
namespace trident::emu::fiber {

namespace {

// The C++ runtime's per-thread exception state (libstdc++/libc++abi __cxa_eh_globals).
struct EhGlobals {
  void* caught = nullptr;
  unsigned int uncaught = 0;
#ifdef __ARM_EABI_UNWINDER__
  void* propagating = nullptr;
#endif
};
EhGlobals* eh_globals() { return reinterpret_cast<EhGlobals*>(abi::__cxa_get_globals()); }

}  // namespace

struct Context {
  platform::MachineContext mc;          // platform/context.h (x86-64 asm or Boost.Context)
  EhGlobals eh;
  void* tsan = nullptr;                 // ThreadSanitizer's fiber
  const void* stack_bottom = nullptr;   // AddressSanitizer: this context's stack
  size_t stack_size = 0;
};

struct Fiber {
  Context ctx;
  void (*fn)(void*) = nullptr;
  void* arg = nullptr;
  Worker* worker = nullptr;
  int worker_index = 0;
  platform::Stack stack;  // guard page first
  Fiber* next = nullptr;  // run queue (worker mutex)
  Fiber* wnext = nullptr;  // bucket list (bucket mutex)
  const void* wait_addr = nullptr;
  bool parked = false;        // switched out and waiting (worker mutex)
  bool wake_pending = false;  // woken before its switch-out completed (worker mutex)
  bool finished = false;      // set by the fiber before its last switch; read by its worker after it
};

struct Worker {
  Scheduler* s = nullptr;
  std::mutex mu;
  Fiber* head = nullptr;
  Fiber* tail = nullptr;
  bool sleeping = false;
  bool stop = false;
  std::atomic<uint32_t> word{0};  // the worker thread sleeps on it (platform/wait.h)
  Context sched;                  // the worker thread's own context (its scheduler loop)
  void push(Fiber* f) {  // under mu
    f->next = nullptr;
    (tail ? tail->next : head) = f;
    tail = f;
  }
  Fiber* pop() {  // under mu, head != nullptr
    Fiber* f = head;
    head = f->next;
    if (!head) tail = nullptr;
    return f;
  }
  // Under mu. Returns whether the caller must wake the thread (after unlocking).
  bool enqueue(Fiber* f) {
    push(f);
    if (!sleeping) return false;
    sleeping = false;
    word.fetch_add(1, std::memory_order_release);
    return true;
  }
  void loop();
};

struct Scheduler::Bucket {
  std::mutex mu;
  Fiber* head = nullptr;
  Fiber* tail = nullptr;
};

namespace {

thread_local Fiber* t_current = nullptr;

// Switches from `from` to `to` on this thread. prev_into: where to record the stack we came from once this
// context runs again (AddressSanitizer; the worker's stack, seen from a fiber). finished: `from` never resumes.
void switch_context(Context& from, Context& to, Context* prev_into, bool finished) {
  EhGlobals* g = eh_globals();
  from.eh = *g;
  *g = to.eh;
#ifdef TD_FIBER_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(finished ? nullptr : &fake, to.stack_bottom, to.stack_size);
#endif
#ifdef TD_FIBER_TSAN
  __tsan_switch_to_fiber(to.tsan, 0);
#endif
  platform::switch_context(from.mc, to.mc);
#ifdef TD_FIBER_ASAN
  const void* bottom = nullptr;
  size_t size = 0;
  __sanitizer_finish_switch_fiber(fake, &bottom, &size);
  if (prev_into) {
    prev_into->stack_bottom = bottom;
    prev_into->stack_size = size;
  }
#else
  (void)prev_into;
#endif
  (void)finished;
}

void fiber_main(void* p) noexcept {
  auto* f = static_cast<Fiber*>(p);
#ifdef TD_FIBER_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &f->worker->sched.stack_bottom, &f->worker->sched.stack_size);
#endif
  f->fn(f->arg);  // the emulator's rank body catches everything
  f->finished = true;
  switch_context(f->ctx, f->worker->sched, nullptr, true);
  __builtin_unreachable();
}

void release(Fiber* f) {
#ifdef TD_FIBER_TSAN
  if (f->ctx.tsan) __tsan_destroy_fiber(f->ctx.tsan);
  f->ctx.tsan = nullptr;
#endif
#ifdef TD_FIBER_ASAN
  // Frames that never returned (the fiber's last switch) leave poisoned redzones in the shadow; memory mapped
  // later at these addresses must not inherit them.
  if (f->stack.map) __asan_unpoison_memory_region(f->ctx.stack_bottom, f->ctx.stack_size);
#endif
  platform::free_stack(f->stack);
}

}  // namespace

void Worker::loop() {
#ifdef TD_FIBER_TSAN
  sched.tsan = __tsan_get_current_fiber();
#endif
  std::unique_lock lk(mu);
  for (;;) {
    while (!head && !stop) {
      sleeping = true;
      const uint32_t t = word.load(std::memory_order_acquire);
      lk.unlock();
      platform::wait_word(word, t);
      lk.lock();
    }
    if (!head) break;
    Fiber* f = pop();
    lk.unlock();
    t_current = f;
    switch_context(sched, f->ctx, nullptr, false);
    t_current = nullptr;
    if (f->finished) {
      release(f);
      if (s->remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) s->stop_all();
      lk.lock();
      continue;
    }
    lk.lock();
    if (f->wake_pending) {
      f->wake_pending = false;
      push(f);
    } else {
      f->parked = true;
    }
  }
}

Scheduler::Scheduler(int workers, size_t fibers) {
  TD_CHECK(workers >= 1, "fiber scheduler: need at least one worker (got {})", workers);
  nbuckets_ = 64;
  while (nbuckets_ < 2 * fibers) nbuckets_ *= 2;
  buckets_ = std::make_unique<Bucket[]>(nbuckets_);
  for (int i = 0; i < workers; ++i) {
    workers_.push_back(std::make_unique<Worker>());
    workers_.back()->s = this;
  }
}

Scheduler::~Scheduler() {
  for (auto& f : fibers_) release(f.get());  // fibers that never ran (run() not called or failed)
}

std::string Scheduler::add(int worker, size_t stack_bytes, void (*fn)(void*), void* arg) {
  TD_CHECK(worker >= 0 && worker < workers(), "fiber scheduler: no worker {}", worker);
  platform::Stack stack;
  if (std::string err = platform::allocate_stack(stack_bytes, stack); !err.empty()) return err;
  auto f = std::make_unique<Fiber>();
  f->fn = fn;
  f->arg = arg;
  f->worker = workers_[static_cast<size_t>(worker)].get();
  f->worker_index = worker;
  f->stack = stack;
  f->ctx.stack_bottom = stack.bottom;
  f->ctx.stack_size = stack.size;
  platform::make_context(f->ctx.mc, stack.bottom, stack.size, &fiber_main, f.get());
#ifdef TD_FIBER_TSAN
  f->ctx.tsan = __tsan_create_fiber(0);
#endif
  fibers_.push_back(std::move(f));
  return "";
}

void Scheduler::stop_all() {
  for (auto& w : workers_) {
    bool wake_thread = false;
    {
      std::lock_guard lk(w->mu);
      w->stop = true;
      if (w->sleeping) {
        w->sleeping = false;
        w->word.fetch_add(1, std::memory_order_release);
        wake_thread = true;
      }
    }
    if (wake_thread) platform::wake_word(w->word, 1);
  }
}

void Scheduler::run() {
  if (fibers_.empty()) return;
  remaining_.store(static_cast<int64_t>(fibers_.size()));
  // Threads start behind a gate, so fibers of a worker whose thread could not start move to a started one first.
  std::atomic<uint32_t> gate{0};
  std::vector<std::thread> threads(workers_.size());
  std::vector<bool> started(workers_.size(), false);
  std::string err;
  for (size_t i = 0; i < workers_.size(); ++i) {
    try {
      Worker* w = workers_[i].get();
      threads[i] = std::thread([w, &gate] {
        platform::wait_word(gate, 0);
        w->loop();
      });
      started[i] = true;
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  size_t first = 0;
  while (first < started.size() && !started[first]) ++first;
  if (first == started.size())
    fail(fmt::format("spawn: could not start a fiber worker thread ({})", err));
  for (auto& f : fibers_) {
    if (!started[static_cast<size_t>(f->worker_index)]) f->worker = workers_[first].get();
    std::lock_guard lk(f->worker->mu);
    f->worker->push(f.get());
  }
  gate.store(1, std::memory_order_release);
  platform::wake_word(gate, INT_MAX);
  for (size_t i = 0; i < threads.size(); ++i)
    if (started[i]) threads[i].join();
}

Scheduler::Bucket& Scheduler::bucket(const void* addr) {
  const uint64_t h = (static_cast<uint64_t>(reinterpret_cast<uintptr_t>(addr)) >> 2) * 0x9E3779B97F4A7C15ull;
  return buckets_[static_cast<size_t>(h >> 32) & (nbuckets_ - 1)];
}

void Scheduler::wait(std::atomic<uint32_t>& word, uint32_t old) {
  Fiber* f = t_current;
  // Only fibers sleep here (wake() never wakes a thread): a rank's communicator used from another thread fails.
  if (!f) fail("emulator: a rank's communicator was used from a thread that is not one of the world's ranks");
  while (word.load(std::memory_order_acquire) == old) {
    Bucket& b = bucket(&word);
    {
      std::lock_guard lk(b.mu);
      if (word.load(std::memory_order_acquire) != old) return;
      f->wait_addr = &word;
      f->wnext = nullptr;
      (b.tail ? b.tail->wnext : b.head) = f;
      b.tail = f;
    }
    switch_context(f->ctx, f->worker->sched, &f->worker->sched, false);
  }
}

void Scheduler::wake(std::atomic<uint32_t>& word, int n) {
  Bucket& b = bucket(&word);
  Fiber* first = nullptr;
  Fiber* last = nullptr;
  {
    std::lock_guard lk(b.mu);
    Fiber* prev = nullptr;
    for (Fiber* f = b.head; f && n > 0;) {
      Fiber* nx = f->wnext;
      if (f->wait_addr == &word) {
        (prev ? prev->wnext : b.head) = nx;
        if (b.tail == f) b.tail = prev;
        f->wait_addr = nullptr;
        f->wnext = nullptr;
        (last ? last->wnext : first) = f;
        last = f;
        --n;
      } else {
        prev = f;
      }
      f = nx;
    }
  }
  for (Fiber* f = first; f;) {
    Fiber* nx = f->wnext;  // read before f may run again
    Worker& w = *f->worker;
    bool wake_thread = false;
    {
      std::lock_guard lk(w.mu);
      if (f->parked) {
        f->parked = false;
        wake_thread = w.enqueue(f);
      } else {
        f->wake_pending = true;
      }
    }
    if (wake_thread) platform::wake_word(w.word, 1);
    f = nx;
  }
}

void* Scheduler::current_arg() { return t_current ? t_current->arg : nullptr; }

}  // namespace trident::emu::fiber
