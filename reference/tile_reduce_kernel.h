// The tile reductions' loops (reference/tile_reduce.h, docs/numerics.md "Tile reductions"), compiled once per
// instruction set like the GEMM kernel: reference/tile_reduce.cpp (the build's baseline ISA, plus the argument
// checks and the choice of copy), tile_reduce_avx2.cpp (-mavx2) and tile_reduce_avx512.cpp (-mavx512f). The includer
// defines TRIDENT_GEMM_NS, the namespace of this copy (trident::gemm_isa_impl::TRIDENT_GEMM_NS). Every copy computes
// the same bits: the in-tile partials come from the in-order GEMM, the grouped double sums add in partial order
// (each element its own chain, vectorised across elements only; -ffp-contract=off and no -mfma), and the exact adds
// are integer operations, so only how many elements advance at once differs. The arguments are checked by the
// callers in tile_reduce.cpp.
//
// Work split: OpenMP over blocks of output elements only; each block walks all tiles in order, so no
// reduction is ever split between threads (the exact sum would not care, but the in-tile sums would).
// Per (block, tile): the in-tile partials P (kb x mb) come from the in-order gemm kernel (gemm_serial with
// X^T addressed in place: s = +0; for rows r of the tile: s += round(X[r,k] * dY[r,m])); then each partial
// is added exactly into its accumulator.
#if !defined(TRIDENT_GEMM_NS)
#error "define TRIDENT_GEMM_NS before including reference/tile_reduce_kernel.h"
#endif
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "reference/exact_acc.h"
#include "reference/gemm.h"

namespace trident::gemm_isa_impl::TRIDENT_GEMM_NS {
namespace {

// Output blocks: kKB rows of K x kMB columns of M (the accumulators of one block stay in cache).
constexpr int64_t kKB = 48;
constexpr int64_t kMB = 128;
constexpr int64_t kJB = 256;
constexpr int64_t kTB = 8;   // tiles whose partials are buffered before the exact adds (a full kKB x kMB block)
constexpr int64_t kTBMax = 32;  // ... a narrower block: as many as fit the same buffer, up to this

// Tiles per group for a (kb x mb) block: the partial buffer holds kTB full blocks' worth (GroupSums then sums up to 32
// partials in double, exact inside a 24-binade window; with groups of 8, 99.2% of the 256-rank bench step's element
// groups fit their 26-binade window).
inline int64_t group_tiles(int64_t kb, int64_t mb) {
  return std::min(kTBMax, std::max(kTB, kTB * kKB * kMB / (kb * mb)));
}

// The partials of the non-empty tiles of group [t0, t0 + tb) for the (kb x mb) block at (k0, m0), into P (one kb x mb
// matrix per tile): P[u][i, j] = in-order sum over the u-th tile's rows of round(X[r, k0+i] * dY[r, m0+j]), from +0.
// Returns how many tiles were not empty.
template <class T>
int64_t group_partials(const T* X, int64_t ldx, const T* dY, int64_t ldy, std::span<const int64_t> segs, int64_t t0,
                       int64_t tb, int64_t k0, int64_t m0, int64_t kb, int64_t mb, T* P) {
  const int64_t n_tiles = static_cast<int64_t>(segs.size()) - 1;
  int64_t n_live = 0;
  for (int64_t t = t0; t < std::min(n_tiles, t0 + tb); ++t) {
    const int64_t r0 = segs[t], len = segs[t + 1] - segs[t];
    if (len == 0) continue;  // an empty tile contributes nothing
    gemm_serial<T>(kb, mb, len, X + r0 * ldx + k0, 1, ldx, dY + r0 * ldy + m0, ldy, false, P + n_live * kb * mb, mb,
                   false);
    ++n_live;
  }
  return n_live;
}

// Whether ExactAcc<T> takes grouped float partials as one exact double (ExactAcc<float>::add_unchecked_wide; not the
// plain-sum benchmark twin, reference/plain_acc_impl.h, nor double).
template <class T>
constexpr bool kWideAdds = requires(ExactAcc<T>& a) { a.add_unchecked_wide(0.0); };

// A tile group's partials summed per element in double where that is provably exact (float only, two or more
// partials): sum[e] and wide[e] for the n elements of the block (P: n_live matrices of n). Exactness: with hi the
// biased exponent of the element's largest |partial| and lo = max(1, that of its smallest nonzero one), every partial
// is a multiple of 2^(lo-150) and below 2^(hi-126) in magnitude, so every running sum of n_live <= 2^c of them is a
// multiple of 2^(lo-150) below n_live * 2^(hi-126): an integer multiple below 2^(hi-lo+24+c) <= 2^53 when
// hi - lo <= 29 - c, so exactly a double, and each double addition is exact. An Inf or NaN partial makes the double
// sum non-finite (finite partials cannot overflow it): not wide. All zeros: the sum is +-0 (adds nothing). The loops
// are SIMD over elements (each element's sum stays in partial order; nothing is reassociated).
struct GroupSums {
  std::vector<double> sum;
  std::vector<float> mx, mn;
  std::vector<uint8_t> wide;
  bool on = false;  // sums formed for the current group

  template <class T>
  void form(const T* P, int64_t n_live, int64_t n, int64_t ldu = -1) {  // ldu: elements from one partial to the next
    if (ldu < 0) ldu = n;
    on = false;
    if constexpr (kWideAdds<T>) {
      if (n_live < 2) return;
      on = true;
      sum.resize(static_cast<size_t>(n)), mx.resize(static_cast<size_t>(n)), mn.resize(static_cast<size_t>(n));
      wide.resize(static_cast<size_t>(n));
      double* sm = sum.data();
      float *hi = mx.data(), *lo = mn.data();
      const int span = 29 - std::bit_width(static_cast<uint64_t>(n_live - 1));  // c = ceil(log2 n_live)
#pragma omp simd
      for (int64_t e = 0; e < n; ++e) sm[e] = 0.0, hi[e] = 0.0f, lo[e] = std::numeric_limits<float>::infinity();
      for (int64_t u = 0; u < n_live; ++u) {
        const T* p = P + u * ldu;
#pragma omp simd
        for (int64_t e = 0; e < n; ++e) {
          const float x = p[e], ax = std::fabs(x);
          sm[e] += static_cast<double>(x);
          hi[e] = ax > hi[e] ? ax : hi[e];
          lo[e] = ax < lo[e] && ax != 0.0f ? ax : lo[e];
        }
      }
      uint8_t* w = wide.data();
#pragma omp simd
      for (int64_t e = 0; e < n; ++e) {
        const int eh = static_cast<int>(std::bit_cast<uint32_t>(hi[e]) >> 23);
        const int el = std::max(static_cast<int>(std::bit_cast<uint32_t>(lo[e]) >> 23), 1);
        w[e] = static_cast<uint8_t>(eh - el <= span && std::isfinite(sm[e]));
      }
    }
  }
};

// Row i of the block's n_live partials added exactly into its mb accumulators `a` (which stay in L1 meanwhile): an
// element whose group sum g formed exactly goes in as that one double (ExactAcc<float>::add_unchecked_wide), any other
// partial by partial. The same exact sum either way, so the same bits.
template <class T>
void add_partials(ExactAcc<T>* a, const T* P, int64_t n_live, int64_t kb, int64_t mb, int64_t i, const GroupSums& g,
                  int64_t ldu = -1) {  // ldu: elements from one tile's partials to the next (kb * mb packed)
  if (ldu < 0) ldu = kb * mb;
  for (int64_t j = 0; j < mb; ++j) a[j].reserve_adds(static_cast<uint32_t>(n_live));
  if constexpr (kWideAdds<T>) {
    if (g.on) {
      const double* sum = g.sum.data() + i * mb;
      const uint8_t* wide = g.wide.data() + i * mb;
      for (int64_t j = 0; j < mb; ++j) {
        if (wide[j]) [[likely]] {
          a[j].add_unchecked_wide(sum[j]);
        } else {
          for (int64_t u = 0; u < n_live; ++u) a[j].add_unchecked(P[u * ldu + i * mb + j]);
        }
      }
      return;
    }
  }
  for (int64_t u = 0; u < n_live; ++u) {
    const T* p = P + u * ldu + i * mb;
    for (int64_t j = 0; j < mb; ++j) a[j].add_unchecked(p[j]);
  }
}

// The in-order row sums (from +0) of the non-empty tiles of group [t0, t0 + kTBMax) over columns [j0, j0 + jb) of x
// (rows of stride ldx), one row of jb per live tile in P; returns how many tiles were not empty.
template <class T>
int64_t sum_group_partials(const T* x, int64_t ldx, std::span<const int64_t> segs, int64_t t0, int64_t j0, int64_t jb,
                           T* P) {
  const int64_t n_tiles = static_cast<int64_t>(segs.size()) - 1;
  int64_t n_live = 0;
  for (int64_t t = t0; t < std::min(n_tiles, t0 + kTBMax); ++t) {
    if (segs[t] == segs[t + 1]) continue;  // an empty tile contributes nothing
    T* __restrict part = P + n_live * jb;
    const T* __restrict first = x + segs[t] * ldx + j0;
#pragma omp simd
    for (int64_t j = 0; j < jb; ++j) part[j] = T(0) + first[j];  // +0 + the first row: no separate zeroing pass
    for (int64_t r = segs[t] + 1; r < segs[t + 1]; ++r) {  // token order inside the tile
      const T* __restrict row = x + r * ldx + j0;
#pragma omp simd
      for (int64_t j = 0; j < jb; ++j) part[j] = part[j] + row[j];
    }
    ++n_live;
  }
  return n_live;
}

// Row i of a block whose every partial is in this one group, rounded straight into out (mb values): the bits of a
// zeroed accumulator, add_partials and round(), without the accumulator where the result is known directly. The
// exact sum of no partials is +0; of one finite partial p, p itself; of a group whose double sum formed exactly
// (GroupSums), that double, and converting an exact double to T rounds it once to nearest, ties to even, overflowing
// to +-Inf: round()'s rule. An exact zero is +0 as round() gives it, since partials and double sums start from +0
// (+0 + -0 is +0). A non-finite partial (round() gives the one quiet NaN for any NaN) or a window too wide for the
// double goes through an accumulator.
template <class T>
void round_group_row(T* out, const T* P, int64_t n_live, int64_t kb, int64_t mb, int64_t i, const GroupSums& g) {
  if (n_live == 0) {
    for (int64_t j = 0; j < mb; ++j) out[j] = T(0);
    return;
  }
  auto slow = [&](int64_t j) {
    ExactAcc<T> a;
    a.reserve_adds(static_cast<uint32_t>(n_live));
    for (int64_t u = 0; u < n_live; ++u) a.add_unchecked(P[(u * kb + i) * mb + j]);
    out[j] = a.round();
  };
  if (n_live == 1) {
    const T* p = P + i * mb;
    for (int64_t j = 0; j < mb; ++j) {
      if (std::isfinite(p[j])) [[likely]] out[j] = p[j];  // a partial sums from +0: never -0
      else slow(j);
    }
    return;
  }
  if constexpr (kWideAdds<T>) {
    if (g.on) {
      const double* sum = g.sum.data() + i * mb;
      const uint8_t* wide = g.wide.data() + i * mb;
      for (int64_t j = 0; j < mb; ++j) {
        if (wide[j]) [[likely]] out[j] = static_cast<T>(sum[j]);  // summed from +0: never -0
        else slow(j);
      }
      return;
    }
  }
  for (int64_t j = 0; j < mb; ++j) slow(j);
}

}  // namespace

template <class T>
void tile_sum_acc_k(const T* x, int64_t J, std::span<const int64_t> segs, ExactAcc<T>* acc) {
  const int64_t n_tiles = static_cast<int64_t>(segs.size()) - 1;
  const int64_t n_blocks = (J + kJB - 1) / kJB;
#pragma omp parallel if (n_blocks > 1 && (segs.back() - segs.front()) * J >= 65536)
  {
    // a group's partials, one row of jb per live tile
    std::vector<T> P(static_cast<size_t>(std::min(kTBMax, n_tiles) * std::min(kJB, J)));
    GroupSums g;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < n_blocks; ++b) {
      const int64_t j0 = b * kJB, jb = std::min(kJB, J - j0);
      for (int64_t t0 = 0; t0 < n_tiles; t0 += kTBMax) {
        const int64_t t1 = std::min(n_tiles, t0 + kTBMax);
        bool one_row = true;
        for (int64_t t = t0; t < t1 && one_row; ++t) one_row = segs[t + 1] - segs[t] == 1;
        if (one_row) {
          // Every tile one row: its partial is +0 + the row, which adds as the row does (+0 and -0 add nothing
          // exactly, and the group's double sum starts from +0): the rows serve as the partials in place.
          const T* rows = x + segs[t0] * J + j0;
          g.form(rows, t1 - t0, jb, J);
          add_partials(acc + j0, rows, t1 - t0, 1, jb, 0, g, J);
          continue;
        }
        const int64_t n_live = sum_group_partials<T>(x, J, segs, t0, j0, jb, P.data());
        if (n_live == 0) continue;
        g.form(P.data(), n_live, jb);
        add_partials(acc + j0, P.data(), n_live, 1, jb, 0, g);
      }
    }
  }
}

// tile_sum_acc's sums of x (rows of stride ldx) rounded straight into out (J values), on the calling thread: per block
// of kJB columns, the tile groups' partials as tile_sum_acc forms them, rounded without an accumulator where
// round_group_row can (every tile in one group), else through a thread-local row of accumulators. The bits of zeroed
// accumulators + tile_sum_acc + exact_round.
template <class T>
void tile_sum_round_k(const T* x, int64_t ldx, int64_t J, std::span<const int64_t> segs, T* out) {
  const int64_t n_tiles = static_cast<int64_t>(segs.size()) - 1;
  static thread_local std::vector<T> P;
  static thread_local std::vector<ExactAcc<T>> abuf;
  static thread_local GroupSums g;
  P.resize(static_cast<size_t>(kTBMax * kJB));
  abuf.resize(static_cast<size_t>(kJB));
  const int64_t n_groups = std::max<int64_t>(1, (n_tiles + kTBMax - 1) / kTBMax);
  for (int64_t j0 = 0; j0 < J; j0 += kJB) {
    const int64_t jb = std::min(kJB, J - j0);
    for (int64_t gi = 0; gi < n_groups; ++gi) {
      const int64_t n_live = sum_group_partials<T>(x, ldx, segs, gi * kTBMax, j0, jb, P.data());
      g.form(P.data(), n_live, jb);
      if (n_groups == 1) {
        round_group_row<T>(out + j0, P.data(), n_live, 1, jb, 0, g);
        continue;
      }
      if (gi == 0) std::fill_n(abuf.data(), jb, ExactAcc<T>());
      if (n_live > 0) add_partials<T>(abuf.data(), P.data(), n_live, 1, jb, 0, g);
      if (gi == n_groups - 1)
        for (int64_t j = 0; j < jb; ++j) out[j0 + j] = abuf[static_cast<size_t>(j)].round();
    }
  }
}

template <class T>
void tile_wgrad_acc_k(const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M,
                      std::span<const int64_t> segs, ExactAcc<T>* acc, int64_t ld_acc, bool parallel) {
  const int64_t n_tiles = static_cast<int64_t>(segs.size()) - 1;
  const int64_t bk = (K + kKB - 1) / kKB, bm = (M + kMB - 1) / kMB;
  const int64_t n_blocks = bk * bm;
  const bool par = parallel && n_blocks > 1 && (segs.back() - segs.front()) * K * M >= 262144;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int64_t k0 = (b / bm) * kKB, m0 = (b % bm) * kMB;
    const int64_t kb = std::min(kKB, K - k0), mb = std::min(kMB, M - m0);
    // Partials of up to tb tiles are computed first, then added row by row of the block, so the mb
    // accumulators of one row stay in L1 while all tb partials go in.
    static thread_local std::vector<T> pbuf;
    static thread_local GroupSums gs;
    pbuf.resize(static_cast<size_t>(kTB * kKB * kMB));
    T* P = pbuf.data();
    const int64_t tb = group_tiles(kb, mb);
    for (int64_t t0 = 0; t0 < n_tiles; t0 += tb) {
      const int64_t n_live = group_partials<T>(X, ldx, dY, ldy, segs, t0, tb, k0, m0, kb, mb, P);
      gs.form(P, n_live, kb * mb);
      for (int64_t i = 0; i < kb; ++i) add_partials<T>(acc + (k0 + i) * ld_acc + m0, P, n_live, kb, mb, i, gs);
    }
  }
}

// The sums of tile_wgrad_acc formed and rounded block by block: a block's accumulators live in a thread-local
// buffer (kKB x kMB, in L2) and each row is zeroed by the first tile group and rounded by the last while it is in
// L1, so no accumulator of the whole (K, M) matrix is ever written to memory. One rounding of the same exact sum:
// the bits of zeroed accumulators + tile_wgrad_acc + exact_round.
template <class T>
void tile_wgrad_k(const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M,
                  std::span<const int64_t> segs, T* dW, int64_t ld_dw) {
  const int64_t n_tiles = static_cast<int64_t>(segs.size()) - 1;
  const int64_t bk = (K + kKB - 1) / kKB, bm = (M + kMB - 1) / kMB;
  const int64_t n_blocks = bk * bm;
  const bool par = n_blocks > 1 && std::max<int64_t>(segs.back() - segs.front(), 1) * K * M >= 262144;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int64_t k0 = (b / bm) * kKB, m0 = (b % bm) * kMB;
    const int64_t kb = std::min(kKB, K - k0), mb = std::min(kMB, M - m0);
    static thread_local std::vector<T> pbuf;
    static thread_local std::vector<ExactAcc<T>> abuf;
    static thread_local GroupSums gs;
    pbuf.resize(static_cast<size_t>(kTB * kKB * kMB));
    abuf.resize(static_cast<size_t>(kKB * kMB));
    T* P = pbuf.data();
    const int64_t tb = group_tiles(kb, mb);
    const int64_t n_groups = std::max<int64_t>(1, (n_tiles + tb - 1) / tb);  // one (empty) group without tiles
    if (n_groups == 1) {  // every partial of the block in one group: most elements need no accumulator
      const int64_t n_live = group_partials<T>(X, ldx, dY, ldy, segs, 0, tb, k0, m0, kb, mb, P);
      gs.form(P, n_live, kb * mb);
      for (int64_t i = 0; i < kb; ++i) round_group_row<T>(dW + (k0 + i) * ld_dw + m0, P, n_live, kb, mb, i, gs);
      continue;
    }
    for (int64_t g = 0; g < n_groups; ++g) {
      const int64_t t0 = g * tb;
      const int64_t n_live = group_partials<T>(X, ldx, dY, ldy, segs, t0, tb, k0, m0, kb, mb, P);
      gs.form(P, n_live, kb * mb);
      for (int64_t i = 0; i < kb; ++i) {
        ExactAcc<T>* a = abuf.data() + i * kMB;
        if (g == 0) std::fill_n(a, mb, ExactAcc<T>());
        add_partials<T>(a, P, n_live, kb, mb, i, gs);
        if (g == n_groups - 1) {
          T* out = dW + (k0 + i) * ld_dw + m0;
          for (int64_t j = 0; j < mb; ++j) out[j] = a[j].round();
        }
      }
    }
  }
}

#define TRIDENT_TILE_INSTANTIATE(T)                                                                                \
  template void tile_sum_acc_k<T>(const T*, int64_t, std::span<const int64_t>, ExactAcc<T>*);                      \
  template void tile_sum_round_k<T>(const T*, int64_t, int64_t, std::span<const int64_t>, T*);                     \
  template void tile_wgrad_acc_k<T>(const T*, int64_t, const T*, int64_t, int64_t, int64_t,                        \
                                    std::span<const int64_t>, ExactAcc<T>*, int64_t, bool);                        \
  template void tile_wgrad_k<T>(const T*, int64_t, const T*, int64_t, int64_t, int64_t, std::span<const int64_t>, \
                                T*, int64_t);
TRIDENT_TILE_INSTANTIATE(float)
TRIDENT_TILE_INSTANTIATE(double)
#undef TRIDENT_TILE_INSTANTIATE

}  // namespace trident::gemm_isa_impl::TRIDENT_GEMM_NS
