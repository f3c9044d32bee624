// The fourth way to bootstrap NCCL's unique id (gpu/nccl/nccl_bootstrap.h): over MPI, for jobs started by
// mpirun with one NCCL rank per MPI process (NCCL rank r = MPI rank r of the communicator). Rank 0 makes the id
// and sends it to every rank (MPI_Isend, tag 0x1d1d on the given communicator); every rank waits with a deadline
// (an error naming what was awaited, never a hang; a timed-out receive is cancelled, so nothing stays pending),
// and a failure of rank 0's make() reaches every rank as an error instead of an id.
// MPI must be initialised by the caller (any thread level; the exchange calls MPI from the calling thread only).
#pragma once
#include <chrono>

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include "gpu/nccl/nccl_bootstrap.h"

namespace trident::mpi {

class MpiExchange final : public nccl::IdExchange {
 public:
  explicit MpiExchange(MPI_Comm comm = MPI_COMM_WORLD, std::chrono::milliseconds timeout = std::chrono::seconds(60))
      : comm_(comm), timeout_(timeout) {}
  // rank / nranks must be this process's rank and size in the communicator (one NCCL rank per process).
  nccl::UniqueId exchange(int rank, int nranks, const nccl::MakeId& make) override;

 private:
  MPI_Comm comm_;
  std::chrono::milliseconds timeout_;
};

}  // namespace trident::mpi
