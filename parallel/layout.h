// Parallel layout (docs/parallel.md): which rank holds which tokens, which parameter rows and which
// experts. Pure arithmetic, no communicator: the distributed step, the tests and the planner share it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace trident {

// The mesh of a run (the one mesh type of the emulator, the step and the planner): two meshes over one world.
// Dense rank = (d * fsdp + f) * cp + c; expert rank = ef * ep + p. Whether a shape is usable for a model and a
// batch is violations() below.
struct MeshShape {
  int64_t d_rep = 1, fsdp = 1, cp = 1;  // dense mesh (cp innermost)
  int64_t e_fsdp = 1, ep = 1;           // expert mesh (ep innermost)
  // 2D CP (docs/parallel.md section 5): the cp group as cp/cp_inner NVLink domains of cp_inner consecutive ranks;
  // the KV is gathered across domains first, then inside one. 1: one-dimensional CP (a single cp collective).
  int64_t cp_inner = 1;
  int64_t world() const { return d_rep * fsdp * cp; }
  int64_t cp_outer() const { return cp_inner >= 1 ? cp / cp_inner : 0; }
  bool cp_2d() const { return cp_inner > 1; }
  std::string str() const;              // "(d_rep,fsdp,cp)x(e_fsdp,ep) = (1,1,2)x(1,2)" (+ ", 2D CP 2x2")
  std::string spec() const;             // "d_rep=1,fsdp=1,cp=2,e_fsdp=1,ep=2" (+ ",cp_inner=2"; parse_mesh reads it)
  bool operator==(const MeshShape&) const = default;
};

// Parses "d_rep=4,fsdp=1,cp=64,e_fsdp=4,ep=64" (missing keys default to 1; unknown or repeated keys, values
// < 1 and worlds larger than kMaxMeshDim ranks are rejected). Syntax only: the mesh rules are violations().
inline constexpr int64_t kMaxMeshDim = int64_t{1} << 20;
MeshShape parse_mesh(const std::string& spec);

struct DenseCoord { int64_t d, f, c; };
struct ExpertCoord { int64_t ef, p; };
DenseCoord dense_coord(const MeshShape& m, int64_t rank);
ExpertCoord expert_coord(const MeshShape& m, int64_t rank);

// ---- Data: whole sequences per data-parallel group, zig-zag chunks within a sequence -----------------------
// Group g = d * fsdp + f holds sequences [g * B/G, (g+1) * B/G), G = d_rep * fsdp. Each sequence of length S
// is cut into 2*cp chunks of S/(2 cp) tokens; cp rank c holds chunks c and 2cp-1-c (balances causal work).
struct TokenRange {
  int64_t seq;    // global sequence index
  int64_t begin;  // first global position
  int64_t end;    // one past the last
};
// The local token rows of a rank, in local order: for each of its sequences (ascending), chunk c then chunk
// 2cp-1-c. Concatenating the ranges gives the rank's rows.
std::vector<TokenRange> local_tokens(const MeshShape& m, int64_t rank, int64_t sequences, int64_t seq_len);

// ---- The attention key side's exchange (docs/parallel.md section 5) -----------------------------------------------
// Whether the step sends the causal core's key side over cp as tile partials instead of reduce-scattering exact
// accumulators: 1D CP, a causal core (no DSA, no document mask), and fewer bytes, nt * value_bytes < acc_bytes with
// nt = seq_len / (cp * tile) query tiles per local sequence (rule 7: the tile divides the chunk). The step, the memory
// estimate and the docs follow this one rule (the step also needs a kernel set with attn_core_backward_partials).
inline bool key_side_partials(const MeshShape& m, int64_t seq_len, int64_t tile, bool causal_core, size_t value_bytes,
                              size_t acc_bytes) {
  const int64_t nt = seq_len / (m.cp * tile);
  return !m.cp_2d() && causal_core && static_cast<size_t>(nt) * value_bytes < acc_bytes;
}

// ---- Dense weight gradients as tile partials (docs/parallel.md section 4) ---------------------------------------
// The tiles every rank holds (the same count on each): sequences / (d_rep fsdp) local sequences of seq_len / (cp tile)
// tiles each, where the tile divides the chunk seq_len / (2 cp) (so no tile straddles a chunk); 0 where it does not.
inline int64_t dense_grad_tiles(const MeshShape& m, int64_t sequences, int64_t seq_len, int64_t tile) {
  const int64_t groups = m.d_rep * m.fsdp, chunk = seq_len / (2 * m.cp);
  if (tile <= 0 || groups <= 0 || sequences % groups != 0 || seq_len % (2 * m.cp) != 0 || chunk % tile != 0) return 0;
  return sequences / groups * (2 * chunk / tile);
}
// Whether the step sends a dense weight gradient over fsdp*cp as its nt tile partials instead of reduce-scattering
// exact accumulators: nt > 0 and the send and receive buffers (nt values of T per element each) take no more than the
// accumulators they replace, 2 nt value_bytes <= acc_bytes (exact float: nt <= 7 against 56 B; fp64: nt <= 34 against
// 552 B; never in the plain-sum twin, whose accumulator is one float). One rule for the step, the estimate and the
// docs (the step also needs a kernel set with wgrad_partials).
inline bool dense_grad_partials(const MeshShape& m, int64_t sequences, int64_t seq_len, int64_t tile,
                                size_t value_bytes, size_t acc_bytes) {
  const int64_t nt = dense_grad_tiles(m, sequences, seq_len, tile);
  return nt > 0 && 2 * static_cast<size_t>(nt) * value_bytes <= acc_bytes;
}

// The dense tensors the step exchanges as tile partials where dense_grad_partials holds: the attention projections
// (wq, wk, wv, wo, wdkv, wuk, wuv), the dense MLP's and the shared expert's weights, the MoE router, embed and
// lm_head (slice by slice). The norms and the DSA indexer keep accumulators.
inline bool dense_grad_partial_tensor(const std::string& name) {
  if (name == "embed" || name == "lm_head") return true;
  const std::string w = name.substr(name.rfind('.') + 1);
  if (w == "router") return name.find(".moe.") != std::string::npos;
  if (name.find(".attn.") != std::string::npos)
    return w == "wq" || w == "wk" || w == "wv" || w == "wo" || w == "wdkv" || w == "wuk" || w == "wuv";
  return name.find(".mlp.") != std::string::npos || name.find(".moe.shared.") != std::string::npos;
}

// ---- Packed sequences: attention work per rank ---------------------------------------------------------------
// The query-key pairs a rank's local queries score in one layer's attention core: the sum over its local rows of
// pos - doc_start + 1 (doc_start: (sequences, seq_len) document starts of the batch, model::Batch::doc_start; empty:
// one document per sequence, pos + 1). Zig-zag balances whole-sequence causal work exactly; document masks do not.
struct AttentionWork {
  std::vector<int64_t> per_rank;  // (world)
  int64_t max = 0, argmax = 0;    // the busiest rank (the lowest such rank)
  double mean = 0;
  double max_over_mean() const { return mean > 0 ? static_cast<double>(max) / mean : 1.0; }
};
AttentionWork attention_work(const MeshShape& m, int64_t sequences, int64_t seq_len,
                             const std::vector<int64_t>& doc_start);

// ---- Parameter shards: per-parameter dim-0 shards with padding --------------------------------------------
// A parameter of dim-0 size `rows` (and `row_elems` elements per row) over n shards: rows_per_shard =
// ceil(rows / n); shard i holds rows [i*rps, min((i+1)*rps, rows)), padded with zeros to rps rows.
struct ShardSpec {
  int64_t rows = 0, row_elems = 1, n = 1;
  int64_t rows_per_shard() const { return (rows + n - 1) / n; }
  int64_t shard_elems() const { return rows_per_shard() * row_elems; }            // padded
  int64_t begin_row(int64_t i) const;                                              // clamped to rows
  int64_t end_row(int64_t i) const;                                                // clamped to rows
  int64_t valid_elems(int64_t i) const { return (end_row(i) - begin_row(i)) * row_elems; }
};

// ---- Vocabulary slices: the (d, V) lm_head and (V, d) embedding gradients in pieces --------------------------
// The two vocabulary-sized gradients are produced, merged across ranks, rounded and freed one slice at a time,
// so a rank never holds a whole (d, V) or (V, d) accumulator. `requested` slices (0: one per vocab chunk):
//   head : n_h = min(s, n_vc) column ranges of whole vocab chunks, n_vc = ceil(V / vocab_chunk); slice k holds
//          chunks [k n_vc / n_h, (k+1) n_vc / n_h), ascending (the order of dhidden's in-order sum);
//   embed: n_e = min(s, rps) row ranges of every fsdp*cp shard, rps = ceil(V / (fsdp cp)); slice k holds
//          shard-local rows [k rps / n_e, (k+1) rps / n_e) of every shard;
// s = requested, or n_vc when requested == 0. Slicing never changes a bit (docs/parallel.md section 4).
struct Range {
  int64_t begin, end;
};
struct VocabSlices {
  std::vector<Range> head_cols;   // lm_head columns [begin, end)
  std::vector<Range> embed_rows;  // embedding shard-local rows [begin, end) (every shard)
};
// Throws trident::Error for requested < 0.
VocabSlices vocab_slices(int64_t vocab, int64_t vocab_chunk, int64_t fsdp_cp, int64_t requested);

// ---- Experts -------------------------------------------------------------------------------------------------
// Expert e lives on ep rank e / (E / ep).
inline int64_t expert_owner(int64_t e, int64_t experts, int64_t ep) { return e / (experts / ep); }

// ---- Validation: the mesh rules (docs/parallel.md section 1) -------------------------------------------------
// One set of rules for the step (validate_layout), `trident emulate` and `trident plan`. The NVLink placement rules
// of a real cluster are not here: they are the planner's warnings (planner/plan.h).
//
// What a mesh is checked against. An input left empty is not checked: the planner has no tile or EP chunks, and
// the emulator's world is the mesh's own.
struct LayoutInputs {
  std::optional<int64_t> world = std::nullopt;      // ranks of the job
  std::optional<int64_t> experts = std::nullopt;    // routed experts E
  std::optional<int64_t> sequences = std::nullopt;  // global batch B (sequences per step)
  std::optional<int64_t> seq_len = std::nullopt;    // tokens per sequence S
  std::optional<int64_t> tile = std::nullopt;       // reduction tile T
  std::optional<int64_t> ep_chunks = std::nullopt;  // EP chunks per MoE layer
  std::optional<int64_t> nvl = std::nullopt;        // GPUs per NVLink domain (bounds cp_inner)
};

// The rules, in the order violations() reports them. A rule whose inputs are missing, or that depends on an
// earlier rule that fails, is not checked (e.g. tile needs seq_len % (2*cp) == 0 first).
enum class LayoutRule : int {
  sizes,      // every mesh size and every given input >= 1; the two mesh products fit 64 bits
  products,   // d_rep*fsdp*cp == e_fsdp*ep
  world,      // d_rep*fsdp*cp == world
  experts,    // experts % ep == 0
  sequences,  // sequences % (d_rep*fsdp) == 0
  zigzag,     // seq_len % (2*cp) == 0
  tile,       // (seq_len / (2*cp)) % tile == 0: a reduction tile never straddles two CP ranks
  ep_chunks,  // 1 <= ep_chunks <= local reduction tiles of a rank
  cp_inner,   // cp % cp_inner == 0 and cp_inner <= nvl (2D CP: an inner group fits one NVLink domain)
};
inline constexpr int kNumLayoutRules = 9;
inline constexpr uint32_t rule_bit(LayoutRule r) { return uint32_t{1} << static_cast<int>(r); }
const char* rule_text(LayoutRule r);  // the rule as a formula, e.g. "seq_len % (2*cp) == 0"

// How the user sets each input, so that a message can name the fix: command-line flags ("use --seq-len 64",
// "use --mesh d_rep=1,fsdp=1,cp=2,e_fsdp=1,ep=2") or config keys ("use workload.context = 64", "use mesh.ep = 2").
// An empty name is not offered as a fix. The defaults are `trident emulate`'s flags.
struct InputNames {
  bool config_keys = false;  // false: "FLAG VALUE" and the whole --mesh spec; true: "KEY = VALUE" per mesh key
  std::string mesh = "--mesh";
  std::string world;         // emulate: the world is the mesh's
  std::string experts = "--experts";
  std::string sequences = "--seqs";
  std::string seq_len = "--seq-len";
  std::string tile = "--tile";
  std::string ep_chunks = "--chunks";
  std::string nvl = "--nvl";
};

// Every broken rule, in LayoutRule order, one readable line each that names the numbers and the fix, e.g.
// "seq_len 48 is not a multiple of 2*cp = 32 (each sequence is cut into 2*cp zig-zag chunks): use --seq-len 64"
// (the sizes rule: one line per size below 1). Empty: the mesh is valid for these inputs.
std::vector<std::string> violations(const MeshShape& m, const LayoutInputs& in, const InputNames& names = {});
// The same rules as bits (rule_bit), without building messages (no allocation: the planner's search calls it
// once per mesh). Zero exactly when violations() is empty; without size problems, one bit per line.
uint32_t broken_rules(const MeshShape& m, const LayoutInputs& in);
// Throws trident::Error with every violation: "invalid mesh (...): <violation>", or a first line
// "invalid mesh (...) breaks N rules:" followed by one indented line per violation.
void validate(const MeshShape& m, const LayoutInputs& in, const InputNames& names = {});

// validate() with every input of the step given (the world is the mesh's).
void validate_layout(const MeshShape& m, int64_t experts, int64_t sequences, int64_t seq_len, int64_t tile,
                     int64_t ep_chunks);

}  // namespace trident
