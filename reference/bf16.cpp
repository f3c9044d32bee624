#include "reference/bf16.h"

namespace trident {

void round_bf16_inplace(float* x, long n) {
  for (long i = 0; i < n; ++i) x[i] = round_bf16(x[i]);
}

}  // namespace trident
