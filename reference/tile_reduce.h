// Tile reductions: the contract's one cross-token reduction (docs/numerics.md, "Tile reductions").
//
// Rows (tokens, or (token, head) pairs) are grouped into segments; a segment holds the rows of one global
// reduction tile, in token order. For each output element:
//   partial(tile) = in-order sum over the tile's rows in T (T = float or double), starting from +0,
//                   each product rounded to T before it is added (no FMA);
//   result        = exact sum (ExactAcc<T>) of all tile partials, rounded once.
// Because the exact sum is order- and partition-free, any split of the tiles over ranks followed by an
// exact merge (ExactAcc::merge / emulator exact_sum) gives the same bits. Empty segments contribute nothing.
//
// segs: offsets [n_tiles + 1] into the rows, non-decreasing, segs[0] == 0 (or any start), rows
// segs[i]..segs[i+1]-1 belong to tile i.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "reference/exact_acc.h"

namespace trident {

// acc[j] += sum over tiles of (in-tile sum over rows r of x[r, j])          x: (N, J) row-major
template <class T>
void tile_sum_acc(const T* x, int64_t J, std::span<const int64_t> segs, ExactAcc<T>* acc);

// out[j] = round(zeroed accumulator + tile_sum_acc) for rows of stride ldx, on the calling thread (no OpenMP), each
// block's sums rounded in cache: with one-row tiles, the exact sum of the rows rounded once (summing exchanged tile
// partials into a result).
template <class T>
void tile_sum_round(const T* x, int64_t ldx, int64_t J, std::span<const int64_t> segs, T* out);

// acc[k, m] += sum over tiles of (in-tile sum over rows r of X[r, k] * dY[r, m])
//   X: (N, K) row stride ldx, dY: (N, M) row stride ldy, acc: (K, M) row-major.
// The weight-gradient form dW = X^T dY. Parallel (OpenMP) over blocks of output elements only.
template <class T>
void tile_wgrad_acc(const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M,
                    std::span<const int64_t> segs, ExactAcc<T>* acc);

// Same, into a (K, M) block of a wider accumulator matrix whose rows have stride ld_acc. parallel = false keeps
// the work on the calling thread (for callers already inside an OpenMP region). Same bits either way.
template <class T>
void tile_wgrad_acc(const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M,
                    std::span<const int64_t> segs, ExactAcc<T>* acc, int64_t ld_acc, bool parallel = true);

// dW (K, M) = round(zeroed accumulators + tile_wgrad_acc): the same bits, but each block's accumulators are formed
// and rounded in cache (no (K, M) accumulator array in memory). The sum of a tensor's only contribution.
template <class T>
void tile_wgrad(const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M,
                std::span<const int64_t> segs, T* dW);
// Same, into a (K, M) block of a wider matrix whose rows have stride ld_dw.
template <class T>
void tile_wgrad(const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M,
                std::span<const int64_t> segs, T* dW, int64_t ld_dw);

// Where a tensor's tile partials go when they are exchanged instead of summed (the distributed step's dense weight
// gradients, docs/parallel.md section 4). The tensor is (rows, row) row-major, cut into `blocks` blocks of
// `block_rows` rows (the last may hold padding rows past `rows`); element e = off + (flat index) of row r = e / row,
// column c = e % row, has the partial of tile t at
//   base[((r / block_rows) * n_tiles + t) * block_rows * row + (r % block_rows) * row + c]
// block-major, then tile, then the block's rows: block s, all its tiles, is contiguous (an all-to-all's send block
// for rank s). `off` lets a caller address a column block of the tensor (p + k, as with an accumulator pointer).
template <class T>
struct TilePartials {
  T* base = nullptr;
  int64_t row = 0, block_rows = 0, blocks = 0, n_tiles = 0, off = 0;
  explicit operator bool() const { return base != nullptr; }
  TilePartials operator+(int64_t k) const {
    TilePartials p = *this;
    p.off += k;
    return p;
  }
  int64_t block_elems() const { return block_rows * row; }
  int64_t size() const { return blocks * n_tiles * block_rows * row; }  // values of T in base
  // The partial of tile t for element e (flat, offset already applied).
  T* at(int64_t t, int64_t e) const {
    const int64_t r = e / row;
    return base + ((r / block_rows) * n_tiles + t) * block_rows * row + (r % block_rows) * row + e % row;
  }
};

// For each tile t of segs and element (k, m) of X^T dY (K, M): out's tile-t partial of element k * ld + m (plus
// out.off) = the in-tile in-order sum over the tile's rows of round(X[r, k] * dY[r, m]), from +0 (+0 for an empty
// tile): exactly the partials tile_wgrad_acc adds into accumulators, so the exact sum of these partials, wherever
// it is formed, is its bits. segs must hold out.n_tiles tiles; a column block must not straddle a row of the tensor.
template <class T>
void tile_wgrad_partials(const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M,
                         std::span<const int64_t> segs, const TilePartials<T>& out, int64_t ld);

// Segments of `n` rows cut into tiles of `tile` consecutive rows (the last may be shorter):
// {0, tile, 2*tile, ..., n}. Rows of several sequences: call per sequence, or use tile ids directly.
std::vector<int64_t> uniform_segments(int64_t n, int64_t tile);

}  // namespace trident
