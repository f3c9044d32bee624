// The layout generator of `trident fuzz` and of the step property tests (docs/fuzz.md): one generator, two sources of
// choices. A Layout is everything one emulated run needs beyond the model: the five mesh dimensions and 2D CP, the
// batch (sequences, lengths, packed documents), EP chunks, vocabulary slices, recompute, the policy, the device and
// its scheduler seeds, the communicator, lowered exact sums, the kernel set, and a checkpoint resumed on a second
// mesh. draw() maps raw choices onto a layout that is valid for the model by construction (every mesh rule of
// parallel/layout.h holds), so a choice source that shrinks toward small numbers (RapidCheck's) shrinks toward small
// layouts, and a seeded one (SeededChoices) replays exactly.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "emulator/run_step.h"

namespace trident::fuzz {

// A source of raw choices.
class Choices {
 public:
  virtual ~Choices() = default;
  virtual int64_t in_range(int64_t lo, int64_t hi) = 0;  // an integer in [lo, hi), hi > lo
  bool coin(int64_t num = 1, int64_t den = 2) { return in_range(0, den) < num; }  // true with probability num/den
};

// Choices from a seeded generator (splitmix64): the same seed gives the same choices on every machine.
class SeededChoices final : public Choices {
 public:
  explicit SeededChoices(uint64_t seed) : s_(seed) {}
  int64_t in_range(int64_t lo, int64_t hi) override;

 private:
  uint64_t next();
  uint64_t s_;
};

// A model to draw layouts for: the config and where it came from (for the repro line).
struct Model {
  model::Config cfg;
  std::string preset = "tiny";  // the preset it came from ("" when config_path is set)
  std::string config_path;      // the config file it came from ("": the preset)
  std::string name() const { return config_path.empty() ? preset : config_path; }
};

struct GenOptions {
  std::vector<Model> models;  // drawn among (at least one)
  int64_t max_world = 64;     // ranks per layout at most (wider draws of d_rep, fsdp and cp above 64)
  // Fixed choices ("": drawn). kernels: cpu | cuda-ref-host | cpu-ulp:OP[:INDEX]; comm: emu | nccl-fake |
  // emu-drop:OP:COUNT (the planted communicator, emulator/world.h).
  std::string kernels, comm;
  StepPlant plant = StepPlant::none;  // a planted bug in every layout (test hook, parallel/step.h)
  // true: every feature (policies, packed documents, 2D CP, the fake NCCL, lowered exact sums, the CUDA ref tier's
  // bodies, a resumed checkpoint, a second scheduler seed). false: the classic draws of the step property test
  // (mesh, EP chunks, vocabulary slices, recompute, bf16, the device), nothing else.
  bool all_features = true;
  // > 0: layouts for the MPI backend under mpirun with this many processes (`trident fuzz` under mpirun): worlds
  // that are multiples of it (ranks per process = world / processes, drawn with the world), the eager device
  // without traces or hazard checks, the MPI communicator (exact sums always lowered), the CPU kernels, no
  // checkpoint (docs/mpi.md section 1). 0: the emulator backend, every feature.
  int64_t processes = 0;
};

struct Layout {
  emu::EmulateSpec spec;     // the run (device, device seed, comm, plant, ...): what `trident emulate` takes
  std::string kernels = "cpu";
  int64_t docs_drawn = 1;    // (= spec.run.docs_per_seq)
  // tokens: sequences = data groups * per_group, seq_len = 2 * cp * tile * chunk_tiles
  int64_t per_group = 1, chunk_tiles = 1;
  uint64_t seed2 = 1;        // the second scheduler seed: a deferred run whose bits and trace must equal the first's
  bool resume = false;       // save after the run, resume on resume_mesh for one more step
  MeshShape resume_mesh;
  int64_t resume_chunks = 1;
  std::string model_name;    // preset or config path (summary)
  // > 0: the run is on the MPI backend, `processes` processes of ranks_per_process ranks each (GenOptions::processes)
  int64_t processes = 0;
  int64_t ranks_per_process = 0;  // (= world / processes; normalize())

  // The `trident emulate ...` line of the first run (with --check-reference and --kernels when not cpu; on the MPI
  // backend `mpirun -np P trident emulate ... --backend mpi --ranks-per-process k`, as `emulate` prints it).
  std::string repro() const;
  // The layout without its seeds (scheduler seeds): two layouts with equal keys are the same layout.
  std::string key() const;
  // The features this layout draws ("recompute", "2D CP", "packed", ...), for the summary.
  std::vector<std::string> features() const;
};

// Draws one valid layout.
Layout draw(Choices& c, const GenOptions& o);

// Fills the derived fields of a layout after its mesh, per_group or chunk_tiles changed (sequences, seq_len, e_fsdp,
// chunks clamped to the local tiles, ranks per process). Returns false when the result breaks a mesh rule or, on the
// MPI backend, the world is not a multiple of the processes (the shrinker skips it).
bool normalize(Layout& l);

// The kernel sets `trident fuzz` and `trident emulate` take beyond cpu: cpu-ulp:OP[:INDEX] (the CPU kernels with the
// last bit of element INDEX of OP's first output flipped: a planted kernel bug, golden/primitives) and
// cuda-ref-host. Throws trident::Error on anything else, naming what is accepted.
struct KernelSet {
  std::string name = "cpu";  // cpu | cuda-ref-host | cpu-ulp
  std::string op;            // cpu-ulp: the op
  int64_t index = 0;         // cpu-ulp: the element
};
KernelSet parse_kernels(const std::string& s);
// The factory of a kernel set (nullptr for cpu: the emulator's CpuKernels).
template <class T>
emu::KernelFactory<T> kernel_factory(const KernelSet& k);

}  // namespace trident::fuzz
