// HDF5 state dump writer, reader and comparer (schema: golden/state_dump.h, docs/golden.md).
#include "golden/state_dump.h"
#include "golden/read_guard.h"

#include <H5Cpp.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string_view>
#include <system_error>

#include "platform/process.h"
#include "reference/atomic_write.h"
#include "reference/check.h"
#include "reference/model/config.h"
#include "reference/model/params.h"
#include "reference/toml_json.h"

namespace trident::golden {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------------------------
// NamedTensor helpers

size_t dtype_size(const std::string& dtype) {
  if (dtype == "f64") return 8;
  if (dtype == "f32" || dtype == "i32") return 4;
  if (dtype == "bf16") return 2;
  fail(fmt::format("unknown tensor dtype '{}' (expected f64, f32, bf16 or i32)", dtype));
}

int64_t NamedTensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape)
    if (s < 0 || __builtin_mul_overflow(n, s, &n))
      fail(fmt::format("tensor '{}': shape {} has a negative dimension or overflows int64", name, shape));
  return n;
}

namespace {

template <class T>
NamedTensor make_raw(std::string name, std::vector<int64_t> shape, std::string dtype, std::span<const T> data) {
  NamedTensor t{std::move(name), std::move(shape), std::move(dtype), {}};
  for (int64_t s : t.shape) TD_CHECK_GE(s, 0, "tensor '{}': negative dimension", t.name);
  TD_CHECK_EQ(static_cast<int64_t>(data.size()), t.numel(), "tensor '{}': data size vs shape", t.name);
  t.bytes.resize(data.size_bytes());
  if (!data.empty()) std::memcpy(t.bytes.data(), data.data(), data.size_bytes());
  return t;
}

void check_tensor(const NamedTensor& t, const std::string& where) {
  const size_t es = dtype_size(t.dtype);
  for (int64_t s : t.shape) TD_CHECK_GE(s, 0, "{}: negative dimension", where);
  TD_CHECK_EQ(t.bytes.size(), static_cast<size_t>(t.numel()) * es, "{}: byte size vs shape {} and dtype {}", where,
              t.shape, t.dtype);
}

template <class T>
T load(const NamedTensor& t, int64_t i) {
  T v;
  std::memcpy(&v, t.bytes.data() + static_cast<size_t>(i) * sizeof(T), sizeof(T));
  return v;
}

}  // namespace

NamedTensor make_tensor(std::string name, std::vector<int64_t> shape, std::span<const double> data) {
  return make_raw(std::move(name), std::move(shape), "f64", data);
}
NamedTensor make_tensor(std::string name, std::vector<int64_t> shape, std::span<const float> data) {
  return make_raw(std::move(name), std::move(shape), "f32", data);
}
NamedTensor make_tensor(std::string name, std::vector<int64_t> shape, std::span<const int32_t> data) {
  return make_raw(std::move(name), std::move(shape), "i32", data);
}
NamedTensor make_tensor(std::string name, std::vector<int64_t> shape, std::span<const bf16> data) {
  return make_raw(std::move(name), std::move(shape), "bf16", data);
}
NamedTensor make_tensor_bf16(std::string name, std::vector<int64_t> shape, std::span<const float> data) {
  std::vector<bf16> h(data.size());
  for (size_t i = 0; i < data.size(); ++i) h[i] = to_bf16(data[i]);
  return make_tensor(std::move(name), std::move(shape), std::span<const bf16>(h));
}

double element_as_double(const NamedTensor& t, int64_t i) {
  if (t.dtype == "f64") return load<double>(t, i);
  if (t.dtype == "f32") return load<float>(t, i);
  if (t.dtype == "i32") return load<int32_t>(t, i);
  if (t.dtype == "bf16") return to_float(bf16{load<uint16_t>(t, i)});
  fail(fmt::format("tensor '{}': unknown dtype '{}'", t.name, t.dtype));
}

std::vector<double> values_as_double(const NamedTensor& t) {
  check_tensor(t, "tensor '" + t.name + "'");
  const int64_t n = t.numel();
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = element_as_double(t, i);
  return out;
}

namespace {
template <class T>
std::vector<T> typed_values(const NamedTensor& t, const char* dtype) {
  TD_CHECK(t.dtype == dtype, "tensor '{}' has dtype {}, not {}", t.name, t.dtype, dtype);
  check_tensor(t, "tensor '" + t.name + "'");
  std::vector<T> out(static_cast<size_t>(t.numel()));
  if (!out.empty()) std::memcpy(out.data(), t.bytes.data(), t.bytes.size());
  return out;
}
}  // namespace

std::vector<double> values_f64(const NamedTensor& t) { return typed_values<double>(t, "f64"); }
std::vector<float> values_f32(const NamedTensor& t) { return typed_values<float>(t, "f32"); }
std::vector<int32_t> values_i32(const NamedTensor& t) { return typed_values<int32_t>(t, "i32"); }

// ---------------------------------------------------------------------------------------------------------------
// Checksum header (docs/golden.md "Checksum")

namespace {

constexpr std::string_view kChecksumMagic = "TRIDENT-STATE-CHECKSUM 1\n";
constexpr unsigned char kHdf5Signature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};

// The header for a payload of `bytes` bytes with CRC `crc`: ASCII lines, NUL-padded to kChecksumBlock bytes.
std::string checksum_header(uint64_t bytes, uint32_t crc) {
  std::string h = fmt::format("{}algorithm crc32\npayload_offset {}\npayload_bytes {}\ncrc32 {:08x}\n", kChecksumMagic,
                              kChecksumBlock, bytes, crc);
  h.resize(kChecksumBlock, '\0');
  return h;
}

// The slice-by-8 tables of the reflected CRC-32 polynomial 0xEDB88320.
struct Crc32Tables {
  uint32_t t[8][256];
  Crc32Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
};

// CRC-32 and size of the bytes of `path` from `offset` to the end.
std::pair<uint32_t, uint64_t> crc_of_file(const std::string& path, uint64_t offset) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(fmt::format("cannot open '{}' for the checksum", path));
  in.seekg(static_cast<std::streamoff>(offset));
  std::vector<std::byte> buf(size_t{1} << 20);
  uint32_t crc = 0;
  uint64_t n = 0;
  while (in) {
    in.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
    const auto got = static_cast<size_t>(in.gcount());
    if (got == 0) break;
    crc = crc32(std::span<const std::byte>(buf.data(), got), crc);
    n += got;
  }
  if (in.bad()) fail(fmt::format("cannot read '{}' for the checksum", path));
  return {crc, n};
}

std::string read_prefix(const std::string& path, size_t n) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(fmt::format("cannot read state dump '{}': cannot open the file", path));
  std::string s(n, '\0');
  in.read(s.data(), static_cast<std::streamsize>(n));
  s.resize(static_cast<size_t>(in.gcount()));
  return s;
}

bool has_hdf5_signature_at(const std::string& prefix, size_t at) {
  return prefix.size() >= at + 8 && std::memcmp(prefix.data() + at, kHdf5Signature, 8) == 0;
}

}  // namespace

uint32_t crc32(std::span<const std::byte> data, uint32_t crc) {
  static const Crc32Tables tables;
  const auto& t = tables.t;
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  size_t n = data.size();
  uint32_t c = ~crc;
  while (n >= 8) {
    const uint32_t lo = c ^ (uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24);
    c = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^ t[3][p[4]] ^
        t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
    p += 8;
    n -= 8;
  }
  while (n--) c = t[0][(c ^ *p++) & 0xff] ^ (c >> 8);
  return ~c;
}

Checksum verify_checksum(const std::string& path) { return verify_checksum_of(path, "state dump"); }

Checksum verify_checksum_of(const std::string& path, const char* kind) {
  auto bad = [&](const std::string& why) -> void {
    fail(fmt::format("cannot read {} '{}': {}", kind, path, why));
  };
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) bad("not a regular file");
  const uint64_t size = fs::file_size(path, ec);
  if (ec) bad(fmt::format("cannot stat the file: {}", ec.message()));
  const std::string head = read_prefix(path, kChecksumBlock);
  if (has_hdf5_signature_at(head, 0)) return Checksum::absent;
  if (head.compare(0, kChecksumMagic.size(), kChecksumMagic) != 0)
    bad(size < 8 ? fmt::format("not an HDF5 file ({} bytes)", size)
                 : fmt::format("not a {}: neither the HDF5 signature nor the Trident checksum header at its start "
                               "(a corrupt or foreign file)",
                               kind));
  if (head.size() < kChecksumBlock) bad(fmt::format("truncated: {} bytes, shorter than the checksum header", size));
  // Parse "payload_bytes N" and "crc32 X", then demand the whole block be exactly the header they render: any
  // changed byte of the block (padding included) is caught.
  auto field = [&](std::string_view key) -> std::string_view {
    const std::string k = fmt::format("\n{} ", key);
    const size_t at = head.find(k);
    if (at == std::string::npos || at > kChecksumBlock) return {};
    const size_t from = at + k.size(), to = head.find('\n', from);
    return to == std::string::npos ? std::string_view() : std::string_view(head).substr(from, to - from);
  };
  uint64_t bytes = 0;
  uint32_t crc = 0;
  const std::string_view fb = field("payload_bytes"), fc = field("crc32");
  const auto rb = std::from_chars(fb.data(), fb.data() + fb.size(), bytes);
  const auto rc = std::from_chars(fc.data(), fc.data() + fc.size(), crc, 16);
  if (fb.empty() || fc.empty() || rb.ec != std::errc() || rc.ec != std::errc() ||
      head != checksum_header(bytes, crc))
    bad("the checksum header is corrupt");
  if (size != kChecksumBlock + bytes)
    bad(fmt::format("{}: the file has {} bytes, its checksum header says {}",
                    size < kChecksumBlock + bytes ? "truncated" : "extended", size, kChecksumBlock + bytes));
  const auto [got, n] = crc_of_file(path, kChecksumBlock);
  if (n != bytes) bad(fmt::format("read {} payload bytes, the header says {}", n, bytes));
  if (got != crc)
    bad(fmt::format("checksum mismatch: the payload's CRC-32 is {:08x}, the header says {:08x} (the file is corrupt)",
                    got, crc));
  return Checksum::ok;
}

void seal_checksum(const std::string& path) {
  const std::string head = read_prefix(path, kChecksumBlock + 8);
  if (!has_hdf5_signature_at(head, kChecksumBlock))
    fail(fmt::format("seal_checksum '{}': the file has no {}-byte user block before its HDF5 data", path,
                     kChecksumBlock));
  const auto [crc, n] = crc_of_file(path, kChecksumBlock);
  const std::string h = checksum_header(n, crc);
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  if (!f) fail(fmt::format("seal_checksum '{}': cannot open the file for writing", path));
  f.seekp(0);
  f.write(h.data(), static_cast<std::streamsize>(h.size()));
  f.flush();
  if (!f) fail(fmt::format("seal_checksum '{}': cannot write the header", path));
}

// ---------------------------------------------------------------------------------------------------------------
// Schema rules shared by the writer and the reader

namespace {

constexpr int kMaxRank = 8;                          // the schema's tensors have rank <= 3
constexpr int64_t kMaxTensorBytes = int64_t{1} << 36;  // 64 GiB
constexpr int64_t kMaxTensors = int64_t{1} << 20;    // per group
constexpr size_t kMaxStringBytes = size_t{1} << 26;  // 64 MiB per string attribute
constexpr size_t kMaxNameBytes = size_t{1} << 12;

int64_t checked_numel(const std::vector<int64_t>& shape, const std::string& where) {
  int64_t n = 1;
  for (int64_t s : shape) {
    if (s < 0) fail(fmt::format("{}: negative dimension in shape {}", where, shape));
    if (__builtin_mul_overflow(n, s, &n)) fail(fmt::format("{}: shape {} overflows int64", where, shape));
  }
  return n;
}

bool is_model_config(const nlohmann::json& c) { return c.is_object() && c.contains("attention"); }

void check_group_twins(const std::vector<NamedTensor>& a, const std::vector<NamedTensor>& b, const char* bname,
                       const std::string& where) {
  if (a.size() != b.size())
    fail(fmt::format("{}: /weights has {} tensors, /{} has {}", where, a.size(), bname, b.size()));
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name)
      fail(fmt::format("{}: tensor {} is '{}' in /weights but '{}' in /{}", where, i, a[i].name, b[i].name, bname));
    if (a[i].shape != b[i].shape || a[i].dtype != b[i].dtype)
      fail(fmt::format("{}: /{}/{} is {} {}, /weights/{} is {} {}", where, bname, b[i].name, b[i].dtype, b[i].shape,
                       a[i].name, a[i].dtype, a[i].shape));
  }
}

}  // namespace

void validate_state(const StateDump& s, const std::string& where) {
  auto tensor_ok = [&](const NamedTensor& t, const std::string& what) {
    if (t.shape.size() > static_cast<size_t>(kMaxRank))
      fail(fmt::format("{}: {} has rank {}, more than {}", where, what, t.shape.size(), kMaxRank));
    const int64_t n = checked_numel(t.shape, where + ": " + what);
    const size_t es = dtype_size(t.dtype);
    if (t.bytes.size() != static_cast<size_t>(n) * es)
      fail(fmt::format("{}: {} holds {} bytes, its shape {} and dtype {} need {}", where, what, t.bytes.size(),
                       t.shape, t.dtype, static_cast<size_t>(n) * es));
  };
  tensor_ok(s.tokens, "/inputs/tokens");
  tensor_ok(s.targets, "/inputs/targets");
  if (s.tokens.dtype != "i32" || s.targets.dtype != "i32")
    fail(fmt::format("{}: /inputs/tokens and /inputs/targets must be i32 (got {} and {})", where, s.tokens.dtype,
                     s.targets.dtype));
  if (s.tokens.shape.size() != 2)
    fail(fmt::format("{}: /inputs/tokens must be [sequences, seq_len], got shape {}", where, s.tokens.shape));
  if (s.tokens.shape != s.targets.shape)
    fail(fmt::format("{}: /inputs/tokens shape {} != /inputs/targets shape {}", where, s.tokens.shape,
                     s.targets.shape));
  if (!s.config.is_object()) fail(fmt::format("{}: the config must be a JSON object, got {}", where, s.config.type_name()));
  if (!s.optimizer.is_object())
    fail(fmt::format("{}: the optimizer must be a JSON object, got {}", where, s.optimizer.type_name()));
  for (const auto* g : {&s.weights, &s.grads, &s.weights_after}) {
    if (static_cast<int64_t>(g->size()) > kMaxTensors)
      fail(fmt::format("{}: {} tensors in one group, more than {}", where, g->size(), kMaxTensors));
    for (const NamedTensor& t : *g) tensor_ok(t, "tensor '" + t.name + "'");
  }
  check_group_twins(s.weights, s.grads, "grads", where);
  check_group_twins(s.weights, s.weights_after, "weights_after", where);
  const bool moments = !s.adam_m.empty() || !s.adam_v.empty() || !s.adam_m_after.empty() || !s.adam_v_after.empty();
  if (moments) {
    for (auto [g, name] : {std::pair{&s.adam_m, "adam_m"}, std::pair{&s.adam_v, "adam_v"},
                           std::pair{&s.adam_m_after, "adam_m_after"}, std::pair{&s.adam_v_after, "adam_v_after"}}) {
      for (const NamedTensor& t : *g) tensor_ok(t, fmt::format("/{}/{}", name, t.name));
      check_group_twins(s.weights, *g, name, where);
    }
  }
  if (s.step < 0) fail(fmt::format("{}: the step attribute is negative ({})", where, s.step));
  if (moments && s.step < 1) fail(fmt::format("{}: AdamW moments need the step attribute (>= 1)", where));
  if (!is_model_config(s.config)) return;

  // A model config: it must be valid, and the tensors must be its parameter layout.
  model::Config cfg;
  try {
    cfg = model::Config::from_json(s.config);
  } catch (const Error& e) {
    fail(fmt::format("{}: the config attribute is not a valid model config: {}", where, e.what()));
  }
  const std::string want_dtype = cfg.policy == Policy::fp64 ? "f64" : "f32";
  const auto layout = model::param_layout(cfg);
  if (layout.size() != s.weights.size())
    fail(fmt::format("{}: /weights has {} tensors, the config's parameter layout has {}", where, s.weights.size(),
                     layout.size()));
  for (size_t i = 0; i < layout.size(); ++i) {
    const NamedTensor& t = s.weights[i];
    if (t.name != layout[i].name || t.shape != layout[i].shape || t.dtype != want_dtype)
      fail(fmt::format("{}: tensor {} is '{}' {} {}, the config (policy {}) says '{}' {} {}", where, i, t.name,
                       t.dtype, t.shape, to_string(cfg.policy), layout[i].name, want_dtype, layout[i].shape));
  }
  if (!s.loss_dtype.empty() && s.loss_dtype != want_dtype)
    fail(fmt::format("{}: /loss is {}, the policy {} says {}", where, s.loss_dtype, to_string(cfg.policy), want_dtype));
  const auto tok = values_i32(s.tokens), tgt = values_i32(s.targets);
  for (size_t i = 0; i < tok.size(); ++i) {
    if (tok[i] < 0 || tok[i] >= cfg.vocab)
      fail(fmt::format("{}: /inputs/tokens element {} is {}, outside [0, vocab = {})", where, i, tok[i], cfg.vocab));
    if (tgt[i] != -100 && (tgt[i] < 0 || tgt[i] >= cfg.vocab))
      fail(fmt::format("{}: /inputs/targets element {} is {}, neither -100 nor in [0, vocab = {})", where, i, tgt[i],
                       cfg.vocab));
  }
}

// ---------------------------------------------------------------------------------------------------------------
// HDF5 plumbing (writer)

namespace {

const H5::DataType& file_type(const std::string& dtype) {
  if (dtype == "f64") return H5::PredType::IEEE_F64LE;
  if (dtype == "f32") return H5::PredType::IEEE_F32LE;
  if (dtype == "i32") return H5::PredType::STD_I32LE;
  if (dtype == "bf16") return H5::PredType::STD_U16LE;
  fail(fmt::format("unknown tensor dtype '{}'", dtype));
}
const H5::DataType& mem_type(const std::string& dtype) {
  if (dtype == "f64") return H5::PredType::NATIVE_DOUBLE;
  if (dtype == "f32") return H5::PredType::NATIVE_FLOAT;
  if (dtype == "i32") return H5::PredType::NATIVE_INT32;
  if (dtype == "bf16") return H5::PredType::NATIVE_UINT16;
  fail(fmt::format("unknown tensor dtype '{}'", dtype));
}

H5::StrType utf8_type() {
  H5::StrType t(H5::PredType::C_S1, H5T_VARIABLE);
  t.setCset(H5T_CSET_UTF8);
  return t;
}

void write_str_attr(H5::H5Object& obj, const char* name, const std::string& value) {
  H5::StrType t = utf8_type();
  H5::Attribute a = obj.createAttribute(name, t, H5::DataSpace(H5S_SCALAR));
  a.write(t, value);
}
template <class T>
void write_scalar_attr(H5::H5Object& obj, const char* name, const H5::DataType& ftype, const H5::DataType& mtype,
                       T value) {
  H5::Attribute a = obj.createAttribute(name, ftype, H5::DataSpace(H5S_SCALAR));
  a.write(mtype, &value);
}

// A group whose links are tracked (and indexed) in creation order, so readers list tensors in write order.
H5::Group create_ordered_group(H5::H5File& f, const char* name) {
  hid_t gcpl = H5Pcreate(H5P_GROUP_CREATE);
  TD_CHECK(gcpl >= 0, "H5Pcreate failed");
  herr_t st = H5Pset_link_creation_order(gcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
  hid_t gid = st >= 0 ? H5Gcreate2(f.getId(), name, H5P_DEFAULT, gcpl, H5P_DEFAULT) : -1;
  H5Pclose(gcpl);
  if (gid < 0) fail(fmt::format("cannot create group '{}'", name));
  H5::Group g(gid);
  // The wrapper adds a reference (HDF5 1.10 C++ API); drop ours so its destructor closes the group and the
  // file is really closed (and unlocked) when the H5File goes out of scope.
  if (H5Iget_ref(gid) > 1) H5Idec_ref(gid);
  return g;
}

void check_name(const std::string& name, const std::string& group) {
  TD_CHECK(!name.empty(), "{}: empty tensor name", group);
  TD_CHECK(name.size() <= kMaxNameBytes, "{}: tensor name of {} bytes, more than {}", group, name.size(),
           kMaxNameBytes);
  TD_CHECK(name.find('/') == std::string::npos && name != "." && name != "..",
           "{}: tensor name '{}' must not contain '/' or be '.'/'..'", group, name);
}

void write_dataset(H5::Group& g, const std::string& name, const NamedTensor& t) {
  check_tensor(t, fmt::format("{}/{}", g.getObjName(), name));
  std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
  H5::DataSpace space = dims.empty() ? H5::DataSpace(H5S_SCALAR)
                                     : H5::DataSpace(static_cast<int>(dims.size()), dims.data());
  H5::DataSet ds = g.createDataSet(name, file_type(t.dtype), space);
  if (t.numel() > 0) ds.write(t.bytes.data(), mem_type(t.dtype));
  write_str_attr(ds, "dtype", t.dtype);
}

void write_group(H5::H5File& f, const char* group, const std::vector<NamedTensor>& ts) {
  H5::Group g = create_ordered_group(f, group);
  for (const NamedTensor& t : ts) {
    check_name(t.name, group);
    TD_CHECK(!g.nameExists(t.name), "{}: duplicate tensor name '{}'", group, t.name);
    write_dataset(g, t.name, t);
  }
}

std::string resolve_loss_dtype(const StateDump& s) {
  if (!s.loss_dtype.empty()) {
    TD_CHECK(s.loss_dtype == "f64" || s.loss_dtype == "f32", "loss_dtype must be f64 or f32, got '{}'",
             s.loss_dtype);
    return s.loss_dtype;
  }
  if (s.config.is_object() && s.config.contains("policy") && s.config["policy"].is_string())
    return s.config["policy"].get<std::string>() == "fp64" ? "f64" : "f32";
  if (!s.weights.empty() && s.weights.front().dtype == "f64") return "f64";
  return "f32";
}

// Why a file cannot be created at `path` (for the error message), or "" when nothing obvious is wrong.
}  // namespace

void check_writable(const std::string& path) {
  TD_CHECK(!path.empty(), "state dump: empty path");
  if (std::string why = io::unwritable_reason(path); !why.empty())
    fail(fmt::format("cannot write state dump '{}': {}", path, why));
}

void write_state(const std::string& path, const StateDump& s, const WriteOptions& opt) {
  H5::Exception::dontPrint();
  TD_CHECK(!path.empty(), "write_state: empty path");
  if (std::string why = io::unwritable_reason(path); !why.empty())
    fail(fmt::format("cannot write state dump '{}': {}", path, why));
  StateDump checked_view;  // validate_state on the metadata and shapes as they will be stored
  {
    const std::string loss_dtype = resolve_loss_dtype(s);
    for (const auto* g : {&s.weights, &s.grads, &s.weights_after})
      for (const NamedTensor& t : *g) check_name(t.name, "write_state");
    StateDump v;
    v.config = s.config;
    v.optimizer = s.optimizer;
    v.tokens = s.tokens;
    v.targets = s.targets;
    v.loss_dtype = loss_dtype;
    v.weights = s.weights;  // copies: a dump is small next to the run that made it
    v.grads = s.grads;
    v.weights_after = s.weights_after;
    v.adam_m = s.adam_m;
    v.adam_v = s.adam_v;
    v.adam_m_after = s.adam_m_after;
    v.adam_v_after = s.adam_v_after;
    v.step = s.step;
    try {
      validate_state(v, "state");
    } catch (const Error& e) {
      fail(fmt::format("cannot write state dump '{}': {}", path, e.what()));
    }
  }
  const std::string loss_dtype = resolve_loss_dtype(s);

  // Staged in a private folder next to the target and renamed onto it (reference/atomic_write.h): no name a
  // planted link could sit at, and a reader never sees a partial file.
  io::StagedFile out(path, "state dump");
  const fs::path tmp(out.path());
  try {
    {
      H5::FileCreatPropList fcpl;
      if (opt.checksum) fcpl.setUserblock(kChecksumBlock);
      H5::H5File f(tmp.string(), H5F_ACC_EXCL, fcpl);
      H5::Group root = f.openGroup("/");
      write_scalar_attr<int32_t>(root, "schema_version", H5::PredType::STD_I32LE, H5::PredType::NATIVE_INT32,
                                 kSchemaVersion);
      write_str_attr(root, "generator", kGenerator);
      write_str_attr(root, "config", s.config.dump());
      write_scalar_attr<uint64_t>(root, "seed", H5::PredType::STD_U64LE, H5::PredType::NATIVE_UINT64, s.seed);
      write_str_attr(root, "repro", s.repro);
      write_str_attr(root, "optimizer", s.optimizer.dump());

      H5::Group in = create_ordered_group(f, "inputs");
      write_dataset(in, "tokens", s.tokens);
      write_dataset(in, "targets", s.targets);

      H5::DataSet loss = f.createDataSet("loss", file_type(loss_dtype), H5::DataSpace(H5S_SCALAR));
      if (loss_dtype == "f64") {
        loss.write(&s.loss, H5::PredType::NATIVE_DOUBLE);
      } else {
        const float l = static_cast<float>(s.loss);
        loss.write(&l, H5::PredType::NATIVE_FLOAT);
      }
      write_str_attr(loss, "dtype", loss_dtype);

      write_group(f, "weights", s.weights);
      write_group(f, "grads", s.grads);
      write_group(f, "weights_after", s.weights_after);
      if (!s.adam_m.empty()) {
        write_group(f, "adam_m", s.adam_m);
        write_group(f, "adam_v", s.adam_v);
        write_group(f, "adam_m_after", s.adam_m_after);
        write_group(f, "adam_v_after", s.adam_v_after);
      }
      if (s.step > 0)
        write_scalar_attr<int64_t>(root, "step", H5::PredType::STD_I64LE, H5::PredType::NATIVE_INT64, s.step);
      f.flush(H5F_SCOPE_GLOBAL);
    }
    if (opt.checksum) seal_checksum(tmp.string());
    out.commit();
  } catch (const H5::Exception& e) {
    fail(fmt::format("cannot write state dump '{}': HDF5: {} ({})", path, e.getDetailMsg(), e.getFuncName()));
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Reader: the C API, every object's type, size and element count checked before a byte of it is read.

namespace {

// An owned HDF5 identifier.
class Hid {
 public:
  Hid() = default;
  Hid(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  Hid(Hid&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  Hid& operator=(Hid&& o) noexcept {
    std::swap(id_, o.id_);
    std::swap(close_, o.close_);
    return *this;
  }
  ~Hid() {
    if (id_ >= 0 && close_) close_(id_);
  }
  hid_t get() const { return id_; }

 private:
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

// The HDF5 error stack as one line: the outermost and the innermost description ("unable to open file: file
// signature not found"). Clears the stack.
std::string h5_error_text() {
  struct Acc {
    std::string first, last;
  } acc;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned n, const H5E_error2_t* e, void* data) -> herr_t {
        auto* a = static_cast<Acc*>(data);
        const std::string d = e && e->desc ? e->desc : "";
        if (n == 0) a->first = d;
        a->last = d;
        return 0;
      },
      &acc);
  H5Eclear2(H5E_DEFAULT);
  if (acc.first.empty() && acc.last.empty()) return "HDF5 error";
  if (acc.first == acc.last || acc.last.empty()) return "HDF5: " + acc.first;
  return fmt::format("HDF5: {}: {}", acc.first, acc.last);
}

struct FileReader {
  std::string path;
  uint64_t file_size = 0;
  mutable uint64_t stored_total = 0;  // bytes of contiguous and compact data read so far

  [[noreturn]] void bad(const std::string& what) const {
    fail(fmt::format("cannot read state dump '{}': {}", path, what));
  }
  // An HDF5 call's result: negative -> one error line naming `what`.
  template <class R>
  R h5(R r, const std::string& what) const {
    if (r < 0) bad(fmt::format("{}: {}", what, h5_error_text()));
    return r;
  }

  Hid open_attr(hid_t obj, const char* name, const std::string& where) const {
    const htri_t ex = h5(H5Aexists(obj, name), fmt::format("{}: attribute '{}'", where, name));
    if (ex == 0) bad(fmt::format("{}: missing attribute '{}'", where, name));
    return Hid(h5(H5Aopen(obj, name, H5P_DEFAULT), fmt::format("{}: attribute '{}'", where, name)), H5Aclose);
  }

  // The attribute holds exactly one element (scalar or a one-element simple dataspace).
  void one_element(hid_t attr, const std::string& what) const {
    Hid sp(h5(H5Aget_space(attr), what), H5Sclose);
    const H5S_class_t c = H5Sget_simple_extent_type(sp.get());
    if (c == H5S_NULL) bad(fmt::format("{} is empty (null dataspace)", what));
    if (c != H5S_SCALAR && c != H5S_SIMPLE) bad(fmt::format("{} has an invalid dataspace", what));
    const hssize_t n = h5(H5Sget_simple_extent_npoints(sp.get()), what);
    if (n != 1) bad(fmt::format("{} must hold one value, it holds {}", what, n));
  }

  static const char* class_name(H5T_class_t c) {
    switch (c) {
      case H5T_INTEGER: return "an integer";
      case H5T_FLOAT: return "a float";
      case H5T_STRING: return "a string";
      case H5T_COMPOUND: return "a compound";
      case H5T_ARRAY: return "an array";
      case H5T_VLEN: return "a variable-length sequence";
      case H5T_ENUM: return "an enum";
      case H5T_BITFIELD: return "a bitfield";
      case H5T_OPAQUE: return "opaque";
      case H5T_REFERENCE: return "a reference";
      case H5T_TIME: return "a time";
      default: return "an invalid type";
    }
  }

  std::string read_string_attr(hid_t obj, const char* name, const std::string& where) const {
    const std::string what = fmt::format("{}: attribute '{}'", where, name);
    Hid a = open_attr(obj, name, where);
    Hid t(h5(H5Aget_type(a.get()), what), H5Tclose);
    const H5T_class_t cls = H5Tget_class(t.get());
    if (cls != H5T_STRING) bad(fmt::format("{} must be a string, it is {}", what, class_name(cls)));
    one_element(a.get(), what);
    const htri_t vl = h5(H5Tis_variable_str(t.get()), what);
    const H5T_cset_t cset = H5Tget_cset(t.get());
    if (cset != H5T_CSET_ASCII && cset != H5T_CSET_UTF8) bad(fmt::format("{} has an unknown character set", what));
    Hid mem(h5(H5Tcopy(H5T_C_S1), what), H5Tclose);
    h5(H5Tset_cset(mem.get(), cset), what);
    if (vl > 0) {
      h5(H5Tset_size(mem.get(), H5T_VARIABLE), what);
      char* p = nullptr;
      h5(H5Aread(a.get(), mem.get(), &p), what);  // one element (checked): one pointer
      std::string v;
      const size_t n = p ? strnlen(p, kMaxStringBytes + 1) : 0;
      if (n <= kMaxStringBytes && p) v.assign(p, n);
      Hid sp(H5Aget_space(a.get()), H5Sclose);
      if (p) H5Dvlen_reclaim(mem.get(), sp.get(), H5P_DEFAULT, &p);
      if (n > kMaxStringBytes) bad(fmt::format("{} is longer than {} bytes", what, kMaxStringBytes));
      return v;
    }
    const size_t n = H5Tget_size(t.get());
    if (n == 0 || n > kMaxStringBytes) bad(fmt::format("{} has an invalid string size {}", what, n));
    h5(H5Tset_size(mem.get(), n), what);
    h5(H5Tset_strpad(mem.get(), H5T_STR_NULLPAD), what);
    std::string buf(n, '\0');
    h5(H5Aread(a.get(), mem.get(), buf.data()), what);
    buf.resize(strnlen(buf.data(), n));
    return buf;
  }

  // One integer of any HDF5 integer type up to 64 bits, as (signed?, value bits).
  struct Int {
    bool is_signed = false;
    int64_t s = 0;
    uint64_t u = 0;
  };
  Int read_int_attr(hid_t obj, const char* name, const std::string& where) const {
    const std::string what = fmt::format("{}: attribute '{}'", where, name);
    Hid a = open_attr(obj, name, where);
    Hid t(h5(H5Aget_type(a.get()), what), H5Tclose);
    const H5T_class_t cls = H5Tget_class(t.get());
    if (cls != H5T_INTEGER) bad(fmt::format("{} must be an integer, it is {}", what, class_name(cls)));
    const size_t size = H5Tget_size(t.get());
    if (size == 0 || size > 8) bad(fmt::format("{} is a {}-byte integer (at most 8)", what, size));
    one_element(a.get(), what);
    Int r;
    r.is_signed = H5Tget_sign(t.get()) == H5T_SGN_2;
    if (r.is_signed) h5(H5Aread(a.get(), H5T_NATIVE_INT64, &r.s), what);
    else h5(H5Aread(a.get(), H5T_NATIVE_UINT64, &r.u), what);
    return r;
  }

  // The dtype a dataset's HDF5 type stores, checked against its `dtype` attribute (when it has one).
  std::string dataset_dtype(hid_t ds, const std::string& where) const {
    Hid t(h5(H5Dget_type(ds), where + ": type"), H5Tclose);
    auto is = [&](hid_t le, hid_t be) {
      return h5(H5Tequal(t.get(), le), where) > 0 || h5(H5Tequal(t.get(), be), where) > 0;
    };
    std::string stored;
    if (is(H5T_IEEE_F64LE, H5T_IEEE_F64BE)) stored = "f64";
    else if (is(H5T_IEEE_F32LE, H5T_IEEE_F32BE)) stored = "f32";
    else if (is(H5T_STD_I32LE, H5T_STD_I32BE)) stored = "i32";
    else if (is(H5T_STD_U16LE, H5T_STD_U16BE)) stored = "bf16";  // only with a dtype attribute saying so
    const htri_t has = h5(H5Aexists(ds, "dtype"), where + ": attribute 'dtype'");
    if (has > 0) {
      const std::string d = read_string_attr(ds, "dtype", where);
      if (d != "f64" && d != "f32" && d != "bf16" && d != "i32")
        bad(fmt::format("{}: dtype attribute '{}' (expected f64, f32, bf16 or i32)", where, d));
      if (d != stored)
        bad(fmt::format("{}: dtype attribute '{}' but the data is stored as {}", where, d,
                        stored.empty() ? "an unsupported HDF5 type" : stored == "bf16" ? "uint16" : stored));
      return d;
    }
    if (stored.empty() || stored == "bf16")  // files written by other tools: the type alone
      bad(fmt::format("{}: no dtype attribute and an unsupported HDF5 type", where));
    return stored;
  }

  NamedTensor read_tensor(hid_t loc, const std::string& name, const std::string& where) const {
    Hid ds(h5(H5Dopen2(loc, name.c_str(), H5P_DEFAULT), where), H5Dclose);
    NamedTensor t;
    t.name = name;
    t.dtype = dataset_dtype(ds.get(), where);
    Hid sp(h5(H5Dget_space(ds.get()), where + ": dataspace"), H5Sclose);
    const H5S_class_t c = H5Sget_simple_extent_type(sp.get());
    if (c == H5S_NULL) bad(fmt::format("{}: null dataspace (no data)", where));
    if (c != H5S_SCALAR && c != H5S_SIMPLE) bad(fmt::format("{}: invalid dataspace", where));
    const int rank = h5(H5Sget_simple_extent_ndims(sp.get()), where + ": dataspace");
    if (rank > kMaxRank) bad(fmt::format("{}: rank {}, more than {}", where, rank, kMaxRank));
    hsize_t dims[kMaxRank] = {};
    if (rank > 0) h5(H5Sget_simple_extent_dims(sp.get(), dims, nullptr), where + ": dataspace");
    for (int i = 0; i < rank; ++i) {
      if (dims[i] > static_cast<hsize_t>(std::numeric_limits<int64_t>::max()))
        bad(fmt::format("{}: dimension {} is {}", where, i, dims[i]));
      t.shape.push_back(static_cast<int64_t>(dims[i]));
    }
    const int64_t n = checked_numel(t.shape, path + ": " + where);
    int64_t nbytes = 0;
    if (__builtin_mul_overflow(n, static_cast<int64_t>(dtype_size(t.dtype)), &nbytes) || nbytes > kMaxTensorBytes)
      bad(fmt::format("{}: shape {} of {} is more than {} bytes", where, t.shape, t.dtype, kMaxTensorBytes));
    // Contiguous and compact data must be stored in full and fit in the file (HDF5 would return fill values
    // for data that was never written); chunked data (other writers, maybe compressed) is read as it is.
    Hid dcpl(h5(H5Dget_create_plist(ds.get()), where + ": creation properties"), H5Pclose);
    const H5D_layout_t layout = H5Pget_layout(dcpl.get());
    if (layout == H5D_CONTIGUOUS || layout == H5D_COMPACT) {
      const hsize_t stored = H5Dget_storage_size(ds.get());
      if (n > 0 && stored != static_cast<hsize_t>(nbytes))
        bad(fmt::format("{}: {} bytes stored, its shape {} and dtype {} need {}", where, stored, t.shape, t.dtype,
                        nbytes));
      // Sound files store each dataset once: all of them together fit in the file (no dataset headers, hard
      // links or copies pointing many datasets at the same bytes to multiply what is read into memory).
      stored_total += static_cast<uint64_t>(nbytes);
      if (stored_total > file_size)
        bad(fmt::format("{}: the datasets so far hold {} bytes of data, more than the file's {} bytes", where,
                        stored_total, file_size));
    } else if (layout == H5D_CHUNKED) {
      H5D_space_status_t st;
      h5(H5Dget_space_status(ds.get(), &st), where + ": storage");
      if (n > 0 && st != H5D_SPACE_STATUS_ALLOCATED)
        bad(fmt::format("{}: not all of its data was written (it would read as fill values)", where));
    } else {
      bad(fmt::format("{}: unsupported storage layout (virtual or invalid)", where));
    }
    t.bytes.resize(static_cast<size_t>(nbytes));
    if (n > 0) {
      hid_t mt = t.dtype == "f64"   ? H5T_NATIVE_DOUBLE
                 : t.dtype == "f32" ? H5T_NATIVE_FLOAT
                 : t.dtype == "i32" ? H5T_NATIVE_INT32
                                    : H5T_NATIVE_UINT16;
      h5(H5Dread(ds.get(), mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.bytes.data()), where + ": reading the data");
    }
    return t;
  }

  // A hard link to a dataset named `name` in `loc` (no soft or external links: they could point anywhere).
  void require_dataset_link(hid_t loc, const std::string& name, const std::string& where) const {
    const htri_t ex = h5(H5Lexists(loc, name.c_str(), H5P_DEFAULT), where);
    if (ex == 0) bad(fmt::format("missing dataset '{}'", where));
    H5L_info_t li;
    h5(H5Lget_info(loc, name.c_str(), &li, H5P_DEFAULT), where);
    if (li.type != H5L_TYPE_HARD) bad(fmt::format("{} is a soft or external link, not a dataset", where));
    Hid o(h5(H5Oopen(loc, name.c_str(), H5P_DEFAULT), where), H5Oclose);
    if (H5Iget_type(o.get()) != H5I_DATASET) bad(fmt::format("{} is not a dataset", where));
  }

  Hid open_group(hid_t file, const char* name) const {
    const std::string where = fmt::format("/{}", name);
    const htri_t ex = h5(H5Lexists(file, name, H5P_DEFAULT), where);
    if (ex == 0) bad(fmt::format("missing group '{}'", where));
    H5L_info_t li;
    h5(H5Lget_info(file, name, &li, H5P_DEFAULT), where);
    if (li.type != H5L_TYPE_HARD) bad(fmt::format("{} is a soft or external link, not a group", where));
    Hid o(h5(H5Oopen(file, name, H5P_DEFAULT), where), H5Oclose);
    if (H5Iget_type(o.get()) != H5I_GROUP) bad(fmt::format("{} is not a group", where));
    return Hid(h5(H5Gopen2(file, name, H5P_DEFAULT), where), H5Gclose);
  }

  std::vector<NamedTensor> read_group(hid_t file, const char* group) const {
    Hid g = open_group(file, group);
    const std::string gwhere = fmt::format("/{}", group);
    // Creation order when tracked (files from write_state), else name order.
    unsigned flags = 0;
    {
      Hid gcpl(h5(H5Gget_create_plist(g.get()), gwhere), H5Pclose);
      h5(H5Pget_link_creation_order(gcpl.get(), &flags), gwhere);
    }
    const H5_index_t idx = (flags & H5P_CRT_ORDER_INDEXED) ? H5_INDEX_CRT_ORDER : H5_INDEX_NAME;
    H5G_info_t info;
    h5(H5Gget_info(g.get(), &info), gwhere);
    if (info.nlinks > static_cast<hsize_t>(kMaxTensors))
      bad(fmt::format("{} has {} entries, more than {}", gwhere, info.nlinks, kMaxTensors));
    std::vector<NamedTensor> out;
    for (hsize_t i = 0; i < info.nlinks; ++i) {
      const ssize_t len = h5(H5Lget_name_by_idx(g.get(), ".", idx, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT),
                             fmt::format("{}: listing entry {}", gwhere, i));
      if (len <= 0 || static_cast<size_t>(len) > kMaxNameBytes)
        bad(fmt::format("{}: entry {} has a name of {} bytes", gwhere, i, len));
      std::string name(static_cast<size_t>(len), '\0');
      h5(H5Lget_name_by_idx(g.get(), ".", idx, H5_ITER_INC, i, name.data(), static_cast<size_t>(len) + 1,
                            H5P_DEFAULT),
         fmt::format("{}: listing entry {}", gwhere, i));
      const std::string where = fmt::format("{}/{}", gwhere, name);
      require_dataset_link(g.get(), name, where);
      out.push_back(read_tensor(g.get(), name, where));
    }
    return out;
  }

  StateDump read() const {
    Hid fapl(h5(H5Pcreate(H5P_FILE_ACCESS), "file access properties"), H5Pclose);
    h5(H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG), "file access properties");
    Hid f(h5(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), "cannot open the HDF5 file"), H5Fclose);
    Hid root(h5(H5Gopen2(f.get(), "/", H5P_DEFAULT), "root group"), H5Gclose);
    const Int ver = read_int_attr(root.get(), "schema_version", "/");
    const bool ver_ok = ver.is_signed ? ver.s == kSchemaVersion : ver.u == static_cast<uint64_t>(kSchemaVersion);
    if (!ver_ok)
      bad(fmt::format("schema_version {} is not supported (this reader knows {})",
                      ver.is_signed ? std::to_string(ver.s) : std::to_string(ver.u), kSchemaVersion));
    StateDump s;
    auto json_attr = [&](const char* name) {
      const std::string text = read_string_attr(root.get(), name, "/");
      try {
        return parse_json_strict(text, fmt::format("/: attribute '{}'", name));
      } catch (const Error& e) {
        bad(e.what());
      }
    };
    s.config = json_attr("config");
    s.optimizer = json_attr("optimizer");
    // Optional, but typed when present.
    if (h5(H5Aexists(root.get(), "generator"), "/: attribute 'generator'") > 0)
      (void)read_string_attr(root.get(), "generator", "/");
    const Int seed = read_int_attr(root.get(), "seed", "/");
    if (seed.is_signed && seed.s < 0) bad(fmt::format("/: attribute 'seed' is negative ({})", seed.s));
    s.seed = seed.is_signed ? static_cast<uint64_t>(seed.s) : seed.u;
    s.repro = read_string_attr(root.get(), "repro", "/");

    Hid in = open_group(f.get(), "inputs");
    require_dataset_link(in.get(), "tokens", "/inputs/tokens");
    require_dataset_link(in.get(), "targets", "/inputs/targets");
    require_dataset_link(f.get(), "loss", "/loss");
    s.tokens = read_tensor(in.get(), "tokens", "/inputs/tokens");
    s.targets = read_tensor(in.get(), "targets", "/inputs/targets");
    NamedTensor loss = read_tensor(f.get(), "loss", "/loss");
    if (loss.numel() != 1 || (loss.dtype != "f64" && loss.dtype != "f32"))
      bad(fmt::format("/loss must be one f64 or f32 value (got {} shape {})", loss.dtype, loss.shape));
    s.loss = element_as_double(loss, 0);
    s.loss_dtype = loss.dtype;
    s.weights = read_group(f.get(), "weights");
    s.grads = read_group(f.get(), "grads");
    s.weights_after = read_group(f.get(), "weights_after");
    // Optional: the AdamW moments (all four groups or none) and the step counter.
    const bool has_m = h5(H5Lexists(f.get(), "adam_m", H5P_DEFAULT), "/adam_m") > 0;
    if (has_m) {
      s.adam_m = read_group(f.get(), "adam_m");
      s.adam_v = read_group(f.get(), "adam_v");
      s.adam_m_after = read_group(f.get(), "adam_m_after");
      s.adam_v_after = read_group(f.get(), "adam_v_after");
    }
    if (h5(H5Aexists(root.get(), "step"), "/: attribute 'step'") > 0) {
      const Int st = read_int_attr(root.get(), "step", "/");
      if ((st.is_signed && st.s < 1) || (!st.is_signed && (st.u < 1 || st.u > (uint64_t{1} << 62))))
        bad("/: attribute 'step' must be an integer >= 1");
      s.step = st.is_signed ? st.s : static_cast<int64_t>(st.u);
    }
    validate_state(s, fmt::format("cannot read state dump '{}'", path));
    return s;
  }
};

}  // namespace

namespace {

// The in-process read: checksum first (before HDF5 parses a byte), then the validating reader.
// HDF5 1.10's global heap loader (H5HG__cache_heap_deserialize) loops forever on a free-space object of size 0
// in a collection and walks past the collection on an object larger than what is left of it (then copies out of
// bounds in H5HG_read). Walk every global heap collection ("GCOL", version 1) exactly as HDF5 will and refuse one
// it would not survive, before HDF5 sees it (the isolation's time limit would also end the loop, but only after a
// long wait). Needed for files without checksum; done for all (a re-sealed damaged file verifies too).
// `superblock` is where the HDF5 data starts (0, or kChecksumBlock after the checksum header).
}  // namespace

void check_global_heaps(const std::string& path, uint64_t file_size, uint64_t superblock, const char* kind) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(fmt::format("cannot read {} '{}': cannot open the file", kind, path));
  auto read_at = [&](uint64_t off, size_t n) {
    std::string b(n, '\0');
    in.clear();
    in.seekg(static_cast<std::streamoff>(off));
    in.read(b.data(), static_cast<std::streamsize>(n));
    b.resize(static_cast<size_t>(in.gcount()));
    return b;
  };
  auto u64le = [](const char* p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
    return v;
  };
  // The width of lengths in this file: only 8 (HDF5's default, and write_state's) is walked; other widths are
  // left to the time limit.
  const std::string sb = read_at(superblock, 16);
  if (sb.size() < 16) return;
  const int version = static_cast<unsigned char>(sb[8]);
  const int sizeof_len = static_cast<unsigned char>(sb[version <= 1 ? 14 : 10]);
  if (sizeof_len != 8) return;
  constexpr uint64_t kHdr = 16;  // object header: index (2), references (2), reserved (4), size (8)
  constexpr size_t kChunk = size_t{1} << 20;
  for (uint64_t base = 0; base < file_size; base += kChunk) {
    const std::string buf = read_at(base, kChunk + 15);  // overlapping, so no signature straddles two reads
    for (size_t at = buf.find("GCOL"); at != std::string::npos && at < kChunk; at = buf.find("GCOL", at + 1)) {
      const uint64_t pos = base + at;
      const std::string h = read_at(pos, 16);
      if (h.size() < 16 || h[4] != 1 || h[5] != 0 || h[6] != 0 || h[7] != 0) continue;  // not a collection header
      const uint64_t size = u64le(h.data() + 8, 8);
      if (size < kHdr || size > file_size - pos) continue;  // HDF5 refuses such a collection itself
      const std::string c = read_at(pos, static_cast<size_t>(size));
      if (c.size() != size) continue;
      uint64_t p = kHdr;
      while (p < size) {
        if (p + kHdr > size) break;  // a tail too small for an object header: free space
        const uint64_t idx = u64le(c.data() + p, 2), osize = u64le(c.data() + p + 8, 8);
        const uint64_t left = size - p;
        // need = header + size rounded up to 8 for an object, the raw size for the free-space object 0
        const bool too_big = idx > 0 ? osize > left - kHdr : osize > left;
        const uint64_t need = idx > 0 ? kHdr + ((osize + 7) & ~uint64_t{7}) : osize;
        if (too_big || need > left)
          fail(fmt::format("cannot read {} '{}': corrupt HDF5 global heap at byte {}: object {} of {} bytes "
                           "does not fit in its collection",
                           kind, path, pos + p, idx, osize));
        if (need == 0)
          fail(fmt::format("cannot read {} '{}': corrupt HDF5 global heap at byte {}: an empty free-space "
                           "object (HDF5 would loop forever)",
                           kind, path, pos + p));
        p += need;
      }
    }
  }
}

namespace {

StateDump read_in_process(const std::string& path, uint64_t file_size) {
  H5::Exception::dontPrint();
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const Checksum sum = verify_checksum(path);
  check_global_heaps(path, file_size, sum == Checksum::absent ? 0 : kChecksumBlock, "state dump");
  FileReader r;
  r.path = path;
  r.file_size = file_size;
  try {
    return r.read();
  } catch (const std::bad_alloc&) {
    fail(fmt::format("cannot read state dump '{}': out of memory", path));
  } catch (const std::length_error& e) {
    fail(fmt::format("cannot read state dump '{}': {}", path, e.what()));
  } catch (const nlohmann::json::exception& e) {
    fail(fmt::format("cannot read state dump '{}': {}", path, e.what()));
  }
}

// The child -> parent wire format of an isolated read: 'O' + the dump, or 'E' + the error message; then 'Z'
// (the end marker: a child that died mid-write is never taken for a result).
struct WireOut {
  std::string b;
  void u64(uint64_t v) { b.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void str(std::string_view s) {
    u64(s.size());
    b.append(s);
  }
  void tensor(const NamedTensor& t) {
    str(t.name);
    str(t.dtype);
    u64(t.shape.size());
    for (int64_t d : t.shape) u64(static_cast<uint64_t>(d));
    str(std::string_view(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size()));
  }
  void tensors(const std::vector<NamedTensor>& ts) {
    u64(ts.size());
    for (const auto& t : ts) tensor(t);
  }
};

struct WireIn {
  const std::string& b;
  size_t pos = 0;
  [[noreturn]] static void broken() { fail("internal error: the isolated state-dump reader sent a malformed result"); }
  uint64_t u64() {
    if (b.size() - pos < 8) broken();
    uint64_t v;
    std::memcpy(&v, b.data() + pos, 8);
    pos += 8;
    return v;
  }
  std::string str() {
    const uint64_t n = u64();
    if (n > b.size() - pos) broken();
    std::string s = b.substr(pos, n);
    pos += n;
    return s;
  }
  NamedTensor tensor() {
    NamedTensor t;
    t.name = str();
    t.dtype = str();
    const uint64_t rank = u64();
    if (rank > static_cast<uint64_t>(kMaxRank)) broken();
    for (uint64_t i = 0; i < rank; ++i) t.shape.push_back(static_cast<int64_t>(u64()));
    const std::string bytes = str();
    t.bytes.resize(bytes.size());
    if (!bytes.empty()) std::memcpy(t.bytes.data(), bytes.data(), bytes.size());
    return t;
  }
  std::vector<NamedTensor> tensors() {
    const uint64_t n = u64();
    if (n > static_cast<uint64_t>(kMaxTensors)) broken();
    std::vector<NamedTensor> ts;
    for (uint64_t i = 0; i < n; ++i) ts.push_back(tensor());
    return ts;
  }
};

std::string encode(const StateDump& s) {
  WireOut w;
  w.str(s.config.dump());
  w.u64(s.seed);
  w.str(s.repro);
  w.tensor(s.tokens);
  w.tensor(s.targets);
  w.u64(std::bit_cast<uint64_t>(s.loss));
  w.str(s.loss_dtype);
  w.tensors(s.weights);
  w.tensors(s.grads);
  w.tensors(s.weights_after);
  w.str(s.optimizer.dump());
  w.tensors(s.adam_m);
  w.tensors(s.adam_v);
  w.tensors(s.adam_m_after);
  w.tensors(s.adam_v_after);
  w.u64(static_cast<uint64_t>(s.step));
  return std::move(w.b);
}

StateDump decode(const std::string& b) {
  WireIn r{b};
  StateDump s;
  s.config = nlohmann::json::parse(r.str());
  s.seed = r.u64();
  s.repro = r.str();
  s.tokens = r.tensor();
  s.targets = r.tensor();
  s.loss = std::bit_cast<double>(r.u64());
  s.loss_dtype = r.str();
  s.weights = r.tensors();
  s.grads = r.tensors();
  s.weights_after = r.tensors();
  s.optimizer = nlohmann::json::parse(r.str());
  s.adam_m = r.tensors();
  s.adam_v = r.tensors();
  s.adam_m_after = r.tensors();
  s.adam_v_after = r.tensors();
  s.step = static_cast<int64_t>(r.u64());
  if (r.pos != b.size()) WireIn::broken();
  return s;
}

bool write_all(int fd, const std::string& b) {
  size_t off = 0;
  while (off < b.size()) {
    const ssize_t n = ::write(fd, b.data() + off, b.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

// Reads `path` in a forked child: whatever HDF5 does with a hostile or corrupt file (it has crashed on bit flips
// in the global heap of unchecksummed files), the caller gets a StateDump or one trident::Error, within a time
// limit. Returns false (nothing done) when no child could be forked.
}  // namespace

bool run_isolated(const std::string& path, uint64_t file_size, const char* kind,
                  const std::function<std::string()>& work, std::string& result, double limit_arg) {
  int fds[2];
  if (!platform::pipe_cloexec(fds)) return false;
  const pid_t parent = ::getpid();
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return false;
  }
  if (pid == 0) {  // the child: read, send, _exit (no atexit handlers, no flushing of the parent's buffers)
    ::close(fds[0]);
    platform::die_with_parent();  // never outlive a parent that gave up on us (Linux; elsewhere the check below)
    if (::getppid() != parent) ::_exit(3);
    if (const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC); null >= 0) ::dup2(null, 2);  // glibc's abort text
    std::string msg;
    try {
      msg = 'O' + work() + 'Z';
    } catch (const std::exception& e) {
      WireOut w;
      w.b.push_back('E');
      w.str(e.what());
      w.b.push_back('Z');
      msg = std::move(w.b);
    } catch (...) {
      ::_exit(4);
    }
    ::_exit(write_all(fds[1], msg) ? 0 : 5);
  }
  ::close(fds[1]);
  // Generous: 10 s plus 1 s per 50 MB, far beyond what a sound file of that size needs (milliseconds for the
  // goldens), short enough that a parser stuck in a loop is no hang for the caller.
  const double limit_s = limit_arg > 0 ? limit_arg : 10.0 + static_cast<double>(file_size) / 50e6;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
  std::string buf;
  bool timed_out = false;
  char chunk[1 << 16];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd pfd{fds[0], POLLIN, 0};
    const int pr = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (pr < 0 && errno == EINTR) continue;
    if (pr < 0) break;
    if (pr == 0) continue;
    const ssize_t n = ::read(fds[0], chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    buf.append(chunk, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  pid_t w;
  do {
    w = ::waitpid(pid, &status, 0);
  } while (w < 0 && errno == EINTR);
  const std::string pre = fmt::format("cannot read {} '{}'", kind, path);
  if (timed_out) fail(fmt::format("{}: parsing took longer than {:.0f} s (a corrupt file?)", pre, limit_s));
  const bool complete = buf.size() >= 2 && buf.back() == 'Z';
  if (w == pid && WIFSIGNALED(status))
    fail(fmt::format("{}: the HDF5 library crashed parsing it (signal {}): the file is corrupt", pre,
                     WTERMSIG(status)));
  if (!complete || (w == pid && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)))
    fail(fmt::format("{}: the reader process failed (exit status {})", pre, w == pid ? status : -1));
  if (buf[0] == 'E') {
    WireIn r{buf};
    r.pos = 1;
    fail(r.str());
  }
  if (buf[0] != 'O') WireIn::broken();
  result = buf.substr(1, buf.size() - 2);
  return true;
}

namespace {

bool read_isolated(const std::string& path, uint64_t file_size, StateDump& out) {
  std::string b;
  if (!run_isolated(path, file_size, "state dump", [&] { return encode(read_in_process(path, file_size)); }, b))
    return false;
  out = decode(b);
  return true;
}

}  // namespace

StateDump read_state(const std::string& path, const ReadOptions& opt) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail(fmt::format("cannot read state dump '{}': no such file", path));
  if (!fs::is_regular_file(path, ec)) fail(fmt::format("cannot read state dump '{}': not a regular file", path));
  const uint64_t size = fs::file_size(path, ec);
  if (ec) fail(fmt::format("cannot read state dump '{}': {}", path, ec.message()));
  StateDump s;
  if (opt.isolate && read_isolated(path, size, s)) return s;
  return read_in_process(path, size);
}

// ---------------------------------------------------------------------------------------------------------------
// Comparer

namespace {
CompareResult differ(std::string dataset, int64_t index, double a, double b, std::string msg) {
  return CompareResult{false, std::move(dataset), index, a, b, std::move(msg)};
}
}  // namespace

CompareResult compare_tensors(const NamedTensor& a, const NamedTensor& b, const CompareOptions& opt) {
  if (a.name != b.name) return differ(a.name, -1, 0, 0, fmt::format("name '{}' vs '{}'", a.name, b.name));
  if (a.dtype != b.dtype) return differ(a.name, -1, 0, 0, fmt::format("dtype {} vs {}", a.dtype, b.dtype));
  if (a.shape != b.shape)
    return differ(a.name, -1, 0, 0, fmt::format("shape {} vs {}", a.shape, b.shape));
  check_tensor(a, "compare: " + a.name);
  check_tensor(b, "compare: " + b.name);
  const size_t es = dtype_size(a.dtype);
  const bool bitwise = opt.rtol == 0 && opt.atol == 0;
  const int64_t n = a.numel();
  for (int64_t i = 0; i < n; ++i) {
    const bool same_bits = std::memcmp(a.bytes.data() + i * es, b.bytes.data() + i * es, es) == 0;
    if (same_bits) continue;
    const double x = element_as_double(a, i), y = element_as_double(b, i);
    bool ok = false;
    if (!bitwise && !std::isnan(x) && !std::isnan(y)) {
      if (std::isinf(x) || std::isinf(y)) ok = x == y;
      else ok = std::fabs(x - y) <= opt.atol + opt.rtol * std::fabs(y);
    }
    if (!ok)
      return differ(a.name, i, x, y,
                    bitwise ? fmt::format("element {}: {} vs {} (bits differ)", i, x, y)
                            : fmt::format("element {}: {} vs {} (|diff| {} > atol {} + rtol {} * |b|)", i, x, y,
                                          std::fabs(x - y), opt.atol, opt.rtol));
  }
  return {};
}

CompareResult compare_states(const StateDump& a, const StateDump& b, const CompareOptions& opt) {
  if (opt.compare_metadata) {
    if (a.config != b.config) return differ("attr:config", -1, 0, 0, "config JSON differs");
    if (a.seed != b.seed)
      return differ("attr:seed", -1, double(a.seed), double(b.seed), fmt::format("seed {} vs {}", a.seed, b.seed));
    if (a.repro != b.repro) return differ("attr:repro", -1, 0, 0, "repro differs");
    if (a.optimizer != b.optimizer) return differ("attr:optimizer", -1, 0, 0, "optimizer JSON differs");
  }
  CompareOptions exact = opt;
  exact.rtol = exact.atol = 0;
  NamedTensor ta = a.tokens, tb = b.tokens, ga = a.targets, gb = b.targets;
  ta.name = tb.name = "inputs/tokens";
  ga.name = gb.name = "inputs/targets";
  if (auto r = compare_tensors(ta, tb, exact); !r.equal) return r;
  if (auto r = compare_tensors(ga, gb, exact); !r.equal) return r;
  {
    const bool bitwise = opt.rtol == 0 && opt.atol == 0;
    const bool same = std::memcmp(&a.loss, &b.loss, sizeof(double)) == 0;
    const bool ok = same || (!bitwise && std::fabs(a.loss - b.loss) <= opt.atol + opt.rtol * std::fabs(b.loss));
    if (!ok) return differ("loss", 0, a.loss, b.loss, fmt::format("loss {} vs {}", a.loss, b.loss));
  }
  auto group = [&](const char* g, const std::vector<NamedTensor>& x,
                   const std::vector<NamedTensor>& y) -> CompareResult {
    if (x.size() != y.size())
      return differ(g, -1, double(x.size()), double(y.size()),
                    fmt::format("{}: {} vs {} tensors", g, x.size(), y.size()));
    for (size_t i = 0; i < x.size(); ++i) {
      CompareResult r = compare_tensors(x[i], y[i], opt);
      if (!r.equal) {
        r.dataset = fmt::format("{}/{}", g, r.dataset);
        r.message = fmt::format("{}: {}", r.dataset, r.message);
        return r;
      }
    }
    return {};
  };
  if (auto r = group("weights", a.weights, b.weights); !r.equal) return r;
  if (auto r = group("grads", a.grads, b.grads); !r.equal) return r;
  if (auto r = group("weights_after", a.weights_after, b.weights_after); !r.equal) return r;
  // The AdamW moments and the step are optional (older dumps, golden/data): compared when both files hold them.
  if (!a.adam_m.empty() && !b.adam_m.empty()) {
    if (auto r = group("adam_m", a.adam_m, b.adam_m); !r.equal) return r;
    if (auto r = group("adam_v", a.adam_v, b.adam_v); !r.equal) return r;
    if (auto r = group("adam_m_after", a.adam_m_after, b.adam_m_after); !r.equal) return r;
    if (auto r = group("adam_v_after", a.adam_v_after, b.adam_v_after); !r.equal) return r;
  }
  if (opt.compare_metadata && a.step > 0 && b.step > 0 && a.step != b.step)
    return differ("attr:step", -1, static_cast<double>(a.step), static_cast<double>(b.step),
                  fmt::format("step differs: {} vs {}", a.step, b.step));
  return {};
}

}  // namespace trident::golden
