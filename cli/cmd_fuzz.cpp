// `trident fuzz`: property-based fuzzing of sharding layouts for a model config (docs/fuzz.md). Draws valid layouts
// (fuzz/layout.h, the generator the step property tests use), checks every property of each (fuzz/check.h), shrinks
// a failure to a minimal layout and prints it as one `trident emulate ...` line. Exit 0: every property held; 1: one
// failed; 2: bad input. Under mpirun every layout runs on the MPI backend (docs/fuzz.md section 7): every process
// draws the same layouts from the same seed, with the ranks per process drawn with the world, and process 0's
// verdicts are every process's, so they run the same cases and shrink the same way.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "emulator/memory.h"
#include "fuzz/check.h"
#include "fuzz/layout.h"
#include "reference/check.h"
#include "reference/repro.h"
#include "sim/export.h"
#ifdef TRIDENT_HAVE_MPI
#include "mpi/run.h"
#endif

namespace {

using namespace trident;

struct Opts {
  std::string preset = "tiny";
  std::string config;
  int64_t cases = 0;    // 0: not given
  double time_s = 0;    // 0: not given
  int64_t max_world = 8;
  int64_t seed = 1;
  std::string kernels, comm, plant = "none", json;
  int64_t shrink_tries = 300;
  bool no_shrink = false, keep_going = false, quiet = false;
};

constexpr int64_t kDefaultCases = 100;

struct Failure {
  int64_t case_index = 0;
  uint64_t case_seed = 0;
  fuzz::Layout original, shrunk;
  fuzz::CaseResult first, last;
  int64_t tries = 0, accepted = 0;
};

uint64_t case_seed(uint64_t seed, int64_t i) {
  fuzz::SeededChoices c(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i));
  return static_cast<uint64_t>(c.in_range(0, int64_t{1} << 62));
}

std::string summary_of(const std::map<std::string, int64_t>& m) {
  std::string s;
  for (const auto& [k, v] : m) s += fmt::format("{}{} {}", s.empty() ? "" : ", ", k, v);
  return s;
}

// One progress line: a bar on a terminal (rewritten in place), else a line per tenth of the budget.
class Progress {
 public:
  Progress(const Opts& o, int64_t cases, double time_s)
      : tty_(isatty(fileno(stdout)) != 0), quiet_(o.quiet), cases_(cases), time_s_(time_s) {}
  void update(int64_t done, double elapsed, int64_t failures, const std::string& note = "") {
    if (quiet_) return;
    const double frac = cases_ > 0 ? double(done) / double(cases_) : std::min(1.0, elapsed / time_s_);
    const int tenth = static_cast<int>(frac * 10);
    if (!tty_ && tenth == last_tenth_ && note.empty()) return;
    last_tenth_ = tenth;
    const int width = 30, fill = static_cast<int>(width * frac);
    const double rate = elapsed > 0 ? double(done) * 60.0 / elapsed : 0.0;
    std::printf("%s[%.*s%*s] %lld%s cases  %.1f s  %.0f layouts/min  %lld failing%s%s", tty_ ? "\r" : "", fill,
                "##############################", width - fill, "", static_cast<long long>(done),
                cases_ > 0 ? fmt::format("/{}", cases_).c_str() : "", elapsed, rate,
                static_cast<long long>(failures), note.empty() ? "" : "  ", note.c_str());
    std::printf(tty_ ? "\033[K" : "\n");
    std::fflush(stdout);
  }
  void end() {
    if (tty_ && !quiet_) std::printf("\n");
  }

 private:
  bool tty_, quiet_;
  int64_t cases_;
  double time_s_;
  int last_tenth_ = -1;
};

int run(const Opts& o) {
  // ---- inputs (any problem: exit 2, one line)
  fuzz::GenOptions g;
  fuzz::Model m;
  if (!o.config.empty()) {
    m.cfg = model::Config::load(o.config);
    m.preset = "";
    m.config_path = o.config;
  } else {
    m.cfg = model::Config::preset(o.preset);
    m.preset = o.preset;
  }
  m.cfg.validate();
  g.models = {m};
  g.max_world = o.max_world;
  if (!o.kernels.empty()) (void)fuzz::parse_kernels(o.kernels), g.kernels = o.kernels;
  if (!o.comm.empty()) {
    if (o.comm.starts_with("emu-drop:")) (void)emu::parse_comm_drop(o.comm);
    else if (o.comm != "emu" && o.comm != "nccl-fake")
      fail(fmt::format("unknown communicator '{}' (emu, nccl-fake, or the planted emu-drop:OP:COUNT)", o.comm));
    g.comm = o.comm;
  }
  g.plant = emu::parse_plant(o.plant);
  if (!o.json.empty()) sim::check_writable_file(o.json, "--json");
  // The smallest layout must exist and fit: one rank, one sequence of 2 * tile tokens.
  {
    fuzz::Layout l;
    l.spec.cfg = m.cfg;
    l.spec.preset = m.preset;
    l.spec.config_path = m.config_path;
    l.spec.run.steps = 1;
    if (!fuzz::normalize(l))
      fail(fmt::format("no valid layout of {} within --max-world {}: even one rank with one sequence of {} tokens "
                       "breaks a mesh rule",
                       m.name(), o.max_world, 2 * m.cfg.tile));
    try {
      l.spec.run.validate();
      l.spec.run.validate_for(l.spec.cfg);
    } catch (const Error& e) {
      fail(fmt::format("no valid layout of {} within --max-world {}: the smallest batch (one sequence of {} tokens, "
                       "2 x tile) is refused: {}",
                       m.name(), o.max_world, l.spec.run.seq_len, e.what()));
    }
    const emu::MemoryEstimate est = emu::estimate_emulate(
        {l.spec.cfg, l.spec.run, l.spec.mesh, 1, 0, /*keep_tensors=*/true, /*check_reference=*/true});
    const double avail = emu::available_memory();
    if (avail > 0 && est.total() > avail)
      fail(fmt::format("no valid layout of {} within --max-world {}: even the smallest (one rank, one sequence of {} "
                       "tokens) needs {} with its reference check, {} available",
                       m.name(), o.max_world, l.spec.run.seq_len, emu::format_bytes(est.total()),
                       emu::format_bytes(avail)));
  }
  // ---- under mpirun: every layout on the MPI backend (one MPI session for the whole command)
  const fuzz::MpiBackend* mpi = nullptr;
  bool root = true;
#ifdef TRIDENT_HAVE_MPI
  std::optional<mpi::Session> session;
  fuzz::MpiBackend mb;
  if (mpi::launched_by_mpi()) {
    if (!o.kernels.empty() && o.kernels != "cpu")
      fail(fmt::format("--kernels {} needs the emulator backend: under mpirun every layout runs on the MPI backend, "
                       "which runs the CPU kernels (run trident fuzz without mpirun)",
                       o.kernels));
    if (!o.comm.empty() && o.comm != "emu")
      fail(fmt::format("--comm {} needs the emulator backend: under mpirun every layout runs on the MPI backend, "
                       "with its own communicator (run trident fuzz without mpirun)",
                       o.comm));
    session.emplace();
    if (o.max_world < session->processes())
      fail(fmt::format("--max-world {} is below the {} processes mpirun started: under mpirun a layout has at least "
                       "one rank per process",
                       o.max_world, session->processes()));
    g.processes = session->processes();
    g.comm.clear();
    root = session->process() == 0;
    if (!root && !std::freopen("/dev/null", "w", stdout))  // process 0 prints; every process exits the same way
      fail("cannot silence the output of the processes other than 0");
    auto runner = [](auto tag) {
      using T = decltype(tag);
      return [](const emu::EmulateSpec& s, int64_t rpp, emu::EmulateResult<T>& out) {
        mpi::FabricOptions fo;
        fo.ranks_per_process = static_cast<int>(rpp);
        fo.peer_timeout_s = 60;  // the processes share the cores with the reference check of process 0
        mpi::MpiRunResult<T> r = mpi::run_mpi<T>(s, fo);
        if (r.root) out = std::move(r.res);
        return r.root;
      };
    };
    mb.run_f32 = runner(float{});
    mb.run_f64 = runner(double{});
    mb.share = [](const std::string& v) { return mpi::share_from_root(v); };
    mpi = &mb;
  }
#endif
  const int64_t cases = o.cases > 0 ? o.cases : (o.time_s > 0 ? 0 : kDefaultCases);
  std::printf("trident fuzz: %s (%s attention, %lld layers, %lld experts top-%lld%s), layouts of up to %lld ranks, "
              "seed %lld, %s\n",
              m.name().c_str(), std::string(to_string(m.cfg.attn)).c_str(), static_cast<long long>(m.cfg.layers),
              static_cast<long long>(m.cfg.experts), static_cast<long long>(m.cfg.top_k),
              m.cfg.dsa() ? ", DSA" : "", static_cast<long long>(o.max_world), static_cast<long long>(o.seed),
              cases > 0 ? fmt::format("{} cases{}", cases, o.time_s > 0 ? fmt::format(" or {} s", o.time_s) : "").c_str()
                        : fmt::format("{} s", o.time_s).c_str());
  if (g.processes > 0)
    std::printf("MPI backend: %lld processes (mpirun); every layout's world a multiple of them, %s ranks per "
                "process drawn with it; properties runs, bits and memory\n",
                static_cast<long long>(g.processes), g.processes == 1 ? "its" : "1 or more");
  if (!o.kernels.empty() || !o.comm.empty() || g.plant != StepPlant::none)
    std::printf("fixed: %s%s%s\n", o.kernels.empty() ? "" : ("kernels " + o.kernels + " ").c_str(),
                o.comm.empty() ? "" : ("comm " + o.comm + " ").c_str(),
                g.plant == StepPlant::none ? "" : ("planted bug " + o.plant).c_str());
  // the exact command (one builder, reference/repro.h): every flag that changes what is drawn and checked
  ReproLine rl(g.processes > 0 ? fmt::format("mpirun -np {} trident fuzz", g.processes) : "trident fuzz");
  if (o.config.empty()) rl.opt("--preset", o.preset);
  else rl.opt("--config", o.config);
  if (o.cases > 0 || o.time_s <= 0) rl.opt("--cases", cases);
  if (o.time_s > 0) rl.opt("--time", o.time_s);
  rl.opt("--max-world", o.max_world).opt("--seed", o.seed);
  rl.opt_nonempty("--kernels", o.kernels).opt_nonempty("--comm", o.comm);
  if (g.plant != StepPlant::none) rl.opt("--plant", o.plant);
  rl.opt_if("--shrink-tries", o.shrink_tries, 300).flag("--no-shrink", o.no_shrink).flag("--keep-going", o.keep_going);
  rl.opt_nonempty("--json", o.json);
  std::printf("repro: %s\n", rl.str().c_str());
  std::fflush(stdout);

  // ---- the cases
  fuzz::keep_freed_memory();
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  Progress bar(o, cases, o.time_s);
  std::set<std::string> distinct;
  std::map<std::string, std::map<int64_t, int64_t>> dims;
  std::map<int64_t, int64_t> worlds;
  std::map<std::string, int64_t> features, checked;
  std::vector<Failure> failures;
  std::set<std::string> failure_keys;
  int64_t done = 0;
  double case_seconds = 0;
  double prop_seconds[fuzz::kNumProperties] = {};
  auto more = [&] {  // under mpirun process 0 decides (--time: the clocks differ), and every process follows
    const bool go = (cases == 0 || done < cases) && (o.time_s <= 0 || elapsed() < o.time_s);
    return mpi ? mpi->share(go ? "1" : "0") == "1" : go;
  };
  bool lost = false;  // an MPI run failed: MPI is unusable, no more runs
  while (!lost && more()) {
    const uint64_t cs = case_seed(static_cast<uint64_t>(o.seed), done);
    fuzz::SeededChoices ch(cs);
    const fuzz::Layout l = fuzz::draw(ch, g);
    const fuzz::CaseResult r = fuzz::check_layout(l, -1, mpi);
    case_seconds += r.seconds;
    for (int p = 0; p < fuzz::kNumProperties; ++p) prop_seconds[p] += r.property_seconds[p];
    ++done;
    distinct.insert(l.key());
    const MeshShape& ms = l.spec.mesh;
    for (const auto& [name, v] : {std::pair<const char*, int64_t>{"d_rep", ms.d_rep}, {"fsdp", ms.fsdp},
                                  {"cp", ms.cp}, {"e_fsdp", ms.e_fsdp}, {"ep", ms.ep}})
      dims[name][v]++;
    if (ms.cp_2d()) dims["cp_inner"][ms.cp_inner]++;
    if (l.processes > 0) dims["ranks_per_process"][l.ranks_per_process]++;
    dims["ep_chunks"][l.spec.ep_chunks]++;
    dims["steps"][l.spec.run.steps]++;
    dims["seq_len"][l.spec.run.seq_len]++;
    dims["sequences"][l.spec.run.sequences]++;
    worlds[ms.world()]++;
    for (const std::string& f : l.features()) features[f]++;
    for (fuzz::Property p : r.checked) checked[fuzz::to_string(p)]++;
    if (!r.ok) {
      Failure f;
      f.case_index = done - 1;
      f.case_seed = cs;
      f.original = l;
      f.first = r;
      std::printf("%scase %lld: property '%s' failed on %s\n  %s\n  repro: %s\n", isatty(fileno(stdout)) ? "\n" : "",
                  static_cast<long long>(done - 1), fuzz::to_string(r.failed), ms.str().c_str(), r.detail.c_str(),
                  r.repro.c_str());
      std::fflush(stdout);
      f.shrunk = l;
      f.last = r;
      lost = r.backend_lost;
      if (lost) std::printf("the MPI run failed: MPI is unusable for more runs in these processes (not shrunk)\n");
      if (!o.no_shrink && !lost) {
        std::printf("shrinking...\n");
        std::fflush(stdout);
        const fuzz::ShrinkResult sr = fuzz::shrink(l, r, g, o.shrink_tries, [&](const fuzz::ShrinkResult& s) {
          if (!o.quiet && isatty(fileno(stdout)))
            std::printf("\r  %lld tries, %lld smaller layouts kept: %s\033[K", static_cast<long long>(s.tries),
                        static_cast<long long>(s.accepted), s.layout.spec.mesh.str().c_str()),
                std::fflush(stdout);
        }, mpi);
        if (!o.quiet && isatty(fileno(stdout))) std::printf("\n");
        lost = sr.backend_lost;
        if (lost)
          std::printf("an MPI run failed while shrinking: MPI is unusable for more runs (shrinking stopped)\n");
        f.shrunk = sr.layout;
        f.last = sr.result;
        f.tries = sr.tries;
        f.accepted = sr.accepted;
        std::printf("shrunk in %lld tries (%lld kept) to %lld rank(s), %lld step(s), %lld x %lld tokens: %s\n",
                    static_cast<long long>(sr.tries), static_cast<long long>(sr.accepted),
                    static_cast<long long>(sr.layout.spec.mesh.world()),
                    static_cast<long long>(sr.layout.spec.run.steps),
                    static_cast<long long>(sr.layout.spec.run.sequences),
                    static_cast<long long>(sr.layout.spec.run.seq_len), sr.result.detail.c_str());
      }
      std::printf("repro: %s\n", f.last.repro.c_str());
      std::fflush(stdout);
      if (failure_keys.insert(f.shrunk.key() + fuzz::to_string(f.last.failed)).second) failures.push_back(f);
      if (!o.keep_going) break;
    }
    bar.update(done, elapsed(), static_cast<int64_t>(failures.size()));
  }
  bar.end();
  const double secs = elapsed();
  const double per_min = secs > 0 ? double(done) * 60.0 / secs : 0.0;

  // ---- the summary
  std::printf("%lld cases, %zu distinct layouts, %.1f s (%.0f layouts/min)%s\n", static_cast<long long>(done),
              distinct.size(), secs, per_min,
              failures.empty() ? "; every property held" : fmt::format("; {} failing", failures.size()).c_str());
  std::printf("properties checked: %s\n", summary_of(checked).c_str());
  std::string ts;
  for (int p = 0; p < fuzz::kNumProperties; ++p)
    ts += fmt::format("{}{} {:.1f} s", p ? ", " : "", fuzz::to_string(static_cast<fuzz::Property>(p)), prop_seconds[p]);
  std::printf("time per property (runs: the first run; bits: the reference): %s\n", ts.c_str());
  std::string ws;
  for (const auto& [w, n] : worlds) ws += fmt::format("{}{}:{}", ws.empty() ? "" : " ", w, n);
  std::printf("ranks: %s\n", ws.c_str());
  for (const auto& [name, hist] : dims) {
    std::string h;
    for (const auto& [v, n] : hist) h += fmt::format("{}{}:{}", h.empty() ? "" : " ", v, n);
    std::printf("%-10s %s\n", name.c_str(), h.c_str());
  }
  std::printf("features: %s\n", summary_of(features).c_str());
  for (const Failure& f : failures)
    std::printf("FAILED %s (case %lld, shrunk to %lld rank(s), %lld step(s)): %s\n  repro: %s\n",
                fuzz::to_string(f.last.failed), static_cast<long long>(f.case_index),
                static_cast<long long>(f.shrunk.spec.mesh.world()), static_cast<long long>(f.shrunk.spec.run.steps),
                f.last.detail.c_str(), f.last.repro.c_str());
  std::fflush(stdout);
  if (!o.json.empty() && root) {
    nlohmann::json j = {{"schema", "trident.fuzz/1"},
                        {"model", m.name()},
                        {"seed", o.seed},
                        {"max_world", o.max_world},
                        {"cases", done},
                        {"distinct_layouts", distinct.size()},
                        {"seconds", secs},
                        {"case_seconds", case_seconds},
                        {"layouts_per_minute", per_min},
                        {"ok", failures.empty()}};
    if (g.processes > 0) j["processes"] = g.processes;
    j["properties_checked"] = checked;
    nlohmann::json jd = nlohmann::json::object();
    for (const auto& [name, hist] : dims) {
      nlohmann::json h = nlohmann::json::object();
      for (const auto& [v, n] : hist) h[std::to_string(v)] = n;
      jd[name] = h;
    }
    nlohmann::json jw = nlohmann::json::object();
    for (const auto& [w, n] : worlds) jw[std::to_string(w)] = n;
    j["dimensions"] = jd;
    j["ranks"] = jw;
    j["features"] = features;
    nlohmann::json jf = nlohmann::json::array();
    for (const Failure& f : failures)
      jf.push_back({{"case", f.case_index},
                    {"property", fuzz::to_string(f.last.failed)},
                    {"detail", f.last.detail},
                    {"repro", f.last.repro},
                    {"original_repro", f.first.repro},
                    {"original_detail", f.first.detail},
                    {"ranks", f.shrunk.spec.mesh.world()},
                    {"steps", f.shrunk.spec.run.steps},
                    {"sequences", f.shrunk.spec.run.sequences},
                    {"seq_len", f.shrunk.spec.run.seq_len},
                    {"shrink_tries", f.tries},
                    {"shrink_kept", f.accepted}});
    j["failures"] = jf;
    sim::write_text_file(o.json, j.dump(2) + "\n", "--json");
    std::printf("wrote %s\n", o.json.c_str());
  }
  return failures.empty() ? 0 : 1;
}

}  // namespace

TRIDENT_COMMAND({"fuzz", "fuzz sharding layouts of a model: every property on random valid layouts, shrunk repro",
                 [](CLI::App& sub) -> trident::cli::Action {
                   auto o = std::make_shared<Opts>();
                   auto* preset = sub.add_option("--preset", o->preset, cli::preset_help())->capture_default_str();
                   sub.add_option("--config", o->config, "model config file (.json or .toml); instead of --preset")
                       ->check(CLI::ExistingFile)
                       ->excludes(preset);
                   sub.add_option("--cases", o->cases,
                                  "layouts to draw and check (default 100 when --time is not given)")
                       ->check(cli::positive_int());
                   sub.add_option("--time", o->time_s, "stop drawing after this many seconds")
                       ->check(CLI::PositiveNumber);
                   sub.add_option("--max-world", o->max_world, "ranks per layout at most")
                       ->check(CLI::Range(int64_t{1}, int64_t{1024}))
                       ->capture_default_str();
                   sub.add_option("--seed", o->seed, "the fuzzer's seed (case i draws from a seed derived from it)")
                       ->check(cli::int_at_least(0))
                       ->capture_default_str();
                   sub.add_option("--kernels", o->kernels,
                                  "the kernel set of every layout: cpu, cuda-ref-host, or cpu-ulp:OP[:INDEX] (a "
                                  "planted one-ulp kernel bug); default: cpu or cuda-ref-host, drawn");
                   sub.add_option("--comm", o->comm,
                                  "the communicator of every layout: emu, nccl-fake, or emu-drop:OP:COUNT (a planted "
                                  "bug: rank 1's contribution to every OP of COUNT elements dropped); default: drawn");
                   sub.add_option("--json", o->json,
                                  "write the summary as JSON: cases, distinct layouts, what was drawn, every "
                                  "failure's repro");
                   sub.add_option("--shrink-tries", o->shrink_tries, "runs the shrinker may spend on one failure")
                       ->check(cli::int_at_least(0))
                       ->capture_default_str();
                   sub.add_flag("--no-shrink", o->no_shrink, "report failures as drawn");
                   sub.add_flag("--keep-going", o->keep_going,
                                "go on after a failure (each distinct shrunk failure is reported)");
                   sub.add_flag("--quiet", o->quiet, "no progress bar");
                   sub.add_option("--plant", o->plant,
                                  "test hook: a planted bug of the step in every layout (none, zigzag-off-by-one, "
                                  "chunk-drops-token; docs/fuzz.md)")
                       ->group("");  // hidden
                   return [o]() -> int {
                     try {
                       return run(*o);
                     } catch (const Error& e) {
                       // bad input (a config, a flag value): exit 2 (1 means a property failed)
                       std::fprintf(stderr, "trident: error: %s\n", e.what());
                       return 2;
                     }
                   };
                 },
                 /*usage_exit=*/2});
