// Device meshes (DESIGN.md section 4): a named n-d mesh over the world ranks, row-major (the last dimension
// varies fastest). The dense mesh is (d_rep, fsdp, cp) and the expert mesh (e_fsdp, ep), over the same ranks,
// so cp and ep are innermost (contiguous ranks). Pure functions: no threads, no communicators (see
// parallel/mesh_comm.h for building the sub-communicators).
#pragma once
#include <span>
#include <string>
#include <string_view>
#include <vector>

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

// The parallel configuration of a run: dense mesh (d_rep, fsdp, cp), expert mesh (e_fsdp, ep).
struct MeshConfig {
  int d_rep = 1, fsdp = 1, cp = 1;
  int e_fsdp = 1, ep = 1;
  int experts = 0;  // routed experts (0: not checked)
  int nvl = 0;      // job ranks per NVLink domain (0: no NVLink rules). Domain of rank r is r / nvl.
  std::string str() const;  // "(d_rep,fsdp,cp)x(e_fsdp,ep)=(4,1,64)x(4,64) experts=256 nvl=64"
};

DeviceMesh dense_mesh(const MeshConfig& c);   // dims d_rep, fsdp, cp
DeviceMesh expert_mesh(const MeshConfig& c);  // dims e_fsdp, ep

// Every rule the configuration breaks, one message each naming the rule and its numbers (empty: valid):
//   sizes >= 1; d_rep*fsdp*cp == world; e_fsdp*ep == world; experts % ep == 0;
//   with nvl > 0: ep <= nvl; fsdp*cp <= nvl; no ep group and no fsdp*cp group straddles two NVLink domains.
std::vector<std::string> mesh_violations(const MeshConfig& c, int world);
// Throws trident::Error with all violations (one per line) when any.
void validate_mesh(const MeshConfig& c, int world);

}  // namespace trident
