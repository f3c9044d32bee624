// `trident train`: the single-rank reference model on a synthetic next-token task (docs/model.md "CLI").
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <span>
#include <string>

#include "cli/command.h"
#include "emulator/memory.h"
#include "golden/checkpoint.h"
#include "golden/state_dump.h"
#include "reference/counted.h"
#include "reference/check.h"
#include "reference/model/repro.h"
#include "reference/model/train.h"
#include "sim/export.h"

namespace {

using namespace trident;
using namespace trident::model;

struct Opts {
  std::string preset = "tiny";
  std::string config;
  std::string policy;
  int64_t steps = 20;
  bool recompute = false;
  int64_t seqs = 4;
  int64_t seq_len = 32;
  double lr = 3e-3;
  int64_t seed = -1;
  int64_t data_seed = 7;
  int64_t docs_per_seq = 1;
  int64_t token_chunk = 64;
  std::string dump;
  std::string save, resume;  // checkpoints (docs/checkpoints.md)
  bool quiet = false;
  std::string max_memory;
  std::string json;  // --json FILE (docs/timeline.md section 6)
};

template <class T>
golden::NamedTensor tensor(const std::string& name, const Tensor<T>& t) {
  return golden::make_tensor(name, t.shape, std::span<const T>(t.data.data(), t.data.size()));
}

// The exact command line of this run (reference/model/repro.h: the builder `trident emulate` uses too).
std::string repro_line(const Opts& o, const Config& c, const RunConfig& rc) {
  ReproLine r("trident train");
  add_model_flags(r, o.config.empty() ? o.preset : "", o.config, c);
  add_run_flags(r, rc);
  r.opt_nonempty("--dump", o.dump);
  r.opt_nonempty("--json", o.json);
  r.opt_nonempty("--resume", o.resume).opt_nonempty("--save", o.save);  // a resumed run reproduces only from there
  return r.str();
}

template <class T>
int run(const Opts& o, const Config& cfg) {
  RunConfig rc;
  rc.sequences = o.seqs;
  rc.seq_len = o.seq_len;
  rc.steps = o.steps;
  rc.token_chunk = o.token_chunk;
  rc.recompute = o.recompute;
  rc.lr = o.lr;
  rc.data_seed = static_cast<uint64_t>(o.data_seed);
  rc.docs_per_seq = o.docs_per_seq;
  rc.validate_for(cfg);  // bounds of every run value and overflow-checked sizes of this model on this batch
  if (!o.dump.empty() && o.steps < 1) fail("--dump needs --steps >= 1 (it records the last step)");
  if (!o.dump.empty() && rc.docs_per_seq > 1)
    fail("--dump does not store document boundaries (the state dump schema has none): drop --docs-per-seq or --dump");
  if (!o.dump.empty()) golden::check_writable(o.dump);  // before training, not after it
  if (!o.json.empty()) sim::check_writable_file(o.json, "--json");
  // Refused before any allocation when the estimate exceeds the available memory or --max-memory.
  emu::check_memory(emu::estimate_train(cfg, rc, !o.dump.empty()),
                    o.max_memory.empty() ? 0 : emu::parse_bytes(o.max_memory), "train");
  if (!o.save.empty()) golden::check_save_target(o.save);
  Trainer<T> tr(cfg, rc);
  if (!o.resume.empty()) {
    const auto l0 = std::chrono::steady_clock::now();
    golden::CheckpointMeta meta = golden::read_checkpoint_meta(o.resume);
    golden::check_resumable(meta, cfg, rc, o.resume);
    tr.restore(golden::load_checkpoint<T>(o.resume, &meta));
    std::printf("resumed from %s: %s taken (written by %s on mesh %s; loaded in %.2f s)\n", o.resume.c_str(),
                counted(tr.step_count, "step").c_str(), meta.writer.c_str(), meta.mesh.spec().c_str(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - l0).count());
  }
  const int64_t first = tr.step_count;  // synthetic data position
  const std::string dsa = cfg.dsa() ? fmt::format(" with DSA (top-{} keys, indexer {}x{})", cfg.dsa_topk, cfg.index_heads,
                                                   cfg.index_dim)
                                     : std::string();
  std::printf("trident train: %s attention%s, %lld layers (%lld dense), %lld experts top-%lld, %lld params, policy %s%s\n",
              std::string(to_string(cfg.attn)).c_str(), dsa.c_str(), static_cast<long long>(cfg.layers),
              static_cast<long long>(cfg.dense_layers), static_cast<long long>(cfg.experts),
              static_cast<long long>(cfg.top_k), static_cast<long long>(tr.params.numel()),
              std::string(to_string(cfg.policy)).c_str(), o.recompute ? ", full recompute" : "");
  std::printf("batch: %lld sequences x %lld tokens, tile %lld, lr %g\n", static_cast<long long>(o.seqs),
              static_cast<long long>(o.seq_len), static_cast<long long>(cfg.tile), o.lr);
  const std::string repro = repro_line(o, cfg, rc);
  std::printf("repro: %s\n", repro.c_str());
  std::fflush(stdout);
  const auto t0 = std::chrono::steady_clock::now();
  StepProgress where;  // the step's layer and phase, shown by the ticker on long steps (outlives the ticker)
  cli::Ticker ticker(fmt::format("step {}/{}", first + 1, first + o.steps));
  tr.progress = &where;
  ticker.watch(&where);
  nlohmann::json steps_json = nlohmann::json::array();
  for (int64_t s = 0; s < o.steps; ++s) {
    const Batch batch = synthetic_batch(cfg, rc, first + s);
    const bool last = s + 1 == o.steps;
    ParamSet<T> before, m_before, v_before;
    if (last && !o.dump.empty()) before = tr.params, m_before = tr.m, v_before = tr.v;
    const StepStats st = tr.step(batch);
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string ilos = cfg.dsa() ? fmt::format("  indexer_loss {:.6f}", st.indexer_loss) : std::string();
    cli::print_step_line(first + s + 1, first + o.steps, s + 1, o.steps,
                         fmt::format("loss {:.6f}{}  grad_norm {:.4f}  clip {:.4f}", st.loss, ilos, st.grad_norm,
                                     st.clip),
                         el);
    ticker.note(fmt::format("step {}/{}", first + s + 2, first + o.steps));
    steps_json.push_back({{"step", first + s + 1}, {"loss", st.loss}, {"grad_norm", st.grad_norm}, {"clip", st.clip}});
    if (cfg.dsa()) steps_json.back()["indexer_loss"] = st.indexer_loss;
    if (!std::isfinite(st.loss) || !std::isfinite(st.grad_norm))
      fail(fmt::format("step {}: loss {} / grad norm {} is not finite (diverged: lower --lr?)", s + 1, st.loss,
                       st.grad_norm));
    if (last && !o.dump.empty()) {
      golden::StateDump d;
      d.config = cfg.to_json();
      d.seed = cfg.seed;
      d.repro = repro;
      d.tokens = golden::make_tensor("tokens", {batch.B, batch.S}, std::span<const int32_t>(batch.tokens));
      d.targets = golden::make_tensor("targets", {batch.B, batch.S}, std::span<const int32_t>(batch.targets));
      d.loss = st.loss;
      for (size_t p = 0; p < tr.params.size(); ++p) {
        const std::string& n = tr.params.info[p].name;
        d.weights.push_back(tensor(n, before.t[p]));
        d.grads.push_back(tensor(n, tr.grads.t[p]));
        d.weights_after.push_back(tensor(n, tr.params.t[p]));
        d.adam_m.push_back(tensor(n, m_before.t[p]));
        d.adam_v.push_back(tensor(n, v_before.t[p]));
        d.adam_m_after.push_back(tensor(n, tr.m.t[p]));
        d.adam_v_after.push_back(tensor(n, tr.v.t[p]));
      }
      d.step = tr.step_count;
      d.optimizer = adamw_hyper(rc).to_json();
      d.optimizer["step"] = tr.step_count;
      d.optimizer["clip_coef"] = st.clip;
      d.optimizer["grad_norm"] = st.grad_norm;
      d.optimizer["decay"] = "matrices only (rank >= 2); router_bias is a buffer updated by bias_rate";
      d.optimizer["run"] = rc.to_json();
      golden::write_state(o.dump, d);
      std::printf("wrote %s (step %lld: weights, grads, weights_after of %zu tensors)\n", o.dump.c_str(),
                  static_cast<long long>(tr.step_count), tr.params.size());
    }
  }
  if (!o.save.empty()) {
    golden::CheckpointMeta meta;
    meta.writer = "train";
    meta.cfg = cfg;
    meta.run = rc;
    meta.step = tr.step_count;
    const auto s0 = std::chrono::steady_clock::now();
    golden::save_checkpoint<T>(o.save, meta, tr.state());
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
    std::printf("saved checkpoint %s (step %lld: weights, router biases, AdamW moments; one rank) in %.2f s\n",
                o.save.c_str(), static_cast<long long>(tr.step_count), secs);
  }
  if (!o.json.empty()) {
    // The same schema as `emulate --json` (docs/timeline.md section 6): one rank, no collectives.
    const nlohmann::json doc = {
        {"schema", "trident.run/1"}, {"command", "train"}, {"repro", repro}, {"mesh", nullptr}, {"ranks", 1},
        {"policy", std::string(to_string(cfg.policy))},
        {"wall_seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()},
        {"steps", steps_json}, {"peak_memory_bytes", {cli::peak_rss_bytes()}}, {"collectives", nlohmann::json::array()}};
    sim::write_text_file(o.json, doc.dump(2) + "\n", "--json");
    std::printf("wrote %s (--json: steps, peak memory, repro)\n", o.json.c_str());
  }
  return 0;
}

}  // namespace

TRIDENT_COMMAND({"train", "train the single-rank reference model on a synthetic next-token task",
                 [](CLI::App& sub) -> trident::cli::Action {
                   auto o = std::make_shared<Opts>();
                   auto* preset = sub.add_option("--preset", o->preset, cli::preset_help())
                                      ->capture_default_str();
                   sub.add_option("--config", o->config,
                                  "model config file (.json or .toml; every key required); instead of --preset")
                       ->check(CLI::ExistingFile)
                       ->excludes(preset);
                   sub.add_option("--steps", o->steps, "number of optimizer steps")->capture_default_str()
                       ->check(trident::cli::int_at_least(0));
                   sub.add_option("--policy", o->policy,
                                  "precision policy fp64|fp32|bf16 (default: the config's policy, fp32 for presets)")
                       ->check(CLI::IsMember({"fp64", "fp32", "bf16"}));
                   sub.add_flag("--recompute", o->recompute,
                                "full recompute: keep only each layer's input, re-run the layer in backward "
                                "(bitwise identical gradients)");
                   sub.add_option("--seqs", o->seqs, "sequences per step")->capture_default_str()
                       ->check(trident::cli::positive_int());
                   sub.add_option("--seq-len", o->seq_len, "tokens per sequence")->capture_default_str()
                       ->check(trident::cli::int_at_least(2));
                   sub.add_option("--lr", o->lr, "AdamW learning rate")->capture_default_str()
                       ->check(trident::cli::non_negative_number());
                   sub.add_option("--seed", o->seed, "parameter init seed (default: the config's seed)")
                       ->check(trident::cli::int_at_least(0));
                   sub.add_option("--data-seed", o->data_seed, "synthetic data seed")->capture_default_str()
                       ->check(trident::cli::int_at_least(0));
                   sub.add_option("--docs-per-seq", o->docs_per_seq,
                                  "packed sequences: documents per sequence, cut at positions drawn from the data "
                                  "seed; attention stays inside a document, RoPE positions restart (docs/model.md)")
                       ->capture_default_str()
                       ->check(trident::cli::positive_int());
                   sub.add_option("--token-chunk", o->token_chunk,
                                  "linear-CE token chunk (memory only: results are bitwise independent of it)")
                       ->capture_default_str()
                       ->check(trident::cli::positive_int());
                   sub.add_option("--dump", o->dump,
                                  "write the golden HDF5 state of the last step (inputs, weights before, loss, "
                                  "grads, weights after, config, optimizer, repro) to this file");
                   sub.add_option("--json", o->json,
                                  "write the run as JSON: loss, grad norm and clip per step, peak resident memory, "
                                  "the repro line (docs/timeline.md section 6)");
                   sub.add_option("--max-memory", o->max_memory,
                                  "refuse the run when its memory estimate exceeds this (bytes, or with a unit: "
                                  "512MiB, 8GiB); default: the memory available on this machine");
                   sub.add_option("--save", o->save,
                                  "after the last step, write a checkpoint directory (weights, router biases, AdamW "
                                  "moments, step, data position; docs/checkpoints.md), replacing it atomically");
                   sub.add_option("--resume", o->resume,
                                  "continue from a checkpoint directory of `train` or `emulate` (same model, batch, "
                                  "optimizer and data flags; --steps more steps), bit for bit");
                   return [o]() -> int {
                     Config cfg = o->config.empty() ? Config::preset(o->preset) : Config::load(o->config);
                     if (!o->policy.empty()) cfg.policy = parse_policy(o->policy);
                     if (o->seed >= 0) cfg.seed = static_cast<uint64_t>(o->seed);
                     if (o->data_seed < 0) fail("--data-seed must be >= 0");
                     cfg.validate();
                     if (cfg.policy == Policy::fp64) return run<double>(*o, cfg);
                     return run<float>(*o, cfg);
                   };
                 }});
