// numalign/op_sequence.hpp: runs recorded op by op (capture.trace_ops) pair their ops by
// name, which means something only while both ran the same sequence of ops.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "numalign/report.hpp"
#include "numalign/trace.hpp"

namespace numalign {

// Where the ops of one module call (forward, or its backward) stop matching between ref and
// another run. Op tensors are those ref tags with "op", named GROUP/NS.OP#k (GROUP/NS.OP#k.i
// for an op's i-th output), GROUP being "MODULE" or "MODULE/grad" (with "#call" after a
// module called again); the other run's sequence is read from its tensor names.
struct OpSequenceMismatch {
  std::string group;                  // "layers.0.mlp", "layers.0.mlp#1/grad"
  std::size_t at = 0;                 // k of the first position whose ops differ
  std::string role;                   // "test" or "truth"
  std::string ref_op;                 // "aten.mm"; "(none)" where ref's sequence ended
  std::string other_op;               // the other run's op there, or "(none)"
  std::vector<std::string> unpaired;  // ref's op tensors from position `at` on, in order
};

// The groups of ref's op tensors whose sequence differs in `other` (in ref's order).
std::vector<OpSequenceMismatch> find_op_sequence_mismatches(const Trace& ref, const Trace& other,
                                                            const std::string& role);

// Fail closed on ops that cannot be paired: for each mismatch of test or truth against ref,
// ref's op tensors from the mismatch on are not judged as pairs of different ops. Their
// results become could-not-judge (VerdictKind::kError, reason naming the mismatch, metrics
// dropped, tag "unpaired"), and a warning says where the sequences stop matching. Ops before
// the mismatch keep their verdicts. A mismatch that leaves no op of ref unpaired (the other
// run only has more ops at the end) is a warning alone.
void mark_unpaired_ops(const Trace& test, const Trace& ref, const Trace* truth, Report& report);

}  // namespace numalign
