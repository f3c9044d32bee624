// The planner's description (planner/plan.h) of an emulated run's model, mesh and tokens, shared by the
// planner cross-checks (test_planner_cross.cpp: bytes; test_planner_overlap.cpp: times). P is the parameter count
// the planner is given (the whole model, or the layers only); the routed experts' share of it is the model's.
// The cluster fields are left to the caller.
#pragma once
#include "emulator/run_step.h"
#include "planner/plan.h"

namespace trident::test {

inline double routed_params(const model::Config& m) {
  return static_cast<double>(m.layers) * 3.0 * static_cast<double>(m.experts * m.d_model * m.expert_ffn);
}

inline planner::PlanInput plan_input_for(const emu::EmulateSpec& spec, double P) {
  const model::Config& m = spec.cfg;
  planner::PlanInput in;
  in.model.params = P;
  in.model.layers = m.layers;
  in.model.hidden = m.d_model;
  in.model.experts = m.experts;
  in.model.top_k = m.top_k;
  in.model.dense_fraction = 1.0 - routed_params(m) / P;
  in.cluster.gpu_memory_gb = 80;
  in.workload.context = spec.run.seq_len;
  in.workload.sequences_per_cp_group = spec.run.sequences / (spec.mesh.d_rep * spec.mesh.fsdp);
  in.mesh = spec.mesh;
  return in;
}

}  // namespace trident::test
