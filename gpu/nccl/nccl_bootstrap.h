// Bootstrap of NCCL's unique id: rank 0 makes it (ncclGetUniqueId) and every rank of the job receives it before
// ncclCommInitRank. Four ways, each bounded by a timeout (an error naming what was awaited, never a hang):
//   in-process  threads of one process (the emulator's ranks, or several GPUs driven by one process)
//   file        rank 0 writes PATH atomically (temporary name, fsync, rename); the others poll until it appears.
//               Use a fresh path per job: a file left by an earlier job would be read as this job's id.
//   tcp         rank 0 listens on MASTER_ADDR:MASTER_PORT and sends the id to each rank that connects (the
//               variables torchrun sets, with RANK and WORLD_SIZE)
//   mpi         MPI_Bcast from rank 0, where the MPI backend is built (mpi/)
#pragma once
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "gpu/nccl/nccl_api.h"

namespace trident::nccl {

using MakeId = std::function<UniqueId()>;

class IdExchange {
 public:
  virtual ~IdExchange() = default;
  // Collective over the job's nranks ranks: rank 0 calls make() and every rank returns its result.
  virtual UniqueId exchange(int rank, int nranks, const MakeId& make) = 0;
};

// Shared by the threads of one process: one object per job, exchange() called once per rank thread.
class InProcessExchange final : public IdExchange {
 public:
  explicit InProcessExchange(std::chrono::milliseconds timeout = std::chrono::seconds(60)) : timeout_(timeout) {}
  UniqueId exchange(int rank, int nranks, const MakeId& make) override;

 private:
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<UniqueId> id_;
  std::string error_;
};

class FileExchange final : public IdExchange {
 public:
  FileExchange(std::string path, std::chrono::milliseconds timeout = std::chrono::seconds(60))
      : path_(std::move(path)), timeout_(timeout) {}
  UniqueId exchange(int rank, int nranks, const MakeId& make) override;

 private:
  std::string path_;
  std::chrono::milliseconds timeout_;
};

class TcpExchange final : public IdExchange {
 public:
  TcpExchange(std::string addr, int port, std::chrono::milliseconds timeout = std::chrono::seconds(60))
      : addr_(std::move(addr)), port_(port), timeout_(timeout) {}
  UniqueId exchange(int rank, int nranks, const MakeId& make) override;

 private:
  std::string addr_;
  int port_;
  std::chrono::milliseconds timeout_;
};

// What the environment asks for: TRIDENT_NCCL_ID_FILE=PATH -> file; MASTER_ADDR + MASTER_PORT -> tcp; else
// nullptr (the caller picks in-process or MPI). Bad values (a port outside 1..65535) throw trident::Error.
std::unique_ptr<IdExchange> exchange_from_env(std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace trident::nccl
