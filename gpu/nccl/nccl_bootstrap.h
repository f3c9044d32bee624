// Bootstrap of NCCL's unique id: rank 0 makes it (ncclGetUniqueId) and every rank of the job receives it before
// ncclCommInitRank. Four ways, each bounded by a timeout (an error naming what was awaited, never a hang):
//   in-process  threads of one process (the emulator's ranks, or several GPUs driven by one process)
//   file        rank 0 writes PATH atomically (temporary name, fsync, rename); the others poll until it appears.
//               Use a fresh path per job: a file left by an earlier job would be read as this job's id.
//   tcp         rank 0 listens on MASTER_ADDR and the id port and hands the id to each rank that proves it knows
//               the job's secret (below); TRIDENT_NCCL_ID_PORT, or MASTER_PORT + 1 (torchrun's own store holds
//               MASTER_PORT itself; `trident launch` sets TRIDENT_NCCL_ID_PORT)
//   mpi         MPI_Bcast from rank 0, where the MPI backend is built (mpi/)
//
// The TCP handshake (docs/security.md section 2). The id lets a process join the job's NCCL communicator, so it goes
// only to the job's own ranks:
//   rank 0 -> peer   "TRIDNCC2" nonce[32]                                 a fresh random challenge per connection
//   peer -> rank 0   "TRIDNCH2" rank:u32 nranks:u32 mac[32]               mac = HMAC-SHA256(secret, "hello" nonce
//                                                                         rank nranks)
//   rank 0 -> peer   "TRIDNCI2" id[128] mac[32]                           mac = HMAC-SHA256(secret, "id" nonce rank id)
//                    or "TRIDNCX2" reason:u32                             1 wrong secret, 2 rank already served,
//                                                                         3 WORLD_SIZE differs, 4 rank out of range
// The secret is TRIDENT_JOB_SECRET (`trident launch` makes one per job); without it only a loopback MASTER_ADDR is
// allowed (the MAC is then keyed with the empty string: it still ties the reply to the challenge). Rank 0 serves each
// rank once, handles connections concurrently (a stranger that holds a connection open delays no one), reads at most
// 48 bytes from a peer and gives each connection 5 s; a connection that sends anything else is closed without a byte
// of the id and without taking a rank's place.
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
  // secret: the job's shared secret (at least 16 characters), or "" on a loopback address only.
  TcpExchange(std::string addr, int port, std::chrono::milliseconds timeout = std::chrono::seconds(60),
              std::string secret = "")
      : addr_(std::move(addr)), port_(port), timeout_(timeout), secret_(std::move(secret)) {}
  UniqueId exchange(int rank, int nranks, const MakeId& make) override;

 private:
  std::string addr_;
  int port_;
  std::chrono::milliseconds timeout_;
  std::string secret_;
};

// A new job secret: 32 random bytes as 64 hex digits (what `trident launch` puts in TRIDENT_JOB_SECRET).
std::string make_job_secret();

// What the environment asks for: TRIDENT_NCCL_ID_FILE=PATH -> file; MASTER_ADDR + MASTER_PORT -> tcp on
// TRIDENT_NCCL_ID_PORT (default MASTER_PORT + 1) with TRIDENT_JOB_SECRET; else nullptr (the caller picks in-process
// or MPI). Bad values (a port outside 1..65535, a short secret) throw trident::Error.
std::unique_ptr<IdExchange> exchange_from_env(std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace trident::nccl
