#include "parallel/layout.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "reference/check.h"

namespace trident::parallel {

std::string MeshShape::str() const {
  return fmt::format("(d_rep,fsdp,cp)x(e_fsdp,ep) = ({},{},{})x({},{})", d_rep, fsdp, cp, e_fsdp, ep);
}

MeshShape parse_mesh(const std::string& spec) {
  MeshShape m;
  std::stringstream ss(spec);
  std::string item;
  std::set<std::string> seen;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    auto eq = item.find('=');
    if (eq == std::string::npos) fail(fmt::format("mesh: '{}' is not key=value (e.g. cp=2)", item));
    std::string key = item.substr(0, eq), val = item.substr(eq + 1);
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
    else fail(fmt::format("mesh: unknown key '{}' (expected d_rep, fsdp, cp, e_fsdp, ep)", key));
  }
  if (m.d_rep * m.fsdp * m.cp > kMaxMeshDim || m.e_fsdp * m.ep > kMaxMeshDim)
    fail(fmt::format("mesh: world size {} exceeds {}", std::max(m.d_rep * m.fsdp * m.cp, m.e_fsdp * m.ep),
                     kMaxMeshDim));
  if (m.d_rep * m.fsdp * m.cp != m.e_fsdp * m.ep)
    fail(fmt::format("mesh: d_rep*fsdp*cp = {} but e_fsdp*ep = {}; both must equal the world size",
                     m.d_rep * m.fsdp * m.cp, m.e_fsdp * m.ep));
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

void validate_layout(const MeshShape& m, int64_t experts, int64_t sequences, int64_t seq_len, int64_t tile,
                     int64_t ep_chunks) {
  const int64_t w = m.world();
  if (m.e_fsdp * m.ep != w)
    fail(fmt::format("mesh {}: d_rep*fsdp*cp = {} != e_fsdp*ep = {}", m.str(), w, m.e_fsdp * m.ep));
  if (experts % m.ep != 0)
    fail(fmt::format("mesh {}: experts % ep != 0 ({} experts over ep = {})", m.str(), experts, m.ep));
  const int64_t groups = m.d_rep * m.fsdp;
  if (sequences % groups != 0)
    fail(fmt::format("mesh {}: sequences % (d_rep*fsdp) != 0 ({} sequences over {} data-parallel groups)",
                     m.str(), sequences, groups));
  if (seq_len % (2 * m.cp) != 0)
    fail(fmt::format("mesh {}: seq_len % (2*cp) != 0 (seq_len {} cannot be cut into {} zig-zag chunks)", m.str(),
                     seq_len, 2 * m.cp));
  const int64_t chunk = seq_len / (2 * m.cp);
  if (chunk % tile != 0)
    fail(fmt::format("mesh {}: zig-zag chunk of {} tokens is not a multiple of the reduction tile T = {}: a tile "
                     "would straddle two CP ranks",
                     m.str(), chunk, tile));
  const int64_t local_tiles = (sequences / groups) * 2 * chunk / tile;
  if (ep_chunks < 1 || ep_chunks > local_tiles)
    fail(fmt::format("EP chunks = {} must be in [1, {}] (the local tokens hold {} reduction tiles; a chunk holds "
                     "whole tiles)",
                     ep_chunks, local_tiles, local_tiles));
}

}  // namespace trident::parallel
