// bench_small: one full reference training step (forward, backward, clip, AdamW, router bias; reference/model/
// train.h) of the `small` preset (55.9 M parameters, 2 x 512 tokens by default, fp32) against the machine's
// GEMM speed, measured in the same run:
//  - achieved GFLOP/s of the step (FLOPs counted from the shapes, reference/model/flops.h) as a fraction of
//    Eigen's fp32 GEMM GFLOP/s on the same OpenMP threads (target >= 0.6);
//  - peak RSS per parameter (target <= 32 B plus activations; the fp32 training state alone is 16 B);
//  - exact vs plain sums: the same step linked against the plain-sum twins of the libraries (bench_small_plain,
//    ExactAcc<T> a plain running sum; reference/plain_acc_impl.h), CPU time ratio (target <= 1.1);
//  - where the last step's CPU time goes, per op, in both runs (the op profile, reference/profile.h: exclusive
//    process CPU time, on for the last step only), the reference GEMM's own GFLOP per CPU-second against Eigen's,
//    and what exact sums cost per op (exact - plain).
// Each run is a child process (bench/bench_child.h), so its peak RSS and CPU time are its own.
// --pairs N runs N alternating exact / plain pairs and prints the median of their ratios (the machine is noisy: one
// pair's ratio moves by +-10%); the per-op tables are the first pair's.
// Usage: bench_small [--steps N] [--seqs B] [--seq-len S] [--recompute] [--no-plain] [--pairs N]
#include <omp.h>

#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_child.h"
#include "bench/model/eigen_rate.h"
#include "platform/process.h"
#include "reference/gemm.h"
#include "reference/model/flops.h"
#include "reference/model/train.h"
#include "reference/profile.h"

using namespace trident;
using namespace trident::model;

namespace {

using bench::kPlainBuild;

constexpr int kMaxSteps = 8;

struct Out {  // written by the child
  double wall[kMaxSteps] = {};
  double cpu[kMaxSteps] = {};
  double loss_last = 0, norm_last = 0;
  int64_t steps = 0;
  int ok = 0;
  // The op profile of the last step (reference/profile.h), per prof::Op.
  double op_s[prof::kOps] = {};
  int64_t op_flops[prof::kOps] = {};
  int64_t op_calls[prof::kOps] = {};
};

using bench::process_cpu_s;

RunConfig run_config(int64_t seqs, int64_t seq_len, bool recompute) {
  RunConfig rc;
  rc.sequences = seqs;
  rc.seq_len = seq_len;
  rc.recompute = recompute;
  return rc;
}

int child(int64_t steps, const RunConfig& rc, int fd) {
  Out o;
  try {
    const Config c = Config::preset("small");
    rc.validate_for(c);
    Trainer<float> tr(c, rc);
    for (int64_t k = 0; k < steps; ++k) {
      const Batch b = synthetic_batch(c, rc, k);
      const bool profile = k == steps - 1;  // the last step: the first also pays for first-touch page faults
      prof::reset();
      prof::enable(profile);
      const auto w0 = std::chrono::steady_clock::now();
      const double c0 = process_cpu_s();
      const StepStats st = tr.step(b);
      o.cpu[k] = process_cpu_s() - c0;
      o.wall[k] = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
      prof::enable(false);
      if (profile) {
        const prof::Profile p = prof::snapshot();
        for (int i = 0; i < prof::kOps; ++i) {
          o.op_s[i] = p.op[i].seconds;
          o.op_flops[i] = p.op[i].flops;
          o.op_calls[i] = p.op[i].calls;
        }
      }
      o.loss_last = st.loss;
      o.norm_last = st.grad_norm;
    }
    o.steps = steps;
    o.ok = 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_small child: %s\n", e.what());
  }
  bench::write_result(fd, o);
  return o.ok ? 0 : 1;
}

using bench::eigen_gflops;
using bench::Rate;

// The op profiles of the runs' last steps: per op its exclusive CPU seconds, share of the step's CPU time, calls;
// for gemm its GFLOP per CPU-second and that over Eigen's; with the plain run, exact - plain per op.
void print_profile(const Out* outs, int runs, double eigen_cpu, double executed_flops) {
  std::printf("per-op CPU time of the last step (op profile, reference/profile.h): exclusive, an op's seconds leave "
              "out the ops nested in it; inside OpenMP parallel regions nothing is attributed (the team's CPU time "
              "counts in the op around the region)\n");
  std::printf("%-16s", "op");
  for (int r = 0; r < runs; ++r)
    std::printf(" | %5s CPU s %6s %7s %11s %7s", r ? "plain" : "exact", "share", "calls", "GFLOP/CPU-s", "/ Eigen");
  if (runs == 2) std::printf(" | %15s", "exact - plain s");
  std::printf("\n");
  auto cells = [&](const Out& o, double s, int64_t calls, int64_t flops) {
    const double step = o.cpu[o.steps - 1];
    std::printf(" | %11.3f %5.1f%% %7lld", s, 100 * s / step, static_cast<long long>(calls));
    if (flops > 0 && s > 0) {
      const double g = static_cast<double>(flops) / s / 1e9;
      std::printf(" %11.2f %7.3f", g, g / eigen_cpu);
    } else {
      std::printf(" %11s %7s", "", "");
    }
  };
  auto diff = [](double a, double b) { return std::fabs(a - b) < 5e-4 ? 0.0 : a - b; };  // no "-0.000"
  for (int i = 0; i < prof::kOps; ++i) {
    std::printf("%-16s", prof::name(static_cast<prof::Op>(i)));
    for (int r = 0; r < runs; ++r) cells(outs[r], outs[r].op_s[i], outs[r].op_calls[i], outs[r].op_flops[i]);
    if (runs == 2) std::printf(" | %+15.3f", diff(outs[0].op_s[i], outs[1].op_s[i]));
    std::printf("\n");
  }
  double sum[2] = {0, 0};
  int64_t calls[2] = {0, 0};
  for (int r = 0; r < runs; ++r)
    for (int i = 0; i < prof::kOps; ++i) sum[r] += outs[r].op_s[i], calls[r] += outs[r].op_calls[i];
  std::printf("%-16s", "sum of the ops");
  for (int r = 0; r < runs; ++r) cells(outs[r], sum[r], calls[r], 0);
  if (runs == 2) std::printf(" | %+15.3f", diff(sum[0], sum[1]));
  std::printf("\n");
  const int g = static_cast<int>(prof::Op::gemm);
  std::printf("gemm counts %.2f of the step's %.2f executed GFLOP (the rest run inside linear CE, the tile reductions "
              "and the attention core); shares are of the run's last-step CPU time (%.3f s exact",
              static_cast<double>(outs[0].op_flops[g]) / 1e9, executed_flops / 1e9, outs[0].cpu[outs[0].steps - 1]);
  if (runs == 2) std::printf(", %.3f s plain", outs[1].cpu[outs[1].steps - 1]);
  std::printf(")\n");
}

}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 2, seqs = 2, seq_len = 512, pairs = 1;
  bool recompute = false, plain = true, is_child = false;
  int fd = -1;
  auto usage = [] {
    std::fprintf(stderr, "usage: bench_small [--steps N (1-%d)] [--seqs B] [--seq-len S] [--recompute] [--no-plain] "
                 "[--pairs N (1-99)]\n",
                 kMaxSteps);
    return 2;
  };
  for (int i = 1; i < argc; ++i) {
    auto num = [&](int64_t& v) {
      if (i + 1 >= argc) return false;
      char* end = nullptr;
      v = std::strtoll(argv[++i], &end, 10);
      return *end == '\0';
    };
    int64_t fdv = -1;
    if (!std::strcmp(argv[i], "--steps")) {
      if (!num(steps)) return usage();
    } else if (!std::strcmp(argv[i], "--seqs")) {
      if (!num(seqs)) return usage();
    } else if (!std::strcmp(argv[i], "--seq-len")) {
      if (!num(seq_len)) return usage();
    } else if (!std::strcmp(argv[i], "--recompute")) {
      recompute = true;
    } else if (!std::strcmp(argv[i], "--pairs")) {
      if (!num(pairs)) return usage();
    } else if (!std::strcmp(argv[i], "--no-plain")) {
      plain = false;
    } else if (!std::strcmp(argv[i], "--child")) {
      is_child = true;
    } else if (!std::strcmp(argv[i], "--fd")) {
      if (!num(fdv)) return usage();
      fd = static_cast<int>(fdv);
    } else {
      return usage();
    }
  }
  if (steps < 1 || steps > kMaxSteps || seqs < 1 || seq_len < 1 || pairs < 1 || pairs > 99) return usage();
  const RunConfig rc = run_config(seqs, seq_len, recompute);
  if (is_child) return child(steps, rc, fd);
  if (kPlainBuild) {
    std::fprintf(stderr, "bench_small_plain is the plain-sum child of bench_small; run bench_small\n");
    return 2;
  }
  const Config c = Config::preset("small");
  try {
    rc.validate_for(c);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_small: %s\n", e.what());
    return 2;
  }
  const StepFlops f = step_flops(c, rc);
  const double params = static_cast<double>(c.param_count());
  std::printf("bench_small: one reference training step of `small` (%.0f parameters), %lld x %lld tokens, fp32, "
              "%s; %d OpenMP threads, %u hardware threads, load %.2f; reference GEMM kernel %s\n",
              params, static_cast<long long>(seqs), static_cast<long long>(seq_len),
              recompute ? "full recompute" : "stored activations", omp_get_max_threads(),
              std::thread::hardware_concurrency(), [] {
                double l[1] = {0};
                return getloadavg(l, 1) == 1 ? l[0] : -1.0;
              }(), gemm_isa_name(gemm_isa()));
  std::printf("FLOPs per step (reference/model/flops.h): executed %.2f G = forward %.2f + backward %.2f + recompute "
              "%.2f (attention core %.2f of the forward); model FLOPs %.2f G\n",
              f.executed() / 1e9, f.forward / 1e9, f.backward / 1e9, f.recompute / 1e9, f.attn_core_forward / 1e9,
              f.model() / 1e9);
  const int64_t N = seqs * seq_len;
  const Rate eigen = eigen_gflops(N, 4 * c.d_model, c.d_model);
  std::printf("Eigen fp32 GEMM %lld x %lld x %lld on %d threads: %.1f GFLOP/s wall, %.1f GFLOP per CPU-second\n",
              static_cast<long long>(N), static_cast<long long>(4 * c.d_model), static_cast<long long>(c.d_model),
              omp_get_max_threads(), eigen.wall, eigen.cpu);
  const std::filesystem::path self = platform::executable_path();
  // Eigen built for the wide ISAs the reference's GEMM kernels use (reference/gemm_kernel.h), where this CPU runs them:
  // separate programs (bench/model/eigen_gemm.cpp), as Eigen's templates for two ISAs must not share a binary.
  struct Wide {
    const char* name;
    const char* what;
    GemmIsa needs;
    Rate r;
  };
  Wide wide[] = {{"avx2", "AVX2 without FMA (two roundings, as the reference)", GemmIsa::avx2, {}},
                 {"avx512_fma", "AVX-512F with FMA (Eigen's only AVX-512 build; the reference may not fuse)",
                  GemmIsa::avx512, {}}};
  for (Wide& w : wide) {
    if (!gemm_isa_supported(w.needs)) continue;
    const std::string exe = (self.parent_path() / (std::string("bench_eigen_gemm_") + w.name)).string();
    const std::string cmd = exe + " " + std::to_string(N) + " " + std::to_string(4 * c.d_model) + " " +
                            std::to_string(c.d_model) + " 2>/dev/null";
    if (FILE* pf = std::filesystem::exists(exe) ? popen(cmd.c_str(), "r") : nullptr) {
      if (std::fscanf(pf, "%lf %lf", &w.r.wall, &w.r.cpu) != 2) w.r = {};
      pclose(pf);
    }
    if (w.r.cpu > 0)
      std::printf("Eigen fp32 GEMM built for %s: %.1f GFLOP/s wall, %.1f GFLOP per CPU-second\n", w.what, w.r.wall,
                  w.r.cpu);
    else
      std::printf("(no %s: the comparison with Eigen built for %s is skipped)\n", exe.c_str(), w.name);
  }
  // The children's idle OpenMP threads sleep, as under `trident` (cli/main.cpp), unless the caller chose otherwise:
  // a spinning thread's CPU time would count against the step.
  setenv("OMP_WAIT_POLICY", "passive", /*overwrite=*/0);
  const std::string plain_exe = (self.parent_path() / "bench_small_plain").string();
  if (plain && !std::filesystem::exists(plain_exe)) {
    std::printf("(no %s: the plain row is skipped; build the bench_small_plain target)\n", plain_exe.c_str());
    plain = false;
  }
  std::vector<std::string> args = {"--child", "--steps", std::to_string(steps), "--seqs", std::to_string(seqs),
                                   "--seq-len", std::to_string(seq_len)};
  if (recompute) args.push_back("--recompute");
  std::printf("%-6s %-20s %-20s %9s %8s %11s %8s %9s %8s\n", "sums", "wall s per step", "CPU s per step",
              "GFLOP/s", "/ Eigen", "GFLOP/CPU-s", "/ Eigen", "RSS MiB", "B/param");
  double cpu_exact = 0, loss_exact = 0, norm_exact = 0;
  Out outs[2];
  std::vector<double> ratios, of_eigen;  // per pair: exact / plain CPU, exact GFLOP per CPU-second / Eigen's
  for (int64_t pair = 0; pair < pairs; ++pair) {
    for (int mode = 0; mode < (plain ? 2 : 1); ++mode) {
      Out scratch;
      Out& o = pair == 0 ? outs[mode] : scratch;
      bench::ChildUsage u;
      if (!bench::run_child(mode ? plain_exe : self.string(), args, o, u) || !o.ok) {
        std::printf("the %s run failed (see stderr)\n", mode ? "plain" : "exact");
        return 1;
      }
      std::string w, cp;
      for (int64_t k = 0; k < o.steps; ++k) {
        w += (k ? " " : "") + std::to_string(o.wall[k]).substr(0, 5);
        cp += (k ? " " : "") + std::to_string(o.cpu[k]).substr(0, 5);
      }
      // The last step: the first one also pays for first-touch page faults of every buffer.
      const double wall = o.wall[o.steps - 1], cpu = o.cpu[o.steps - 1];
      const double gw = f.executed() / wall / 1e9, gc = f.executed() / cpu / 1e9;
      std::printf("%-6s %-20s %-20s %9.2f %8.3f %11.2f %8.3f %9.1f %8.1f\n", mode ? "plain" : "exact", w.c_str(),
                  cp.c_str(), gw, gw / eigen.wall, gc, gc / eigen.cpu, static_cast<double>(u.rss_kb) / 1024.0,
                  static_cast<double>(u.rss_kb) * 1024.0 / params);
      if (mode == 0) {
        of_eigen.push_back(gc / eigen.cpu);
        cpu_exact = cpu;
        loss_exact = o.loss_last;
        norm_exact = o.norm_last;
      } else {
        std::printf("exact / plain CPU time of the last step: %.3f (target <= 1.1); last loss %.9g vs %.9g, grad norm "
                    "%.9g vs %.9g\n",
                    cpu_exact / cpu, loss_exact, o.loss_last, norm_exact, o.norm_last);
        ratios.push_back(cpu_exact / cpu);
      }
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  };
  if (pairs > 1) {
    std::printf("over %lld alternating pairs: exact GFLOP per CPU-second / Eigen's median %.3f (%.3f-%.3f)",
                static_cast<long long>(pairs), median(of_eigen), *std::min_element(of_eigen.begin(), of_eigen.end()),
                *std::max_element(of_eigen.begin(), of_eigen.end()));
    if (!ratios.empty())
      std::printf("; exact / plain CPU median %.3f (%.3f-%.3f)", median(ratios),
                  *std::min_element(ratios.begin(), ratios.end()), *std::max_element(ratios.begin(), ratios.end()));
    std::printf("\n");
  }
  std::printf("targets: the last step's GFLOP per CPU-second >= 0.6 x Eigen's (the wall-clock ratio is the same on an "
              "idle machine; under other load the CPU-time ratio is the stable one); peak RSS <= 32 B per parameter "
              "plus activations (fp32 weights, gradients and AdamW moments: 16 B)\n");
  for (const Wide& w : wide) {
    if (w.r.cpu <= 0) continue;
    std::printf("against Eigen built for %s (%.1f GFLOP per CPU-second): the exact step at %.3f", w.name, w.r.cpu,
                f.executed() / outs[0].cpu[outs[0].steps - 1] / 1e9 / w.r.cpu);
    if (plain)
      std::printf(", the plain step at %.3f", f.executed() / outs[1].cpu[outs[1].steps - 1] / 1e9 / w.r.cpu);
    std::printf("\n");
  }
  print_profile(outs, plain ? 2 : 1, eigen.cpu, f.executed());
  return 0;
}
