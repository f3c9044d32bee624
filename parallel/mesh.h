// Device meshes (DESIGN.md section 4): a named n-d mesh over the world ranks, row-major (the last dimension
// varies fastest). The dense mesh is (d_rep, fsdp, cp) and the expert mesh (e_fsdp, ep), over the same ranks,
// so cp and ep are innermost (contiguous ranks). Pure functions: no threads, no communicators (see
// parallel/mesh_comm.h for building the sub-communicators). The run's mesh and its rules are
// MeshShape and violations (parallel/layout.h).
#pragma once
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "parallel/layout.h"

namespace trident {

struct MeshDim {
  std::string name;
  int size = 1;
};

class DeviceMesh {
 public:
  explicit DeviceMesh(std::vector<MeshDim> dims);  // sizes >= 1, names unique and non-empty

  const std::vector<MeshDim>& dims() const { return dims_; }
  int ndim() const { return static_cast<int>(dims_.size()); }
  int world() const { return world_; }
  int dim_index(std::string_view name) const;  // throws for an unknown name
  int size(std::string_view name) const { return dims_[static_cast<size_t>(dim_index(name))].size; }

  std::vector<int> coords(int rank) const;              // one per dimension
  int coord(int rank, std::string_view dim) const;
  int rank_of(std::span<const int> coords) const;

  // The sub-group over `dims` containing `rank`: all ranks that share every OTHER coordinate with it, ordered
  // row-major over `dims` taken in mesh order (so the innermost chosen dim varies fastest). An empty `dims`
  // gives {rank}; all dims give the world.
  std::vector<int> group(int rank, const std::vector<std::string>& dims) const;
  // Split arguments for that group: color = index of the group (row-major over the other dims), key = the
  // rank's position inside it.
  int group_color(int rank, const std::vector<std::string>& dims) const;
  int group_key(int rank, const std::vector<std::string>& dims) const;
  // Every group over `dims` (a partition of the world), in color order.
  std::vector<std::vector<int>> groups(const std::vector<std::string>& dims) const;
  // "fsdp*cp": the dims in mesh order joined by '*' ("" for none); used as the communicator name.
  std::string group_name(const std::vector<std::string>& dims) const;

 private:
  std::vector<bool> mask(const std::vector<std::string>& dims) const;
  std::vector<MeshDim> dims_;
  std::vector<int> strides_;
  int world_ = 1;
};

// The dense mesh (d_rep, fsdp, cp) and the expert mesh (e_fsdp, ep) of a run's MeshShape (parallel/layout.h),
// over the same ranks. Sizes must be >= 1 and the world at most 2^30 ranks (DeviceMesh's limit).
DeviceMesh dense_mesh(const MeshShape& m);
DeviceMesh expert_mesh(const MeshShape& m);
// 2D CP: the dense mesh with cp split into (cp_outer, cp_inner), cp_inner innermost: cp coordinate
// c = o * cp_inner + i, the same ranks in the same order as dense_mesh (m.cp % m.cp_inner == 0).
DeviceMesh dense_mesh_2d_cp(const MeshShape& m);

}  // namespace trident
