// platform/context.h: the x86-64 register swap (Linux default) or Boost.Context's fcontext (portable).
#include "platform/context.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#if !defined(TRIDENT_PORTABLE) && defined(__x86_64__) && defined(__linux__)
#define TD_CONTEXT_ASM 1
#else
#include <boost/context/detail/fcontext.hpp>
#endif

#if defined(TD_CONTEXT_ASM)
// trident_fiber_switch(save, to): pushes the callee-saved registers and the FP control state on the current
// stack, stores the stack pointer in *save, loads `to` and pops the same from there. trident_fiber_start: a new
// fiber's first "return address": calls r13(r12); the fiber's entry never returns (ud2 after it), and the CFI
// marks the end of the call chain for unwinders.
extern "C" void trident_fiber_switch(void** save, void* to);
extern "C" void trident_fiber_start();
asm(R"(
    .text
    .globl trident_fiber_switch
    .hidden trident_fiber_switch
    .type trident_fiber_switch,@function
    .p2align 4
trident_fiber_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $16, %rsp
    stmxcsr 8(%rsp)
    fnstcw (%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr 8(%rsp)
    fldcw (%rsp)
    addq $16, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size trident_fiber_switch,.-trident_fiber_switch

    .globl trident_fiber_start
    .hidden trident_fiber_start
    .type trident_fiber_start,@function
    .p2align 4
trident_fiber_start:
    .cfi_startproc
    .cfi_undefined rip
    movq %r12, %rdi
    callq *%r13
    ud2
    .cfi_endproc
    .size trident_fiber_start,.-trident_fiber_start
)");
#endif

namespace trident::platform {

#if defined(TD_CONTEXT_ASM)

void make_context(MachineContext& ctx, void* bottom, size_t size, void (*entry)(void*), void* arg) {
  // The frame trident_fiber_switch pops (see its push order), ending in a return into trident_fiber_start with
  // the stack 16-byte aligned; the FP control state is the creating thread's (as a new thread inherits it).
  char* top = static_cast<char*>(bottom) + size;
  auto* sp = reinterpret_cast<uint64_t*>(top - 88);
  uint32_t mxcsr = 0;
  uint16_t fpucw = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  sp[0] = fpucw;
  sp[1] = mxcsr;
  sp[2] = 0;                                                 // r15
  sp[3] = 0;                                                 // r14
  sp[4] = reinterpret_cast<uint64_t>(entry);                 // r13: entry
  sp[5] = reinterpret_cast<uint64_t>(arg);                   // r12: its argument
  sp[6] = 0;                                                 // rbx
  sp[7] = 0;                                                 // rbp (end of the frame-pointer chain)
  sp[8] = reinterpret_cast<uint64_t>(&trident_fiber_start);  // return address
  sp[9] = 0;
  sp[10] = 0;
  ctx.sp = sp;
  ctx.entry = entry;
  ctx.arg = arg;
}

void switch_context(MachineContext& from, MachineContext& to) { trident_fiber_switch(&from.sp, to.sp); }

const char* context_impl() { return "x86-64 asm"; }

#else

namespace {

namespace bc = boost::context::detail;

// What a switch hands to the context it resumes: where to store the suspended side's handle (fcontext returns
// it to the resumed side, not to the one that jumps), and, for a fresh context, its entry.
struct Handoff {
  MachineContext* from;
  MachineContext* to;
};

void trampoline(bc::transfer_t t) {
  auto* h = static_cast<Handoff*>(t.data);
  h->from->sp = t.fctx;
  void (*entry)(void*) = h->to->entry;
  void* arg = h->to->arg;
  entry(arg);
  std::abort();  // entry never returns
}

}  // namespace

void make_context(MachineContext& ctx, void* bottom, size_t size, void (*entry)(void*), void* arg) {
  ctx.entry = entry;
  ctx.arg = arg;
  ctx.sp = bc::make_fcontext(static_cast<char*>(bottom) + size, size, &trampoline);
}

void switch_context(MachineContext& from, MachineContext& to) {
  Handoff h{&from, &to};
  const bc::transfer_t t = bc::jump_fcontext(to.sp, &h);
  // Resumed: t.data is the Handoff of whoever switched back to us; their context is suspended at t.fctx.
  static_cast<Handoff*>(t.data)->from->sp = t.fctx;
}

const char* context_impl() { return "boost.context"; }

#endif

std::string allocate_stack(size_t bytes, Stack& s) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t total = (std::max<size_t>(bytes, 16 * 1024) + page - 1) / page * page + page;
  int flags = MAP_PRIVATE | MAP_ANONYMOUS;
#ifdef MAP_NORESERVE
  flags |= MAP_NORESERVE;
#endif
#ifdef MAP_STACK
  flags |= MAP_STACK;
#endif
  void* m = mmap(nullptr, total, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (m == MAP_FAILED) return fmt::format("mmap of a {}-byte fiber stack failed: {}", total, std::strerror(errno));
  if (mprotect(m, page, PROT_NONE) != 0) {
    const int e = errno;
    munmap(m, total);
    return fmt::format("mprotect of a fiber stack's guard page failed: {}", std::strerror(e));
  }
  s.map = m;
  s.map_bytes = total;
  s.bottom = static_cast<char*>(m) + page;
  s.size = total - page;
  return "";
}

void free_stack(Stack& s) {
  if (s.map) munmap(s.map, s.map_bytes);
  s = Stack{};
}

}  // namespace trident::platform
