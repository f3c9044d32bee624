// The device seam: memory, streams, events and kernel launches of one rank, backend-neutral (docs/architecture.md
// "The device seam"). The step (parallel/step.h) is written against this header and the communicator
// (parallel/comm.h) only; the emulator implements it on host memory (emulator/device.h: eager, or deferred with a
// seeded scheduler and a stream-hazard checker), a CUDA backend on cudaStream_t / cudaEvent_t / cudaMallocAsync.
//
// Semantics (CUDA's):
//  - Work issued to one stream runs in issue order. Work on different streams is unordered unless an event orders
//    it: record(e, s) marks the current end of s; wait(t, e) makes work issued to t afterwards start only after
//    that point. Waiting for an event that was never recorded is an error.
//  - Memory is device memory. allocate(bytes, s) is stream-ordered (cudaMallocAsync): the memory may be used by
//    work issued to s afterwards, or by other streams ordered after that point. free(p, s) is stream-ordered
//    (cudaFreeAsync): every use of p must be ordered before it on s. Fresh memory is uninitialised.
//  - The host never reads or writes device memory directly: upload() copies host -> device (the host buffer may be
//    reused as soon as the call returns), download() copies device -> host asynchronously, and the host may read
//    the destination only after synchronize() of that stream. fetch() does both: a named host sync point.
//  - Every launch declares the byte ranges it reads and writes (Access). A checking backend (the emulator's
//    deferred mode) reports two accesses to overlapping bytes, at least one a write, on different streams with no
//    event or host synchronisation ordering them: the names and call sites of both launches.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace trident {

enum class DataType : uint8_t;  // parallel/comm.h

// A stream of one rank: an ordered queue of work. Handle only; the Device that created it gives it meaning.
// Stream{} is the rank's default (compute) stream.
struct Stream {
  int id = 0;
  friend bool operator==(Stream, Stream) = default;
};
// An event: a point in a stream that other streams can wait for (cudaEvent_t: wait() waits for the most recent
// record()).
struct Event {
  int id = -1;
  friend bool operator==(Event, Event) = default;
};

// One byte range a launch reads or writes.
struct Access {
  const void* p = nullptr;
  int64_t bytes = 0;
  bool write = false;
  // The bytes the kernel moves through this access, for the trace's cost metadata only (-1: `bytes`): fewer than the
  // range for an indexed access that touches some rows of it (a gather of embedding rows).
  int64_t moved = -1;
};
// bytes == kToEnd: from p to the end of the allocation that holds it (a weight or a whole buffer whose size the
// caller does not know).
inline constexpr int64_t kToEnd = -1;
template <class T>
Access reads(const T* p, int64_t n) {
  return Access{p, n * static_cast<int64_t>(sizeof(T)), false};
}
template <class T>
Access writes(T* p, int64_t n) {
  return Access{p, n * static_cast<int64_t>(sizeof(T)), true};
}
using Accesses = std::vector<Access>;

// The inverse of Device::native_stream's default encoding.
inline Stream stream_from_native(const void* h) { return Stream{static_cast<int>(reinterpret_cast<uintptr_t>(h) - 1)}; }

// Bytes of device memory of one rank.
struct DeviceMemory {
  int64_t cur = 0, peak = 0;
};

class Device {
 public:
  using loc_t = std::source_location;
  virtual ~Device() = default;
  virtual Stream compute_stream() = 0;  // id 0
  virtual Stream comm_stream() = 0;     // id 1
  // The backend's handle of a stream, passed to a communication library (cudaStream_t on CUDA). The default
  // encodes the id (id + 1, never null) for backends whose streams are their own: the emulator's fake NCCL decodes
  // it with stream_from_native().
  virtual void* native_stream(Stream s) { return reinterpret_cast<void*>(static_cast<uintptr_t>(s.id) + 1); }
  virtual Stream create_stream(std::string name) = 0;
  virtual Event create_event() = 0;
  // Marks the current end of `s`.
  virtual void record(Event e, Stream s, loc_t loc = loc_t::current()) = 0;
  // Work issued to `s` after this call starts only after the last record() of `e` completed.
  virtual void wait(Stream s, Event e, loc_t loc = loc_t::current()) = 0;
  // Runs a kernel (a host function standing for one on the emulator) on `s`. `acc` lists every byte range it
  // reads or writes; `flops` its arithmetic, for traces. `fn` may run later than the call (deferred mode): it
  // must capture by value whatever may change after the call.
  virtual void launch(Stream s, std::string_view name, const Accesses& acc, double flops, std::function<void()> fn,
                      loc_t loc = loc_t::current()) = 0;
  // Host waits for all work issued to `s`.
  virtual void synchronize(Stream s, loc_t loc = loc_t::current()) = 0;
  // False on a shapes-only device (the emulator's `--shapes-only`, emulator/device.h): memory has addresses and
  // sizes but no bytes, launches are recorded and never run, and the host can read nothing back (download() is an
  // error naming the call site). The step then takes what it would have read from elsewhere (routing counts from a
  // routing spec) or goes without it (the loss).
  virtual bool has_data() const { return true; }
  // A host read whose value a shapes-only run does without (see has_data): download() on a data device; on a
  // shapes-only device the same trace entry, `dst` untouched. The caller must not use dst when !has_data().
  virtual void download_known(void* dst, const void* src, int64_t bytes, Stream s, loc_t loc = loc_t::current()) {
    download(dst, src, bytes, s, loc);
  }
  // True when launched work would run at once on the calling thread, unrecorded and unchecked (the emulator's eager
  // mode without trace or checker): a host kernel set may then call its function directly, skipping the launch.
  virtual bool immediate() const { return false; }

  // ---- memory
  virtual void* allocate(int64_t bytes, Stream s, loc_t loc = loc_t::current()) = 0;
  virtual void free(void* p, Stream s, loc_t loc = loc_t::current()) = 0;
  // dst and src device memory (bytes each, no overlap), on s.
  virtual void copy(void* dst, const void* src, int64_t bytes, Stream s, loc_t loc = loc_t::current()) = 0;
  virtual void memset(void* dst, int value, int64_t bytes, Stream s, loc_t loc = loc_t::current()) = 0;
  // rows x width bytes: row r from src + r*spitch to dst + r*dpitch (cudaMemcpy2DAsync), device memory, on s.
  virtual void copy_2d(void* dst, int64_t dpitch, const void* src, int64_t spitch, int64_t width, int64_t rows,
                       Stream s, loc_t loc = loc_t::current()) = 0;
  // host -> device on s; `src` is consumed before the call returns.
  virtual void upload(void* dst, const void* src, int64_t bytes, Stream s, loc_t loc = loc_t::current()) = 0;
  // device -> host on s; the host reads `dst` only after synchronize(s).
  virtual void download(void* dst, const void* src, int64_t bytes, Stream s, loc_t loc = loc_t::current()) = 0;
  virtual DeviceMemory memory() const = 0;

  // The i64 lowering of exact_sum (parallel/exact_lowering.h) as work on s, ordered with the collective that sums
  // the words: pack `count` accumulators of exact dtype t into `out` (exact_lowering::words_per_element(t) words
  // each), and unpack word sums into canonical accumulators. The defaults launch the host functions (device memory
  // the host can read: the emulator's, eager or deferred); a CUDA device runs them as kernels
  // (gpu/exact_lowering.cu). Defined in parallel/exact_lowering.cpp.
  virtual void exact_pack(DataType t, const void* acc, size_t count, int64_t* out, Stream s,
                          loc_t loc = loc_t::current());
  virtual void exact_unpack(DataType t, const int64_t* in, size_t count, void* acc, Stream s,
                            loc_t loc = loc_t::current());

  // A named host sync point: copies n elements to the host and waits for s.
  template <class T>
  std::vector<T> fetch(const T* src, int64_t n, Stream s, loc_t loc = loc_t::current()) {
    std::vector<T> out(static_cast<size_t>(n));
    if (n > 0) download(out.data(), src, n * static_cast<int64_t>(sizeof(T)), s, loc);
    synchronize(s, loc);
    return out;
  }
  template <class T>
  T fetch_one(const T* src, Stream s, loc_t loc = loc_t::current()) {
    T v{};
    download(&v, src, static_cast<int64_t>(sizeof(T)), s, loc);
    synchronize(s, loc);
    return v;
  }
};

// n elements of device memory, owned: allocated on a stream, freed on the same stream when destroyed or reset
// (every use on another stream must be ordered before the free by an event). Move-only.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Device& dev, int64_t n, Stream s, std::source_location loc = std::source_location::current())
      : dev_(&dev), s_(s), n_(n) {
    if (n_ > 0) p_ = static_cast<T*>(dev.allocate(n_ * static_cast<int64_t>(sizeof(T)), s, loc));
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept { swap(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    DeviceBuffer(std::move(o)).swap(*this);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }
  void reset() noexcept { reset(s_); }
  // Frees on stream `s` instead of the allocating stream (every use must be ordered before it on s).
  void reset(Stream s) noexcept {
    if (p_) dev_->free(p_, s);
    p_ = nullptr;
    n_ = 0;
  }
  void swap(DeviceBuffer& o) noexcept {
    std::swap(dev_, o.dev_);
    std::swap(s_, o.s_);
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
  }
  T* data() const { return p_; }
  int64_t size() const { return n_; }
  int64_t bytes() const { return n_ * static_cast<int64_t>(sizeof(T)); }
  bool empty() const { return n_ == 0; }
  Stream stream() const { return s_; }
  Access rd() const { return Access{p_, bytes(), false}; }
  Access wr() const { return Access{p_, bytes(), true}; }

 private:
  Device* dev_ = nullptr;
  Stream s_{};
  T* p_ = nullptr;
  int64_t n_ = 0;
};

}  // namespace trident
