// Parameters of the reference model: names, shapes, flags, deterministic init, and the gradient
// accumulators (docs/model.md "Parameters").
//
// Names and shapes (y = x W, W stored [in, out]; per-head blocks head-major):
//   embed [V,d]; layers.{i}.attn_norm [d];
//   GQA layers.{i}.attn.wq [d,H*Dh], .wk [d,Hkv*Dh], .wv [d,Hkv*Dh], .wo [H*Dh,d];
//   MLA layers.{i}.attn.wq [d,H*(Dn+Dr)] (per head Dn nope then Dr rope), .wdkv [d,r+Dr] (r latent then Dr rope),
//       .kv_norm [r], .wuk [r,H*Dn], .wuv [r,H*Dv], .wo [H*Dv,d];
//   layers.{i}.ffn_norm [d]; dense layers.{i}.mlp.wg|wu [d,F], .wd [F,d];
//   MoE layers.{i}.moe.router [d,E], .router_bias [E] (buffer, not trained), .experts.wg|wu [E,d,Fe],
//       .experts.wd [E,Fe,d], shared .shared.wg|wu [d,Fs], .shared.wd [Fs,d];
//   final_norm [d]; lm_head [d,V].
// Order: embed, then per layer in the order above, then final_norm, lm_head (the index order of ParamSet).
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "reference/exact_acc.h"
#include "reference/model/config.h"
#include "reference/tensor.h"

namespace trident::model {

struct ParamInfo {
  std::string name;
  Shape shape;
  bool is_matrix = false;  // rank >= 2: AdamW weight decay applies
  bool trainable = true;   // false for buffers (router_bias)
  int64_t fan_in = 1;      // init scale a = 1/sqrt(fan_in) (embed: a = 1; norms: 1; router_bias: 0)
};

// The full ordered list for a config.
std::vector<ParamInfo> param_layout(const Config& cfg);

// Counter-based RNG for init and synthetic data: splitmix64 of (seed, stream, index).
uint64_t hash3(uint64_t seed, uint64_t stream, uint64_t index);
// Uniform double in [-1, 1) from the 53 high bits of hash3.
double uniform_pm1(uint64_t seed, uint64_t stream, uint64_t index);

template <class T>
struct ParamSet {
  std::vector<ParamInfo> info;
  std::vector<Tensor<T>> t;  // same order as info
  std::unordered_map<std::string, size_t> index;

  // Zero tensors with the layout of cfg.
  static ParamSet zeros(const Config& cfg);
  // Deterministic init: element k of parameter p is a * uniform_pm1(seed, p, k) rounded to T,
  // a = 1/sqrt(fan_in) (embed a = 1); norm gains 1; router_bias 0.
  static ParamSet init(const Config& cfg, uint64_t seed);

  size_t find(const std::string& name) const;  // throws naming the parameter
  Tensor<T>& operator[](const std::string& name) { return t[find(name)]; }
  const Tensor<T>& operator[](const std::string& name) const { return t[find(name)]; }
  bool has(const std::string& name) const { return index.count(name) != 0; }
  size_t size() const { return t.size(); }
  int64_t numel() const;
};

// Gradient accumulators: one ExactAcc<T> per element of every trainable parameter (empty for buffers).
// Every contribution of a step is added (tile partials, exact); the sum is rounded once into grads.
//
// Two modes, same bits (an exact sum rounded once does not depend on when it is rounded):
//  - full (zeros): every accumulator exists for the whole backward; finalize() rounds them all. The distributed
//    step's merges and the tests use this.
//  - streaming (streaming): accumulators exist only while their parameters' contributions arrive. The backward
//    open()s the parameters of one block (the LM head and final norm, one layer, the embedding), accumulates, and
//    close()s them: each accumulator is rounded into the sink ParamSet and reset to zero, and the space is reused
//    by the next block. Peak accumulator memory is the largest block's (one layer), not the whole model's, and
//    the space is allocated once per run, never re-faulted. finalize() then only checks every trainable
//    parameter was closed and zeroes the buffers' gradients.
template <class T>
struct GradAcc {
  std::vector<std::vector<ExactAcc<T>>> acc;  // full mode: acc[p] has numel(p) accumulators (empty if not trainable)
  static GradAcc zeros(const std::vector<ParamInfo>& info);
  static GradAcc streaming(const std::vector<ParamInfo>& info);
  bool is_streaming() const { return streaming_; }
  ExactAcc<T>* ptr(size_t p);  // streaming: p must be open
  void clear();  // all accumulators back to exact zero (streaming: nothing open, nothing closed yet)
  // Streaming: the gradients' destination for close(), set before each backward (full mode: unused).
  ParamSet<T>* sink = nullptr;
  // Streaming: zeroed accumulators for the trainable parameters among ps (nothing may be open); full: no-op.
  void open(const std::vector<size_t>& ps);
  // Streaming: sink->t[p] = round(acc) for every open parameter, accumulators reset; full: no-op.
  void close();
  // Full: grads.t[p] = round(acc[p]) for trainable p; zero for buffers. Streaming: checks that every trainable
  // parameter was closed since clear() and zeroes the buffers. grads must have the same layout.
  void finalize(ParamSet<T>& grads) const;

 private:
  bool streaming_ = false;
  std::vector<int64_t> numel_;                // per parameter (0 for buffers)
  std::vector<ExactAcc<T>> arena_;            // streaming: the open block's accumulators
  std::vector<std::pair<size_t, int64_t>> open_;  // streaming: (parameter, offset in arena_)
  std::vector<uint8_t> closed_;               // streaming: closed since clear()
};

extern template struct ParamSet<float>;
extern template struct ParamSet<double>;
extern template struct GradAcc<float>;
extern template struct GradAcc<double>;

}  // namespace trident::model
