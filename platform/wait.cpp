// platform/wait.h: the futex (Linux default), a condition variable (portable), or std::atomic::wait (portable with
// TRIDENT_WAIT_ATOMIC).
#include "platform/wait.h"

#include <condition_variable>
#include <mutex>
#include <version>

#if !defined(TRIDENT_PORTABLE) && defined(__linux__)
#define TD_WAIT_FUTEX 1
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#elif defined(__cpp_lib_atomic_wait) && defined(TRIDENT_WAIT_ATOMIC)
#define TD_WAIT_ATOMIC 1
#else
#define TD_WAIT_CONDVAR 1
#endif

namespace trident::platform {

namespace {

// The portable wait, a parking lot: each sleeping thread waits on its own mutex and condition variable, listed in
// the bucket of the word's address. A waiter re-checks the word under the bucket lock before it lists itself, and a
// waker takes the bucket lock after changing the word, so no wake is lost; a waker signals each waiter under the
// waiter's own mutex, so n threads woken at once (a barrier) do not queue on one lock.
struct Waiter {
  std::mutex mu;
  std::condition_variable cv;
  bool woken = false;            // under mu
  const void* addr = nullptr;    // under the bucket's mutex
  Waiter* next = nullptr;
};
struct Bucket {
  std::mutex mu;
  Waiter* head = nullptr;
};
Bucket& bucket_of(const void* addr) {
  static Bucket buckets[256];
  const uint64_t h = (static_cast<uint64_t>(reinterpret_cast<uintptr_t>(addr)) >> 2) * 0x9E3779B97F4A7C15ull;
  return buckets[h >> 56];
}
thread_local Waiter t_waiter;

}  // namespace

void condvar_wait(std::atomic<uint32_t>& w, uint32_t old) {
  Waiter& me = t_waiter;
  while (w.load(std::memory_order_acquire) == old) {
    Bucket& b = bucket_of(&w);
    {
      std::lock_guard lk(b.mu);
      if (w.load(std::memory_order_acquire) != old) return;
      {
        std::lock_guard mk(me.mu);
        me.woken = false;
      }
      me.addr = &w;
      me.next = b.head;
      b.head = &me;
    }
    std::unique_lock mk(me.mu);
    me.cv.wait(mk, [&] { return me.woken; });
  }
}

void condvar_wake(std::atomic<uint32_t>& w, int n) {
  Bucket& b = bucket_of(&w);
  Waiter* first = nullptr;
  {
    std::lock_guard lk(b.mu);
    for (Waiter** p = &b.head; *p && n > 0;) {
      Waiter* x = *p;
      if (x->addr == &w) {
        *p = x->next;
        x->next = first;
        first = x;
        --n;
      } else {
        p = &x->next;
      }
    }
  }
  while (first) {
    Waiter* x = first;
    first = x->next;  // read before x may return and wait again
    std::lock_guard mk(x->mu);
    x->woken = true;
    x->cv.notify_one();  // under x's mutex: x cannot return (and its thread end) before this is done
  }
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
