#include "parallel/comm.h"

#include <algorithm>
#include <cstdint>

#include "reference/check.h"

namespace trident {

size_t exact_dtype_size(DataType t);  // parallel/comm_exact.cpp (needs reference/exact_acc.h)

size_t dtype_size(DataType t) {
  switch (t) {
    case DataType::f64: return 8;
    case DataType::f32: return 4;
    case DataType::bf16: return 2;
    case DataType::i32: return 4;
    case DataType::i64: return 8;
    case DataType::u8: return 1;
    case DataType::exact_f32:
    case DataType::exact_f64: return exact_dtype_size(t);
  }
  fail(fmt::format("unknown DataType {}", static_cast<int>(t)));
}

std::string_view to_string(DataType t) {
  switch (t) {
    case DataType::f64: return "f64";
    case DataType::f32: return "f32";
    case DataType::bf16: return "bf16";
    case DataType::i32: return "i32";
    case DataType::i64: return "i64";
    case DataType::u8: return "u8";
    case DataType::exact_f32: return "exact_f32";
    case DataType::exact_f64: return "exact_f64";
  }
  return "?";
}

std::string_view to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
    case ReduceOp::exact_sum: return "exact_sum";
  }
  return "?";
}

std::string_view to_string(CollOp op) {
  switch (op) {
    case CollOp::all_gather: return "all_gather";
    case CollOp::reduce_scatter: return "reduce_scatter";
    case CollOp::all_reduce: return "all_reduce";
    case CollOp::broadcast: return "broadcast";
    case CollOp::reduce: return "reduce";
    case CollOp::send: return "send";
    case CollOp::recv: return "recv";
    case CollOp::all_to_all: return "all_to_all";
    case CollOp::all_to_allv: return "all_to_allv";
    case CollOp::split: return "split";
  }
  return "?";
}

bool is_exact(DataType t) { return t == DataType::exact_f32 || t == DataType::exact_f64; }

void check_reduce_op(DataType t, ReduceOp op, std::source_location loc) {
  if (is_exact(t) != (op == ReduceOp::exact_sum))
    fail(fmt::format("reduce op {} is not valid with dtype {} ({}: exact_sum goes with exact_f32/exact_f64 only, "
                     "and those dtypes allow no other op) at {}:{}",
                     to_string(op), to_string(t), is_exact(t) ? "use exact_sum" : "use sum/max/min",
                     loc.file_name(), loc.line()));
}

namespace {

std::string where(std::source_location loc) { return fmt::format("{}:{}", loc.file_name(), loc.line()); }

// Buffers [a, a+na) and [b, b+nb) overlap?
bool overlaps(const void* a, size_t na, const void* b, size_t nb) {
  if (na == 0 || nb == 0) return false;
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + nb && pb < pa + na;
}

}  // namespace

void Communicator::count(CollOp op, size_t bytes, DataType t) {
  auto& s = stats_[static_cast<size_t>(op)];
  s.calls += 1;
  s.bytes += static_cast<int64_t>(bytes);
  if (is_exact(t)) s.exact_bytes += static_cast<int64_t>(bytes);
}

#define TD_NOT_IN_GROUP(what)                                                                                 \
  TD_CHECK(group_depth_ == 0, "{} inside group_start()/group_end() on communicator '{}' at {} (group_start() at {}): " \
           "only send/recv may be grouped", what, name_, where(loc), where(group_loc_))

void Communicator::all_gather(const void* send, void* recv, size_t sendcount, DataType t, Stream s, loc_t loc) {
  TD_NOT_IN_GROUP("all_gather");
  const size_t es = dtype_size(t), n = static_cast<size_t>(size());
  const auto* in_place = static_cast<const char*>(recv) + static_cast<size_t>(rank()) * sendcount * es;
  TD_CHECK(send == in_place || !overlaps(send, sendcount * es, recv, n * sendcount * es),
           "all_gather on '{}' at {}: send and recv overlap but send != recv + rank*count (not NCCL in-place)", name_,
           where(loc));
  do_collective({CollOp::all_gather, send, recv, sendcount, t, ReduceOp::sum, -1}, s, loc);
  count(CollOp::all_gather, n * sendcount * es, t);
}

void Communicator::reduce_scatter(const void* send, void* recv, size_t recvcount, DataType t, ReduceOp op, Stream s,
                                  loc_t loc) {
  TD_NOT_IN_GROUP("reduce_scatter");
  check_reduce_op(t, op, loc);
  const size_t es = dtype_size(t), n = static_cast<size_t>(size());
  const auto* in_place = static_cast<const char*>(send) + static_cast<size_t>(rank()) * recvcount * es;
  TD_CHECK(recv == in_place || !overlaps(send, n * recvcount * es, recv, recvcount * es),
           "reduce_scatter on '{}' at {}: send and recv overlap but recv != send + rank*recvcount (not NCCL "
           "in-place)", name_, where(loc));
  if (op == ReduceOp::exact_sum && !native_exact_sum()) {
    count(CollOp::reduce_scatter, lower_exact_sum(CollOp::reduce_scatter, send, recv, recvcount, t, -1, s, loc), t);
    return;
  }
  do_collective({CollOp::reduce_scatter, send, recv, recvcount, t, op, -1}, s, loc);
  count(CollOp::reduce_scatter, n * recvcount * es, t);
}

void Communicator::all_reduce(const void* send, void* recv, size_t count_, DataType t, ReduceOp op, Stream s,
                              loc_t loc) {
  TD_NOT_IN_GROUP("all_reduce");
  check_reduce_op(t, op, loc);
  const size_t es = dtype_size(t);
  TD_CHECK(send == recv || !overlaps(send, count_ * es, recv, count_ * es),
           "all_reduce on '{}' at {}: send and recv overlap partially", name_, where(loc));
  if (op == ReduceOp::exact_sum && !native_exact_sum()) {
    count(CollOp::all_reduce, lower_exact_sum(CollOp::all_reduce, send, recv, count_, t, -1, s, loc), t);
    return;
  }
  do_collective({CollOp::all_reduce, send, recv, count_, t, op, -1}, s, loc);
  count(CollOp::all_reduce, count_ * es, t);
}

void Communicator::broadcast(const void* send, void* recv, size_t count_, DataType t, int root, Stream s, loc_t loc) {
  TD_NOT_IN_GROUP("broadcast");
  TD_CHECK(root >= 0 && root < size(), "broadcast on '{}' at {}: root {} out of range [0, {})", name_, where(loc),
           root, size());
  const size_t es = dtype_size(t);
  TD_CHECK(rank() != root || send == recv || !overlaps(send, count_ * es, recv, count_ * es),
           "broadcast on '{}' at {}: send and recv overlap partially", name_, where(loc));
  do_collective({CollOp::broadcast, send, recv, count_, t, ReduceOp::sum, root}, s, loc);
  count(CollOp::broadcast, count_ * es, t);
}

void Communicator::reduce(const void* send, void* recv, size_t count_, DataType t, ReduceOp op, int root, Stream s,
                          loc_t loc) {
  TD_NOT_IN_GROUP("reduce");
  check_reduce_op(t, op, loc);
  TD_CHECK(root >= 0 && root < size(), "reduce on '{}' at {}: root {} out of range [0, {})", name_, where(loc), root,
           size());
  const size_t es = dtype_size(t);
  TD_CHECK(rank() != root || send == recv || !overlaps(send, count_ * es, recv, count_ * es),
           "reduce on '{}' at {}: send and recv overlap partially", name_, where(loc));
  if (op == ReduceOp::exact_sum && !native_exact_sum()) {
    count(CollOp::reduce, lower_exact_sum(CollOp::reduce, send, recv, count_, t, root, s, loc), t);
    return;
  }
  do_collective({CollOp::reduce, send, recv, count_, t, op, root}, s, loc);
  count(CollOp::reduce, count_ * es, t);
}

void Communicator::send(const void* buf, size_t count_, DataType t, int peer, Stream s, loc_t loc) {
  TD_CHECK(peer >= 0 && peer < size(), "send on '{}' at {}: peer {} out of range [0, {})", name_, where(loc), peer,
           size());
  do_send(buf, count_, t, peer, s, loc);
  if (helper_depth_ == 0) count(CollOp::send, count_ * dtype_size(t), t);
}

void Communicator::recv(void* buf, size_t count_, DataType t, int peer, Stream s, loc_t loc) {
  TD_CHECK(peer >= 0 && peer < size(), "recv on '{}' at {}: peer {} out of range [0, {})", name_, where(loc), peer,
           size());
  do_recv(buf, count_, t, peer, s, loc);
  if (helper_depth_ == 0) count(CollOp::recv, count_ * dtype_size(t), t);
}

void Communicator::group_start(loc_t loc) {
  do_group_start(loc);
  if (group_depth_++ == 0) group_loc_ = loc;
}

void Communicator::group_end(loc_t loc) {
  TD_CHECK(group_depth_ > 0, "group_end without group_start on '{}' at {}", name_, where(loc));
  --group_depth_;
  do_group_end(loc);
}

void Communicator::all_to_all(const void* send_, void* recv_, size_t count_, DataType t, Stream s, loc_t loc) {
  const size_t es = dtype_size(t), n = static_cast<size_t>(size());
  TD_CHECK(!overlaps(send_, n * count_ * es, recv_, n * count_ * es),
           "all_to_all on '{}' at {}: send and recv overlap (all_to_all is out of place only)", name_, where(loc));
  if (group_depth_ == 0 && do_all_to_all(send_, recv_, count_, t, s, loc)) {
    count(CollOp::all_to_all, n * count_ * es, t);
    on_helper_done(CollOp::all_to_all, count_, t, n * count_ * es, n * count_ * es, s, loc);
    return;
  }
  ++helper_depth_;
  try {
    group_start(loc);
    for (size_t j = 0; j < n; ++j) {
      send(static_cast<const char*>(send_) + j * count_ * es, count_, t, static_cast<int>(j), s, loc);
      recv(static_cast<char*>(recv_) + j * count_ * es, count_, t, static_cast<int>(j), s, loc);
    }
    group_end(loc);
  } catch (...) {
    --helper_depth_;
    throw;
  }
  --helper_depth_;
  count(CollOp::all_to_all, n * count_ * es, t);
  on_helper_done(CollOp::all_to_all, count_, t, n * count_ * es, n * count_ * es, s, loc);
}

void Communicator::all_to_allv(const void* send_, const size_t* sendcounts, const size_t* sdispls, void* recv_,
                               const size_t* recvcounts, const size_t* rdispls, DataType t, Stream s, loc_t loc) {
  const size_t es = dtype_size(t), n = static_cast<size_t>(size());
  size_t sent = 0, got = 0;
  for (size_t j = 0; j < n; ++j) sent += sendcounts[j], got += recvcounts[j];
  // Cheap span test first; the pairwise test only when the spans overlap at all.
  uintptr_t s_lo = UINTPTR_MAX, s_hi = 0, r_lo = UINTPTR_MAX, r_hi = 0;
  for (size_t j = 0; j < n; ++j) {
    auto sb = reinterpret_cast<uintptr_t>(send_) + sdispls[j] * es, rb = reinterpret_cast<uintptr_t>(recv_) + rdispls[j] * es;
    if (sendcounts[j]) s_lo = std::min(s_lo, sb), s_hi = std::max(s_hi, sb + sendcounts[j] * es);
    if (recvcounts[j]) r_lo = std::min(r_lo, rb), r_hi = std::max(r_hi, rb + recvcounts[j] * es);
  }
  if (s_lo < r_hi && r_lo < s_hi)
    for (size_t j = 0; j < n; ++j)
      for (size_t k = 0; k < n; ++k)
        TD_CHECK(!overlaps(static_cast<const char*>(send_) + sdispls[j] * es, sendcounts[j] * es,
                         static_cast<const char*>(recv_) + rdispls[k] * es, recvcounts[k] * es),
               "all_to_allv on '{}' at {}: send block {} overlaps recv block {} (out of place only)", name_,
               where(loc), j, k);
  ++helper_depth_;
  try {
    group_start(loc);
    for (size_t j = 0; j < n; ++j) {
      send(static_cast<const char*>(send_) + sdispls[j] * es, sendcounts[j], t, static_cast<int>(j), s, loc);
      recv(static_cast<char*>(recv_) + rdispls[j] * es, recvcounts[j], t, static_cast<int>(j), s, loc);
    }
    group_end(loc);
  } catch (...) {
    --helper_depth_;
    throw;
  }
  --helper_depth_;
  count(CollOp::all_to_allv, sent * es, t);
  on_helper_done(CollOp::all_to_allv, sent, t, sent * es, got * es, s, loc);
}

std::unique_ptr<Communicator> Communicator::split(int color, int key, std::string name, loc_t loc) {
  TD_NOT_IN_GROUP("split");
  auto c = do_split(color < 0 ? kNoColor : color, key, std::move(name), loc);
  count(CollOp::split, 0, DataType::u8);
  return c;
}

void accumulate_stats(CommStats& into, const Communicator& c) {
  add_stats(into[c.name()], c.stats());
}

void add_stats(OpStatsTable& into, const OpStatsTable& t) {
  for (size_t i = 0; i < t.size(); ++i) {
    into[i].calls += t[i].calls;
    into[i].bytes += t[i].bytes;
    into[i].exact_bytes += t[i].exact_bytes;
  }
}

}  // namespace trident
