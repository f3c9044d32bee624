// The op profile (reference/profile.h): exclusive attribution of nested sections, nothing recorded when off or inside
// OpenMP parallel regions, a section inside one of the same op merged into it, GEMM FLOPs as 2 M N K, and a `tiny`
// training step whose ops sum to the step's CPU time with the same bits as an unprofiled step. No timing threshold:
// the checks are structural, or relations between process CPU clock readings taken around the sections.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <ctime>
#include <set>
#include <string>
#include <vector>

#include "reference/gemm.h"
#include "reference/model/ops.h"
#include "reference/model/train.h"
#include "reference/profile.h"

using namespace trident;
using namespace trident::model;
using prof::Op;
using prof::OpSection;

namespace {

double cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Spends at least `s` seconds of this process's CPU time (the clock the profile reads; load elsewhere only makes it
// take longer).
void burn(double s) {
  const double t0 = cpu_s();
  volatile double x = 1;
  while (cpu_s() - t0 < s)
    for (int i = 0; i < 1000; ++i) x = x * 1.0000001 + 1e-9;
}

// The profile on and zeroed for one test; off again afterwards whatever happens.
struct Profiling {
  Profiling() {
    prof::reset();
    prof::enable(true);
  }
  ~Profiling() {
    prof::enable(false);
    prof::reset();
  }
};

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

int64_t total_calls(const prof::Profile& p) {
  int64_t n = 0;
  for (const auto& x : p.op) n += x.calls;
  return n;
}

}  // namespace

TEST(Profile, NamesAreDistinct) {
  std::set<std::string> names;
  for (int i = 0; i < prof::kOps; ++i) names.insert(prof::name(static_cast<Op>(i)));
  EXPECT_EQ(static_cast<int>(names.size()), prof::kOps);
  EXPECT_EQ(names.count("?"), 0u);
}

TEST(Profile, OffRecordsNothing) {
  prof::enable(false);
  prof::reset();
  {
    OpSection a(Op::other);
    OpSection b(Op::gemm, 1000);
    burn(0.002);
  }
  std::vector<float> A(6 * 5, 1.0f), B(5 * 4, 1.0f), C(6 * 4);
  gemm<float>(6, 4, 5, A.data(), 5, B.data(), 4, false, C.data(), 4);
  const prof::Profile p = prof::snapshot();
  EXPECT_EQ(p.seconds(), 0.0);
  EXPECT_EQ(total_calls(p), 0);
  for (const auto& x : p.op) EXPECT_EQ(x.flops, 0);
}

// Opening a section pauses its parent: the parent's seconds leave out the child's, and the two sum to the time
// between the outermost open and close.
TEST(Profile, NestedSectionsAreExclusive) {
  Profiling on;
  double c0, c1, c2, c3;
  c0 = cpu_s();
  {
    OpSection outer(Op::other);
    burn(0.01);
    {
      OpSection inner(Op::rmsnorm);
      c1 = cpu_s();
      burn(0.05);
      c2 = cpu_s();
    }
    burn(0.01);
  }
  c3 = cpu_s();
  const prof::Profile p = prof::snapshot();
  const double outer = p[Op::other].seconds, inner = p[Op::rmsnorm].seconds;
  const double slack = 1e-3;  // clock readings of the same clock, taken in program order
  EXPECT_EQ(p[Op::other].calls, 1);
  EXPECT_EQ(p[Op::rmsnorm].calls, 1);
  EXPECT_GE(inner, c2 - c1 - slack);                 // the inner section holds [c1, c2]
  EXPECT_GE(outer, 0.02 - slack);                    // the two bursts outside it
  EXPECT_LE(outer + inner, c3 - c0 + slack);         // nothing counted twice: exclusive
  EXPECT_LE(outer, (c3 - c0) - (c2 - c1) + slack);   // the parent excludes the child
  EXPECT_NEAR(p.seconds(), outer + inner, 1e-12);
}

// A section directly inside one of the same op is part of it; the outer one states the FLOPs.
TEST(Profile, SameOpMerges) {
  Profiling on;
  {
    OpSection a(Op::gemm, 100);
    OpSection b(Op::gemm, 7);
    { OpSection c(Op::rope); }
    OpSection d(Op::gemm, 9);  // the innermost recording section is a (gemm): merged
  }
  const prof::Profile p = prof::snapshot();
  EXPECT_EQ(p[Op::gemm].calls, 1);
  EXPECT_EQ(p[Op::gemm].flops, 100);
  EXPECT_EQ(p[Op::rope].calls, 1);
}

// Inside an OpenMP parallel region, active or not, a section records nothing: the enclosing one counts the team.
TEST(Profile, ParallelRegionsAreIgnored) {
  Profiling on;
  {
    OpSection outer(Op::adamw);
#pragma omp parallel num_threads(2)
    {
      OpSection s(Op::rope, 5);
      burn(0.002);
    }
    const bool never = omp_get_max_threads() < 0;
#pragma omp parallel if (never)
    {
      OpSection s(Op::swiglu, 5);
    }
  }
  const prof::Profile p = prof::snapshot();
  EXPECT_EQ(p[Op::rope].calls, 0);
  EXPECT_EQ(p[Op::rope].seconds, 0.0);
  EXPECT_EQ(p[Op::rope].flops, 0);
  EXPECT_EQ(p[Op::swiglu].calls, 0);
  EXPECT_EQ(p[Op::adamw].calls, 1);
  EXPECT_GT(p[Op::adamw].seconds, 0.0);
}

// The GEMM entry points count 2 M N K per call; gemm_bf16 and mm count their inner gemm once.
TEST(Profile, GemmFlops) {
  const int64_t M = 37, N = 29, K = 53;
  std::vector<float> A(M * K), B(K * N), C(M * N);
  for (size_t i = 0; i < A.size(); ++i) A[i] = static_cast<float>(i % 7) - 3;
  for (size_t i = 0; i < B.size(); ++i) B[i] = static_cast<float>(i % 5) - 2;
  auto one = [&](auto&& f) {
    Profiling on;
    f();
    return prof::snapshot();
  };
  const prof::Profile g = one([&] { gemm<float>(M, N, K, A.data(), K, B.data(), N, false, C.data(), N); });
  EXPECT_EQ(g[Op::gemm].flops, 2 * M * N * K);
  EXPECT_EQ(g[Op::gemm].calls, 1);
  const prof::Profile b = one([&] { gemm_bf16(M, N, K, A.data(), K, B.data(), N, false, C.data(), N); });
  EXPECT_EQ(b[Op::gemm].flops, 2 * M * N * K);
  EXPECT_EQ(b[Op::gemm].calls, 1);
  const prof::Profile s = one([&] {
    gemm_serial<float>(M, N, K, A.data(), K, 1, B.data(), N, false, C.data(), N, false);
  });
  EXPECT_EQ(s[Op::gemm].flops, 2 * M * N * K);
  for (Policy pol : {Policy::fp32, Policy::bf16}) {
    const prof::Profile m = one([&] { mm<float>(pol, M, N, K, A.data(), K, B.data(), N, false, C.data(), N); });
    EXPECT_EQ(m[Op::gemm].flops, 2 * M * N * K) << to_string(pol);
    EXPECT_EQ(m[Op::gemm].calls, 1) << to_string(pol);
    EXPECT_EQ(total_calls(m), 1) << to_string(pol);
  }
  const prof::Profile e = one([&] { gemm<float>(0, N, K, A.data(), K, B.data(), N, false, C.data(), N); });
  EXPECT_EQ(e[Op::gemm].flops, 0);
}

// A `tiny` step (dense and MoE layers, MLA) profiled: every op of the step recorded, the ops sum to the step's CPU
// time, and the step's results are the bits of the same step unprofiled.
TEST(Profile, TinyStepSumsToItsCpuTimeWithTheSameBits) {
  const Config c = Config::preset("tiny");
  RunConfig rc;
  rc.sequences = 2;
  rc.seq_len = 64;
  Trainer<float> off(c, rc), on(c, rc);
  const Batch b0 = synthetic_batch(c, rc, 0), b1 = synthetic_batch(c, rc, 1);
  off.step(b0);
  on.step(b0);
  prof::enable(false);
  prof::reset();
  const StepStats s_off = off.step(b1);
  EXPECT_EQ(total_calls(prof::snapshot()), 0);  // off: nothing recorded
  prof::Profile p;
  double cpu = 0;
  StepStats s_on;
  {
    Profiling prof_on;
    const double c0 = cpu_s();
    s_on = on.step(b1);
    cpu = cpu_s() - c0;
    p = prof::snapshot();
  }
  EXPECT_EQ(std::memcmp(&s_on.loss, &s_off.loss, sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(&s_on.grad_norm, &s_off.grad_norm, sizeof(double)), 0);
  for (size_t i = 0; i < on.params.size(); ++i) {
    EXPECT_TRUE(same_bits(on.params.t[i].data, off.params.t[i].data)) << on.params.info[i].name;
    EXPECT_TRUE(same_bits(on.grads.t[i].data, off.grads.t[i].data)) << on.params.info[i].name;
    EXPECT_TRUE(same_bits(on.m.t[i].data, off.m.t[i].data)) << on.params.info[i].name;
    EXPECT_TRUE(same_bits(on.v.t[i].data, off.v.t[i].data)) << on.params.info[i].name;
  }
  for (Op op : {Op::gemm, Op::embedding, Op::rmsnorm, Op::rope, Op::attn_core_fwd, Op::attn_core_bwd, Op::attn_other,
                Op::moe_router, Op::moe_dispatch, Op::moe_combine, Op::swiglu, Op::lce_fwd, Op::lce_bwd,
                Op::tile_reduce, Op::grad_finalize, Op::grad_norm, Op::adamw, Op::finite_check, Op::other})
    EXPECT_GT(p[op].calls, 0) << prof::name(op);
  EXPECT_EQ(p[Op::other].calls, 1);  // Trainer::step; the model driver inside it merges
  EXPECT_GT(p[Op::gemm].flops, 0);
  // The step's section lies inside [c0, c0 + cpu]: the ops sum to at most that, and to all of it but the call and
  // clock overhead at its two ends (generous slack: no timing threshold).
  EXPECT_LE(p.seconds(), cpu + 1e-3);
  EXPECT_GE(p.seconds(), 0.8 * cpu - 5e-3);
}
