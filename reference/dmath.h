// Deterministic elementary functions: implemented here from IEEE +,-,*,/,sqrt only (no libm, no FMA), so
// their bits do not depend on the C library, the compiler's builtins or the instruction set.
// Accuracy: the float overloads are correctly rounded; the double overloads are within 0.501 ulp (faithful).
// The promised bounds are in reference/dmath_bounds.h, documented with the algorithms in docs/numerics.md
// ("Elementary functions") and checked against MPFR by tests/dmath. Special values follow C99 Annex F
// (exp(-inf)=+0, log(+-0)=-inf, log(<0)=NaN, tanh(+-inf)=+-1, NaN in -> NaN out ...).
#pragma once
#include <cstdint>

namespace trident::dm {

float exp(float x);
double exp(double x);
float expm1(float x);
double expm1(double x);
float log(float x);
double log(double x);
float log1p(float x);
double log1p(double x);
float tanh(float x);
double tanh(double x);
float sigmoid(float x);   // 1 / (1 + exp(-x)), stable for both signs
double sigmoid(double x);
float silu(float x);      // x * sigmoid(x)
double silu(double x);
float rsqrt(float x);     // 1 / sqrt(x), rounded once (rsqrt(+0)=+inf, rsqrt(-0)=-inf as IEEE 754 rSqrt)
double rsqrt(double x);
double sin(double x);     // for RoPE tables: angles are computed and tabulated in fp64; any finite x
double cos(double x);
double pow(double base, double e);  // exp(e * log(base)) in double-double; Annex F specials; theta^(-2i/D)

// Array forms (host): y[i] = exp(x[i]) for i < n, the same bits as the scalar function; y may be x. The float form
// evaluates the fast stage for many elements at once (SIMD), which is where the attention core's softmax spends.
void exp_n(const float* x, float* y, int64_t n);
void exp_n(const double* x, double* y, int64_t n);
// sg[i] = sigmoid(x[i]) and si[i] = silu(x[i]) for i < n, the same bits as the scalar functions; either output may be
// null (not computed) or x itself. The float form evaluates the fast stage for many elements at once, one exp for
// both (SwiGLU, the router).
void sigmoid_silu_n(const float* x, float* sg, float* si, int64_t n);
void sigmoid_silu_n(const double* x, double* sg, double* si, int64_t n);

}  // namespace trident::dm
