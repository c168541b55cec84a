// make_example_traces.cpp: writes the demo's traces (a bf16/fp32 matmul and a fused
// allreduce + residual in bf16) as truth / ref / test safetensors files.
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>

#include "numalign/error.hpp"
#include "numalign/trace.hpp"
#include "simulations.hpp"

namespace {

using namespace numalign;
using namespace numalign::examples;

// FNV-1a over the inputs: enough for a judge to notice that two runs saw different data.
std::string fingerprint(const std::vector<double>& values) {
  std::uint64_t h = 1469598103934665603ULL;
  for (double v : values) {
    unsigned char b[8];
    std::memcpy(b, &v, 8);
    for (unsigned char c : b) h = (h ^ c) * 1099511628211ULL;
  }
  char buf[24];
  std::snprintf(buf, sizeof buf, "fnv1a:%016llx", static_cast<unsigned long long>(h));
  return buf;
}

void save(const std::filesystem::path& file,
          const std::vector<std::pair<std::string, Buffer>>& tensors, const std::string& role,
          const std::string& recipe, const std::map<std::string, std::string>& fingerprints) {
  TraceMetadata meta;
  meta.role = role;
  meta.dtype_recipe = recipe;
  meta.device = "cpu (simulated kernel)";
  meta.seed = 0;
  meta.tf32 = {{"matmul", false}};
  meta.fingerprints = fingerprints;
  std::vector<NamedTensor> named;
  for (const auto& [name, buf] : tensors) {
    named.push_back({name, buf.view()});
    meta.order.push_back(name);
  }
  const std::map<std::string, std::string> header{{kMetadataKey, meta.to_json()}};
  write_trace(file.string(), named, &header);
  std::printf("  wrote %s\n", file.string().c_str());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT_DIR\n", argv[0]);
    return 2;
  }
  try {
    const std::filesystem::path dir(argv[1]);
    std::filesystem::create_directories(dir / "matmul");
    std::filesystem::create_directories(dir / "allreduce");

    const MatmulCase bf16(32, 128, 32, DType::BF16, 7), fp32(32, 128, 32, DType::F32, 11);
    std::map<std::string, std::string> mm_inputs{{"bf16.a", fingerprint(bf16.a)},
                                                 {"bf16.b", fingerprint(bf16.b)},
                                                 {"fp32.a", fingerprint(fp32.a)},
                                                 {"fp32.b", fingerprint(fp32.b)}};
    auto mm = [&](MatmulVariant v) {
      return std::vector<std::pair<std::string, Buffer>>{{"bf16.out", bf16.run(v)},
                                                         {"fp32.out", fp32.run(v)}};
    };
    save(dir / "matmul" / "truth.safetensors",
         {{"bf16.out", bf16.truth()}, {"fp32.out", fp32.truth()}}, "truth", "fp64", mm_inputs);
    save(dir / "matmul" / "ref.safetensors", mm(MatmulVariant::kReference), "ref",
         "fp32-accumulate", mm_inputs);
    save(dir / "matmul" / "reordered.safetensors", mm(MatmulVariant::kReordered), "test",
         "fp32-accumulate", mm_inputs);
    save(dir / "matmul" / "dropped_column.safetensors", mm(MatmulVariant::kDropColumn), "test",
         "fp32-accumulate", mm_inputs);

    std::vector<std::pair<std::string, AllreduceCase>> cases;
    for (double mag : {1.0, 16.0, 64.0, 256.0}) {
      cases.emplace_back("out.magnitude_" + std::to_string(static_cast<int>(mag)),
                         AllreduceCase(4, 4096, mag, 100 + static_cast<std::uint64_t>(mag)));
    }
    std::map<std::string, std::string> ar_inputs;
    for (const auto& [name, c] : cases) ar_inputs[name + ".residual"] = fingerprint(c.residual);
    auto ar = [&](auto make) {
      std::vector<std::pair<std::string, Buffer>> out;
      for (const auto& [name, c] : cases) out.emplace_back(name, make(c));
      return out;
    };
    save(dir / "allreduce" / "truth.safetensors",
         ar([](const AllreduceCase& c) { return c.truth(); }), "truth", "fp64", ar_inputs);
    save(dir / "allreduce" / "unfused.safetensors",
         ar([](const AllreduceCase& c) { return c.run(AllreduceVariant::kUnfused); }), "ref",
         "bf16", ar_inputs);
    save(dir / "allreduce" / "fused.safetensors",
         ar([](const AllreduceCase& c) { return c.run(AllreduceVariant::kFused); }), "test", "bf16",
         ar_inputs);
    save(dir / "allreduce" / "truncating.safetensors",
         ar([](const AllreduceCase& c) { return c.run(AllreduceVariant::kTruncating); }), "test",
         "bf16", ar_inputs);
  } catch (const numalign::Error& e) {
    std::fprintf(stderr, "make_example_traces: error: %s\n", e.what());
    return 2;
  }
  return 0;
}
