// NCCL's unique id over MPI (mpi/nccl_exchange.h), under mpirun with 3 processes: every rank receives rank 0's
// id byte for byte; a failing make() on rank 0 is an error on every rank; a rank/size that is not this
// process's is refused before any MPI call; ranks waiting for a rank 0 that never comes fail within their
// timeout, and the cancelled receives leave nothing pending.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>
#include <vector>

#include "mpi/nccl_exchange.h"
#include "reference/check.h"
#include "tests/error_of.h"

using namespace trident;

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

nccl::UniqueId make_id() {  // different in every run: rank 0's pid and address of a local
  nccl::UniqueId id{};
  const long pid = getpid();
  for (size_t i = 0; i < nccl::kUniqueIdBytes; ++i) id.internal[i] = static_cast<char>((pid >> (i % 16)) + 31 * i);
  return id;
}

using trident::test::error_of;

}  // namespace

TEST(MpiExchange, EveryRankGetsRankZerosId) {
  mpi::MpiExchange ex;
  nccl::UniqueId made{};
  const nccl::UniqueId id = ex.exchange(world_rank(), world_size(), [&] { return made = make_id(); });
  std::vector<char> all(nccl::kUniqueIdBytes * static_cast<size_t>(world_size()));
  MPI_Allgather(id.internal, static_cast<int>(nccl::kUniqueIdBytes), MPI_BYTE, all.data(),
                static_cast<int>(nccl::kUniqueIdBytes), MPI_BYTE, MPI_COMM_WORLD);
  for (int r = 1; r < world_size(); ++r) {
    EXPECT_EQ(std::memcmp(all.data(), all.data() + r * nccl::kUniqueIdBytes, nccl::kUniqueIdBytes), 0)
        << "rank " << r << " received another id than rank 0";
  }
  if (world_rank() == 0) {
    EXPECT_EQ(std::memcmp(made.internal, id.internal, nccl::kUniqueIdBytes), 0);
  }
}

TEST(MpiExchange, FailureOfMakeReachesEveryRank) {
  mpi::MpiExchange ex;
  const std::string e = error_of([&] {
    ex.exchange(world_rank(), world_size(), []() -> nccl::UniqueId { throw Error("no GPU here"); });
  });
  const char* want = world_rank() == 0 ? "making the unique id failed: no GPU here" : "rank 0 failed to make the unique id";
  EXPECT_NE(e.find(want), std::string::npos) << e;
}

TEST(MpiExchange, RankMappingIsChecked) {
  mpi::MpiExchange ex;
  const std::string e = error_of([&] { ex.exchange(world_rank(), world_size() + 1, make_id); });
  EXPECT_NE(e.find("must be MPI rank"), std::string::npos) << e;
}

TEST(MpiExchange, MissingRankZeroTimesOut) {
  if (world_rank() != 0) {
    mpi::MpiExchange ex(MPI_COMM_WORLD, std::chrono::milliseconds(300));
    const std::string e = error_of([&] { ex.exchange(world_rank(), world_size(), make_id); });
    EXPECT_NE(e.find("got no unique id from rank 0 within 300 ms"), std::string::npos) << e;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // The cancelled receives left nothing behind: a normal exchange works on the same communicator.
  mpi::MpiExchange ex;
  EXPECT_NO_THROW(ex.exchange(world_rank(), world_size(), make_id));
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  const int rc = RUN_ALL_TESTS();
  int worst = 0;  // every process's result: a failure on any rank fails the test
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
