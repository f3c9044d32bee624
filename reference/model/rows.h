// Elementwise adds, row movement and the MoE combine of the reference model (docs/model.md "Ops"): the ops that
// layer_forward / moe_forward and their backward passes apply between the GEMM-like ops. The distributed step
// launches the same functions as kernels (parallel/step_kernels.h), so the single-rank model and the step share
// every operation and its order. Header-only: the element type is any copyable value (T, ExactAcc<T>, ...).
#pragma once
#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace trident::model {

// out (n) = a (n) + b (n), one rounding per element. out may alias a or b.
template <class T>
void residual_forward(T* out, const T* a, const T* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// dst (idx.size(), w): row j = src row idx[j].
template <class T>
void gather_rows(T* dst, const T* src, std::span<const int64_t> idx, int64_t w) {
  for (size_t j = 0; j < idx.size(); ++j) std::copy_n(src + idx[j] * w, w, dst + static_cast<int64_t>(j) * w);
}
// dst row idx[j] = src (idx.size(), w) row j.
template <class T>
void scatter_rows(T* dst, const T* src, std::span<const int64_t> idx, int64_t w) {
  for (size_t j = 0; j < idx.size(); ++j) std::copy_n(src + static_cast<int64_t>(j) * w, w, dst + idx[j] * w);
}

// MoE combine: out (N,d) row t = ((+0 + g[t,0]*yk[t*K+0]) + g[t,1]*yk[t*K+1]) + ..., k ascending (the selected
// experts in ascending id), each product and sum rounded. gates (N,K); yk (N*K, d).
template <class T>
void moe_combine_forward(T* out, const T* gates, const T* yk, int64_t N, int64_t d, int64_t K) {
  for (int64_t t = 0; t < N; ++t) {
    T* o = out + t * d;
    for (int64_t c = 0; c < d; ++c) o[c] = T(0);
    for (int64_t k = 0; k < K; ++k) {
      const T g = gates[t * K + k];
      const T* y = yk + (t * K + k) * d;
      for (int64_t c = 0; c < d; ++c) o[c] = o[c] + g * y[c];
    }
  }
}
// Its backward for the (token, slot) pairs tk[j] = t*K + k, j < n: dgates[tk] = sum_c dout[t,c]*yk[tk,c]
// (ascending c from +0), dyk (n, d) row j = gates[tk] * dout[t].
template <class T>
void moe_combine_backward(const T* dout, const T* gates, const T* yk, const int64_t* tk, int64_t n, int64_t d,
                          int64_t K, T* dgates, T* dyk) {
  for (int64_t j = 0; j < n; ++j) {
    const int64_t p = tk[j], t = p / K;
    const T g = gates[p];
    const T* dr = dout + t * d;
    const T* y = yk + p * d;
    T s = T(0);
    for (int64_t c = 0; c < d; ++c) {
      s = s + dr[c] * y[c];
      dyk[j * d + c] = g * dr[c];
    }
    dgates[p] = s;
  }
}
// The routed part of the input gradient: dx (N,d) row t = ((+0 + dxk[t*K+0]) + dxk[t*K+1]) + ...
template <class T>
void moe_dx_sum(T* dx, const T* dxk, int64_t N, int64_t d, int64_t K) {
  for (int64_t t = 0; t < N; ++t) {
    T* o = dx + t * d;
    for (int64_t c = 0; c < d; ++c) o[c] = T(0);
    for (int64_t k = 0; k < K; ++k) {
      const T* x = dxk + (t * K + k) * d;
      for (int64_t c = 0; c < d; ++c) o[c] = o[c] + x[c];
    }
  }
}

// Zig-zag context parallelism (docs/parallel.md section 3): a sequence is cut into 2cp position blocks; cp rank c
// holds blocks c and 2cp-1-c, so an all-gather over cp yields the blocks in gather order (slot 2c: block c, slot
// 2c+1: block 2cp-1-c). kv_zigzag_reorder moves 2cp blocks of `block` elements from gather order to position order
// (dst block b = src slot of b) or back (to_gather). dst and src do not overlap.
inline int64_t zigzag_slot(int64_t b, int64_t cp) { return b < cp ? 2 * b : 2 * (2 * cp - 1 - b) + 1; }
template <class T>
void kv_zigzag_reorder(T* dst, const T* src, int64_t cp, int64_t block, bool to_gather) {
  for (int64_t b = 0; b < 2 * cp; ++b) {
    const int64_t sl = zigzag_slot(b, cp);
    if (to_gather) std::copy_n(src + b * block, block, dst + sl * block);
    else std::copy_n(src + sl * block, block, dst + b * block);
  }
}

// The gather-order row of each of the 2cp * ch positions (ch per block): row zigzag_slot(j / ch) * ch + j % ch.
inline std::vector<int64_t> zigzag_gather_rows(int64_t cp, int64_t ch) {
  std::vector<int64_t> rows(static_cast<size_t>(2 * cp * ch));
  for (int64_t j = 0; j < 2 * cp * ch; ++j) rows[static_cast<size_t>(j)] = zigzag_slot(j / ch, cp) * ch + j % ch;
  return rows;
}

// Position order -> gather order in place, through the cycles of the block permutation, with one block of scratch
// (the key-side gradient accumulators, too large for a second copy).
template <class T>
void kv_zigzag_to_gather_inplace(T* x, T* scratch, int64_t cp, int64_t block) {
  std::vector<bool> done(static_cast<size_t>(2 * cp), false);
  for (int64_t b0 = 0; b0 < 2 * cp; ++b0) {
    if (done[static_cast<size_t>(b0)] || zigzag_slot(b0, cp) == b0) continue;
    std::copy_n(x + b0 * block, block, scratch);
    int64_t b = b0;
    do {
      const int64_t nb = zigzag_slot(b, cp);
      std::swap_ranges(scratch, scratch + block, x + nb * block);
      done[static_cast<size_t>(nb)] = true;
      b = nb;
    } while (b != b0);
  }
}

}  // namespace trident::model
