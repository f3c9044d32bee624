// The emulator's world: ranks (fibers or threads), communicator groups, rendezvous, fault detection
// (docs/emulator.md).
//
// Concurrency design
//  * Ranks run as user-space fibers on a few worker threads (emulator/fiber.h; RankExec::fibers) or as one OS
//    thread each (RankExec::threads). Everything below holds for both: the only difference is how a rank sleeps
//    on a word and is woken (World::wait_word / wake_word: the fiber scheduler's user-space futex, or
//    platform/wait.h). No lock is held while a rank sleeps, so a fiber never blocks its worker on another fiber.
//  * One world mutex guards every rendezvous state (arrivals, posted send/recv, blocked flags). Detection of
//    mismatches and deadlocks needs one consistent view, and arrivals are short.
//  * A rank that must wait marks itself blocked (under the mutex) and sleeps on its own futex word; whoever
//    completes its rendezvous, or fails it, clears the flag and wakes it.
//    Because "blocked" is only cleared by the waker, "all live ranks blocked" means no rendezvous can ever
//    complete: that is the deadlock test, run whenever a rank blocks or finishes.
//  * Data moves outside the mutex: after a collective's arrival, each rank copies/reduces its own part
//    straight from the other ranks' buffers, then all meet at a lock-free completion barrier (so no buffer is
//    reused while another rank still reads it). Send/recv: the rank that completes a match copies.
//  * A watchdog thread fails blocked ranks when nothing progressed for SpawnOptions::watchdog.
#include "emulator/world.h"

#include <pthread.h>
#include <unistd.h>

#include <climits>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "emulator/device.h"
#include "emulator/fiber.h"
#include "emulator/reduce.h"
#include "platform/wait.h"

namespace trident::emu {

namespace {

std::string where(const char* file, unsigned line) { return fmt::format("{}:{}", file, line); }

// One rank's call as seen by the rendezvous (what is compared and what a report prints).
struct CallDesc {
  CollOp op = CollOp::all_gather;
  uint64_t count = 0;
  DataType dtype = DataType::f32;
  ReduceOp redop = ReduceOp::sum;
  int root = -1;  // broadcast/reduce root; send/recv peer
  uint64_t seq = 0;
  const char* file = "";
  unsigned line = 0;
};

bool has_redop(CollOp op) {
  return op == CollOp::reduce_scatter || op == CollOp::all_reduce || op == CollOp::reduce;
}

std::string describe(const CallDesc& c) {
  std::string args;
  switch (c.op) {
    case CollOp::split: args = ""; break;
    case CollOp::send: args = fmt::format("count={}, {}, to {}", c.count, to_string(c.dtype), c.root); break;
    case CollOp::recv: args = fmt::format("count={}, {}, from {}", c.count, to_string(c.dtype), c.root); break;
    default:
      args = fmt::format("count={}, {}", c.count, to_string(c.dtype));
      if (has_redop(c.op)) args += fmt::format(", {}", to_string(c.redop));
      if (c.root >= 0) args += fmt::format(", root={}", c.root);
  }
  return fmt::format("{}({}) #{} at {}", to_string(c.op), args, c.seq, where(c.file, c.line));
}

std::string describe_members(const std::vector<int>& m) {
  if (m.empty()) return "{}";
  bool contiguous = true;
  for (size_t i = 1; i < m.size(); ++i) contiguous &= m[i] == m[i - 1] + 1;
  if (contiguous && m.size() > 2) return fmt::format("world ranks {}..{}", m.front(), m.back());
  if (m.size() <= 16) return fmt::format("world ranks {}", fmt::join(m, ","));
  return fmt::format("world ranks {},{},{},...,{} ({} ranks)", m[0], m[1], m[2], m.back(), m.size());
}

}  // namespace

struct P2POp;
struct Group;

struct RankState {
  int rank = 0;
  bool live = true;
  // --- guarded by World::mu
  bool blocked = false;
  std::atomic<bool> released{false};     // collective arrival completed (read without the mutex after a wake)
  std::optional<std::string> error;      // set by whoever fails this rank's pending call
  Group* waiting_group = nullptr;        // the group of the pending call (for aborts and reports)
  bool pending_p2p = false;              // pending call: a send/recv group (p2p_ops) or a collective
  CallDesc pending_desc;                 //   (described lazily: only reports format strings)
  CallDesc last_desc;                    // last communicator call started (reports)
  std::shared_ptr<Group> last_group;
  size_t last_p2p_count = 0;
  int p2p_outstanding = 0;               // unfinished ops of the current send/recv group
  bool draining = false;                 // failing: waiting for other ranks' copies on its ops
  std::vector<P2POp*> p2p_ops;           // the current send/recv group's ops (reports)
  // --- futex word: bumped (release) by the waker
  std::atomic<uint32_t> wake{0};
  // --- owned by the rank thread
  void* local_slot = nullptr;            // rank_local_slot()
  RankTrace trace;
  CommStats retired;                     // counters of destroyed communicators
  std::set<const Communicator*> live_comms;
  std::mutex stats_mu;                   // guards retired/live_comms against RankContext::stats from the owner
  // group_start() without its group_end(): per open communicator its description; a communicator destroyed with
  // its group open moves it to dropped_groups. Checked at the next call on any communicator and at rank exit.
  // Only the rank's own thread touches them (no lock).
  // Open groups are kept as (communicator, group, call site), ordered by communicator, and described only for a
  // report (a group_start() costs no formatting and no allocation).
  struct OpenGroup {
    const Communicator* comm;
    const Group* group;
    const char* file;
    unsigned line;
    std::string describe() const;  // "group_start() at FILE:LINE on communicator ..."
  };
  std::vector<OpenGroup> open_groups;
  std::vector<std::string> dropped_groups;
  OpenGroup* find_open_group(const Communicator* c) {
    auto it = std::lower_bound(open_groups.begin(), open_groups.end(), c,
                               [](const OpenGroup& o, const Communicator* k) { return std::less<>()(o.comm, k); });
    return it != open_groups.end() && it->comm == c ? &*it : nullptr;
  }
  void add_open_group(const OpenGroup& o) {
    auto it = std::lower_bound(open_groups.begin(), open_groups.end(), o.comm,
                               [](const OpenGroup& x, const Communicator* k) { return std::less<>()(x.comm, k); });
    open_groups.insert(it, o);
  }
  void erase_open_group(const Communicator* c) {
    if (OpenGroup* o = find_open_group(c)) open_groups.erase(open_groups.begin() + (o - open_groups.data()));
  }
  std::string open_group_error(const Communicator* except) const {
    std::vector<std::string> v = dropped_groups;
    for (const OpenGroup& o : open_groups)
      if (o.comm != except) v.push_back(o.describe());
    if (v.empty()) return "";
    return fmt::format("{} has no group_end(){}", fmt::join(v, "; "),
                       v.size() > 1 ? fmt::format(" ({} open groups)", v.size()) : "");
  }
};

struct P2POp {
  bool is_send = false;
  int owner = 0;  // world rank
  int crank = 0;  // owner's communicator rank
  int peer = 0;   // communicator rank
  const void* sbuf = nullptr;
  void* rbuf = nullptr;
  CallDesc desc;
  bool matched = false;
  bool done = false;
  P2POp* next = nullptr;  // Group::OpQueue link
};

struct Slot {
  CallDesc call;
  const void* send = nullptr;
  void* recv = nullptr;
  int color = -1, key = 0;                  // split
  std::string split_name;
  std::vector<char> stage[2];               // eager protocol staging, by sequence parity (owner writes)
  std::shared_ptr<Group> split_group;       // split result
  int split_rank = -1;
};

struct Group {
  int64_t id = 0;
  std::string name;
  std::vector<int> members;  // world rank of each communicator rank
  // --- guarded by World::mu
  int arrived = 0;
  std::vector<Slot> slots;
  bool aborted = false;
  std::string abort_reason;
  // --- send/recv queues, guarded by p2p_mu (not the world mutex: posting many ops must not serialise the
  // world). Completion state (P2POp::done, RankState::p2p_outstanding) stays under the world mutex.
  struct OpQueue {  // intrusive FIFO through P2POp::next
    P2POp* head = nullptr;
    P2POp* tail = nullptr;
    bool empty() const { return head == nullptr; }
    void push(P2POp* op);
    P2POp* pop();
    void remove(P2POp* op);
  };
  struct PairQueues {
    OpQueue sends, recvs;
  };
  std::mutex p2p_mu;
  std::vector<PairQueues> p2p;  // [src * size() + dst] (communicator ranks); allocated at the first send/recv
  PairQueues& pair(int src, int dst) {
    if (p2p.empty()) p2p.resize(members.size() * members.size());
    return p2p[static_cast<size_t>(src) * members.size() + static_cast<size_t>(dst)];
  }
  // --- lock-free completion barrier
  std::vector<char> result[2];  // eager all_reduce/reduce result, by sequence parity (written by the last arriver)
  std::atomic<int> bar_count{0};
  std::atomic<uint32_t> bar_gen{0};

  int size() const { return static_cast<int>(members.size()); }
  std::string label() const { return fmt::format("communicator '{}' (id {}, {})", name, id, describe_members(members)); }
};

std::string RankState::OpenGroup::describe() const {
  return fmt::format("group_start() at {} on {}", where(file, line), group->label());
}

void Group::OpQueue::push(P2POp* op) {
  op->next = nullptr;
  (tail ? tail->next : head) = op;
  tail = op;
}
P2POp* Group::OpQueue::pop() {
  P2POp* o = head;
  head = o->next;
  if (!head) tail = nullptr;
  return o;
}
void Group::OpQueue::remove(P2POp* op) {
  P2POp* prev = nullptr;
  for (P2POp* p = head; p; prev = p, p = p->next)
    if (p == op) {
      (prev ? prev->next : head) = p->next;
      if (tail == p) tail = prev;
      return;
    }
}

std::string describe_p2p(const RankState& r, const Group& g) {
  std::vector<std::string> parts;
  int shown = 0, pending = 0;
  for (const P2POp* o : r.p2p_ops) {
    if (o->done) continue;
    ++pending;
    if (shown++ < 4) parts.push_back(describe(o->desc));
  }
  std::string s = fmt::format("{} unmatched in a group of {} send/recv on {}: {}", pending, r.p2p_ops.size(),
                              g.label(), fmt::join(parts, "; "));
  if (pending > 4) s += fmt::format("; ... ({} more)", pending - 4);
  return s;
}
std::string pending_str(const RankState& r) {
  if (!r.waiting_group) return "nothing";
  if (r.pending_p2p) return describe_p2p(r, *r.waiting_group);
  return fmt::format("{} on {}", describe(r.pending_desc), r.waiting_group->label());
}
std::string last_str(const RankState& r) {
  if (!r.last_group) return "none";
  if (r.last_p2p_count)
    return fmt::format("group of {} send/recv on {} (first: {})", r.last_p2p_count, r.last_group->label(),
                       describe(r.last_desc));
  return fmt::format("{} on {}", describe(r.last_desc), r.last_group->label());
}

struct World {
  explicit World(int n, const SpawnOptions& o) : opts(o) {
    ranks.reserve(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      ranks.push_back(std::make_unique<RankState>());
      ranks.back()->rank = r;
    }
    live = n;
    failures.reserve(static_cast<size_t>(n) + 1);  // recording a failure does not allocate (out of memory)
  }
  SpawnOptions opts;
  // RankExec::fibers: ranks wait by parking their fiber. Made before the first fiber is added and kept as long as
  // the world (the watchdog thread may wake fibers until it is joined).
  std::unique_ptr<fiber::Scheduler> sched;
  // Fibers: the device memory of each worker's ranks (emulator/block_pool.h); empty with rank threads (the host's
  // allocator). Destroyed after every rank's device.
  WorkerPools pools;
  // Sleeping on a word until it changes, and waking the sleepers: platform/wait.h (the kernel's futex on Linux)
  // for rank threads, the fiber scheduler's user-space one for fibers (from any thread: the watchdog wakes fibers
  // too).
  void wait_word(std::atomic<uint32_t>& w, uint32_t old) {
    if (sched) sched->wait(w, old);
    else platform::wait_word(w, old);
  }
  void wake_word(std::atomic<uint32_t>& w, int n) {
    if (sched) sched->wake(w, n);
    else platform::wake_word(w, n);
  }
  std::mutex mu;
  std::vector<std::unique_ptr<RankState>> ranks;
  std::vector<std::weak_ptr<Group>> groups;  // every communicator group created (abort on rank failure)
  int64_t next_group_id = 0;
  int live = 0;
  int blocked = 0;
  uint64_t progress = 0;
  // failures, in order
  struct Failure {
    int rank;
    std::string msg;
  };
  std::vector<Failure> failures;
  // watchdog
  std::condition_variable watchdog_cv;
  bool finished = false;
  std::shared_ptr<Group> world_group;

  int size() const { return static_cast<int>(ranks.size()); }

  std::shared_ptr<Group> make_group(std::string name, std::vector<int> members) {  // under mu (or before threads)
    auto g = std::make_shared<Group>();
    g->id = next_group_id++;
    g->name = std::move(name);
    g->members = std::move(members);
    g->slots.resize(g->members.size());
    groups.push_back(g);
    return g;
  }

  // --- all under mu
  void wake(RankState& r) {
    mark_woken(r);
    wake_word(r.wake, 1);
  }
  // wake() without the futex call, which the caller makes after releasing the mutex (shorter hold time).
  void mark_woken(RankState& r) {
    if (r.blocked) {
      r.blocked = false;
      --blocked;
    }
    r.wake.fetch_add(1, std::memory_order_release);
  }
  void fail_rank(RankState& r, const std::string& msg) {
    if (!r.error) r.error = msg;
    wake(r);
  }
  // Fails a blocked rank and aborts the communicator it waits in: its rendezvous state (arrivals, queued
  // send/recv) is no longer consistent, so later calls on it fail at once instead of misbehaving.
  void fail_blocked(RankState& r, const std::string& msg) {
    if (Group* g = r.waiting_group; g && !g->aborted) {
      g->aborted = true;
      g->abort_reason = fmt::format("{} was aborted by an earlier failure:\n{}", g->label(), msg);
    }
    fail_rank(r, msg);
  }

  // Sleeps until done() (returns) or an error is set for this rank (throws it). Precondition: lk holds mu.
  // Fast path: when `fast` is given and reads true after a wake, return at once WITHOUT re-taking the mutex
  // (the waker already cleared this rank's wait state); lk then no longer owns the mutex.
  template <class Pred>
  void block_until(RankState& me, std::unique_lock<std::mutex>& lk, Pred done, std::atomic<bool>* fast = nullptr) {
    while (!done()) {
      if (me.error) {
        std::string msg = std::move(*me.error);
        me.error.reset();
        me.waiting_group = nullptr;
        throw Error(msg);
      }
      if (me.waiting_group && me.waiting_group->aborted) {  // aborted while this rank was not yet blocked
        std::string msg = me.waiting_group->abort_reason;
        me.waiting_group = nullptr;
        throw Error(msg);
      }
      me.blocked = true;
      ++blocked;
      check_deadlock();
      if (!me.blocked) continue;  // the deadlock check failed us (error set) or we were woken
      const uint32_t t = me.wake.load(std::memory_order_acquire);
      lk.unlock();
      wait_word(me.wake, t);
      if (fast && fast->load(std::memory_order_acquire)) return;
      lk.lock();
    }
    me.waiting_group = nullptr;
  }

  // All live ranks blocked: no rendezvous can complete. Fail every blocked rank with one report.
  void check_deadlock() {
    if (live == 0 || blocked < live) return;
    std::string report = fmt::format(
        "deadlock: all {} live rank(s) are blocked in communicator calls that cannot complete "
        "({} rank(s) finished or failed). Pending calls:",
        live, size() - live);
    for (auto& r : ranks)
      if (r->blocked) report += fmt::format("\n  rank {}: {}", r->rank, pending_str(*r));
    for (auto& r : ranks)
      if (!r->live) report += fmt::format("\n  rank {}: finished (last call: {})", r->rank, last_str(*r));
    for (auto& r : ranks)
      if (r->blocked) fail_blocked(*r, report);
  }

  // A rank's exception reached spawn: abort every communicator it belongs to.
  void on_rank_failed(int rank, const std::string& msg) noexcept {
    std::lock_guard lk(mu);
    try {
      failures.push_back({rank, msg});
    } catch (...) {  // no memory for the message: the rank is still named
      failures.push_back({rank, std::string()});
    }
    try {
      abort_groups_of(rank, msg);
    } catch (...) {  // out of memory formatting the reason: abort without it
      for (auto& wg : groups)
        if (auto g = wg.lock(); g && !g->aborted &&
                                std::find(g->members.begin(), g->members.end(), rank) != g->members.end()) {
          g->aborted = true;
          for (int m : g->members) {
            auto& r = *ranks[static_cast<size_t>(m)];
            if (r.waiting_group == g.get() && r.blocked) {
              r.error.emplace();
              wake(r);
            }
          }
        }
    }
    ++progress;
  }
  void abort_groups_of(int rank, const std::string& msg) {
    for (auto& wg : groups) {
      auto g = wg.lock();
      if (!g || g->aborted) continue;
      if (std::find(g->members.begin(), g->members.end(), rank) == g->members.end()) continue;
      g->aborted = true;
      g->abort_reason = fmt::format("{} aborted: rank {} failed: {}", g->label(), rank, msg);
      for (int m : g->members) {
        auto& r = *ranks[static_cast<size_t>(m)];
        if (r.waiting_group == g.get() && r.blocked) fail_rank(r, g->abort_reason);
      }
    }
  }

  void on_rank_finished(RankState& r) {
    std::lock_guard lk(mu);
    r.live = false;
    --live;
    ++progress;
    check_deadlock();
    if (live == 0) {
      finished = true;
      watchdog_cv.notify_all();
    }
  }

  void watchdog_loop() {
    std::unique_lock lk(mu);
    uint64_t seen = progress;
    auto since = std::chrono::steady_clock::now();
    while (!finished) {
      watchdog_cv.wait_for(lk, std::min<std::chrono::milliseconds>(opts.watchdog / 4 + std::chrono::milliseconds(1),
                                                                   std::chrono::milliseconds(250)));
      if (finished) break;
      auto now = std::chrono::steady_clock::now();
      if (progress != seen || blocked == 0) {
        seen = progress;
        since = now;
        continue;
      }
      if (now - since < opts.watchdog) continue;
      std::string report = fmt::format(
          "watchdog: no progress for {} ms while {} rank(s) are blocked (a rank may be stuck in compute). States:",
          opts.watchdog.count(), blocked);
      for (auto& r : ranks) {
        if (r->blocked)
          report += fmt::format("\n  rank {}: blocked in {}", r->rank, pending_str(*r));
        else if (r->live)
          report += fmt::format("\n  rank {}: running, not in a communicator call (last call: {})", r->rank,
                                last_str(*r));
      }
      for (auto& r : ranks)
        if (r->blocked) fail_blocked(*r, report);
      ++progress;
      seen = progress;
      since = now;
    }
  }
};

// ------------------------------------------------------------------------------------------------------------
// Device: emulator/device.h. The trace entry of a communication call:
// The hash of the bytes a rank received (TraceEntry::recv_hash): the device's choice (emulator/trace_hash.h).
void trace_comm(EmuDevice& dev, Stream s, TraceEntry::Kind kind, const Group& g, const CallDesc& c, int64_t bytes,
                const void* recv = nullptr, size_t recv_bytes = 0, int64_t helper_recv_bytes = -1) {
  if (!dev.tracing()) return;
  TraceEntry t;
  if (recv && recv_bytes) t.recv_hash = recv_hash(dev.options().recv_hash, recv, recv_bytes);
  t.kind = kind;
  t.name = to_string(c.op);
  t.comm = g.name;
  t.comm_id = g.id;
  t.seq = c.seq;
  t.op = c.op;
  t.dtype = c.dtype;
  t.redop = c.redop;
  t.count = c.count;
  t.peer = c.root;
  t.bytes = bytes;
  t.recv_bytes = helper_recv_bytes;
  t.file = c.file;
  t.line = c.line;
  dev.push_trace(s, std::move(t));
}

// ------------------------------------------------------------------------------------------------------------
// Communicator.

namespace {

// Lock-free barrier over a group's ranks (no deadlock possible: every rank reaching it is already past the
// rendezvous and only copies data before arriving).
void group_barrier(World& w, Group& g) {
  const int n = g.size();
  if (n == 1) return;
  const uint32_t gen = g.bar_gen.load(std::memory_order_acquire);
  if (g.bar_count.fetch_add(1, std::memory_order_acq_rel) + 1 == n) {
    g.bar_count.store(0, std::memory_order_relaxed);
    g.bar_gen.fetch_add(1, std::memory_order_acq_rel);
    w.wake_word(g.bar_gen, INT_MAX);
  } else {
    w.wait_word(g.bar_gen, gen);
  }
}

// Segment k of [0, count) split into n near-equal parts.
size_t seg_lo(size_t count, int n, int k) { return count / static_cast<size_t>(n) * static_cast<size_t>(k) +
                                                std::min(static_cast<size_t>(k), count % static_cast<size_t>(n)); }

}  // namespace

class EmuComm final : public Communicator {
 public:
  EmuComm(World& w, RankState& me, EmuDevice& dev, std::shared_ptr<Group> g, int crank)
      : Communicator(g->name), w_(w), me_(me), dev_(dev), g_(std::move(g)), crank_(crank) {
    std::lock_guard lk(me_.stats_mu);
    me_.live_comms.insert(this);
  }
  ~EmuComm() override {  // never throws: it may run while another exception unwinds the rank
    std::lock_guard lk(me_.stats_mu);
    me_.live_comms.erase(this);
    try {
      accumulate_stats(me_.retired, *this);
      if (const RankState::OpenGroup* o = me_.find_open_group(this)) {
        me_.dropped_groups.push_back(o->describe() + " (communicator destroyed)");
        me_.erase_open_group(this);
      }
    } catch (...) {  // out of memory: the counters of this communicator are lost, nothing else
      me_.erase_open_group(this);
    }
  }
  int rank() const override { return crank_; }
  int size() const override { return g_->size(); }

 protected:
  void do_collective(const CollArgs& call, Stream s, loc_t loc) override {
    check_no_open_group(loc);
    CollArgs a = call;
    CallDesc c{a.op, a.count, a.dtype, a.redop, a.root, seq_, loc.file_name(), loc.line()};
    const size_t es = dtype_size(a.dtype), n = static_cast<size_t>(size());
    {  // the device ranges it reads and writes (checked against the rank's other streams; deferred: runs s first)
      const auto b = [](size_t x) { return static_cast<int64_t>(x); };
      const size_t one = a.count * es, all = n * one;
      Access acc[2];
      size_t na = 2;
      switch (a.op) {
        case CollOp::all_gather: acc[0] = Access{a.send, b(one), false}, acc[1] = Access{a.recv, b(all), true}; break;
        case CollOp::reduce_scatter:
          acc[0] = Access{a.send, b(all), false}, acc[1] = Access{a.recv, b(one), true};
          break;
        case CollOp::broadcast:
        case CollOp::reduce: {
          const bool root = crank_ == a.root;
          na = 0;
          if (a.op == CollOp::reduce || root) acc[na++] = Access{a.send, b(one), false};
          if (a.op == CollOp::broadcast || root) acc[na++] = Access{a.recv, b(one), true};
          break;
        }
        default: acc[0] = Access{a.send, b(one), false}, acc[1] = Access{a.recv, b(one), true}; break;
      }
      dev_.before_comm(s, to_string(a.op), {acc, na}, loc);
    }
    // Test hook (SpawnOptions::drop_count, `trident fuzz`'s planted communicator): rank 1 contributes zeros.
    std::vector<char> dropped;
    if (!dev_.options().shapes_only && w_.opts.drop_count > 0 && a.op == w_.opts.drop_op && a.count == w_.opts.drop_count && crank_ == 1) {
      dropped.assign((a.op == CollOp::reduce_scatter ? n : 1) * a.count * es, 0);
      a.send = dropped.data();
    }
    // Eager protocol for small calls: each rank first copies its input into its slot's staging buffer (two,
    // alternating by sequence parity), then reads only staging after the rendezvous, so no rank waits for the
    // others to finish reading (no completion barrier). Safe because a rank can only reach call k+2 after
    // every rank has finished call k. Larger calls read the other ranks' buffers directly (zero extra copies)
    // and end with a completion barrier.
    // Shapes only (DeviceOptions::shapes_only): the rendezvous and its checks, the counters and the trace; no bytes.
    const bool nodata = dev_.options().shapes_only;
    const size_t reads = (a.op == CollOp::broadcast ? 1 : n) * a.count * es;
    const bool eager = !nodata && n > 1 && reads <= w_.opts.eager_bytes;
    const int parity = static_cast<int>(seq_ & 1);
    if (eager) {
      size_t sb = (a.op == CollOp::reduce_scatter ? n : 1) * a.count * es;
      if (a.op == CollOp::broadcast && crank_ != a.root) sb = 0;
      auto& st = g_->slots[static_cast<size_t>(crank_)].stage[parity];
      st.resize(sb);
      if (sb) std::memcpy(st.data(), a.send, sb);
    }
    arrive(c, a.send, a.recv, eager ? parity : -1);
    if (nodata) {
    } else if (eager) {
      execute_eager(a, parity);
    } else {
      execute(a);
      group_barrier(w_, *g_);  // nobody reuses a buffer another rank may still read
    }
    const size_t bytes = (a.op == CollOp::all_gather || a.op == CollOp::reduce_scatter) ? n * a.count * es
                                                                                         : a.count * es;
    const size_t got = a.op == CollOp::all_gather                      ? n * a.count * es
                       : a.op == CollOp::reduce && crank_ != a.root    ? 0
                                                                        : a.count * es;
    trace_comm(dev_, s, TraceEntry::Kind::collective, *g_, c, static_cast<int64_t>(bytes), nodata ? nullptr : a.recv,
               got);
  }

  void do_send(const void* buf, size_t count, DataType t, int peer, Stream s, loc_t loc) override {
    post_p2p(true, buf, nullptr, count, t, peer, s, loc);
  }
  void do_recv(void* buf, size_t count, DataType t, int peer, Stream s, loc_t loc) override {
    post_p2p(false, nullptr, buf, count, t, peer, s, loc);
  }
  void do_group_start(loc_t loc) override {
    check_no_open_group(loc);
    if (depth_++ == 0) {
      me_.add_open_group({this, g_.get(), loc.file_name(), loc.line()});
    }
  }
  void on_helper_done(CollOp op, size_t count, DataType t, size_t bytes, size_t recv_bytes, Stream s,
                      loc_t loc) override {
    CallDesc c{op, count, t, ReduceOp::sum, -1, helper_seq_++, loc.file_name(), loc.line()};
    // the received bytes too: a hot receiver sets the all-to-all's time (sim/timeline.h)
    trace_comm(dev_, s, TraceEntry::Kind::collective, *g_, c, static_cast<int64_t>(bytes), nullptr, 0,
               static_cast<int64_t>(recv_bytes));
  }
  void do_group_end(loc_t loc) override {
    (void)loc;
    --depth_;
    if (depth_ == 0) {
      me_.erase_open_group(this);
      run_p2p();
    }
  }

  // all_to_all as a collective: one rendezvous, then each rank copies its block of every member's send buffer (read in
  // place, as all_gather does) and a completion barrier, instead of 2n matched send/recv. The same bytes, the same
  // trace entry (on_helper_done; the collectives' sequence numbers are not advanced: the helper's own count is the
  // rendezvous's, so a member calling something else is reported as a mismatch).
  bool do_all_to_all(const void* send, void* recv, size_t count, DataType t, Stream s, loc_t loc) override {
    check_no_open_group(loc);
    const size_t es = dtype_size(t), n = static_cast<size_t>(size()), one = count * es;
    const Access acc[2] = {Access{send, static_cast<int64_t>(n * one), false},
                           Access{recv, static_cast<int64_t>(n * one), true}};
    dev_.before_comm(s, "all_to_all", {acc, 2}, loc);
    const CallDesc c{CollOp::all_to_all, count, t, ReduceOp::sum, -1, helper_seq_, loc.file_name(), loc.line()};
    arrive(c, send, recv, -1, -1, 0, {}, /*collective_seq=*/false);
    if (!dev_.options().shapes_only) execute({CollOp::all_to_all, send, recv, count, t, ReduceOp::sum, -1});
    group_barrier(w_, *g_);  // nobody reuses a send buffer another rank may still read
    return true;
  }

  bool native_exact_sum() const override { return !w_.opts.lower_exact_sum; }
  Device* lowering_device() override { return &dev_; }

  std::unique_ptr<Communicator> do_split(int color, int key, std::string name, loc_t loc) override {
    check_no_open_group(loc);
    CallDesc c{CollOp::split, 0, DataType::u8, ReduceOp::sum, -1, seq_, loc.file_name(), loc.line()};
    auto [grp, r] = arrive(c, nullptr, nullptr, -1, color, key, std::move(name));  // result read from own slot only
    if (!grp) return nullptr;
    return std::make_unique<EmuComm>(w_, me_, dev_, std::move(grp), r);
  }

 private:
  // A group left open on another communicator of this rank (or on a destroyed one) would drop its sends: the next
  // call outside it fails, naming where the group started and where this call is.
  void check_no_open_group(loc_t loc) {
    if (me_.open_groups.empty() && me_.dropped_groups.empty()) return;
    const std::string open = me_.open_group_error(this);
    if (!open.empty())
      fail(fmt::format("a call at {} on {} while {}: its send/recv were never issued",
                       where(loc.file_name(), loc.line()), g_->label(), open));
  }

  // Rendezvous of a collective (or split). Returns the split result when op == split.
  // eager_parity >= 0: an eager call; the last arriver computes a reduction's result once, into the group's
  // result buffer of that parity (instead of every rank reducing all inputs: O(n) instead of O(n^2)).
  // collective_seq: false for a helper (all_to_all), whose CallDesc carries the helper count instead.
  std::pair<std::shared_ptr<Group>, int> arrive(const CallDesc& c, const void* send, void* recv, int eager_parity,
                                                int color = -1, int key = 0, std::string split_name = {},
                                                bool collective_seq = true) {
    std::unique_lock lk(w_.mu);
    Group& g = *g_;
    me_.last_desc = c;
    me_.last_p2p_count = 0;
    if (me_.last_group != g_) me_.last_group = g_;
    if (g.aborted) throw Error(g.abort_reason);
    if (collective_seq) ++seq_;
    ++w_.progress;
    Slot& mine = g.slots[static_cast<size_t>(crank_)];
    mine.call = c;
    mine.send = send;
    mine.recv = recv;
    mine.color = color;
    mine.key = key;
    mine.split_name = std::move(split_name);
    mine.split_group.reset();
    mine.split_rank = -1;
    me_.released.store(false, std::memory_order_relaxed);
    if (++g.arrived < g.size()) {
      me_.waiting_group = &g;
      me_.pending_p2p = false;
      me_.pending_desc = c;
      w_.block_until(me_, lk, [&] { return me_.released.load(std::memory_order_acquire); }, &me_.released);
    } else {
      g.arrived = 0;
      if (auto report = mismatch_report(g)) {  // every member fails with the same report
        g.aborted = true;
        g.abort_reason = *report;
        for (int m : g.members)
          if (m != me_.rank) w_.fail_rank(*w_.ranks[static_cast<size_t>(m)], *report);
        throw Error(*report);
      }
      if (c.op == CollOp::split) do_split_groups(g);
      if (eager_parity >= 0 && (c.op == CollOp::all_reduce || c.op == CollOp::reduce)) {
        auto& res = g.result[eager_parity];
        res.resize(c.count * dtype_size(c.dtype));
        srcs_.resize(g.slots.size());
        for (size_t j = 0; j < g.slots.size(); ++j) srcs_[j] = g.slots[j].stage[eager_parity].data();
        reduce_into(c.dtype, c.redop, res.data(), srcs_.data(), g.size(), c.count);
      }
      ++w_.progress;
      for (int m : g.members) {
        if (m == me_.rank) continue;
        auto& r = *w_.ranks[static_cast<size_t>(m)];
        r.released.store(true, std::memory_order_release);
        r.waiting_group = nullptr;
        w_.mark_woken(r);
      }
      auto result = std::make_pair(mine.split_group, mine.split_rank);
      lk.unlock();
      for (int m : g.members)  // RankStates live as long as the world
        if (m != me_.rank) w_.wake_word(w_.ranks[static_cast<size_t>(m)]->wake, 1);
      return result;
    }
    return {mine.split_group, mine.split_rank};
  }

  std::optional<std::string> mismatch_report(const Group& g) const {
    const CallDesc& a = g.slots[0].call;
    bool same = true;
    for (const Slot& s : g.slots) {
      const CallDesc& b = s.call;
      same &= b.op == a.op && b.seq == a.seq;
      if (a.op != CollOp::split)
        same &= b.count == a.count && b.dtype == a.dtype && b.root == a.root && (!has_redop(a.op) || b.redop == a.redop);
    }
    if (same) return std::nullopt;
    std::string what;
    auto differs = [&](auto get) {
      for (const Slot& s : g.slots)
        if (get(s.call) != get(a)) return true;
      return false;
    };
    std::vector<std::string> fields;
    if (differs([](const CallDesc& d) { return d.seq; })) fields.push_back("sequence number (call order)");
    if (differs([](const CallDesc& d) { return d.op; })) fields.push_back("operation");
    if (differs([](const CallDesc& d) { return d.count; })) fields.push_back("count");
    if (differs([](const CallDesc& d) { return d.dtype; })) fields.push_back("dtype");
    if (differs([](const CallDesc& d) { return d.root; })) fields.push_back("root");
    if (differs([](const CallDesc& d) { return d.redop; })) fields.push_back("reduce op");
    std::string report = fmt::format("collective mismatch on {}: ranks disagree on {}. Calls:", g.label(),
                                     fmt::join(fields, ", "));
    for (size_t i = 0; i < g.slots.size(); ++i)
      report += fmt::format("\n  rank {} (world rank {}): {}", i, g.members[i], describe(g.slots[i].call));
    return report;
  }

  // Last arriver of a split: form the new groups (members ordered by key, then parent rank).
  void do_split_groups(Group& g) {
    std::map<int, std::vector<std::pair<int, int>>> by_color;  // color -> (key, parent rank)
    for (int i = 0; i < g.size(); ++i) {
      const Slot& s = g.slots[static_cast<size_t>(i)];
      if (s.color >= 0) by_color[s.color].push_back({s.key, i});
    }
    for (auto& [color, v] : by_color) {
      std::sort(v.begin(), v.end());
      std::vector<int> members;
      for (auto& kv : v) members.push_back(g.members[static_cast<size_t>(kv.second)]);
      // All ranks of one color pass the same name in correct programs; the lowest parent rank's is used.
      int lowest = v.front().second;
      for (auto& kv : v) lowest = std::min(lowest, kv.second);
      auto ng = w_.make_group(g.slots[static_cast<size_t>(lowest)].split_name, std::move(members));
      for (size_t k = 0; k < v.size(); ++k) {
        Slot& s = g.slots[static_cast<size_t>(v[k].second)];
        s.split_group = ng;
        s.split_rank = static_cast<int>(k);
      }
    }
  }

  void execute_eager(const CollArgs& a, int parity) {
    const int n = size(), r = crank_;
    const size_t es = dtype_size(a.dtype), cnt = a.count;
    auto st = [&](int j) -> const char* { return g_->slots[static_cast<size_t>(j)].stage[parity].data(); };
    if (cnt == 0) return;
    switch (a.op) {
      case CollOp::all_gather:
        for (int j = 0; j < n; ++j) std::memcpy(static_cast<char*>(a.recv) + static_cast<size_t>(j) * cnt * es, st(j), cnt * es);
        break;
      case CollOp::reduce_scatter: {
        const size_t off = static_cast<size_t>(r) * cnt * es;
        srcs_.resize(static_cast<size_t>(n));
        for (int j = 0; j < n; ++j) srcs_[static_cast<size_t>(j)] = st(j) + off;
        reduce_into(a.dtype, a.redop, a.recv, srcs_.data(), n, cnt);
        break;
      }
      case CollOp::all_reduce:
      case CollOp::reduce:  // computed once by the last arriver (arrive)
        if (a.op == CollOp::all_reduce || r == a.root) std::memcpy(a.recv, g_->result[parity].data(), cnt * es);
        break;
      case CollOp::broadcast: std::memcpy(a.recv, st(a.root), cnt * es); break;
      default: fail(fmt::format("emulator: {} is not a collective", to_string(a.op)));
    }
  }

  void execute(const CollArgs& a) {
    const int n = size(), r = crank_;
    const size_t es = dtype_size(a.dtype), cnt = a.count;
    auto slot = [&](int j) -> const Slot& { return g_->slots[static_cast<size_t>(j)]; };
    switch (a.op) {
      case CollOp::all_gather:
        for (int k = 1; k <= n; ++k) {  // start after self: spreads the readers over the sources
          const int j = (r + k) % n;
          char* dst = static_cast<char*>(a.recv) + static_cast<size_t>(j) * cnt * es;
          if (slot(j).send != dst && cnt) std::memcpy(dst, slot(j).send, cnt * es);
        }
        break;
      case CollOp::reduce_scatter: {
        srcs_.resize(static_cast<size_t>(n));
        for (int j = 0; j < n; ++j)
          srcs_[static_cast<size_t>(j)] = static_cast<const char*>(slot(j).send) + static_cast<size_t>(r) * cnt * es;
        reduce_into(a.dtype, a.redop, a.recv, srcs_.data(), n, cnt);
        break;
      }
      case CollOp::all_reduce: {
        // Phase 1: rank r reduces segment r into its own recv. Phase 2: copy the other segments from their owners.
        const size_t lo = seg_lo(cnt, n, r), hi = seg_lo(cnt, n, r + 1);
        srcs_.resize(static_cast<size_t>(n));
        for (int j = 0; j < n; ++j) srcs_[static_cast<size_t>(j)] = static_cast<const char*>(slot(j).send) + lo * es;
        reduce_into(a.dtype, a.redop, static_cast<char*>(a.recv) + lo * es, srcs_.data(), n, hi - lo);
        group_barrier(w_, *g_);
        for (int k = 1; k < n; ++k) {
          const int j = (r + k) % n;
          const size_t jlo = seg_lo(cnt, n, j), jhi = seg_lo(cnt, n, j + 1);
          if (jhi > jlo)
            std::memcpy(static_cast<char*>(a.recv) + jlo * es, static_cast<const char*>(slot(j).recv) + jlo * es,
                        (jhi - jlo) * es);
        }
        break;
      }
      case CollOp::broadcast: {
        const void* src = slot(a.root).send;
        if (src != a.recv && cnt) std::memcpy(a.recv, src, cnt * es);
        break;
      }
      case CollOp::all_to_all:  // (do_all_to_all) block r of every member's send buffer, read in place
        for (int k = 1; k <= n && cnt; ++k) {  // start after self: spreads the readers over the sources
          const int j = (r + k) % n;
          std::memcpy(static_cast<char*>(a.recv) + static_cast<size_t>(j) * cnt * es,
                      static_cast<const char*>(slot(j).send) + static_cast<size_t>(r) * cnt * es, cnt * es);
        }
        break;
      case CollOp::reduce: {  // every rank reduces one segment of the root's result
        const size_t lo = seg_lo(cnt, n, r), hi = seg_lo(cnt, n, r + 1);
        srcs_.resize(static_cast<size_t>(n));
        for (int j = 0; j < n; ++j) srcs_[static_cast<size_t>(j)] = static_cast<const char*>(slot(j).send) + lo * es;
        reduce_into(a.dtype, a.redop, static_cast<char*>(slot(a.root).recv) + lo * es, srcs_.data(), n, hi - lo);
        break;
      }
      default: fail(fmt::format("emulator: {} is not a collective", to_string(a.op)));
    }
  }

  // ---- send/recv
  void post_p2p(bool is_send, const void* sbuf, void* rbuf, size_t count, DataType t, int peer, Stream s,
                loc_t loc) {
    if (depth_ == 0) check_no_open_group(loc);
    const Access acc{is_send ? sbuf : rbuf, static_cast<int64_t>(count * dtype_size(t)), !is_send};
    dev_.before_comm(s, is_send ? "send" : "recv", {&acc, 1}, loc);
    if (send_seq_.empty()) send_seq_.assign(static_cast<size_t>(size()), 0), recv_seq_.assign(static_cast<size_t>(size()), 0);
    P2POp op;
    op.is_send = is_send;
    op.owner = me_.rank;
    op.crank = crank_;
    op.peer = peer;
    op.sbuf = sbuf;
    op.rbuf = rbuf;
    uint64_t& seq = (is_send ? send_seq_ : recv_seq_)[static_cast<size_t>(peer)];
    op.desc = CallDesc{is_send ? CollOp::send : CollOp::recv, count, t, ReduceOp::sum, peer, seq++, loc.file_name(),
                       loc.line()};
    pending_.push_back(op);
    streams_.push_back(s);
    if (depth_ == 0) run_p2p();
  }

  // Issues the pending send/recv group: post each op, matching it against the peer's queue (in order per
  // sender->receiver pair); the rank that completes a match copies; then wait until all own ops are done.
  void run_p2p() {
    if (pending_.empty()) return;
    // The group's ops move to ops_ (addresses stay fixed from here on: no more growth); both vectors keep their
    // capacity for the next group.
    ops_.swap(pending_);
    ops_streams_.swap(streams_);
    pending_.clear();
    streams_.clear();
    std::vector<P2POp>& ops = ops_;
    const std::vector<Stream>& streams = ops_streams_;
    Group& g = *g_;
    std::unique_lock lk(w_.mu);
    me_.last_desc = ops.front().desc;
    me_.last_p2p_count = ops.size();
    if (me_.last_group != g_) me_.last_group = g_;
    if (g.aborted) throw Error(g.abort_reason);
    ++w_.progress;
    me_.p2p_ops.clear();
    for (auto& op : ops) me_.p2p_ops.push_back(&op);
    me_.p2p_outstanding = static_cast<int>(ops.size());
    lk.unlock();

    auto& to_copy = to_copy_;  // (send, recv) pairs this rank matched: it copies them
    to_copy.clear();
    std::optional<std::string> mismatch;
    int other_failed = -1;
    {
      std::lock_guard pl(g.p2p_mu);
      for (auto& op : ops) {
        const int src = op.is_send ? crank_ : op.peer, dst = op.is_send ? op.peer : crank_;
        auto& q = g.pair(src, dst);
        auto& other = op.is_send ? q.recvs : q.sends;
        if (other.empty()) {
          (op.is_send ? q.sends : q.recvs).push(&op);
          continue;
        }
        P2POp* o = other.pop();
        P2POp* sop = op.is_send ? &op : o;
        P2POp* rop = op.is_send ? o : &op;
        if (sop->desc.count != rop->desc.count || sop->desc.dtype != rop->desc.dtype) {
          mismatch = fmt::format(
              "send/recv mismatch on {}: send #{} from rank {} to rank {} and the matching recv disagree on {}. "
              "Calls:\n  rank {} (world rank {}): {}\n  rank {} (world rank {}): {}",
              g.label(), sop->desc.seq, src, dst,
              sop->desc.count != rop->desc.count ? (sop->desc.dtype != rop->desc.dtype ? "count, dtype" : "count")
                                                 : "dtype",
              src, g.members[static_cast<size_t>(src)], describe(sop->desc), dst,
              g.members[static_cast<size_t>(dst)], describe(rop->desc));
          if (o->owner != me_.rank) other_failed = o->owner;
          break;
        }
        sop->matched = rop->matched = true;
        to_copy.push_back({sop, rop});
      }
    }
    const bool nodata = dev_.options().shapes_only;
    for (auto& [sop, rop] : to_copy)
      if (sop->desc.count && !nodata) std::memcpy(rop->rbuf, sop->sbuf, sop->desc.count * dtype_size(sop->desc.dtype));
    lk.lock();
    auto& notify = notify_;
    notify.clear();
    for (auto& [sop, rop] : to_copy) {
      for (P2POp* o : {sop, rop}) {
        o->done = true;
        auto& owner = *w_.ranks[static_cast<size_t>(o->owner)];
        if ((--owner.p2p_outstanding == 0 || owner.draining) && o->owner != me_.rank) {
          w_.mark_woken(owner);
          notify.push_back(&owner);
        }
      }
    }
    ++w_.progress;
    if (mismatch) {
      if (other_failed >= 0) w_.fail_rank(*w_.ranks[static_cast<size_t>(other_failed)], *mismatch);
      if (!g.aborted) {
        g.aborted = true;
        g.abort_reason = fmt::format("{} was aborted by an earlier failure:\n{}", g.label(), *mismatch);
      }
      for (RankState* r : notify) w_.wake_word(r->wake, 1);
      retire_ops(g, ops, lk);
      throw Error(*mismatch);
    }
    if (me_.p2p_outstanding > 0) {
      me_.waiting_group = &g;
      me_.pending_p2p = true;
      lk.unlock();
      for (RankState* r : notify) w_.wake_word(r->wake, 1);
      lk.lock();
      try {
        w_.block_until(me_, lk, [&] { return me_.p2p_outstanding == 0; });
      } catch (...) {
        retire_ops(g, ops, lk);
        throw;
      }
    }
    me_.p2p_ops.clear();
    lk.unlock();
    for (RankState* r : notify) w_.wake_word(r->wake, 1);  // (harmless if already woken above)
    if (in_helper()) return;  // all_to_all(v): one trace entry, from on_helper_done
    for (size_t i = 0; i < ops.size(); ++i) {
      const auto& d = ops[i].desc;
      trace_comm(dev_, streams[i], ops[i].is_send ? TraceEntry::Kind::send : TraceEntry::Kind::recv, g, d,
                 static_cast<int64_t>(d.count * dtype_size(d.dtype)), ops[i].is_send || nodata ? nullptr : ops[i].rbuf,
                 ops[i].is_send ? 0 : d.count * dtype_size(d.dtype));
    }
  }

  // After a failure (lk holds the world mutex): take the unmatched ops out of the queues first (then nobody can
  // match them any more), then wait for copies other ranks are still doing on the matched ones (bounded:
  // copies never block), since this rank's buffers and op records go away.
  void retire_ops(Group& g, std::vector<P2POp>& ops, std::unique_lock<std::mutex>& lk) {
    {
      std::lock_guard pl(g.p2p_mu);  // lock order: world mutex, then p2p_mu (posting never holds both)
      for (auto& op : ops) {
        if (op.matched) continue;
        const int src = op.is_send ? crank_ : op.peer, dst = op.is_send ? op.peer : crank_;
        auto& q = g.pair(src, dst);
        (op.is_send ? q.sends : q.recvs).remove(&op);
      }
    }
    auto in_flight = [&] {
      for (auto& op : ops)
        if (op.matched && !op.done) return true;  // `matched` was set before this rank took p2p_mu above
      return false;
    };
    me_.draining = true;
    while (in_flight()) {
      const uint32_t t = me_.wake.load(std::memory_order_acquire);
      lk.unlock();
      w_.wait_word(me_.wake, t);
      lk.lock();
    }
    me_.draining = false;
    me_.p2p_ops.clear();
    me_.p2p_outstanding = 0;
    me_.waiting_group = nullptr;
  }

  World& w_;
  RankState& me_;
  EmuDevice& dev_;
  std::shared_ptr<Group> g_;
  int crank_;
  uint64_t seq_ = 0;
  uint64_t helper_seq_ = 0;  // all_to_all(v) calls (trace sequence numbers)
  int depth_ = 0;
  std::vector<const void*> srcs_;
  std::vector<P2POp> pending_;
  std::vector<Stream> streams_;
  // run_p2p's working vectors (members so that their capacity is reused: an EP all_to_allv posts 2 x ep ops)
  std::vector<P2POp> ops_;
  std::vector<Stream> ops_streams_;
  std::vector<std::pair<P2POp*, P2POp*>> to_copy_;
  std::vector<RankState*> notify_;
  std::vector<uint64_t> send_seq_, recv_seq_;  // per peer
};

// ------------------------------------------------------------------------------------------------------------
// RankContext, spawn.

RankContext::RankContext(World& w, RankState& r) : w_(w), r_(r) {
  DeviceOptions o = w.opts.device;
  o.record_trace = w.opts.record_trace;
  auto dev = std::make_unique<EmuDevice>(r.rank, r.trace, o, w.pools.of(r.rank));
  auto* d = dev.get();
  dev_ = std::move(dev);
  world_ = std::make_unique<EmuComm>(w, r, *d, w.world_group, r.rank);
}
RankContext::~RankContext() = default;
int RankContext::rank() const { return r_.rank; }
int RankContext::world_size() const { return w_.size(); }
Communicator& RankContext::world() { return *world_; }
Device& RankContext::device() { return *dev_; }

CommStats RankContext::stats() const {
  std::lock_guard lk(r_.stats_mu);
  CommStats s = r_.retired;
  for (const Communicator* c : r_.live_comms) accumulate_stats(s, *c);
  return s;
}
const RankTrace& RankContext::trace() const { return r_.trace; }

CommStats SpawnResult::total() const {
  CommStats t;
  for (const auto& r : ranks)
    for (const auto& [name, table] : r.stats) add_stats(t[name], table);
  return t;
}

RankError::RankError(int r, std::string orig, int nfailed)
    : Error(fmt::format("{}{}{}", orig.starts_with(fmt::format("rank {}: ", r)) ? "" : fmt::format("rank {}: ", r), orig,
                        nfailed > 1 ? fmt::format(" [{} ranks failed in total]", nfailed) : std::string())),
      rank(r),
      original(std::move(orig)),
      failed_ranks(nfailed) {}

namespace {

struct ThreadArg {
  World* w;
  RankState* r;
  const std::function<void(RankContext&)>* fn;
};

// Made before any rank runs: reporting them allocates nothing.
const std::string kOutOfMemory = "out of memory (std::bad_alloc) in the rank's host code";
const std::string kUnknownException = "unknown exception (not derived from std::exception)";

// The rank's thread (RankExec::threads); fibers find theirs through the scheduler's current argument.
thread_local RankState* t_rank = nullptr;

void run_rank(void* p) noexcept {
  auto* a = static_cast<ThreadArg*>(p);
  World& w = *a->w;
  RankState& r = *a->r;
  try {
    RankContext ctx(w, r);
    (*a->fn)(ctx);
    static_cast<EmuDevice&>(ctx.device()).finish();  // queued work runs; a hazard found in a free() is raised
    if (const std::string open = r.open_group_error(nullptr); !open.empty())
      fail(fmt::format("the rank returned while {}: its send/recv were never issued", open));
  } catch (const std::bad_alloc&) {
    w.on_rank_failed(r.rank, kOutOfMemory);
  } catch (const std::exception& e) {
    try {
      w.on_rank_failed(r.rank, e.what());
    } catch (...) {  // no memory for a copy of the message
      w.on_rank_failed(r.rank, kOutOfMemory);
    }
  } catch (...) {
    w.on_rank_failed(r.rank, kUnknownException);
  }
  w.on_rank_finished(r);
}

void* rank_thread_main(void* p) {
  t_rank = static_cast<ThreadArg*>(p)->r;
  run_rank(p);
  t_rank = nullptr;
  return nullptr;
}

// Ranks i..n-1 could not start: they count as failed right away, so the started ones get aborted, not hung.
void fail_unstarted(World& w, int i, int n, const std::string& why) {
  for (int k = i; k < n; ++k) {
    w.on_rank_failed(k, why);
    w.on_rank_finished(*w.ranks[static_cast<size_t>(k)]);
  }
}

void run_threads(World& w, std::vector<ThreadArg>& args, const SpawnOptions& opts) {
  const int world_size = w.size();
  std::vector<pthread_t> threads;
  threads.reserve(static_cast<size_t>(world_size));
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  const size_t stack = std::max<size_t>(opts.stack_bytes, 64 * 1024);
  pthread_attr_setstacksize(&attr, stack);
  for (int i = 0; i < world_size; ++i) {
    pthread_t t;
    const int rc = pthread_create(&t, &attr, rank_thread_main, &args[static_cast<size_t>(i)]);
    if (rc != 0) {
      fail_unstarted(w, i, world_size,
                     fmt::format("spawn: could not start rank thread {} of {} (pthread_create error {})", i,
                                 world_size, rc));
      break;
    }
    threads.push_back(t);
  }
  pthread_attr_destroy(&attr);
  for (pthread_t t : threads) pthread_join(t, nullptr);
}

void run_fibers(World& w, std::vector<ThreadArg>& args, const SpawnOptions& opts) {
  const int world_size = w.size();
  int workers = opts.workers;
  if (workers <= 0) workers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  workers = std::min(workers, world_size);
  w.sched = std::make_unique<fiber::Scheduler>(workers, static_cast<size_t>(world_size));
  w.pools.make(workers);  // rank i: worker i % workers
  const size_t stack = std::max<size_t>(opts.stack_bytes, 64 * 1024);
  for (int i = 0; i < world_size; ++i) {
    const std::string err = w.sched->add(i % workers, stack, run_rank, &args[static_cast<size_t>(i)]);
    if (!err.empty()) {
      fail_unstarted(w, i, world_size, fmt::format("spawn: could not start rank fiber {} of {} ({})", i, world_size, err));
      break;
    }
  }
  w.sched->run();  // throws only if no worker thread started (then no rank ran)
}

}  // namespace

void** rank_local_slot() {
  if (t_rank) return &t_rank->local_slot;
  if (void* a = fiber::Scheduler::current_arg()) return &static_cast<ThreadArg*>(a)->r->local_slot;
  return nullptr;
}

SpawnResult spawn(int world_size, const std::function<void(RankContext&)>& fn, const SpawnOptions& opts) {
  TD_CHECK(world_size >= 1, "spawn: world_size must be >= 1 (got {})", world_size);
  TD_CHECK(opts.watchdog.count() > 0, "spawn: watchdog must be positive (got {} ms)", opts.watchdog.count());
  TD_CHECK(opts.workers >= 0, "spawn: workers must be >= 0 (0: one per hardware thread; got {})", opts.workers);
  World w(world_size, opts);
  {
    std::vector<int> all(static_cast<size_t>(world_size));
    for (int i = 0; i < world_size; ++i) all[static_cast<size_t>(i)] = i;
    w.world_group = w.make_group("world", std::move(all));
  }
  std::vector<ThreadArg> args(static_cast<size_t>(world_size));
  for (int i = 0; i < world_size; ++i) args[static_cast<size_t>(i)] = {&w, w.ranks[static_cast<size_t>(i)].get(), &fn};
  std::thread watchdog([&w] { w.watchdog_loop(); });
  auto stop_watchdog = [&] {
    {
      std::lock_guard lk(w.mu);
      w.finished = true;
      w.watchdog_cv.notify_all();
    }
    watchdog.join();
  };
  try {
    if (opts.exec == RankExec::threads) run_threads(w, args, opts);
    else run_fibers(w, args, opts);
  } catch (...) {
    stop_watchdog();
    throw;
  }
  stop_watchdog();
  if (!w.failures.empty()) {
    const auto& f = w.failures.front();
    throw RankError(f.rank, f.msg, static_cast<int>(w.failures.size()));
  }
  SpawnResult res;
  res.ranks.resize(static_cast<size_t>(world_size));
  for (int i = 0; i < world_size; ++i) {
    auto& r = *w.ranks[static_cast<size_t>(i)];
    res.ranks[static_cast<size_t>(i)].stats = r.retired;
    res.ranks[static_cast<size_t>(i)].trace = std::move(r.trace);
  }
  return res;
}

}  // namespace trident::emu
