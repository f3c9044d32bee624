// Tile reductions (reference/tile_reduce.h, docs/numerics.md "Tile reductions"): the argument checks and the choice
// of loop copy. The loops are reference/tile_reduce_kernel.h, compiled here for the build's baseline ISA and, on
// x86-64 (TRIDENT_GEMM_DISPATCH), in tile_reduce_avx2.cpp and tile_reduce_avx512.cpp; the copy follows the GEMM's
// (gemm_isa(): the widest the CPU runs, or TRIDENT_GEMM_ISA). Every copy computes the same bits.
#include "reference/tile_reduce.h"

#include <algorithm>
#include <vector>

#include "reference/check.h"
#include "reference/gemm.h"

#define TRIDENT_GEMM_NS base
#include "reference/tile_reduce_kernel.h"
#undef TRIDENT_GEMM_NS

namespace trident {

namespace gemm_isa_impl {
#if TRIDENT_GEMM_DISPATCH
#define TRIDENT_TILE_DECLARE(ns, T)                                                                                  \
  namespace ns {                                                                                                     \
  template <class U>                                                                                                 \
  void tile_sum_acc_k(const U* x, int64_t J, std::span<const int64_t> segs, ExactAcc<U>* acc);                       \
  template <class U>                                                                                                 \
  void tile_sum_round_k(const U* x, int64_t ldx, int64_t J, std::span<const int64_t> segs, U* out);                  \
  template <class U>                                                                                                 \
  void tile_wgrad_acc_k(const U* X, int64_t ldx, const U* dY, int64_t ldy, int64_t K, int64_t M,                     \
                        std::span<const int64_t> segs, ExactAcc<U>* acc, int64_t ld_acc, bool parallel);             \
  template <class U>                                                                                                 \
  void tile_wgrad_k(const U* X, int64_t ldx, const U* dY, int64_t ldy, int64_t K, int64_t M,                         \
                    std::span<const int64_t> segs, U* dW, int64_t ld_dw);                                            \
  extern template void tile_sum_acc_k<T>(const T*, int64_t, std::span<const int64_t>, ExactAcc<T>*);                 \
  extern template void tile_sum_round_k<T>(const T*, int64_t, int64_t, std::span<const int64_t>, T*);                \
  extern template void tile_wgrad_acc_k<T>(const T*, int64_t, const T*, int64_t, int64_t, int64_t,                   \
                                           std::span<const int64_t>, ExactAcc<T>*, int64_t, bool);                   \
  extern template void tile_wgrad_k<T>(const T*, int64_t, const T*, int64_t, int64_t, int64_t,                       \
                                       std::span<const int64_t>, T*, int64_t);                                       \
  }
TRIDENT_TILE_DECLARE(avx2, float)
TRIDENT_TILE_DECLARE(avx2, double)
TRIDENT_TILE_DECLARE(avx512, float)
TRIDENT_TILE_DECLARE(avx512, double)
#undef TRIDENT_TILE_DECLARE
#endif
}  // namespace gemm_isa_impl

namespace {

void check_segs(std::span<const int64_t> segs) {
  TD_CHECK(!segs.empty(), "tile reduction: segs must hold n_tiles + 1 offsets (got an empty span)");
  for (size_t i = 1; i < segs.size(); ++i)
    TD_CHECK(segs[i - 1] <= segs[i], "tile reduction: segment offsets must be non-decreasing (segs[{}] = {} > "
                                     "segs[{}] = {})", i - 1, segs[i - 1], i, segs[i]);
}
// The copy of `fn` for the GEMM's instruction set, called with the arguments that follow.
#if TRIDENT_GEMM_DISPATCH
#define TRIDENT_TILE_CALL(fn, ...)                                                                          \
  switch (gemm_isa()) {                                                                                     \
    case GemmIsa::avx512: return gemm_isa_impl::avx512::fn(__VA_ARGS__);                                    \
    case GemmIsa::avx2: return gemm_isa_impl::avx2::fn(__VA_ARGS__);                                        \
    case GemmIsa::baseline: break;                                                                          \
  }                                                                                                         \
  return gemm_isa_impl::base::fn(__VA_ARGS__)
#else
#define TRIDENT_TILE_CALL(fn, ...) return gemm_isa_impl::base::fn(__VA_ARGS__)
#endif

}  // namespace

template <class T>
void tile_sum_acc(const T* x, int64_t J, std::span<const int64_t> segs, ExactAcc<T>* acc) {
  check_segs(segs);
  if (J <= 0) return;
  TRIDENT_TILE_CALL(tile_sum_acc_k<T>, x, J, segs, acc);
}

template <class T>
void tile_sum_round(const T* x, int64_t ldx, int64_t J, std::span<const int64_t> segs, T* out) {
  check_segs(segs);
  if (J <= 0) return;
  TD_CHECK_GE(ldx, J, "tile_sum_round: input row stride below the row width");
  TRIDENT_TILE_CALL(tile_sum_round_k<T>, x, ldx, J, segs, out);
}

template <class T>
void tile_wgrad_acc(const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M,
                    std::span<const int64_t> segs, ExactAcc<T>* acc) {
  tile_wgrad_acc<T>(X, ldx, dY, ldy, K, M, segs, acc, M, true);
}

template <class T>
void tile_wgrad_acc(const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M,
                    std::span<const int64_t> segs, ExactAcc<T>* acc, int64_t ld_acc, bool parallel) {
  check_segs(segs);
  if (K <= 0 || M <= 0) return;
  TD_CHECK_GE(ld_acc, M, "tile_wgrad_acc: accumulator row stride below the block width");
  TRIDENT_TILE_CALL(tile_wgrad_acc_k<T>, X, ldx, dY, ldy, K, M, segs, acc, ld_acc, parallel);
}

template <class T>
void tile_wgrad(const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M,
                std::span<const int64_t> segs, T* dW) {
  tile_wgrad<T>(X, ldx, dY, ldy, K, M, segs, dW, M);
}

// The sums of tile_wgrad_acc formed and rounded block by block (reference/tile_reduce_kernel.h): one rounding of the
// same exact sum, so the bits of zeroed accumulators + tile_wgrad_acc + exact_round.
template <class T>
void tile_wgrad(const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M,
                std::span<const int64_t> segs, T* dW, int64_t ld_dw) {
  check_segs(segs);
  if (K <= 0 || M <= 0) return;
  TD_CHECK_GE(ld_dw, M, "tile_wgrad: output row stride below the block width");
  TRIDENT_TILE_CALL(tile_wgrad_k<T>, X, ldx, dY, ldy, K, M, segs, dW, ld_dw);
}

// One in-order GEMM per tile (gemm_serial: the per-element order of tile_wgrad_acc's partials, whatever the block
// shape), its rows copied to their places in the send layout.
template <class T>
void tile_wgrad_partials(const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M,
                         std::span<const int64_t> segs, const TilePartials<T>& out, int64_t ld) {
  check_segs(segs);
  if (K <= 0 || M <= 0) return;
  TD_CHECK(out.base != nullptr && out.row > 0 && out.block_rows > 0 && out.blocks > 0,
           "tile_wgrad_partials: no partial buffer");
  const int64_t n_tiles = static_cast<int64_t>(segs.size()) - 1;
  TD_CHECK_EQ(n_tiles, out.n_tiles, "tile_wgrad_partials: segs' tiles against the buffer's tiles per element");
  TD_CHECK_GE(ld, M, "tile_wgrad_partials: output row stride below the block width");
  TD_CHECK(out.off % out.row + M <= out.row && ld % out.row == 0,
           "tile_wgrad_partials: a column block straddles the tensor's rows (off {}, width {}, row {}, ld {})", out.off,
           M, out.row, ld);
  TD_CHECK_LE(out.off / out.row + (K - 1) * (ld / out.row) + 1, out.blocks * out.block_rows,
              "tile_wgrad_partials: rows past the buffer");
  static thread_local std::vector<T> buf;
  buf.resize(static_cast<size_t>(K * M));
  for (int64_t t = 0; t < n_tiles; ++t) {
    const int64_t r0 = segs[static_cast<size_t>(t)], len = segs[static_cast<size_t>(t) + 1] - r0;
    if (len == 0)
      std::fill(buf.begin(), buf.end(), T(0));  // an empty tile: +0 partials (they add nothing)
    else
      gemm_serial<T>(K, M, len, X + r0 * ldx, 1, ldx, dY + r0 * ldy, ldy, false, buf.data(), M, false);
    for (int64_t k = 0; k < K; ++k) std::copy_n(buf.data() + k * M, M, out.at(t, out.off + k * ld));
  }
}

#undef TRIDENT_TILE_CALL

std::vector<int64_t> uniform_segments(int64_t n, int64_t tile) {
  TD_CHECK_GT(tile, 0, "uniform_segments: the tile size must be positive");
  TD_CHECK_GE(n, 0, "uniform_segments: the row count must be non-negative");
  std::vector<int64_t> segs;
  segs.reserve(static_cast<size_t>(n / tile + 2));
  for (int64_t r = 0; r < n; r += tile) segs.push_back(r);
  segs.push_back(n);
  return segs;
}

template void tile_sum_acc<float>(const float*, int64_t, std::span<const int64_t>, ExactAcc<float>*);
template void tile_sum_acc<double>(const double*, int64_t, std::span<const int64_t>, ExactAcc<double>*);
template void tile_sum_round<float>(const float*, int64_t, int64_t, std::span<const int64_t>, float*);
template void tile_sum_round<double>(const double*, int64_t, int64_t, std::span<const int64_t>, double*);
template void tile_wgrad_acc<float>(const float*, int64_t, const float*, int64_t, int64_t, int64_t,
                                    std::span<const int64_t>, ExactAcc<float>*);
template void tile_wgrad_acc<double>(const double*, int64_t, const double*, int64_t, int64_t, int64_t,
                                     std::span<const int64_t>, ExactAcc<double>*);
template void tile_wgrad_acc<float>(const float*, int64_t, const float*, int64_t, int64_t, int64_t,
                                    std::span<const int64_t>, ExactAcc<float>*, int64_t, bool);
template void tile_wgrad_acc<double>(const double*, int64_t, const double*, int64_t, int64_t, int64_t,
                                     std::span<const int64_t>, ExactAcc<double>*, int64_t, bool);
template void tile_wgrad_partials<float>(const float*, int64_t, const float*, int64_t, int64_t, int64_t,
                                         std::span<const int64_t>, const TilePartials<float>&, int64_t);
template void tile_wgrad_partials<double>(const double*, int64_t, const double*, int64_t, int64_t, int64_t,
                                          std::span<const int64_t>, const TilePartials<double>&, int64_t);
template void tile_wgrad<float>(const float*, int64_t, const float*, int64_t, int64_t, int64_t,
                                std::span<const int64_t>, float*);
template void tile_wgrad<double>(const double*, int64_t, const double*, int64_t, int64_t, int64_t,
                                 std::span<const int64_t>, double*);
template void tile_wgrad<float>(const float*, int64_t, const float*, int64_t, int64_t, int64_t,
                                std::span<const int64_t>, float*, int64_t);
template void tile_wgrad<double>(const double*, int64_t, const double*, int64_t, int64_t, int64_t,
                                 std::span<const int64_t>, double*, int64_t);

}  // namespace trident
