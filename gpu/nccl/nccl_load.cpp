// load_nccl(): the real NCCL through dlopen. When nccl.h was found at build time (TRIDENT_HAVE_NCCL_H) the mirrored
// types are checked against it and communicators are created with ncclConfig_t (blocking or not); without the
// header, ncclCommInitRank / ncclCommSplit(config = NULL) give blocking communicators.
#include <dlfcn.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "gpu/nccl/nccl_api.h"
#include "gpu/nccl/nvidia_libs.h"
#ifdef TRIDENT_HAVE_NCCL_H
#include <nccl.h>
static_assert(sizeof(ncclUniqueId) == trident::nccl::kUniqueIdBytes);
#define TRIDENT_SAME(a, b) static_assert(static_cast<int>(a) == static_cast<int>(trident::nccl::b), #a)
TRIDENT_SAME(ncclSuccess, kSuccess);
TRIDENT_SAME(ncclSystemError, kSystemError);
TRIDENT_SAME(ncclInvalidArgument, kInvalidArgument);
TRIDENT_SAME(ncclRemoteError, kRemoteError);
TRIDENT_SAME(ncclInProgress, kInProgress);
TRIDENT_SAME(ncclUint8, kUint8);
TRIDENT_SAME(ncclInt32, kInt32);
TRIDENT_SAME(ncclInt64, kInt64);
TRIDENT_SAME(ncclFloat32, kFloat32);
TRIDENT_SAME(ncclFloat64, kFloat64);
TRIDENT_SAME(ncclBfloat16, kBfloat16);
TRIDENT_SAME(ncclSum, kSum);
TRIDENT_SAME(ncclMax, kMax);
TRIDENT_SAME(ncclMin, kMin);
TRIDENT_SAME(NCCL_SPLIT_NOCOLOR, kSplitNoColor);
#undef TRIDENT_SAME
#endif

namespace trident::nccl {
namespace {

using C = Comm;
struct Syms {
  Result (*get_version)(int*);
  Result (*get_unique_id)(UniqueId*);
  Result (*init_rank)(C*, int, UniqueId, int);
  Result (*init_rank_config)(C*, int, UniqueId, int, void*);
  Result (*split)(C, int, int, C*, void*);
  Result (*finalize)(C);
  Result (*destroy)(C);
  Result (*abort)(C);
  Result (*async_error)(C, Result*);
  Result (*count)(C, int*);
  Result (*user_rank)(C, int*);
  const char* (*error_string)(Result);
  const char* (*last_error)(C);
  Result (*all_gather)(const void*, void*, size_t, DType, C, StreamHandle);
  Result (*reduce_scatter)(const void*, void*, size_t, DType, RedOp, C, StreamHandle);
  Result (*all_reduce)(const void*, void*, size_t, DType, RedOp, C, StreamHandle);
  Result (*broadcast)(const void*, void*, size_t, DType, int, C, StreamHandle);
  Result (*reduce)(const void*, void*, size_t, DType, RedOp, int, C, StreamHandle);
  Result (*send)(const void*, size_t, DType, int, C, StreamHandle);
  Result (*recv)(void*, size_t, DType, int, C, StreamHandle);
  Result (*group_start)();
  Result (*group_end)();
};
Syms g{};
Api g_api{};
std::string g_name;

Result init_rank(C* c, int n, UniqueId id, int r, int blocking) {
#ifdef TRIDENT_HAVE_NCCL_H
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = blocking;
  return g.init_rank_config(c, n, id, r, &cfg);
#else
  if (!blocking) return kInvalidUsage;  // non-blocking communicators need ncclConfig_t from nccl.h
  return g.init_rank(c, n, id, r);
#endif
}
Result split(C c, int color, int key, C* out, int blocking) {
#ifdef TRIDENT_HAVE_NCCL_H
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = blocking;
  return g.split(c, color, key, out, &cfg);
#else
  (void)blocking;
  return g.split(c, color, key, out, nullptr);
#endif
}

template <class F>
bool sym(void* lib, const char* name, F& f, std::string* why) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  if (!f && why) *why = std::string("NCCL library lacks ") + name;
  return f != nullptr;
}

}  // namespace

std::string to_string(Result r) {
  switch (r) {
    case kSuccess: return "ncclSuccess";
    case kUnhandledCudaError: return "ncclUnhandledCudaError";
    case kSystemError: return "ncclSystemError";
    case kInternalError: return "ncclInternalError";
    case kInvalidArgument: return "ncclInvalidArgument";
    case kInvalidUsage: return "ncclInvalidUsage";
    case kRemoteError: return "ncclRemoteError";
    case kInProgress: return "ncclInProgress";
  }
  return "ncclResult " + std::to_string(static_cast<int>(r));
}

const Api* load_nccl(const std::string& path, std::string* why) {
  static std::mutex mu;
  std::lock_guard lk(mu);
  if (g_api.get_unique_id) return &g_api;
  std::string tried;
  // the loader's search, then the wheel folders (site-packages/nvidia/nccl/lib) where images install NCCL
  void* lib = path.empty() ? dlopen_nvidia({"libnccl.so.2", "libnccl.so"}, "nccl", &tried)
                           : dlopen_nvidia({path}, "nccl", &tried);
  if (!lib) {
    if (why) *why = "cannot load NCCL: " + tried;
    return nullptr;
  }
  g_name = library_path(lib);
  if (g_name.empty()) g_name = path.empty() ? "libnccl.so.2" : path;
  bool ok = sym(lib, "ncclGetVersion", g.get_version, why) && sym(lib, "ncclGetUniqueId", g.get_unique_id, why) &&
            sym(lib, "ncclCommInitRank", g.init_rank, why) &&
            sym(lib, "ncclCommInitRankConfig", g.init_rank_config, why) &&
            sym(lib, "ncclCommSplit", g.split, why) && sym(lib, "ncclCommFinalize", g.finalize, why) &&
            sym(lib, "ncclCommDestroy", g.destroy, why) && sym(lib, "ncclCommAbort", g.abort, why) &&
            sym(lib, "ncclCommGetAsyncError", g.async_error, why) && sym(lib, "ncclCommCount", g.count, why) &&
            sym(lib, "ncclCommUserRank", g.user_rank, why) && sym(lib, "ncclGetErrorString", g.error_string, why) &&
            sym(lib, "ncclGetLastError", g.last_error, why) && sym(lib, "ncclAllGather", g.all_gather, why) &&
            sym(lib, "ncclReduceScatter", g.reduce_scatter, why) && sym(lib, "ncclAllReduce", g.all_reduce, why) &&
            sym(lib, "ncclBroadcast", g.broadcast, why) && sym(lib, "ncclReduce", g.reduce, why) &&
            sym(lib, "ncclSend", g.send, why) && sym(lib, "ncclRecv", g.recv, why) &&
            sym(lib, "ncclGroupStart", g.group_start, why) && sym(lib, "ncclGroupEnd", g.group_end, why);
  if (!ok) {
    dlclose(lib);
    g = Syms{};
    return nullptr;
  }
  int v = 0;
  g.get_version(&v);
  g_name = "nccl " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100) +
           " (" + g_name + ")";
  Api a;
  a.name = g_name.c_str();
  a.version = v;
  a.get_unique_id = g.get_unique_id;
  a.comm_init_rank = init_rank;
  a.comm_split = split;
  a.comm_finalize = g.finalize;
  a.comm_destroy = g.destroy;
  a.comm_abort = g.abort;
  a.comm_get_async_error = g.async_error;
  a.comm_count = g.count;
  a.comm_user_rank = g.user_rank;
  a.get_error_string = g.error_string;
  a.get_last_error = g.last_error;
  a.all_gather = g.all_gather;
  a.reduce_scatter = g.reduce_scatter;
  a.all_reduce = g.all_reduce;
  a.broadcast = g.broadcast;
  a.reduce = g.reduce;
  a.send = g.send;
  a.recv = g.recv;
  a.group_start = g.group_start;
  a.group_end = g.group_end;
  g_api = a;
  return &g_api;
}

}  // namespace trident::nccl
