// Parameter placement on a rank (parallel/shard.h).
#include "parallel/shard.h"

#include <algorithm>

#include "reference/check.h"

namespace trident {

const char* to_string(ShardKind k) {
  switch (k) {
    case ShardKind::dense: return "dense";
    case ShardKind::expert: return "expert";
    case ShardKind::buffer: return "buffer";
  }
  return "?";
}

ParamPlacement place(const model::ParamInfo& in, const MeshShape& m, int64_t experts, int64_t rank) {
  TD_CHECK(rank >= 0 && rank < m.world(), "place: rank {} outside mesh {}", rank, m.str());
  ParamPlacement pl;
  pl.numel = 1;
  for (int64_t s : in.shape) pl.numel *= s;
  const DenseCoord dc = dense_coord(m, rank);
  const ExpertCoord ec = expert_coord(m, rank);
  if (!in.trainable) {
    pl.kind = ShardKind::buffer;
    pl.owner = rank == 0;
    pl.shape = in.shape;
    return pl;
  }
  if (in.name.find(".moe.experts.") != std::string::npos) {
    TD_CHECK(in.shape.size() == 3 && in.shape[0] == experts, "place: expert tensor {} shape", in.name);
    TD_CHECK(experts % m.ep == 0, "place: {} experts over ep = {}", experts, m.ep);
    pl.kind = ShardKind::expert;
    pl.spec = ShardSpec{in.shape[1], in.shape[2], m.e_fsdp};
    pl.shard = ec.ef;
    pl.eloc = experts / m.ep;
    pl.e0 = ec.p * pl.eloc;
    pl.owner = true;
    pl.shape = {pl.eloc, pl.spec.end_row(pl.shard) - pl.spec.begin_row(pl.shard), in.shape[2]};
    return pl;
  }
  TD_CHECK(!in.shape.empty() && in.shape[0] > 0, "place: dense tensor {} has no rows", in.name);
  pl.kind = ShardKind::dense;
  pl.spec = ShardSpec{in.shape[0], pl.numel / in.shape[0], m.fsdp * m.cp};
  pl.shard = dc.f * m.cp + dc.c;
  pl.owner = dc.d == 0;
  pl.shape = in.shape;
  pl.shape[0] = pl.spec.end_row(pl.shard) - pl.spec.begin_row(pl.shard);
  return pl;
}

int64_t ParamPlacement::padded_elems() const {
  switch (kind) {
    case ShardKind::dense: return spec.shard_elems();
    case ShardKind::expert: return eloc * spec.shard_elems();
    case ShardKind::buffer: return numel;
  }
  return 0;
}
int64_t ParamPlacement::valid_elems() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

template <class T>
void take_part(const ParamPlacement& pl, const T* full, T* part) {
  switch (pl.kind) {
    case ShardKind::buffer: std::copy_n(full, pl.numel, part); return;
    case ShardKind::dense:
      std::copy_n(full + pl.spec.begin_row(pl.shard) * pl.spec.row_elems, pl.spec.valid_elems(pl.shard), part);
      return;
    case ShardKind::expert: {
      const int64_t per = pl.spec.rows * pl.spec.row_elems, ve = pl.spec.valid_elems(pl.shard);
      for (int64_t el = 0; el < pl.eloc; ++el)
        std::copy_n(full + (pl.e0 + el) * per + pl.spec.begin_row(pl.shard) * pl.spec.row_elems, ve, part + el * ve);
      return;
    }
  }
}
template <class T>
void put_part(const ParamPlacement& pl, const T* part, T* full) {
  switch (pl.kind) {
    case ShardKind::buffer: std::copy_n(part, pl.numel, full); return;
    case ShardKind::dense:
      std::copy_n(part, pl.spec.valid_elems(pl.shard), full + pl.spec.begin_row(pl.shard) * pl.spec.row_elems);
      return;
    case ShardKind::expert: {
      const int64_t per = pl.spec.rows * pl.spec.row_elems, ve = pl.spec.valid_elems(pl.shard);
      for (int64_t el = 0; el < pl.eloc; ++el)
        std::copy_n(part + el * ve, ve, full + (pl.e0 + el) * per + pl.spec.begin_row(pl.shard) * pl.spec.row_elems);
      return;
    }
  }
}
template <class T>
void pad_part(const ParamPlacement& pl, const T* part, T* padded) {
  std::fill_n(padded, pl.padded_elems(), T(0));
  if (pl.kind == ShardKind::buffer) {
    std::copy_n(part, pl.numel, padded);
    return;
  }
  const int64_t reps = pl.kind == ShardKind::expert ? pl.eloc : 1;
  const int64_t ve = pl.spec.valid_elems(pl.shard), se = pl.spec.shard_elems();
  for (int64_t el = 0; el < reps; ++el) std::copy_n(part + el * ve, ve, padded + el * se);
}
template <class T>
void unpad_part(const ParamPlacement& pl, const T* padded, T* part) {
  if (pl.kind == ShardKind::buffer) {
    std::copy_n(padded, pl.numel, part);
    return;
  }
  const int64_t reps = pl.kind == ShardKind::expert ? pl.eloc : 1;
  const int64_t ve = pl.spec.valid_elems(pl.shard), se = pl.spec.shard_elems();
  for (int64_t el = 0; el < reps; ++el) std::copy_n(padded + el * se, ve, part + el * ve);
}

#define TD_SHARD(T)                                                    \
  template void take_part<T>(const ParamPlacement&, const T*, T*);     \
  template void put_part<T>(const ParamPlacement&, const T*, T*);      \
  template void pad_part<T>(const ParamPlacement&, const T*, T*);      \
  template void unpad_part<T>(const ParamPlacement&, const T*, T*);
TD_SHARD(float)
TD_SHARD(double)
#undef TD_SHARD

}  // namespace trident
