// HDF5 state dump writer, reader and comparer (schema: golden/state_dump.h, docs/golden.md).
#include "golden/state_dump.h"

#include <H5Cpp.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <filesystem>
#include <system_error>

#include "reference/check.h"

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
  for (int64_t s : shape) n *= s;
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
  std::vector<double> out(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[static_cast<size_t>(i)] = element_as_double(t, i);
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
// HDF5 plumbing

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
std::string unwritable_reason(const fs::path& path) {
  std::error_code ec;
  fs::path dir = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  if (!fs::exists(dir, ec)) return fmt::format("directory '{}' does not exist", dir.string());
  if (!fs::is_directory(dir, ec)) return fmt::format("'{}' is not a directory", dir.string());
  if (fs::is_directory(path, ec)) return "the path is a directory";
  if (::access(dir.c_str(), W_OK) != 0) return fmt::format("directory '{}' is not writable", dir.string());
  return "";
}

}  // namespace

void write_state(const std::string& path, const StateDump& s) {
  H5::Exception::dontPrint();
  const fs::path target(path);
  TD_CHECK(!path.empty(), "write_state: empty path");
  if (std::string why = unwritable_reason(target); !why.empty())
    fail(fmt::format("cannot write state dump '{}': {}", path, why));
  check_tensor(s.tokens, "inputs/tokens");
  check_tensor(s.targets, "inputs/targets");
  TD_CHECK(s.tokens.dtype == "i32" && s.targets.dtype == "i32", "inputs/tokens and inputs/targets must be i32");
  TD_CHECK(s.tokens.shape.size() == 2, "inputs/tokens must be [sequences, seq_len], got shape {}", s.tokens.shape);
  TD_CHECK(s.tokens.shape == s.targets.shape, "inputs/tokens shape {} != inputs/targets shape {}", s.tokens.shape,
           s.targets.shape);
  const std::string loss_dtype = resolve_loss_dtype(s);

  const fs::path tmp = target.parent_path() /
                       fmt::format(".{}.tmp.{}", target.filename().string(), static_cast<long>(::getpid()));
  try {
    {
      H5::H5File f(tmp.string(), H5F_ACC_TRUNC);
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
      f.flush(H5F_SCOPE_GLOBAL);
    }
    std::error_code ec;
    fs::rename(tmp, target, ec);
    if (ec) fail(fmt::format("cannot write state dump '{}': rename failed: {}", path, ec.message()));
  } catch (const H5::Exception& e) {
    std::error_code ec;
    fs::remove(tmp, ec);
    fail(fmt::format("cannot write state dump '{}': HDF5: {} ({})", path, e.getDetailMsg(), e.getFuncName()));
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Reader

namespace {

std::string read_str_attr(const H5::H5Object& obj, const char* name, const std::string& where) {
  if (!obj.attrExists(name)) fail(fmt::format("{}: missing attribute '{}'", where, name));
  H5::Attribute a = obj.openAttribute(name);
  H5::DataType t = a.getDataType();
  if (t.getClass() != H5T_STRING) fail(fmt::format("{}: attribute '{}' is not a string", where, name));
  std::string v;
  a.read(a.getStrType(), v);
  return v;
}

std::string dtype_of(const H5::DataSet& ds, const std::string& where) {
  std::string d = ds.attrExists("dtype") ? read_str_attr(ds, "dtype", where) : std::string();
  if (d.empty()) {  // infer from the HDF5 type (files written by other tools)
    H5::DataType t = ds.getDataType();
    if (t == H5::PredType::IEEE_F64LE) d = "f64";
    else if (t == H5::PredType::IEEE_F32LE) d = "f32";
    else if (t == H5::PredType::STD_I32LE) d = "i32";
    else fail(fmt::format("{}: no dtype attribute and an unsupported HDF5 type", where));
  }
  dtype_size(d);
  return d;
}

NamedTensor read_dataset(const H5::DataSet& ds, const std::string& name, const std::string& where) {
  NamedTensor t;
  t.name = name;
  t.dtype = dtype_of(ds, where);
  H5::DataSpace sp = ds.getSpace();
  const int rank = sp.getSimpleExtentNdims();
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (rank > 0) sp.getSimpleExtentDims(dims.data());
  t.shape.assign(dims.begin(), dims.end());
  t.bytes.resize(static_cast<size_t>(t.numel()) * dtype_size(t.dtype));
  if (t.numel() > 0) ds.read(t.bytes.data(), mem_type(t.dtype));
  return t;
}

std::vector<NamedTensor> read_group(const H5::H5File& f, const char* group, const std::string& path) {
  if (!f.nameExists(group)) fail(fmt::format("{}: missing group '/{}'", path, group));
  H5::Group g = f.openGroup(group);
  // Creation order when tracked (files from write_state), else name order.
  hid_t gcpl = H5Gget_create_plist(g.getId());
  unsigned flags = 0;
  H5Pget_link_creation_order(gcpl, &flags);
  H5Pclose(gcpl);
  const H5_index_t idx = (flags & H5P_CRT_ORDER_INDEXED) ? H5_INDEX_CRT_ORDER : H5_INDEX_NAME;
  std::vector<NamedTensor> out;
  const hsize_t n = g.getNumObjs();
  for (hsize_t i = 0; i < n; ++i) {
    ssize_t len = H5Lget_name_by_idx(g.getId(), ".", idx, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (len < 0) fail(fmt::format("{}: cannot list group '/{}'", path, group));
    std::string name(static_cast<size_t>(len), '\0');
    H5Lget_name_by_idx(g.getId(), ".", idx, H5_ITER_INC, i, name.data(), static_cast<size_t>(len) + 1, H5P_DEFAULT);
    const std::string where = fmt::format("{}: /{}/{}", path, group, name);
    out.push_back(read_dataset(g.openDataSet(name), name, where));
  }
  return out;
}

}  // namespace

StateDump read_state(const std::string& path) {
  H5::Exception::dontPrint();
  std::error_code ec;
  if (!fs::exists(path, ec)) fail(fmt::format("cannot read state dump '{}': no such file", path));
  try {
    H5::H5File f(path, H5F_ACC_RDONLY);
    H5::Group root = f.openGroup("/");
    if (!root.attrExists("schema_version")) fail(fmt::format("{}: missing attribute 'schema_version'", path));
    int32_t ver = 0;
    root.openAttribute("schema_version").read(H5::PredType::NATIVE_INT32, &ver);
    if (ver != kSchemaVersion)
      fail(fmt::format("{}: schema_version {} is not supported (this reader knows {})", path, ver, kSchemaVersion));
    StateDump s;
    try {
      s.config = nlohmann::json::parse(read_str_attr(root, "config", path));
      s.optimizer = nlohmann::json::parse(read_str_attr(root, "optimizer", path));
    } catch (const nlohmann::json::exception& e) {
      fail(fmt::format("{}: config/optimizer attribute is not valid JSON: {}", path, e.what()));
    }
    if (!root.attrExists("seed")) fail(fmt::format("{}: missing attribute 'seed'", path));
    root.openAttribute("seed").read(H5::PredType::NATIVE_UINT64, &s.seed);
    s.repro = read_str_attr(root, "repro", path);

    auto has = [&](const char* grp, const char* name) {
      return grp ? (f.nameExists(grp) && f.openGroup(grp).nameExists(name)) : f.nameExists(name);
    };
    if (!has("inputs", "tokens")) fail(fmt::format("{}: missing dataset '/inputs/tokens'", path));
    if (!has("inputs", "targets")) fail(fmt::format("{}: missing dataset '/inputs/targets'", path));
    if (!has(nullptr, "loss")) fail(fmt::format("{}: missing dataset '/loss'", path));
    s.tokens = read_dataset(f.openDataSet("inputs/tokens"), "tokens", path + ": /inputs/tokens");
    s.targets = read_dataset(f.openDataSet("inputs/targets"), "targets", path + ": /inputs/targets");
    NamedTensor loss = read_dataset(f.openDataSet("loss"), "loss", path + ": /loss");
    if (loss.numel() != 1 || (loss.dtype != "f64" && loss.dtype != "f32"))
      fail(fmt::format("{}: /loss must be one f64 or f32 value", path));
    s.loss = element_as_double(loss, 0);
    s.loss_dtype = loss.dtype;
    s.weights = read_group(f, "weights", path);
    s.grads = read_group(f, "grads", path);
    s.weights_after = read_group(f, "weights_after", path);
    return s;
  } catch (const H5::Exception& e) {
    fail(fmt::format("cannot read state dump '{}': HDF5: {} ({})", path, e.getDetailMsg(), e.getFuncName()));
  }
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
  for (int64_t i = 0; i < a.numel(); ++i) {
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
  return {};
}

}  // namespace trident::golden
