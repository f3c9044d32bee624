// Checkpoints (golden/checkpoint.h, docs/checkpoints.md).
#include "golden/checkpoint.h"

#include <H5Cpp.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <type_traits>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "golden/read_guard.h"
#include "golden/state_dump.h"
#include "parallel/shard.h"
#include "platform/files.h"
#include "reference/check.h"
#include "reference/model/params.h"

namespace trident::golden {

namespace fs = std::filesystem;
namespace md = trident::model;
using json = nlohmann::json;

namespace {

CheckpointSaveHook g_hook;

constexpr int64_t kMaxManifestBytes = int64_t{64} << 20;

template <class T>
const char* dtype_of() {
  return std::is_same_v<T, double> ? "f64" : "f32";
}

std::string rank_file(int64_t r) { return fmt::format("rank_{:05d}.h5", r); }

std::string errno_text() { return std::strerror(errno); }

// fsync a file or a directory by path.
void sync_path(const fs::path& p, bool dir) {
  const int fd = ::open(p.c_str(), dir ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) fail(fmt::format("cannot open '{}' to sync it: {}", p.string(), errno_text()));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) fail(fmt::format("fsync of '{}' failed: {}", p.string(), std::strerror(err)));
}

// Size and CRC-32 of a whole file.
std::pair<int64_t, uint32_t> size_and_crc(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) fail(fmt::format("cannot read '{}'", p.string()));
  std::vector<char> buf(1 << 20);
  uint32_t crc = 0;
  int64_t n = 0;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize got = in.gcount();
    if (got <= 0) break;
    crc = crc32(std::span<const std::byte>(reinterpret_cast<const std::byte*>(buf.data()), static_cast<size_t>(got)),
                crc);
    n += got;
  }
  return {n, crc};
}

std::string hex32(uint32_t v) { return fmt::format("{:08x}", v); }

// The manifest's own checksum: CRC-32 of its compact dump without the "checksum" key (keys sorted: deterministic).
uint32_t manifest_crc(json j) {
  j.erase("checksum");
  const std::string s = j.dump();
  return crc32(std::span<const std::byte>(reinterpret_cast<const std::byte*>(s.data()), s.size()));
}

json mesh_json(const MeshShape& m) {
  return json{{"d_rep", m.d_rep}, {"fsdp", m.fsdp}, {"cp", m.cp}, {"e_fsdp", m.e_fsdp}, {"ep", m.ep}};
}

fs::path target_path(const std::string& dir) {
  fs::path target = fs::path(dir).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();  // "dir/"
  return target;
}

// ---- writing -----------------------------------------------------------------------------------------------------
template <class T>
void write_rank_file(const fs::path& path, const md::Config& cfg, const std::vector<md::ParamInfo>& info,
                     const MeshShape& mesh, int64_t rank, const ShardState<T>& st) {
  const H5::PredType& ft = std::is_same_v<T, double> ? H5::PredType::IEEE_F64LE : H5::PredType::IEEE_F32LE;
  const H5::PredType& mt = std::is_same_v<T, double> ? H5::PredType::NATIVE_DOUBLE : H5::PredType::NATIVE_FLOAT;
  H5::H5File f(path.string(), H5F_ACC_EXCL);
  {
    H5::Attribute a = f.createAttribute("rank", H5::PredType::STD_I64LE, H5::DataSpace(H5S_SCALAR));
    a.write(H5::PredType::NATIVE_INT64, &rank);
    H5::Attribute b = f.createAttribute("step", H5::PredType::STD_I64LE, H5::DataSpace(H5S_SCALAR));
    b.write(H5::PredType::NATIVE_INT64, &st.step);
  }
  H5::Group groups[3] = {f.createGroup("params"), f.createGroup("exp_avg"), f.createGroup("exp_avg_sq")};
  const std::vector<std::vector<T>>* data[3] = {&st.w, &st.m, &st.v};
  for (size_t p = 0; p < info.size(); ++p) {
    const ParamPlacement pl = place(info[p], mesh, cfg.experts, rank);
    if (!pl.owner) continue;
    std::vector<hsize_t> dims(pl.shape.begin(), pl.shape.end());
    for (int g = 0; g < 3; ++g) {
      if (g > 0 && !info[p].trainable) continue;
      const std::vector<T>& v = (*data[g])[p];
      TD_CHECK_EQ(static_cast<int64_t>(v.size()), pl.valid_elems(), "checkpoint: rank {} part of {}", rank,
                  info[p].name);
      H5::DataSpace space(static_cast<int>(dims.size()), dims.data());
      H5::DataSet ds = groups[g].createDataSet(info[p].name, ft, space);
      if (!v.empty()) ds.write(v.data(), mt);
    }
  }
}

template <class T>
void save_impl(const std::string& dir, const CheckpointMeta& meta, const std::vector<ShardState<T>>& ranks) {
  meta.cfg.validate();
  constexpr bool is_f64 = std::is_same_v<T, double>;
  TD_CHECK(is_f64 == (meta.cfg.policy == Policy::fp64),
           "checkpoint: policy {} with {} tensors", to_string(meta.cfg.policy), dtype_of<T>());
  const int64_t W = meta.mesh.world();
  TD_CHECK_EQ(static_cast<int64_t>(ranks.size()), W, "checkpoint: rank states for mesh {}", meta.mesh.str());
  for (const ShardState<T>& r : ranks)
    TD_CHECK_EQ(r.step, meta.step, "checkpoint: a rank's step counter vs the run's");
  const std::vector<md::ParamInfo> info = md::param_layout(meta.cfg);
  check_save_target(dir);
  const fs::path target = target_path(dir);
  const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  std::error_code ec;
  // A private sibling with a random name, created exclusively (mkdtemp, mode 0700): nothing planted next to DIR can
  // stand in for it (docs/security.md section 1).
  auto private_dir = [&](const char* kind) {
    std::string t = (parent / fmt::format(".{}.{}-XXXXXX", target.filename().string(), kind)).string();
    if (::mkdtemp(t.data()) == nullptr)
      fail(fmt::format("cannot save checkpoint '{}': cannot create a folder in '{}': {}", dir, parent.string(),
                       errno_text()));
    return fs::path(t);
  };
  const fs::path tmp = private_dir("tmp");
  try {
    json files = json::array();
    for (int64_t r = 0; r < W; ++r) {
      const fs::path fp = tmp / rank_file(r);
      try {
        H5::Exception::dontPrint();
        write_rank_file<T>(fp, meta.cfg, info, meta.mesh, r, ranks[static_cast<size_t>(r)]);
      } catch (const H5::Exception& e) {
        fail(fmt::format("cannot write '{}': HDF5: {}", fp.string(), e.getDetailMsg()));
      }
      sync_path(fp, false);
      const auto [bytes, crc] = size_and_crc(fp);
      files.push_back(json{{"path", rank_file(r)}, {"rank", r}, {"bytes", bytes}, {"crc32", hex32(crc)}});
      if (g_hook) g_hook(rank_file(r));
    }
    json tensors = json::array();
    for (const md::ParamInfo& in : info)
      tensors.push_back(json{{"name", in.name},
                             {"shape", in.shape},
                             {"kind", to_string(place(in, meta.mesh, meta.cfg.experts, 0).kind)},
                             {"trainable", in.trainable}});
    json m{{"format", kCheckpointFormat},
           {"version", kCheckpointVersion},
           {"generator", kGenerator},
           {"writer", meta.writer},
           {"config", meta.cfg.to_json()},
           {"run", meta.run.to_json()},
           {"dtype", dtype_of<T>()},
           {"mesh", mesh_json(meta.mesh)},
           {"mesh_spec", meta.mesh.spec()},
           {"ep_chunks", meta.ep_chunks},
           {"vocab_slices", meta.vocab_slices},
           {"step", meta.step},
           {"data", json{{"kind", "synthetic"}, {"seed", meta.run.data_seed}, {"next_step", meta.step}}},
           {"tensors", tensors},
           {"files", files}};
    m["checksum"] = hex32(manifest_crc(m));
    const fs::path mp = tmp / "manifest.json";
    {
      std::ofstream out(mp, std::ios::binary | std::ios::trunc);
      out << m.dump(1) << "\n";
      out.close();
      if (!out) fail(fmt::format("cannot write '{}'", mp.string()));
    }
    sync_path(mp, false);
    if (g_hook) g_hook("manifest.json");
    sync_path(tmp, true);
    if (g_hook) g_hook("install");
    if (!fs::exists(target, ec)) {
      if (::rename(tmp.c_str(), target.c_str()) != 0)
        fail(fmt::format("cannot rename '{}' to '{}': {}", tmp.string(), target.string(), errno_text()));
    } else {
      // Atomic swap: at every instant DIR is either the old checkpoint or the new one.
      if (platform::rename_exchange(tmp.c_str(), target.c_str()) == 0) {
        fs::remove_all(tmp, ec);  // now the old checkpoint
      } else if (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP) {
        // A file system (or system) without an atomic exchange: move the old one aside first. A crash between the two renames
        // leaves no DIR, and the old checkpoint complete at .NAME.old-PID-N (docs/checkpoints.md).
        const fs::path old = private_dir("old");  // empty: the rename below replaces it
        if (::rename(target.c_str(), old.c_str()) != 0)
          fail(fmt::format("cannot rename '{}' to '{}': {}", target.string(), old.string(), errno_text()));
        if (::rename(tmp.c_str(), target.c_str()) != 0) {
          const std::string why = errno_text();
          (void)::rename(old.c_str(), target.c_str());
          fail(fmt::format("cannot rename '{}' to '{}': {}", tmp.string(), target.string(), why));
        }
        fs::remove_all(old, ec);
      } else {
        fail(fmt::format("cannot exchange '{}' with '{}': {}", tmp.string(), target.string(), errno_text()));
      }
    }
    sync_path(parent, true);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

// ---- reading -----------------------------------------------------------------------------------------------------
struct Manifest {
  CheckpointMeta meta;
  std::string dtype;
  std::vector<std::tuple<std::string, int64_t, uint32_t>> files;  // path, bytes, crc
};

Manifest read_manifest(const std::string& dir) {
  const fs::path d(dir);
  std::error_code ec;
  if (!fs::exists(d, ec)) fail(fmt::format("checkpoint '{}': no such directory", dir));
  if (!fs::is_directory(d, ec)) fail(fmt::format("checkpoint '{}': not a directory", dir));
  const fs::path mp = d / "manifest.json";
  if (!fs::exists(mp, ec))
    fail(fmt::format("checkpoint '{}': manifest.json is missing (not a checkpoint, or a save that did not finish)",
                     dir));
  const auto size = fs::file_size(mp, ec);
  if (ec || size > static_cast<uintmax_t>(kMaxManifestBytes))
    fail(fmt::format("checkpoint '{}': manifest.json is unreadable or larger than {} bytes", dir, kMaxManifestBytes));
  std::ifstream in(mp, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string where = fmt::format("checkpoint '{}': manifest.json", dir);
  Manifest out;
  try {
    const json j = json::parse(ss.str());
    if (!j.is_object()) fail(where + ": not a JSON object");
    if (!j.contains("checksum") || !j["checksum"].is_string())
      fail(where + ": no checksum (not a trident checkpoint manifest)");
    if (j["checksum"].get<std::string>() != hex32(manifest_crc(j)))
      fail(fmt::format("{}: checksum mismatch (crc32 {}, the manifest says {}): the file is corrupt or was edited",
                       where, hex32(manifest_crc(j)), j["checksum"].get<std::string>()));
    if (j.value("format", "") != kCheckpointFormat) fail(where + ": format is not " + kCheckpointFormat);
    // Every field is checked, the ones loading does not use too: exactly the keys a save writes.
    static const std::set<std::string> keys = {"format", "version", "generator", "writer", "config", "run",
                                               "dtype", "mesh", "mesh_spec", "ep_chunks", "vocab_slices", "step",
                                               "data", "tensors", "files", "checksum"};
    for (auto it = j.begin(); it != j.end(); ++it)
      if (!keys.count(it.key())) fail(fmt::format("{}: unknown key '{}'", where, it.key().substr(0, 64)));
    for (const std::string& k : keys)
      if (!j.contains(k)) fail(fmt::format("{}: key '{}' is missing", where, k));
    if (!j.at("generator").is_string() || j.at("generator").get<std::string>().rfind("trident ", 0) != 0)
      fail(where + ": generator is not a trident version string");
    if (j.at("version").get<int>() != kCheckpointVersion)
      fail(fmt::format("{}: version {} (this build reads version {})", where, j.at("version").get<int>(),
                       kCheckpointVersion));
    CheckpointMeta& m = out.meta;
    m.writer = j.at("writer").get<std::string>();
    if (m.writer != "train" && m.writer != "emulate")
      fail(fmt::format("{}: writer '{}' (train or emulate)", where, m.writer.substr(0, 64)));
    m.cfg = md::Config::from_json(j.at("config"));
    m.run = md::RunConfig::from_json(j.at("run"));
    m.mesh = parse_mesh(j.at("mesh_spec").get<std::string>());
    if (mesh_json(m.mesh) != j.at("mesh")) fail(where + ": mesh and mesh_spec disagree");
    validate(m.mesh, {.experts = m.cfg.experts}, InputNames{});
    m.ep_chunks = j.at("ep_chunks").get<int64_t>();
    m.vocab_slices = j.at("vocab_slices").get<int64_t>();
    if (m.ep_chunks < 1 || m.ep_chunks > (int64_t{1} << 20))
      fail(fmt::format("{}: ep_chunks {} outside [1, 2^20]", where, m.ep_chunks));
    if (m.vocab_slices < 0 || m.vocab_slices > (int64_t{1} << 20))
      fail(fmt::format("{}: vocab_slices {} outside [0, 2^20]", where, m.vocab_slices));
    m.step = j.at("step").get<int64_t>();
    if (m.step < 0 || m.step > (int64_t{1} << 40)) fail(fmt::format("{}: step {} outside [0, 2^40]", where, m.step));
    const json& data = j.at("data");
    if (!data.is_object() || data.size() != 3 || data.value("kind", "") != "synthetic")
      fail(where + ": data is not {kind: synthetic, seed, next_step}");
    if (j.at("data").at("next_step").get<int64_t>() != m.step || j.at("data").at("seed").get<uint64_t>() !=
                                                                      m.run.data_seed)
      fail(where + ": data position or seed disagree with step / run.data_seed");
    out.dtype = j.at("dtype").get<std::string>();
    const std::string want = m.cfg.policy == Policy::fp64 ? "f64" : "f32";
    if (out.dtype != want) fail(fmt::format("{}: dtype {} for policy {}", where, out.dtype, to_string(m.cfg.policy)));
    const std::vector<md::ParamInfo> info = md::param_layout(m.cfg);
    const json& ts = j.at("tensors");
    if (!ts.is_array() || ts.size() != info.size())
      fail(fmt::format("{}: {} tensors listed, the config has {}", where, ts.is_array() ? ts.size() : 0, info.size()));
    for (size_t p = 0; p < info.size(); ++p) {
      if (!ts[p].is_object() || ts[p].size() != 4 || ts[p].at("name").get<std::string>() != info[p].name ||
          ts[p].at("shape").get<std::vector<int64_t>>() != info[p].shape)
        fail(fmt::format("{}: tensor {} is not {} of the config's layout", where, p, info[p].name));
      const std::string kind(to_string(place(info[p], m.mesh, m.cfg.experts, 0).kind));
      if (ts[p].at("kind").get<std::string>() != kind)
        fail(fmt::format("{}: tensor {} ({}) has kind '{}', its placement is '{}'", where, p, info[p].name,
                         ts[p].at("kind").get<std::string>().substr(0, 64), kind));
      if (ts[p].at("trainable").get<bool>() != info[p].trainable)
        fail(fmt::format("{}: tensor {} ({}) has trainable {}, the config says {}", where, p, info[p].name,
                         ts[p].at("trainable").get<bool>(), info[p].trainable));
    }
    const json& fl = j.at("files");
    if (!fl.is_array() || static_cast<int64_t>(fl.size()) != m.mesh.world())
      fail(fmt::format("{}: {} rank files listed for a mesh of {} ranks", where, fl.is_array() ? fl.size() : 0,
                       m.mesh.world()));
    for (size_t r = 0; r < fl.size(); ++r) {
      const std::string path = fl[r].at("path").get<std::string>();
      if (path != rank_file(static_cast<int64_t>(r)) || fl[r].at("rank").get<int64_t>() != static_cast<int64_t>(r))
        fail(fmt::format("{}: file entry {} is '{}'", where, r, path));
      const std::string crc = fl[r].at("crc32").get<std::string>();
      uint32_t c = 0;
      if (crc.size() != 8 || std::sscanf(crc.c_str(), "%8x", &c) != 1)
        fail(fmt::format("{}: crc32 '{}' of {}", where, crc, path));
      if (!fl[r].is_object() || fl[r].size() != 4 || fl[r].at("bytes").get<int64_t>() < 0)
        fail(fmt::format("{}: file entry {} is malformed", where, r));
      out.files.emplace_back(path, fl[r].at("bytes").get<int64_t>(), c);
    }
  } catch (const nlohmann::json::exception& e) {
    fail(fmt::format("{}: {}", where, e.what()));
  }
  return out;
}

// The parts of every tensor a rank file holds, in the order put_parts takes them: for each parameter the rank owns,
// its /params, /exp_avg and /exp_avg_sq parts (the moments of trainable ones only), unpadded, as raw bytes. Parsed in
// a forked child (load_checkpoint), so it returns bytes and throws trident::Error only.
template <class T>
std::string read_rank_parts(const fs::path& path, const std::string& where, const md::Config& cfg,
                            const std::vector<md::ParamInfo>& info, const MeshShape& mesh, int64_t rank,
                            int64_t step) {
  try {
    const H5::PredType& mt = std::is_same_v<T, double> ? H5::PredType::NATIVE_DOUBLE : H5::PredType::NATIVE_FLOAT;
    // The bytes were checked against the manifest's CRC before; a file damaged before it was checksummed could
    // still hold a global heap HDF5 would crash or loop on: refused first, as for every HDF5 file Trident reads.
    std::error_code ec;
    check_global_heaps(path.string(), fs::file_size(path, ec), 0, "checkpoint file");
    H5::H5File f(path.string(), H5F_ACC_RDONLY);
    int64_t r = -1, s = -1;
    for (auto [name, out] : {std::pair{"rank", &r}, std::pair{"step", &s}}) {
      if (!f.attrExists(name)) fail(fmt::format("{}: attribute '{}' is missing", where, name));
      H5::Attribute a = f.openAttribute(name);
      if (a.getTypeClass() != H5T_INTEGER || a.getDataType().getSize() > 8 ||
          a.getSpace().getSimpleExtentNpoints() != 1)
        fail(fmt::format("{}: attribute '{}' is not one integer", where, name));
      a.read(H5::PredType::NATIVE_INT64, out);
    }
    if (r != rank || s != step)
      fail(fmt::format("{}: holds rank {} at step {}, the manifest says rank {} at step {}", where, r, s, rank, step));
    const char* names[3] = {"params", "exp_avg", "exp_avg_sq"};
    hsize_t expect[3] = {0, 0, 0};
    H5::Group groups[3] = {f.openGroup(names[0]), f.openGroup(names[1]), f.openGroup(names[2])};
    std::string out;
    for (size_t p = 0; p < info.size(); ++p) {
      const ParamPlacement pl = place(info[p], mesh, cfg.experts, rank);
      if (!pl.owner) continue;
      for (int g = 0; g < 3; ++g) {
        if (g > 0 && !info[p].trainable) continue;
        ++expect[g];
        if (!groups[g].nameExists(info[p].name))
          fail(fmt::format("{}: /{}/{} is missing", where, names[g], info[p].name));
        H5::DataSet ds = groups[g].openDataSet(info[p].name);
        H5::DataSpace sp = ds.getSpace();
        const int nd = sp.getSimpleExtentNdims();
        std::vector<hsize_t> dims(static_cast<size_t>(std::max(nd, 0)));
        if (nd > 0) sp.getSimpleExtentDims(dims.data());
        const std::vector<hsize_t> want(pl.shape.begin(), pl.shape.end());
        if (dims != want || ds.getTypeClass() != H5T_FLOAT || ds.getFloatType().getSize() != sizeof(T))
          fail(fmt::format("{}: /{}/{} has the wrong shape or type (want {} [{}])", where, names[g], info[p].name,
                           dtype_of<T>(), fmt::join(pl.shape, ", ")));
        const size_t at = out.size();
        out.resize(at + static_cast<size_t>(pl.valid_elems()) * sizeof(T));
        if (pl.valid_elems() > 0) ds.read(out.data() + at, mt);
      }
    }
    for (int g = 0; g < 3; ++g)
      if (groups[g].getNumObjs() != expect[g])
        fail(fmt::format("{}: /{} holds {} datasets, expected {}", where, names[g], groups[g].getNumObjs(),
                         expect[g]));
    return out;
  } catch (const H5::Exception& e) {
    fail(fmt::format("{}: HDF5: {}", where, e.getDetailMsg()));
  }
}

// Puts a rank's parts (read_rank_parts) into the full state.
template <class T>
void put_parts(const std::string& parts, const std::string& where, const md::Config& cfg,
               const std::vector<md::ParamInfo>& info, const MeshShape& mesh, int64_t rank, md::TrainState<T>& out) {
  md::ParamSet<T>* sets[3] = {&out.params, &out.m, &out.v};
  std::vector<T> part;
  size_t at = 0;
  for (size_t p = 0; p < info.size(); ++p) {
    const ParamPlacement pl = place(info[p], mesh, cfg.experts, rank);
    if (!pl.owner) continue;
    for (int g = 0; g < 3; ++g) {
      if (g > 0 && !info[p].trainable) continue;
      const size_t bytes = static_cast<size_t>(pl.valid_elems()) * sizeof(T);
      if (parts.size() - at < bytes) fail(fmt::format("{}: internal error: the reader sent too few bytes", where));
      part.resize(static_cast<size_t>(pl.valid_elems()));
      if (bytes > 0) std::memcpy(part.data(), parts.data() + at, bytes);
      at += bytes;
      put_part(pl, part.data(), sets[g]->t[p].ptr());
    }
  }
  if (at != parts.size()) fail(fmt::format("{}: internal error: the reader sent too many bytes", where));
}

}  // namespace

void set_checkpoint_save_hook(CheckpointSaveHook hook) { g_hook = std::move(hook); }

void check_save_target(const std::string& dir) {
  if (dir.empty()) fail("checkpoint: empty directory name");
  const fs::path target = target_path(dir);
  const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  std::error_code ec;
  if (!fs::is_directory(parent, ec))
    fail(fmt::format("cannot save checkpoint '{}': directory '{}' does not exist", dir, parent.string()));
  if (::access(parent.c_str(), W_OK) != 0)
    fail(fmt::format("cannot save checkpoint '{}': directory '{}' is not writable", dir, parent.string()));
  if (fs::exists(target, ec)) {
    if (!fs::is_directory(target, ec))
      fail(fmt::format("cannot save checkpoint '{}': it exists and is not a directory", dir));
    if (!fs::is_empty(target, ec) && !fs::exists(target / "manifest.json", ec))
      fail(fmt::format("cannot save checkpoint '{}': the directory is not empty and holds no manifest.json (refusing "
                       "to replace something that is not a checkpoint)",
                       dir));
  }
}

template <class T>
void save_checkpoint(const std::string& dir, const CheckpointMeta& meta, const std::vector<ShardState<T>>& ranks) {
  save_impl<T>(dir, meta, ranks);
}

template <class T>
void save_checkpoint(const std::string& dir, const CheckpointMeta& meta, const md::TrainState<T>& state) {
  TD_CHECK(meta.mesh.world() == 1, "checkpoint: a full state is saved as one rank, not {}", meta.mesh.str());
  TD_CHECK_EQ(state.step, meta.step, "checkpoint: the state's step vs the run's");
  const std::vector<md::ParamInfo> info = md::param_layout(meta.cfg);
  TD_CHECK_EQ(info.size(), state.params.size(), "checkpoint: parameter count");
  ShardState<T> r;
  r.step = state.step;
  r.w.resize(info.size());
  r.m.resize(info.size());
  r.v.resize(info.size());
  for (size_t p = 0; p < info.size(); ++p) {
    const ParamPlacement pl = place(info[p], meta.mesh, meta.cfg.experts, 0);
    auto take = [&](const md::ParamSet<T>& s, std::vector<T>& dst) {
      TD_CHECK_EQ(s.t[p].size(), pl.numel, "checkpoint: size of {}", info[p].name);
      dst.resize(static_cast<size_t>(pl.valid_elems()));
      take_part(pl, s.t[p].ptr(), dst.data());
    };
    take(state.params, r.w[p]);
    if (info[p].trainable) {
      take(state.m, r.m[p]);
      take(state.v, r.v[p]);
    }
  }
  save_impl<T>(dir, meta, std::vector<ShardState<T>>{std::move(r)});
}

CheckpointMeta read_checkpoint_meta(const std::string& dir) { return read_manifest(dir).meta; }

template <class T>
void validate_restored(const md::TrainState<T>& st, const CheckpointMeta& meta, const std::string& dir) {
  // AdamW's moments are convex combinations of clipped gradients (|g * clip| <= max_grad_norm): |m| <= max_grad_norm
  // and 0 <= v <= max_grad_norm^2. A factor 2 (4) of slack covers rounding; without clipping only the signs and
  // finiteness are known.
  const double mgn = meta.run.max_grad_norm;
  const double m_max = mgn > 0 ? 2 * mgn : INFINITY, v_max = mgn > 0 ? 4 * mgn * mgn : INFINITY;
  for (size_t p = 0; p < st.params.info.size(); ++p) {
    const std::string& name = st.params.info[p].name;
    const auto check = [&](const md::ParamSet<T>& set, const char* group, double lo, double hi, const char* rule) {
      const T* x = set.t[p].ptr();
      const int64_t n = static_cast<int64_t>(set.t[p].data.size());
      for (int64_t i = 0; i < n; ++i) {
        const double v = static_cast<double>(x[i]);
        if (std::isfinite(v) && v >= lo && v <= hi) continue;
        fail(fmt::format("checkpoint '{}': restored state is invalid: {} of {} element {} is {} ({}; the file was "
                         "damaged before its checksum was made, or written by a run that had already diverged)",
                         dir, group, name, i, x[i], rule));
      }
    };
    check(st.params, "params", -INFINITY, INFINITY, "parameters must be finite");
    if (!st.params.info[p].trainable) continue;
    check(st.m, "exp_avg", -m_max, m_max,
          mgn > 0 ? "AdamW's first moment is finite with |m| <= 2 x max_grad_norm" : "AdamW's first moment is finite");
    check(st.v, "exp_avg_sq", 0, v_max,
          mgn > 0 ? "AdamW's second moment is finite with 0 <= v <= 4 x max_grad_norm^2"
                  : "AdamW's second moment is finite and >= 0");
  }
}

template <class T>
md::TrainState<T> load_checkpoint(const std::string& dir, CheckpointMeta* meta_out) {
  const Manifest man = read_manifest(dir);
  const CheckpointMeta& meta = man.meta;
  if (man.dtype != dtype_of<T>())
    fail(fmt::format("checkpoint '{}' holds {} tensors (policy {}), this run uses {}", dir, man.dtype,
                     to_string(meta.cfg.policy), dtype_of<T>()));
  // Every file's size and CRC-32 before HDF5 parses a byte of any of them.
  std::error_code ec;
  for (const auto& [path, bytes, crc] : man.files) {
    const fs::path fp = fs::path(dir) / path;
    if (!fs::exists(fp, ec)) fail(fmt::format("checkpoint '{}': {} is missing", dir, path));
    const auto [n, c] = size_and_crc(fp);
    if (n != bytes)
      fail(fmt::format("checkpoint '{}': {} has {} bytes, the manifest says {} (truncated or replaced)", dir, path, n,
                       bytes));
    if (c != crc)
      fail(fmt::format("checkpoint '{}': {} checksum mismatch (crc32 {}, the manifest says {}): the file is corrupt",
                       dir, path, hex32(c), hex32(crc)));
  }
  const std::vector<md::ParamInfo> info = md::param_layout(meta.cfg);
  md::TrainState<T> st;
  st.params = md::ParamSet<T>::zeros(meta.cfg);
  st.m = md::ParamSet<T>::zeros(meta.cfg);
  st.v = md::ParamSet<T>::zeros(meta.cfg);
  st.step = meta.step;
  H5::Exception::dontPrint();
  for (int64_t r = 0; r < static_cast<int64_t>(man.files.size()); ++r) {
    const auto& [path, bytes, crc] = man.files[static_cast<size_t>(r)];
    const fs::path fp = fs::path(dir) / path;
    const std::string where = fmt::format("checkpoint '{}': {}", dir, path);
    // Parsed in a forked child with a time limit, as every HDF5 file Trident reads (golden/read_guard.h): a CRC
    // made after the damage (a file damaged before it was checksummed, or re-sealed) lets HDF5 itself parse
    // corrupt metadata, and a crash or a loop of the library is then one error, not the end of the run.
    const auto work = [&] { return read_rank_parts<T>(fp, where, meta.cfg, info, meta.mesh, r, meta.step); };
    std::string parts;
    if (!run_isolated(fp.string(), static_cast<uint64_t>(bytes), "checkpoint file", work, parts)) parts = work();
    put_parts<T>(parts, where, meta.cfg, info, meta.mesh, r, st);
  }
  validate_restored(st, meta, dir);
  if (meta_out) *meta_out = meta;
  return st;
}

void check_resumable(const CheckpointMeta& saved, const md::Config& cfg, const md::RunConfig& run,
                     const std::string& dir) {
  const json a = saved.cfg.to_json(), b = cfg.to_json();
  for (const auto& [k, v] : a.items())
    if (!b.contains(k) || b[k] != v)
      fail(fmt::format("checkpoint '{}' is incompatible: model config '{}' is {} in the checkpoint, {} here", dir, k,
                       v.dump(), b.contains(k) ? b[k].dump() : "absent"));
  for (const auto& [k, v] : b.items())
    if (!a.contains(k)) fail(fmt::format("checkpoint '{}' is incompatible: model config '{}' is absent there", dir, k));
  const json ra = saved.run.to_json(), rb = run.to_json();
  // Named by the flag that sets each (the optimizer's constants have none: they are the run's defaults).
  const std::pair<const char*, const char*> keys[] = {
      {"sequences", "--seqs"}, {"seq_len", "--seq-len"},           {"lr", "--lr"},
      {"beta1", "AdamW beta1"}, {"beta2", "AdamW beta2"},          {"eps", "AdamW eps"},
      {"weight_decay", "AdamW weight decay"}, {"max_grad_norm", "max grad norm"}, {"data_seed", "--data-seed"}};
  for (const auto& [k, flag] : keys)
    if (ra.at(k) != rb.at(k))
      fail(fmt::format("checkpoint '{}' is incompatible: {} is {} in the checkpoint, {} here (resume with the same "
                       "batch, optimizer and data settings: {} {})",
                       dir, flag, ra.at(k).dump(), rb.at(k).dump(), flag, ra.at(k).dump()));
  if (saved.run.docs_per_seq != run.docs_per_seq)
    fail(fmt::format("checkpoint '{}' is incompatible: --docs-per-seq is {} in the checkpoint, {} here (resume with "
                     "the same batch, optimizer and data settings: --docs-per-seq {})",
                     dir, saved.run.docs_per_seq, run.docs_per_seq, saved.run.docs_per_seq));
}

template void save_checkpoint<float>(const std::string&, const CheckpointMeta&, const std::vector<ShardState<float>>&);
template void save_checkpoint<double>(const std::string&, const CheckpointMeta&,
                                      const std::vector<ShardState<double>>&);
template void save_checkpoint<float>(const std::string&, const CheckpointMeta&, const md::TrainState<float>&);
template void save_checkpoint<double>(const std::string&, const CheckpointMeta&, const md::TrainState<double>&);
template md::TrainState<float> load_checkpoint<float>(const std::string&, CheckpointMeta*);
template md::TrainState<double> load_checkpoint<double>(const std::string&, CheckpointMeta*);

}  // namespace trident::golden
