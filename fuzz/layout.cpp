// The layout generator (fuzz/layout.h).
#include "fuzz/layout.h"

#include <algorithm>

#include "golden/primitives/primitives.h"
#include "gpu/ref/host_kernels.h"
#include "reference/check.h"
#include "reference/repro.h"

namespace trident::fuzz {

uint64_t SeededChoices::next() {  // splitmix64
  uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
int64_t SeededChoices::in_range(int64_t lo, int64_t hi) {
  TD_CHECK(hi > lo, "in_range: empty range [{}, {})", lo, hi);
  return lo + static_cast<int64_t>(next() % static_cast<uint64_t>(hi - lo));
}

namespace {

int64_t pick(Choices& c, const std::vector<int64_t>& v) {
  return v[static_cast<size_t>(c.in_range(0, static_cast<int64_t>(v.size())))];
}

// ep values of a world: divisors of W that divide the experts.
std::vector<int64_t> ep_choices(int64_t W, int64_t experts) {
  std::vector<int64_t> eps;
  for (int64_t e = 1; e <= W; ++e)
    if (W % e == 0 && experts % e == 0) eps.push_back(e);
  return eps;
}

bool mesh_ok(const MeshShape& m, const model::Config& cfg, int64_t sequences, int64_t seq_len, int64_t chunks,
             int64_t nvl) {
  try {
    validate(m, {.experts = cfg.experts,
                 .sequences = sequences,
                 .seq_len = seq_len,
                 .tile = cfg.tile,
                 .ep_chunks = chunks,
                 .nvl = nvl});
    return true;
  } catch (const Error&) {
    return false;
  }
}

// Every mesh of at most max_w ranks that runs this batch (1D CP), for the resumed run.
std::vector<MeshShape> meshes_for(const model::Config& cfg, int64_t sequences, int64_t seq_len, int64_t max_w) {
  std::vector<MeshShape> out;
  for (int64_t cp = 1; cp <= max_w; ++cp) {
    if (seq_len % (2 * cp) != 0 || (seq_len / (2 * cp)) % cfg.tile != 0) continue;
    for (int64_t f = 1; f * cp <= max_w; ++f)
      for (int64_t d = 1; d * f * cp <= max_w; ++d) {
        if (sequences % (d * f) != 0) continue;
        const int64_t W = d * f * cp;
        for (int64_t ep : ep_choices(W, cfg.experts)) {
          const MeshShape m{d, f, cp, W / ep, ep};
          if (mesh_ok(m, cfg, sequences, seq_len, 1, 8)) out.push_back(m);
        }
      }
  }
  return out;
}

}  // namespace

bool normalize(Layout& l) {
  emu::EmulateSpec& s = l.spec;
  MeshShape& m = s.mesh;
  const model::Config& cfg = s.cfg;
  const int64_t W = m.world();
  if (W < 1 || m.ep < 1 || W % m.ep != 0 || cfg.experts % m.ep != 0) return false;
  if (l.processes > 0) {  // the MPI backend: every process holds world / processes ranks
    if (W % l.processes != 0) return false;
    l.ranks_per_process = W / l.processes;
  }
  m.e_fsdp = W / m.ep;
  if (m.cp_inner > 1 && (m.cp % m.cp_inner != 0 || m.cp_inner >= m.cp)) m.cp_inner = 1;
  s.run.sequences = m.d_rep * m.fsdp * l.per_group;
  s.run.seq_len = 2 * m.cp * cfg.tile * l.chunk_tiles;
  s.ep_chunks = std::clamp<int64_t>(s.ep_chunks, 1, l.per_group * 2 * l.chunk_tiles);
  s.run.docs_per_seq = std::min(s.run.docs_per_seq, s.run.seq_len);
  if (!mesh_ok(m, cfg, s.run.sequences, s.run.seq_len, s.ep_chunks, s.nvl)) return false;
  if (l.resume) {
    const MeshShape& r = l.resume_mesh;
    const int64_t rw = r.world();
    const bool ok = rw >= 1 && r.ep >= 1 && rw % r.ep == 0 && cfg.experts % r.ep == 0 &&
                    s.run.sequences % (r.d_rep * r.fsdp) == 0 &&
                    mesh_ok(MeshShape{r.d_rep, r.fsdp, r.cp, rw / r.ep, r.ep}, cfg, s.run.sequences, s.run.seq_len,
                            1, 8);
    if (!ok) l.resume_mesh = MeshShape{};
    l.resume_mesh.e_fsdp = l.resume_mesh.world() / l.resume_mesh.ep;
    const int64_t rtiles = s.run.sequences / (l.resume_mesh.d_rep * l.resume_mesh.fsdp) * s.run.seq_len /
                           (l.resume_mesh.cp * cfg.tile);
    l.resume_chunks = std::clamp<int64_t>(l.resume_chunks, 1, rtiles);
  }
  l.docs_drawn = s.run.docs_per_seq;
  return true;
}

Layout draw(Choices& c, const GenOptions& o) {
  TD_CHECK(!o.models.empty(), "fuzz: no model to draw layouts for");
  const int64_t max_w = std::max<int64_t>(o.max_world, 1);
  const bool big = max_w > 64;  // wider draws (the default draws are the step property test's)
  const bool all = o.all_features;
  Layout l;
  const Model& md = o.models.size() == 1 ? o.models[0] : o.models[static_cast<size_t>(c.in_range(0, static_cast<int64_t>(o.models.size())))];
  emu::EmulateSpec& s = l.spec;
  s.preset = md.preset;
  s.config_path = md.config_path;
  s.cfg = md.cfg;
  l.model_name = md.name();
  if (all) {  // the config's policy half the time, else fp32, bf16 or fp64
    const int64_t p = c.in_range(0, 6);
    if (p == 3) s.cfg.policy = Policy::fp32;
    if (p == 4) s.cfg.policy = Policy::bf16;
    if (p == 5) s.cfg.policy = Policy::fp64;
  } else if (c.coin(1, 5)) {
    s.cfg.policy = Policy::bf16;
  }
  int64_t cp = 1, fsdp = 1, d_rep = 1;
  const int64_t np = o.processes;
  if (np > 0) {  // the MPI backend: the world uniform among the multiples of the processes that factor (ranks per
                 // process = world / processes), then its factors as below
    const int64_t cmax = big ? 16 : 8, fmax = big ? 8 : 4, dmax = big ? 4 : 3;
    struct F { int64_t cp, fsdp; };
    std::vector<std::pair<int64_t, std::vector<F>>> worlds;
    for (int64_t W = np; W <= std::min(max_w, cmax * fmax * dmax); W += np) {
      std::vector<F> fs;
      for (int64_t x = 1; x <= std::min(W, cmax); x *= 2)
        for (int64_t f = 1; f <= fmax && W % x == 0; ++f)
          if ((W / x) % f == 0 && W / x / f <= dmax) fs.push_back({x, f});
      if (!fs.empty()) worlds.emplace_back(W, std::move(fs));
    }
    TD_CHECK(!worlds.empty(), "fuzz: no world of up to {} ranks is a multiple of the {} MPI processes", max_w, np);
    const auto& [W, fs] = worlds[static_cast<size_t>(c.in_range(0, static_cast<int64_t>(worlds.size())))];
    const F f = fs[static_cast<size_t>(c.in_range(0, static_cast<int64_t>(fs.size())))];
    cp = f.cp;
    fsdp = f.fsdp;
    d_rep = W / (cp * fsdp);
  } else if (all) {  // the world first, uniform in [1, max_world] (small worlds as often as large), then its factors: cp a
              // power of two, fsdp and d_rep within their ranges (a world they cannot factor is drawn again)
    const int64_t cmax = big ? 16 : 8, fmax = big ? 8 : 4, dmax = big ? 4 : 3;
    for (int attempt = 0; attempt < 64; ++attempt) {
      const int64_t W = c.in_range(1, std::min(max_w, cmax * fmax * dmax) + 1);
      std::vector<int64_t> cps;
      for (int64_t x = 1; x <= std::min(W, cmax); x *= 2)
        if (W % x == 0) cps.push_back(x);
      const int64_t cpw = pick(c, cps);
      std::vector<int64_t> fs;
      for (int64_t f = 1; f <= fmax; ++f)
        if ((W / cpw) % f == 0 && W / cpw / f <= dmax) fs.push_back(f);
      if (fs.empty()) continue;
      cp = cpw;
      fsdp = pick(c, fs);
      d_rep = W / (cp * fsdp);
      break;
    }
  } else {  // the step property test's draws (clamped to max_world)
    cp = int64_t{1} << c.in_range(0, big ? 5 : 4);  // 1..8 (big: 1..16)
    fsdp = c.in_range(1, big ? 9 : 5);
    d_rep = c.in_range(1, big ? 5 : 4);
    while (cp > max_w) cp /= 2;
    while (d_rep * fsdp * cp > max_w) {
      if (d_rep > 1) --d_rep;
      else --fsdp;
    }
  }
  const int64_t W = d_rep * fsdp * cp;
  const int64_t ep = pick(c, ep_choices(W, s.cfg.experts));
  s.mesh = MeshShape{d_rep, fsdp, cp, W / ep, ep};
  if (all && cp >= 4 && c.coin(1, 3)) {  // 2D CP: cp_inner consecutive ranks per NVLink domain
    std::vector<int64_t> inner;
    for (int64_t k = 2; k < cp && k <= s.nvl; ++k)
      if (cp % k == 0) inner.push_back(k);
    if (!inner.empty()) s.mesh.cp_inner = pick(c, inner);
  }
  // sequences per data group, tiles per zig-zag chunk, steps: 1 or 2 (all features: 2 a quarter of the time, so the
  // time goes to more layouts rather than to longer runs of one)
  auto one_or_two = [&] { return all ? 1 + static_cast<int64_t>(c.coin(1, 4)) : c.in_range(1, 3); };
  l.per_group = one_or_two();
  l.chunk_tiles = one_or_two();
  s.run.steps = one_or_two();
  s.run.recompute = c.coin();
  s.ep_chunks = c.in_range(1, 5);
  // vocabulary slices: 0 (default: one per vocab chunk), or 1..6 (more than the vocab chunks: clamped)
  s.vocab_slices = c.in_range(0, 7);
  // the device: eager, or deferred with a drawn scheduler seed (queued per stream, hazards checked; same bits)
  if (c.coin()) {
    s.device.mode = emu::DeviceMode::deferred;
    s.device.seed = static_cast<uint64_t>(c.in_range(0, 1000));
  }
  l.kernels = o.kernels.empty() ? "cpu" : o.kernels;
  s.plant = o.plant;
  if (!o.comm.empty() && o.comm.starts_with("emu-drop:")) {
    const auto [op, n] = emu::parse_comm_drop(o.comm);
    s.drop_op = op;
    s.drop_count = n;
  } else if (o.comm == "nccl-fake") {
    s.comm = emu::CommBackend::nccl_fake;
  }
  if (all) {
    if (c.coin(1, 3)) s.run.docs_per_seq = c.in_range(2, 6);  // packed documents
    if (o.comm.empty() && c.coin(1, 4)) {
      s.comm = emu::CommBackend::nccl_fake;
      s.nccl_blocking = c.coin();
    }
    if (s.comm == emu::CommBackend::emu && c.coin(1, 4)) s.lower_exact_sum = true;
    if (o.kernels.empty() && c.coin(1, 5)) l.kernels = "cuda-ref-host";
    // the eager device checks hazards too (the CPU kernels declare their accesses; the other sets declare none)
    if (s.device.mode == emu::DeviceMode::eager && l.kernels == "cpu") s.device.check_hazards = true;
    l.seed2 = static_cast<uint64_t>(c.in_range(1, 1000));
    if (s.device.mode == emu::DeviceMode::deferred && l.seed2 == s.device.seed) l.seed2 += 1000;
    l.resume = c.coin(1, 4);
  }
  if (np > 0) {  // what the MPI backend runs: the eager device without checks or traces, its own communicator
                // (exact sums always lowered), the CPU kernels, no checkpoint
    l.processes = np;
    s.device = emu::DeviceOptions{};
    s.comm = emu::CommBackend::emu;
    s.nccl_blocking = false;
    s.lower_exact_sum = false;
    s.drop_count = 0;
    l.kernels = "cpu";
    l.resume = false;
  }
  if (!normalize(l)) {  // a drawn 2D CP the rules refuse: 1D
    s.mesh.cp_inner = 1;
    TD_CHECK(normalize(l), "fuzz: drew an invalid layout {}", l.repro());
  }
  if (l.resume) {
    const std::vector<MeshShape> ms = meshes_for(s.cfg, s.run.sequences, s.run.seq_len, max_w);
    l.resume_mesh = ms[static_cast<size_t>(c.in_range(0, static_cast<int64_t>(ms.size())))];
    l.resume_chunks = c.in_range(1, 3);
    TD_CHECK(normalize(l), "fuzz: drew an invalid resumed layout {}", l.repro());
  }
  return l;
}

std::string Layout::repro() const {
  std::string r = spec.repro(true);
  if (kernels != "cpu") r += " --kernels " + ReproLine::quote(kernels);
  if (processes > 0) {  // the launcher first and the backend's flags last, as `trident emulate --backend mpi` prints
    ReproLine b("");
    b.opt("--backend", "mpi").opt_if("--ranks-per-process", ranks_per_process, 1);
    r = fmt::format("mpirun -np {} {}{}", processes, r, b.str());
  }
  return r;
}

std::string Layout::key() const {
  Layout k = *this;
  k.spec.device.seed = 0;
  std::string s = k.repro();
  if (resume) s += " resume " + resume_mesh.spec() + " chunks " + std::to_string(resume_chunks);
  return s;
}

std::vector<std::string> Layout::features() const {
  std::vector<std::string> f;
  const MeshShape& m = spec.mesh;
  auto add = [&](bool on, const char* name) {
    if (on) f.emplace_back(name);
  };
  add(m.d_rep > 1, "d_rep > 1");
  add(m.fsdp > 1, "fsdp > 1");
  add(m.cp > 1, "cp > 1");
  add(m.e_fsdp > 1, "e_fsdp > 1");
  add(m.ep > 1, "ep > 1");
  add(m.cp_2d(), "2D CP");
  add(spec.ep_chunks > 1, "EP chunks > 1");
  add(spec.vocab_slices > 0, "vocab slices");
  add(spec.run.recompute, "recompute");
  add(spec.run.docs_per_seq > 1, "packed documents");
  add(spec.cfg.dsa(), "DSA");
  add(spec.run.steps > 1, "steps > 1");
  add(per_group > 1, "sequences per group > 1");
  add(chunk_tiles > 1, "tiles per chunk > 1");
  f.push_back(fmt::format("policy {}", to_string(spec.cfg.policy)));
  add(spec.device.mode == emu::DeviceMode::deferred, "deferred device");
  add(spec.device.mode == emu::DeviceMode::eager && spec.device.check_hazards, "eager device, hazards checked");
  add(spec.comm == emu::CommBackend::nccl_fake, "fake NCCL");
  add(spec.lower_exact_sum, "lowered exact sums");
  add(kernels == "cuda-ref-host", "cuda-ref-host kernels");
  add(resume, "checkpoint resumed on another mesh");
  add(processes > 0 && ranks_per_process > 1, "ranks per process > 1");
  return f;
}

KernelSet parse_kernels(const std::string& s) {
  if (s == "cpu" || s == "cuda-ref-host") return {s, "", 0};
  if (s.rfind("cpu-ulp:", 0) == 0) {
    KernelSet k{"cpu-ulp", s.substr(8), 0};
    if (const size_t c = k.op.find(':'); c != std::string::npos) {
      const std::string idx = k.op.substr(c + 1);
      k.op = k.op.substr(0, c);
      size_t used = 0;
      try {
        k.index = std::stoll(idx, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != idx.size() || idx.empty() || k.index < 0)
        fail(fmt::format("kernels '{}': the element index must be an integer >= 0", s));
    }
    const auto& ops = golden::kernel_ops();
    if (std::find(ops.begin(), ops.end(), k.op) == ops.end())
      fail(fmt::format("kernels '{}': unknown op '{}' (one of: {})", s, k.op, fmt::join(ops, ", ")));
    return k;
  }
  fail(fmt::format("unknown kernel set '{}' (cpu, cuda-ref-host, cpu-ulp:OP[:INDEX]; the fuzzer checks bits, so not "
                   "cuda-fast-host)",
                   s));
}

template <class T>
emu::KernelFactory<T> kernel_factory(const KernelSet& k) {
  if (k.name == "cuda-ref-host") return [](int, Device& dev) { return gpu::make_ref_host_kernels<T>(dev); };
  if (k.name == "cpu-ulp")
    return [op = k.op, index = k.index](int, Device& dev) {
      return golden::make_perturbed_kernels<T>(std::make_unique<CpuKernels<T>>(dev), dev, op, index);
    };
  return nullptr;
}
template emu::KernelFactory<float> kernel_factory<float>(const KernelSet&);
template emu::KernelFactory<double> kernel_factory<double>(const KernelSet&);

}  // namespace trident::fuzz
