// Bundles (mpi/wire.h): one MPI message carrying whole chunks of several messages. Messages whole in one chunk come
// back as views into the bundle, in order; a message chunked over several bundles reassembles; each kind of
// malformed bundle is an error naming the sending process; random bytes never crash. No MPI needed.
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

// 4 processes x 2 ranks; this is process 1 (ranks 2, 3); chunks of at most 16 bytes.
WireLayout layout() { return WireLayout{4, 2, 1, 16, 1 << 20}; }

void add(std::vector<char>& b, uint64_t ctx, int src, int dst, uint32_t sig, uint64_t total, uint64_t offset,
         const std::string& payload, uint32_t len_override = ~0u) {
  const uint32_t len = len_override != ~0u ? len_override : static_cast<uint32_t>(payload.size());
  ChunkHeader h{ctx, src, dst, sig, len, total, offset};
  const char* p = reinterpret_cast<const char*>(&h);
  b.insert(b.end(), p, p + sizeof h);
  b.insert(b.end(), payload.begin(), payload.end());
}

struct Got {
  int src, dst;
  uint32_t sig;
  std::string bytes;
  bool in_place;
};

std::vector<Got> take(Reassembler& r, int from, const std::vector<char>& b) {
  std::vector<Got> out;
  r.take_bundle(from, b.data(), b.size(), [&](Delivery&& d) {
    const char* p = d.in_place ? d.view : d.msg.data.data();
    const size_t n = d.in_place ? d.view_size : d.msg.data.size();
    if (d.in_place) {
      EXPECT_TRUE(d.view >= b.data() && d.view + n <= b.data() + b.size());
    }
    out.push_back(Got{d.src, d.dst, d.msg.sig, std::string(p, n), d.in_place});
  });
  return out;
}

std::string error_of(Reassembler& r, int from, const std::vector<char>& b) {
  try {
    take(r, from, b);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Bundle, SeveralMessagesInOrderAsViews) {
  Reassembler r(layout());
  std::vector<char> b;
  add(b, 7, 0, 2, 1, 3, 0, "abc");
  add(b, 7, 1, 3, 2, 0, 0, "");  // an empty message
  add(b, 9, 0, 2, 3, 5, 0, "hello");
  const std::vector<Got> got = take(r, 0, b);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].bytes, "abc");
  EXPECT_EQ(got[0].src, 0);
  EXPECT_EQ(got[0].dst, 2);
  EXPECT_EQ(got[0].sig, 1u);
  EXPECT_EQ(got[1].bytes, "");
  EXPECT_EQ(got[1].dst, 3);
  EXPECT_EQ(got[2].bytes, "hello");
  EXPECT_EQ(got[2].sig, 3u);
  for (const Got& g : got) EXPECT_TRUE(g.in_place);
}

TEST(Bundle, ChunkedMessageAcrossBundlesReassembles) {
  Reassembler r(layout());
  const std::string msg = "0123456789abcdefghijklmnopqrstuvwxyz";  // 36 bytes: chunks of 16, 16, 4
  std::vector<char> b1, b2;
  add(b1, 7, 1, 2, 9, 36, 0, msg.substr(0, 16));
  add(b1, 7, 1, 3, 5, 2, 0, "xy");  // another destination in between
  add(b1, 7, 1, 2, 9, 36, 16, msg.substr(16, 16));
  add(b2, 7, 1, 2, 9, 36, 32, msg.substr(32));
  std::vector<Got> got = take(r, 0, b1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].bytes, "xy");
  EXPECT_EQ(r.partial_messages(), 1u);
  got = take(r, 0, b2);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].bytes, msg);
  EXPECT_FALSE(got[0].in_place);  // assembled: a copy
  EXPECT_EQ(r.partial_messages(), 0u);
}

TEST(Bundle, MalformedBundlesNameTheProcess) {
  {
    Reassembler r(layout());
    EXPECT_NE(error_of(r, 2, {}).find("process 2 (ranks 4..5) sent a malformed data message: an empty data message"),
              std::string::npos);
  }
  {
    Reassembler r(layout());
    std::vector<char> b;
    add(b, 7, 4, 2, 1, 3, 0, "abc");
    b.insert(b.end(), 10, '\0');  // trailing bytes shorter than a header
    EXPECT_NE(error_of(r, 2, b).find("10 trailing bytes"), std::string::npos);
  }
  {
    Reassembler r(layout());
    std::vector<char> b;
    add(b, 7, 4, 2, 1, 3, 0, "abc", 30);  // a chunk claiming more bytes than the bundle holds
    EXPECT_NE(error_of(r, 2, b).find("a chunk of 30 bytes where 3 bytes of the message are left"), std::string::npos);
  }
  {
    Reassembler r(layout());
    std::vector<char> b;
    add(b, 7, 0, 2, 1, 3, 0, "abc");  // source rank 0 is process 0's, not process 2's
    EXPECT_NE(error_of(r, 2, b).find("source rank 0 is not one of that process's ranks"), std::string::npos);
  }
  {
    Reassembler r(layout());
    std::vector<char> b;
    add(b, 7, 4, 2, 1, 40, 0, std::string(20, 'a'));  // above the 16-byte chunk size
    EXPECT_NE(error_of(r, 2, b).find("above the chunk size 16"), std::string::npos);
  }
}

TEST(Bundle, RandomBytesNeverCrash) {
  std::mt19937_64 rng(33);
  int errors = 0;
  for (int i = 0; i < 2000; ++i) {
    Reassembler r(layout());
    std::vector<char> b;
    add(b, rng(), 2 + static_cast<int>(rng() % 2), 2 + static_cast<int>(rng() % 2), 1, rng() % 20, rng() % 20,
        std::string(rng() % 20, 'z'));
    const size_t flips = 1 + rng() % 4;
    for (size_t f = 0; f < flips; ++f) b[rng() % b.size()] = static_cast<char>(rng());
    b.resize(b.size() - rng() % 8);
    errors += !error_of(r, 1, b).empty();
  }
  EXPECT_GT(errors, 0);  // random damage is caught (and never crashes, overflows or allocates what it claims)
}
