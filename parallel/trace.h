// What ran on each stream of one rank, in order: the raw material of a timeline (overlap of compute and
// communication) and of collective accounting. Backend-agnostic: the emulator records it for every call; a GPU
// backend may record the same (plus timings).
//
// Storage (TraceLog): a trace of the seeds' scale holds about 80,000 entries per rank per step on thousands of
// ranks, so entries are stored compactly and handed out by value: names, communicator names and call sites are
// interned per stream; an entry takes 40 bytes, plus 72 for the fields of communication and events that do not fit
// (docs/emulator.md section 9.4). A stored entry reads back equal to the one pushed, field for field.
#pragma once
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "parallel/comm.h"

namespace trident {

struct TraceEntry {
  // alloc / free: a device allocation or free of `bytes` bytes, stream-ordered on this stream (Device::allocate /
  // free); what the device's current and peak memory are made of, so a replay can follow memory over time.
  enum class Kind : uint8_t { compute, collective, send, recv, record, wait, alloc, free };
  Kind kind = Kind::compute;
  // Views: into the pusher's storage until TraceLog::push_back (which copies the text), into the log's interned
  // text when read back from a TraceLog (valid while that log lives).
  std::string_view name;    // compute: the launch name; communication: the op name; record/wait: "record"/"wait";
                            // alloc/free: "alloc"/"free"
  // communication
  std::string_view comm;    // communicator name ("world", "fsdp*cp", ...)
  int64_t comm_id = -1;     // backend id of the communicator (unique within a run)
  uint64_t seq = 0;         // collective: sequence number on the communicator; send/recv: per (sender, receiver);
                            // all_to_all(v) (recorded as one collective entry): count of such calls
  CollOp op = CollOp::all_gather;
  DataType dtype = DataType::f32;
  ReduceOp redop = ReduceOp::sum;
  uint64_t count = 0;       // NCCL count argument
  int peer = -1;            // broadcast/reduce: root; send/recv: peer (communicator rank)
  uint64_t recv_hash = 0;   // communication: hash of the bytes this rank received (FNV-1a 64 unless the device
                            // chose XXH64, emulator/trace_hash.h; 0: none received or not
                            // recorded, e.g. the all_to_all helpers); a failing backend's first differing collective
  // sizes
  int64_t bytes = 0;        // communication: OpStats bytes; compute: the launch's bytes; alloc/free: the size
  int64_t recv_bytes = -1;  // all_to_all(v): the bytes this rank received (-1: not recorded, or another op)
  double flops = 0;
  // events (record: the event recorded; wait: the event and where its last record() sits)
  int event = -1;
  int event_stream = -1;
  int64_t event_index = -1;  // index of the record entry in event_stream's list
  int64_t issue = -1;       // the rank's issue order across all its streams (0, 1, ...): cross-stream "before"
  // call site
  const char* file = "";
  unsigned line = 0;
};

// One stream's entries in issue order, stored compactly (see the top of this file). Reads return entries by value;
// set() replaces one. Appending is amortized O(1) without reallocation (fixed-size blocks), so a log never holds
// twice its size while it grows.
class TraceLog {
 public:
  TraceLog() = default;
  TraceLog(std::initializer_list<TraceEntry> v);
  TraceLog(const TraceLog& o);
  TraceLog(TraceLog&&) noexcept = default;
  TraceLog& operator=(const TraceLog& o);
  TraceLog& operator=(TraceLog&&) noexcept = default;
  TraceLog& operator=(std::initializer_list<TraceEntry> v);

  void push_back(const TraceEntry& e);
  void pop_back();
  void clear();
  void set(size_t i, const TraceEntry& e);  // replaces entry i (i < size())
  TraceEntry operator[](size_t i) const;
  TraceEntry back() const { return (*this)[size_ - 1]; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // Bytes held by the entries and the interned text (what a trace of this log costs in memory).
  int64_t memory_bytes() const;

  class iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = TraceEntry;
    using difference_type = std::ptrdiff_t;
    using pointer = void;
    using reference = TraceEntry;
    iterator(const TraceLog* l, size_t i) : l_(l), i_(i) {}
    TraceEntry operator*() const { return (*l_)[i_]; }
    iterator& operator++() { ++i_; return *this; }
    bool operator==(const iterator& o) const { return i_ == o.i_; }
   private:
    const TraceLog* l_;
    size_t i_;
  };
  iterator begin() const { return {this, 0}; }
  iterator end() const { return {this, size_}; }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  static constexpr uint8_t kEventBit = 0x80;  // in Packed::kind
  static constexpr int kBlockBits = 10;  // 1,024 entries per block
  static constexpr size_t kBlock = size_t{1} << kBlockBits;
  // 40 bytes: every entry. `u` holds flops (compute) or event and event_stream, whichever the entry uses; an entry
  // that needs more has a Wide record.
  struct Packed {
    uint8_t kind, op, dtype, redop;
    uint32_t name;  // interned text
    uint32_t site;  // interned (file, line)
    uint32_t wide;  // index of the Wide record, kNone: none
    int64_t bytes;
    int64_t issue;
    union {
      double flops;
      struct {
        int32_t event, event_stream;
      } ev;
    } u;
  };
  // 72 bytes: the fields of communication and events, and whatever does not fit in Packed::u.
  struct Wide {
    uint32_t comm;  // interned text
    int32_t peer;
    int64_t comm_id;
    uint64_t seq, count, recv_hash;
    int64_t recv_bytes, event_index;
    double flops;
    int32_t event, event_stream;
  };
  template <class T>
  struct Blocks {  // fixed-size blocks, no doubling; the first grows to its size by doubling (short streams)
    std::vector<std::unique_ptr<T[]>> b;
    size_t cap0 = 0;  // capacity of b[0]
    T& at(size_t i) { return b[i >> kBlockBits][i & (kBlock - 1)]; }
    const T& at(size_t i) const { return b[i >> kBlockBits][i & (kBlock - 1)]; }
    void ensure(size_t n) {
      if (n <= cap0 || n == 0) return;
      if (cap0 < kBlock) {
        size_t c = cap0 ? cap0 : 16;
        while (c < n && c < kBlock) c *= 2;
        auto nb = std::make_unique<T[]>(c);
        for (size_t i = 0; i < cap0; ++i) nb[i] = b[0][i];
        if (b.empty()) b.push_back(std::move(nb));
        else b[0] = std::move(nb);
        cap0 = c;
      }
      while (b.size() * kBlock < n) b.push_back(std::make_unique<T[]>(kBlock));
    }
    size_t capacity() const { return b.empty() ? 0 : cap0 + (b.size() - 1) * kBlock; }
  };
  uint32_t intern(std::string_view s);
  uint32_t site(const char* file, unsigned line);
  Packed pack(const TraceEntry& e, uint32_t wide_index);
  static bool needs_wide(const TraceEntry& e);
  Wide widen(const TraceEntry& e);

  Blocks<Packed> packed_;
  Blocks<Wide> wide_;
  size_t size_ = 0, n_wide_ = 0;
  std::deque<std::string> text_;                       // interned text, by id (stable addresses)
  std::unordered_map<std::string_view, uint32_t> text_id_;  // views into text_
  struct SiteHash {
    size_t operator()(const std::pair<const char*, unsigned>& k) const {
      return std::hash<const void*>()(k.first) * 31 + k.second;
    }
  };
  std::vector<std::pair<const char*, unsigned>> sites_;  // by id
  std::unordered_map<std::pair<const char*, unsigned>, uint32_t, SiteHash> site_id_;
};

struct StreamTrace {
  std::string name;  // "compute", "comm", or create_stream()'s name
  TraceLog entries;  // in issue order
};

using RankTrace = std::vector<StreamTrace>;  // indexed by Stream::id

}  // namespace trident
