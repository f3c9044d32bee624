// Sleeping on a 32-bit word until it changes, and waking the sleepers (platform/README in docs/laptops.md).
//
// The emulator's rank threads and fiber worker threads sleep here. One interface, chosen at configure time:
//  * default on Linux x86-64: the futex system call on the word itself (no spinning; with hundreds of rank threads
//    on two cores a spin-then-sleep wait costs more than the sleep);
//  * TRIDENT_PORTABLE (macOS, arm64, or forced with -DTRIDENT_PORTABLE=ON): a parking lot, each sleeping thread
//    on its own mutex and condition variable, listed under the word's address (condvar_wait/condvar_wake below,
//    compiled everywhere so its test runs on every build); with
//    -DTRIDENT_WAIT_ATOMIC=ON, C++20 std::atomic::wait/notify instead. Not the default: libstdc++ 12 spins with
//    sched_yield before it sleeps, and a thread ping-pong took 169 us with it against 7-18 us with the futex or a
//    condition variable on the loaded 2-core machine (docs/laptops.md section 4).
// Ordering comes from the atomic operations on the word: the waker changes it (release) before wake_word, the
// waiter reads it (acquire).
#pragma once
#include <atomic>
#include <cstdint>

namespace trident::platform {

// Returns once w != old (never spuriously).
void wait_word(std::atomic<uint32_t>& w, uint32_t old);
// Wakes up to n threads sleeping on w in wait_word (INT_MAX: all of them).
void wake_word(std::atomic<uint32_t>& w, int n);
// "futex", "atomic-wait" or "condvar": which implementation wait_word uses in this build.
const char* wait_impl();

// The condition-variable implementation (the portable build's), callable directly for its test.
void condvar_wait(std::atomic<uint32_t>& w, uint32_t old);
void condvar_wake(std::atomic<uint32_t>& w, int n);

}  // namespace trident::platform
