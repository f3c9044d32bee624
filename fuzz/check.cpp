// The properties of one layout and the shrinker (fuzz/check.h).
#include "fuzz/check.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <omp.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>

#include "emulator/trace_compare.h"
#include "emulator/memory.h"
#include "golden/checkpoint.h"
#include "planner/plan.h"
#include "reference/check.h"
#include "reference/model/repro.h"
#include "reference/model/train.h"
#include "sim/hardware.h"
#include "sim/timeline.h"

namespace trident::fuzz {

const char* to_string(Property p) {
  switch (p) {
    case Property::runs: return "runs";
    case Property::bits: return "bits";
    case Property::scheduler: return "scheduler";
    case Property::hazards: return "hazards";
    case Property::memory: return "memory";
    case Property::planner: return "planner";
    case Property::timeline: return "timeline";
    case Property::resume: return "resume";
  }
  return "?";
}

planner::PlanInput plan_input(const emu::EmulateSpec& s, size_t value_bytes) {
  planner::PlanInput in;
  in.model.params = 1e6;
  in.model.layers = s.cfg.layers;
  in.model.hidden = s.cfg.d_model;
  in.model.experts = s.cfg.experts;
  in.model.top_k = s.cfg.top_k;
  in.model.dense_fraction = 0.5;
  in.model.kv_latent_bytes_per_token = static_cast<double>(s.cfg.payload_dim()) * static_cast<double>(value_bytes);
  in.cluster.gpu_memory_gb = 80;
  in.cluster.nvl = s.mesh.cp_inner;
  in.cluster.rdma_GBps = 50;
  in.cluster.peak_tflops = 1000;
  in.workload.context = s.run.seq_len;
  in.workload.sequences_per_cp_group = s.run.sequences / (s.mesh.d_rep * s.mesh.fsdp);
  return in;
}

namespace {

namespace fs = std::filesystem;

// Where the resume property saves its checkpoint: a private directory of this process (mkdtemp: two fuzzers at once
// never share one), in memory-backed /dev/shm where there is one (the save syncs every file), removed at exit.
class ResumeDir {
 public:
  const std::string& path() {
    std::lock_guard lk(mu_);
    if (dir_.empty()) {
      std::error_code ec;
      const char* t = std::getenv("TMPDIR");
      const fs::path base = fs::is_directory("/dev/shm", ec) ? fs::path("/dev/shm") : fs::path(t && *t ? t : "/tmp");
      std::string tmpl = (base / "trident-fuzz-XXXXXX").string();
      if (!::mkdtemp(tmpl.data())) fail(fmt::format("fuzz: cannot create a directory under {}", base.string()));
      dir_ = tmpl;
      ck_ = (fs::path(dir_) / "checkpoint").string();
    }
    return ck_;
  }
  ~ResumeDir() {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

 private:
  std::mutex mu_;
  std::string dir_, ck_;
};
ResumeDir g_resume_dir;
// The directory the resume property's repro line names (any directory the user may write works).
constexpr const char* kReproResumeDir = "/tmp/trident-fuzz-resume";

// ---- the reference, computed once per batch ----------------------------------------------------------------------
// The single-rank reference depends on the model and the batch, not on the layout: layouts that share a model,
// policy and batch (sequences, length, documents) share one reference run, and a run of n steps holds the first
// steps of every longer one (the steps' batches and the optimizer do not depend on the step count): a layout of
// more steps extends the cached run from its trainer. A bounded cache (the last batches' runs, kRefCacheBytes of
// tensors at most).
constexpr double kRefCacheBytes = 256.0 * 1024 * 1024;
// The references run on one OpenMP thread (same bits: the reference does not depend on the thread count). libgomp
// reads OMP_WAIT_POLICY when it loads, before `trident` sets it to passive, so idle team threads spin; on a busy
// 2-core machine the spinning made the reference 5x slower than one thread (bench_fuzz, 12 layouts: 16.5 s vs
// 1.7 s).
struct OneOmpThread {
  int before = omp_get_max_threads();
  OneOmpThread() { omp_set_num_threads(1); }
  ~OneOmpThread() { omp_set_num_threads(before); }
  OneOmpThread(const OneOmpThread&) = delete;
  OneOmpThread& operator=(const OneOmpThread&) = delete;
};

template <class T>
struct RefRun {
  std::vector<double> loss;
  std::vector<model::ParamSet<T>> grads, params;  // per step
  // The trainer after the last step (to extend the run); taken, under the cache's lock, by the one that extends it.
  mutable std::shared_ptr<model::Trainer<T>> trainer;
  double bytes() const {
    double b = 0;
    for (const auto* v : {&grads, &params})
      for (const model::ParamSet<T>& p : *v)
        for (const auto& t : p.t) b += static_cast<double>(t.size()) * sizeof(T);
    if (!params.empty()) b += b / static_cast<double>(2 * params.size()) * 4;  // the trainer: params, grads, m, v
    return b;
  }
};
template <class T>
std::shared_ptr<const RefRun<T>> reference_run(const emu::EmulateSpec& s) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const RefRun<T>>> cache;
  static std::deque<std::string> order;
  static double total = 0;
  ReproLine key("ref");
  model::RunConfig run = s.run;
  run.recompute = false;  // changes no bit (docs/checkpoints.md: recompute, token chunk, mesh, chunks)
  run.token_chunk = model::RunConfig().token_chunk;
  run.steps = 1;  // a longer run holds the shorter ones
  model::add_model_flags(key, s.preset, s.config_path, s.cfg);
  model::add_run_flags(key, run);
  key.opt("--first-step", s.first_step);
  const std::string k = key.str();
  const bool cacheable = s.overrides.empty() && s.batches.empty();
  const size_t steps = static_cast<size_t>(s.run.steps);
  std::shared_ptr<const RefRun<T>> base;
  std::shared_ptr<model::Trainer<T>> tr;
  if (cacheable) {
    std::lock_guard lk(mu);
    if (auto it = cache.find(k); it != cache.end()) {
      if (it->second->loss.size() >= steps) return it->second;
      base = it->second;
      tr = std::exchange(base->trainer, nullptr);  // null: another thread is extending it (start over)
    }
  }
  auto r = std::make_shared<RefRun<T>>();
  if (tr) {
    r->loss = base->loss;
    r->grads = base->grads;
    r->params = base->params;
  } else {
    tr = std::make_shared<model::Trainer<T>>(s.cfg, s.run);
    tr->params = emu::spec_init<T>(s);
  }
  const std::vector<model::Batch> batches = emu::spec_batches(s);
  const OneOmpThread one_thread;
  for (size_t st = r->loss.size(); st < steps; ++st) {
    r->loss.push_back(tr->step(batches[st]).loss);
    r->grads.push_back(tr->grads);
    r->params.push_back(tr->params);
  }
  if (cacheable) {  // the newest entries within kRefCacheBytes (the newest always)
    r->trainer = tr;
    std::lock_guard lk(mu);
    auto [it, fresh] = cache.try_emplace(k, r);
    if (fresh) {
      order.push_back(k);
    } else if (it->second->loss.size() < r->loss.size()) {
      total -= it->second->bytes();
      it->second = r;
    } else {
      return r;  // another thread cached as long a run meanwhile
    }
    total += r->bytes();
    while (order.size() > 1 && total > kRefCacheBytes) {
      total -= cache.at(order.front())->bytes();
      cache.erase(order.front());
      order.pop_front();
    }
  }
  return r;
}

// emu::check_reference against the cached reference run (the same checks: loss, every trainable gradient, every
// parameter and buffer after each step).
template <class T>
emu::CheckReport check_against_reference(const emu::EmulateSpec& s, const emu::EmulateResult<T>& got) {
  const std::shared_ptr<const RefRun<T>> ref = reference_run<T>(s);
  emu::CheckReport rep;
  for (int64_t st = 0; st < s.run.steps; ++st) {
    const size_t i = static_cast<size_t>(st);
    rep.checks.push_back(emu::compare_bits<double>(st, "loss", "", &got.steps[i].loss, &ref->loss[i], 1));
    const model::ParamSet<T>& g = got.grads[i];
    const model::ParamSet<T>& p = got.params[i];
    const model::ParamSet<T>& rg = ref->grads[i];
    const model::ParamSet<T>& rp = ref->params[i];
    for (size_t t = 0; t < rp.size(); ++t) {
      const std::string& n = rp.info[t].name;
      if (rp.info[t].trainable)
        rep.checks.push_back(emu::compare_bits<T>(st, "grad", n, g.t[t].ptr(), rg.t[t].ptr(), rg.t[t].size()));
      rep.checks.push_back(emu::compare_bits<T>(st, "param", n, p.t[t].ptr(), rp.t[t].ptr(), rp.t[t].size()));
    }
  }
  return rep;
}

bool is_hazard(const std::string& what) { return what.find("stream hazard") != std::string::npos; }

template <class T>
std::string result_difference(const emu::EmulateResult<T>& a, const emu::EmulateResult<T>& b) {
  for (size_t s = 0; s < a.steps.size(); ++s) {
    if (std::memcmp(&a.steps[s].loss, &b.steps[s].loss, sizeof(double)) != 0)
      return fmt::format("step {} loss {:.9g} vs {:.9g}", s + 1, a.steps[s].loss, b.steps[s].loss);
    for (size_t i = 0; i < a.grads[s].size(); ++i) {
      const auto& g = a.grads[s].t[i];
      const auto& h = b.grads[s].t[i];
      if (std::memcmp(g.ptr(), h.ptr(), sizeof(T) * static_cast<size_t>(g.size())) != 0)
        return fmt::format("step {} gradient {}", s + 1, a.grads[s].info[i].name);
      const auto& p = a.params[s].t[i];
      const auto& q = b.params[s].t[i];
      if (std::memcmp(p.ptr(), q.ptr(), sizeof(T) * static_cast<size_t>(p.size())) != 0)
        return fmt::format("step {} parameter {}", s + 1, a.params[s].info[i].name);
    }
  }
  return "";
}

// The planner's 2D-CP traffic against the recorded cp_outer / cp_inner bytes of every rank (the formula of
// tests/step/test_step_layouts.cpp Step2dCp.PlannerTrafficEqualsRecordedBytes). Applies to 2D-CP layouts on the
// emulator's communicator with native exact sums and the fp32 or fp64 policy.
bool planner_applies(const Layout& l) {
  const emu::EmulateSpec& s = l.spec;
  return s.mesh.cp_2d() && s.comm == emu::CommBackend::emu && !s.lower_exact_sum && s.cfg.policy != Policy::bf16;
}
template <class T>
std::string planner_difference(const emu::EmulateSpec& s, const emu::EmulateResult<T>& r) {
  const planner::PlanInput in = plan_input(s, sizeof(T));
  const MeshShape pm{1, 1, s.mesh.cp, 1, s.mesh.ep};  // the planner derives cp_inner from the NVLink domain
  const planner::MeshCheck chk = planner::check_mesh(in, pm);
  if (chk.cp_inner != s.mesh.cp_inner || chk.cp_outer != s.mesh.cp_outer())
    return fmt::format("the planner splits cp = {} as {} x {}, the run as {} x {}", s.mesh.cp, chk.cp_outer,
                       chk.cp_inner, s.mesh.cp_outer(), s.mesh.cp_inner);
  const planner::Plan plan = planner::evaluate(in, pm, chk);
  const double passes = (s.run.recompute ? 2.0 : 1.0) + double(sizeof(ExactAcc<T>)) / double(sizeof(T));
  const planner::CpTraffic want = planner::cp_traffic(plan.kv_bytes, s.mesh.cp, chk.cp_inner, chk.cp_outer, passes);
  const double per_layer = double(s.run.steps * s.cfg.layers);
  for (int64_t rank = 0; rank < s.mesh.world(); ++rank) {
    auto wire = [&](const char* comm, int64_t n) {
      double b = 0;
      const auto& st = r.rank_stats[static_cast<size_t>(rank)];
      if (auto it = st.find(comm); it != st.end())
        for (const OpStats& o : it->second) b += double(o.bytes);
      return b * double(n - 1) / double(n) / per_layer;
    };
    const double outer = wire("cp_outer", s.mesh.cp_outer()), inner = wire("cp_inner", s.mesh.cp_inner);
    if (outer != want.rdma || inner != want.nvlink)
      return fmt::format("rank {}: recorded cp_outer {} B and cp_inner {} B per layer, the planner's cp_traffic {} B "
                         "(RDMA) and {} B (NVLink)",
                         rank, outer, inner, want.rdma, want.nvlink);
  }
  return "";
}

std::string timeline_difference(const emu::EmulateSpec& s, const std::vector<RankTrace>& traces) {
  const std::string dtype = s.cfg.policy == Policy::bf16 ? "bf16" : s.cfg.policy == Policy::fp32 ? "f32" : "f64";
  sim::Timeline tl;
  try {
    tl = sim::simulate(traces, sim::hardware_model("h100"), {.dtype = dtype, .mesh = &s.mesh});
  } catch (const std::exception& e) {
    return e.what();
  }
  if (!(std::isfinite(tl.makespan) && tl.makespan > 0)) return fmt::format("makespan {}", tl.makespan);
  if (tl.spans.size() != traces.size()) return fmt::format("{} of {} ranks simulated", tl.spans.size(), traces.size());
  for (size_t r = 0; r < traces.size(); ++r) {
    if (tl.spans[r].size() != traces[r].size()) return fmt::format("rank {}: streams missing", r);
    for (size_t st = 0; st < traces[r].size(); ++st) {
      if (tl.spans[r][st].size() != traces[r][st].entries.size())
        return fmt::format("rank {} stream '{}': {} of {} entries simulated", r, traces[r][st].name,
                           tl.spans[r][st].size(), traces[r][st].entries.size());
      for (const sim::Span& sp : tl.spans[r][st])
        if (!(std::isfinite(sp.start) && std::isfinite(sp.end) && sp.start >= 0 && sp.end >= sp.start &&
              sp.end <= tl.makespan))
          return fmt::format("rank {} stream '{}': a span [{}, {}) outside [0, {}]", r, traces[r][st].name,
                             sp.start, sp.end, tl.makespan);
    }
  }
  return "";
}

template <class T>
CaseResult check_t(const Layout& l, int only) {
  CaseResult res;
  const auto t0 = std::chrono::steady_clock::now();
  auto want = [&](Property p) { return only < 0 || only == static_cast<int>(p); };
  auto mark = std::chrono::steady_clock::now();
  auto spent = [&](Property p) {  // the time since the last mark goes to p
    const auto now = std::chrono::steady_clock::now();
    res.property_seconds[static_cast<int>(p)] += std::chrono::duration<double>(now - mark).count();
    mark = now;
  };
  auto done = [&]() {
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return res;
  };
  auto failed = [&](Property p, std::string detail, std::string repro) {
    spent(p);
    res.ok = false;
    res.failed = p;
    res.detail = std::move(detail);
    res.repro = std::move(repro);
    return done();
  };
  const emu::KernelFactory<T> kf = kernel_factory<T>(parse_kernels(l.kernels));
  emu::EmulateSpec a = l.spec;
  a.keep_tensors = true;
  a.record_trace = want(Property::scheduler) || want(Property::timeline);
  // the traces are compared between this process's runs only: the fast hash of the received bytes (XXH64; the
  // goldens' FNV-1a 64 is byte-serial and took 42% of a tiny layout's time)
  a.device.recv_hash = emu::RecvHash::xxh64;
  a.keep_state = want(Property::resume) && l.resume;
  a.watchdog_s = 120;
  res.checked.push_back(Property::runs);
  if (a.device.mode == emu::DeviceMode::deferred || a.device.check_hazards) res.checked.push_back(Property::hazards);
  std::optional<emu::EmulateResult<T>> ra;
  try {
    ra.emplace(emu::emulate<T>(a, kf));
  } catch (const std::exception& e) {
    return failed(is_hazard(e.what()) ? Property::hazards : Property::runs, e.what(), l.repro());
  }
  spent(Property::runs);
  if (want(Property::bits)) {
    res.checked.push_back(Property::bits);
    const emu::CheckReport rep = check_against_reference<T>(a, *ra);
    if (!rep.ok()) return failed(Property::bits, rep.summary(), l.repro());
    spent(Property::bits);
  }
  if (want(Property::memory)) {
    res.checked.push_back(Property::memory);
    emu::EmulateMemoryInputs mi{a.cfg, a.run, a.mesh, a.ep_chunks, a.vocab_slices, /*keep_tensors=*/true,
                                /*check_reference=*/true};
    mi.lower_exact_sum = a.lower_exact_sum || a.comm == emu::CommBackend::nccl_fake;  // NCCL always lowers
    const emu::MemoryEstimate est = emu::estimate_emulate(mi);
    const int64_t peak = *std::max_element(ra->device_peak_bytes.begin(), ra->device_peak_bytes.end());
    if (est.device_bytes() < static_cast<double>(peak))
      return failed(Property::memory,
                    fmt::format("estimated device bytes per rank {:.0f} < measured peak {} ({})", est.device_bytes(),
                                peak, est.describe()),
                    l.repro());
    spent(Property::memory);
  }
  if (want(Property::planner) && planner_applies(l)) {
    res.checked.push_back(Property::planner);
    if (std::string d = planner_difference<T>(a, *ra); !d.empty()) return failed(Property::planner, d, l.repro());
    spent(Property::planner);
  }
  if (want(Property::timeline)) {
    res.checked.push_back(Property::timeline);
    if (std::string d = timeline_difference(a, ra->traces); !d.empty())
      return failed(Property::timeline, d, l.repro() + " --hardware h100");
    spent(Property::timeline);
  }
  if (want(Property::scheduler)) {
    res.checked.push_back(Property::scheduler);
    emu::EmulateSpec b = a;  // keep_state as a: saving the state issues work too
    b.device = emu::DeviceOptions{};
    b.device.mode = emu::DeviceMode::deferred;
    b.device.seed = l.seed2;
    b.device.recv_hash = emu::RecvHash::xxh64;
    b.record_trace = true;
    Layout lb = l;
    lb.spec.device = b.device;
    try {
      const emu::EmulateResult<T> rb = emu::emulate<T>(b, kf);
      std::string d = result_difference(*ra, rb);
      if (d.empty()) d = emu::trace_difference(ra->traces, rb.traces);
      if (!d.empty())
        return failed(Property::scheduler,
                      fmt::format("scheduler seed {} differs from the first run ({}): {}", l.seed2,
                                  l.spec.device.mode == emu::DeviceMode::deferred
                                      ? fmt::format("deferred, seed {}", l.spec.device.seed)
                                      : std::string("eager"),
                                  d),
                      lb.repro());
    } catch (const std::exception& e) {
      res.second_seed = true;  // the shrinker starts from the second seed's layout (it fails the first run there)
      return failed(is_hazard(e.what()) ? Property::hazards : Property::scheduler, e.what(), lb.repro());
    }
    spent(Property::scheduler);
  }
  if (want(Property::resume) && l.resume) {
    res.checked.push_back(Property::resume);
    const std::string dir = g_resume_dir.path();
    emu::EmulateSpec b = l.spec;
    b.mesh = l.resume_mesh;
    b.ep_chunks = l.resume_chunks;
    b.run.steps = 1;
    b.keep_tensors = true;
    b.watchdog_s = 120;
    Layout la = l, lb = l;
    lb.spec = b;
    lb.resume = false;
    const std::string kflag = l.kernels != "cpu" ? " --kernels " + l.kernels : "";
    const std::string repro = la.spec.repro(false) + kflag + " --save " + kReproResumeDir + " && " + lb.repro() +
                              " --resume " + kReproResumeDir;
    try {
      golden::CheckpointMeta meta;
      meta.writer = "emulate";
      meta.cfg = a.cfg;
      meta.run = a.run;
      meta.mesh = a.mesh;
      meta.ep_chunks = a.ep_chunks;
      meta.vocab_slices = a.vocab_slices;
      meta.step = ra->state.front().step;
      golden::save_checkpoint<T>(dir, meta, ra->state);
      const model::TrainState<T> st = golden::load_checkpoint<T>(dir);
      fs::remove_all(dir);
      b.first_step = st.step;
      const emu::EmulateResult<T> rb = emu::emulate<T>(b, kf, &st);
      const emu::CheckReport rep = [&] {
        const OneOmpThread one_thread;
        return emu::check_reference<T>(b, rb, &st);
      }();
      if (!rep.ok()) return failed(Property::resume, rep.summary(), repro);
    } catch (const std::exception& e) {
      std::error_code ec;
      fs::remove_all(dir, ec);
      return failed(Property::resume, e.what(), repro);
    }
    spent(Property::resume);
  }
  return done();
}

// A layout on the MPI backend (Layout::processes > 0): the run on every process, then on process 0 the bits against
// the cached reference and the memory estimate against the gathered device peaks; process 0's verdict ("" or the
// property's index, a newline and the detail) is shared, so every process returns the same result.
template <class T>
CaseResult check_mpi_t(const Layout& l, int only, const MpiBackend& mb) {
  CaseResult res;
  const auto t0 = std::chrono::steady_clock::now();
  auto want = [&](Property p) { return only < 0 || only == static_cast<int>(p); };
  auto mark = t0;
  auto spent = [&](Property p) {
    const auto now = std::chrono::steady_clock::now();
    res.property_seconds[static_cast<int>(p)] += std::chrono::duration<double>(now - mark).count();
    mark = now;
  };
  auto finish = [&](Property p, bool ok, std::string detail) {
    spent(p);
    if (!ok) {
      res.ok = false;
      res.failed = p;
      res.detail = std::move(detail);
      res.repro = l.repro();
    }
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return res;
  };
  emu::EmulateSpec a = l.spec;
  a.keep_tensors = want(Property::bits);
  a.record_trace = false;
  a.keep_state = false;
  res.checked.push_back(Property::runs);
  if (want(Property::bits)) res.checked.push_back(Property::bits);
  if (want(Property::memory)) res.checked.push_back(Property::memory);
  emu::EmulateResult<T> r;
  bool root = false;
  try {
    if constexpr (std::is_same_v<T, double>) root = mb.run_f64(a, l.ranks_per_process, r);
    else root = mb.run_f32(a, l.ranks_per_process, r);
  } catch (const std::exception& e) {
    res.backend_lost = true;
    return finish(Property::runs, false, e.what());
  }
  spent(Property::runs);
  std::string verdict;
  if (root) {
    auto verdict_of = [](Property p, const std::string& d) { return fmt::format("{}\n{}", static_cast<int>(p), d); };
    if (want(Property::bits)) {
      const emu::CheckReport rep = check_against_reference<T>(a, r);
      if (!rep.ok()) verdict = verdict_of(Property::bits, rep.summary());
      spent(Property::bits);
    }
    if (verdict.empty() && want(Property::memory)) {
      emu::EmulateMemoryInputs mi{a.cfg, a.run, a.mesh, a.ep_chunks, a.vocab_slices, /*keep_tensors=*/true,
                                  /*check_reference=*/true};
      mi.lower_exact_sum = a.lower_exact_sum;  // the MPI backend lowers exact sums only when asked (native merge)
      const emu::MemoryEstimate est = emu::estimate_emulate(mi);
      const int64_t peak = *std::max_element(r.device_peak_bytes.begin(), r.device_peak_bytes.end());
      if (est.device_bytes() < static_cast<double>(peak))
        verdict = verdict_of(Property::memory, fmt::format("estimated device bytes per rank {:.0f} < measured peak {} "
                                                           "({})",
                                                           est.device_bytes(), peak, est.describe()));
      spent(Property::memory);
    }
  }
  verdict = mb.share(verdict);
  if (verdict.empty()) return finish(Property::memory, true, "");
  const size_t nl = verdict.find('\n');
  const auto p = static_cast<Property>(std::stoi(verdict.substr(0, nl)));
  return finish(p, false, verdict.substr(nl + 1));
}

// ---- shrinking ----------------------------------------------------------------------------------------------------
std::vector<int64_t> smaller(int64_t v) {  // 1, v/2, v-1 (distinct, < v)
  std::vector<int64_t> out;
  for (int64_t x : {int64_t{1}, v / 2, v - 1})
    if (x >= 1 && x < v && std::find(out.begin(), out.end(), x) == out.end()) out.push_back(x);
  return out;
}

// Simplifications of a layout, the biggest first.
std::vector<Layout> simplifications(const Layout& l, const GenOptions& fixed, Property p) {
  std::vector<Layout> out;
  auto add = [&](Layout c) {
    if (normalize(c) && c.key() != l.key()) out.push_back(std::move(c));
  };
  const emu::EmulateSpec& s = l.spec;
  if (s.run.steps > 1) {
    Layout c = l;
    c.spec.run.steps = 1;
    add(c);
  }
  if (l.resume && p != Property::resume) {
    Layout c = l;
    c.resume = false;
    add(c);
  }
  // ranks: each dense dimension down, ep down (the expert mesh follows: e_fsdp = world / ep)
  auto mesh_variants = [&](auto set) {
    for (int64_t dim = 0; dim < 3; ++dim) {
      const int64_t v = dim == 0 ? s.mesh.d_rep : dim == 1 ? s.mesh.fsdp : s.mesh.cp;
      for (int64_t x : smaller(v)) {
        Layout c = l;
        MeshShape& m = c.spec.mesh;
        (dim == 0 ? m.d_rep : dim == 1 ? m.fsdp : m.cp) = x;
        set(c);
        // keep ep when it still divides the world, else the largest that does
        const int64_t W = m.world();
        while (m.ep > 1 && (W % m.ep != 0)) --m.ep;
        add(c);
      }
    }
  };
  mesh_variants([](Layout&) {});
  for (int64_t x : smaller(s.mesh.ep)) {
    Layout c = l;
    c.spec.mesh.ep = x;
    add(c);
  }
  if (l.resume) {
    Layout c = l;
    c.resume_mesh = MeshShape{};
    add(c);
  }
  // tokens
  if (l.per_group > 1) {
    Layout c = l;
    c.per_group = 1;
    add(c);
  }
  if (l.chunk_tiles > 1) {
    Layout c = l;
    c.chunk_tiles = 1;
    add(c);
  }
  // features
  auto feature = [&](bool on, auto off) {
    if (!on) return;
    Layout c = l;
    off(c);
    add(c);
  };
  feature(s.mesh.cp_2d(), [](Layout& c) { c.spec.mesh.cp_inner = 1; });
  for (int64_t x : smaller(s.ep_chunks)) feature(true, [x](Layout& c) { c.spec.ep_chunks = x; });
  if (l.resume) for (int64_t x : smaller(l.resume_chunks)) feature(true, [x](Layout& c) { c.resume_chunks = x; });
  feature(s.vocab_slices != 0, [](Layout& c) { c.spec.vocab_slices = 0; });
  feature(s.run.recompute, [](Layout& c) { c.spec.run.recompute = false; });
  for (int64_t x : smaller(s.run.docs_per_seq)) feature(true, [x](Layout& c) { c.spec.run.docs_per_seq = x; });
  if (p != Property::hazards && p != Property::scheduler) {
    feature(s.device.mode == emu::DeviceMode::deferred, [](Layout& c) {
      c.spec.device = emu::DeviceOptions{};
      c.spec.device.check_hazards = c.kernels == "cpu";
    });
    feature(s.device.check_hazards && s.device.mode == emu::DeviceMode::eager,
            [](Layout& c) { c.spec.device.check_hazards = false; });
  }
  if (fixed.comm.empty()) {
    feature(s.comm != emu::CommBackend::emu, [](Layout& c) {
      c.spec.comm = emu::CommBackend::emu;
      c.spec.nccl_blocking = false;
    });
  }
  feature(s.nccl_blocking, [](Layout& c) { c.spec.nccl_blocking = false; });
  feature(s.lower_exact_sum, [](Layout& c) { c.spec.lower_exact_sum = false; });
  if (fixed.kernels.empty()) feature(l.kernels != "cpu", [](Layout& c) { c.kernels = "cpu"; });
  {  // the policy of the model the layout came from
    Policy base = s.cfg.policy;
    for (const Model& m : fixed.models)
      if (m.name() == l.model_name) base = m.cfg.policy;
    feature(s.cfg.policy != base, [base](Layout& c) { c.spec.cfg.policy = base; });
  }
  // fewer layers (--layers; the dense ones stay, as the repro line keeps the config's dense_layers; at least one MoE
  // layer stays where the model has one)
  if (s.cfg.layers > 1)
    for (int64_t x : smaller(s.cfg.layers)) {
      if (x < s.cfg.dense_layers + (s.cfg.layers > s.cfg.dense_layers ? 1 : 0)) continue;
      Layout c = l;
      c.spec.cfg.layers = x;
      try {
        c.spec.cfg.validate();
      } catch (const Error&) {
        continue;
      }
      add(c);
    }
  return out;
}

}  // namespace

void keep_freed_memory() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, INT_MAX);
#endif
}

CaseResult check_layout(const Layout& l, int only, const MpiBackend* mpi) {
  if (l.processes > 0) {
    TD_CHECK(mpi != nullptr, "fuzz: a layout for the MPI backend needs the backend (trident fuzz under mpirun)");
    if (l.spec.cfg.policy == Policy::fp64) return check_mpi_t<double>(l, only, *mpi);
    return check_mpi_t<float>(l, only, *mpi);
  }
  if (l.spec.cfg.policy == Policy::fp64) return check_t<double>(l, only);
  return check_t<float>(l, only);
}

ShrinkResult shrink(const Layout& failing, const CaseResult& failure, const GenOptions& fixed, int64_t max_tries,
                    const std::function<void(const ShrinkResult&)>& on_try, const MpiBackend* mpi) {
  ShrinkResult sr{failing, failure, 0, 0};
  const Property p = failure.failed;
  if (failure.second_seed && p == Property::hazards) {  // a hazard of the second seed's run: shrink that run
    sr.layout.spec.device = emu::DeviceOptions{};
    sr.layout.spec.device.mode = emu::DeviceMode::deferred;
    sr.layout.spec.device.seed = failing.seed2;
  }
  bool progress = true;
  while (progress && sr.tries < max_tries) {
    progress = false;
    for (const Layout& c : simplifications(sr.layout, fixed, p)) {
      if (sr.tries >= max_tries) break;
      ++sr.tries;
      // the layout's own property: hazards and runs need the run only; the rest their own check
      const CaseResult r = check_layout(c,
                                        p == Property::runs || p == Property::hazards ? static_cast<int>(Property::runs)
                                                                                      : static_cast<int>(p),
                                        mpi);
      if (on_try) on_try(sr);
      if (r.backend_lost) {  // MPI is unusable: the smallest failing layout so far
        sr.backend_lost = true;
        return sr;
      }
      if (!r.ok && r.failed == p) {
        sr.layout = c;
        sr.result = r;
        ++sr.accepted;
        progress = true;
        break;  // restart from the biggest simplification of the smaller layout
      }
    }
  }
  return sr;
}

}  // namespace trident::fuzz
