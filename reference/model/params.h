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
// Every contribution of a step is added (tile partials, exact); finalize() rounds once into grads.
// The distributed step exact-merges (reduce-scatters) these arrays between accumulation and finalize.
template <class T>
struct GradAcc {
  std::vector<std::vector<ExactAcc<T>>> acc;  // acc[p]: numel(p) accumulators, or empty if not trainable
  static GradAcc zeros(const std::vector<ParamInfo>& info);
  ExactAcc<T>* ptr(size_t p) { return acc[p].empty() ? nullptr : acc[p].data(); }
  void clear();  // all accumulators back to exact zero
  // grads.t[p] = round(acc[p]) for trainable p; zero for buffers. grads must have the same layout.
  void finalize(ParamSet<T>& grads) const;
};

extern template struct ParamSet<float>;
extern template struct ParamSet<double>;
extern template struct GradAcc<float>;
extern template struct GradAcc<double>;

}  // namespace trident::model
