// Checkpoints: save a training run and resume it bit for bit, on the same mesh or another one (docs/checkpoints.md).
//
// A checkpoint is a directory:
//   manifest.json     format "trident-checkpoint", version 1, writer ("train" | "emulate"), the model config, the
//                     run config, the tensor dtype, the mesh it was written on, the optimizer steps taken, the data
//                     position and seed, the parameter list (name, shape, placement kind), and one entry per rank
//                     file (path, bytes, CRC-32); its own CRC-32 in "checksum".
//   rank_NNNNN.h5     one per rank of the writing mesh: the rank's part of every parameter it owns (parallel/shard.h:
//                     dense tensors on d_rep coordinate 0, expert shards on every rank, buffers on rank 0), unpadded,
//                     in /params/<name>, /exp_avg/<name> (AdamW m) and /exp_avg_sq/<name> (AdamW v).
// `trident train` writes a one-rank checkpoint (mesh 1x1x1x1x1), so train and emulate checkpoints interchange.
//
// Crash safety: save writes everything into a hidden sibling directory (.NAME.tmp-XXXXXX, a random name made by mkdtemp), fsyncs every file and the
// directory, writes manifest.json last, then atomically exchanges it with DIR (renameat2 RENAME_EXCHANGE; a
// first save renames) and fsyncs the parent. A save that dies at any point leaves DIR as it was; the temporary
// directory has no manifest (or is never at DIR's name), so it never loads as DIR.
//
// Loading verifies the manifest's checksum and fields, then every listed file's size and CRC-32 before HDF5 parses
// a byte, then parses each rank file in a forked child with a time limit (golden/read_guard.h: a crash or loop of
// HDF5 on a damaged file is an error), checking each dataset's shape and type; any problem is one trident::Error
// naming the directory, the file and the reason.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "parallel/layout.h"
#include "parallel/step.h"
#include "reference/model/config.h"
#include "reference/model/train.h"

namespace trident::golden {

inline constexpr int kCheckpointVersion = 1;
inline constexpr const char* kCheckpointFormat = "trident-checkpoint";

// What a checkpoint records besides the tensors.
struct CheckpointMeta {
  std::string writer = "train";  // "train" or "emulate"
  model::Config cfg;
  model::RunConfig run;          // run.steps: the steps of the run that wrote it (informational)
  MeshShape mesh;                // the writing mesh (train: one rank)
  int64_t ep_chunks = 1;         // informational: they never change a bit
  int64_t vocab_slices = 0;
  int64_t step = 0;              // optimizer steps taken; also the synthetic data position of the next step
};

// Writes a checkpoint of an emulated run: `ranks` holds every rank's state (RankStep::state) of meta.mesh.
template <class T>
void save_checkpoint(const std::string& dir, const CheckpointMeta& meta, const std::vector<ShardState<T>>& ranks);
// Writes the full state of a single-rank run as a one-rank checkpoint (meta.mesh must be one rank).
template <class T>
void save_checkpoint(const std::string& dir, const CheckpointMeta& meta, const model::TrainState<T>& state);

// The checks save_checkpoint makes on DIR before writing anything (its parent exists; DIR is absent, empty or a
// checkpoint), so a command can refuse a bad --save before it trains.
void check_save_target(const std::string& dir);

// The validated manifest of a checkpoint (its checksum and fields; the rank files are not read).
CheckpointMeta read_checkpoint_meta(const std::string& dir);
// Verifies every file and assembles the full state (weights with router biases, AdamW moments, step) from the
// rank files, whatever mesh wrote them. T must be the checkpoint's dtype (double for the fp64 policy).
template <class T>
model::TrainState<T> load_checkpoint(const std::string& dir, CheckpointMeta* meta = nullptr);

// A run resumes a checkpoint only when it computes the same bits as the run that wrote it would have: the same
// model config (policy and init seed included) and the same batch, optimizer and data settings (sequences,
// seq_len, lr, betas, eps, weight decay, max grad norm, data seed). The mesh, EP chunks, vocabulary slices,
// token chunk and recompute may differ (none changes a bit). Throws naming the first difference.
void check_resumable(const CheckpointMeta& saved, const model::Config& cfg, const model::RunConfig& run,
                     const std::string& dir);

// Test hook: called with each file name right after that file is written and synced ("rank_00000.h5", ...,
// "manifest.json") and with "install" just before the temporary directory replaces DIR. A hook that throws
// simulates a failed save; one that kills the process, a crash. Empty in every real run.
using CheckpointSaveHook = std::function<void(const std::string& stage)>;
void set_checkpoint_save_hook(CheckpointSaveHook hook);

extern template void save_checkpoint<float>(const std::string&, const CheckpointMeta&,
                                            const std::vector<ShardState<float>>&);
extern template void save_checkpoint<double>(const std::string&, const CheckpointMeta&,
                                             const std::vector<ShardState<double>>&);
extern template void save_checkpoint<float>(const std::string&, const CheckpointMeta&,
                                            const model::TrainState<float>&);
extern template void save_checkpoint<double>(const std::string&, const CheckpointMeta&,
                                             const model::TrainState<double>&);
extern template model::TrainState<float> load_checkpoint<float>(const std::string&, CheckpointMeta*);
extern template model::TrainState<double> load_checkpoint<double>(const std::string&, CheckpointMeta*);

}  // namespace trident::golden
