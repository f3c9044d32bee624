// One process per GPU (gpu/nccl_run.h).
#include "gpu/nccl_run.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>

#include "gpu/cuda_device.h"
#include "gpu/fast/cuda_kernels.h"
#include "gpu/nccl/nccl_bootstrap.h"
#include "gpu/nccl/nccl_comm.h"
#include "gpu/ref/cuda_kernels.h"
#include "reference/check.h"

namespace trident::gpu {
namespace {

int env_int(const char* name, int lo, int hi, const int* fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) {
    if (fallback) return *fallback;
    fail(fmt::format("--backend nccl: {} is not set (one process per GPU: start the processes with `trident launch "
                     "--nproc N -- emulate ...` or torchrun, which set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and "
                     "MASTER_PORT)",
                     name));
  }
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  if (errno != 0 || !end || *end != '\0' || x < lo || x > hi)
    fail(fmt::format("--backend nccl: {}='{}' is not an integer in [{}, {}]", name, v, lo, hi));
  return static_cast<int>(x);
}

}  // namespace

ProcessPlace process_place_from_env() {
  ProcessPlace p;
  p.world = env_int("WORLD_SIZE", 1, 1 << 20, nullptr);
  p.rank = env_int("RANK", 0, p.world - 1, nullptr);
  p.local_rank = env_int("LOCAL_RANK", 0, 1 << 16, &p.rank);
  return p;
}

namespace {
template <class T>
emu::RankRunResult run_placed(const emu::EmulateSpec& spec, const NcclRunOptions& opt, const ProcessPlace& place);
}  // namespace

template <class T>
emu::RankRunResult run_nccl_process(const emu::EmulateSpec& spec, const NcclRunOptions& opt) {
  TD_CHECK(opt.kernels == "cuda-ref" || opt.kernels == "cuda-fast",
           "--backend nccl runs the CUDA kernels: --kernels cuda-ref or cuda-fast (got {})", opt.kernels);
  TD_CHECK(!opt.check || opt.kernels == "cuda-ref",
           "--backend nccl --check-reference compares bits, which only --kernels cuda-ref promises (the fast tier's "
           "step rows need whole tensors: `emulate --kernels cuda-fast --check-reference` on one GPU)");
  const ProcessPlace place = process_place_from_env();
  try {  // every error of a process names its rank (the launcher shows all processes' lines together)
    return run_placed<T>(spec, opt, place);
  } catch (const Error& e) {
    fail(fmt::format("rank {} of {}: {}", place.rank, place.world, e.what()));
  }
}

namespace {
template <class T>
emu::RankRunResult run_placed(const emu::EmulateSpec& spec, const NcclRunOptions& opt, const ProcessPlace& place) {
  if (place.world != spec.mesh.world())
    fail(fmt::format("--backend nccl: WORLD_SIZE is {} but mesh {} has {} ranks (one process per rank)", place.world,
                     spec.mesh.str(), spec.mesh.world()));
  std::unique_ptr<nccl::IdExchange> ex = nccl::exchange_from_env(opt.timeout);
  if (!ex && place.world > 1)
    fail("--backend nccl: no way to exchange NCCL's unique id: set MASTER_ADDR and MASTER_PORT (rank 0 listens "
         "there) or TRIDENT_NCCL_ID_FILE (a fresh path on a shared file system)");
  CudaDevice dev(place.local_rank);
  std::string why;
  const nccl::Api* api = nccl::load_nccl(opt.nccl_library, &why);
  if (!api) fail("--backend nccl: " + why);
  const auto make = [&] {
    nccl::UniqueId id;
    const nccl::Result r = api->get_unique_id(&id);
    if (r != nccl::kSuccess) fail("ncclGetUniqueId failed: " + nccl::to_string(r));
    return id;
  };
  const nccl::UniqueId id = ex ? ex->exchange(place.rank, place.world, make) : make();
  NcclOptions no;
  no.blocking = opt.blocking;
  no.deadline = opt.timeout;
  std::unique_ptr<NcclCommunicator> world =
      NcclCommunicator::init(*api, id, place.world, place.rank, dev, "world", no);
  cudaDeviceProp prop{};
  (void)cudaGetDeviceProperties(&prop, place.local_rank);
  if (opt.on_start)
    opt.on_start(place, fmt::format("{} (GPU {}, sm_{}{}), {}", prop.name, place.local_rank, prop.major, prop.minor,
                                    api->name));
  std::unique_ptr<Kernels<T>> k =
      opt.kernels == "cuda-ref" ? make_cuda_ref_kernels<T>(dev) : make_cuda_fast_kernels<T>(dev);
  return emu::run_rank<T>(spec, *world, dev, *k, {.check = opt.check, .progress = opt.progress});
}
}  // namespace

template emu::RankRunResult run_nccl_process<float>(const emu::EmulateSpec&, const NcclRunOptions&);
template emu::RankRunResult run_nccl_process<double>(const emu::EmulateSpec&, const NcclRunOptions&);

}  // namespace trident::gpu
