// The machine-level context switch under the emulator's fibers (emulator/fiber.h), and fiber stacks.
//
// Chosen at configure time:
//  * default on Linux x86-64: a hand-written register swap (callee-saved registers, MXCSR and the x87 control
//    word; no system call);
//  * TRIDENT_PORTABLE (macOS, arm64, or forced with -DTRIDENT_PORTABLE=ON): Boost.Context's fcontext
//    (make_fcontext/jump_fcontext: the assembly Boost maintains for x86-64, arm64 and the rest, on ELF and Mach-O).
// Sanitizer annotations (__tsan_switch_to_fiber, __sanitizer_start/finish_switch_fiber) and the C++ runtime's
// per-thread exception state stay with the caller (emulator/fiber.cpp), the same for both.
#pragma once
#include <cstddef>
#include <string>

namespace trident::platform {

// A suspended context. Zero-initialised for a thread's own context (filled by the first switch away from it).
struct MachineContext {
  void* sp = nullptr;                 // the saved stack pointer (or fcontext handle)
  void (*entry)(void*) = nullptr;     // a fresh context's entry and argument
  void* arg = nullptr;
};

// Prepares ctx so that the first switch to it calls entry(arg) on the stack [bottom, bottom + size) (16-byte
// aligned, at least 16 KiB). entry must never return: it ends by switching away for good.
void make_context(MachineContext& ctx, void* bottom, size_t size, void (*entry)(void*), void* arg);
// Saves the running context into `from` and resumes `to`. Returns when something switches back to `from`.
void switch_context(MachineContext& from, MachineContext& to);
// "x86-64 asm" or "boost.context": which implementation this build uses.
const char* context_impl();

// A fiber stack: at least `bytes` usable (rounded up to pages) above one inaccessible guard page.
struct Stack {
  void* map = nullptr;  // the whole mapping, guard page first
  size_t map_bytes = 0;
  void* bottom = nullptr;  // the usable part
  size_t size = 0;
};
// Maps a stack; "" on success, else what failed.
std::string allocate_stack(size_t bytes, Stack& s);
// Unmaps it (no-op for an empty Stack).
void free_stack(Stack& s);

}  // namespace trident::platform
