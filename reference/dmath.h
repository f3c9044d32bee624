// Deterministic elementary functions: implemented here from IEEE +,-,*,/,sqrt only (no libm, no FMA), so
// their bits do not depend on the C library, the compiler's builtins or the instruction set.
// Error bounds (ulps, measured against MPFR) are documented in docs/numerics.md and checked by
// tests/numerics/test_dmath.cpp. Special values follow C99 Annex F (exp(-inf)=0, log(0)=-inf, log(<0)=NaN...).
#pragma once

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
float rsqrt(float x);     // 1 / sqrt(x): IEEE sqrt then IEEE division (two roundings, deterministic)
double rsqrt(double x);
double sin(double x);     // for RoPE tables: angles are computed and tabulated in fp64
double cos(double x);
double pow(double base, double e);  // base > 0: exp(e * log(base)); used for theta^(-2i/D)

}  // namespace trident::dm
