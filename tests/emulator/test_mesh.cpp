// Meshes: coordinates, groups, the validator (every rule violated once, with its message), and the mesh
// communicators built on the emulator.
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

std::vector<std::string> viol(MeshConfig c, int world) { return mesh_violations(c, world); }

TEST(MeshValidator, ValidSourceDocumentMesh) {
  // 753B on GB200 NVL72 with 64 job ranks per rack: (4,1,64)x(4,64), 256 experts.
  EXPECT_TRUE(viol({4, 1, 64, 4, 64, 256, 64}, 256).empty());
  EXPECT_NO_THROW(validate_mesh({4, 1, 64, 4, 64, 256, 64}, 256));
  EXPECT_TRUE(viol({1, 1, 1, 1, 1, 0, 0}, 1).empty());
}

TEST(MeshValidator, EachRuleOnce) {
  EXPECT_EQ(viol({0, 1, 1, 1, 1, 0, 0}, 1), (std::vector<std::string>{"size rule: d_rep = 0 must be >= 1"}));
  EXPECT_EQ(viol({2, 1, 3, 1, 8, 0, 0}, 8),
            (std::vector<std::string>{"dense mesh rule: d_rep*fsdp*cp = 2*1*3 = 6 != world 8"}));
  EXPECT_EQ(viol({2, 2, 4, 2, 4, 0, 0}, 16),
            (std::vector<std::string>{"expert mesh rule: e_fsdp*ep = 2*4 = 8 != world 16"}));
  EXPECT_EQ(viol({1, 1, 4, 1, 4, 10, 0}, 4),
            (std::vector<std::string>{"expert placement rule: experts % ep = 10 % 4 = 2 != 0 (each ep rank must own "
                                      "experts/ep whole experts)"}));
  EXPECT_EQ(viol({2, 1, 8, 1, 16, 0, 8}, 16),
            (std::vector<std::string>{
                "NVLink rule: ep = 16 > NVLink domain size 8 (an ep group must fit in one domain)"}));
  EXPECT_EQ(viol({1, 2, 8, 2, 8, 0, 8}, 16),
            (std::vector<std::string>{"NVLink rule: fsdp*cp = 2*8 = 16 > NVLink domain size 8 (an fsdp*cp group "
                                      "must fit in one domain)"}));
  EXPECT_EQ(viol({6, 1, 2, 3, 4, 0, 6}, 12),
            (std::vector<std::string>{"NVLink rule: the ep group of ranks 4..7 straddles NVLink domains 0 and 1 (6 "
                                      "ranks per domain; ep=4 must divide 6)"}));
  EXPECT_EQ(viol({3, 1, 4, 6, 2, 0, 6}, 12),
            (std::vector<std::string>{"NVLink rule: the fsdp*cp group of ranks 4..7 straddles NVLink domains 0 and 1 "
                                      "(6 ranks per domain; fsdp*cp=4 must divide 6)"}));
  // The source document's mesh with all 72 GPUs of an NVL72 rack as job ranks straddles racks.
  EXPECT_EQ(viol({4, 1, 64, 4, 64, 256, 72}, 256).size(), 2u);
  try {
    validate_mesh({2, 1, 3, 2, 4, 6, 0}, 8);
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("invalid mesh (d_rep,fsdp,cp)x(e_fsdp,ep)=(2,1,3)x(2,4) experts=6 for world 8"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("d_rep*fsdp*cp = 2*1*3 = 6 != world 8"), std::string::npos) << m;
    EXPECT_NE(m.find("experts % ep = 6 % 4 = 2 != 0"), std::string::npos) << m;
  }
}

// The mesh communicators on the emulator: every rank's communicator holds exactly its mesh group, in order.
void check_mesh_comms(const MeshConfig& cfg, int world) {
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

TEST(MeshComms, Small) { check_mesh_comms({2, 2, 2, 2, 4, 8, 0}, 8); }
TEST(MeshComms, SourceDocument256) { check_mesh_comms({4, 1, 64, 4, 64, 64, 64}, 256); }

}  // namespace
}  // namespace trident
