// Routing counts (parallel/routing.h): the specs, the seeded draws and the file format.
#include "parallel/routing.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <sstream>

#include "reference/atomic_write.h"
#include "reference/check.h"

namespace trident {

namespace {
constexpr const char* kForms = "uniform, zipf:S (S > 0), dirichlet:A (A > 0) or file:PATH";
// Routing files of recorded runs are small; a bigger one is a mistake.
constexpr int64_t kMaxFileBytes = int64_t{1} << 31;

double parse_positive(const std::string& s, const std::string& what) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (...) {
    used = 0;
  }
  if (used == 0 || used != s.size() || !std::isfinite(v) || v <= 0 || v > 1e6)
    fail(fmt::format("--routing {}: '{}' is not a number in (0, 1e6] (forms: {})", what, s, kForms));
  return v;
}

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
uint64_t key(uint64_t seed, std::initializer_list<int64_t> parts) {
  uint64_t h = mix(seed);
  for (int64_t p : parts) h = mix(h ^ static_cast<uint64_t>(p));
  return h;
}

// Integer counts from real targets t (sum = total, each in [0, cap]): targets above cap are cut to cap and the
// excess spread over the others in proportion (water filling), then floors plus one for the largest remainders
// (ties: lower expert first).
void round_counts(std::vector<double>& t, int64_t total, int64_t cap, int32_t* out) {
  const size_t E = t.size();
  std::vector<bool> capped(E, false);
  for (size_t it = 0; it < E; ++it) {
    double excess = 0, free_w = 0;
    for (size_t e = 0; e < E; ++e) {
      if (!capped[e] && t[e] > static_cast<double>(cap)) {
        excess += t[e] - static_cast<double>(cap);
        t[e] = static_cast<double>(cap);
        capped[e] = true;
      }
    }
    if (excess <= 0) break;
    for (size_t e = 0; e < E; ++e)
      if (!capped[e]) free_w += t[e];
    for (size_t e = 0; e < E; ++e)
      if (!capped[e]) t[e] += free_w > 0 ? excess * t[e] / free_w : excess / static_cast<double>(E);
  }
  int64_t sum = 0;
  std::vector<std::pair<double, size_t>> rem(E);
  for (size_t e = 0; e < E; ++e) {
    const int64_t f = std::min<int64_t>(cap, static_cast<int64_t>(std::floor(t[e])));
    out[e] = static_cast<int32_t>(f);
    sum += f;
    rem[e] = {t[e] - static_cast<double>(f), e};
  }
  std::stable_sort(rem.begin(), rem.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t pass = 0; sum < total && pass < 2 * E + 2; ++pass)  // the second sweep catches rounding drift
    for (const auto& [r, e] : rem) {
      if (sum >= total) break;
      if (out[e] < cap) ++out[e], ++sum;
    }
  TD_CHECK_EQ(sum, total, "routing: counts of a chunk (internal error)");
}
}  // namespace

RoutingSpec parse_routing(const std::string& s) {
  RoutingSpec r;
  r.text = s;
  const size_t colon = s.find(':');
  const std::string head = s.substr(0, colon), arg = colon == std::string::npos ? "" : s.substr(colon + 1);
  if (s == "uniform") {
    r.kind = RoutingSpec::Kind::uniform;
  } else if (head == "zipf" && colon != std::string::npos) {
    r.kind = RoutingSpec::Kind::zipf;
    r.param = parse_positive(arg, "zipf:S");
  } else if (head == "dirichlet" && colon != std::string::npos) {
    r.kind = RoutingSpec::Kind::dirichlet;
    r.param = parse_positive(arg, "dirichlet:A");
  } else if (head == "file" && colon != std::string::npos && !arg.empty()) {
    r.kind = RoutingSpec::Kind::file;
    r.path = arg;
  } else {
    fail(fmt::format("--routing '{}': unknown routing (forms: {})", s, kForms));
  }
  return r;
}

RoutingCounts RoutingCounts::empty(const model::Config& cfg, int64_t world, int64_t chunks, int64_t steps) {
  RoutingCounts c;
  c.steps = steps;
  c.ranks = world;
  c.chunks = chunks;
  c.experts = cfg.experts;
  c.top_k = cfg.top_k;
  for (int64_t i = 0; i < cfg.layers; ++i)
    if (cfg.is_moe_layer(i)) c.layers.push_back(i);
  int64_t total = 1;
  for (int64_t f : {steps, static_cast<int64_t>(c.layers.size()), world, chunks, cfg.experts})
    total = model::checked_mul(total, std::max<int64_t>(f, 1), "routing counts");
  TD_CHECK(total <= (int64_t{1} << 33),
           "routing counts: {} steps x {} MoE layers x {} ranks x {} chunks x {} experts is {} counts, more than 2^33",
           steps, c.layers.size(), world, chunks, cfg.experts, total);
  c.n.assign(static_cast<size_t>(c.layers.empty() ? 0 : total), 0);
  return c;
}

RoutingCounts RoutingCounts::from_spec(const RoutingSpec& spec, const model::Config& cfg, int64_t world,
                                       int64_t chunks, int64_t steps, uint64_t seed) {
  if (spec.kind != RoutingSpec::Kind::file) {
    RoutingCounts c = empty(cfg, world, chunks, 1);
    c.drawn = true;
    c.spec = spec;
    c.seed = seed;
    return c;
  }
  const std::string& path = spec.path;
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(fmt::format("--routing file:{}: cannot open the file", path));
  f.seekg(0, std::ios::end);
  const std::streamoff size = f.tellg();
  if (size < 0 || size > kMaxFileBytes)
    fail(fmt::format("--routing file:{}: {} bytes, more than a routing file may have (2 GiB)", path,
                     static_cast<int64_t>(size)));
  f.seekg(0);
  std::string text(static_cast<size_t>(size), '\0');
  f.read(text.data(), size);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    fail(fmt::format("--routing file:{}: not JSON ({})", path, e.what()));
  }
  auto get = [&](const char* k) -> int64_t {
    if (!j.is_object() || !j.contains(k) || !j[k].is_number_integer())
      fail(fmt::format("--routing file:{}: '{}' is missing or not an integer (a file written by emulate "
                       "--record-routing)",
                       path, k));
    return j[k].get<int64_t>();
  };
  if (!j.is_object() || j.value("format", std::string()) != "trident-routing" || get("version") != 1)
    fail(fmt::format("--routing file:{}: not a routing file (format 'trident-routing', version 1)", path));
  RoutingCounts want = empty(cfg, world, chunks, 1);
  const int64_t fsteps = get("steps");
  auto mismatch = [&](const char* what, auto got, auto run) {
    fail(fmt::format("--routing file:{}: recorded with {} {}, this run has {}", path, what, got, run));
  };
  if (get("ranks") != world) mismatch("ranks", get("ranks"), world);
  if (get("chunks") != chunks) mismatch("EP chunks", get("chunks"), chunks);
  if (get("experts") != cfg.experts) mismatch("experts", get("experts"), cfg.experts);
  if (get("top_k") != cfg.top_k) mismatch("top_k", get("top_k"), cfg.top_k);
  if (!j.contains("layers") || !j["layers"].is_array() || j["layers"].get<std::vector<int64_t>>() != want.layers)
    fail(fmt::format("--routing file:{}: its MoE layers differ from the model's ({})", path,
                     fmt::join(want.layers, ", ")));
  if (fsteps < steps) mismatch("steps", fsteps, steps);
  RoutingCounts c = empty(cfg, world, chunks, fsteps);
  const auto& arr = j.contains("counts") ? j["counts"] : nlohmann::json();
  if (!arr.is_array() || arr.size() != c.n.size())
    fail(fmt::format("--routing file:{}: 'counts' must be an array of {} integers (steps x layers x ranks x chunks x "
                     "experts)",
                     path, c.n.size()));
  for (size_t i = 0; i < arr.size(); ++i) {
    if (!arr[i].is_number_integer() || arr[i].get<int64_t>() < 0 || arr[i].get<int64_t>() > INT32_MAX)
      fail(fmt::format("--routing file:{}: counts[{}] is not an integer in [0, 2^31)", path, i));
    c.n[i] = static_cast<int32_t>(arr[i].get<int64_t>());
  }
  c.spec = spec;
  return c;
}

int64_t RoutingCounts::moe_index(int64_t layer) const {
  const auto it = std::lower_bound(layers.begin(), layers.end(), layer);
  TD_CHECK(it != layers.end() && *it == layer, "routing: layer {} is not a MoE layer", layer);
  return it - layers.begin();
}

const int32_t* RoutingCounts::slot(int64_t step, int64_t layer, int64_t rank, int64_t chunk) const {
  return const_cast<RoutingCounts*>(this)->slot(step, layer, rank, chunk);
}
int32_t* RoutingCounts::slot(int64_t step, int64_t layer, int64_t rank, int64_t chunk) {
  const int64_t s = drawn ? 0 : step;
  TD_CHECK(s >= 0 && s < steps, "routing: step {} but the counts hold {} steps", step + 1, steps);
  TD_CHECK(rank >= 0 && rank < ranks && chunk >= 0 && chunk < chunks, "routing: slot rank {} chunk {} out of range",
           rank, chunk);
  const int64_t L = static_cast<int64_t>(layers.size());
  const int64_t i = (((s * L + moe_index(layer)) * ranks + rank) * chunks + chunk) * experts;
  return n.data() + i;
}

const int32_t* RoutingCounts::fill(int64_t step, int64_t layer, int64_t rank, int64_t chunk, int64_t rows) {
  int32_t* out = slot(step, layer, rank, chunk);
  const size_t E = static_cast<size_t>(experts);
  if (!drawn) {  // replayed: the slot must fit the chunk
    int64_t sum = 0;
    for (size_t e = 0; e < E; ++e) {
      TD_CHECK(out[e] <= rows,
               "--routing {}: step {}, layer {}, rank {}, chunk {}: expert {} gets {} rows of a chunk of {} (a token "
               "picks distinct experts)",
               spec.text, step + 1, layer, rank, chunk, e, out[e], rows);
      sum += out[e];
    }
    TD_CHECK(sum <= rows * top_k,
             "--routing {}: step {}, layer {}, rank {}, chunk {}: {} routed rows, more than {} rows x top_k {}",
             spec.text, step + 1, layer, rank, chunk, sum, rows, top_k);
    return out;
  }
  const int64_t total = rows * top_k;
  std::vector<double> t(E, 0.0);
  switch (spec.kind) {
    case RoutingSpec::Kind::uniform: {  // as even as integers allow; the extra ones start at a drawn expert
      const uint64_t r = key(seed, {step, layer, rank, chunk}) % E;
      for (size_t e = 0; e < E; ++e)
        t[(e + r) % E] = static_cast<double>(total / experts + (static_cast<int64_t>(e) < total % experts ? 1 : 0));
      break;
    }
    case RoutingSpec::Kind::zipf: {  // expert popularity ~ 1 / rank^S, the ranking drawn per layer (hot everywhere)
      std::vector<size_t> perm(E);
      std::iota(perm.begin(), perm.end(), size_t{0});
      std::mt19937_64 g(key(seed, {-1, layer}));
      std::shuffle(perm.begin(), perm.end(), g);
      double z = 0;
      for (size_t j = 0; j < E; ++j) z += std::pow(static_cast<double>(j + 1), -spec.param);
      for (size_t j = 0; j < E; ++j)
        t[perm[j]] = static_cast<double>(total) * std::pow(static_cast<double>(j + 1), -spec.param) / z;
      break;
    }
    case RoutingSpec::Kind::dirichlet: {  // shares ~ Dirichlet(A, ..., A), drawn per slot
      std::mt19937_64 g(key(seed, {step, layer, rank, chunk}));
      std::gamma_distribution<double> gam(spec.param, 1.0);
      double z = 0;
      for (size_t e = 0; e < E; ++e) z += t[e] = gam(g);
      for (size_t e = 0; e < E; ++e)
        t[e] = z > 0 ? static_cast<double>(total) * t[e] / z : static_cast<double>(total) / static_cast<double>(E);
      break;
    }
    case RoutingSpec::Kind::file: break;
  }
  round_counts(t, total, rows, out);
  return out;
}

std::string RoutingCounts::to_json() const {
  nlohmann::json j;
  j["format"] = "trident-routing";
  j["version"] = 1;
  j["steps"] = steps;
  j["ranks"] = ranks;
  j["chunks"] = chunks;
  j["experts"] = experts;
  j["top_k"] = top_k;
  j["layers"] = layers;
  j["counts"] = n;
  return j.dump() + "\n";
}

void RoutingCounts::save(const std::string& path) const { io::write_file(path, to_json(), "routing file"); }

std::span<const int64_t> unread_rows(int64_t n) {
  if (n == 0) return {};
  constexpr int64_t kEntries = int64_t{1} << 31;
  static const int64_t* base = [] {
    void* p = ::mmap(nullptr, static_cast<size_t>(kEntries) * sizeof(int64_t), PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    TD_CHECK(p != MAP_FAILED, "shapes-only run: cannot reserve address space for row lists");
    return static_cast<const int64_t*>(p);
  }();
  TD_CHECK(n >= 0 && n <= kEntries, "shapes-only run: a row list of {} rows (at most 2^31)", n);
  return {base, static_cast<size_t>(n)};
}

}  // namespace trident
