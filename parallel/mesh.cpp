#include "parallel/mesh.h"

#include <algorithm>
#include <set>

#include "reference/check.h"

namespace trident {

DeviceMesh::DeviceMesh(std::vector<MeshDim> dims) : dims_(std::move(dims)) {
  std::set<std::string> names;
  int64_t w = 1;
  for (const auto& d : dims_) {
    TD_CHECK(!d.name.empty(), "DeviceMesh: a dimension has an empty name");
    TD_CHECK(names.insert(d.name).second, "DeviceMesh: dimension name '{}' appears twice", d.name);
    TD_CHECK(d.size >= 1, "DeviceMesh: dimension '{}' has size {} (must be >= 1)", d.name, d.size);
    w *= d.size;
    TD_CHECK(w <= (int64_t{1} << 30), "DeviceMesh: world size overflows");
  }
  world_ = static_cast<int>(w);
  strides_.assign(dims_.size(), 1);
  for (int i = ndim() - 2; i >= 0; --i)
    strides_[static_cast<size_t>(i)] = strides_[static_cast<size_t>(i) + 1] * dims_[static_cast<size_t>(i) + 1].size;
}

int DeviceMesh::dim_index(std::string_view name) const {
  for (size_t i = 0; i < dims_.size(); ++i)
    if (dims_[i].name == name) return static_cast<int>(i);
  std::vector<std::string> known;
  for (const auto& d : dims_) known.push_back(d.name);
  fail(fmt::format("DeviceMesh: unknown dimension '{}' (mesh has {})", name, fmt::join(known, ", ")));
}

std::vector<int> DeviceMesh::coords(int rank) const {
  TD_CHECK(rank >= 0 && rank < world_, "DeviceMesh: rank {} out of range [0, {})", rank, world_);
  std::vector<int> c(dims_.size());
  for (size_t i = 0; i < dims_.size(); ++i) c[i] = rank / strides_[i] % dims_[i].size;
  return c;
}

int DeviceMesh::coord(int rank, std::string_view dim) const {
  return coords(rank)[static_cast<size_t>(dim_index(dim))];
}

int DeviceMesh::rank_of(std::span<const int> c) const {
  TD_CHECK_EQ(c.size(), dims_.size(), "DeviceMesh::rank_of: number of coordinates");
  int r = 0;
  for (size_t i = 0; i < dims_.size(); ++i) {
    TD_CHECK(c[i] >= 0 && c[i] < dims_[i].size, "DeviceMesh: coordinate {} of '{}' out of range [0, {})", c[i],
             dims_[i].name, dims_[i].size);
    r += c[i] * strides_[i];
  }
  return r;
}

std::vector<bool> DeviceMesh::mask(const std::vector<std::string>& dims) const {
  std::vector<bool> m(dims_.size(), false);
  for (const auto& d : dims) {
    const auto i = static_cast<size_t>(dim_index(d));
    TD_CHECK(!m[i], "DeviceMesh: dimension '{}' listed twice in a group", d);
    m[i] = true;
  }
  return m;
}

std::vector<int> DeviceMesh::group(int rank, const std::vector<std::string>& dims) const {
  const auto m = mask(dims);
  const auto c = coords(rank);
  // Base rank: this rank with the chosen coordinates zeroed; then enumerate the chosen dims row-major.
  int base = 0;
  for (size_t i = 0; i < dims_.size(); ++i)
    if (!m[i]) base += c[i] * strides_[i];
  std::vector<int> out{base};
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (!m[i]) continue;
    std::vector<int> next;
    next.reserve(out.size() * static_cast<size_t>(dims_[i].size));
    for (int r : out)
      for (int k = 0; k < dims_[i].size; ++k) next.push_back(r + k * strides_[i]);
    out = std::move(next);
  }
  return out;
}

int DeviceMesh::group_color(int rank, const std::vector<std::string>& dims) const {
  const auto m = mask(dims);
  const auto c = coords(rank);
  int color = 0;
  for (size_t i = 0; i < dims_.size(); ++i)
    if (!m[i]) color = color * dims_[i].size + c[i];
  return color;
}

int DeviceMesh::group_key(int rank, const std::vector<std::string>& dims) const {
  const auto m = mask(dims);
  const auto c = coords(rank);
  int key = 0;
  for (size_t i = 0; i < dims_.size(); ++i)
    if (m[i]) key = key * dims_[i].size + c[i];
  return key;
}

std::vector<std::vector<int>> DeviceMesh::groups(const std::vector<std::string>& dims) const {
  const auto m = mask(dims);
  int ngroups = 1;
  for (size_t i = 0; i < dims_.size(); ++i)
    if (!m[i]) ngroups *= dims_[i].size;
  std::vector<std::vector<int>> out(static_cast<size_t>(ngroups));
  for (int r = 0; r < world_; ++r) {
    auto& g = out[static_cast<size_t>(group_color(r, dims))];
    if (g.empty()) g = group(r, dims);
  }
  return out;
}

std::string DeviceMesh::group_name(const std::vector<std::string>& dims) const {
  const auto m = mask(dims);
  std::vector<std::string> names;
  for (size_t i = 0; i < dims_.size(); ++i)
    if (m[i]) names.push_back(dims_[i].name);
  return fmt::format("{}", fmt::join(names, "*"));
}

namespace {
int narrow_dim(const char* name, int64_t v) {
  TD_CHECK(v >= 1 && v <= (int64_t{1} << 30), "DeviceMesh: {} = {} must be in [1, 2^30]", name, v);
  return static_cast<int>(v);
}
}  // namespace

DeviceMesh dense_mesh(const MeshShape& m) {
  return DeviceMesh({{"d_rep", narrow_dim("d_rep", m.d_rep)},
                     {"fsdp", narrow_dim("fsdp", m.fsdp)},
                     {"cp", narrow_dim("cp", m.cp)}});
}
DeviceMesh dense_mesh_2d_cp(const MeshShape& m) {
  TD_CHECK(m.cp_inner >= 1 && m.cp % m.cp_inner == 0, "dense_mesh_2d_cp: cp_inner {} does not divide cp {}",
           m.cp_inner, m.cp);
  return DeviceMesh({{"d_rep", narrow_dim("d_rep", m.d_rep)},
                     {"fsdp", narrow_dim("fsdp", m.fsdp)},
                     {"cp_outer", narrow_dim("cp_outer", m.cp_outer())},
                     {"cp_inner", narrow_dim("cp_inner", m.cp_inner)}});
}
DeviceMesh expert_mesh(const MeshShape& m) {
  return DeviceMesh({{"e_fsdp", narrow_dim("e_fsdp", m.e_fsdp)}, {"ep", narrow_dim("ep", m.ep)}});
}

}  // namespace trident
