// Checkpoints (golden/checkpoint.h, docs/checkpoints.md): resuming gives the bits of an uninterrupted run (train and
// emulate), a checkpoint of one mesh resumes on another with the bits of an uninterrupted run there, train and
// emulate checkpoints interchange, a save that fails or is killed midway leaves the previous checkpoint intact and
// nothing that loads, and damaged checkpoints are refused with one clear error.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <H5Cpp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "emulator/run_step.h"
#include "parallel/shard.h"
#include "golden/checkpoint.h"
#include "golden/state_dump.h"
#include "reference/check.h"
#include "reference/model/train.h"

namespace {

using namespace trident;
namespace md = trident::model;
namespace fs = std::filesystem;
using golden::CheckpointMeta;

fs::path scratch(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / fmt::format("trident_ckpt_{}_{}", ::getpid(), name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

// The run every case shares (valid on every mesh below): 8 sequences of 64 tokens.
struct Run {
  std::string preset = "tiny";
  std::string policy = "fp32";
  int64_t seqs = 8, seq_len = 64;
};

md::Config config_of(const Run& r) {
  md::Config c = md::Config::preset(r.preset);
  c.policy = parse_policy(r.policy);
  return c;
}
md::RunConfig run_of(const Run& r, int64_t steps) {
  md::RunConfig rc;
  rc.sequences = r.seqs;
  rc.seq_len = r.seq_len;
  rc.steps = steps;
  return rc;
}
emu::EmulateSpec spec_of(const Run& r, const MeshShape& m, int64_t steps, int64_t chunks = 1, bool recompute = false) {
  emu::EmulateSpec s;
  s.preset = r.preset;
  s.cfg = config_of(r);
  s.run = run_of(r, steps);
  s.run.recompute = recompute;
  s.mesh = m;
  s.ep_chunks = chunks;
  s.keep_tensors = true;
  s.keep_state = true;
  return s;
}

template <class T>
std::string first_diff(const md::ParamSet<T>& a, const md::ParamSet<T>& b) {
  if (a.size() != b.size()) return "tensor count";
  for (size_t p = 0; p < a.size(); ++p) {
    if (a.t[p].size() != b.t[p].size()) return a.info[p].name + " size";
    if (a.t[p].size() > 0 && std::memcmp(a.t[p].ptr(), b.t[p].ptr(), sizeof(T) * static_cast<size_t>(a.t[p].size())))
      return a.info[p].name;
  }
  return "";
}
template <class T>
void expect_state_eq(const md::TrainState<T>& a, const md::TrainState<T>& b, const std::string& what) {
  EXPECT_EQ(a.step, b.step) << what;
  EXPECT_EQ(first_diff(a.params, b.params), "") << what << ": weights";
  EXPECT_EQ(first_diff(a.m, b.m), "") << what << ": AdamW m";
  EXPECT_EQ(first_diff(a.v, b.v), "") << what << ": AdamW v";
}
template <class T>
void expect_rank_states_eq(const std::vector<ShardState<T>>& a, const std::vector<ShardState<T>>& b,
                           const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t r = 0; r < a.size(); ++r) {
    EXPECT_EQ(a[r].step, b[r].step) << what << " rank " << r;
    EXPECT_TRUE(a[r].w == b[r].w && a[r].m == b[r].m && a[r].v == b[r].v) << what << ": rank " << r << " state";
  }
}
bool bits_eq(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// A nonzero AdamW v somewhere (the moments really are carried).
template <class T>
bool moments_nonzero(const md::TrainState<T>& s) {
  for (const auto& t : s.v.t)
    for (T x : t.data)
      if (x != T(0)) return true;
  return false;
}

// ---- placement: the saved parts of all ranks cover every element exactly once -------------------------------------
TEST(CheckpointPlacement, OwnedPartsCoverEveryElementOnce) {
  for (const char* preset : {"tiny", "tiny-gqa", "tiny-e64"}) {
    const md::Config cfg = md::Config::preset(preset);
    for (const MeshShape& m : {MeshShape{1, 1, 1, 1, 1}, MeshShape{1, 8, 1, 1, 8}, MeshShape{2, 1, 4, 1, 8},
                               MeshShape{1, 2, 2, 2, 2}, MeshShape{3, 1, 1, 1, 3}, MeshShape{1, 4, 4, 2, 8}}) {
      if (cfg.experts % m.ep != 0) continue;
      for (const md::ParamInfo& in : md::param_layout(cfg)) {
        int64_t numel = 1;
        for (int64_t s : in.shape) numel *= s;
        std::vector<double> full(static_cast<size_t>(numel)), count(static_cast<size_t>(numel), 0.0);
        for (int64_t i = 0; i < numel; ++i) full[static_cast<size_t>(i)] = static_cast<double>(i);
        for (int64_t r = 0; r < m.world(); ++r) {
          const ParamPlacement pl = place(in, m, cfg.experts, r);
          std::vector<double> part(static_cast<size_t>(pl.valid_elems()));
          std::vector<double> padded(static_cast<size_t>(pl.padded_elems()));
          take_part(pl, full.data(), part.data());
          pad_part(pl, part.data(), padded.data());
          std::vector<double> back(part.size());
          unpad_part(pl, padded.data(), back.data());
          ASSERT_EQ(back, part) << in.name << " rank " << r;
          if (!pl.owner) continue;
          std::vector<double> one(part.size(), 1.0), seen(static_cast<size_t>(numel), 0.0);
          put_part(pl, one.data(), seen.data());
          for (size_t i = 0; i < seen.size(); ++i) count[i] += seen[i];
          std::vector<double> rebuilt(static_cast<size_t>(numel), -1.0);
          put_part(pl, part.data(), rebuilt.data());
          for (size_t i = 0; i < rebuilt.size(); ++i)
            if (seen[i] != 0.0) {
              ASSERT_EQ(rebuilt[i], full[i]) << in.name << " rank " << r << " element " << i;
            }
        }
        for (size_t i = 0; i < count.size(); ++i)
          ASSERT_EQ(count[i], 1.0) << preset << " " << m.spec() << " " << in.name << " element " << i;
      }
    }
  }
}

// ---- train: save after k steps, resume for n, against k + n uninterrupted ------------------------------------------
template <class T>
void train_resume(const Run& run, int64_t k, int64_t n) {
  const std::string repro = fmt::format("train_resume preset {} policy {} k {} n {}", run.preset, run.policy, k, n);
  const md::Config cfg = config_of(run);
  const md::RunConfig rc = run_of(run, k + n);
  md::Trainer<T> full(cfg, rc);
  std::vector<double> loss;
  for (int64_t s = 0; s < k + n; ++s) loss.push_back(full.step(md::synthetic_batch(cfg, rc, s)).loss);

  md::Trainer<T> first(cfg, rc);
  for (int64_t s = 0; s < k; ++s) first.step(md::synthetic_batch(cfg, rc, s));
  const fs::path dir = scratch("train") / "ck";
  CheckpointMeta meta{.writer = "train", .cfg = cfg, .run = rc, .mesh = {}, .step = first.step_count};
  golden::save_checkpoint<T>(dir.string(), meta, first.state());
  CheckpointMeta got;
  const md::TrainState<T> loaded = golden::load_checkpoint<T>(dir.string(), &got);
  expect_state_eq(loaded, first.state(), repro + ": round trip");
  EXPECT_TRUE(moments_nonzero(loaded)) << repro;
  EXPECT_EQ(got.step, k);
  EXPECT_EQ(got.writer, "train");
  golden::check_resumable(got, cfg, rc, dir.string());

  md::Trainer<T> second(cfg, rc);
  second.restore(loaded);
  for (int64_t s = k; s < k + n; ++s) {
    const md::StepStats st = second.step(md::synthetic_batch(cfg, rc, s));
    EXPECT_TRUE(bits_eq(st.loss, loss[static_cast<size_t>(s)])) << repro << ": loss of step " << s + 1;
  }
  EXPECT_EQ(first_diff(second.grads, full.grads), "") << repro << ": gradients of the last step";
  expect_state_eq(second.state(), full.state(), repro + ": final state");
  fs::remove_all(dir.parent_path());
}

TEST(CheckpointResume, TrainFp32) { train_resume<float>({.seqs = 4, .seq_len = 32}, 2, 2); }
TEST(CheckpointResume, TrainBf16Gqa) {
  train_resume<float>({.preset = "tiny-gqa", .policy = "bf16", .seqs = 4, .seq_len = 32}, 1, 2);
}
TEST(CheckpointResume, TrainFp64) { train_resume<double>({.policy = "fp64", .seqs = 4, .seq_len = 32}, 2, 1); }

// ---- emulate: save on mesh A after k steps, resume on mesh B for n, against k + n uninterrupted on B ---------------
struct Side {
  MeshShape mesh;
  bool train = false;  // the single-rank trainer instead of the emulator
  int64_t chunks = 1;
  bool recompute = false;
};

template <class T>
void reshard(const Run& run, const Side& a, const Side& b, int64_t k, int64_t n) {
  const std::string repro = fmt::format("reshard preset {} policy {} seqs {} seq_len {}: {} {} -> {} {}, {} + {} steps",
                                        run.preset, run.policy, run.seqs, run.seq_len, a.train ? "train" : "emulate",
                                        a.mesh.spec(), b.train ? "train" : "emulate", b.mesh.spec(), k, n);
  SCOPED_TRACE(repro);
  const md::Config cfg = config_of(run);
  const fs::path dir = scratch("reshard") / "ck";
  // write on A
  if (a.train) {
    md::Trainer<T> tr(cfg, run_of(run, k));
    for (int64_t s = 0; s < k; ++s) tr.step(md::synthetic_batch(cfg, tr.run, s));
    golden::save_checkpoint<T>(dir.string(), {.writer = "train", .cfg = cfg, .run = tr.run, .mesh = {}, .step = k},
                               tr.state());
  } else {
    emu::EmulateSpec sa = spec_of(run, a.mesh, k, a.chunks, a.recompute);
    sa.keep_tensors = false;
    const emu::EmulateResult<T> ra = emu::emulate<T>(sa);
    golden::save_checkpoint<T>(dir.string(),
                               {.writer = "emulate", .cfg = cfg, .run = sa.run, .mesh = a.mesh, .ep_chunks = a.chunks,
                                .step = k},
                               ra.state);
    ASSERT_EQ(static_cast<int64_t>(std::distance(fs::directory_iterator(dir), fs::directory_iterator{})),
              a.mesh.world() + 1);  // a file per rank and the manifest
  }
  CheckpointMeta meta;
  const md::TrainState<T> st = golden::load_checkpoint<T>(dir.string(), &meta);
  ASSERT_EQ(meta.mesh, a.mesh);
  ASSERT_EQ(st.step, k);
  EXPECT_TRUE(moments_nonzero(st));
  golden::check_resumable(meta, cfg, run_of(run, n), dir.string());
  // resume on B, and the uninterrupted run on B
  if (b.train) {
    md::Trainer<T> full(cfg, run_of(run, k + n)), resumed(cfg, run_of(run, n));
    resumed.restore(st);
    for (int64_t s = 0; s < k + n; ++s) {
      const md::Batch batch = md::synthetic_batch(cfg, full.run, s);
      const double lf = full.step(batch).loss;
      if (s < k) continue;
      EXPECT_TRUE(bits_eq(resumed.step(batch).loss, lf)) << "loss of step " << s + 1;
    }
    EXPECT_EQ(first_diff(resumed.grads, full.grads), "") << "gradients of the last step";
    expect_state_eq(resumed.state(), full.state(), repro);
  } else {
    const emu::EmulateSpec sf = spec_of(run, b.mesh, k + n, b.chunks, b.recompute);
    const emu::EmulateResult<T> full = emu::emulate<T>(sf);
    emu::EmulateSpec sr = spec_of(run, b.mesh, n, b.chunks, b.recompute);
    sr.first_step = k;
    const emu::EmulateResult<T> res = emu::emulate<T>(sr, nullptr, &st);
    for (int64_t s = 0; s < n; ++s) {
      const size_t f = static_cast<size_t>(k + s), i = static_cast<size_t>(s);
      EXPECT_TRUE(bits_eq(res.steps[i].loss, full.steps[f].loss)) << "loss of step " << k + s + 1;
      EXPECT_TRUE(bits_eq(res.steps[i].grad_norm, full.steps[f].grad_norm)) << "grad norm of step " << k + s + 1;
      EXPECT_EQ(first_diff(res.grads[i], full.grads[f]), "") << "gradients of step " << k + s + 1;
      EXPECT_EQ(first_diff(res.params[i], full.params[f]), "") << "weights after step " << k + s + 1;
    }
    expect_rank_states_eq(res.state, full.state, "every rank's weights, moments and step after the last step");
    ASSERT_FALSE(full.state.empty());
    EXPECT_EQ(full.state.front().step, k + n);
  }
  fs::remove_all(dir.parent_path());
}

MeshShape M(int64_t dr, int64_t f, int64_t cp, int64_t ef, int64_t ep) { return MeshShape{dr, f, cp, ef, ep}; }

TEST(CheckpointResume, EmulateSameMesh) {
  reshard<float>({}, {.mesh = M(1, 2, 2, 2, 2), .chunks = 2}, {.mesh = M(1, 2, 2, 2, 2), .chunks = 2}, 2, 2);
}
TEST(CheckpointReshard, OneTo8) { reshard<float>({}, {.mesh = M(1, 1, 1, 1, 1)}, {.mesh = M(1, 8, 1, 1, 8)}, 2, 2); }
TEST(CheckpointReshard, Fsdp8To_Cp4_EFsdp2Ep2) {
  reshard<float>({}, {.mesh = M(1, 8, 1, 1, 8)}, {.mesh = M(1, 1, 4, 2, 2), .chunks = 2}, 2, 2);
}
TEST(CheckpointReshard, Fsdp2Cp2To_DRep2Cp4Ep8_Bf16) {
  reshard<float>({.policy = "bf16"}, {.mesh = M(1, 2, 2, 2, 2)}, {.mesh = M(2, 1, 4, 1, 8), .recompute = true}, 2,
                 1);
}
TEST(CheckpointReshard, DRep2Cp2To1) {
  reshard<float>({}, {.mesh = M(2, 1, 2, 2, 2)}, {.mesh = M(1, 1, 1, 1, 1)}, 1, 2);
}
TEST(CheckpointReshard, Cp4To_Fsdp2Cp2Ep4) {
  reshard<float>({}, {.mesh = M(1, 1, 4, 2, 2), .chunks = 3}, {.mesh = M(1, 2, 2, 1, 4), .chunks = 2}, 2, 1);
}
TEST(CheckpointReshard, GqaFp64_Cp2Ep2To_Fsdp2Cp2) {
  reshard<double>({.preset = "tiny-gqa", .policy = "fp64", .seqs = 4, .seq_len = 32}, {.mesh = M(1, 1, 2, 1, 2)},
                  {.mesh = M(1, 2, 2, 2, 2)}, 1, 1);
}
TEST(CheckpointInterchange, TrainToEmulate) {
  reshard<float>({.seqs = 4, .seq_len = 32}, {.mesh = {}, .train = true}, {.mesh = M(1, 2, 2, 2, 2), .chunks = 2}, 2,
                 1);
}
TEST(CheckpointInterchange, EmulateToTrain) {
  reshard<float>({.seqs = 4, .seq_len = 32}, {.mesh = M(2, 1, 2, 2, 2)}, {.mesh = {}, .train = true}, 2, 1);
}

// ---- crash safety -----------------------------------------------------------------------------------------------
// Two emulated states of a 4-rank mesh: after 1 step (the checkpoint on disk) and after 2 (the save that fails).
struct TwoStates {
  CheckpointMeta m1, m2;
  std::vector<ShardState<float>> s1, s2;
};
const TwoStates& two_states() {
  static const TwoStates t = [] {
    TwoStates x;
    const Run run{.seqs = 4, .seq_len = 32};
    for (int k : {1, 2}) {
      emu::EmulateSpec s = spec_of(run, M(1, 2, 2, 2, 2), k);
      s.keep_tensors = false;
      CheckpointMeta m{.writer = "emulate", .cfg = s.cfg, .run = s.run, .mesh = s.mesh, .step = k};
      (k == 1 ? x.m1 : x.m2) = m;
      (k == 1 ? x.s1 : x.s2) = emu::emulate<float>(s).state;
    }
    return x;
  }();
  return t;
}

std::vector<fs::path> leftovers(const fs::path& parent) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(parent))
    if (e.path().filename().string().rfind(".ck.tmp-", 0) == 0) out.push_back(e.path());
  return out;
}

const char* kStages[] = {"rank_00000.h5", "rank_00002.h5", "manifest.json", "install"};

TEST(CheckpointCrash, ThrowingSaveKeepsPrevious) {
  const TwoStates& t = two_states();
  const fs::path parent = scratch("throw"), dir = parent / "ck";
  golden::save_checkpoint<float>(dir.string(), t.m1, t.s1);
  const md::TrainState<float> before = golden::load_checkpoint<float>(dir.string());
  ASSERT_EQ(before.step, 1);
  for (const char* stage : kStages) {
    golden::set_checkpoint_save_hook([&](const std::string& s) {
      if (s == stage) throw Error("injected failure at " + s);
    });
    EXPECT_THROW(golden::save_checkpoint<float>(dir.string(), t.m2, t.s2), Error) << stage;
    golden::set_checkpoint_save_hook(nullptr);
    expect_state_eq(golden::load_checkpoint<float>(dir.string()), before,
                    std::string("after a failed save at ") + stage);
    EXPECT_TRUE(leftovers(parent).empty()) << "a failed save cleans its temporary directory (" << stage << ")";
  }
  // and a save that completes replaces it
  golden::save_checkpoint<float>(dir.string(), t.m2, t.s2);
  EXPECT_EQ(golden::load_checkpoint<float>(dir.string()).step, 2);
  EXPECT_TRUE(leftovers(parent).empty());
  fs::remove_all(parent);
}

// A child process killed (SIGKILL) at each stage of a save: the previous checkpoint still loads with its bits, the
// temporary directory it leaves is never at the checkpoint's name, and before the manifest is written it does not load
// at all. Without a previous checkpoint, nothing loads at the name.
TEST(CheckpointCrash, KilledSaveKeepsPrevious) {
  const TwoStates& t = two_states();
  for (bool previous : {true, false}) {
    for (const char* stage : kStages) {
      const fs::path parent = scratch("kill"), dir = parent / "ck";
      md::TrainState<float> before;
      if (previous) {
        golden::save_checkpoint<float>(dir.string(), t.m1, t.s1);
        before = golden::load_checkpoint<float>(dir.string());
      }
      const pid_t pid = ::fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        golden::set_checkpoint_save_hook([&](const std::string& s) {
          if (s == stage) ::raise(SIGKILL);
        });
        try {
          golden::save_checkpoint<float>(dir.string(), t.m2, t.s2);
        } catch (...) {
          ::_exit(3);
        }
        ::_exit(0);  // not reached: the hook kills the process
      }
      int status = 0;
      ASSERT_EQ(::waitpid(pid, &status, 0), pid);
      ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "child status " << status << " at " << stage;
      const std::string what = fmt::format("killed at {} ({} previous checkpoint)", stage, previous ? "with" : "no");
      if (previous) {
        expect_state_eq(golden::load_checkpoint<float>(dir.string()), before, what);
      } else {
        try {
          golden::load_checkpoint<float>(dir.string());
          ADD_FAILURE() << what << ": a checkpoint loaded";
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("no such directory"), std::string::npos) << e.what();
        }
      }
      const std::vector<fs::path> left = leftovers(parent);
      ASSERT_EQ(left.size(), 1u) << what << ": the killed save's temporary directory";
      if (std::string(stage).rfind("rank_", 0) == 0) {
        EXPECT_THROW(golden::load_checkpoint<float>(left[0].string()), Error) << what;
      }
      fs::remove_all(parent);
    }
  }
}

// ---- damaged checkpoints -------------------------------------------------------------------------------------------
std::string load_error(const fs::path& dir) {
  try {
    golden::load_checkpoint<float>(dir.string());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
void expect_refused(const fs::path& dir, const std::string& needle, const std::string& what) {
  const std::string msg = load_error(dir);
  EXPECT_NE(msg.find(needle), std::string::npos) << what << ": got '" << msg << "'";
  EXPECT_EQ(msg.find('\n'), std::string::npos) << what << ": one line";
}

struct Damaged : ::testing::Test {
  fs::path parent, dir;
  void SetUp() override {
    const TwoStates& t = two_states();
    parent = scratch("damage");
    dir = parent / "ck";
    golden::save_checkpoint<float>(dir.string(), t.m1, t.s1);
    ASSERT_EQ(load_error(dir), "");
  }
  void TearDown() override { fs::remove_all(parent); }
  void flip(const fs::path& f, uintmax_t at) {
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(static_cast<std::streamoff>(at));
    char c = 0;
    io.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    io.seekp(static_cast<std::streamoff>(at));
    io.write(&c, 1);
  }
};

TEST_F(Damaged, FlippedBitInEveryRegionOfARankFile) {
  const fs::path f = dir / "rank_00001.h5";
  const uintmax_t n = fs::file_size(f);
  for (uintmax_t at : {uintmax_t{0}, uintmax_t{100}, n / 2, n - 1}) {
    flip(f, at);
    expect_refused(dir, "rank_00001.h5 checksum mismatch", fmt::format("bit flipped at byte {}", at));
    flip(f, at);
    EXPECT_EQ(load_error(dir), "");
  }
}
TEST_F(Damaged, TruncatedRankFile) {
  fs::resize_file(dir / "rank_00003.h5", fs::file_size(dir / "rank_00003.h5") - 7);
  expect_refused(dir, "rank_00003.h5 has", "truncated");
}
TEST_F(Damaged, MissingRankFile) {
  fs::remove(dir / "rank_00002.h5");
  expect_refused(dir, "rank_00002.h5 is missing", "missing rank file");
}
TEST_F(Damaged, MissingManifest) {
  fs::remove(dir / "manifest.json");
  expect_refused(dir, "manifest.json is missing", "missing manifest");
}
TEST_F(Damaged, EditedManifest) {
  std::ifstream in(dir / "manifest.json");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  const size_t at = s.find("\"step\": 1");
  ASSERT_NE(at, std::string::npos);
  s.replace(at, 9, "\"step\": 2");
  std::ofstream(dir / "manifest.json", std::ios::trunc) << s;
  expect_refused(dir, "manifest.json: checksum mismatch", "edited step");
  std::ofstream(dir / "manifest.json", std::ios::trunc) << "{\"format\": ";
  expect_refused(dir, "manifest.json", "not JSON");
}
TEST_F(Damaged, WrongDtypeAndIncompatibleRuns) {
  try {
    golden::load_checkpoint<double>(dir.string());
    ADD_FAILURE() << "f32 checkpoint loaded as f64";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds f32 tensors"), std::string::npos) << e.what();
  }
  const CheckpointMeta m = golden::read_checkpoint_meta(dir.string());
  auto refused = [&](const md::Config& c, const md::RunConfig& r, const std::string& needle) {
    try {
      golden::check_resumable(m, c, r, dir.string());
      ADD_FAILURE() << needle << ": accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  md::Config gqa = md::Config::preset("tiny-gqa");
  refused(gqa, m.run, "model config 'attention'");
  md::Config f64 = m.cfg;
  f64.policy = Policy::fp64;
  refused(f64, m.run, "model config 'policy'");
  md::RunConfig r = m.run;
  r.lr = 1e-3;
  refused(m.cfg, r, "--lr is");
  r = m.run;
  r.data_seed = 8;
  refused(m.cfg, r, "--data-seed is");
  // what never changes a bit may differ
  r = m.run;
  r.recompute = !r.recompute;
  r.token_chunk = 16;
  r.steps = 99;
  EXPECT_NO_THROW(golden::check_resumable(m, m.cfg, r, dir.string()));
}
// Re-seals every CRC after a deliberate edit (the damage happened before the checksum was made): only the validation
// of the restored state can catch it.
void reseal(const fs::path& dir) {
  auto read = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  nlohmann::json m = nlohmann::json::parse(read(dir / "manifest.json"));
  auto crc = [](const std::string& b) {
    return fmt::format("{:08x}",
                       golden::crc32(std::span<const std::byte>(reinterpret_cast<const std::byte*>(b.data()), b.size())));
  };
  for (auto& e : m["files"]) {
    const std::string b = read(dir / e["path"].get<std::string>());
    e["bytes"] = b.size();
    e["crc32"] = crc(b);
  }
  m.erase("checksum");
  m["checksum"] = crc(m.dump());
  std::ofstream(dir / "manifest.json", std::ios::trunc) << m.dump(1) << "\n";
}
void set_value(const fs::path& file, const std::string& dataset, double v) {
  H5::H5File f(file.string(), H5F_ACC_RDWR);
  H5::DataSet ds = f.openDataSet(dataset);
  H5::DataSpace sp = ds.getSpace();
  std::vector<hsize_t> dims(static_cast<size_t>(sp.getSimpleExtentNdims()));
  sp.getSimpleExtentDims(dims.data());
  std::vector<hsize_t> coord(dims.size(), 0);
  sp.selectElements(H5S_SELECT_SET, 1, coord.data());
  hsize_t one = 1;
  H5::DataSpace mem(1, &one);
  ds.write(&v, H5::PredType::NATIVE_DOUBLE, mem, sp);
}

TEST_F(Damaged, NonFiniteOrImpossibleMomentsAreRefusedUnderAValidChecksum) {
  const fs::path f = dir / "rank_00000.h5";
  struct Bad {
    std::string dataset;
    double v;
    std::string needle;
  };
  const std::vector<Bad> bad = {
      {"exp_avg/layers.0.attn.wq", std::nan(""), "exp_avg of layers.0.attn.wq element 0 is nan"},
      {"exp_avg/layers.0.attn.wq", INFINITY, "exp_avg of layers.0.attn.wq element 0 is inf"},
      {"exp_avg/layers.0.attn.wq", 3e38, "exp_avg of layers.0.attn.wq element 0 is 3e+38"},
      {"exp_avg_sq/embed", -1e-3, "exp_avg_sq of embed element 0 is -0.001"},
      {"exp_avg_sq/embed", 3e38, "exp_avg_sq of embed element 0 is 3e+38"},
      {"params/final_norm", -INFINITY, "params of final_norm element 0 is -inf"},
  };
  for (const Bad& b : bad) {
    const fs::path copy = parent / "bad";
    fs::remove_all(copy);
    fs::copy(dir, copy, fs::copy_options::recursive);
    set_value(copy / "rank_00000.h5", b.dataset, b.v);
    reseal(copy);
    expect_refused(copy, b.needle, b.dataset);
    expect_refused(copy, "restored state is invalid", b.dataset);
  }
  (void)f;
  // A value inside the bounds loads.
  const fs::path copy = parent / "ok";
  fs::copy(dir, copy, fs::copy_options::recursive);
  set_value(copy / "rank_00000.h5", "exp_avg_sq/embed", 0.5);
  reseal(copy);
  EXPECT_EQ(load_error(copy), "");
}
TEST_F(Damaged, EveryManifestFieldIsChecked) {
  auto edited = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& needle) {
    const fs::path copy = parent / "m";
    fs::remove_all(copy);
    fs::copy(dir, copy, fs::copy_options::recursive);
    std::ifstream in(copy / "manifest.json");
    nlohmann::json m = nlohmann::json::parse(in);
    in.close();
    edit(m);
    std::ofstream(copy / "manifest.json", std::ios::trunc) << m.dump(1);
    reseal(copy);
    expect_refused(copy, needle, needle);
  };
  edited([](nlohmann::json& m) { m["tensors"][0]["kind"] = "expert"; }, "has kind 'expert', its placement is 'dense'");
  edited([](nlohmann::json& m) { m["tensors"][0]["trainable"] = false; }, "has trainable false");
  edited([](nlohmann::json& m) { m["writer"] = "x"; }, "writer 'x'");
  edited([](nlohmann::json& m) { m["data"]["kind"] = "file"; }, "data is not {kind: synthetic");
  edited([](nlohmann::json& m) { m["extra"] = 1; }, "unknown key 'extra'");
  edited([](nlohmann::json& m) { m.erase("generator"); }, "key 'generator' is missing");
  edited([](nlohmann::json& m) { m["ep_chunks"] = 0; }, "ep_chunks 0");
}

TEST_F(Damaged, SaveRefusesToReplaceWhatIsNotACheckpoint) {
  const fs::path other = parent / "notes";
  fs::create_directories(other);
  std::ofstream(other / "keep.txt") << "precious";
  try {
    golden::save_checkpoint<float>(other.string(), two_states().m1, two_states().s1);
    ADD_FAILURE() << "replaced a directory that is not a checkpoint";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds no manifest.json"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::exists(other / "keep.txt"));
  EXPECT_THROW(golden::save_checkpoint<float>((parent / "no" / "such" / "ck").string(), two_states().m1,
                                              two_states().s1),
               Error);
}

}  // namespace
