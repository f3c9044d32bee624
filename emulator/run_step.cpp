// Emulated run of the distributed step (emulator/run_step.h).
#include "emulator/run_step.h"

#include <cmath>

#include <omp.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <type_traits>

#include "emulator/fake_nccl.h"
#include "emulator/world.h"
#include "parallel/mesh_comm.h"
#include "platform/memory_info.h"
#include "reference/counted.h"
#include "reference/check.h"
#include "reference/model/repro.h"
#include "reference/model/train.h"

namespace trident::emu {

namespace md = trident::model;

std::string_view to_string(CommBackend b) { return b == CommBackend::nccl_fake ? "nccl-fake" : "emu"; }

std::string_view to_string(StepPlant p) {
  switch (p) {
    case StepPlant::zigzag_off_by_one: return "zigzag-off-by-one";
    case StepPlant::chunk_drops_token: return "chunk-drops-token";
    default: return "none";
  }
}
StepPlant parse_plant(const std::string& s) {
  for (StepPlant p : {StepPlant::none, StepPlant::zigzag_off_by_one, StepPlant::chunk_drops_token})
    if (s == to_string(p)) return p;
  fail(fmt::format("unknown planted bug '{}' (none, zigzag-off-by-one, chunk-drops-token)", s));
}
std::pair<CollOp, size_t> parse_comm_drop(const std::string& s) {
  const std::string pre = "emu-drop:";
  const size_t c = s.find(':', pre.size());
  if (s.rfind(pre, 0) != 0 || c == std::string::npos)
    fail(fmt::format("communicator '{}': the planted communicator is emu-drop:OP:COUNT (e.g. emu-drop:all_reduce:1)",
                     s));
  const std::string op = s.substr(pre.size(), c - pre.size()), cnt = s.substr(c + 1);
  std::optional<CollOp> o;
  for (CollOp k : {CollOp::all_gather, CollOp::reduce_scatter, CollOp::all_reduce, CollOp::broadcast, CollOp::reduce})
    if (op == to_string(k)) o = k;
  if (!o)
    fail(fmt::format("communicator '{}': unknown collective '{}' (all_gather, reduce_scatter, all_reduce, broadcast, "
                     "reduce)",
                     s, op));
  size_t used = 0;
  long long n = 0;
  try {
    n = std::stoll(cnt, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != cnt.size() || cnt.empty() || n < 1)
    fail(fmt::format("communicator '{}': COUNT must be an integer >= 1 (elements of the collective)", s));
  return {*o, static_cast<size_t>(n)};
}

std::string EmulateSpec::repro(bool check_reference) const {
  ReproLine r("trident emulate");
  md::add_model_flags(r, preset, config_path, cfg);
  r.opt("--mesh", mesh.spec());
  if (mesh.cp_2d()) r.opt_if("--nvl", nvl, 8);
  md::add_run_flags(r, run);
  r.opt_if("--chunks", ep_chunks, 1);
  r.opt_if("--vocab-slices", vocab_slices, 0);
  r.flag("--lower-exact-sum", lower_exact_sum);
  if (drop_count > 0) r.opt("--comm", fmt::format("emu-drop:{}:{}", to_string(drop_op), drop_count));
  else if (comm != CommBackend::emu) r.opt("--comm", std::string(to_string(comm)));
  r.flag("--nccl-blocking", comm == CommBackend::nccl_fake && nccl_blocking);
  if (device.mode == DeviceMode::deferred) r.opt("--device", "deferred").opt_if("--device-seed", device.seed, 0);
  else r.flag("--check-hazards", device.check_hazards);
  if (plant != StepPlant::none) r.opt("--plant", std::string(to_string(plant)));
  r.flag("--shapes-only", shapes_only);
  if (shapes_only) r.opt_nonempty("--routing", routing);
  r.flag("--check-reference", check_reference);
  return r.str();
}

std::vector<md::Batch> spec_batches(const EmulateSpec& spec) {
  if (!spec.batches.empty()) {
    TD_CHECK_EQ(static_cast<int64_t>(spec.batches.size()), spec.run.steps, "emulate: one batch per step");
    return spec.batches;
  }
  std::vector<md::Batch> b;
  for (int64_t s = 0; s < spec.run.steps; ++s)
    b.push_back(md::synthetic_batch(spec.cfg, spec.run, spec.first_step + s));
  return b;
}

template <class T>
md::ParamSet<T> spec_init(const EmulateSpec& spec) {
  md::ParamSet<T> p = md::ParamSet<T>::init(spec.cfg, spec.cfg.seed);
  for (const auto& [name, vals] : spec.overrides) {
    Tensor<T>& t = p[name];
    TD_CHECK_EQ(t.size(), static_cast<int64_t>(vals.size()), "emulate: override of {}", name);
    for (size_t i = 0; i < vals.size(); ++i) t.data[i] = static_cast<T>(vals[i]);
  }
  return p;
}
template md::ParamSet<float> spec_init<float>(const EmulateSpec&);
template md::ParamSet<double> spec_init<double>(const EmulateSpec&);

template <class T>
CommStats EmulateResult<T>::total() const {
  CommStats t;
  for (const CommStats& r : rank_stats)
    for (const auto& [name, tab] : r) add_stats(t[name], tab);
  return t;
}

template <class T>
StepShared<T> step_shared(const EmulateSpec& spec, const md::ParamSet<T>& init, const md::TrainState<T>* resume) {
  StepShared<T> sh;
  sh.cfg = spec.cfg;
  sh.run = spec.run;
  sh.mesh = spec.mesh;
  sh.ep_chunks = spec.ep_chunks;
  sh.vocab_slices = spec.vocab_slices;
  sh.init = resume ? &resume->params : &init;
  if (resume) {
    const std::vector<md::ParamInfo> info = md::param_layout(spec.cfg);
    for (const md::ParamSet<T>* p : {&resume->params, &resume->m, &resume->v}) {
      TD_CHECK_EQ(p->size(), info.size(), "emulate: resumed state of another model");
      for (size_t i = 0; i < info.size(); ++i)
        TD_CHECK(p->info[i].name == info[i].name && p->t[i].shape == info[i].shape,
                 "emulate: resumed tensor {} is not {} of this model", i, info[i].name);
    }
    sh.init_m = &resume->m;
    sh.init_v = &resume->v;
    sh.init_step = resume->step;
  }
  sh.skip_wait = spec.skip_wait;
  sh.fault = spec.fault;
  sh.plant = spec.plant;
  sh.progress = spec.where;
  if (!spec.shapes_only) sh.rope = md::rope_table<T>(spec.run.seq_len, spec.cfg.rope_width(), spec.cfg.rope_theta);
  sh.validate();
  return sh;
}
template StepShared<float> step_shared<float>(const EmulateSpec&, const md::ParamSet<float>&,
                                              const md::TrainState<float>*);
template StepShared<double> step_shared<double>(const EmulateSpec&, const md::ParamSet<double>&,
                                                const md::TrainState<double>*);

template <class T>
EmulateResult<T> emulate(const EmulateSpec& spec, const KernelFactory<T>& kernels, const md::TrainState<T>* resume) {
  if (spec.mesh.world() > kMaxEmulatedRanks)
    fail(fmt::format("emulate: mesh {} has {} ranks; the emulator runs one thread per rank and takes at most {}",
                     spec.mesh.str(), spec.mesh.world(), kMaxEmulatedRanks));
  if (spec.shapes_only) {
    TD_CHECK(!resume && !spec.keep_tensors && !spec.keep_state && spec.overrides.empty(),
             "emulate: a shapes-only run has no data: no resume, kept tensors, state or overrides");
    TD_CHECK(spec.comm == CommBackend::emu && spec.drop_count == 0,
             "emulate --shapes-only runs on the emulator's own communicator (not --comm {})", to_string(spec.comm));
    TD_CHECK(spec.device.mode == DeviceMode::eager,
             "emulate --shapes-only: a shapes-only device runs nothing, so it has no deferred mode (use "
             "--check-hazards to check the streams)");
  }
  // Shapes only: the layout (names, shapes, index), no tensors.
  md::ParamSet<T> init;
  if (spec.shapes_only) {
    init.info = md::param_layout(spec.cfg);
    for (size_t i = 0; i < init.info.size(); ++i) init.index[init.info[i].name] = i;
  } else if (!resume) {
    init = spec_init<T>(spec);
  }
  StepShared<T> sh = step_shared<T>(spec, init, resume);
  const int64_t n_chunks = spec.ep_chunks;
  RoutingCounts routing;
  bool moe = false;
  for (int64_t i = 0; i < spec.cfg.layers; ++i) moe = moe || spec.cfg.is_moe_layer(i);
  if (spec.shapes_only && moe) {
    if (spec.replay) {
      routing = *spec.replay;
      TD_CHECK(routing.ranks == spec.mesh.world() && routing.chunks == n_chunks && routing.experts == spec.cfg.experts &&
                   routing.steps >= spec.run.steps,
               "emulate: replayed routing counts of {} ranks, {} chunks, {} experts, {} steps for a run of {}, {}, {}, "
               "{}",
               routing.ranks, routing.chunks, routing.experts, routing.steps, spec.mesh.world(), n_chunks,
               spec.cfg.experts, spec.run.steps);
    } else {
      routing = RoutingCounts::from_spec(parse_routing(spec.routing.empty() ? "uniform" : spec.routing), spec.cfg,
                                         spec.mesh.world(), n_chunks, spec.run.steps, spec.routing_seed);
    }
    sh.routing = &routing;
  } else if (spec.record_routing && moe) {
    routing = RoutingCounts::empty(spec.cfg, spec.mesh.world(), n_chunks, spec.run.steps);
    sh.routing = &routing;
  }
  const std::vector<md::Batch> batches = spec_batches(spec);
  for (const md::Batch& b : batches) md::validate_batch(spec.cfg, b);

  const int W = static_cast<int>(spec.mesh.world());
  const int64_t steps = spec.run.steps;
  EmulateResult<T> res;
  res.steps.resize(static_cast<size_t>(steps));
  res.peak_bytes.assign(static_cast<size_t>(W), 0);
  res.device_peak_bytes.assign(static_cast<size_t>(W), 0);
  res.phases.resize(static_cast<size_t>(W));
  if (spec.keep_state) res.state.resize(static_cast<size_t>(W));
  if (spec.keep_tensors) {
    res.grads.assign(static_cast<size_t>(steps), md::ParamSet<T>::zeros(spec.cfg));
    res.params.assign(static_cast<size_t>(steps), md::ParamSet<T>::zeros(spec.cfg));
  }
  std::vector<std::vector<RankStepStats>> per_rank(static_cast<size_t>(W),
                                                        std::vector<RankStepStats>(static_cast<size_t>(steps)));
  SpawnOptions so;
  so.record_trace = spec.record_trace;
  so.device = spec.device;
  so.device.shapes_only = spec.shapes_only;
  so.watchdog = std::chrono::milliseconds(spec.watchdog_ms > 0 ? spec.watchdog_ms : int64_t{spec.watchdog_s} * 1000);
  so.stack_bytes = 1 << 20;
  if (spec.eager_bytes > 0) so.eager_bytes = spec.eager_bytes;
  so.lower_exact_sum = spec.lower_exact_sum;
  so.exec = spec.exec;
  so.workers = spec.workers;
  so.drop_op = spec.drop_op;
  so.drop_count = spec.drop_count;
  if (spec.drop_count > 0 && spec.comm != CommBackend::emu)
    fail("emulate: the planted communicator emu-drop is the emulator's own (not --comm nccl-fake)");
  std::optional<FakeNcclWorld> fake_world;
  if (spec.comm == CommBackend::nccl_fake) {
    NcclOptions no;
    no.blocking = spec.nccl_blocking;
    no.deadline = std::chrono::milliseconds(int64_t{spec.watchdog_s} * 1000);
    fake_world.emplace(no);
  }
  const auto t0 = std::chrono::steady_clock::now();
  StepCpuClock cpu(W, steps);
  SpawnResult sr = spawn(
      W,
      [&](RankContext& ctx) {
        omp_set_num_threads(1);  // one core's worth per fake rank: ranks are the parallelism
        const int r = ctx.rank();
        std::optional<FakeNcclScope> fake_scope;
        std::unique_ptr<NcclCommunicator> nccl_world;
        if (spec.comm == CommBackend::nccl_fake) {
          fake_scope.emplace(ctx);
          nccl_world = fake_world->world(ctx);
        }
        Communicator& world = nccl_world ? static_cast<Communicator&>(*nccl_world) : ctx.world();
        MeshComms mc = make_mesh_comms(world, spec.mesh);
        std::unique_ptr<Kernels<T>> k =
            kernels ? kernels(r, ctx.device()) : std::make_unique<CpuKernels<T>>(ctx.device());
        RankStep<T> step(sh, world, mc, ctx.device(), *k);
        for (int64_t s = 0; s < steps; ++s) {
          const RankStepStats st = step.step(batches[static_cast<size_t>(s)]);
          per_rank[static_cast<size_t>(r)][static_cast<size_t>(s)] = st;
          // loss and grad norm are global values, identical on every rank: every rank stops at the same step
          if (!spec.shapes_only && (!std::isfinite(st.loss) || !std::isfinite(st.grad_norm)))
            fail(fmt::format("step {}: loss {} / grad norm {} is not finite (diverged: lower --lr?)", s + 1, st.loss,
                             st.grad_norm));
          if (spec.keep_tensors) {
            step.write_grads(res.grads[static_cast<size_t>(s)]);
            step.write_params(res.params[static_cast<size_t>(s)]);
          }
          cpu.done(s);
          if (r == 0 && spec.progress) spec.progress(s, st);
        }
        if (spec.keep_state) res.state[static_cast<size_t>(r)] = step.state();
        res.peak_bytes[static_cast<size_t>(r)] = step.memory().peak;
        res.device_peak_bytes[static_cast<size_t>(r)] = ctx.device().memory().peak;
        res.phases[static_cast<size_t>(r)] = step.phase_counts();
      },
      so);
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  res.step_cpu_seconds = cpu.seconds();
  for (auto& rr : sr.ranks) {
    res.rank_stats.push_back(std::move(rr.stats));
    if (spec.record_trace) res.traces.push_back(std::move(rr.trace));
  }
  for (int64_t s = 0; s < steps; ++s) {
    const RankStepStats& a = per_rank[0][static_cast<size_t>(s)];
    for (int r = 1; r < W; ++r) {
      const RankStepStats& b = per_rank[static_cast<size_t>(r)][static_cast<size_t>(s)];
      TD_CHECK(std::memcmp(&a.loss, &b.loss, sizeof(double)) == 0 && a.n_valid == b.n_valid &&
                   std::memcmp(&a.grad_norm, &b.grad_norm, sizeof(double)) == 0,
               "emulate: rank {} disagrees with rank 0 on step {} (loss {} vs {})", r, s, b.loss, a.loss);
    }
    res.steps[static_cast<size_t>(s)] = a;
  }
  res.routing = std::move(routing);
  return res;
}

StepCpuClock::StepCpuClock(int ranks, int64_t steps)
    : t0_(platform::cpu_seconds()), left_(new std::atomic<int>[static_cast<size_t>(steps)]),
      at_(static_cast<size_t>(steps), 0.0) {
  for (int64_t s = 0; s < steps; ++s) left_[static_cast<size_t>(s)].store(ranks);
}

void StepCpuClock::done(int64_t step) {
  if (left_[static_cast<size_t>(step)].fetch_sub(1, std::memory_order_acq_rel) == 1)
    at_[static_cast<size_t>(step)] = platform::cpu_seconds() - t0_;
}

// ---- reference check --------------------------------------------------------------------------------------------
bool CheckReport::ok() const { return first_mismatch() == nullptr; }
const TensorCheck* CheckReport::first_mismatch() const {
  for (const TensorCheck& c : checks)
    if (!c.equal) return &c;
  return nullptr;
}
std::string CheckReport::summary() const {
  const TensorCheck* m = first_mismatch();
  if (!m) {
    int64_t steps = 0;
    for (const TensorCheck& c : checks) steps = std::max(steps, c.step + 1);
    return fmt::format("bitwise equal to the single-rank reference: {} tensors over {} (loss, every gradient, "
                       "every parameter and router bias after each step)",
                       checks.size(), counted(steps, "step"));
  }
  int64_t bad = 0;
  for (const TensorCheck& c : checks) bad += c.equal ? 0 : 1;
  return fmt::format("MISMATCH: {} of {} tensors differ; first: step {} {} {} at index {} (got {:.9g}, reference "
                     "{:.9g})",
                     bad, checks.size(), m->step + 1, m->what, m->name.empty() ? "-" : m->name, m->first_index,
                     m->got, m->want);
}


template <class T>
CheckReport check_reference(const EmulateSpec& spec, const EmulateResult<T>& got, const md::TrainState<T>* resume) {
  TD_CHECK(spec.keep_tensors, "check_reference: the run must keep tensors");
  md::Trainer<T> tr(spec.cfg, spec.run);
  if (resume) tr.restore(*resume);
  else tr.params = spec_init<T>(spec);
  const std::vector<md::Batch> batches = spec_batches(spec);
  CheckReport rep;
  for (int64_t s = 0; s < spec.run.steps; ++s) {
    const md::StepStats st = tr.step(batches[static_cast<size_t>(s)]);
    const double gl = got.steps[static_cast<size_t>(s)].loss;
    rep.checks.push_back(compare_bits<double>(s, "loss", "", &gl, &st.loss, 1));
    const md::ParamSet<T>& g = got.grads[static_cast<size_t>(s)];
    const md::ParamSet<T>& p = got.params[static_cast<size_t>(s)];
    for (size_t i = 0; i < tr.params.size(); ++i) {
      const std::string& n = tr.params.info[i].name;
      if (tr.params.info[i].trainable)
        rep.checks.push_back(compare_bits<T>(s, "grad", n, g.t[i].ptr(), tr.grads.t[i].ptr(), tr.grads.t[i].size()));
      rep.checks.push_back(compare_bits<T>(s, "param", n, p.t[i].ptr(), tr.params.t[i].ptr(), tr.params.t[i].size()));
    }
  }
  return rep;
}

template struct EmulateResult<float>;
template struct EmulateResult<double>;
template EmulateResult<float> emulate<float>(const EmulateSpec&, const KernelFactory<float>&,
                                             const md::TrainState<float>*);
template EmulateResult<double> emulate<double>(const EmulateSpec&, const KernelFactory<double>&,
                                               const md::TrainState<double>*);
template CheckReport check_reference<float>(const EmulateSpec&, const EmulateResult<float>&,
                                            const md::TrainState<float>*);
template CheckReport check_reference<double>(const EmulateSpec&, const EmulateResult<double>&,
                                             const md::TrainState<double>*);

}  // namespace trident::emu
