// One rank of the step with its own reference check (emulator/rank_run.h).
#include "emulator/rank_run.h"

#include <fmt/format.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>

#include "parallel/mesh_comm.h"
#include "reference/counted.h"
#include "reference/check.h"
#include "reference/model/train.h"

namespace trident::emu {

namespace md = trident::model;

namespace {

// Elements no rank part covers keep this NaN payload, which no step writes (a non-finite loss or gradient stops the
// step first; a rank that wrote this very NaN would be counted as not covering the element, and so still fail).
template <class T>
T sentinel() {
  if constexpr (sizeof(T) == 4) return std::bit_cast<T>(uint32_t{0x7fbadbadu});
  else return std::bit_cast<T>(uint64_t{0x7ff7badbadbadbadull});
}

template <class T>
bool is_sentinel(const T& v) {
  const T s = sentinel<T>();
  return std::memcmp(&v, &s, sizeof(T)) == 0;
}

template <class T>
void fill_sentinel(md::ParamSet<T>& p) {
  for (auto& t : p.t) std::fill(t.data.begin(), t.data.end(), sentinel<T>());
}

// This rank's part of one tensor against the reference: the elements it wrote, and the first that differs.
template <class T>
void compare_part(int64_t step, const char* what, const std::string& name, const T* got, const T* want, int64_t n,
                  int64_t& written, std::vector<TensorCheck>& bad) {
  bool first = true;
  for (int64_t i = 0; i < n; ++i) {
    if (is_sentinel(got[i])) continue;
    ++written;
    if (first && std::memcmp(got + i, want + i, sizeof(T)) != 0) {
      first = false;
      bad.push_back({step, what, name, false, i, static_cast<double>(got[i]), static_cast<double>(want[i])});
    }
  }
}

}  // namespace

bool RankRunResult::ok() const {
  return !checked || (world_mismatches == 0 && world_loss_mismatches == 0 && world_elements == expected_elements);
}

std::string RankRunResult::summary() const {
  if (!checked) return fmt::format("{} run (not checked)", counted(static_cast<int64_t>(steps.size()), "step"));
  if (ok())
    return fmt::format("bitwise equal to the single-rank reference: every rank's part of every gradient and "
                       "parameter over {} ({} elements, each written by exactly one rank) and the loss",
                       counted(static_cast<int64_t>(steps.size()), "step"), world_elements);
  std::string s = fmt::format("MISMATCH: {} tensor part(s) differ over all ranks, {} loss(es) differ; the ranks' "
                              "parts cover {} of {} elements",
                              world_mismatches, world_loss_mismatches, world_elements, expected_elements);
  if (!mismatches.empty()) {
    const TensorCheck& m = mismatches.front();
    s += fmt::format("; first on this rank: step {} {} {} at index {} (got {:.9g}, reference {:.9g})", m.step + 1,
                     m.what, m.name.empty() ? "-" : m.name, m.first_index, m.got, m.want);
  }
  return s;
}

template <class T>
RankRunResult run_rank(const EmulateSpec& spec, Communicator& world, Device& dev, Kernels<T>& kernels,
                       const RankRunOptions& opt) {
  TD_CHECK(world.size() == spec.mesh.world(), "run_rank: the world communicator has {} ranks, mesh {} has {}",
           world.size(), spec.mesh.str(), spec.mesh.world());
  const md::ParamSet<T> init = spec_init<T>(spec);
  const StepShared<T> sh = step_shared<T>(spec, init);
  const std::vector<md::Batch> batches = spec_batches(spec);
  for (const md::Batch& b : batches) md::validate_batch(spec.cfg, b);
  MeshComms mc = make_mesh_comms(world, spec.mesh);
  RankStep<T> step(sh, world, mc, dev, kernels);

  RankRunResult res;
  res.checked = opt.check;
  std::optional<md::Trainer<T>> ref;
  md::ParamSet<T> got_g, got_p;
  int64_t loss_bad = 0;
  if (opt.check) {
    ref.emplace(spec.cfg, spec.run);
    ref->params = init;
    got_g = md::ParamSet<T>::zeros(spec.cfg);
    got_p = md::ParamSet<T>::zeros(spec.cfg);
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t s = 0; s < spec.run.steps; ++s) {
    const RankStepStats st = step.step(batches[static_cast<size_t>(s)]);
    res.steps.push_back(st);
    if (!std::isfinite(st.loss) || !std::isfinite(st.grad_norm))
      fail(fmt::format("step {}: loss {} / grad norm {} is not finite (diverged: lower --lr?)", s + 1, st.loss,
                       st.grad_norm));
    if (opt.progress) opt.progress(s, st);
    if (!opt.check) continue;
    const md::StepStats want = ref->step(batches[static_cast<size_t>(s)]);
    if (std::memcmp(&st.loss, &want.loss, sizeof(double)) != 0) {
      ++loss_bad;
      res.mismatches.push_back({s, "loss", "", false, 0, st.loss, want.loss});
    }
    fill_sentinel(got_g);
    fill_sentinel(got_p);
    step.write_grads(got_g);
    step.write_params(got_p);
    for (size_t i = 0; i < ref->params.size(); ++i) {
      const std::string& n = ref->params.info[i].name;
      const int64_t sz = ref->params.t[i].size();
      if (ref->params.info[i].trainable) {
        compare_part(s, "grad", n, got_g.t[i].ptr(), ref->grads.t[i].ptr(), sz, res.rank_elements, res.mismatches);
        res.expected_elements += sz;
      }
      compare_part(s, "param", n, got_p.t[i].ptr(), ref->params.t[i].ptr(), sz, res.rank_elements, res.mismatches);
      res.expected_elements += sz;
    }
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  res.peak_bytes = step.memory().peak;
  res.device_peak_bytes = dev.memory().peak;
  if (opt.check) {  // one verdict on every rank: counts summed over world (device memory, as any collective)
    const int64_t tensor_bad = static_cast<int64_t>(res.mismatches.size()) - loss_bad;
    const int64_t counts[3] = {res.rank_elements, tensor_bad, loss_bad};
    const Stream s = dev.compute_stream();
    DeviceBuffer<int64_t> buf(dev, 3, s);
    dev.upload(buf.data(), counts, sizeof counts, s);
    world.all_reduce(buf.data(), buf.data(), 3, DataType::i64, ReduceOp::sum, s);
    const std::vector<int64_t> sum = dev.fetch(buf.data(), 3, s);
    res.world_elements = sum[0];
    res.world_mismatches = sum[1];
    res.world_loss_mismatches = sum[2];
  }
  return res;
}

template RankRunResult run_rank<float>(const EmulateSpec&, Communicator&, Device&, Kernels<float>&,
                                       const RankRunOptions&);
template RankRunResult run_rank<double>(const EmulateSpec&, Communicator&, Device&, Kernels<double>&,
                                        const RankRunOptions&);

}  // namespace trident::emu
