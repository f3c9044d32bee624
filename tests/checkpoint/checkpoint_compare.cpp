// checkpoint_compare A B: bitwise comparison of two checkpoints (docs/checkpoints.md) whatever meshes wrote them:
// model config, the bit-relevant run settings, the step, and every assembled tensor (weights with router biases,
// AdamW m and v). Exit 0 when equal, 1 with the first difference, 2 on an error. Used by the command-line
// resume/reshard tests.
#include <cstdio>
#include <cstring>
#include <exception>

#include "golden/checkpoint.h"

namespace {

template <class T>
int compare(const char* a, const char* b) {
  using namespace trident;
  golden::CheckpointMeta ma, mb;
  const model::TrainState<T> sa = golden::load_checkpoint<T>(a, &ma);
  const model::TrainState<T> sb = golden::load_checkpoint<T>(b, &mb);
  golden::check_resumable(ma, mb.cfg, mb.run, a);  // same model, batch, optimizer and data settings
  if (sa.step != sb.step) {
    std::printf("checkpoint MISMATCH: step %lld vs %lld\n", static_cast<long long>(sa.step),
                static_cast<long long>(sb.step));
    return 1;
  }
  const model::ParamSet<T>* x[3] = {&sa.params, &sa.m, &sa.v};
  const model::ParamSet<T>* y[3] = {&sb.params, &sb.m, &sb.v};
  const char* what[3] = {"params", "exp_avg", "exp_avg_sq"};
  int64_t n = 0;
  for (int g = 0; g < 3; ++g)
    for (size_t p = 0; p < x[g]->size(); ++p, ++n) {
      const auto& u = x[g]->t[p];
      const auto& v = y[g]->t[p];
      for (int64_t i = 0; i < u.size(); ++i)
        if (std::memcmp(u.ptr() + i, v.ptr() + i, sizeof(T)) != 0) {
          std::printf("checkpoint MISMATCH: %s/%s element %lld: %.9g vs %.9g\n", what[g],
                      x[g]->info[p].name.c_str(), static_cast<long long>(i), static_cast<double>(u.ptr()[i]),
                      static_cast<double>(v.ptr()[i]));
          return 1;
        }
    }
  std::printf("checkpoints bitwise equal: %lld tensors (params, exp_avg, exp_avg_sq) at step %lld; meshes %s and %s\n",
              static_cast<long long>(n), static_cast<long long>(sa.step), ma.mesh.spec().c_str(),
              mb.mesh.spec().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: checkpoint_compare DIR_A DIR_B\n");
    return 2;
  }
  try {
    const auto m = trident::golden::read_checkpoint_meta(argv[1]);
    return m.cfg.policy == trident::Policy::fp64 ? compare<double>(argv[1], argv[2]) : compare<float>(argv[1], argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_compare: error: %s\n", e.what());
    return 2;
  }
}
