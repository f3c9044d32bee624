// Internal to golden/primitives: the Binder that lets one function per op drive capture (from a live call) and
// replay (recompute a stored case with any Kernels<T>). Each bind_<op> names every argument once: scalars through
// i()/f()/flag()/pol(), device tensors through in()/out()/inout(), exact accumulators through acc()/acc_in(),
// host metadata through host(); the op call itself goes in call().
#pragma once
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>
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

// Elements of a shape; a negative dimension or a product past 2^40 (no case is that large) throws.
inline int64_t prod(const std::vector<int64_t>& shape) {
  constexpr int64_t kMax = int64_t{1} << 40;
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || d > kMax || (d != 0 && n > kMax / d))
      fail(fmt::format("primitive case: the shape [{}] is negative or too large", fmt::join(shape, ", ")));
    n *= d;
  }
  return n;
}
// Largest value a size scalar of a case may hold (and of host offsets): 2^31 - 1.
inline constexpr int64_t kMaxScalar = (int64_t{1} << 31) - 1;

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
  bool replaying() const { return mode_ == Mode::replay; }
  // Replay of a case read from a file (run_case): every output the op writes must be in the case with the shape
  // its scalars give (a deleted output is an error, and no allocation exceeds what the file holds).
  bool expect_outputs = false;
  // Validation only: every check and upload runs, the op itself does not (validate_case).
  bool skip_call = false;

  // ---- the op's contract, checked before any kernel runs (replay only: a live call is the step's own)
  template <class... A>
  void require(bool ok, fmt::format_string<A...> f, A&&... a) {
    if (mode_ == Mode::replay && !ok)
      fail(fmt::format("primitive case {}/{} (rank {}): {} (the file is corrupt, or not a golden of this op)", c_.op,
                       c_.name, c_.rank, fmt::format(f, std::forward<A>(a)...)));
  }
  // The stored values of an integer input (replay only; empty otherwise).
  template <class U>
  std::vector<U> values(const char* name) const {
    std::vector<U> v;
    if (mode_ != Mode::replay) return v;
    const NamedTensor* t = find(name);
    if (!t || t->dtype != dtype_of<U>()) return v;
    v.resize(static_cast<size_t>(t->numel()));
    if (!v.empty()) std::memcpy(v.data(), t->bytes.data(), v.size() * sizeof(U));
    return v;
  }
  // Every value of integer input `name` in [lo, hi) (or equal to `also`).
  template <class U>
  void in_range(const char* name, int64_t lo, int64_t hi, std::optional<int64_t> also = std::nullopt) {
    if (mode_ != Mode::replay) return;
    const std::vector<U> v = values<U>(name);
    for (size_t j = 0; j < v.size(); ++j) {
      const int64_t x = static_cast<int64_t>(v[j]);
      if ((x < lo || x >= hi) && !(also && x == *also))
        require(false, "input '{}' element {} is {}, outside [{}, {}){}", name, j, x, lo, hi,
                also ? fmt::format(" (or {})", *also) : std::string());
    }
  }
  // Tile segments: non-decreasing offsets starting at >= 0 and ending at most at `rows` (-1: no bound).
  void segments(const char* name, std::span<const int64_t> segs, int64_t rows) {
    if (mode_ != Mode::replay) return;
    for (size_t j = 0; j < segs.size(); ++j) {
      require(segs[j] >= 0 && segs[j] <= kMaxScalar && (j == 0 || segs[j] >= segs[j - 1]),
              "input '{}' is not non-decreasing offsets in [0, 2^31) (element {} is {})", name, j, segs[j]);
    }
    if (rows >= 0 && !segs.empty())
      require(segs.back() <= rows, "input '{}' ends at row {}, past the {} rows", name, segs.back(), rows);
  }
  Stream s() const { return s_; }
  Kernels<T>& k() { return *k_; }
  bool abs_inputs = false;  // replay: every floating input replaced by |x| (sum_abs of multilinear ops)

  // ---- scalars
  int64_t i(const char* name, int64_t v) {
    if (mode_ == Mode::replay) {
      const nlohmann::json& j = get(name);
      require(j.is_number_integer(), "scalar '{}' is not an integer", name);
      const int64_t x = j.template get<int64_t>();
      require(x >= 0 && x <= kMaxScalar, "scalar '{}' is {}, outside [0, 2^31)", name, x);
      return x;
    }
    c_.shapes[name] = v;
    return v;
  }
  double f(const char* name, double v) {
    if (mode_ == Mode::replay) {
      const nlohmann::json& j = get(name);
      require(j.is_number(), "scalar '{}' is not a number", name);
      return j.template get<double>();
    }
    c_.shapes[name] = v;
    return v;
  }
  bool flag(const char* name, bool v) {
    if (mode_ == Mode::replay) {
      require(get(name).is_boolean(), "scalar '{}' is not true or false", name);
      return get(name).template get<bool>();
    }
    c_.shapes[name] = v;
    return v;
  }
  Policy pol(Policy p) {
    if (mode_ == Mode::replay) {
      uses_policy_ = true;
      require(c_.policy == "fp32" || c_.policy == "bf16" || c_.policy == "fp64", "policy '{}' is not fp32, bf16 or fp64",
              c_.policy.substr(0, 64));
      require((c_.policy == "fp64") == (c_.dtype == "f64"), "policy {} with dtype {}", c_.policy, c_.dtype);
      return parse_policy(c_.policy);
    }
    c_.policy = std::string(to_string(p));
    return p;
  }
  const model::Config& config(const model::Config& cfg) {
    if (mode_ != Mode::replay) {
      c_.shapes["config"] = cfg.to_json();
      return cfg;
    }
    try {
      return cfgs_.emplace_back(model::Config::from_json(get("config")));
    } catch (const std::exception& e) {
      require(false, "scalar 'config' is not a valid model config: {}", e.what());
      throw;
    }
  }
  bool uses_policy() const { return uses_policy_; }

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
    expect_output(name, shape);
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
    expect_output(name, shape);
    U* d = const_cast<U*>(upload<U>(name, shape));
    outs_.push_back({name, d, shape, dtype_of<U>(), sizeof(U), OutKind::plain});
    return d;
  }
  // A fresh (zero) exact accumulator whose rounded value is an output.
  ExactAcc<T>* acc(const char* name, ExactAcc<T>* p, const std::vector<int64_t>& shape) {
    if (mode_ != Mode::replay) return p;
    expect_output(name, shape);
    ExactAcc<T>* d = zero_acc<T>(prod(shape));
    outs_.push_back({name, d, shape, dtype_of<T>(), sizeof(T), OutKind::acc});
    return d;
  }
  // Scratch accumulators (no output).
  ExactAcc<T>* scratch_acc(ExactAcc<T>* p, int64_t n) { return mode_ == Mode::replay ? zero_acc<T>(n) : p; }
  ExactAcc<double>* acc_f64(const char* name, ExactAcc<double>* p) {
    if (mode_ != Mode::replay) return p;
    expect_output(name, {});
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
    if (output) expect_output(name, shape);
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
    t.D = i("rope.D", 0);
    t.max_pos = i("rope.max_pos", 0);
    require(t.D > 0 && t.D % 2 == 0, "scalar 'rope.D' is {}: the rope width must be even and > 0", t.D);
    const int64_t want = prod({t.max_pos, t.D / 2});
    for (auto [nm, v] : {std::pair{"rope.cos", &t.cos}, std::pair{"rope.sin", &t.sin}}) {
      const NamedTensor& x = need(nm, dtype_of<T>());
      require(x.numel() == want, "input '{}' has {} values, the table needs max_pos * D / 2 = {}", nm, x.numel(), want);
      v->resize(static_cast<size_t>(x.numel()));
      if (!v->empty()) std::memcpy(v->data(), x.bytes.data(), x.bytes.size());
    }
    return t;
  }

  // The op itself: runs in replay only, then collects the outputs (accumulators rounded with the backend's own
  // exact_round) into `results`.
  template <class F>
  void call(F&& fn) {
    if (mode_ != Mode::replay || skip_call) return;
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
  void expect_output(const char* name, const std::vector<int64_t>& shape) {
    if (!expect_outputs) return;
    for (const NamedTensor& t : c_.outputs)
      if (t.name == name) {
        require(t.shape == shape, "output '{}' has shape [{}], its scalars say [{}]", name, fmt::join(t.shape, ", "),
                fmt::join(shape, ", "));
        return;
      }
    require(false, "output '{}' is missing", name);
  }
  template <class U>
  U* alloc(int64_t n) {
    if (n <= 0) return nullptr;
    if (mode_ == Mode::replay && expect_outputs) {  // what a case from a file may allocate: a multiple of its data
      if (budget_ < 0) {
        budget_ = int64_t{64} << 20;
        for (const auto* list : {&c_.inputs, &c_.outputs})
          for (const NamedTensor& t : *list) budget_ += 128 * static_cast<int64_t>(t.bytes.size());
      }
      const int64_t bytes = n * static_cast<int64_t>(sizeof(U));
      require(bytes <= budget_ - used_, "its scalars ask for {} bytes of buffers, more than its data justifies", bytes);
      used_ += bytes;
    }
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
  int64_t budget_ = -1, used_ = 0;
  bool uses_policy_ = false;
};

}  // namespace trident::golden::detail
