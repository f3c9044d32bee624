// The step's optimizer part (parallel/step_impl.h): the exact global gradient norm (dense shards counted on d_rep
// coordinate 0 only), AdamW on the shards, the router bias update from global expert loads.
#include <cmath>
#include <limits>

#include "parallel/step_impl.h"
#include "reference/model/train.h"

namespace trident {

namespace md = trident::model;

template <class T>
void StepImpl<T>::optimizer(RankStepStats& res) {
  Buf<ExactAcc<double>> sq(dev, 1, CS);
  dev.memset(sq.data(), 0, sq.bytes(), CS);  // the zero accumulator
  for (const PState& st : ps) {
    if (!st.trainable) continue;
    if (!st.expert && dc.d != 0) continue;
    if (!st.expert) {
      K.grad_sq_acc(st.g.data(), st.spec.valid_elems(st.shard), sq.data(), CS);
    } else {
      for (int64_t el = 0; el < Eloc; ++el)
        K.grad_sq_acc(st.g.data() + el * st.spec.shard_elems(), st.spec.valid_elems(st.shard), sq.data(), CS);
    }
  }
  world.all_reduce(sq.data(), sq.data(), 1, DataType::exact_f64, ReduceOp::exact_sum, CS);
  note("opt", world, CollOp::all_reduce);
  const md::AdamWHyper hy = md::adamw_hyper(sh.run);
  if (data) {
    const ExactAcc<double> sum_sq = dev.fetch_one(sq.data(), CS);  // host sync point 4: grad norm and clip
    res.grad_norm = std::sqrt(sum_sq.round());
    res.clip = md::clip_coef(sum_sq, hy.max_grad_norm);
  } else {  // shapes only: the same read, no value (the clip coefficient is any value)
    dev.download_known(nullptr, sq.data(), sq.bytes(), CS);
    dev.synchronize(CS);
    res.grad_norm = std::numeric_limits<double>::quiet_NaN();
    res.clip = 1;
  }
  ++step_count;
  for (PState& st : ps) {
    if (!st.trainable) continue;
    const bool decay = sh.init->info[st.p].is_matrix;
    const int64_t se = st.spec.shard_elems(), ve = st.spec.valid_elems(st.shard);
    const int64_t reps = st.expert ? Eloc : 1;
    for (int64_t el = 0; el < reps; ++el)
      K.adamw_step(st.w.data() + el * se, st.g.data() + el * se, st.m.data() + el * se, st.v.data() + el * se, ve, hy,
                   step_count, res.clip, decay, CS);
  }
  bool any_moe = false;
  for (int64_t i = 0; i < L; ++i) any_moe = any_moe || cfg.is_moe_layer(i);
  if (any_moe) {
    Buf<int64_t> ld(dev, L * E, CS);
    dev.upload(ld.data(), load.data(), ld.bytes(), CS);
    world.all_reduce(ld.data(), ld.data(), sz(L * E), DataType::i64, ReduceOp::sum, CS);
    note("opt", world, CollOp::all_reduce);
    for (int64_t i = 0; i < L; ++i) {
      if (!cfg.is_moe_layer(i)) continue;
      PState& b = ps[idx(fmt::format("layers.{}.moe.router_bias", i))];
      K.router_bias_update(b.w.data(), ld.data() + i * E, E, cfg.bias_rate, CS);
    }
  }
}

template void StepImpl<float>::optimizer(RankStepStats&);
template void StepImpl<double>::optimizer(RankStepStats&);

}  // namespace trident
