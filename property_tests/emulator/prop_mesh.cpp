// Properties of meshes over random valid configurations: coordinates round-trip, every group family
// partitions the world, and on the emulator every rank's Split result holds exactly its mesh group (so all
// ranks agree on the groups).
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>

#include "emulator/world.h"
#include "parallel/mesh.h"
#include "parallel/mesh_comm.h"

namespace trident {
namespace {

// A random valid mesh with world <= max_world (ep a divisor of the world) and a number of experts it places.
struct RandomMesh {
  MeshShape m;
  int64_t experts = 0;
};
rc::Gen<RandomMesh> gen_mesh(int max_world) {
  return rc::gen::exec([max_world] {
    RandomMesh r;
    MeshShape& c = r.m;
    c.d_rep = *rc::gen::inRange(1, 5);
    c.fsdp = *rc::gen::inRange(1, 5);
    c.cp = *rc::gen::suchThat(rc::gen::inRange(1, 9), [&](int cp) { return c.d_rep * c.fsdp * cp <= max_world; });
    const int64_t world = c.world();
    std::vector<int64_t> divs;
    for (int64_t d = 1; d <= world; ++d)
      if (world % d == 0) divs.push_back(d);
    c.ep = *rc::gen::elementOf(divs);
    c.e_fsdp = world / c.ep;
    r.experts = c.ep * *rc::gen::inRange(1, 4);
    return r;
  });
}

std::vector<std::vector<std::string>> subsets(const DeviceMesh& m) {
  std::vector<std::vector<std::string>> out;
  for (int mask = 0; mask < (1 << m.ndim()); ++mask) {
    std::vector<std::string> s;
    for (int i = 0; i < m.ndim(); ++i)
      if (mask & (1 << i)) s.push_back(m.dims()[static_cast<size_t>(i)].name);
    out.push_back(s);
  }
  return out;
}

RC_GTEST_PROP(MeshProps, GroupsPartitionAndCoordsRoundTrip, ()) {
  const RandomMesh r = *gen_mesh(256);
  const MeshShape& c = r.m;
  const int world = static_cast<int>(c.world());
  RC_ASSERT(violations(c, {.world = world, .experts = r.experts}).empty());
  for (const DeviceMesh& m : {dense_mesh(c), expert_mesh(c)}) {
    RC_ASSERT(m.world() == world);
    for (int r = 0; r < world; ++r) RC_ASSERT(m.rank_of(m.coords(r)) == r);
    for (const auto& dims : subsets(m)) {
      int expect = 1;
      for (const auto& d : dims) expect *= m.size(d);
      std::vector<int> seen(static_cast<size_t>(world), 0);
      for (const auto& g : m.groups(dims)) {
        RC_ASSERT(static_cast<int>(g.size()) == expect);
        for (int q : g) ++seen[static_cast<size_t>(q)];
      }
      RC_ASSERT(std::all_of(seen.begin(), seen.end(), [](int k) { return k == 1; }));
      for (int r = 0; r < world; ++r) {
        const auto g = m.group(r, dims);
        const auto key = static_cast<size_t>(m.group_key(r, dims));
        RC_ASSERT(key < g.size());
        RC_ASSERT(g[key] == r);
        // Members share every coordinate outside `dims`.
        for (int q : g)
          for (int i = 0; i < m.ndim(); ++i) {
            const auto& nm = m.dims()[static_cast<size_t>(i)].name;
            if (std::find(dims.begin(), dims.end(), nm) == dims.end()) RC_ASSERT(m.coords(q)[static_cast<size_t>(i)] == m.coords(r)[static_cast<size_t>(i)]);
          }
      }
    }
  }
}

RC_GTEST_PROP(MeshProps, RanksAgreeOnSplitGroups, ()) {
  const MeshShape c = (*gen_mesh(32)).m;
  const int world = static_cast<int>(c.world());
  const DeviceMesh dense = dense_mesh(c), expert = expert_mesh(c);
  std::vector<std::string> errs(static_cast<size_t>(world));
  emu::spawn(world, [&](emu::RankContext& ctx) {
    const int r = ctx.rank();
    for (const DeviceMesh* m : {&dense, &expert})
      for (const auto& dims : subsets(*m)) {
        auto comm = split_mesh(ctx.world(), *m, dims);
        std::vector<int> got(static_cast<size_t>(comm->size()));
        comm->all_gather(&r, got.data(), 1, DataType::i32);
        if (got != m->group(r, dims) || comm->name() != m->group_name(dims))
          errs[static_cast<size_t>(r)] += fmt::format("{}: got [{}]; ", m->group_name(dims), fmt::join(got, ","));
      }
  });
  for (int r = 0; r < world; ++r) {
    if (!errs[static_cast<size_t>(r)].empty()) RC_LOG() << "mesh " << c.str() << " rank " << r << ": " << errs[static_cast<size_t>(r)];
    RC_ASSERT(errs[static_cast<size_t>(r)].empty());
  }
}

}  // namespace
}  // namespace trident
