// Per-primitive goldens (docs/golden.md "Primitive goldens"): the inputs and outputs of every op of the step's
// kernel set (parallel/step_kernels.h), captured from a real step, so a kernel author checks one GPU kernel
// against the reference without running a model.
//
// How a case is made: RecordingKernels wraps a kernel set; the first call of each (op, shape signature) per rank
// is captured — every input the op reads is copied off the device, every scalar argument is noted — and the case
// is then *replayed* on a scratch device with the reference kernels (CpuKernels) to produce its outputs. Outputs
// start zeroed (exact accumulators too: an accumulator output is the rounded contribution of this one call), so
// a case is self-contained and any backend's Kernels<T> recomputes it the same way (run_case). The same bind
// function per op drives capture and replay, so the two cannot disagree on an argument.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "golden/state_dump.h"
#include "parallel/device.h"
#include "parallel/step_kernels.h"
#include "parallel/trace.h"

namespace trident::golden {

inline constexpr int kPrimitivesSchemaVersion = 1;

// One captured call. Tensors use NamedTensor with dtype f64, f32, i32 or i64 (the last only here).
struct PrimCase {
  std::string op;      // the Kernels<T> method name: "mm", "attn_core_forward", ...
  std::string name;    // "c0", "c1", ... (per op and rank, in capture order)
  int rank = 0;        // the emulated rank that made the call
  std::string dtype;   // T of the kernel set: "f32" or "f64"
  std::string policy;  // precision policy of the call ("fp32", "bf16", "fp64"), or "" when the op has none
  nlohmann::json shapes = nlohmann::json::object();  // scalar arguments, and "config" for attention ops
  std::vector<NamedTensor> inputs;   // in argument order
  std::vector<NamedTensor> outputs;  // in argument order (accumulators: the rounded contribution)
  // Error-bound data, for outputs whose op is a sum of products (GEMM, tile sums): per output element
  // sum_abs = sum |terms| (the op replayed on |inputs|), n_terms = the longest in-order chain, and the
  // tolerance-table entry that turns them into a bound (reference/tolerances.h).
  std::vector<NamedTensor> sum_abs;
  nlohmann::json n_terms = nlohmann::json::object();    // output name -> int
  nlohmann::json tolerance = nlohmann::json::object();  // output name -> {primitive, direction, k_const, k_per_term, u}
  // The derived acceptance rule (golden/primitives/accept.h): per floating output with a derived chain, the fp64
  // oracle and the per-element bound (f64, the output's shape); `accept` maps every output with a rule to
  // {"rule": "bound", "row", "k_rel", "floor"} or {"rule": "exact"}. Goldens written before the rule have none.
  std::vector<NamedTensor> oracle, bound;
  nlohmann::json accept = nlohmann::json::object();
  std::string repro;
};

struct PrimitivesFile;

// Every op of Kernels<T>, in header order (on_moe_combined is a test hook, not an op).
const std::vector<std::string>& kernel_ops();
// The ops a step runs only with packed sequences (document masks: attn_doc_core_*; a step without documents runs
// attn_core_* instead), so a golden of such a step holds them and one without does not.
const std::vector<std::string>& packed_only_ops();
// The ops only a DSA model runs (dsa_*; its attention runs them instead of attn_core_* / attn_doc_core_*).
const std::vector<std::string>& dsa_only_ops();

// Recomputes a case with `k` on `dev` (stream 0) and returns its outputs in the case's order.
template <class T>
std::vector<NamedTensor> run_case(const PrimCase& c, Kernels<T>& k, Device& dev);
// Checks a case against its op's contract before any backend runs it (run_case checks the same): every scalar an
// integer in [0, 2^31) (or a number / a flag), every input of the shape its scalars give, indices and positions in
// range (tokens in [0, V), router selections in [0, E), row lists >= 0, positions inside the rope table and the
// keys, document starts and DSA selections inside their rows), tile segments non-decreasing inside the rows, the
// rope table of max_pos * D / 2 values, the policy present exactly on ops that take one, every output present with
// the shape its scalars give, buffers at most a multiple of the case's data. Throws trident::Error naming the case.
template <class T>
void validate_case(const PrimCase& c);
// validate_case for every case of `f` (each with its own dtype).
void validate_cases(const PrimitivesFile& f);
// The same with a fresh eager emulator device and CpuKernels: the reference outputs (also sum_abs).
// abs_inputs: every floating input replaced by |x| (for multilinear ops, sum |terms| per output element).
template <class T>
std::vector<NamedTensor> reference_outputs(const PrimCase& c, bool abs_inputs = false);

// Captures cases from a live step. Thread-safe: one recorder serves every rank's RecordingKernels.
class Recorder {
 public:
  explicit Recorder(int max_cases_per_op = 2, std::string repro_base = {})
      : max_cases_(max_cases_per_op), repro_base_(std::move(repro_base)) {}
  // Claims the slot for (rank, op, signature): true for the first call of a new signature while the rank has
  // fewer than max_cases_per_op cases of that op; sets `name`.
  bool claim(int rank, const std::string& op, const std::string& signature, std::string& name);
  void add(PrimCase c);
  std::vector<PrimCase> take();  // sorted by (rank, op order, name)
  const std::string& repro_base() const { return repro_base_; }

 private:
  std::mutex mu_;
  int max_cases_;
  std::string repro_base_;
  std::map<std::tuple<int, std::string>, std::set<std::string>> seen_;
  std::vector<PrimCase> cases_;
};

// A kernel set that forwards every op to `inner` and captures the first call of each case into `rec`.
template <class T>
std::unique_ptr<Kernels<T>> make_recording_kernels(std::unique_ptr<Kernels<T>> inner, Device& dev, int rank,
                                                   Recorder& rec);

// A kernel set that forwards to `inner` and then flips the last bit (one ulp) of element `index` of the first
// output of op `op` (every call of it): the deliberately wrong backend of the tests and of `trident paired`.
// How often the perturbation met its op, and how often it flipped a bit (the op's output had element `index`), over
// every perturbed kernel set of the process: `trident paired` says whether it ever fired.
struct PerturbStats {
  std::atomic<int64_t> calls{0}, flips{0};
};
PerturbStats& perturb_stats();
template <class T>
std::unique_ptr<Kernels<T>> make_perturbed_kernels(std::unique_ptr<Kernels<T>> inner, Device& dev, std::string op,
                                                   int64_t index = 0);

// ---- the file: <dir>/primitives.h5 (docs/golden.md "Primitive goldens") -----------------------------------------
struct CommRecord {   // one communication call of one rank, in issue order
  std::string op;     // all_gather, reduce_scatter, all_reduce, ..., send, recv
  std::string comm;   // communicator name
  uint64_t seq = 0;
  uint64_t count = 0;
  std::string dtype;
  int peer = -1;
  uint64_t recv_hash = 0;  // FNV-1a 64 of the bytes this rank received (0: not recorded)
};
struct PrimitivesFile {
  nlohmann::json config;   // the model config
  nlohmann::json mesh = nlohmann::json::object();
  std::string repro;
  int ranks = 1;
  std::vector<PrimCase> cases;
  std::vector<std::vector<CommRecord>> comm;  // per rank
  // Set by read_primitives: the file has the checksum header (verified) / the case manifest (checked). Files
  // written before they existed have neither; they still load (`check` prints a note).
  bool checksum = false;
  bool manifest = false;
};
std::vector<CommRecord> comm_records(const RankTrace& trace);
// Writes the checksum header and the case manifest unless opt.checksum is false (the layout of older files).
void write_primitives(const std::string& path, const PrimitivesFile& f, const WriteOptions& opt = {});
// The validating reader (docs/golden.md "What the primitive reader checks"): checksum, global heaps, schema, shapes
// and stored sizes, the case manifest, the ranks; parsed in a forked child with a time limit unless opt.isolate is
// false. Throws trident::Error naming the file and the item.
PrimitivesFile read_primitives(const std::string& path, const ReadOptions& opt = {});

// ---- checking ---------------------------------------------------------------------------------------------------
struct CaseFailure {
  std::string op, name;
  int rank = 0;
  std::string output;   // output tensor name (or "" when the backend threw)
  int64_t index = -1;   // flat element index of the worst violation
  double got = 0, want = 0, bound = 0;
  std::string message;  // one line
  std::string repro;     // the `trident check` command line that reruns just this case
};
struct CheckOptions {
  bool bitwise = true;      // the backend promises the reference's bits; else the golden's stored rule
  std::string only_op;      // filter (empty: all)
  std::string only_case;    // filter (empty: all)
  int only_rank = -1;
  std::string backend = "cpu";  // named in the repro lines
};
// Per (op, output) figures of a check, as ggml's test-backend-ops prints them (golden/primitives/accept.h).
struct OutputStat {
  std::string rule;        // bound | exact | sum_abs | bitwise
  int64_t cases = 0, passed = 0;
  double worst_ratio = 0;  // max over cases of the worst |err| / bound (bits: inf where they differ)
  double worst_rel = -1;   // max over cases of the relative test's ratio (-1: not run)
};
using OutputReport = std::map<std::pair<std::string, std::string>, OutputStat>;
struct CheckSummary {
  OutputReport report;
  int64_t cases = 0, passed = 0;
  std::vector<CaseFailure> failures;
  std::vector<std::string> ops_checked;
  nlohmann::json to_json() const;
};
// The steps every checker (check_primitives, the fast tier's gpu/fast/check.h) takes per case, one way:
// case_selected: the case has T's dtype (want_dtype) and passes opt's filters; it is then counted in sum (cases,
// ops_checked). case_failure: its failure record, with the `trident check` line that reruns just it.
// run_checked: its outputs from the backend, or false with the backend's error recorded in sum.
bool case_selected(const PrimCase& c, const CheckOptions& opt, const std::string& want_dtype, CheckSummary& sum);
CaseFailure case_failure(const PrimCase& c, const CheckOptions& opt, const std::string& golden_path);
template <class T>
bool run_checked(const PrimCase& c, Kernels<T>& k, Device& dev, CaseFailure& fl, CheckSummary& sum,
                 std::vector<NamedTensor>& got);
// The output of `got` a golden output `want` is compared with: the one of the same name, shape and dtype. Null
// when there is none, with fl.message saying so (fl.output set to want's name either way).
const NamedTensor* matching_output(const std::vector<NamedTensor>& got, const NamedTensor& want, const PrimCase& c,
                                   CaseFailure& fl);
template <class T>
using KernelsFactory = std::function<std::unique_ptr<Kernels<T>>(Device& dev)>;
// Recomputes every case of `f` with the kernel sets `factory` makes and compares. The cases' buffers live on
// `device` when given (e.g. a CudaDevice for a GPU kernel set: inputs uploaded, outputs downloaded through it),
// else on a fresh eager emulator device (host memory).
template <class T>
CheckSummary check_primitives(const PrimitivesFile& f, const KernelsFactory<T>& factory, const CheckOptions& opt,
                              const std::string& golden_path, Device* device = nullptr);

}  // namespace trident::golden
