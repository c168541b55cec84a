// numalign/divergence.hpp: the first divergence of a judged run, from the execution order,
// modules and inputs its reference trace records.
#pragma once

#include "numalign/report.hpp"
#include "numalign/trace.hpp"

namespace numalign {

// The first failing (or unjudgeable) tensor in forward order (tensors tagged kind "input"
// or "output") and in backward order (kind "grad-output" or "grad"), with the module that
// computed it (tag "producer" when there is one, else "module") and whether the tensors it
// was computed from passed. Empty when the metadata records no such tensors.
std::optional<FirstDivergence> find_first_divergence(const TraceMetadata& ref,
                                                     const Report& report);

}  // namespace numalign
