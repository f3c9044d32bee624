#include "mpi/nccl_exchange.h"

#include <array>
#include <cstring>
#include <exception>
#include <vector>
#include <thread>

#include <fmt/format.h>

#include "reference/check.h"

namespace trident::mpi {

namespace {
// Message: a status byte (0: the id follows; 1: rank 0 failed to make one) and the id.
constexpr size_t kBytes = 1 + nccl::kUniqueIdBytes;
constexpr int kTag = 0x1d1d;  // <= 32767, the smallest MPI_TAG_UB an implementation may have
}  // namespace

nccl::UniqueId MpiExchange::exchange(int rank, int nranks, const nccl::MakeId& make) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (!inited || finalized) fail("nccl id exchange over MPI: MPI is not initialised (or already finalised)");
  int me = -1, size = 0;
  MPI_Comm_rank(comm_, &me);
  MPI_Comm_size(comm_, &size);
  if (nranks != size || rank != me)
    fail(fmt::format("nccl id exchange over MPI: NCCL rank {} of {} must be MPI rank {} of {} (one NCCL rank per "
                     "process; this process is MPI rank {} of {})",
                     rank, nranks, rank, nranks, me, size));
  std::array<char, kBytes> buf{};
  std::string make_error;
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  // Waits for req until the deadline; false when it did not complete (the caller cancels it).
  auto wait = [&](MPI_Request& req) {
    for (int done = 0;;) {
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (done) return true;
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  };
  // Point to point, not MPI_Ibcast: a receive that times out can be cancelled (a nonblocking collective cannot),
  // so nothing is left pending on the communicator.
  if (rank == 0) {
    try {
      const nccl::UniqueId id = make();
      std::memcpy(buf.data() + 1, id.internal, nccl::kUniqueIdBytes);
    } catch (const std::exception& e) {
      buf[0] = 1;
      make_error = e.what();
    }
    std::vector<MPI_Request> reqs(static_cast<size_t>(nranks), MPI_REQUEST_NULL);
    for (int r = 1; r < nranks; ++r) {
      const int rc = MPI_Isend(buf.data(), static_cast<int>(kBytes), MPI_BYTE, r, kTag, comm_, &reqs[r]);
      if (rc != MPI_SUCCESS) fail(fmt::format("nccl id exchange over MPI: MPI_Isend to rank {} failed (code {})", r, rc));
    }
    for (int r = 1; r < nranks; ++r)
      if (!wait(reqs[r])) {
        for (int q = r; q < nranks; ++q) {
          MPI_Cancel(&reqs[q]);
          MPI_Wait(&reqs[q], MPI_STATUS_IGNORE);
        }
        fail(fmt::format("nccl id exchange over MPI: rank {} of {} did not take the unique id from rank 0 within {} "
                         "ms (it did not reach the exchange)",
                         r, nranks, timeout_.count()));
      }
  } else {
    MPI_Request req = MPI_REQUEST_NULL;
    const int rc = MPI_Irecv(buf.data(), static_cast<int>(kBytes), MPI_BYTE, 0, kTag, comm_, &req);
    if (rc != MPI_SUCCESS) fail(fmt::format("nccl id exchange over MPI: MPI_Irecv failed (code {})", rc));
    if (!wait(req)) {
      MPI_Cancel(&req);
      MPI_Status st;
      MPI_Wait(&req, &st);
      int cancelled = 0;
      MPI_Test_cancelled(&st, &cancelled);
      if (cancelled)  // (otherwise the id arrived just now: use it)
        fail(fmt::format("nccl id exchange over MPI: rank {} of {} got no unique id from rank 0 within {} ms (rank 0 "
                         "did not reach the exchange)",
                         rank, nranks, timeout_.count()));
    }
  }
  if (buf[0] != 0 && buf[0] != 1)
    fail(fmt::format("nccl id exchange over MPI: rank {} received a malformed message from rank 0 (status byte {}; "
                     "0 or 1 expected): the processes run different builds?",
                     rank, static_cast<int>(static_cast<unsigned char>(buf[0]))));
  if (buf[0] != 0)
    fail(rank == 0 ? fmt::format("nccl id exchange over MPI: making the unique id failed: {}", make_error)
                   : fmt::format("nccl id exchange over MPI: rank 0 failed to make the unique id (rank {} of {})",
                                 rank, nranks));
  nccl::UniqueId id{};
  std::memcpy(id.internal, buf.data() + 1, nccl::kUniqueIdBytes);
  return id;
}

}  // namespace trident::mpi
