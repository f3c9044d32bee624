// ISA invariance probe: this file (and the reference sources) is compiled twice, with -march=x86-64 and with
// -march=native; each binary writes the raw bytes of a fixed set of results to argv[1], and a third test
// compares the two files byte for byte (tests/numerics/CMakeLists.txt). Inputs come from integer arithmetic
// only (splitmix64), so they are identical in both builds by construction.
#include <cstdint>
#include <cstdio>
#include <vector>

#include "reference/exact_acc.h"
#include "reference/gemm.h"
#include "reference/tile_reduce.h"
#ifndef TRIDENT_ISA_BF16
#define TRIDENT_ISA_BF16 0
#endif
#ifndef TRIDENT_ISA_DMATH
#define TRIDENT_ISA_DMATH 0
#endif
#if TRIDENT_ISA_BF16
#include "reference/bf16.h"
#endif
#if TRIDENT_ISA_DMATH
#include "reference/dmath.h"
#endif

namespace {

uint64_t g_state = 0x9e3779b97f4a7c15ull;
uint64_t next() {
  uint64_t z = (g_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Signed 24-bit integer times a power of two in [2^-30, 2^-10]: exact in float and double.
template <class T>
std::vector<T> values(size_t n) {
  static const T scale[] = {T(0x1p-30), T(0x1p-26), T(0x1p-22), T(0x1p-18), T(0x1p-14), T(0x1p-10)};
  std::vector<T> v(n);
  for (auto& x : v) {
    const uint64_t r = next();
    x = static_cast<T>(static_cast<int64_t>(r >> 40) - (int64_t{1} << 23)) * scale[r % 6];
  }
  return v;
}

FILE* g_out = nullptr;
size_t g_bytes = 0;
template <class T>
void put(const std::vector<T>& v) {
  g_bytes += std::fwrite(v.data(), sizeof(T), v.size(), g_out) * sizeof(T);
}

template <class T>
void dump_gemm_and_tiles() {
  const int64_t M = 97, N = 131, K = 300;
  auto A = values<T>(M * K), B = values<T>(K * N);
  std::vector<T> C(M * N);
  trident::gemm<T>(M, N, K, A.data(), K, B.data(), N, false, C.data(), N);
  put(C);
  std::vector<T> C2(M * K);
  trident::gemm<T>(M, K, N, A.data(), K, B.data(), N, true, C2.data(), K);  // A(:, :N) * (B as (K, N))^T
  put(C2);
  const int64_t R = 1000, KK = 40, MM = 70;
  auto X = values<T>(R * KK), dY = values<T>(R * MM);
  for (int64_t tile : {16, 128}) {
    std::vector<T> dW(KK * MM);
    trident::tile_wgrad<T>(X.data(), KK, dY.data(), MM, KK, MM, trident::uniform_segments(R, tile), dW.data());
    put(dW);
  }
  // Exact sums of wide-range values (products of pairs spread the exponents).
  std::vector<T> sums;
  for (int s = 0; s < 50; ++s) {
    trident::ExactAcc<T> acc;
    for (int i = 0; i < 500; ++i) {
      auto ab = values<T>(2);
      acc.add(ab[0] * ab[1] * T(1e6));
      acc.add(ab[0]);
    }
    sums.push_back(acc.round());
  }
  put(sums);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT_FILE\n", argv[0]);
    return 2;
  }
  g_out = std::fopen(argv[1], "wb");
  if (!g_out) {
    std::fprintf(stderr, "cannot open %s\n", argv[1]);
    return 2;
  }
  dump_gemm_and_tiles<float>();
  dump_gemm_and_tiles<double>();
#if TRIDENT_ISA_BF16
  {
    std::vector<float> v = values<float>(4096);
    for (auto& x : v) x *= 1234.5f;
    trident::round_bf16_inplace(v.data(), static_cast<long>(v.size()));
    put(v);
  }
#endif
#if TRIDENT_ISA_DMATH
  {
    auto xs = values<float>(2000);
    auto xd = values<double>(2000);
    std::vector<float> f;
    std::vector<double> d;
    for (size_t i = 0; i < xs.size(); ++i) {
      const float x = xs[i] * 1e4f;  // about [-80, 80]
      f.insert(f.end(), {trident::dm::exp(x), trident::dm::expm1(x), trident::dm::log(x < 0 ? -x : x),
                         trident::dm::log1p(x < 0 ? -x : x), trident::dm::tanh(x), trident::dm::sigmoid(x),
                         trident::dm::silu(x), trident::dm::rsqrt(x < 0 ? -x : x)});
      const double y = xd[i] * 1e4;
      d.insert(d.end(), {trident::dm::exp(y), trident::dm::expm1(y), trident::dm::log(y < 0 ? -y : y),
                         trident::dm::log1p(y < 0 ? -y : y), trident::dm::tanh(y), trident::dm::sigmoid(y),
                         trident::dm::silu(y), trident::dm::rsqrt(y < 0 ? -y : y), trident::dm::sin(y),
                         trident::dm::cos(y), trident::dm::pow(y < 0 ? -y : y + 1.0, 0.37)});
    }
    put(f);
    put(d);
  }
#endif
  std::fclose(g_out);
  std::printf("wrote %zu bytes to %s (bf16 %d, dmath %d)\n", g_bytes, argv[1], TRIDENT_ISA_BF16, TRIDENT_ISA_DMATH);
  return g_bytes > 0 ? 0 : 1;
}
