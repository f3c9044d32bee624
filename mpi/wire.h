// What travels between the MPI backend's processes (mpi/fabric.h), and the checks every arriving message passes
// before a byte of it is used (docs/security.md section 3). A peer is another process of the same job, but a bug,
// a version mismatch or memory corruption there must give an error naming that process, never an out-of-range
// write, a huge allocation or a crash here.
//
// A data message is one or more chunks, each one MPI message: a 40-byte ChunkHeader, then at most chunk_bytes of
// payload. From one process, the chunks of one (context, source rank, destination rank) come in order (MPI's
// non-overtaking rule), so a message is reassembled by appending: its memory grows only with bytes that arrived,
// never with a size the peer claims.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace trident::mpi {

// What a receive gets: the sender's signature (op, dtype, phase; checked by the receiver) and the bytes.
struct Msg {
  uint32_t sig = 0;
  std::vector<char> data;
};

struct ChunkHeader {
  uint64_t ctx;
  int32_t src, dst;
  uint32_t sig, pad;
  uint64_t total, offset;
};
static_assert(sizeof(ChunkHeader) == 40);

// A complete message for a rank of this process.
struct Delivery {
  uint64_t ctx = 0;
  int src = 0, dst = 0;
  Msg msg;
};

// The layout the checks hold messages to: process p hosts ranks [p*k, p*k + k).
struct WireLayout {
  int processes = 1;
  int ranks_per_process = 1;
  int me = 0;                           // this process
  size_t chunk_bytes = 0;               // the largest payload of one chunk
  uint64_t max_message_bytes = 1ull << 40;  // larger totals are refused (no collective of Trident's comes near)
};

// Reassembles data chunks from every process, checking each against the layout. take() returns the completed
// message (or nothing yet); a malformed chunk throws trident::Error naming the process that sent it.
class Reassembler {
 public:
  explicit Reassembler(const WireLayout& w);
  std::optional<Delivery> take(int from, const std::vector<char>& buf);
  size_t partial_messages() const { return partial_.size(); }

 private:
  struct Partial {
    uint32_t sig = 0;
    uint64_t total = 0;
    std::vector<char> data;
  };
  WireLayout w_;
  std::map<std::tuple<int, uint64_t, int, int>, Partial> partial_;  // (from, ctx, src, dst)
};

// The text of another process's failure notice, as printed: at most 4,096 bytes, control characters (other than
// newline and tab) shown as '?', so a corrupt notice cannot flood or garble the terminal.
std::string notice_text(const std::vector<char>& buf);

}  // namespace trident::mpi
