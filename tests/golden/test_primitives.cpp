// Per-primitive goldens (golden/primitives, docs/golden.md "Primitive goldens") and the AdamW moments of the state
// dump: capture from a real step on a 4-rank mesh, write, read back, recheck with the CPU kernel set (bitwise), fail
// on a kernel set with one ulp flipped, communication traces with received-bytes hashes, checked-in goldens, and a
// step-3 dump that reproduces its own weights_after from the file alone.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <hdf5.h>

#include <functional>
#include <iterator>

#include "emulator/device.h"
#include "emulator/run_step.h"
#include "golden/primitives/primitives.h"
#include "golden/state_dump.h"
#include "reference/model/adamw.h"
#include "reference/model/train.h"

namespace {

using namespace trident;
using namespace trident::golden;
namespace fs = std::filesystem;

// Whether the file starts with the checksum header (not the HDF5 signature), so an edit made on purpose re-seals it.
bool verify_checksum_status(const std::string& path) {
  char head[4] = {};
  std::ifstream(path, std::ios::binary).read(head, 4);
  return std::string(head, 4) == "TRID";
}

struct TempDir {
  fs::path p;
  TempDir() {
    p = fs::temp_directory_path() / fmt::format("trident_prim_{}_{}", ::getpid(),
                                                ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(p);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(p, ec);
  }
};

emu::EmulateSpec tiny_spec(const std::string& mesh, int64_t seqs, int64_t seq_len) {
  emu::EmulateSpec spec;
  spec.cfg = model::Config::preset("tiny");
  spec.run.sequences = seqs;
  spec.run.seq_len = seq_len;
  spec.run.steps = 1;
  spec.mesh = parse_mesh(mesh);
  spec.keep_tensors = false;
  spec.record_trace = true;
  return spec;
}

// One recorded step of tiny on a mesh, written and read back (shared by the tests below: recording is the slow part).
const PrimitivesFile& recorded() {
  static const PrimitivesFile f = [] {
    const emu::EmulateSpec spec = tiny_spec("d_rep=1,fsdp=2,cp=2,e_fsdp=2,ep=2", 2, 32);
    Recorder rec(2, "test");
    const auto r = emu::emulate<float>(spec, [&](int rank, Device& dev) {
      return make_recording_kernels<float>(std::make_unique<CpuKernels<float>>(dev), dev, rank, rec);
    });
    PrimitivesFile out;
    out.config = spec.cfg.to_json();
    out.repro = "test";
    out.ranks = 4;
    out.cases = rec.take();
    for (const RankTrace& t : r.traces) out.comm.push_back(comm_records(t));
    const fs::path path = fs::temp_directory_path() / fmt::format("trident_prim_{}.h5", ::getpid());
    write_primitives(path.string(), out);
    PrimitivesFile back = read_primitives(path.string());
    fs::remove(path);
    EXPECT_TRUE(back.checksum && back.manifest);
    EXPECT_EQ(back.comm.size(), out.comm.size());
    for (size_t r = 0; r < std::min(back.comm.size(), out.comm.size()); ++r) {
      EXPECT_EQ(back.comm[r].size(), out.comm[r].size());
      for (size_t i = 0; i < std::min(back.comm[r].size(), out.comm[r].size()); ++i)
        EXPECT_TRUE(back.comm[r][i].op == out.comm[r][i].op && back.comm[r][i].seq == out.comm[r][i].seq &&
                    back.comm[r][i].recv_hash == out.comm[r][i].recv_hash && back.comm[r][i].peer == out.comm[r][i].peer)
            << "rank " << r << " record " << i;
    }
    EXPECT_EQ(back.cases.size(), out.cases.size());
    for (size_t i = 0; i < std::min(back.cases.size(), out.cases.size()); ++i) {
      EXPECT_EQ(back.cases[i].op, out.cases[i].op);
      EXPECT_EQ(back.cases[i].inputs, out.cases[i].inputs) << out.cases[i].op;
      EXPECT_EQ(back.cases[i].outputs, out.cases[i].outputs) << out.cases[i].op;
      EXPECT_EQ(back.cases[i].sum_abs, out.cases[i].sum_abs) << out.cases[i].op;
    }
    return back;
  }();
  return f;
}

CheckOptions opts(bool bitwise, std::string op = {}, std::string backend = "cpu") {
  CheckOptions o;
  o.bitwise = bitwise;
  o.only_op = std::move(op);
  o.backend = std::move(backend);
  return o;
}

bool is_packed_only(const std::string& op) {
  const auto& p = packed_only_ops();
  return std::find(p.begin(), p.end(), op) != p.end();
}
bool is_dsa_only(const std::string& op) {
  const auto& p = dsa_only_ops();
  return std::find(p.begin(), p.end(), op) != p.end();
}
// The ops a checked-in golden holds: every op but the variants its step does not run (document masks unless packed;
// DSA's ops only with DSA, which runs them instead of the dense or masked core).
std::set<std::string> expected_ops(const std::string& preset) {
  std::set<std::string> want;
  const bool dsa = preset == "tiny-dsa", packed = preset == "tiny-packed";
  for (const std::string& op : kernel_ops()) {
    if (is_dsa_only(op) && !dsa) continue;
    if (is_packed_only(op) && (!packed || dsa)) continue;
    if ((op == "attn_core_forward" || op == "attn_core_backward") && (dsa || packed)) continue;
    want.insert(op);
  }
  return want;
}

KernelsFactory<float> cpu() {
  return [](Device& d) { return std::make_unique<CpuKernels<float>>(d); };
}

TEST(Primitives, EveryOpOnEveryRankIsCapturedAndRechecksBitwise) {
  const PrimitivesFile& f = recorded();
  std::map<int, std::set<std::string>> ops;
  for (const PrimCase& c : f.cases) ops[c.rank].insert(c.op);
  ASSERT_EQ(ops.size(), 4u);
  for (const auto& [r, s] : ops)
    for (const std::string& op : kernel_ops())
      EXPECT_TRUE(is_packed_only(op) || is_dsa_only(op) || s.count(op)) << "rank " << r << " has no case of " << op;
  const CheckSummary sum = check_primitives<float>(f, cpu(), {}, "golden");
  EXPECT_EQ(sum.cases, static_cast<int64_t>(f.cases.size()));
  EXPECT_EQ(sum.passed, sum.cases);
  for (const auto& fl : sum.failures) ADD_FAILURE() << fl.message << "\n" << fl.repro;
}

TEST(Primitives, OneUlpAtOneElementFailsWithARepro) {
  const PrimitivesFile& f = recorded();
  for (const char* op : {"mm", "rmsnorm_forward", "attn_core_forward", "linear_ce_forward", "adamw_step",
                         "expert_backward_dgrad", "moe_combine_forward", "exact_round"}) {
    const CheckSummary sum = check_primitives<float>(
        f, [&](Device& d) { return make_perturbed_kernels<float>(std::make_unique<CpuKernels<float>>(d), d, op, 0); },
        opts(true, {}, fmt::format("cpu-ulp:{}", op)), "golden");
    int64_t of_op = 0;
    for (const PrimCase& c : f.cases) of_op += c.op == op;
    // exact_round is also how accumulator outputs are read back: every such case fails too.
    if (std::string(op) == "exact_round") {
      EXPECT_GE(static_cast<int64_t>(sum.failures.size()), of_op);
    } else {
      EXPECT_EQ(static_cast<int64_t>(sum.failures.size()), of_op) << op;
    }
    for (const CaseFailure& fl : sum.failures) {
      if (std::string(op) != "exact_round") {
        EXPECT_EQ(fl.op, op);
      }
      EXPECT_NE(fl.repro.find(fmt::format("--backend cpu-ulp:{} --op {} --case {}", op, fl.op, fl.name)),
                std::string::npos)
          << fl.repro;
      EXPECT_NE(fl.message.find("differs at element"), std::string::npos) << fl.message;
    }
  }
}

// Packed sequences add two ops (attn_doc_core_forward/backward, with the document starts `qdoc` as an input): a step
// with documents captures them on every rank, the file round-trips, the CPU kernels recheck them bitwise, and one ulp
// flipped in either fails every case of that op.
TEST(Primitives, DocumentMaskOpsAreCapturedAndChecked) {
  emu::EmulateSpec spec = tiny_spec("d_rep=1,fsdp=2,cp=2,e_fsdp=2,ep=2", 2, 32);
  spec.run.docs_per_seq = 5;
  Recorder rec(1, "test");
  const auto r = emu::emulate<float>(spec, [&](int rank, Device& dev) {
    return make_recording_kernels<float>(std::make_unique<CpuKernels<float>>(dev), dev, rank, rec);
  });
  PrimitivesFile out;
  out.config = spec.cfg.to_json();
  out.repro = spec.repro(false);
  out.ranks = 4;
  out.cases = rec.take();
  TempDir dir;
  const std::string path = (dir.p / "packed.h5").string();
  write_primitives(path, out);
  const PrimitivesFile f = read_primitives(path);
  std::map<int, std::set<std::string>> ops;
  for (const PrimCase& c : f.cases) ops[c.rank].insert(c.op);
  ASSERT_EQ(ops.size(), 4u);
  for (const auto& [rk, s] : ops) {
    EXPECT_TRUE(s.count("attn_doc_core_forward")) << rk;
    EXPECT_TRUE(s.count("attn_doc_core_backward")) << rk;
    EXPECT_FALSE(s.count("attn_core_forward")) << rk << ": a packed step runs the document-mask core only";
  }
  for (const char* op : {"attn_doc_core_forward", "attn_doc_core_backward"}) {
    const CheckSummary ok = check_primitives<float>(f, cpu(), opts(true, op), "golden");
    EXPECT_EQ(ok.cases, 4) << op;
    EXPECT_EQ(ok.passed, ok.cases) << op;
    const CheckSummary bad = check_primitives<float>(
        f, [&](Device& d) { return make_perturbed_kernels<float>(std::make_unique<CpuKernels<float>>(d), d, op, 0); },
        opts(true, op, fmt::format("cpu-ulp:{}", op)), "golden");
    EXPECT_EQ(static_cast<int64_t>(bad.failures.size()), bad.cases) << op;
    EXPECT_GT(bad.cases, 0) << op;
  }
  (void)r;
}

TEST(Primitives, ToleranceModeUsesTheStoredBound) {
  const PrimitivesFile& f = recorded();
  // One ulp at one GEMM element is far inside the gemm bound (K+2)u*sum|a*b| (unless sum|a*b| is tiny):
  // the tolerance mode passes what the bitwise mode rejects, and only ops with a stored bound are tolerant.
  const auto flip_mm = [](Device& d) {
    return make_perturbed_kernels<float>(std::make_unique<CpuKernels<float>>(d), d, "mm", 0);
  };
  const CheckSummary bits = check_primitives<float>(f, flip_mm, opts(true, "mm"), "g");
  const CheckSummary tol = check_primitives<float>(f, flip_mm, opts(false, "mm"), "g");
  EXPECT_GT(bits.failures.size(), 0u);
  EXPECT_EQ(tol.failures.size(), 0u);
  for (const PrimCase& c : f.cases)
    if (c.op == "mm") {
      ASSERT_EQ(c.sum_abs.size(), 1u);
      EXPECT_EQ(c.n_terms.at("C").get<int64_t>(), c.shapes.at("K").get<int64_t>());
    }
  // The derived rule covers the nonlinear ops too (one ulp of RMSNorm's y is inside its chain's bound); an output with
  // the exact rule (a copy) stays bitwise in tolerance mode.
  const auto flip_rms = [](Device& d) {
    return make_perturbed_kernels<float>(std::make_unique<CpuKernels<float>>(d), d, "rmsnorm_forward", 0);
  };
  EXPECT_EQ(check_primitives<float>(f, flip_rms, opts(false, "rmsnorm_forward"), "g").failures.size(), 0u);
  EXPECT_GT(check_primitives<float>(f, flip_rms, opts(true, "rmsnorm_forward"), "g").failures.size(), 0u);
  const auto flip_gather = [](Device& d) {
    return make_perturbed_kernels<float>(std::make_unique<CpuKernels<float>>(d), d, "gather_rows", 0);
  };
  const CheckSummary g = check_primitives<float>(f, flip_gather, opts(false, "gather_rows"), "g");
  ASSERT_GT(g.failures.size(), 0u) << "the exact rule: bits even in tolerance mode";
  EXPECT_NE(g.failures.front().message.find("exact rule"), std::string::npos) << g.failures.front().message;
}

TEST(Primitives, CommTraceHashesAgreeAcrossAGroup) {
  const PrimitivesFile& f = recorded();
  ASSERT_EQ(f.comm.size(), 4u);
  for (const auto& r : f.comm) ASSERT_FALSE(r.empty());
  // Every rank of the fsdp*cp group (all 4 ranks here) receives the same bytes from each all_gather.
  int compared = 0;
  for (size_t i = 0; i < f.comm[0].size(); ++i) {
    const CommRecord& a = f.comm[0][i];
    if (a.op != "all_gather" || a.comm != "fsdp*cp") continue;
    EXPECT_NE(a.recv_hash, 0u);
    for (int r = 1; r < 4; ++r) {
      auto it = std::find_if(f.comm[r].begin(), f.comm[r].end(),
                             [&](const CommRecord& b) { return b.comm == a.comm && b.seq == a.seq; });
      ASSERT_NE(it, f.comm[r].end());
      EXPECT_EQ(it->recv_hash, a.recv_hash) << "seq " << a.seq << " rank " << r;
      ++compared;
    }
  }
  EXPECT_GT(compared, 0);
}

TEST(Primitives, CheckedInGoldensPassOnCpu) {
  for (const char* preset : {"tiny", "tiny-gqa", "tiny-e64", "tiny-dsa", "tiny-packed"}) {
    const std::string path = fmt::format("{}/primitives/{}/primitives.h5", TRIDENT_GOLDEN_DATA, preset);
    const PrimitivesFile f = read_primitives(path);
    std::set<std::string> ops;
    for (const PrimCase& c : f.cases) ops.insert(c.op);
    EXPECT_EQ(ops, expected_ops(preset)) << preset;
    const CheckSummary sum = check_primitives<float>(f, cpu(), {}, path);
    EXPECT_EQ(sum.passed, static_cast<int64_t>(f.cases.size())) << preset;
    for (const auto& fl : sum.failures) ADD_FAILURE() << fl.message << "\n" << fl.repro;
  }
}

TEST(Primitives, BadFilesAreOneError) {
  TempDir td;
  EXPECT_THROW(read_primitives((td.p / "missing.h5").string()), Error);
  const std::string junk = (td.p / "junk.h5").string();
  { std::ofstream(junk) << "not hdf5"; }
  try {
    read_primitives(junk);
    ADD_FAILURE() << "junk accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a primitive golden"), std::string::npos) << e.what();
  }
  // A state dump is HDF5 but not a primitives file.
  try {
    read_primitives(fmt::format("{}/micro_fp32_step1.h5", TRIDENT_GOLDEN_DATA));
    ADD_FAILURE() << "state dump accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a primitives file"), std::string::npos) << e.what();
  }
}

// ---- The validating reader and the op contracts (docs/golden.md "What the primitive reader checks") --------------

// The checked-in tiny golden rewritten (with the checksum and the case manifest unless `sealed` is false) into `path`.
// (The ops the tests below edit, so the copies stay small and quick to write and read.)
PrimitivesFile tiny_copy(const std::string& path, bool sealed = true, int ranks = 1) {
  static const PrimitivesFile full =
      read_primitives(fmt::format("{}/primitives/tiny/primitives.h5", TRIDENT_GOLDEN_DATA));
  EXPECT_TRUE(full.checksum && full.manifest);  // the checked-in goldens are sealed
  PrimitivesFile f = full;
  static const std::set<std::string> ops = {"mm",          "gather_rows",      "embedding_forward", "wgrad_acc",
                                            "router_backward", "attn_qkv_forward", "linear_ce_forward"};
  f.cases.clear();
  for (const PrimCase& c : full.cases)
    if (ops.count(c.op)) f.cases.push_back(c);
  if (ranks > 1) {
    const size_t n = f.cases.size();
    for (size_t i = 0; i < n; ++i) {
      PrimCase c = f.cases[i];
      c.rank = 1;
      f.cases.push_back(std::move(c));
    }
    f.ranks = ranks;
    f.mesh["spec"] = "d_rep=1,fsdp=2,cp=1,e_fsdp=1,ep=2";
    f.comm.push_back(f.comm[0]);
  }
  write_primitives(path, f, {.checksum = sealed});
  return f;
}

// Runs `edit` on the open file (HDF5 C API), then re-seals the checksum when the file has one (an edit made on
// purpose, so only the manifest or the op contracts can catch it).
void edit_h5(const std::string& path, const std::function<void(hid_t)>& edit) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  edit(f);
  ASSERT_GE(H5Fclose(f), 0);
  if (verify_checksum_status(path)) seal_checksum(path);
}

template <class U>
void set_element(hid_t f, const std::string& ds, int64_t i, U v, hid_t mem_type) {
  hid_t d = H5Dopen2(f, ds.c_str(), H5P_DEFAULT);
  ASSERT_GE(d, 0) << ds;
  hid_t sp = H5Dget_space(d);
  const int rank = H5Sget_simple_extent_ndims(sp);
  std::vector<hsize_t> dims(static_cast<size_t>(rank)), coord(static_cast<size_t>(rank));
  H5Sget_simple_extent_dims(sp, dims.data(), nullptr);
  for (int k = rank - 1; k >= 0; --k) {
    coord[static_cast<size_t>(k)] = static_cast<hsize_t>(i) % dims[static_cast<size_t>(k)];
    i /= static_cast<int64_t>(dims[static_cast<size_t>(k)]);
  }
  H5Sselect_elements(sp, H5S_SELECT_SET, 1, coord.data());
  hsize_t one = 1;
  hid_t mem = H5Screate_simple(1, &one, nullptr);
  EXPECT_GE(H5Dwrite(d, mem_type, mem, sp, H5P_DEFAULT, &v), 0);
  H5Sclose(mem), H5Sclose(sp), H5Dclose(d);
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}
#define EXPECT_ERROR(expr, text) EXPECT_NE(error_of([&] { (void)(expr); }).find(text), std::string::npos) << error_of([&] { (void)(expr); })

TEST(PrimitiveReader, NewFilesCarryAChecksumAndAManifestOldFilesStillLoad) {
  TempDir td;
  const std::string p = (td.p / "p.h5").string();
  const PrimitivesFile f = tiny_copy(p);
  const PrimitivesFile back = read_primitives(p);
  EXPECT_TRUE(back.checksum);
  EXPECT_TRUE(back.manifest);
  ASSERT_EQ(back.cases.size(), f.cases.size());
  for (size_t i = 0; i < f.cases.size(); ++i) {  // the same tensor bits as the checked-in file
    EXPECT_EQ(back.cases[i].inputs, f.cases[i].inputs);
    EXPECT_EQ(back.cases[i].outputs, f.cases[i].outputs);
    EXPECT_EQ(back.cases[i].sum_abs, f.cases[i].sum_abs);
  }
  validate_cases(back);
  // A file written before the checksum and the manifest existed still loads (the reader notes their absence).
  const std::string old_path = (td.p / "old.h5").string();
  tiny_copy(old_path, /*sealed=*/false);
  const PrimitivesFile legacy = read_primitives(old_path);
  EXPECT_FALSE(legacy.checksum || legacy.manifest);
  ASSERT_EQ(legacy.cases.size(), f.cases.size());
  validate_cases(legacy);
}

TEST(PrimitiveReader, FlippedDataBitsAreACorruptFileNotANumericsFailure) {
  TempDir td;
  const std::string p = (td.p / "p.h5").string();
  tiny_copy(p);
  std::string bytes;
  {
    std::ifstream in(p, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  for (size_t at : {bytes.size() / 3, bytes.size() / 2, bytes.size() - 100}) {
    std::string b = bytes;
    b[at] ^= 0x10;
    std::ofstream(p, std::ios::binary | std::ios::trunc).write(b.data(), static_cast<std::streamsize>(b.size()));
    EXPECT_ERROR(read_primitives(p), "checksum mismatch");
  }
}

TEST(PrimitiveReader, ADeletedCaseOutputOrRankIsAnError) {
  TempDir td;
  const std::string p = (td.p / "p.h5").string();
  tiny_copy(p);
  edit_h5(p, [](hid_t f) { ASSERT_GE(H5Ldelete(f, "primitives/mm/c0", H5P_DEFAULT), 0); });
  EXPECT_ERROR(read_primitives(p), "case mm/c0 of rank 0 is missing");
  tiny_copy(p);
  edit_h5(p, [](hid_t f) { ASSERT_GE(H5Ldelete(f, "primitives/mm/c0/outputs/C", H5P_DEFAULT), 0); });
  EXPECT_ERROR(read_primitives(p), "case mm/c0 of rank 0: its outputs are [], the manifest says [\"C\"]");
  // Without a manifest (an older file): a case missing from the middle of an op's c0, c1, ... is an error, ...
  tiny_copy(p, false);
  edit_h5(p, [](hid_t f) { ASSERT_GE(H5Ldelete(f, "primitives/gather_rows/c0", H5P_DEFAULT), 0); });
  EXPECT_ERROR(read_primitives(p), "op gather_rows of rank 0: 1 cases but no case c0");
  // ... and a missing output is named: by the stored acceptance rule, or (a file without one) by the op's contract.
  tiny_copy(p, false);
  edit_h5(p, [](hid_t f) { ASSERT_GE(H5Ldelete(f, "primitives/gather_rows/c0/outputs/dst", H5P_DEFAULT), 0); });
  EXPECT_ERROR(read_primitives(p), "case gather_rows/c0 of rank 0: output 'dst' is missing");
  tiny_copy(p, false);
  edit_h5(p, [](hid_t f) {
    ASSERT_GE(H5Ldelete(f, "primitives/gather_rows/c0/outputs/dst", H5P_DEFAULT), 0);
    ASSERT_GE(H5Adelete_by_name(f, "primitives/gather_rows/c0", "accept", H5P_DEFAULT), 0);
  });
  EXPECT_ERROR(validate_cases(read_primitives(p)), "gather_rows/c0 (rank 0): output 'dst' is missing");
  // The ranks attribute halved on a 2-rank file, with or without a manifest.
  for (bool sealed : {true, false}) {
    tiny_copy(p, sealed, 2);
    edit_h5(p, [](hid_t f) {
      hid_t root = H5Gopen2(f, "/", H5P_DEFAULT);
      const int64_t one = 1;
      hid_t a = H5Aopen(root, "ranks", H5P_DEFAULT);
      H5Awrite(a, H5T_NATIVE_INT64, &one);
      H5Aclose(a), H5Gclose(root);
    });
    EXPECT_ERROR(read_primitives(p), "attribute 'ranks' is 1");
  }
}

TEST(PrimitiveReader, EveryInputIsRangeCheckedBeforeAKernelRuns) {
  TempDir td;
  const std::string p = (td.p / "p.h5").string();
  struct Edit {
    std::string dataset;
    int64_t value;
    std::string message;
  };
  const std::vector<Edit> edits = {
      {"primitives/gather_rows/c0/inputs/idx", -2147483648, "input 'idx' element 0 is -2147483648"},
      {"primitives/embedding_forward/c0/inputs/tokens", -2147483648, "input 'tokens' element 0 is -2147483648"},
      {"primitives/wgrad_acc/c0/inputs/segs", 1000000000, "input 'segs' is not non-decreasing"},
      {"primitives/router_backward/c0/inputs/sel", 1000000, "input 'sel' element 0 is 1000000, outside [0, 8)"},
      {"primitives/attn_qkv_forward/c0/inputs/pos", 1 << 30, "input 'pos' element 0 is 1073741824"},
      {"primitives/linear_ce_forward/c0/inputs/targets", -7, "input 'targets' element 0 is -7"},
  };
  for (const Edit& e : edits) {
    tiny_copy(p);
    edit_h5(p, [&](hid_t f) { set_element<int64_t>(f, e.dataset, 0, e.value, H5T_NATIVE_INT64); });
    const PrimitivesFile f = read_primitives(p);  // sealed again on purpose: the contract check is what catches it
    EXPECT_ERROR(validate_cases(f), e.message) << e.dataset;
    // run_case (what every backend's check calls) checks the same before any kernel runs.
    for (const PrimCase& c : f.cases)
      if (e.dataset.find("/" + c.op + "/") != std::string::npos) {
        RankTrace trace;
        emu::EmuDevice dev(0, trace, emu::DeviceOptions{.record_trace = false});
        CpuKernels<float> k(dev);
        EXPECT_ERROR(run_case<float>(c, k, dev), e.message) << e.dataset;
        break;
      }
  }
  // The rope table replaced by an empty dataset (in a file without a manifest, which would name the re-created
  // dataset's new position first).
  tiny_copy(p, false);
  edit_h5(p, [](hid_t f) {
    hid_t d = H5Dopen2(f, "primitives/attn_qkv_forward/c0/inputs/rope.cos", H5P_DEFAULT);
    hid_t t = H5Dget_type(d);
    H5Dclose(d);
    H5Ldelete(f, "primitives/attn_qkv_forward/c0/inputs/rope.cos", H5P_DEFAULT);
    hsize_t zero = 0;
    hid_t sp = H5Screate_simple(1, &zero, nullptr);
    hid_t nd = H5Dcreate2(f, "primitives/attn_qkv_forward/c0/inputs/rope.cos", t, sp, H5P_DEFAULT, H5P_DEFAULT,
                          H5P_DEFAULT);
    hid_t st = H5Tcopy(H5T_C_S1);
    H5Tset_size(st, H5T_VARIABLE);
    hid_t ss = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(nd, "dtype", st, ss, H5P_DEFAULT, H5P_DEFAULT);
    const char* f32 = "f32";
    H5Awrite(a, st, &f32);
    H5Aclose(a), H5Sclose(ss), H5Tclose(st), H5Dclose(nd), H5Sclose(sp), H5Tclose(t);
  });
  EXPECT_ERROR(validate_cases(read_primitives(p)), "input 'rope.cos' has 0 values");
}

TEST(PrimitiveReader, ADamagedGlobalHeapIsAnErrorNotACrash) {
  TempDir td;
  const std::string p = (td.p / "p.h5").string();
  std::string bytes;
  {  // an unsealed file: a sealed one is refused by its checksum before HDF5 parses anything
    const std::string src = (td.p / "unsealed.h5").string();
    tiny_copy(src, /*sealed=*/false);
    std::ifstream in(src, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  int tried = 0;
  for (size_t at = bytes.find("GCOL"); at != std::string::npos && tried < 3; at = bytes.find("GCOL", at + 1), ++tried) {
    for (size_t off : {size_t{16}, size_t{40}}) {  // an object's index and its data
      std::string b = bytes;
      if (at + off + 8 > b.size()) continue;
      for (int k = 0; k < 8; ++k) b[at + off + static_cast<size_t>(k)] = '\x7f';
      std::ofstream(p, std::ios::binary | std::ios::trunc).write(b.data(), static_cast<std::streamsize>(b.size()));
      try {
        validate_cases(read_primitives(p));  // loading is fine when the damage hit nothing HDF5 or we use
      } catch (const Error&) {
      }
    }
  }
  EXPECT_GT(tried, 0);
}

// ---- AdamW moments: a dump after step 3 is checkable on its own -------------------------------------------------
TEST(StateDumpMoments, Step3DumpReproducesItsUpdateFromTheFileAlone) {
  TempDir td;
  const model::Config cfg = model::Config::preset("tiny");
  model::RunConfig rc;
  rc.sequences = 2;
  rc.seq_len = 16;
  rc.steps = 3;
  model::Trainer<float> tr(cfg, rc);
  StateDump d;
  for (int64_t s = 0; s < 3; ++s) {
    const model::Batch batch = model::synthetic_batch(cfg, rc, s);
    const model::ParamSet<float> before = tr.params, mb = tr.m, vb = tr.v;
    const model::StepStats st = tr.step(batch);
    if (s < 2) continue;
    d.config = cfg.to_json();
    d.tokens = make_tensor("tokens", {batch.B, batch.S}, std::span<const int32_t>(batch.tokens));
    d.targets = make_tensor("targets", {batch.B, batch.S}, std::span<const int32_t>(batch.targets));
    d.loss = st.loss;
    auto t = [](const std::string& n, const Tensor<float>& x) {
      return make_tensor(n, x.shape, std::span<const float>(x.data));
    };
    for (size_t p = 0; p < tr.params.size(); ++p) {
      const std::string& n = tr.params.info[p].name;
      d.weights.push_back(t(n, before.t[p]));
      d.grads.push_back(t(n, tr.grads.t[p]));
      d.weights_after.push_back(t(n, tr.params.t[p]));
      d.adam_m.push_back(t(n, mb.t[p]));
      d.adam_v.push_back(t(n, vb.t[p]));
      d.adam_m_after.push_back(t(n, tr.m.t[p]));
      d.adam_v_after.push_back(t(n, tr.v.t[p]));
    }
    d.step = tr.step_count;
    d.optimizer = model::adamw_hyper(rc).to_json();
  }
  const std::string path = (td.p / "step3.h5").string();
  write_state(path, d);
  const StateDump f = read_state(path);
  ASSERT_EQ(f.step, 3);
  ASSERT_EQ(f.adam_m.size(), f.weights.size());
  EXPECT_TRUE(compare_states(d, f).equal) << compare_states(d, f).message;

  // From the file alone: clip from the exact norm of the stored gradients, then AdamW per trainable tensor.
  const model::AdamWHyper h = model::AdamWHyper::from_json(f.optimizer);
  const auto layout = model::param_layout(model::Config::from_json(f.config));
  ExactAcc<double> sq;
  for (size_t p = 0; p < layout.size(); ++p)
    if (layout[p].trainable) {
      const auto g = values_f32(f.grads[p]);
      model::grad_sq_acc<float>(g.data(), static_cast<int64_t>(g.size()), sq);
    }
  const double clip = model::clip_coef(sq, h.max_grad_norm);
  int checked = 0;
  for (size_t p = 0; p < layout.size(); ++p) {
    if (!layout[p].trainable) continue;
    auto w = values_f32(f.weights[p]);
    auto m = values_f32(f.adam_m[p]);
    auto v = values_f32(f.adam_v[p]);
    const auto g = values_f32(f.grads[p]);
    model::adamw_step<float>(w.data(), g.data(), m.data(), v.data(), static_cast<int64_t>(w.size()), h, f.step, clip,
                             layout[p].is_matrix);
    EXPECT_EQ(w, values_f32(f.weights_after[p])) << layout[p].name;
    EXPECT_EQ(m, values_f32(f.adam_m_after[p])) << layout[p].name;
    EXPECT_EQ(v, values_f32(f.adam_v_after[p])) << layout[p].name;
    ++checked;
  }
  EXPECT_GT(checked, 30);
  // And without the moments (the old layout) the same recomputation is wrong after step 1: they are needed.
  auto w0 = values_f32(f.weights[1]);
  std::vector<float> zero(w0.size(), 0.0f), zero2 = zero;
  const auto g1 = values_f32(f.grads[1]);
  model::adamw_step<float>(w0.data(), g1.data(), zero.data(), zero2.data(), static_cast<int64_t>(w0.size()), h,
                           f.step, clip, layout[1].is_matrix);
  EXPECT_NE(w0, values_f32(f.weights_after[1]));
}

TEST(StateDumpMoments, MomentsMustMatchTheWeights) {
  TempDir td;
  StateDump s;
  s.config = {{"k", 1}};
  s.optimizer = nlohmann::json::object();
  std::vector<int32_t> tok{1, 2};
  s.tokens = make_tensor("tokens", {1, 2}, std::span<const int32_t>(tok));
  s.targets = s.tokens;
  std::vector<float> w{1, 2, 3};
  s.weights = {make_tensor("w", {3}, std::span<const float>(w))};
  s.grads = s.weights_after = s.weights;
  s.adam_m = s.adam_v = s.adam_m_after = s.weights;
  s.adam_v_after = {make_tensor("other", {3}, std::span<const float>(w))};
  s.step = 2;
  EXPECT_THROW(write_state((td.p / "a.h5").string(), s), Error);
  s.adam_v_after = s.weights;
  s.step = 0;
  EXPECT_THROW(write_state((td.p / "b.h5").string(), s), Error);  // moments need a step
  s.step = 2;
  write_state((td.p / "c.h5").string(), s);
  const StateDump back = read_state((td.p / "c.h5").string());
  EXPECT_EQ(back.step, 2);
  EXPECT_EQ(back.adam_v_after, s.adam_v_after);
}

}  // namespace
