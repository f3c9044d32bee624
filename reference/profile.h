// Op profile: where a reference step's process CPU time goes, per op (bench_small's per-op table, docs/model.md
// "A real model's step: bench_small"). Nothing in it changes a result: it only reads the clock.
//
// Off by default; off, a section costs one relaxed atomic load. On, a section reads the process CPU clock
// (clock_gettime(CLOCK_PROCESS_CPUTIME_ID): every thread of the process, immune to other processes' load) when it
// opens and when it closes, and its time is EXCLUSIVE: opening a section pauses the innermost open section of its
// thread, closing it resumes that one, so each CPU nanosecond of a profiled region counts in exactly one op (the
// innermost open section) and the ops sum to the time spent inside sections. Rules:
//  - A section opened inside an OpenMP parallel region records nothing (the process clock already counts every
//    thread of the team in the section that encloses the region). "Inside" is omp_get_level() > 0, inactive regions
//    (`parallel if (false)`, a one-thread team) included, so the attribution does not depend on the thread count:
//    e.g. the gemm_serial calls of the tile reductions and of linear CE always count in those ops.
//  - A section opened directly inside an open section of the same op is part of it: no call, no time or FLOPs of its
//    own. The outer section states the work (mm's section covers its gemm's, gemm_bf16's its gemm<float>'s).
//  - Per thread: emulated ranks may run concurrently. Ranks that are fibers sharing a worker thread switch only at
//    communicator calls, and no section contains one, so a section always opens and closes on one rank. The clock is
//    the process's: with several ranks computing at once each section also counts the others' CPU time, so the table
//    sums to the step only with one rank per process (bench_small).
//  - enable(), reset() and snapshot() are meant for the boundaries of a step: time of a section still open is
//    counted when it pauses or closes.
#pragma once
#include <atomic>
#include <cstdint>

namespace trident::prof {

// The ops of a reference training step (reference/model/*.cpp). Each names the code whose time it gets, less
// the sections nested in it.
enum class Op : int {
  gemm,            // the batch-invariant GEMM (gemm, gemm_bf16, gemm_serial outside parallel regions; model::mm)
  embedding,       // the embedding lookup (its backward is a tile reduction)
  rmsnorm,         // RMSNorm forward and backward (its gain gradient's sum is a tile reduction)
  rope,            // RoPE tables, forward and backward
  attn_core_fwd,   // the attention core forward (softmax(q k^T) v; DSA: the selection too)
  attn_core_bwd,   // the attention core backward (dq, the key side's in-tile partials; their exact adds: tile_reduce)
  attn_other,      // the rest of attention: projections' copies, operand layouts (their GEMMs: gemm)
  moe_router,      // the router's scores, top-k and gates, and their backward
  moe_dispatch,    // MoE outside its nested ops: rows to experts and back (route, gather, scatter), expert buffers
  moe_combine,     // the gate-weighted sum of the experts' outputs, its backward, the routed input gradient's sum
  swiglu,          // the SwiGLU activations (dense MLP, experts, shared expert) forward and backward
  lce_fwd,         // linear cross-entropy forward (its GEMMs run inside it: gemm_serial in its parallel region)
  lce_bwd,         // linear cross-entropy backward, incl. its GEMMs and its dW tile reduction
  tile_reduce,     // exact tile reductions: weight/norm/embedding gradients, the attention key side and its rounding,
                   // the loss sums
  grad_finalize,   // closing gradient accumulator blocks: one rounding of each accumulator into its gradient
  grad_norm,       // the exact global gradient norm (sum of squares) and the clip coefficient
  adamw,           // AdamW and the router bias update
  finite_check,    // the step's scans of gradients, parameters and moments for non-finite values
  other,           // the rest of the step (residual adds, buffers, batch checks): Trainer::step and the model driver
};
inline constexpr int kOps = static_cast<int>(Op::other) + 1;

// A short name for tables ("gemm", "attn core fwd", ...).
const char* name(Op op);

void enable(bool on);
bool enabled();
// Zeroes every op's seconds, FLOPs and calls.
void reset();

struct OpStats {
  double seconds = 0;  // exclusive process CPU seconds
  int64_t flops = 0;   // FLOPs its sections stated (gemm: 2 M N K)
  int64_t calls = 0;   // sections that recorded (not those inside parallel regions or merged into the same op)
};
struct Profile {
  OpStats op[kOps];
  const OpStats& operator[](Op o) const { return op[static_cast<int>(o)]; }
  double seconds() const;  // over every op
};
Profile snapshot();

// 2 M N K for a GEMM of those dimensions (0 when one is not positive).
inline int64_t gemm_flops(int64_t M, int64_t N, int64_t K) { return M > 0 && N > 0 && K > 0 ? 2 * M * N * K : 0; }

namespace detail {
inline std::atomic<bool> g_on{false};
}  // namespace detail

// RAII: `OpSection s(Op::rmsnorm);` for the rest of the scope. Not inside hot loops: per call of an op function.
class OpSection {
 public:
  explicit OpSection(Op op, int64_t flops = 0) noexcept {
    if (detail::g_on.load(std::memory_order_relaxed)) [[unlikely]] open(op, flops);
  }
  ~OpSection() {
    if (on_) [[unlikely]] close();
  }
  OpSection(const OpSection&) = delete;
  OpSection& operator=(const OpSection&) = delete;

 private:
  void open(Op op, int64_t flops) noexcept;
  void close() noexcept;
  Op op_ = Op::other;
  bool on_ = false;            // recording: closes on destruction
  long long t0_ = 0;           // process CPU ns when it last started or resumed counting
  OpSection* parent_ = nullptr;  // the section it paused
};

}  // namespace trident::prof
