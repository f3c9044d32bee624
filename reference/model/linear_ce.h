// Linear cross-entropy: LM head + cross-entropy in token and vocabulary chunks, never materialising the
// N x V logits (docs/optimizer_and_loss.md, "Linear cross-entropy and optimizer", which states every rounding).
//
// Per row i (T = double for the fp64 policy, float for fp32 and bf16):
//   logits  l[i, j] = in-order dot of row i of hidden with column j of W (the batch-invariant gemm order);
//                     bf16: both operands rounded to bf16 first (products exact in fp32).
//   LSE     vocab chunks c = 0, 1, ... of `vocab_chunk` columns (the last may be shorter), ascending:
//             m_c = max over the chunk; s_c = sum over j ascending of dm::exp(l - m_c), from +0;
//             running (M, S): first chunk (M, S) = (m_c, s_c); then
//               if m_c > M: S = S * dm::exp(M - m_c) + s_c;  M = m_c
//               else:       S = S + s_c * dm::exp(m_c - M)
//           lse = M + dm::log(S).
//   loss    token_loss[i] = lse[i] - l[i, target[i]]   (0 for target == -100; lse is still computed).
//   grad    p = dm::exp(l - lse); dlogit = (p - [j == target]) * grad_scale  (a whole 0 row when ignored);
//           bf16: dlogit rounded to bf16 as a GEMM operand.
//           dhidden[i, k] = in-order sum over ALL j = 0..V-1 of round(dlogit[i, j] * W[k, j]) (one sequential
//           sum across the vocabulary chunks: independent of vocab_chunk given dlogit); 0 rows when ignored.
//           dW[k, j] += tile reduction over the rows (segs) of hidden[i, k] * dlogit[i, j] (tile_wgrad_acc
//           semantics: in-tile in-order sum in T, exact merge), left unrounded in dW_acc.
// Everything is per row except dW, and dW is computed over whole tiles, so all results are bitwise
// independent of token_chunk (and of the OpenMP thread count). vocab_chunk is part of the numerics (it
// changes the LSE merge order): it belongs to the model config.
//
// Memory: scratch per thread O(min(token_chunk, N/threads) * vocab_chunk + d * vocab_chunk) values (plus
// d * vocab_chunk thread-local dW accumulators in the backward when threads > 1); never N x V.
#pragma once
#include <cstdint>
#include <span>

#include "reference/exact_acc.h"
#include "reference/tile_reduce.h"
#include "reference/policy.h"

namespace trident::model {

inline constexpr int32_t kIgnoreIndex = -100;

// hidden: (N, d) final-normed hidden; W: (d, V) lm_head; targets: (N) int32 in [0, V) or -100 (ignored).
// Outputs token_loss (N) (0 where ignored) and lse (N) (computed for every row).
// Throws trident::Error for a target outside [0, V) other than -100, or a policy that does not match T.
template <class T>
void linear_ce_forward(const T* hidden, const T* W, const int32_t* targets, int64_t N, int64_t d, int64_t V,
                       int64_t vocab_chunk, Policy policy, int64_t token_chunk, T* token_loss /*(N)*/,
                       T* lse /*(N)*/);

// lse: (N) from linear_ce_forward. grad_scale: 1 / (number of valid targets of the global batch).
// segs: tile segments of the N rows (segs.front() == 0, segs.back() == N, non-decreasing).
// Writes dhidden (N, d) (rows of ignored targets are +0) and ADDS the unrounded dW tile sums into
// dW_acc (d, V) (the caller merges across ranks and rounds). Backward token chunks are rounded up to whole
// tiles (a tile's in-tile sum is never split), so a tile longer than token_chunk is processed whole.
template <class T>
void linear_ce_backward(const T* hidden, const T* W, const int32_t* targets, const T* lse, int64_t N, int64_t d,
                        int64_t V, int64_t vocab_chunk, Policy policy, int64_t token_chunk, T grad_scale,
                        std::span<const int64_t> segs, T* dhidden /*(N,d)*/, ExactAcc<T>* dW_acc /*(d,V)*/);

// The backward restricted to the vocabulary columns [j_begin, j_end), made of whole vocab chunks (j_begin a
// multiple of vocab_chunk; j_end one too, or V). ADDS the columns' dW tile sums into dW_acc (d, j_end - j_begin)
// (row stride j_end - j_begin) and continues dhidden's in-order sum over j: from the first product when
// j_begin == 0, else accumulating onto the dhidden the call for the preceding columns left; ignored rows are
// zeroed by the call whose j_end == V. Calls for consecutive column ranges covering [0, V) in ascending order
// give exactly linear_ce_backward's bits (which is this call with [0, V)), so a caller can merge, round and
// free the dW of one range before computing the next (the distributed step's vocabulary slices).
template <class T>
void linear_ce_backward_cols(const T* hidden, const T* W, const int32_t* targets, const T* lse, int64_t N, int64_t d,
                             int64_t V, int64_t vocab_chunk, Policy policy, int64_t token_chunk, T grad_scale,
                             std::span<const int64_t> segs, int64_t j_begin, int64_t j_end, T* dhidden /*(N,d)*/,
                             ExactAcc<T>* dW_acc /*(d, j_end - j_begin)*/);

// linear_ce_backward_cols with the columns' dW rounded and WRITTEN into dW (d, j_end - j_begin) (row stride
// j_end - j_begin): the bits of linear_ce_backward_cols into zeroed accumulators and exact_round, for a caller whose
// one call is the whole gradient of those columns (the single-rank reference's head). With at most 32 tiles, each
// vocab chunk's tile partials are summed and rounded in cache (no accumulator array); with more, through a
// temporary accumulator array.
template <class T>
void linear_ce_backward_cols_round(const T* hidden, const T* W, const int32_t* targets, const T* lse, int64_t N,
                                   int64_t d, int64_t V, int64_t vocab_chunk, Policy policy, int64_t token_chunk,
                                   T grad_scale, std::span<const int64_t> segs, int64_t j_begin, int64_t j_end,
                                   T* dhidden /*(N,d)*/, T* dW /*(d, j_end - j_begin)*/);

// linear_ce_backward_cols with the columns' dW tile partials WRITTEN into dW's send layout (reference/tile_reduce.h
// TilePartials: rows of j_end - j_begin columns, at least d rows; segs' tiles, at most 32): the partials whose exact
// sum is linear_ce_backward_cols' dW (the distributed step's exchange of lm_head slices as tile partials).
template <class T>
void linear_ce_backward_cols_partials(const T* hidden, const T* W, const int32_t* targets, const T* lse, int64_t N,
                                      int64_t d, int64_t V, int64_t vocab_chunk, Policy policy, int64_t token_chunk,
                                      T grad_scale, std::span<const int64_t> segs, int64_t j_begin, int64_t j_end,
                                      T* dhidden /*(N,d)*/, const TilePartials<T>& dW);

// Forward and backward in one pass over the vocabulary per token chunk (3 GEMMs instead of 4: the logits of
// a token chunk are kept for all V columns, token_chunk x V values, then turned into dlogit in place).
// Bitwise identical to linear_ce_forward followed by linear_ce_backward with the same arguments (tested).
// Scratch: (token_chunk rounded up to whole tiles) x V values; choose token_chunk accordingly.
template <class T>
void linear_ce_fused(const T* hidden, const T* W, const int32_t* targets, int64_t N, int64_t d, int64_t V,
                     int64_t vocab_chunk, Policy policy, int64_t token_chunk, T grad_scale,
                     std::span<const int64_t> segs, T* token_loss /*(N)*/, T* lse /*(N)*/, T* dhidden /*(N,d)*/,
                     ExactAcc<T>* dW_acc /*(d,V)*/);

// Number of rows whose target is not -100 (the local share of N_valid; the global count is a sum over ranks).
int64_t count_valid_targets(const int32_t* targets, int64_t N);

}  // namespace trident::model
