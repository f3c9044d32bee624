// Parameters of the reference model: names, shapes, flags, deterministic init, and the gradient
// accumulators (docs/model.md "Parameters").
//
// Names and shapes (y = x W, W stored [in, out]; per-head blocks head-major):
//   embed [V,d]; layers.{i}.attn_norm [d];
//   GQA layers.{i}.attn.wq [d,H*Dh], .wk [d,Hkv*Dh], .wv [d,Hkv*Dh], .wo [H*Dh,d];
//   MLA layers.{i}.attn.wq [d,H*(Dn+Dr)] (per head Dn nope then Dr rope), .wdkv [d,r+Dr] (r latent then Dr rope),
//       .kv_norm [r], .wuk [r,H*Dn], .wuv [r,H*Dv], .wo [H*Dv,d];
//       with DSA also .wiq [d,Hi*Di], .wiw [d,Hi], .wik [d,Di] (the lightning indexer);
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
//    open()s a block (the LM head and final norm; one layer without its routed experts; one expert's three weight
//    slices inside its layer; the embedding), accumulates, and close()s it: each accumulator is rounded into the
//    sink ParamSet and reset to zero, and the space is reused by the next block at that depth. Blocks nest as a
//    stack (an expert's slices inside its layer), each depth with its own space, allocated once per run and never
//    re-faulted. Peak accumulator memory is the largest block's per depth, not the whole model's. finalize() then
//    only checks that every element of every trainable parameter was closed and zeroes the buffers' gradients.
template <class T>
struct GradAcc {
  struct Slice {  // elements [begin, begin + count) of parameter p
    size_t p = 0;
    int64_t begin = 0, count = 0;
  };
  std::vector<std::vector<ExactAcc<T>>> acc;  // full mode: acc[p] has numel(p) accumulators (empty if not trainable)
  static GradAcc zeros(const std::vector<ParamInfo>& info);
  static GradAcc streaming(const std::vector<ParamInfo>& info);
  bool is_streaming() const { return streaming_; }
  // Full: the accumulators of p. Streaming: those of p's open slice (its first element), p must be open.
  ExactAcc<T>* ptr(size_t p);
  bool is_open(size_t p) const;  // streaming: p has an open slice; full: true
  void clear();  // all accumulators back to exact zero (streaming: nothing open, nothing closed yet)
  // Streaming: the gradients' destination for close(), set before each backward (full mode: unused).
  ParamSet<T>* sink = nullptr;
  // Streaming: a new block on top of the open ones with zeroed accumulators for the trainable parameters among ps
  // (whole) or for the given slices; a parameter may have one open slice at a time. Full: no-op.
  void open(const std::vector<size_t>& ps);
  void open_slices(const std::vector<Slice>& slices);
  // Streaming: closes the top block: sink->t[p][begin + i] = round(acc[i]) for each of its slices, accumulators
  // reset. Full: no-op.
  void close();
  // Streaming: the gradients' destinations (in sink) of these slices, counted as closed now: the caller writes each
  // slice's rounded sum itself (a slice whose sum is formed and rounded in one place, model/ops.h wgrad_round),
  // instead of open, accumulate, close. Same checks as open_slices. Empty when not offered: full accumulators, or a
  // slice of a parameter that is not trainable.
  std::vector<T*> direct(const std::vector<Slice>& slices);
  // Full: grads.t[p] = round(acc[p]) for trainable p; zero for buffers. Streaming: checks that every trainable
  // parameter was closed since clear() and zeroes the buffers. grads must have the same layout.
  void finalize(ParamSet<T>& grads) const;

 private:
  struct Part {
    Slice s;
    int64_t off = 0;  // in the block's arena
  };
  void push(std::vector<Slice> slices);
  bool streaming_ = false;
  std::vector<int64_t> numel_;                     // per parameter (0 for buffers)
  std::vector<std::vector<ExactAcc<T>>> arenas_;  // streaming: per depth; zero outside the open blocks' parts
  std::vector<std::vector<Part>> blocks_;          // streaming: the open blocks, innermost last
  std::vector<int64_t> done_;                      // streaming: elements of each parameter closed since clear()
};

// Where a parameter's gradient contributions arrive in the single-rank backward (model.cpp): the block of the
// streaming GradAcc it belongs to. The LM head with the final norm first, then layer i (without its routed
// experts) from the last layer down, inside it layer i's routed experts (one expert's slices at a time), then
// the embedding. Throws on a name outside param_layout's.
struct GradBlock {
  enum class Kind { head, layer, experts, embed };
  Kind kind = Kind::head;
  int64_t layer = -1;  // layer and experts: the layer index
};
GradBlock grad_block(const std::string& name);

// The most accumulators the single-rank backward's streaming GradAcc holds at once: the largest outer block
// (head, one layer, embedding) plus one expert's three weight slices. For memory estimates.
int64_t streaming_peak_accumulators(const Config& cfg);

extern template struct ParamSet<float>;
extern template struct ParamSet<double>;
extern template struct GradAcc<float>;
extern template struct GradAcc<double>;

}  // namespace trident::model
