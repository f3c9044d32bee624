#include "parallel/mesh_comm.h"

#include "reference/check.h"

namespace trident {

std::unique_ptr<Communicator> split_mesh(Communicator& world, const DeviceMesh& mesh,
                                         const std::vector<std::string>& dims, std::source_location loc) {
  TD_CHECK_EQ(world.size(), mesh.world(), "split_mesh: communicator size vs mesh world");
  const int r = world.rank();
  auto c = world.split(mesh.group_color(r, dims), mesh.group_key(r, dims), mesh.group_name(dims), loc);
  TD_CHECK(c != nullptr, "split_mesh: no communicator returned");
  return c;
}

MeshComms make_mesh_comms(Communicator& world, const MeshShape& mesh, std::source_location loc) {
  validate(mesh, {.world = world.size()});
  const DeviceMesh dense = dense_mesh(mesh), expert = expert_mesh(mesh);
  MeshComms m;
  m.fsdp_cp = split_mesh(world, dense, {"fsdp", "cp"}, loc);
  m.d_rep = split_mesh(world, dense, {"d_rep"}, loc);
  m.fsdp = split_mesh(world, dense, {"fsdp"}, loc);
  m.cp = split_mesh(world, dense, {"cp"}, loc);
  m.e_fsdp = split_mesh(world, expert, {"e_fsdp"}, loc);
  m.ep = split_mesh(world, expert, {"ep"}, loc);
  if (mesh.cp_2d()) {
    const DeviceMesh d2 = dense_mesh_2d_cp(mesh);
    m.cp_outer = split_mesh(world, d2, {"cp_outer"}, loc);
    m.cp_inner = split_mesh(world, d2, {"cp_inner"}, loc);
  }
  return m;
}

}  // namespace trident
