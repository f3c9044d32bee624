// Linear cross-entropy (reference/model/linear_ce.h; every rounding point: docs/optimizer_and_loss.md).
//
// Loop structure (none of it changes a bit; see the header for the per-element definitions):
//   forward : one OpenMP region; each thread takes blocks of rows and walks all vocab chunks in ascending order
//             (the LSE merge order) with the block's running (M, S, target logit): no barrier.
//   backward: one OpenMP region; thread t owns a contiguous range of whole tiles; vocab chunks outer (dhidden
//             continues its one in-order sum chunk by chunk: gemm_serial accumulate), token chunks inner; the dW
//             tile sums of a chunk go into a thread-local accumulator block, merged exactly into dW_acc under a
//             critical section (exact merges: the partition and the merge order cannot change a bit).
//   fused   : token chunks (whole tiles) outer; the chunk's logits are kept for all V columns.
// Nothing is split along an inexact reduction, so results do not depend on the thread count.
#include "reference/model/linear_ce.h"

#include <omp.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "reference/bf16.h"
#include "reference/check.h"
#include "reference/dmath.h"
#include "reference/gemm.h"
#include "reference/profile.h"
#include "reference/tile_reduce.h"

namespace trident::model {
namespace {

template <class T>
void check_common(const char* fn, int64_t N, int64_t d, int64_t V, int64_t vocab_chunk, Policy policy,
                  int64_t token_chunk) {
  TD_CHECK_GE(N, 0, "{}: N", fn);
  TD_CHECK_GT(d, 0, "{}: d", fn);
  TD_CHECK_GT(V, 0, "{}: V", fn);
  TD_CHECK_GT(vocab_chunk, 0, "{}: vocab_chunk", fn);
  TD_CHECK_GT(token_chunk, 0, "{}: token_chunk", fn);
  if constexpr (std::is_same_v<T, double>)
    TD_CHECK(policy == Policy::fp64, "{}: double data needs the fp64 policy, got {}", fn, to_string(policy));
  else
    TD_CHECK(policy != Policy::fp64, "{}: float data needs the fp32 or bf16 policy, got fp64", fn);
}

void check_targets(const char* fn, const int32_t* targets, int64_t N, int64_t V) {
  for (int64_t i = 0; i < N; ++i) {
    const int32_t t = targets[i];
    if (t != kIgnoreIndex && (t < 0 || t >= V))
      fail(fmt::format("{}: target {} at row {} is out of range [0, {}) (and not the ignore index {})", fn, t, i, V,
                       kIgnoreIndex));
  }
}

void check_segs(const char* fn, std::span<const int64_t> segs, int64_t N) {
  TD_CHECK(!segs.empty(), "{}: segs must hold n_tiles + 1 offsets", fn);
  TD_CHECK_EQ(segs.front(), static_cast<int64_t>(0), "{}: segs must start at row 0", fn);
  TD_CHECK_EQ(segs.back(), N, "{}: segs must end at row N", fn);
  for (size_t i = 1; i < segs.size(); ++i)
    TD_CHECK_LE(segs[i - 1], segs[i], "{}: segment offsets must be non-decreasing (at {})", fn, i);
}

// Token chunks for the backward: consecutive whole tiles, at least `token_chunk` rows unless the rows run
// out. Returns indices into segs: chunk q covers tiles [cuts[q], cuts[q+1]).
std::vector<size_t> tile_chunks(std::span<const int64_t> segs, int64_t token_chunk) {
  std::vector<size_t> cuts{0};
  const size_t n_tiles = segs.size() - 1;
  size_t t = 0;
  while (t < n_tiles) {
    const int64_t start = segs[t];
    while (t < n_tiles && segs[t] - start < token_chunk) ++t;
    cuts.push_back(t);
  }
  return cuts;
}

// dst (rows, cols) contiguous = round_bf16(src (rows, cols) row stride lds).
void round_rows(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst) {
#pragma omp parallel for schedule(static) if (rows * cols >= 65536)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = round_bf16(src[r * lds + c]);
}

// GEMM operands for one vocab chunk [j0, j0 + w): B = W columns (d, w) with row stride ldb.
template <class T>
struct WChunk {
  const T* B;
  int64_t ldb;
};
template <class T>
WChunk<T> w_chunk(const T* W, int64_t d, int64_t V, int64_t j0, int64_t w, bool bf16, std::vector<T>& buf) {
  if constexpr (std::is_same_v<T, float>) {
    if (bf16) {
      round_rows(W + j0, V, d, w, buf.data());  // the chunk of W rounded once per use
      return {buf.data(), w};
    }
  }
  return {W + j0, V};
}

// Row operands for rows [r0, r0 + rows): hidden (rows, d) row stride d.
template <class T>
const T* h_rows(const T* hidden, int64_t d, int64_t r0, int64_t rows, bool bf16, std::vector<T>& buf) {
  if constexpr (std::is_same_v<T, float>) {
    if (bf16) {
      round_rows(hidden + r0 * d, d, rows, d, buf.data());
      return buf.data();
    }
  }
  return hidden + r0 * d;
}

// The calling thread's buffer of at least n elements for lse_update's exponentials (kept across calls).
template <class T>
std::vector<T>& exp_scratch(int64_t n) {
  static thread_local std::vector<T> v;
  if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
  return v;
}

// Online LSE: merge the chunk [j0, j0 + w) of each row's logits L (rows, w) row stride ldl into (M, S); record
// the target logit when the target falls in the chunk.
template <class T>
void lse_update(const T* L, int64_t ldl, int64_t rows, int64_t j0, int64_t w, const int32_t* targets, T* M, T* S,
                T* tl, bool first) {
  std::vector<T>& e = exp_scratch<T>(w);
  for (int64_t r = 0; r < rows; ++r) {
    const T* l = L + r * ldl;
    T m = l[0];
    for (int64_t j = 1; j < w; ++j) m = l[j] > m ? l[j] : m;
    for (int64_t j = 0; j < w; ++j) e[static_cast<size_t>(j)] = l[j] - m;
    dm::exp_n(e.data(), e.data(), w);  // exp's bits, many elements at once
    T s = T(0);
    for (int64_t j = 0; j < w; ++j) s = s + e[static_cast<size_t>(j)];  // vocabulary order
    if (first) {
      M[r] = m;
      S[r] = s;
    } else if (m > M[r]) {
      S[r] = S[r] * dm::exp(M[r] - m) + s;
      M[r] = m;
    } else {
      S[r] = S[r] + s * dm::exp(m - M[r]);
    }
    const int64_t t = targets[r];
    if (t >= j0 && t < j0 + w) tl[r] = l[t - j0];
  }
}

// Final per-row values: lse = M + log(S); loss = lse - target logit (0 when ignored).
template <class T>
void lse_finish(int64_t rows, const int32_t* targets, const T* M, const T* S, const T* tl, T* lse, T* loss) {
  for (int64_t r = 0; r < rows; ++r) {
    lse[r] = M[r] + dm::log(S[r]);
    loss[r] = targets[r] == kIgnoreIndex ? T(0) : lse[r] - tl[r];
  }
}

// In place: L (rows, w) row stride ldl, logits of columns [j0, j0 + w) -> dlogit (bf16: rounded to bf16).
template <class T>
void to_dlogit(T* L, int64_t ldl, int64_t rows, int64_t j0, int64_t w, const int32_t* targets, const T* lse,
               T grad_scale, bool bf16) {
  for (int64_t r = 0; r < rows; ++r) {
    T* l = L + r * ldl;
    const int64_t t = targets[r];
    if (t == kIgnoreIndex) {
      for (int64_t j = 0; j < w; ++j) l[j] = T(0);
      continue;
    }
    const T z = lse[r];
    for (int64_t j = 0; j < w; ++j) l[j] = l[j] - z;
    dm::exp_n(l, l, w);  // p, exp's bits
    for (int64_t j = 0; j < w; ++j) l[j] = (j0 + j == t ? l[j] - T(1) : l[j]) * grad_scale;
    if constexpr (std::is_same_v<T, float>)
      if (bf16)
        for (int64_t j = 0; j < w; ++j) l[j] = round_bf16(l[j]);
  }
}

// Rows per unit of OpenMP work in the per-row phases (a multiple of the gemm micro-tile height).
constexpr int64_t kRowBlock = 48;

template <class T>
void lse_update_par(const T* L, int64_t ldl, int64_t rows, int64_t j0, int64_t w, const int32_t* targets, T* M,
                    T* S, T* tl, bool first) {
  const int64_t nb = (rows + kRowBlock - 1) / kRowBlock;
#pragma omp parallel for schedule(static) if (nb > 1 && rows * w >= 32768)
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t r = b * kRowBlock, n = std::min(kRowBlock, rows - r);
    lse_update<T>(L + r * ldl, ldl, n, j0, w, targets + r, M + r, S + r, tl + r, first);
  }
}
template <class T>
void to_dlogit_par(T* L, int64_t ldl, int64_t rows, int64_t j0, int64_t w, const int32_t* targets, const T* lse,
                   T grad_scale, bool bf16) {
  const int64_t nb = (rows + kRowBlock - 1) / kRowBlock;
#pragma omp parallel for schedule(static) if (nb > 1 && rows * w >= 32768)
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t r = b * kRowBlock, n = std::min(kRowBlock, rows - r);
    to_dlogit<T>(L + r * ldl, ldl, n, j0, w, targets + r, lse + r, grad_scale, bf16);
  }
}

// dh (rows, d) row stride d (+)= dlogit (rows, w) ldl @ B^T, B = (d, w) row stride ldb (i.e. W columns):
// dh[i, k] continues its in-order sum over the chunk's columns (gemm_serial accumulate; first: from +0).
template <class T>
void dhidden_acc(const T* DL, int64_t ldl, int64_t rows, int64_t w, const WChunk<T>& B, int64_t d, T* dh,
                 bool first) {
  constexpr int64_t kRB = 96, kCB = 128;
  const int64_t nrb = (rows + kRB - 1) / kRB, ncb = (d + kCB - 1) / kCB;
#pragma omp parallel for schedule(static) if (nrb * ncb > 1 && rows * w * d >= 262144)
  for (int64_t b = 0; b < nrb * ncb; ++b) {
    const int64_t r0 = (b / ncb) * kRB, c0 = (b % ncb) * kCB;
    const int64_t mr = std::min(kRB, rows - r0), nc = std::min(kCB, d - c0);
    gemm_serial<T>(mr, nc, w, DL + r0 * ldl, ldl, 1, B.B + c0 * B.ldb, B.ldb, /*trans_b=*/true, dh + r0 * d + c0, d,
                   /*accumulate=*/!first);
  }
}

// Segments of tiles [t0, t1) rebased to row segs[t0].
std::vector<int64_t> rebased(std::span<const int64_t> segs, size_t t0, size_t t1) {
  std::vector<int64_t> s(segs.begin() + static_cast<ptrdiff_t>(t0), segs.begin() + static_cast<ptrdiff_t>(t1) + 1);
  const int64_t base = s.front();
  for (int64_t& x : s) x -= base;
  return s;
}

void zero_ignored_rows(const int32_t* targets, int64_t N, int64_t d, float* dh) {
  for (int64_t i = 0; i < N; ++i)
    if (targets[i] == kIgnoreIndex) std::fill(dh + i * d, dh + (i + 1) * d, 0.0f);
}
void zero_ignored_rows(const int32_t* targets, int64_t N, int64_t d, double* dh) {
  for (int64_t i = 0; i < N; ++i)
    if (targets[i] == kIgnoreIndex) std::fill(dh + i * d, dh + (i + 1) * d, 0.0);
}

}  // namespace

int64_t count_valid_targets(const int32_t* targets, int64_t N) {
  int64_t n = 0;
  for (int64_t i = 0; i < N; ++i) n += targets[i] != kIgnoreIndex ? 1 : 0;
  return n;
}

template <class T>
void linear_ce_forward(const T* hidden, const T* W, const int32_t* targets, int64_t N, int64_t d, int64_t V,
                       int64_t vocab_chunk, Policy policy, int64_t token_chunk, T* token_loss, T* lse) {
  prof::OpSection prof_section(prof::Op::lce_fwd);
  check_common<T>("linear_ce_forward", N, d, V, vocab_chunk, policy, token_chunk);
  check_targets("linear_ce_forward", targets, N, V);
  if (N == 0) return;
  const bool bf16 = policy == Policy::bf16;
  const int64_t vc = std::min(vocab_chunk, V);
  // Rows outer, vocab chunks inner: a row block walks all vocab chunks in ascending order with its own running
  // (M, S), so the whole forward is one OpenMP region without barriers. bf16 rounds the W chunk per row block
  // (larger blocks keep that cost ~1% of the GEMM).
  const int64_t rb = std::min(bf16 ? 4 * kRowBlock : kRowBlock, std::min(token_chunk, N));
  const int64_t nb = (N + rb - 1) / rb;
#pragma omp parallel if (nb > 1 && N * V * d >= 262144)
  {
    std::vector<T> L(static_cast<size_t>(rb * vc)), M(static_cast<size_t>(rb)), S(static_cast<size_t>(rb)),
        tl(static_cast<size_t>(rb));
    std::vector<T> hbuf(bf16 ? static_cast<size_t>(rb * d) : 0), wbuf(bf16 ? static_cast<size_t>(d * vc) : 0);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t r0 = b * rb, n = std::min(rb, N - r0);
      const T* A = h_rows<T>(hidden, d, r0, n, bf16, hbuf);
      std::fill(tl.begin(), tl.end(), T(0));
      for (int64_t j0 = 0; j0 < V; j0 += vc) {  // ascending vocab chunks: the LSE merge order
        const int64_t w = std::min(vc, V - j0);
        const WChunk<T> B = w_chunk<T>(W, d, V, j0, w, bf16, wbuf);
        gemm_serial<T>(n, w, d, A, d, 1, B.B, B.ldb, false, L.data(), w, false);
        lse_update<T>(L.data(), w, n, j0, w, targets + r0, M.data(), S.data(), tl.data(), j0 == 0);
      }
      lse_finish<T>(n, targets + r0, M.data(), S.data(), tl.data(), lse + r0, token_loss + r0);
    }
  }
}

template <class T>
void linear_ce_backward(const T* hidden, const T* W, const int32_t* targets, const T* lse, int64_t N, int64_t d,
                        int64_t V, int64_t vocab_chunk, Policy policy, int64_t token_chunk, T grad_scale,
                        std::span<const int64_t> segs, T* dhidden, ExactAcc<T>* dW_acc) {
  linear_ce_backward_cols<T>(hidden, W, targets, lse, N, d, V, vocab_chunk, policy, token_chunk, grad_scale, segs, 0,
                             V, dhidden, dW_acc);
}

namespace {

// Tiles up to which linear_ce_backward_cols_round sums each vocab chunk's tile partials in cache (one group of
// tile_sum_round): a partial buffer of n_tiles x d x vocab_chunk values; with more tiles, accumulators.
constexpr int64_t kDirectTiles = 32;

// linear_ce_backward_cols into dW_acc (added) or, with dW_acc null, rounded into dW (at most kDirectTiles tiles).
template <class T>
void lce_backward_impl(const T* hidden, const T* W, const int32_t* targets, const T* lse, int64_t N, int64_t d,
                       int64_t V, int64_t vocab_chunk, Policy policy, int64_t token_chunk, T grad_scale,
                       std::span<const int64_t> segs, int64_t j_begin, int64_t j_end, T* dhidden, ExactAcc<T>* dW_acc,
                       T* dW, const TilePartials<T>* dW_part = nullptr) {
  const bool bf16 = policy == Policy::bf16, direct = dW_acc == nullptr;
  const int64_t vc = std::min(vocab_chunk, V), ldw = j_end - j_begin;
  const size_t n_tiles = segs.size() - 1;
  // Direct: every tile's partials of the current vocab chunk (tile t at P + t * d * w), then summed per element and
  // rounded; empty tiles' partials are +0 (they add nothing).
  std::vector<T> P(direct ? n_tiles * static_cast<size_t>(d * vc) : 0);
  std::vector<int64_t> one_row(direct ? n_tiles + 1 : 0);
  for (size_t t = 0; t < one_row.size(); ++t) one_row[t] = static_cast<int64_t>(t);
  // One OpenMP region: thread t owns a contiguous range of whole tiles (about N/threads rows) and runs vocab chunks
  // outer, its token chunks inner. Accumulating, dW tile sums go into a thread-local (d, chunk) accumulator merged
  // into dW_acc under a critical section (exact merges: neither the partition nor the merge order changes a bit; a
  // single thread accumulates into dW_acc directly), without barriers. Direct, each thread writes its tiles' partials
  // of the chunk, and after a barrier rounds the sums of its share of dW's rows.
#pragma omp parallel if (N * V * d >= 262144)
  {
    const int nth = omp_get_num_threads(), th = omp_get_thread_num();
    auto first_tile = [&](int t) -> size_t {  // first tile starting at or after row N*t/nth
      if (t >= nth) return n_tiles;
      const int64_t row = N * t / nth;
      return static_cast<size_t>(std::lower_bound(segs.begin(), segs.end() - 1, row) - segs.begin());
    };
    const size_t ta = first_tile(th), tb = first_tile(th + 1);
    const std::vector<int64_t> my = rebased(segs, ta, tb);  // my tiles, rows relative to segs[ta]
    const int64_t base = segs[ta], my_rows = segs[tb] - base;
    const std::vector<size_t> cuts = tile_chunks(my, token_chunk);
    int64_t max_rows = 0;
    for (size_t q = 0; q + 1 < cuts.size(); ++q) max_rows = std::max(max_rows, my[cuts[q + 1]] - my[cuts[q]]);
    std::vector<T> dl(static_cast<size_t>(max_rows * vc));
    std::vector<T> hbuf(bf16 ? static_cast<size_t>(max_rows * d) : 0), wbuf(bf16 ? static_cast<size_t>(d * vc) : 0);
    std::vector<ExactAcc<T>> local(!direct && nth > 1 && my_rows > 0 ? static_cast<size_t>(d * vc) : 0);
    for (int64_t j0 = j_begin; j0 < j_end && (direct || my_rows > 0); j0 += vc) {  // ascending: dhidden's sum
      const int64_t w = std::min(vc, j_end - j0);
      if (direct)
        for (size_t t = ta; t < tb; ++t)
          if (segs[t] == segs[t + 1]) std::fill_n(P.data() + t * static_cast<size_t>(d * w), d * w, T(0));
      if (my_rows > 0) {
        const WChunk<T> B = w_chunk<T>(W, d, V, j0, w, bf16, wbuf);
        ExactAcc<T>* acc = direct ? nullptr : nth > 1 ? local.data() : dW_acc + (j0 - j_begin);
        const int64_t ld_acc = nth > 1 ? w : ldw;
        if (!direct && nth > 1) std::fill(local.begin(), local.begin() + d * w, ExactAcc<T>{});
        for (size_t q = 0; q + 1 < cuts.size(); ++q) {
          const int64_t r0 = base + my[cuts[q]], rows = my[cuts[q + 1]] - my[cuts[q]];
          if (rows == 0) continue;
          const T* A = h_rows<T>(hidden, d, r0, rows, bf16, hbuf);
          // Per row block, in cache: recomputed logits -> dlogit -> dhidden += dlogit @ W_chunk^T.
          for (int64_t i = 0; i < rows; i += kRowBlock) {
            const int64_t n = std::min(kRowBlock, rows - i);
            T* L = dl.data() + i * w;
            gemm_serial<T>(n, w, d, A + i * d, d, 1, B.B, B.ldb, false, L, w, false);  // recomputed logits
            to_dlogit<T>(L, w, n, j0, w, targets + r0 + i, lse + r0 + i, grad_scale, bf16);
            gemm_serial<T>(n, d, w, L, w, 1, B.B, B.ldb, /*trans_b=*/true, dhidden + (r0 + i) * d, d,
                           /*accumulate=*/j0 > 0);
          }
          if (!direct) {
            const std::vector<int64_t> s = rebased(my, cuts[q], cuts[q + 1]);
            tile_wgrad_acc<T>(A, d, dl.data(), w, d, w, s, acc, ld_acc, /*parallel=*/false);
            continue;
          }
          for (size_t u = cuts[q]; u < cuts[q + 1]; ++u) {  // the in-tile partials, tile_wgrad_acc's order
            const int64_t o = my[u] - my[cuts[q]], len = my[u + 1] - my[u];
            if (len > 0)
              gemm_serial<T>(d, w, len, A + o * d, 1, d, dl.data() + o * w, w, false,
                             P.data() + (ta + u) * static_cast<size_t>(d * w), w, false);
          }
        }
        if (!direct && nth > 1) {
#pragma omp critical(trident_linear_ce_dw)
          for (int64_t k = 0; k < d; ++k) exact_merge<T>(dW_acc + k * ldw + (j0 - j_begin), local.data() + k * w, w);
        }
      }
      if (direct) {
#pragma omp barrier
        for (int64_t k = d * th / nth; k < d * (th + 1) / nth; ++k) {
          if (dW_part) {  // the partials themselves, at their places in the send layout
            for (size_t t = 0; t < n_tiles; ++t)
              std::copy_n(P.data() + t * static_cast<size_t>(d * w) + k * w, w,
                          dW_part->at(static_cast<int64_t>(t), dW_part->off + k * ldw + (j0 - j_begin)));
            continue;
          }
          tile_sum_round<T>(P.data() + k * w, d * w, w, one_row, dW + k * ldw + (j0 - j_begin));
        }
#pragma omp barrier
      }
    }
  }
  if (j_end == V) zero_ignored_rows(targets, N, d, dhidden);
}

// The argument checks of linear_ce_backward_cols(_round); false when there is nothing to do (N == 0).
template <class T>
bool lce_backward_checks(const char* fn, const int32_t* targets, int64_t N, int64_t d, int64_t V, int64_t vocab_chunk,
                         Policy policy, int64_t token_chunk, std::span<const int64_t> segs, int64_t j_begin,
                         int64_t j_end) {
  check_common<T>(fn, N, d, V, vocab_chunk, policy, token_chunk);
  TD_CHECK(0 <= j_begin && j_begin < j_end && j_end <= V,
           "{}: vocabulary columns [{}, {}) are not a non-empty range of [0, {})", fn, j_begin, j_end, V);
  TD_CHECK(j_begin % vocab_chunk == 0 && (j_end % vocab_chunk == 0 || j_end == V),
           "{}: vocabulary columns [{}, {}) do not consist of whole vocab chunks of {}", fn, j_begin, j_end,
           vocab_chunk);
  check_targets(fn, targets, N, V);
  check_segs(fn, segs, N);
  return N > 0;
}

}  // namespace

template <class T>
void linear_ce_backward_cols(const T* hidden, const T* W, const int32_t* targets, const T* lse, int64_t N, int64_t d,
                             int64_t V, int64_t vocab_chunk, Policy policy, int64_t token_chunk, T grad_scale,
                             std::span<const int64_t> segs, int64_t j_begin, int64_t j_end, T* dhidden,
                             ExactAcc<T>* dW_acc) {
  prof::OpSection prof_section(prof::Op::lce_bwd);
  if (!lce_backward_checks<T>("linear_ce_backward", targets, N, d, V, vocab_chunk, policy, token_chunk, segs, j_begin,
                              j_end))
    return;
  lce_backward_impl<T>(hidden, W, targets, lse, N, d, V, vocab_chunk, policy, token_chunk, grad_scale, segs, j_begin,
                       j_end, dhidden, dW_acc, nullptr);
}

template <class T>
void linear_ce_backward_cols_round(const T* hidden, const T* W, const int32_t* targets, const T* lse, int64_t N,
                                   int64_t d, int64_t V, int64_t vocab_chunk, Policy policy, int64_t token_chunk,
                                   T grad_scale, std::span<const int64_t> segs, int64_t j_begin, int64_t j_end,
                                   T* dhidden, T* dW) {
  prof::OpSection prof_section(prof::Op::lce_bwd);
  const int64_t ldw = j_end - j_begin;
  if (!lce_backward_checks<T>("linear_ce_backward", targets, N, d, V, vocab_chunk, policy, token_chunk, segs, j_begin,
                              j_end)) {
    std::fill_n(dW, d * ldw, T(0));  // no rows: the exact sums are zero
    return;
  }
  if (static_cast<int64_t>(segs.size()) - 1 <= kDirectTiles) {
    lce_backward_impl<T>(hidden, W, targets, lse, N, d, V, vocab_chunk, policy, token_chunk, grad_scale, segs,
                         j_begin, j_end, dhidden, nullptr, dW);
    return;
  }
  std::vector<ExactAcc<T>> acc(static_cast<size_t>(d * ldw));
  lce_backward_impl<T>(hidden, W, targets, lse, N, d, V, vocab_chunk, policy, token_chunk, grad_scale, segs, j_begin,
                       j_end, dhidden, acc.data(), nullptr);
  exact_round<T>(acc.data(), dW, d * ldw);
}

template <class T>
void linear_ce_backward_cols_partials(const T* hidden, const T* W, const int32_t* targets, const T* lse, int64_t N,
                                      int64_t d, int64_t V, int64_t vocab_chunk, Policy policy, int64_t token_chunk,
                                      T grad_scale, std::span<const int64_t> segs, int64_t j_begin, int64_t j_end,
                                      T* dhidden, const TilePartials<T>& dW) {
  prof::OpSection prof_section(prof::Op::lce_bwd);
  const int64_t ldw = j_end - j_begin, n_tiles = static_cast<int64_t>(segs.size()) - 1;
  TD_CHECK(dW.base != nullptr && dW.row == ldw && dW.off == 0 && dW.blocks * dW.block_rows >= d,
           "linear_ce_backward: a partial buffer of rows of {} columns and at least {} rows (got rows of {}, {} x {})",
           ldw, d, dW.row, dW.blocks, dW.block_rows);
  TD_CHECK_EQ(n_tiles, dW.n_tiles, "linear_ce_backward: segs' tiles against the partial buffer's");
  TD_CHECK_LE(n_tiles, kDirectTiles, "linear_ce_backward: partials of at most {} tiles", kDirectTiles);
  if (!lce_backward_checks<T>("linear_ce_backward", targets, N, d, V, vocab_chunk, policy, token_chunk, segs, j_begin,
                              j_end)) {
    for (int64_t t = 0; t < n_tiles; ++t)  // no rows: every partial +0
      for (int64_t k = 0; k < d; ++k) std::fill_n(dW.at(t, k * ldw), ldw, T(0));
    return;
  }
  lce_backward_impl<T>(hidden, W, targets, lse, N, d, V, vocab_chunk, policy, token_chunk, grad_scale, segs, j_begin,
                       j_end, dhidden, nullptr, nullptr, &dW);
}

template <class T>
void linear_ce_fused(const T* hidden, const T* W, const int32_t* targets, int64_t N, int64_t d, int64_t V,
                     int64_t vocab_chunk, Policy policy, int64_t token_chunk, T grad_scale,
                     std::span<const int64_t> segs, T* token_loss, T* lse, T* dhidden, ExactAcc<T>* dW_acc) {
  prof::OpSection prof_section(prof::Op::lce_bwd);  // forward and backward in one pass
  check_common<T>("linear_ce_fused", N, d, V, vocab_chunk, policy, token_chunk);
  check_targets("linear_ce_fused", targets, N, V);
  check_segs("linear_ce_fused", segs, N);
  if (N == 0) return;
  const bool bf16 = policy == Policy::bf16;
  const int64_t vc = std::min(vocab_chunk, V);
  const std::vector<size_t> cuts = tile_chunks(segs, token_chunk);
  int64_t max_rows = 0;
  for (size_t q = 0; q + 1 < cuts.size(); ++q) max_rows = std::max(max_rows, segs[cuts[q + 1]] - segs[cuts[q]]);
  std::vector<T> L(static_cast<size_t>(max_rows * V));
  std::vector<T> Mrun(static_cast<size_t>(max_rows)), Srun(static_cast<size_t>(max_rows)),
      tl(static_cast<size_t>(max_rows));
  std::vector<T> wbuf(bf16 ? static_cast<size_t>(d * vc) : 0), hbuf(bf16 ? static_cast<size_t>(max_rows * d) : 0);
  for (size_t q = 0; q + 1 < cuts.size(); ++q) {
    const int64_t r0 = segs[cuts[q]], rows = segs[cuts[q + 1]] - r0;
    if (rows == 0) continue;
    const T* A = h_rows<T>(hidden, d, r0, rows, bf16, hbuf);
    std::fill(tl.begin(), tl.end(), T(0));
    for (int64_t j0 = 0; j0 < V; j0 += vc) {
      const int64_t w = std::min(vc, V - j0);
      const WChunk<T> B = w_chunk<T>(W, d, V, j0, w, bf16, wbuf);
      gemm<T>(rows, w, d, A, d, B.B, B.ldb, false, L.data() + j0, V);
      lse_update_par<T>(L.data() + j0, V, rows, j0, w, targets + r0, Mrun.data(), Srun.data(), tl.data(), j0 == 0);
    }
    lse_finish<T>(rows, targets + r0, Mrun.data(), Srun.data(), tl.data(), lse + r0, token_loss + r0);
    to_dlogit_par<T>(L.data(), V, rows, 0, V, targets + r0, lse + r0, grad_scale, bf16);
    if (bf16) {
      for (int64_t j0 = 0; j0 < V; j0 += vc) {  // rounded W chunks again, ascending: one in-order sum
        const int64_t w = std::min(vc, V - j0);
        const WChunk<T> B = w_chunk<T>(W, d, V, j0, w, bf16, wbuf);
        dhidden_acc<T>(L.data() + j0, V, rows, w, B, d, dhidden + r0 * d, j0 == 0);
      }
    } else {
      dhidden_acc<T>(L.data(), V, rows, V, WChunk<T>{W, V}, d, dhidden + r0 * d, true);
    }
    const std::vector<int64_t> s = rebased(segs, cuts[q], cuts[q + 1]);
    tile_wgrad_acc<T>(A, d, L.data(), V, d, V, s, dW_acc);
  }
  zero_ignored_rows(targets, N, d, dhidden);
}

#define TD_LINEAR_CE(T)                                                                                            \
  template void linear_ce_forward<T>(const T*, const T*, const int32_t*, int64_t, int64_t, int64_t, int64_t,       \
                                     Policy, int64_t, T*, T*);                                                     \
  template void linear_ce_backward<T>(const T*, const T*, const int32_t*, const T*, int64_t, int64_t, int64_t,     \
                                      int64_t, Policy, int64_t, T, std::span<const int64_t>, T*, ExactAcc<T>*);    \
  template void linear_ce_backward_cols<T>(const T*, const T*, const int32_t*, const T*, int64_t, int64_t,        \
                                           int64_t, int64_t, Policy, int64_t, T, std::span<const int64_t>, int64_t, \
                                           int64_t, T*, ExactAcc<T>*);                                             \
  template void linear_ce_backward_cols_round<T>(const T*, const T*, const int32_t*, const T*, int64_t, int64_t,  \
                                                 int64_t, int64_t, Policy, int64_t, T, std::span<const int64_t>,    \
                                                 int64_t, int64_t, T*, T*);                                         \
  template void linear_ce_backward_cols_partials<T>(const T*, const T*, const int32_t*, const T*, int64_t, int64_t,\
                                                    int64_t, int64_t, Policy, int64_t, T, std::span<const int64_t>, \
                                                    int64_t, int64_t, T*, const TilePartials<T>&);                 \
  template void linear_ce_fused<T>(const T*, const T*, const int32_t*, int64_t, int64_t, int64_t, int64_t, Policy, \
                                   int64_t, T, std::span<const int64_t>, T*, T*, T*, ExactAcc<T>*);
TD_LINEAR_CE(float)
TD_LINEAR_CE(double)
#undef TD_LINEAR_CE

}  // namespace trident::model
