// Seeded fuzzing of every input Trident reads (issue 15: no crash, hang or silent nonsense on any input).
//
// Each case mutates one input and loads it in a forked child under alarm(): model configs (JSON and TOML: values
// replaced by interesting numbers and types, keys deleted/added/duplicated, bytes flipped, text truncated, deep
// nesting), run configs (JSON), mesh strings (--mesh: keys, values, separators and spaces mutated; what parses is
// checked against the mesh rules and must round-trip through MeshShape::spec()), planner configs (the examples with
// values replaced, deleted or damaged; a plan that is produced must be all finite numbers: never "inf" or "nan"),
// and HDF5 state dumps (bit flips anywhere or next to an HDF5 metadata signature,
// byte ranges overwritten, truncation, extension; attributes and datasets replaced through the HDF5 C API by
// other types, shapes, element counts, links; with and without the checksum header, re-sealed or not). A case
// passes when the input loads (and what loaded satisfies the loader's invariants) or the loader throws
// trident::Error. Anything else is a failure: another exception type, a broken invariant, a crash (signal) or a
// hang (the alarm). Each failure prints a repro line; a case reruns alone with --case.
//
//   fuzz_inputs [--seed S] [--cases N] [--case I] [--kinds json,toml,run,mesh,plan,h5] [--time-limit SEC] [--verbose]
//               [--source-dir DIR] [--keep DIR] [--no-isolation]
//   fuzz_inputs [--no-isolation] --read FILE.h5     (read one dump, e.g. a kept failing input)
//
// --no-isolation reads every dump in this process (ReadOptions::isolate = false) instead of read_state's forked
// reader: it shows what the isolation is for (HDF5 1.10 crashes on some corrupt files without a checksum).
#include <fcntl.h>
#include <hdf5.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli/command.h"
#include "emulator/memory.h"
#include "golden/checkpoint.h"
#include "golden/primitives/primitives.h"
#include "golden/state_dump.h"
#include "parallel/layout.h"
#include "planner/config.h"
#include "planner/run.h"
#include "reference/check.h"
#include "reference/model/config.h"
#include "reference/model/params.h"
#include "reference/toml_json.h"
#include "tests/golden/micro_config.h"

namespace fs = std::filesystem;
using namespace trident;
using json = nlohmann::json;

namespace {

// ---------------------------------------------------------------------------------------------------------------
// Options, randomness

struct Options {
  uint64_t seed = 20261201;
  int64_t cases = 3000;
  int64_t only_case = -1;
  std::set<std::string> kinds = {"json", "toml", "run", "mesh", "plan", "h5", "prim", "ckpt", "cli"};
  int time_limit_s = 20;
  bool verbose = false;
  std::string source_dir = TRIDENT_SOURCE_DIR;
  std::string keep;        // copy failing inputs here
  bool no_isolation = false;  // read every dump in-process (shows what the isolation of read_state catches)
};

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct Rng {
  std::mt19937_64 g;
  explicit Rng(uint64_t s) : g(s) {}
  uint64_t u64() { return g(); }
  int64_t range(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(g() % static_cast<uint64_t>(hi - lo + 1)); }
  bool coin(double p = 0.5) { return std::uniform_real_distribution<double>(0, 1)(g) < p; }
  template <class T>
  const T& pick(const std::vector<T>& v) {
    return v[static_cast<size_t>(g() % v.size())];
  }
};

std::string read_file(const std::string& p) {  // in one read (a character iterator is slow under ASan)
  std::ifstream in(p, std::ios::binary | std::ios::ate);
  if (!in) return {};
  std::string s(static_cast<size_t>(std::max<std::streamoff>(in.tellg(), 0)), '\0');
  in.seekg(0);
  in.read(s.data(), static_cast<std::streamsize>(s.size()));
  s.resize(static_cast<size_t>(std::max<std::streamsize>(in.gcount(), 0)));
  return s;
}
void write_file(const std::string& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(s.data(), static_cast<std::streamsize>(s.size()));
}

// What a case did (for the summary and the failure line). announce() sends the mutation to the parent before
// the input is loaded, so a case that crashes or hangs still says what it was.
int g_report_fd = -1;
struct Outcome {
  std::string mutation;
  bool announced = false;
  void announce() {
    const std::string line = mutation + "\n";
    if (g_report_fd >= 0) (void)!::write(g_report_fd, line.data(), line.size());
    announced = true;
  }
};

// Exit codes of a case's child process: none is 1, the exit code of a sanitizer finding (UBSan exits with 1 after
// its report, ASan too without abort_on_error), so a finding is a failure, never taken for a rejected input.
enum : int { kLoaded = 20, kRejected = 21, kOtherException = 22, kInvariant = 23, kSkipped = 24 };

[[noreturn]] void invariant(const std::string& what) { throw std::logic_error("invariant: " + what); }

// Thrown when a mutation could not be made (the case is counted as skipped). An exception rather than exit():
// exit() would run LeakSanitizer's scan of the whole inherited heap in the case's process.
struct Skipped {};

// ---------------------------------------------------------------------------------------------------------------
// Config mutations

const std::vector<std::string> kIntLiterals = {
    "0", "1", "-1", "2", "3", "7", "8", "64", "4096", "4097", "65536", "65537", "1048577", "16777217",
    "2147483647", "2147483648", "-2147483649", "9007199254740993", "2305843009213693953", "4611686018427387905",
    "9223372036854775807", "-9223372036854775808", "9223372036854775808", "18446744073709551615",
    "18446744073709551616", "99999999999999999999", "-99999999999999999999"};
const std::vector<std::string> kFloatLiterals = {"0.0", "-0.0", "0.5", "1.0", "1.5", "1e-300", "5e-324", "1e308",
                                                 "1.7976931348623157e308", "1e309", "-1e309", "1e999", "2.0",
                                                 "1000000.5", "10000.0", "1e12", "1.0000001e12"};

// A random valid model config (small), as JSON.
json random_config(Rng& r) {
  model::Config c = model::Config::preset(r.pick<std::string>({"tiny", "tiny-gqa", "tiny-e64"}));
  c.vocab = r.range(2, 600);
  c.d_model = r.range(1, 80);
  c.layers = r.range(1, 4);
  c.dense_layers = r.range(0, c.layers);
  c.heads = r.range(1, 6);
  if (c.attn == model::AttnKind::gqa) {
    c.kv_heads = 1;
    for (int64_t k = c.heads; k >= 1; --k)
      if (c.heads % k == 0 && r.coin()) c.kv_heads = k;
    c.head_dim = 2 * r.range(1, 12);
  } else {
    c.nope_dim = r.range(1, 20);
    c.rope_dim = 2 * r.range(1, 6);
    c.v_dim = r.range(1, 20);
    c.kv_lora_rank = r.range(1, 40);
  }
  c.experts = r.range(1, 9);
  c.top_k = r.range(1, c.experts);
  c.expert_ffn = r.range(1, 40);
  c.shared_ffn = r.range(0, 40);
  c.dense_ffn = r.range(1, 140);
  c.tile = r.range(1, 64);
  c.vocab_chunk = r.range(1, 300);
  c.seed = r.u64();
  c.validate();
  return c.to_json();
}

// The integer keys and their bounds (docs/model.md "Limits"), for values around and below the bounds.
const std::vector<std::pair<std::string, int64_t>> kBoundedKeys = {
    {"vocab", model::limits::vocab},       {"d_model", model::limits::d_model},
    {"layers", model::limits::layers},     {"dense_layers", model::limits::layers},
    {"experts", model::limits::experts},   {"top_k", model::limits::experts},
    {"expert_ffn", model::limits::expert_ffn}, {"shared_ffn", model::limits::expert_ffn},
    {"dense_ffn", model::limits::dense_ffn}, {"tile", model::limits::tile},
    {"vocab_chunk", model::limits::vocab_chunk}, {"attention.heads", model::limits::heads},
    {"attention.kv_heads", model::limits::heads}, {"attention.head_dim", model::limits::head_dim},
    {"attention.nope_dim", model::limits::head_dim}, {"attention.rope_dim", model::limits::head_dim},
    {"attention.v_dim", model::limits::head_dim}, {"attention.kv_lora_rank", model::limits::kv_lora_rank}};

// A log-uniform value in [1, 2 * bound], or the bound itself or one past it.
int64_t around_bound(Rng& r, int64_t bound) {
  switch (r.range(0, 3)) {
    case 0: return bound;
    case 1: return bound + 1;
    default: {
      const int bits = static_cast<int>(r.range(0, 63 - __builtin_clzll(static_cast<uint64_t>(bound)) + 1));
      return std::max<int64_t>(1, static_cast<int64_t>(r.u64() % (uint64_t{1} << bits)));
    }
  }
}

// A JSON value of an interesting kind.
json interesting_json(Rng& r) {
  switch (r.range(0, 9)) {
    case 0:
    case 1:
    case 2: {
      const std::string& lit = r.pick(kIntLiterals);
      try {
        return json::parse(lit);  // big literals become unsigned or floating
      } catch (...) {
        return 0;
      }
    }
    case 3:
      try {
        return json::parse(r.pick(kFloatLiterals));  // 1e309 and beyond: nlohmann refuses them
      } catch (...) {
        return 0.5;
      }
    case 4: return r.pick<std::string>({"", "mla", "gqa", "fp64", "fp32", "bf16", "MLA", std::string(5000, 'x')});
    case 5: return r.coin();
    case 6: return nullptr;
    case 7: return json::array({1, 2});
    case 8: return json::object({{"kind", "mla"}});
    default: return static_cast<int64_t>(r.range(-5, 300));
  }
}

// Text-level damage shared by JSON and TOML.
std::string damage_text(Rng& r, std::string t, std::string& what) {
  if (t.empty()) t = " ";
  switch (r.range(0, 6)) {
    case 0: {
      const int n = static_cast<int>(r.range(1, 4));
      for (int i = 0; i < n; ++i) t[static_cast<size_t>(r.range(0, static_cast<int64_t>(t.size()) - 1))] ^=
          static_cast<char>(1 << r.range(0, 7));
      what = fmt::format("text: {} bit flip(s)", n);
      break;
    }
    case 1: {
      const size_t at = static_cast<size_t>(r.range(0, static_cast<int64_t>(t.size())));
      t.resize(at);
      what = fmt::format("text: truncated at {}", at);
      break;
    }
    case 2: {
      const size_t at = static_cast<size_t>(r.range(0, static_cast<int64_t>(t.size()) - 1));
      const size_t n = static_cast<size_t>(r.range(1, 20));
      t.erase(at, n);
      what = fmt::format("text: {} bytes deleted at {}", n, at);
      break;
    }
    case 3: {
      const size_t at = static_cast<size_t>(r.range(0, static_cast<int64_t>(t.size())));
      std::string junk;
      const int64_t n = r.range(1, 16);
      for (int64_t i = 0; i < n; ++i) junk.push_back(static_cast<char>(r.range(0, 255)));
      t.insert(at, junk);
      what = fmt::format("text: {} random bytes inserted at {}", n, at);
      break;
    }
    case 4: {  // every digit run replaced by a huge one
      std::string o;
      for (size_t i = 0; i < t.size(); ++i) {
        if (std::isdigit(static_cast<unsigned char>(t[i])) && r.coin(0.3)) {
          o += "99999999999999999999999";
          while (i + 1 < t.size() && std::isdigit(static_cast<unsigned char>(t[i + 1]))) ++i;
        } else {
          o.push_back(t[i]);
        }
      }
      t = o;
      what = "text: digit runs widened";
      break;
    }
    case 5: {
      const size_t at = static_cast<size_t>(r.range(0, static_cast<int64_t>(t.size())));
      const int64_t depth = r.pick<int64_t>({10, 65, 1000, 200000});
      t.insert(at, std::string(static_cast<size_t>(depth), r.coin() ? '[' : '{'));
      what = fmt::format("text: {} open brackets at {}", depth, at);
      break;
    }
    default: {
      t = std::string(static_cast<size_t>(r.range(0, 64)), static_cast<char>(r.range(0, 255)));
      what = "text: replaced by junk";
    }
  }
  return t;
}

// A model config as TOML text (top-level keys, then the [attention] table).
std::string to_toml(const json& c) {
  std::string top, att;
  auto lit = [](const json& v) -> std::string {
    if (v.is_string()) return json(v.get<std::string>()).dump();
    if (v.is_number_float()) {
      std::string s = v.dump();
      if (s.find_first_of(".eE") == std::string::npos) s += ".0";
      return s;
    }
    return v.dump();
  };
  for (auto it = c.begin(); it != c.end(); ++it) {
    if (it.key() == "attention") {
      for (auto a = it->begin(); a != it->end(); ++a) att += a.key() + " = " + lit(*a) + "\n";
    } else {
      top += it.key() + " = " + lit(*it) + "\n";
    }
  }
  return top + "\n[attention]\n" + att;
}

const std::vector<std::string> kTomlValues = {
    "99999999999999999999", "-99999999999999999999", "9223372036854775807", "-9223372036854775808",
    "9_223_372_036_854_775_808", "0xFFFFFFFFFFFFFFFFFF", "0x7FFFFFFFFFFFFFFF", "0o7777777777777777777777777",
    "0b11111111111111111111111111111111111111111111111111111111111111111111", "1e999", "-1e999", "1e308",
    "inf", "-inf", "nan", "+nan", "0.0", "-0.0", "1_000", "0", "-1", "2305843009213693953", "4611686018427387905",
    "\"8\"", "\"\"", "true", "[1, 2]", "{ a = 1 }", "1979-05-27T07:32:00Z", "07:32:00", "'lit'", "\"\"\"multi\"\"\"",
    "[[[[[[[[[[1]]]]]]]]]]", "4097", "65537", "131073", "262145", "1048577", "16777217", "1e12", "1.0000001e12"};

// One model-config case. Returns the mutation description; throws what Config::load throws.
void config_case(Rng& r, bool toml_kind, const std::string& dir, Outcome& o) {
  json base;
  if (r.coin(0.7)) base = random_config(r);
  else base = model::Config::preset(r.pick<std::string>({"tiny", "tiny-gqa", "tiny-e64"})).to_json();
  std::string text;
  std::vector<std::string> steps;
  if (r.coin(0.3)) {  // mild: valid syntax, one or two integers around or below their bounds
    const int64_t n = r.range(1, 2);
    for (int64_t s = 0; s < n; ++s) {
      const auto& [key, bound] = r.pick(kBoundedKeys);
      const int64_t v = around_bound(r, bound);
      json& obj = key.rfind("attention.", 0) == 0 ? base["attention"] : base;
      const std::string k = key.rfind("attention.", 0) == 0 ? key.substr(10) : key;
      if (!obj.contains(k)) continue;
      obj[k] = v;
      steps.push_back(fmt::format("{} = {}", key, v));
    }
    text = toml_kind ? to_toml(base) : base.dump(2);
  } else if (!toml_kind) {
    json j = base;
    const int64_t n = r.range(1, 3);
    for (int64_t s = 0; s < n; ++s) {
      const bool in_att = r.coin(0.3);
      json& obj = in_att ? j["attention"] : j;
      if (!obj.is_object() || obj.empty()) break;
      std::vector<std::string> keys;
      for (auto it = obj.begin(); it != obj.end(); ++it) keys.push_back(it.key());
      const std::string key = r.pick(keys);
      const std::string path = (in_att ? "attention." : "") + key;
      switch (r.range(0, 5)) {
        case 0: obj.erase(key); steps.push_back("delete " + path); break;
        case 1: obj["unknown_" + key] = 1; steps.push_back("add unknown key next to " + path); break;
        default: {
          json v = interesting_json(r);
          steps.push_back(fmt::format("{} = {}", path, v.dump().substr(0, 40)));
          obj[key] = std::move(v);
        }
      }
    }
    text = j.dump(r.coin() ? 2 : -1);
    if (r.coin(0.15)) {  // a duplicate key, at the text level
      const std::vector<std::string> keys = {"\"vocab\"", "\"tile\"", "\"heads\"", "\"attention\"", "\"seed\""};
      const std::string k = r.pick(keys);
      const size_t at = text.find(k);
      if (at != std::string::npos) {
        text.insert(at, k + ": 3, ");
        steps.push_back("duplicate " + k);
      }
    }
    if (r.coin(0.35)) {
      std::string w;
      text = damage_text(r, text, w);
      steps.push_back(w);
    }
  } else {
    text = to_toml(base);
    const int64_t n = r.range(1, 3);
    for (int64_t s = 0; s < n; ++s) {
      // the lines "key = value"
      std::vector<size_t> starts;
      for (size_t i = 0; i < text.size(); i = text.find('\n', i) + 1) {
        if (text.find(" = ", i) < text.find('\n', i)) starts.push_back(i);
        if (text.find('\n', i) == std::string::npos) break;
      }
      if (starts.empty()) break;
      const size_t ls = r.pick(starts), le = text.find('\n', ls);
      const size_t eq = text.find(" = ", ls);
      const std::string key = text.substr(ls, eq - ls);
      switch (r.range(0, 6)) {
        case 0: text.erase(ls, le - ls + 1); steps.push_back("delete " + key); break;
        case 1: text.insert(ls, text.substr(ls, le - ls + 1)); steps.push_back("duplicate line " + key); break;
        case 2: {
          std::string chain = "deep";
          const int64_t d = r.pick<int64_t>({3, 70, 5000});
          for (int64_t i = 0; i < d; ++i) chain += ".k";
          text.insert(ls, chain + " = 1\n");
          steps.push_back(fmt::format("dotted key of depth {}", d));
          break;
        }
        default: {
          const std::string v = r.pick(kTomlValues);
          text.replace(eq + 3, le - eq - 3, v);
          steps.push_back(key + " = " + v.substr(0, 40));
        }
      }
    }
    if (r.coin(0.3)) {
      std::string w;
      text = damage_text(r, text, w);
      steps.push_back(w);
    }
  }
  for (const auto& s : steps) o.mutation += (o.mutation.empty() ? "" : "; ") + s;
  const std::string path = dir + (toml_kind ? "/case.toml" : "/case.json");
  write_file(path, text);
  o.announce();
  const model::Config c = model::Config::load(path);
  // Loaded: the invariants of a validated config.
  c.validate();
  const int64_t n = c.param_count();
  if (n <= 0 || n > model::limits::params) invariant(fmt::format("param_count {} out of (0, bound]", n));
  int64_t sum = 0;
  for (const auto& p : model::param_layout(c)) {
    int64_t e = 1;
    for (int64_t d : p.shape) {
      if (d <= 0) invariant(fmt::format("parameter {} has a dimension {}", p.name, d));
      e = model::checked_mul(e, d, "fuzz: parameter size");
    }
    sum = model::checked_add(sum, e, "fuzz: parameter sum");
  }
  if (sum != n) invariant(fmt::format("param_count {} != the layout's {}", n, sum));
  try {
    model::RunConfig{}.validate_for(c);
  } catch (const Error&) {
  }
}

void run_config_case(Rng& r, Outcome& o) {
  json j = model::RunConfig{}.to_json();
  std::vector<std::string> keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys.push_back(it.key());
  const int64_t n = r.range(1, 3);
  for (int64_t s = 0; s < n; ++s) {
    const std::string key = r.pick(keys);
    if (r.coin(0.15)) {
      j.erase(key);
      o.mutation += "delete " + key + "; ";
    } else {
      json v = interesting_json(r);
      o.mutation += fmt::format("{} = {}; ", key, v.dump().substr(0, 40));
      j[key] = std::move(v);
    }
  }
  std::string text = j.dump();
  if (r.coin(0.3)) {
    std::string w;
    text = damage_text(r, text, w);
    o.mutation += w;
  }
  o.announce();
  const model::RunConfig rc = model::RunConfig::from_json(parse_json_strict(text, "run.json"));
  rc.validate();
  try {
    rc.validate_for(model::Config::preset("tiny"));
  } catch (const Error&) {
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Mesh strings (--mesh) and planner configs

void mesh_case(Rng& r, Outcome& o) {
  static const std::vector<std::string> keys = {"d_rep", "fsdp", "cp", "e_fsdp", "ep", "dp", "", "CP", "ep "};
  static const std::vector<std::string> vals = {"1",  "2",   "3",   "4",          "64",   "0",   "-1",  "",
                                                "1.5", "1e3", " 2 ", "1048576", "1048577", "9223372036854775807",
                                                "9223372036854775808", "99999999999999999999", "0x10", "+4", "x"};
  std::string text;
  const int64_t n = r.range(0, 6);
  for (int64_t i = 0; i < n; ++i) {
    if (i) text += r.coin(0.95) ? "," : r.pick<std::string>({";", ",,", " , ", ""});
    const std::string key = r.coin(0.85) ? keys[static_cast<size_t>(r.range(0, 4))] : r.pick(keys);
    const std::string val = r.coin(0.8) ? vals[static_cast<size_t>(r.range(0, 4))] : r.pick(vals);
    text += key + (r.coin(0.95) ? "=" : r.pick<std::string>({"==", ":", ""})) + val;
  }
  if (r.coin(0.2)) {
    std::string w;
    text = damage_text(r, text, w);
    o.mutation += w + "; ";
  }
  o.mutation += fmt::format("mesh '{}'", text.substr(0, 80));
  o.announce();
  const MeshShape m = parse_mesh(text);
  // Parsed: what parse_mesh promises, and the rules give a verdict without crashing.
  for (int64_t v : {m.d_rep, m.fsdp, m.cp, m.e_fsdp, m.ep})
    if (v < 1 || v > kMaxMeshDim) invariant(fmt::format("mesh size {} out of [1, {}]", v, kMaxMeshDim));
  if (!(parse_mesh(m.spec()) == m)) invariant("mesh does not round-trip through spec(): " + m.spec());
  (void)violations(m, {.experts = r.range(1, 300), .sequences = r.range(1, 300), .seq_len = r.range(1, 4096),
                       .tile = r.range(1, 64), .ep_chunks = r.range(1, 8)});
}

void plan_case(Rng& r, const std::string& source_dir, const std::string& dir, Outcome& o) {
  const std::string ex = r.pick<std::string>({"nvl72_1m.json", "nvl8_256k_a.json", "nvl8_2dcp_1m.json"});
  std::ifstream f(source_dir + "/planner/examples/" + ex);
  json j = parse_json_strict(std::string(std::istreambuf_iterator<char>(f), {}), ex);
  o.mutation += ex + ": ";
  const int64_t n = r.range(1, 3);
  for (int64_t s = 0; s < n; ++s) {
    const std::string sec = r.pick<std::string>({"model", "cluster", "workload", "mesh"});
    if (!j.contains(sec)) continue;
    std::vector<std::string> keys;
    for (auto it = j[sec].begin(); it != j[sec].end(); ++it) keys.push_back(it.key());
    if (keys.empty()) continue;
    const std::string key = r.pick(keys);
    if (r.coin(0.1)) {
      j[sec].erase(key);
      o.mutation += fmt::format("delete {}.{}; ", sec, key);
    } else {
      json v = r.coin(0.5) ? json(r.pick<double>({1e308, 1.7976931348623157e308, 1e300, 1e-300, 5e-324, 1e30, 0.0,
                                                  -1.0, 1e15, 9.0e15, 1e16, 0.5, 2.0, 72.0}))
                           : interesting_json(r);
      o.mutation += fmt::format("{}.{} = {}; ", sec, key, v.dump().substr(0, 40));
      j[sec][key] = std::move(v);
    }
  }
  if (r.coin(0.2) && j.contains("mesh")) {
    j.erase("mesh");
    o.mutation += "delete mesh (search); ";
  }
  std::string text = j.dump();
  if (r.coin(0.15)) {
    std::string w;
    text = damage_text(r, text, w);
    o.mutation += w;
  }
  const std::string path = dir + "/plan.json";
  std::ofstream(path) << text;
  o.announce();
  planner::RunOptions opt;
  opt.config_path = path;
  opt.json = r.coin();
  std::ostringstream out;
  const int rc = planner::run_plan(opt, out);
  // A plan was produced: every number in it is finite (an overflow is an error, never a printed inf or nan).
  const std::string rep = out.str();
  for (const char* bad : {"inf", "nan", "NaN", "Inf"}) {
    for (size_t at = rep.find(bad); at != std::string::npos; at = rep.find(bad, at + 1)) {
      const bool word_before = at > 0 && std::isalpha(static_cast<unsigned char>(rep[at - 1]));
      const bool word_after = at + 3 < rep.size() && std::isalpha(static_cast<unsigned char>(rep[at + 3]));
      if (!word_before && !word_after) invariant(fmt::format("plan output has '{}' (exit code {})", bad, rc));
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// HDF5 bases and mutations

struct Base {
  std::string path;
  bool sealed = false;
  std::string name;
};

golden::StateDump generic_dump(uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<double> nd;
  golden::StateDump s;
  s.config = {{"preset", "fuzz"}, {"policy", "fp64"}, {"vocab", 16}};
  s.seed = seed;
  s.repro = "fuzz_inputs";
  s.optimizer = {{"lr", 1e-3}};
  std::vector<int32_t> tok(6), tgt(6);
  for (int i = 0; i < 6; ++i) {
    tok[i] = static_cast<int32_t>(g() % 16);
    tgt[i] = i == 2 ? -100 : static_cast<int32_t>(g() % 16);
  }
  s.tokens = golden::make_tensor("tokens", {2, 3}, std::span<const int32_t>(tok));
  s.targets = golden::make_tensor("targets", {2, 3}, std::span<const int32_t>(tgt));
  s.loss = 1.25;
  std::vector<double> d(12);
  std::vector<float> f(12);
  for (auto& x : d) x = nd(g);
  for (auto& x : f) x = static_cast<float>(nd(g));
  std::vector<int32_t> iv = {1, -2, 3, std::numeric_limits<int32_t>::min()};
  const double one = 3.5;
  for (auto* grp : {&s.weights, &s.grads, &s.weights_after}) {
    grp->push_back(golden::make_tensor("a.f64", {3, 4}, std::span<const double>(d)));
    grp->push_back(golden::make_tensor("b.f32", {2, 2, 3}, std::span<const float>(f)));
    grp->push_back(golden::make_tensor_bf16("c.bf16", {12}, std::span<const float>(f)));
    grp->push_back(golden::make_tensor("d.i32", {2, 2}, std::span<const int32_t>(iv)));
    grp->push_back(golden::make_tensor("e.scalar", {}, std::span<const double>(&one, 1)));
    grp->push_back(golden::make_tensor("f.empty", {0, 3}, std::span<const float>()));
  }
  return s;
}

golden::StateDump model_dump(uint64_t seed) {
  model::Config c = goldentest::micro_config(24, 4);
  c.validate();
  const auto ps = model::ParamSet<float>::init(c, seed);
  golden::StateDump s;
  s.config = c.to_json();
  s.seed = seed;
  s.repro = "fuzz_inputs model base";
  s.optimizer = {{"name", "adamw"}, {"lr", 1e-3}};
  std::vector<int32_t> tok(8), tgt(8);
  for (int i = 0; i < 8; ++i) {
    tok[i] = (i * 5 + 1) % 24;
    tgt[i] = i == 3 ? -100 : (i * 7 + 2) % 24;
  }
  s.tokens = golden::make_tensor("tokens", {2, 4}, std::span<const int32_t>(tok));
  s.targets = golden::make_tensor("targets", {2, 4}, std::span<const int32_t>(tgt));
  s.loss = 3.0;
  for (size_t p = 0; p < ps.size(); ++p) {
    const auto& t = ps.t[p];
    auto nt = golden::make_tensor(ps.info[p].name, t.shape, std::span<const float>(t.data.data(), t.data.size()));
    s.weights.push_back(nt);
    s.grads.push_back(nt);
    s.weights_after.push_back(nt);
  }
  return s;
}

const std::vector<std::string> kSignatures = {"GCOL", "OHDR", "OCHK", "TREE", "HEAP", "SNOD", "BTHD", "BTIN",
                                              "BTLF", "FRHP", "FHDB", "FHIB", "FSHD", "FSSE", "SMTB", "SMLI",
                                              "\x89HDF"};

std::string byte_mutation(Rng& r, std::string b, std::string& what) {
  const int64_t size = static_cast<int64_t>(b.size());
  switch (r.range(0, 6)) {
    case 0:
    case 1: {  // bit flips anywhere
      const int64_t n = r.range(1, 8);
      for (int64_t i = 0; i < n; ++i) b[static_cast<size_t>(r.range(0, size - 1))] ^= static_cast<char>(1 << r.range(0, 7));
      what = fmt::format("bytes: {} bit flip(s)", n);
      break;
    }
    case 2:
    case 3: {  // flips right after a metadata signature (global heap, object headers, B-trees, local heaps, ...)
      std::vector<size_t> at;
      for (const auto& sig : kSignatures)
        for (size_t p = b.find(sig); p != std::string::npos; p = b.find(sig, p + 1)) at.push_back(p);
      if (at.empty()) at.push_back(0);
      const size_t p0 = r.pick(at);
      const int64_t n = r.range(1, 4);
      for (int64_t i = 0; i < n; ++i) {
        const size_t p = std::min<size_t>(b.size() - 1, p0 + static_cast<size_t>(r.range(0, 255)));
        b[p] ^= static_cast<char>(1 << r.range(0, 7));
      }
      what = fmt::format("bytes: {} flip(s) within 256 bytes of the '{}' at {}", n, b.substr(p0, 4) == "\x89HDF"
                                                                                       ? std::string("HDF5 signature")
                                                                                       : b.substr(p0, 4),
                         p0);
      break;
    }
    case 4: {
      const int64_t at = r.range(0, size - 1), n = std::min<int64_t>(size - at, r.range(1, 64));
      const int fill = static_cast<int>(r.range(0, 2));
      for (int64_t i = 0; i < n; ++i)
        b[static_cast<size_t>(at + i)] = fill == 0 ? '\0' : fill == 1 ? '\xff' : static_cast<char>(r.range(0, 255));
      what = fmt::format("bytes: {} bytes at {} overwritten ({})", n, at, fill == 0 ? "zeros" : fill == 1 ? "0xff" : "random");
      break;
    }
    case 5: {
      const int64_t at = r.coin(0.2) ? r.range(0, 600) : r.range(0, size);
      b.resize(static_cast<size_t>(at));
      what = fmt::format("bytes: truncated to {} of {}", at, size);
      break;
    }
    default: {
      const int64_t n = r.range(1, 4096);
      for (int64_t i = 0; i < n; ++i) b.push_back(static_cast<char>(r.range(0, 255)));
      what = fmt::format("bytes: {} bytes appended", n);
    }
  }
  return b;
}

// HDF5 C API helpers for structural mutations (any failure: the mutation is skipped, not the reader tested).
struct H5Fail {};
hid_t ck(hid_t id) {
  if (id < 0) throw H5Fail{};
  return id;
}

hid_t interesting_type(Rng& r, std::string& what) {
  switch (r.range(0, 12)) {
    case 0: what = "int8"; return H5Tcopy(H5T_STD_I8LE);
    case 1: what = "int32"; return H5Tcopy(H5T_STD_I32LE);
    case 2: what = "int64"; return H5Tcopy(H5T_STD_I64LE);
    case 3: what = "uint64"; return H5Tcopy(H5T_STD_U64LE);
    case 4: what = "uint16"; return H5Tcopy(H5T_STD_U16BE);
    case 5: what = "f32be"; return H5Tcopy(H5T_IEEE_F32BE);
    case 6: what = "f64"; return H5Tcopy(H5T_IEEE_F64LE);
    case 7: {
      what = "vlen string";
      hid_t t = H5Tcopy(H5T_C_S1);
      H5Tset_size(t, H5T_VARIABLE);
      return t;
    }
    case 8: {
      const size_t n = static_cast<size_t>(r.pick<int64_t>({1, 7, 64, 5000}));
      what = fmt::format("fixed string[{}]", n);
      hid_t t = H5Tcopy(H5T_C_S1);
      H5Tset_size(t, n);
      return t;
    }
    case 9: {
      what = "compound";
      hid_t t = H5Tcreate(H5T_COMPOUND, 16);
      H5Tinsert(t, "a", 0, H5T_NATIVE_INT64);
      H5Tinsert(t, "b", 8, H5T_NATIVE_DOUBLE);
      return t;
    }
    case 10: what = "opaque"; return H5Tcreate(H5T_OPAQUE, 8);
    case 11: what = "vlen int"; return H5Tvlen_create(H5T_NATIVE_INT);
    default: {
      what = "array int[3]";
      const hsize_t d = 3;
      return H5Tarray_create2(H5T_NATIVE_INT, 1, &d);
    }
  }
}

// Fills a buffer with contents valid for `type` (strings: interesting texts, numbers: interesting values).
void write_attr_data(Rng& r, hid_t attr, hid_t type, hssize_t n) {
  if (n <= 0) return;
  const H5T_class_t c = H5Tget_class(type);
  if (c == H5T_STRING && H5Tis_variable_str(type) > 0) {
    const std::vector<std::string> texts = {"1", "", "{\"a\": 1, \"a\": 2}", "[1, 2]", "{\"policy\": \"fp64\"}",
                                            std::string(300, '[') , "{\"attention\": {}}", "not json", "2",
                                            "{\"vocab\": 16, \"preset\": \"fuzz\", \"policy\": \"fp64\"}"};
    std::vector<std::string> keep(static_cast<size_t>(n));
    std::vector<const char*> ptr(static_cast<size_t>(n));
    for (hssize_t i = 0; i < n; ++i) {
      keep[static_cast<size_t>(i)] = r.pick(texts);
      ptr[static_cast<size_t>(i)] = keep[static_cast<size_t>(i)].c_str();
    }
    H5Awrite(attr, type, ptr.data());
    return;
  }
  if (c == H5T_VLEN) return;  // left unwritten (reads as empty sequences)
  const size_t es = H5Tget_size(type);
  std::vector<unsigned char> buf(es * static_cast<size_t>(n));
  for (auto& x : buf) x = static_cast<unsigned char>(r.range(0, 255));
  if (c == H5T_INTEGER && r.coin(0.5))
    for (hssize_t i = 0; i < n; ++i) {  // small values, e.g. schema_version 1 or 2
      std::memset(buf.data() + static_cast<size_t>(i) * es, 0, es);
      buf[static_cast<size_t>(i) * es] = static_cast<unsigned char>(r.range(0, 3));
    }
  H5Awrite(attr, type, buf.data());
}

std::string replace_attr(Rng& r, hid_t obj, const char* name) {
  if (H5Aexists(obj, name) > 0) ck(H5Adelete(obj, name));
  if (r.coin(0.1)) return fmt::format("attribute '{}' deleted", name);
  std::string tw;
  const hid_t t = ck(interesting_type(r, tw));
  hid_t sp;
  std::string sw;
  switch (r.range(0, 3)) {
    case 0: sp = H5Screate(H5S_SCALAR); sw = "scalar"; break;
    case 1: sp = H5Screate(H5S_NULL); sw = "null"; break;
    default: {
      const hsize_t d = static_cast<hsize_t>(r.pick<int64_t>({0, 1, 2, 3, 64, 1000, 100000}));
      sp = H5Screate_simple(1, &d, nullptr);
      sw = fmt::format("[{}]", d);
    }
  }
  ck(sp);
  const hid_t a = ck(H5Acreate2(obj, name, t, sp, H5P_DEFAULT, H5P_DEFAULT));
  write_attr_data(r, a, t, H5Sget_simple_extent_npoints(sp));
  H5Aclose(a);
  H5Sclose(sp);
  H5Tclose(t);
  return fmt::format("attribute '{}' := {} {}", name, tw, sw);
}

std::vector<std::string> dataset_paths(hid_t f) {
  std::vector<std::string> out = {"inputs/tokens", "inputs/targets", "loss"};
  for (const char* g : {"weights", "grads", "weights_after"}) {
    const hid_t gid = H5Gopen2(f, g, H5P_DEFAULT);
    if (gid < 0) continue;
    H5G_info_t info;
    if (H5Gget_info(gid, &info) >= 0)
      for (hsize_t i = 0; i < info.nlinks; ++i) {
        char name[512];
        if (H5Lget_name_by_idx(gid, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name, H5P_DEFAULT) > 0)
          out.push_back(std::string(g) + "/" + name);
      }
    H5Gclose(gid);
  }
  return out;
}

std::string replace_dataset(Rng& r, hid_t f, const std::string& path) {
  ck(H5Ldelete(f, path.c_str(), H5P_DEFAULT));
  switch (r.range(0, 9)) {
    case 0: return "dataset '" + path + "' deleted";
    case 1: ck(H5Lcreate_soft("/loss", f, path.c_str(), H5P_DEFAULT, H5P_DEFAULT)); return path + " := soft link";
    case 2:
      ck(H5Lcreate_external("elsewhere.h5", "/x", f, path.c_str(), H5P_DEFAULT, H5P_DEFAULT));
      return path + " := external link";
    case 3: {
      const hid_t g = ck(H5Gcreate2(f, path.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
      H5Gclose(g);
      return path + " := group";
    }
    default: break;
  }
  std::string tw;
  const hid_t t = ck(r.coin(0.6) ? H5Tcopy(r.pick<hid_t>({H5T_IEEE_F64LE, H5T_IEEE_F32LE, H5T_STD_I32LE,
                                                           H5T_STD_U16LE, H5T_IEEE_F32BE, H5T_STD_I64LE}))
                                 : interesting_type(r, tw));
  if (tw.empty()) tw = "a numeric type";
  const int rank = static_cast<int>(r.pick<int64_t>({0, 1, 2, 2, 3, 9, 12}));
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  for (auto& d : dims) d = static_cast<hsize_t>(r.range(0, 4));
  const bool huge = rank > 0 && r.coin(0.15);
  if (huge) dims[0] = hsize_t{1} << r.range(30, 60);
  const hid_t sp = ck(rank == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(rank, dims.data(), nullptr));
  const hid_t dcpl = ck(H5Pcreate(H5P_DATASET_CREATE));
  std::string layout = "contiguous";
  if (rank > 0 && !huge && r.coin(0.3)) {
    std::vector<hsize_t> chunk(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) chunk[i] = std::max<hsize_t>(1, dims[i]);
    H5Pset_chunk(dcpl, rank, chunk.data());
    layout = "chunked";
  } else if (!huge && r.coin(0.2)) {
    H5Pset_layout(dcpl, H5D_COMPACT);
    layout = "compact";
  }
  const hid_t ds = H5Dcreate2(f, path.c_str(), t, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  if (ds < 0) throw H5Fail{};
  const hssize_t n = H5Sget_simple_extent_npoints(sp);
  const bool written = !huge && r.coin(0.7) && H5Tget_class(t) != H5T_VLEN && !(H5Tget_class(t) == H5T_STRING &&
                                                                                 H5Tis_variable_str(t) > 0);
  if (written && n > 0) {
    std::vector<unsigned char> buf(H5Tget_size(t) * static_cast<size_t>(n));
    for (auto& x : buf) x = static_cast<unsigned char>(r.range(0, 255));
    H5Dwrite(ds, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data());
  }
  std::string attr = "no dtype attribute";
  if (r.coin(0.8)) {
    const std::string d = r.pick<std::string>({"f64", "f32", "i32", "bf16", "f16", ""});
    const hid_t st = H5Tcopy(H5T_C_S1);
    H5Tset_size(st, H5T_VARIABLE);
    const hid_t asp = H5Screate(H5S_SCALAR);
    const hid_t a = H5Acreate2(ds, "dtype", st, asp, H5P_DEFAULT, H5P_DEFAULT);
    const char* p = d.c_str();
    if (a >= 0) H5Awrite(a, st, &p);
    if (a >= 0) H5Aclose(a);
    H5Sclose(asp);
    H5Tclose(st);
    attr = "dtype '" + d + "'";
  }
  H5Dclose(ds);
  H5Pclose(dcpl);
  H5Sclose(sp);
  H5Tclose(t);
  std::string dimstr;
  for (auto d : dims) dimstr += (dimstr.empty() ? "" : ",") + std::to_string(d);
  return fmt::format("{} := {} [{}] {} {}, {}", path, tw, dimstr, layout, written ? "written" : "unwritten", attr);
}

std::string structural_mutation(Rng& r, const std::string& file) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const hid_t f = ck(H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
  std::string what;
  try {
    const int64_t n = r.range(1, 2);
    for (int64_t s = 0; s < n; ++s) {
      std::string w;
      switch (r.range(0, 5)) {
        case 0:
        case 1: {
          const hid_t root = ck(H5Gopen2(f, "/", H5P_DEFAULT));
          w = replace_attr(r, root, r.pick<std::string>({"schema_version", "seed", "config", "repro", "optimizer",
                                                         "generator"}).c_str());
          H5Gclose(root);
          break;
        }
        case 2: {
          const std::string p = r.pick(dataset_paths(f));
          const hid_t ds = H5Dopen2(f, p.c_str(), H5P_DEFAULT);
          if (ds < 0) throw H5Fail{};
          w = p + ": " + replace_attr(r, ds, "dtype");
          H5Dclose(ds);
          break;
        }
        case 3:
        case 4: w = replace_dataset(r, f, r.pick(dataset_paths(f))); break;
        default: {
          const std::string g = r.pick<std::string>({"inputs", "weights", "grads", "weights_after"});
          if (r.coin()) {
            ck(H5Ldelete(f, g.c_str(), H5P_DEFAULT));
            w = "group /" + g + " deleted";
          } else {
            const auto names = dataset_paths(f);
            const std::string from = r.pick(names), to = r.pick(names);
            if (from == to) throw H5Fail{};
            ck(H5Ldelete(f, to.c_str(), H5P_DEFAULT));
            ck(H5Lcreate_hard(f, from.c_str(), f, to.c_str(), H5P_DEFAULT, H5P_DEFAULT));
            w = to + " := hard link to " + from;
          }
        }
      }
      what += (what.empty() ? "" : "; ") + w;
    }
  } catch (const H5Fail&) {
    H5Fclose(f);
    throw;
  }
  if (H5Fclose(f) < 0) throw H5Fail{};
  return what;
}

bool g_no_isolation = false;

void h5_case(Rng& r, const std::vector<Base>& bases, const std::string& dir, Outcome& o) {
  const Base& b = r.pick(bases);
  const std::string file = dir + "/case.h5";
  bool in_process_ok = false;  // whether HDF5 only sees metadata the HDF5 library itself wrote
  if (r.coin(0.5)) {
    std::string w;
    const std::string bytes = byte_mutation(r, read_file(b.path), w);
    write_file(file, bytes);
    o.mutation = b.name + ", " + w;
    in_process_ok = b.sealed;  // the checksum stops corrupt bytes before HDF5
    if (b.sealed && r.coin(0.4)) {
      try {
        golden::seal_checksum(file);  // a corrupt HDF5 file under a valid checksum: HDF5 itself parses damage
        o.mutation += ", re-sealed";
        in_process_ok = false;
      } catch (const Error&) {
        o.mutation += ", re-seal refused";
      }
    }
  } else {
    fs::copy_file(b.path, file, fs::copy_options::overwrite_existing);
    try {
      o.mutation = b.name + ", " + structural_mutation(r, file);
    } catch (const H5Fail&) {
      throw Skipped{};
    }
    in_process_ok = true;
    if (b.sealed && r.coin(0.85)) {
      golden::seal_checksum(file);
      o.mutation += ", re-sealed";
    }
  }
  const bool isolate = !g_no_isolation && !(in_process_ok && r.coin(0.5));
  if (!isolate) o.mutation += ", read in-process";
  o.announce();
  const golden::StateDump s = golden::read_state(file, {.isolate = isolate});
  // Loaded: what the reader promises.
  golden::validate_state(s, "fuzz");
  for (const auto* g : {&s.weights, &s.grads, &s.weights_after})
    for (const auto& t : *g)
      if (t.bytes.size() != static_cast<size_t>(t.numel()) * golden::dtype_size(t.dtype))
        invariant("tensor '" + t.name + "' bytes vs shape");
  if (!golden::compare_states(s, s).equal) invariant("a loaded dump differs from itself");
}

// ---------------------------------------------------------------------------------------------------------------
// Primitive goldens (primitives.h5): the bases are a few cases of the checked-in tiny golden, written with and
// without the checksum and the case manifest, on one rank and on two. A case damages bytes, replaces an input
// value (indices, segments, positions, sizes, the rope table), deletes a case, an output or a rank, or changes a
// root attribute; then the file is read, every case validated against its op's contract and one of them
// replayed with the reference kernels. Silent passes: a sealed file changed and not re-sealed that loads, and a
// re-sealed file with a case, an output or a rank deleted (or `ranks` / `mesh` changed) that loads.

struct PrimBase {
  std::string path;
  bool sealed = false;
  int ranks = 1;
  std::string name;
};

golden::PrimitivesFile prim_subset(const std::string& source_dir, int ranks) {
  const golden::PrimitivesFile full =
      golden::read_primitives(source_dir + "/golden/data/primitives/tiny/primitives.h5");
  static const std::set<std::string> keep = {"mm", "wgrad_acc", "embedding_forward", "router_backward",
                                             "moe_combine_backward", "gather_rows", "attn_qkv_forward",
                                             "linear_ce_forward"};
  golden::PrimitivesFile f = full;
  f.cases.clear();
  std::set<std::string> seen;
  for (const golden::PrimCase& c : full.cases)
    if (keep.count(c.op) && seen.insert(c.op).second) f.cases.push_back(c);
  f.ranks = ranks;
  f.mesh["spec"] = ranks == 1 ? "d_rep=1,fsdp=1,cp=1,e_fsdp=1,ep=1" : "d_rep=1,fsdp=2,cp=1,e_fsdp=1,ep=2";
  f.comm.assign(static_cast<size_t>(ranks), full.comm.empty() ? std::vector<golden::CommRecord>{} : full.comm[0]);
  if (ranks > 1) {
    const size_t n = f.cases.size();
    for (size_t i = 0; i < n; ++i) {
      golden::PrimCase c = f.cases[i];
      c.rank = 1;
      f.cases.push_back(std::move(c));
    }
  }
  return f;
}

// Every dataset and group path of a file (visited through the C API), sorted.
std::vector<std::string> h5_paths(hid_t f, H5O_type_t type) {
  struct Acc {
    H5O_type_t type;
    std::vector<std::string> out;
  } acc{type, {}};
  H5Ovisit(
      f, H5_INDEX_NAME, H5_ITER_INC,
      [](hid_t, const char* name, const H5O_info_t* info, void* d) -> herr_t {
        auto* a = static_cast<Acc*>(d);
        if (info->type == a->type && std::string(name) != ".") a->out.push_back(name);
        return 0;
      },
      &acc);
  std::sort(acc.out.begin(), acc.out.end());
  return acc.out;
}

// Overwrites element `i` of a dataset with `v` (converted to the dataset's type by HDF5).
void poke(hid_t ds, int64_t i, double v, bool as_int) {
  hid_t sp = ck(H5Dget_space(ds));
  const hssize_t n = H5Sget_simple_extent_npoints(sp);
  if (n <= 0) {
    H5Sclose(sp);
    throw H5Fail{};
  }
  hsize_t coord[8] = {};
  const int rank = H5Sget_simple_extent_ndims(sp);
  std::vector<hsize_t> dims(static_cast<size_t>(std::max(rank, 1)), 1);
  if (rank > 0) H5Sget_simple_extent_dims(sp, dims.data(), nullptr);
  int64_t rem = i % n;
  for (int k = rank - 1; k >= 0; --k) {
    coord[k] = static_cast<hsize_t>(rem % static_cast<int64_t>(dims[static_cast<size_t>(k)]));
    rem /= static_cast<int64_t>(dims[static_cast<size_t>(k)]);
  }
  if (rank > 0) H5Sselect_elements(sp, H5S_SELECT_SET, 1, coord);
  hsize_t one = 1;
  hid_t mem = ck(H5Screate_simple(1, &one, nullptr));
  herr_t st;
  if (as_int) {
    const int64_t x = static_cast<int64_t>(v);
    st = H5Dwrite(ds, H5T_NATIVE_INT64, mem, rank > 0 ? sp : H5S_ALL, H5P_DEFAULT, &x);
  } else {
    st = H5Dwrite(ds, H5T_NATIVE_DOUBLE, mem, rank > 0 ? sp : H5S_ALL, H5P_DEFAULT, &v);
  }
  H5Sclose(mem);
  H5Sclose(sp);
  if (st < 0) throw H5Fail{};
}

void set_str_attr(hid_t obj, const char* name, const std::string& v) {
  if (H5Aexists(obj, name) > 0) H5Adelete(obj, name);
  hid_t t = ck(H5Tcopy(H5T_C_S1));
  H5Tset_size(t, H5T_VARIABLE);
  H5Tset_cset(t, H5T_CSET_UTF8);
  hid_t sp = ck(H5Screate(H5S_SCALAR));
  hid_t a = ck(H5Acreate2(obj, name, t, sp, H5P_DEFAULT, H5P_DEFAULT));
  const char* p = v.c_str();
  const herr_t st = H5Awrite(a, t, &p);
  H5Aclose(a), H5Sclose(sp), H5Tclose(t);
  if (st < 0) throw H5Fail{};
}
std::string get_str_attr(hid_t obj, const char* name) {
  hid_t a = ck(H5Aopen(obj, name, H5P_DEFAULT));
  hid_t t = ck(H5Tcopy(H5T_C_S1));
  H5Tset_size(t, H5T_VARIABLE);
  char* p = nullptr;
  const herr_t st = H5Aread(a, t, &p);
  std::string v = p ? p : "";
  if (p) H5free_memory(p);
  H5Tclose(t), H5Aclose(a);
  if (st < 0) throw H5Fail{};
  return v;
}

// A structural or value mutation of a primitive golden. `must_reject`: the reader must refuse the result when the
// file carries a manifest (a deletion or a changed rank count).
std::string prim_mutation(Rng& r, const std::string& file, bool& must_reject) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  if (f < 0) throw H5Fail{};
  std::string what;
  try {
    const std::vector<std::string> ds = h5_paths(f, H5O_TYPE_DATASET), gs = h5_paths(f, H5O_TYPE_GROUP);
    std::vector<std::string> inputs, outputs, cases, ints;
    for (const std::string& p : ds) {
      if (p.find("/inputs/") != std::string::npos) inputs.push_back(p);
      if (p.find("/outputs/") != std::string::npos) outputs.push_back(p);
    }
    for (const std::string& p : inputs) {
      hid_t d = ck(H5Dopen2(f, p.c_str(), H5P_DEFAULT));
      hid_t t = H5Dget_type(d);
      if (H5Tget_class(t) == H5T_INTEGER) ints.push_back(p);
      H5Tclose(t), H5Dclose(d);
    }
    for (const std::string& g : gs) {
      const size_t at = g.rfind('/');
      if (at != std::string::npos && g.find("primitives/") != std::string::npos && g.size() > at + 1 &&
          g[at + 1] == 'c' && std::count(g.begin(), g.end(), '/') == (g.rfind("ranks/", 0) == 0 ? 4 : 2))
        cases.push_back(g);
    }
    const int kind = static_cast<int>(r.range(0, 9));
    if (kind <= 3 && !ints.empty()) {  // an index, segment, position or count
      const std::string p = r.pick(ints);
      const double v = r.pick<double>({-2147483648.0, -1, -2, 1e9, 2147483647.0, 4294967296.0, 1e15, 0, 1, 3, 64,
                                       -100, 9.0e18});
      hid_t d = ck(H5Dopen2(f, p.c_str(), H5P_DEFAULT));
      const int64_t i = r.range(0, 1 << 20);
      try {
        poke(d, i, v, true);
      } catch (...) {
        H5Dclose(d);
        throw;
      }
      H5Dclose(d);
      what = fmt::format("{}[{}] = {:.0f}", p, i, v);
    } else if (kind == 4 && !inputs.empty()) {  // a float input value
      const std::string p = r.pick(inputs);
      hid_t d = ck(H5Dopen2(f, p.c_str(), H5P_DEFAULT));
      const double v = r.pick<double>({std::nan(""), INFINITY, -INFINITY, 1e38, -0.0, 3e38});
      try {
        poke(d, r.range(0, 1 << 20), v, false);
      } catch (...) {
        H5Dclose(d);
        throw;
      }
      H5Dclose(d);
      what = fmt::format("{} element = {}", p, v);
    } else if (kind == 5) {  // the rope table (or another input) replaced by an empty dataset
      std::vector<std::string> ropes;
      for (const std::string& p : inputs)
        if (p.find("rope.") != std::string::npos || r.coin(0.05)) ropes.push_back(p);
      if (ropes.empty()) throw H5Fail{};
      const std::string p = r.pick(ropes);
      hid_t d = ck(H5Dopen2(f, p.c_str(), H5P_DEFAULT));
      const std::string dt = get_str_attr(d, "dtype");
      hid_t t = H5Dget_type(d);
      H5Dclose(d);
      if (H5Ldelete(f, p.c_str(), H5P_DEFAULT) < 0) throw H5Fail{};
      hsize_t zero = 0;
      hid_t sp = ck(H5Screate_simple(1, &zero, nullptr));
      hid_t nd = ck(H5Dcreate2(f, p.c_str(), t, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
      set_str_attr(nd, "dtype", dt);
      H5Dclose(nd), H5Sclose(sp), H5Tclose(t);
      what = p + " replaced by an empty dataset";
      must_reject = true;  // an empty input where its scalars say otherwise: refused with or without a manifest
      if (p.find("rope.") == std::string::npos) must_reject = false;  // some inputs may legally be empty
    } else if (kind == 6 && !cases.empty()) {  // a scalar of a case's shapes
      const std::string g = r.pick(cases);
      hid_t gid = ck(H5Gopen2(f, g.c_str(), H5P_DEFAULT));
      json sh = json::parse(get_str_attr(gid, "shapes"));
      std::vector<std::string> keys;
      for (auto it = sh.begin(); it != sh.end(); ++it)
        if (it->is_number_integer()) keys.push_back(it.key());
      if (keys.empty()) {
        H5Gclose(gid);
        throw H5Fail{};
      }
      const std::string k = r.pick(keys);
      sh[k] = r.pick<int64_t>({-1, 0, 1000000000, 2147483648, -2147483648, INT64_MAX, 3});
      set_str_attr(gid, "shapes", sh.dump());
      H5Gclose(gid);
      what = fmt::format("{} shapes.{} = {}", g, k, sh[k].dump());
    } else if (kind == 7 && !cases.empty()) {  // a case deleted
      const std::string g = r.pick(cases);
      if (H5Ldelete(f, g.c_str(), H5P_DEFAULT) < 0) throw H5Fail{};
      what = g + " deleted";
      must_reject = true;
    } else if (kind == 8 && !outputs.empty()) {  // an output deleted
      const std::string p = r.pick(outputs);
      if (H5Ldelete(f, p.c_str(), H5P_DEFAULT) < 0) throw H5Fail{};
      what = p + " deleted";
      must_reject = true;
    } else {  // the rank count or the mesh changed
      hid_t root = ck(H5Gopen2(f, "/", H5P_DEFAULT));
      if (r.coin()) {
        const int64_t v = r.pick<int64_t>({1, 2, 3, 4, 0, -1, 65536});
        H5Adelete(root, "ranks");
        hid_t sp = ck(H5Screate(H5S_SCALAR));
        hid_t a = ck(H5Acreate2(root, "ranks", H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT));
        H5Awrite(a, H5T_NATIVE_INT64, &v);
        H5Aclose(a), H5Sclose(sp);
        what = fmt::format("root ranks = {}", v);
        json mesh = json::parse(get_str_attr(root, "mesh"));
        const MeshShape ms = parse_mesh(mesh["spec"].get<std::string>());
        must_reject = v != ms.world();
      } else {
        json mesh = json::parse(get_str_attr(root, "mesh"));
        const std::string spec = r.pick<std::string>({"d_rep=1,fsdp=2,cp=2,e_fsdp=2,ep=2", "d_rep=4", "cp=2,ep=2"});
        const MeshShape before = parse_mesh(mesh["spec"].get<std::string>()), after = parse_mesh(spec);
        mesh["spec"] = spec;
        set_str_attr(root, "mesh", mesh.dump());
        what = "root mesh spec = " + spec;
        must_reject = before.world() != after.world();
      }
      H5Gclose(root);
    }
  } catch (...) {
    H5Fclose(f);
    throw;
  }
  if (H5Fclose(f) < 0) throw H5Fail{};
  if (what.empty()) throw H5Fail{};
  return what;
}

void prim_case(Rng& r, const std::vector<PrimBase>& bases, const std::string& dir, Outcome& o) {
  const PrimBase& b = r.pick(bases);
  const std::string file = dir + "/primitives.h5";
  bool changed_unsealed = false, must_reject = false;
  if (r.coin(0.4)) {
    std::string w;
    const std::string orig = read_file(b.path);
    const std::string bytes = byte_mutation(r, orig, w);
    write_file(file, bytes);
    o.mutation = b.name + ", " + w;
    changed_unsealed = b.sealed && bytes != orig;
    if (b.sealed && r.coin(0.3)) {
      try {
        golden::seal_checksum(file);
        o.mutation += ", re-sealed";
        changed_unsealed = false;
      } catch (const Error&) {
        o.mutation += ", re-seal refused";
      }
    }
  } else {
    fs::copy_file(b.path, file, fs::copy_options::overwrite_existing);
    try {
      o.mutation = b.name + ", " + prim_mutation(r, file, must_reject);
    } catch (const H5Fail&) {
      throw Skipped{};
    }
    must_reject = must_reject && (b.sealed || o.mutation.find("ranks =") != std::string::npos ||
                                  o.mutation.find("mesh spec") != std::string::npos ||
                                  o.mutation.find("rope.") != std::string::npos);
    if (b.sealed) {
      if (r.coin(0.9)) {
        golden::seal_checksum(file);
        o.mutation += ", re-sealed";
      } else {
        changed_unsealed = true;
      }
    }
  }
  o.announce();
  // Damaged bytes are read isolated, as `trident check` reads every file: HDF5 itself may crash on them (the
  // forked child turns that into one error). Structural edits are read in-process half of the time, as state dumps.
  const bool coin = r.coin(0.5);
  const bool isolate = !g_no_isolation && (coin || o.mutation.find("bytes: ") != std::string::npos);
  const golden::PrimitivesFile f = golden::read_primitives(file, {.isolate = isolate});
  golden::validate_cases(f);
  if (changed_unsealed) invariant("a sealed primitive golden changed without re-sealing loaded (silent pass)");
  if (must_reject) invariant("a damaged primitive golden loaded and validated (silent pass)");
  // Loaded and valid: a case replays with the reference kernels (an Error is fine, a crash is not).
  for (int k = 0; k < 1 && !f.cases.empty(); ++k) {
    const golden::PrimCase& c = r.pick(f.cases);
    const auto out = c.dtype == "f64" ? golden::reference_outputs<double>(c) : golden::reference_outputs<float>(c);
    if (out.size() != c.outputs.size()) invariant("a replayed case gives another number of outputs than it stores");
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Checkpoint values: one small checkpoint (the micro model, one rank, step 3); a case sets one value of a rank file
// (params, exp_avg, exp_avg_sq) to NaN, an infinity, a huge, negative or ordinary number, or edits a manifest field,
// and re-seals the CRCs (or not). Invalid restored state must be refused (never loaded: a silent pass), valid state
// must load.

std::string g_ckpt_base;

void reseal_checkpoint(const std::string& dir) {
  json m = json::parse(read_file(dir + "/manifest.json"));
  for (json& e : m["files"]) {
    const std::string b = read_file(dir + "/" + e["path"].get<std::string>());
    e["bytes"] = b.size();
    e["crc32"] = fmt::format("{:08x}", golden::crc32(std::span<const std::byte>(
                                           reinterpret_cast<const std::byte*>(b.data()), b.size())));
  }
  m.erase("checksum");
  const std::string c = m.dump();
  m["checksum"] =
      fmt::format("{:08x}", golden::crc32(std::span<const std::byte>(reinterpret_cast<const std::byte*>(c.data()),
                                                                     c.size())));
  write_file(dir + "/manifest.json", m.dump(1) + "\n");
}

void ckpt_case(Rng& r, const std::string& dir, Outcome& o) {
  const std::string ck_dir = dir + "/ck";
  fs::copy(g_ckpt_base, ck_dir, fs::copy_options::recursive);
  bool valid = true, damaged = false;
  const double pick = std::uniform_real_distribution<double>(0, 1)(r.g);
  if (pick < 0.25) {  // damaged bytes of the rank file: HDF5 itself parses them when the CRC is re-sealed
    const std::string file = ck_dir + "/rank_00000.h5";
    std::string w;
    const std::string orig = read_file(file), bytes = byte_mutation(r, orig, w);
    write_file(file, bytes);
    damaged = bytes != orig;  // (bytes overwritten by the same bytes change nothing)
    o.mutation = "rank_00000.h5 " + w;
  } else if (pick < 0.85) {  // a value
    const std::string file = ck_dir + "/rank_00000.h5";
    hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    if (f < 0) throw Skipped{};
    const std::vector<std::string> ds = h5_paths(f, H5O_TYPE_DATASET);
    if (ds.empty()) throw Skipped{};
    const std::string p = r.pick(ds);
    const bool is_v = p.rfind("exp_avg_sq/", 0) == 0, is_m = p.rfind("exp_avg/", 0) == 0;
    const double v = r.pick<double>({std::nan(""), INFINITY, -INFINITY, 3e38, -3e38, -1e-30, -1.0, 0.5, -0.5, 1e-3,
                                     0.0, 1.5, 2.5, 5.0});
    bool ok = std::isfinite(v);
    if (is_v) ok = ok && v >= 0 && v <= 4.0;
    if (is_m) ok = ok && std::fabs(v) <= 2.0;
    hid_t d = H5Dopen2(f, p.c_str(), H5P_DEFAULT);
    try {
      poke(d, r.range(0, 1 << 16), v, false);
    } catch (const H5Fail&) {
      H5Dclose(d), H5Fclose(f);
      throw Skipped{};
    }
    H5Dclose(d);
    H5Fclose(f);
    valid = ok;
    o.mutation = fmt::format("{} element = {}", p, v);
  } else {  // a manifest field
    json m = json::parse(read_file(ck_dir + "/manifest.json"));
    switch (r.range(0, 5)) {
      case 0: m["tensors"][static_cast<size_t>(r.range(0, 3))]["kind"] = r.pick<std::string>({"expert", "buffer", "x"}); break;
      case 1: m["writer"] = "someone"; break;
      case 2: m["data"]["kind"] = "file"; break;
      case 3: m["extra"] = 1; break;
      case 4: m["tensors"][0]["trainable"] = false; break;
      default: m["generator"] = 7; break;
    }
    write_file(ck_dir + "/manifest.json", m.dump(1));
    valid = false;
    o.mutation = "manifest field edited";
  }
  const bool reseal = r.coin(0.9);
  if (reseal) reseal_checkpoint(ck_dir);
  else o.mutation += ", not re-sealed";
  o.announce();
  const model::TrainState<float> st = golden::load_checkpoint<float>(ck_dir);
  if (!reseal && (damaged || pick >= 0.25))
    invariant("a checkpoint changed without re-sealing loaded (silent pass)");
  if (!valid) invariant("an invalid checkpoint loaded (silent pass)");
  // Loaded (damaged bytes may hit only tensor data): what loading promises, every value finite.
  for (const model::ParamSet<float>* set : {&st.params, &st.m, &st.v})
    for (const auto& t : set->t)
      for (float x : t.data)
        if (!std::isfinite(x)) invariant(damaged ? "a damaged checkpoint loaded a non-finite value" : "non-finite");
}

// ---------------------------------------------------------------------------------------------------------------
// Command-line numbers: the option validators and number parsers of the CLI (positive integers, byte sizes, world
// ranges). Accepted values must be what they claim; NaN, infinities, values beyond the type and junk are refused.

void cli_case(Rng& r, Outcome& o) {
  std::vector<std::string> lit = kIntLiterals;
  lit.insert(lit.end(), kFloatLiterals.begin(), kFloatLiterals.end());
  for (const char* x : {"nan", "NaN", "-nan", "inf", "-inf", "Infinity", "", " ", " 1", "1 ", "0x10", "1e3", "+5",
                        "1.5", "abc", "999999999999999999999999999999", "1GiB", "8 GiB", "1e20GiB", "nanGiB",
                        "-1GiB", "0GiB", "1:0", "0:1", "1:", ":1", "1:100001"})
    lit.push_back(x);
  std::string v = r.pick(lit);
  if (r.coin(0.2)) v += r.pick<std::string>({"GiB", "MiB", "B", "x", ":4", ":9999999999"});
  const int which = static_cast<int>(r.range(0, 2));
  o.mutation = fmt::format("'{}' as {}", v, which == 0 ? "a positive integer" : which == 1 ? "bytes" : "a world range");
  o.announce();
  if (which == 0) {
    std::string copy = v;
    const std::string err = cli::positive_int()(copy);
    if (err.empty()) {
      size_t used = 0;
      const long long x = std::stoll(v, &used);
      if (used != v.size() || x < 1) invariant("positive_int accepted '" + v + "'");
    }
    if (!err.empty()) throw Error(err);
  } else if (which == 1) {
    const double b = emu::parse_bytes(v);
    if (!std::isfinite(b) || !(b >= 1)) invariant(fmt::format("parse_bytes('{}') = {}", v, b));
  } else {
    int64_t lo = 0, hi = 0;
    planner::parse_world_range(v, lo, hi);
    if (lo < 1 || hi < lo || hi - lo > 100000) invariant(fmt::format("world range '{}' = {}:{}", v, lo, hi));
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Driver

const char* kind_of(int64_t i) {
  static const char* schedule[16] = {"json", "toml", "h5",   "prim", "json", "h5",   "run", "ckpt",
                                     "toml", "h5",   "mesh", "prim", "json", "cli",  "h5",  "plan"};
  return schedule[i % 16];
}

std::vector<PrimBase> g_prim_bases;

// Runs case i in the current process; returns the exit code (kLoaded/kRejected/...), message in `msg`.
int run_case(const Options& opt, const std::vector<Base>& bases, int64_t i, const std::string& dir, Outcome& o,
             std::string& msg) {
  Rng r(splitmix(opt.seed ^ splitmix(static_cast<uint64_t>(i) + 0x5151)));
  const std::string kind = kind_of(i);
  try {
    if (kind == "json") config_case(r, false, dir, o);
    else if (kind == "toml") config_case(r, true, dir, o);
    else if (kind == "run") run_config_case(r, o);
    else if (kind == "mesh") mesh_case(r, o);
    else if (kind == "plan") plan_case(r, opt.source_dir, dir, o);
    else if (kind == "prim") prim_case(r, g_prim_bases, dir, o);
    else if (kind == "ckpt") ckpt_case(r, dir, o);
    else if (kind == "cli") cli_case(r, o);
    else h5_case(r, bases, dir, o);
    return kLoaded;
  } catch (const Skipped&) {
    return kSkipped;
  } catch (const Error& e) {
    msg = e.what();
    return kRejected;
  } catch (const std::logic_error& e) {
    msg = e.what();
    return std::string(e.what()).rfind("invariant:", 0) == 0 ? kInvariant : kOtherException;
  } catch (const std::exception& e) {
    msg = fmt::format("{} (not a trident::Error)", e.what());
    return kOtherException;
  } catch (...) {
    msg = "unknown exception type";
    return kOtherException;
  }
}

// Runs `f` in a forked child process; returns "" when it succeeded, else what went wrong.
std::string in_child(const std::function<void()>& f) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return "fork failed";
  if (pid == 0) {
    ::close(fds[0]);
    std::string err;
    try {
      f();
    } catch (const std::exception& e) {
      err = e.what();
    }
    (void)!::write(fds[1], err.data(), err.size());
    ::_exit(err.empty() ? 0 : 1);
  }
  ::close(fds[1]);
  std::string err;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    err.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) && err.empty())
    err = fmt::format("the process ended with status {}", status);
  return err;
}

int usage() {
  std::fprintf(stderr,
               "usage: fuzz_inputs [--seed S] [--cases N] [--case I] [--kinds json,toml,run,mesh,plan,h5,prim,ckpt,cli]\n"
               "                   [--time-limit SEC] [--verbose] [--source-dir DIR] [--keep DIR] [--no-isolation]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int a = 1; a < argc; ++a) {
    const std::string s = argv[a];
    auto next = [&]() -> std::string {
      if (a + 1 >= argc) std::exit(usage());
      return argv[++a];
    };
    if (s == "--seed") opt.seed = std::stoull(next());
    else if (s == "--cases") opt.cases = std::stoll(next());
    else if (s == "--case") opt.only_case = std::stoll(next());
    else if (s == "--time-limit") opt.time_limit_s = std::stoi(next());
    else if (s == "--verbose") opt.verbose = true;
    else if (s == "--source-dir") opt.source_dir = next();
    else if (s == "--keep") opt.keep = next();
    else if (s == "--no-isolation") opt.no_isolation = g_no_isolation = true;
    else if (s == "--read") {  // read one dump (a kept failing input) and say what happened
      const std::string f = next();
      try {
        const auto d = golden::read_state(f, {.isolate = !g_no_isolation});
        std::printf("loaded: %zu weights\n", d.weights.size());
        return 0;
      } catch (const Error& e) {
        std::printf("rejected: %s\n", e.what());
        return 1;
      }
    }
    else if (s == "--kinds") {
      opt.kinds.clear();
      std::string k = next();
      for (size_t p = 0; p <= k.size();) {
        const size_t q = std::min(k.find(',', p), k.size());
        opt.kinds.insert(k.substr(p, q - p));
        p = q + 1;
      }
    } else return usage();
  }
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const auto t_start = std::chrono::steady_clock::now();
  const fs::path work = fs::temp_directory_path() / fmt::format("trident_fuzz_{}", static_cast<long>(::getpid()));
  fs::create_directories(work);
  struct Cleanup {
    fs::path p;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } cleanup{work};

  // The HDF5 bases: small dumps with and without the checksum, and a checked-in golden file (no checksum); the
  // primitive goldens (1 and 2 ranks, with and without the checksum and manifest); a one-rank checkpoint. Named
  // here, written by a child process: this process forks every case (and a case may fork an isolated reader), and
  // a fork's cost grows with the forking process's resident memory (about 20 ms of CPU a fork at 240 MB under
  // ASan, against 8 ms at 80 MB), so the parent never holds what making the bases allocates.
  std::vector<Base> bases;
  for (bool sealed : {true, false}) {
    const std::string tag = sealed ? "sealed" : "legacy";
    bases.push_back({(work / ("generic_" + tag + ".h5")).string(), sealed, "generic " + tag + " dump"});
    bases.push_back({(work / ("model_" + tag + ".h5")).string(), sealed, "model " + tag + " dump"});
  }
  const std::string micro_golden = opt.source_dir + "/golden/data/micro_fp32_step1.h5";
  if (fs::exists(micro_golden)) bases.push_back({micro_golden, false, "golden/data/micro_fp32_step1.h5"});
  if (opt.kinds.count("prim"))
    for (int ranks : {1, 2})
      for (bool sealed : {true, false})
        g_prim_bases.push_back({(work / fmt::format("prim_{}_{}.h5", ranks, sealed)).string(), sealed, ranks,
                                fmt::format("primitives {} rank(s) {}", ranks, sealed ? "sealed" : "legacy")});
  if (opt.kinds.count("ckpt")) g_ckpt_base = (work / "ckpt_base").string();
  const std::string setup_error = in_child([&] {
    const auto gen = generic_dump(opt.seed), mod = model_dump(opt.seed);
    for (size_t i = 0; i < 4; ++i)
      golden::write_state(bases[i].path, i % 2 == 0 ? gen : mod, {.checksum = bases[i].sealed});
    for (const Base& b : bases) golden::read_state(b.path);  // the bases themselves load
    for (const PrimBase& b : g_prim_bases) {
      golden::write_primitives(b.path, prim_subset(opt.source_dir, b.ranks), {.checksum = b.sealed});
      golden::validate_cases(golden::read_primitives(b.path));
    }
    if (!g_ckpt_base.empty()) {  // the micro model at step 3, moments inside their bounds
      const model::Config cfg = goldentest::micro_config(128, 0);
      golden::CheckpointMeta meta;
      meta.writer = "train";
      meta.cfg = cfg;
      meta.mesh = parse_mesh("d_rep=1");
      meta.step = 3;
      model::TrainState<float> st;
      st.params = model::ParamSet<float>::init(cfg, 1);
      st.m = model::ParamSet<float>::zeros(cfg);
      st.v = model::ParamSet<float>::zeros(cfg);
      st.step = 3;
      std::mt19937_64 g(opt.seed);
      for (size_t p = 0; p < st.m.t.size(); ++p)
        for (size_t i = 0; i < st.m.t[p].data.size(); ++i) {
          st.m.t[p].data[i] = static_cast<float>(static_cast<double>(g() % 2001) / 1000.0 - 1.0) * 0.01f;
          st.v.t[p].data[i] = static_cast<float>(static_cast<double>(g() % 1000) / 1000.0) * 1e-4f;
        }
      golden::save_checkpoint<float>(g_ckpt_base, meta, st);
      (void)golden::load_checkpoint<float>(g_ckpt_base);
    }
  });
  if (!setup_error.empty()) {
    std::fprintf(stderr, "fuzz_inputs: making the bases failed: %s\n", setup_error.c_str());
    return 2;
  }

  const auto t0 = std::chrono::steady_clock::now();
  const double setup_s = std::chrono::duration<double>(t0 - t_start).count();
  std::map<std::string, std::array<int64_t, 5>> count;  // kind -> loaded, rejected, skipped, failed, total
  std::map<std::string, double> cpu;                     // kind -> CPU seconds of its cases (children, reaped)
  auto children_cpu = [] {
    rusage u{};
    ::getrusage(RUSAGE_CHILDREN, &u);
    return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
  };
  const double cpu0 = children_cpu();
  double cpu_last = cpu0;
  int64_t failures = 0;
  const int64_t first = opt.only_case >= 0 ? opt.only_case : 0;
  const int64_t last = opt.only_case >= 0 ? opt.only_case + 1 : opt.cases;
  for (int64_t i = first; i < last; ++i) {
    const std::string kind = kind_of(i);
    if (!opt.kinds.count(kind)) continue;
    const fs::path dir = work / fmt::format("case{}", i);
    fs::create_directories(dir);
    int fds[2];
    if (::pipe(fds) != 0) {
      std::perror("pipe");
      return 2;
    }
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("fork");
      return 2;
    }
    if (pid == 0) {
      ::close(fds[0]);
      ::alarm(static_cast<unsigned>(opt.time_limit_s));
      g_report_fd = fds[1];
      Outcome o;
      std::string msg;
      const int code = run_case(opt, bases, i, dir.string(), o, msg);
      const std::string report = (o.announced ? "" : o.mutation + "\n") + msg;
      (void)!::write(fds[1], report.data(), report.size());
      ::_exit(code);
    }
    ::close(fds[1]);
    std::string report;
    char buf[4096];
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) != 0;) {
      if (n < 0) {
        if (errno == EINTR) continue;
        break;
      }
      report.append(buf, static_cast<size_t>(n));
    }
    ::close(fds[0]);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    const double cpu_now = children_cpu();
    cpu[kind] += cpu_now - cpu_last;
    cpu_last = cpu_now;
    const size_t nl = report.find('\n');
    const std::string mutation = report.substr(0, nl), msg = nl == std::string::npos ? "" : report.substr(nl + 1);
    auto& c = count[kind];
    ++c[4];
    std::string failure;
    if (WIFSIGNALED(status)) {
      failure = WTERMSIG(status) == SIGALRM ? fmt::format("hang: no result within {} s", opt.time_limit_s)
                                            : fmt::format("crash: signal {} ({})", WTERMSIG(status),
                                                          strsignal(WTERMSIG(status)));
    } else if (WIFEXITED(status)) {
      switch (WEXITSTATUS(status)) {
        case kLoaded: ++c[0]; break;
        case kRejected: ++c[1]; break;
        case kSkipped: ++c[2]; break;
        case kInvariant: failure = msg; break;
        case kOtherException: failure = "exception other than trident::Error: " + msg; break;
        default:
          failure = WEXITSTATUS(status) == 1 ? "exit status 1 (a sanitizer finding? its report is above)"
                                             : fmt::format("exit status {}", WEXITSTATUS(status));
      }
    }
    if (opt.verbose) {
      const bool ok = WIFEXITED(status);
      const std::string what = !failure.empty()                                    ? failure
                               : ok && WEXITSTATUS(status) == kSkipped              ? "skipped (the mutation failed)"
                               : ok && WEXITSTATUS(status) == kRejected             ? "rejected: " + msg
                                                                                    : "loaded";
      std::printf("case %lld %s: %s -> %s\n", static_cast<long long>(i), kind.c_str(), mutation.c_str(), what.c_str());
    }
    if (!failure.empty()) {
      ++c[3];
      ++failures;
      std::printf("FAIL case %lld (%s; %s): %s\n  repro: fuzz_inputs --seed %llu --case %lld --verbose\n",
                  static_cast<long long>(i), kind.c_str(), mutation.c_str(), failure.c_str(),
                  static_cast<unsigned long long>(opt.seed), static_cast<long long>(i));
      if (!opt.keep.empty()) {
        std::error_code ec;
        fs::create_directories(opt.keep, ec);
        fs::copy(dir, fs::path(opt.keep) / dir.filename(), fs::copy_options::recursive, ec);
      }
    }
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t total = 0, loaded = 0, rejected = 0, skipped = 0;
  for (const auto& [k, c] : count) {
    std::printf("fuzz %-4s: %5lld cases, %5lld loaded, %5lld rejected (trident::Error), %4lld skipped, %lld failed; "
                "%.1f CPU s (%.1f ms a case)\n",
                k.c_str(), static_cast<long long>(c[4]), static_cast<long long>(c[0]), static_cast<long long>(c[1]),
                static_cast<long long>(c[2]), static_cast<long long>(c[3]), cpu[k],
                c[4] > 0 ? 1e3 * cpu[k] / static_cast<double>(c[4]) : 0.0);
    total += c[4];
    loaded += c[0];
    rejected += c[1];
    skipped += c[2];
  }
  std::printf("fuzz: seed %llu, %lld cases in %.1f s (%.1f CPU s; setup %.1f s): %lld loaded, %lld rejected, %lld "
              "skipped, %lld failures\n",
              static_cast<unsigned long long>(opt.seed), static_cast<long long>(total), secs, cpu_last - cpu0,
              setup_s,
              static_cast<long long>(loaded), static_cast<long long>(rejected), static_cast<long long>(skipped),
              static_cast<long long>(failures));
  return failures == 0 ? 0 : 1;
}
