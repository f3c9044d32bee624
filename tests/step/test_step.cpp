// The FSDP x CP x EP step on emulated meshes is bit-identical to the single-rank reference (docs/parallel.md):
// loss of every step, every gradient, every parameter after 3 AdamW steps, router biases.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <new>
#include <optional>
#include <type_traits>

#include "emulator/world.h"
#include "parallel/exact_lowering.h"
#include "reference/model/linear_ce.h"
#include "tests/step/step_cases.h"

namespace trident {
namespace {

using namespace steptest;

// ---- bitwise equality on the issue's meshes ------------------------------------------------------------------
TEST(StepEquality, OneRank) { run_case({.mesh = M(1, 1, 1, 1, 1)}); }
TEST(StepEquality, Cp2Ep2) { run_case({.mesh = M(1, 1, 2, 1, 2)}); }
TEST(StepEquality, DRep2Cp2_EFsdp2Ep2) { run_case({.mesh = M(2, 1, 2, 2, 2)}); }
TEST(StepEquality, Fsdp2Cp2_EFsdp2Ep2) { run_case({.mesh = M(1, 2, 2, 2, 2)}); }
TEST(StepEquality, Fsdp2Cp2_Recompute_Chunks2) { run_case({.mesh = M(1, 2, 2, 2, 2), .chunks = 2, .recompute = true}); }
// ep = 3 needs experts % 3 == 0 and sequences % 3 == 0
TEST(StepEquality, DRep3_Ep3) { run_case({.mesh = M(3, 1, 1, 1, 3), .seqs = 3, .experts = 6}); }
TEST(StepEquality, DRep3_Ep3_Recompute) {
  run_case({.mesh = M(3, 1, 1, 1, 3), .recompute = true, .seqs = 6, .experts = 6});
}
TEST(StepEquality, Cp4_Chunks1) { run_case({.mesh = M(1, 1, 4, 2, 2), .chunks = 1, .seq_len = 64}); }
TEST(StepEquality, Cp4_Chunks2) { run_case({.mesh = M(1, 1, 4, 2, 2), .chunks = 2, .seq_len = 64}); }
TEST(StepEquality, Cp4_Chunks3) { run_case({.mesh = M(1, 1, 4, 2, 2), .chunks = 3, .seq_len = 64}); }
TEST(StepEquality, Cp4_Chunks3_Recompute) {
  run_case({.mesh = M(1, 1, 4, 2, 2), .chunks = 3, .recompute = true, .seq_len = 64});
}
TEST(StepEquality, Cp4_Chunks2_Recompute) {
  run_case({.mesh = M(1, 1, 4, 2, 2), .chunks = 2, .recompute = true, .seq_len = 64});
}
TEST(StepEquality, Gqa_Fsdp2Cp2) { run_case({.preset = "tiny-gqa", .mesh = M(1, 2, 2, 2, 2), .chunks = 2}); }
TEST(StepEquality, Gqa_Cp4_Recompute) {
  run_case({.preset = "tiny-gqa", .mesh = M(1, 1, 4, 2, 2), .chunks = 3, .recompute = true, .seq_len = 64});
}
TEST(StepEquality, Bf16_Fsdp2Cp2) { run_case({.mesh = M(1, 2, 2, 2, 2), .chunks = 2, .policy = "bf16"}); }
TEST(StepEquality, Bf16_Gqa_DRep2_Recompute) {
  run_case({.preset = "tiny-gqa", .mesh = M(2, 1, 2, 2, 2), .recompute = true, .policy = "bf16"});
}
TEST(StepEquality, Fp64_Cp2Ep2) { run_case({.mesh = M(1, 1, 2, 1, 2), .chunks = 2, .policy = "fp64"}); }
TEST(StepEquality, Fp64_Gqa_Fsdp2Cp2_Recompute) {
  run_case({.preset = "tiny-gqa", .mesh = M(1, 2, 2, 2, 2), .recompute = true, .policy = "fp64"});
}
// more ranks than rows of some parameters (empty padded shards), 8 ranks, experts 1 per ep rank
TEST(StepEquality, Fsdp8_Ep8) { run_case({.mesh = M(1, 8, 1, 1, 8), .seqs = 8}); }
// Vocabulary slices (docs/parallel.md section 4): the lm_head / embedding gradients merged in 1 piece, in 3 uneven
// pieces, and in the most pieces there are (4 head slices, 64 embedding rows of 64 per shard); the default (one per
// vocab chunk) runs in every other case.
TEST(StepEquality, VocabSlices1_Fsdp2Cp2) { run_case({.mesh = M(1, 2, 2, 2, 2), .chunks = 2, .vocab_slices = 1}); }
TEST(StepEquality, VocabSlices3_Bf16_DRep2_Recompute) {
  run_case({.mesh = M(2, 1, 2, 1, 4), .vocab_slices = 3, .recompute = true, .policy = "bf16"});
}
TEST(StepEquality, VocabSlices4_ShortLastChunk) {  // V 512 in chunks of 100: 6 chunks, the last of 12 columns
  run_case({.mesh = M(1, 2, 2, 1, 4), .chunks = 2, .vocab_slices = 4, .steps = 2, .vocab_chunk = 100});
}
TEST(StepEquality, VocabSlicesMax_Fsdp8) { run_case({.mesh = M(1, 8, 1, 1, 8), .vocab_slices = 512, .seqs = 8}); }
TEST(StepEquality, E64_DRep2Cp4_Ep8) {
  run_case({.preset = "tiny-e64", .mesh = M(2, 1, 4, 1, 8), .chunks = 2, .seq_len = 64, .steps = 2});
}

// ---- exact_sum lowered onto i64 sums (EmulateSpec::lower_exact_sum; docs/numerics.md "Exact sums over integer
// collectives"): the whole step through the lowering a backend without a native exact_sum uses, still bitwise
// equal to the reference, with the documented schedule; no exact dtype reaches the backend.
template <class T>
void lowered_case(const Case& c) {
  emu::EmulateSpec s = make_spec(c);
  s.lower_exact_sum = true;
  s.record_trace = true;
  ASSERT_NE(s.repro().find("--lower-exact-sum"), std::string::npos);
  const emu::EmulateResult<T> r = expect_equal<T>(s);
  const size_t W = exact_lowering::words_per_element(std::is_same_v<T, double> ? DataType::exact_f64
                                                                                : DataType::exact_f32);
  const Counts want = expected_schedule(s);
  for (size_t rank = 0; rank < r.traces.size(); ++rank) {
    EXPECT_EQ(r.phases[rank], want) << "rank " << rank << " " << s.repro();
    int64_t rs_i64 = 0, rs_calls = 0;
    for (const StreamTrace& st : r.traces[rank])
      for (const TraceEntry& e : st.entries) {
        if (e.kind != TraceEntry::Kind::collective) continue;
        EXPECT_FALSE(is_exact(e.dtype)) << "rank " << rank << " " << e.comm << " " << e.name;
        // every reduce-scatter of the step is an exact gradient merge: lowered, count a multiple of W
        if (e.op == CollOp::reduce_scatter) rs_i64 += e.dtype == DataType::i64 && e.count % W == 0 ? 1 : 0;
      }
    for (const auto& [comm, tab] : r.rank_stats[rank])
      rs_calls += tab[static_cast<size_t>(CollOp::reduce_scatter)].calls;
    EXPECT_GT(rs_calls, 0);
    EXPECT_EQ(rs_i64, rs_calls) << "rank " << rank;
  }
}
TEST(StepExactLowering, DRep2Cp2_EFsdp2Ep2) { lowered_case<float>({.mesh = M(2, 1, 2, 2, 2), .steps = 2}); }
TEST(StepExactLowering, Fp64_Fsdp2Cp2_Recompute_Chunks2) {
  lowered_case<double>({.mesh = M(1, 2, 2, 2, 2), .chunks = 2, .recompute = true, .policy = "fp64", .steps = 2});
}
// The lowering on the deferred device: pack and unpack are stream work ordered with the collective and with the
// queued kernels that wrote the accumulators, and their declared accesses pass the hazard checker.
TEST(StepExactLowering, DeferredDevice) {
  for (const uint64_t seed : {0u, 7u}) {
    emu::EmulateSpec s = make_spec({.mesh = M(2, 1, 2, 2, 2), .chunks = 2, .recompute = true, .steps = 2});
    s.lower_exact_sum = true;
    s.device.mode = emu::DeviceMode::deferred;
    s.device.seed = seed;
    s.device.strict_memory = true;
    SCOPED_TRACE(s.repro());
    expect_equal<float>(s);
  }
}
TEST(StepExactLowering, Bf16_Cp4_Chunks2) {
  lowered_case<float>({.mesh = M(1, 1, 4, 2, 2), .chunks = 2, .policy = "bf16", .seq_len = 64, .steps = 2});
}

// ---- rejection: a mesh or chunking that would split a reduction tile ---------------------------------------------
TEST(StepLayout, TileSplitRejected) {
  const emu::EmulateSpec s = make_spec({.mesh = M(1, 1, 4, 1, 4), .seq_len = 32});  // chunk of 4 < tile 8
  try {
    emu::emulate<float>(s);
    FAIL() << "expected rejection";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("straddle"), std::string::npos) << e.what();
  }
  const emu::EmulateSpec s2 = make_spec({.mesh = M(1, 1, 2, 1, 2), .chunks = 5, .seqs = 1, .seq_len = 32});
  try {
    emu::emulate<float>(s2);  // 4 local tiles, 5 chunks
    FAIL() << "expected rejection";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("EP chunks"), std::string::npos) << e.what();
  }
  const emu::EmulateSpec s3 = make_spec({.mesh = M(1, 1, 2, 1, 2), .vocab_slices = -1});
  try {
    emu::emulate<float>(s3);
    FAIL() << "expected rejection";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocabulary slices must be >= 0"), std::string::npos) << e.what();
  }
}

// ---- the comparison can fail: a kernel set that differs from the reference is caught, with the tensor named -----
template <class T>
struct IdentityExperts : CpuKernels<T> {
  explicit IdentityExperts(Device& dev) : CpuKernels<T>(dev) {}
  void expert_forward(Policy, const T* x, const T*, const T*, const T*, int64_t n, int64_t d, int64_t F, T* ug, T* uu,
                      T* h, T* y, Stream, std::source_location) override {
    std::copy_n(x, n * d, y);
    std::fill_n(ug, n * F, T(0));
    std::fill_n(uu, n * F, T(0));
    std::fill_n(h, n * F, T(0));
  }
};
TEST(StepEquality, DifferentKernelsAreDetected) {
  emu::EmulateSpec s = make_spec({.mesh = M(1, 1, 2, 1, 2), .steps = 1});
  const auto r = emu::emulate<float>(s, [](int, Device& dev) { return std::make_unique<IdentityExperts<float>>(dev); });
  const emu::CheckReport rep = emu::check_reference<float>(s, r);
  ASSERT_FALSE(rep.ok());
  EXPECT_NE(rep.summary().find("MISMATCH"), std::string::npos) << rep.summary();
  EXPECT_FALSE(rep.first_mismatch()->what.empty());
}

// ---- identity experts: combine(dispatch(x)) == sum over selected k (ascending) of gate_k * x -----------------------
struct Tally {
  std::atomic<int64_t> checked{0}, bad{0}, nonzero{0};
};
template <class T>
struct IdentityCheck : IdentityExperts<T> {
  Tally* tally;
  IdentityCheck(Device& dev, Tally* t) : IdentityExperts<T>(dev), tally(t) {}
  void on_moe_combined(int64_t, const T* a, const T* gates, const int32_t*, const T* routed, int64_t N, int64_t d,
                       int64_t K, Stream, std::source_location) override {
    for (int64_t t = 0; t < N; ++t)
      for (int64_t c = 0; c < d; ++c) {
        T want = T(0);  // x * (sum of gates), in the combine's order: ((0 + g_0 x) + g_1 x) + ...
        for (int64_t k = 0; k < K; ++k) want = want + gates[t * K + k] * a[t * d + c];
        tally->checked++;
        tally->nonzero += routed[t * d + c] != T(0);
        if (std::memcmp(&want, &routed[t * d + c], sizeof(T)) != 0) tally->bad++;
      }
  }
};
TEST(StepEp, IdentityExpertsCombineDispatch) {
  for (const Case& c : {Case{.mesh = M(1, 1, 2, 1, 2), .chunks = 2, .steps = 1},
                        Case{.mesh = M(1, 2, 2, 1, 4), .chunks = 3, .steps = 1},
                        Case{.preset = "tiny-e64", .mesh = M(1, 1, 4, 1, 4), .chunks = 2, .seq_len = 64, .steps = 1}}) {
    emu::EmulateSpec s = make_spec(c);
    s.keep_tensors = false;
    Tally tally;
    emu::emulate<float>(s, [&](int, Device& dev) { return std::make_unique<IdentityCheck<float>>(dev, &tally); });
    EXPECT_EQ(tally.bad.load(), 0) << s.repro();
    // every local row of every MoE layer was checked, and the outputs are not trivially zero
    const int64_t moe_layers = s.cfg.layers - s.cfg.dense_layers;
    EXPECT_EQ(tally.checked.load(), moe_layers * s.run.sequences * s.run.seq_len * s.cfg.d_model) << s.repro();
    EXPECT_GT(tally.nonzero.load(), tally.checked.load() / 2) << s.repro();
  }
}

// ---- edge cases ----------------------------------------------------------------------------------------------
// Router biases that force every token onto experts {0, 1} (top-2) or {5} (top-1): the other experts receive
// zero tokens on every rank, one expert receives all of them.
std::vector<double> forced_bias(int64_t E, std::initializer_list<int> hot) {
  std::vector<double> b(static_cast<size_t>(E), 0.0);
  for (int e : hot) b[static_cast<size_t>(e)] = 10.0;
  return b;
}
TEST(StepEdge, ZeroTokenExpertsAndAllTokensToOne) {
  {
    emu::EmulateSpec s = make_spec({.mesh = M(1, 2, 2, 1, 4), .chunks = 2});
    for (int64_t i = s.cfg.dense_layers; i < s.cfg.layers; ++i)
      s.overrides.push_back({fmt::format("layers.{}.moe.router_bias", i), forced_bias(s.cfg.experts, {0, 1})});
    expect_equal<float>(s);
  }
  {
    emu::EmulateSpec s = make_spec({.mesh = M(1, 2, 2, 2, 2), .chunks = 2, .recompute = true, .top_k = 1});
    for (int64_t i = s.cfg.dense_layers; i < s.cfg.layers; ++i)
      s.overrides.push_back({fmt::format("layers.{}.moe.router_bias", i), forced_bias(s.cfg.experts, {5})});
    const auto r = expect_equal<float>(s);
    // the forced expert got every token: its gradient is nonzero, an idle expert's is exactly zero
    const auto& g = r.grads[0];
    const auto& wg = g[fmt::format("layers.{}.moe.experts.wg", s.cfg.dense_layers)];
    const int64_t per = s.cfg.d_model * s.cfg.expert_ffn;
    double hot = 0, idle = 0;
    for (int64_t j = 0; j < per; ++j) {
      hot += std::abs(static_cast<double>(wg.data[static_cast<size_t>(5 * per + j)]));
      idle += std::abs(static_cast<double>(wg.data[static_cast<size_t>(2 * per + j)]));
    }
    EXPECT_GT(hot, 0.0);
    EXPECT_EQ(idle, 0.0);
  }
}

// Sequences whose targets are all ignored: on a (1,2,2) mesh sequences 0, 1 belong to data group 0, so ranks
// 0 and 1 see no valid target at all; the loss is still the global mean and the gradients match.
TEST(StepEdge, AllTargetsIgnoredOnSomeRanks) {
  emu::EmulateSpec s = make_spec({.mesh = M(1, 2, 2, 2, 2), .chunks = 2});
  s.batches = emu::spec_batches(s);
  for (auto& b : s.batches) {
    for (int64_t p = 0; p < 2 * b.S; ++p) b.targets[static_cast<size_t>(p)] = model::kIgnoreIndex;  // seqs 0, 1
    for (int64_t p = 2 * b.S; p < 4 * b.S; p += 3) b.targets[static_cast<size_t>(p)] = model::kIgnoreIndex;
  }
  const auto r = expect_equal<float>(s);
  EXPECT_EQ(r.steps[0].n_valid, 2 * 32 - (2 * 32 + 2) / 3);
}

// ---- streams: chunked EP overlaps communication with compute (docs/parallel.md section 4) ----------------------------
// The comm stream runs in order, so what it may overlap is fixed by where its waits sit. Per MoE layer and rank,
// its EP entries must read (A = all_to_all, V = all_to_allv, W = wait for a compute event), for n = 3 chunks:
//   forward : W AV | AV W V | AV W V | W V   - the routing, then dispatch c+1 (counts + rows) before the wait for
//                                              chunk c's GEMMs
//   backward: WV | WV W V | WV W V | W V     - dy of chunk c+1 (after its packing on the compute stream) before the
//                                              wait for chunk c's dgrad
// after one wait when the step is built (the shards), and the compute stream waits for the combines once per
// layer, after the last chunk.
emu::EmulateResult<float> traced_run(emu::EmulateSpec s) {
  s.record_trace = true;
  s.keep_tensors = false;
  return emu::emulate<float>(s);
}

TEST(StepStreams, ChunkedEpOverlapsCommunicationWithCompute) {
  for (const bool rec : {false, true}) {
    const emu::EmulateSpec s = make_spec({.mesh = M(1, 1, 2, 1, 2), .chunks = 3, .recompute = rec, .steps = 1});
    const auto r = traced_run(s);
    ASSERT_EQ(r.traces.size(), size_t{2});
    const std::string fwd = "WAVAVWVAVWVWV", bwd = "WVWVWVWVWVWV";
    int moe = 0;
    for (int64_t i = 0; i < s.cfg.layers; ++i) moe += s.cfg.is_moe_layer(i) ? 1 : 0;
    ASSERT_EQ(moe, 2);
    const std::string want = "W" + fwd + fwd + (rec ? fwd + bwd + fwd + bwd : bwd + bwd);
    for (size_t rank = 0; rank < r.traces.size(); ++rank) {
      const RankTrace& t = r.traces[rank];
      ASSERT_EQ(t.size(), size_t{2}) << "compute and comm streams";
      std::string comm;
      for (const TraceEntry& e : t[1].entries) {
        if (e.kind == TraceEntry::Kind::wait) comm += 'W';
        else if (e.kind == TraceEntry::Kind::collective && e.comm == "ep")
          comm += e.op == CollOp::all_to_all ? 'A' : e.op == CollOp::all_to_allv ? 'V' : '?';
      }
      EXPECT_EQ(comm, want) << "rank " << rank << " recompute " << rec << " " << s.repro();
      int64_t launches = 0;
      for (const TraceEntry& e : t[0].entries)
        launches += e.kind == TraceEntry::Kind::compute &&
                    (e.name == "expert_forward" || e.name == "expert_backward_dgrad");
      const int64_t eloc = s.cfg.experts / s.mesh.ep;
      EXPECT_EQ(launches, 2 * 3 * eloc * (rec ? 3 : 2))
          << "expert_forward / expert_backward_dgrad per local expert, chunk and MoE layer";
    }
  }
}

// FSDP prefetch: unit u+1's all-gather (forward) and unit u-1's (backward) are issued on the comm stream before
// anything of unit u's compute reaches the compute stream, i.e. before the first compute-stream entry that
// follows the compute stream's wait for unit u's own gather.
TEST(StepStreams, FsdpPrefetchesTheNextUnit) {
  for (const bool rec : {false, true}) {
    const emu::EmulateSpec s = make_spec({.mesh = M(1, 2, 2, 2, 2), .chunks = 2, .recompute = rec, .steps = 1});
    const auto r = traced_run(s);
    const int64_t L = s.cfg.layers;
    for (size_t rank = 0; rank < r.traces.size(); ++rank) {
      const auto& comp = r.traces[rank][0].entries;
      const auto& comm = r.traces[rank][1].entries;
      // unit gathers: records on the comm stream right after an FSDP all-gather (fsdp*cp or e_fsdp)
      std::vector<size_t> recs;
      for (size_t k = 1; k < comm.size(); ++k)
        if (comm[k].kind == TraceEntry::Kind::record && comm[k - 1].kind == TraceEntry::Kind::collective &&
            comm[k - 1].op == CollOp::all_gather && (comm[k - 1].comm == "fsdp*cp" || comm[k - 1].comm == "e_fsdp"))
          recs.push_back(k);
      ASSERT_EQ(static_cast<int64_t>(recs.size()), 2 * L + 2) << "forward units 0..L+1, backward units L..1";
      // the compute-stream entry right after the wait for a gather record
      auto after_wait = [&](size_t rec_index) -> std::optional<TraceEntry> {
        for (size_t k = 0; k + 1 < comp.size(); ++k)
          if (comp[k].kind == TraceEntry::Kind::wait && comp[k].event_stream == 1 &&
              comp[k].event_index == static_cast<int64_t>(rec_index))
            return comp[k + 1];
        return std::nullopt;
      };
      const auto gather_issue = [&](size_t rec) {  // first all-gather of the unit that this record closes
        size_t k = rec;
        while (k > 0 && comm[k - 1].kind == TraceEntry::Kind::collective && comm[k - 1].op == CollOp::all_gather)
          --k;
        return comm[k].issue;
      };
      for (int64_t u = 1; u <= L; ++u) {  // forward: layer units 1..L, next unit u+1 (the head after the last)
        const std::optional<TraceEntry> first = after_wait(recs[static_cast<size_t>(u)]);
        ASSERT_TRUE(first.has_value()) << "forward unit " << u;
        EXPECT_LT(gather_issue(recs[static_cast<size_t>(u + 1)]), first->issue)
            << "rank " << rank << " forward unit " << u << " recompute " << rec;
      }
      for (int64_t k = 0; k + 1 < L; ++k) {  // backward: record k of the backward is unit L-k, the next is L-k-1
        const size_t cur = recs[static_cast<size_t>(L + 2 + k)], next = recs[static_cast<size_t>(L + 3 + k)];
        const std::optional<TraceEntry> first = after_wait(cur);
        ASSERT_TRUE(first.has_value()) << "backward unit " << L - k;
        EXPECT_LT(gather_issue(next), first->issue)
            << "rank " << rank << " backward unit " << L - k << " recompute " << rec;
      }
    }
  }
}

// ---- collective accounting: the documented schedule, per phase and in total ----------------------------------------
TEST(StepAccounting, MatchesDocumentedSchedule) {
  for (const Case& c : {Case{.mesh = M(1, 2, 2, 2, 2), .chunks = 1, .steps = 2},
                        Case{.mesh = M(1, 2, 2, 2, 2), .chunks = 3, .recompute = true, .steps = 2},
                        Case{.preset = "tiny-gqa", .mesh = M(2, 1, 2, 1, 4), .chunks = 2, .seqs = 8, .steps = 1},
                        Case{.mesh = M(1, 1, 1, 1, 1), .recompute = true, .steps = 1},
                        Case{.mesh = M(2, 1, 2, 1, 4), .chunks = 2, .vocab_slices = 1, .steps = 1},
                        Case{.mesh = M(1, 2, 2, 2, 2), .vocab_slices = 3, .steps = 1},
                        Case{.mesh = M(1, 1, 2, 1, 2), .vocab_slices = 600, .steps = 1}})
    expect_schedule(make_spec(c));
}

// ---- the causal core's key side: tile partials over an all-to-all where they are fewer bytes than accumulators, the
// accumulators' reduce-scatter otherwise (StepImpl::key_partials). Both forms give the reference's bits; the schedule
// says which ran. cp 2, chunks of 16 tokens: tile 8 gives 4 tiles per local sequence (4 floats < 56 B: partials),
// tile 2 gives 16 (64 B: accumulators; in fp64 16 doubles < 552 B: partials); cp 4 with chunks of 8 and tile 2 gives
// 8 (partials, with recompute). The deferred device checks either form's stream accesses.
TEST(StepKeySide, PartialsOrAccumulatorsSameBits) {
  for (const Case& c : {Case{.mesh = M(1, 1, 2, 1, 2), .seqs = 2, .seq_len = 64, .steps = 2, .tile = 8},
                        Case{.mesh = M(1, 1, 2, 1, 2), .seqs = 2, .seq_len = 64, .steps = 2, .tile = 2},
                        Case{.mesh = M(2, 1, 4, 2, 4), .recompute = true, .seqs = 4, .seq_len = 64, .steps = 1,
                             .tile = 2}}) {
    emu::EmulateSpec s = make_spec(c);
    SCOPED_TRACE(s.repro());
    expect_equal<float>(s);
    expect_schedule(s);
    s.device.mode = emu::DeviceMode::deferred;
    s.device.seed = 3;
    expect_equal<float>(s);
  }
  emu::EmulateSpec d = make_spec({.mesh = M(1, 1, 2, 1, 2), .policy = "fp64", .seqs = 2, .seq_len = 64, .steps = 1,
                                  .tile = 2});
  SCOPED_TRACE(d.repro());
  const emu::EmulateResult<double> r = expect_equal<double>(d);
  const Counts want = expected_schedule(d);
  for (size_t rank = 0; rank < r.phases.size(); ++rank) EXPECT_EQ(r.phases[rank], want) << "rank " << rank;
}

// ---- a diverged run stops every rank with one clear error (never "bitwise equal" on NaN) ------------------------------
TEST(StepEdge, NonFiniteLossStopsTheRun) {
  emu::EmulateSpec s = make_spec({.mesh = M(1, 2, 1, 1, 2), .steps = 2});
  const int64_t n = s.cfg.d_model * s.cfg.vocab;
  s.overrides.push_back({"lm_head", std::vector<double>(static_cast<size_t>(n), std::nan(""))});
  try {
    (void)emu::emulate<float>(s);
    FAIL() << "a NaN loss did not stop the run";
  } catch (const emu::RankError& e) {
    EXPECT_NE(e.original.find("step 1: loss nan"), std::string::npos) << e.original;
    EXPECT_NE(e.original.find("not finite"), std::string::npos) << e.original;
  }
}

}  // namespace
}  // namespace trident

// ---- the device seam: the step's cross-stream ordering, checked by the emulator's hazard checker -------------------
namespace trident::steptest {
namespace {

emu::EmulateSpec checked(Case c) {
  emu::EmulateSpec s = make_spec(c);
  s.device.check_hazards = true;
  return s;
}

TEST(StepHazards, CheckedMeshesBitwise) {
  for (const Case& c : {Case{.mesh = M(1, 2, 2, 2, 2), .chunks = 2, .steps = 2},
                        Case{.mesh = M(2, 1, 2, 1, 4), .chunks = 2, .recompute = true, .steps = 2},
                        Case{.preset = "tiny-gqa", .mesh = M(1, 1, 4, 2, 2), .chunks = 3, .seq_len = 64, .steps = 1}}) {
    const emu::EmulateSpec s = checked(c);
    SCOPED_TRACE(s.repro());
    expect_equal<float>(s);
  }
}

TEST(StepHazards, MissingGatherWaitIsCaughtWithBothNames) {
  emu::EmulateSpec s = checked({.mesh = M(1, 2, 1, 1, 2), .steps = 1});
  s.skip_wait = "fsdp_gather";
  try {
    (void)emu::emulate<float>(s);
    FAIL() << "a missing wait passed the hazard checker; repro: " << s.repro();
  } catch (const emu::RankError& e) {
    const std::string& m = e.original;
    EXPECT_NE(m.find("stream hazard"), std::string::npos) << m;
    EXPECT_NE(m.find("all_gather"), std::string::npos) << m;           // the producer (comm stream)
    EXPECT_NE(m.find("embedding_forward"), std::string::npos) << m;    // the first consumer (compute stream)
    EXPECT_NE(m.find("step_fsdp.cpp"), std::string::npos) << m;        // call sites: the gather
    EXPECT_NE(m.find("step_layers.cpp"), std::string::npos) << m;      // and the embedding
  }
  s.skip_wait.clear();  // the same run with the wait passes
  expect_equal<float>(s);
}

// Deferred execution: every launch, copy and free queued per stream and run in an order drawn by the seed among
// all orders the streams and events allow, fresh memory poisoned, the hazard checker on. Bitwise equal to the
// reference on the step meshes, for several seeds.
TEST(StepDeferred, MeshesAndSeedsBitwise) {
  const std::vector<Case> cases = {
      Case{.mesh = M(1, 1, 1, 1, 1), .steps = 2},
      Case{.mesh = M(1, 2, 2, 2, 2), .chunks = 2, .steps = 2},
      Case{.mesh = M(2, 1, 2, 1, 4), .chunks = 3, .recompute = true, .steps = 2},
      Case{.mesh = M(3, 1, 1, 1, 3), .recompute = true, .seqs = 6, .steps = 1, .experts = 6},
      Case{.preset = "tiny-gqa", .mesh = M(1, 1, 4, 2, 2), .chunks = 3, .seq_len = 64, .steps = 1},
      Case{.mesh = M(1, 2, 2, 1, 4), .chunks = 2, .vocab_slices = 3, .policy = "bf16", .steps = 1},
      Case{.mesh = M(1, 1, 2, 1, 2), .chunks = 2, .policy = "fp64", .steps = 1},
  };
  for (const Case& c : cases)
    for (const uint64_t seed : {1, 2, 3}) {
      emu::EmulateSpec s = make_spec(c);
      s.device.mode = emu::DeviceMode::deferred;
      s.device.seed = seed;
      SCOPED_TRACE(fmt::format("{} (deferred device, seed {})", s.repro(), seed));
      if (c.policy == "fp64") expect_equal<double>(s);
      else expect_equal<float>(s);
    }
}

// Strict device memory: every access the step declares (kernels and collectives) is to memory the device
// allocated; a host std::vector anywhere in the step's data path fails with the launch's name.
TEST(StepDeferred, EveryAccessIsDeviceMemory) {
  for (const Case& c : {Case{.mesh = M(1, 2, 2, 2, 2), .chunks = 2, .recompute = true, .steps = 1},
                        Case{.preset = "tiny-gqa", .mesh = M(2, 1, 2, 1, 4), .chunks = 2, .steps = 1}}) {
    emu::EmulateSpec s = make_spec(c);
    s.device.mode = emu::DeviceMode::deferred;
    s.device.seed = 4;
    s.device.strict_memory = true;
    SCOPED_TRACE(s.repro());
    expect_equal<float>(s);
  }
}

// A device memory source (DeviceOptions::memory: how `emulate --kernels cuda-ref|cuda-fast` puts every rank's
// device memory in CUDA managed memory): every allocation of the step, eager and deferred, comes from it and goes
// back to it; the bits do not change.
std::atomic<int64_t> g_source_live{0}, g_source_calls{0};
void* counting_allocate(size_t n) {
  ++g_source_calls, ++g_source_live;
  return ::operator new(n, std::nothrow);
}
void counting_release(void* p) {
  --g_source_live;
  ::operator delete(p);
}
TEST(StepDeferred, MemorySourceServesEveryAllocation) {
  static const emu::MemorySource source{"counting", counting_allocate, counting_release};
  for (const emu::DeviceMode mode : {emu::DeviceMode::eager, emu::DeviceMode::deferred}) {
    emu::EmulateSpec s = make_spec({.mesh = M(1, 2, 2, 2, 2), .chunks = 2, .steps = 2});
    s.device.mode = mode;
    s.device.strict_memory = true;
    s.device.memory = &source;
    SCOPED_TRACE(s.repro());
    g_source_calls = 0;
    expect_equal<float>(s);
    EXPECT_GT(g_source_calls.load(), 100);
    EXPECT_EQ(g_source_live.load(), 0) << "allocations not returned to the source";
  }
}

TEST(StepDeferred, MissingGatherWaitIsCaught) {
  emu::EmulateSpec s = make_spec({.mesh = M(1, 2, 1, 1, 2), .steps = 1});
  s.device.mode = emu::DeviceMode::deferred;
  s.skip_wait = "fsdp_gather";
  try {
    (void)emu::emulate<float>(s);
    FAIL() << "a missing wait passed the deferred device; repro: " << s.repro();
  } catch (const emu::RankError& e) {
    EXPECT_NE(e.original.find("all_gather"), std::string::npos) << e.original;
    EXPECT_NE(e.original.find("embedding_forward"), std::string::npos) << e.original;
  }
}

}  // namespace
}  // namespace trident::steptest
