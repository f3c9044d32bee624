// The attention core's per-instruction-set copies (reference/model/attn_core_kernel.h): what they share, and the
// declarations reference/model/attention.cpp dispatches to (the copy the GEMM runs: gemm_isa()).
#pragma once
#include <cstdint>
#include <span>

#include "reference/exact_acc.h"
#include "reference/model/attention.h"

namespace trident::model::attn_isa {

// Where the key side goes. dkv given, krow null: key j's accumulators are dkv row j, added into. dkv and krow given
// (a permutation of [0, S)): they are row krow[j], written: the first tile reaching a key starts from an empty
// accumulator instead of reading one, and the keys no tile reaches are cleared at the end, so no row of dkv is read
// before it is written (the bits of a zeroed dkv). part given (with krow): no accumulators; tile t's partial for key j
// is stored at row (krow[j] / blk * nt + t) * blk + krow[j] % blk of part (P values each, nt tiles), +0 where the tile
// has no term for the key.
template <class T>
struct KeySide {
  ExactAcc<T>* dkv = nullptr;
  const int64_t* krow = nullptr;
  T* part = nullptr;
  int64_t blk = 0;
};

#define TRIDENT_ATTN_CORE_DECLARE(ns)                                                                                 \
  namespace ns {                                                                                                      \
  template <class T>                                                                                                  \
  void core_forward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, const int64_t* qdoc, int64_t Nq,  \
                    const T* kv, int64_t S, T* o, T* stats);                                                          \
  template <class T>                                                                                                  \
  void core_backward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, const int64_t* qdoc, int64_t Nq, \
                     const T* kv, int64_t S, const T* o, const T* stats, const T* dO, std::span<const int64_t> qsegs, \
                     T* dq, KeySide<T> ks);                                                                           \
  }
TRIDENT_ATTN_CORE_DECLARE(base)
#if TRIDENT_GEMM_DISPATCH
TRIDENT_ATTN_CORE_DECLARE(avx2)
TRIDENT_ATTN_CORE_DECLARE(avx512)
#endif
#undef TRIDENT_ATTN_CORE_DECLARE

}  // namespace trident::model::attn_isa
