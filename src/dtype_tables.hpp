// dtype_tables.hpp: the lookup tables of the 8-bit float formats, for the SIMD kernel.
#pragma once

#include <cstdint>

#include "numalign/dtype.hpp"

namespace numalign {

// 256 entries indexed by bit pattern: the value (NaN patterns decode to NaN) and the
// ordinal of ulp_ordinal. For the F8_* dtypes only.
const double* fp8_value_table(DType d);
const std::int64_t* fp8_ordinal_table(DType d);

}  // namespace numalign
