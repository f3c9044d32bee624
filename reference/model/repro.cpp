// Model and run flags of a repro line (reference/model/repro.h).
#include "reference/model/repro.h"

namespace trident::model {

void add_model_flags(ReproLine& r, const std::string& preset, const std::string& config_path, const Config& cfg) {
  const bool from_file = !config_path.empty();
  const Config base = from_file ? Config::load(config_path) : Config::preset(preset);
  if (from_file) r.opt("--config", config_path);
  else r.opt("--preset", preset);
  if (cfg.policy != base.policy) r.opt("--policy", std::string(to_string(cfg.policy)));
  r.opt_if("--seed", cfg.seed, base.seed);
  r.opt_if("--experts", cfg.experts, base.experts);
  r.opt_if("--top-k", cfg.top_k, base.top_k);
  r.opt_if("--tile", cfg.tile, base.tile);
  r.opt_if("--layers", cfg.layers, base.layers);
  r.opt_if("--vocab-chunk", cfg.vocab_chunk, base.vocab_chunk);
}

void add_run_flags(ReproLine& r, const RunConfig& run) {
  const RunConfig d;
  r.opt("--steps", run.steps);
  r.opt_if("--seqs", run.sequences, d.sequences);
  r.opt_if("--seq-len", run.seq_len, d.seq_len);
  r.opt_if("--lr", run.lr, d.lr);
  r.opt_if("--data-seed", run.data_seed, d.data_seed);
  r.opt_if("--docs-per-seq", run.docs_per_seq, d.docs_per_seq);
  r.opt_if("--token-chunk", run.token_chunk, d.token_chunk);
  r.flag("--recompute", run.recompute);
}

}  // namespace trident::model
