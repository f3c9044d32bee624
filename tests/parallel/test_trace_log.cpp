// TraceLog (parallel/trace.h): the compact storage of a stream's trace reads back every entry equal to the one
// pushed, field for field, for any values (communication, events, FLOPs beside an event, -0.0, long names); set,
// pop_back and copies keep that; and the common entries cost what the header says (40 bytes, names interned).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "parallel/trace.h"
#include "reference/check.h"

using namespace trident;

namespace {

// Field-for-field equality, floats by their bits.
void expect_same(const TraceEntry& a, const TraceEntry& b, size_t i) {
  SCOPED_TRACE(::testing::Message() << "entry " << i);
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.comm, b.comm);
  EXPECT_EQ(a.comm_id, b.comm_id);
  EXPECT_EQ(a.seq, b.seq);
  EXPECT_EQ(a.op, b.op);
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(a.redop, b.redop);
  EXPECT_EQ(a.count, b.count);
  EXPECT_EQ(a.peer, b.peer);
  EXPECT_EQ(a.recv_hash, b.recv_hash);
  EXPECT_EQ(a.bytes, b.bytes);
  EXPECT_EQ(a.recv_bytes, b.recv_bytes);
  uint64_t x = 0, y = 0;
  std::memcpy(&x, &a.flops, 8);
  std::memcpy(&y, &b.flops, 8);
  EXPECT_EQ(x, y) << a.flops << " vs " << b.flops;
  EXPECT_EQ(a.event, b.event);
  EXPECT_EQ(a.event_stream, b.event_stream);
  EXPECT_EQ(a.event_index, b.event_index);
  EXPECT_EQ(a.issue, b.issue);
  EXPECT_EQ(a.file, b.file);
  EXPECT_EQ(a.line, b.line);
}

const char* const kFiles[] = {"a.cpp", "parallel/step_layers.cpp", "emulator/world.cpp"};

// Random entries: each field is left at its default half of the time (the compact cases) or drawn.
std::vector<TraceEntry> draw(std::mt19937_64& g, size_t n, std::vector<std::string>& text) {
  text.clear();
  for (int k = 0; k < 40; ++k)
    text.push_back(k % 3 == 0 ? std::string(40 + k, static_cast<char>('a' + k % 26)) : "k" + std::to_string(k));
  std::vector<TraceEntry> v(n);
  auto maybe = [&](auto& field, auto value) {
    if (g() & 1) field = value;
  };
  for (TraceEntry& e : v) {
    e.kind = static_cast<TraceEntry::Kind>(g() % 8);
    e.name = text[g() % text.size()];
    maybe(e.comm, std::string_view(text[g() % text.size()]));
    maybe(e.comm_id, static_cast<int64_t>(g() % 1000));
    maybe(e.seq, g());
    e.op = static_cast<CollOp>(g() % kNumCollOps);
    e.dtype = kAllDataTypes[g() % kAllDataTypes.size()];
    e.redop = static_cast<ReduceOp>(g() % 4);
    maybe(e.count, g());
    maybe(e.peer, static_cast<int>(g() % 64));
    maybe(e.recv_hash, g());
    e.bytes = static_cast<int64_t>(g() >> 1);
    maybe(e.recv_bytes, static_cast<int64_t>(g() >> 1));
    const uint64_t f = g() % 4;
    e.flops = f == 0 ? 0.0 : f == 1 ? -0.0 : f == 2 ? 1e15 * static_cast<double>(g() % 1000) : std::nan("");
    maybe(e.event, static_cast<int>(g() % 100));
    maybe(e.event_stream, static_cast<int>(g() % 4));
    maybe(e.event_index, static_cast<int64_t>(g() % 100000));
    e.issue = static_cast<int64_t>(g() % 1000000);
    e.file = kFiles[g() % 3];
    e.line = static_cast<unsigned>(g() % 2000);
  }
  return v;
}

TEST(TraceLog, ReadsBackEveryFieldOfEveryEntry) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE(::testing::Message() << "repro: seed " << seed);
    std::mt19937_64 g(seed);
    std::vector<std::string> text;
    const std::vector<TraceEntry> v = draw(g, 5000, text);  // several 1,024-entry blocks
    TraceLog log;
    for (const TraceEntry& e : v) log.push_back(e);
    text.assign(text.size(), std::string(64, '#'));  // the log keeps its own copy of the names
    ASSERT_EQ(log.size(), v.size());
    std::vector<std::string> text2;
    std::mt19937_64 g2(seed);
    const std::vector<TraceEntry> w = draw(g2, 5000, text2);  // the same draw, with live names
    for (size_t i = 0; i < w.size(); ++i) expect_same(log[i], w[i], i);
    size_t i = 0;
    for (const TraceEntry& e : log) expect_same(e, w[i], i), ++i;
    EXPECT_EQ(i, w.size());

    TraceLog copy = log;  // copies intern their own text
    log.clear();
    EXPECT_TRUE(log.empty());
    for (size_t k = 0; k < w.size(); ++k) expect_same(copy[k], w[k], k);

    // set() in either direction (compact <-> wide), then pop_back down to the first entries.
    for (size_t k = 0; k + 1 < w.size(); k += 7) copy.set(k, w[k + 1]);
    for (size_t k = 0; k + 1 < w.size(); k += 7) expect_same(copy[k], w[k + 1], k);
    for (size_t k = 0; k < 3000; ++k) copy.pop_back();
    ASSERT_EQ(copy.size(), w.size() - 3000);
    copy.push_back(w[17]);
    expect_same(copy.back(), w[17], copy.size() - 1);
    for (size_t k = 1; k + 1 < copy.size(); ++k)
      if (k % 7 != 0) expect_same(copy[k], w[k], k);
  }
}

TEST(TraceLog, CommonEntriesTakeFortyBytes) {
  // A step's trace is mostly kernels and allocations: 40 bytes each, the names stored once.
  TraceLog log;
  const int64_t n = 100 * 1024;
  for (int64_t i = 0; i < n; ++i) {
    TraceEntry e;
    e.kind = i % 2 ? TraceEntry::Kind::compute : TraceEntry::Kind::alloc;
    e.name = i % 2 ? "expert_backward_dgrad layer with a long name" : "alloc";
    e.bytes = i;
    e.flops = 3.0 * static_cast<double>(i);
    e.issue = i;
    e.file = kFiles[i % 3];
    e.line = 10;
    log.push_back(e);
  }
  EXPECT_LE(log.memory_bytes(), n * 40 + 4096) << "bytes per entry " << double(log.memory_bytes()) / double(n);
  EXPECT_GT(sizeof(TraceEntry), 100u) << "the decoded entry is the wide one";
  // Communication entries pay for their fields once more (72 bytes).
  TraceLog comm;
  TraceEntry c;
  c.kind = TraceEntry::Kind::collective;
  c.name = "all_gather";
  c.comm = "e_fsdp";
  c.comm_id = 3;
  c.seq = 9;
  for (int64_t i = 0; i < 1024; ++i) comm.push_back(c);
  EXPECT_LE(comm.memory_bytes(), 1024 * (40 + 72) + 4096);
}

TEST(TraceLog, ErrorsAreErrors) {
  TraceLog log;
  EXPECT_THROW(log.pop_back(), Error);
  EXPECT_THROW(log.set(0, TraceEntry{}), Error);
}

}  // namespace
