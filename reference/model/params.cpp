#include "reference/model/params.h"

#include <algorithm>
#include <cmath>

#include "reference/check.h"
#include "reference/profile.h"

namespace trident::model {

std::vector<ParamInfo> param_layout(const Config& c) {
  std::vector<ParamInfo> out;
  auto add = [&](std::string name, Shape shape, int64_t fan_in, bool trainable = true) {
    ParamInfo p;
    p.name = std::move(name);
    p.is_matrix = shape.size() >= 2;
    p.shape = std::move(shape);
    p.trainable = trainable;
    p.fan_in = fan_in;
    out.push_back(std::move(p));
  };
  const int64_t d = c.d_model, H = c.heads;
  add("embed", {c.vocab, d}, 1);
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string L = fmt::format("layers.{}.", i);
    add(L + "attn_norm", {d}, 1);
    if (c.attn == AttnKind::gqa) {
      const int64_t Dh = c.head_dim, Hkv = c.kv_heads;
      add(L + "attn.wq", {d, H * Dh}, d);
      add(L + "attn.wk", {d, Hkv * Dh}, d);
      add(L + "attn.wv", {d, Hkv * Dh}, d);
      add(L + "attn.wo", {H * Dh, d}, H * Dh);
    } else {
      const int64_t Dn = c.nope_dim, Dr = c.rope_dim, Dv = c.v_dim, r = c.kv_lora_rank;
      add(L + "attn.wq", {d, H * (Dn + Dr)}, d);
      add(L + "attn.wdkv", {d, r + Dr}, d);
      add(L + "attn.kv_norm", {r}, 1);
      add(L + "attn.wuk", {r, H * Dn}, r);
      add(L + "attn.wuv", {r, H * Dv}, r);
      add(L + "attn.wo", {H * Dv, d}, H * Dv);
      if (c.dsa()) {  // the lightning indexer (docs/model.md "Sparse attention (DSA)")
        add(L + "attn.wiq", {d, c.index_heads * c.index_dim}, d);
        add(L + "attn.wiw", {d, c.index_heads}, d);
        add(L + "attn.wik", {d, c.index_dim}, d);
      }
    }
    add(L + "ffn_norm", {d}, 1);
    if (!c.is_moe_layer(i)) {
      add(L + "mlp.wg", {d, c.dense_ffn}, d);
      add(L + "mlp.wu", {d, c.dense_ffn}, d);
      add(L + "mlp.wd", {c.dense_ffn, d}, c.dense_ffn);
    } else {
      const int64_t E = c.experts, Fe = c.expert_ffn, Fs = c.shared_ffn;
      add(L + "moe.router", {d, E}, d);
      add(L + "moe.router_bias", {E}, 1, /*trainable=*/false);
      add(L + "moe.experts.wg", {E, d, Fe}, d);
      add(L + "moe.experts.wu", {E, d, Fe}, d);
      add(L + "moe.experts.wd", {E, Fe, d}, Fe);
      if (Fs > 0) {
        add(L + "moe.shared.wg", {d, Fs}, d);
        add(L + "moe.shared.wu", {d, Fs}, d);
        add(L + "moe.shared.wd", {Fs, d}, Fs);
      }
    }
  }
  add("final_norm", {d}, 1);
  add("lm_head", {d, c.vocab}, d);
  return out;
}

static inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t hash3(uint64_t seed, uint64_t stream, uint64_t index) {
  return splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ index);
}

double uniform_pm1(uint64_t seed, uint64_t stream, uint64_t index) {
  const double u = static_cast<double>(hash3(seed, stream, index) >> 11) * 0x1.0p-53;  // [0, 1)
  return 2.0 * u - 1.0;
}

template <class T>
ParamSet<T> ParamSet<T>::zeros(const Config& cfg) {
  ParamSet s;
  s.info = param_layout(cfg);
  for (size_t i = 0; i < s.info.size(); ++i) {
    s.t.emplace_back(s.info[i].shape, T(0));
    s.index[s.info[i].name] = i;
  }
  return s;
}

static bool ends_with(const std::string& s, std::string_view suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

template <class T>
ParamSet<T> ParamSet<T>::init(const Config& cfg, uint64_t seed) {
  ParamSet s = zeros(cfg);
  for (size_t p = 0; p < s.size(); ++p) {
    const ParamInfo& in = s.info[p];
    Tensor<T>& w = s.t[p];
    if (ends_with(in.name, "norm")) {  // attn_norm, ffn_norm, kv_norm, final_norm
      for (auto& x : w.data) x = T(1);
    } else if (ends_with(in.name, "router_bias")) {
      for (auto& x : w.data) x = T(0);
    } else {
      const double a = in.name == "embed" ? 1.0 : 1.0 / std::sqrt(static_cast<double>(in.fan_in));
      for (int64_t k = 0; k < w.size(); ++k) w[k] = static_cast<T>(a * uniform_pm1(seed, p, static_cast<uint64_t>(k)));
    }
  }
  return s;
}

template <class T>
size_t ParamSet<T>::find(const std::string& name) const {
  auto it = index.find(name);
  if (it == index.end()) fail(fmt::format("no parameter named '{}'", name));
  return it->second;
}

template <class T>
int64_t ParamSet<T>::numel() const {
  int64_t n = 0;
  for (const auto& x : t) n += x.size();
  return n;
}

GradBlock grad_block(const std::string& name) {
  using K = GradBlock::Kind;
  if (name == "embed") return {K::embed, -1};
  if (name == "lm_head" || name == "final_norm") return {K::head, -1};
  const std::string pre = "layers.";
  const size_t dot = name.compare(0, pre.size(), pre) == 0 ? name.find('.', pre.size()) : std::string::npos;
  TD_CHECK(dot != std::string::npos && dot > pre.size(), "grad_block: '{}' is not a parameter name", name);
  int64_t i = 0;
  for (size_t c = pre.size(); c < dot; ++c) {
    TD_CHECK(name[c] >= '0' && name[c] <= '9', "grad_block: '{}' is not a parameter name", name);
    i = i * 10 + (name[c] - '0');
  }
  return {name.compare(dot + 1, 12, "moe.experts.") == 0 ? K::experts : K::layer, i};
}

int64_t streaming_peak_accumulators(const Config& cfg) {
  using K = GradBlock::Kind;
  int64_t head = 0, embed = 0;
  const size_t L = static_cast<size_t>(cfg.layers);
  std::vector<int64_t> layer(L, 0), expert(L, 0);  // per layer: its block, one expert's slices
  for (const ParamInfo& x : param_layout(cfg)) {
    if (!x.trainable) continue;
    const int64_t n = numel(x.shape);
    const GradBlock b = grad_block(x.name);
    if (b.kind == K::embed) embed += n;
    if (b.kind == K::head) head += n;
    if (b.kind == K::layer) layer[static_cast<size_t>(b.layer)] += n;
    if (b.kind == K::experts) expert[static_cast<size_t>(b.layer)] += n / cfg.experts;
  }
  int64_t peak = std::max(head, embed);
  for (size_t i = 0; i < L; ++i) peak = std::max(peak, layer[i] + expert[i]);
  return peak;
}

template <class T>
GradAcc<T> GradAcc<T>::zeros(const std::vector<ParamInfo>& info) {
  GradAcc g;
  g.acc.resize(info.size());
  g.numel_.resize(info.size());
  for (size_t p = 0; p < info.size(); ++p)
    if (info[p].trainable) {
      g.numel_[p] = numel(info[p].shape);
      g.acc[p].assign(static_cast<size_t>(g.numel_[p]), ExactAcc<T>());
    }
  return g;
}

template <class T>
GradAcc<T> GradAcc<T>::streaming(const std::vector<ParamInfo>& info) {
  GradAcc g;
  g.streaming_ = true;
  g.acc.resize(info.size());  // stays empty: the arenas hold the open blocks
  g.numel_.resize(info.size());
  for (size_t p = 0; p < info.size(); ++p)
    if (info[p].trainable) g.numel_[p] = numel(info[p].shape);
  g.done_.assign(info.size(), 0);
  return g;
}

template <class T>
ExactAcc<T>* GradAcc<T>::ptr(size_t p) {
  TD_CHECK(p < numel_.size(), "GradAcc::ptr: parameter {} out of range", p);
  if (!streaming_) return acc[p].empty() ? nullptr : acc[p].data();
  if (numel_[p] == 0) return nullptr;
  for (size_t d = blocks_.size(); d-- > 0;)
    for (const Part& x : blocks_[d])
      if (x.s.p == p) return arenas_[d].data() + x.off;
  TD_CHECK(false, "GradAcc::ptr: parameter {} is not open (streaming accumulators)", p);
  return nullptr;
}

template <class T>
bool GradAcc<T>::is_open(size_t p) const {
  if (!streaming_) return true;
  for (const auto& b : blocks_)
    for (const Part& x : b)
      if (x.s.p == p) return true;
  return false;
}

template <class T>
void GradAcc<T>::clear() {
  prof::OpSection prof_section(prof::Op::grad_finalize);
  if (!streaming_) {
    for (auto& a : acc) std::fill(a.begin(), a.end(), ExactAcc<T>());
    return;
  }
  // An interrupted backward may leave blocks open: reset their accumulators.
  for (size_t d = 0; d < blocks_.size(); ++d)
    for (const Part& x : blocks_[d]) std::fill_n(arenas_[d].begin() + x.off, x.s.count, ExactAcc<T>());
  blocks_.clear();
  std::fill(done_.begin(), done_.end(), 0);
}

template <class T>
void GradAcc<T>::push(std::vector<Slice> slices) {
  std::vector<Part> parts;
  int64_t total = 0;
  for (const Slice& s : slices) {
    TD_CHECK(s.p < numel_.size(), "GradAcc::open: parameter {} out of range", s.p);
    if (numel_[s.p] == 0 || s.count == 0) continue;
    TD_CHECK(s.begin >= 0 && s.count > 0 && s.begin <= numel_[s.p] - s.count,
             "GradAcc::open: slice [{}, +{}) of parameter {} outside its {} elements", s.begin, s.count, s.p,
             numel_[s.p]);
    TD_CHECK(!is_open(s.p), "GradAcc::open: parameter {} is already open", s.p);
    TD_CHECK(done_[s.p] <= numel_[s.p] - s.count, "GradAcc::open: parameter {} was already closed this step", s.p);
    parts.push_back({s, total});
    total += s.count;
  }
  const size_t depth = blocks_.size();
  if (arenas_.size() <= depth) arenas_.resize(depth + 1);
  // Grows only (a fresh, zeroed allocation; the deeper and shallower arenas, which open blocks point into, stay
  // where they are); its accumulators are zero outside open parts because close() resets what it rounds.
  auto& arena = arenas_[depth];
  if (static_cast<int64_t>(arena.size()) < total) {
    arena.clear();
    arena.shrink_to_fit();
    arena.assign(static_cast<size_t>(total), ExactAcc<T>());
  }
  blocks_.push_back(std::move(parts));
}

template <class T>
void GradAcc<T>::open(const std::vector<size_t>& ps) {
  if (!streaming_) return;
  std::vector<Slice> slices;
  for (size_t p : ps) slices.push_back({p, 0, p < numel_.size() ? numel_[p] : 0});
  push(std::move(slices));
}

template <class T>
void GradAcc<T>::open_slices(const std::vector<Slice>& slices) {
  if (streaming_) push(slices);
}

template <class T>
void GradAcc<T>::close() {
  if (!streaming_) return;
  prof::OpSection prof_section(prof::Op::grad_finalize);
  TD_CHECK(!blocks_.empty(), "GradAcc::close: no open block");
  TD_CHECK(sink != nullptr, "GradAcc::close: no sink ParamSet set (streaming accumulators)");
  auto& arena = arenas_[blocks_.size() - 1];
  for (const Part& x : blocks_.back()) {
    TD_CHECK_EQ(sink->t[x.s.p].size(), numel_[x.s.p], "GradAcc::close: size of {}", sink->info[x.s.p].name);
    exact_round_clear(arena.data() + x.off, sink->t[x.s.p].ptr() + x.s.begin, x.s.count);
    done_[x.s.p] += x.s.count;
  }
  blocks_.pop_back();
}

template <class T>
std::vector<T*> GradAcc<T>::direct(const std::vector<Slice>& slices) {
  if (!streaming_) return {};
  TD_CHECK(sink != nullptr, "GradAcc::direct: no sink ParamSet set (streaming accumulators)");
  for (const Slice& s : slices) {
    TD_CHECK(s.p < numel_.size(), "GradAcc::direct: parameter {} out of range", s.p);
    if (numel_[s.p] == 0) return {};
    TD_CHECK(s.begin >= 0 && s.count > 0 && s.begin <= numel_[s.p] - s.count,
             "GradAcc::direct: slice [{}, +{}) of parameter {} outside its {} elements", s.begin, s.count, s.p,
             numel_[s.p]);
    TD_CHECK(!is_open(s.p), "GradAcc::direct: parameter {} is open", s.p);
    TD_CHECK(done_[s.p] <= numel_[s.p] - s.count, "GradAcc::direct: parameter {} was already closed this step", s.p);
    TD_CHECK_EQ(sink->t[s.p].size(), numel_[s.p], "GradAcc::direct: size of {}", sink->info[s.p].name);
  }
  std::vector<T*> out;
  for (const Slice& s : slices) {
    done_[s.p] += s.count;
    out.push_back(sink->t[s.p].ptr() + s.begin);
  }
  return out;
}

template <class T>
void GradAcc<T>::finalize(ParamSet<T>& grads) const {
  prof::OpSection prof_section(prof::Op::grad_finalize);
  TD_CHECK_EQ(grads.size(), numel_.size(), "GradAcc::finalize: layout mismatch");
  for (size_t p = 0; p < numel_.size(); ++p) {
    if (numel_[p] == 0) {
      std::fill(grads.t[p].data.begin(), grads.t[p].data.end(), T(0));
      continue;
    }
    if (streaming_) {
      TD_CHECK(done_[p] == numel_[p], "GradAcc::finalize: {} of the {} elements of {} were closed (streaming "
               "accumulators)", done_[p], numel_[p], grads.info[p].name);
      continue;
    }
    TD_CHECK_EQ(static_cast<int64_t>(acc[p].size()), grads.t[p].size(), "GradAcc::finalize: size of {}", grads.info[p].name);
    exact_round(acc[p].data(), grads.t[p].ptr(), grads.t[p].size());
  }
}

template struct ParamSet<float>;
template struct ParamSet<double>;
template struct GradAcc<float>;
template struct GradAcc<double>;

}  // namespace trident::model
