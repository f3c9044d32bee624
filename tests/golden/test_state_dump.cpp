// Golden state dump: bitwise write/read round trip for every dtype, structural edge cases, atomic writes,
// clear errors for unwritable paths and bad files, the comparer, and a read from Python with h5py.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <set>

#include "golden/state_dump.h"
#include "reference/check.h"

namespace fs = std::filesystem;
using namespace trident;
using namespace trident::golden;

namespace {

constexpr uint64_t kSeed = 20261129;

struct TempDir {
  fs::path dir;
  TempDir() {
    dir = fs::temp_directory_path() / fmt::format("trident_golden_test_{}", static_cast<long>(::getpid()));
    fs::create_directories(dir);
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(dir, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir, ec);
  }
  std::string file(const std::string& n) const { return (dir / n).string(); }
};

// Values that stress the bit patterns: signed zeros, subnormals, extremes, infinities, NaN payloads.
std::vector<double> special_f64() {
  const double inf = std::numeric_limits<double>::infinity();
  return {0.0, -0.0, 1.0, -1.5, std::numeric_limits<double>::denorm_min(), -std::numeric_limits<double>::min(),
          std::numeric_limits<double>::max(), inf, -inf, std::bit_cast<double>(0x7ff8000000000123ull), 1e-300,
          0.1};
}
std::vector<float> special_f32() {
  const float inf = std::numeric_limits<float>::infinity();
  return {0.0f, -0.0f, 1.0f, -1.5f, std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::min(),
          std::numeric_limits<float>::max(), inf, -inf, std::bit_cast<float>(0x7fc00123u), 1e-30f, 0.1f};
}

StateDump sample_state(std::mt19937_64& rng, bool fp64) {
  std::normal_distribution<double> nd;
  StateDump s;
  s.config = {{"preset", "tiny"}, {"policy", fp64 ? "fp64" : "bf16"}, {"d_model", 8}, {"vocab", 16}};
  s.seed = kSeed;
  s.repro = "trident train --preset tiny --steps 1 --dump x.h5";
  s.optimizer = {{"lr", 1e-3}, {"beta1", 0.9}, {"beta2", 0.95}};
  const int S = 2, L = 5;
  std::vector<int32_t> tok(S * L), tgt(S * L);
  for (int i = 0; i < S * L; ++i) {
    tok[i] = static_cast<int32_t>(rng() % 16);
    tgt[i] = (i % 4 == 3) ? -100 : static_cast<int32_t>(rng() % 16);
  }
  s.tokens = make_tensor("tokens", {S, L}, std::span<const int32_t>(tok));
  s.targets = make_tensor("targets", {S, L}, std::span<const int32_t>(tgt));
  s.loss = fp64 ? 2.7182818284590451 : static_cast<double>(2.71828f);

  auto add_all = [&](std::vector<NamedTensor>& out, double scale) {
    std::vector<double> a(3 * 4), sp = special_f64();
    for (double& x : a) x = nd(rng) * scale;
    std::vector<float> f(4 * 3), spf = special_f32();
    for (float& x : f) x = static_cast<float>(nd(rng) * scale);
    out.push_back(make_tensor("layers.0.attn.wq", {3, 4}, std::span<const double>(a)));
    out.push_back(make_tensor("layers.0.attn_norm", {12}, std::span<const double>(sp)));
    out.push_back(make_tensor("layers.1.moe.experts.wg", {2, 2, 3}, std::span<const float>(f)));
    out.push_back(make_tensor("specials.f32", {12}, std::span<const float>(spf)));
    out.push_back(make_tensor_bf16("embed", {4, 3}, std::span<const float>(f)));
    out.push_back(make_tensor_bf16("specials.bf16", {12}, std::span<const float>(spf)));
    std::vector<int32_t> iv = {0, -1, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
    out.push_back(make_tensor("counts", {2, 2}, std::span<const int32_t>(iv)));
    const double one = 3.25;
    out.push_back(make_tensor("scalar", {}, std::span<const double>(&one, 1)));
    out.push_back(make_tensor("empty", {0, 3}, std::span<const float>()));
  };
  add_all(s.weights, 1.0);
  add_all(s.grads, 1e-3);
  add_all(s.weights_after, 1.0);
  return s;
}

bool bytes_equal(const NamedTensor& a, const NamedTensor& b) { return a == b; }

std::vector<std::string> dir_entries(const fs::path& d) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(d)) out.push_back(e.path().filename().string());
  return out;
}

}  // namespace

TEST(GoldenStateDump, RoundTripBitwiseAllDtypes) {
  SCOPED_TRACE(fmt::format("repro: test_golden_state_dump --gtest_filter=*RoundTrip* (seed {})", kSeed));
  TempDir td;
  for (bool fp64 : {true, false}) {
    std::mt19937_64 rng(kSeed);
    const StateDump s = sample_state(rng, fp64);
    const std::string path = td.file(fp64 ? "fp64.h5" : "bf16.h5");
    write_state(path, s);
    const StateDump r = read_state(path);
    EXPECT_EQ(r.config, s.config);
    EXPECT_EQ(r.seed, s.seed);
    EXPECT_EQ(r.repro, s.repro);
    EXPECT_EQ(r.optimizer, s.optimizer);
    EXPECT_EQ(r.loss_dtype, fp64 ? "f64" : "f32");
    EXPECT_EQ(std::bit_cast<uint64_t>(r.loss), std::bit_cast<uint64_t>(s.loss));
    EXPECT_TRUE(bytes_equal(r.tokens, s.tokens));
    EXPECT_TRUE(bytes_equal(r.targets, s.targets));
    ASSERT_EQ(r.weights.size(), s.weights.size());
    for (size_t i = 0; i < s.weights.size(); ++i) {
      EXPECT_TRUE(bytes_equal(r.weights[i], s.weights[i])) << s.weights[i].name;  // name, order, shape, dtype
      EXPECT_TRUE(bytes_equal(r.grads[i], s.grads[i])) << s.grads[i].name;
      EXPECT_TRUE(bytes_equal(r.weights_after[i], s.weights_after[i])) << s.weights_after[i].name;
    }
    const CompareResult c = compare_states(s, r);
    EXPECT_TRUE(c.equal) << c.message;
    // Guard against a vacuous pass: the sample really holds nonzero data of every dtype.
    std::set<std::string> dtypes;
    double norm = 0;
    for (const auto& t : r.weights) {
      dtypes.insert(t.dtype);
      for (double v : values_as_double(t))
        if (std::isfinite(v)) norm += std::fabs(v);
    }
    EXPECT_EQ(dtypes, (std::set<std::string>{"f64", "f32", "bf16", "i32"}));
    EXPECT_GT(norm, 0);
  }
  // No temporary files left behind.
  for (const auto& n : dir_entries(td.dir)) EXPECT_EQ(n.find(".tmp."), std::string::npos) << n;
}

TEST(GoldenStateDump, F32LossIsTheFloatValue) {
  TempDir td;
  std::mt19937_64 rng(kSeed);
  StateDump s = sample_state(rng, false);
  s.loss = 1.0 / 3.0;  // not a float: stored rounded to f32
  write_state(td.file("a.h5"), s);
  EXPECT_EQ(read_state(td.file("a.h5")).loss, static_cast<double>(static_cast<float>(1.0 / 3.0)));
  s.loss_dtype = "f64";
  write_state(td.file("a.h5"), s);  // overwrite an existing file
  EXPECT_EQ(read_state(td.file("a.h5")).loss, 1.0 / 3.0);
}

TEST(GoldenStateDump, UnwritablePathsGiveClearErrors) {
  TempDir td;
  std::mt19937_64 rng(kSeed);
  const StateDump s = sample_state(rng, true);
  auto expect_error = [&](const std::string& path, const std::string& needle) {
    try {
      write_state(path, s);
      ADD_FAILURE() << "no error for " << path;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    }
  };
  expect_error(td.file("no/such/dir/x.h5"), "does not exist");
  fs::create_directories(td.dir / "adir");
  expect_error(td.file("adir"), "is a directory");
  std::ofstream(td.file("plainfile")) << "x";
  expect_error(td.file("plainfile/x.h5"), "not a directory");
  if (::geteuid() != 0) {  // root ignores permissions
    fs::create_directories(td.dir / "ro");
    fs::permissions(td.dir / "ro", fs::perms::owner_read | fs::perms::owner_exec);
    expect_error(td.file("ro/x.h5"), "not writable");
  }
}

TEST(GoldenStateDump, FailedWriteLeavesExistingFileAndNoTemp) {
  TempDir td;
  std::mt19937_64 rng(kSeed);
  StateDump s = sample_state(rng, true);
  const std::string path = td.file("keep.h5");
  write_state(path, s);
  const auto before = fs::file_size(path);
  StateDump bad = s;
  bad.grads.push_back(bad.grads.front());  // duplicate name -> error after the file was partly written
  EXPECT_THROW(write_state(path, bad), Error);
  StateDump bad2 = s;
  bad2.weights[0].name = "a/b";
  EXPECT_THROW(write_state(path, bad2), Error);
  StateDump bad3 = s;
  bad3.weights[0].bytes.pop_back();
  EXPECT_THROW(write_state(path, bad3), Error);
  EXPECT_EQ(fs::file_size(path), before);
  EXPECT_TRUE(compare_states(read_state(path), s).equal);
  EXPECT_EQ(dir_entries(td.dir), std::vector<std::string>{"keep.h5"});
}

TEST(GoldenStateDump, ReadErrors) {
  TempDir td;
  EXPECT_THROW(read_state(td.file("missing.h5")), Error);
  std::ofstream(td.file("garbage.h5")) << "not an hdf5 file";
  try {
    read_state(td.file("garbage.h5"));
    ADD_FAILURE() << "garbage accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("garbage.h5"), std::string::npos) << e.what();
  }
}

TEST(GoldenStateDump, ComparerFindsFirstDifference) {
  std::mt19937_64 rng(kSeed);
  const StateDump s = sample_state(rng, true);
  StateDump t = s;
  // Flip the last mantissa bit of grads/layers.0.attn.wq element 5.
  auto& g = t.grads[0];
  ASSERT_EQ(g.name, "layers.0.attn.wq");
  g.bytes[5 * 8] ^= std::byte{1};
  CompareResult c = compare_states(s, t);
  EXPECT_FALSE(c.equal);
  EXPECT_EQ(c.dataset, "grads/layers.0.attn.wq");
  EXPECT_EQ(c.index, 5);
  EXPECT_NE(c.a, c.b);
  // Within a relative tolerance of 1e-12 the one-ulp change passes; the NaN/Inf specials still match bitwise.
  EXPECT_TRUE(compare_states(s, t, {.rtol = 1e-12}).equal);
  // Structural differences.
  StateDump u = s;
  u.weights_after[2].shape = {3, 2, 2};
  c = compare_states(s, u);
  EXPECT_FALSE(c.equal);
  EXPECT_EQ(c.dataset, "weights_after/layers.1.moe.experts.wg");
  EXPECT_EQ(c.index, -1);
  StateDump v = s;
  v.seed += 1;
  EXPECT_EQ(compare_states(s, v).dataset, "attr:seed");
  EXPECT_TRUE(compare_states(s, v, {.compare_metadata = false}).equal);
  StateDump w = s;
  w.loss = std::nextafter(w.loss, 10.0);
  EXPECT_EQ(compare_states(s, w).dataset, "loss");
}

TEST(GoldenStateDump, PythonH5pyReadsTheFile) {
  // The first python3 with h5py: the one on PATH, else the system one (Debian's python3-h5py).
  std::string py;
  for (const char* cand : {"python3", "/usr/bin/python3"})
    if (std::system(fmt::format("{} -c 'import h5py, numpy' >/dev/null 2>&1", cand).c_str()) == 0) {
      py = cand;
      break;
    }
  if (py.empty())
    GTEST_SKIP() << "no python3 with h5py/numpy (apt-get install python3-h5py); skipping the h5py read";
  TempDir td;
  // Values from formulas that read_state.py recomputes independently.
  StateDump s;
  s.config = {{"policy", "bf16"}, {"vocab", 16}};
  s.seed = kSeed;
  s.repro = "trident train --preset tiny";
  s.optimizer = {{"lr", 0.001}};
  std::vector<int32_t> tok(2 * 3), tgt(2 * 3);
  for (int i = 0; i < 6; ++i) {
    tok[i] = i;
    tgt[i] = i == 2 ? -100 : i + 1;
  }
  s.tokens = make_tensor("tokens", {2, 3}, std::span<const int32_t>(tok));
  s.targets = make_tensor("targets", {2, 3}, std::span<const int32_t>(tgt));
  s.loss = 0.5;
  std::vector<float> w(12);
  std::vector<double> d(6);
  for (int i = 0; i < 12; ++i) w[i] = 0.25f * static_cast<float>(i) - 1.0f;  // bf16-exact
  for (int i = 0; i < 6; ++i) d[i] = 1.0 / (i + 1);
  s.weights.push_back(make_tensor_bf16("layers.0.attn.wq", {3, 4}, std::span<const float>(w)));
  s.weights.push_back(make_tensor("final_norm", {6}, std::span<const double>(d)));
  s.weights.push_back(make_tensor("lm_head", {4, 3}, std::span<const float>(w)));
  s.grads = s.weights;
  s.weights_after = s.weights;
  const std::string path = td.file("py.h5");
  write_state(path, s);
  const std::string cmd = fmt::format("{} '{}' '{}'", py, TRIDENT_GOLDEN_PY, path);
  EXPECT_EQ(std::system(cmd.c_str()), 0) << "repro: " << cmd;
}
