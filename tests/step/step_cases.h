// Shared helpers of the step tests: building specs, running them, the documented collective schedule.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "emulator/run_step.h"
#include "reference/check.h"
#include "reference/model/params.h"

namespace trident::steptest {


struct Case {
  std::string preset = "tiny";
  MeshShape mesh;
  int64_t chunks = 1;
  int64_t vocab_slices = 0;  // 0: one per vocab chunk
  bool recompute = false;
  std::string policy = "fp32";
  int64_t seqs = 4, seq_len = 32, steps = 3;
  int64_t experts = 0, top_k = 0, tile = 0, vocab_chunk = 0;  // overrides (0: the preset's)
  emu::CommBackend comm = emu::CommBackend::emu;
  int64_t docs_per_seq = 1;  // packed sequences (1: one document per sequence)
};

inline MeshShape M(int64_t dr, int64_t f, int64_t cp, int64_t ef, int64_t ep) { return MeshShape{dr, f, cp, ef, ep}; }
// 2D CP: cp = (cp / ci) domains x ci ranks.
inline MeshShape M2(int64_t dr, int64_t f, int64_t cp, int64_t ef, int64_t ep, int64_t ci) {
  return MeshShape{dr, f, cp, ef, ep, ci};
}

inline emu::EmulateSpec make_spec(const Case& c) {
  emu::EmulateSpec s;
  s.preset = c.preset;
  s.cfg = model::Config::preset(c.preset);
  s.cfg.policy = parse_policy(c.policy);
  if (c.experts) s.cfg.experts = c.experts;
  if (c.top_k) s.cfg.top_k = c.top_k;
  if (c.tile) s.cfg.tile = c.tile;
  if (c.vocab_chunk) s.cfg.vocab_chunk = c.vocab_chunk;
  s.cfg.validate();
  s.run.sequences = c.seqs;
  s.run.seq_len = c.seq_len;
  s.run.steps = c.steps;
  s.run.recompute = c.recompute;
  s.run.docs_per_seq = c.docs_per_seq;
  s.mesh = c.mesh;
  s.ep_chunks = c.chunks;
  s.vocab_slices = c.vocab_slices;
  s.comm = c.comm;
  return s;
}

// Runs the spec and compares with the reference; returns the result for further checks.
template <class T>
emu::EmulateResult<T> expect_equal(const emu::EmulateSpec& s) {
  emu::EmulateResult<T> r = emu::emulate<T>(s);
  const emu::CheckReport rep = emu::check_reference<T>(s, r);
  EXPECT_TRUE(rep.ok()) << rep.summary() << "\nrepro: " << s.repro();
  EXPECT_GT(rep.checks.size(), size_t{10});
  // vacuous-pass guards: a real loss and nonzero gradients in every step
  for (const auto& st : r.steps) {
    EXPECT_GT(st.loss, 0.0) << s.repro();
    EXPECT_GT(st.grad_norm, 0.0) << s.repro();
  }
  return r;
}

inline void run_case(const Case& c) {
  const emu::EmulateSpec s = make_spec(c);
  if (s.cfg.policy == Policy::fp64) expect_equal<double>(s);
  else expect_equal<float>(s);
}

// ---- the documented schedule (docs/parallel.md "Schedule and collective accounting") -------------------------
using Counts = PhaseCounts;
inline void add(Counts& c, const std::string& ph, const std::string& comm, CollOp op, int64_t n) {
  if (n > 0) c[ph][comm][static_cast<size_t>(op)] += n;
}
inline Counts expected_schedule(const emu::EmulateSpec& s) {
  const model::Config& cfg = s.cfg;
  const MeshShape& m = s.mesh;
  const int64_t sequences = s.run.sequences, chunks = s.ep_chunks;
  const bool recompute = s.run.recompute;
  const auto info = model::param_layout(cfg);
  auto dense_params = [&](const std::string& prefix) {
    int64_t n = 0;
    for (const auto& p : info)
      if (p.trainable && p.name.rfind(prefix, 0) == 0 && p.name.find(".moe.experts.") == std::string::npos) ++n;
    return n;
  };
  const int64_t q = sequences / (m.d_rep * m.fsdp);  // local sequences
  const int64_t X = 3 * (cfg.experts / m.ep);         // expert tensors on a rank per MoE layer
  const int64_t n = chunks;
  const auto AG = CollOp::all_gather, RS = CollOp::reduce_scatter, AR = CollOp::all_reduce,
             A2A = CollOp::all_to_all, A2AV = CollOp::all_to_allv;
  // The causal core's key side: tile partials in an all-to-all per query tile where they are fewer bytes than
  // accumulators (1D CP, no DSA, no packed documents; StepImpl::key_partials), else the accumulators' reduce-scatter.
  const bool packed = std::any_of(s.batches.begin(), s.batches.end(),
                                  [](const model::Batch& b) { return !b.doc_start.empty(); });
  const int64_t nt = 2 * (s.run.seq_len / (2 * m.cp)) / cfg.tile;
  const size_t acc_bytes = cfg.policy == Policy::fp64 ? sizeof(ExactAcc<double>) : sizeof(ExactAcc<float>);
  const size_t t_bytes = cfg.policy == Policy::fp64 ? sizeof(double) : sizeof(float);
  const bool partials = !m.cp_2d() && !cfg.dsa() && !packed && static_cast<size_t>(nt) * t_bytes < acc_bytes;
  // Dense weight gradients as tile partials (docs/parallel.md section 4): the attention projections, the dense MLP's
  // and the shared expert's weights go through an fsdp*cp all-to-all instead of the accumulators' reduce-scatter where
  // dense_grad_partials holds (the CPU kernel set has the ops), and so does the MoE router; the norms and the indexer
  // do not.
  const bool dense_parts = dense_grad_partials(m, sequences, s.run.seq_len, cfg.tile, t_bytes, acc_bytes);
  auto partial_params = [&](const std::string& prefix) {
    int64_t n = 0;
    if (!dense_parts) return n;
    for (const auto& p : info)
      if (p.trainable && p.name.rfind(prefix, 0) == 0 && dense_grad_partial_tensor(p.name)) ++n;
    return n;
  };
  Counts c;
  add(c, "fwd.embed", "fsdp*cp", AG, 1);
  bool any_moe = false;
  for (int64_t i = 0; i < cfg.layers; ++i) {
    const bool moe = cfg.is_moe_layer(i);
    any_moe = any_moe || moe;
    const int64_t P = dense_params(fmt::format("layers.{}.", i));
    const std::string f = fmt::format("fwd.layer.{}", i), b = fmt::format("bwd.layer.{}", i);
    add(c, f, "fsdp*cp", AG, P);
    add(c, b, "fsdp*cp", AG, P);
    // CP: one collective per local sequence on cp, or one on each of cp_outer and cp_inner (2D CP)
    const std::vector<std::string> cp_comms =
        m.cp_2d() ? std::vector<std::string>{"cp_outer", "cp_inner"} : std::vector<std::string>{"cp"};
    for (const std::string& cpc : cp_comms) {
      add(c, f, cpc, AG, q);
      add(c, b, cpc, AG, recompute ? q : 0);
      add(c, b, cpc, partials ? A2A : RS, partials ? q * nt : q);  // partials: one all-to-all per query tile
    }
    const int64_t Pp = partial_params(fmt::format("layers.{}.", i));
    add(c, b, "fsdp*cp", RS, P - Pp);
    add(c, b, "fsdp*cp", A2A, Pp);
    add(c, b, "d_rep", AR, P);
    if (moe) {
      add(c, f, "e_fsdp", AG, X);
      add(c, f, "ep", A2A, n);
      add(c, f, "ep", A2AV, 2 * n);
      add(c, b, "e_fsdp", AG, X);
      add(c, b, "ep", A2A, recompute ? n : 0);
      add(c, b, "ep", A2AV, (recompute ? 2 * n : 0) + 2 * n);
      add(c, b, "e_fsdp", RS, X);
    }
  }
  add(c, "fwd.head", "fsdp*cp", AG, 2);
  add(c, "loss", "world", AR, 2);
  // vocabulary slices: lm_head in n_h column slices of whole vocab chunks, embed in n_e row slices per shard
  const int64_t n_vc = (cfg.vocab + cfg.vocab_chunk - 1) / cfg.vocab_chunk;
  const int64_t sl = s.vocab_slices == 0 ? n_vc : s.vocab_slices;
  const int64_t n_h = std::min(sl, n_vc), n_e = std::min(sl, (cfg.vocab + m.fsdp * m.cp - 1) / (m.fsdp * m.cp));
  // lm_head slices, final_norm; the slices' and embed's as tile partials where dense_parts holds
  add(c, "bwd.head", "fsdp*cp", RS, dense_parts ? 1 : n_h + 1);
  add(c, "bwd.head", "fsdp*cp", A2A, dense_parts ? n_h : 0);
  add(c, "bwd.head", "d_rep", AR, n_h + 1);
  add(c, "bwd.embed", "fsdp*cp", dense_parts ? A2A : RS, n_e);
  add(c, "bwd.embed", "d_rep", AR, n_e);
  add(c, "opt", "world", AR, any_moe ? 2 : 1);
  return c;
}

// Runs the spec and checks every rank's collectives against expected_schedule, per phase and in CommStats (nothing
// issued outside the schedule).
inline void expect_schedule(emu::EmulateSpec s) {
  s.keep_tensors = false;
  const auto r = emu::emulate<float>(s);
  const Counts want = expected_schedule(s);
  for (int64_t rank = 0; rank < s.mesh.world(); ++rank) {
    const Counts& got = r.phases[static_cast<size_t>(rank)];
    EXPECT_EQ(got, want) << "rank " << rank << " " << s.repro();
    std::map<std::string, std::array<int64_t, kNumCollOps>> tot;
    for (const auto& [ph, m] : want)
      for (const auto& [comm, a] : m)
        for (int op = 0; op < kNumCollOps; ++op) tot[comm][static_cast<size_t>(op)] += a[static_cast<size_t>(op)];
    for (const auto& [comm, tab] : r.rank_stats[static_cast<size_t>(rank)])
      for (int op = 0; op < kNumCollOps; ++op) {
        if (static_cast<CollOp>(op) == CollOp::split) continue;  // communicator setup, once per run
        const int64_t w = tot.count(comm) ? tot[comm][static_cast<size_t>(op)] * s.run.steps : 0;
        EXPECT_EQ(tab[static_cast<size_t>(op)].calls, w)
            << "rank " << rank << " " << comm << " " << to_string(static_cast<CollOp>(op)) << " " << s.repro();
      }
  }
}

}  // namespace trident::steptest
