// Property: packed sequences with random document lengths (documents shorter than a zig-zag chunk, documents
// spanning CP ranks, length-1 documents, one document per sequence) on random meshes of up to 32 ranks, 1D or 2D CP,
// give the single-rank reference's bits (docs/parallel.md section 2), for MLA, GQA and DSA (a random top-k: the
// selection then also crosses documents' and ranks' boundaries only where the mask allows). Document lengths are drawn per sequence from
// a mix of 1, short (< one zig-zag chunk) and long lengths, cut at the sequence end; a failure logs the repro
// command and the document starts.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include "emulator/run_step.h"
#include "reference/model/train.h"

namespace trident {
namespace {

RC_GTEST_PROP(PackedProps, RandomDocumentLengthsBitwise, ()) {
  const std::string preset = *rc::gen::element<std::string>("tiny", "tiny-gqa", "tiny-dsa");
  const int64_t cp = int64_t{1} << *rc::gen::inRange(0, 4);  // 1..8
  const int64_t fsdp = *rc::gen::inRange(1, 3), d_rep = cp <= 4 ? *rc::gen::inRange(1, 3) : 1;
  const int64_t W = d_rep * fsdp * cp;
  emu::EmulateSpec s;
  s.preset = preset;
  s.cfg = model::Config::preset(s.preset);
  if (s.cfg.dsa()) s.cfg.dsa_topk = *rc::gen::inRange(1, 17);
  const int64_t ep = std::min<int64_t>(W, *rc::gen::element<int64_t>(1, 2, 4, 8));
  s.mesh = MeshShape{d_rep, fsdp, cp, W / ep, ep};
  if (cp >= 4 && *rc::gen::arbitrary<bool>()) s.mesh.cp_inner = *rc::gen::element<int64_t>(2, cp / 2);  // 2D CP
  const int64_t groups = d_rep * fsdp, m = *rc::gen::inRange(1, 3);
  s.run.sequences = groups * *rc::gen::inRange(1, 3);
  s.run.seq_len = 2 * cp * s.cfg.tile * m;
  s.run.steps = 1;
  s.run.recompute = *rc::gen::arbitrary<bool>();
  s.ep_chunks = *rc::gen::inRange(1, 3);
  const int64_t S = s.run.seq_len, ch = S / (2 * cp);
  model::Batch b = model::synthetic_batch(s.cfg, s.run, 0);
  int64_t docs = 0, spanning = 0, shorter = 0, ones = 0;
  for (int64_t q = 0; q < b.B; ++q) {
    int64_t p = 0;
    while (p < S) {
      const int64_t kind = *rc::gen::inRange(0, 3);  // 0: length 1, 1: shorter than a chunk, 2: up to the whole rest
      int64_t len = kind == 0 ? 1 : kind == 1 ? *rc::gen::inRange<int64_t>(1, ch + 1) : *rc::gen::inRange<int64_t>(1, S + 1);
      len = std::min(len, S - p);
      for (int64_t k = 0; k < len; ++k) b.doc_start.push_back(p);
      ++docs;
      ones += len == 1;
      shorter += len < ch;
      spanning += p / ch != (p + len - 1) / ch;
      p += len;
    }
  }
  RC_CLASSIFY(ones > 0, "length-1 documents");
  RC_CLASSIFY(spanning > 0, "documents spanning chunks");
  RC_CLASSIFY(shorter > 0, "documents shorter than a chunk");
  RC_CLASSIFY(s.mesh.cp_2d(), "2D CP");
  RC_CLASSIFY(s.cfg.dsa(), "DSA");
  s.batches = {b};
  RC_LOG() << "repro: " << s.repro() << " (document starts given explicitly; " << docs << " documents"
           << (s.cfg.dsa() ? "; DSA top-k " + std::to_string(s.cfg.dsa_topk) : std::string()) << ")\n";
  const emu::EmulateResult<float> r = emu::emulate<float>(s);
  const emu::CheckReport rep = emu::check_reference<float>(s, r);
  RC_LOG() << rep.summary() << "\n";
  RC_ASSERT(rep.ok());
  RC_ASSERT(r.steps.at(0).grad_norm > 0.0);
}

}  // namespace
}  // namespace trident
