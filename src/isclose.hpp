// isclose.hpp: torch.isclose as ATen evaluates it in the tensors' dtype (the allclose fast
// path of the same rule), and the band around its boundary outside which plain double
// arithmetic already gives the same verdict (what the SIMD kernel decides by itself).
#pragma once

#include "numalign/dtype.hpp"

namespace numalign::detail {

// x rounded to the nearest value of the floating type d (ties to even), as a float: the
// rounding ATen applies after each operation on bf16 and f16 tensors.
float round_float_to(DType d, float x);

// torch.isclose(self, other, atol, rtol) for one element, rounded as ATen rounds it in
// the dtype d. `same()` calls allclose(ref, test): other is the test.
bool torch_isclose(DType d, double self, double other, double atol, double rtol, bool equal_nan);

// Where the allclose verdict |t - r| <= allowed (allowed = tol + tol * |t| in double) is
// certain without torch_isclose's emulation: close when |t - r| <= lo_scale * allowed +
// lo_offset, not close when >= hi_scale * allowed + hi_offset; between, the emulation
// decides. See close_band in isclose.cpp for the bounds.
struct CloseBand {
  double lo_scale, lo_offset, hi_scale, hi_offset;
};
CloseBand close_band(DType d, double tol);

}  // namespace numalign::detail
