// The MPI backend's messages are checked before use (mpi/wire.h, docs/security.md section 3): well-formed chunked
// messages reassemble; each kind of malformed chunk is an error naming the sending process; random bytes never
// crash, overflow or allocate what the peer claims (run under ASan + UBSan too).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mpi/wire.h"
#include "reference/check.h"

using namespace trident;
using namespace trident::mpi;

namespace {

// Layout: 4 processes x 2 ranks; this is process 1 (ranks 2, 3); chunks of at most 16 bytes.
WireLayout layout() { return WireLayout{4, 2, 1, 16, 1 << 20}; }

std::vector<char> chunk(uint64_t ctx, int src, int dst, uint32_t sig, uint64_t total, uint64_t offset,
                        const std::string& payload) {
  ChunkHeader h{ctx, src, dst, sig, 0, total, offset};
  std::vector<char> b(sizeof h + payload.size());
  std::memcpy(b.data(), &h, sizeof h);
  std::memcpy(b.data() + sizeof h, payload.data(), payload.size());
  return b;
}

std::string error_of(Reassembler& r, int from, const std::vector<char>& b) {
  try {
    r.take(from, b);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Wire, ChunkedMessagesReassemble) {
  Reassembler r(layout());
  const std::string msg = "0123456789abcdefghijklmnopqrstuvwxyz";  // 36 bytes: chunks of 16, 16, 4
  EXPECT_FALSE(r.take(0, chunk(7, 1, 2, 9, 36, 0, msg.substr(0, 16))));
  // another message interleaved (another destination) does not disturb the first
  auto one = r.take(0, chunk(7, 1, 3, 5, 3, 0, "abc"));
  ASSERT_TRUE(one);
  EXPECT_EQ(std::string(one->msg.data.begin(), one->msg.data.end()), "abc");
  EXPECT_FALSE(r.take(0, chunk(7, 1, 2, 9, 36, 16, msg.substr(16, 16))));
  auto d = r.take(0, chunk(7, 1, 2, 9, 36, 32, msg.substr(32)));
  ASSERT_TRUE(d);
  EXPECT_EQ(d->src, 1);
  EXPECT_EQ(d->dst, 2);
  EXPECT_EQ(d->msg.sig, 9u);
  EXPECT_EQ(std::string(d->msg.data.begin(), d->msg.data.end()), msg);
  auto empty = r.take(3, chunk(1, 6, 2, 1, 0, 0, ""));
  ASSERT_TRUE(empty);
  EXPECT_TRUE(empty->msg.data.empty());
  EXPECT_EQ(r.partial_messages(), 0u);
}

TEST(Wire, MalformedChunksNameTheProcess) {
  struct Case {
    const char* what;
    int from;
    std::vector<char> buf;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"short", 0, std::vector<char>(39), "shorter than its 40-byte header"},
      {"foreign source", 0, chunk(1, 5, 2, 1, 3, 0, "abc"), "source rank 5 is not one of that process's ranks"},
      {"negative source", 0, chunk(1, -1, 2, 1, 3, 0, "abc"), "source rank -1"},
      {"other destination", 0, chunk(1, 1, 4, 1, 3, 0, "abc"), "destination rank 4 is not one of this process's"},
      {"huge destination", 0, chunk(1, 1, 2147483647, 1, 3, 0, "abc"), "destination rank 2147483647"},
      {"oversized chunk", 0, chunk(1, 1, 2, 1, 20, 0, std::string(17, 'x')), "above the chunk size 16"},
      {"huge total", 0, chunk(1, 1, 2, 1, ~uint64_t{0}, 0, "abc"), "above the limit"},
      {"past the end", 0, chunk(1, 1, 2, 1, 4, 3, "abc"), "bytes 3..6 of a 4-byte message"},
      {"offset overflow", 0, chunk(1, 1, 2, 1, 100, ~uint64_t{0} - 1, "abc"), "of a 100-byte message"},
      {"never began", 0, chunk(1, 1, 2, 1, 40, 16, "abc"), "that never began"},
  };
  for (const Case& c : cases) {
    Reassembler r(layout());
    const std::string e = error_of(r, c.from, c.buf);
    EXPECT_NE(e.find("process 0 (ranks 0..1) sent a malformed data message"), std::string::npos) << c.what << ": " << e;
    EXPECT_NE(e.find(c.expect), std::string::npos) << c.what << ": " << e;
  }
  // Within a message: a gap, a changed size or signature, a restart.
  Reassembler r(layout());
  ASSERT_FALSE(r.take(2, chunk(1, 4, 3, 1, 40, 0, std::string(16, 'a'))));
  EXPECT_NE(error_of(r, 2, chunk(1, 4, 3, 1, 40, 20, "x")).find("at offset 20 where 16 bytes had arrived"),
            std::string::npos);
  EXPECT_NE(error_of(r, 2, chunk(1, 4, 3, 1, 41, 16, "x")).find("differs from its message's"), std::string::npos);
  EXPECT_NE(error_of(r, 2, chunk(1, 4, 3, 2, 40, 16, "x")).find("differs from its message's"), std::string::npos);
  EXPECT_NE(error_of(r, 2, chunk(1, 4, 3, 1, 40, 0, "x")).find("before the last one ended"), std::string::npos);
}

TEST(Wire, RandomMessagesNeverCrash) {
  // 20,000 random chunks from random processes: half pure noise, half a valid header with one field mutated.
  std::mt19937_64 rng(20261202);
  Reassembler r(layout());
  int delivered = 0, refused = 0;
  for (int i = 0; i < 20000; ++i) {
    const int from = static_cast<int>(rng() % 4);
    std::vector<char> b;
    if (rng() % 2) {
      b.resize(rng() % 80);
      for (char& c : b) c = static_cast<char>(rng());
    } else {
      const int src = from * 2 + static_cast<int>(rng() % 2);
      const uint64_t total = rng() % 40;
      const uint64_t off = (rng() % 3 == 0) ? (total ? rng() % total : 0) : 0;
      std::string payload(std::min<uint64_t>(total - off, rng() % 20), 'p');
      b = chunk(rng() % 3, src, 2 + static_cast<int>(rng() % 2), static_cast<uint32_t>(rng() % 3), total, off,
                payload);
      const size_t at = rng() % b.size();
      if (rng() % 2) b[at] = static_cast<char>(rng());
    }
    try {
      if (r.take(from, b)) ++delivered;
    } catch (const Error& e) {
      ++refused;
      EXPECT_NE(std::string(e.what()).find("sent a malformed data message"), std::string::npos) << e.what();
      r = Reassembler(layout());  // a malformed message ends the run; start a fresh one
    }
  }
  EXPECT_GT(delivered, 100);
  EXPECT_GT(refused, 1000);
  std::printf("repro: test_wire --gtest_filter=Wire.RandomMessagesNeverCrash (seed 20261202): %d delivered, %d "
              "refused\n",
              delivered, refused);
}

TEST(Wire, NoticesAreBoundedAndPrintable) {
  std::vector<char> b = {'o', 'k', '\n', '\x1b', '[', '2', 'J', '\0'};
  EXPECT_EQ(notice_text(b), "ok\n?[2J?");
  EXPECT_EQ(notice_text(std::vector<char>(100000, 'a')).size(), 4096 + std::string("... (100000 bytes in all)").size());
}
