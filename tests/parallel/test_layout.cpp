// Layout arithmetic of docs/parallel.md: zig-zag data, dim-0 shards, and the mesh validator (violations: every
// rule alone, several at once, messages that name the fix, fixes that work).
#include <gtest/gtest.h>

#include <bit>
#include <map>
#include <set>

#include "parallel/layout.h"
#include "parallel/mesh.h"
#include "reference/check.h"

using namespace trident;

namespace {
MeshShape mesh(int64_t d, int64_t f, int64_t c, int64_t ef, int64_t p) { return {d, f, c, ef, p}; }
}  // namespace

TEST(Layout, ParseMesh) {
  auto m = parse_mesh("d_rep=4,fsdp=1,cp=64,e_fsdp=4,ep=64");
  EXPECT_EQ(m.world(), 256);
  EXPECT_EQ(m.e_fsdp * m.ep, 256);
  EXPECT_EQ(parse_mesh("cp=2,ep=3"), (MeshShape{1, 1, 2, 1, 3}));  // syntax only: the products are violations()
  EXPECT_EQ(parse_mesh(m.spec()), m);
  EXPECT_THROW(parse_mesh("cp=two"), Error);
  EXPECT_THROW(parse_mesh("tp=2,ep=2"), Error);
  EXPECT_THROW(parse_mesh("cp=0"), Error);
  EXPECT_THROW(parse_mesh("cp=2,cp=2,ep=4"), Error);                       // repeated key
  EXPECT_THROW(parse_mesh("d_rep=1048577,e_fsdp=1048577"), Error);         // one dimension too large
  EXPECT_THROW(parse_mesh("d_rep=65536,fsdp=65536,e_fsdp=65536,ep=65536"), Error);  // world too large
  EXPECT_NO_THROW(parse_mesh("d_rep=1048576,e_fsdp=1048576"));
  EXPECT_EQ(parse_mesh(" cp = 2 , ep=2 "), (MeshShape{1, 1, 2, 1, 2}));  // spaces around keys and values
  EXPECT_THROW(parse_mesh(""), Error);                                    // empty: never a silent 1-rank mesh
  EXPECT_THROW(parse_mesh("  "), Error);
  EXPECT_THROW(parse_mesh("cp=2,,ep=2"), Error);
}

// 2D CP: cp_inner is read, printed only when set (every 1D spec and str() unchanged) and round-trips; the 2D dense
// mesh keeps every rank's cp coordinate (c = o * cp_inner + i).
TEST(Layout, CpInnerKey) {
  const MeshShape m = parse_mesh("fsdp=2,cp=8,e_fsdp=2,ep=8,cp_inner=4");
  EXPECT_EQ(m.cp_inner, 4);
  EXPECT_EQ(m.cp_outer(), 2);
  EXPECT_TRUE(m.cp_2d());
  EXPECT_EQ(m.spec(), "d_rep=1,fsdp=2,cp=8,e_fsdp=2,ep=8,cp_inner=4");
  EXPECT_EQ(parse_mesh(m.spec()), m);
  EXPECT_EQ(parse_mesh("cp=2,ep=2").spec(), "d_rep=1,fsdp=1,cp=2,e_fsdp=1,ep=2");
  EXPECT_EQ(parse_mesh("cp=2,ep=2").str(), "(d_rep,fsdp,cp)x(e_fsdp,ep) = (1,1,2)x(1,2)");
  const DeviceMesh d = dense_mesh(m), d2 = dense_mesh_2d_cp(m);
  for (int r = 0; r < m.world(); ++r) {
    EXPECT_EQ(d2.coord(r, "cp_outer") * 4 + d2.coord(r, "cp_inner"), d.coord(r, "cp")) << r;
    EXPECT_EQ(d2.coord(r, "fsdp"), d.coord(r, "fsdp")) << r;
  }
  EXPECT_TRUE(violations(m, {.nvl = 4}).empty());
  EXPECT_EQ(broken_rules(m, {.nvl = 2}), rule_bit(LayoutRule::cp_inner));
}

// Attention work per rank: with one document per sequence zig-zag balances it exactly (each rank: sum of its two
// chunks' causal rows = closed form); with one document per token every rank does one pair per row.
TEST(Layout, AttentionWork) {
  const MeshShape m{1, 2, 4, 2, 4};
  const int64_t B = 4, S = 64, ch = S / 8, per = B / 2;
  const AttentionWork w = attention_work(m, B, S, {});
  for (int64_t r = 0; r < m.world(); ++r) {
    const int64_t c = r % 4, lo = c * ch, hi = (7 - c) * ch;
    // sum_{p in [lo, lo+ch)} (p + 1) + sum_{p in [hi, hi+ch)} (p + 1), per local sequence
    const int64_t want = per * (ch * (lo + hi) + ch * (ch + 1));
    EXPECT_EQ(w.per_rank[static_cast<size_t>(r)], want) << r;
  }
  EXPECT_EQ(w.max_over_mean(), 1.0);
  std::vector<int64_t> ones(static_cast<size_t>(B * S));
  for (size_t i = 0; i < ones.size(); ++i) ones[i] = static_cast<int64_t>(i) % S;
  const AttentionWork w1 = attention_work(m, B, S, ones);
  for (int64_t n : w1.per_rank) EXPECT_EQ(n, per * 2 * ch);
  // documents [0, S/4) and [S/4, S): the causal mirror no longer pairs up, ranks differ (halves would still balance)
  std::vector<int64_t> two(static_cast<size_t>(B * S));
  for (size_t i = 0; i < two.size(); ++i) two[i] = static_cast<int64_t>(i) % S < S / 4 ? 0 : S / 4;
  EXPECT_GT(attention_work(m, B, S, two).max_over_mean(), 1.0);
}

TEST(Layout, CoordinatesRoundTrip) {
  auto m = mesh(2, 3, 4, 6, 4);
  for (int64_t r = 0; r < m.world(); ++r) {
    auto dc = dense_coord(m, r);
    EXPECT_EQ((dc.d * m.fsdp + dc.f) * m.cp + dc.c, r);
    auto ec = expert_coord(m, r);
    EXPECT_EQ(ec.ef * m.ep + ec.p, r);
  }
}

// Every token of every sequence is held by exactly one rank; rank c holds chunks c and 2cp-1-c.
TEST(Layout, ZigZagCoversEachTokenOnce) {
  for (auto m : {mesh(1, 1, 1, 1, 1), mesh(1, 1, 2, 1, 2), mesh(2, 1, 2, 2, 2), mesh(1, 2, 2, 2, 2),
                 mesh(3, 1, 1, 1, 3), mesh(1, 1, 4, 2, 2), mesh(2, 2, 4, 4, 4)}) {
    const int64_t B = 2 * m.d_rep * m.fsdp, S = 8 * m.cp;
    std::map<std::pair<int64_t, int64_t>, int> owner_count;
    for (int64_t r = 0; r < m.world(); ++r) {
      auto rs = local_tokens(m, r, B, S);
      const int64_t c = dense_coord(m, r).c, chunk = S / (2 * m.cp);
      ASSERT_EQ(rs.size() % 2, 0u);
      for (size_t i = 0; i < rs.size(); i += 2) {
        EXPECT_EQ(rs[i].begin, c * chunk) << m.str() << " rank " << r;
        EXPECT_EQ(rs[i + 1].begin, (2 * m.cp - 1 - c) * chunk) << m.str() << " rank " << r;
      }
      for (auto& t : rs)
        for (int64_t p = t.begin; p < t.end; ++p) owner_count[{t.seq, p}]++;
    }
    EXPECT_EQ(static_cast<int64_t>(owner_count.size()), B * S) << m.str();
    for (auto& [k, n] : owner_count) EXPECT_EQ(n, 1) << m.str();
  }
}

TEST(Layout, ShardsPartitionRowsWithPadding) {
  for (int64_t rows : {1, 5, 64, 65}) {
    for (int64_t n : {1, 2, 3, 4, 7, 64}) {
      ShardSpec s{rows, 3, n};
      int64_t covered = 0;
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_LE(s.begin_row(i), s.end_row(i));
        EXPECT_EQ(s.begin_row(i), std::min(rows, covered));
        covered = std::max(covered, s.end_row(i));
        EXPECT_LE(s.valid_elems(i), s.shard_elems());
      }
      EXPECT_EQ(covered, rows) << "rows " << rows << " n " << n;
      EXPECT_GE(s.rows_per_shard() * n, rows);
      EXPECT_LT((s.rows_per_shard() - 1) * n, rows);
    }
  }
}

// Vocabulary slices: head slices are whole vocab chunks covering [0, V) in order; embedding slices partition the
// rows of a shard; counts are min(s, n_vc) and min(s, rps); negative requests are rejected.
TEST(Layout, VocabSlicesPartition) {
  for (int64_t V : {1, 7, 512, 1000}) {
    for (int64_t vc : {1, 100, 128, 4096}) {
      for (int64_t nfc : {1, 3, 64}) {
        for (int64_t req : {0, 1, 2, 3, 5, 10000}) {
          const VocabSlices s = vocab_slices(V, vc, nfc, req);
          const int64_t n_vc = (V + vc - 1) / vc, rps = (V + nfc - 1) / nfc, want = req == 0 ? n_vc : req;
          const std::string at = fmt::format("V {} vc {} nfc {} req {}", V, vc, nfc, req);
          ASSERT_EQ(static_cast<int64_t>(s.head_cols.size()), std::min(want, n_vc)) << at;
          ASSERT_EQ(static_cast<int64_t>(s.embed_rows.size()), std::min(want, rps)) << at;
          int64_t j = 0;
          for (const Range& r : s.head_cols) {
            EXPECT_EQ(r.begin, j) << at;
            EXPECT_GT(r.end, r.begin) << at;
            EXPECT_EQ(r.begin % vc, 0) << at;
            EXPECT_TRUE(r.end % vc == 0 || r.end == V) << at;
            j = r.end;
          }
          EXPECT_EQ(j, V) << at;
          int64_t row = 0;
          for (const Range& r : s.embed_rows) {
            EXPECT_EQ(r.begin, row) << at;
            EXPECT_GT(r.end, r.begin) << at;
            row = r.end;
          }
          EXPECT_EQ(row, rps) << at;
        }
      }
    }
  }
  EXPECT_THROW(vocab_slices(512, 128, 4, -1), Error);
}

// ---- the validator: every rule, several at once, messages that name the fix -------------------------------------

// The step's inputs (tiny preset: 8 experts, tile 8).
LayoutInputs step_inputs(int64_t experts, int64_t seqs, int64_t seq_len, int64_t tile, int64_t chunks) {
  return {.experts = experts, .sequences = seqs, .seq_len = seq_len, .tile = tile, .ep_chunks = chunks};
}
uint32_t bit(LayoutRule r) { return rule_bit(r); }

TEST(Validator, ValidMeshes) {
  EXPECT_TRUE(violations(mesh(1, 1, 1, 1, 1), {}).empty());
  EXPECT_TRUE(violations(mesh(1, 1, 4, 2, 2), step_inputs(8, 2, 64, 8, 2)).empty());
  EXPECT_TRUE(violations(mesh(4, 1, 64, 4, 64), {.world = 256, .experts = 256, .seq_len = 1 << 20}).empty());
  EXPECT_EQ(broken_rules(mesh(4, 1, 64, 4, 64), {.world = 256, .experts = 256, .seq_len = 1 << 20}), 0u);
  EXPECT_NO_THROW(validate(mesh(2, 2, 2, 2, 4), step_inputs(8, 4, 32, 8, 1)));
  EXPECT_NO_THROW(validate_layout(mesh(1, 1, 4, 2, 2), 8, 2, 64, 8, 2));
}

// Each rule broken alone: exactly that rule's bit, one line, naming the numbers and the fix (emulate's flags).
TEST(Validator, EachRuleAlone) {
  struct Case {
    MeshShape m;
    LayoutInputs in;
    LayoutRule rule;
    std::string message;
  };
  const std::vector<Case> cases = {
      {mesh(1, 0, 2, 1, 2), {}, LayoutRule::sizes,
       "mesh size fsdp = 0 must be >= 1: use --mesh d_rep=1,fsdp=1,cp=2,e_fsdp=1,ep=2"},
      {mesh(1, 1, 2, 1, 2), {.seq_len = 0}, LayoutRule::sizes, "seq_len = 0 must be >= 1: use --seq-len 1"},
      {mesh(1, 1, 2, 1, 4), step_inputs(8, 2, 32, 8, 1), LayoutRule::products,
       "d_rep*fsdp*cp = 2 but e_fsdp*ep = 4 (both must be the world size): use --mesh "
       "d_rep=1,fsdp=1,cp=2,e_fsdp=1,ep=2"},
      {mesh(2, 1, 2, 1, 4), {.world = 8}, LayoutRule::world,
       "d_rep*fsdp*cp = 4 but the world size is 8: use a mesh of 8 ranks"},
      {mesh(1, 1, 3, 1, 3), step_inputs(8, 2, 48, 8, 1), LayoutRule::experts,
       "experts 8 is not a multiple of ep = 3 (each ep rank owns experts/ep whole experts): use --mesh "
       "d_rep=1,fsdp=1,cp=3,e_fsdp=3,ep=1 or --experts 9"},
      {mesh(3, 1, 1, 1, 3), step_inputs(9, 2, 64, 8, 1), LayoutRule::sequences,
       "sequences 2 do not split over d_rep*fsdp = 3 data-parallel groups (each group holds whole sequences): use "
       "--seqs 3"},
      {mesh(1, 1, 16, 1, 16), {.experts = 16, .sequences = 1, .seq_len = 48}, LayoutRule::zigzag,
       "seq_len 48 is not a multiple of 2*cp = 32 (each sequence is cut into 2*cp zig-zag chunks): use --seq-len 64"},
      {mesh(1, 1, 4, 1, 4), step_inputs(8, 1, 32, 8, 1), LayoutRule::tile,
       "the zig-zag chunk seq_len/(2*cp) = 32/8 = 4 tokens is not a multiple of the reduction tile 8: a reduction "
       "tile would straddle two CP ranks: use --seq-len 64 or --tile 4"},
      {mesh(1, 1, 2, 1, 2), step_inputs(8, 1, 32, 8, 3), LayoutRule::ep_chunks,
       "EP chunks 3 exceed the 2 reduction tiles a rank holds (1 sequence(s) x 2 zig-zag chunks of 8 tokens, tile "
       "8; an EP chunk holds whole tiles): use --chunks 2"},
      {mesh(1, 1, 2, 1, 2), step_inputs(8, 1, 32, 8, 0), LayoutRule::ep_chunks,
       "EP chunks 0 must be >= 1: use --chunks 1"},
      {MeshShape{1, 1, 4, 1, 4, 3}, step_inputs(8, 1, 64, 8, 1), LayoutRule::cp_inner,
       "cp_inner 3 does not divide cp = 4 (2D CP: cp/cp_inner NVLink domains of cp_inner ranks each): use --mesh "
       "d_rep=1,fsdp=1,cp=4,e_fsdp=1,ep=4,cp_inner=2"},
      {MeshShape{1, 1, 8, 1, 8, 8}, {.nvl = 4}, LayoutRule::cp_inner,
       "cp_inner 8 exceeds the NVLink domain of 4 GPUs (an inner CP group must fit one domain): use --mesh "
       "d_rep=1,fsdp=1,cp=8,e_fsdp=1,ep=8,cp_inner=4 or --nvl 8"},
      {MeshShape{1, 1, 12, 1, 12, 12}, {.nvl = 8}, LayoutRule::cp_inner,  // the fix: the largest divisor <= 8
       "cp_inner 12 exceeds the NVLink domain of 8 GPUs (an inner CP group must fit one domain): use --mesh "
       "d_rep=1,fsdp=1,cp=12,e_fsdp=1,ep=12,cp_inner=6 or --nvl 12"},
  };
  for (const Case& c : cases) {
    const auto v = violations(c.m, c.in);
    ASSERT_EQ(v.size(), 1u) << rule_text(c.rule) << ": " << fmt::format("{}", fmt::join(v, " | "));
    EXPECT_EQ(v[0], c.message) << rule_text(c.rule);
    EXPECT_EQ(broken_rules(c.m, c.in), bit(c.rule)) << rule_text(c.rule);
    try {
      validate(c.m, c.in);
      ADD_FAILURE() << rule_text(c.rule) << ": no throw";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), "invalid mesh " + c.m.str() + ": " + c.message);
    }
  }
}

// With a tile, the seq_len fix of the zig-zag rule also keeps tiles whole; the tile rule is then not reported.
TEST(Validator, ZigzagFixKeepsTilesWhole) {
  const auto v = violations(mesh(1, 1, 16, 1, 16), {.experts = 16, .sequences = 1, .seq_len = 48, .tile = 8});
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0],
            "seq_len 48 is not a multiple of 2*cp = 32 (each sequence is cut into 2*cp zig-zag chunks): use --seq-len "
            "256 (a multiple of 2*cp*tile = 256, so every chunk holds whole reduction tiles)");
}

TEST(Validator, SeveralAtOnce) {
  // experts 8 over ep 16, 3 sequences over 2 data groups, seq_len 48 over 2*cp = 32, 9 EP chunks (not checkable
  // while the data rules fail), and the world given as 16.
  const MeshShape m = mesh(1, 2, 16, 2, 16);
  const LayoutInputs in{.world = 16, .experts = 8, .sequences = 3, .seq_len = 48, .tile = 8, .ep_chunks = 9};
  const auto v = violations(m, in);
  ASSERT_EQ(v.size(), 4u) << fmt::format("{}", fmt::join(v, "\n"));
  EXPECT_EQ(v[0], "d_rep*fsdp*cp = 32 but the world size is 16: use a mesh of 16 ranks");
  EXPECT_EQ(v[1],
            "experts 8 is not a multiple of ep = 16 (each ep rank owns experts/ep whole experts): use --mesh "
            "d_rep=1,fsdp=2,cp=16,e_fsdp=4,ep=8 or --experts 16");
  EXPECT_EQ(v[2].rfind("sequences 3 do not split over d_rep*fsdp = 2", 0), 0u) << v[2];
  EXPECT_NE(v[2].find("use --seqs 4"), std::string::npos) << v[2];
  EXPECT_EQ(v[3].rfind("seq_len 48 is not a multiple of 2*cp = 32", 0), 0u) << v[3];
  EXPECT_EQ(broken_rules(m, in),
            bit(LayoutRule::world) | bit(LayoutRule::experts) | bit(LayoutRule::sequences) | bit(LayoutRule::zigzag));
  try {
    validate(m, in);
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), fmt::format("invalid mesh {}, 4 problems:\n  {}", m.str(), fmt::join(v, "\n  ")));
  }
  // validate_layout (the step's entry) reports the same lines.
  try {
    validate_layout(mesh(1, 1, 16, 1, 16), 8, 3, 48, 8, 1);
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("2 problems:\n  experts 8 is not a multiple of ep = 16"), std::string::npos) << w;
    EXPECT_NE(w.find("\n  seq_len 48 is not a multiple of 2*cp = 32"), std::string::npos) << w;
  }
}

// The planner's vocabulary: config keys, the world as cluster.world, no sequences / tile / EP chunks.
TEST(Validator, ConfigKeyNames) {
  InputNames n;
  n.config_keys = true;
  n.mesh = "mesh";
  n.world = "cluster.world";
  n.experts = "model.experts";
  n.seq_len = "workload.context";
  n.sequences = n.tile = n.ep_chunks = "";
  const auto v = violations(mesh(4, 1, 64, 2, 96), {.world = 128, .experts = 256, .seq_len = 1000000}, n);
  ASSERT_EQ(v.size(), 4u) << fmt::format("{}", fmt::join(v, "\n"));
  EXPECT_EQ(v[0], "d_rep*fsdp*cp = 256 but e_fsdp*ep = 192 (both must be the world size): use mesh.e_fsdp = 8, "
                  "mesh.ep = 32");
  EXPECT_EQ(v[1], "d_rep*fsdp*cp = 256 but the world size is 128: use cluster.world = 256 or a mesh of 128 ranks");
  EXPECT_EQ(v[2], "experts 256 is not a multiple of ep = 96 (each ep rank owns experts/ep whole experts): use "
                  "mesh.e_fsdp = 8, mesh.ep = 32 or model.experts = 288");
  EXPECT_EQ(v[3], "seq_len 1000000 is not a multiple of 2*cp = 128 (each sequence is cut into 2*cp zig-zag "
                  "chunks): use workload.context = 1000064");
  // A nameless input is not offered as a fix.
  const auto t = violations(mesh(1, 1, 4, 1, 4), {.seq_len = 32, .tile = 8}, n);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0], "the zig-zag chunk seq_len/(2*cp) = 32/8 = 4 tokens is not a multiple of the reduction tile 8: a "
                  "reduction tile would straddle two CP ranks: use workload.context = 64");
}

// Meshes whose products do not fit 64 bits are one sizes violation (no overflow); rules without inputs are skipped.
TEST(Validator, HugeAndMissing) {
  const int64_t big = int64_t{1} << 40;
  const auto v = violations(mesh(big, big, 1, 1, 1), {.experts = 8});
  ASSERT_EQ(v.size(), 1u);
  EXPECT_NE(v[0].find("more ranks than 64-bit integers hold"), std::string::npos) << v[0];
  EXPECT_EQ(broken_rules(mesh(big, big, 1, 1, 1), {}), bit(LayoutRule::sizes));
  EXPECT_EQ(broken_rules(mesh(1, 1, 3, 1, 3), {}), 0u);  // no experts, no seq_len: nothing else to check
  EXPECT_EQ(broken_rules(mesh(1, 1, 3, 1, 3), {.seq_len = 32}), bit(LayoutRule::zigzag));
}

// Over a grid of small meshes and inputs: broken_rules and violations agree, and applying the first fix a
// message offers (a flag value or a whole --mesh) makes that rule hold.
TEST(Validator, FixesWork) {
  int64_t checked = 0;
  for (int64_t d : {1, 2, 3})
    for (int64_t f : {1, 2})
      for (int64_t c : {1, 2, 3, 4})
        for (int64_t ep : {1, 2, 3, 4, 6, 8})
          for (int64_t ef : {1, 2, 3})
            for (int64_t E : {4, 6, 8})
              for (int64_t B : {1, 2, 3, 4})
                for (int64_t S : {24, 32, 48, 64})
                  for (int64_t chunks : {1, 2, 5}) {
                    const MeshShape m = mesh(d, f, c, ef, ep);
                    const LayoutInputs in = step_inputs(E, B, S, 4, chunks);
                    const auto v = violations(m, in);
                    const uint32_t bits = broken_rules(m, in);
                    ASSERT_EQ(v.empty(), bits == 0) << m.str();
                    ASSERT_EQ(v.size(), static_cast<size_t>(std::popcount(bits))) << m.str();
                    uint32_t rest = bits;
                    for (const std::string& line : v) {
                      const uint32_t rule = rest & (~rest + 1);  // lines come in rule order, one per rule here
                      rest &= ~rule;
                      const auto at = line.find(": use ");
                      ASSERT_NE(at, std::string::npos) << line;
                      std::string fix = line.substr(at + 6);
                      fix = fix.substr(0, fix.find(" or "));
                      fix = fix.substr(0, fix.find(" ("));
                      const auto sp = fix.find(' ');
                      const std::string flag = fix.substr(0, sp), value = fix.substr(sp + 1);
                      MeshShape m2 = m;
                      LayoutInputs in2 = in;
                      if (flag == "--mesh") m2 = parse_mesh(value);
                      else if (flag == "--experts") in2.experts = std::stoll(value);
                      else if (flag == "--seqs") in2.sequences = std::stoll(value);
                      else if (flag == "--seq-len") in2.seq_len = std::stoll(value);
                      else if (flag == "--tile") in2.tile = std::stoll(value);
                      else if (flag == "--chunks") in2.ep_chunks = std::stoll(value);
                      else FAIL() << "unknown fix '" << fix << "' in: " << line;
                      // The fixed rule holds (other rules may still fail, or fail anew: each line fixes its own).
                      EXPECT_EQ(broken_rules(m2, in2) & rule, 0u) << m.str() << ": " << line << " -> " << fix;
                      ++checked;
                    }
                  }
  EXPECT_GT(checked, 10000);
}
