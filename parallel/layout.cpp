#include "parallel/layout.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <sstream>

#include "reference/check.h"

namespace trident {

std::string MeshShape::str() const {
  std::string s = fmt::format("(d_rep,fsdp,cp)x(e_fsdp,ep) = ({},{},{})x({},{})", d_rep, fsdp, cp, e_fsdp, ep);
  if (cp_inner != 1) s += fmt::format(", cp_inner {}", cp_inner);
  return s;
}

std::string MeshShape::spec() const {
  std::string s = fmt::format("d_rep={},fsdp={},cp={},e_fsdp={},ep={}", d_rep, fsdp, cp, e_fsdp, ep);
  if (cp_inner != 1) s += fmt::format(",cp_inner={}", cp_inner);
  return s;
}

MeshShape parse_mesh(const std::string& spec) {
  MeshShape m;
  const auto trim = [](std::string x) {
    const size_t b = x.find_first_not_of(" \t"), e = x.find_last_not_of(" \t");
    return b == std::string::npos ? std::string() : x.substr(b, e - b + 1);
  };
  if (trim(spec).empty()) fail("mesh: empty (e.g. d_rep=1,fsdp=2,cp=2,e_fsdp=2,ep=2; missing keys are 1)");
  std::stringstream ss(spec);
  std::string item;
  std::set<std::string> seen;
  while (std::getline(ss, item, ',')) {
    item = trim(item);
    if (item.empty()) fail(fmt::format("mesh: empty item in '{}'", spec));
    auto eq = item.find('=');
    if (eq == std::string::npos) fail(fmt::format("mesh: '{}' is not key=value (e.g. cp=2)", item));
    std::string key = trim(item.substr(0, eq)), val = trim(item.substr(eq + 1));
    int64_t v = 0;
    try {
      size_t used = 0;
      v = std::stoll(val, &used);
      if (used != val.size()) throw std::invalid_argument(val);
    } catch (const std::exception&) {
      fail(fmt::format("mesh: value of '{}' is not an integer: '{}'", key, val));
    }
    if (v < 1) fail(fmt::format("mesh: {} must be >= 1, got {}", key, v));
    if (v > kMaxMeshDim) fail(fmt::format("mesh: {} = {} exceeds {}", key, v, kMaxMeshDim));
    if (!seen.insert(key).second) fail(fmt::format("mesh: '{}' given twice", key));
    if (key == "d_rep") m.d_rep = v;
    else if (key == "fsdp") m.fsdp = v;
    else if (key == "cp") m.cp = v;
    else if (key == "e_fsdp") m.e_fsdp = v;
    else if (key == "ep") m.ep = v;
    else if (key == "cp_inner") m.cp_inner = v;
    else fail(fmt::format("mesh: unknown key '{}' (expected d_rep, fsdp, cp, e_fsdp, ep, cp_inner)", key));
  }
  if (m.d_rep * m.fsdp * m.cp > kMaxMeshDim || m.e_fsdp * m.ep > kMaxMeshDim)
    fail(fmt::format("mesh: world size {} exceeds {}", std::max(m.d_rep * m.fsdp * m.cp, m.e_fsdp * m.ep),
                     kMaxMeshDim));
  return m;
}

DenseCoord dense_coord(const MeshShape& m, int64_t rank) {
  TD_CHECK(rank >= 0 && rank < m.world(), "rank {} outside world {}", rank, m.world());
  return {rank / (m.fsdp * m.cp), (rank / m.cp) % m.fsdp, rank % m.cp};
}

ExpertCoord expert_coord(const MeshShape& m, int64_t rank) {
  TD_CHECK(rank >= 0 && rank < m.world(), "rank {} outside world {}", rank, m.world());
  return {rank / m.ep, rank % m.ep};
}

std::vector<TokenRange> local_tokens(const MeshShape& m, int64_t rank, int64_t sequences, int64_t seq_len) {
  const int64_t groups = m.d_rep * m.fsdp;
  TD_CHECK(sequences % groups == 0, "{} sequences do not split over d_rep*fsdp = {} data groups", sequences, groups);
  TD_CHECK(seq_len % (2 * m.cp) == 0, "seq_len {} is not a multiple of 2*cp = {}", seq_len, 2 * m.cp);
  const DenseCoord dc = dense_coord(m, rank);
  const int64_t g = dc.d * m.fsdp + dc.f, per = sequences / groups, chunk = seq_len / (2 * m.cp);
  std::vector<TokenRange> out;
  for (int64_t s = g * per; s < (g + 1) * per; ++s) {
    const int64_t lo = dc.c, hi = 2 * m.cp - 1 - dc.c;  // zig-zag: chunk c, then its mirror
    out.push_back({s, lo * chunk, (lo + 1) * chunk});
    out.push_back({s, hi * chunk, (hi + 1) * chunk});
  }
  return out;
}

AttentionWork attention_work(const MeshShape& m, int64_t sequences, int64_t seq_len,
                             const std::vector<int64_t>& doc_start) {
  TD_CHECK(doc_start.empty() || static_cast<int64_t>(doc_start.size()) == sequences * seq_len,
           "attention_work: {} document starts for {} x {} tokens", doc_start.size(), sequences, seq_len);
  AttentionWork w;
  const int64_t W = m.world();
  w.per_rank.assign(static_cast<size_t>(W), 0);
  int64_t total = 0;
  for (int64_t r = 0; r < W; ++r) {
    int64_t& n = w.per_rank[static_cast<size_t>(r)];
    for (const TokenRange& t : local_tokens(m, r, sequences, seq_len))
      for (int64_t p = t.begin; p < t.end; ++p)
        n += p + 1 - (doc_start.empty() ? 0 : doc_start[static_cast<size_t>(t.seq * seq_len + p)]);
    if (n > w.max) w.max = n, w.argmax = r;
    total += n;
  }
  w.mean = static_cast<double>(total) / static_cast<double>(W);
  return w;
}

int64_t ShardSpec::begin_row(int64_t i) const { return std::min(i * rows_per_shard(), rows); }
int64_t ShardSpec::end_row(int64_t i) const { return std::min((i + 1) * rows_per_shard(), rows); }

VocabSlices vocab_slices(int64_t vocab, int64_t vocab_chunk, int64_t fsdp_cp, int64_t requested) {
  TD_CHECK(vocab > 0 && vocab_chunk > 0 && fsdp_cp > 0, "vocab_slices: V {}, vocab_chunk {}, fsdp*cp {}", vocab,
           vocab_chunk, fsdp_cp);
  if (requested < 0) fail(fmt::format("vocabulary slices must be >= 0 (0: one per vocab chunk), got {}", requested));
  const int64_t n_vc = (vocab + vocab_chunk - 1) / vocab_chunk, rps = (vocab + fsdp_cp - 1) / fsdp_cp;
  const int64_t s = requested == 0 ? n_vc : requested;
  VocabSlices out;
  const int64_t nh = std::min(s, n_vc), ne = std::min(s, rps);
  for (int64_t k = 0; k < nh; ++k)
    out.head_cols.push_back({k * n_vc / nh * vocab_chunk, std::min((k + 1) * n_vc / nh * vocab_chunk, vocab)});
  for (int64_t k = 0; k < ne; ++k) out.embed_rows.push_back({k * rps / ne, (k + 1) * rps / ne});
  return out;
}

// ---- Validation ----------------------------------------------------------------------------------------------

const char* rule_text(LayoutRule r) {
  switch (r) {
    case LayoutRule::sizes: return "every size >= 1";
    case LayoutRule::products: return "d_rep*fsdp*cp == e_fsdp*ep";
    case LayoutRule::world: return "d_rep*fsdp*cp == world";
    case LayoutRule::experts: return "experts % ep == 0";
    case LayoutRule::sequences: return "sequences % (d_rep*fsdp) == 0";
    case LayoutRule::zigzag: return "seq_len % (2*cp) == 0";
    case LayoutRule::tile: return "(seq_len / (2*cp)) % tile == 0";
    case LayoutRule::ep_chunks: return "1 <= ep_chunks <= local tiles";
    case LayoutRule::cp_inner: return "cp % cp_inner == 0 and cp_inner <= NVL";
  }
  return "?";
}

namespace {

// a*b, or nothing when it does not fit int64.
std::optional<int64_t> mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
int64_t sat_mul(int64_t a, int64_t b) { return mul(a, b).value_or(INT64_MAX); }
// The smallest multiple of `step` that is >= v (v, step >= 1; the largest multiple when that overflows).
int64_t round_up(int64_t v, int64_t step) {
  const int64_t q = v / step + (v % step != 0 ? 1 : 0);
  return mul(q, step).value_or(INT64_MAX / step * step);
}
// The largest divisor of n (>= 1) that is <= cap (>= 1).
int64_t largest_divisor_upto(int64_t n, int64_t cap) {
  int64_t best = 1;
  for (int64_t i = 1; i <= n / i; ++i)
    if (n % i == 0) {
      if (i <= cap) best = std::max(best, i);
      if (n / i <= cap) best = std::max(best, n / i);
    }
  return best;
}

// Renders the fixes a message offers, in the caller's vocabulary (InputNames).
struct Fixes {
  const InputNames& n;
  std::string value(const std::string& name, int64_t v) const {
    if (name.empty()) return "";
    return n.config_keys ? fmt::format("{} = {}", name, v) : fmt::format("{} {}", name, v);
  }
  std::string mesh(const MeshShape& from, const MeshShape& to) const {
    if (n.mesh.empty()) return "";
    if (!n.config_keys) return fmt::format("{} {}", n.mesh, to.spec());
    std::vector<std::string> parts;
    const std::pair<const char*, std::pair<int64_t, int64_t>> keys[] = {{"d_rep", {from.d_rep, to.d_rep}},
                                                                         {"fsdp", {from.fsdp, to.fsdp}},
                                                                         {"cp", {from.cp, to.cp}},
                                                                         {"e_fsdp", {from.e_fsdp, to.e_fsdp}},
                                                                         {"ep", {from.ep, to.ep}},
                                                                         {"cp_inner", {from.cp_inner, to.cp_inner}}};
    for (const auto& [key, v] : keys)
      if (v.first != v.second) parts.push_back(fmt::format("{}.{} = {}", n.mesh, key, v.second));
    return fmt::format("{}", fmt::join(parts, ", "));
  }
};
// ": use A or B" over the fixes that are not empty; "" when none is.
std::string use(std::initializer_list<std::string> fixes) {
  std::vector<std::string> f;
  for (const auto& s : fixes)
    if (!s.empty()) f.push_back(s);
  return f.empty() ? std::string() : fmt::format(": use {}", fmt::join(f, " or "));
}

// The rules, once. kMessages = false (broken_rules) compiles the messages away: the planner's search runs it for
// millions of meshes.
template <bool kMessages>
uint32_t check_rules(const MeshShape& m, const LayoutInputs& in, const InputNames& names,
                     std::vector<std::string>* out) {
  uint32_t bits = 0;
  const Fixes fix{names};
  auto broken = [&](LayoutRule r, auto&& message) {
    bits |= rule_bit(r);
    if constexpr (kMessages) out->push_back(message());
  };

  // sizes: the mesh (nothing else is checked when it fails) and each given input (its rules are skipped)
  const std::pair<const char*, int64_t> dims[] = {
      {"d_rep", m.d_rep}, {"fsdp", m.fsdp}, {"cp", m.cp}, {"e_fsdp", m.e_fsdp}, {"ep", m.ep}};
  bool mesh_ok = true;
  for (const auto& [key, v] : dims)
    if (v < 1) {
      mesh_ok = false;
      broken(LayoutRule::sizes, [&, key = key, v = v] {
        MeshShape to = m;
        for (int64_t* p : {&to.d_rep, &to.fsdp, &to.cp, &to.e_fsdp, &to.ep}) *p = std::max<int64_t>(*p, 1);
        return fmt::format("mesh size {} = {} must be >= 1{}", key, v, use({fix.mesh(m, to)}));
      });
    }
  if (!mesh_ok) return bits;
  const std::optional<int64_t> groups_o = mul(m.d_rep, m.fsdp);
  const std::optional<int64_t> dense_o = groups_o ? mul(*groups_o, m.cp) : std::nullopt;
  const std::optional<int64_t> expert_o = mul(m.e_fsdp, m.ep);
  if (!dense_o || !expert_o) {
    broken(LayoutRule::sizes, [&] {
      return fmt::format("the mesh {} has more ranks than 64-bit integers hold: use a smaller {}", m.str(),
                         names.mesh.empty() ? "mesh" : names.mesh);
    });
    return bits;
  }
  const int64_t dense = *dense_o, expert = *expert_o;
  auto given = [&](const std::optional<int64_t>& v, const char* label, const std::string& name) {
    if (!v) return false;
    if (*v >= 1) return true;
    broken(LayoutRule::sizes,
           [&] { return fmt::format("{} = {} must be >= 1{}", label, *v, use({fix.value(name, 1)})); });
    return false;
  };
  const bool has_world = given(in.world, "world size", names.world);
  const bool has_experts = given(in.experts, "experts", names.experts);
  const bool has_seqs = given(in.sequences, "sequences", names.sequences);
  const bool has_seq_len = given(in.seq_len, "seq_len", names.seq_len);
  const bool has_tile = given(in.tile, "tile", names.tile);

  // The suggested mesh for the expert rules keeps the dense mesh and picks ep' = gcd(world, ep[, experts]).
  auto expert_fix = [&] {
    int64_t ep = std::gcd(dense, m.ep);
    if (has_experts) ep = std::gcd(ep, *in.experts);
    MeshShape to = m;
    to.ep = ep;
    to.e_fsdp = dense / ep;
    return fix.mesh(m, to);
  };
  if (dense != expert)
    broken(LayoutRule::products, [&] {
      return fmt::format("d_rep*fsdp*cp = {} but e_fsdp*ep = {} (both must be the world size){}", dense, expert,
                         use({expert_fix()}));
    });
  if (has_world && dense != *in.world)
    broken(LayoutRule::world, [&] {
      return fmt::format("d_rep*fsdp*cp = {} but the world size is {}{}", dense, *in.world,
                         use({fix.value(names.world, dense), fmt::format("a mesh of {} ranks", *in.world)}));
    });
  if (has_experts && *in.experts % m.ep != 0)
    broken(LayoutRule::experts, [&] {
      return fmt::format("experts {} is not a multiple of ep = {} (each ep rank owns experts/ep whole experts){}",
                         *in.experts, m.ep, use({expert_fix(), fix.value(names.experts, round_up(*in.experts, m.ep))}));
    });
  const int64_t groups = m.d_rep * m.fsdp;
  const bool seqs_ok = has_seqs && *in.sequences % groups == 0;
  if (has_seqs && !seqs_ok)
    broken(LayoutRule::sequences, [&] {
      return fmt::format("sequences {} do not split over d_rep*fsdp = {} data-parallel groups (each group holds "
                         "whole sequences){}",
                         *in.sequences, groups, use({fix.value(names.sequences, round_up(*in.sequences, groups))}));
    });
  const int64_t two_cp = sat_mul(2, m.cp);
  const bool zigzag_ok = has_seq_len && *in.seq_len % two_cp == 0;
  if (has_seq_len && !zigzag_ok)
    broken(LayoutRule::zigzag, [&] {
      const int64_t step = has_tile ? sat_mul(two_cp, *in.tile) : two_cp;
      std::string f = fix.value(names.seq_len, round_up(*in.seq_len, step));
      if (!f.empty() && step != two_cp)
        f += fmt::format(" (a multiple of 2*cp*tile = {}, so every chunk holds whole reduction tiles)", step);
      return fmt::format("seq_len {} is not a multiple of 2*cp = {} (each sequence is cut into 2*cp zig-zag "
                         "chunks){}",
                         *in.seq_len, two_cp, use({f}));
    });
  const int64_t chunk = zigzag_ok ? *in.seq_len / two_cp : 0;
  const bool tile_ok = zigzag_ok && has_tile && chunk % *in.tile == 0;
  if (zigzag_ok && has_tile && !tile_ok)
    broken(LayoutRule::tile, [&] {
      return fmt::format("the zig-zag chunk seq_len/(2*cp) = {}/{} = {} tokens is not a multiple of the reduction "
                         "tile {}: a reduction tile would straddle two CP ranks{}",
                         *in.seq_len, two_cp, chunk, *in.tile,
                         use({fix.value(names.seq_len, round_up(*in.seq_len, sat_mul(two_cp, *in.tile))),
                              fix.value(names.tile, largest_divisor_upto(chunk, *in.tile))}));
    });
  if (in.ep_chunks) {
    const int64_t n = *in.ep_chunks;
    if (n < 1) {
      broken(LayoutRule::ep_chunks, [&] {
        return fmt::format("EP chunks {} must be >= 1{}", n, use({fix.value(names.ep_chunks, 1)}));
      });
    } else if (seqs_ok && tile_ok) {
      const int64_t per = *in.sequences / groups, tiles = sat_mul(per, 2 * chunk / *in.tile);
      if (n > tiles)
        broken(LayoutRule::ep_chunks, [&] {
          return fmt::format("EP chunks {} exceed the {} reduction tiles a rank holds ({} sequence(s) x 2 zig-zag "
                             "chunks of {} tokens, tile {}; an EP chunk holds whole tiles){}",
                             n, tiles, per, chunk, *in.tile, use({fix.value(names.ep_chunks, tiles)}));
        });
    }
  }
  // 2D CP: the inner groups tile the cp group and each fits one NVLink domain. The fix: the largest divisor of cp
  // that fits the domain (and is not above the requested cp_inner).
  const bool has_nvl = in.nvl && *in.nvl >= 1;
  const bool divides = m.cp_inner >= 1 && m.cp % m.cp_inner == 0;
  if (!divides || (has_nvl && m.cp_inner > *in.nvl))
    broken(LayoutRule::cp_inner, [&] {
      MeshShape to = m;
      to.cp_inner = largest_divisor_upto(m.cp, std::max<int64_t>(1, std::min(m.cp_inner, has_nvl ? *in.nvl : m.cp)));
      if (!divides)
        return fmt::format("cp_inner {} does not divide cp = {} (2D CP: cp/cp_inner NVLink domains of cp_inner "
                           "ranks each){}",
                           m.cp_inner, m.cp, use({fix.mesh(m, to)}));
      return fmt::format("cp_inner {} exceeds the NVLink domain of {} GPUs (an inner CP group must fit one "
                         "domain){}",
                         m.cp_inner, *in.nvl, use({fix.mesh(m, to), fix.value(names.nvl, m.cp_inner)}));
    });
  return bits;
}

}  // namespace

std::vector<std::string> violations(const MeshShape& m, const LayoutInputs& in, const InputNames& names) {
  std::vector<std::string> out;
  check_rules<true>(m, in, names, &out);
  return out;
}

uint32_t broken_rules(const MeshShape& m, const LayoutInputs& in) {
  static const InputNames kNames;
  return check_rules<false>(m, in, kNames, nullptr);
}

void validate(const MeshShape& m, const LayoutInputs& in, const InputNames& names) {
  const std::vector<std::string> v = violations(m, in, names);
  if (v.empty()) return;
  if (v.size() == 1) fail(fmt::format("invalid mesh {}: {}", m.str(), v[0]));
  fail(fmt::format("invalid mesh {}, {} problems:\n  {}", m.str(), v.size(), fmt::join(v, "\n  ")));
}

void validate_layout(const MeshShape& m, int64_t experts, int64_t sequences, int64_t seq_len, int64_t tile,
                     int64_t ep_chunks) {
  validate(m, LayoutInputs{.world = std::nullopt,
                           .experts = experts,
                           .sequences = sequences,
                           .seq_len = seq_len,
                           .tile = tile,
                           .ep_chunks = ep_chunks});
}

}  // namespace trident
