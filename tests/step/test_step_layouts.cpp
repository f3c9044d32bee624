// The source documents' remaining layouts on the emulated step (docs/parallel.md sections 2, 5 and 10): packed
// sequences (document masks under zig-zag CP), 2D CP (the cp group split into NVLink domains) and DSA (the indexer key
// gathered with the latent KV, the selection kept for backward), each bit-identical to the single-rank reference; 2D
// CP also to 1D CP, with the planner's 2D-CP traffic equal to the emulator's recorded bytes.
#include <gtest/gtest.h>

#include <set>

#include "fuzz/check.h"
#include "planner/plan.h"
#include "reference/model/train.h"
#include "tests/step/step_cases.h"

namespace trident {
namespace {

using namespace steptest;

// ---- packed sequences -------------------------------------------------------------------------------------------
// The batches really are packed: several documents per sequence, some spanning two CP ranks' chunks, some shorter
// than a zig-zag chunk (guards against a vacuous pass where every document is the whole sequence).
TEST(StepPacked, BatchesHaveDocumentsAcrossAndInsideChunks) {
  const emu::EmulateSpec s = make_spec({.mesh = M(1, 1, 4, 2, 2), .seq_len = 64, .docs_per_seq = 6});
  const int64_t ch = s.run.seq_len / (2 * s.mesh.cp);
  int64_t spanning = 0, short_docs = 0;
  for (int64_t step = 0; step < s.run.steps; ++step) {
    const model::Batch b = model::synthetic_batch(s.cfg, s.run, step);
    ASSERT_EQ(b.doc_start.size(), static_cast<size_t>(b.B * b.S));
    model::validate_batch(s.cfg, b);
    for (int64_t q = 0; q < b.B; ++q) {
      std::set<int64_t> starts;
      for (int64_t p = 0; p < b.S; ++p) starts.insert(b.doc_start[static_cast<size_t>(q * b.S + p)]);
      EXPECT_EQ(starts.size(), static_cast<size_t>(s.run.docs_per_seq));
      std::vector<int64_t> st(starts.begin(), starts.end());
      st.push_back(b.S);
      for (size_t k = 0; k + 1 < st.size(); ++k) {
        spanning += st[k] / ch != (st[k + 1] - 1) / ch;
        short_docs += st[k + 1] - st[k] < ch;
      }
    }
  }
  EXPECT_GT(spanning, 0);
  EXPECT_GT(short_docs, 0);
}

TEST(StepPacked, Cp2Ep2) { run_case({.mesh = M(1, 1, 2, 1, 2), .docs_per_seq = 5}); }
TEST(StepPacked, Fsdp2Cp2_Recompute_Chunks2) {
  run_case({.mesh = M(1, 2, 2, 2, 2), .chunks = 2, .recompute = true, .docs_per_seq = 7});
}
TEST(StepPacked, Cp4_Chunks3) { run_case({.mesh = M(1, 1, 4, 2, 2), .chunks = 3, .seq_len = 64, .docs_per_seq = 12}); }
TEST(StepPacked, DRep2Cp2_EveryDocumentOneToken) {  // docs_per_seq == seq_len: every token its own document
  run_case({.mesh = M(2, 1, 2, 2, 2), .docs_per_seq = 32});
}
TEST(StepPacked, Gqa_Bf16_Fsdp2Cp2) {
  run_case({.preset = "tiny-gqa", .mesh = M(1, 2, 2, 2, 2), .chunks = 2, .policy = "bf16", .docs_per_seq = 4});
}
TEST(StepPacked, Fp64_Cp2Ep2_Recompute) {
  run_case({.mesh = M(1, 1, 2, 1, 2), .recompute = true, .policy = "fp64", .docs_per_seq = 3});
}
TEST(StepPacked, DeferredDevice) {
  emu::EmulateSpec s = make_spec({.mesh = M(1, 2, 2, 2, 2), .chunks = 2, .steps = 2, .docs_per_seq = 6});
  s.device.mode = emu::DeviceMode::deferred;
  s.device.seed = 11;
  expect_equal<float>(s);
}

// One document per sequence given explicitly (doc_start all 0) runs the document-mask kernels and must give the
// default path's bits: the mask [0, pos] is the causal mask.
TEST(StepPacked, ExplicitSingleDocumentIsTheDefault) {
  emu::EmulateSpec s = make_spec({.mesh = M(1, 2, 2, 2, 2), .steps = 2});
  const auto plain = emu::emulate<float>(s);
  for (int64_t step = 0; step < s.run.steps; ++step) {
    model::Batch b = model::synthetic_batch(s.cfg, s.run, step);
    b.doc_start.assign(b.tokens.size(), 0);
    s.batches.push_back(b);
  }
  const auto masked = expect_equal<float>(s);
  for (int64_t step = 0; step < s.run.steps; ++step) {
    EXPECT_EQ(masked.steps[static_cast<size_t>(step)].loss, plain.steps[static_cast<size_t>(step)].loss);
    for (size_t p = 0; p < plain.grads[static_cast<size_t>(step)].size(); ++p)
      EXPECT_EQ(masked.grads[static_cast<size_t>(step)].t[p].data, plain.grads[static_cast<size_t>(step)].t[p].data)
          << plain.grads[static_cast<size_t>(step)].info[p].name;
  }
}

// ---- 2D CP ------------------------------------------------------------------------------------------------------
TEST(Step2dCp, Cp4Inner2_Recompute) { run_case({.mesh = M2(1, 1, 4, 1, 4, 2), .recompute = true, .seq_len = 64}); }
TEST(Step2dCp, Fsdp2Cp4Inner2_Chunks2) { run_case({.mesh = M2(1, 2, 4, 2, 4, 2), .chunks = 2, .seq_len = 64}); }
TEST(Step2dCp, DRep2Cp4Inner4_OneDomain) { run_case({.mesh = M2(2, 1, 4, 2, 4, 4), .seq_len = 64}); }
TEST(Step2dCp, Cp8Inner2_FourDomains) { run_case({.mesh = M2(1, 1, 8, 1, 8, 2), .seq_len = 128, .steps = 2}); }
TEST(Step2dCp, Gqa_Fp64_Packed) {
  run_case({.preset = "tiny-gqa", .mesh = M2(1, 1, 4, 2, 2, 2), .policy = "fp64", .seq_len = 64, .steps = 2,
            .docs_per_seq = 5});
}
TEST(Step2dCp, FakeNccl) {
  run_case({.mesh = M2(1, 2, 4, 2, 4, 2), .recompute = true, .seq_len = 64, .steps = 2,
            .comm = emu::CommBackend::nccl_fake});
}

// The block transposes and the four collectives on the deferred device (seeded order, stream hazards checked).
TEST(Step2dCp, DeferredDevice) {
  for (const uint64_t seed : {3u, 19u}) {
    emu::EmulateSpec s = make_spec({.mesh = M2(1, 2, 4, 2, 4, 2), .chunks = 2, .recompute = seed == 3, .seq_len = 64,
                                    .steps = 2, .docs_per_seq = 4});
    s.device.mode = emu::DeviceMode::deferred;
    s.device.seed = seed;
    expect_equal<float>(s);
  }
}

// 2D CP gives 1D CP's bits (both are the reference's; compared directly here too) and the documented schedule.
TEST(Step2dCp, EqualsOneDimensionalCp) {
  const Case c2{.mesh = M2(1, 2, 4, 2, 4, 2), .chunks = 2, .recompute = true, .seq_len = 64, .steps = 2};
  Case c1 = c2;
  c1.mesh.cp_inner = 1;
  const auto r2 = emu::emulate<float>(make_spec(c2)), r1 = emu::emulate<float>(make_spec(c1));
  ASSERT_EQ(r2.grads.size(), r1.grads.size());
  for (size_t step = 0; step < r1.grads.size(); ++step) {
    EXPECT_EQ(r2.steps[step].loss, r1.steps[step].loss);
    for (size_t p = 0; p < r1.grads[step].size(); ++p) {
      EXPECT_EQ(r2.grads[step].t[p].data, r1.grads[step].t[p].data) << r1.grads[step].info[p].name;
      EXPECT_EQ(r2.params[step].t[p].data, r1.params[step].t[p].data) << r1.params[step].info[p].name;
    }
  }
  EXPECT_EQ(r1.rank_stats[0].count("cp_outer"), 0u);
  EXPECT_EQ(r2.rank_stats[0].at("cp_outer")[static_cast<size_t>(CollOp::all_gather)].calls,
            r1.rank_stats[0].at("cp")[static_cast<size_t>(CollOp::all_gather)].calls);
}

TEST(Step2dCp, MatchesDocumentedSchedule) {
  expect_schedule(make_spec({.mesh = M2(1, 2, 4, 2, 4, 2), .chunks = 2, .seq_len = 64, .steps = 1}));
  expect_schedule(make_spec({.mesh = M2(2, 1, 4, 1, 8, 2), .recompute = true, .seq_len = 64, .steps = 2}));
}

// The planner's 2D-CP traffic (planner/plan.h cp_traffic, what `trident plan` reports as cp_rdma_* / CP NVLink bytes)
// equals the bytes the emulator records on the cp_outer (inter-node) and cp_inner (intra-node) communicators, per
// rank and layer. The emulator records each call's largest buffer (the nccl-tests size); a ring moves (n-1)/n of it
// into each rank. The step's dtypes give the passes: fp32 payload all-gathers (forward, recompute) and 56-byte exact
// accumulators in the reduce-scatter (56/4 = 14 all-gathers' worth).
// With DSA the per-token bytes CP gathers include the indexer key (seed 000's latent KV + rope + indexer K).
TEST(Step2dCp, PlannerTrafficEqualsRecordedBytes) {
  for (const char* preset : {"tiny", "tiny-dsa"})
  for (const bool recompute : {true, false}) {
    const emu::EmulateSpec s = make_spec({.preset = preset, .mesh = M2(1, 1, 8, 1, 8, 2), .recompute = recompute,
                                          .seqs = 2, .seq_len = 128, .steps = 2});
    const auto r = emu::emulate<float>(s);
    const planner::PlanInput in = fuzz::plan_input(s, sizeof(float));
    const MeshShape pm{1, 1, s.mesh.cp, 1, s.mesh.ep};  // the planner derives cp_inner from the NVLink domain
    const planner::MeshCheck chk = planner::check_mesh(in, pm);
    ASSERT_EQ(chk.cp_inner, s.mesh.cp_inner);
    ASSERT_EQ(chk.cp_outer, s.mesh.cp_outer());
    const planner::Plan plan = planner::evaluate(in, pm, chk);
    ASSERT_GT(plan.cp_rdma_bytes, 0.0);
    const double passes = (recompute ? 2.0 : 1.0) + double(sizeof(ExactAcc<float>)) / double(sizeof(float));
    const planner::CpTraffic want = planner::cp_traffic(plan.kv_bytes, s.mesh.cp, chk.cp_inner, chk.cp_outer, passes);
    EXPECT_EQ(plan.cp_rdma_bytes, want.rdma / passes * planner::kCpPasses);  // the report's number, same formula
    const double per_layer = double(s.run.steps * s.cfg.layers);
    for (int64_t rank = 0; rank < s.mesh.world(); ++rank) {
      auto wire = [&](const char* comm, int64_t n) {
        double b = 0;
        for (const OpStats& o : r.rank_stats[static_cast<size_t>(rank)].at(comm)) b += double(o.bytes);
        return b * double(n - 1) / double(n) / per_layer;
      };
      EXPECT_EQ(wire("cp_outer", s.mesh.cp_outer()), want.rdma) << "rank " << rank << " " << s.repro();
      EXPECT_EQ(wire("cp_inner", s.mesh.cp_inner), want.nvlink) << "rank " << rank << " " << s.repro();
    }
  }
}

// ---- DSA ----------------------------------------------------------------------------------------------------------
// tiny-dsa selects 8 keys per query: with 32- and 64-token sequences most queries attend a strict subset, chosen from
// the whole sequence's indexer keys, which CP gathers with the latent KV.
TEST(StepDsa, Cp2Ep2) { run_case({.preset = "tiny-dsa", .mesh = M(1, 1, 2, 1, 2)}); }
TEST(StepDsa, Fsdp2Cp4_Recompute_Chunks2) {
  run_case({.preset = "tiny-dsa", .mesh = M(1, 2, 4, 2, 4), .chunks = 2, .recompute = true, .seq_len = 64});
}
TEST(StepDsa, DRep2Cp2_Bf16) { run_case({.preset = "tiny-dsa", .mesh = M(2, 1, 2, 2, 2), .policy = "bf16"}); }
TEST(StepDsa, Fp64_Packed_Recompute) {
  run_case({.preset = "tiny-dsa", .mesh = M(1, 1, 4, 2, 2), .recompute = true, .policy = "fp64", .seq_len = 64,
            .docs_per_seq = 5});
}
TEST(StepDsa, TwoDimensionalCp_FakeNccl) {
  run_case({.preset = "tiny-dsa", .mesh = M2(1, 2, 4, 2, 4, 2), .seq_len = 64, .steps = 2,
            .comm = emu::CommBackend::nccl_fake});
}
TEST(StepDsa, DeferredDevice) {
  emu::EmulateSpec s = make_spec({.preset = "tiny-dsa", .mesh = M(1, 2, 2, 2, 2), .chunks = 2, .recompute = true,
                                  .steps = 2, .docs_per_seq = 3});
  s.device.mode = emu::DeviceMode::deferred;
  s.device.seed = 7;
  expect_equal<float>(s);
}
// The indexer loss the step reports (every rank's KL terms, summed exactly over the world) is the reference's.
TEST(StepDsa, IndexerLossIsTheReferences) {
  const emu::EmulateSpec s = make_spec({.preset = "tiny-dsa", .mesh = M(2, 2, 2, 2, 4), .steps = 1});
  const auto r = emu::emulate<float>(s);
  model::Trainer<float> tr(s.cfg, s.run);
  const auto ref = model::model_forward<float>(s.cfg, tr.params, model::synthetic_batch(s.cfg, s.run, 0), {});
  ASSERT_GT(ref.indexer_loss, 0.0f);
  EXPECT_EQ(static_cast<float>(r.steps[0].indexer_loss), ref.indexer_loss);
}

}  // namespace
}  // namespace trident
