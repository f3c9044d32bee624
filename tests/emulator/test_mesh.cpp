// Meshes: coordinates, groups, the dense and expert meshes of a MeshShape, and the mesh communicators built on
// the emulator (the mesh rules themselves are tested in tests/parallel/test_layout.cpp).
#include <gtest/gtest.h>

#include <algorithm>

#include "emulator/world.h"
#include "parallel/mesh.h"
#include "parallel/mesh_comm.h"

namespace trident {
namespace {

TEST(Mesh, CoordinatesRowMajorLastFastest) {
  DeviceMesh m({{"a", 2}, {"b", 3}, {"c", 4}});
  EXPECT_EQ(m.world(), 24);
  EXPECT_EQ(m.coords(0), (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(m.coords(1), (std::vector<int>{0, 0, 1}));
  EXPECT_EQ(m.coords(4), (std::vector<int>{0, 1, 0}));
  EXPECT_EQ(m.coords(23), (std::vector<int>{1, 2, 3}));
  for (int r = 0; r < m.world(); ++r) EXPECT_EQ(m.rank_of(m.coords(r)), r);
  EXPECT_EQ(m.coord(17, "b"), 1);  // 17 = 1*12 + 1*4 + 1
}

TEST(Mesh, Groups) {
  DeviceMesh m({{"d_rep", 2}, {"fsdp", 2}, {"cp", 3}});
  EXPECT_EQ(m.group(7, {"cp"}), (std::vector<int>{6, 7, 8}));
  EXPECT_EQ(m.group(7, {"fsdp"}), (std::vector<int>{7, 10}));
  EXPECT_EQ(m.group(7, {"d_rep"}), (std::vector<int>{1, 7}));
  EXPECT_EQ(m.group(7, {"cp", "fsdp"}), (std::vector<int>{6, 7, 8, 9, 10, 11}));  // mesh order: cp fastest
  EXPECT_EQ(m.group(7, {}), (std::vector<int>{7}));
  EXPECT_EQ(m.group_name({"cp", "fsdp"}), "fsdp*cp");
  EXPECT_EQ(m.group_color(7, {"fsdp"}), 1 * 3 + 1);  // (d_rep=1, cp=1)
  EXPECT_EQ(m.group_key(7, {"fsdp"}), 0);
  EXPECT_EQ(m.groups({"fsdp", "cp"}).size(), 2u);
  EXPECT_THROW(m.group(0, {"ep"}), Error);
  EXPECT_THROW(DeviceMesh({{"a", 2}, {"a", 2}}), Error);
  EXPECT_THROW(DeviceMesh({{"a", 0}}), Error);
}

TEST(Mesh, DenseAndExpertMeshesOfAShape) {
  const MeshShape m{2, 3, 4, 6, 4};
  const DeviceMesh dense = dense_mesh(m), expert = expert_mesh(m);
  EXPECT_EQ(dense.world(), 24);
  EXPECT_EQ(expert.world(), 24);
  EXPECT_EQ(dense.group_name({"fsdp", "cp"}), "fsdp*cp");
  for (int r = 0; r < 24; ++r) {
    const auto dc = dense_coord(m, r);
    const auto ec = expert_coord(m, r);
    EXPECT_EQ(dense.coords(r), (std::vector<int>{int(dc.d), int(dc.f), int(dc.c)}));
    EXPECT_EQ(expert.coords(r), (std::vector<int>{int(ec.ef), int(ec.p)}));
  }
  EXPECT_THROW(dense_mesh(MeshShape{0, 1, 1, 1, 1}), Error);
}

// make_mesh_comms checks the mesh against the communicator with the shared validator (validate).
TEST(MeshComms, RejectsAMeshOfAnotherWorld) {
  try {
    emu::spawn(4, [&](emu::RankContext& ctx) { make_mesh_comms(ctx.world(), MeshShape{1, 1, 2, 1, 2}); });
    ADD_FAILURE() << "no error";
  } catch (const emu::RankError& e) {
    EXPECT_NE(e.original.find("d_rep*fsdp*cp = 2 but the world size is 4"), std::string::npos) << e.what();
  }
}

// The mesh communicators on the emulator: every rank's communicator holds exactly its mesh group, in order.
void check_mesh_comms(const MeshShape& cfg, int world) {
  const DeviceMesh dense = dense_mesh(cfg), expert = expert_mesh(cfg);
  std::vector<std::string> errs(static_cast<size_t>(world));
  emu::spawn(world, [&](emu::RankContext& ctx) {
    const int r = ctx.rank();
    auto mc = make_mesh_comms(ctx.world(), cfg);
    auto check = [&](Communicator& c, const DeviceMesh& m, std::vector<std::string> dims, const char* name) {
      const auto want = m.group(r, dims);
      std::vector<int> got(static_cast<size_t>(c.size()));
      c.all_gather(&r, got.data(), 1, DataType::i32);
      if (got != want || c.name() != name || c.rank() != m.group_key(r, dims))
        errs[static_cast<size_t>(r)] += fmt::format("{}: got [{}] want [{}]; ", name, fmt::join(got, ","),
                                                     fmt::join(want, ","));
    };
    check(*mc.fsdp_cp, dense, {"fsdp", "cp"}, "fsdp*cp");
    check(*mc.d_rep, dense, {"d_rep"}, "d_rep");
    check(*mc.fsdp, dense, {"fsdp"}, "fsdp");
    check(*mc.cp, dense, {"cp"}, "cp");
    check(*mc.e_fsdp, expert, {"e_fsdp"}, "e_fsdp");
    check(*mc.ep, expert, {"ep"}, "ep");
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(errs[static_cast<size_t>(r)], "") << "rank " << r << " " << cfg.str();
}

TEST(MeshComms, Small) { check_mesh_comms({2, 2, 2, 2, 4}, 8); }
TEST(MeshComms, SourceDocument256) { check_mesh_comms({4, 1, 64, 4, 64}, 256); }

}  // namespace
}  // namespace trident
