// Where each parameter lives on a rank of the distributed step (docs/parallel.md section 3, docs/checkpoints.md):
// the one function that says which part of a full tensor a rank holds. The step's constructor takes its shards
// with it, and checkpoints write and reassemble per-rank shards with it, so a checkpoint of one mesh can be
// re-sharded onto another.
#pragma once
#include <cstdint>
#include <vector>

#include "parallel/layout.h"
#include "reference/model/params.h"

namespace trident {

enum class ShardKind {
  dense,   // dim 0 sharded over fsdp*cp (padded shards), replicated over d_rep
  expert,  // moe.experts.*: experts over ep, each expert's (rows, cols) dim 0 sharded over e_fsdp
  buffer,  // not trained (router_bias): replicated on every rank
};
const char* to_string(ShardKind k);

struct ParamPlacement {
  ShardKind kind = ShardKind::dense;
  ShardSpec spec;        // dense: the tensor's dim 0 over fsdp*cp; expert: one expert's dim 0 over e_fsdp
  int64_t shard = 0;     // this rank's shard index (fsdp*cp rank, or e_fsdp rank)
  int64_t e0 = 0;        // expert: first local expert
  int64_t eloc = 1;      // expert: local experts (E / ep)
  int64_t numel = 0;     // elements of the full tensor
  // The rank's copy is the one a checkpoint keeps: dense on d_rep coordinate 0, experts on every rank (their
  // shards are disjoint), buffers on world rank 0. Over all ranks the kept parts cover every element once.
  bool owner = false;
  std::vector<int64_t> shape;  // the rank's valid part (no padding): dense {rows, dims 1..}, expert {eloc, rows,
                               // cols}, buffer the full shape
  int64_t padded_elems() const;  // what the step stores: dense shard_elems, expert eloc * shard_elems, buffer numel
  int64_t valid_elems() const;   // the product of shape
};

// The placement of parameter `info` on `rank` of `mesh` for a model with `experts` routed experts.
ParamPlacement place(const model::ParamInfo& info, const MeshShape& mesh, int64_t experts, int64_t rank);

// full (the whole tensor) -> the rank's valid part (valid_elems values), and back. put() writes only the
// elements the part covers.
template <class T>
void take_part(const ParamPlacement& pl, const T* full, T* part);
template <class T>
void put_part(const ParamPlacement& pl, const T* part, T* full);
// The valid part <-> the padded layout the step stores (padding rows are zero).
template <class T>
void pad_part(const ParamPlacement& pl, const T* part, T* padded);
template <class T>
void unpad_part(const ParamPlacement& pl, const T* padded, T* part);

}  // namespace trident
