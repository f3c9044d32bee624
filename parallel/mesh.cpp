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

std::string MeshConfig::str() const {
  std::string s = fmt::format("(d_rep,fsdp,cp)x(e_fsdp,ep)=({},{},{})x({},{})", d_rep, fsdp, cp, e_fsdp, ep);
  if (experts) s += fmt::format(" experts={}", experts);
  if (nvl) s += fmt::format(" nvl={}", nvl);
  return s;
}

DeviceMesh dense_mesh(const MeshConfig& c) { return DeviceMesh({{"d_rep", c.d_rep}, {"fsdp", c.fsdp}, {"cp", c.cp}}); }
DeviceMesh expert_mesh(const MeshConfig& c) { return DeviceMesh({{"e_fsdp", c.e_fsdp}, {"ep", c.ep}}); }

namespace {

// First group of `size` consecutive ranks (groups start at multiples of size) that spans two NVLink domains.
std::string straddle(const char* what, int size, int world, int nvl) {
  for (int start = 0; start + size <= world; start += size) {
    const int d0 = start / nvl, d1 = (start + size - 1) / nvl;
    if (d0 != d1)
      return fmt::format(
          "NVLink rule: the {} group of ranks {}..{} straddles NVLink domains {} and {} ({} ranks per domain; "
          "{}={} must divide {})",
          what, start, start + size - 1, d0, d1, nvl, what, size, nvl);
  }
  return {};
}

}  // namespace

std::vector<std::string> mesh_violations(const MeshConfig& c, int world) {
  std::vector<std::string> v;
  const std::pair<const char*, int> sizes[] = {{"d_rep", c.d_rep}, {"fsdp", c.fsdp}, {"cp", c.cp},
                                               {"e_fsdp", c.e_fsdp}, {"ep", c.ep}};
  bool sizes_ok = true;
  for (auto [n, s] : sizes)
    if (s < 1) {
      v.push_back(fmt::format("size rule: {} = {} must be >= 1", n, s));
      sizes_ok = false;
    }
  if (world < 1) v.push_back(fmt::format("size rule: world = {} must be >= 1", world));
  if (c.experts < 0) v.push_back(fmt::format("size rule: experts = {} must be >= 0", c.experts));
  if (c.nvl < 0) v.push_back(fmt::format("size rule: nvl = {} must be >= 0 (0 = no NVLink rules)", c.nvl));
  if (!sizes_ok || world < 1) return v;
  const int64_t dense = int64_t{c.d_rep} * c.fsdp * c.cp, expert = int64_t{c.e_fsdp} * c.ep;
  if (dense != world)
    v.push_back(fmt::format("dense mesh rule: d_rep*fsdp*cp = {}*{}*{} = {} != world {}", c.d_rep, c.fsdp, c.cp,
                            dense, world));
  if (expert != world)
    v.push_back(fmt::format("expert mesh rule: e_fsdp*ep = {}*{} = {} != world {}", c.e_fsdp, c.ep, expert, world));
  if (c.experts > 0 && c.experts % c.ep != 0)
    v.push_back(fmt::format("expert placement rule: experts % ep = {} % {} = {} != 0 (each ep rank must own "
                            "experts/ep whole experts)", c.experts, c.ep, c.experts % c.ep));
  if (c.nvl > 0) {
    const int64_t fc = int64_t{c.fsdp} * c.cp;
    if (c.ep > c.nvl)
      v.push_back(fmt::format("NVLink rule: ep = {} > NVLink domain size {} (an ep group must fit in one domain)",
                              c.ep, c.nvl));
    if (fc > c.nvl)
      v.push_back(fmt::format("NVLink rule: fsdp*cp = {}*{} = {} > NVLink domain size {} (an fsdp*cp group must fit "
                              "in one domain)", c.fsdp, c.cp, fc, c.nvl));
    if (c.ep <= c.nvl && expert == world)
      if (auto s = straddle("ep", c.ep, world, c.nvl); !s.empty()) v.push_back(s);
    if (fc <= c.nvl && dense == world)
      if (auto s = straddle("fsdp*cp", static_cast<int>(fc), world, c.nvl); !s.empty()) v.push_back(s);
  }
  return v;
}

void validate_mesh(const MeshConfig& c, int world) {
  const auto v = mesh_violations(c, world);
  if (!v.empty()) fail(fmt::format("invalid mesh {} for world {}:\n  {}", c.str(), world, fmt::join(v, "\n  ")));
}

}  // namespace trident
