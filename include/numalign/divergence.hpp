// numalign/divergence.hpp: the first divergence of a judged run, from the execution order,
// modules and inputs its reference trace records.
#pragma once

#include <string_view>
#include <utility>

#include "numalign/report.hpp"
#include "numalign/trace.hpp"

namespace numalign {

// The first tensor judged to fail in forward order (tensors tagged kind "input",
// "output" or "op") and in backward order (kind "grad-output", "grad", "param-grad",
// "input-grad" or "op-grad"), with the module that
// computed it (tag "producer" when there is one, else "module") and whether the tensors it
// was computed from passed, and its tag "op" for an op's output (capture.trace_ops). A
// tensor that could not be judged is never the divergence, and as an input leaves the question
// open (inputs_aligned empty), as do results tagged "unpaired" (mark_unpaired_ops). Empty when
// the metadata records no such tensors.
std::optional<FirstDivergence> find_first_divergence(const TraceMetadata& ref,
                                                     const Report& report);

// Modules by their own worst ratio / limit (could-not-judge and failures without a ratio
// first), from each tensor's "module" tag: for runs where every module ran on the truth's
// inputs (isolation). Failing modules come first, and among them the innermost: a module
// holding a failing module ranks after every module that holds none, whatever its ratio (a
// parent runs its children, so their bug is its failure too).
std::vector<ModuleRank> rank_modules(const Report& report);

// How many tensors of the report were not judged (was_judged), forward and backward (by the
// "kind" tag the first divergence reads).
std::pair<std::size_t, std::size_t> unjudged_by_direction(const Report& report);

// Whether module path `inner` lies inside `outer` ("a.b.c" in "a.b"; every module in "", the
// model itself).
bool module_inside(std::string_view inner, std::string_view outer);

// The first tensor in execution order whose verdict is not pass; empty when all pass.
std::optional<std::string> first_failing(const Report& report);

}  // namespace numalign
