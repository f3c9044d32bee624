// bench_step: one full emulated FSDP x CP x EP step (3 optimizer steps, reported separately) on the 256-rank
// mesh (4,1,64)x(4,64) and on a 1,024-rank mesh, with exact reductions (the contract) and with plain sums,
// printing wall time per step, CPU time, peak RSS and the exact/plain cost ratio.
//
// The plain rows run bench_step_plain: this same program linked against the benchmark twins of the libraries
// in which ExactAcc<T> is a plain running sum (reference/plain_acc_impl.h) - every tile partial, every
// cross-rank merge (gradients, the KV gradient, the loss) and every accumulator is a plain fp32 sum / 4-byte
// value, with the step's code unchanged. Each row runs in its own child process (fork + exec of this binary or
// of the twin), so its peak RSS is its own.
//
// --pairs N (1..20, default 1) runs each configuration's exact and plain children N times, alternating (exact first in
// even pairs, plain first in odd ones), and prints the medians of the N pairs' CPU and user-CPU ratios and the ratio of
// the two builds' least CPU times (the run least disturbed by other load on a shared machine), besides every pair.
// The order alternates because the kernel's time to fault in pages that the previous run did not leave free (system
// time, 'sys s') varies widely on a virtual machine and would otherwise always fall on the build that needs more.
//
// The children use the host's allocator as `trident emulate` does (no mallopt): the ranks' device buffers come
// from their workers' pools (emulator/block_pool.h), the host's heap holds only kernels' scratch.
//
// Usage: bench_step [--steps N] [--only 256|1024] [--no-plain] [--pairs N]

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_child.h"
#include "emulator/run_step.h"
#include "platform/process.h"

using namespace trident;

namespace {

using bench::kPlainBuild;

struct Conf {
  std::string name;  // "256" or "1024", plus "r" with full recompute
  MeshShape mesh;
  int64_t seqs, seq_len, tile, chunks;
  bool recompute;
};
const std::vector<Conf> kConfs = {
    {"256", MeshShape{4, 1, 64, 4, 64}, 4, 1024, 8, 2, false},
    {"256r", MeshShape{4, 1, 64, 4, 64}, 4, 1024, 8, 2, true},
    {"1024", MeshShape{16, 4, 16, 16, 64}, 64, 256, 8, 2, false},
    {"1024r", MeshShape{16, 4, 16, 16, 64}, 64, 256, 8, 2, true},
};

struct Out {  // written by the child to the fd it is given
  double step_s[8] = {};
  int64_t steps = 0;
  int64_t tracked_max = 0;
  double wall = 0;
  double loss_last = 0, norm_last = 0;  // of the last step: the plain run's are close to, not equal to, exact's
  int ok = 0;
};

// Child: runs one configuration and writes Out to fd.
int child(const std::string& name, int64_t steps, int fd, size_t eager) {
  const auto it = std::find_if(kConfs.begin(), kConfs.end(), [&](const Conf& c) { return c.name == name; });
  if (it == kConfs.end()) return 2;
  const Conf& c = *it;
  Out o;
  emu::EmulateSpec s;
  s.preset = "tiny-e64";
  s.cfg = model::Config::preset("tiny-e64");
  s.cfg.tile = c.tile;
  s.run.sequences = c.seqs;
  s.run.seq_len = c.seq_len;
  s.run.steps = steps;
  s.run.recompute = c.recompute;
  s.mesh = c.mesh;
  s.ep_chunks = c.chunks;
  s.keep_tensors = false;
  s.eager_bytes = eager;
  auto last = std::chrono::steady_clock::now();
  s.progress = [&](int64_t k, const RankStepStats& st) {
    const auto now = std::chrono::steady_clock::now();
    if (k < 8) o.step_s[k] = std::chrono::duration<double>(now - last).count();
    last = now;
    o.loss_last = st.loss;
    o.norm_last = st.grad_norm;
  };
  try {
    const auto r = emu::emulate<float>(s);
    o.steps = steps;
    o.wall = r.seconds;
    for (int64_t b : r.peak_bytes) o.tracked_max = std::max(o.tracked_max, b);
    o.ok = 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_step child %s: %s\n", name.c_str(), e.what());
  }
  bench::write_result(fd, o);
  return o.ok ? 0 : 1;
}

// Parent: runs `exe --child NAME STEPS [...] --fd N` (bench/bench_child.h); false when the child failed.
bool run_child(const std::string& exe, const Conf& c, int64_t steps, size_t eager, Out& o,
               double& user, double& sys, long& rss_kb) {
  std::vector<std::string> args = {"--child", c.name, std::to_string(steps), "--eager-bytes", std::to_string(eager)};
  bench::ChildUsage u;
  const bool ok = bench::run_child(exe, args, o, u);
  user = u.user;
  sys = u.sys;
  rss_kb = u.rss_kb;
  return ok && o.ok;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 3, pairs = 1;
  std::string only, child_name;
  bool plain = true;
  int child_fd = -1;
  size_t eager = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
    else if (!std::strcmp(argv[i], "--no-plain")) plain = false;
    else if (!std::strcmp(argv[i], "--pairs") && i + 1 < argc) {
      char* end = nullptr;
      pairs = std::strtoll(argv[++i], &end, 10);
      if (*end != '\0' || pairs < 1 || pairs > 20) {
        std::fprintf(stderr, "bench_step: --pairs takes a whole number from 1 to 20 (got '%s')\n", argv[i]);
        return 2;
      }
    }
    else if (!std::strcmp(argv[i], "--eager-bytes") && i + 1 < argc) eager = static_cast<size_t>(std::atoll(argv[++i]));
    else if (!std::strcmp(argv[i], "--child") && i + 2 < argc) {
      child_name = argv[++i];
      steps = std::atoll(argv[++i]);
    } else if (!std::strcmp(argv[i], "--fd") && i + 1 < argc) child_fd = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: bench_step [--steps N] [--only 256|1024] [--no-plain] [--pairs N]\n");
      return 2;
    }
  }
  steps = std::min<int64_t>(std::max<int64_t>(steps, 1), 8);
  if (!child_name.empty()) return child(child_name, steps, child_fd < 0 ? 1 : child_fd, eager);
  if (kPlainBuild) {
    std::fprintf(stderr, "bench_step_plain is the plain-sum child of bench_step; run bench_step\n");
    return 2;
  }
  if (only != "" && only != "256" && only != "1024") {
    std::fprintf(stderr, "bench_step: --only takes 256 or 1024\n");
    return 2;
  }
  const std::filesystem::path self = platform::executable_path();
  const std::string exact_exe = self.string(), plain_exe = (self.parent_path() / "bench_step_plain").string();
  if (plain && !std::filesystem::exists(plain_exe)) {
    std::printf("(no %s: plain rows skipped; build the bench_step_plain target)\n", plain_exe.c_str());
    plain = false;
  }
  std::printf("bench_step: tiny-e64 (V 512, d 64, 3 layers, 64 experts top-4), fp32, EP chunks 2; "
              "%u hardware threads\n",
              std::thread::hardware_concurrency());
  std::printf("%-5s %-24s %-22s %-6s %-28s %8s %8s %9s %10s\n", "ranks", "mesh", "batch", "sums", "wall s/step",
              "user s", "sys s", "RSS MiB", "track/rk");
  int failures = 0;
  for (const Conf& c : kConfs) {
    const std::string ranks = std::to_string(c.mesh.world());
    if (!only.empty() && only != ranks) continue;
    std::vector<double> ratios, user_ratios, cpu_e, cpu_p;  // per pair
    const int failed_before = failures;
    struct Run {
      double wall = 0, user = 0, sys = 0, loss = 0, norm = 0;
    };
    // One child (mode 0 exact, 1 plain): prints its row; false when it failed.
    auto run_one = [&](int mode, Run& out) {
      long rss = 0;
      Out o;
      if (!run_child(mode ? plain_exe : exact_exe, c, steps, eager, o, out.user, out.sys, rss)) {
        std::printf("%-5s %s: the %s run failed (see stderr)\n", ranks.c_str(), c.name.c_str(),
                    mode ? "plain" : "exact");
        ++failures;
        return false;
      }
      std::string per;
      for (int64_t k = 0; k < o.steps; ++k) {
        per += fmt::format("{}{:.2f}", k ? " " : "", o.step_s[k]);
        out.wall += o.step_s[k];
      }
      out.loss = o.loss_last;
      out.norm = o.norm_last;
      const std::string mesh = fmt::format("({},{},{})x({},{}){}", c.mesh.d_rep, c.mesh.fsdp, c.mesh.cp,
                                           c.mesh.e_fsdp, c.mesh.ep, c.recompute ? " recomp" : "");
      std::printf("%-5s %-24s %-22s %-6s %-28s %8.2f %8.2f %9.1f %8.2fMiB\n", ranks.c_str(), mesh.c_str(),
                  fmt::format("{}x{} T={}", c.seqs, c.seq_len, c.tile).c_str(), mode ? "plain" : "exact",
                  per.c_str(), out.user, out.sys, static_cast<double>(rss) / 1024.0,
                  static_cast<double>(o.tracked_max) / (1024.0 * 1024.0));
      std::fflush(stdout);
      return true;
    };
    for (int64_t pair = 0; pair < (plain ? pairs : 1) && failures == failed_before; ++pair) {
      Run r[2];
      if (!plain) {
        run_one(0, r[0]);
        break;
      }
      // Pairs alternate which build runs first (exact, plain; then plain, exact; ...): on a virtual machine the pages
      // a run needs beyond what the previous run freed can be far slower to fault in, which would otherwise always
      // fall on the build that needs more memory.
      const int first = static_cast<int>(pair % 2);
      if (!run_one(first, r[first]) || !run_one(1 - first, r[1 - first])) break;
      const Run& e = r[0];
      const Run& pl = r[1];
      std::printf("      exact / plain cost ratio: wall %.3f, CPU %.3f, user CPU %.3f (plain: every accumulator a "
                  "plain fp32 running sum, 4 B instead of 56 B, in-kernel and across ranks); last step's loss %.9g vs "
                  "%.9g, grad norm %.9g vs %.9g\n",
                  e.wall / pl.wall, (e.user + e.sys) / (pl.user + pl.sys), e.user / pl.user, e.loss, pl.loss, e.norm,
                  pl.norm);
      ratios.push_back((e.user + e.sys) / (pl.user + pl.sys));
      user_ratios.push_back(e.user / pl.user);
      cpu_e.push_back(e.user + e.sys);
      cpu_p.push_back(pl.user + pl.sys);
    }
    if (ratios.size() > 1) {
      auto median = [](std::vector<double> r) {
        std::sort(r.begin(), r.end());
        const size_t n = r.size();
        return std::array<double, 3>{n % 2 ? r[n / 2] : (r[n / 2 - 1] + r[n / 2]) / 2, r.front(), r.back()};
      };
      const auto m = median(ratios), u = median(user_ratios);
      std::printf("      over %zu alternating pairs: exact / plain CPU median %.3f (%.3f-%.3f), user CPU median %.3f "
                  "(%.3f-%.3f); least exact CPU / least plain CPU %.3f (%.2f / %.2f s)\n",
                  ratios.size(), m[0], m[1], m[2], u[0], u[1], u[2],
                  *std::min_element(cpu_e.begin(), cpu_e.end()) / *std::min_element(cpu_p.begin(), cpu_p.end()),
                  *std::min_element(cpu_e.begin(), cpu_e.end()), *std::min_element(cpu_p.begin(), cpu_p.end()));
    }
  }
  std::printf("targets (2-core machine): 256 ranks <= 5 s/step, 1,024 ranks <= 30 s/step, RSS <= 4 GB. Wall time "
              "depends on other load on the machine; user+sys is the CPU work.\n");
  return failures ? 1 : 0;
}
