#include "parallel/trace.h"

#include <cmath>

#include "reference/check.h"

namespace trident {

TraceLog::TraceLog(std::initializer_list<TraceEntry> v) {
  for (const TraceEntry& e : v) push_back(e);
}

TraceLog::TraceLog(const TraceLog& o) {
  for (const TraceEntry& e : o) push_back(e);
}

TraceLog& TraceLog::operator=(const TraceLog& o) {
  if (this != &o) {
    TraceLog t(o);
    *this = std::move(t);
  }
  return *this;
}

TraceLog& TraceLog::operator=(std::initializer_list<TraceEntry> v) {
  TraceLog t(v);
  *this = std::move(t);
  return *this;
}

void TraceLog::clear() { *this = TraceLog(); }

uint32_t TraceLog::intern(std::string_view s) {
  const auto it = text_id_.find(s);
  if (it != text_id_.end()) return it->second;
  TD_CHECK(text_.size() < kNone, "trace: more than {} distinct names on one stream", kNone - 1);
  const auto id = static_cast<uint32_t>(text_.size());
  text_.emplace_back(s);
  text_id_.emplace(std::string_view(text_.back()), id);
  return id;
}

uint32_t TraceLog::site(const char* file, unsigned line) {
  const std::pair<const char*, unsigned> k{file, line};
  const auto it = site_id_.find(k);
  if (it != site_id_.end()) return it->second;
  TD_CHECK(sites_.size() < kNone, "trace: more than {} call sites on one stream", kNone - 1);
  const auto id = static_cast<uint32_t>(sites_.size());
  sites_.push_back(k);
  site_id_.emplace(k, id);
  return id;
}

bool TraceLog::needs_wide(const TraceEntry& e) {
  const bool has_event = e.event != -1 || e.event_stream != -1;
  return !e.comm.empty() || e.comm_id != -1 || e.seq != 0 || e.count != 0 || e.peer != -1 || e.recv_hash != 0 ||
         e.recv_bytes != -1 || e.event_index != -1 || (has_event && e.flops != 0) ||
         (has_event && std::signbit(e.flops));  // -0.0 round-trips too
}

TraceLog::Wide TraceLog::widen(const TraceEntry& e) {
  Wide w{};
  w.comm = intern(e.comm);
  w.peer = e.peer;
  w.comm_id = e.comm_id;
  w.seq = e.seq;
  w.count = e.count;
  w.recv_hash = e.recv_hash;
  w.recv_bytes = e.recv_bytes;
  w.event_index = e.event_index;
  w.flops = e.flops;
  w.event = e.event;
  w.event_stream = e.event_stream;
  return w;
}

TraceLog::Packed TraceLog::pack(const TraceEntry& e, uint32_t wide_index) {
  Packed p{};
  p.kind = static_cast<uint8_t>(e.kind);  // 3 bits; kEventBit: u holds the event
  p.op = static_cast<uint8_t>(e.op);
  p.dtype = static_cast<uint8_t>(e.dtype);
  p.redop = static_cast<uint8_t>(e.redop);
  p.name = intern(e.name);
  p.site = site(e.file, e.line);
  p.wide = wide_index;
  p.bytes = e.bytes;
  p.issue = e.issue;
  if (e.event != -1 || e.event_stream != -1) {
    p.kind |= kEventBit;
    p.u.ev.event = e.event;
    p.u.ev.event_stream = e.event_stream;
  } else {
    p.u.flops = e.flops;
  }
  return p;
}

void TraceLog::push_back(const TraceEntry& e) {
  uint32_t w = kNone;
  if (needs_wide(e)) {
    TD_CHECK(n_wide_ < kNone, "trace: more than {} communication entries on one stream", kNone - 1);
    w = static_cast<uint32_t>(n_wide_);
    wide_.ensure(n_wide_ + 1);
    wide_.at(n_wide_++) = widen(e);
  }
  packed_.ensure(size_ + 1);
  packed_.at(size_++) = pack(e, w);
}

void TraceLog::pop_back() {
  TD_CHECK(size_ > 0, "trace: pop_back on an empty stream");
  if (n_wide_ > 0 && packed_.at(size_ - 1).wide == n_wide_ - 1) --n_wide_;
  --size_;
}

void TraceLog::set(size_t i, const TraceEntry& e) {
  TD_CHECK(i < size_, "trace: set({}) on a stream of {} entries", i, size_);
  Packed& p = packed_.at(i);
  uint32_t w = p.wide;
  if (needs_wide(e)) {
    if (w == kNone) {  // appended: the Wide records stay in entry order only for push_back, which is all reads need
      TD_CHECK(n_wide_ < kNone, "trace: more than {} communication entries on one stream", kNone - 1);
      w = static_cast<uint32_t>(n_wide_);
      wide_.ensure(n_wide_ + 1);
      ++n_wide_;
    }
    wide_.at(w) = widen(e);
  } else {
    w = kNone;  // a Wide record left behind is unused (set() is for tests and tools, not the recording path)
  }
  p = pack(e, w);
}

TraceEntry TraceLog::operator[](size_t i) const {
  const Packed& p = packed_.at(i);
  TraceEntry e;
  e.kind = static_cast<TraceEntry::Kind>(p.kind & ~kEventBit);
  e.op = static_cast<CollOp>(p.op);
  e.dtype = static_cast<DataType>(p.dtype);
  e.redop = static_cast<ReduceOp>(p.redop);
  e.name = text_[p.name];
  e.file = sites_[p.site].first;
  e.line = sites_[p.site].second;
  e.bytes = p.bytes;
  e.issue = p.issue;
  if (p.wide != kNone) {
    const Wide& w = wide_.at(p.wide);
    e.comm = text_[w.comm];
    e.peer = w.peer;
    e.comm_id = w.comm_id;
    e.seq = w.seq;
    e.count = w.count;
    e.recv_hash = w.recv_hash;
    e.recv_bytes = w.recv_bytes;
    e.event_index = w.event_index;
    e.flops = w.flops;
    e.event = w.event;
    e.event_stream = w.event_stream;
  } else if (p.kind & kEventBit) {
    e.event = p.u.ev.event;
    e.event_stream = p.u.ev.event_stream;
  } else {
    e.flops = p.u.flops;
  }
  return e;
}

int64_t TraceLog::memory_bytes() const {
  int64_t n = static_cast<int64_t>(packed_.capacity() * sizeof(Packed) + wide_.capacity() * sizeof(Wide));
  for (const std::string& t : text_) n += static_cast<int64_t>(sizeof(std::string) + t.capacity() + 32);
  n += static_cast<int64_t>(sites_.size() * (sizeof(sites_[0]) + 32));
  return n;
}

}  // namespace trident
