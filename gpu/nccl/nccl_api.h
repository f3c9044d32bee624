// The NCCL entry points NcclCommunicator uses, as a table of function pointers, so that one communicator runs
// over the real library (loaded with dlopen at run time: load_nccl()) or over the fake NCCL that the emulator
// implements (emulator/fake_nccl.h), which lets CI run the NCCL communicator's code on CPU threads.
//
// The types mirror nccl.h's ABI (NCCL 2.x: ncclResult_t, ncclDataType_t, ncclRedOp_t values, the 128-byte unique
// id, streams as opaque pointers). nccl_load.cpp checks them against nccl.h when the header is found at build
// time. Nothing here needs CUDA or NCCL to compile.
#pragma once
#include <cstddef>
#include <source_location>
#include <string>

namespace trident::nccl {

// ncclResult_t
enum Result : int {
  kSuccess = 0,
  kUnhandledCudaError = 1,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,
  kInProgress = 7,
};
// ncclDataType_t
enum DType : int { kInt8 = 0, kUint8 = 1, kInt32 = 2, kUint32 = 3, kInt64 = 4, kUint64 = 5, kFloat16 = 6,
                   kFloat32 = 7, kFloat64 = 8, kBfloat16 = 9 };
// ncclRedOp_t
enum RedOp : int { kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4 };
inline constexpr int kSplitNoColor = -1;  // NCCL_SPLIT_NOCOLOR
inline constexpr size_t kUniqueIdBytes = 128;
struct UniqueId {
  char internal[kUniqueIdBytes];
};
using Comm = struct OpaqueComm*;   // ncclComm_t
using StreamHandle = void*;        // cudaStream_t

// One NCCL implementation. Every pointer is set (load_nccl() refuses a library missing one). `blocking` is the
// communicator's mode (ncclConfig_t::blocking): with 0 every call may return kInProgress and completes when
// comm_get_async_error() stops returning kInProgress.
struct Api {
  const char* name = "";  // "nccl 2.28.9 (/usr/lib/x86_64-linux-gnu/libnccl.so.2)", "fake nccl (emulator)"
  int version = 0;        // NCCL_VERSION_CODE of the implementation
  Result (*get_unique_id)(UniqueId* id) = nullptr;
  Result (*comm_init_rank)(Comm* comm, int nranks, UniqueId id, int rank, int blocking) = nullptr;
  Result (*comm_split)(Comm comm, int color, int key, Comm* newcomm, int blocking) = nullptr;
  Result (*comm_finalize)(Comm comm) = nullptr;
  Result (*comm_destroy)(Comm comm) = nullptr;
  Result (*comm_abort)(Comm comm) = nullptr;
  Result (*comm_get_async_error)(Comm comm, Result* async_error) = nullptr;
  Result (*comm_count)(Comm comm, int* count) = nullptr;
  Result (*comm_user_rank)(Comm comm, int* rank) = nullptr;
  const char* (*get_error_string)(Result r) = nullptr;
  const char* (*get_last_error)(Comm comm) = nullptr;
  Result (*all_gather)(const void* send, void* recv, size_t sendcount, DType t, Comm comm, StreamHandle s) = nullptr;
  Result (*reduce_scatter)(const void* send, void* recv, size_t recvcount, DType t, RedOp op, Comm comm,
                           StreamHandle s) = nullptr;
  Result (*all_reduce)(const void* send, void* recv, size_t count, DType t, RedOp op, Comm comm,
                       StreamHandle s) = nullptr;
  Result (*broadcast)(const void* send, void* recv, size_t count, DType t, int root, Comm comm,
                      StreamHandle s) = nullptr;
  Result (*reduce)(const void* send, void* recv, size_t count, DType t, RedOp op, int root, Comm comm,
                   StreamHandle s) = nullptr;
  Result (*send)(const void* buf, size_t count, DType t, int peer, Comm comm, StreamHandle s) = nullptr;
  Result (*recv)(void* buf, size_t count, DType t, int peer, Comm comm, StreamHandle s) = nullptr;
  Result (*group_start)() = nullptr;
  Result (*group_end)() = nullptr;
  // Optional (nullptr in the real library): names the communicator the next comm_split on this thread creates,
  // so the fake's statistics and reports carry the mesh names ("fsdp*cp", "ep").
  void (*set_next_comm_name)(const char* name) = nullptr;
  // Optional (nullptr in the real library): the caller's site of the next call on this thread, so the fake's
  // mismatch and deadlock reports name the step's line rather than the fake's.
  void (*set_call_site)(const std::source_location* loc) = nullptr;
};

// Loads the real NCCL with dlopen (path: "" tries libnccl.so.2, then libnccl.so). Returns nullptr and sets *why
// when the library or one of its symbols is missing; the table lives until the process exits.
const Api* load_nccl(const std::string& path, std::string* why);

std::string to_string(Result r);

}  // namespace trident::nccl
