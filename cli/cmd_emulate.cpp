// `trident emulate`: the FSDP x CP x EP training step on emulated ranks (docs/parallel.md), optionally checked
// bit for bit against the single-rank reference.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/command.h"
#include "emulator/memory.h"
#include "emulator/run_step.h"
#include "fuzz/layout.h"
#include "golden/checkpoint.h"
#include "gpu/fast/host_kernels.h"
#include "gpu/fast/step_check.h"
#include "gpu/ref/host_kernels.h"
#include "reference/counted.h"
#include "reference/check.h"
#include "reference/repro.h"
#include "sim/collectives.h"
#include "sim/export.h"
#include "sim/hardware.h"
#include "sim/timeline.h"
#ifdef TRIDENT_HAVE_MPI
#include "mpi/run.h"
#endif
#ifdef TRIDENT_HAVE_CUDA
#include "gpu/emu_cuda.h"
#include "gpu/nccl_run.h"
#endif

namespace {

using namespace trident;

struct Opts {
  std::string preset = "tiny";
  std::string config;
  std::string mesh;
  std::string policy;
  int64_t steps = 3;
  int64_t chunks = 1;
  int64_t vocab_slices = 0;
  bool recompute = false;
  bool lower_exact_sum = false;
  std::string comm = "emu";
  std::string plant = "none";  // test hook (docs/fuzz.md): a planted bug of the step
  std::string kernels = "cpu";
  std::string gpu_name;  // --kernels cuda-ref|cuda-fast: the device, for the header
  bool nccl_blocking = false;
  std::string device = "eager";
  int64_t device_seed = 0;
  std::string ranks_as = "fibers";
  int64_t workers = 0;
  bool check_hazards = false;
  bool check = false;
  bool verbose = false;
  int64_t seqs = 4;
  int64_t seq_len = 32;
  double lr = 3e-3;
  int64_t data_seed = 7;
  int64_t docs_per_seq = 1;
  int64_t nvl = 0;    // 0: not given (8 for a 2D-CP mesh)
  int64_t seed = -1;  // -1: the config's
  int64_t token_chunk = 64;
  int64_t experts = 0, top_k = 0, tile = 0, layers = 0, vocab_chunk = 0;
  std::string max_memory;
  std::string save, resume;  // checkpoints (docs/checkpoints.md)
  std::string backend = "emulator";
  int64_t ranks_per_process = 1;
  double mpi_peer_timeout = 6.0;
  double mpi_wait_timeout = 600.0;
  int64_t mpi_chunk_bytes = 0;
  // machine-readable output and the simulated timeline (docs/timeline.md)
  std::string json, trace, timeline, hardware;
  // shapes only (docs/emulator.md "Shapes-only runs")
  bool shapes_only = false;
  std::string routing;         // --routing (shapes only; "" = uniform)
  std::string record_routing;  // --record-routing PATH (a data run writes its router's counts)
  int64_t timeline_ranks = 4;
  bool no_fixed_costs = false;
  bool planner_dtypes = false;  // --planner-dtypes
  int64_t ranks_per_domain = -1;  // --ranks-per-domain (-1: not given, the hardware's NVLink domain)
  bool simulate() const { return !trace.empty() || !timeline.empty() || !hardware.empty(); }
  std::string hardware_name() const { return hardware.empty() ? "h100" : hardware; }
  // The output flags for the repro line.
  std::string repro_flags() const {
    ReproLine r("");
    if (kernels != "cpu") r.opt_nonempty("--kernels", kernels);
    if (backend != "emulator") r.opt("--backend", backend);
    if (backend == "mpi") {
      r.opt_if("--ranks-per-process", ranks_per_process, 1);
      r.opt_if("--mpi-peer-timeout", mpi_peer_timeout, 6.0).opt_if("--mpi-wait-timeout", mpi_wait_timeout, 600.0);
      r.opt_if("--mpi-chunk-bytes", mpi_chunk_bytes, 0);
    }
    r.opt_nonempty("--resume", resume).opt_nonempty("--save", save);
    if (ranks_as != "fibers") r.opt("--ranks-as", ranks_as);
    r.opt_if("--workers", workers, 0);
    r.opt_nonempty("--hardware", hardware).flag("--no-fixed-costs", no_fixed_costs);
    r.flag("--planner-dtypes", planner_dtypes);
    r.opt_if("--ranks-per-domain", ranks_per_domain, -1);
    r.opt_nonempty("--record-routing", record_routing);
    r.opt_nonempty("--json", json).opt_nonempty("--trace", trace);
    r.opt_nonempty("--timeline", timeline);
    if (!timeline.empty()) r.opt_if("--timeline-ranks", timeline_ranks, 4);
    return r.str();
  }
};

std::string mib(int64_t b) { return fmt::format("{:.2f} MiB", static_cast<double>(b) / (1024.0 * 1024.0)); }

// What run() hands to report(): the memory estimate, the repro line and the resumed state (or null).
template <class T>
struct RunInfo {
  emu::MemoryEstimate est;
  std::string repro;
  const model::TrainState<T>* resume = nullptr;
};

// launcher: what starts the command ("mpirun -np 4 " under the MPI backend), so the repro line runs as printed.
template <class T>
std::string print_header(const Opts& o, const emu::EmulateSpec& spec, const std::string& launcher = "") {
  const auto& c = spec.cfg;
  const auto& m = spec.mesh;
  const int64_t W = m.world();
  std::printf("trident emulate: %s attention, %lld layers (%lld dense), %lld experts top-%lld, policy %s, tile %lld\n",
              std::string(to_string(c.attn)).c_str(), static_cast<long long>(c.layers),
              static_cast<long long>(c.dense_layers), static_cast<long long>(c.experts),
              static_cast<long long>(c.top_k), std::string(to_string(c.policy)).c_str(),
              static_cast<long long>(c.tile));
  const int64_t groups = m.d_rep * m.fsdp;
  std::printf("mesh %s: %s; %lld data groups x %lld sequences of %lld tokens, zig-zag over cp = %lld "
              "(%lld local tokens per rank); EP chunks %lld%s\n",
              m.str().c_str(), counted(W, "rank").c_str(), static_cast<long long>(groups),
              static_cast<long long>(spec.run.sequences / std::max<int64_t>(groups, 1)),
              static_cast<long long>(spec.run.seq_len), static_cast<long long>(m.cp),
              static_cast<long long>(spec.run.sequences / std::max<int64_t>(groups, 1) * spec.run.seq_len / m.cp),
              static_cast<long long>(spec.ep_chunks), spec.run.recompute ? ", full recompute" : "");
  if (spec.run.docs_per_seq > 1) {  // packed sequences: the document masks' load balance over the ranks
    const AttentionWork aw = attention_work(m, spec.run.sequences, spec.run.seq_len,
                                            model::synthetic_batch(c, spec.run, spec.first_step).doc_start);
    std::printf("packed sequences: %lld documents per sequence; attention work per rank (query-key pairs per layer, "
                "first step): mean %.1f, max %lld (rank %lld), max/mean %.3f (one document per sequence: %.3f)\n",
                static_cast<long long>(spec.run.docs_per_seq), aw.mean, static_cast<long long>(aw.max),
                static_cast<long long>(aw.argmax), aw.max_over_mean(),
                attention_work(m, spec.run.sequences, spec.run.seq_len, {}).max_over_mean());
  }
  const VocabSlices vs =
      vocab_slices(c.vocab, c.vocab_chunk, m.fsdp * m.cp, spec.vocab_slices);
  int64_t hw = 0, er = 0;
  for (const Range& r : vs.head_cols) hw = std::max(hw, r.end - r.begin);
  for (const Range& r : vs.embed_rows) er = std::max(er, r.end - r.begin);
  std::printf("vocabulary gradients in slices: lm_head %zu x <= %lld columns, embedding %zu x <= %lld rows per shard\n",
              vs.head_cols.size(), static_cast<long long>(hw), vs.embed_rows.size(), static_cast<long long>(er));
  if (o.kernels.starts_with("cpu-ulp:"))
    std::printf("kernels: %s (the CPU kernels with the last bit of one element of one op's first output flipped: a "
                "planted kernel bug)\n",
                o.kernels.c_str());
  if (o.kernels == "cuda-ref-host")
    std::printf("kernels: cuda-ref-host (the CUDA ref tier's kernel bodies, gpu/ref/, run on the CPU)\n");
  if (o.kernels == "cuda-fast-host")
    std::printf("kernels: cuda-fast-host (the fast tier, gpu/fast/: split-K GEMMs, online-softmax attention, chunked "
                "linear CE, on the CPU; compared with tolerances, not bits)\n");
  if ((o.kernels == "cuda-ref" || o.kernels == "cuda-fast") && o.backend != "nccl")
    std::printf("kernels: %s on one GPU (%s): every rank's kernels on its own CUDA stream, its device memory CUDA "
                "managed memory, collectives emulated on the host%s\n",
                o.kernels.c_str(), o.gpu_name.c_str(),
                o.kernels == "cuda-ref" ? "; bitwise the reference" : "; compared with tolerances, not bits");
  if (spec.device.mode == emu::DeviceMode::deferred)
    std::printf("deferred device (seed %llu): work queued per stream, run in a seeded legal order, stream hazards "
                "checked\n",
                static_cast<unsigned long long>(spec.device.seed));
  else if (spec.device.check_hazards)
    std::printf("stream-hazard checker on (every declared access against the streams' event order)\n");
  if (spec.comm == emu::CommBackend::nccl_fake)
    std::printf("communicator: NcclCommunicator over the fake NCCL (%s communicators; exact sums lowered onto "
                "ncclInt64 sums)\n",
                spec.nccl_blocking ? "blocking" : "non-blocking");
  if (spec.shapes_only)
    std::printf("shapes only: device memory has addresses and sizes but no data, kernels and collectives are issued "
                "and traced but not run; EP sizes from routing %s (no loss, no gradients)\n",
                spec.replay ? "replayed" : spec.routing.empty() ? "uniform" : spec.routing.c_str());
  if (spec.lower_exact_sum)
    std::printf("exact_sum lowered onto i64 sums of packed accumulators (exact_f32: 96, exact_f64: 560 bytes per "
                "element on the wire)\n");
  // The exact command: the spec's flags (one builder, reference/repro.h) and the display flag --verbose.
  const std::string repro = launcher + spec.repro(o.check) + (o.verbose ? " --verbose" : "") + o.repro_flags();
  std::printf("repro: %s\n", repro.c_str());
  std::fflush(stdout);
  return repro;
}

template <class T>
int report(const Opts& o, const emu::EmulateSpec& spec, const emu::EmulateResult<T>& r, const RunInfo<T>& info);

// --backend nccl: this process is one rank on one GPU (gpu/nccl_run.h); rank 0 prints.
template <class T>
int run_nccl_backend(const Opts& o, const emu::EmulateSpec& spec) {
#ifdef TRIDENT_HAVE_CUDA
  int rank = -1;
  gpu::NcclRunOptions no;
  no.kernels = o.kernels;
  no.check = o.check;
  no.blocking = o.nccl_blocking;
  no.on_start = [&](const gpu::ProcessPlace& p, const std::string& gpu) {
    rank = p.rank;
    if (rank != 0) return;
    const std::string repro = print_header<T>(o, spec);
    std::printf("NCCL backend: %d process(es), one rank and one GPU each (rank 0: %s); kernels %s; started by "
                "`trident launch --nproc %d -- %s` or torchrun\n",
                p.world, gpu.c_str(), o.kernels.c_str(), p.world,
                repro.substr(repro.starts_with("trident ") ? 8 : 0).c_str());
    std::fflush(stdout);
  };
  no.progress = [&](int64_t s, const RankStepStats& st) {
    if (rank == 0) spec.progress(s, st);
  };
  const emu::RankRunResult r = gpu::run_nccl_process<T>(spec, no);
  if (rank == 0) {
    std::printf("rank 0: device peak %s, step buffers peak %s, %.3f s for %zu steps\n",
                mib(r.device_peak_bytes).c_str(), mib(r.peak_bytes).c_str(), r.seconds, r.steps.size());
    if (o.check) std::printf("%s\n", r.summary().c_str());
  } else if (!r.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, r.summary().c_str());
  }
  return r.ok() ? 0 : 1;
#else
  (void)o, (void)spec;
  fail("--backend nccl: this trident was built without CUDA (no nvcc at configure time, or a sanitizer build)");
#endif
}

template <class T>
int run(const Opts& o, emu::EmulateSpec spec) {
  if (o.backend == "mpi" && (!o.save.empty() || !o.resume.empty()))
    fail("--save and --resume are not supported with --backend mpi yet (use the emulator backend)");
  if (!o.save.empty()) golden::check_save_target(o.save);
  std::unique_ptr<model::TrainState<T>> resume;
  if (!o.resume.empty()) {
    const auto l0 = std::chrono::steady_clock::now();
    golden::CheckpointMeta meta = golden::read_checkpoint_meta(o.resume);
    golden::check_resumable(meta, spec.cfg, spec.run, o.resume);
    resume = std::make_unique<model::TrainState<T>>(golden::load_checkpoint<T>(o.resume, &meta));
    spec.first_step = resume->step;
    std::printf("resumed from %s: %s taken (written by %s on mesh %s), re-sharded onto this mesh; loaded in "
                "%.2f s\n",
                o.resume.c_str(), counted(resume->step, "step").c_str(), meta.writer.c_str(), meta.mesh.spec().c_str(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - l0).count());
  }
  const auto t0 = std::chrono::steady_clock::now();
  StepProgress where;  // rank 0's layer and phase inside a step, shown by the ticker (outlives it)
  std::unique_ptr<cli::Ticker> ticker;  // started with the run: "  ... step 1/3: 20 s so far" on long steps
  spec.progress = [&](int64_t s, const RankStepStats& st) {
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (spec.shapes_only) {
      cli::print_step_line(s + 1, spec.run.steps, s + 1, spec.run.steps, "shapes only (no loss)", el);
      if (ticker) ticker->note(s + 1 < spec.run.steps ? fmt::format("step {}/{}", s + 2, spec.run.steps)
                                                      : std::string("gathering the ranks' results"));
      return;
    }
    const std::string ilos = spec.cfg.dsa() ? fmt::format("  indexer_loss {:.6f}", st.indexer_loss) : std::string();
    cli::print_step_line(spec.first_step + s + 1, spec.first_step + spec.run.steps, s + 1, spec.run.steps,
                         fmt::format("loss {:.6f}{}  grad_norm {:.4f}  clip {:.4f}", st.loss, ilos, st.grad_norm,
                                     st.clip),
                         el);
    if (ticker)
      ticker->note(s + 1 < spec.run.steps
                       ? fmt::format("step {}/{}", spec.first_step + s + 2, spec.first_step + spec.run.steps)
                       : std::string("gathering the ranks' results"));
  };
  spec.keep_tensors = o.check;
  spec.keep_state = !o.save.empty();
  spec.record_trace = o.simulate();
  spec.shapes_only = o.shapes_only;
  spec.routing = o.routing;
  spec.routing_seed = spec.run.data_seed;
  spec.record_routing = !o.record_routing.empty();
  if (!o.routing.empty()) {
    if (!o.shapes_only) fail("--routing needs --shapes-only (a data run routes by its router)");
    (void)parse_routing(o.routing);  // an unknown form fails before the run
  }
  if (o.shapes_only) {
    if (o.check) fail("--shapes-only has no data to compare: drop --check-reference");
    if (!o.save.empty() || !o.resume.empty()) fail("--shapes-only has no data to save or resume");
    if (o.backend != "emulator") fail("--shapes-only runs on --backend emulator");
    if (o.kernels != "cpu") fail("--shapes-only issues the CPU kernel set's launches (drop --kernels)");
    if (!o.record_routing.empty()) fail("--record-routing needs a data run (not --shapes-only)");
  }
  if (!o.record_routing.empty()) {
    if (o.backend != "emulator") fail("--record-routing needs --backend emulator");
    sim::check_writable_file(o.record_routing, "--record-routing");
  }
  if (o.backend == "mpi" && o.simulate())
    fail("--trace, --timeline and --hardware need --backend emulator (the MPI backend does not gather traces)");
  if (o.backend == "nccl") {
    if (o.simulate()) fail("--trace, --timeline and --hardware need --backend emulator");
    return run_nccl_backend<T>(o, spec);
  }
  if (o.no_fixed_costs && !o.simulate()) fail("--no-fixed-costs needs --hardware (or --trace, --timeline)");
  if (o.planner_dtypes && !o.simulate()) fail("--planner-dtypes needs --hardware (or --trace, --timeline)");
  if (o.ranks_per_domain != -1 && o.ranks_per_domain < 1)
    fail(fmt::format("--ranks-per-domain {}: a domain holds at least 1 rank", o.ranks_per_domain));
  if (o.ranks_per_domain != -1 && !o.simulate()) fail("--ranks-per-domain needs --hardware (or --trace, --timeline)");
  if (o.simulate()) (void)sim::hardware_model(o.hardware_name());  // an unknown --hardware fails before the run
  for (const auto& [path, flag] : {std::pair{o.json, "--json"}, {o.trace, "--trace"}, {o.timeline, "--timeline"}})
    if (!path.empty()) sim::check_writable_file(path, flag);
  const int64_t W = spec.mesh.world();
  if (W > emu::kMaxEmulatedRanks)  // emulate() refuses it too; named before the memory estimate of so many ranks
    fail(fmt::format("emulate: mesh {} has {} ranks; the emulator runs one thread per rank and takes at most {}",
                     spec.mesh.str(), W, emu::kMaxEmulatedRanks));
  RunInfo<T> info;
  info.resume = resume.get();
  // Refused here, before any allocation, when the estimate exceeds the available memory or --max-memory.
  emu::EmulateMemoryInputs mi{spec.cfg, spec.run, spec.mesh, spec.ep_chunks, spec.vocab_slices, spec.keep_tensors,
                              o.check};
  mi.lower_exact_sum = spec.lower_exact_sum || spec.comm == emu::CommBackend::nccl_fake;  // NCCL always lowers
  info.est = emu::estimate_emulate(mi);
  // A shapes-only run holds no tensors: the estimate is what the ranks' devices would hold, not this host.
  if (!spec.shapes_only)
    emu::check_memory(info.est, o.max_memory.empty() ? 0 : emu::parse_bytes(o.max_memory), "emulate");
  if (o.backend == "mpi") {
#ifdef TRIDENT_HAVE_MPI
    mpi::FabricOptions fo;
    fo.ranks_per_process = static_cast<int>(o.ranks_per_process);
    fo.peer_timeout_s = o.mpi_peer_timeout;
    fo.wait_timeout_s = o.mpi_wait_timeout;
    fo.chunk_bytes = static_cast<size_t>(o.mpi_chunk_bytes);
    const mpi::MpiRunResult<T> mr = mpi::run_mpi<T>(spec, fo, [&](int p, int np) {
      if (p != 0) return;
      info.repro = print_header<T>(o, spec, fmt::format("mpirun -np {} ", np));
      std::printf("memory estimate: %s\n", info.est.describe().c_str());
      std::printf("MPI backend: %d process(es) x %d rank(s) per process (fibers; in-process exchange in memory, "
                  "between processes over MPI)\n",
                  np, fo.ranks_per_process);
      std::fflush(stdout);
    });
    if (!mr.root) return 0;
    int64_t mx = 0, sum = 0, shared = 0, once = 0;
    for (size_t p = 0; p < mr.process_rss.size(); ++p) {
      const int64_t b = mr.process_rss[p], sh = std::min(mr.process_shared_rss[p], b);
      mx = std::max(mx, b), sum += b, shared = std::max(shared, sh), once += b - sh;
    }
    // The sum counts the pages every process maps (the program, its libraries, MPI's shared memory) once per
    // process; the machine holds them once.
    std::printf("peak RSS per process: max %s, all %d processes %s; %s with shared pages counted once\n",
                mib(mx).c_str(), mr.processes, mib(sum).c_str(), mib(once + shared).c_str());
    std::printf("between processes (MPI): %lld messages, %s, in %lld MPI messages\n",
                static_cast<long long>(mr.remote_messages), mib(mr.remote_bytes).c_str(),
                static_cast<long long>(mr.mpi_messages));
    return report<T>(o, spec, mr.res, info);
#else
    fail("--backend mpi: this trident was built without MPI (install libopenmpi-dev and openmpi-bin, reconfigure)");
#endif
  }
  info.repro = print_header<T>(o, spec);
  if (spec.shapes_only)
    std::printf("device memory estimate per rank (what a data run's ranks would hold): %s; the data run's estimate: "
                "%s\n",
                mib(static_cast<int64_t>(info.est.device_bytes())).c_str(), info.est.describe().c_str());
  else
    std::printf("memory estimate: %s\n", info.est.describe().c_str());
  std::fflush(stdout);
  emu::KernelFactory<T> kernels;  // null: the CPU kernels
  if (o.kernels == "cuda-ref-host") kernels = [](int, Device& dev) { return gpu::make_ref_host_kernels<T>(dev); };
  if (o.kernels == "cuda-fast-host") kernels = [](int, Device& dev) { return gpu::make_fast_host_kernels<T>(dev); };
  if (o.kernels.starts_with("cpu-ulp:")) kernels = fuzz::kernel_factory<T>(fuzz::parse_kernels(o.kernels));
#ifdef TRIDENT_HAVE_CUDA
  if (o.kernels == "cuda-ref") kernels = [](int, Device& dev) { return gpu::make_emu_cuda_ref_kernels<T>(dev); };
  if (o.kernels == "cuda-fast") kernels = [](int, Device& dev) { return gpu::make_emu_cuda_fast_kernels<T>(dev); };
#endif
  ticker = std::make_unique<cli::Ticker>(
      fmt::format("setting up {} and running step {}/{}", counted(spec.mesh.world(), "rank"), spec.first_step + 1,
                  spec.first_step + spec.run.steps));
  spec.where = &where;
  ticker->watch(&where);
  const emu::EmulateResult<T> r = emu::emulate<T>(spec, kernels, resume.get());
  ticker->note(o.check ? "checking against the single-rank reference" : "reporting");
  std::printf("peak RSS of this process: %s\n", mib(cli::peak_rss_bytes()).c_str());
  return report<T>(o, spec, r, info);
}

// --kernels cuda-ref|cuda-fast: W ranks on GPU 0 (gpu/emu_cuda.h), checked before anything is allocated.
void use_gpu(Opts& o, emu::EmulateSpec& spec) {
#ifdef TRIDENT_HAVE_CUDA
  const gpu::EmuGpuInfo gi = gpu::check_emu_gpu();
  o.gpu_name = fmt::format("{}, sm_{}{}", gi.name, gi.major, gi.minor);
  spec.device.memory = &gpu::cuda_managed_memory();
  if (!gi.concurrent) {  // the host may not touch managed memory while a kernel runs: one worker at a time
    spec.exec = emu::RankExec::fibers;
    spec.workers = 1;
    o.gpu_name += "; no concurrent managed access: the ranks run on one worker";
  }
#else
  (void)spec;
  fail("--kernels " + o.kernels + ": this trident was built without CUDA (no nvcc at configure time, or a sanitizer build); "
       "--kernels " + o.kernels + "-host runs the same kernel bodies on the CPU");
#endif
}

// The compute dtype of the hardware model for a precision policy.
std::string sim_dtype(Policy p) { return p == Policy::bf16 ? "bf16" : p == Policy::fp32 ? "f32" : "f64"; }

// Replays the traces on --hardware, prints the summary, writes --trace / --timeline, fills `j` (the JSON part).
sim::Timeline simulate_and_report(const Opts& o, const emu::EmulateSpec& spec, const std::vector<RankTrace>& traces,
                                  nlohmann::json& j) {
  const sim::Hardware& hw = sim::hardware_model(o.hardware_name());
  const std::string dtype = sim_dtype(spec.cfg.policy);
  int64_t entries = 0, trace_bytes = 0;
  for (const RankTrace& t : traces)
    for (const StreamTrace& s : t) {
      entries += static_cast<int64_t>(s.entries.size());
      trace_bytes += s.entries.memory_bytes();
    }
  const auto t0 = std::chrono::steady_clock::now();
  const int domain = o.ranks_per_domain > 0 ? static_cast<int>(o.ranks_per_domain) : hw.nvl_domain;
  sim::Timeline tl = sim::simulate(
      traces, hw,
      {.dtype = dtype,
       .mesh = &spec.mesh,
       .fixed_costs = !o.no_fixed_costs,
       .ranks_per_domain = domain,
       .planner_dtypes = o.planner_dtypes});
  const double replay = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("timeline on %s (%s; compute in %s; %d ranks per NVLink domain%s): %s %s %.3f ms of simulated time; "
              "replayed %lld trace entries (%s) of %zu ranks in %.2f s\n",
              hw.name.c_str(), hw.description.c_str(), dtype.c_str(), domain,
              fmt::format("{}{}", o.no_fixed_costs ? "; no launch or latency costs" : "",
                          o.planner_dtypes ? "; collectives at the planner's dtypes" : "")
                  .c_str(),
              counted(spec.run.steps, "step").c_str(),
              spec.run.steps == 1 ? "takes" : "take",
              tl.makespan * 1e3, static_cast<long long>(entries), mib(trace_bytes).c_str(), traces.size(), replay);
  std::string path;
  for (const auto& [name, v] : tl.path_comm_s)
    if (v > 0) path += fmt::format(", {} {:.3f} us", name, v * 1e6);
  std::printf("  critical path (ends on rank %d, %lld entries): compute %.3f us%s\n", tl.critical_rank,
              static_cast<long long>(tl.path_entries), tl.path_compute_s * 1e6, path.c_str());
  std::vector<int64_t> mp = tl.mem_peak;
  std::sort(mp.begin(), mp.end());
  const int64_t mem_max = mp.empty() ? 0 : mp.back(), mem_median = mp.empty() ? 0 : mp[mp.size() / 2];
  std::printf("  peak device memory over simulated time (alloc/free entries) per rank: max %s, median %s\n",
              mib(mem_max).c_str(), mib(mem_median).c_str());
  std::printf("  exposed communication per mesh dimension (not overlapped by any kernel of the rank): max over ranks "
              "(rank) / critical rank %d\n",
              tl.critical_rank);
  nlohmann::json exposed = nlohmann::json::object();
  for (const auto& [name, v] : tl.exposed_s[static_cast<size_t>(tl.critical_rank)]) {
    int at = 0;
    const double mx = tl.max_exposed(name, &at);
    std::printf("    %-10s %12.3f us (rank %d) / %12.3f us; busy %12.3f us on the critical rank\n", name.c_str(),
                mx * 1e6, at, v * 1e6, tl.comm_busy_s[static_cast<size_t>(tl.critical_rank)].at(name) * 1e6);
    exposed[name] = {{"max_s", mx}, {"max_rank", at}, {"critical_rank_s", v},
                     {"critical_rank_busy_s", tl.comm_busy_s[static_cast<size_t>(tl.critical_rank)].at(name)}};
  }
  nlohmann::json pc = nlohmann::json::object();
  for (const auto& [name, v] : tl.path_comm_s) pc[name] = v;
  j = {{"hardware", hw.name},
       {"fixed_costs", !o.no_fixed_costs},
       {"planner_dtypes", o.planner_dtypes},
       {"ranks_per_domain", domain},
       {"mem_peak_bytes", {{"max", mem_max}, {"median", mem_median}}},
       {"compute_dtype", dtype},
       {"makespan_s", tl.makespan},
       {"critical_rank", tl.critical_rank},
       {"critical_path", {{"compute_s", tl.path_compute_s}, {"comm_s", pc}, {"entries", tl.path_entries}}},
       {"exposed", exposed},
       {"trace_entries", entries},
       {"trace_bytes", trace_bytes}};
  const std::string title = fmt::format("trident emulate --mesh {} on {}", spec.mesh.spec(), hw.name);
  if (!o.trace.empty()) {
    sim::write_text_file(o.trace, sim::trace_events(traces, tl, title).dump() + "\n", "--trace");
    std::printf("wrote %s (Chrome/Perfetto trace events: open in https://ui.perfetto.dev)\n", o.trace.c_str());
  }
  if (!o.timeline.empty()) {
    std::vector<int> ranks;
    const int W = static_cast<int>(traces.size());
    for (int r = 0; r < std::min<int64_t>(W, o.timeline_ranks); ++r) ranks.push_back(r);
    if (std::find(ranks.begin(), ranks.end(), tl.critical_rank) == ranks.end()) ranks.push_back(tl.critical_rank);
    sim::write_text_file(o.timeline, sim::timeline_svg(traces, tl, ranks, title), "--timeline");
    std::printf("wrote %s (SVG timeline of %zu ranks)\n", o.timeline.c_str(), ranks.size());
  }
  std::fflush(stdout);
  return tl;
}

template <class T>
int report(const Opts& o, const emu::EmulateSpec& spec, const emu::EmulateResult<T>& r, const RunInfo<T>& info) {
  const int64_t W = spec.mesh.world();
  const std::string& repro = info.repro;
  const emu::MemoryEstimate& est = info.est;
  std::printf("wall time %.2f s (%.2f s/step)\n", r.seconds,
              r.seconds / static_cast<double>(std::max<int64_t>(spec.run.steps, 1)));
  if (const std::vector<double>& c = r.step_cpu_seconds; !c.empty()) {
    // CPU time beside wall time: on a shared machine the wall time stretches, the CPU time much less.
    const size_t n = c.size();
    std::string after;
    const int64_t first = spec.first_step + 1, last = spec.first_step + static_cast<int64_t>(n);
    if (n > 1)  // the first step also sets the ranks up and touches their memory for the first time
      after = fmt::format("; {}: {:.2f} s/step",
                          n > 2 ? fmt::format("steps {}-{}", first + 1, last) : fmt::format("step {}", last),
                          (c[n - 1] - c[0]) / static_cast<double>(n - 1));
    std::printf("CPU time %.2f s, user + system%s (%.2f s/step%s)\n", c[n - 1],
                o.backend == "mpi" ? " of every process" : "", c[n - 1] / static_cast<double>(n), after.c_str());
  }
  // peak memory per rank
  std::vector<int64_t> pk = r.peak_bytes;
  const auto mx = std::max_element(pk.begin(), pk.end());
  const int64_t max_rank = mx - pk.begin();
  std::sort(pk.begin(), pk.end());
  int64_t sum = 0;
  for (int64_t b : pk) sum += b;
  std::printf("peak memory per rank (tracked buffers: shards, optimizer state, gathered params, accumulators, "
              "activations): min %s, median %s, max %s (rank %lld); all ranks %s\n",
              mib(pk.front()).c_str(), mib(pk[pk.size() / 2]).c_str(), mib(pk.back()).c_str(),
              static_cast<long long>(max_rank), mib(sum).c_str());
  if (!r.device_peak_bytes.empty()) {  // the MPI backend gathers the step's tracked peaks only
    std::vector<int64_t> dp = r.device_peak_bytes;
    const int64_t at = std::max_element(dp.begin(), dp.end()) - dp.begin();
    std::sort(dp.begin(), dp.end());
    std::printf("peak device memory per rank (every device allocation): max %s (rank %lld), median %s; estimated "
                "%s\n",
                mib(dp.back()).c_str(), static_cast<long long>(at), mib(dp[dp.size() / 2]).c_str(),
                mib(static_cast<int64_t>(est.device_bytes())).c_str());
  }
  if (!o.record_routing.empty()) {
    r.routing.save(o.record_routing);
    std::printf("wrote %s (routing counts: %lld steps x %zu MoE layers x %lld ranks x %lld chunks x %lld experts; "
                "replay with --shapes-only --routing file:%s)\n",
                o.record_routing.c_str(), static_cast<long long>(r.routing.steps), r.routing.layers.size(),
                static_cast<long long>(r.routing.ranks), static_cast<long long>(r.routing.chunks),
                static_cast<long long>(r.routing.experts), o.record_routing.c_str());
  }
  // the simulated timeline (with --trace / --timeline / --hardware) and the collectives per mesh dimension
  std::optional<sim::Timeline> tl;
  nlohmann::json tl_json;
  if (o.simulate()) tl = simulate_and_report(o, spec, r.traces, tl_json);
  const std::vector<sim::CollRow> rows = sim::collective_rows(r.total(), spec.mesh, tl ? &*tl : nullptr);
  std::printf("%s", sim::format_collectives(rows, spec.run.steps).c_str());
  std::fflush(stdout);
  if (!o.save.empty()) {
    golden::CheckpointMeta meta;
    meta.writer = "emulate";
    meta.cfg = spec.cfg;
    meta.run = spec.run;
    meta.mesh = spec.mesh;
    meta.ep_chunks = spec.ep_chunks;
    meta.vocab_slices = spec.vocab_slices;
    meta.step = r.state.front().step;
    const auto s0 = std::chrono::steady_clock::now();
    golden::save_checkpoint<T>(o.save, meta, r.state);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
    std::printf("saved checkpoint %s (step %lld: %lld rank files and a manifest) in %.2f s\n", o.save.c_str(),
                static_cast<long long>(meta.step), static_cast<long long>(W), secs);
  }
  nlohmann::json doc;
  if (!o.json.empty()) {
    doc = {{"schema", "trident.run/1"}, {"command", "emulate"}, {"repro", repro}, {"mesh", spec.mesh.spec()},
           {"ranks", W}, {"policy", std::string(to_string(spec.cfg.policy))}, {"wall_seconds", r.seconds}};
    nlohmann::json steps = nlohmann::json::array();
    for (size_t s = 0; s < r.steps.size(); ++s)
      steps.push_back({{"step", spec.first_step + static_cast<int64_t>(s) + 1}, {"loss", r.steps[s].loss},
                       {"grad_norm", r.steps[s].grad_norm}, {"clip", r.steps[s].clip},
                       {"valid_targets", r.steps[s].n_valid}});
    for (size_t s = 0; s < r.steps.size() && s < r.step_cpu_seconds.size(); ++s)
      steps[s]["cpu_seconds"] = r.step_cpu_seconds[s] - (s ? r.step_cpu_seconds[s - 1] : 0.0);
    if (spec.cfg.dsa())
      for (size_t s = 0; s < r.steps.size(); ++s) steps[s]["indexer_loss"] = r.steps[s].indexer_loss;
    doc["steps"] = std::move(steps);
    doc["shapes_only"] = spec.shapes_only;
    if (spec.shapes_only) doc["routing"] = spec.routing.empty() ? "uniform" : spec.routing;
    doc["peak_memory_bytes"] = r.peak_bytes;
    doc["device_peak_bytes"] = r.device_peak_bytes;
    doc["device_estimate_bytes"] = est.device_bytes();
    doc["collectives"] = sim::collectives_json(rows);
    if (tl) doc["timeline"] = tl_json;
  }
  auto write_json = [&] {
    if (o.json.empty()) return;
    sim::write_text_file(o.json, doc.dump(2) + "\n", "--json");
    std::printf("wrote %s (--json: steps, peak memory per rank, collectives%s)\n", o.json.c_str(),
                tl ? ", timeline" : "");
  };
  if (!o.check) {
    write_json();
    return 0;
  }
  std::printf("checking against the single-rank reference (%s)...\n", counted(spec.run.steps, "step").c_str());
  std::fflush(stdout);
  if (o.kernels == "cuda-fast-host" || o.kernels == "cuda-fast") {  // the fast tier: the step rows, not bits
    const gpu::fast::StepCheckReport rep = gpu::fast::check_step_tolerance<T>(spec, r, info.resume);
    for (const auto& ch : rep.checks)
      if (o.verbose || !ch.ok() || ch.what == "loss")
        std::printf("  %s step %lld %-5s %-28s relative difference %.3g (bound %.3g)\n", ch.ok() ? "ok  " : "OVER",
                    static_cast<long long>(ch.step + 1), ch.what.c_str(), ch.name.empty() ? "-" : ch.name.c_str(),
                    ch.rel, ch.bound);
    std::printf("%s\n", rep.summary().c_str());
    if (!rep.ok() && spec.cfg.top_k < spec.cfg.experts)
      std::printf("note: a MoE router or expert gradient far over its bound is usually a routing flip (a token's "
                  "top-k changing under a tiny difference of its router input), which the step rows do not cover; "
                  "a config with top_k = experts rules flips out (docs/gpu.md \"cuda-fast\")\n");
    if (!o.json.empty()) {
      nlohmann::json checks = nlohmann::json::array();
      for (const auto& ch : rep.checks)
        checks.push_back({{"step", ch.step + 1}, {"what", ch.what}, {"name", ch.name}, {"rel", ch.rel},
                          {"bound", ch.bound}});
      doc["check_reference"] = {{"within_tolerance", rep.ok()}, {"summary", rep.summary()}, {"checks", checks}};
    }
    write_json();
    if (!rep.ok()) std::printf("repro: %s\n", repro.c_str());
    return rep.ok() ? 0 : 1;
  }
  const emu::CheckReport rep = emu::check_reference<T>(spec, r, info.resume);
  for (int64_t s = 0; s < spec.run.steps; ++s) {
    int64_t ng = 0, eg = 0, np = 0, ep = 0;
    bool loss_ok = true;
    for (const auto& ch : rep.checks) {
      if (ch.step != s) continue;
      if (ch.what == "loss") loss_ok = ch.equal;
      if (ch.what == "grad") ng++, eg += ch.equal;
      if (ch.what == "param") np++, ep += ch.equal;
    }
    std::printf("  step %lld: loss %s; gradients %lld/%lld bitwise equal; parameters (incl. router biases) %lld/%lld "
                "bitwise equal\n",
                static_cast<long long>(s + 1), loss_ok ? "equal" : "DIFFERS", static_cast<long long>(eg),
                static_cast<long long>(ng), static_cast<long long>(ep), static_cast<long long>(np));
  }
  int shown = 0;
  for (const auto& ch : rep.checks) {
    if (!o.verbose && (ch.equal || shown >= 20)) continue;
    shown += ch.equal ? 0 : 1;
    std::printf("  %s step %lld %-5s %-28s", ch.equal ? "ok  " : "DIFF", static_cast<long long>(ch.step + 1),
                ch.what.c_str(), ch.name.empty() ? "-" : ch.name.c_str());
    if (!ch.equal)
      std::printf(" first index %lld: got %.9g, reference %.9g", static_cast<long long>(ch.first_index), ch.got,
                  ch.want);
    std::printf("\n");
  }
  std::printf("%s\n", rep.summary().c_str());
  if (!o.json.empty()) doc["check_reference"] = {{"bitwise_equal", rep.ok()}, {"summary", rep.summary()}};
  write_json();
  if (!rep.ok()) std::printf("repro: %s\n", repro.c_str());
  return rep.ok() ? 0 : 1;
}

}  // namespace

TRIDENT_COMMAND({"emulate", "run the FSDP x CP x EP training step on emulated ranks (optionally vs the reference)",
                 [](CLI::App& sub) -> trident::cli::Action {
                   auto o = std::make_shared<Opts>();
                   auto* preset = sub.add_option("--preset", o->preset, cli::preset_help())
                                      ->capture_default_str();
                   sub.add_option("--config", o->config, "model config file (.json or .toml); instead of --preset")
                       ->check(CLI::ExistingFile)
                       ->excludes(preset);
                   sub.add_option("--mesh", o->mesh,
                                  "mesh, e.g. d_rep=1,fsdp=2,cp=2,e_fsdp=2,ep=2 (missing keys are 1; "
                                  "d_rep*fsdp*cp must equal e_fsdp*ep; docs/parallel.md section 1 lists the rules)")
                       ->required();
                   sub.add_option("--steps", o->steps, "optimizer steps")->capture_default_str()
                       ->check(cli::int_at_least(0));
                   sub.add_option("--chunks", o->chunks, "EP chunks per MoE layer (tile-aligned)")
                       ->capture_default_str();
                   sub.add_option("--vocab-slices", o->vocab_slices,
                                  "slices the lm_head and embedding gradients are merged and freed in (less "
                                  "memory per rank, more reduce-scatters; bits unchanged); 0: one per vocab chunk")
                       ->capture_default_str();
                   sub.add_flag("--recompute", o->recompute, "full recompute (re-run each layer in backward)");
                   sub.add_flag("--lower-exact-sum", o->lower_exact_sum,
                                "run every exact_sum as an i64 sum of packed accumulators (the lowering a backend "
                                "without a native exact_sum uses; bits unchanged)");
                   sub.add_option("--comm", o->comm,
                                  "communicator: emu (the emulator's) or nccl-fake (the CUDA path's "
                                  "NcclCommunicator over a fake NCCL on the emulator; bits unchanged)")
                       ->check(CLI::Validator(
                           [](std::string& v) -> std::string {
                             if (v == "emu" || v == "nccl-fake" || v.starts_with("emu-drop:")) return {};
                             return "must be emu or nccl-fake, got " + v;
                           },
                           "emu|nccl-fake"))
                       ->capture_default_str();
                   sub.add_option("--plant", o->plant,
                                  "test hook: a planted bug of the step (none, zigzag-off-by-one, chunk-drops-token; "
                                  "docs/fuzz.md)")
                       ->group("");  // hidden, as emu-drop:OP:COUNT of --comm
                   sub.add_option("--kernels", o->kernels,
                                  "kernel set of every rank: cpu (the reference's CPU kernels), cuda-ref-host (the "
                                  "CUDA ref tier's kernel bodies run on the CPU, gpu/ref/; bits unchanged) or "
                                  "cuda-fast-host (the fast tier on the CPU, gpu/fast/; --check-reference compares "
                                  "with the tolerance table's step rows); cuda-ref and cuda-fast run the same tiers "
                                  "as CUDA kernels, every rank on GPU 0 (built with CUDA; docs/gpu.md)")
                       ->check(CLI::Validator(
                           [](std::string& v) -> std::string {
                             for (const char* k : {"cpu", "cuda-ref-host", "cuda-fast-host", "cuda-ref", "cuda-fast"})
                               if (v == k) return {};
                             if (v.starts_with("cpu-ulp:")) return {};  // checked with the op list when run
                             return "must be one of cpu, cuda-ref-host, cuda-fast-host, cuda-ref, cuda-fast, "
                                    "cpu-ulp:OP[:INDEX], got " + v;
                           },
                           "KERNELS"))
                       ->capture_default_str();
                   sub.add_flag("--nccl-blocking", o->nccl_blocking,
                                "with --comm nccl-fake: blocking NCCL communicators (default: non-blocking, "
                                "every call polled to completion)");
                   sub.add_option("--device", o->device,
                                  "emulated device: eager (run work when issued) or deferred (queue it per stream, "
                                  "run it in a seeded legal order, check stream hazards; bits unchanged)")
                       ->check(CLI::IsMember({"eager", "deferred"}))
                       ->capture_default_str();
                   sub.add_option("--ranks-as", o->ranks_as,
                                  "how emulated ranks execute: fibers (user-space fibers on a few worker threads) or "
                                  "threads (one OS thread per rank); bits unchanged")
                       ->check(CLI::IsMember({"fibers", "threads"}))
                       ->capture_default_str();
                   sub.add_option("--workers", o->workers,
                                  "worker threads of --ranks-as fibers (0: one per hardware thread, at most one per "
                                  "rank)")
                       ->check(cli::int_at_least(0))
                       ->capture_default_str();
                   sub.add_option("--device-seed", o->device_seed, "deferred device: the scheduler's seed")
                       ->check(cli::int_at_least(0))
                       ->capture_default_str();
                   sub.add_flag("--check-hazards", o->check_hazards,
                                "check every declared device access against the streams' event order (on in "
                                "deferred mode)");
                   auto* check = sub.add_flag("--check-reference", o->check,
                                              "run the single-rank reference too and compare loss, every gradient "
                                              "and every parameter bit for bit (exit code 1 on any difference)");
                   sub.add_flag("--verbose", o->verbose, "with --check-reference: one line per compared tensor")
                       ->needs(check);
                   sub.add_option("--policy", o->policy, "precision policy fp64|fp32|bf16 (default: the config's)")
                       ->check(CLI::IsMember({"fp64", "fp32", "bf16"}));
                   sub.add_option("--seqs", o->seqs, "sequences per step (global batch)")->capture_default_str()
                       ->check(cli::positive_int());
                   sub.add_option("--seq-len", o->seq_len, "tokens per sequence")->capture_default_str()
                       ->check(cli::int_at_least(2));
                   sub.add_option("--lr", o->lr, "AdamW learning rate")->capture_default_str()
                       ->check(cli::non_negative_number());
                   sub.add_option("--data-seed", o->data_seed, "synthetic data seed")->capture_default_str()
                       ->check(cli::int_at_least(0));
                   sub.add_option("--nvl", o->nvl,
                                  "GPUs per NVLink domain for a 2D-CP mesh (--mesh ...,cp_inner=k: k <= this); "
                                  "default 8")
                       ->check(cli::positive_int());
                   sub.add_option("--docs-per-seq", o->docs_per_seq,
                                  "packed sequences: documents per sequence (cut at positions drawn from the data "
                                  "seed; document masks, RoPE restarts; prints the attention work per rank)")
                       ->capture_default_str()
                       ->check(cli::positive_int());
                   sub.add_option("--seed", o->seed, "parameter init seed (default: the config's seed)")
                       ->check(cli::int_at_least(0));
                   sub.add_option("--token-chunk", o->token_chunk, "linear-CE token chunk (memory only)")
                       ->capture_default_str()
                       ->check(cli::positive_int());
                   sub.add_option("--experts", o->experts, "override the config's routed experts")
                       ->check(cli::positive_int());
                   sub.add_option("--top-k", o->top_k, "override the config's top-k")
                       ->check(cli::positive_int());
                   sub.add_option("--tile", o->tile, "override the config's reduction tile T")
                       ->check(cli::positive_int());
                   sub.add_option("--layers", o->layers, "override the config's layer count")
                       ->check(cli::positive_int());
                   sub.add_option("--vocab-chunk", o->vocab_chunk, "override the config's linear-CE vocab chunk")
                       ->check(cli::positive_int());
                   sub.add_option("--max-memory", o->max_memory,
                                  "refuse the run when its memory estimate exceeds this (bytes, or with a unit: "
                                  "512MiB, 8GiB); default: the memory available on this machine");
                   sub.add_option("--save", o->save,
                                  "after the last step, write a checkpoint directory: one shard file per rank and a "
                                  "manifest (docs/checkpoints.md), replacing it atomically");
                   sub.add_option("--resume", o->resume,
                                  "continue from a checkpoint directory of `emulate` (any mesh: re-sharded onto this "
                                  "one) or `train` (same model, batch, optimizer and data flags), bit for bit");
                   sub.add_option("--backend", o->backend,
                                  "emulator: every rank a thread of this process; mpi: run under mpirun, "
                                  "--ranks-per-process ranks per MPI process (docs/mpi.md); nccl: one process per "
                                  "GPU with the real NCCL, started by `trident launch` or torchrun (needs --kernels "
                                  "cuda-ref or cuda-fast; docs/gpu.md)")
                       ->check(CLI::IsMember({"emulator", "mpi", "nccl"}))
                       ->capture_default_str();
                   sub.add_option("--ranks-per-process", o->ranks_per_process,
                                  "--backend mpi: emulated ranks per MPI process (threads); the mesh must have "
                                  "processes x this ranks")
                       ->check(cli::positive_int())
                       ->capture_default_str();
                   sub.add_option("--mpi-peer-timeout", o->mpi_peer_timeout,
                                  "--backend mpi: seconds without a heartbeat after which a process counts as dead")
                       ->check(CLI::Range(1.0, 3600.0))
                       ->capture_default_str();
                   sub.add_option("--mpi-wait-timeout", o->mpi_wait_timeout,
                                  "--backend mpi: seconds one rank may wait for one message")
                       ->check(CLI::Range(1.0, 86400.0))
                       ->capture_default_str();
                   sub.add_option("--mpi-chunk-bytes", o->mpi_chunk_bytes,
                                  "--backend mpi: largest MPI message payload (0: INT_MAX - 64; small values test "
                                  "the splitting)")
                       ->check(CLI::Range(int64_t{0}, int64_t{2147483583}))
                       ->capture_default_str();
                   sub.add_flag("--shapes-only", o->shapes_only,
                                "issue the step with sizes and no data: device memory, collectives, trace and "
                                "timeline of any model size (docs/emulator.md \"Shapes-only runs\")");
                   sub.add_option("--routing", o->routing,
                                  "shapes only: EP routing counts: uniform (default), zipf:S, dirichlet:A or "
                                  "file:PATH (written by --record-routing)");
                   sub.add_option("--record-routing", o->record_routing,
                                  "write the router's counts per step, layer, rank, chunk and expert to PATH (JSON)");
                   sub.add_option("--json", o->json,
                                  "write the run as JSON: loss per step, peak memory per rank, the collectives "
                                  "table, the repro line, the timeline summary (docs/timeline.md section 6)");
                   sub.add_option("--hardware", o->hardware,
                                  "simulate the step's timeline on a hardware model: h100, h200, gb200-nvl72, "
                                  "gb300-nvl72 (sim/hardware.json; default h100 with --trace or --timeline)");
                   sub.add_option("--ranks-per-domain", o->ranks_per_domain,
                                  "with --hardware: world ranks per NVLink domain, rank r in domain r / N (default: "
                                  "the model's domain, e.g. 72 for gb200-nvl72; a job on 64 GPUs of each rack: 64)");
                   sub.add_flag("--no-fixed-costs", o->no_fixed_costs,
                                "simulate without kernel launch and collective latency costs (the bandwidth-bound "
                                "regime of a production-size model; docs/timeline.md section 7)");
                   sub.add_flag("--planner-dtypes", o->planner_dtypes,
                                "with --hardware: time the collectives at the planner's wire dtypes (fp32 gathers "
                                "and all-to-alls as bf16, exact-accumulator reductions as fp32; docs/timeline.md "
                                "section 2)");
                   sub.add_option("--trace", o->trace,
                                  "write the simulated timeline as Chrome/Perfetto trace-event JSON (one process "
                                  "per rank, one track per stream)");
                   auto* tlopt = sub.add_option("--timeline", o->timeline,
                                                "write an SVG picture of the simulated streams of a few ranks");
                   sub.add_option("--timeline-ranks", o->timeline_ranks,
                                  "with --timeline: the first N ranks are drawn (plus the critical rank)")
                       ->check(CLI::Range(int64_t{1}, int64_t{64}))
                       ->needs(tlopt)
                       ->capture_default_str();
                   return [o]() -> int {
                     emu::EmulateSpec spec;
                     spec.preset = o->config.empty() ? o->preset : "";
                     spec.config_path = o->config;
                     spec.cfg = o->config.empty() ? model::Config::preset(o->preset) : model::Config::load(o->config);
                     if (!o->policy.empty()) spec.cfg.policy = parse_policy(o->policy);
                     if (o->seed >= 0) spec.cfg.seed = static_cast<uint64_t>(o->seed);
                     if (o->experts > 0) spec.cfg.experts = o->experts;
                     if (o->top_k > 0) spec.cfg.top_k = o->top_k;
                     if (o->tile > 0) spec.cfg.tile = o->tile;
                     if (o->layers > 0) spec.cfg.layers = o->layers;
                     if (o->vocab_chunk > 0) spec.cfg.vocab_chunk = o->vocab_chunk;
                     spec.cfg.validate();
                     spec.run.sequences = o->seqs;
                     spec.run.seq_len = o->seq_len;
                     spec.run.steps = o->steps;
                     if (o->check && o->steps < 1) fail("--check-reference needs --steps >= 1 (nothing to compare)");
                     spec.run.recompute = o->recompute;
                     spec.run.lr = o->lr;
                     if (o->data_seed < 0) fail("--data-seed must be >= 0");
                     spec.run.data_seed = static_cast<uint64_t>(o->data_seed);
                     spec.run.token_chunk = o->token_chunk;
                     spec.run.docs_per_seq = o->docs_per_seq;
                     spec.run.validate();
                     spec.run.validate_for(spec.cfg);  // bounds and overflow-checked sizes of this model and batch
                     spec.mesh = parse_mesh(o->mesh);
                     if (o->nvl > 0 && !spec.mesh.cp_2d()) fail("--nvl needs a 2D-CP mesh (--mesh ...,cp_inner=k)");
                     spec.nvl = o->nvl > 0 ? o->nvl : 8;
                     spec.ep_chunks = o->chunks;
                     spec.vocab_slices = o->vocab_slices;
                     spec.lower_exact_sum = o->lower_exact_sum;
                     spec.comm = o->comm == "nccl-fake" ? emu::CommBackend::nccl_fake : emu::CommBackend::emu;
                     if (o->comm.starts_with("emu-drop:")) {  // the planted communicator (test hook, docs/fuzz.md)
                       const auto [op, n] = emu::parse_comm_drop(o->comm);
                       spec.drop_op = op;
                       spec.drop_count = n;
                     }
                     spec.plant = emu::parse_plant(o->plant);
                     if (o->kernels.starts_with("cpu-ulp:")) (void)fuzz::parse_kernels(o->kernels);
                     if (o->nccl_blocking && spec.comm != emu::CommBackend::nccl_fake && o->backend != "nccl")
                       fail("--nccl-blocking needs --comm nccl-fake or --backend nccl");
                     spec.nccl_blocking = o->nccl_blocking;
                     spec.device.mode = o->device == "deferred" ? emu::DeviceMode::deferred : emu::DeviceMode::eager;
                     spec.exec = o->ranks_as == "threads" ? emu::RankExec::threads : emu::RankExec::fibers;
                     if (o->workers > 4096) fail("--workers: at most 4096 worker threads (got " + std::to_string(o->workers) + ")");
                     spec.workers = static_cast<int>(o->workers);
                     spec.device.seed = static_cast<uint64_t>(o->device_seed);
                     spec.device.check_hazards = o->check_hazards;
                     if (o->backend != "mpi" && o->ranks_per_process != 1)
                       fail("--ranks-per-process needs --backend mpi");
                     if (o->kernels != "cpu" && o->backend == "mpi")
                       fail("--kernels " + o->kernels + " needs --backend emulator (the MPI backend runs the CPU "
                            "kernels)");
                     if (o->backend == "nccl") {  // one process per GPU: the CUDA kernels, NCCL's communicator
                       if (o->kernels != "cuda-ref" && o->kernels != "cuda-fast")
                         fail("--backend nccl runs the CUDA kernels: add --kernels cuda-ref (bitwise) or cuda-fast");
                       if (o->comm != "emu" || spec.device.mode != emu::DeviceMode::eager || o->check_hazards ||
                           o->lower_exact_sum || !o->save.empty() || !o->resume.empty() || !o->json.empty() ||
                           !o->max_memory.empty() || o->ranks_as != "fibers" || o->workers != 0)
                         fail("--backend nccl: --comm, --device deferred, --check-hazards, --lower-exact-sum, --save, "
                              "--resume, --json, --max-memory, --ranks-as and --workers need --backend emulator (one "
                              "rank per process; NCCL's communicator always lowers exact sums)");
                     } else if (o->kernels == "cuda-ref" || o->kernels == "cuda-fast") {
                       use_gpu(*o, spec);
                     }
                     if (o->kernels != "cpu" && o->check_hazards)
                       fail("--check-hazards sees no accesses of the " + o->kernels + " kernels (they declare none): drop "
                            "--check-hazards or use --kernels cpu");
                     (void)vocab_slices(spec.cfg.vocab, spec.cfg.vocab_chunk, spec.mesh.fsdp * spec.mesh.cp,
                                                  spec.vocab_slices);
                     // Every mesh rule at once, each naming the flag to change (parallel/layout.h).
                     validate(spec.mesh, {.experts = spec.cfg.experts,
                                                    .sequences = spec.run.sequences,
                                                    .seq_len = spec.run.seq_len,
                                                    .tile = spec.cfg.tile,
                                                    .ep_chunks = spec.ep_chunks,
                                                    .nvl = spec.nvl});
                     if (spec.cfg.policy == Policy::fp64) return run<double>(*o, spec);
                     return run<float>(*o, spec);
                   };
                 }});
