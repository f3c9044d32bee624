// MpiCommunicator: the communicator interface (parallel/comm.h) over the MPI transport (mpi/fabric.h), for one
// emulated rank of an MPI run (docs/mpi.md).
//
// Every operation is built from the fabric's point-to-point messages, so ranks in the same process exchange in
// memory and ranks in other processes through MPI, with the same code:
//   all_gather      each rank sends its block to every other rank (small calls: gathered at rank 0 and sent back
//                   as one message per rank)
//   reduce_scatter  block j goes to rank j; each rank combines the n blocks in communicator-rank order
//   all_reduce      the buffer is split into n balanced ranges; rank j combines range j in rank order, then the
//                   ranges are all-gathered (every element is combined in rank order: the emulator's bits)
//   reduce          everything to the root, combined there in rank order
//   broadcast       the root sends to every rank
//   send/recv       one message; inside group_start()/group_end() sends are posted at group_end, then receives
//                   are taken
//   split           the (color, key) pairs are all-gathered, each rank builds its group ordered by (key, rank)
// Floating reductions are never handed to MPI: the contributions move and are combined locally with the
// emulator's kernel (emulator/reduce.h: fp32 accumulation for bf16, one rounding; NaN-propagating max/min), so the
// bits equal the emulator's. Exact sums are merged natively (the accumulator bytes move, emulator/reduce.h merges
// them in rank order) when every process holds them in the same format (Fabric::native_exact_sum()); otherwise,
// or when asked (FabricOptions::lower_exact_sum), they arrive lowered onto i64 sums (parallel/exact_lowering.h).
// Each message carries the sender's operation; a receiver that expected another one fails naming both ranks.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mpi/fabric.h"
#include "parallel/comm.h"

namespace trident::mpi {

class MpiCommunicator final : public Communicator {
 public:
  // ranks: the global ranks of the members in communicator order; me: this rank's index; ctx: a context id every
  // member computes alike (the world is 0; split derives the children's).
  MpiCommunicator(Fabric& f, std::shared_ptr<const std::vector<int>> ranks, int me, uint64_t ctx, std::string name);
  // The world communicator of global rank g.
  static std::unique_ptr<MpiCommunicator> world(Fabric& f, int g);

  int rank() const override { return me_; }
  int size() const override { return static_cast<int>(ranks_->size()); }
  int global_rank(int r) const { return (*ranks_)[static_cast<size_t>(r)]; }

 protected:
  void do_collective(const CollArgs& a, Stream s, loc_t loc) override;
  void do_send(const void* buf, size_t count, DataType t, int peer, Stream s, loc_t loc) override;
  void do_recv(void* buf, size_t count, DataType t, int peer, Stream s, loc_t loc) override;
  void do_group_start(loc_t loc) override;
  void do_group_end(loc_t loc) override;
  std::unique_ptr<Communicator> do_split(int color, int key, std::string name, loc_t loc) override;
  bool native_exact_sum() const override { return native_exact_; }

 private:
  void put(int peer, uint32_t sig, const void* data, size_t bytes);      // copied at once
  void put_ref(int peer, uint32_t sig, const void* data, size_t bytes);  // read in place in this process
  // Waits until this process's receivers released every put_ref message of this rank (the end of a call).
  void wait_sent(uint32_t sig, loc_t loc);
  template <class F>
  void draining(const F& body);  // body; on an exception, drain_refs before it leaves
  void collective(const CollArgs& a, loc_t loc);
  // Receives exactly `bytes` from peer into dst (or returns the message when dst is null), checking the signature.
  Received get(int peer, uint32_t sig, void* dst, size_t bytes, loc_t loc);
  void all_gather_impl(const void* send, void* recv, size_t bytes, uint32_t sig, loc_t loc);

  // The channels to and from the peers in this process (Fabric::channel), made at first use: per peer, the queue
  // of this communicator's messages from this rank in the peer's mailbox, and from the peer in this rank's.
  Fabric::Channel* out_channel(int peer);
  Fabric::Channel* in_channel(int peer);

  Fabric& f_;
  std::vector<Fabric::Channel*> out_, in_;  // by communicator rank; null: not made yet (or the peer is remote)
  std::shared_ptr<const std::vector<int>> ranks_;
  int me_;
  uint64_t ctx_;
  bool native_exact_;  // Fabric::native_exact_sum()
  uint64_t splits_ = 0;
  int group_depth_ = 0;
  struct Pending {
    bool send;
    void* buf;
    size_t bytes;
    DataType t;
    int peer;
    loc_t loc;
  };
  std::vector<Pending> group_;
};

}  // namespace trident::mpi
