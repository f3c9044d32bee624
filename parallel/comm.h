// The abstract communicator: NCCL semantics, implemented by the emulator (emulator/) and, later, by NCCL (gpu/).
// Nothing here knows about threads or fake ranks. The step code is written against this header only.
//
// Buffers are raw pointers with an element count and a DataType, exactly as in NCCL:
//   all_gather     send: count            recv: size()*count      in place iff send == recv + rank()*count
//   reduce_scatter send: size()*recvcount  recv: recvcount        in place iff recv == send + rank()*recvcount
//   all_reduce     send: count            recv: count             in place iff send == recv
//   broadcast      send: count (root)     recv: count             in place iff send == recv (root only reads send)
//   reduce         send: count            recv: count (root)      in place iff send == recv (root)
//   send/recv      buf: count; matched in order per (sender, receiver) pair; count and dtype must agree.
// Any other overlap of send and recv buffers is undefined (as in NCCL).
//
// Reductions combine contributions in communicator-rank order, ((c0 op c1) op c2) ..., so every result is
// deterministic (NCCL's order is not; the GPU path is checked with tolerances, see reference/tolerances.h).
// bf16 sum/min/max accumulate in fp32 in rank order and round once (RNE) at the end.
// Integer sums wrap modulo 2^bits. max/min of floating types propagate NaN.
// exact_sum is only valid with exact_f32 / exact_f64 (elements are trident::ExactAcc<float/double>), and
// sum/max/min are invalid with those dtypes. A backend without a native exact_sum (native_exact_sum() false)
// gets it lowered onto an i64 sum by the public wrappers, with the same bits (parallel/exact_lowering.h).
//
// Every call takes a Stream (the work is ordered on it; see Device) and a std::source_location that the
// backend uses for error reports (the emulator names it when ranks disagree or deadlock).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <source_location>
#include <string>
#include <string_view>
#include <vector>

#include "parallel/device.h"

namespace trident {

enum class DataType : uint8_t { f64, f32, bf16, i32, i64, u8, exact_f32, exact_f64 };
enum class ReduceOp : uint8_t { sum, max, min, exact_sum };
// Operations as counted in CommStats and named in reports/traces.
enum class CollOp : uint8_t {
  all_gather, reduce_scatter, all_reduce, broadcast, reduce, send, recv, all_to_all, all_to_allv, split
};
inline constexpr int kNumCollOps = 10;
inline constexpr std::array<DataType, 8> kAllDataTypes = {DataType::f64, DataType::f32,       DataType::bf16,
                                                          DataType::i32, DataType::i64,       DataType::u8,
                                                          DataType::exact_f32, DataType::exact_f64};

size_t dtype_size(DataType t);  // bytes per element (exact_*: sizeof(ExactAcc<T>))
std::string_view to_string(DataType t);
std::string_view to_string(ReduceOp op);
std::string_view to_string(CollOp op);
bool is_exact(DataType t);
// Throws trident::Error when op is not valid for dtype (exact_sum <-> exact_* only).
void check_reduce_op(DataType t, ReduceOp op, std::source_location loc);

// Calls and bytes of one operation. Bytes: the size of the call's largest buffer on this rank (the nccl-tests
// "size"): all_gather size()*count, reduce_scatter size()*recvcount, all_reduce/broadcast/reduce count,
// send/recv count, all_to_all(v) the bytes this rank sends. All in bytes of the dtype; an exact_sum lowered
// onto i64 counts the bytes of its packed i64 buffer (what the backend moves: 96 / 560 bytes per exact_f32 /
// exact_f64 element instead of 56 / 552).
// exact_bytes: the part of bytes whose elements are exact accumulators (exact_f32 / exact_f64, or their packed i64
// lowering): what the exact reductions cost on the wire, reported apart from the real-dtype bytes.
struct OpStats {
  int64_t calls = 0;
  int64_t bytes = 0;
  int64_t exact_bytes = 0;
  friend bool operator==(const OpStats&, const OpStats&) = default;
};
using OpStatsTable = std::array<OpStats, kNumCollOps>;  // indexed by CollOp
// Per communicator name (e.g. "world", "fsdp*cp", "ep"): summed over all communicators of this rank with
// that name.
using CommStats = std::map<std::string, OpStatsTable>;

class Communicator {
 public:
  using loc_t = std::source_location;
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  const std::string& name() const { return name_; }
  // This communicator's counters on this rank (calls and bytes per op).
  const OpStatsTable& stats() const { return stats_; }

  // --- collectives (NCCL semantics; see the table at the top of this file)
  void all_gather(const void* send, void* recv, size_t sendcount, DataType t, Stream s = {},
                  loc_t loc = loc_t::current());
  void reduce_scatter(const void* send, void* recv, size_t recvcount, DataType t, ReduceOp op, Stream s = {},
                      loc_t loc = loc_t::current());
  void all_reduce(const void* send, void* recv, size_t count, DataType t, ReduceOp op, Stream s = {},
                  loc_t loc = loc_t::current());
  void broadcast(const void* send, void* recv, size_t count, DataType t, int root, Stream s = {},
                 loc_t loc = loc_t::current());
  void reduce(const void* send, void* recv, size_t count, DataType t, ReduceOp op, int root, Stream s = {},
              loc_t loc = loc_t::current());

  // --- point to point. Outside a group each call blocks until matched (like an unbuffered NCCL send);
  // inside group_start()/group_end() they are issued together at group_end(), which returns when all are done.
  void send(const void* buf, size_t count, DataType t, int peer, Stream s = {}, loc_t loc = loc_t::current());
  void recv(void* buf, size_t count, DataType t, int peer, Stream s = {}, loc_t loc = loc_t::current());
  void group_start(loc_t loc = loc_t::current());
  void group_end(loc_t loc = loc_t::current());

  // --- all-to-all as grouped send/recv (helpers on the interface, counted as one all_to_all(v) call).
  // all_to_all: send (size()*count), block j goes to rank j; recv (size()*count), block j came from rank j.
  void all_to_all(const void* send, void* recv, size_t count, DataType t, Stream s = {}, loc_t loc = loc_t::current());
  // all_to_allv: counts/displacements in elements, one entry per rank (MPI_Alltoallv layout).
  void all_to_allv(const void* send, const size_t* sendcounts, const size_t* sdispls, void* recv,
                   const size_t* recvcounts, const size_t* rdispls, DataType t, Stream s = {},
                   loc_t loc = loc_t::current());

  // ncclCommSplit: collective over this communicator. Ranks with the same color form a new communicator,
  // ordered by (key, rank in this communicator). color < 0 (kNoColor) -> nullptr. `name` labels the result
  // in stats, traces and reports (e.g. "fsdp*cp").
  static constexpr int kNoColor = -1;
  std::unique_ptr<Communicator> split(int color, int key, std::string name, loc_t loc = loc_t::current());

 protected:
  explicit Communicator(std::string name) : name_(std::move(name)) {}

  // Backend hooks. Arguments are validated by the public wrappers (ranks in range, reduce op vs dtype).
  struct CollArgs {
    CollOp op;
    const void* send;
    void* recv;
    size_t count;  // NCCL's count argument (all_gather: sendcount; reduce_scatter: recvcount)
    DataType dtype;
    ReduceOp redop;  // reductions only
    int root;        // broadcast/reduce only, else -1
  };
  virtual void do_collective(const CollArgs& a, Stream s, loc_t loc) = 0;
  virtual void do_send(const void* buf, size_t count, DataType t, int peer, Stream s, loc_t loc) = 0;
  virtual void do_recv(void* buf, size_t count, DataType t, int peer, Stream s, loc_t loc) = 0;
  virtual void do_group_start(loc_t loc) = 0;
  virtual void do_group_end(loc_t loc) = 0;
  virtual std::unique_ptr<Communicator> do_split(int color, int key, std::string name, loc_t loc) = 0;
  // all_to_all as one operation of the backend (outside a group only; validated): true when done, false to have it
  // built from grouped send/recv (the default, NCCL's way). Either way on_helper_done follows.
  virtual bool do_all_to_all(const void* send, void* recv, size_t count, DataType t, Stream s, loc_t loc) {
    (void)send, (void)recv, (void)count, (void)t, (void)s, (void)loc;
    return false;
  }
  // Whether do_collective implements ReduceOp::exact_sum on exact_f32/exact_f64 itself (the emulator does, unless
  // SpawnOptions::lower_exact_sum). When false, reduce_scatter / all_reduce / reduce with exact_sum pack the
  // accumulators into int64 words, call do_collective with DataType::i64 and ReduceOp::sum on the packed buffer
  // (in place) and unpack the sums (parallel/exact_lowering.h, docs/numerics.md): do_collective never sees an
  // exact dtype in a reduction. The default suits backends whose reductions are the usual integer/float sums
  // (NCCL, MPI). Non-reducing calls with exact dtypes (all_gather, broadcast, send/recv, all_to_all(v)) still
  // reach the backend and move the accumulator bytes unchanged (dtype_size(t) opaque bytes per element).
  virtual bool native_exact_sum() const { return false; }
  // The device whose streams this communicator's operations run on, for the lowering's pack and unpack
  // (Device::exact_pack / exact_unpack, stream-ordered with the collective). nullptr: the lowering packs and unpacks
  // on the host at issue, which is right only when every earlier write to the buffers has already happened (an
  // eager host backend: MPI).
  virtual Device* lowering_device() { return nullptr; }
  // Called after all_to_all / all_to_allv completed (count: all_to_all's count, all_to_allv's total send
  // elements; bytes: what this rank sent; recv_bytes: what it received). Lets a backend record the helper as one
  // operation.
  virtual void on_helper_done(CollOp op, size_t count, DataType t, size_t bytes, size_t recv_bytes, Stream s,
                              loc_t loc) {
    (void)op, (void)count, (void)t, (void)bytes, (void)recv_bytes, (void)s, (void)loc;
  }
  // True while all_to_all(v) issues its send/recv.
  bool in_helper() const { return helper_depth_ > 0; }

 private:
  void count(CollOp op, size_t bytes, DataType t);
  // exact_sum of reduce_scatter / all_reduce / reduce (validated) on the i64 lowering; returns the bytes to count
  // (parallel/exact_lowering.cpp).
  size_t lower_exact_sum(CollOp op, const void* send, void* recv, size_t count, DataType t, int root, Stream s,
                         loc_t loc);
  std::string name_;
  OpStatsTable stats_{};
  int group_depth_ = 0;
  loc_t group_loc_;  // where the outermost open group started (errors name it)
  int helper_depth_ = 0;  // > 0 inside all_to_all(v): inner send/recv are not counted separately
};

// Adds one communicator's counters into a CommStats under its name.
void accumulate_stats(CommStats& into, const Communicator& c);
// Adds a table of counters into another (calls, bytes, exact_bytes).
void add_stats(OpStatsTable& into, const OpStatsTable& t);

}  // namespace trident
