// MoE FFN of the reference model (DESIGN.md section 3; docs/model.md "MoE"), in pieces the expert-parallel
// step can distribute: route (per token) -> per-expert row lists in (tile, token) order with tile segments
// -> expert SwiGLU on a row list (per row, batch-invariant) -> combine per token in increasing e.
// Backward splits dgrad (per row) from wgrad (tile reductions over an expert's row list), so wgrad can be
// delayed until all EP chunks are done.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "reference/exact_acc.h"
#include "reference/model/config.h"
#include "reference/model/ops.h"

namespace trident::model {

template <class T>
struct MoeW {
  const T* router = nullptr;  // (d, E)
  const T* bias = nullptr;    // (E) router_bias (buffer)
  const T *wg = nullptr, *wu = nullptr, *wd = nullptr;     // (E, d, Fe), (E, d, Fe), (E, Fe, d)
  const T *swg = nullptr, *swu = nullptr, *swd = nullptr;  // shared expert (d, Fs), (d, Fs), (Fs, d); null if Fs = 0
};
// Per-expert weight-gradient accumulators handed out one expert at a time (the single-rank Trainer's streaming
// accumulators, params.h): open(e) returns the accumulators of expert e's slices of wg, wu, wd (each pointing at
// the expert's first element), close() rounds them.
template <class T>
struct ExpertGradBlocks {
  virtual ~ExpertGradBlocks() = default;
  struct Slices {
    ExactAcc<T> *wg = nullptr, *wu = nullptr, *wd = nullptr;
  };
  virtual Slices open(int64_t e) = 0;
  virtual void close() = 0;
  // Instead of open/close: where expert e's rounded gradients go (its slices of wg, wu, wd), for a caller whose
  // one wgrad per tensor is the expert's whole contribution; all null (the default): not offered. Rounding each
  // exact sum where it is formed (wgrad_round) gives the bits of open, accumulate, close without streaming the
  // 56-byte accumulators through memory.
  struct Direct {
    T *wg = nullptr, *wu = nullptr, *wd = nullptr;
  };
  virtual Direct direct(int64_t /*e*/) { return {}; }
};

template <class T>
struct MoeG {
  ExactAcc<T>* router = nullptr;
  ExactAcc<T> *wg = nullptr, *wu = nullptr, *wd = nullptr;  // (E, ...) base pointers, or null with `experts`
  ExactAcc<T> *swg = nullptr, *swu = nullptr, *swd = nullptr;
  T *sdwg = nullptr, *sdwu = nullptr, *sdwd = nullptr;  // the shared expert's gradients rounded here instead, when set
  ExpertGradBlocks<T>* experts = nullptr;  // when set, moe_backward takes each expert's accumulators from it
};

// Rows routed to one expert, in (tile, token) order: tile by tile, token order inside a tile.
struct ExpertRows {
  std::vector<int64_t> row;   // (n_e) token row index
  std::vector<int32_t> slot;  // (n_e) k: sel[row, k] == e
  std::vector<int64_t> segs;  // (n_tiles + 1) segments of the n_e rows, one per token tile (may be empty)
};
// sel (N, K) ascending per row; segs: tile segments of the N rows. Returns E row lists.
std::vector<ExpertRows> route_rows(const int32_t* sel, int64_t N, int64_t K, int64_t E, std::span<const int64_t> segs);

template <class T>
struct ExpertActs {  // one expert's rows
  std::vector<T> x, ug, uu, h, y;  // (n_e, d), (n_e, Fe) x3, (n_e, d)
};
template <class T>
struct MoeActs {
  std::vector<T> logits, scores;  // (N, E)
  std::vector<int32_t> sel;       // (N, K) selected experts, ascending
  std::vector<T> gates;           // (N, K)
  std::vector<ExpertRows> rows;   // (E)
  std::vector<ExpertActs<T>> ex;  // (E)
  std::vector<T> yk;              // (N*K, d) routed outputs: row t*K+k = expert sel[t,k]'s output for token t
  std::vector<T> sug, suu, sh, sy;  // shared expert (N, Fs) x3, (N, d)
  std::vector<int64_t> load;      // (E) tokens routed to each expert (integer)
};

// Expert e on its row list: x (n, d) -> y (n, d) (gathered rows; any n; per row batch-invariant).
template <class T>
void expert_forward(Policy pol, const Config& cfg, const MoeW<T>& W, int64_t e, int64_t n, ExpertActs<T>& A);
// dy (n, d) -> dx (n, d); fills dug, duu (n, Fe) for the (delayed) wgrad.
template <class T>
void expert_backward_dgrad(Policy pol, const Config& cfg, const MoeW<T>& W, int64_t e, int64_t n,
                           const ExpertActs<T>& A, const T* dy, T* dug, T* duu, T* dx);
template <class T>
void expert_backward_wgrad(Policy pol, const Config& cfg, const MoeG<T>& G, int64_t e, const ExpertActs<T>& A,
                           const T* dy, const T* dug, const T* duu, std::span<const int64_t> segs);

// Whole layer on the local rows (single rank): a (N, d) normed input -> out (N, d).
// out[t] = +0, then += gate_k * y_e(t) for selected e ascending (product rounded, then added), then += shared(t).
template <class T>
void moe_forward(Policy pol, const Config& cfg, const MoeW<T>& W, const T* a, int64_t N,
                 std::span<const int64_t> segs, MoeActs<T>& A, T* out);
// dout (N, d) -> da (N, d) = +0, += expert dx for selected e ascending, += shared dx, += router dx.
// dgate_k = dot(dout[t], y_e(t)) (ascending c); dy_e(t) = gate_k * dout[t].
template <class T>
void moe_backward(Policy pol, const Config& cfg, const MoeW<T>& W, const MoeG<T>& G, const T* a, int64_t N,
                  std::span<const int64_t> segs, const MoeActs<T>& A, const T* dout, T* da);

}  // namespace trident::model
