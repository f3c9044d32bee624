// The exact_* dtypes' element size. Kept apart from comm.cpp because it needs reference/exact_acc.h.
#include "parallel/comm.h"
#include "reference/check.h"
#include "reference/exact_acc.h"

namespace trident {

size_t exact_dtype_size(DataType t) {
  if (t == DataType::exact_f32) return sizeof(ExactAcc<float>);
  if (t == DataType::exact_f64) return sizeof(ExactAcc<double>);
  fail(fmt::format("exact_dtype_size: {} is not an exact dtype", to_string(t)));
}

}  // namespace trident
