// platform/wait.h: the futex (Linux default), std::atomic::wait (portable) or a condition variable (fallback).
#include "platform/wait.h"

#include <condition_variable>
#include <mutex>
#include <version>

#if !defined(TRIDENT_PORTABLE) && defined(__linux__)
#define TD_WAIT_FUTEX 1
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#elif defined(__cpp_lib_atomic_wait)
#define TD_WAIT_ATOMIC 1
#else
#define TD_WAIT_CONDVAR 1
#endif

namespace trident::platform {

namespace {

// The fallback: one mutex and condition variable per hashed address. A waiter holds the slot's mutex from its check
// of the word until it sleeps, and a waker takes the same mutex after changing the word, so no wake is lost.
struct Slot {
  std::mutex mu;
  std::condition_variable cv;
};
Slot& slot_of(const void* addr) {
  static Slot slots[256];
  const uint64_t h = (static_cast<uint64_t>(reinterpret_cast<uintptr_t>(addr)) >> 2) * 0x9E3779B97F4A7C15ull;
  return slots[h >> 56];
}

}  // namespace

void condvar_wait(std::atomic<uint32_t>& w, uint32_t old) {
  Slot& s = slot_of(&w);
  std::unique_lock lk(s.mu);
  while (w.load(std::memory_order_acquire) == old) s.cv.wait(lk);
}

void condvar_wake(std::atomic<uint32_t>& w, int n) {
  (void)n;  // a slot is shared by several words: every sleeper wakes and checks its own
  Slot& s = slot_of(&w);
  { std::lock_guard lk(s.mu); }
  s.cv.notify_all();
}

#if defined(TD_WAIT_FUTEX)
void wait_word(std::atomic<uint32_t>& w, uint32_t old) {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  while (w.load(std::memory_order_acquire) == old)
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&w), FUTEX_WAIT_PRIVATE, old, nullptr, nullptr, 0);
}
void wake_word(std::atomic<uint32_t>& w, int n) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&w), FUTEX_WAKE_PRIVATE, n, nullptr, nullptr, 0);
}
const char* wait_impl() { return "futex"; }
#elif defined(TD_WAIT_ATOMIC)
void wait_word(std::atomic<uint32_t>& w, uint32_t old) { w.wait(old, std::memory_order_acquire); }
void wake_word(std::atomic<uint32_t>& w, int n) {
  if (n == 1) w.notify_one();
  else w.notify_all();
}
const char* wait_impl() { return "atomic-wait"; }
#else
void wait_word(std::atomic<uint32_t>& w, uint32_t old) { condvar_wait(w, old); }
void wake_word(std::atomic<uint32_t>& w, int n) { condvar_wake(w, n); }
const char* wait_impl() { return "condvar"; }
#endif

}  // namespace trident::platform
