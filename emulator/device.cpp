// EmuDevice: eager and deferred execution, memory tracking and the stream-hazard checker (emulator/device.h).
#include "emulator/device.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "reference/check.h"

namespace trident::emu {

namespace {
// Emulated device memory: the global allocator (16-byte aligned, as every element type here needs; the benchmark's
// malloc tuning applies to it as to the step's former host vectors).
// Shapes only: rank r's addresses are [kShapeBase + r kShapeRange, + kShapeRange), 16 TiB each (65,536 ranks fit
// below 2^60); never mapped, so a stray dereference faults instead of reading another rank's data.
constexpr uintptr_t kShapeBase = uintptr_t{1} << 44, kShapeRange = uintptr_t{1} << 44;
const char* base_name(const char* path) {
  const char* s = std::strrchr(path, '/');
  return s ? s + 1 : path;
}
}  // namespace

EmuDevice::EmuDevice(int rank, RankTrace& trace, const DeviceOptions& opt, BlockPool* pool)
    : rank_(rank),
      trace_(trace),
      opt_(opt),
      deferred_(opt.mode == DeviceMode::deferred),
      checking_(opt.check_hazards || opt.mode == DeviceMode::deferred),
      rng_(opt.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(rank)),
      pool_(opt.memory || opt.shapes_only ? nullptr : pool) {
  TD_CHECK(!opt.shapes_only || opt.mode == DeviceMode::eager,
           "rank {}: a shapes-only device runs nothing, so it has no deferred mode (use eager, with --check-hazards to "
           "check the streams)",
           rank);
  next_addr_ = kShapeBase + static_cast<uintptr_t>(rank) * kShapeRange;
  trace_.push_back({"compute", {}});
  trace_.push_back({"comm", {}});
  streams_.resize(2);
  clocks_.assign(3, Clock(3, 0));
}

EmuDevice::~EmuDevice() {
  // Whatever is still queued (frees issued by destructors) runs now, unless a hazard was found (then the queued
  // work may touch released memory: it is dropped). Errors cannot propagate from here.
  if (pending_error_.empty()) {
    try {
      for (size_t s = 0; s < streams_.size(); ++s) run_until(static_cast<int>(s), streams_[s].issued);
    } catch (...) {
    }
  }
  if (opt_.shapes_only) return;  // nothing was allocated
  sizes_.for_each([this](uintptr_t p, int64_t bytes) { raw_release(reinterpret_cast<void*>(p), bytes); });
  for (auto& [p, bytes] : unreleased_) raw_release(p, bytes);
}

void* EmuDevice::raw_allocate(size_t n) {
  if (opt_.memory) return opt_.memory->allocate(n);
  if (pool_) return pool_->allocate(n);
  return ::operator new(n, std::nothrow);
}

void EmuDevice::raw_release(void* p, int64_t bytes) noexcept {
  if (opt_.shapes_only) return;
  if (opt_.memory) opt_.memory->release(p);
  else if (pool_) pool_->release(p, static_cast<size_t>(std::max<int64_t>(bytes, 1)));
  else ::operator delete(p);
}

Stream EmuDevice::create_stream(std::string name) {
  trace_.push_back({std::move(name), {}});
  streams_.emplace_back();
  const int id = static_cast<int>(streams_.size()) - 1;
  clocks_.emplace_back();
  for (Clock& c : clocks_) c.resize(clocks_.size(), 0);
  return Stream{id};
}

Event EmuDevice::create_event() {
  events_.push_back({});
  return Event{static_cast<int>(events_.size()) - 1};
}

void EmuDevice::check_event(Event e, loc_t loc) const {
  TD_CHECK(e.id >= 0 && static_cast<size_t>(e.id) < events_.size(),
           "rank {}: unknown event {} (create it with create_event) at {}:{}", rank_, e.id, loc.file_name(),
           loc.line());
}

void EmuDevice::check_stream(Stream s, loc_t loc) const {
  TD_CHECK(s.id >= 0 && static_cast<size_t>(s.id) < streams_.size(), "rank {}: unknown stream {} at {}:{}", rank_,
           s.id, loc.file_name(), loc.line());
}

EmuDevice::Clock& EmuDevice::clock(int agent) { return clocks_[static_cast<size_t>(agent)]; }
void EmuDevice::merge(Clock& into, const Clock& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (size_t i = 0; i < from.size(); ++i) into[i] = std::max(into[i], from[i]);
}
void EmuDevice::tick(int agent) {
  Clock& c = clock(agent);
  if (c.size() < clocks_.size()) c.resize(clocks_.size(), 0);
  if (agent > 0) merge(c, clock(0));  // work issued after a host action is ordered after it
  ++c[static_cast<size_t>(agent)];
}
std::string EmuDevice::agent_name(int agent) const {
  if (agent == 0) return "the host";
  return fmt::format("stream '{}'", trace_[static_cast<size_t>(agent - 1)].name);
}

void EmuDevice::raise_pending() {
  if (pending_error_.empty()) return;
  std::string m = std::move(pending_error_);
  pending_error_.clear();
  fail(m);
}

// ---- the hazard checker -------------------------------------------------------------------------------------------
void EmuDevice::check(int agent, std::string_view name, std::span<const Access> acc, loc_t loc) {
  const Clock& vc = clock(agent);
  const int64_t epoch = vc[static_cast<size_t>(agent)];
  for (Access a : acc) {
    if (a.bytes == 0 || a.p == nullptr) continue;
    const auto p = reinterpret_cast<uintptr_t>(a.p);
    auto it = allocs_.upper_bound(p);
    if (a.bytes < 0) {  // kToEnd: from p to the end of its allocation (untracked outside device memory)
      if (it == allocs_.begin()) continue;
      const auto& pr = *std::prev(it);
      if (p >= pr.first + static_cast<uintptr_t>(pr.second.bytes)) continue;
      a.bytes = static_cast<int64_t>(pr.first + static_cast<uintptr_t>(pr.second.bytes) - p);
    }
    const auto end_of = [](const auto& al) { return al.first + static_cast<uintptr_t>(al.second.bytes); };
    if (it == allocs_.begin() || p + static_cast<uintptr_t>(a.bytes) > end_of(*std::prev(it))) {
      bool inside = false;
      if (it != allocs_.begin()) {
        auto pr = std::prev(it);
        inside = p < pr->first + static_cast<uintptr_t>(pr->second.bytes);
      }
      if (inside)
        fail(fmt::format("rank {}: '{}' ({}:{}) {} {} bytes past the end of a {}-byte device allocation", rank_, name,
                         base_name(loc.file_name()), loc.line(), a.write ? "writes" : "reads", a.bytes,
                         std::prev(it)->second.bytes));
      if (opt_.strict_memory)
        fail(fmt::format("rank {}: '{}' ({}:{}) {} {} bytes of host memory that no Device::allocate returned", rank_,
                         name, base_name(loc.file_name()), loc.line(), a.write ? "writes" : "reads", a.bytes));
      continue;
    }
    auto al = std::prev(it);
    const int64_t lo = static_cast<int64_t>(p - al->first), hi = lo + a.bytes;
    std::vector<Rec>& recs = al->second.recs;
    for (const Rec& r : recs) {
      if (r.hi <= lo || hi <= r.lo || (!r.write && !a.write) || r.agent == agent) continue;
      if (vc.size() > static_cast<size_t>(r.agent) && vc[static_cast<size_t>(r.agent)] >= r.epoch) continue;
      fail(fmt::format(
          "rank {}: stream hazard: '{}' on {} ({}:{}) {} bytes [{}, {}) of a device buffer that '{}' on {} ({}:{}) "
          "{}, with no event wait or synchronize ordering the two",
          rank_, name, agent_name(agent), base_name(loc.file_name()), loc.line(), a.write ? "writes" : "reads",
          std::max(lo, r.lo), std::min(hi, r.hi), r.name, agent_name(r.agent), base_name(r.file), r.line,
          r.write ? "writes" : "reads"));
    }
    // Forget what the new access supersedes: on a write, every contained access it is ordered after; on a read, the
    // same agent's contained reads.
    std::erase_if(recs, [&](const Rec& r) {
      if (r.lo < lo || r.hi > hi) return false;
      if (a.write) return r.agent == agent || vc[static_cast<size_t>(r.agent)] >= r.epoch;
      return !r.write && r.agent == agent;
    });
    recs.push_back(Rec{lo, hi, agent, epoch, a.write, std::string(name), loc.file_name(), loc.line()});
  }
}

// ---- execution --------------------------------------------------------------------------------------------------
void EmuDevice::issue(Stream s, Op&& op) {
  StreamQ& q = streams_[static_cast<size_t>(s.id)];
  ++q.issued;
  if (!deferred_) {
    ++q.done;
    if (op.kind == Op::Kind::run && op.fn && !opt_.shapes_only) op.fn();
    return;
  }
  q.q.push_back(std::move(op));
}

bool EmuDevice::runnable(int stream) const {
  const StreamQ& q = streams_[static_cast<size_t>(stream)];
  if (q.q.empty()) return false;
  const Op& op = q.q.front();
  return op.kind != Op::Kind::wait || streams_[static_cast<size_t>(op.wait_stream)].done >= op.wait_count;
}

void EmuDevice::step_stream(int stream) {
  StreamQ& q = streams_[static_cast<size_t>(stream)];
  Op op = std::move(q.q.front());
  q.q.pop_front();
  ++q.done;
  if (op.kind == Op::Kind::run && op.fn) op.fn();
}

// Runs queued work until `stream` has run `count` ops. Each step runs the head of a runnable stream: the target's
// with probability 1/2 when it can run, else one drawn among all runnable streams. Waits only name earlier records,
// so some stream is always runnable while the target is not done.
void EmuDevice::run_until(int stream, int64_t count) {
  const size_t ns = streams_.size();
  std::vector<int> ready;
  while (streams_[static_cast<size_t>(stream)].done < count) {
    if (runnable(stream) && (rng_() & 1)) {
      step_stream(stream);
      continue;
    }
    ready.clear();
    for (size_t s = 0; s < ns; ++s)
      if (runnable(static_cast<int>(s))) ready.push_back(static_cast<int>(s));
    TD_CHECK(!ready.empty(), "rank {}: deferred device: no stream can run (internal error)", rank_);
    step_stream(ready[static_cast<size_t>(rng_() % ready.size())]);
  }
}

void EmuDevice::trace_simple(Stream s, TraceEntry::Kind kind, std::string_view name, const Accesses& acc,
                             double flops, loc_t loc) {
  if (!opt_.record_trace) return;
  TraceEntry t;
  t.kind = kind;
  t.name = name;
  for (const Access& a : acc) t.bytes += a.moved >= 0 ? a.moved : std::max<int64_t>(a.bytes, 0);
  t.flops = flops;
  t.file = loc.file_name();
  t.line = loc.line();
  push_trace(s, std::move(t));
}

void EmuDevice::trace_memory(Stream s, TraceEntry::Kind kind, int64_t bytes, loc_t loc) {
  if (!opt_.record_trace) return;
  TraceEntry t;
  t.kind = kind;
  t.name = kind == TraceEntry::Kind::alloc ? "alloc" : "free";
  t.bytes = bytes;
  t.file = loc.file_name();
  t.line = loc.line();
  push_trace(s, std::move(t));
}

void EmuDevice::push_trace(Stream s, TraceEntry&& t) {
  t.issue = issue_++;
  trace_[static_cast<size_t>(s.id)].entries.push_back(std::move(t));
}

void EmuDevice::record(Event e, Stream s, loc_t loc) {
  check_stream(s, loc);
  check_event(e, loc);
  raise_pending();
  Ev& ev = events_[static_cast<size_t>(e.id)];
  ev.stream = s.id;
  ev.count = streams_[static_cast<size_t>(s.id)].issued;
  if (checking_) {
    tick(s.id + 1);
    ev.clock = clock(s.id + 1);
  }
  ev.index = static_cast<int64_t>(trace_[static_cast<size_t>(s.id)].entries.size());
  trace_event(s, TraceEntry::Kind::record, e, ev, loc);  // always kept: wait() refers to it
}

void EmuDevice::trace_event(Stream s, TraceEntry::Kind kind, Event e, const Ev& ev, loc_t loc) {
  TraceEntry t;
  t.kind = kind;
  t.name = kind == TraceEntry::Kind::record ? "record" : "wait";
  t.event = e.id;
  t.event_stream = ev.stream;
  t.event_index = ev.index;
  t.file = loc.file_name();
  t.line = loc.line();
  push_trace(s, std::move(t));
}

void EmuDevice::wait(Stream s, Event e, loc_t loc) {
  check_stream(s, loc);
  check_event(e, loc);
  raise_pending();
  const Ev& ev = events_[static_cast<size_t>(e.id)];
  TD_CHECK(ev.stream >= 0, "rank {}: wait on event {} that was never recorded (at {}:{})", rank_, e.id,
           loc.file_name(), loc.line());
  if (checking_) merge(clock(s.id + 1), ev.clock);
  if (deferred_ && ev.stream != s.id) {
    Op op;
    op.kind = Op::Kind::wait;
    op.wait_stream = ev.stream;
    op.wait_count = ev.count;
    issue(s, std::move(op));
  }
  trace_event(s, TraceEntry::Kind::wait, e, ev, loc);
}

void EmuDevice::launch(Stream s, std::string_view name, const Accesses& acc, double flops, std::function<void()> fn,
                       loc_t loc) {
  check_stream(s, loc);
  raise_pending();
  if (checking_) {
    tick(s.id + 1);
    check(s.id + 1, name, acc, loc);
  }
  trace_simple(s, TraceEntry::Kind::compute, name, acc, flops, loc);
  issue(s, Op{Op::Kind::run, std::move(fn), -1, 0});
}

void EmuDevice::synchronize(Stream s, loc_t loc) {
  check_stream(s, loc);
  if (deferred_) run_until(s.id, streams_[static_cast<size_t>(s.id)].issued);
  if (checking_) {
    merge(clock(0), clock(s.id + 1));
    ++clock(0)[0];
  }
  raise_pending();
}

void EmuDevice::before_comm(Stream s, std::string_view name, std::span<const Access> acc, loc_t loc) {
  check_stream(s, loc);
  raise_pending();
  if (checking_) {
    tick(s.id + 1);
    check(s.id + 1, name, acc, loc);
  }
  StreamQ& q = streams_[static_cast<size_t>(s.id)];
  if (deferred_) run_until(s.id, q.issued);
  ++q.issued;  // the call itself: an op of s that runs now
  ++q.done;
}

void EmuDevice::finish(loc_t loc) {
  raise_pending();  // a hazard: the queued work must not run
  if (deferred_)
    for (size_t s = 0; s < streams_.size(); ++s) run_until(static_cast<int>(s), streams_[s].issued);
  (void)loc;
  raise_pending();
}

// ---- memory -----------------------------------------------------------------------------------------------------
void* EmuDevice::allocate(int64_t bytes, Stream s, loc_t loc) {
  check_stream(s, loc);
  TD_CHECK(bytes >= 0, "rank {}: allocate of {} bytes at {}:{}", rank_, bytes, loc.file_name(), loc.line());
  raise_pending();
  const size_t n = static_cast<size_t>(std::max<int64_t>(bytes, 1));
  void* p = nullptr;
  const bool over = opt_.max_bytes > 0 && bytes > opt_.max_bytes - mem_.cur;
  if (over) {
  } else if (opt_.shapes_only) {  // a fresh address range, 256-byte aligned (as cudaMalloc's)
    const uintptr_t end = kShapeBase + (static_cast<uintptr_t>(rank_) + 1) * kShapeRange;
    const uintptr_t need = (static_cast<uintptr_t>(n) + 255) & ~uintptr_t{255};
    TD_CHECK(need <= end - next_addr_,
             "rank {}: shapes-only run: the rank's 16 TiB of addresses are used up (allocations are never reused) at "
             "{}:{}",
             rank_, base_name(loc.file_name()), loc.line());
    p = reinterpret_cast<void*>(next_addr_);
    next_addr_ += need;
  } else {
    p = raw_allocate(n);
  }
  if (p == nullptr)
    fail(fmt::format("rank {}: out of memory allocating {} bytes of emulated device memory{} ({} bytes in use{}) at "
                     "{}:{}",
                     rank_, bytes, opt_.memory ? fmt::format(" ({})", opt_.memory->name) : "", mem_.cur,
                     over ? fmt::format(", device limit {}", opt_.max_bytes) : "", base_name(loc.file_name()),
                     loc.line()));
  if (deferred_ && !opt_.shapes_only) std::memset(p, 0xFF, n);  // poison: uninitialised reads show up as NaN
  sizes_.insert(reinterpret_cast<uintptr_t>(p), bytes);
  if (checking_) allocs_[reinterpret_cast<uintptr_t>(p)] = Alloc{bytes, {}};
  mem_.cur += bytes;
  mem_.peak = std::max(mem_.peak, mem_.cur);
  if (checking_) {
    tick(s.id + 1);
    const Access a{p, bytes, true};
    check(s.id + 1, "allocate", {&a, 1}, loc);
  }
  trace_memory(s, TraceEntry::Kind::alloc, bytes, loc);
  StreamQ& q = streams_[static_cast<size_t>(s.id)];
  ++q.issued;  // an op of s (ordered with its work) that has nothing to run
  if (deferred_) q.q.push_back(Op{});
  else ++q.done;
  return p;
}

void EmuDevice::free(void* p, Stream s, loc_t loc) {
  if (p == nullptr) return;
  try {
    free_impl(p, s, loc);
  } catch (...) {  // out of memory queueing the free: release it now (eager) or leak it (deferred: queued work may
                   // still use it); the error is raised at the next call that can throw
    if (pending_error_.empty())
      pending_error_ = fmt::format("rank {}: out of memory freeing device memory at {}:{}", rank_,
                                   base_name(loc.file_name()), loc.line());
  }
}

void EmuDevice::free_impl(void* p, Stream s, loc_t loc) {
  const int64_t* found = sizes_.find(reinterpret_cast<uintptr_t>(p));
  if (found == nullptr || s.id < 0 || static_cast<size_t>(s.id) >= streams_.size()) {
    if (pending_error_.empty())
      pending_error_ = fmt::format("rank {}: free of {} that no allocate returned (or freed twice) at {}:{}", rank_,
                                   p, base_name(loc.file_name()), loc.line());
    return;
  }
  const int64_t bytes = *found;
  if (checking_) {
    try {
      tick(s.id + 1);
      const Access a{p, bytes, true};
      check(s.id + 1, "free", {&a, 1}, loc);
    } catch (const Error& e) {
      if (pending_error_.empty()) pending_error_ = e.what();
    }
  }
  sizes_.erase(reinterpret_cast<uintptr_t>(p));
  trace_memory(s, TraceEntry::Kind::free, bytes, loc);
  if (checking_) allocs_.erase(reinterpret_cast<uintptr_t>(p));  // checker state goes with it
  if (!deferred_) {  // eager: the free is an op of s that runs now (what issue() would do, without the closure)
    StreamQ& q = streams_[static_cast<size_t>(s.id)];
    ++q.issued;
    ++q.done;
    raw_release(p, bytes);
    mem_.cur -= bytes;
    return;
  }
  unreleased_.emplace(p, bytes);  // deferred: the bytes are released when the free runs
  issue(s, Op{Op::Kind::run,
              [this, p, bytes] {
                unreleased_.erase(p);
                raw_release(p, bytes);
                mem_.cur -= bytes;
              },
              -1, 0});
}

void EmuDevice::copy(void* dst, const void* src, int64_t bytes, Stream s, loc_t loc) {
  if (immediate()) {
    check_stream(s, loc);
    std::memcpy(dst, src, static_cast<size_t>(bytes));
    return;
  }
  launch(s, "copy", {Access{src, bytes, false}, Access{dst, bytes, true}}, 0,
         [dst, src, bytes] { std::memcpy(dst, src, static_cast<size_t>(bytes)); }, loc);
}

void EmuDevice::memset(void* dst, int value, int64_t bytes, Stream s, loc_t loc) {
  if (immediate()) {
    check_stream(s, loc);
    std::memset(dst, value, static_cast<size_t>(bytes));
    return;
  }
  launch(s, "memset", {Access{dst, bytes, true}}, 0,
         [dst, value, bytes] { std::memset(dst, value, static_cast<size_t>(bytes)); }, loc);
}

void EmuDevice::copy_2d(void* dst, int64_t dpitch, const void* src, int64_t spitch, int64_t width, int64_t rows,
                        Stream s, loc_t loc) {
  TD_CHECK(width >= 0 && rows >= 0 && dpitch >= width && spitch >= width,
           "rank {}: copy_2d of {} rows x {} bytes with pitches {} / {} at {}:{}", rank_, rows, width, dpitch, spitch,
           base_name(loc.file_name()), loc.line());
  if (rows == 0 || width == 0) return;
  const int64_t span_d = (rows - 1) * dpitch + width, span_s = (rows - 1) * spitch + width;
  launch(s, "copy_2d", {Access{src, span_s, false}, Access{dst, span_d, true}}, 0,
         [=] {
           auto* d = static_cast<std::byte*>(dst);
           const auto* c = static_cast<const std::byte*>(src);
           for (int64_t r = 0; r < rows; ++r) std::memcpy(d + r * dpitch, c + r * spitch, static_cast<size_t>(width));
         },
         loc);
}

void EmuDevice::upload(void* dst, const void* src, int64_t bytes, Stream s, loc_t loc) {
  if (immediate()) {
    check_stream(s, loc);
    if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
    return;
  }
  if (opt_.shapes_only) {  // traced and checked; no bytes
    launch(s, "upload", {Access{dst, bytes, true}}, 0, nullptr, loc);
    return;
  }
  // The host buffer is consumed now (staged), as cudaMemcpyAsync from pageable memory does.
  auto stage = std::make_shared<std::vector<std::byte>>(static_cast<size_t>(bytes));
  if (bytes > 0) std::memcpy(stage->data(), src, static_cast<size_t>(bytes));
  launch(s, "upload", {Access{dst, bytes, true}}, 0,
         [dst, stage, bytes] { std::memcpy(dst, stage->data(), static_cast<size_t>(bytes)); }, loc);
}

void EmuDevice::download_known(void* dst, const void* src, int64_t bytes, Stream s, loc_t loc) {
  if (!opt_.shapes_only) return download(dst, src, bytes, s, loc);
  launch(s, "download", {Access{src, bytes, false}}, 0, nullptr, loc);
}

void EmuDevice::download(void* dst, const void* src, int64_t bytes, Stream s, loc_t loc) {
  TD_CHECK(!opt_.shapes_only,
           "rank {}: shapes-only run: the host reads {} bytes of device memory at {}:{}, but a shapes-only device has "
           "no data (what sets sizes must come from the layout or the routing spec)",
           rank_, bytes, base_name(loc.file_name()), loc.line());
  if (immediate()) {
    check_stream(s, loc);
    if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
    return;
  }
  launch(s, "download", {Access{src, bytes, false}}, 0,
         [dst, src, bytes] { std::memcpy(dst, src, static_cast<size_t>(bytes)); }, loc);
}

}  // namespace trident::emu
