// Per-token ops of the reference model and their manual backward passes (docs/model.md "Ops").
//
// llm.c style: free functions over raw pointers with shape comments; the GPU path will share names and
// argument order (STYLE.md habit 1). T is double (fp64 policy) or float (fp32 and bf16 policies).
//
// Rules every op follows (the distributed step depends on them):
//  - Tokens are an explicit row list: N rows, each with a global position; tile segments `segs` group the
//    rows into reduction tiles (T consecutive positions of one sequence, rows of a tile contiguous and in
//    position order). Nothing per row depends on N or on other rows.
//  - Every cross-token reduction goes into ExactAcc<T> arrays via tile partials (tile_sum_acc /
//    tile_wgrad_acc or the same scheme written out); accumulators are never rounded here.
//  - bf16 policy: every GEMM operand (both of them, including weight-gradient GEMMs) is rounded with
//    round_bf16 first; accumulation fp32. Norms, rope, softmax, activations: fp32.
//  - Each op function is an op-profile section (reference/profile.h: gemm for mm, tile_reduce for the tile sums,
//    ...): it only reads the clock, and only when the profile is on.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "reference/exact_acc.h"
#include "reference/policy.h"
#include "reference/tile_reduce.h"

namespace trident::model {

// The token rows of one call. Rows are grouped in reduction tiles: segs[i]..segs[i+1]-1 are tile i
// (one sequence, consecutive positions, ascending). seq/pos give each row's sequence and global position.
struct TokenRows {
  int64_t n = 0;
  std::vector<int64_t> seq;   // (N)
  std::vector<int64_t> pos;   // (N)
  std::vector<int64_t> segs;  // (n_tiles + 1), segs[0] = 0, segs.back() = N
  // Packed sequences: (N) global position of the first token of the row's document (attention masks keys outside
  // [doc, pos]; RoPE uses pos - doc). Empty: one document per sequence (doc = 0 for every row).
  std::vector<int64_t> doc;
  // B whole sequences of S tokens, sequence-major; tiles of T positions (the last of a sequence may be short).
  static TokenRows contiguous(int64_t B, int64_t S, int64_t T);
  // Runs of rows that belong to one sequence: [(seq, row_begin, row_end)], in row order.
  struct Run { int64_t seq, begin, end; };
  std::vector<Run> sequence_runs() const;
  // Segments of the rows [begin, end), rebased to begin (tiles must not straddle the range).
  std::vector<int64_t> segs_in(int64_t begin, int64_t end) const;
};

// ---- GEMM helpers with the policy's operand rounding ---------------------------------------------------
// C (M,N) ldc = A (M,K) lda @ op(B); op(B)(k,n) = B[k*ldb+n] or, if trans_b, B[n*ldb+k]. batch-invariant.
template <class T>
void mm(Policy pol, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, bool trans_b,
        T* C, int64_t ldc);
// acc (K,M) += X^T dY over the rows of segs (tile partials, exact merge). X: (rows, K) ldx; dY: (rows, M) ldy.
template <class T>
void wgrad_acc(Policy pol, const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M,
               std::span<const int64_t> segs, ExactAcc<T>* acc);
// Same, into a block of a larger accumulator: acc rows of stride ld_acc (used for per-head blocks).
template <class T>
void wgrad_acc_block(Policy pol, const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M,
                     std::span<const int64_t> segs, ExactAcc<T>* acc, int64_t ld_acc);
// dW (K,M) = round(exact sum of the tile partials of X^T dY): the bits of zeroed accumulators, wgrad_acc and one
// rounding, for a tensor whose only contribution this is; the accumulators are formed and rounded in cache
// (tile_wgrad). No rows: dW = +0.
template <class T>
void wgrad_round(Policy pol, const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M,
                 std::span<const int64_t> segs, T* dW);
// The tile partials of X^T dY (K,M) written to out (reference/tile_reduce.h TilePartials) instead of added into
// accumulators: element k * ld + m (plus out.off) of the tensor. Their exact sum is wgrad_acc's (the same partials).
template <class T>
void wgrad_partials(Policy pol, const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M,
                    std::span<const int64_t> segs, const TilePartials<T>& out, int64_t ld);
// wgrad_acc and wgrad_acc_block with a partial buffer in place of the accumulators (code that takes either view of a
// gradient, as the attention backward does, calls one name).
template <class T>
void wgrad_acc(Policy pol, const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M,
               std::span<const int64_t> segs, const TilePartials<T>& out) {
  wgrad_partials<T>(pol, X, ldx, dY, ldy, K, M, segs, out, M);
}
template <class T>
void wgrad_acc_block(Policy pol, const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M,
                     std::span<const int64_t> segs, const TilePartials<T>& out, int64_t ld) {
  wgrad_partials<T>(pol, X, ldx, dY, ldy, K, M, segs, out, ld);
}
// acc (J) += sum over rows of x (rows, J) (tile partials, exact merge).
template <class T>
void sum_acc(const T* x, int64_t J, std::span<const int64_t> segs, ExactAcc<T>* acc);

// ---- embedding ---------------------------------------------------------------------------------------
// out (N,d) = embed[tokens[r]]; throws on a token id outside [0, V).
template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* embed, int64_t N, int64_t d, int64_t V);
// dembed (V,d) += per tile: in-order (row order) scatter-add of dout rows by token id in T, then each
// touched id's partial row added exactly. A row whose id is negative contributes nothing: a caller that
// produces the table's gradient in row slices passes, per slice, each row's slot in the slice's accumulator
// (or -1), and gets each id's bits unchanged (an id's partial only ever sums that id's rows).
template <class T>
void embedding_backward(ExactAcc<T>* dembed, const int32_t* tokens, const T* dout, int64_t N, int64_t d,
                        std::span<const int64_t> segs);
// The same sums rounded and WRITTEN into dembed (V, d), every row (+0 where no token has its id): the bits of zeroed
// accumulators, embedding_backward and exact_round, without a (V, d) accumulator array (the single-rank reference,
// whose one call is the whole gradient). An id >= V is an error.
template <class T>
void embedding_backward_round(T* dembed, const int32_t* tokens, const T* dout, int64_t N, int64_t d, int64_t V,
                              std::span<const int64_t> segs);
// embedding_backward's (tile, id) partials written into dembed's send layout (reference/tile_reduce.h TilePartials,
// rows of d values; row `id` of the table or slice) instead of added: every other (row, tile) place is +0 (the whole
// buffer is written). Their exact sum per row is embedding_backward's.
template <class T>
void embedding_backward_partials(const TilePartials<T>& dembed, const int32_t* tokens, const T* dout, int64_t N,
                                 int64_t d, std::span<const int64_t> segs);

// ---- RMSNorm: y = (x * rinv) * g, rinv = rsqrt(sum_i(x_i*x_i)/d + eps), sum ascending i --------------
template <class T>
void rmsnorm_forward(const T* x, int64_t ldx, const T* g, int64_t N, int64_t d, double eps, T* y, int64_t ldy,
                     T* rinv /*(N)*/);
// xhat = x*rinv; dg += tile sums of (dy*xhat); dxh = dy*g; c = (sum_i dxh_i*xhat_i)/d (ascending i);
// dx = rinv * (dxh - xhat*c).  dx written (not accumulated). dg may be null (no gain gradient wanted).
template <class T>
void rmsnorm_backward(const T* dy, int64_t lddy, const T* x, int64_t ldx, const T* rinv, const T* g, int64_t N,
                      int64_t d, std::span<const int64_t> segs, T* dx, int64_t lddx, ExactAcc<T>* dg /*(d)*/);

// ---- RoPE (half-split) ----------------------------------------------------------------------------------
// Tables in fp64: inv_freq_i = dm::pow(theta, -(2i)/D), angle = p * inv_freq_i, cos/sin = dm::cos/sin,
// then rounded to T. (max_pos, D/2) each.
template <class T>
struct RopeTable {
  int64_t D = 0, max_pos = 0;
  std::vector<T> cos, sin;
};
template <class T>
RopeTable<T> rope_table(int64_t max_pos, int64_t D, double theta);
// In place on x[r*ldx + h*head_stride + 0..D-1] for h < n_heads:
//   u'[i] = u[i]*c - u[i+D/2]*s;  u'[i+D/2] = u[i+D/2]*c + u[i]*s   (each product rounded, then the add)
template <class T>
void rope_forward(T* x, int64_t ldx, int64_t n_heads, int64_t head_stride, const int64_t* pos, int64_t N,
                  const RopeTable<T>& tab);
// Transpose: du[i] = du'[i]*c + du'[i+D/2]*s;  du[i+D/2] = du'[i+D/2]*c - du'[i]*s
template <class T>
void rope_backward(T* dx, int64_t ldx, int64_t n_heads, int64_t head_stride, const int64_t* pos, int64_t N,
                   const RopeTable<T>& tab);

// ---- SwiGLU FFN (dense MLP, each expert, shared expert) -------------------------------------------------
// ug = x Wg; uu = x Wu; h = silu(ug) * uu; y = h Wd.
template <class T>
void swiglu_forward(Policy pol, const T* x /*(N,d)*/, const T* wg /*(d,F)*/, const T* wu /*(d,F)*/,
                    const T* wd /*(F,d)*/, int64_t N, int64_t d, int64_t F, T* ug /*(N,F)*/, T* uu /*(N,F)*/,
                    T* h /*(N,F)*/, T* y /*(N,d)*/);
// dgrad only: dh = dy Wd^T; sg = sigmoid(ug); dug = dh*uu*(sg*(1 + ug*(1-sg))); duu = dh*silu(ug);
// dx = (dug Wg^T) + (duu Wu^T).
template <class T>
void swiglu_backward_dgrad(Policy pol, const T* dy /*(N,d)*/, const T* wg, const T* wu, const T* wd,
                           const T* ug, const T* uu, int64_t N, int64_t d, int64_t F, T* dug /*(N,F)*/,
                           T* duu /*(N,F)*/, T* dx /*(N,d)*/);
// wgrad (may be delayed): dwg += x^T dug; dwu += x^T duu; dwd += h^T dy (over the tiles of segs).
template <class T>
void swiglu_backward_wgrad(Policy pol, const T* x, const T* h, const T* dy, const T* dug, const T* duu,
                           int64_t d, int64_t F, std::span<const int64_t> segs, ExactAcc<T>* dwg,
                           ExactAcc<T>* dwu, ExactAcc<T>* dwd);
// The same three sums rounded into gradients (wgrad_round): dwg = x^T dug, dwu = x^T duu, dwd = h^T dy.
template <class T>
void swiglu_backward_wgrad_round(Policy pol, const T* x, const T* h, const T* dy, const T* dug, const T* duu,
                                 int64_t d, int64_t F, std::span<const int64_t> segs, T* dwg, T* dwu, T* dwd);

// ---- router ---------------------------------------------------------------------------------------------
// logits = a Wr (N,E); s = sigmoid(logits); select K experts by s + b (descending; ties to the lower index),
// stored ascending in sel (N,K); ssum = sum of selected s in ascending e; gates = (alpha * s_e) / ssum.
template <class T>
void router_forward(Policy pol, const T* a /*(N,d)*/, const T* wr /*(d,E)*/, const T* bias /*(E)*/, int64_t N,
                    int64_t d, int64_t E, int64_t K, double alpha, T* logits /*(N,E)*/, T* scores /*(N,E)*/,
                    int32_t* sel /*(N,K)*/, T* gates /*(N,K)*/);
// dgates (N,K) -> dlogits (N,E) (zero for unselected experts):
//   ssum as forward; c = sum_k dgate_k * s_k (ascending); ds_e = (alpha * (dgate_e - c/ssum)) / ssum;
//   dlogit_e = ds_e * (s_e * (1 - s_e)).
template <class T>
void router_backward(const T* dgates, const T* scores, const int32_t* sel, int64_t N, int64_t E, int64_t K,
                     double alpha, T* dlogits);

}  // namespace trident::model
