// map_fuzzer.cpp: map files and the pairing and judging they drive. The first line is a glob
// and the second a name (captures checked against the matcher); the rest is a map's JSON,
// which, when it parses, pairs and judges small runs of a fused and a separate layout (with
// two test ranks for sharded and replicated entries), reading every piece under ASan.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "numalign/error.hpp"
#include "numalign/glob.hpp"
#include "numalign/judge.hpp"
#include "numalign/map.hpp"
#include "numalign/trace.hpp"

namespace {

using numalign::DType;

struct Run {
  std::deque<std::vector<std::byte>> data;
  std::vector<numalign::NamedTensor> tensors;
  void add(const std::string& name, DType dt, numalign::Shape shape, double seed) {
    std::uint64_t n = 1;
    for (auto d : shape) n *= d;
    auto& bytes = data.emplace_back(n * numalign::element_size(dt));
    for (std::uint64_t i = 0; i < n; ++i) {
      const double v = seed + 0.25 * static_cast<double>(i % 7) - 0.5;
      if (dt == DType::F64) {
        std::memcpy(bytes.data() + i * 8, &v, 8);
      } else {
        const float f = static_cast<float>(v);
        std::memcpy(bytes.data() + i * 4, &f, 4);
      }
    }
    tensors.push_back({name, numalign::TensorView{dt, std::move(shape), bytes.data()}});
  }
  numalign::Trace trace() const { return numalign::Trace::from_tensors(tensors, {}); }
};

// Test holds a fused [2, 3, 6] tensor and pieces; ref and truth the separate layout.
Run test_run(double shift) {
  Run r;
  r.add("blocks.0.qkv", DType::F32, {2, 3, 6}, 1 + shift);
  r.add("blocks.0.o", DType::F32, {2, 3, 2}, 2 + shift);
  r.add("blocks.0.ot", DType::F32, {2, 2, 3}, 2 + shift);
  r.add("a", DType::F32, {4}, 3);
  r.add("s", DType::F32, {}, 4);
  return r;
}
Run ref_run(DType dt) {
  Run r;
  for (const char* n : {"m.0.q", "m.0.k", "m.0.v", "m.0.o"}) r.add(n, dt, {2, 3, 2}, 1);
  r.add("m.0.qkv", dt, {2, 3, 6}, 1);
  r.add("a", dt, {4}, 3);
  r.add("s", dt, {}, 4);
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto nl1 = text.find('\n');
  const auto nl2 = nl1 == std::string_view::npos ? nl1 : text.find('\n', nl1 + 1);
  const std::string_view glob = text.substr(0, nl1);
  const std::string_view name =
      nl1 == std::string_view::npos ? std::string_view() : text.substr(nl1 + 1, nl2 - nl1 - 1);
  const std::string_view json =
      nl2 == std::string_view::npos ? std::string_view() : text.substr(nl2 + 1);
  // Captures exist exactly when the glob matches; without '?', putting them back in place of
  // the stars gives the name again.
  if (glob.size() < 64 && name.size() < 256) {
    const auto caps = numalign::glob_captures(glob, name);
    if (caps.has_value() != numalign::glob_match(glob, name)) std::abort();
    if (caps && glob.find('?') == std::string_view::npos) {
      std::string again;
      std::size_t k = 0;
      for (char c : glob) {
        if (c == '*') {
          if (k >= caps->size()) std::abort();
          again += (*caps)[k++];
        } else {
          again += c;
        }
      }
      if (again != name || k != caps->size()) std::abort();
    }
  }
  try {
    numalign::JudgeOptions o;
    o.map = std::make_shared<numalign::TensorMap>(numalign::TensorMap::parse(json, "fuzz.json"));
    o.threads = 1;
    const Run t0 = test_run(0), t1 = test_run(0.125), r = ref_run(DType::F32),
              u = ref_run(DType::F64);
    const numalign::Trace test0 = t0.trace(), test1 = t1.trace(), ref = r.trace(),
                          truth = u.trace();
    numalign::judge(test0, ref, &truth, o);
    numalign::judge({&test0, &test1}, ref, &truth, o);
  } catch (const numalign::Error&) {
  }
  return 0;
}
