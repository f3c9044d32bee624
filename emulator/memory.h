// Up-front memory estimates of `trident train` and `trident emulate` (docs/emulator.md section 8): what a
// run will hold at its peak, by part, computed from the config, the batch and the mesh before anything is
// allocated, so a run that cannot fit is refused at once with the numbers instead of being killed by the kernel
// after minutes. Pure arithmetic (in double: an estimate never overflows).
//
// An estimate is an upper bound of the measured peak for the parts it names (tests/emulator/test_memory.cpp checks
// estimate >= measured and estimate <= kMemoryEstimateFactor x measured on several meshes and configs), with one
// stated assumption: expert routing is data dependent, so EP buffers are sized for an owner receiving at most
// kEpCapacity times its balanced share of routed rows.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "parallel/layout.h"
#include "reference/model/config.h"

namespace trident::emu {

// The factor the tests hold the estimate to: measured <= estimate <= factor * measured.
inline constexpr double kMemoryEstimateFactor = 3.0;
// EP capacity assumption: an expert owner receives at most this many times the balanced share N*K of routed rows
// per MoE layer (and never more than every row of its ep group could send it).
inline constexpr double kEpCapacity = 2.0;

struct MemoryPart {
  std::string what;
  double bytes = 0;
};

struct MemoryEstimate {
  int64_t ranks = 1;                 // ranks (threads) of the process; 1 for train
  std::vector<MemoryPart> per_rank;  // one rank's memory (device buffers, staging, stack), by part
  std::vector<MemoryPart> host;      // the process's other memory (full parameters, batches, checks), by part
  double rank_bytes() const;         // sum of per_rank
  double device_bytes() const;       // the per_rank parts that are device buffers (what EmuDevice counts)
  double host_bytes() const;         // sum of host
  double total() const;              // ranks * rank_bytes() + host_bytes()
  // "12.3 MiB = 8 ranks x 1.2 MiB (shards 0.3 MiB, ...) + host 2.1 MiB (...)"
  std::string describe() const;
};

// `trident train` (the single-rank Trainer): weights, gradients, AdamW moments, exact accumulators, the saved
// activations of one step, the batch, and with dump the copies the golden dump holds.
MemoryEstimate estimate_train(const model::Config& cfg, const model::RunConfig& run, bool dump);

struct EmulateMemoryInputs {
  model::Config cfg;
  model::RunConfig run;
  MeshShape mesh;
  int64_t ep_chunks = 1;
  int64_t vocab_slices = 0;
  bool keep_tensors = true;        // full gradients and parameters per step (EmulateSpec::keep_tensors)
  bool check_reference = false;    // the single-rank reference runs afterwards (estimate_train on top)
  size_t eager_bytes = 32 * 1024;  // SpawnOptions::eager_bytes
  size_t stack_bytes = 1 << 20;    // SpawnOptions::stack_bytes
  // Exact sums lowered onto i64 sums (EmulateSpec::lower_exact_sum, and every NCCL communicator): each lowered
  // reduction packs its accumulators into a scratch buffer of i64 words (parallel/exact_lowering.h), up to the
  // accumulator arena's worth at once.
  bool lower_exact_sum = false;
};
// The 1D/2D CP key side of one layer's attention (parallel/step_attention.cpp), per rank, in bytes: what the
// estimate holds for the KV payload all-gathered per local sequence and for its gradient's exact key-side sums.
// With S = seq_len, P = Config::payload_dim(), ch = S / (2 cp), no = cp / cp_inner, e = the element size, a =
// sizeof(ExactAcc) (docs/emulator.md section 8):
struct CpKeySide {
  double kv = 0;      // one layer's gathered payload, kept from its forward to its backward: nseq x S x P x e
  double gather = 0;  // the forward's receive buffer: S x P x e (2D: + S x P x e + no x 2 ch x P x e)
  double acc = 0;     // the backward's accumulators, live together: (S + ch + 2 ch) x P x a (2D: + (S + no 2 ch) x P
                      // x a); where the tile partials are exchanged instead, their arena (cp = 1 runs the same code)
  double peak() const { return kv + acc; }  // what the key side holds at the backward's peak
};
CpKeySide cp_key_side(const EmulateMemoryInputs& in);

// `trident emulate`: per rank the parameter shards and AdamW state, the gathered FSDP units, the exact gradient
// accumulator arena (one buffer grown to its largest use: the gradient groups, and the CP key side's accumulators
// as their own part "CP key side" on top, since the arena grows to or from them with the old buffer still live), the
// saved activations (all layers, or layer inputs with
// recompute), the gathered CP KV (cp_key_side: every layer's, or the recomputed layer's), the
// EP dispatch/combine buffers, the loss buffers, the communicator staging and the thread stack; for the process
// the initial full parameters, every step's batch, the kept tensors and the reference check.
MemoryEstimate estimate_emulate(const EmulateMemoryInputs& in);

// Bytes this process may still use (platform/memory_info.h: on Linux MemAvailable of /proc/meminfo, lowered by a
// cgroup memory limit when one is set). 0 when unknown.
double available_memory();

// Parses --max-memory: a byte count with an optional unit B, KiB, MiB, GiB, TiB (binary) or KB, MB, GB, TB
// (decimal), e.g. "512MiB", "8GiB", "1000000". Throws trident::Error on anything else or a value < 1.
double parse_bytes(const std::string& s);
std::string format_bytes(double b);  // "1.5 GiB"

// Refuses the run (trident::Error naming every number) when est.total() exceeds limit (--max-memory), or, without a
// limit (0), the available memory. `what` names the command ("train", "emulate").
void check_memory(const MemoryEstimate& est, double limit, const std::string& what);

}  // namespace trident::emu
