#include "emulator/fake_nccl.h"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "reference/check.h"

namespace trident::emu {
namespace {

using nccl::Result;
constexpr char kMagic[16] = "trident-fake-id";

struct FakeComm;

// What the calling rank thread has bound (FakeNcclScope).
struct Binding {
  RankContext* ctx = nullptr;
  std::vector<FakeComm*> comms;         // alive (not destroyed), owned here until destroy or scope end
  std::string next_name;                // set_next_comm_name
  std::optional<std::source_location> site;
  int group_depth = 0;
  std::vector<FakeComm*> grouped;       // communicators whose emulator group is open
  std::string init_error;               // last error of a failed init (no communicator to hold it)
};
// The calling rank's binding, in its rank-local slot: with RankExec::fibers several ranks share a worker thread and
// switch at blocking calls, so a thread_local would be another rank's after any collective. Outside a rank (no
// slot) a thread_local stands in.
void*& tl_slot() {
  if (void** slot = rank_local_slot()) return *slot;
  static thread_local void* outside = nullptr;
  return outside;
}
Binding* tl() { return static_cast<Binding*>(tl_slot()); }

struct FakeComm {
  Communicator* c = nullptr;                 // the emulated communicator (world: borrowed)
  std::unique_ptr<Communicator> owned;       // split results
  bool blocking = true;
  // Set by ncclCommAbort, which frees a real communicator: from then on every call on this handle is a use after
  // free (counted in g_unsafe and refused); the memory stays until the scope ends so that the fake itself never
  // reads freed memory.
  std::atomic<bool> aborted{false};
  std::atomic<int> in_call{0};               // calls on this handle in progress (an abort meanwhile is unsafe)
  std::atomic<int> fault{0};                 // FakeFault
  std::atomic<bool> pending{false};          // non-blocking: the last operation reports kInProgress once
  std::string last_error;
  bool group_open = false;
};

FakeComm* as_fake(nccl::Comm c) { return reinterpret_cast<FakeComm*>(c); }

// Process-wide counters (fake_nccl_stats).
std::atomic<int64_t> g_destroyed{0}, g_aborted{0}, g_unsafe{0};

// One call on a handle: counts it in progress; a handle already aborted (freed) is an unsafe use.
struct InCall {
  FakeComm* f;
  bool freed;
  explicit InCall(FakeComm* fc) : f(fc), freed(fc && fc->aborted.load()) {
    if (!f) return;
    f->in_call.fetch_add(1);
    if (freed) g_unsafe.fetch_add(1);
  }
  ~InCall() {
    if (f) f->in_call.fetch_sub(1);
  }
  InCall(const InCall&) = delete;
  InCall& operator=(const InCall&) = delete;
};

// The ids the fake has initialised communicators with: NCCL's bootstrap root serves one ncclCommInitRank per rank
// and id, so a second init of a rank with the same id is refused, as the real library cannot serve it.
std::mutex g_ids_mu;
std::map<uint64_t, std::set<int>> g_ids_used;
nccl::Comm as_handle(FakeComm* f) { return reinterpret_cast<nccl::Comm>(f); }

std::source_location take_site() {
  std::source_location s = tl() && tl()->site ? *tl()->site : std::source_location::current();
  if (tl()) tl()->site.reset();
  return s;
}

bool to_dtype(nccl::DType t, DataType* out) {
  switch (t) {
    case nccl::kFloat64: *out = DataType::f64; return true;
    case nccl::kFloat32: *out = DataType::f32; return true;
    case nccl::kBfloat16: *out = DataType::bf16; return true;
    case nccl::kInt32: *out = DataType::i32; return true;
    case nccl::kInt64: *out = DataType::i64; return true;
    case nccl::kUint8: *out = DataType::u8; return true;
    default: return false;
  }
}
bool to_op(nccl::RedOp op, ReduceOp* out) {
  switch (op) {
    case nccl::kSum: *out = ReduceOp::sum; return true;
    case nccl::kMax: *out = ReduceOp::max; return true;
    case nccl::kMin: *out = ReduceOp::min; return true;
    default: return false;
  }
}

// Runs one operation on the emulated communicator; an exception becomes kSystemError with its message kept.
template <class F>
Result run(nccl::Comm h, F&& body) {
  FakeComm* f = as_fake(h);
  if (!tl() || !f) return nccl::kInvalidUsage;
  InCall in(f);
  if (in.freed) return nccl::kInvalidUsage;  // a use after ncclCommAbort (counted)
  if (f->fault.load() == static_cast<int>(FakeFault::error_during_call)) {
    // NCCL finds an error while the caller is inside this call: an abort that does not wait for the call frees
    // the communicator under it (counted by comm_abort).
    f->fault.store(static_cast<int>(FakeFault::async_error));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (f->fault.load() == static_cast<int>(FakeFault::stuck)) {
    f->pending.store(true);
    return f->blocking ? nccl::kSystemError : nccl::kInProgress;
  }
  try {
    body(*f);
  } catch (const std::exception& e) {
    f->last_error = e.what();
    return nccl::kSystemError;
  }
  if (!f->blocking) {
    f->pending.store(true);
    return nccl::kInProgress;
  }
  return nccl::kSuccess;
}

// Inside ncclGroupStart/End, the emulated communicator's own group is opened on first use.
void enter_group(FakeComm& f, const std::source_location& loc) {
  if (tl()->group_depth > 0 && !f.group_open) {
    f.c->group_start(loc);
    f.group_open = true;
    tl()->grouped.push_back(&f);
  }
}

Result get_unique_id(nccl::UniqueId* id) {
  static std::atomic<uint64_t> counter{0};
  std::memset(id->internal, 0, sizeof(id->internal));
  std::memcpy(id->internal, kMagic, sizeof(kMagic));
  const uint64_t n = ++counter;
  std::memcpy(id->internal + sizeof(kMagic), &n, sizeof(n));
  return nccl::kSuccess;
}

Result comm_init_rank(nccl::Comm* comm, int nranks, nccl::UniqueId id, int rank, int blocking) {
  if (!tl()) return nccl::kInvalidUsage;
  *comm = nullptr;
  if (std::memcmp(id.internal, kMagic, sizeof(kMagic)) != 0) {
    tl()->init_error = "the unique id was not made by the fake NCCL's ncclGetUniqueId";
    return nccl::kInvalidArgument;
  }
  RankContext& ctx = *tl()->ctx;
  if (nranks != ctx.world_size() || rank != ctx.rank()) {
    tl()->init_error = fmt::format("the fake NCCL initialises the whole emulated world only: rank {} of {} asked for "
                                 "rank {} of {}",
                                 ctx.rank(), ctx.world_size(), rank, nranks);
    return nccl::kInvalidArgument;
  }
  uint64_t serial = 0;
  std::memcpy(&serial, id.internal + sizeof(kMagic), sizeof(serial));
  {
    std::lock_guard lk(g_ids_mu);
    if (!g_ids_used[serial].insert(rank).second) {
      tl()->init_error = fmt::format("rank {} already initialised a communicator with this unique id (NCCL's "
                                     "bootstrap serves one ncclCommInitRank per rank and id: make a new id with "
                                     "ncclGetUniqueId)",
                                     rank);
      return nccl::kInvalidUsage;
    }
  }
  auto* f = new FakeComm;
  f->c = &ctx.world();
  f->blocking = blocking != 0;
  f->pending.store(!f->blocking);
  tl()->comms.push_back(f);
  *comm = as_handle(f);
  return f->blocking ? nccl::kSuccess : nccl::kInProgress;
}

Result comm_split(nccl::Comm h, int color, int key, nccl::Comm* out, int blocking) {
  *out = nullptr;
  std::string name = tl() && !tl()->next_name.empty() ? tl()->next_name : std::string("nccl-split");
  if (tl()) tl()->next_name.clear();
  FakeComm* made = nullptr;
  const Result r = run(h, [&](FakeComm& f) {
    std::unique_ptr<Communicator> c = f.c->split(color, key, name, take_site());
    if (!c) return;
    made = new FakeComm;
    made->owned = std::move(c);
    made->c = made->owned.get();
    made->blocking = blocking != 0;
    made->pending.store(!made->blocking);
    tl()->comms.push_back(made);
  });
  if (made) *out = as_handle(made);
  // a non-blocking split settles on the child; with no child (no color) there is nothing to poll
  if (r == nccl::kInProgress) {
    as_fake(h)->pending.store(false);
    return made ? nccl::kInProgress : nccl::kSuccess;
  }
  return r;
}

void forget(FakeComm* f) {
  if (!tl()) return;
  std::erase(tl()->comms, f);
  std::erase(tl()->grouped, f);
}

Result comm_finalize(nccl::Comm h) {
  FakeComm* f = as_fake(h);
  if (!f) return nccl::kInvalidArgument;
  InCall in(f);
  if (in.freed) return nccl::kInvalidUsage;
  if (!f->blocking) {
    f->pending.store(true);
    return nccl::kInProgress;
  }
  return nccl::kSuccess;
}
Result comm_destroy(nccl::Comm h) {
  FakeComm* f = as_fake(h);
  if (!f) return nccl::kInvalidArgument;
  {
    InCall in(f);
    if (in.freed) return nccl::kInvalidUsage;
  }
  forget(f);
  delete f;
  g_destroyed.fetch_add(1);
  return nccl::kSuccess;
}
// Thread-safe (the watchdog calls it). The real ncclCommAbort frees the communicator: here the handle is marked
// dead (every later call on it is an unsafe use, counted) and its memory is kept until the scope ends. An abort
// while another call on the handle is in progress, or a second abort, is an unsafe use too.
Result comm_abort(nccl::Comm h) {
  FakeComm* f = as_fake(h);
  if (!f) return nccl::kInvalidArgument;
  if (f->aborted.exchange(true) || f->in_call.load() > 0) g_unsafe.fetch_add(1);
  g_aborted.fetch_add(1);
  return nccl::kSuccess;
}
// Thread-safe: reads atomics only.
Result comm_get_async_error(nccl::Comm h, Result* st) {
  FakeComm* f = as_fake(h);
  if (!f) return nccl::kInvalidArgument;
  InCall in(f);
  if (in.freed) return nccl::kInvalidUsage;
  if (f->fault.load() == static_cast<int>(FakeFault::async_error)) {
    *st = nccl::kRemoteError;
    return nccl::kSuccess;
  }
  if (f->fault.load() == static_cast<int>(FakeFault::stuck) && f->pending.load()) {
    *st = nccl::kInProgress;
    return nccl::kSuccess;
  }
  *st = f->pending.exchange(false) ? nccl::kInProgress : nccl::kSuccess;
  return nccl::kSuccess;
}
Result comm_count(nccl::Comm h, int* n) {
  FakeComm* f = as_fake(h);
  if (!f) return nccl::kInvalidArgument;
  InCall in(f);
  if (in.freed) return nccl::kInvalidUsage;
  *n = f->c->size();
  return nccl::kSuccess;
}
Result comm_user_rank(nccl::Comm h, int* r) {
  FakeComm* f = as_fake(h);
  if (!f) return nccl::kInvalidArgument;
  InCall in(f);
  if (in.freed) return nccl::kInvalidUsage;
  *r = f->c->rank();
  return nccl::kSuccess;
}
const char* get_error_string(Result r) {
  switch (r) {
    case nccl::kSuccess: return "no error";
    case nccl::kSystemError: return "system error (the emulator reported a failure)";
    case nccl::kInvalidArgument: return "invalid argument";
    case nccl::kInvalidUsage: return "invalid usage";
    case nccl::kRemoteError: return "remote process exited or there was a network error";
    case nccl::kInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}
const char* get_last_error(nccl::Comm h) {
  if (FakeComm* f = as_fake(h)) {
    InCall in(f);
    if (in.freed) return "the communicator was freed by ncclCommAbort";
    return f->last_error.c_str();
  }
  return tl() ? tl()->init_error.c_str() : "";
}

Result bad_type(nccl::Comm h, int t) {
  if (FakeComm* f = as_fake(h)) f->last_error = fmt::format("the fake NCCL does not implement data type {}", t);
  return nccl::kInvalidArgument;
}

Result all_gather(const void* s, void* r, size_t n, nccl::DType t, nccl::Comm h, nccl::StreamHandle st) {
  DataType dt;
  if (!to_dtype(t, &dt)) return bad_type(h, t);
  return run(h, [&](FakeComm& f) { f.c->all_gather(s, r, n, dt, stream_from_native(st), take_site()); });
}
Result reduce_scatter(const void* s, void* r, size_t n, nccl::DType t, nccl::RedOp op, nccl::Comm h,
                      nccl::StreamHandle st) {
  DataType dt;
  ReduceOp o;
  if (!to_dtype(t, &dt) || !to_op(op, &o)) return bad_type(h, t);
  return run(h, [&](FakeComm& f) { f.c->reduce_scatter(s, r, n, dt, o, stream_from_native(st), take_site()); });
}
Result all_reduce(const void* s, void* r, size_t n, nccl::DType t, nccl::RedOp op, nccl::Comm h,
                  nccl::StreamHandle st) {
  DataType dt;
  ReduceOp o;
  if (!to_dtype(t, &dt) || !to_op(op, &o)) return bad_type(h, t);
  return run(h, [&](FakeComm& f) { f.c->all_reduce(s, r, n, dt, o, stream_from_native(st), take_site()); });
}
Result broadcast(const void* s, void* r, size_t n, nccl::DType t, int root, nccl::Comm h, nccl::StreamHandle st) {
  DataType dt;
  if (!to_dtype(t, &dt)) return bad_type(h, t);
  return run(h, [&](FakeComm& f) { f.c->broadcast(s, r, n, dt, root, stream_from_native(st), take_site()); });
}
Result reduce(const void* s, void* r, size_t n, nccl::DType t, nccl::RedOp op, int root, nccl::Comm h,
              nccl::StreamHandle st) {
  DataType dt;
  ReduceOp o;
  if (!to_dtype(t, &dt) || !to_op(op, &o)) return bad_type(h, t);
  return run(h, [&](FakeComm& f) { f.c->reduce(s, r, n, dt, o, root, stream_from_native(st), take_site()); });
}
Result send(const void* b, size_t n, nccl::DType t, int peer, nccl::Comm h, nccl::StreamHandle st) {
  DataType dt;
  if (!to_dtype(t, &dt)) return bad_type(h, t);
  return run(h, [&](FakeComm& f) {
    const std::source_location loc = take_site();
    enter_group(f, loc);
    f.c->send(b, n, dt, peer, stream_from_native(st), loc);
  });
}
Result recv(void* b, size_t n, nccl::DType t, int peer, nccl::Comm h, nccl::StreamHandle st) {
  DataType dt;
  if (!to_dtype(t, &dt)) return bad_type(h, t);
  return run(h, [&](FakeComm& f) {
    const std::source_location loc = take_site();
    enter_group(f, loc);
    f.c->recv(b, n, dt, peer, stream_from_native(st), loc);
  });
}
Result group_start() {
  if (!tl()) return nccl::kInvalidUsage;
  ++tl()->group_depth;
  tl()->site.reset();
  return nccl::kSuccess;
}
// Closes the emulated groups opened since the outermost ncclGroupStart; the first failure is returned (on the
// communicator that failed, with its report).
Result group_end() {
  if (!tl() || tl()->group_depth == 0) return nccl::kInvalidUsage;
  if (--tl()->group_depth > 0) return nccl::kSuccess;
  const std::source_location loc = take_site();
  std::vector<FakeComm*> open;
  open.swap(tl()->grouped);
  Result first = nccl::kSuccess;
  bool any_nonblocking = false;
  for (FakeComm* f : open) {
    f->group_open = false;
    if (first != nccl::kSuccess) continue;
    try {
      f->c->group_end(loc);
    } catch (const std::exception& e) {
      f->last_error = e.what();
      first = nccl::kSystemError;
    }
    if (!f->blocking) any_nonblocking = true;
  }
  if (first != nccl::kSuccess) return first;
  return any_nonblocking ? nccl::kInProgress : nccl::kSuccess;
}
void set_next_comm_name(const char* name) {
  if (tl()) tl()->next_name = name ? name : "";
}
void set_call_site(const std::source_location* loc) {
  if (tl() && loc) tl()->site = *loc;
}

nccl::Api make_api() {
  nccl::Api a;
  a.name = "fake nccl (emulator)";
  a.version = 22809;
  a.get_unique_id = get_unique_id;
  a.comm_init_rank = comm_init_rank;
  a.comm_split = comm_split;
  a.comm_finalize = comm_finalize;
  a.comm_destroy = comm_destroy;
  a.comm_abort = comm_abort;
  a.comm_get_async_error = comm_get_async_error;
  a.comm_count = comm_count;
  a.comm_user_rank = comm_user_rank;
  a.get_error_string = get_error_string;
  a.get_last_error = get_last_error;
  a.all_gather = all_gather;
  a.reduce_scatter = reduce_scatter;
  a.all_reduce = all_reduce;
  a.broadcast = broadcast;
  a.reduce = reduce;
  a.send = send;
  a.recv = recv;
  a.group_start = group_start;
  a.group_end = group_end;
  a.set_next_comm_name = set_next_comm_name;
  a.set_call_site = set_call_site;
  return a;
}

}  // namespace

const nccl::Api& fake_nccl() {
  static const nccl::Api api = make_api();
  return api;
}

FakeNcclScope::FakeNcclScope(RankContext& ctx) {
  TD_CHECK(tl() == nullptr, "FakeNcclScope: this rank is already bound (to rank {})", tl() ? tl()->ctx->rank() : -1);
  tl_slot() = new Binding;
  tl()->ctx = &ctx;
}
FakeNcclScope::~FakeNcclScope() {
  // Communicators still here were aborted (or leaked by their owner): free them, newest first (splits before
  // their parents).
  for (auto it = tl()->comms.rbegin(); it != tl()->comms.rend(); ++it) delete *it;
  delete tl();
  tl_slot() = nullptr;
}

FakeNcclStats fake_nccl_stats() { return {g_destroyed.load(), g_aborted.load(), g_unsafe.load()}; }

void fake_nccl_inject(nccl::Comm comm, FakeFault f) {
  TD_CHECK(comm != nullptr, "fake_nccl_inject: null communicator");
  as_fake(comm)->fault.store(static_cast<int>(f));
}

std::unique_ptr<NcclCommunicator> FakeNcclWorld::world(RankContext& ctx) {
  const nccl::Api& api = fake_nccl();
  // The first rank here makes the unique id and the others take it. No rank waits for another (a rank waiting
  // for rank 0 outside the communicator would hold its worker thread, and rank 0 may be a fiber behind it).
  nccl::UniqueId id;
  {
    std::lock_guard lk(id_mu_);
    if (!id_) {
      nccl::UniqueId u;
      const Result r = api.get_unique_id(&u);
      TD_CHECK(r == nccl::kSuccess, "fake ncclGetUniqueId failed: {}", nccl::to_string(r));
      id_ = u;
    }
    id = *id_;
  }
  return NcclCommunicator::init(api, id, ctx.world_size(), ctx.rank(), ctx.device(), "world", opts_);
}

}  // namespace trident::emu
