// `trident golden`, `trident check`, `trident paired`: goldens for kernel authors (docs/golden.md).
//
//   golden  runs one step of a preset on emulated ranks with a recording kernel set and writes
//           DIR/primitives.h5 (per-primitive inputs/outputs, per-rank shards and communication traces) and
//           DIR/state.h5 (the single-rank state dump, with AdamW moments and the step counter).
//   check   recomputes every primitive of a golden with a backend's kernel set and compares.
//   paired  runs two implementations on the same inputs (one primitive, or the whole step) and reports loss,
//           gradient, peak memory and time with their ratios, in one run.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "emulator/device.h"
#include "emulator/memory.h"
#include "emulator/run_step.h"
#include "golden/plugin.h"
#include "golden/primitives/primitives.h"
#include "golden/state_dump.h"
#include "golden/primitives/accept.h"
#include "gpu/fast/host_kernels.h"
#include "gpu/ref/host_kernels.h"
#include "reference/counted.h"
#include "reference/atomic_write.h"
#include "reference/check.h"
#include "reference/model/train.h"
#include "reference/repro.h"
#ifdef TRIDENT_HAVE_CUDA
#include "gpu/cuda_device.h"
#include "gpu/gemm.h"
#include "gpu/fast/cuda_kernels.h"
#include "gpu/ref/cuda_kernels.h"
#endif

namespace {

using namespace trident;
namespace fs = std::filesystem;

// ---- shared: the spec of a preset run --------------------------------------------------------------------------
struct RunOpts {
  std::string preset = "tiny";
  std::string mesh = "d_rep=1";
  std::string policy;
  int64_t seqs = 2;
  int64_t seq_len = 16;
  int64_t chunks = 1;
  int64_t steps = 1;
  int64_t docs_per_seq = 1;  // packed sequences (docs/model.md)
};

void add_run_options(CLI::App& sub, RunOpts& o) {
  sub.add_option("--preset", o.preset, cli::preset_help())->capture_default_str();
  sub.add_option("--mesh", o.mesh, "mesh, e.g. d_rep=1,fsdp=2,cp=2,e_fsdp=2,ep=2 (missing keys are 1)")
      ->capture_default_str();
  sub.add_option("--policy", o.policy, "precision policy fp64|fp32|bf16 (default: the preset's)");
  sub.add_option("--seqs", o.seqs, "sequences per step")->capture_default_str()->check(cli::positive_int());
  sub.add_option("--seq-len", o.seq_len, "tokens per sequence")->capture_default_str()->check(cli::positive_int());
  sub.add_option("--chunks", o.chunks, "EP token chunks per MoE layer")->capture_default_str()
      ->check(cli::positive_int());
  sub.add_option("--docs-per-seq", o.docs_per_seq,
                 "packed sequences: documents per sequence (the document-mask ops are captured; docs/model.md)")
      ->capture_default_str()
      ->check(cli::positive_int());
}

emu::EmulateSpec make_spec(const RunOpts& o, int64_t steps) {
  emu::EmulateSpec spec;
  spec.preset = o.preset;
  spec.cfg = model::Config::preset(o.preset);
  if (!o.policy.empty()) spec.cfg.policy = parse_policy(o.policy);
  spec.cfg.validate();
  spec.run.sequences = o.seqs;
  spec.run.seq_len = o.seq_len;
  spec.run.steps = steps;
  spec.run.docs_per_seq = o.docs_per_seq;
  spec.run.validate();
  spec.run.validate_for(spec.cfg);
  spec.mesh = parse_mesh(o.mesh);
  spec.ep_chunks = o.chunks;
  validate(spec.mesh, {.experts = spec.cfg.experts,
                       .sequences = spec.run.sequences,
                       .seq_len = spec.run.seq_len,
                       .tile = spec.cfg.tile,
                       .ep_chunks = spec.ep_chunks});
  spec.keep_tensors = false;
  return spec;
}

// ---- golden ----------------------------------------------------------------------------------------------------
struct GoldenOpts {
  RunOpts run;
  std::string out;
  int cases = 2;
  std::string max_memory;
};

// Upper bounds of the count options (docs/golden.md "Commands"): beyond them a run is a mistake, not a bigger run.
constexpr int kMaxCasesPerOp = 64;
constexpr int kMaxRepeats = 10000;

// The memory a run of `spec` needs (emulate's estimate; with `reference`, the single-rank trainer of the state dump
// on top), `runs` times over; refused with the numbers before any allocation, as train and emulate do.
void check_run_memory(const emu::EmulateSpec& spec, bool reference, int runs, const std::string& max_memory,
                      const std::string& what) {
  const int64_t W = spec.mesh.world();
  if (W > emu::kMaxEmulatedRanks)
    fail(fmt::format("{}: mesh {} has {} ranks; the emulator runs one thread per rank and takes at most {}", what,
                     spec.mesh.str(), W, emu::kMaxEmulatedRanks));
  emu::EmulateMemoryInputs mi{spec.cfg, spec.run, spec.mesh, spec.ep_chunks, spec.vocab_slices, spec.keep_tensors,
                              reference};
  emu::MemoryEstimate est = emu::estimate_emulate(mi);
  if (runs > 1) {
    for (auto* parts : {&est.per_rank, &est.host})
      for (emu::MemoryPart& p : *parts) p.bytes *= runs;
  }
  emu::check_memory(est, max_memory.empty() ? 0 : emu::parse_bytes(max_memory), what);
}

// A golden written before the checksum and the case manifest existed: still read, with this note.
void note_unsealed(const golden::PrimitivesFile& f, const std::string& path) {
  if (f.checksum) return;
  std::printf("note: %s has no checksum and no case manifest (written before they existed): a flipped data bit or a "
              "deleted case goes unnoticed; its repro command writes a file with both\n",
              path.c_str());
}

template <class T>
golden::NamedTensor tensor(const std::string& name, const Tensor<T>& t) {
  return golden::make_tensor(name, t.shape, std::span<const T>(t.data.data(), t.data.size()));
}

template <class T>
int run_golden(const GoldenOpts& o) {
  emu::EmulateSpec spec = make_spec(o.run, 1);
  spec.record_trace = true;
  check_run_memory(spec, true, 1, o.max_memory, "golden");
  std::error_code ec;
  fs::create_directories(o.out, ec);
  if (ec || !fs::is_directory(o.out)) fail(fmt::format("--out '{}': cannot create the directory", o.out));
  const std::string prim_path = (fs::path(o.out) / "primitives.h5").string();
  const std::string state_path = (fs::path(o.out) / "state.h5").string();
  const std::string repro =
      fmt::format("trident golden --preset {} --mesh {} --policy {} --seqs {} --seq-len {} --chunks {} --steps {} "
                  "--cases-per-op {}{} --out {}",
                  o.run.preset, spec.mesh.spec(), to_string(spec.cfg.policy), o.run.seqs, o.run.seq_len,
                  o.run.chunks, o.run.steps, o.cases,
                  o.run.docs_per_seq > 1 ? fmt::format(" --docs-per-seq {}", o.run.docs_per_seq) : "",
                  ReproLine::quote(o.out));
  std::printf("repro: %s\n", repro.c_str());
  std::fflush(stdout);
  golden::Recorder rec(o.cases, fmt::format("{} && trident check {} --backend cpu", repro, o.out));
  emu::KernelFactory<T> factory = [&](int rank, Device& dev) {
    return golden::make_recording_kernels<T>(std::make_unique<CpuKernels<T>>(dev), dev, rank, rec);
  };
  const emu::EmulateResult<T> r = emu::emulate<T>(spec, factory);
  golden::PrimitivesFile f;
  f.config = spec.cfg.to_json();
  f.mesh = {{"spec", spec.mesh.spec()}, {"ep_chunks", spec.ep_chunks}, {"sequences", spec.run.sequences},
            {"seq_len", spec.run.seq_len}};
  f.repro = repro;
  f.ranks = static_cast<int>(spec.mesh.world());
  f.cases = rec.take();
  for (const RankTrace& t : r.traces) f.comm.push_back(golden::comm_records(t));
  golden::write_primitives(prim_path, f);
  std::vector<std::string> ops;
  for (const auto& c : f.cases)
    if (std::find(ops.begin(), ops.end(), c.op) == ops.end()) ops.push_back(c.op);
  std::printf("wrote %s: %zu cases of %zu ops over %d rank(s), step loss %.6f\n", prim_path.c_str(), f.cases.size(),
              ops.size(), f.ranks, r.steps.empty() ? 0.0 : r.steps[0].loss);

  if (spec.run.docs_per_seq > 1) {  // (as `train --dump` refuses packed sequences)
    std::error_code rm;
    fs::remove(state_path, rm);  // never leave a state dump of another run next to these primitives
    std::printf("no %s: the state dump schema stores no document boundaries (docs/golden.md); primitives only\n",
                state_path.c_str());
    return 0;
  }
  // The single-rank state dump of step `steps`, with the AdamW moments.
  model::RunConfig rc = spec.run;
  rc.steps = o.run.steps;
  model::Trainer<T> tr(spec.cfg, rc);
  for (int64_t s = 0; s < o.run.steps; ++s) {
    const model::Batch batch = model::synthetic_batch(spec.cfg, rc, s);
    const bool last = s + 1 == o.run.steps;
    model::ParamSet<T> before, mb, vb;
    if (last) before = tr.params, mb = tr.m, vb = tr.v;
    const model::StepStats st = tr.step(batch);
    if (!last) continue;
    golden::StateDump d;
    d.config = spec.cfg.to_json();
    d.seed = spec.cfg.seed;
    d.repro = repro;
    d.tokens = golden::make_tensor("tokens", {batch.B, batch.S}, std::span<const int32_t>(batch.tokens));
    d.targets = golden::make_tensor("targets", {batch.B, batch.S}, std::span<const int32_t>(batch.targets));
    d.loss = st.loss;
    for (size_t p = 0; p < tr.params.size(); ++p) {
      const std::string& n = tr.params.info[p].name;
      d.weights.push_back(tensor(n, before.t[p]));
      d.grads.push_back(tensor(n, tr.grads.t[p]));
      d.weights_after.push_back(tensor(n, tr.params.t[p]));
      d.adam_m.push_back(tensor(n, mb.t[p]));
      d.adam_v.push_back(tensor(n, vb.t[p]));
      d.adam_m_after.push_back(tensor(n, tr.m.t[p]));
      d.adam_v_after.push_back(tensor(n, tr.v.t[p]));
    }
    d.step = tr.step_count;
    d.optimizer = model::adamw_hyper(rc).to_json();
    d.optimizer["step"] = tr.step_count;
    d.optimizer["clip_coef"] = st.clip;
    d.optimizer["grad_norm"] = st.grad_norm;
    d.optimizer["decay"] = "matrices only (rank >= 2); router_bias is a buffer updated by bias_rate";
    d.optimizer["run"] = rc.to_json();
    golden::write_state(state_path, d);
    std::printf("wrote %s (step %lld: weights, grads, weights_after and AdamW moments of %zu tensors)\n",
                state_path.c_str(), static_cast<long long>(tr.step_count), tr.params.size());
  }
  return 0;
}

// ---- backends ----------------------------------------------------------------------------------------------------
struct Backend {
  std::string spec;          // as given
  std::string name;          // cpu | cpu-ulp
  std::string perturb_op;    // cpu-ulp: the op whose first output gets one ulp flipped
  int64_t perturb_index = 0;
  const golden::LoadedPlugin* plugin = nullptr;  // plugin:PATH.so (golden/plugin.h; loaded once, kept loaded)
};
// "cpu", "cpu-ulp:OP[:INDEX]"; cuda-ref / cuda-fast are named but not built into this binary.
Backend parse_backend(const std::string& s) {
  if (s == "cpu") return {s, "cpu", "", 0};
  // plugin:PATH.so: a kernel set built outside this tree (docs/plugins.md), loaded and ABI-checked here.
  if (s.rfind("plugin:", 0) == 0) {
    Backend b{s, "plugin", "", 0};
    const std::string path = s.substr(7), own = "plugin '" + path + "': ";
    try {
      b.plugin = &golden::load_plugin(path);
    } catch (const Error& e) {  // "plugin 'P': why" -> "--backend plugin:P: why"
      const std::string why = e.what();
      fail(fmt::format("--backend {}: {}", s, why.rfind(own, 0) == 0 ? why.substr(own.size()) : why));
    }
    return b;
  }
  if (s.rfind("cpu-ulp:", 0) == 0) {
    Backend b{s, "cpu-ulp", s.substr(8), 0};
    if (const size_t c = b.perturb_op.find(':'); c != std::string::npos) {
      const std::string idx = b.perturb_op.substr(c + 1);
      b.perturb_op = b.perturb_op.substr(0, c);
      size_t used = 0;
      try {
        b.perturb_index = std::stoll(idx, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != idx.size() || idx.empty() || b.perturb_index < 0)
        fail(fmt::format("backend '{}': the element index must be an integer >= 0", s));
    }
    const auto& ops = golden::kernel_ops();
    if (std::find(ops.begin(), ops.end(), b.perturb_op) == ops.end())
      fail(fmt::format("backend '{}': unknown op '{}' (one of: {})", s, b.perturb_op, fmt::join(ops, ", ")));
    return b;
  }
  // cuda-ref-host: the CUDA ref tier's kernel bodies run on the CPU (gpu/ref/host_kernels.h), on every machine.
  if (s == "cuda-ref-host") return {s, s, "", 0};
  // cuda-fast-host: the fast tier's fused bodies on the CPU with Eigen GEMMs (gpu/fast/host_kernels.h).
  if (s == "cuda-fast-host") return {s, s, "", 0};
  if (s == "cuda-ref" || s == "cuda-fast") {
    const std::string host = s + "-host";
#ifdef TRIDENT_HAVE_CUDA
    if (gpu::device_count() > 0) return {s, s, "", 0};
    const char* why = "this machine has none usable (CUDA: no device found)";
#else
    const char* why = "this trident binary has no CUDA kernels built in (no nvcc at build time)";
#endif
    fail(fmt::format("--backend {} needs a CUDA device, and {}; --backend {} runs the same kernel bodies on the CPU "
                     "(the CPU backends are cpu, cuda-ref-host, cuda-fast-host and cpu-ulp:OP[:INDEX])",
                     s, why, host));
  }
  fail(fmt::format("unknown backend '{}' (cpu, cuda-ref-host, cuda-fast-host, cpu-ulp:OP[:INDEX], plugin:PATH.so; "
                   "cuda-ref and cuda-fast need a CUDA build and a device)",
                   s));
}
template <class T>
std::unique_ptr<Kernels<T>> make_kernels(const Backend& b, Device& dev) {
  if (b.name == "cuda-ref-host") return gpu::make_ref_host_kernels<T>(dev);
  if (b.name == "cuda-fast-host") return gpu::make_fast_host_kernels<T>(dev);
  if (b.name == "plugin") {
    const golden::PluginKernels& pk = b.plugin->kernels;
    const golden::KernelsFactory<T>& f = [&]() -> const golden::KernelsFactory<T>& {
      if constexpr (std::is_same_v<T, float>) return pk.f32;
      else return pk.f64;
    }();
    if (!f)
      fail(fmt::format("--backend {}: the plugin '{}' has no Kernels<{}> (its trident_kernels_v1 left {} empty) and "
                       "this golden has {} cases",
                       b.spec, pk.name, std::is_same_v<T, float> ? "float" : "double",
                       std::is_same_v<T, float> ? "f32" : "f64", std::is_same_v<T, float> ? "f32" : "f64"));
    std::unique_ptr<Kernels<T>> k = f(dev);
    if (!k)
      fail(fmt::format("--backend {}: the plugin '{}' made no kernel set (its factory returned null)", b.spec,
                       pk.name));
    return k;
  }
  if (b.name == "cuda-ref" || b.name == "cuda-fast") {  // buffers must live on the GPU: only `check` sets that up
#ifdef TRIDENT_HAVE_CUDA
    if (auto* cd = dynamic_cast<gpu::CudaDevice*>(&dev))
      return b.name == "cuda-ref" ? gpu::make_cuda_ref_kernels<T>(*cd) : gpu::make_cuda_fast_kernels<T>(*cd);
#endif
    fail(fmt::format("backend '{}' runs in `trident check` only (its buffers live on the GPU); use {}-host here "
                     "(the same kernel bodies on the CPU)",
                     b.name, b.name));
  }
  auto cpu = std::make_unique<CpuKernels<T>>(dev);
  if (b.name == "cpu") return cpu;
  return golden::make_perturbed_kernels<T>(std::move(cpu), dev, b.perturb_op, b.perturb_index);
}

// ---- check -------------------------------------------------------------------------------------------------------
struct CheckOpts {
  std::string golden;
  std::string backend = "cpu";
  std::string report;
  std::string op, case_name;
  int rank = -1;
  bool tolerance = false, bitwise = false;
};

std::string primitives_path(const std::string& g) {
  std::error_code ec;
  if (fs::is_directory(g, ec)) return (fs::path(g) / "primitives.h5").string();
  return g;
}

// The backends whose contract is the reference's bits (the reference itself, the CUDA ref tier, the deliberately wrong
// cpu-ulp); every other backend (the fast tier, plugins) is judged by the golden's stored acceptance rule.
bool promises_bits(const Backend& b) {
  return b.name == "cpu" || b.name == "cpu-ulp" || b.name == "cuda-ref" || b.name == "cuda-ref-host";
}

int run_check(const CheckOpts& o) {
  if (!o.report.empty()) io::check_writable(o.report, "--report");  // before the check, not after it
  const Backend be = parse_backend(o.backend);
  {
    ReproLine r("trident check");
    r.arg(o.golden).opt("--backend", o.backend).flag("--tolerance", o.tolerance).flag("--bitwise", o.bitwise);
    r.opt_nonempty("--op", o.op).opt_nonempty("--case", o.case_name).opt_if("--rank", o.rank, -1);
    r.opt_nonempty("--report", o.report);
    std::printf("repro: %s\n", r.str().c_str());
  }
  const std::string path = primitives_path(o.golden);
  const golden::PrimitivesFile f = golden::read_primitives(path);
  note_unsealed(f, path);
  golden::validate_cases(f);  // every case against its op's contract, before any backend runs one
  if (o.tolerance && o.bitwise) fail("--tolerance and --bitwise: choose one");
  golden::CheckOptions co;
  co.bitwise = o.bitwise || (!o.tolerance && promises_bits(be));
  co.only_op = o.op;
  co.only_case = o.case_name;
  co.only_rank = o.rank;
  co.backend = o.backend + (o.tolerance ? " --tolerance" : "") + (o.bitwise ? " --bitwise" : "");
  if (!o.op.empty()) {
    const auto& ops = golden::kernel_ops();
    if (std::find(ops.begin(), ops.end(), o.op) == ops.end())
      fail(fmt::format("--op '{}': not an op of the kernel set (one of: {})", o.op, fmt::join(ops, ", ")));
  }
  std::unique_ptr<Device> device;  // cuda-ref: the cases' buffers on the GPU
#ifdef TRIDENT_HAVE_CUDA
  if (be.name == "cuda-ref" || be.name == "cuda-fast") device = std::make_unique<gpu::CudaDevice>(0);
#endif
  golden::CheckSummary sum;
  for (bool f64 : {false, true}) {
    golden::CheckSummary part =
        f64 ? golden::check_primitives<double>(f, [&](Device& d) { return make_kernels<double>(be, d); }, co,
                                               o.golden, device.get())
            : golden::check_primitives<float>(f, [&](Device& d) { return make_kernels<float>(be, d); }, co, o.golden,
                                              device.get());
    sum.cases += part.cases;
    sum.passed += part.passed;
    for (auto& x : part.failures) sum.failures.push_back(std::move(x));
    for (auto& x : part.ops_checked) sum.ops_checked.push_back(std::move(x));
    for (auto& [k, v] : part.report) sum.report[k] = v;  // f32 and f64 cases never share an (op, output) here
  }
  if (sum.cases == 0) fail(fmt::format("{}: no primitive case matches the filters", path));
  if (!co.bitwise) std::printf("%s", golden::report_text(sum.report).c_str());
  for (const auto& fl : sum.failures) {
    std::printf("FAIL %s\n", fl.message.c_str());
    std::printf("  repro: %s\n", fl.repro.c_str());
  }
  std::printf("trident check %s --backend %s: %lld/%lld cases of %zu ops passed (%s)\n", path.c_str(),
              o.backend.c_str(), static_cast<long long>(sum.passed), static_cast<long long>(sum.cases),
              sum.ops_checked.size(),
              co.bitwise ? "bitwise" : "the golden's acceptance rule: derived bounds where stored, else bits");
  if (!o.report.empty()) {
    nlohmann::json j = sum.to_json();
    j["golden"] = path;
    j["backend"] = o.backend;
    j["mode"] = co.bitwise ? "bitwise" : "rule";
    io::write_file(o.report, j.dump(2) + "\n", "--report");
  }
  return sum.failures.empty() ? 0 : 1;
}

// ---- paired ------------------------------------------------------------------------------------------------------
struct PairedOpts {
  std::string a = "cpu", b;
  RunOpts run;
  std::string golden;  // primitive mode
  std::string op, case_name;
  int repeats = 5;
  std::string max_memory;
};

std::string ratio(double a, double b) { return a != 0 ? fmt::format("{:.6g}", b / a) : std::string("-"); }

// Whether a cpu-ulp perturbation fired: "0 elements differ" means something only when it did.
void print_perturbation(const Backend& A, const Backend& B) {
  for (const Backend* b : {&A, &B}) {
    if (b->name != "cpu-ulp") continue;
    const golden::PerturbStats& st = golden::perturb_stats();
    if (st.flips.load() > 0)
      std::printf("perturbation %s: one ulp flipped in %s of %s (%s)\n", b->spec.c_str(),
                  counted(st.flips.load(), "call").c_str(), b->perturb_op.c_str(),
                  counted(st.calls.load(), "call", "calls in all").c_str());
    else
      std::printf("perturbation %s: NEVER FIRED: %s; the comparison above saw the unperturbed kernels\n",
                  b->spec.c_str(),
                  (st.calls.load() == 0
                      ? fmt::format("op {} was not called in this run", b->perturb_op)
                      : fmt::format("op {}'s output never had element {} ({})", b->perturb_op, b->perturb_index,
                                    counted(st.calls.load(), "call")))
                      .c_str());
  }
}

// The exact command (reference/repro.h), printed first so the run can be repeated as it was.
void add_run_repro(ReproLine& r, const RunOpts& o) {
  const RunOpts d;
  r.opt_if("--preset", o.preset, d.preset).opt_if("--mesh", o.mesh, d.mesh).opt_nonempty("--policy", o.policy);
  r.opt_if("--seqs", o.seqs, d.seqs).opt_if("--seq-len", o.seq_len, d.seq_len).opt_if("--chunks", o.chunks, d.chunks);
  r.opt_if("--docs-per-seq", o.docs_per_seq, d.docs_per_seq);
}

void print_paired_repro(const PairedOpts& o) {
  ReproLine r("trident paired");
  r.arg(o.a).arg(o.b);
  if (o.golden.empty()) {
    add_run_repro(r, o.run);
  } else {
    r.opt("--golden", o.golden).opt_nonempty("--op", o.op).opt_nonempty("--case", o.case_name);
    r.opt_if("--repeats", o.repeats, PairedOpts{}.repeats);
  }
  std::printf("repro: %s\n", r.str().c_str());
}

template <class T>
int paired_step(const PairedOpts& o, const Backend& A, const Backend& B) {
  emu::EmulateSpec spec = make_spec(o.run, 1);
  spec.keep_tensors = true;
  check_run_memory(spec, false, 2, o.max_memory, "paired");
  auto run = [&](const Backend& be) {
    return emu::emulate<T>(spec, [&](int, Device& dev) { return make_kernels<T>(be, dev); });
  };
  const emu::EmulateResult<T> ra = run(A), rb = run(B);
  const double la = ra.steps[0].loss, lb = rb.steps[0].loss;
  double na = 0, nb = 0, maxdiff = 0, nd = 0;
  int64_t ndiff = 0, total = 0;
  for (size_t p = 0; p < ra.grads[0].size(); ++p) {
    const auto& ga = ra.grads[0].t[p].data;
    const auto& gb = rb.grads[0].t[p].data;
    for (size_t i = 0; i < ga.size(); ++i) {
      const double x = ga[i], y = gb[i];
      na += x * x, nb += y * y, nd += (x - y) * (x - y);
      maxdiff = std::max(maxdiff, std::fabs(x - y));
      ndiff += std::memcmp(&ga[i], &gb[i], sizeof(T)) != 0;
      ++total;
    }
  }
  const double pa = static_cast<double>(*std::max_element(ra.peak_bytes.begin(), ra.peak_bytes.end()));
  const double pb = static_cast<double>(*std::max_element(rb.peak_bytes.begin(), rb.peak_bytes.end()));
  std::printf("trident paired %s %s: one step of %s on mesh %s (%s), both in this run\n", A.spec.c_str(),
              B.spec.c_str(), o.run.preset.c_str(), spec.mesh.spec().c_str(), counted(spec.mesh.world(), "rank").c_str());
  std::printf("%-22s %18s %18s %12s\n", "measure", "A", "B", "B/A");
  std::printf("%-22s %18.9g %18.9g %12s\n", "loss", la, lb, ratio(la, lb).c_str());
  std::printf("%-22s %18.9g %18.9g %12s\n", "grad norm", std::sqrt(na), std::sqrt(nb),
              ratio(std::sqrt(na), std::sqrt(nb)).c_str());
  std::printf("%-22s %18.0f %18.0f %12s\n", "peak memory (bytes)", pa, pb, ratio(pa, pb).c_str());
  std::printf("%-22s %18.4f %18.4f %12s\n", "time (s)", ra.seconds, rb.seconds, ratio(ra.seconds, rb.seconds).c_str());
  std::printf("loss |A-B| %.3g; grad: %lld of %lld elements differ, max |A-B| %.3g, ||A-B|| / ||A|| %.3g\n",
              std::fabs(la - lb), static_cast<long long>(ndiff), static_cast<long long>(total), maxdiff,
              na > 0 ? std::sqrt(nd / na) : 0.0);
  print_perturbation(A, B);
  return 0;
}

template <class T>
int paired_primitive(const PairedOpts& o, const Backend& A, const Backend& B, const golden::PrimitivesFile& f) {
  const golden::PrimCase* c = nullptr;
  for (const auto& x : f.cases)
    if (x.op == o.op && (o.case_name.empty() || x.name == o.case_name) && x.rank == 0) {
      c = &x;
      break;
    }
  if (!c) fail(fmt::format("{}: no case of op '{}'{} on rank 0", o.golden, o.op,
                           o.case_name.empty() ? std::string() : " named " + o.case_name));
  struct M {
    std::vector<golden::NamedTensor> out;
    double seconds = 0;
    int64_t peak = 0;
  };
  auto measure = [&](const Backend& be) {
    M m;
    RankTrace trace;
    emu::EmuDevice dev(0, trace, emu::DeviceOptions{.record_trace = false});
    auto k = make_kernels<T>(be, dev);
    std::vector<double> times;
    for (int i = 0; i < o.repeats; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      m.out = golden::run_case<T>(*c, *k, dev);
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    m.seconds = times[times.size() / 2];
    m.peak = dev.memory().peak;
    return m;
  };
  const M ma = measure(A), mb = measure(B);
  // "loss" of a primitive: the sum of its first output; "grad": the norm of its outputs.
  double sa = 0, sb = 0, na = 0, nb = 0, maxdiff = 0;
  int64_t ndiff = 0, total = 0;
  for (size_t i = 0; i < ma.out.size(); ++i)
    for (int64_t j = 0; j < ma.out[i].numel(); ++j) {
      const double x = golden::element_as_double(ma.out[i], j), y = golden::element_as_double(mb.out[i], j);
      if (i == 0) sa += x, sb += y;
      na += x * x, nb += y * y;
      maxdiff = std::max(maxdiff, std::fabs(x - y));
      ndiff += x != y;
      ++total;
    }
  std::printf("trident paired %s %s: %s/%s of %s, median of %d runs each, both in this run\n", A.spec.c_str(),
              B.spec.c_str(), c->op.c_str(), c->name.c_str(), o.golden.c_str(), o.repeats);
  std::printf("%-28s %18s %18s %12s\n", "measure", "A", "B", "B/A");
  std::printf("%-28s %18.9g %18.9g %12s\n", ("sum of " + ma.out[0].name).c_str(), sa, sb, ratio(sa, sb).c_str());
  std::printf("%-28s %18.9g %18.9g %12s\n", "output norm", std::sqrt(na), std::sqrt(nb),
              ratio(std::sqrt(na), std::sqrt(nb)).c_str());
  std::printf("%-28s %18lld %18lld %12s\n", "peak device memory (bytes)", static_cast<long long>(ma.peak),
              static_cast<long long>(mb.peak), ratio(double(ma.peak), double(mb.peak)).c_str());
  std::printf("%-28s %18.6f %18.6f %12s\n", "time (s)", ma.seconds, mb.seconds, ratio(ma.seconds, mb.seconds).c_str());
  std::printf("outputs: %lld of %lld elements differ, max |A-B| %.3g\n", static_cast<long long>(ndiff),
              static_cast<long long>(total), maxdiff);
  print_perturbation(A, B);
  return 0;
}

int run_paired(const PairedOpts& o) {
  const Backend A = parse_backend(o.a), B = parse_backend(o.b);
  print_paired_repro(o);
  if (!o.golden.empty()) {
    if (o.op.empty()) fail("paired --golden needs --op (the primitive to run)");
    const std::string path = primitives_path(o.golden);
    const golden::PrimitivesFile f = golden::read_primitives(path);
    note_unsealed(f, path);
    golden::validate_cases(f);
    const bool f64 = !f.cases.empty() && f.cases[0].dtype == "f64";
    return f64 ? paired_primitive<double>(o, A, B, f) : paired_primitive<float>(o, A, B, f);
  }
  const model::Config cfg = model::Config::preset(o.run.preset);
  const Policy pol = o.run.policy.empty() ? cfg.policy : parse_policy(o.run.policy);
  return pol == Policy::fp64 ? paired_step<double>(o, A, B) : paired_step<float>(o, A, B);
}

}  // namespace

TRIDENT_COMMAND({"golden", "write per-primitive goldens (inputs/outputs of every kernel op) and a state dump",
                 [](CLI::App& sub) -> trident::cli::Action {
                   auto o = std::make_shared<GoldenOpts>();
                   add_run_options(sub, o->run);
                   sub.add_option("--steps", o->run.steps, "the state dump records this step (moments included)")
                       ->capture_default_str()
                       ->check(cli::positive_int());
                   sub.add_option("--cases-per-op", o->cases,
                                  fmt::format("cases (distinct shapes) kept per op and rank, 1..{}", kMaxCasesPerOp))
                       ->capture_default_str()
                       ->check(cli::positive_int())
                       ->check(CLI::Range(1, kMaxCasesPerOp));
                   sub.add_option("--max-memory", o->max_memory,
                                  "refuse the run when its memory estimate exceeds this (bytes, or with a unit: "
                                  "512MiB, 8GiB); default: the memory available on this machine");
                   sub.add_option("--out", o->out, "output directory (primitives.h5, state.h5)")->required();
                   return [o]() -> int {
                     const model::Config cfg = model::Config::preset(o->run.preset);
                     const Policy pol = o->run.policy.empty() ? cfg.policy : parse_policy(o->run.policy);
                     return pol == Policy::fp64 ? run_golden<double>(*o) : run_golden<float>(*o);
                   };
                 }});

TRIDENT_COMMAND({"check", "recompute every primitive of a golden with a backend and compare (exit 1 on failure)",
                 [](CLI::App& sub) -> trident::cli::Action {
                   auto o = std::make_shared<CheckOpts>();
                   sub.add_option("golden", o->golden, "golden directory (or its primitives.h5)")->required();
                   sub.add_option("--backend", o->backend,
                                  "cpu | cuda-ref-host | cuda-ref | cuda-fast-host | cuda-fast | cpu-ulp:OP[:INDEX] "
                                  "| plugin:PATH.so "
                                  "(cuda-ref-host: the CUDA ref tier's kernel bodies on the CPU; cuda-ref: on the GPU, "
                                  "needs a CUDA build and a device; cuda-fast-host / cuda-fast: the fast tier, judged "
                                  "by the golden's acceptance rule; cpu-ulp: cpu with one ulp flipped at element INDEX of OP's "
                                  "first output, a deliberately wrong backend; plugin:PATH.so: the kernel set of a "
                                  "plugin built against an installed Trident, docs/plugins.md)")
                       ->capture_default_str();
                   sub.add_option("--report", o->report, "write a JSON report here");
                   sub.add_option("--op", o->op, "check only this op");
                   sub.add_option("--case", o->case_name, "check only this case (c0, c1, ...)");
                   sub.add_option("--rank", o->rank, "check only this rank's cases");
                   sub.add_flag("--tolerance", o->tolerance,
                                "judge every output by the golden's acceptance rule (docs/golden.md \"The acceptance "
                                "rule\"); the default for backends that do not promise the reference's bits "
                                "(cuda-fast, cuda-fast-host, plugin:)");
                   sub.add_flag("--bitwise", o->bitwise,
                                "compare every output bit for bit; the default for cpu, cuda-ref, cuda-ref-host and "
                                "cpu-ulp:, whose contract is the reference's bits");
                   return [o]() -> int { return run_check(*o); };
                 }});

TRIDENT_COMMAND({"paired", "run two implementations on the same inputs: loss, grad, peak memory, time and ratios",
                 [](CLI::App& sub) -> trident::cli::Action {
                   auto o = std::make_shared<PairedOpts>();
                   sub.add_option("A", o->a, "implementation A: cpu | cuda-ref-host | cuda-fast-host | cpu-ulp:OP[:INDEX]")->required();
                   sub.add_option("B", o->b, "implementation B")->required();
                   add_run_options(sub, o->run);
                   sub.add_option("--golden", o->golden, "primitive mode: a golden directory (with --op)");
                   sub.add_option("--op", o->op, "primitive mode: the op to run");
                   sub.add_option("--case", o->case_name, "primitive mode: the case (default: the first)");
                   sub.add_option("--repeats", o->repeats,
                                  fmt::format("primitive mode: runs per implementation (median time), 1..{}",
                                              kMaxRepeats))
                       ->capture_default_str()
                       ->check(cli::positive_int())
                       ->check(CLI::Range(1, kMaxRepeats));
                   sub.add_option("--max-memory", o->max_memory,
                                  "step mode: refuse the run when its memory estimate exceeds this (bytes, or with a "
                                  "unit: 512MiB, 8GiB); default: the memory available on this machine");
                   return [o]() -> int { return run_paired(*o); };
                 }});
