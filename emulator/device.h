// The emulator's Device (parallel/device.h) of one rank: device memory is host memory it tracks (current and peak
// bytes), streams and events are records, and work runs on the rank's thread in one of two modes
// (docs/emulator.md "Device modes"):
//
//  - eager: every launch, copy and collective runs when it is issued (a legal serialisation of any correct
//    program: whatever the events order is already done). The default; fastest.
//  - deferred: work is queued per stream and runs only when something needs it (a collective on that stream, a
//    host synchronize or fetch, a wait chain), in an order drawn by a seeded scheduler among all orders the
//    streams and events allow. Fresh allocations are poisoned (0xFF bytes: NaN for floats). A program that is
//    correct only because of issue order gives different bits, and the hazard checker names the cause.
//
// The hazard checker (on in deferred mode, optional in eager mode) keeps a vector clock per stream and for the host
// (issue order within a stream, record/wait, synchronize) and, per allocation, the recent accesses with their
// clocks. Two accesses to overlapping bytes, at least one a write, by different streams (or a stream and the host)
// that no clock orders fail with both launches' names, streams and call sites. It is exact for the declared
// accesses, whatever order the scheduler picks.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "emulator/addr_map.h"
#include "emulator/block_pool.h"
#include "emulator/trace_hash.h"
#include "parallel/device.h"
#include "parallel/trace.h"

namespace trident::emu {

enum class DeviceMode : uint8_t { eager, deferred };

// Where a rank's device memory comes from. The default is the host's global allocator. `emulate --kernels
// cuda-ref|cuda-fast` gives CUDA managed memory (gpu/emu_cuda.h), which the host side of the emulator (collectives,
// copies, uploads) and the rank's GPU kernels can both read and write. allocate returns nullptr when it cannot
// (the device reports an out-of-memory error naming the rank, the size and the call site); release never throws.
struct MemorySource {
  const char* name = "host";
  void* (*allocate)(size_t bytes) = nullptr;
  void (*release)(void* p) = nullptr;
};

struct DeviceOptions {
  DeviceMode mode = DeviceMode::eager;
  uint64_t seed = 0;             // deferred: the scheduler's choices
  bool check_hazards = false;    // forced on in deferred mode
  bool strict_memory = false;    // a declared access outside device memory is an error (else not tracked)
  bool record_trace = true;
  // The hash of received bytes in the trace (TraceEntry::recv_hash, emulator/trace_hash.h): FNV-1a 64 (the value
  // the goldens store) or XXH64 (faster; for comparing two runs, as `trident fuzz` does).
  RecvHash recv_hash = RecvHash::fnv1a64;
  // Device memory of the rank, in bytes (0: no limit but the host's): an allocation past it fails like an
  // out-of-memory allocation (one error naming the rank, the size and the call site). A test hook for OOM handling.
  int64_t max_bytes = 0;
  // nullptr: host memory (::operator new). Must outlive every device that uses it.
  const MemorySource* memory = nullptr;
  // Shapes only (`emulate --shapes-only`, docs/emulator.md "Shapes-only runs"): allocations get unique addresses in
  // a reserved, never-mapped range of this rank (exact sizes, current and peak bytes as in a data run), launches,
  // copies and uploads are traced and checked but never run, and download() fails naming its call site
  // (Device::has_data). Eager mode only.
  bool shapes_only = false;
};

class EmuDevice final : public Device {
 public:
  // pool: where host device memory comes from (the rank's worker's pool, emulator/block_pool.h; nullptr: the host's
  // allocator). Not used with opt.memory or shapes_only. Must outlive the device.
  EmuDevice(int rank, RankTrace& trace, const DeviceOptions& opt, BlockPool* pool = nullptr);
  ~EmuDevice() override;

  Stream compute_stream() override { return Stream{0}; }
  Stream comm_stream() override { return Stream{1}; }
  Stream create_stream(std::string name) override;
  Event create_event() override;
  void record(Event e, Stream s, loc_t loc) override;
  void wait(Stream s, Event e, loc_t loc) override;
  void launch(Stream s, std::string_view name, const Accesses& acc, double flops, std::function<void()> fn,
              loc_t loc) override;
  void synchronize(Stream s, loc_t loc) override;
  void* allocate(int64_t bytes, Stream s, loc_t loc) override;
  void free(void* p, Stream s, loc_t loc) override;  // never throws (called from destructors); errors are raised later
  void copy(void* dst, const void* src, int64_t bytes, Stream s, loc_t loc) override;
  void memset(void* dst, int value, int64_t bytes, Stream s, loc_t loc) override;
  void copy_2d(void* dst, int64_t dpitch, const void* src, int64_t spitch, int64_t width, int64_t rows, Stream s,
               loc_t loc) override;
  void upload(void* dst, const void* src, int64_t bytes, Stream s, loc_t loc) override;
  void download(void* dst, const void* src, int64_t bytes, Stream s, loc_t loc) override;
  DeviceMemory memory() const override { return mem_; }
  bool immediate() const override { return !deferred_ && !checking_ && !opt_.record_trace && !opt_.shapes_only; }
  bool has_data() const override { return !opt_.shapes_only; }
  void download_known(void* dst, const void* src, int64_t bytes, Stream s, loc_t loc) override;

  // ---- for the emulated communicator
  void check_stream(Stream s, loc_t loc) const;
  // A communication call on s with these accesses is about to run on the host thread: checks them as an operation
  // of s, and (deferred) first runs everything issued to s before.
  void before_comm(Stream s, std::string_view name, std::span<const Access> acc, loc_t loc);
  // Appends a trace entry (stamped with the rank's issue order) when tracing.
  void push_trace(Stream s, TraceEntry&& t);
  bool tracing() const { return opt_.record_trace; }
  // Runs everything still queued (deferred) and raises a hazard recorded where no exception could be thrown.
  void finish(loc_t loc = loc_t::current());
  const DeviceOptions& options() const { return opt_; }

 private:
  using Clock = std::vector<int64_t>;  // index 0: host; stream s: s + 1
  struct Op {
    enum class Kind : uint8_t { run, wait } kind = Kind::run;
    std::function<void()> fn;
    int wait_stream = -1;  // wait: the stream and the count of its ops that must have run
    int64_t wait_count = 0;
  };
  struct StreamQ {
    std::deque<Op> q;
    int64_t issued = 0, done = 0;  // ops issued / run (deferred)
  };
  struct Rec {  // one access of an allocation's bytes [lo, hi)
    int64_t lo, hi;
    int agent;
    int64_t epoch;
    bool write;
    std::string name;
    const char* file;
    unsigned line;
  };
  struct Alloc {
    int64_t bytes = 0;
    std::vector<Rec> recs;
  };
  struct Ev {
    int stream = -1;
    int64_t count = 0;  // ops of `stream` issued before the record
    int64_t index = -1; // trace index of the record entry
    Clock clock;
  };

  void free_impl(void* p, Stream s, loc_t loc);
  // From opt_.memory (one call per allocation), the pool, or the host's allocator; nullptr when out of memory.
  void* raw_allocate(size_t n);
  void raw_release(void* p, int64_t bytes) noexcept;
  void issue(Stream s, Op&& op);  // eager: runs it now; deferred: queues it
  void run_until(int stream, int64_t count);
  bool runnable(int stream) const;
  void step_stream(int stream);
  // Checks and records the accesses of one operation of `agent` (a stream + 1, or 0 for the host) at its clock.
  void check(int agent, std::string_view name, std::span<const Access> acc, loc_t loc);
  Clock& clock(int agent);
  void merge(Clock& into, const Clock& from);
  void tick(int agent);
  std::string agent_name(int agent) const;
  void raise_pending();
  void check_event(Event e, loc_t loc) const;
  void trace_event(Stream s, TraceEntry::Kind kind, Event e, const Ev& ev, loc_t loc);
  void trace_memory(Stream s, TraceEntry::Kind kind, int64_t bytes, loc_t loc);  // alloc / free entries
  void trace_simple(Stream s, TraceEntry::Kind kind, std::string_view name, const Accesses& acc, double flops,
                    loc_t loc);

  int rank_;
  RankTrace& trace_;
  DeviceOptions opt_;
  bool deferred_;
  bool checking_;
  std::vector<StreamQ> streams_;
  std::vector<Ev> events_;
  std::vector<Clock> clocks_;  // per agent
  // Every live allocation's bytes, found by address in O(1) (emulator/addr_map.h): the step allocates and frees a
  // buffer per tensor and layer, and an ordered tree of a rank's allocations, cold in the cache after the other ranks
  // ran, cost more than the allocation itself. allocs_ (address-ordered, with the access records) is kept only while
  // checking.
  AddrMap sizes_;
  std::map<uintptr_t, Alloc> allocs_;
  std::map<void*, int64_t> unreleased_;  // freed, the free not run yet (deferred): bytes
  DeviceMemory mem_;
  std::mt19937_64 rng_;
  std::string pending_error_;  // a hazard found in free() (which cannot throw)
  int64_t issue_ = 0;
  uintptr_t next_addr_ = 0;  // shapes only: the next unused address of this rank's range
  BlockPool* pool_ = nullptr;
};

}  // namespace trident::emu
