#include "reference/model/ops.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "reference/bf16.h"
#include "reference/check.h"
#include "reference/dmath.h"
#include "reference/gemm.h"
#include "reference/profile.h"
#include "reference/tile_reduce.h"

namespace trident::model {

// ---- TokenRows ---------------------------------------------------------------------------------------------
TokenRows TokenRows::contiguous(int64_t B, int64_t S, int64_t T) {
  TD_CHECK(B > 0 && S > 0 && T > 0, "TokenRows::contiguous: B, S, T must be > 0 (B = {}, S = {}, T = {})", B, S, T);
  TokenRows r;
  r.n = B * S;
  r.seq.resize(static_cast<size_t>(r.n));
  r.pos.resize(static_cast<size_t>(r.n));
  r.segs.push_back(0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t p = 0; p < S; ++p) {
      r.seq[static_cast<size_t>(b * S + p)] = b;
      r.pos[static_cast<size_t>(b * S + p)] = p;
    }
    for (int64_t p = T; p < S; p += T) r.segs.push_back(b * S + p);
    r.segs.push_back((b + 1) * S);
  }
  return r;
}

std::vector<TokenRows::Run> TokenRows::sequence_runs() const {
  std::vector<Run> runs;
  for (int64_t i = 0; i < n;) {
    int64_t j = i;
    while (j < n && seq[static_cast<size_t>(j)] == seq[static_cast<size_t>(i)]) ++j;
    runs.push_back({seq[static_cast<size_t>(i)], i, j});
    i = j;
  }
  return runs;
}

std::vector<int64_t> TokenRows::segs_in(int64_t begin, int64_t end) const {
  std::vector<int64_t> out;
  for (int64_t s : segs)
    if (s >= begin && s <= end) out.push_back(s - begin);
  TD_CHECK(!out.empty() && out.front() == 0 && out.back() == end - begin,
           "TokenRows::segs_in: rows [{}, {}) do not start and end on tile boundaries", begin, end);
  return out;
}

// ---- GEMM helpers -------------------------------------------------------------------------------------------
namespace {
// Copy a (rows, cols) strided block into a contiguous buffer, rounding to bf16.
void copy_round(const float* src, int64_t ld, int64_t rows, int64_t cols, std::vector<float>& dst) {
  dst.resize(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[static_cast<size_t>(i * cols + j)] = round_bf16(src[i * ld + j]);
}

// A weight gradient's operands as the policy computes them: under bf16 (float storage) X and dY rounded to bf16
// into dense copies (ld K and M), else as given; f(x, ldx, dy, ldy).
template <class T, class F>
void with_wgrad_operands(Policy pol, const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M,
                         std::span<const int64_t> segs, F&& f) {
  if constexpr (std::is_same_v<T, float>) {
    if (pol == Policy::bf16) {
      const int64_t rows = segs.back();
      std::vector<float> x, dy;
      copy_round(X, ldx, rows, K, x);
      copy_round(dY, ldy, rows, M, dy);
      f(x.data(), K, dy.data(), M);
      return;
    }
  }
  f(X, ldx, dY, ldy);
}
}  // namespace

template <class T>
void mm(Policy pol, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, bool trans_b,
        T* C, int64_t ldc) {
  prof::OpSection prof_section(prof::Op::gemm, prof::gemm_flops(M, N, K));  // bf16: its operand copies too
  if (M <= 0 || N <= 0) return;
  if constexpr (std::is_same_v<T, float>) {
    if (pol == Policy::bf16) {
      std::vector<float> a, b;
      copy_round(A, lda, M, K, a);
      if (trans_b) copy_round(B, ldb, N, K, b);
      else copy_round(B, ldb, K, N, b);
      gemm<float>(M, N, K, a.data(), K, b.data(), trans_b ? K : N, trans_b, C, ldc);
      return;
    }
  }
  gemm<T>(M, N, K, A, lda, B, ldb, trans_b, C, ldc);
}

template <class T>
void wgrad_acc(Policy pol, const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M,
               std::span<const int64_t> segs, ExactAcc<T>* acc) {
  wgrad_acc_block<T>(pol, X, ldx, dY, ldy, K, M, segs, acc, M);
}

template <class T>
void wgrad_acc_block(Policy pol, const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M,
                     std::span<const int64_t> segs, ExactAcc<T>* acc, int64_t ld_acc) {
  if (K <= 0 || M <= 0 || segs.empty() || segs.back() == segs.front()) return;
  prof::OpSection prof_section(prof::Op::tile_reduce);
  with_wgrad_operands<T>(pol, X, ldx, dY, ldy, K, M, segs, [&](const T* x, int64_t lx, const T* dy, int64_t ly) {
    tile_wgrad_acc<T>(x, lx, dy, ly, K, M, segs, acc, ld_acc);
  });
}

template <class T>
void wgrad_partials(Policy pol, const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M,
                    std::span<const int64_t> segs, const TilePartials<T>& out, int64_t ld) {
  if (K <= 0 || M <= 0) return;
  prof::OpSection prof_section(prof::Op::tile_reduce);
  if (segs.empty() || segs.back() == segs.front()) {  // no rows: every tile empty, every partial +0
    tile_wgrad_partials<T>(X, ldx, dY, ldy, K, M, segs, out, ld);
    return;
  }
  with_wgrad_operands<T>(pol, X, ldx, dY, ldy, K, M, segs, [&](const T* x, int64_t lx, const T* dy, int64_t ly) {
    tile_wgrad_partials<T>(x, lx, dy, ly, K, M, segs, out, ld);
  });
}

template <class T>
void wgrad_round(Policy pol, const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M,
                 std::span<const int64_t> segs, T* dW) {
  if (K <= 0 || M <= 0) return;
  if (segs.empty() || segs.back() == segs.front()) {  // no rows: the exact sum is zero
    std::fill_n(dW, K * M, T(0));
    return;
  }
  prof::OpSection prof_section(prof::Op::tile_reduce);
  with_wgrad_operands<T>(pol, X, ldx, dY, ldy, K, M, segs, [&](const T* x, int64_t lx, const T* dy, int64_t ly) {
    tile_wgrad<T>(x, lx, dy, ly, K, M, segs, dW);
  });
}

template <class T>
void sum_acc(const T* x, int64_t J, std::span<const int64_t> segs, ExactAcc<T>* acc) {
  if (J <= 0 || segs.empty() || segs.back() == segs.front()) return;
  prof::OpSection prof_section(prof::Op::tile_reduce);
  tile_sum_acc<T>(x, J, segs, acc);
}

// ---- embedding ----------------------------------------------------------------------------------------------
template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* embed, int64_t N, int64_t d, int64_t V) {
  prof::OpSection prof_section(prof::Op::embedding);
  for (int64_t r = 0; r < N; ++r) {
    const int32_t id = tokens[r];
    if (id < 0 || id >= V) fail(fmt::format("token id {} at row {} is out of range [0, {})", id, r, V));
    std::copy(embed + id * d, embed + (id + 1) * d, out + r * d);
  }
}

namespace {

// Tile t's partials of the embedding gradient: per id its rows (ids, in first-seen order; -1 rows skipped) summed in
// row order from +0 into part (one row of d per id). V > 0 checks each id against it.
template <class T>
void embedding_tile_partials(const int32_t* tokens, const T* dout, int64_t d, int64_t V, std::span<const int64_t> segs,
                             size_t t, std::vector<int32_t>& ids, std::vector<T>& part) {
  ids.clear();
  part.clear();
  for (int64_t r = segs[t]; r < segs[t + 1]; ++r) {  // row order inside the tile
    const int32_t id = tokens[r];
    if (id < 0) continue;  // outside the caller's row slice
    TD_CHECK(V <= 0 || id < V, "embedding_backward: token id {} at row {} is out of range [0, {})", id, r, V);
    size_t u = std::find(ids.begin(), ids.end(), id) - ids.begin();
    if (u == ids.size()) {
      ids.push_back(id);
      part.resize(part.size() + static_cast<size_t>(d), T(0));
    }
    T* p = part.data() + u * static_cast<size_t>(d);
    const T* g = dout + r * d;
    for (int64_t c = 0; c < d; ++c) p[c] = p[c] + g[c];
  }
}

}  // namespace

template <class T>
void embedding_backward(ExactAcc<T>* dembed, const int32_t* tokens, const T* dout, int64_t N, int64_t d,
                        std::span<const int64_t> segs) {
  prof::OpSection prof_section(prof::Op::tile_reduce);
  std::vector<int32_t> ids;
  std::vector<T> part;
  for (size_t t = 0; t + 1 < segs.size(); ++t) {
    embedding_tile_partials<T>(tokens, dout, d, 0, segs, t, ids, part);
    for (size_t u = 0; u < ids.size(); ++u) {
      ExactAcc<T>* a = dembed + static_cast<int64_t>(ids[u]) * d;
      const T* p = part.data() + u * static_cast<size_t>(d);
      for (int64_t c = 0; c < d; ++c) a[c].add(p[c]);
    }
  }
}

template <class T>
void embedding_backward_partials(const TilePartials<T>& dembed, const int32_t* tokens, const T* dout, int64_t N,
                                 int64_t d, std::span<const int64_t> segs) {
  prof::OpSection prof_section(prof::Op::tile_reduce);
  (void)N;
  TD_CHECK(dembed.base != nullptr && dembed.row == d && dembed.off == 0,
           "embedding_backward: a partial buffer of rows of {} values (got rows of {})", d, dembed.row);
  TD_CHECK_EQ(static_cast<int64_t>(segs.size()) - 1, dembed.n_tiles, "embedding_backward: segs' tiles");
  std::fill_n(dembed.base, dembed.size(), T(0));  // a (row, tile) without a term: +0
  const int64_t rows = dembed.blocks * dembed.block_rows;
  std::vector<int32_t> ids;
  std::vector<T> part;
  for (size_t t = 0; t + 1 < segs.size(); ++t) {
    embedding_tile_partials<T>(tokens, dout, d, rows, segs, t, ids, part);
    for (size_t u = 0; u < ids.size(); ++u)
      std::copy_n(part.data() + u * static_cast<size_t>(d), d,
                  dembed.at(static_cast<int64_t>(t), static_cast<int64_t>(ids[u]) * d));
  }
}

template <class T>
void embedding_backward_round(T* dembed, const int32_t* tokens, const T* dout, int64_t N, int64_t d, int64_t V,
                              std::span<const int64_t> segs) {
  prof::OpSection prof_section(prof::Op::tile_reduce);
  std::fill_n(dembed, V * d, T(0));  // a row without a term: +0
  // Every (tile, id) partial as embedding_backward forms it, tagged with its id; then each id's partials summed exactly
  // and rounded once (tile_sum_round over one-row tiles), written into its row.
  std::vector<int32_t> ids, tag;
  std::vector<T> part, all;
  for (size_t t = 0; t + 1 < segs.size(); ++t) {
    embedding_tile_partials<T>(tokens, dout, d, V, segs, t, ids, part);
    tag.insert(tag.end(), ids.begin(), ids.end());
    all.insert(all.end(), part.begin(), part.end());
  }
  std::vector<size_t> order(tag.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tag[a] < tag[b]; });
  std::vector<T> rows;
  std::vector<int64_t> one_row;
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    rows.clear();
    while (j < order.size() && tag[order[j]] == tag[order[i]]) {
      rows.insert(rows.end(), all.begin() + static_cast<std::ptrdiff_t>(order[j] * static_cast<size_t>(d)),
                  all.begin() + static_cast<std::ptrdiff_t>((order[j] + 1) * static_cast<size_t>(d)));
      ++j;
    }
    one_row.resize(j - i + 1);
    for (size_t u = 0; u < one_row.size(); ++u) one_row[u] = static_cast<int64_t>(u);
    tile_sum_round<T>(rows.data(), d, d, one_row, dembed + static_cast<int64_t>(tag[order[i]]) * d);
    i = j;
  }
}

// ---- RMSNorm ------------------------------------------------------------------------------------------------
template <class T>
void rmsnorm_forward(const T* x, int64_t ldx, const T* g, int64_t N, int64_t d, double eps, T* y, int64_t ldy,
                     T* rinv) {
  prof::OpSection prof_section(prof::Op::rmsnorm);
  const T e = static_cast<T>(eps);
  const T dd = static_cast<T>(d);
  for (int64_t r = 0; r < N; ++r) {
    const T* xr = x + r * ldx;
    T ss = T(0);
    for (int64_t i = 0; i < d; ++i) ss = ss + xr[i] * xr[i];
    const T ri = dm::rsqrt(ss / dd + e);
    rinv[r] = ri;
    T* yr = y + r * ldy;
    for (int64_t i = 0; i < d; ++i) yr[i] = (xr[i] * ri) * g[i];
  }
}

template <class T>
void rmsnorm_backward(const T* dy, int64_t lddy, const T* x, int64_t ldx, const T* rinv, const T* g, int64_t N,
                      int64_t d, std::span<const int64_t> segs, T* dx, int64_t lddx, ExactAcc<T>* dg) {
  prof::OpSection prof_section(prof::Op::rmsnorm);
  const T dd = static_cast<T>(d);
  std::vector<T> prod(dg ? static_cast<size_t>(N * d) : 0);  // (N,d) dy*xhat, the per-token gain terms
  std::vector<T> dxh(static_cast<size_t>(d)), xh(static_cast<size_t>(d));
  for (int64_t r = 0; r < N; ++r) {
    const T* xr = x + r * ldx;
    const T* dyr = dy + r * lddy;
    const T ri = rinv[r];
    T c = T(0);
    for (int64_t i = 0; i < d; ++i) {
      xh[i] = xr[i] * ri;
      dxh[i] = dyr[i] * g[i];
      c = c + dxh[i] * xh[i];
      if (dg) prod[static_cast<size_t>(r * d + i)] = dyr[i] * xh[i];
    }
    c = c / dd;
    T* dxr = dx + r * lddx;
    for (int64_t i = 0; i < d; ++i) dxr[i] = ri * (dxh[i] - xh[i] * c);
  }
  if (dg) sum_acc<T>(prod.data(), d, segs, dg);
}

// ---- RoPE ---------------------------------------------------------------------------------------------------
template <class T>
RopeTable<T> rope_table(int64_t max_pos, int64_t D, double theta) {
  prof::OpSection prof_section(prof::Op::rope);
  TD_CHECK(D > 0 && D % 2 == 0, "rope_table: width must be even and > 0 (got {})", D);
  RopeTable<T> t;
  t.D = D;
  t.max_pos = max_pos;
  const int64_t h = D / 2;
  t.cos.resize(static_cast<size_t>(max_pos * h));
  t.sin.resize(static_cast<size_t>(max_pos * h));
  std::vector<double> inv(static_cast<size_t>(h));
  for (int64_t i = 0; i < h; ++i) inv[i] = dm::pow(theta, -static_cast<double>(2 * i) / static_cast<double>(D));
  for (int64_t p = 0; p < max_pos; ++p)
    for (int64_t i = 0; i < h; ++i) {
      const double ang = static_cast<double>(p) * inv[i];
      t.cos[static_cast<size_t>(p * h + i)] = static_cast<T>(dm::cos(ang));
      t.sin[static_cast<size_t>(p * h + i)] = static_cast<T>(dm::sin(ang));
    }
  return t;
}

template <class T>
void rope_forward(T* x, int64_t ldx, int64_t n_heads, int64_t head_stride, const int64_t* pos, int64_t N,
                  const RopeTable<T>& tab) {
  prof::OpSection prof_section(prof::Op::rope);
  const int64_t h = tab.D / 2;
  for (int64_t r = 0; r < N; ++r) {
    TD_CHECK(pos[r] >= 0 && pos[r] < tab.max_pos, "rope: position {} outside the table [0, {})", pos[r], tab.max_pos);
    const T* c = tab.cos.data() + pos[r] * h;
    const T* s = tab.sin.data() + pos[r] * h;
    for (int64_t hd = 0; hd < n_heads; ++hd) {
      T* u = x + r * ldx + hd * head_stride;
      for (int64_t i = 0; i < h; ++i) {
        const T a = u[i], b = u[i + h];
        u[i] = a * c[i] - b * s[i];
        u[i + h] = b * c[i] + a * s[i];
      }
    }
  }
}

template <class T>
void rope_backward(T* dx, int64_t ldx, int64_t n_heads, int64_t head_stride, const int64_t* pos, int64_t N,
                   const RopeTable<T>& tab) {
  prof::OpSection prof_section(prof::Op::rope);
  const int64_t h = tab.D / 2;
  for (int64_t r = 0; r < N; ++r) {
    TD_CHECK(pos[r] >= 0 && pos[r] < tab.max_pos, "rope: position {} outside the table [0, {})", pos[r], tab.max_pos);
    const T* c = tab.cos.data() + pos[r] * h;
    const T* s = tab.sin.data() + pos[r] * h;
    for (int64_t hd = 0; hd < n_heads; ++hd) {
      T* u = dx + r * ldx + hd * head_stride;
      for (int64_t i = 0; i < h; ++i) {
        const T a = u[i], b = u[i + h];
        u[i] = a * c[i] + b * s[i];
        u[i + h] = b * c[i] - a * s[i];
      }
    }
  }
}

// ---- SwiGLU -------------------------------------------------------------------------------------------------
template <class T>
void swiglu_forward(Policy pol, const T* x, const T* wg, const T* wu, const T* wd, int64_t N, int64_t d, int64_t F,
                    T* ug, T* uu, T* h, T* y) {
  prof::OpSection prof_section(prof::Op::swiglu);
  if (N == 0) return;
  mm<T>(pol, N, F, d, x, d, wg, F, false, ug, F);
  mm<T>(pol, N, F, d, x, d, wu, F, false, uu, F);
  dm::sigmoid_silu_n(ug, static_cast<T*>(nullptr), h, N * F);  // silu's bits, many elements at once
  for (int64_t i = 0; i < N * F; ++i) h[i] = h[i] * uu[i];
  mm<T>(pol, N, d, F, h, F, wd, d, false, y, d);
}

template <class T>
void swiglu_backward_dgrad(Policy pol, const T* dy, const T* wg, const T* wu, const T* wd, const T* ug, const T* uu,
                           int64_t N, int64_t d, int64_t F, T* dug, T* duu, T* dx) {
  prof::OpSection prof_section(prof::Op::swiglu);
  if (N == 0) return;
  std::vector<T> dh(static_cast<size_t>(N * F)), t2(static_cast<size_t>(N * d));
  mm<T>(pol, N, F, d, dy, d, wd, d, true, dh.data(), F);
  dm::sigmoid_silu_n(ug, dug, duu, N * F);  // sigmoid into dug, silu into duu: the scalar functions' bits
  for (int64_t i = 0; i < N * F; ++i) {
    const T sg = dug[i];
    dug[i] = (dh[i] * uu[i]) * (sg * (T(1) + ug[i] * (T(1) - sg)));
    duu[i] = dh[i] * duu[i];
  }
  mm<T>(pol, N, d, F, dug, F, wg, F, true, dx, d);
  mm<T>(pol, N, d, F, duu, F, wu, F, true, t2.data(), d);
  for (int64_t i = 0; i < N * d; ++i) dx[i] = dx[i] + t2[i];
}

template <class T>
void swiglu_backward_wgrad(Policy pol, const T* x, const T* h, const T* dy, const T* dug, const T* duu, int64_t d,
                           int64_t F, std::span<const int64_t> segs, ExactAcc<T>* dwg, ExactAcc<T>* dwu,
                           ExactAcc<T>* dwd) {
  wgrad_acc<T>(pol, x, d, dug, F, d, F, segs, dwg);
  wgrad_acc<T>(pol, x, d, duu, F, d, F, segs, dwu);
  wgrad_acc<T>(pol, h, F, dy, d, F, d, segs, dwd);
}

template <class T>
void swiglu_backward_wgrad_round(Policy pol, const T* x, const T* h, const T* dy, const T* dug, const T* duu,
                                 int64_t d, int64_t F, std::span<const int64_t> segs, T* dwg, T* dwu, T* dwd) {
  wgrad_round<T>(pol, x, d, dug, F, d, F, segs, dwg);
  wgrad_round<T>(pol, x, d, duu, F, d, F, segs, dwu);
  wgrad_round<T>(pol, h, F, dy, d, F, d, segs, dwd);
}

// ---- router -------------------------------------------------------------------------------------------------
template <class T>
void router_forward(Policy pol, const T* a, const T* wr, const T* bias, int64_t N, int64_t d, int64_t E, int64_t K,
                    double alpha, T* logits, T* scores, int32_t* sel, T* gates) {
  prof::OpSection prof_section(prof::Op::moe_router);
  if (N == 0) return;
  mm<T>(pol, N, E, d, a, d, wr, E, false, logits, E);
  const T al = static_cast<T>(alpha);
  std::vector<char> taken(static_cast<size_t>(E));
  std::vector<T> biased(static_cast<size_t>(E));
  dm::sigmoid_silu_n(logits, scores, static_cast<T*>(nullptr), N * E);  // sigmoid's bits, many at once
  for (int64_t r = 0; r < N; ++r) {
    T* s = scores + r * E;
    for (int64_t e = 0; e < E; ++e) {
      TD_CHECK(!std::isnan(s[e]), "router: NaN score at row {} expert {}", r, e);
      biased[e] = s[e] + bias[e];
      taken[e] = 0;
    }
    int32_t* sr = sel + r * K;
    for (int64_t k = 0; k < K; ++k) {  // k-th largest biased score; strict '>' keeps the lower index on ties
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e)
        if (!taken[e] && (best < 0 || biased[e] > biased[best])) best = e;
      taken[best] = 1;
      sr[k] = static_cast<int32_t>(best);
    }
    std::sort(sr, sr + K);
    T ssum = T(0);
    for (int64_t k = 0; k < K; ++k) ssum = ssum + s[sr[k]];
    for (int64_t k = 0; k < K; ++k) gates[r * K + k] = (al * s[sr[k]]) / ssum;
  }
}

template <class T>
void router_backward(const T* dgates, const T* scores, const int32_t* sel, int64_t N, int64_t E, int64_t K,
                     double alpha, T* dlogits) {
  prof::OpSection prof_section(prof::Op::moe_router);
  const T al = static_cast<T>(alpha);
  for (int64_t r = 0; r < N; ++r) {
    const T* s = scores + r * E;
    const int32_t* sr = sel + r * K;
    const T* dg = dgates + r * K;
    T* dl = dlogits + r * E;
    for (int64_t e = 0; e < E; ++e) dl[e] = T(0);
    T ssum = T(0), c = T(0);
    for (int64_t k = 0; k < K; ++k) ssum = ssum + s[sr[k]];
    for (int64_t k = 0; k < K; ++k) c = c + dg[k] * s[sr[k]];
    const T cs = c / ssum;
    for (int64_t k = 0; k < K; ++k) {
      const T se = s[sr[k]];
      const T ds = (al * (dg[k] - cs)) / ssum;
      dl[sr[k]] = ds * (se * (T(1) - se));
    }
  }
}

// ---- instantiations -----------------------------------------------------------------------------------------
#define TD_MODEL_OPS(T)                                                                                            \
  template void mm<T>(Policy, int64_t, int64_t, int64_t, const T*, int64_t, const T*, int64_t, bool, T*, int64_t); \
  template void wgrad_acc<T>(Policy, const T*, int64_t, const T*, int64_t, int64_t, int64_t,                       \
                             std::span<const int64_t>, ExactAcc<T>*);                                              \
  template void wgrad_acc_block<T>(Policy, const T*, int64_t, const T*, int64_t, int64_t, int64_t,                 \
                                   std::span<const int64_t>, ExactAcc<T>*, int64_t);                               \
  template void wgrad_partials<T>(Policy, const T*, int64_t, const T*, int64_t, int64_t, int64_t,                  \
                                  std::span<const int64_t>, const TilePartials<T>&, int64_t);                      \
  template void wgrad_round<T>(Policy, const T*, int64_t, const T*, int64_t, int64_t, int64_t,                     \
                               std::span<const int64_t>, T*);                                                      \
  template void sum_acc<T>(const T*, int64_t, std::span<const int64_t>, ExactAcc<T>*);                             \
  template void embedding_forward<T>(T*, const int32_t*, const T*, int64_t, int64_t, int64_t);                     \
  template void embedding_backward_round<T>(T*, const int32_t*, const T*, int64_t, int64_t, int64_t,              \
                                            std::span<const int64_t>);                                              \
  template void embedding_backward_partials<T>(const TilePartials<T>&, const int32_t*, const T*, int64_t, int64_t,  \
                                               std::span<const int64_t>);                                           \
  template void embedding_backward<T>(ExactAcc<T>*, const int32_t*, const T*, int64_t, int64_t,                    \
                                      std::span<const int64_t>);                                                   \
  template void rmsnorm_forward<T>(const T*, int64_t, const T*, int64_t, int64_t, double, T*, int64_t, T*);        \
  template void rmsnorm_backward<T>(const T*, int64_t, const T*, int64_t, const T*, const T*, int64_t, int64_t,    \
                                    std::span<const int64_t>, T*, int64_t, ExactAcc<T>*);                          \
  template RopeTable<T> rope_table<T>(int64_t, int64_t, double);                                                   \
  template void rope_forward<T>(T*, int64_t, int64_t, int64_t, const int64_t*, int64_t, const RopeTable<T>&);      \
  template void rope_backward<T>(T*, int64_t, int64_t, int64_t, const int64_t*, int64_t, const RopeTable<T>&);     \
  template void swiglu_forward<T>(Policy, const T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, T*,   \
                                  T*, T*, T*);                                                                     \
  template void swiglu_backward_dgrad<T>(Policy, const T*, const T*, const T*, const T*, const T*, const T*,       \
                                         int64_t, int64_t, int64_t, T*, T*, T*);                                   \
  template void swiglu_backward_wgrad<T>(Policy, const T*, const T*, const T*, const T*, const T*, int64_t,        \
                                         int64_t, std::span<const int64_t>, ExactAcc<T>*, ExactAcc<T>*,            \
                                         ExactAcc<T>*);                                                            \
  template void swiglu_backward_wgrad_round<T>(Policy, const T*, const T*, const T*, const T*, const T*, int64_t,  \
                                               int64_t, std::span<const int64_t>, T*, T*, T*);                     \
  template void router_forward<T>(Policy, const T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t,        \
                                  double, T*, T*, int32_t*, T*);                                                   \
  template void router_backward<T>(const T*, const T*, const int32_t*, int64_t, int64_t, int64_t, double, T*);
TD_MODEL_OPS(float)
TD_MODEL_OPS(double)
#undef TD_MODEL_OPS

}  // namespace trident::model
