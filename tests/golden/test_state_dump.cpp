// Golden state dump: bitwise write/read round trip for every dtype, structural edge cases, atomic writes,
// clear errors for unwritable paths and bad files, the comparer, and a read from Python with h5py.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <set>

#include "golden/state_dump.h"
#include "reference/check.h"
#include "reference/model/config.h"
#include "reference/model/params.h"
#include "tests/golden/micro_config.h"

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
  const std::string cmd = fmt::format("{} '{}' --test-file '{}'", py, TRIDENT_GOLDEN_PY, path);
  EXPECT_EQ(std::system(cmd.c_str()), 0) << "repro: " << cmd;
}

// ---------------------------------------------------------------------------------------------------------------
// Hardening (issue 15): the checksum header, and a reader that validates every attribute and dataset before it
// reads one (before: a multi-element `seed` or `schema_version` or an array of strings overflowed the stack, and
// bit flips in the global heap crashed HDF5).

namespace {

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void spit(const std::string& p, const std::string& s) {
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(s.data(), static_cast<std::streamsize>(s.size()));
}

// Expect read_state to throw trident::Error naming the file and containing `needle`.
void expect_read_error(const std::string& path, const std::string& needle, ReadOptions opt = {}) {
  try {
    read_state(path, opt);
    ADD_FAILURE() << "read_state accepted " << path << " (expected: " << needle << ")";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << "expected '" << needle << "' in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
  }
}

// verify_checksum without throwing on a mismatch (the edit changed the payload): is there a header?
Checksum verify_checksum_status(const std::string& path) {
  return slurp(path).rfind("TRIDENT-STATE-CHECKSUM", 0) == 0 ? Checksum::ok : Checksum::absent;
}

// Edits a dump in place with the HDF5 C API (as h5py or a hostile tool would), then re-seals its checksum when it
// has one, so the reader's own validation is what is tested.
void edit_h5(const std::string& path, const std::function<void(hid_t)>& edit) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0) << path;
  edit(f);
  ASSERT_GE(H5Fclose(f), 0);
  if (verify_checksum_status(path) != Checksum::absent) seal_checksum(path);
}

void put_attr(hid_t obj, const char* name, hid_t type, hid_t space, const void* data, hid_t mem = -1) {
  if (H5Aexists(obj, name) > 0) {
    ASSERT_GE(H5Adelete(obj, name), 0);
  }
  const hid_t a = H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(a, 0) << name;
  if (data) {
    ASSERT_GE(H5Awrite(a, mem >= 0 ? mem : type, data), 0) << name;
  }
  H5Aclose(a);
}
void put_root_attr(hid_t f, const char* name, hid_t type, hid_t space, const void* data, hid_t mem = -1) {
  const hid_t root = H5Gopen2(f, "/", H5P_DEFAULT);
  put_attr(root, name, type, space, data, mem);
  H5Gclose(root);
}
hid_t vlen_str() {
  const hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, H5T_VARIABLE);
  return t;
}
hid_t vec_space(hsize_t n) { return H5Screate_simple(1, &n, nullptr); }

// A dump in both layouts: with the checksum header (edits re-seal it) and without (older files).
std::vector<std::pair<std::string, WriteOptions>> layouts() {
  return {{"sealed", WriteOptions{.checksum = true}}, {"legacy", WriteOptions{.checksum = false}}};
}

// The smallest dump whose config is a model config: the reader checks it against the parameter layout.
StateDump model_state(bool fp64) {
  model::Config c = goldentest::micro_config(20, 0);
  c.policy = fp64 ? Policy::fp64 : Policy::fp32;
  StateDump s;
  s.config = c.to_json();
  s.seed = 3;
  s.repro = "test";
  s.optimizer = {{"lr", 0.001}};
  std::vector<int32_t> tok = {1, 2, 3, 19}, tgt = {2, 3, -100, 0};
  s.tokens = make_tensor("tokens", {1, 4}, std::span<const int32_t>(tok));
  s.targets = make_tensor("targets", {1, 4}, std::span<const int32_t>(tgt));
  s.loss = 2.5;
  auto add = [&](const auto& ps) {
    for (size_t p = 0; p < ps.size(); ++p) {
      const auto& t = ps.t[p];
      s.weights.push_back(make_tensor(ps.info[p].name, t.shape, std::span(t.data.data(), t.data.size())));
    }
  };
  if (fp64) add(model::ParamSet<double>::init(c, 3));
  else add(model::ParamSet<float>::init(c, 3));
  s.grads = s.weights;
  s.weights_after = s.weights;
  return s;
}

}  // namespace

TEST(GoldenChecksum, HeaderCrcAndLegacyLayout) {
  const std::string check = "123456789";
  EXPECT_EQ(crc32(std::as_bytes(std::span(check.data(), check.size()))), 0xCBF43926u);  // the CRC-32 check value
  EXPECT_EQ(crc32({}), 0u);
  TempDir td;
  std::mt19937_64 rng(kSeed);
  const StateDump s = sample_state(rng, true);
  write_state(td.file("sealed.h5"), s);
  write_state(td.file("legacy.h5"), s, {.checksum = false});
  EXPECT_EQ(verify_checksum(td.file("sealed.h5")), Checksum::ok);
  EXPECT_EQ(verify_checksum(td.file("legacy.h5")), Checksum::absent);
  const std::string bytes = slurp(td.file("sealed.h5"));
  ASSERT_GT(bytes.size(), kChecksumBlock + 8);
  EXPECT_EQ(bytes.substr(0, 25), "TRIDENT-STATE-CHECKSUM 1\n");
  EXPECT_EQ(bytes.substr(kChecksumBlock + 1, 3), "HDF");  // HDF5 finds its superblock after the user block
  // The documented recipe: zlib.crc32 of everything after the 512-byte block, and its length.
  const std::string payload = bytes.substr(kChecksumBlock);
  EXPECT_NE(bytes.find(fmt::format("payload_bytes {}\n", payload.size())), std::string::npos);
  EXPECT_NE(bytes.find(fmt::format("crc32 {:08x}\n", crc32(std::as_bytes(std::span(payload.data(), payload.size()))))),
            std::string::npos);
  for (const char* f : {"sealed.h5", "legacy.h5"})
    for (bool isolate : {true, false}) {
      const StateDump r = read_state(td.file(f), {.isolate = isolate});
      EXPECT_TRUE(compare_states(r, s).equal) << f;
      EXPECT_EQ(std::bit_cast<uint64_t>(r.loss), std::bit_cast<uint64_t>(s.loss));
    }
  // seal_checksum is idempotent on an intact file and refuses a file without the user block.
  seal_checksum(td.file("sealed.h5"));
  EXPECT_EQ(slurp(td.file("sealed.h5")), bytes);
  EXPECT_THROW(seal_checksum(td.file("legacy.h5")), Error);
}

TEST(GoldenChecksum, CorruptionIsOneErrorBeforeHdf5ParsesAByte) {
  TempDir td;
  std::mt19937_64 rng(kSeed);
  write_state(td.file("ok.h5"), sample_state(rng, false));
  const std::string good = slurp(td.file("ok.h5"));
  const std::string p = td.file("bad.h5");
  // A flipped bit anywhere in the payload: in the global heap (the measured crash), in tensor data (silent
  // nonsense without a checksum), in the superblock, in the last byte.
  const size_t gcol = good.find("GCOL");
  ASSERT_NE(gcol, std::string::npos);
  for (size_t at : {gcol + 20, gcol + 100, good.size() / 2, kChecksumBlock + 3, good.size() - 1}) {
    std::string b = good;
    b[at] ^= 0x10;
    spit(p, b);
    expect_read_error(p, "checksum mismatch");
    expect_read_error(p, "checksum mismatch", {.isolate = false});
  }
  spit(p, good.substr(0, good.size() - 100));
  expect_read_error(p, "truncated: the file has");
  spit(p, good.substr(0, 300));
  expect_read_error(p, "truncated");
  spit(p, good + "junk");
  expect_read_error(p, "extended: the file has");
  {
    std::string b = good;
    b[60] ^= 0x01;  // inside the header's text
    spit(p, b);
    expect_read_error(p, "the checksum header is corrupt");
    b = good;
    b[400] = 'x';  // the header's padding
    spit(p, b);
    expect_read_error(p, "the checksum header is corrupt");
    b = good;
    b[0] ^= 0x01;  // the magic: neither the header nor the HDF5 signature
    spit(p, b);
    expect_read_error(p, "not a state dump");
  }
  spit(p, "");
  expect_read_error(p, "not an HDF5 file (0 bytes)");
  expect_read_error(td.dir.string(), "not a regular file");
  EXPECT_THROW(verify_checksum(td.dir.string()), Error);  // never blocks on a directory, FIFO or device
}

TEST(GoldenReader, MultiElementAndWrongTypeAttributesAreErrors) {
  TempDir td;
  std::mt19937_64 rng(kSeed);
  const StateDump s = sample_state(rng, true);
  for (const auto& [tag, wopt] : layouts()) {
    SCOPED_TRACE(tag);
    int n = 0;
    // Each edit on a fresh copy, then the error it must give.
    auto check = [&, wopt = wopt, tag = tag](const std::function<void(hid_t)>& edit, const std::string& needle) {
      const std::string p = td.file(fmt::format("{}_{}.h5", tag, n++));
      write_state(p, s, wopt);
      edit_h5(p, edit);
      expect_read_error(p, needle);
      expect_read_error(p, needle, {.isolate = false});  // structurally valid HDF5: safe in-process too
    };
    // The measured stack overflows: 4096 seeds, 4096 schema versions, an array of three strings.
    check(
        [](hid_t f) {
          std::vector<uint64_t> v(4096, 7);
          put_root_attr(f, "seed", H5T_STD_U64LE, vec_space(v.size()), v.data());
        },
        "attribute 'seed' must hold one value, it holds 4096");
    check(
        [](hid_t f) {
          std::vector<int32_t> v(4096, 1);
          put_root_attr(f, "schema_version", H5T_STD_I32LE, vec_space(v.size()), v.data());
        },
        "attribute 'schema_version' must hold one value, it holds 4096");
    check(
        [](hid_t f) {
          const char* v[3] = {"a", "b", "c"};
          put_root_attr(f, "repro", vlen_str(), vec_space(3), v);
        },
        "attribute 'repro' must hold one value, it holds 3");
    check(
        [](hid_t f) {
          const char* v[2] = {"{}", "{}"};
          put_root_attr(f, "config", vlen_str(), vec_space(2), v);
        },
        "attribute 'config' must hold one value, it holds 2");
    // Wrong type classes, empty dataspaces, out-of-range values, bad JSON.
    check([](hid_t f) { const int32_t v = 5; put_root_attr(f, "config", H5T_STD_I32LE, H5Screate(H5S_SCALAR), &v); },
          "attribute 'config' must be a string, it is an integer");
    check(
        [](hid_t f) {
          const char* v = "1234";
          put_root_attr(f, "seed", vlen_str(), H5Screate(H5S_SCALAR), &v);
        },
        "attribute 'seed' must be an integer, it is a string");
    check([](hid_t f) { const double v = 1; put_root_attr(f, "schema_version", H5T_IEEE_F64LE, H5Screate(H5S_SCALAR), &v); },
          "attribute 'schema_version' must be an integer, it is a float");
    check([](hid_t f) { put_root_attr(f, "repro", vlen_str(), H5Screate(H5S_NULL), nullptr); },
          "attribute 'repro' is empty (null dataspace)");
    check([](hid_t f) { const int64_t v = -1; put_root_attr(f, "seed", H5T_STD_I64LE, H5Screate(H5S_SCALAR), &v); },
          "attribute 'seed' is negative (-1)");
    check([](hid_t f) { const int32_t v = 2; put_root_attr(f, "schema_version", H5T_STD_I32LE, H5Screate(H5S_SCALAR), &v); },
          "schema_version 2 is not supported");
    check([](hid_t f) { const uint64_t v = 1ull << 63; put_root_attr(f, "schema_version", H5T_STD_U64LE, H5Screate(H5S_SCALAR), &v); },
          "schema_version 9223372036854775808 is not supported");
    check(
        [](hid_t f) {
          const char* v = "{\"policy\": \"fp64\", \"policy\": \"bf16\"}";
          put_root_attr(f, "config", vlen_str(), H5Screate(H5S_SCALAR), &v);
        },
        "attribute 'config': duplicate JSON key 'policy'");
    check(
        [](hid_t f) {
          const char* v = "[1, 2]";
          put_root_attr(f, "optimizer", vlen_str(), H5Screate(H5S_SCALAR), &v);
        },
        "the optimizer must be a JSON object, got array");
    check([](hid_t f) { const int32_t v = 1; put_root_attr(f, "generator", H5T_STD_I32LE, H5Screate(H5S_SCALAR), &v); },
          "attribute 'generator' must be a string, it is an integer");
    check(
        [](hid_t f) {
          const hid_t root = H5Gopen2(f, "/", H5P_DEFAULT);
          H5Adelete(root, "seed");
          H5Gclose(root);
        },
        "missing attribute 'seed'");
    // Compatible variants load: a fixed-length string config, an int8 seed, a one-element array of a version.
    const std::string p = td.file(fmt::format("{}_ok.h5", tag));
    write_state(p, s, wopt);
    edit_h5(p, [&](hid_t f) {
      const std::string cfg = s.config.dump();
      const hid_t t = H5Tcopy(H5T_C_S1);
      H5Tset_size(t, cfg.size());
      put_root_attr(f, "config", t, H5Screate(H5S_SCALAR), cfg.data());
      const int8_t seed = 9;
      put_root_attr(f, "seed", H5T_STD_I8LE, H5Screate(H5S_SCALAR), &seed);
      const int64_t ver = 1;
      put_root_attr(f, "schema_version", H5T_STD_I64BE, vec_space(1), &ver, H5T_NATIVE_INT64);
    });
    const StateDump r = read_state(p);
    EXPECT_EQ(r.config, s.config);
    EXPECT_EQ(r.seed, 9u);
  }
}

TEST(GoldenReader, DatasetsAreCheckedAgainstTheSchema) {
  TempDir td;
  std::mt19937_64 rng(kSeed);
  const StateDump s = sample_state(rng, false);
  auto replace = [](hid_t f, const char* path, hid_t type, std::vector<hsize_t> dims, bool write,
                    const char* dtype) {
    H5Ldelete(f, path, H5P_DEFAULT);
    const hid_t sp = dims.empty() ? H5Screate(H5S_SCALAR)
                                  : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    const hid_t ds = H5Dcreate2(f, path, type, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(ds, 0) << path;
    const hssize_t n = H5Sget_simple_extent_npoints(sp);
    if (write && n > 0) {
      std::vector<char> buf(static_cast<size_t>(n) * H5Tget_size(type), 1);
      H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data());
    }
    if (dtype) {
      const char* v = dtype;
      put_attr(ds, "dtype", vlen_str(), H5Screate(H5S_SCALAR), &v);
    }
    H5Dclose(ds);
    H5Sclose(sp);
  };
  for (const auto& [tag, wopt] : layouts()) {
    SCOPED_TRACE(tag);
    int n = 0;
    auto check = [&, wopt = wopt, tag = tag](const std::function<void(hid_t)>& edit, const std::string& needle) {
      const std::string p = td.file(fmt::format("{}_d{}.h5", tag, n++));
      write_state(p, s, wopt);
      edit_h5(p, edit);
      expect_read_error(p, needle);
      expect_read_error(p, needle, {.isolate = false});
    };
    check([&](hid_t f) { replace(f, "weights/specials.f32", H5T_IEEE_F32LE, {12}, true, "f64"); },
          "/weights/specials.f32: dtype attribute 'f64' but the data is stored as f32");
    check([&](hid_t f) { replace(f, "weights/counts", H5T_STD_I64LE, {2, 2}, true, "i32"); },
          "dtype attribute 'i32' but the data is stored as an unsupported HDF5 type");
    check([&](hid_t f) { replace(f, "inputs/tokens", H5T_STD_I32LE, {2, 5, 1}, true, "i32"); },
          "/inputs/tokens must be [sequences, seq_len], got shape [2, 5, 1]");
    check([&](hid_t f) { replace(f, "inputs/targets", H5T_IEEE_F32LE, {2, 5}, true, "f32"); },
          "must be i32");
    check([&](hid_t f) { replace(f, "grads/layers.0.attn.wq", H5T_IEEE_F64LE, {3, 4}, false, "f64"); },
          "/grads/layers.0.attn.wq: 0 bytes stored, its shape [3, 4] and dtype f64 need 96");
    check([&](hid_t f) { replace(f, "grads/layers.0.attn.wq", H5T_IEEE_F64LE, {hsize_t{1} << 40, 4}, false, "f64"); },
          "is more than 68719476736 bytes");
    check([&](hid_t f) { replace(f, "grads/counts", H5T_STD_I32LE, std::vector<hsize_t>(9, 1), true, "i32"); },
          "rank 9, more than 8");
    check([&](hid_t f) { replace(f, "loss", H5T_IEEE_F32LE, {2}, true, "f32"); }, "/loss must be one f64 or f32 value");
    check([&](hid_t f) { replace(f, "weights/embed", H5T_STD_U16LE, {4, 3}, true, nullptr); },
          "/weights/embed: no dtype attribute and an unsupported HDF5 type");
    check(
        [&](hid_t f) {
          H5Ldelete(f, "grads/scalar", H5P_DEFAULT);
          H5Lcreate_soft("/loss", f, "grads/scalar", H5P_DEFAULT, H5P_DEFAULT);
        },
        "/grads/scalar is a soft or external link, not a dataset");
    check(
        [&](hid_t f) {
          H5Ldelete(f, "weights_after/empty", H5P_DEFAULT);
          H5Lcreate_external("/etc/passwd", "/x", f, "weights_after/empty", H5P_DEFAULT, H5P_DEFAULT);
        },
        "/weights_after/empty is a soft or external link");
    check(
        [&](hid_t f) {
          H5Ldelete(f, "weights/embed", H5P_DEFAULT);
          H5Gclose(H5Gcreate2(f, "weights/embed", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
        },
        "/weights/embed is not a dataset");
    check([&](hid_t f) { H5Ldelete(f, "grads/embed", H5P_DEFAULT); }, "/weights has 9 tensors, /grads has 8");
    check([&](hid_t f) { H5Ldelete(f, "weights_after", H5P_DEFAULT); }, "missing group '/weights_after'");
    check([&](hid_t f) { replace(f, "weights_after", H5T_IEEE_F32LE, {1}, true, "f32"); },
          "/weights_after is not a group");
    check([&](hid_t f) { H5Lmove(f, "grads/counts", f, "grads/zz_counts", H5P_DEFAULT, H5P_DEFAULT); },
          "in /weights but");
    check(
        [&](hid_t f) {  // a chunked dataset whose chunks were never written
          H5Ldelete(f, "grads/specials.f32", H5P_DEFAULT);
          const hsize_t dim = 12, chunk = 4;
          const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
          H5Pset_chunk(dcpl, 1, &chunk);
          const hid_t sp = H5Screate_simple(1, &dim, nullptr);
          const hid_t ds = H5Dcreate2(f, "grads/specials.f32", H5T_IEEE_F32LE, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
          const char* v = "f32";
          put_attr(ds, "dtype", vlen_str(), H5Screate(H5S_SCALAR), &v);
          H5Dclose(ds);
          H5Sclose(sp);
          H5Pclose(dcpl);
        },
        "/grads/specials.f32: not all of its data was written");
    check([&](hid_t f) { replace(f, "weights_after/empty", H5T_IEEE_F32LE, {3, 0}, true, "f32"); },
          "/weights_after/empty is f32 [3, 0], /weights/empty is f32 [0, 3]");
  }
}

TEST(GoldenReader, HardLinksCannotMultiplyWhatIsRead) {
  // Ten more names for one 1 MiB dataset: the data read would be 11 times the file's; refused while listing.
  TempDir td;
  std::mt19937_64 rng(kSeed);
  StateDump s = sample_state(rng, false);
  std::vector<float> big(1 << 18, 0.5f);
  for (auto* g : {&s.weights, &s.grads, &s.weights_after})
    g->push_back(make_tensor("big", {1 << 18}, std::span<const float>(big)));
  const std::string p = td.file("links.h5");
  write_state(p, s);
  edit_h5(p, [](hid_t f) {
    for (int i = 0; i < 10; ++i)
      H5Lcreate_hard(f, "weights/big", f, fmt::format("weights/big{}", i).c_str(), H5P_DEFAULT, H5P_DEFAULT);
  });
  expect_read_error(p, "more than the file's");
}

TEST(GoldenReader, ModelConfigDumpsMatchTheParameterLayout) {
  TempDir td;
  for (bool fp64 : {false, true}) {
    const StateDump s = model_state(fp64);
    const std::string p = td.file(fp64 ? "m64.h5" : "m32.h5");
    write_state(p, s);
    EXPECT_TRUE(compare_states(read_state(p), s).equal);
  }
  auto expect_write_error = [&](const StateDump& s, const std::string& needle) {
    try {
      write_state(td.file("bad.h5"), s);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(td.file("bad.h5")));
  };
  // The writer refuses what the reader would refuse ...
  StateDump s = model_state(false);
  s.weights[1].shape = {4, 2};
  s.grads[1].shape = s.weights_after[1].shape = {4, 2};
  expect_write_error(s, "the config (policy fp32) says 'layers.0.attn_norm' f32 [8]");
  s = model_state(false);
  s.config["policy"] = "fp64";
  expect_write_error(s, "the config (policy fp64) says 'embed' f64");
  s = model_state(false);
  s.config["attention"]["v_dim"] = (int64_t{1} << 61) + 1;
  expect_write_error(s, "attention.v_dim = 2305843009213693953 exceeds its bound 4096");
  s = model_state(false);
  const int32_t big = 20;
  std::memcpy(s.tokens.bytes.data() + 4, &big, 4);
  expect_write_error(s, "/inputs/tokens element 1 is 20, outside [0, vocab = 20)");
  s = model_state(false);
  s.config = nullptr;
  expect_write_error(s, "the config must be a JSON object");
  // ... and the reader refuses a file edited into it.
  const std::string p = td.file("edited.h5");
  write_state(p, model_state(false));
  edit_h5(p, [](hid_t f) {
    const char* cfg = "{\"attention\": {\"kind\": \"mla\"}}";
    put_root_attr(f, "config", vlen_str(), H5Screate(H5S_SCALAR), &cfg);
  });
  expect_read_error(p, "the config attribute is not a valid model config");
}

TEST(GoldenReader, CheckedInGoldensStillLoad) {
  // golden/data predates the checksum: read without one, fully validated (model config, layout, token ranges),
  // bit for bit the same in-process and isolated.
  for (const char* pol : {"fp32", "bf16", "fp64"}) {
    const std::string p = fmt::format("{}/micro_{}_step1.h5", TRIDENT_GOLDEN_DATA, pol);
    SCOPED_TRACE(p);
    EXPECT_EQ(verify_checksum(p), Checksum::absent);
    const StateDump a = read_state(p), b = read_state(p, {.isolate = false});
    EXPECT_TRUE(compare_states(a, b).equal);
    EXPECT_EQ(a.repro, b.repro);
    EXPECT_EQ(std::bit_cast<uint64_t>(a.loss), std::bit_cast<uint64_t>(b.loss));
    EXPECT_EQ(a.weights.size(), model::param_layout(model::Config::from_json(a.config)).size());
    EXPECT_EQ(a.loss_dtype, std::string(pol) == "fp64" ? "f64" : "f32");
  }
}

TEST(GoldenReader, CorruptGlobalHeapIsRefusedBeforeHdf5) {
  // Files without checksum: the measured hang (a zeroed object header in the global heap is an empty free-space
  // object, on which HDF5 1.10's heap loader loops forever) and crash (an object size past its collection, which
  // H5HG_read copies out of bounds) are refused by the reader's own walk of the heap, in-process too.
  TempDir td;
  std::mt19937_64 rng(kSeed);
  const std::string p = td.file("heap.h5");
  write_state(p, sample_state(rng, true), {.checksum = false});
  const std::string good = slurp(p);
  const size_t gcol = good.find("GCOL"), opt = good.find("{\"beta1\"");
  ASSERT_NE(gcol, std::string::npos);
  ASSERT_NE(opt, std::string::npos);
  ASSERT_GT(opt, gcol + 32);
  std::string b = good;
  std::memset(b.data() + opt - 16, 0, 16);  // the optimizer string's object header: index 0, size 0
  spit(p, b);
  expect_read_error(p, "an empty free-space object (HDF5 would loop forever)", {.isolate = false});
  expect_read_error(p, "corrupt HDF5 global heap at byte");
  b = good;
  const uint64_t huge = uint64_t{1} << 58;
  std::memcpy(b.data() + opt - 8, &huge, 8);  // the object's size field precedes its data
  spit(p, b);
  expect_read_error(p, "does not fit in its collection", {.isolate = false});
}

TEST(GoldenReader, IsolationTurnsHdf5CrashesIntoErrors) {
  // One flipped bit in an address of golden/data/micro_fp32_step1.h5 (no checksum: it predates it) makes
  // HDF5 1.10.8 read a v2 B-tree header from a wild address and crash. read_state parses in a child process:
  // one error line, and this process lives on.
  TempDir td;
  const std::string p = td.file("flipped.h5");
  std::string b = slurp(fmt::format("{}/micro_fp32_step1.h5", TRIDENT_GOLDEN_DATA));
  ASSERT_EQ(static_cast<unsigned char>(b.at(1286)), 0xffu);
  b[1286] ^= 0x02;
  spit(p, b);
  try {
    read_state(p);
    ADD_FAILURE() << "a corrupt file was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(p), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    std::printf("isolated read: %s\n", msg.c_str());
  }
  // The same file in-process, in a child of this test: HDF5 1.10.8 dies of a signal (another HDF5 version may
  // detect the damage and return an error; either way it must not load).
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    try {
      read_state(p, {.isolate = false});
    } catch (const Error&) {
      _exit(1);
    }
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "loaded in-process";
  std::printf("in-process read of the same file: %s\n",
              WIFSIGNALED(status) ? fmt::format("killed by signal {}", WTERMSIG(status)).c_str() : "an error");
}
