// Internal to golden/primitives: the Binder that lets one function per op drive capture (from a live call) and
// replay (recompute a stored case with any Kernels<T>). Each bind_<op> names every argument once: scalars through
// i()/f()/flag()/pol(), device tensors through in()/out()/inout(), exact accumulators through acc()/acc_in(),
// host metadata through host(); the op call itself goes in call().
#pragma once
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "golden/primitives/primitives.h"
#include "reference/check.h"
#include "reference/model/config.h"

namespace trident::golden::detail {

enum class Mode { dry, capture, replay };

template <class U>
const char* dtype_of() {
  if constexpr (std::is_same_v<U, double>) return "f64";
  else if constexpr (std::is_same_v<U, float>) return "f32";
  else if constexpr (std::is_same_v<U, int32_t>) return "i32";
  else {
    static_assert(std::is_same_v<U, int64_t>);
    return "i64";
  }
}

inline int64_t prod(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

template <class T>
class Binder {
 public:
  Binder(Mode mode, Device& dev, Stream s, PrimCase& c, Kernels<T>* k = nullptr)
      : mode_(mode), dev_(dev), s_(s), c_(c), k_(k) {}
  ~Binder() {
    for (void* p : allocs_) dev_.free(p, s_);
  }
  Binder(const Binder&) = delete;
  Binder& operator=(const Binder&) = delete;

  Mode mode() const { return mode_; }
  Stream s() const { return s_; }
  Kernels<T>& k() { return *k_; }
  bool abs_inputs = false;  // replay: every floating input replaced by |x| (sum_abs of multilinear ops)

  // ---- scalars
  int64_t i(const char* name, int64_t v) {
    if (mode_ == Mode::replay) return get(name).template get<int64_t>();
    c_.shapes[name] = v;
    return v;
  }
  double f(const char* name, double v) {
    if (mode_ == Mode::replay) return get(name).template get<double>();
    c_.shapes[name] = v;
    return v;
  }
  bool flag(const char* name, bool v) {
    if (mode_ == Mode::replay) return get(name).template get<bool>();
    c_.shapes[name] = v;
    return v;
  }
  Policy pol(Policy p) {
    if (mode_ == Mode::replay) return parse_policy(c_.policy);
    c_.policy = std::string(to_string(p));
    return p;
  }
  const model::Config& config(const model::Config& cfg) {
    if (mode_ != Mode::replay) {
      c_.shapes["config"] = cfg.to_json();
      return cfg;
    }
    return cfgs_.emplace_back(model::Config::from_json(get("config")));
  }

  // ---- device tensors
  template <class U>
  const U* in(const char* name, const U* p, const std::vector<int64_t>& shape) {
    if (mode_ == Mode::dry) return p;
    if (mode_ == Mode::capture) {
      capture_tensor(name, p, shape);
      return p;
    }
    return upload<U>(name, shape);
  }
  // An input that may be absent (a null pointer; in replay: no such input in the case).
  template <class U>
  const U* opt_in(const char* name, const U* p, const std::vector<int64_t>& shape) {
    if (mode_ == Mode::replay) return find(name) ? upload<U>(name, shape) : nullptr;
    return p ? in(name, p, shape) : nullptr;
  }
  template <class U>
  U* out(const char* name, U* p, const std::vector<int64_t>& shape) {
    if (mode_ != Mode::replay) return p;
    U* d = alloc<U>(prod(shape));
    dev_.memset(d, 0, prod(shape) * static_cast<int64_t>(sizeof(U)), s_);
    outs_.push_back({name, d, shape, dtype_of<U>(), sizeof(U), OutKind::plain});
    return d;
  }
  template <class U>
  U* inout(const char* name, U* p, const std::vector<int64_t>& shape) {
    if (mode_ == Mode::dry) return p;
    if (mode_ == Mode::capture) {
      capture_tensor(name, p, shape);
      return p;
    }
    U* d = const_cast<U*>(upload<U>(name, shape));
    outs_.push_back({name, d, shape, dtype_of<U>(), sizeof(U), OutKind::plain});
    return d;
  }
  // A fresh (zero) exact accumulator whose rounded value is an output.
  ExactAcc<T>* acc(const char* name, ExactAcc<T>* p, const std::vector<int64_t>& shape) {
    if (mode_ != Mode::replay) return p;
    ExactAcc<T>* d = zero_acc<T>(prod(shape));
    outs_.push_back({name, d, shape, dtype_of<T>(), sizeof(T), OutKind::acc});
    return d;
  }
  // Scratch accumulators (no output).
  ExactAcc<T>* scratch_acc(ExactAcc<T>* p, int64_t n) { return mode_ == Mode::replay ? zero_acc<T>(n) : p; }
  ExactAcc<double>* acc_f64(const char* name, ExactAcc<double>* p) {
    if (mode_ != Mode::replay) return p;
    ExactAcc<double>* d = zero_acc<double>(1);
    outs_.push_back({name, d, {}, "f64", sizeof(double), OutKind::acc_f64});
    return d;
  }
  // An accumulator read (and, with `output`, written): stored as its rounded values; replay rebuilds it with
  // sum_acc over one row (exact: the accumulator then holds exactly those values).
  ExactAcc<T>* acc_in(const char* name, ExactAcc<T>* p, const std::vector<int64_t>& shape, bool output) {
    const int64_t n = prod(shape);
    if (mode_ == Mode::dry) return p;
    if (mode_ == Mode::capture) {
      std::vector<ExactAcc<T>> host(static_cast<size_t>(n));
      if (n > 0) dev_.download(host.data(), p, n * static_cast<int64_t>(sizeof(ExactAcc<T>)), s_);
      dev_.synchronize(s_);
      std::vector<T> v(static_cast<size_t>(n));
      exact_round<T>(host.data(), v.data(), n);
      push_input(name, shape, dtype_of<T>(), v.data(), v.size() * sizeof(T));
      return p;
    }
    const T* x = upload<T>(name, shape);
    ExactAcc<T>* d = zero_acc<T>(n);
    static const std::vector<int64_t> one_row{0, 1};
    if (n > 0) k_->sum_acc(x, n, one_row, d, s_);
    if (output) outs_.push_back({name, d, shape, dtype_of<T>(), sizeof(T), OutKind::acc});
    return d;
  }

  // ---- host data
  std::span<const int64_t> host(const char* name, std::span<const int64_t> v) {
    if (mode_ == Mode::dry) {
      c_.shapes[std::string(name) + ".len"] = static_cast<int64_t>(v.size());
      return v;
    }
    if (mode_ == Mode::capture) {
      push_input(name, {static_cast<int64_t>(v.size())}, "i64", v.data(), v.size() * sizeof(int64_t));
      return v;
    }
    const NamedTensor& t = need(name, "i64");
    auto& h = host_.emplace_back(static_cast<size_t>(t.numel()));
    if (!h.empty()) std::memcpy(h.data(), t.bytes.data(), h.size() * sizeof(int64_t));
    return h;
  }
  const model::RopeTable<T>& rope(const model::RopeTable<T>& r) {
    if (mode_ == Mode::dry) return r;
    if (mode_ == Mode::capture) {
      c_.shapes["rope.D"] = r.D;
      c_.shapes["rope.max_pos"] = r.max_pos;
      push_input("rope.cos", {static_cast<int64_t>(r.cos.size())}, dtype_of<T>(), r.cos.data(), r.cos.size() * sizeof(T));
      push_input("rope.sin", {static_cast<int64_t>(r.sin.size())}, dtype_of<T>(), r.sin.data(), r.sin.size() * sizeof(T));
      return r;
    }
    model::RopeTable<T>& t = ropes_.emplace_back();
    t.D = get("rope.D").template get<int64_t>();
    t.max_pos = get("rope.max_pos").template get<int64_t>();
    for (auto [nm, v] : {std::pair{"rope.cos", &t.cos}, std::pair{"rope.sin", &t.sin}}) {
      const NamedTensor& x = need(nm, dtype_of<T>());
      v->resize(static_cast<size_t>(x.numel()));
      if (!v->empty()) std::memcpy(v->data(), x.bytes.data(), x.bytes.size());
    }
    return t;
  }

  // The op itself: runs in replay only, then collects the outputs (accumulators rounded with the backend's own
  // exact_round) into `results`.
  template <class F>
  void call(F&& fn) {
    if (mode_ != Mode::replay) return;
    fn();
    struct Pending {
      std::vector<std::byte> host;
      const void* src;
    };
    std::vector<NamedTensor> res;
    std::vector<std::vector<ExactAcc<double>>> accd;
    for (const Out& o : outs_) {
      NamedTensor t;
      t.name = o.name;
      t.shape = o.shape;
      t.dtype = o.dtype;
      const int64_t n = prod(o.shape);
      t.bytes.resize(static_cast<size_t>(n) * o.esize);
      if (o.kind == OutKind::acc) {
        T* r = alloc<T>(n);
        if (n > 0) k_->exact_round(static_cast<const ExactAcc<T>*>(o.p), r, n, s_);
        if (n > 0) dev_.download(t.bytes.data(), r, n * static_cast<int64_t>(sizeof(T)), s_);
      } else if (o.kind == OutKind::acc_f64) {
        auto& h = accd.emplace_back(1);
        dev_.download(h.data(), o.p, static_cast<int64_t>(sizeof(ExactAcc<double>)), s_);
      } else if (n > 0) {
        dev_.download(t.bytes.data(), o.p, n * static_cast<int64_t>(o.esize), s_);
      }
      res.push_back(std::move(t));
    }
    dev_.synchronize(s_);
    size_t j = 0;
    for (size_t i = 0; i < outs_.size(); ++i)
      if (outs_[i].kind == OutKind::acc_f64) {
        double v = 0;
        exact_round<double>(accd[j++].data(), &v, 1);
        std::memcpy(res[i].bytes.data(), &v, sizeof v);
      }
    results = std::move(res);
  }
  std::vector<NamedTensor> results;

 private:
  enum class OutKind { plain, acc, acc_f64 };
  struct Out {
    std::string name;
    void* p;
    std::vector<int64_t> shape;
    std::string dtype;
    size_t esize;
    OutKind kind;
  };

  const nlohmann::json& get(const char* name) const {
    auto it = c_.shapes.find(name);
    if (it == c_.shapes.end())
      fail(fmt::format("primitive case {}/{}: missing scalar '{}' in its shapes", c_.op, c_.name, name));
    return *it;
  }
  const NamedTensor* find(const char* name) const {
    for (const NamedTensor& t : c_.inputs)
      if (t.name == name) return &t;
    return nullptr;
  }
  const NamedTensor& need(const char* name, const char* dtype) const {
    const NamedTensor* t = find(name);
    if (!t) fail(fmt::format("primitive case {}/{}: missing input '{}'", c_.op, c_.name, name));
    if (t->dtype != dtype)
      fail(fmt::format("primitive case {}/{}: input '{}' is {}, expected {}", c_.op, c_.name, name, t->dtype, dtype));
    return *t;
  }
  template <class U>
  U* alloc(int64_t n) {
    if (n <= 0) return nullptr;
    void* p = dev_.allocate(n * static_cast<int64_t>(sizeof(U)), s_);
    allocs_.push_back(p);
    return static_cast<U*>(p);
  }
  template <class A>
  ExactAcc<A>* zero_acc(int64_t n) {
    ExactAcc<A>* d = alloc<ExactAcc<A>>(n);
    if (n > 0) dev_.memset(d, 0, n * static_cast<int64_t>(sizeof(ExactAcc<A>)), s_);
    return d;
  }
  template <class U>
  const U* upload(const char* name, const std::vector<int64_t>& shape) {
    const NamedTensor& t = need(name, dtype_of<U>());
    const int64_t n = prod(shape);
    if (t.numel() != n)
      fail(fmt::format("primitive case {}/{}: input '{}' has {} elements, its scalars say {}", c_.op, c_.name, name,
                       t.numel(), n));
    U* d = alloc<U>(n);
    if (n == 0) return d;
    if constexpr (std::is_floating_point_v<U>) {
      if (abs_inputs) {
        std::vector<U> v(static_cast<size_t>(n));
        std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
        for (U& x : v) x = std::fabs(x);
        dev_.upload(d, v.data(), n * static_cast<int64_t>(sizeof(U)), s_);
        return d;
      }
    }
    dev_.upload(d, t.bytes.data(), n * static_cast<int64_t>(sizeof(U)), s_);
    return d;
  }
  template <class U>
  void capture_tensor(const char* name, const U* p, const std::vector<int64_t>& shape) {
    const int64_t n = prod(shape);
    std::vector<std::byte> b(static_cast<size_t>(n) * sizeof(U));
    if (n > 0) {
      dev_.download(b.data(), p, n * static_cast<int64_t>(sizeof(U)), s_);
      dev_.synchronize(s_);
    }
    NamedTensor t;
    t.name = name;
    t.shape = shape;
    t.dtype = dtype_of<U>();
    t.bytes = std::move(b);
    c_.inputs.push_back(std::move(t));
  }
  void push_input(const char* name, std::vector<int64_t> shape, const char* dtype, const void* p, size_t bytes) {
    NamedTensor t;
    t.name = name;
    t.shape = std::move(shape);
    t.dtype = dtype;
    t.bytes.resize(bytes);
    if (bytes) std::memcpy(t.bytes.data(), p, bytes);
    c_.inputs.push_back(std::move(t));
  }

  Mode mode_;
  Device& dev_;
  Stream s_;
  PrimCase& c_;
  Kernels<T>* k_;
  std::vector<void*> allocs_;
  std::vector<Out> outs_;
  std::deque<std::vector<int64_t>> host_;
  std::deque<model::RopeTable<T>> ropes_;
  std::deque<model::Config> cfgs_;
};

}  // namespace trident::golden::detail
