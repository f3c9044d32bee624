// A primitive case's tensors as xtensor arrays (docs/plugins.md "xtensor views"): shaped views over a NamedTensor's
// bytes (xt::adapt, no copy), typed by its dtype (f32 float, f64 double, i32 int32_t, i64 int64_t), looked up by
// name in a case's inputs and outputs. Header-only; needs xtensor (Debian xtensor-dev; find_package(Trident
// COMPONENTS xview) gives the target Trident::xview).
//
//   const golden::PrimCase& c = ...;                                  // an mm case
//   auto A = golden::xview::input<float>(c, "A");                     // shape {M, lda}
//   auto C = golden::xview::output<float>(c, "C");                    // shape {M, ldc}
//   xt::xarray<float> mine = ...;  double worst = xt::amax(xt::abs(mine - C))();
//
// A view aliases the tensor's bytes: it is valid while the NamedTensor lives and is not resized.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <xtensor/xadapt.hpp>
#include <xtensor/xarray.hpp>

#include "golden/primitives/primitives.h"
#include "golden/state_dump.h"
#include "reference/check.h"

namespace trident::golden::xview {

// The dtype string of an element type.
template <class T>
constexpr const char* dtype_of() {
  if constexpr (std::is_same_v<T, float>) return "f32";
  else if constexpr (std::is_same_v<T, double>) return "f64";
  else if constexpr (std::is_same_v<T, int32_t>) return "i32";
  else if constexpr (std::is_same_v<T, int64_t>) return "i64";
  else static_assert(sizeof(T) == 0, "golden tensors hold f32, f64, i32 or i64");
}

// The tensor's shape as xtensor wants it.
inline std::vector<size_t> shape_of(const NamedTensor& t) {
  std::vector<size_t> s;
  s.reserve(t.shape.size());
  for (int64_t d : t.shape) {
    if (d < 0) fail(fmt::format("tensor '{}': negative dimension in shape [{}]", t.name, fmt::join(t.shape, ", ")));
    s.push_back(static_cast<size_t>(d));
  }
  return s;
}

namespace detail {
template <class T>
void check_typed(const NamedTensor& t) {
  if (t.dtype != dtype_of<T>())
    fail(fmt::format("tensor '{}' is {}, not {}", t.name, t.dtype, dtype_of<T>()));
  size_t n = 1;
  for (int64_t d : t.shape) n *= static_cast<size_t>(d < 0 ? 0 : d);
  if (t.bytes.size() != n * sizeof(T))
    fail(fmt::format("tensor '{}': {} bytes for shape [{}] of {}", t.name, t.bytes.size(), fmt::join(t.shape, ", "),
                     t.dtype));
}
inline const NamedTensor& find(const std::vector<NamedTensor>& v, std::string_view name, const PrimCase& c,
                               const char* what) {
  for (const NamedTensor& t : v)
    if (t.name == name) return t;
  std::vector<std::string> names;
  for (const NamedTensor& t : v) names.push_back(t.name);
  fail(fmt::format("case {}/{} (rank {}) has no {} '{}' ({}s: {})", c.op, c.name, c.rank, what, name, what,
                   fmt::join(names, ", ")));
}
}  // namespace detail

// A read-only shaped view of `t` (its dtype must be T's).
template <class T>
auto view(const NamedTensor& t) {
  detail::check_typed<T>(t);
  const T* p = reinterpret_cast<const T*>(t.bytes.data());
  const size_t n = t.bytes.size() / sizeof(T);
  return xt::adapt(p, n, xt::no_ownership(), shape_of(t));
}
// A writable shaped view of `t`.
template <class T>
auto view(NamedTensor& t) {
  detail::check_typed<T>(t);
  T* p = reinterpret_cast<T*>(t.bytes.data());
  const size_t n = t.bytes.size() / sizeof(T);
  return xt::adapt(p, n, xt::no_ownership(), shape_of(t));
}
// An owning copy.
template <class T>
xt::xarray<T> copy(const NamedTensor& t) {
  return xt::xarray<T>(view<T>(t));
}

// The case's input / output named `name` (an error lists the names there are).
inline const NamedTensor& input_tensor(const PrimCase& c, std::string_view name) {
  return detail::find(c.inputs, name, c, "input");
}
inline const NamedTensor& output_tensor(const PrimCase& c, std::string_view name) {
  return detail::find(c.outputs, name, c, "output");
}
template <class T>
auto input(const PrimCase& c, std::string_view name) {
  return view<T>(input_tensor(c, name));
}
template <class T>
auto output(const PrimCase& c, std::string_view name) {
  return view<T>(output_tensor(c, name));
}

// Calls f(view) with the view of t's runtime dtype (f32, f64, i32 or i64).
template <class F>
decltype(auto) visit(const NamedTensor& t, F&& f) {
  if (t.dtype == "f32") return f(view<float>(t));
  if (t.dtype == "f64") return f(view<double>(t));
  if (t.dtype == "i32") return f(view<int32_t>(t));
  if (t.dtype == "i64") return f(view<int64_t>(t));
  fail(fmt::format("tensor '{}': dtype '{}' has no xtensor view (f32, f64, i32, i64)", t.name, t.dtype));
}

// A NamedTensor holding a copy of an xtensor expression's values (row-major), e.g. to hand back as an output.
template <class E>
NamedTensor to_tensor(std::string name, const E& e) {
  using T = std::decay_t<typename std::decay_t<E>::value_type>;
  const xt::xarray<T> a = e;
  NamedTensor t;
  t.name = std::move(name);
  t.dtype = dtype_of<T>();
  for (size_t d : a.shape()) t.shape.push_back(static_cast<int64_t>(d));
  t.bytes.resize(a.size() * sizeof(T));
  if (a.size() > 0) std::memcpy(t.bytes.data(), a.data(), t.bytes.size());
  return t;
}

}  // namespace trident::golden::xview
