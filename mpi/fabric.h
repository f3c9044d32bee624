// The MPI transport under MpiCommunicator (docs/mpi.md): byte messages between emulated ranks that live in one or
// several MPI processes.
//
// Layout: process p of P hosts the k = ranks_per_process consecutive global ranks [p*k, p*k + k), run by
// run_ranks() as user-space fibers on a few worker threads (emulator/fiber.h, as the emulator runs its ranks).
// A message is (context, source rank, destination rank, signature, bytes). Messages to a rank of the same process
// go straight into its mailbox (memory); messages to another process are queued to this process's progress thread,
// which alone calls MPI (MPI_THREAD_SERIALIZED is enough): a message is cut in chunks of at most chunk_bytes
// (counts above INT_MAX split) appended to a bundle for its destination process, and every bundle queued since the
// last pass goes out as one MPI message (MPI_Isend); arrivals are received with MPI_Improbe/MPI_Imrecv, split,
// reassembled and delivered to the destination's mailbox (a message whole in one chunk as a view of the bundle). Mailboxes are FIFO per (context, source): with every rank issuing its calls on one
// communicator in the same order, that is the matching rule (as MPI's non-overtaking rule).
//
// Sends are buffered (the bytes are copied when posted), receives wait: a rank fiber parks on its mailbox's word
// (no system call; its worker runs the next rank) until a message for what it waits for is delivered; a rank on
// an ordinary thread sleeps on the same word (platform/wait.h). Nothing waits without a deadline:
//  - the progress thread sends a heartbeat to every other process every heartbeat_s and fails the run when a
//    process was silent for peer_timeout_s (it died, was stopped or is unreachable): every waiting rank throws an
//    error naming the silent process's ranks;
//  - a process that fails (a rank's error, a silent process, an MPI error) sends its error once to every other
//    process, which fail at once with it (so one detection is enough, whatever the others saw);
//  - a rank waiting longer than wait_timeout_s for one message fails naming what it waited for (the progress
//    thread looks at the waiting ranks every heartbeat and wakes the ones past the limit).
// Every arriving message is checked before use (mpi/wire.h): a malformed one fails the run naming its process.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include "emulator/block_pool.h"
#include "mpi/wire.h"

namespace trident::emu::fiber {
class Scheduler;
}

namespace trident::mpi {

class Fabric;

// Memory for the buffers of messages between processes (bundles, arrivals). From 64 KiB up to 4 MiB a buffer is a
// block of a process-wide pool: 4 MiB mappings (mmap) reused from one message to the next, so the large,
// short-lived buffers of a step neither fragment malloc's heaps (whose peak would then grow past what is live) nor
// pay a page fault per page and an unmap per message; a block's pages are touched only as bytes are written, and
// idle blocks beyond a few are unmapped. Larger buffers are mappings of their own. resize() leaves new bytes
// uninitialised (MPI or a copy fills them).
constexpr size_t kWirePagesFrom = size_t{64} << 10;
constexpr size_t kWireBlock = size_t{4} << 20;
void* wire_pages(size_t bytes);  // throws std::bad_alloc when nothing can be mapped
void free_wire_pages(void* p, size_t bytes) noexcept;
void trim_wire_pages() noexcept;  // unmaps every idle block (the end of a run)
template <class T>
struct WireAlloc {
  using value_type = T;
  WireAlloc() = default;
  template <class U>
  WireAlloc(const WireAlloc<U>&) noexcept {}  // NOLINT: rebinding
  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes >= kWirePagesFrom) return static_cast<T*>(wire_pages(bytes));
    return std::allocator<T>().allocate(n);
  }
  void deallocate(T* p, size_t n) noexcept {
    const size_t bytes = n * sizeof(T);
    if (bytes >= kWirePagesFrom) free_wire_pages(p, bytes);
    else std::allocator<T>().deallocate(p, n);
  }
  template <class U>
  void construct(U* p) noexcept {}  // default-initialised: no zero fill
  template <class U, class... A>
  void construct(U* p, A&&... a) {
    ::new (static_cast<void*>(p)) U(std::forward<A>(a)...);
  }
  template <class U>
  bool operator==(const WireAlloc<U>&) const noexcept { return true; }
};
using WireBytes = std::vector<char, WireAlloc<char>>;

// What a waiting rank waits for, in words: formatted only when an error names it (a receive does not pay for the
// text). From a string literal, or from a callable returning std::string that outlives the call.
class Describe {
 public:
  Describe(const char* text) : text_(text) {}  // NOLINT: implicit on purpose
  template <class F>
    requires std::is_invocable_r_v<std::string, const F&>
  Describe(const F& f)  // NOLINT: implicit on purpose
      : obj_(&f), call_([](const void* o) { return std::string((*static_cast<const F*>(o))()); }) {}
  std::string operator()() const { return call_ ? call_(obj_) : std::string(text_); }

 private:
  const char* text_ = "";
  const void* obj_ = nullptr;
  std::string (*call_)(const void*) = nullptr;
};

// A message taken from a mailbox: the sender's signature and bytes, valid while this lives. The bytes are this
// process's copy (a message from another process, or one posted with post()) or, for a message a rank of this
// process posted with post_ref(), the sender's own buffer: releasing it (the destructor) tells the sender, which
// keeps the buffer until every such message of it was released (Fabric::wait_refs).
class Received {
 public:
  Received() = default;
  Received(Received&& o) noexcept { *this = std::move(o); }
  Received& operator=(Received&& o) noexcept;
  ~Received() { release(); }
  Received(const Received&) = delete;
  Received& operator=(const Received&) = delete;
  uint32_t sig = 0;
  const char* data() const { return ptr_; }
  size_t size() const { return size_; }

 private:
  friend class Fabric;
  void release();
  Fabric* f_ = nullptr;
  const char* ptr_ = nullptr;
  size_t size_ = 0;
  std::shared_ptr<const void> keep_;  // the bytes' buffer (a copy, or the bundle that carried them)
  void* owner_ = nullptr;  // the sending rank's mailbox (a post_ref message), else null
};

// How run_ranks executes this process's ranks.
struct RankExecOptions {
  bool fibers = true;            // false: one OS thread per rank
  int workers = 0;               // fiber worker threads; 0: this machine's hardware threads / the processes on it
  size_t stack_bytes = 1 << 20;  // per rank
};

struct FabricOptions {
  int ranks_per_process = 1;
  double heartbeat_s = 0.5;       // heartbeat period
  double peer_timeout_s = 6.0;    // a process silent this long is reported dead
  double wait_timeout_s = 600.0;  // one receive waiting longer fails (a rank stuck in compute, a lost message)
  size_t chunk_bytes = 0;         // largest MPI message payload; 0: INT_MAX - 64 (tests use small values)
  // Exact sums through the i64 lowering (parallel/exact_lowering.h) even where every process holds the
  // accumulators in the same format (then they are merged natively, as the emulator merges them).
  bool lower_exact_sum = false;
};

// The MPI side of this process. MPI must be initialised (MpiSession) before and finalised after.
class Fabric {
 public:
  explicit Fabric(const FabricOptions& opt);
  ~Fabric();  // stops the progress thread (no MPI calls from other threads afterwards)
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;

  const FabricOptions& options() const { return opt_; }
  int process() const { return proc_; }
  int processes() const { return nproc_; }
  int ranks_per_process() const { return k_; }
  int world() const { return nproc_ * k_; }
  int first_rank() const { return proc_ * k_; }
  int process_of(int g) const { return g / k_; }
  std::string describe_process(int p) const;  // "process 3 (ranks 24..31)"
  // Processes of this job on this machine (MPI_COMM_TYPE_SHARED), for sizing the fiber workers.
  int local_processes() const { return local_procs_; }
  // True when exact sums are merged natively: not asked to lower them, and every process reported the same
  // accumulator format (ExactAcc<float> / <double>: size, limbs, digit bits, byte order) at startup.
  bool native_exact_sum() const { return native_exact_; }

  // Runs fn(g) for every rank g of this process and returns when all returned: as fibers on
  // opt.workers worker threads (rank first_rank() + i on worker i % workers), or one thread each. fn must not
  // throw (a rank catches its errors and calls fail()); a rank that cannot start fails the run.
  void run_ranks(const std::function<void(int g)>& fn, const RankExecOptions& opt = {});
  // Inside fn: where rank g's device memory comes from, as in the emulator's spawn: with fibers the pool of the worker
  // that runs it (emulator/block_pool.h; nullptr under AddressSanitizer), with threads nullptr (the host's allocator).
  emu::BlockPool* rank_pool(int g) const { return pools_.of(g - first_rank()); }

  // Posts `bytes` from src (a rank of this process) to dst; returns at once (the bytes are copied).
  void post(uint64_t ctx, int src, int dst, uint32_t sig, const void* data, size_t bytes);
  // As post, but a destination in this process reads the bytes from `data` itself (no copy): src must keep them
  // unchanged until wait_refs(src) returned. Other destinations get a copy, as with post.
  void post_ref(uint64_t ctx, int src, int dst, uint32_t sig, const void* data, size_t bytes);
  // Waits until every post_ref message of src was released by its receiver. Throws trident::Error when the run
  // failed (after the wait: no receiver reads src's buffers any more) or src waited longer than wait_timeout_s.
  void wait_refs(int src, const Describe& what);
  // The same wait without the error (a rank leaving a collective by an exception).
  void drain_refs(int src) noexcept;
  // The next message on (ctx, src) for dst (a rank of this process); throws trident::Error on failure/timeout.
  Received take(uint64_t ctx, int src, int dst, const Describe& what);

  // The queue of the messages (ctx, src) -> dst in the mailbox of dst (a rank of this process), looked up once: a
  // communicator keeps its peers' channels, so that sending to and taking from a rank of this process needs no
  // look-up per message. Valid while the fabric lives.
  struct Channel;
  Channel* channel(uint64_t ctx, int src, int dst);
  // post_ref and take on a channel (its dst a rank of this process, src the calling rank for post_ref).
  void post_ref(Channel* c, uint32_t sig, const void* data, size_t bytes);
  Received take(Channel* c, const Describe& what);

  // This process failed with `msg` (a rank threw): wakes every waiter here and tells the other processes.
  void fail(const std::string& msg);
  bool failed() const { return failed_.load(); }
  std::string failure() const;
  // Normal end: waits (with the liveness checks still running) until every process got here and every send
  // completed, then stops the progress thread. Throws on failure.
  void shutdown();
  // Error end: flushes this process's failure notice (at most ~1 s) and stops the progress thread.
  void stop_after_failure();

  // Messages (and their payload bytes) this process's ranks sent to ranks of other processes, over MPI.
  int64_t remote_messages() const { return remote_msgs_.load(); }
  int64_t remote_bytes() const { return remote_bytes_.load(); }
  // The MPI data messages (bundles) that carried them: the messages posted for one process between two passes of
  // the progress thread travel as one.
  int64_t mpi_messages() const { return mpi_msgs_.load(); }

  // Peak resident set of this process (VmHWM), bytes.
  static int64_t peak_rss();

 private:
  struct KeyHash {
    size_t operator()(const std::pair<uint64_t, int>& k) const {
      return static_cast<size_t>((k.first ^ (static_cast<uint64_t>(static_cast<uint32_t>(k.second)) << 1)) *
                                 0x9E3779B97F4A7C15ull);
    }
  };
  struct Item {  // a queued message (Received's fields); recycled through the destination's free list
    Item* next = nullptr;
    uint32_t sig = 0;
    const char* ptr = nullptr;
    size_t size = 0;
    std::shared_ptr<const void> keep;
    void* owner = nullptr;
  };

 public:
  struct Channel {  // public as a name only (declared above); its fields are the fabric's
    uint64_t ctx = 0;  // the key it was made for
    int src = -1, dst = -1;
    // The queue, oldest first: `slot` when full, then the list head..tail (items of the mailbox's free list). The
    // slot lives in the channel itself, so that queueing and taking the usual one message in flight touch no other
    // memory (a free-list item is cold by the time its rank runs again); it is filled only when the list is empty.
    bool slot_full = false;
    Item slot;
    Item* head = nullptr;
    Item* tail = nullptr;
  };

 private:
  using Queue = Channel;
  struct Mailbox {
    std::mutex m;
    Item* free_items = nullptr;
    std::atomic<int64_t> refs{0};  // this rank's post_ref messages not yet released
    // The rank sleeps on `word` (a fiber parks on it, a thread futex-waits on it); a wake bumps it under m.
    std::atomic<uint32_t> word{0};
    // FIFO per (context, source); emptied queues stay (a rank talks to the same peers every step).
    std::unordered_map<std::pair<uint64_t, int>, Queue, KeyHash> q;
    ~Mailbox();
    // What the rank waits for: deliver() wakes it only for that (a collective over n ranks would otherwise wake
    // its receivers n times). fiber: it sleeps as a fiber (wake through the scheduler); since: when it started.
    bool waiting = false;
    bool fiber = false;
    std::pair<uint64_t, int> want{};
    std::chrono::steady_clock::time_point since{};
  };
  friend class Received;
  Mailbox& box(int g) { return *boxes_[static_cast<size_t>(g - first_rank())]; }
  // Queues a message for dst (a rank of this process); after a failure it is dropped (and released) instead.
  void deliver(uint64_t ctx, int src, int dst, uint32_t sig, const char* ptr, size_t size,
               std::shared_ptr<const void> keep, void* owner);
  void deliver(Channel& q, uint32_t sig, const char* ptr, size_t size, std::shared_ptr<const void> keep,
               void* owner);
  Queue& queue_locked(Mailbox& b, uint64_t ctx, int src, int dst);
  static Item* front(Queue& q) { return q.slot_full ? &q.slot : q.head; }  // under b.m: the oldest, or nullptr
  static void pop(Mailbox& b, Queue& q);  // under b.m: removes front(q) (not null); a list item goes to b's free list
  bool push_locked(Mailbox& b, Queue& q, uint32_t sig, const char* ptr, size_t size, std::shared_ptr<const void>& keep,
                   void* owner);
  void release_ref(void* owner);  // a post_ref message of that mailbox's rank was released
  bool in_fiber() const;
  void await_refs(int src, const Describe* what);  // wait_refs (what: the timeout and its error) / drain_refs
  void sleep_on(Mailbox& b, bool fiber, uint32_t old);
  void wake_locked(Mailbox& b);  // under b.m: bumps the word, wakes the sleeper
  void wake_overdue();           // the progress thread: wakes ranks waiting past wait_timeout_s
  void progress_main();
  void set_failure(const std::string& msg, bool tell_others);

  FabricOptions opt_;
  int proc_ = 0, nproc_ = 1, k_ = 1, local_procs_ = 1;
  emu::WorkerPools pools_;  // while run_ranks runs fibers: one per worker
  bool native_exact_ = false;
  std::atomic<emu::fiber::Scheduler*> sched_{nullptr};  // while run_ranks runs fibers
  size_t chunk_ = 0;
  size_t bundle_cap_ = 0;  // a bundle grows to at most this (chunk_ + header, at most kWireBlock) unless one chunk
  MPI_Comm comm_ = MPI_COMM_NULL;  // a duplicate of MPI_COMM_WORLD: our messages only
  std::vector<std::unique_ptr<Mailbox>> boxes_;  // per local rank

  // Bundles to send, per destination process, in posting order (the last one still filling); the progress thread
  // takes them all on each pass. out_pending_: some bundle is queued (a post into an empty queue wakes the thread).
  std::mutex out_m_;
  std::condition_variable out_cv_;
  std::vector<std::vector<WireBytes>> out_;
  bool out_pending_ = false;

  std::atomic<int64_t> remote_msgs_{0}, remote_bytes_{0}, mpi_msgs_{0};
  std::atomic<bool> failed_{false};
  mutable std::mutex fail_m_;
  std::string failure_;
  bool tell_others_ = false;

  std::atomic<int> mode_{0};  // 0 running, 1 shutdown requested, 2 stop after failure
  std::atomic<bool> done_{false};
  std::string shutdown_error_;
  std::thread progress_;
};

}  // namespace trident::mpi
