// Sub-communicators of a device mesh, built with Communicator::split (collective over `world`: every rank
// calls these functions in the same order).
#pragma once
#include <memory>
#include <source_location>
#include <string>
#include <vector>

#include "parallel/comm.h"
#include "parallel/mesh.h"

namespace trident {

// The communicator over `dims` of `mesh` that contains this rank (DeviceMesh::group), named
// mesh.group_name(dims). Requires world.size() == mesh.world(); communicator rank == DeviceMesh::group_key.
std::unique_ptr<Communicator> split_mesh(Communicator& world, const DeviceMesh& mesh,
                                         const std::vector<std::string>& dims,
                                         std::source_location loc = std::source_location::current());

// The communicators of FSDP x CP x EP (DESIGN.md section 4). Validates the mesh against the world size first
// (validate).
struct MeshComms {
  std::unique_ptr<Communicator> fsdp_cp;  // "fsdp*cp": dense parameter shards (reduce-scatter / all-gather)
  std::unique_ptr<Communicator> d_rep;    // "d_rep":   dense gradient all-reduce across replicas
  std::unique_ptr<Communicator> fsdp;     // "fsdp"
  std::unique_ptr<Communicator> cp;       // "cp":      KV all-gather / KV-gradient reduce-scatter
  std::unique_ptr<Communicator> e_fsdp;   // "e_fsdp":  expert parameter shards
  std::unique_ptr<Communicator> ep;       // "ep":      token dispatch / combine (all-to-all(v))
  // 2D CP only (mesh.cp_inner > 1; null otherwise): the cp group split into NVLink domains.
  std::unique_ptr<Communicator> cp_outer;  // "cp_outer": same inner index, one rank per domain (RDMA)
  std::unique_ptr<Communicator> cp_inner;  // "cp_inner": the cp ranks of one domain (NVLink)
};
MeshComms make_mesh_comms(Communicator& world, const MeshShape& mesh,
                          std::source_location loc = std::source_location::current());

}  // namespace trident
