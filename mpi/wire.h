// What travels between the MPI backend's processes (mpi/fabric.h), and the checks every arriving message passes
// before a byte of it is used (docs/security.md section 3). A peer is another process of the same job, but a bug,
// a version mismatch or memory corruption there must give an error naming that process, never an out-of-range
// write, a huge allocation or a crash here.
//
// A data message is one or more chunks, each a 40-byte ChunkHeader, then at most chunk_bytes of payload (the
// header's len). One MPI message (a bundle) carries one or more whole chunks, of messages from ranks of the sending
// process to ranks of the receiving one, in the order they were posted; a bundle is at most chunk_bytes + 40 bytes
// unless it holds a single chunk. From one process, the chunks of one (context, source rank, destination rank) come
// in order (MPI's non-overtaking rule, then the order inside a bundle), so a message is reassembled by appending:
// its memory grows only with bytes that arrived, never with a size the peer claims.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <span>
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
  uint32_t sig;
  uint32_t len;  // payload bytes of this chunk (in a bundle; a chunk alone in a buffer is the rest of it)
  uint64_t total, offset;
};
static_assert(sizeof(ChunkHeader) == 40);

// A complete message for a rank of this process: msg.data, or (in_place) `view`, view_size bytes inside the
// buffer that was handed in (a message whole in one chunk of a bundle: not copied).
struct Delivery {
  uint64_t ctx = 0;
  int src = 0, dst = 0;
  Msg msg;
  bool in_place = false;
  const char* view = nullptr;
  size_t view_size = 0;
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
  // One chunk alone in buf (its payload is the rest of buf; the header's len is not consulted).
  std::optional<Delivery> take(int from, const std::vector<char>& buf);
  // One chunk: header h and its n payload bytes. With in_place, a message whole in this chunk comes back as a view
  // of `payload` (Delivery::in_place) instead of a copy.
  std::optional<Delivery> take_chunk(int from, const ChunkHeader& h, const char* payload, size_t n, bool in_place);
  // A bundle (one MPI data message: whole chunks, each header's len giving its payload): fn(Delivery&&) for every
  // message it completes, in order; messages whole in one chunk are views into `data`. A malformed bundle throws
  // trident::Error naming the process (messages before the bad chunk were handed to fn).
  template <class F>
  void take_bundle(int from, const char* data, size_t size, F&& fn) {
    if (size == 0) bad(from, "an empty data message");
    for (size_t at = 0; at < size;) {
      if (size - at < sizeof(ChunkHeader))
        bad(from, fmt_tail(size - at));
      ChunkHeader h;
      std::memcpy(&h, data + at, sizeof h);
      at += sizeof h;
      if (h.len > size - at) bad(from, fmt_past_end(h.len, size - at));
      if (std::optional<Delivery> d = take_chunk(from, h, data + at, h.len, true)) fn(std::move(*d));
      at += h.len;
    }
  }
  size_t partial_messages() const { return partial_.size(); }

 private:
  [[noreturn]] void bad(int from, const std::string& why) const;
  static std::string fmt_tail(size_t n);
  static std::string fmt_past_end(uint64_t len, size_t left);
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
std::string notice_text(std::span<const char> buf);

}  // namespace trident::mpi
