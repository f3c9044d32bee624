// Layout arithmetic of docs/parallel.md: zig-zag data, dim-0 shards, validation messages.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "parallel/layout.h"
#include "reference/check.h"

using namespace trident;
using namespace trident::parallel;

namespace {
MeshShape mesh(int64_t d, int64_t f, int64_t c, int64_t ef, int64_t p) { return {d, f, c, ef, p}; }
}  // namespace

TEST(Layout, ParseMesh) {
  auto m = parse_mesh("d_rep=4,fsdp=1,cp=64,e_fsdp=4,ep=64");
  EXPECT_EQ(m.world(), 256);
  EXPECT_EQ(m.e_fsdp * m.ep, 256);
  EXPECT_THROW(parse_mesh("cp=2,ep=3"), Error);
  EXPECT_THROW(parse_mesh("cp=two"), Error);
  EXPECT_THROW(parse_mesh("tp=2,ep=2"), Error);
  EXPECT_THROW(parse_mesh("cp=0"), Error);
  EXPECT_THROW(parse_mesh("cp=2,cp=2,ep=4"), Error);                       // repeated key
  EXPECT_THROW(parse_mesh("d_rep=1048577,e_fsdp=1048577"), Error);         // one dimension too large
  EXPECT_THROW(parse_mesh("d_rep=65536,fsdp=65536,e_fsdp=65536,ep=65536"), Error);  // world too large
  EXPECT_NO_THROW(parse_mesh("d_rep=1048576,e_fsdp=1048576"));
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

TEST(Layout, ValidateNamesTheRule) {
  auto msg = [](auto fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NO_THROW(validate_layout(mesh(1, 1, 4, 2, 2), 8, 2, 64, 8, 2));
  EXPECT_NE(msg([] { validate_layout(mesh(1, 1, 2, 1, 3), 8, 2, 64, 8, 1); }).find("e_fsdp*ep"), std::string::npos);
  EXPECT_NE(msg([] { validate_layout(mesh(1, 1, 3, 1, 3), 8, 2, 96, 8, 1); }).find("experts % ep"), std::string::npos);
  EXPECT_NE(msg([] { validate_layout(mesh(3, 1, 1, 1, 3), 9, 2, 64, 8, 1); }).find("sequences % (d_rep*fsdp)"),
            std::string::npos);
  EXPECT_NE(msg([] { validate_layout(mesh(1, 1, 3, 1, 3), 9, 1, 64, 8, 1); }).find("seq_len % (2*cp)"),
            std::string::npos);
  EXPECT_NE(msg([] { validate_layout(mesh(1, 1, 4, 1, 4), 8, 1, 32, 8, 1); }).find("straddle"), std::string::npos);
  EXPECT_NE(msg([] { validate_layout(mesh(1, 1, 2, 1, 2), 8, 1, 32, 8, 3); }).find("EP chunks"), std::string::npos);
}
