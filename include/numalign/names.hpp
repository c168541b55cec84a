// numalign/names.hpp: a trace's names grouped by the module that recorded them, in execution
// order: what to read before writing a map between two implementations.
#pragma once

#include <string>

#include "numalign/trace.hpp"

namespace numalign {

// One block per module (its "module" tag; "(model)" for the model's own tensors), in the
// order its first tensor was recorded, each tensor on a line: its name as the map sees it,
// its kind (input, output, grad, grad-output, param-grad...), dtype and shape. A trace
// without tags (not captured by numalign) lists its names by their dotted prefix. Names are
// printable (escaped).
std::string render_names(const Trace& trace);

}  // namespace numalign
