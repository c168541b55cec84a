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

#include "numalign/consistency.hpp"
#include "numalign/divergence.hpp"
#include "numalign/error.hpp"
#include "numalign/fingerprint.hpp"
#include "numalign/judge.hpp"
#include "numalign/map.hpp"
#include "numalign/names.hpp"
#include "numalign/options.hpp"
#include "numalign/report_transfer.hpp"
#include "numalign/sensitivity.hpp"
#include "numalign/trace.hpp"
#include "numalign/trace_writer.hpp"
#include "numalign/upstream_gradient.hpp"
#include "numalign/version.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using namespace numalign;

namespace {
// A file system path as the OS holds it: bytes, not necessarily UTF-8.
struct FsPath {
  std::string bytes;
};
}  // namespace

// Paths cross as Python's os module passes them: a str (a byte that is not UTF-8 held as a
// lone surrogate, as os.fsdecode makes it), bytes or an os.PathLike, encoded with the file
// system encoding. Paths come back as str decoded the same way (fs_str), so they round-trip.
template <>
struct nanobind::detail::type_caster<FsPath> {
  NB_TYPE_CASTER(FsPath, const_name("str | os.PathLike[str] | bytes"))

  bool from_python(handle src, std::uint32_t, cleanup_list*) noexcept {
    PyObject* encoded = nullptr;
    if (!PyUnicode_FSConverter(src.ptr(), &encoded)) {
      // A NUL (ValueError) is kept for the core's check_path to name; anything else is not a
      // path, and the binding's type check says what it expected.
      const bool nul = PyErr_ExceptionMatches(PyExc_ValueError);
      PyErr_Clear();
      return nul && from_path_with_nul(src);
    }
    value.bytes.assign(PyBytes_AS_STRING(encoded),
                       static_cast<std::size_t>(PyBytes_GET_SIZE(encoded)));
    Py_DECREF(encoded);
    return true;
  }

 private:
  // PyUnicode_FSConverter refuses a NUL; keep it, so that the core says what is wrong.
  bool from_path_with_nul(handle src) noexcept {
    PyObject* fspath = PyOS_FSPath(src.ptr());
    if (!fspath) {
      PyErr_Clear();
      return false;
    }
    PyObject* encoded = PyUnicode_Check(fspath) ? PyUnicode_EncodeFSDefault(fspath) : fspath;
    if (encoded != fspath) Py_DECREF(fspath);
    if (!encoded || !PyBytes_Check(encoded)) {
      Py_XDECREF(encoded);
      PyErr_Clear();
      return false;
    }
    value.bytes.assign(PyBytes_AS_STRING(encoded),
                       static_cast<std::size_t>(PyBytes_GET_SIZE(encoded)));
    Py_DECREF(encoded);
    return true;
  }
};

namespace {

nb::str fs_str(const std::string& path) {
  return nb::steal<nb::str>(
      PyUnicode_DecodeFSDefaultAndSize(path.data(), static_cast<Py_ssize_t>(path.size())));
}

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

// A run for the core: a trace file (or shards) kept mapped, or a front end's tensors in
// memory, held alive here for as long as the views point into them.
struct PyTrace {
  Trace trace;
  std::vector<nb::object> owners;  // the tensors handed over by address
  std::vector<Bytes> arrays;       // the arrays handed over as buffers
};

PyTrace trace_from_tensors(const std::string& label,
                           const std::vector<std::pair<std::string, PyTensor>>& tensors,
                           std::map<std::string, std::string> raw_metadata) {
  PyTrace t;
  std::vector<NamedTensor> named;
  named.reserve(tensors.size());
  t.owners.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    named.push_back({name, to_view(tensor, name)});
    const auto& data = std::get<2>(tensor);
    if (const auto* a = std::get_if<Address>(&data)) {
      t.owners.push_back(std::get<2>(*a));
    } else {
      t.arrays.push_back(std::get<Bytes>(data));
    }
  }
  t.trace = Trace::from_tensors(std::move(named), std::move(raw_metadata), label);
  return t;
}

// Picklable (ranks send them to each other): every field as a tuple.
using DifferenceState = std::tuple<std::size_t, std::string, std::uint64_t, std::uint64_t, double,
                                   double, std::uint64_t, bool>;

DifferenceState state_of(const RankDifference& d) {
  return {d.rank,  d.problem,     d.elements_differ, d.first_index,
          d.value, d.rank0_value, d.max_ulp,         d.ulp_inf};
}

// A rank's summary as Python gathers it: (name, dtype name, shape, digest).
using PySummary = std::tuple<std::string, std::string, std::vector<std::uint64_t>, std::string>;

std::vector<std::vector<RankTensorSummary>> summaries_of(
    const std::vector<std::vector<PySummary>>& ranks) {
  std::vector<std::vector<RankTensorSummary>> out;
  for (const auto& rank : ranks) {
    auto& list = out.emplace_back();
    for (const auto& [n, dtype_name, shape, digest] : rank) {
      const auto dtype = dtype_from_name(dtype_name);
      if (!dtype) throw nb::value_error(("tensor '" + n + "': unknown dtype").c_str());
      list.push_back({n, *dtype, Shape(shape.begin(), shape.end()), digest});
    }
  }
  return out;
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "numalign's C++ core: rules, fused metrics, reports and safetensors traces";
  m.attr("__version__") = NUMALIGN_VERSION;
  m.attr("METADATA_KEY") = kMetadataKey;  // our JSON's key inside __metadata__
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
      // [(values, tensors, passed, failed, errors, max_ratio)] in execution order.
      .def("by_tag",
           [](const Report& r, const std::vector<std::string>& keys) {
             nb::list out;
             for (const auto& g : group_by_tags(r, keys)) {
               out.append(
                   nb::make_tuple(g.values, g.tensors, g.passed, g.failed, g.errors, g.max_ratio));
             }
             return out;
           })
      // Picklable, so that ranks (or pytest workers) can send their reports.
      .def("__getstate__",
           [](const Report& r) {
             const std::string bytes = encode_report(r);
             return nb::bytes(bytes.data(), bytes.size());
           })
      .def("__setstate__", [](Report& r, const nb::bytes& state) {
        new (&r) Report(decode_report({state.c_str(), state.size()}, "pickled report"));
      });

  // [(suite name, report)] as one JUnit document (the pytest plugin's session report).
  m.def(
      "render_junit_suites",
      [](const std::vector<std::pair<std::string, const Report*>>& parts) {
        std::vector<JunitSuite> suites;
        for (const auto& [name, report] : parts) suites.push_back({name, report});
        return render_junit_suites(suites);
      },
      "suites"_a);
  // "(3, 5)": the index of a flat position, as every report writes it.
  m.def(
      "format_index",
      [](const std::vector<std::uint64_t>& shape, std::uint64_t flat) {
        return format_index(Shape(shape), flat);
      },
      "shape"_a, "flat"_a);

  m.def(
      "merge_reports",
      [](const std::vector<
             std::tuple<std::string, const Report*, std::map<std::string, std::string>>>& parts,
         std::string title) {
        std::vector<ReportPart> copies;
        for (const auto& [prefix, report, tags] : parts) copies.push_back({prefix, *report, tags});
        return merge_reports(std::move(copies), std::move(title));
      },
      "parts"_a, "title"_a);

  // What the user gave; fields left None were not given (resolve_options fills them from
  // the policy, then the defaults).
  nb::class_<JudgeArguments>(m, "JudgeArguments")
      .def(nb::init<>())
      .def_rw("tol", &JudgeArguments::tol)
      .def_rw("equal_nan", &JudgeArguments::equal_nan)
      .def_rw("check_bias", &JudgeArguments::check_bias)
      .def_rw("larger_multiplier_for_small", &JudgeArguments::larger_multiplier_for_small)
      .def_rw("force_max_multiplier", &JudgeArguments::force_max_multiplier)
      .def_rw("magnitude_profile", &JudgeArguments::magnitude_profile)
      .def_rw("threads", &JudgeArguments::threads)
      .def_prop_rw(
          "policy_path", [](const JudgeArguments& a) { return fs_str(a.policy_path); },
          [](JudgeArguments& a, const FsPath& p) { a.policy_path = p.bytes; })
      .def_rw("policy_json", &JudgeArguments::policy_json)
      .def_prop_rw(
          "map_path", [](const JudgeArguments& a) { return fs_str(a.map_path); },
          [](JudgeArguments& a, const FsPath& p) { a.map_path = p.bytes; })
      .def_rw("map_json", &JudgeArguments::map_json)
      .def_rw("only", &JudgeArguments::only)
      .def_rw("shared_randomness", &JudgeArguments::shared_randomness)
      .def_prop_rw(
          "module_ranking", [](const JudgeArguments& a) { return a.sections.module_ranking; },
          [](JudgeArguments& a, bool v) { a.sections.module_ranking = v; })
      .def_prop_rw(
          "first_failing", [](const JudgeArguments& a) { return a.sections.first_failing; },
          [](JudgeArguments& a, bool v) { a.sections.first_failing = v; })
      .def(
          "add_rule",
          [](JudgeArguments& a, const std::string& text) {
            a.rules.push_back(parse_rule_argument(text, a.rules_origin));
          },
          "text"_a, "\"SPEC\" (the default rule) or \"GLOB=SPEC\"")
      .def(
          "add_override",
          [](JudgeArguments& a, const std::string& glob, const std::string& spec,
             const std::string& reason) {
            a.rules.push_back({glob, spec, reason});
          },
          "glob"_a, "spec"_a, "reason"_a = "");

  // The options resolved from the arguments (the policy file read once), before any tensor
  // is handed over: a bad option raises first. Opaque: judge and sensitivity take it.
  nb::class_<JudgeOptions>(m, "JudgeOptions");
  m.def("resolve_options", &resolve_options, "arguments"_a);

  // "same", "ulp", "exact", "abs", "allclose" or "measured": the kind of a rule spec (raises on
  // a bad one).
  m.def(
      "rule_kind",
      [](const std::string& spec, const std::string& where) {
        static constexpr const char* kinds[] = {"same", "ulp",      "exact",
                                                "abs",  "allclose", "measured"};
        return std::string(kinds[static_cast<int>(parse_rule(spec, where).kind)]);
      },
      "spec"_a, "where"_a = "rule");

  nb::class_<PyTrace>(m, "Trace")
      .def_static(
          "open",
          [](const FsPath& path) {
            return PyTrace{Trace::open(path.bytes), {}, {}};
          },
          "path"_a)
      .def_static("from_tensors", &trace_from_tensors, "label"_a, "tensors"_a,
                  "raw_metadata"_a = std::map<std::string, std::string>{})
      .def_prop_ro("path", [](const PyTrace& t) { return fs_str(t.trace.path()); })
      .def_prop_ro("raw_metadata", [](const PyTrace& t) { return t.trace.raw_metadata(); })
      .def("__len__", [](const PyTrace& t) { return t.trace.entries().size(); })
      .def(
          "copy",
          [](const PyTrace& t, const std::string& name) {
            const TraceEntry* e = t.trace.find(name);
            if (!e) throw nb::key_error(name.c_str());
            const std::size_t n = e->view.nbytes();
            std::unique_ptr<std::uint8_t[]> data(new std::uint8_t[n > 0 ? n : 1]);  // not zeroed
            nb::capsule owner(data.get(),
                              [](void* p) noexcept { delete[] static_cast<std::uint8_t*>(p); });
            std::uint8_t* bytes = data.release();  // the capsule owns it now
            {
              nb::gil_scoped_release release;
              Trace::copy_data(*e, reinterpret_cast<std::byte*>(bytes));
            }
            return nb::ndarray<nb::numpy, std::uint8_t, nb::ndim<1>>(bytes, {n}, owner);
          },
          "name"_a,
          "A copy of the tensor's bytes: a file that shrank since it was opened raises, naming it.")
      .def("entries", [](const PyTrace& t) {
        // A capsule sharing the mapping (and the tensors held) owns the views, not the
        // Python object: torch never releases what a tensor alive at exit holds, and a Trace
        // kept so would read as a nanobind leak.
        nb::capsule owner(new PyTrace(t),
                          [](void* p) noexcept { delete static_cast<PyTrace*>(p); });
        nb::list out;
        for (const auto& e : t.trace.entries()) {
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
      "render_names", [](const PyTrace& t) { return render_names(t.trace); }, "trace"_a,
      "The trace's names grouped by module, in execution order (numalign names).");

  // The one judge of every front end: the CLI's `numalign judge` calls the same function.
  m.def(
      "judge",
      [](const PyTrace& test, const PyTrace& ref, const PyTrace* truth,
         const JudgeOptions& options) {
        nb::gil_scoped_release release;
        return judge(test.trace, ref.trace, truth ? &truth->trace : nullptr, options);
      },
      "test"_a, "ref"_a, "truth"_a.none(), "options"_a);

  // A test run saved as one trace per tensor-parallel rank (rank 0 first).
  m.def(
      "judge_ranks",
      [](const nb::list& test_ranks, const PyTrace& ref, const PyTrace* truth,
         const JudgeOptions& options) {
        std::vector<const Trace*> ranks;
        for (nb::handle h : test_ranks) ranks.push_back(&nb::cast<const PyTrace&>(h).trace);
        nb::gil_scoped_release release;
        return judge(ranks, ref.trace, truth ? &truth->trace : nullptr, options);
      },
      "test_ranks"_a, "ref"_a, "truth"_a.none(), "options"_a);
  m.def(
      "rank_trace_path",
      [](const FsPath& path, std::size_t rank) {
        return fs_str(rank_trace_path(path.bytes, rank));
      },
      "path"_a, "rank"_a,
      "A rank's trace as numalign.distributed.save names it: run.safetensors -> "
      "run.rank1.safetensors.");

  m.def(
      "sensitivity",
      [](const PyTrace& test, const PyTrace& ref, const PyTrace* truth, const JudgeOptions& options,
         std::uint64_t terms) {
        nb::gil_scoped_release release;
        return render_sensitivity_json(sensitivity(test.trace, ref.trace,
                                                   truth ? &truth->trace : nullptr, options,
                                                   {.reduction_terms = terms}));
      },
      "test"_a, "ref"_a, "truth"_a.none(), "options"_a, "terms"_a = 256);

  // Replicated tensors across ranks: Python gathers, the core measures and reports.
  nb::class_<RankDifference>(m, "RankDifference")
      .def_ro("rank", &RankDifference::rank)
      .def_ro("elements_differ", &RankDifference::elements_differ)
      .def("__getstate__", [](const RankDifference& d) { return state_of(d); })
      .def("__setstate__", [](RankDifference& d, const DifferenceState& s) {
        new (&d) RankDifference{};
        std::tie(d.rank, d.problem, d.elements_differ, d.first_index, d.value, d.rank0_value,
                 d.max_ulp, d.ulp_inf) = s;
      });
  m.def(
      "tensors_to_compare",
      [](const std::vector<std::vector<PySummary>>& ranks) {
        return tensors_to_compare(summaries_of(ranks));
      },
      "summaries"_a);
  m.def(
      "compare_with_rank0",
      [](const PyTensor& mine, const PyTensor& rank0, std::size_t rank, const std::string& name) {
        return compare_with_rank0(to_view(mine, name), to_view(rank0, name), rank);
      },
      "mine"_a, "rank0"_a, "rank"_a, "name"_a);
  m.def(
      "consistency_report",
      [](const std::vector<std::vector<PySummary>>& ranks,
         const std::vector<std::pair<std::string, RankDifference>>& measured,
         const std::string& rule, const std::vector<FsPath>& files) {
        std::vector<MeasuredDifference> found;
        for (const auto& [n, d] : measured) found.push_back({n, d});
        std::vector<std::string> paths;
        for (const auto& f : files) paths.push_back(f.bytes);
        return render_consistency_json(consistency_report(
            summaries_of(ranks), found, parse_rule(rule, "rule"), std::move(paths)));
      },
      "summaries"_a, "measured"_a, "rule"_a, "files"_a);

  m.def(
      "fingerprint",
      [](const PyTensor& t) {
        const TensorView v = to_view(t, "fingerprint");
        nb::gil_scoped_release release;
        return fingerprint(v);
      },
      "tensor"_a, "A hash of a tensor's dtype, shape and bytes (numalign/fingerprint.hpp).");
  m.attr("UPSTREAM_GRADIENT_RECIPE") = std::string(kUpstreamGradientRecipe);
  m.def(
      "upstream_gradient",
      [](std::uint64_t key, std::size_t count) {
        auto* values = new float[count];
        fill_upstream_gradient(key, values, count);
        nb::capsule owner(values, [](void* p) noexcept { delete[] static_cast<float*>(p); });
        return nb::ndarray<nb::numpy, float, nb::ndim<1>>(values, {count}, owner);
      },
      "key"_a, "count"_a,
      "The fixed upstream gradient of captured runs: count float32 values drawn from key.");

  // trace_model(save_to=): each tensor copied as it is produced and written in the
  // background, the file renamed into place by close() (see StreamOptions).
  nb::class_<TraceStreamWriter>(m, "TraceStreamWriter")
      .def(
          "__init__",
          [](TraceStreamWriter* w, FsPath path, std::uint64_t header_reserve,
             std::uint64_t reference_layout_below) {
            StreamOptions options;
            options.header_reserve = header_reserve;
            options.reference_layout_below = reference_layout_below;
            new (w) TraceStreamWriter(std::move(path.bytes), options);
          },
          "path"_a, "header_reserve"_a = StreamOptions{}.header_reserve,
          "reference_layout_below"_a = StreamOptions{}.reference_layout_below)
      .def_prop_ro("path", [](const TraceStreamWriter& w) { return fs_str(w.path()); })
      .def_prop_ro("written_once", &TraceStreamWriter::written_once)
      .def(
          "add",
          [](TraceStreamWriter& w, const std::string& name, const PyTensor& t) {
            const TensorView v = to_view(t, name);
            nb::gil_scoped_release release;
            w.add(name, v);
          },
          "name"_a, "tensor"_a)
      .def(
          "close",
          [](TraceStreamWriter& w, const std::map<std::string, std::string>& metadata) {
            nb::gil_scoped_release release;
            w.close(metadata.empty() ? nullptr : &metadata);
          },
          "metadata"_a = std::map<std::string, std::string>{})
      .def("abort", &TraceStreamWriter::abort);

  m.def(
      "write_trace",
      [](const FsPath& path, const std::vector<std::tuple<std::string, PyTensor>>& tensors,
         const std::optional<std::map<std::string, std::string>>& metadata) {
        std::vector<NamedTensor> named;
        for (const auto& [n, t] : tensors) named.push_back({n, to_view(t, n)});
        nb::gil_scoped_release release;
        write_trace(path.bytes, named, metadata ? &*metadata : nullptr);
      },
      "path"_a, "tensors"_a, "metadata"_a = nb::none());
  m.def(
      "write_file",
      [](const FsPath& path, const std::string& text, const std::vector<FsPath>& inputs) {
        std::vector<std::string> input_paths;
        for (const auto& i : inputs) input_paths.push_back(i.bytes);
        nb::gil_scoped_release release;
        refuse_output_over_input(path.bytes, input_paths);
        write_file_atomic(path.bytes, text);
      },
      "path"_a, "text"_a, "inputs"_a = nb::list(),
      "Writes text as the CLI's -o does: atomically (links followed, mode kept), or through\n"
      "a device, FIFO or '-' (stdout); refuses a path that is one of `inputs` (the same file\n"
      "through any path or link).");
}
