// numalign/report_transfer.hpp: reports that cross processes. A rank (or a pytest worker)
// judges its own tensors and sends the Report, never the tensors; the receiver decodes each
// and merges them into one report, ordered as any other.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "numalign/report.hpp"

namespace numalign {

// Every field of the report, bit for bit (float64 as its bits, NaN and Inf included), in a
// private binary form that only the same numalign version reads back: it moves reports
// between processes of one run, it is not a file format (the JSON report is).
std::string encode_report(const Report& report);
// Throws Error naming `where` when the bytes are not a report this version wrote:
// another version, truncated, or inconsistent (an unknown verdict, a count beyond the end).
Report decode_report(std::string_view bytes, const std::string& where = "report");

// One report of several: each part's tensor names get its prefix ("rank1/"), as do its
// warnings and first divergence; passes keep their order part by part; failures sort
// worst first across all parts; each tensor gains its part's tags. Parts judged with different
// settings get a warning.
struct ReportPart {
  std::string prefix;
  Report report;
  std::map<std::string, std::string> tags;  // added to each of its tensors (e.g. "rank")
};
Report merge_reports(std::vector<ReportPart> parts, std::string title);

}  // namespace numalign
