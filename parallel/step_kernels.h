// The kernel set of the distributed step: every piece of per-rank compute the step launches, behind one
// interface, so the same step code (parallel/step.h) can drive the CPU reference ops (CpuKernels, below)
// and CUDA kernels with the same names and argument order (STYLE.md habit 1).
//
// Every kernel has the semantics (and the bits) of the reference op it is named after (reference/model/*.h);
// the step only arranges rows, collectives and reduction order around them. Shapes are given as comments.
// One argument order everywhere: Policy first (where the op has one), the reference op's arguments in its
// order, the Stream last (llm.c habit: the reference op's name, plus a stream). Every op is asynchronous: it is
// issued to the stream and its pointers must stay valid until it ran (Device semantics, parallel/device.h).
#pragma once
#include <cstdint>
#include <source_location>
#include <span>
#include <vector>

#include "parallel/device.h"
#include "reference/exact_acc.h"
#include "reference/model/adamw.h"
#include "reference/model/attention.h"
#include "reference/model/config.h"
#include "reference/model/ops.h"
#include "reference/policy.h"

namespace trident {

template <class T>
class Kernels {
 public:
  virtual ~Kernels() = default;
  using Config = model::Config;
  using AttnW = model::AttnW<T>;
  using AttnG = model::AttnG<T>;
  using AttnGP = model::AttnGP<T>;  // the projections' gradients as tile partials (kv_norm an accumulator)
  using AttnBufs = model::AttnBufs<T>;  // activation buffers (model::AttnActSizes)
  using CoreDims = model::CoreDims;
  using Rope = model::RopeTable<T>;
  using Segs = std::span<const int64_t>;  // tile segments of the rows (host metadata, copied at issue)
  using loc_t = std::source_location;     // the caller's line, named in hazard and error reports

  // ---- GEMM-like ---------------------------------------------------------------------------------------------
  // C (M,N) ldc = A (M,K) lda @ op(B) (K,N); op(B) = B (K,N) ldb, or B^T with B (N,K) ldb when trans_b.
  virtual void mm(Policy pol, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
                  bool trans_b, T* C, int64_t ldc, Stream s, loc_t loc = loc_t::current()) = 0;
  // acc (K,M) += X^T dY over the tiles of segs; X (rows,K) ldx, dY (rows,M) ldy.
  virtual void wgrad_acc(Policy pol, const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M, Segs segs,
                         ExactAcc<T>* acc, Stream s, loc_t loc = loc_t::current()) = 0;
  // The tile partials of X^T dY (K,M) written into out's send layout (reference/tile_reduce.h TilePartials; element
  // k * M + m of the tensor, plus out.off) instead of added into accumulators (model::wgrad_partials): the step
  // exchanges them where that moves fewer bytes (docs/parallel.md section 4). Returns false, issuing nothing, where
  // the kernel set does not have this op (the default; the step then adds into accumulators, the same bits).
  virtual bool wgrad_partials(Policy pol, const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M,
                              Segs segs, const TilePartials<T>& out, Stream s, loc_t loc = loc_t::current()) {
    return false;
  }
  // acc (J) += sum of the rows of x (rows,J) over the tiles of segs.
  virtual void sum_acc(const T* x, int64_t J, Segs segs, ExactAcc<T>* acc, Stream s, loc_t loc = loc_t::current()) = 0;
  // out (n) = round(acc (n)).
  virtual void exact_round(const ExactAcc<T>* acc, T* out, int64_t n, Stream s, loc_t loc = loc_t::current()) = 0;

  // ---- per-token ops -----------------------------------------------------------------------------------------
  // out (N,d) = embed (V,d) [tokens (N)].
  virtual void embedding_forward(T* out, const int32_t* tokens, const T* embed, int64_t N, int64_t d, int64_t V,
                                 Stream s, loc_t loc = loc_t::current()) = 0;
  // dembed (rows of the slice, d) += dout (N,d) scattered by tokens (N) (slots; -1 skipped), per tile.
  // The same with its tile partials written into dembed's send layout (model::embedding_backward_partials; the step's
  // exchange of embedding slices as tile partials, docs/parallel.md section 4). Returns false, issuing nothing, where
  // the kernel set does not have it (the default; the step then adds into accumulators, the same bits).
  virtual bool embedding_backward_partials(const TilePartials<T>& dembed, const int32_t* tokens, const T* dout,
                                           int64_t N, int64_t d, Segs segs, Stream s, loc_t loc = loc_t::current()) {
    return false;
  }
  virtual void embedding_backward(ExactAcc<T>* dembed, const int32_t* tokens, const T* dout, int64_t N, int64_t d,
                                  Segs segs, Stream s, loc_t loc = loc_t::current()) = 0;
  // y (N,d) ldy = rmsnorm(x (N,d) ldx) * g (d); rinv (N).
  virtual void rmsnorm_forward(const T* x, int64_t ldx, const T* g, int64_t N, int64_t d, double eps, T* y, int64_t ldy,
                               T* rinv, Stream s, loc_t loc = loc_t::current()) = 0;
  // dx (N,d) written; dg (d) += per tile.
  virtual void rmsnorm_backward(const T* dy, int64_t lddy, const T* x, int64_t ldx, const T* rinv, const T* g,
                                int64_t N, int64_t d, Segs segs, T* dx, int64_t lddx, ExactAcc<T>* dg, Stream s,
                                loc_t loc = loc_t::current()) = 0;
  // out (n) = a (n) + b (n) elementwise (the residual adds of layer_forward / layer_backward).
  virtual void residual_forward(T* out, const T* a, const T* b, int64_t n, Stream s, loc_t loc = loc_t::current()) = 0;
  // Dense MLP and shared expert: SwiGLU (reference/model/ops.h). x (N,d); wg, wu (d,F); wd (F,d);
  // ug, uu, h (N,F); y (N,d).
  virtual void swiglu_forward(Policy pol, const T* x, const T* wg, const T* wu, const T* wd, int64_t N, int64_t d,
                              int64_t F, T* ug, T* uu, T* h, T* y, Stream s, loc_t loc = loc_t::current()) = 0;
  // dy (N,d) -> dug, duu (N,F), dx (N,d).
  virtual void swiglu_backward_dgrad(Policy pol, const T* dy, const T* wg, const T* wu, const T* wd, const T* ug,
                                     const T* uu, int64_t N, int64_t d, int64_t F, T* dug, T* duu, T* dx, Stream s,
                                     loc_t loc = loc_t::current()) = 0;
  // (SwiGLU weight gradients: the step issues the reference's swiglu_backward_wgrad as its three wgrad_acc calls,
  // one tensor at a time, so one accumulator is live at a time.)
  // A routed expert on a row list: x (n, d) -> y (n, d) with its SwiGLU activations. The default is the
  // SwiGLU; the identity-expert test hook overrides it (y = x).
  virtual void expert_forward(Policy pol, const T* x, const T* wg, const T* wu, const T* wd, int64_t n, int64_t d,
                              int64_t F, T* ug, T* uu, T* h, T* y, Stream s, loc_t loc = loc_t::current()) {
    swiglu_forward(pol, x, wg, wu, wd, n, d, F, ug, uu, h, y, s, loc);
  }
  // Its dgrad (swiglu_backward_dgrad on the expert's rows): dy (n,d) -> dug, duu (n,F), dx (n,d).
  virtual void expert_backward_dgrad(Policy pol, const T* dy, const T* wg, const T* wu, const T* wd, const T* ug,
                                     const T* uu, int64_t n, int64_t d, int64_t F, T* dug, T* duu, T* dx, Stream s,
                                     loc_t loc = loc_t::current()) {
    swiglu_backward_dgrad(pol, dy, wg, wu, wd, ug, uu, n, d, F, dug, duu, dx, s, loc);
  }
  // Test hook, called after the EP combine of each MoE layer's forward with the routed part of the output
  // (before the shared expert is added): a (N, d) the expert input, gates/sel (N, K), routed (N, d).
  virtual void on_moe_combined(int64_t layer, const T* a, const T* gates, const int32_t* sel, const T* routed,
                               int64_t N, int64_t d, int64_t K, Stream s, loc_t loc = loc_t::current()) {}
  // a (N,d), wr (d,E), bias (E) -> logits, scores (N,E), sel (N,K) ascending, gates (N,K).
  virtual void router_forward(Policy pol, const T* a, const T* wr, const T* bias, int64_t N, int64_t d, int64_t E,
                              int64_t K, double alpha, T* logits, T* scores, int32_t* sel, T* gates, Stream s,
                              loc_t loc = loc_t::current()) = 0;
  // dgates (N,K) -> dlogits (N,E).
  virtual void router_backward(const T* dgates, const T* scores, const int32_t* sel, int64_t N, int64_t E, int64_t K,
                               double alpha, T* dlogits, Stream s, loc_t loc = loc_t::current()) = 0;
  // MoE combine (moe_forward's order): out (N,d) = sum over k ascending of gates (N,K) [t,k] * yk (N*K, d) [t*K+k].
  virtual void moe_combine_forward(T* out, const T* gates, const T* yk, int64_t N, int64_t d, int64_t K, Stream s,
                                   loc_t loc = loc_t::current()) = 0;
  // Its backward into the routed rows: dgates (N,K) [t,k] = dout[t] . yk[t*K+k] (ascending c); dyk (N*K, d)
  // [t*K+k] = gates[t,k] * dout[t]. Rows listed in tk (entries t*K+k; host metadata) only, dyk packed in that
  // order.
  virtual void moe_combine_backward(const T* dout, const T* gates, const T* yk, std::span<const int64_t> tk, int64_t d,
                                    int64_t K, T* dgates, T* dyk, Stream s, loc_t loc = loc_t::current()) = 0;
  // Sum of the expert gradients (moe_backward's order): dx (N,d) = +0 + dxk[t*K+0] + ... + dxk[t*K+K-1].
  virtual void moe_dx_sum(T* dx, const T* dxk, int64_t N, int64_t d, int64_t K, Stream s,
                          loc_t loc = loc_t::current()) = 0;
  // Rows by index: dst (n, w) row j = src row idx[j] (gather_rows) / dst row idx[j] = src (n, w) row j
  // (scatter_rows). idx is host metadata, copied at issue.
  virtual void gather_rows(T* dst, const T* src, std::span<const int64_t> idx, int64_t w, Stream s,
                           loc_t loc = loc_t::current()) = 0;
  virtual void scatter_rows(T* dst, const T* src, std::span<const int64_t> idx, int64_t w, Stream s,
                            loc_t loc = loc_t::current()) = 0;

  // ---- attention (reference/model/attention.h) ----------------------------------------------------------------
  virtual void attn_qkv_forward(Policy pol, const Config& cfg, const AttnW& W, const T* a, const int64_t* pos,
                                int64_t N, const Rope& rope, const AttnBufs& acts, Stream s,
                                loc_t loc = loc_t::current()) = 0;
  // kv (2cp blocks of `block` values) from gather order to position order: block b of dst = block slot(b) of src,
  // slot(b) = 2b for b < cp, 2(2cp-1-b)+1 otherwise (docs/parallel.md zig-zag). to_gather: the inverse.
  virtual void kv_zigzag_reorder(T* dst, const T* src, int64_t cp, int64_t block, bool to_gather, Stream s,
                                 loc_t loc = loc_t::current()) = 0;
  // Exact accumulators x (2cp blocks of `block`) from position order to gather order in place (the key-side
  // gradient before its reduce-scatter); scratch: one block.
  virtual void kv_zigzag_to_gather_acc(ExactAcc<T>* x, ExactAcc<T>* scratch, int64_t cp, int64_t block, Stream s,
                                       loc_t loc = loc_t::current()) = 0;
  virtual void attn_core_forward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq,
                                 const T* kv, int64_t S, T* o, T* stats, Stream s, loc_t loc = loc_t::current()) = 0;
  virtual void attn_core_backward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq,
                                  const T* kv, int64_t S, const T* o, const T* stats, const T* dO, Segs qsegs, T* dq,
                                  ExactAcc<T>* dkv, Stream s, loc_t loc = loc_t::current()) = 0;
  // attn_core_backward with the key side written (not added) straight in zig-zag gather order (kv_zigzag_reorder's
  // slots, 2cp blocks of S / 2cp keys): dkv (S, P) = kv_zigzag_to_gather_acc of (zeroed accumulators +
  // attn_core_backward's key side), so dkv need not be zeroed and is not reordered after. Returns false, issuing
  // nothing, where the kernel set does not have this op (the default); the step then zeroes dkv, runs
  // attn_core_backward and reorders: the same bits.
  virtual bool attn_core_backward_gather(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq,
                                         const T* kv, int64_t S, const T* o, const T* stats, const T* dO, Segs qsegs,
                                         T* dq, ExactAcc<T>* dkv, int64_t cp, Stream s, loc_t loc = loc_t::current()) {
    return false;
  }
  // attn_core_backward with the key side as tile partials, not sums (model::attn_core_backward_partials): part
  // (nt * S rows of P, nt = qsegs.size() - 1) holds cp blocks of nt * (S / cp) rows, block c the tile partials of the
  // keys of zig-zag gather slots 2c and 2c+1 (cp rank c's keys), tile-major: block c, tile t, key i of the block at row
  // (c * nt + t) * (S / cp) + i; +0 where a tile has no term. So an all-to-all of nt * (S / cp) * P values over cp
  // gives each rank every tile partial of its own keys, and their exact sum (sum_acc over one-row tiles) rounded once
  // is the key side's bits. Returns false, issuing nothing, where the kernel set does not have this op (the default).
  virtual bool attn_core_backward_partials(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq,
                                           const T* kv, int64_t S, const T* o, const T* stats, const T* dO,
                                           Segs qsegs, T* dq, T* part, int64_t cp, Stream s,
                                           loc_t loc = loc_t::current()) {
    return false;
  }
  // Packed sequences: the core under a document mask; qdoc (Nq) each query's document start (device memory).
  virtual void attn_doc_core_forward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos,
                                     const int64_t* qdoc, int64_t Nq, const T* kv, int64_t S, T* o, T* stats,
                                     Stream s, loc_t loc = loc_t::current()) = 0;
  virtual void attn_doc_core_backward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos,
                                      const int64_t* qdoc, int64_t Nq, const T* kv, int64_t S, const T* o,
                                      const T* stats, const T* dO, Segs qsegs, T* dq, ExactAcc<T>* dkv, Stream s,
                                      loc_t loc = loc_t::current()) = 0;
  // DSA (reference/model/attention.h): the indexer's top-k selection, the sparse core, its backward with the
  // indexer loss's gradient. iq (Nq, Hi*Di + Hi); sel (Nq, topk) int32 positions, ascending, -1 padded; qdoc may be
  // null; ikl (Nq) may be null.
  virtual void dsa_select(Policy pol, const CoreDims& cd, const T* iq, const int64_t* qpos, const int64_t* qdoc,
                          int64_t Nq, const T* kv, int64_t S, int32_t* sel, Stream s, loc_t loc = loc_t::current()) = 0;
  virtual void dsa_core_forward(Policy pol, const CoreDims& cd, const T* q, const T* iq, const int64_t* qpos,
                                int64_t Nq, const T* kv, int64_t S, const int32_t* sel, T* o, T* stats, T* ikl,
                                Stream s, loc_t loc = loc_t::current()) = 0;
  virtual void dsa_core_backward(Policy pol, const CoreDims& cd, const T* q, const T* iq, const int64_t* qpos,
                                 int64_t Nq, const T* kv, int64_t S, const int32_t* sel, const T* o, const T* stats,
                                 const T* dO, T iscale, Segs qsegs, T* dq, T* diq, ExactAcc<T>* dkv, Stream s,
                                 loc_t loc = loc_t::current()) = 0;
  virtual void attn_out_forward(Policy pol, const Config& cfg, const AttnW& W, int64_t N, const AttnBufs& acts, T* y,
                                Stream s, loc_t loc = loc_t::current()) = 0;
  virtual void attn_out_backward(Policy pol, const Config& cfg, const AttnW& W, const AttnG& G, int64_t N,
                                 const AttnBufs& acts, const T* dy, Segs segs, T* dO, Stream s,
                                 loc_t loc = loc_t::current()) = 0;
  virtual void attn_qkv_backward(Policy pol, const Config& cfg, const AttnW& W, const AttnG& G, const T* a,
                                 const int64_t* pos, int64_t N, const Rope& rope, const AttnBufs& acts, const T* dqc,
                                 const T* dpayload, Segs segs, T* da, Stream s, loc_t loc = loc_t::current()) = 0;
  // The same two with the projections' gradients written as tile partials into G's send layouts (model::AttnGP; the
  // step's exchange of dense weight gradients, docs/parallel.md section 4). Return false, issuing nothing, where the
  // kernel set does not have them (the default; the step then adds into accumulators, the same bits).
  virtual bool attn_out_backward_partials(Policy pol, const Config& cfg, const AttnW& W, const AttnGP& G, int64_t N,
                                          const AttnBufs& acts, const T* dy, Segs segs, T* dO, Stream s,
                                          loc_t loc = loc_t::current()) {
    return false;
  }
  virtual bool attn_qkv_backward_partials(Policy pol, const Config& cfg, const AttnW& W, const AttnGP& G, const T* a,
                                          const int64_t* pos, int64_t N, const Rope& rope, const AttnBufs& acts,
                                          const T* dqc, const T* dpayload, Segs segs, T* da, Stream s,
                                          loc_t loc = loc_t::current()) {
    return false;
  }

  // ---- loss and optimizer -------------------------------------------------------------------------------------
  // hidden (N,d), W (d,V), targets (N) -> token_loss (N), lse (N).
  virtual void linear_ce_forward(Policy pol, const T* hidden, const T* W, const int32_t* targets, int64_t N, int64_t d,
                                 int64_t V, int64_t vocab_chunk, int64_t token_chunk, T* token_loss, T* lse, Stream s,
                                 loc_t loc = loc_t::current()) = 0;
  // The columns [j_begin, j_end) of the backward (linear_ce_backward_cols): dhidden (N,d) continued in order,
  // dW (d, j_end - j_begin) += tile sums.
  virtual void linear_ce_backward(Policy pol, const T* hidden, const T* W, const int32_t* targets, const T* lse,
                                  int64_t N, int64_t d, int64_t V, int64_t vocab_chunk, int64_t token_chunk,
                                  T grad_scale, Segs segs, int64_t j_begin, int64_t j_end, T* dhidden, ExactAcc<T>* dW,
                                  Stream s, loc_t loc = loc_t::current()) = 0;
  // The same with the columns' dW tile partials written into dW's send layout (model::linear_ce_backward_cols_partials;
  // the step's exchange of lm_head slices as tile partials, docs/parallel.md section 4). Returns false, issuing
  // nothing, where the kernel set does not have it (the default; the step then adds into accumulators, the same bits).
  virtual bool linear_ce_backward_partials(Policy pol, const T* hidden, const T* W, const int32_t* targets,
                                           const T* lse, int64_t N, int64_t d, int64_t V, int64_t vocab_chunk,
                                           int64_t token_chunk, T grad_scale, Segs segs, int64_t j_begin,
                                           int64_t j_end, T* dhidden, const TilePartials<T>& dW, Stream s,
                                           loc_t loc = loc_t::current()) {
    return false;
  }
  // acc += sum of g (n) squared, exactly.
  virtual void grad_sq_acc(const T* g, int64_t n, ExactAcc<double>* acc, Stream s, loc_t loc = loc_t::current()) = 0;
  // w, m, v (n) updated from g (n).
  virtual void adamw_step(T* w, const T* g, T* m, T* v, int64_t n, const model::AdamWHyper& hyper, int64_t step,
                          double clip, bool decay, Stream s, loc_t loc = loc_t::current()) = 0;
  // b (E) from load (E).
  virtual void router_bias_update(T* b, const int64_t* load, int64_t E, double gamma, Stream s,
                                  loc_t loc = loc_t::current()) = 0;
};

// The CPU instance: every kernel is the reference op of the same name (bits of the reference), launched on the
// given stream of `dev` with the byte ranges it reads and writes declared (so the emulator's deferred mode can
// run it later and check the streams' ordering).
template <class T>
class CpuKernels : public Kernels<T> {
 public:
  using typename Kernels<T>::Config;
  using typename Kernels<T>::AttnW;
  using typename Kernels<T>::AttnG;
  using typename Kernels<T>::AttnGP;
  using typename Kernels<T>::AttnBufs;
  using typename Kernels<T>::CoreDims;
  using typename Kernels<T>::Rope;
  using typename Kernels<T>::Segs;
  using typename Kernels<T>::loc_t;
  explicit CpuKernels(Device& dev) : dev_(dev) {}
  void mm(Policy pol, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, bool trans_b,
          T* C, int64_t ldc, Stream s, loc_t loc = loc_t::current()) override;
  bool wgrad_partials(Policy pol, const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M, Segs segs,
                      const TilePartials<T>& out, Stream s, loc_t loc = loc_t::current()) override;
  void wgrad_acc(Policy pol, const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M, Segs segs,
                 ExactAcc<T>* acc, Stream s, loc_t loc = loc_t::current()) override;
  void sum_acc(const T* x, int64_t J, Segs segs, ExactAcc<T>* acc, Stream s, loc_t loc = loc_t::current()) override;
  void exact_round(const ExactAcc<T>* acc, T* out, int64_t n, Stream s, loc_t loc = loc_t::current()) override;
  void embedding_forward(T* out, const int32_t* tokens, const T* embed, int64_t N, int64_t d, int64_t V, Stream s,
                         loc_t loc = loc_t::current()) override;
  bool embedding_backward_partials(const TilePartials<T>& dembed, const int32_t* tokens, const T* dout, int64_t N,
                                   int64_t d, Segs segs, Stream s, loc_t loc = loc_t::current()) override;
  void embedding_backward(ExactAcc<T>* dembed, const int32_t* tokens, const T* dout, int64_t N, int64_t d, Segs segs,
                          Stream s, loc_t loc = loc_t::current()) override;
  void rmsnorm_forward(const T* x, int64_t ldx, const T* g, int64_t N, int64_t d, double eps, T* y, int64_t ldy,
                       T* rinv, Stream s, loc_t loc = loc_t::current()) override;
  void rmsnorm_backward(const T* dy, int64_t lddy, const T* x, int64_t ldx, const T* rinv, const T* g, int64_t N,
                        int64_t d, Segs segs, T* dx, int64_t lddx, ExactAcc<T>* dg, Stream s,
                        loc_t loc = loc_t::current()) override;
  void residual_forward(T* out, const T* a, const T* b, int64_t n, Stream s, loc_t loc = loc_t::current()) override;
  void swiglu_forward(Policy pol, const T* x, const T* wg, const T* wu, const T* wd, int64_t N, int64_t d, int64_t F,
                      T* ug, T* uu, T* h, T* y, Stream s, loc_t loc = loc_t::current()) override;
  void swiglu_backward_dgrad(Policy pol, const T* dy, const T* wg, const T* wu, const T* wd, const T* ug, const T* uu,
                             int64_t N, int64_t d, int64_t F, T* dug, T* duu, T* dx, Stream s,
                             loc_t loc = loc_t::current()) override;
  // The routed experts launch under their own names (traces count them per EP chunk).
  void expert_forward(Policy pol, const T* x, const T* wg, const T* wu, const T* wd, int64_t n, int64_t d, int64_t F,
                      T* ug, T* uu, T* h, T* y, Stream s, loc_t loc = loc_t::current()) override;
  void expert_backward_dgrad(Policy pol, const T* dy, const T* wg, const T* wu, const T* wd, const T* ug, const T* uu,
                             int64_t n, int64_t d, int64_t F, T* dug, T* duu, T* dx, Stream s,
                             loc_t loc = loc_t::current()) override;
  void router_forward(Policy pol, const T* a, const T* wr, const T* bias, int64_t N, int64_t d, int64_t E, int64_t K,
                      double alpha, T* logits, T* scores, int32_t* sel, T* gates, Stream s,
                      loc_t loc = loc_t::current()) override;
  void router_backward(const T* dgates, const T* scores, const int32_t* sel, int64_t N, int64_t E, int64_t K,
                       double alpha, T* dlogits, Stream s, loc_t loc = loc_t::current()) override;
  void moe_combine_forward(T* out, const T* gates, const T* yk, int64_t N, int64_t d, int64_t K, Stream s,
                           loc_t loc = loc_t::current()) override;
  void moe_combine_backward(const T* dout, const T* gates, const T* yk, std::span<const int64_t> tk, int64_t d,
                            int64_t K, T* dgates, T* dyk, Stream s, loc_t loc = loc_t::current()) override;
  void moe_dx_sum(T* dx, const T* dxk, int64_t N, int64_t d, int64_t K, Stream s,
                  loc_t loc = loc_t::current()) override;
  void gather_rows(T* dst, const T* src, std::span<const int64_t> idx, int64_t w, Stream s,
                   loc_t loc = loc_t::current()) override;
  void scatter_rows(T* dst, const T* src, std::span<const int64_t> idx, int64_t w, Stream s,
                    loc_t loc = loc_t::current()) override;
  void attn_qkv_forward(Policy pol, const Config& cfg, const AttnW& W, const T* a, const int64_t* pos, int64_t N,
                        const Rope& rope, const AttnBufs& acts, Stream s, loc_t loc = loc_t::current()) override;
  void kv_zigzag_reorder(T* dst, const T* src, int64_t cp, int64_t block, bool to_gather, Stream s,
                         loc_t loc = loc_t::current()) override;
  void kv_zigzag_to_gather_acc(ExactAcc<T>* x, ExactAcc<T>* scratch, int64_t cp, int64_t block, Stream s,
                               loc_t loc = loc_t::current()) override;
  void attn_core_forward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq, const T* kv,
                         int64_t S, T* o, T* stats, Stream s, loc_t loc = loc_t::current()) override;
  void attn_core_backward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq, const T* kv,
                          int64_t S, const T* o, const T* stats, const T* dO, Segs qsegs, T* dq, ExactAcc<T>* dkv,
                          Stream s, loc_t loc = loc_t::current()) override;
  bool attn_core_backward_gather(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq,
                                 const T* kv, int64_t S, const T* o, const T* stats, const T* dO, Segs qsegs, T* dq,
                                 ExactAcc<T>* dkv, int64_t cp, Stream s, loc_t loc = loc_t::current()) override;
  bool attn_core_backward_partials(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq,
                                   const T* kv, int64_t S, const T* o, const T* stats, const T* dO, Segs qsegs, T* dq,
                                   T* part, int64_t cp, Stream s, loc_t loc = loc_t::current()) override;
  void attn_doc_core_forward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, const int64_t* qdoc,
                             int64_t Nq, const T* kv, int64_t S, T* o, T* stats, Stream s,
                             loc_t loc = loc_t::current()) override;
  void attn_doc_core_backward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, const int64_t* qdoc,
                              int64_t Nq, const T* kv, int64_t S, const T* o, const T* stats, const T* dO, Segs qsegs,
                              T* dq, ExactAcc<T>* dkv, Stream s, loc_t loc = loc_t::current()) override;
  void dsa_select(Policy pol, const CoreDims& cd, const T* iq, const int64_t* qpos, const int64_t* qdoc, int64_t Nq,
                  const T* kv, int64_t S, int32_t* sel, Stream s, loc_t loc = loc_t::current()) override;
  void dsa_core_forward(Policy pol, const CoreDims& cd, const T* q, const T* iq, const int64_t* qpos, int64_t Nq,
                        const T* kv, int64_t S, const int32_t* sel, T* o, T* stats, T* ikl, Stream s,
                        loc_t loc = loc_t::current()) override;
  void dsa_core_backward(Policy pol, const CoreDims& cd, const T* q, const T* iq, const int64_t* qpos, int64_t Nq,
                         const T* kv, int64_t S, const int32_t* sel, const T* o, const T* stats, const T* dO, T iscale,
                         Segs qsegs, T* dq, T* diq, ExactAcc<T>* dkv, Stream s, loc_t loc = loc_t::current()) override;
  void attn_out_forward(Policy pol, const Config& cfg, const AttnW& W, int64_t N, const AttnBufs& acts, T* y, Stream s,
                        loc_t loc = loc_t::current()) override;
  void attn_out_backward(Policy pol, const Config& cfg, const AttnW& W, const AttnG& G, int64_t N, const AttnBufs& acts,
                         const T* dy, Segs segs, T* dO, Stream s, loc_t loc = loc_t::current()) override;
  void attn_qkv_backward(Policy pol, const Config& cfg, const AttnW& W, const AttnG& G, const T* a, const int64_t* pos,
                         int64_t N, const Rope& rope, const AttnBufs& acts, const T* dqc, const T* dpayload, Segs segs,
                         T* da, Stream s, loc_t loc = loc_t::current()) override;
  bool attn_out_backward_partials(Policy pol, const Config& cfg, const AttnW& W, const AttnGP& G, int64_t N,
                                  const AttnBufs& acts, const T* dy, Segs segs, T* dO, Stream s,
                                  loc_t loc = loc_t::current()) override;
  bool attn_qkv_backward_partials(Policy pol, const Config& cfg, const AttnW& W, const AttnGP& G, const T* a,
                                  const int64_t* pos, int64_t N, const Rope& rope, const AttnBufs& acts, const T* dqc,
                                  const T* dpayload, Segs segs, T* da, Stream s,
                                  loc_t loc = loc_t::current()) override;
  void linear_ce_forward(Policy pol, const T* hidden, const T* W, const int32_t* targets, int64_t N, int64_t d,
                         int64_t V, int64_t vocab_chunk, int64_t token_chunk, T* token_loss, T* lse, Stream s,
                         loc_t loc = loc_t::current()) override;
  bool linear_ce_backward_partials(Policy pol, const T* hidden, const T* W, const int32_t* targets, const T* lse,
                                   int64_t N, int64_t d, int64_t V, int64_t vocab_chunk, int64_t token_chunk,
                                   T grad_scale, Segs segs, int64_t j_begin, int64_t j_end, T* dhidden,
                                   const TilePartials<T>& dW, Stream s, loc_t loc = loc_t::current()) override;
  void linear_ce_backward(Policy pol, const T* hidden, const T* W, const int32_t* targets, const T* lse, int64_t N,
                          int64_t d, int64_t V, int64_t vocab_chunk, int64_t token_chunk, T grad_scale, Segs segs,
                          int64_t j_begin, int64_t j_end, T* dhidden, ExactAcc<T>* dW, Stream s,
                          loc_t loc = loc_t::current()) override;
  void grad_sq_acc(const T* g, int64_t n, ExactAcc<double>* acc, Stream s, loc_t loc = loc_t::current()) override;
  void adamw_step(T* w, const T* g, T* m, T* v, int64_t n, const model::AdamWHyper& hyper, int64_t step, double clip,
                  bool decay, Stream s, loc_t loc = loc_t::current()) override;
  void router_bias_update(T* b, const int64_t* load, int64_t E, double gamma, Stream s,
                          loc_t loc = loc_t::current()) override;

 protected:
  Device& dev_;
};

extern template class CpuKernels<float>;
extern template class CpuKernels<double>;

}  // namespace trident
