// Op profile (reference/profile.h).
#include "reference/profile.h"

#include <omp.h>

#include <ctime>

namespace trident::prof {

namespace {
std::atomic<long long> g_ns[kOps];
std::atomic<int64_t> g_flops[kOps];
std::atomic<int64_t> g_calls[kOps];
// The innermost recording section of this thread (the stack is the chain of parent_ pointers).
thread_local OpSection* t_top = nullptr;

long long cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}
}  // namespace

const char* name(Op op) {
  switch (op) {
    case Op::gemm: return "gemm";
    case Op::embedding: return "embedding";
    case Op::rmsnorm: return "rmsnorm";
    case Op::rope: return "rope";
    case Op::attn_core_fwd: return "attn core fwd";
    case Op::attn_core_bwd: return "attn core bwd";
    case Op::attn_other: return "attn other";
    case Op::moe_router: return "moe router";
    case Op::moe_dispatch: return "moe dispatch";
    case Op::moe_combine: return "moe combine";
    case Op::swiglu: return "swiglu";
    case Op::lce_fwd: return "linear-CE fwd";
    case Op::lce_bwd: return "linear-CE bwd";
    case Op::tile_reduce: return "tile reductions";
    case Op::grad_finalize: return "grad finalize";
    case Op::grad_norm: return "grad norm";
    case Op::adamw: return "adamw";
    case Op::finite_check: return "finite checks";
    case Op::other: return "other";
  }
  return "?";
}

void enable(bool on) { detail::g_on.store(on, std::memory_order_relaxed); }
bool enabled() { return detail::g_on.load(std::memory_order_relaxed); }

void reset() {
  for (int i = 0; i < kOps; ++i) {
    g_ns[i].store(0, std::memory_order_relaxed);
    g_flops[i].store(0, std::memory_order_relaxed);
    g_calls[i].store(0, std::memory_order_relaxed);
  }
}

double Profile::seconds() const {
  double s = 0;
  for (const OpStats& x : op) s += x.seconds;
  return s;
}

Profile snapshot() {
  Profile p;
  for (int i = 0; i < kOps; ++i) {
    p.op[i].seconds = static_cast<double>(g_ns[i].load(std::memory_order_relaxed)) * 1e-9;
    p.op[i].flops = g_flops[i].load(std::memory_order_relaxed);
    p.op[i].calls = g_calls[i].load(std::memory_order_relaxed);
  }
  return p;
}

void OpSection::open(Op op, int64_t flops) noexcept {
  if (omp_get_level() > 0) return;  // inside a parallel region: the enclosing section counts the team
  OpSection* const top = t_top;
  if (top != nullptr && top->op_ == op) return;  // part of the enclosing section of the same op
  const long long now = cpu_ns();
  if (top != nullptr) g_ns[static_cast<int>(top->op_)].fetch_add(now - top->t0_, std::memory_order_relaxed);
  const int i = static_cast<int>(op);
  g_calls[i].fetch_add(1, std::memory_order_relaxed);
  g_flops[i].fetch_add(flops, std::memory_order_relaxed);
  op_ = op;
  t0_ = now;
  parent_ = top;
  on_ = true;
  t_top = this;
}

void OpSection::close() noexcept {
  const long long now = cpu_ns();
  g_ns[static_cast<int>(op_)].fetch_add(now - t0_, std::memory_order_relaxed);
  t_top = parent_;
  if (parent_ != nullptr) parent_->t0_ = now;  // the paused section resumes
}

}  // namespace trident::prof
