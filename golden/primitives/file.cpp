// primitives.h5: writer, reader, communication records and the checker (docs/golden.md "Primitive goldens").
#include <H5Cpp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include <unistd.h>

#include "emulator/device.h"
#include "golden/primitives/accept.h"
#include "golden/primitives/primitives.h"
#include "golden/read_guard.h"
#include "parallel/layout.h"
#include "reference/atomic_write.h"
#include "reference/check.h"

namespace trident::golden {

namespace fs = std::filesystem;

namespace {

const H5::DataType& ftype(const std::string& dtype) {
  if (dtype == "f64") return H5::PredType::IEEE_F64LE;
  if (dtype == "f32") return H5::PredType::IEEE_F32LE;
  if (dtype == "i32") return H5::PredType::STD_I32LE;
  if (dtype == "i64") return H5::PredType::STD_I64LE;
  fail(fmt::format("primitives: unknown tensor dtype '{}'", dtype));
}
const H5::DataType& mtype(const std::string& dtype) {
  if (dtype == "f64") return H5::PredType::NATIVE_DOUBLE;
  if (dtype == "f32") return H5::PredType::NATIVE_FLOAT;
  if (dtype == "i32") return H5::PredType::NATIVE_INT32;
  if (dtype == "i64") return H5::PredType::NATIVE_INT64;
  fail(fmt::format("primitives: unknown tensor dtype '{}'", dtype));
}
size_t esize(const std::string& dtype) { return dtype == "f64" || dtype == "i64" ? 8 : 4; }

H5::StrType utf8() {
  H5::StrType t(H5::PredType::C_S1, H5T_VARIABLE);
  t.setCset(H5T_CSET_UTF8);
  return t;
}
void str_attr(H5::H5Object& o, const char* name, const std::string& v) {
  H5::StrType t = utf8();
  o.createAttribute(name, t, H5::DataSpace(H5S_SCALAR)).write(t, v);
}
void int_attr(H5::H5Object& o, const char* name, int64_t v) {
  o.createAttribute(name, H5::PredType::STD_I64LE, H5::DataSpace(H5S_SCALAR)).write(H5::PredType::NATIVE_INT64, &v);
}
void f64_attr(H5::H5Object& o, const char* name, double v) {
  o.createAttribute(name, H5::PredType::IEEE_F64LE, H5::DataSpace(H5S_SCALAR)).write(H5::PredType::NATIVE_DOUBLE, &v);
}
// A group whose links are listed in creation order.
H5::Group ordered_group(hid_t parent, const std::string& name) {
  hid_t gcpl = H5Pcreate(H5P_GROUP_CREATE);
  TD_CHECK(gcpl >= 0, "H5Pcreate failed");
  herr_t st = H5Pset_link_creation_order(gcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
  hid_t gid = st >= 0 ? H5Gcreate2(parent, name.c_str(), H5P_DEFAULT, gcpl, H5P_DEFAULT) : -1;
  H5Pclose(gcpl);
  if (gid < 0) fail(fmt::format("primitives: cannot create group '{}'", name));
  H5::Group g(gid);
  if (H5Iget_ref(gid) > 1) H5Idec_ref(gid);
  return g;
}
H5::DataSet write_tensor(H5::Group& g, const NamedTensor& t) {
  std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
  H5::DataSpace space =
      dims.empty() ? H5::DataSpace(H5S_SCALAR) : H5::DataSpace(static_cast<int>(dims.size()), dims.data());
  H5::DataSet ds = g.createDataSet(t.name, ftype(t.dtype), space);
  if (t.numel() > 0) ds.write(t.bytes.data(), mtype(t.dtype));
  str_attr(ds, "dtype", t.dtype);
  return ds;
}
void write_case(hid_t parent, const PrimCase& c) {
  H5::Group g = ordered_group(parent, c.name);
  str_attr(g, "op", c.op);
  str_attr(g, "dtype", c.dtype);
  str_attr(g, "policy", c.policy);
  str_attr(g, "shapes", c.shapes.dump());
  str_attr(g, "n_terms", c.n_terms.dump());
  str_attr(g, "tolerance", c.tolerance.dump());
  if (!c.accept.empty()) str_attr(g, "accept", c.accept.dump());
  str_attr(g, "repro", c.repro);
  int_attr(g, "rank", c.rank);
  for (auto [name, list] : {std::pair{"inputs", &c.inputs}, std::pair{"outputs", &c.outputs},
                            std::pair{"sum_abs", &c.sum_abs}, std::pair{"oracle", &c.oracle},
                            std::pair{"bound", &c.bound}}) {
    if ((list == &c.oracle || list == &c.bound) && list->empty()) continue;  // optional groups
    H5::Group sub = ordered_group(g.getId(), name);
    for (const NamedTensor& t : *list) {
      H5::DataSet ds = write_tensor(sub, t);
      if (list == &c.sum_abs) {
        const nlohmann::json& tol = c.tolerance.at(t.name);
        int_attr(ds, "n_terms", c.n_terms.at(t.name).get<int64_t>());
        str_attr(ds, "primitive", tol.at("primitive").get<std::string>());
        f64_attr(ds, "k_const", tol.at("k_const").get<double>());
        f64_attr(ds, "k_per_term", tol.at("k_per_term").get<double>());
        f64_attr(ds, "u", tol.at("u").get<double>());
      }
    }
  }
}
void write_cases(hid_t parent, const std::vector<const PrimCase*>& cases) {
  H5::Group prims = ordered_group(parent, "primitives");
  std::string cur;
  std::optional<H5::Group> opg;
  for (const PrimCase* c : cases) {
    if (c->op != cur) {
      opg.reset();
      opg.emplace(ordered_group(prims.getId(), c->op));
      cur = c->op;
    }
    write_case(opg->getId(), *c);
  }
}
void write_strings(H5::Group& g, const char* name, const std::vector<std::string>& v) {
  hsize_t n = v.size();
  H5::StrType t = utf8();
  H5::DataSet ds = g.createDataSet(name, t, H5::DataSpace(1, &n));
  std::vector<const char*> p;
  for (const auto& s : v) p.push_back(s.c_str());
  if (n) ds.write(p.data(), t);
}
template <class U>
void write_column(H5::Group& g, const char* name, const std::vector<U>& v, const H5::DataType& ft,
                  const H5::DataType& mt) {
  hsize_t n = v.size();
  H5::DataSet ds = g.createDataSet(name, ft, H5::DataSpace(1, &n));
  if (n) ds.write(v.data(), mt);
}

// ---- reading (docs/golden.md "What the primitive reader checks"): every attribute's type and element count and every
// dataset's dtype, rank, shape and stored size are checked before a byte of it is read.
constexpr int64_t kMaxChildren = int64_t{1} << 20;        // links per group
constexpr int64_t kMaxElements = int64_t{1} << 32;        // per tensor
constexpr size_t kMaxAttrString = size_t{1} << 26;        // 64 MiB per string attribute

struct Budget {           // bytes of tensor data read so far, at most the file's size (no dataset read twice over)
  uint64_t file_size = 0;
  uint64_t read = 0;
};

// The attribute holds exactly one element of HDF5 class `cls`.
H5::Attribute one_attr(const H5::H5Object& o, const char* name, H5T_class_t cls, const char* what_class) {
  if (!o.attrExists(name)) fail(fmt::format("attribute '{}' missing", name));
  H5::Attribute a = o.openAttribute(name);
  if (a.getTypeClass() != cls) fail(fmt::format("attribute '{}' is not {}", name, what_class));
  H5::DataSpace sp = a.getSpace();
  const H5S_class_t sc = sp.getSimpleExtentType();
  if ((sc != H5S_SCALAR && sc != H5S_SIMPLE) || sp.getSimpleExtentNpoints() != 1)
    fail(fmt::format("attribute '{}' must hold exactly one value", name));
  return a;
}
std::string read_str_attr(const H5::H5Object& o, const char* name) {
  H5::Attribute a = one_attr(o, name, H5T_STRING, "a string");
  H5::StrType t = a.getStrType();
  if (!t.isVariableStr() && (t.getSize() == 0 || t.getSize() > kMaxAttrString))
    fail(fmt::format("attribute '{}' has an invalid string size", name));
  std::string s;
  a.read(t, s);
  if (s.size() > kMaxAttrString) fail(fmt::format("attribute '{}' is longer than {} bytes", name, kMaxAttrString));
  return s;
}
int64_t read_int_attr(const H5::H5Object& o, const char* name) {
  H5::Attribute a = one_attr(o, name, H5T_INTEGER, "an integer");
  const size_t size = a.getDataType().getSize();
  if (size == 0 || size > 8) fail(fmt::format("attribute '{}' is a {}-byte integer (at most 8)", name, size));
  int64_t v = 0;
  a.read(H5::PredType::NATIVE_INT64, &v);
  return v;
}
std::vector<std::string> children(const H5::Group& g, const std::string& where) {
  std::vector<std::string> out;
  const hsize_t n = g.getNumObjs();
  if (n > static_cast<hsize_t>(kMaxChildren)) fail(fmt::format("{}: {} entries, more than {}", where, n, kMaxChildren));
  hid_t gid = g.getId();
  H5_index_t idx = H5_INDEX_NAME;
  hid_t gcpl = H5Gget_create_plist(gid);
  unsigned flags = 0;
  if (gcpl >= 0 && H5Pget_link_creation_order(gcpl, &flags) >= 0 && (flags & H5P_CRT_ORDER_INDEXED))
    idx = H5_INDEX_CRT_ORDER;
  if (gcpl >= 0) H5Pclose(gcpl);
  for (hsize_t i = 0; i < n; ++i) {
    const ssize_t len = H5Lget_name_by_idx(gid, ".", idx, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (len <= 0 || len > 4096) fail(fmt::format("{}: a link name is empty or too long", where));
    std::string name(static_cast<size_t>(len), '\0');
    if (H5Lget_name_by_idx(gid, ".", idx, H5_ITER_INC, i, name.data(), static_cast<size_t>(len) + 1, H5P_DEFAULT) < 0)
      fail(fmt::format("{}: cannot read a link name", where));
    H5L_info_t info;
    if (H5Lget_info(gid, name.c_str(), &info, H5P_DEFAULT) < 0 || info.type != H5L_TYPE_HARD)
      fail(fmt::format("{}/{}: not a hard link (soft and external links are refused)", where, name));
    out.push_back(name);
  }
  return out;
}
H5::Group open_group(const H5::Group& g, const std::string& name, const std::string& where) {
  if (!g.nameExists(name)) fail(fmt::format("{}: group '{}' missing", where, name));
  if (g.childObjType(name) != H5O_TYPE_GROUP) fail(fmt::format("{}/{}: not a group", where, name));
  return g.openGroup(name);
}
NamedTensor read_tensor(const H5::Group& g, const std::string& name, const std::string& where, Budget& budget) {
  if (g.childObjType(name) != H5O_TYPE_DATASET) fail(fmt::format("{}: not a dataset", where));
  H5::DataSet ds = g.openDataSet(name);
  NamedTensor t;
  t.name = name;
  t.dtype = read_str_attr(ds, "dtype");
  if (t.dtype != "f64" && t.dtype != "f32" && t.dtype != "i32" && t.dtype != "i64")
    fail(fmt::format("{}: dtype '{}' (expected f64, f32, i32 or i64)", where, t.dtype.substr(0, 64)));
  const H5::DataType& ft = ftype(t.dtype);
  H5::DataType actual = ds.getDataType();
  if (actual.getClass() != ft.getClass() || actual.getSize() != ft.getSize())
    fail(fmt::format("{}: stored type does not match its dtype '{}'", where, t.dtype));
  H5::DataSpace sp = ds.getSpace();
  const H5S_class_t sc = sp.getSimpleExtentType();
  if (sc != H5S_SCALAR && sc != H5S_SIMPLE) fail(fmt::format("{}: null or invalid dataspace", where));
  const int rank = sp.getSimpleExtentNdims();
  if (rank < 0 || rank > 8) fail(fmt::format("{}: rank {} not supported", where, rank));
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (rank > 0) sp.getSimpleExtentDims(dims.data());
  int64_t n = 1;
  for (hsize_t d : dims) {
    if (d > static_cast<hsize_t>(kMaxElements)) fail(fmt::format("{}: dimension {} too large", where, d));
    t.shape.push_back(static_cast<int64_t>(d));
    if (d != 0 && n > kMaxElements / static_cast<int64_t>(d)) fail(fmt::format("{}: too many elements", where));
    n *= static_cast<int64_t>(d);
  }
  const uint64_t bytes = static_cast<uint64_t>(n) * esize(t.dtype);
  // The data must be stored in full (unwritten data reads as fill values), and all datasets together fit in the
  // file: hard links or headers pointing many datasets at the same bytes cannot multiply what is read.
  if (n > 0 && ds.getStorageSize() < bytes)
    fail(fmt::format("{}: {} bytes of data stored, its shape needs {}", where, ds.getStorageSize(), bytes));
  budget.read += bytes;
  if (budget.read > budget.file_size)
    fail(fmt::format("{}: the datasets hold more data than the file's {} bytes", where, budget.file_size));
  t.bytes.resize(static_cast<size_t>(bytes));
  if (n > 0) ds.read(t.bytes.data(), mtype(t.dtype));
  return t;
}
nlohmann::json json_attr(const H5::H5Object& o, const char* name) {
  try {
    return nlohmann::json::parse(read_str_attr(o, name));
  } catch (const nlohmann::json::exception& e) {
    fail(fmt::format("attribute '{}' is not JSON: {}", name, e.what()));
  }
}
void read_cases(const H5::Group& parent, int rank, std::vector<PrimCase>& out, Budget& budget,
                const std::string& base) {
  if (!parent.nameExists("primitives")) return;
  H5::Group prims = open_group(parent, "primitives", base);
  for (const std::string& op : children(prims, base + "primitives")) {
    H5::Group opg = open_group(prims, op, base + "primitives");
    for (const std::string& cn : children(opg, base + "primitives/" + op)) {
      const std::string where = fmt::format("{}primitives/{}/{}", base, op, cn);
      H5::Group g = open_group(opg, cn, base + "primitives/" + op);
      PrimCase c;
      c.op = op;
      c.name = cn;
      c.rank = rank;
      c.dtype = read_str_attr(g, "dtype");
      if (c.dtype != "f32" && c.dtype != "f64") fail(fmt::format("{}: dtype '{}' is not f32 or f64", where, c.dtype));
      if (g.attrExists("op") && read_str_attr(g, "op") != op)
        fail(fmt::format("{}: its attribute 'op' names another op", where));
      if (g.attrExists("rank") && read_int_attr(g, "rank") != rank)
        fail(fmt::format("{}: its attribute 'rank' is not {}", where, rank));
      c.policy = read_str_attr(g, "policy");
      c.shapes = json_attr(g, "shapes");
      c.n_terms = json_attr(g, "n_terms");
      c.tolerance = json_attr(g, "tolerance");
      if (g.attrExists("accept")) c.accept = json_attr(g, "accept");
      if (!c.shapes.is_object() || !c.n_terms.is_object() || !c.tolerance.is_object() || !c.accept.is_object())
        fail(fmt::format("{}: attributes 'shapes', 'n_terms', 'tolerance' and 'accept' must be JSON objects", where));
      c.repro = read_str_attr(g, "repro");
      for (auto [name, list] : {std::pair{"inputs", &c.inputs}, std::pair{"outputs", &c.outputs},
                                std::pair{"sum_abs", &c.sum_abs}, std::pair{"oracle", &c.oracle},
                                std::pair{"bound", &c.bound}}) {
        if ((list == &c.oracle || list == &c.bound) && !g.nameExists(name)) continue;  // optional groups
        H5::Group sub = open_group(g, name, where);
        for (const std::string& tn : children(sub, where + "/" + name))
          list->push_back(read_tensor(sub, tn, where + "/" + name + "/" + tn, budget));
      }
      out.push_back(std::move(c));
    }
  }
}
template <class U>
std::vector<U> read_column(const H5::Group& g, const char* name, const char* dtype, const H5::DataType& mt,
                           const std::string& where, Budget& budget) {
  if (!g.nameExists(name)) fail(fmt::format("{}/{}: missing", where, name));
  if (g.childObjType(name) != H5O_TYPE_DATASET) fail(fmt::format("{}/{}: not a dataset", where, name));
  H5::DataSet ds = g.openDataSet(name);
  H5::DataType t = ds.getDataType();
  const bool is_int = std::is_integral_v<U>;
  if (t.getClass() != (is_int ? H5T_INTEGER : H5T_STRING) || (is_int && t.getSize() != sizeof(U)))
    fail(fmt::format("{}/{}: not a column of {}", where, name, dtype));
  H5::DataSpace sp = ds.getSpace();
  if (sp.getSimpleExtentType() != H5S_SIMPLE || sp.getSimpleExtentNdims() != 1)
    fail(fmt::format("{}/{}: not a one-dimensional column", where, name));
  hsize_t n = 0;
  sp.getSimpleExtentDims(&n);
  if (n > static_cast<hsize_t>(kMaxChildren)) fail(fmt::format("{}/{}: {} rows, more than {}", where, name, n, kMaxChildren));
  const uint64_t bytes = n * (is_int ? sizeof(U) : 16);
  if (n > 0 && is_int && ds.getStorageSize() < bytes) fail(fmt::format("{}/{}: data not stored in full", where, name));
  budget.read += bytes;
  if (budget.read > budget.file_size)
    fail(fmt::format("{}/{}: the datasets hold more data than the file's {} bytes", where, name, budget.file_size));
  std::vector<U> v(static_cast<size_t>(n));
  if constexpr (std::is_same_v<U, std::string>) {
    H5::StrType st(H5::PredType::C_S1, H5T_VARIABLE);
    if (!t.isVariableStr()) fail(fmt::format("{}/{}: not variable-length strings", where, name));
    std::vector<char*> p(static_cast<size_t>(n), nullptr);
    if (n > 0) ds.read(p.data(), st);
    for (size_t i = 0; i < p.size(); ++i) {
      const size_t len = p[i] ? strnlen(p[i], 4096) : 0;
      if (p[i]) v[i].assign(p[i], len);
    }
    if (n > 0) H5Dvlen_reclaim(st.getId(), sp.getId(), H5P_DEFAULT, p.data());
    for (const std::string& x : v)
      if (x.size() >= 4096) fail(fmt::format("{}/{}: a string longer than 4095 bytes", where, name));
  } else {
    if (n > 0) ds.read(v.data(), mt);
  }
  return v;
}
std::vector<CommRecord> read_comm(const H5::Group& rg, const std::string& where, Budget& budget) {
  H5::Group cg = open_group(rg, "comm", where);
  const std::string w = where + "/comm";
  const auto op = read_column<std::string>(cg, "op", "strings", H5::PredType::C_S1, w, budget);
  const auto comm = read_column<std::string>(cg, "comm", "strings", H5::PredType::C_S1, w, budget);
  const auto dtype = read_column<std::string>(cg, "dtype", "strings", H5::PredType::C_S1, w, budget);
  const auto seq = read_column<uint64_t>(cg, "seq", "uint64", H5::PredType::NATIVE_UINT64, w, budget);
  const auto count = read_column<uint64_t>(cg, "count", "uint64", H5::PredType::NATIVE_UINT64, w, budget);
  const auto peer = read_column<int32_t>(cg, "peer", "int32", H5::PredType::NATIVE_INT32, w, budget);
  const auto hash = read_column<uint64_t>(cg, "recv_hash", "uint64", H5::PredType::NATIVE_UINT64, w, budget);
  const size_t n = op.size();
  if (comm.size() != n || dtype.size() != n || seq.size() != n || count.size() != n || peer.size() != n ||
      hash.size() != n)
    fail(fmt::format("{}: its columns have different lengths", w));
  std::vector<CommRecord> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (op[i].empty() || comm[i].empty() || dtype[i].empty())
      fail(fmt::format("{}: row {} has an empty op, comm or dtype", w, i));
    if (peer[i] < -1) fail(fmt::format("{}: row {} has peer {}", w, i, peer[i]));
    out[i] = CommRecord{op[i], comm[i], seq[i], count[i], dtype[i], peer[i], hash[i]};
  }
  return out;
}

// The case manifest (root attribute `manifest`): every case with its input, output and sum_abs names, per rank,
// and the length of each rank's communication trace, so a deleted case, tensor or rank is an error.
nlohmann::json manifest_of(const PrimitivesFile& f) {
  nlohmann::json m;
  m["ranks"] = f.ranks;
  m["cases"] = nlohmann::json::array();
  for (const PrimCase& c : f.cases) {
    nlohmann::json e;
    e["rank"] = c.rank;
    e["op"] = c.op;
    e["case"] = c.name;
    for (auto [name, list] : {std::pair{"inputs", &c.inputs}, std::pair{"outputs", &c.outputs},
                              std::pair{"sum_abs", &c.sum_abs}, std::pair{"oracle", &c.oracle},
                              std::pair{"bound", &c.bound}}) {
      if ((list == &c.oracle || list == &c.bound) && list->empty()) continue;  // listed where present
      e[name] = nlohmann::json::array();
      for (const NamedTensor& t : *list) e[name].push_back(t.name);
    }
    m["cases"].push_back(std::move(e));
  }
  m["comm"] = nlohmann::json::array();
  for (int r = 0; r < f.ranks; ++r)
    m["comm"].push_back(static_cast<size_t>(r) < f.comm.size() ? f.comm[static_cast<size_t>(r)].size() : 0);
  return m;
}

void check_manifest(const PrimitivesFile& f, const nlohmann::json& m) {
  if (!m.is_object() || !m.contains("ranks") || !m.contains("cases") || !m.contains("comm") ||
      !m["cases"].is_array() || !m["comm"].is_array())
    fail("attribute 'manifest' is not a case manifest");
  if (m["ranks"] != f.ranks) fail(fmt::format("attribute 'ranks' is {}, the manifest says {}", f.ranks, m["ranks"].dump()));
  const nlohmann::json want = manifest_of(f);
  if (m["comm"] != want["comm"])
    fail(fmt::format("the communication traces have {} rows per rank, the manifest says {}", want["comm"].dump(),
                     m["comm"].dump()));
  std::map<std::tuple<int64_t, std::string, std::string>, const nlohmann::json*> have;
  for (const nlohmann::json& e : want["cases"])
    have[{e["rank"].get<int64_t>(), e["op"].get<std::string>(), e["case"].get<std::string>()}] = &e;
  for (const nlohmann::json& e : m["cases"]) {
    if (!e.is_object() || !e.contains("rank") || !e.contains("op") || !e.contains("case") ||
        !e["rank"].is_number_integer() || !e["op"].is_string() || !e["case"].is_string())
      fail("attribute 'manifest' has a malformed case entry");
    const auto key = std::tuple{e["rank"].get<int64_t>(), e["op"].get<std::string>(), e["case"].get<std::string>()};
    auto it = have.find(key);
    if (it == have.end())
      fail(fmt::format("case {}/{} of rank {} is missing (the manifest lists it)", std::get<1>(key), std::get<2>(key),
                       std::get<0>(key)));
    for (const char* part : {"inputs", "outputs", "sum_abs", "oracle", "bound"})
      if (e.contains(part) != it->second->contains(part) || (e.contains(part) && e[part] != (*it->second)[part]))
        fail(fmt::format("case {}/{} of rank {}: its {} are {}, the manifest says {}", std::get<1>(key),
                         std::get<2>(key), std::get<0>(key), part,
                         it->second->contains(part) ? (*it->second)[part].dump() : "nothing",
                         e.contains(part) ? e[part].dump() : "nothing"));
    have.erase(it);
  }
  if (!have.empty()) {
    const auto& [r, op, cn] = have.begin()->first;
    fail(fmt::format("case {}/{} of rank {} is not in the manifest", op, cn, r));
  }
}

// The derived rule's data of a case (golden/primitives/accept.h): every `accept` entry names an output and a rule;
// a "bound" rule has its oracle and bound (f64, the output's shape; bounds finite and >= 0) and a finite floor and
// k_rel; oracle and bound tensors belong to a "bound" rule. A bound of +Inf or NaN would pass anything: refused.
void check_accept(const PrimCase& c) {
  auto output = [&](const std::string& name) {
    return std::find_if(c.outputs.begin(), c.outputs.end(), [&](const NamedTensor& t) { return t.name == name; });
  };
  const std::string w = fmt::format("case {}/{} of rank {}", c.op, c.name, c.rank);
  for (const auto& [name, e] : c.accept.items()) {
    if (output(name) == c.outputs.end())
      fail(fmt::format("{}: output '{}' is missing (the file stores its acceptance rule)", w, name.substr(0, 64)));
    if (!e.is_object() || !e.contains("rule") || !e["rule"].is_string() ||
        (e["rule"] != "bound" && e["rule"] != "exact"))
      fail(fmt::format("{}: accept '{}' is not {{\"rule\": \"bound\" | \"exact\", ...}}", w, name));
    if (e["rule"] != "bound") continue;
    for (const char* k : {"floor", "k_rel"})
      if (!e.contains(k) || !e[k].is_number() || !std::isfinite(e[k].get<double>()) || !(e[k].get<double>() >= 0))
        fail(fmt::format("{}: accept '{}': '{}' is not a finite number >= 0", w, name, k));
    for (const std::vector<NamedTensor>* list : {&c.oracle, &c.bound})
      if (std::none_of(list->begin(), list->end(), [&](const NamedTensor& t) { return t.name == name; }))
        fail(fmt::format("{}: output '{}' has the bound rule but no {}", w, name, list == &c.oracle ? "oracle" : "bound"));
  }
  for (const std::vector<NamedTensor>* list : {&c.oracle, &c.bound})
    for (const NamedTensor& t : *list) {
      const char* what = list == &c.oracle ? "oracle" : "bound";
      const auto out = output(t.name);
      if (out == c.outputs.end() || out->shape != t.shape || t.dtype != "f64")
        fail(fmt::format("{}: {} '{}' is not f64 of an output's name and shape", w, what, t.name.substr(0, 64)));
      if (!c.accept.contains(t.name) || c.accept[t.name].value("rule", "") != "bound")
        fail(fmt::format("{}: {} '{}' belongs to no bound rule", w, what, t.name));
      if (list == &c.bound)
        for (int64_t i = 0; i < t.numel(); ++i) {
          const double b = element_as_double(t, i);
          if (!std::isfinite(b) || !(b >= 0))
            fail(fmt::format("{}: bound '{}' element {} is {} (a bound is finite and >= 0)", w, t.name, i, b));
        }
    }
}

// Rules every file meets, with or without a manifest: the ranks attribute agrees with the mesh and with /ranks.
void check_structure(const PrimitivesFile& f, const std::vector<std::string>& rank_groups) {
  if (!f.config.is_object()) fail("attribute 'config' is not a JSON object");
  if (!f.mesh.is_object()) fail("attribute 'mesh' is not a JSON object");
  if (f.mesh.contains("spec")) {
    if (!f.mesh["spec"].is_string()) fail("attribute 'mesh': 'spec' is not a string");
    const MeshShape ms = parse_mesh(f.mesh["spec"].get<std::string>());
    if (ms.world() != f.ranks)
      fail(fmt::format("attribute 'ranks' is {}, the mesh '{}' has {} ranks", f.ranks, f.mesh["spec"].get<std::string>(),
                       ms.world()));
  }
  for (const char* k : {"sequences", "seq_len", "ep_chunks"})
    if (f.mesh.contains(k) && (!f.mesh[k].is_number_integer() || f.mesh[k].get<int64_t>() < 1))
      fail(fmt::format("attribute 'mesh': '{}' is not an integer >= 1", k));
  if (static_cast<int64_t>(rank_groups.size()) != f.ranks)
    fail(fmt::format("attribute 'ranks' is {}, the file holds {} rank groups", f.ranks, rank_groups.size()));
  for (int r = 0; r < f.ranks; ++r)
    if (rank_groups[static_cast<size_t>(r)] != std::to_string(r))
      fail(fmt::format("/ranks: group '{}' where rank {} belongs", rank_groups[static_cast<size_t>(r)].substr(0, 64), r));
  const std::string cfg_policy = f.config.contains("policy") && f.config["policy"].is_string()
                                     ? f.config["policy"].get<std::string>()
                                     : std::string();
  // Case names per (rank, op) are c0, c1, ... in order, as the recorder names them: a deleted case in the middle is
  // an error even in a file without a manifest.
  std::map<std::pair<int, std::string>, std::set<std::string>> names;
  for (const PrimCase& c : f.cases) names[{c.rank, c.op}].insert(c.name);
  for (const auto& [key, set] : names)
    for (size_t i = 0; i < set.size(); ++i)
      if (!set.count(fmt::format("c{}", i)))
        fail(fmt::format("op {} of rank {}: {} cases but no case c{} (cases are named c0, c1, ...: one is missing or "
                         "renamed)",
                         key.second, key.first, set.size(), i));
  for (const PrimCase& c : f.cases) {
    if (c.policy != "" && c.policy != "fp32" && c.policy != "bf16" && c.policy != "fp64")
      fail(fmt::format("case {}/{} of rank {}: policy '{}'", c.op, c.name, c.rank, c.policy.substr(0, 64)));
    if (!c.policy.empty() && (c.policy == "fp64") != (c.dtype == "f64"))
      fail(fmt::format("case {}/{} of rank {}: policy {} with dtype {}", c.op, c.name, c.rank, c.policy, c.dtype));
    if (!cfg_policy.empty() && (cfg_policy == "fp64") != (c.dtype == "f64"))
      fail(fmt::format("case {}/{} of rank {}: dtype {}, the config's policy is {}", c.op, c.name, c.rank, c.dtype,
                       cfg_policy));
    for (const NamedTensor& sa : c.sum_abs) {
      const std::string w = fmt::format("case {}/{} of rank {}: sum_abs '{}'", c.op, c.name, c.rank, sa.name);
      const auto out = std::find_if(c.outputs.begin(), c.outputs.end(),
                                    [&](const NamedTensor& t) { return t.name == sa.name; });
      if (out == c.outputs.end() || out->shape != sa.shape)
        fail(fmt::format("{} has no output of its name and shape", w));
      if (sa.dtype != "f64" && sa.dtype != "f32") fail(fmt::format("{} is not floating point", w));
      const nlohmann::json* tol = c.tolerance.contains(sa.name) ? &c.tolerance[sa.name] : nullptr;
      if (!tol || !tol->is_object() || !c.n_terms.contains(sa.name) || !c.n_terms[sa.name].is_number_integer() ||
          c.n_terms[sa.name].get<int64_t>() < 0)
        fail(fmt::format("{}: its tolerance or n_terms entry is missing", w));
      for (const char* k : {"k_const", "k_per_term", "u"})
        if (!tol->contains(k) || !(*tol)[k].is_number() || !((*tol)[k].get<double>() >= 0))
          fail(fmt::format("{}: tolerance '{}' is not a number >= 0", w, k));
    }
    check_accept(c);
  }
}

// The isolated reader's result, child -> parent.
struct Wire {
  std::string b;
  size_t pos = 0;
  void u64(uint64_t v) { b.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void str(std::string_view s) {
    u64(s.size());
    b.append(s);
  }
  void tensors(const std::vector<NamedTensor>& ts) {
    u64(ts.size());
    for (const NamedTensor& t : ts) {
      str(t.name);
      str(t.dtype);
      u64(t.shape.size());
      for (int64_t d : t.shape) u64(static_cast<uint64_t>(d));
      str(std::string_view(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size()));
    }
  }
  [[noreturn]] static void broken() { fail("internal error: the isolated primitive reader sent a malformed result"); }
  uint64_t get() {
    if (b.size() - pos < 8) broken();
    uint64_t v;
    std::memcpy(&v, b.data() + pos, 8);
    pos += 8;
    return v;
  }
  std::string gets() {
    const uint64_t n = get();
    if (n > b.size() - pos) broken();
    std::string s = b.substr(pos, n);
    pos += n;
    return s;
  }
  std::vector<NamedTensor> get_tensors() {
    std::vector<NamedTensor> ts(get());
    for (NamedTensor& t : ts) {
      t.name = gets();
      t.dtype = gets();
      t.shape.resize(get());
      for (int64_t& d : t.shape) d = static_cast<int64_t>(get());
      const std::string bytes = gets();
      t.bytes.resize(bytes.size());
      if (!bytes.empty()) std::memcpy(t.bytes.data(), bytes.data(), bytes.size());
    }
    return ts;
  }
};
std::string encode(const PrimitivesFile& f) {
  Wire w;
  w.str(f.config.dump());
  w.str(f.mesh.dump());
  w.str(f.repro);
  w.u64(static_cast<uint64_t>(f.ranks));
  w.u64(f.checksum ? 1 : 0);
  w.u64(f.manifest ? 1 : 0);
  w.u64(f.cases.size());
  for (const PrimCase& c : f.cases) {
    for (const std::string* s : {&c.op, &c.name, &c.dtype, &c.policy, &c.repro}) w.str(*s);
    w.u64(static_cast<uint64_t>(c.rank));
    w.str(c.shapes.dump());
    w.str(c.n_terms.dump());
    w.str(c.tolerance.dump());
    w.str(c.accept.dump());
    w.tensors(c.inputs);
    w.tensors(c.outputs);
    w.tensors(c.sum_abs);
    w.tensors(c.oracle);
    w.tensors(c.bound);
  }
  w.u64(f.comm.size());
  for (const auto& rc : f.comm) {
    w.u64(rc.size());
    for (const CommRecord& r : rc) {
      w.str(r.op), w.str(r.comm), w.str(r.dtype);
      w.u64(r.seq), w.u64(r.count), w.u64(static_cast<uint64_t>(static_cast<int64_t>(r.peer))), w.u64(r.recv_hash);
    }
  }
  return std::move(w.b);
}
PrimitivesFile decode(std::string b) {
  Wire w{std::move(b)};
  PrimitivesFile f;
  f.config = nlohmann::json::parse(w.gets());
  f.mesh = nlohmann::json::parse(w.gets());
  f.repro = w.gets();
  f.ranks = static_cast<int>(w.get());
  f.checksum = w.get() != 0;
  f.manifest = w.get() != 0;
  f.cases.resize(w.get());
  for (PrimCase& c : f.cases) {
    for (std::string* s : {&c.op, &c.name, &c.dtype, &c.policy, &c.repro}) *s = w.gets();
    c.rank = static_cast<int>(w.get());
    c.shapes = nlohmann::json::parse(w.gets());
    c.n_terms = nlohmann::json::parse(w.gets());
    c.tolerance = nlohmann::json::parse(w.gets());
    c.accept = nlohmann::json::parse(w.gets());
    c.inputs = w.get_tensors();
    c.outputs = w.get_tensors();
    c.sum_abs = w.get_tensors();
    c.oracle = w.get_tensors();
    c.bound = w.get_tensors();
  }
  f.comm.resize(w.get());
  for (auto& rc : f.comm) {
    rc.resize(w.get());
    for (CommRecord& r : rc) {
      r.op = w.gets(), r.comm = w.gets(), r.dtype = w.gets();
      r.seq = w.get(), r.count = w.get(), r.peer = static_cast<int>(static_cast<int64_t>(w.get()));
      r.recv_hash = w.get();
    }
  }
  if (w.pos != w.b.size()) Wire::broken();
  return f;
}


}  // namespace

std::vector<CommRecord> comm_records(const RankTrace& trace) {
  std::vector<std::pair<int64_t, CommRecord>> all;
  for (const StreamTrace& st : trace)
    for (const TraceEntry& e : st.entries) {
      if (e.kind != TraceEntry::Kind::collective && e.kind != TraceEntry::Kind::send &&
          e.kind != TraceEntry::Kind::recv)
        continue;
      CommRecord r;
      r.op = e.name;
      r.comm = e.comm;
      r.seq = e.seq;
      r.count = e.count;
      r.dtype = std::string(to_string(e.dtype));
      r.peer = e.peer;
      r.recv_hash = e.recv_hash;
      all.emplace_back(e.issue, std::move(r));
    }
  std::stable_sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<CommRecord> out;
  for (auto& [i, r] : all) out.push_back(std::move(r));
  return out;
}

void write_primitives(const std::string& path, const PrimitivesFile& f, const WriteOptions& opt) {
  H5::Exception::dontPrint();
  io::StagedFile staged(path, "primitive golden");  // a private folder + rename (reference/atomic_write.h)
  const fs::path tmp(staged.path());
  try {
    {
      H5::FileCreatPropList fcpl;
      if (opt.checksum) fcpl.setUserblock(kChecksumBlock);  // the checksum header's room (docs/golden.md)
      H5::H5File file(tmp.string(), H5F_ACC_EXCL, fcpl);
      H5::Group root = file.openGroup("/");
      str_attr(root, "schema", "trident-primitives");
      int_attr(root, "schema_version", kPrimitivesSchemaVersion);
      str_attr(root, "generator", kGenerator);
      str_attr(root, "config", f.config.dump());
      str_attr(root, "mesh", f.mesh.dump());
      str_attr(root, "repro", f.repro);
      int_attr(root, "ranks", f.ranks);
      if (opt.checksum) str_attr(root, "manifest", manifest_of(f).dump());
      std::vector<const PrimCase*> r0;
      for (const PrimCase& c : f.cases)
        if (c.rank == 0) r0.push_back(&c);
      write_cases(root.getId(), r0);
      H5::Group ranks = ordered_group(root.getId(), "ranks");
      for (int r = 0; r < f.ranks; ++r) {
        H5::Group rg = ordered_group(ranks.getId(), std::to_string(r));
        if (r > 0) {
          std::vector<const PrimCase*> mine;
          for (const PrimCase& c : f.cases)
            if (c.rank == r) mine.push_back(&c);
          write_cases(rg.getId(), mine);
        }
        H5::Group cg = ordered_group(rg.getId(), "comm");
        const std::vector<CommRecord> none;
        const auto& recs = static_cast<size_t>(r) < f.comm.size() ? f.comm[static_cast<size_t>(r)] : none;
        std::vector<std::string> op, comm, dtype;
        std::vector<uint64_t> seq, count, hash;
        std::vector<int32_t> peer;
        for (const CommRecord& c : recs) {
          op.push_back(c.op), comm.push_back(c.comm), dtype.push_back(c.dtype);
          seq.push_back(c.seq), count.push_back(c.count), hash.push_back(c.recv_hash), peer.push_back(c.peer);
        }
        write_strings(cg, "op", op);
        write_strings(cg, "comm", comm);
        write_column(cg, "seq", seq, H5::PredType::STD_U64LE, H5::PredType::NATIVE_UINT64);
        write_column(cg, "count", count, H5::PredType::STD_U64LE, H5::PredType::NATIVE_UINT64);
        write_strings(cg, "dtype", dtype);
        write_column(cg, "peer", peer, H5::PredType::STD_I32LE, H5::PredType::NATIVE_INT32);
        write_column(cg, "recv_hash", hash, H5::PredType::STD_U64LE, H5::PredType::NATIVE_UINT64);
      }
      file.flush(H5F_SCOPE_GLOBAL);
    }
    if (opt.checksum) seal_checksum(tmp.string());
    staged.commit();
  } catch (const H5::Exception& e) {
    fail(fmt::format("cannot write '{}': HDF5: {} ({})", path, e.getDetailMsg(), e.getFuncName()));
  }
}

namespace {

PrimitivesFile read_in_process(const std::string& path, uint64_t file_size) {
  H5::Exception::dontPrint();
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const Checksum sum = verify_checksum_of(path, "primitive golden");
  check_global_heaps(path, file_size, sum == Checksum::absent ? 0 : kChecksumBlock, "primitive golden");
  try {
    if (!H5::H5File::isHdf5(path)) fail("not an HDF5 file");
    H5::H5File file(path, H5F_ACC_RDONLY);
    H5::Group root = file.openGroup("/");
    if (!root.attrExists("schema") || read_str_attr(root, "schema") != "trident-primitives")
      fail("not a primitives file (its root attribute 'schema' is not \"trident-primitives\")");
    const int64_t ver = read_int_attr(root, "schema_version");
    if (ver != kPrimitivesSchemaVersion)
      fail(fmt::format("schema_version {} is not supported (this reader knows {})", ver, kPrimitivesSchemaVersion));
    PrimitivesFile f;
    f.checksum = sum == Checksum::ok;
    f.config = json_attr(root, "config");
    f.mesh = json_attr(root, "mesh");
    f.repro = read_str_attr(root, "repro");
    const int64_t ranks = read_int_attr(root, "ranks");
    if (ranks < 1 || ranks > 65536) fail(fmt::format("attribute 'ranks' is {}", ranks));
    f.ranks = static_cast<int>(ranks);
    Budget budget{file_size, 0};
    read_cases(root, 0, f.cases, budget, "/");
    H5::Group rs = open_group(root, "ranks", "/");
    const std::vector<std::string> rank_groups = children(rs, "/ranks");
    if (static_cast<int64_t>(rank_groups.size()) != f.ranks)
      fail(fmt::format("attribute 'ranks' is {}, the file holds {} rank groups", f.ranks, rank_groups.size()));
    for (int r = 0; r < f.ranks; ++r) {
      const std::string rn = std::to_string(r);
      if (rank_groups[static_cast<size_t>(r)] != rn)
        fail(fmt::format("/ranks: group '{}' where rank {} belongs", rank_groups[static_cast<size_t>(r)].substr(0, 64),
                         r));
      H5::Group rg = open_group(rs, rn, "/ranks");
      if (r > 0) read_cases(rg, r, f.cases, budget, fmt::format("/ranks/{}/", r));
      else if (rg.nameExists("primitives")) fail("/ranks/0: rank 0's cases belong in /primitives");
      f.comm.push_back(read_comm(rg, "/ranks/" + rn, budget));
    }
    if (root.attrExists("manifest")) {
      check_manifest(f, json_attr(root, "manifest"));
      f.manifest = true;
    } else if (f.checksum) {
      fail("the root attribute 'manifest' is missing (a file with a checksum always has one)");
    }
    check_structure(f, rank_groups);
    return f;
  } catch (const H5::Exception& e) {
    fail(fmt::format("cannot read primitive golden '{}': HDF5: {} ({})", path, e.getDetailMsg(), e.getFuncName()));
  } catch (const nlohmann::json::exception& e) {
    fail(fmt::format("cannot read primitive golden '{}': {}", path, e.what()));
  } catch (const std::bad_alloc&) {
    fail(fmt::format("cannot read primitive golden '{}': out of memory", path));
  } catch (const std::length_error& e) {
    fail(fmt::format("cannot read primitive golden '{}': {}", path, e.what()));
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.rfind("cannot read", 0) == 0) throw;
    fail(fmt::format("cannot read primitive golden '{}': {}", path, what));
  }
}

}  // namespace

PrimitivesFile read_primitives(const std::string& path, const ReadOptions& opt) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) fail(fmt::format("cannot read primitive golden '{}': no such file", path));
  const uint64_t size = fs::file_size(path, ec);
  if (ec) fail(fmt::format("cannot read primitive golden '{}': {}", path, ec.message()));
  std::string b;
  // A primitive golden holds thousands of small objects: it parses in about a second (3.5 MB) on an idle machine,
  // many times that on a loaded one. The limit only has to end a parser stuck in a loop: 60 s plus 1 s per MB.
  const double limit_s = 60.0 + static_cast<double>(size) / 1e6;
  if (opt.isolate &&
      run_isolated(path, size, "primitive golden", [&] { return encode(read_in_process(path, size)); }, b, limit_s))
    return decode(std::move(b));
  return read_in_process(path, size);
}

nlohmann::json CheckSummary::to_json() const {
  nlohmann::json j;
  j["cases"] = cases;
  j["passed"] = passed;
  j["ops"] = ops_checked;
  j["failures"] = nlohmann::json::array();
  for (const CaseFailure& f : failures)
    j["failures"].push_back({{"op", f.op},       {"case", f.name},   {"rank", f.rank},   {"output", f.output},
                             {"index", f.index}, {"got", f.got},     {"want", f.want},   {"bound", f.bound},
                             {"message", f.message}, {"repro", f.repro}});
  j["per_output"] = report_json(report);
  return j;
}

const NamedTensor* matching_output(const std::vector<NamedTensor>& got, const NamedTensor& want, const PrimCase& c,
                                   CaseFailure& fl) {
  fl.output = want.name;
  auto it = std::find_if(got.begin(), got.end(), [&](const NamedTensor& t) { return t.name == want.name; });
  if (it != got.end() && it->shape == want.shape && it->dtype == want.dtype) return &*it;
  fl.message = fmt::format("{}/{} (rank {}): output '{}' missing or of another shape/dtype", c.op, c.name, c.rank,
                           want.name);
  return nullptr;
}

bool case_selected(const PrimCase& c, const CheckOptions& opt, const std::string& want_dtype, CheckSummary& sum) {
  if (c.dtype != want_dtype) return false;
  if (!opt.only_op.empty() && c.op != opt.only_op) return false;
  if (!opt.only_case.empty() && c.name != opt.only_case) return false;
  if (opt.only_rank >= 0 && c.rank != opt.only_rank) return false;
  ++sum.cases;
  if (std::find(sum.ops_checked.begin(), sum.ops_checked.end(), c.op) == sum.ops_checked.end())
    sum.ops_checked.push_back(c.op);
  return true;
}

CaseFailure case_failure(const PrimCase& c, const CheckOptions& opt, const std::string& golden_path) {
  CaseFailure fl;
  fl.op = c.op, fl.name = c.name, fl.rank = c.rank;
  fl.repro = fmt::format("trident check {} --backend {} --op {} --case {}{}", golden_path, opt.backend, c.op, c.name,
                         c.rank > 0 ? fmt::format(" --rank {}", c.rank) : std::string());
  return fl;
}

template <class T>
bool run_checked(const PrimCase& c, Kernels<T>& k, Device& dev, CaseFailure& fl, CheckSummary& sum,
                 std::vector<NamedTensor>& got) {
  try {
    got = run_case<T>(c, k, dev);
    return true;
  } catch (const Error& e) {
    fl.message = fmt::format("{}/{} (rank {}): the backend failed: {}", c.op, c.name, c.rank, e.what());
    sum.failures.push_back(fl);
    return false;
  }
}
template bool run_checked<float>(const PrimCase&, Kernels<float>&, Device&, CaseFailure&, CheckSummary&,
                                 std::vector<NamedTensor>&);
template bool run_checked<double>(const PrimCase&, Kernels<double>&, Device&, CaseFailure&, CheckSummary&,
                                  std::vector<NamedTensor>&);

template <class T>
CheckSummary check_primitives(const PrimitivesFile& f, const KernelsFactory<T>& factory, const CheckOptions& opt,
                              const std::string& golden_path, Device* device) {
  CheckSummary sum;
  RankTrace trace;
  emu::EmuDevice emu_dev(0, trace, emu::DeviceOptions{.record_trace = false});
  Device& dev = device ? *device : emu_dev;
  std::unique_ptr<Kernels<T>> k = factory(dev);
  const std::string want_dtype = sizeof(T) == 8 ? "f64" : "f32";
  for (const PrimCase& c : f.cases) {
    if (!case_selected(c, opt, want_dtype, sum)) continue;
    CaseFailure fl = case_failure(c, opt, golden_path);
    std::vector<NamedTensor> got;
    if (!run_checked<T>(c, *k, dev, fl, sum, got)) continue;
    bool ok = true;
    for (const NamedTensor& want : c.outputs) {  // every output judged (the report), the first failure recorded
      const NamedTensor* it = matching_output(got, want, c, fl);
      if (!it) {
        if (ok) sum.failures.push_back(fl);
        ok = false;
        OutputVerdict v;
        v.rule = "bitwise", v.pass = false, v.worst_ratio = INFINITY;
        add_to_report(sum.report, c, want.name, v);
        continue;
      }
      const OutputVerdict v = judge_output(c, *it, want, opt.bitwise);
      add_to_report(sum.report, c, want.name, v);
      if (v.pass || !ok) continue;
      ok = false;
      fl.output = want.name;
      fl.index = v.index, fl.got = v.got, fl.want = v.want, fl.bound = v.bound;
      fl.message = v.message;
      sum.failures.push_back(fl);
    }
    if (ok) ++sum.passed;
  }
  return sum;
}

template CheckSummary check_primitives<float>(const PrimitivesFile&, const KernelsFactory<float>&, const CheckOptions&,
                                              const std::string&, Device*);
template CheckSummary check_primitives<double>(const PrimitivesFile&, const KernelsFactory<double>&,
                                               const CheckOptions&, const std::string&, Device*);

}  // namespace trident::golden
