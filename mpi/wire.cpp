#include "mpi/wire.h"

#include <cstring>

#include <fmt/format.h>

#include "reference/check.h"

namespace trident::mpi {

Reassembler::Reassembler(const WireLayout& w) : w_(w) {
  TD_CHECK(w_.processes >= 1 && w_.ranks_per_process >= 1 && w_.me >= 0 && w_.me < w_.processes,
           "mpi: wire layout of {} processes x {} ranks, this process {}", w_.processes, w_.ranks_per_process, w_.me);
  TD_CHECK(w_.chunk_bytes >= 1, "mpi: chunk size must be >= 1 byte");
}

void Reassembler::bad(int from, const std::string& why) const {
  const int k = w_.ranks_per_process;
  fail(fmt::format("mpi: process {} (ranks {}..{}) sent a malformed data message: {}", from, from * k, from * k + k - 1,
                   why));
}

std::string Reassembler::fmt_tail(size_t n) {
  return fmt::format("{} trailing bytes, shorter than a {}-byte chunk header", n, sizeof(ChunkHeader));
}

std::string Reassembler::fmt_past_end(uint64_t len, size_t left) {
  return fmt::format("a chunk of {} bytes where {} bytes of the message are left", len, left);
}

std::optional<Delivery> Reassembler::take(int from, const std::vector<char>& buf) {
  TD_CHECK(from >= 0 && from < w_.processes, "mpi: a message from process {} of {}", from, w_.processes);
  if (buf.size() < sizeof(ChunkHeader))
    bad(from, fmt::format("{} bytes, shorter than its {}-byte header", buf.size(), sizeof(ChunkHeader)));
  ChunkHeader h;
  std::memcpy(&h, buf.data(), sizeof h);
  return take_chunk(from, h, buf.data() + sizeof h, buf.size() - sizeof h, false);
}

std::optional<Delivery> Reassembler::take_chunk(int from, const ChunkHeader& h, const char* payload, size_t n,
                                                bool in_place) {
  const int k = w_.ranks_per_process;
  TD_CHECK(from >= 0 && from < w_.processes, "mpi: a message from process {} of {}", from, w_.processes);
  if (h.src < from * k || h.src >= from * k + k)
    bad(from, fmt::format("source rank {} is not one of that process's ranks", h.src));
  if (h.dst < w_.me * k || h.dst >= w_.me * k + k)
    bad(from, fmt::format("destination rank {} is not one of this process's ranks {}..{}", h.dst, w_.me * k,
                          w_.me * k + k - 1));
  if (n > w_.chunk_bytes) bad(from, fmt::format("a chunk of {} bytes, above the chunk size {}", n, w_.chunk_bytes));
  if (h.total > w_.max_message_bytes)
    bad(from, fmt::format("a message of {} bytes, above the limit of {}", h.total, w_.max_message_bytes));
  if (h.offset > h.total || n > h.total - h.offset)
    bad(from, fmt::format("bytes {}..{} of a {}-byte message", h.offset, h.offset + n, h.total));
  const auto key = std::make_tuple(from, h.ctx, int{h.src}, int{h.dst});
  auto it = partial_.empty() ? partial_.end() : partial_.find(key);
  if (h.offset == 0) {
    if (it != partial_.end())
      bad(from, fmt::format("a new message from rank {} to rank {} before the last one ended ({} of {} bytes)", h.src,
                            h.dst, it->second.data.size(), it->second.total));
    if (n == h.total) {  // the whole message in one chunk
      Delivery d{h.ctx, h.src, h.dst, Msg{h.sig, {}}};
      if (in_place) {
        d.in_place = true;
        d.view = payload;
        d.view_size = n;
      } else {
        d.msg.data.assign(payload, payload + n);
      }
      return d;
    }
    if (n == 0) bad(from, "an empty first chunk of a non-empty message");
    Partial p;
    p.sig = h.sig;
    p.total = h.total;
    p.data.reserve(static_cast<size_t>(std::min<uint64_t>(h.total, 64ull << 20)));  // grows with what arrives
    it = partial_.emplace(key, std::move(p)).first;
  } else {
    if (it == partial_.end())
      bad(from, fmt::format("bytes from offset {} of a message from rank {} to rank {} that never began", h.offset,
                            h.src, h.dst));
    Partial& p = it->second;
    if (h.sig != p.sig || h.total != p.total)
      bad(from, fmt::format("a chunk whose signature or size ({} bytes) differs from its message's ({} bytes)",
                            h.total, p.total));
    if (h.offset != p.data.size())
      bad(from, fmt::format("a chunk at offset {} where {} bytes had arrived", h.offset, p.data.size()));
    if (n == 0) bad(from, "an empty chunk inside a message");
  }
  Partial& p = it->second;
  p.data.insert(p.data.end(), payload, payload + n);
  if (p.data.size() < p.total) return std::nullopt;
  Delivery d{h.ctx, h.src, h.dst, Msg{p.sig, std::move(p.data)}};
  partial_.erase(it);
  return d;
}

std::string notice_text(std::span<const char> buf) {
  constexpr size_t kMax = 4096;
  std::string s;
  for (size_t i = 0; i < buf.size() && i < kMax; ++i) {
    const unsigned char c = static_cast<unsigned char>(buf[i]);
    s += (c >= 0x20 && c != 0x7f) || c == '\n' || c == '\t' ? static_cast<char>(c) : '?';
  }
  if (buf.size() > kMax) s += fmt::format("... ({} bytes in all)", buf.size());
  return s;
}

}  // namespace trident::mpi
