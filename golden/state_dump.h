// HDF5 state dump: the golden-file contract between the reference and every other path (docs/golden.md).
//
// One file holds one training step of one scenario: the config, the inputs, the weights before the step,
// the loss, the gradients and the weights after one optimizer step. Schema version 1:
//
//   /                    attributes schema_version (int32, 1), generator ("trident 0.1.0"), config (JSON string),
//                        seed (uint64), repro (string), optimizer (JSON string)
//   /inputs/tokens       int32 [sequences, seq_len]
//   /inputs/targets      int32 [sequences, seq_len]   (-100 = ignored)
//   /loss                scalar, f64 for the fp64 policy else f32
//   /weights/<name>      each in its dtype (names keep their dots: layers.0.attn.wq)
//   /grads/<name>
//   /weights_after/<name>
//   /adam_m/<name>, /adam_v/<name>, /adam_m_after/<name>, /adam_v_after/<name>   (optional: AdamW moments)
//   root attribute step (int64, optional): the 1-based optimizer step
//
// Every tensor dataset carries a string attribute `dtype` in {"f64","f32","bf16","i32"}; bf16 data is stored
// as its uint16 bit pattern (HDF5 type uint16). Groups track creation order, so tensors read back (from C++
// or h5py) in the order they were written.
//
// Integrity (docs/golden.md "Checksum"): write_state puts a 512-byte HDF5 user block in front of the HDF5 data
// holding a text header with the CRC-32 (zlib.crc32) and the length of everything after it; read_state verifies
// it before HDF5 parses a byte, so a flipped bit or a truncated file is one clear error, never HDF5 walking
// corrupt metadata. Files without the header (they start with the HDF5 signature: older dumps, golden/data)
// are still read. Then every attribute's type class, size and element count and every dataset's dtype, rank
// and shape are checked against the schema before anything is read into memory.
#pragma once
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "reference/bf16.h"

namespace trident::golden {

inline constexpr int kSchemaVersion = 1;
inline constexpr const char* kGenerator = "trident 0.1.0";

// A named tensor: row-major bytes of `shape` in `dtype` ("f64", "f32", "bf16" (uint16 bits), "i32").
struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype;
  std::vector<std::byte> bytes;

  int64_t numel() const;
  friend bool operator==(const NamedTensor&, const NamedTensor&) = default;
};

// Bytes per element of a dtype string; throws trident::Error for an unknown one.
size_t dtype_size(const std::string& dtype);

// Builders (copy the data). `n` must equal the product of `shape`.
NamedTensor make_tensor(std::string name, std::vector<int64_t> shape, std::span<const double> data);  // f64
NamedTensor make_tensor(std::string name, std::vector<int64_t> shape, std::span<const float> data);   // f32
NamedTensor make_tensor(std::string name, std::vector<int64_t> shape, std::span<const int32_t> data); // i32
NamedTensor make_tensor(std::string name, std::vector<int64_t> shape, std::span<const bf16> data);    // bf16
// bf16 from fp32 values, each rounded with to_bf16 (RNE); exact when the values are bf16-representable.
NamedTensor make_tensor_bf16(std::string name, std::vector<int64_t> shape, std::span<const float> data);

// Element i of any tensor as a double (exact for every dtype: bf16 and f32 widen exactly, i32 too).
double element_as_double(const NamedTensor& t, int64_t i);
std::vector<double> values_as_double(const NamedTensor& t);
// Typed copies; throw if the dtype does not match.
std::vector<double> values_f64(const NamedTensor& t);
std::vector<float> values_f32(const NamedTensor& t);   // f32 only
std::vector<int32_t> values_i32(const NamedTensor& t);

struct StateDump {
  nlohmann::json config;
  uint64_t seed = 0;
  std::string repro;
  NamedTensor tokens, targets;  // i32 [sequences, seq_len]; names are ignored on write ("tokens"/"targets" on read)
  double loss = 0;
  std::vector<NamedTensor> weights, grads, weights_after;
  nlohmann::json optimizer;
  // Storage type of /loss: "f64" or "f32". Empty: "f64" when config["policy"] == "fp64" (or, without a
  // policy in the config, when the first weight is f64), else "f32". read_state fills it from the file.
  std::string loss_dtype;
  // AdamW state (optional: all four empty, or each listing the weights' names, shapes and dtypes in order), so a
  // dump taken after step > 1 is checkable on its own: weights_after = AdamW(weights, grads, adam_m, adam_v, step).
  std::vector<NamedTensor> adam_m, adam_v;              // first and second moments before the step
  std::vector<NamedTensor> adam_m_after, adam_v_after;  // after it
  int64_t step = 0;  // the 1-based optimizer step this dump records (root attribute `step`; 0: not stored)
};

struct WriteOptions {
  bool checksum = true;  // false: no user block, no checksum (the layout of files written before it existed)
};

// Writes `s` to `path` atomically (a temporary file in the same directory, renamed on success; nothing is
// left behind on error). Throws trident::Error with the path and the reason (missing directory, permission,
// invalid tensor names or sizes, a state the reader would refuse (validate_state), HDF5 failures).
void write_state(const std::string& path, const StateDump& s, const WriteOptions& opt = {});
// The path checks write_state makes first (the directory exists, is a directory and is writable; the path is not a
// directory), without writing: callers run them before the work that produces the state. Throws trident::Error.
void check_writable(const std::string& path);

struct ReadOptions {
  // Parse in a forked child process with a time limit (10 s plus 1 s per 50 MB) and get the result through
  // a pipe: HDF5 1.10 itself can crash or loop on corrupt metadata (a flipped bit in the global heap of a file
  // without checksum crashes it), and this turns that into an error too. false: parse in this process.
  bool isolate = true;
};

// Reads a file written by write_state (any schema_version 1 file, with or without the checksum header).
// Throws trident::Error naming the file and the missing/invalid item: a corrupt or hostile file is an error,
// never a crash, a hang or an allocation its size does not justify.
StateDump read_state(const std::string& path, const ReadOptions& opt = {});

// The schema rules a StateDump must meet (docs/golden.md "What the reader checks"): tokens/targets i32
// [sequences, seq_len]; config and optimizer JSON objects; weights, grads and weights_after listing the same
// names in the same order with the same shapes and dtypes; and, when `config` is a model config (it has the key
// "attention"), a valid one whose parameter layout (names, shapes, the policy's dtype) the tensors match, with
// token ids in [0, vocab) and targets in [0, vocab) or -100. Throws trident::Error prefixed with `where`.
void validate_state(const StateDump& s, const std::string& where);

// The checksum header (docs/golden.md "Checksum").
inline constexpr size_t kChecksumBlock = 512;  // the HDF5 user block holding the header
enum class Checksum { absent, ok };
// absent: the file starts with the HDF5 signature (no header); ok: the header is intact and the CRC-32 and
// length of the payload match. Anything else (corrupt header, truncated or extended file, CRC mismatch, not
// an HDF5 file) throws trident::Error.
Checksum verify_checksum(const std::string& path);
// (Re)writes the header of a file that has the 512-byte user block, e.g. after editing a dump in place with
// HDF5 tools (which keep the user block but cannot update the checksum).
void seal_checksum(const std::string& path);
// CRC-32 (ISO-HDLC: the CRC of zlib.crc32 / binascii.crc32), continuing from `crc`.
uint32_t crc32(std::span<const std::byte> data, uint32_t crc = 0);

// Comparison: bitwise when both tolerances are 0, else |a - b| <= atol + rtol * |b| elementwise (NaN matches
// NaN only bitwise). Compares config, seed, inputs, loss, then weights, grads, weights_after (names, order,
// shapes and dtypes must match exactly).
struct CompareOptions {
  double rtol = 0;
  double atol = 0;
  bool compare_metadata = true;  // config, seed, repro, optimizer
};
struct CompareResult {
  bool equal = true;
  std::string dataset;  // e.g. "grads/layers.0.attn.wq", "loss", "attr:seed"; empty when equal
  int64_t index = -1;   // flat element index of the first difference (-1: a structural difference)
  double a = 0, b = 0;  // the two values at `index`
  std::string message;  // one line: what differs
};
CompareResult compare_states(const StateDump& a, const StateDump& b, const CompareOptions& opt = {});
// Tensor-level comparison used by compare_states (dataset = t.name).
CompareResult compare_tensors(const NamedTensor& a, const NamedTensor& b, const CompareOptions& opt = {});

}  // namespace trident::golden
