// MpiCommunicator (mpi/comm.h): the collectives as point-to-point messages over the fabric, reductions combined
// locally in communicator-rank order.
#include "mpi/comm.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "emulator/reduce.h"
#include "reference/check.h"

namespace trident::mpi {

namespace {

constexpr uint32_t kPhase2 = 1u << 16;  // second message of a call to the same peer (all_reduce, small all_gather)

uint32_t sig_of(CollOp op, DataType t) { return (static_cast<uint32_t>(op) << 8) | static_cast<uint32_t>(t); }
std::string sig_name(uint32_t s) {
  const auto op = static_cast<CollOp>((s >> 8) & 0xff);
  const auto t = static_cast<DataType>(s & 0xff);
  return fmt::format("{} ({}{})", to_string(op == CollOp::recv ? CollOp::send : op), to_string(t),
                     (s & kPhase2) ? ", second phase" : "");
}
std::string where(std::source_location loc) { return fmt::format("{}:{}", loc.file_name(), loc.line()); }

uint64_t mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

MpiCommunicator::MpiCommunicator(Fabric& f, std::shared_ptr<const std::vector<int>> ranks, int me, uint64_t ctx,
                                 std::string name)
    : Communicator(std::move(name)), f_(f), ranks_(std::move(ranks)), me_(me), ctx_(ctx),
      native_exact_(f.native_exact_sum()) {}

std::unique_ptr<MpiCommunicator> MpiCommunicator::world(Fabric& f, int g) {
  auto all = std::make_shared<std::vector<int>>(static_cast<size_t>(f.world()));
  std::iota(all->begin(), all->end(), 0);
  return std::make_unique<MpiCommunicator>(f, std::move(all), g, 0, "world");
}

void MpiCommunicator::put(int peer, uint32_t sig, const void* data, size_t bytes) {
  f_.post(ctx_, global_rank(me_), global_rank(peer), sig, data, bytes);
}

Fabric::Channel* MpiCommunicator::out_channel(int peer) {
  if (f_.process_of(global_rank(peer)) != f_.process()) return nullptr;
  if (out_.empty()) out_.assign(static_cast<size_t>(size()), nullptr);
  Fabric::Channel*& c = out_[static_cast<size_t>(peer)];
  if (!c) c = f_.channel(ctx_, global_rank(me_), global_rank(peer));
  return c;
}

Fabric::Channel* MpiCommunicator::in_channel(int peer) {
  if (in_.empty()) in_.assign(static_cast<size_t>(size()), nullptr);
  Fabric::Channel*& c = in_[static_cast<size_t>(peer)];
  if (!c) c = f_.channel(ctx_, global_rank(peer), global_rank(me_));
  return c;
}

void MpiCommunicator::put_ref(int peer, uint32_t sig, const void* data, size_t bytes) {
  if (Fabric::Channel* c = out_channel(peer)) f_.post_ref(c, sig, data, bytes);
  else f_.post_ref(ctx_, global_rank(me_), global_rank(peer), sig, data, bytes);
}

Received MpiCommunicator::get(int peer, uint32_t sig, void* dst, size_t bytes, loc_t loc) {
  const auto what = [&] { return fmt::format("{} on '{}' at {}", sig_name(sig), name(), where(loc)); };
  Received m = f_.take(in_channel(peer), what);
  if (m.sig != sig)
    fail(fmt::format("rank {} ('{}' rank {}) at {} expected {} from '{}' rank {} (rank {}) but received {}: the ranks "
                     "issued different calls",
                     global_rank(me_), name(), me_, where(loc), sig_name(sig), name(), peer, global_rank(peer),
                     sig_name(m.sig)));
  if (m.size() != bytes)
    fail(fmt::format("rank {} ('{}' rank {}) at {}: {} from '{}' rank {} (rank {}) has {} bytes, this rank expected "
                     "{} (counts differ)",
                     global_rank(me_), name(), me_, where(loc), sig_name(sig), name(), peer, global_rank(peer),
                     m.size(), bytes));
  if (dst && bytes) std::memcpy(dst, m.data(), bytes);
  return m;
}

void MpiCommunicator::all_gather_impl(const void* send, void* recv, size_t bytes, uint32_t sig, loc_t loc) {
  const int n = size();
  char* out = static_cast<char*>(recv);
  char* mine = out + static_cast<size_t>(me_) * bytes;
  if (n > 2 && static_cast<size_t>(n) * bytes <= 64 * 1024) {  // small: through rank 0, one message back
    if (me_ == 0) {
      if (send != mine && bytes) std::memmove(mine, send, bytes);
      for (int j = 1; j < n; ++j) get(j, sig, out + static_cast<size_t>(j) * bytes, bytes, loc);
      for (int j = 1; j < n; ++j) put_ref(j, sig | kPhase2, out, static_cast<size_t>(n) * bytes);
    } else {
      put_ref(0, sig, send, bytes);
      get(0, sig | kPhase2, out, static_cast<size_t>(n) * bytes, loc);
    }
    return;
  }
  for (int d = 1; d < n; ++d) put_ref((me_ + d) % n, sig, send, bytes);
  if (send != mine && bytes) std::memmove(mine, send, bytes);
  for (int d = 1; d < n; ++d) {
    const int j = (me_ + n - d) % n;
    get(j, sig, out + static_cast<size_t>(j) * bytes, bytes, loc);
  }
}

void MpiCommunicator::collective(const CollArgs& a, loc_t loc) {
  const int n = size();
  const size_t es = dtype_size(a.dtype);
  const uint32_t sig = sig_of(a.op, a.dtype);
  const char* in = static_cast<const char*>(a.send);
  char* out = static_cast<char*>(a.recv);
  switch (a.op) {
    case CollOp::all_gather:
      all_gather_impl(a.send, a.recv, a.count * es, sig, loc);
      return;
    case CollOp::reduce_scatter: {
      const size_t bytes = a.count * es;
      for (int d = 1; d < n; ++d) {
        const int j = (me_ + d) % n;
        put_ref(j, sig, in + static_cast<size_t>(j) * bytes, bytes);
      }
      std::vector<Received> msgs(static_cast<size_t>(n));
      std::vector<const void*> srcs(static_cast<size_t>(n));
      for (int j = 0; j < n; ++j) {
        if (j == me_) {
          srcs[static_cast<size_t>(j)] = in + static_cast<size_t>(me_) * bytes;
          continue;
        }
        msgs[static_cast<size_t>(j)] = get(j, sig, nullptr, bytes, loc);
        srcs[static_cast<size_t>(j)] = msgs[static_cast<size_t>(j)].data();
      }
      emu::reduce_into(a.dtype, a.redop, out, srcs.data(), n, a.count);
      return;
    }
    case CollOp::all_reduce: {
      // Range j = [begin(j), begin(j+1)) is combined by rank j, then all ranges are gathered.
      const size_t base = a.count / static_cast<size_t>(n), rem = a.count % static_cast<size_t>(n);
      auto begin = [&](int j) { return static_cast<size_t>(j) * base + std::min(static_cast<size_t>(j), rem); };
      auto len = [&](int j) { return begin(j + 1) - begin(j); };
      for (int d = 1; d < n; ++d) {
        const int j = (me_ + d) % n;
        if (len(j)) put_ref(j, sig, in + begin(j) * es, len(j) * es);
      }
      if (len(me_)) {
        std::vector<Received> msgs(static_cast<size_t>(n));
        std::vector<const void*> srcs(static_cast<size_t>(n));
        for (int j = 0; j < n; ++j) {
          if (j == me_) {
            srcs[static_cast<size_t>(j)] = in + begin(me_) * es;
            continue;
          }
          msgs[static_cast<size_t>(j)] = get(j, sig, nullptr, len(me_) * es, loc);
          srcs[static_cast<size_t>(j)] = msgs[static_cast<size_t>(j)].data();
        }
        emu::reduce_into(a.dtype, a.redop, out + begin(me_) * es, srcs.data(), n, len(me_));
        for (int d = 1; d < n; ++d) put_ref((me_ + d) % n, sig | kPhase2, out + begin(me_) * es, len(me_) * es);
      }
      for (int d = 1; d < n; ++d) {
        const int j = (me_ + n - d) % n;
        if (len(j)) get(j, sig | kPhase2, out + begin(j) * es, len(j) * es, loc);
      }
      return;
    }
    case CollOp::broadcast: {
      const size_t bytes = a.count * es;
      if (me_ == a.root) {
        for (int d = 1; d < n; ++d) put_ref((me_ + d) % n, sig, in, bytes);
        if (in != out && bytes) std::memcpy(out, in, bytes);
      } else {
        get(a.root, sig, out, bytes, loc);
      }
      return;
    }
    case CollOp::reduce: {
      const size_t bytes = a.count * es;
      if (me_ != a.root) {
        put_ref(a.root, sig, in, bytes);
        return;
      }
      std::vector<Received> msgs(static_cast<size_t>(n));
      std::vector<const void*> srcs(static_cast<size_t>(n));
      for (int j = 0; j < n; ++j) {
        if (j == me_) {
          srcs[static_cast<size_t>(j)] = in;
          continue;
        }
        msgs[static_cast<size_t>(j)] = get(j, sig, nullptr, bytes, loc);
        srcs[static_cast<size_t>(j)] = msgs[static_cast<size_t>(j)].data();
      }
      emu::reduce_into(a.dtype, a.redop, out, srcs.data(), n, a.count);
      return;
    }
    default:
      fail(fmt::format("MpiCommunicator: {} is not a collective (at {})", to_string(a.op), where(loc)));
  }
}

// Runs body, which may post_ref this rank's buffers; on an exception, the ranks of this process that read them in
// place are done with them before the exception leaves (the buffers may not outlive it).
template <class F>
void MpiCommunicator::draining(const F& body) {
  try {
    body();
  } catch (...) {
    f_.drain_refs(global_rank(me_));
    throw;
  }
}

void MpiCommunicator::do_collective(const CollArgs& a, Stream, loc_t loc) {
  draining([&] { collective(a, loc); });
  wait_sent(sig_of(a.op, a.dtype), loc);
}

void MpiCommunicator::wait_sent(uint32_t sig, loc_t loc) {
  f_.wait_refs(global_rank(me_), [&] { return fmt::format("{} on '{}' at {}", sig_name(sig), name(), where(loc)); });
}

void MpiCommunicator::do_send(const void* buf, size_t count, DataType t, int peer, Stream, loc_t loc) {
  if (group_depth_ > 0) {
    group_.push_back(Pending{true, const_cast<void*>(buf), count * dtype_size(t), t, peer, loc});
    return;
  }
  put(peer, sig_of(CollOp::send, t), buf, count * dtype_size(t));
}

void MpiCommunicator::do_recv(void* buf, size_t count, DataType t, int peer, Stream, loc_t loc) {
  if (group_depth_ > 0) {
    group_.push_back(Pending{false, buf, count * dtype_size(t), t, peer, loc});
    return;
  }
  get(peer, sig_of(CollOp::send, t), buf, count * dtype_size(t), loc);
}

void MpiCommunicator::do_group_start(loc_t) { ++group_depth_; }

void MpiCommunicator::do_group_end(loc_t) {
  if (--group_depth_ > 0) return;
  std::vector<Pending> ops;
  ops.swap(group_);
  // Every send first (the receivers in this process read the buffers in place), then every receive in issue
  // order, then the wait until this process's receivers have read the sent buffers.
  draining([&] {
    for (const Pending& p : ops)
      if (p.send) put_ref(p.peer, sig_of(CollOp::send, p.t), p.buf, p.bytes);
    for (const Pending& p : ops)
      if (!p.send) get(p.peer, sig_of(CollOp::send, p.t), p.buf, p.bytes, p.loc);
  });
  if (!ops.empty()) wait_sent(sig_of(CollOp::send, ops.front().t), ops.front().loc);
}

std::unique_ptr<Communicator> MpiCommunicator::do_split(int color, int key, std::string name, loc_t loc) {
  const int n = size();
  const int32_t mine[2] = {color, key};
  std::vector<int32_t> all(2 * static_cast<size_t>(n));
  draining([&] { all_gather_impl(mine, all.data(), sizeof mine, sig_of(CollOp::split, DataType::i32), loc); });
  wait_sent(sig_of(CollOp::split, DataType::i32), loc);
  const uint64_t seq = splits_++;
  if (color < 0) return nullptr;
  std::vector<int> members;  // communicator ranks of this color, ordered by (key, rank)
  for (int j = 0; j < n; ++j)
    if (all[2 * static_cast<size_t>(j)] == color) members.push_back(j);
  std::stable_sort(members.begin(), members.end(), [&](int x, int y) {
    return all[2 * static_cast<size_t>(x) + 1] < all[2 * static_cast<size_t>(y) + 1];
  });
  auto ranks = std::make_shared<std::vector<int>>();
  int me = -1;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] == me_) me = static_cast<int>(i);
    ranks->push_back(global_rank(members[i]));
  }
  const uint64_t ctx = mix(mix(ctx_ ^ mix(seq + 1)) ^ static_cast<uint64_t>(static_cast<uint32_t>(color)));
  return std::make_unique<MpiCommunicator>(f_, std::move(ranks), me, ctx, std::move(name));
}

}  // namespace trident::mpi
