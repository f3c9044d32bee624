// The up-front memory estimates (emulator/memory.h) against measured peaks: every emulated rank's device peak
// (EmuDevice counts every allocation) and the peak resident memory of a child process running `train`. The
// estimate must be an upper bound within kMemoryEstimateFactor of the measurement.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <tuple>

#include "emulator/memory.h"
#include "emulator/run_step.h"
#include "emulator/world.h"
#include "reference/check.h"
#include "reference/exact_acc.h"
#include "reference/model/train.h"

namespace trident {
namespace {

using emu::kMemoryEstimateFactor;

struct EmuCase {
  std::string preset = "tiny";
  MeshShape mesh;
  int64_t chunks = 1;
  bool recompute = false;
  std::string policy = "fp32";
  int64_t seqs = 4, seq_len = 32;
};

emu::EmulateSpec spec_of(const EmuCase& c) {
  emu::EmulateSpec s;
  s.preset = c.preset;
  s.cfg = model::Config::preset(c.preset);
  s.cfg.policy = parse_policy(c.policy);
  s.run.sequences = c.seqs;
  s.run.seq_len = c.seq_len;
  s.run.steps = 2;
  s.run.recompute = c.recompute;
  s.mesh = c.mesh;
  s.ep_chunks = c.chunks;
  s.keep_tensors = false;
  return s;
}

// Each case emulated: every rank's device peak against the estimate's device part.
void check_device_peaks(const std::vector<EmuCase>& cases) {
  for (const EmuCase& c : cases) {
    const emu::EmulateSpec s = spec_of(c);
    SCOPED_TRACE(s.repro());
    const emu::MemoryEstimate est = emu::estimate_emulate({s.cfg, s.run, s.mesh, s.ep_chunks, 0, false, false});
    const std::vector<int64_t> peaks = s.cfg.policy == Policy::fp64 ? emu::emulate<double>(s).device_peak_bytes
                                                                     : emu::emulate<float>(s).device_peak_bytes;
    const double measured = static_cast<double>(*std::max_element(peaks.begin(), peaks.end()));
    const double want = est.device_bytes();
    std::printf("%-70s device peak %10.0f  estimate %10.0f  ratio %.2f\n", s.mesh.spec().c_str(), measured, want,
                want / measured);
    EXPECT_GE(want, measured) << est.describe();
    EXPECT_LE(want, kMemoryEstimateFactor * measured) << est.describe();
  }
}

TEST(MemoryEstimate, EmulateBoundsEveryRanksDevicePeak) {
  const std::vector<EmuCase> cases = {
      {.mesh = {1, 1, 1, 1, 1}},
      {.mesh = {1, 1, 2, 1, 2}},
      {.mesh = {1, 2, 2, 2, 2}, .chunks = 2},
      {.mesh = {1, 2, 2, 2, 2}, .chunks = 2, .recompute = true},
      {.mesh = {2, 1, 2, 2, 2}, .seqs = 8, .seq_len = 64},
      {.preset = "tiny-gqa", .mesh = {1, 1, 4, 2, 2}, .seq_len = 64},
      {.mesh = {1, 2, 1, 1, 2}, .policy = "fp64"},
      {.mesh = {1, 1, 2, 1, 2}, .recompute = true, .seqs = 8, .seq_len = 128},
      {.preset = "tiny-dsa", .mesh = {1, 2, 2, 2, 2}, .recompute = true, .seq_len = 64},
  };
  check_device_peaks(cases);
}

// The CP key side's term (cp_key_side, docs/emulator.md section 8): its formula on the kimi-k2 preset at 1 M
// context on cp 64 (the NVL72 study's layout), and on EmulateBoundsTheKeySide's long-sequence cases, where it is what
// sizes the accumulator arena (so their measured peaks hold it).
TEST(MemoryEstimate, KeySide) {
  emu::EmulateMemoryInputs in{model::Config::preset("kimi-k2"), model::RunConfig{}, MeshShape{4, 1, 64, 4, 64}};
  in.run.sequences = 4;  // one sequence per CP group
  in.run.seq_len = 1 << 20;
  const emu::CpKeySide k = emu::cp_key_side(in);
  const double SP = double(1 << 20) * 576, ch = double(1 << 20) / 128;
  EXPECT_DOUBLE_EQ(k.kv, SP * 4);                                           // 2.42 GB: S x P, bf16 held as float
  EXPECT_DOUBLE_EQ(k.acc, (SP + 3 * ch * 576) * sizeof(ExactAcc<float>));   // 34.6 GB: S x P + 3 ch x P exact sums
  EXPECT_NEAR(k.peak() / 1e9, 37.03, 0.01);
  std::printf("kimi-k2, S = 1M, cp = 64: gathered KV %.3f GB, key-side accumulators %.3f GB, together %.3f GB\n",
              k.kv / 1e9, k.acc / 1e9, k.peak() / 1e9);
  // listed in the estimate: its own accumulators part, and the gathered KV
  const emu::MemoryEstimate e = emu::estimate_emulate(in);
  double acc = 0, kv = 0;
  for (const emu::MemoryPart& p : e.per_rank) {
    if (p.what == "CP key side") acc = p.bytes;
    if (p.what == "gathered KV") kv = p.bytes;
  }
  EXPECT_DOUBLE_EQ(acc, k.acc);
  EXPECT_DOUBLE_EQ(kv, 61 * k.kv + SP * 4);  // every layer's (no recompute) and the forward's gather buffer
  // the long-sequence tiny cases: the key side is the larger use of the arena (so their peaks measure it)
  for (const auto& [mesh, seqs, seq_len] : std::vector<std::tuple<MeshShape, int64_t, int64_t>>{
           {{1, 1, 1, 1, 1}, 1, 2048}, {{1, 1, 2, 1, 2}, 2, 2048}, {{1, 1, 4, 1, 4}, 1, 2048}}) {
    emu::EmulateMemoryInputs t{model::Config::preset("tiny"), model::RunConfig{}, mesh};
    t.run.sequences = seqs;
    t.run.seq_len = seq_len;
    const emu::MemoryEstimate te = emu::estimate_emulate(t);
    double ks = 0, groups = 0;
    for (const emu::MemoryPart& p : te.per_rank) {
      if (p.what == "CP key side") ks = p.bytes;
      if (p.what == "accumulators") groups = p.bytes;
    }
    EXPECT_GT(ks, groups) << mesh.spec() << " " << te.describe();
  }
}

// Peak resident memory of a child running `steps` Trainer steps, minus what it inherited (the parent's resident
// memory at fork), in bytes. A fork's peak starts at the parent's: the larger emulations of EmulateBoundsTheKeySide
// run after this test.
double measured_train_bytes(const model::Config& cfg, const model::RunConfig& rc) {
  long pages = 0;
  {
    std::ifstream f("/proc/self/statm");
    long size = 0;
    f >> size >> pages;
  }
  const double inherited = static_cast<double>(pages) * static_cast<double>(sysconf(_SC_PAGESIZE));
  const pid_t pid = fork();
  if (pid == 0) {
    int code = 0;
    omp_set_num_threads(1);  // the memory does not depend on it; the time under load does
    try {
      if (cfg.policy == Policy::fp64) {
        model::Trainer<double> tr(cfg, rc);
        for (int64_t s = 0; s < rc.steps; ++s) (void)tr.step(model::synthetic_batch(cfg, rc, s));
      } else {
        model::Trainer<float> tr(cfg, rc);
        for (int64_t s = 0; s < rc.steps; ++s) (void)tr.step(model::synthetic_batch(cfg, rc, s));
      }
    } catch (...) {
      code = 1;
    }
    _exit(code);
  }
  int st = 0;
  rusage ru{};
  EXPECT_EQ(wait4(pid, &st, 0, &ru), pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  return static_cast<double>(ru.ru_maxrss) * 1024.0 - inherited;
}

TEST(MemoryEstimate, TrainBoundsMeasuredResidentPeak) {
  struct C {
    std::string preset, policy;
    int64_t seqs, seq_len;
    bool recompute;
  };
  for (const C& c : {C{"tiny", "fp32", 4, 256, false}, C{"tiny", "fp32", 4, 256, true},
                     C{"tiny-e64", "fp32", 2, 256, false}, C{"tiny", "fp64", 2, 128, false},
                     C{"tiny-dsa", "fp32", 4, 256, true}}) {
    model::Config cfg = model::Config::preset(c.preset);
    cfg.policy = parse_policy(c.policy);
    model::RunConfig rc;
    rc.sequences = c.seqs;
    rc.seq_len = c.seq_len;
    rc.steps = 1;
    rc.recompute = c.recompute;
    const emu::MemoryEstimate est = emu::estimate_train(cfg, rc, false);
    const double measured = measured_train_bytes(cfg, rc);
    // the program part of the estimate is in the child's inherited memory: compare the rest
    const double want = est.rank_bytes();
    std::printf("train %-8s %s seqs %lld x %lld%s: measured %10.0f  estimate %10.0f  ratio %.2f\n", c.preset.c_str(),
                c.policy.c_str(), static_cast<long long>(c.seqs), static_cast<long long>(c.seq_len),
                c.recompute ? " recompute" : "", measured, want, want / measured);
    EXPECT_GE(want, measured) << est.describe();
    EXPECT_LE(want, kMemoryEstimateFactor * measured) << est.describe();
  }
}

TEST(MemoryEstimate, RefusesWithTheNumbers) {
  model::Config cfg = model::Config::preset("tiny");
  model::RunConfig rc;
  const emu::MemoryEstimate est = emu::estimate_train(cfg, rc, false);
  try {
    emu::check_memory(est, 1024 * 1024, "train");
    FAIL() << "1 MiB accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("train: the run needs an estimated "), std::string::npos) << m;
    EXPECT_NE(m.find("over --max-memory 1.00 MiB (1048576 bytes)"), std::string::npos) << m;
    EXPECT_NE(m.find("exact accumulators"), std::string::npos) << m;
  }
  EXPECT_NO_THROW(emu::check_memory(est, 1e15, "train"));
  // a batch at the bounds of RunConfig (2^24 tokens) on the tiny model needs far more than a laptop
  rc.sequences = 1 << 20;
  rc.seq_len = 16;
  EXPECT_GT(emu::estimate_train(cfg, rc, false).total(), 64.0 * (1ull << 30));
}

TEST(MemoryEstimate, ParseBytes) {
  EXPECT_EQ(emu::parse_bytes("1000"), 1000);
  EXPECT_EQ(emu::parse_bytes("512MiB"), 512.0 * 1024 * 1024);
  EXPECT_EQ(emu::parse_bytes("8GiB"), 8.0 * 1024 * 1024 * 1024);
  EXPECT_EQ(emu::parse_bytes("1.5 GB"), 1.5e9);
  for (const char* bad : {"", "abc", "0", "-5", "5XB", "1e9", ".", "1.2.3GiB", "99999999999999999999999TiB"})
    EXPECT_THROW(emu::parse_bytes(bad), Error) << bad;
}

// Long sequences: the CP key side (gathered KV, key-side accumulators) outgrows the largest gradient group, at cp 1, 2
// and 4 (KeySide checks that it is the larger), so these peaks measure it. Last in the file: their emulations raise
// this process's resident peak, which TrainBoundsMeasuredResidentPeak's children would inherit.
TEST(MemoryEstimate, EmulateBoundsTheKeySide) {
  check_device_peaks({
      {.mesh = {1, 1, 1, 1, 1}, .recompute = true, .seqs = 1, .seq_len = 2048},
      {.mesh = {1, 1, 2, 1, 2}, .recompute = true, .seqs = 2, .seq_len = 2048},
      {.mesh = {1, 1, 2, 1, 2}, .seqs = 1, .seq_len = 2048},
      {.preset = "tiny-gqa", .mesh = {1, 1, 4, 2, 2}, .recompute = true, .seqs = 1, .seq_len = 2048},
      {.mesh = {1, 1, 4, 1, 4}, .recompute = true, .seqs = 1, .seq_len = 2048},
  });
}

}  // namespace
}  // namespace trident
