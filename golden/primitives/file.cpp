// primitives.h5: writer, reader, communication records and the checker (docs/golden.md "Primitive goldens").
#include <H5Cpp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>

#include <unistd.h>

#include "emulator/device.h"
#include "golden/primitives/primitives.h"
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
  str_attr(g, "repro", c.repro);
  int_attr(g, "rank", c.rank);
  for (auto [name, list] : {std::pair{"inputs", &c.inputs}, std::pair{"outputs", &c.outputs},
                            std::pair{"sum_abs", &c.sum_abs}}) {
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

// ---- reading
std::string read_str_attr(const H5::H5Object& o, const char* name) {
  if (!o.attrExists(name)) fail(fmt::format("attribute '{}' missing", name));
  H5::Attribute a = o.openAttribute(name);
  if (a.getTypeClass() != H5T_STRING) fail(fmt::format("attribute '{}' is not a string", name));
  std::string s;
  a.read(a.getStrType(), s);
  return s;
}
int64_t read_int_attr(const H5::H5Object& o, const char* name) {
  if (!o.attrExists(name)) fail(fmt::format("attribute '{}' missing", name));
  H5::Attribute a = o.openAttribute(name);
  if (a.getTypeClass() != H5T_INTEGER || a.getSpace().getSimpleExtentNpoints() != 1)
    fail(fmt::format("attribute '{}' is not one integer", name));
  int64_t v = 0;
  a.read(H5::PredType::NATIVE_INT64, &v);
  return v;
}
std::vector<std::string> children(const H5::Group& g) {
  std::vector<std::string> out;
  const hsize_t n = g.getNumObjs();
  hid_t gid = g.getId();
  H5_index_t idx = H5_INDEX_NAME;
  hid_t gcpl = H5Gget_create_plist(gid);
  unsigned flags = 0;
  if (gcpl >= 0 && H5Pget_link_creation_order(gcpl, &flags) >= 0 && (flags & H5P_CRT_ORDER_INDEXED))
    idx = H5_INDEX_CRT_ORDER;
  if (gcpl >= 0) H5Pclose(gcpl);
  for (hsize_t i = 0; i < n; ++i) {
    const ssize_t len = H5Lget_name_by_idx(gid, ".", idx, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (len <= 0 || len > 4096) fail("a link name is empty or too long");
    std::string name(static_cast<size_t>(len), '\0');
    H5Lget_name_by_idx(gid, ".", idx, H5_ITER_INC, i, name.data(), static_cast<size_t>(len) + 1, H5P_DEFAULT);
    out.push_back(name);
  }
  return out;
}
NamedTensor read_tensor(const H5::Group& g, const std::string& name, const std::string& where) {
  H5::DataSet ds = g.openDataSet(name);
  NamedTensor t;
  t.name = name;
  t.dtype = read_str_attr(ds, "dtype");
  const H5::DataType& ft = ftype(t.dtype);
  H5::DataType actual = ds.getDataType();
  if (actual.getClass() != ft.getClass() || actual.getSize() != ft.getSize())
    fail(fmt::format("{}: stored type does not match its dtype '{}'", where, t.dtype));
  H5::DataSpace sp = ds.getSpace();
  const int rank = sp.getSimpleExtentNdims();
  if (rank < 0 || rank > 8) fail(fmt::format("{}: rank {} not supported", where, rank));
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (rank > 0) sp.getSimpleExtentDims(dims.data());
  int64_t n = 1;
  for (hsize_t d : dims) {
    if (d > (hsize_t{1} << 40)) fail(fmt::format("{}: dimension {} too large", where, d));
    t.shape.push_back(static_cast<int64_t>(d));
    n *= static_cast<int64_t>(d);
    if (n > (int64_t{1} << 32)) fail(fmt::format("{}: too many elements", where));
  }
  t.bytes.resize(static_cast<size_t>(n) * esize(t.dtype));
  if (n > 0) ds.read(t.bytes.data(), mtype(t.dtype));
  return t;
}
nlohmann::json json_attr(const H5::H5Object& o, const char* name) {
  return nlohmann::json::parse(read_str_attr(o, name));
}
void read_cases(const H5::Group& parent, int rank, std::vector<PrimCase>& out) {
  if (!parent.nameExists("primitives")) return;
  H5::Group prims = parent.openGroup("primitives");
  for (const std::string& op : children(prims)) {
    H5::Group opg = prims.openGroup(op);
    for (const std::string& cn : children(opg)) {
      const std::string where = fmt::format("primitives/{}/{}", op, cn);
      H5::Group g = opg.openGroup(cn);
      PrimCase c;
      c.op = op;
      c.name = cn;
      c.rank = rank;
      c.dtype = read_str_attr(g, "dtype");
      if (c.dtype != "f32" && c.dtype != "f64") fail(fmt::format("{}: dtype '{}' is not f32 or f64", where, c.dtype));
      c.policy = read_str_attr(g, "policy");
      c.shapes = json_attr(g, "shapes");
      c.n_terms = json_attr(g, "n_terms");
      c.tolerance = json_attr(g, "tolerance");
      c.repro = read_str_attr(g, "repro");
      for (auto [name, list] : {std::pair{"inputs", &c.inputs}, std::pair{"outputs", &c.outputs},
                                std::pair{"sum_abs", &c.sum_abs}}) {
        if (!g.nameExists(name)) fail(fmt::format("{}: group '{}' missing", where, name));
        H5::Group sub = g.openGroup(name);
        for (const std::string& tn : children(sub)) list->push_back(read_tensor(sub, tn, where + "/" + name + "/" + tn));
      }
      out.push_back(std::move(c));
    }
  }
}

std::string fmt_double(double v) { return fmt::format("{:.9g}", v); }

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

void write_primitives(const std::string& path, const PrimitivesFile& f) {
  H5::Exception::dontPrint();
  io::StagedFile staged(path, "primitive golden");  // a private folder + rename (reference/atomic_write.h)
  const fs::path tmp(staged.path());
  try {
    {
      H5::H5File file(tmp.string(), H5F_ACC_EXCL);
      H5::Group root = file.openGroup("/");
      str_attr(root, "schema", "trident-primitives");
      int_attr(root, "schema_version", kPrimitivesSchemaVersion);
      str_attr(root, "generator", kGenerator);
      str_attr(root, "config", f.config.dump());
      str_attr(root, "mesh", f.mesh.dump());
      str_attr(root, "repro", f.repro);
      int_attr(root, "ranks", f.ranks);
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
    staged.commit();
  } catch (const H5::Exception& e) {
    fail(fmt::format("cannot write '{}': HDF5: {} ({})", path, e.getDetailMsg(), e.getFuncName()));
  }
}

PrimitivesFile read_primitives(const std::string& path) {
  H5::Exception::dontPrint();
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) fail(fmt::format("cannot read primitive golden '{}': no such file", path));
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
    f.config = json_attr(root, "config");
    f.mesh = json_attr(root, "mesh");
    f.repro = read_str_attr(root, "repro");
    const int64_t ranks = read_int_attr(root, "ranks");
    if (ranks < 1 || ranks > 65536) fail(fmt::format("attribute 'ranks' is {}", ranks));
    f.ranks = static_cast<int>(ranks);
    read_cases(root, 0, f.cases);
    if (root.nameExists("ranks")) {
      H5::Group rs = root.openGroup("ranks");
      for (int r = 0; r < f.ranks; ++r) {
        const std::string rn = std::to_string(r);
        if (!rs.nameExists(rn)) continue;
        H5::Group rg = rs.openGroup(rn);
        if (r > 0) read_cases(rg, r, f.cases);
      }
    }
    return f;
  } catch (const H5::Exception& e) {
    fail(fmt::format("cannot read primitive golden '{}': HDF5: {} ({})", path, e.getDetailMsg(), e.getFuncName()));
  } catch (const nlohmann::json::exception& e) {
    fail(fmt::format("cannot read primitive golden '{}': {}", path, e.what()));
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.rfind("cannot read", 0) == 0) throw;
    fail(fmt::format("cannot read primitive golden '{}': {}", path, what));
  }
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
    for (const NamedTensor& want : c.outputs) {
      const NamedTensor* it = matching_output(got, want, c, fl);
      if (!it) {
        ok = false;
        break;
      }
      const NamedTensor* sa = nullptr;
      for (const NamedTensor& s : c.sum_abs)
        if (s.name == want.name) sa = &s;
      const bool bits = opt.bitwise || !sa;
      const int64_t n = want.numel();
      const size_t es = esize(want.dtype);
      // worst violation: bitwise -> first differing element; bound -> largest |err| / bound
      int64_t bad = -1;
      double worst = 0, bound_at = 0;
      for (int64_t i = 0; i < n; ++i) {
        const std::byte* a = it->bytes.data() + static_cast<size_t>(i) * es;
        const std::byte* b = want.bytes.data() + static_cast<size_t>(i) * es;
        if (std::memcmp(a, b, es) == 0) continue;
        if (bits) {
          bad = i;
          break;
        }
        const double x = element_as_double(*it, i), y = element_as_double(want, i);
        const nlohmann::json& tol = c.tolerance.at(want.name);
        const double bound = (tol.at("k_const").get<double>() +
                              tol.at("k_per_term").get<double>() * c.n_terms.at(want.name).get<double>()) *
                             tol.at("u").get<double>() * element_as_double(*sa, i);
        const double err = std::fabs(x - y);
        if (!(err <= bound)) {
          const double ratio = bound > 0 ? err / bound : INFINITY;
          if (bad < 0 || ratio > worst || std::isnan(ratio)) bad = i, worst = ratio, bound_at = bound;
        }
      }
      if (bad >= 0) {
        fl.index = bad;
        fl.got = element_as_double(*it, bad);
        fl.want = element_as_double(want, bad);
        fl.bound = bits ? 0 : bound_at;
        fl.message = bits ? fmt::format("{}/{} (rank {}): output '{}' differs at element {}: got {}, golden {} "
                                        "(bitwise contract)",
                                        c.op, c.name, c.rank, want.name, bad, fmt_double(fl.got), fmt_double(fl.want))
                          : fmt::format("{}/{} (rank {}): output '{}' element {}: got {}, golden {}, |err| {} > "
                                        "bound {}",
                                        c.op, c.name, c.rank, want.name, bad, fmt_double(fl.got), fmt_double(fl.want),
                                        fmt_double(std::fabs(fl.got - fl.want)), fmt_double(bound_at));
        ok = false;
        break;
      }
    }
    if (ok)
      ++sum.passed;
    else
      sum.failures.push_back(fl);
  }
  return sum;
}

template CheckSummary check_primitives<float>(const PrimitivesFile&, const KernelsFactory<float>&, const CheckOptions&,
                                              const std::string&, Device*);
template CheckSummary check_primitives<double>(const PrimitivesFile&, const KernelsFactory<double>&,
                                               const CheckOptions&, const std::string&, Device*);

}  // namespace trident::golden
