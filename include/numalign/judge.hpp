// numalign/judge.hpp: judging whole traces, or tensors in memory, into a Report.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "numalign/map.hpp"
#include "numalign/report.hpp"
#include "numalign/rules.hpp"
#include "numalign/trace.hpp"

namespace numalign {

using ProgressFn = std::function<void(double done_bytes, double total_bytes)>;

// `mapped`: the file mappings the views point into (Trace::mappings()), if any; their pages
// are then mapped ahead of the pass, window by window, on the threads about to read them,
// and dropped from the process once read. Only read-only file mappings may be given (as
// Trace::mappings() are): dropped pages of other memory would read back as zeros.
Report judge_tensors(const std::vector<TensorTriple>& tensors, const JudgeOptions& options,
                     const ProgressFn& progress = {},
                     std::span<const std::span<const std::byte>> mapped = {});

// Warnings that the runs' metadata reveals (docs/architecture.md, "Comparisons that mean
// nothing"): precision recipes that differ, inputs that differ (fingerprints), TF32 on, a
// truth at ref's precision.
void add_metadata_warnings(const TraceMetadata* test, const TraceMetadata* ref,
                           const TraceMetadata* truth, Report& report);

// The tensors of ref (in its execution order when recorded, else file order) with their
// namesakes in test and truth, then test's tensors that ref lacks; `only`: globs of names.
std::vector<TensorTriple> pair_tensors(const Trace& test, const Trace& ref, const Trace* truth,
                                       const std::vector<std::string>& only = {});

// The pairing every front end judges: options.map's when given, else by identical names
// (several test ranks: replicated, so each must agree with rank 0 bit for bit).
Pairing pair_runs(const std::vector<const Trace*>& test_ranks, const Trace& ref, const Trace* truth,
                  const JudgeOptions& options);

// The one entry point of every front end (CLI, Python): pairs the runs' tensors (those of
// ref matching options.only), judges them in one pass, adds the warnings their pairing
// and metadata reveal, the reference's tags, the first divergence and the sections asked
// for. Runs are files (Trace::open) or tensors in memory (Trace::from_tensors).
Report judge(const Trace& test, const Trace& ref, const Trace* truth, const JudgeOptions& options,
             const ProgressFn& progress = {});
// The same, for a test run saved as one trace per tensor-parallel rank (rank 0 first):
// options.map says which tensors the ranks hold pieces of (sharded_dim); the others are
// replicated, and every rank's copy must equal rank 0's bit for bit.
Report judge(const std::vector<const Trace*>& test_ranks, const Trace& ref, const Trace* truth,
             const JudgeOptions& options, const ProgressFn& progress = {});

}  // namespace numalign
