// bindings.cpp: the thin nanobind layer over the C++ core; all logic stays in the core.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <deque>
#include <memory>
#include <variant>

#include "numalign/divergence.hpp"
#include "numalign/error.hpp"
#include "numalign/judge.hpp"
#include "numalign/report_transfer.hpp"
#include "numalign/sensitivity.hpp"
#include "numalign/trace.hpp"
#include "numalign/version.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using namespace numalign;

namespace {

using Bytes = nb::ndarray<const std::uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
// A contiguous CPU torch tensor's bytes as (address, size, the tensor): its DLPack export
// costs more than judging a small tensor. The tuple holds the tensor for the call.
using Address = std::tuple<std::uintptr_t, std::size_t, nb::object>;
// A tensor as Python hands it over: safetensors dtype name, shape, its bytes (zero copy).
using PyTensor = std::tuple<std::string, std::vector<std::uint64_t>, std::variant<Address, Bytes>>;

TensorView to_view(const PyTensor& t, const std::string& name) {
  const auto& [dtype_name, shape, data] = t;
  const auto dtype = dtype_from_name(dtype_name);
  if (!dtype)
    throw nb::value_error(("tensor '" + name + "': unknown dtype '" + dtype_name + "'").c_str());
  const auto* bytes = std::get_if<Bytes>(&data);
  const auto* address = std::get_if<Address>(&data);
  const auto* start = bytes ? reinterpret_cast<const std::byte*>(bytes->data())
                            : reinterpret_cast<const std::byte*>(std::get<0>(*address));
  const std::size_t size = bytes ? bytes->size() : std::get<1>(*address);
  TensorView v{*dtype, Shape(shape.begin(), shape.end()), start};
  if (v.nbytes() != size) {
    throw nb::value_error(("tensor '" + name + "': " + std::to_string(size) + " bytes for " +
                           dtype_name + " " + format_shape(v.shape) + " (needs " +
                           std::to_string(v.nbytes()) + ")")
                              .c_str());
  }
  return v;
}

using PyItem = std::tuple<std::string, std::optional<PyTensor>, std::optional<PyTensor>,
                          std::optional<PyTensor>>;

// Views of (name, test, ref, truth) items, validated while the GIL is held.
struct Triples {
  std::deque<TensorView> views;
  std::vector<TensorTriple> triples;
  explicit Triples(const std::vector<PyItem>& items) {
    triples.reserve(items.size());
    for (const auto& [name, test, ref, truth] : items) {
      auto view = [&](const std::optional<PyTensor>& t) -> const TensorView* {
        return t ? &views.emplace_back(to_view(*t, name)) : nullptr;
      };
      const TensorView* tv = view(test);
      const TensorView* rv = view(ref);
      triples.push_back({name, tv, rv, view(truth)});
    }
  }
};

// An open trace file (or shards): keeps the mapping alive for the views handed out.
struct TraceFile {
  explicit TraceFile(const std::string& path) : trace(Trace::open(path)) {}
  Trace trace;
};

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "numalign's C++ core: rules, fused metrics, reports and safetensors traces";
  m.attr("__version__") = NUMALIGN_VERSION;
  nb::exception<Error>(m, "NumalignError", PyExc_ValueError);

  nb::class_<Report>(m, "Report")
      .def_prop_ro("aligned", &Report::aligned)
      .def_prop_ro("exit_code", [](const Report& r) { return static_cast<int>(r.exit_code()); })
      .def_prop_ro("warnings", [](const Report& r) { return r.warnings; })
      .def(
          "text", [](const Report& r, bool verbose) { return render_text(r, verbose); },
          "verbose"_a = false)
      .def("json", [](const Report& r) { return render_json(r); })
      .def("junit", [](const Report& r) { return render_junit(r); })
      .def("html", [](const Report& r) { return render_html(r); })
      // Picklable, so that ranks (or pytest workers) can send their reports.
      .def("__getstate__",
           [](const Report& r) {
             const std::string bytes = encode_report(r);
             return nb::bytes(bytes.data(), bytes.size());
           })
      .def("__setstate__", [](Report& r, const nb::bytes& state) {
        new (&r) Report(decode_report({state.c_str(), state.size()}, "pickled report"));
      });

  // "(3, 5)": the index of a flat position, as every report writes it.
  m.def("format_index", &format_index, "shape"_a, "flat"_a);

  m.def(
      "merge_reports",
      [](const std::vector<std::pair<std::string, const Report*>>& parts, std::string title) {
        std::vector<ReportPart> copies;
        for (const auto& [prefix, report] : parts) copies.push_back({prefix, *report});
        return merge_reports(std::move(copies), std::move(title));
      },
      "parts"_a, "title"_a);

  // Options are built once in Python (numalign.api._options) and shared by judge and
  // sensitivity.
  nb::class_<JudgeOptions>(m, "JudgeOptions")
      .def(nb::init<>())
      .def_rw("tol", &JudgeOptions::tol)
      .def_rw("equal_nan", &JudgeOptions::equal_nan)
      .def_rw("larger_multiplier_for_small", &JudgeOptions::larger_multiplier_for_small)
      .def_rw("force_max_multiplier", &JudgeOptions::force_max_multiplier)
      .def_rw("check_bias", &JudgeOptions::check_bias)
      .def_rw("threads", &JudgeOptions::threads)
      .def_rw("magnitude_profile", &JudgeOptions::magnitude_profile)
      .def("load_policy", [](JudgeOptions& o, const std::string& json,
                             const std::string& name) { parse_policy(json, name, o); })
      .def("set_default_rule",
           [](JudgeOptions& o, const std::string& spec) {
             o.default_rule = parse_rule(spec, "rules");
           })
      .def("add_override", [](JudgeOptions& o, const std::string& glob, const std::string& spec,
                              const std::string& reason) {
        o.overrides.push_back({glob, parse_rule(spec, "rules"), reason, "rules"});
      });

  m.def(
      "judge",
      [](const std::vector<PyItem>& items, const JudgeOptions& o, const std::string& title,
         const std::vector<std::optional<std::string>>& metadata) {
        const Triples t(items);
        Report report;
        {
          nb::gil_scoped_release release;
          report = judge_tensors(t.triples, o);
        }
        report.title = title;
        // Metadata JSON of test, ref and truth (None where a run has none).
        std::vector<std::optional<TraceMetadata>> meta;
        for (std::size_t i = 0; i < 3; ++i) {
          const char* role[] = {"test", "ref", "truth"};
          meta.push_back(i < metadata.size() && metadata[i]
                             ? std::optional(TraceMetadata::from_json(*metadata[i], role[i]))
                             : std::nullopt);
        }
        add_metadata_warnings(meta[0] ? &*meta[0] : nullptr, meta[1] ? &*meta[1] : nullptr,
                              meta[2] ? &*meta[2] : nullptr, report);
        if (meta[1]) report.first_divergence = find_first_divergence(*meta[1], report);
        return report;
      },
      "items"_a, "options"_a, "title"_a = "",
      "metadata"_a = std::vector<std::optional<std::string>>{});

  m.def(
      "sensitivity",
      [](const std::vector<PyItem>& items, const JudgeOptions& o, std::uint64_t terms) {
        const Triples t(items);
        nb::gil_scoped_release release;
        return render_sensitivity_json(sensitivity(t.triples, o, {.reduction_terms = terms}));
      },
      "items"_a, "options"_a, "terms"_a = 256);

  nb::class_<TraceFile>(m, "TraceFile")
      .def(nb::init<const std::string&>(), "path"_a)
      .def_prop_ro("path", [](const TraceFile& f) { return f.trace.path(); })
      .def_prop_ro("raw_metadata", [](const TraceFile& f) { return f.trace.raw_metadata(); })
      .def("entries", [](nb::handle self) {
        const TraceFile& f = nb::cast<const TraceFile&>(self);
        // A capsule sharing the mapping owns the views, not `self`: torch never releases what
        // a tensor alive at exit holds, and a TraceFile kept so reads as a nanobind leak.
        nb::capsule owner(new Trace(f.trace),
                          [](void* p) noexcept { delete static_cast<Trace*>(p); });
        nb::list out;
        for (const auto& e : f.trace.entries()) {
          const std::size_t n = e.view.nbytes();
          // Read-only, zero-copy view into the mapping; `owner` keeps it alive.
          nb::ndarray<nb::numpy, const std::uint8_t, nb::ndim<1>> bytes(
              reinterpret_cast<const std::uint8_t*>(e.view.data), {n}, owner);
          std::vector<std::uint64_t> shape(e.view.shape.begin(), e.view.shape.end());
          out.append(nb::make_tuple(e.name, std::string(name(e.view.dtype)), shape, bytes));
        }
        return out;
      });

  m.def(
      "write_trace",
      [](const std::string& path, const std::vector<std::tuple<std::string, PyTensor>>& tensors,
         const std::optional<std::map<std::string, std::string>>& metadata) {
        std::vector<NamedTensor> named;
        for (const auto& [n, t] : tensors) named.push_back({n, to_view(t, n)});
        nb::gil_scoped_release release;
        write_trace(path, named, metadata ? &*metadata : nullptr);
      },
      "path"_a, "tensors"_a, "metadata"_a = nb::none());
}
