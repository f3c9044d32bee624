// A minimal owning dense tensor: row-major, shape + contiguous storage. Kernels take raw pointers with
// shape comments (llm.c style); Tensor is the container that owns them.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <numeric>
#include <vector>

#include "reference/check.h"

namespace trident {

using Shape = std::vector<int64_t>;

inline int64_t numel(const Shape& s) {
  return std::accumulate(s.begin(), s.end(), int64_t{1}, [](int64_t a, int64_t b) { return a * b; });
}

template <class T>
struct Tensor {
  Shape shape;
  std::vector<T> data;

  Tensor() = default;
  explicit Tensor(Shape s, T fill = T{}) : shape(std::move(s)), data(static_cast<size_t>(numel(shape)), fill) {}

  int64_t size() const { return static_cast<int64_t>(data.size()); }
  int64_t dim(int i) const { return shape.at(static_cast<size_t>(i)); }
  int rank() const { return static_cast<int>(shape.size()); }
  T* ptr() { return data.data(); }
  const T* ptr() const { return data.data(); }
  T& operator[](int64_t i) { return data[static_cast<size_t>(i)]; }
  const T& operator[](int64_t i) const { return data[static_cast<size_t>(i)]; }
};

}  // namespace trident
