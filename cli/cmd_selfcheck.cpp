// `trident selfcheck`: the numerics contract, demonstrated in a few seconds. One line per check:
// PASS/FAIL, a number, what was checked. Exit code 1 if any check fails.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cli/command.h"
#include "reference/bf16.h"
#include "reference/dmath.h"
#include "reference/exact_acc.h"
#include "reference/gemm.h"
#include "reference/repro.h"
#include "reference/tile_reduce.h"

namespace {

struct Opts {
  uint64_t seed = 20261129;
  int threads = 4;
};

struct Report {
  int failed = 0;
  void line(bool ok, const std::string& number, const std::string& what) {
    std::printf("%s  %-22s %s\n", ok ? "PASS" : "FAIL", number.c_str(), what.c_str());
    failed += ok ? 0 : 1;
  }
};

std::string fmt_g(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

// Inputs from integers only (the same on every machine): signed 24-bit integers times 2^-s.
std::vector<float> values(std::mt19937_64& rng, size_t n, int spread) {
  std::vector<float> v(n);
  for (auto& x : v) {
    const uint64_t r = rng();
    const int e = -20 - static_cast<int>(r % static_cast<uint64_t>(spread + 1));
    x = std::ldexp(static_cast<float>(static_cast<int64_t>(r >> 40) - (int64_t{1} << 23)), e);
  }
  return v;
}

void check_bf16(Report& rep) {
  // (input bits, expected bf16 bits) from the IEEE definition of round-to-nearest-even at 8 significand bits.
  const std::pair<uint32_t, uint16_t> cases[] = {
      {0x3f800000u, 0x3f80}, {0x3f808000u, 0x3f80},  // 1 + half ulp: tie, even (down)
      {0x3f818000u, 0x3f82},                         // 1 + 3 half ulps: tie, even (up)
      {0x3f808001u, 0x3f81},                         // just above the tie: up
      {0x3f807fffu, 0x3f80},                         // just below the tie: down
      {0xbf818000u, 0xbf82},                         // negative tie
      {0x7f7fffffu, 0x7f80},                         // FLT_MAX rounds to +Inf
      {0x7f7f7fffu, 0x7f7f},                         // largest value that stays finite
      {0x7f800000u, 0x7f80}, {0xff800000u, 0xff80},  // +-Inf
      {0x80000000u, 0x8000},                         // -0 stays -0
      {0x00008000u, 0x0000}, {0x00018000u, 0x0002},  // subnormal ties
      {0x007fffffu, 0x0080},                         // largest subnormal rounds up to min normal
  };
  int bad = 0, n = 0;
  for (auto [in, want] : cases) {
    bad += trident::to_bf16(std::bit_cast<float>(in)).bits != want;
    ++n;
  }
  const uint16_t nan = trident::to_bf16(std::bit_cast<float>(0x7f800001u)).bits;  // sNaN payload in low bits
  bad += !((nan & 0x7f80) == 0x7f80 && (nan & 0x7f) != 0);
  ++n;
  rep.line(bad == 0, std::to_string(n - bad) + "/" + std::to_string(n),
           "bf16 round-to-nearest-even boundary cases (ties, overflow to Inf, subnormals, NaN stays NaN)");
}

void check_exact(Report& rep, uint64_t seed) {
  trident::ExactAcc<float> a;
  for (float x : {1e30f, 1.0f, -1e30f}) a.add(x);
  const float naive = (1e30f + 1.0f) - 1e30f;
  rep.line(a.round() == 1.0f, fmt_g(a.round()),
           "exact accumulation: 1e30 + 1 - 1e30 (plain fp32 gives " + fmt_g(naive) + ")");
  trident::ExactAcc<double> ad;
  for (double x : {1e300, 1.0, 0x1p-1074, -1e300}) ad.add(x);
  rep.line(ad.round() == 1.0, fmt_g(ad.round()), "exact accumulation fp64: 1e300 + 1 + 2^-1074 - 1e300");

  std::mt19937_64 rng(seed);
  std::vector<float> xs;
  for (int i = 0; i < 20000; ++i) {
    const uint64_t r = rng();
    xs.push_back(std::ldexp(static_cast<float>(static_cast<int64_t>(r >> 40) - (int64_t{1} << 23)),
                            static_cast<int>(r % 80) - 60));
  }
  trident::ExactAcc<float> s1, s2;
  float p1 = 0.f, p2 = 0.f;
  for (float x : xs) s1.add(x), p1 += x;
  std::shuffle(xs.begin(), xs.end(), rng);
  for (float x : xs) s2.add(x), p2 += x;
  rep.line(std::bit_cast<uint32_t>(s1.round()) == std::bit_cast<uint32_t>(s2.round()), fmt_g(s1.round()),
           "exact sum of 20000 wide-range floats, original vs shuffled order, bitwise (plain fp32: " + fmt_g(p1) +
               " vs " + fmt_g(p2) + ")");
}

void check_gemm(Report& rep, uint64_t seed, int max_threads) {
  std::mt19937_64 rng(seed + 1);
  const int64_t M = 257, N = 200, K = 333, row = 130;
  auto A = values(rng, M * K, 12), B = values(rng, K * N, 12);
  std::vector<float> C(M * N), c1(N);
  trident::gemm<float>(M, N, K, A.data(), K, B.data(), N, false, C.data(), N);
  trident::gemm<float>(1, N, K, A.data() + row * K, K, B.data(), N, false, c1.data(), N);
  int64_t diff = 0;
  for (int64_t n = 0; n < N; ++n) diff += std::bit_cast<uint32_t>(c1[n]) != std::bit_cast<uint32_t>(C[row * N + n]);
  rep.line(diff == 0, std::to_string(diff) + " differ",
           "GEMM batch invariance: row 130 of a 1-row call == row 130 of a 257-row call (200 outputs, bitwise)");

  int64_t tdiff = 0;
  std::string counts;
  std::vector<float> ref;
  for (int th = 1; th <= max_threads; th *= 2) {
    omp_set_num_threads(th);
    std::vector<float> Ct(M * N);
    trident::gemm<float>(M, N, K, A.data(), K, B.data(), N, true, Ct.data(), N);  // trans_b as well
    if (th == 1) ref = Ct;
    tdiff += std::memcmp(ref.data(), Ct.data(), Ct.size() * sizeof(float)) != 0;
    counts += (counts.empty() ? "" : ",") + std::to_string(th);
  }
  omp_set_num_threads(max_threads);
  rep.line(tdiff == 0, std::to_string(tdiff) + " differ",
           "GEMM thread invariance: 257x200x333 (trans_b) with " + counts + " OpenMP threads, bitwise");
}

void check_tiles(Report& rep, uint64_t seed) {
  std::mt19937_64 rng(seed + 2);
  const int64_t N = 1024, K = 48, M = 64, tile = 16;
  auto X = values(rng, N * K, 8), dY = values(rng, N * M, 8);
  auto segs = trident::uniform_segments(N, tile);
  const int64_t n_tiles = static_cast<int64_t>(segs.size()) - 1;
  std::vector<float> ref(K * M);
  trident::tile_wgrad<float>(X.data(), K, dY.data(), M, K, M, segs, ref.data());
  int bad = 0;
  std::string parts_list;
  for (int parts : {1, 2, 3, 7, 16, 64}) {
    std::vector<trident::ExactAcc<float>> total(K * M);
    for (int p = 0; p < parts; ++p) {  // part p holds tiles [p*n/parts, (p+1)*n/parts)
      const int64_t t0 = p * n_tiles / parts, t1 = (p + 1) * n_tiles / parts;
      std::vector<trident::ExactAcc<float>> acc(K * M);
      std::vector<int64_t> sp(segs.begin() + t0, segs.begin() + t1 + 1);
      trident::tile_wgrad_acc<float>(X.data(), K, dY.data(), M, K, M, sp, acc.data());
      std::vector<std::byte> wire(acc.size() * trident::ExactAcc<float>::kBytes);  // as a rank would send it
      trident::exact_serialize(acc.data(), K * M, wire.data());
      trident::exact_deserialize(wire.data(), K * M, acc.data());
      trident::exact_merge(total.data(), acc.data(), K * M);
    }
    std::vector<float> got(K * M);
    trident::exact_round(total.data(), got.data(), K * M);
    bad += std::memcmp(got.data(), ref.data(), got.size() * sizeof(float)) != 0;
    parts_list += (parts_list.empty() ? "" : ",") + std::to_string(parts);
  }
  rep.line(bad == 0, std::to_string(bad) + " differ",
           "tile-reduced dW = X^T dY (1024 tokens, T=16) split over " + parts_list +
               " parts, merged exactly via bytes == single part, bitwise");
}

// Faithful (<= 1 ulp) at points whose correctly rounded values are known constants.
void check_dmath(Report& rep) {
  struct P {
    const char* name;
    double got, want;
  };
  using namespace trident;
  const P pts[] = {
      {"exp(1)", dm::exp(1.0), 2.718281828459045},      {"exp(-1)", dm::exp(-1.0), 0.36787944117144233},
      {"log(2)", dm::log(2.0), 0.6931471805599453},     {"log(10)", dm::log(10.0), 2.302585092994046},
      {"tanh(0.5)", dm::tanh(0.5), 0.46211715726000974}, {"sigmoid(1)", dm::sigmoid(1.0), 0.7310585786300049},
      {"silu(1)", dm::silu(1.0), 0.7310585786300049},   {"sin(1)", dm::sin(1.0), 0.8414709848078965},
      {"cos(1)", dm::cos(1.0), 0.5403023058681398},     {"rsqrt(4)", dm::rsqrt(4.0), 0.5},
      {"pow(1e4,-0.5)", dm::pow(10000.0, -0.5), 0.01},   {"exp(0)", dm::exp(0.0), 1.0},
  };
  int64_t worst = 0;
  std::string worst_name = "-";
  for (const P& p : pts) {
    const int64_t d = std::bit_cast<int64_t>(p.got) - std::bit_cast<int64_t>(p.want);
    if (std::llabs(d) > worst || std::isnan(p.got)) worst = std::isnan(p.got) ? 1 << 30 : std::llabs(d), worst_name = p.name;
  }
  // float overloads against the double constants rounded to float (faithful => within 1 float ulp).
  const std::pair<float, double> fpts[] = {{dm::exp(1.0f), 2.718281828459045}, {dm::log(2.0f), 0.6931471805599453},
                                           {dm::tanh(0.5f), 0.46211715726000974},
                                           {dm::sigmoid(1.0f), 0.7310585786300049}};
  for (auto [got, want] : fpts) {
    const int64_t d = static_cast<int64_t>(std::bit_cast<int32_t>(got)) -
                      static_cast<int64_t>(std::bit_cast<int32_t>(static_cast<float>(want)));
    if (std::llabs(d) > worst) worst = std::llabs(d), worst_name = "float overload";
  }
  rep.line(worst <= 1, "max " + std::to_string(worst) + " ulp",
           "dm:: exp/log/tanh/sigmoid/silu/sin/cos/rsqrt/pow at 16 points vs known values (faithful: <= 1 ulp; worst " +
               worst_name + ")");
}

}  // namespace

TRIDENT_COMMAND({"selfcheck", "check the numerics contract on this machine in a few seconds (bf16, exact sums, GEMM, tiles, dm::)",
                 [](CLI::App& sub) -> trident::cli::Action {
                   auto opts = std::make_shared<Opts>();
                   sub.footer(
                       "Runs the numerics self-check: bf16 rounding boundary cases, exact accumulation, GEMM batch "
                       "and thread invariance, tile-partition invariance of the weight gradient and the "
                       "deterministic elementary functions. Prints one PASS/FAIL line per check; exits 1 if any "
                       "check fails.");
                   sub.add_option("--seed", opts->seed, "Seed of the random inputs (fixed by default)")
                       ->capture_default_str();
                   sub.add_option("--threads", opts->threads,
                                  "Largest OpenMP thread count for the thread-invariance check (1, 2, 4, ...)")
                       ->capture_default_str()
                       ->check(CLI::Range(1, 256));
                   return [opts]() -> int {
                     const auto t0 = std::chrono::steady_clock::now();
                     std::printf("trident selfcheck (seed %llu)\n", static_cast<unsigned long long>(opts->seed));
                     trident::ReproLine repro("trident selfcheck");
                     repro.opt_if("--seed", opts->seed, Opts{}.seed).opt_if("--threads", opts->threads, Opts{}.threads);
                     std::printf("repro: %s\n", repro.str().c_str());
                     Report rep;
                     check_bf16(rep);
                     check_exact(rep, opts->seed);
                     check_gemm(rep, opts->seed, opts->threads);
                     check_tiles(rep, opts->seed);
                     check_dmath(rep);
                     const double s =
                         std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                     std::printf("%s: %d check(s) failed (%.2f s)\n", rep.failed ? "FAILED" : "OK", rep.failed, s);
                     return rep.failed ? 1 : 0;
                   };
                 }});
