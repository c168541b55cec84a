// trace_writer_test.cpp: the reference serializer's layout, write -> read round trips of every
// dtype, and atomic writes that leave the previous file whole.
#include "numalign/trace_writer.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "numalign/error.hpp"
#include "numalign/trace.hpp"
#include "temp_dir.hpp"

namespace numalign {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(TraceWriteTest, HeaderMatchesTheReferenceSerializer) {
  // The reference's own unit test: F32 [1, 2, 3] named attn.0, no metadata.
  std::vector<float> values{0, 1, 2, 3, 4, 5};
  const TensorView v{DType::F32, {1, 2, 3}, reinterpret_cast<const std::byte*>(values.data())};
  const std::string header = serialize_header({{"attn.0", v}}, nullptr);
  // 64 bytes: already a multiple of 8, so no padding (the reference's bytes start with 64).
  EXPECT_EQ(header, R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})");
  EXPECT_EQ(header.size() % 8, 0u);
  // Empty with one metadata key, as in the reference's test_empty.
  const std::map<std::string, std::string> meta{{"framework", "pt"}};
  EXPECT_EQ(serialize_header({}, &meta),
            std::string(R"({"__metadata__":{"framework":"pt"}})") + "     ");
  EXPECT_EQ(serialize_header({}, nullptr), "{}      ");
}

TEST(TraceWriteTest, EntriesOrderedByDtypeDescendingThenName) {
  const std::byte data[8] = {};
  const std::string h = serialize_header({{"b", {DType::U8, {1}, data}},
                                          {"a", {DType::U8, {1}, data}},
                                          {"z", {DType::F64, {1}, data}},
                                          {"m", {DType::BF16, {1}, data}}},
                                         nullptr);
  EXPECT_LT(h.find("\"z\""), h.find("\"m\""));
  EXPECT_LT(h.find("\"m\""), h.find("\"a\""));
  EXPECT_LT(h.find("\"a\""), h.find("\"b\""));
  EXPECT_NE(h.find(R"("z":{"dtype":"F64","shape":[1],"data_offsets":[0,8]})"), std::string::npos);
  EXPECT_NE(h.find(R"("b":{"dtype":"U8","shape":[1],"data_offsets":[11,12]})"), std::string::npos);
}

TEST(TraceWriteTest, RoundTripOfEveryDtypeAndMetadata) {
  TempDir dir;
  std::vector<std::vector<std::byte>> storage;
  std::vector<NamedTensor> tensors;
  for (int i = 0; i < kDTypeCount; ++i) {
    const auto d = static_cast<DType>(i);
    const std::uint64_t numel = bits(d) < 8 ? 8 : 3;  // packed types fill whole bytes
    std::vector<std::byte> b(numel * static_cast<std::uint64_t>(bits(d)) / 8);
    for (std::size_t k = 0; k < b.size(); ++k) b[k] = static_cast<std::byte>(k * 37 + i);
    storage.push_back(std::move(b));
    tensors.push_back({"t." + std::string(name(d)), {d, {numel}, storage.back().data()}});
  }
  const float scalar = 2.5f;  // a 0-d tensor holds one element
  tensors.push_back({"scalar", {DType::F32, {}, reinterpret_cast<const std::byte*>(&scalar)}});
  tensors.push_back({"empty", {DType::F16, {0, 4}, nullptr}});
  TraceMetadata meta;
  meta.role = "test";
  meta.seed = 42;
  meta.order = {"scalar", "empty"};
  meta.tf32 = {{"matmul", false}};
  const std::map<std::string, std::string> header{{kMetadataKey, meta.to_json()}, {"format", "pt"}};
  const std::string path = dir.file("all.safetensors");
  write_trace(path, tensors, &header);
  const Trace t = Trace::open(path);
  ASSERT_EQ(t.entries().size(), tensors.size());
  for (const auto& w : tensors) {
    const TraceEntry* e = t.find(w.name);
    ASSERT_NE(e, nullptr) << w.name;
    EXPECT_EQ(e->view.dtype, w.view.dtype);
    EXPECT_EQ(e->view.shape, w.view.shape);
    ASSERT_EQ(e->view.nbytes(), w.view.nbytes());
    if (w.view.nbytes()) {
      EXPECT_EQ(std::memcmp(e->view.data, w.view.data, w.view.nbytes()), 0) << w.name;
    }
  }
  ASSERT_TRUE(t.metadata());
  EXPECT_EQ(t.metadata()->role, "test");
  EXPECT_EQ(t.metadata()->seed, 42);
  EXPECT_EQ(t.metadata()->order, meta.order);
  EXPECT_EQ(t.raw_metadata().at("format"), "pt");
}

TEST(TraceWriteTest, FailedWriteLeavesThePreviousFileIntact) {
  TempDir dir;
  const std::string path = dir.file("keep.safetensors");
  const std::byte data[4] = {};
  write_trace(path, {{"x", {DType::F32, {1}, data}}}, nullptr);
  const auto before = fs::file_size(path);
  // A tensor named __metadata__ is refused before anything is written.
  EXPECT_THROW(write_trace(path, {{"__metadata__", {DType::F32, {1}, data}}}, nullptr), Error);
  EXPECT_EQ(fs::file_size(path), before);
  EXPECT_NO_THROW(Trace::open(path));
  for (const auto& e : fs::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos)
        << "temp file left behind";
  }
}

TEST(TraceWriteTest, FileStartsWithTheHeaderLengthAndHoldsTheDataInHeaderOrder) {
  TempDir dir;
  const std::uint8_t u8[3] = {7, 8, 9};
  const double f64 = -1.5;
  const std::vector<NamedTensor> tensors{
      {"small", {DType::U8, {3}, reinterpret_cast<const std::byte*>(u8)}},
      {"wide", {DType::F64, {}, reinterpret_cast<const std::byte*>(&f64)}}};
  const std::string path = dir.file("t.safetensors");
  write_trace(path, tensors);
  const std::string header = serialize_header(tensors, nullptr);
  const std::string file = read_all(path);
  ASSERT_EQ(file.size(), 8 + header.size() + 8 + 3);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<std::uint8_t>(file[i]);
  EXPECT_EQ(n, header.size());
  EXPECT_EQ(file.substr(8, header.size()), header);
  // F64 sorts before U8: its 8 bytes come first.
  double back;
  std::memcpy(&back, file.data() + 8 + header.size(), 8);
  EXPECT_EQ(back, f64);
  EXPECT_EQ(file.substr(8 + header.size() + 8), "\x07\x08\x09");
}

TEST(TraceWriteTest, ANameGivenTwiceIsRefused) {
  const std::byte data[4] = {};
  try {
    serialize_header({{"x", {DType::F32, {1}, data}}, {"x", {DType::F32, {1}, data}}}, nullptr);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "x");
    EXPECT_EQ(e.problem(), "tensor name given twice");
  }
}

TEST(WriteFileAtomicTest, ReplacesTheWholeFileReadableByAll) {
  TempDir dir;
  const std::string path = dir.file("report.txt");
  write_file_atomic(path, "a longer first version\n");
  write_file_atomic(path, "short\n");
  EXPECT_EQ(read_all(path), "short\n");
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  for (const auto& e : fs::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().filename(), "report.txt") << "only the target is left";
  }
}

TEST(WriteFileAtomicTest, AMissingFolderIsAnErrorNamingThePath) {
  TempDir dir;
  const std::string path = dir.file("no/such/folder/report.txt");
  try {
    write_file_atomic(path, "x");
    FAIL() << "written";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), path);
    EXPECT_EQ(e.problem().rfind("cannot create a temporary file: ", 0), 0u) << e.problem();
  }
}

// The streaming writer writes the same bytes as write_trace, whatever order tensors arrive
// in, and leaves nothing behind but the finished file.
TEST(TraceStreamWriterTest, SameBytesAsWriteTraceAndNothingElseLeft) {
  const TempDir dir;
  std::vector<float> a{1, 2, 3, 4};
  std::vector<std::uint16_t> b{7, 8, 9};
  std::vector<double> c{0.5};
  const TensorView va{DType::F32, {2, 2}, reinterpret_cast<const std::byte*>(a.data())};
  const TensorView vb{DType::BF16, {3}, reinterpret_cast<const std::byte*>(b.data())};
  const TensorView vc{DType::F64, {}, reinterpret_cast<const std::byte*>(c.data())};
  const std::map<std::string, std::string> meta{{"numalign", "{\"role\":\"ref\"}"}};
  write_trace(dir.file("whole.safetensors"), {{"z.a", va}, {"b", vb}, {"c", vc}}, &meta);
  TraceStreamWriter w(dir.file("streamed.safetensors"));
  w.add("b", vb);
  w.add("c", vc);
  w.add("z.a", va);
  EXPECT_THROW(w.add("b", vb), Error);
  EXPECT_THROW(w.add("__metadata__", vb), Error);
  EXPECT_FALSE(fs::exists(dir.file("streamed.safetensors"))) << "nothing under the name yet";
  w.close(&meta);
  EXPECT_EQ(read_all(dir.file("streamed.safetensors")), read_all(dir.file("whole.safetensors")));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 2);
  EXPECT_THROW(w.add("d", vb), Error);
}

TEST(TraceStreamWriterTest, AbortLeavesThePreviousFileAsItWas) {
  const TempDir dir;
  const std::string path = dir.file("t.safetensors");
  std::ofstream(path) << "previous";
  std::vector<float> a(1000, 1.0f);
  {
    TraceStreamWriter w(path);
    w.add("a", TensorView{DType::F32, {1000}, reinterpret_cast<const std::byte*>(a.data())});
    // Destroyed without close: an exception in the middle of a capture.
  }
  EXPECT_EQ(read_all(path), "previous");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
}

// A large trace's data is written once, where it first lands (arrival order, after a header
// padded with JSON whitespace to the reserve): the reference reader's rules still hold
// (offsets back to back from 0, the header JSON), and every tensor reads back bit for bit,
// including one that spans many staging blocks.
StreamOptions written_once_options() {
  StreamOptions o;
  o.header_reserve = 4096;
  o.reference_layout_below = 0;
  o.staging_block_bytes = 64;  // tensors cross blocks, and the blocks are reused
  o.staging_blocks = 2;
  return o;
}

TEST(TraceStreamWriterTest, LargeTracesAreWrittenOnceInArrivalOrder) {
  const TempDir dir;
  std::vector<double> big(1000);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = 0.5 * static_cast<double>(i) - 7;
  std::vector<float> small{1.5f, -2.0f};
  std::vector<std::int64_t> ids{3, 1, 4, 1};
  const TensorView vb{DType::F64, {10, 100}, reinterpret_cast<const std::byte*>(big.data())};
  const TensorView vs{DType::F32, {2}, reinterpret_cast<const std::byte*>(small.data())};
  const TensorView vi{DType::I64, {4}, reinterpret_cast<const std::byte*>(ids.data())};
  const std::string path = dir.file("t.safetensors");
  const std::map<std::string, std::string> meta{{"numalign", "{\"seed\":0}"}};
  TraceStreamWriter w(path, written_once_options());
  w.add("z.big", vb);
  big.assign(big.size(), 99.0);  // the caller may change its bytes once add returns
  w.add("a.small", vs);
  w.add("ids", vi);
  w.close(&meta);
  EXPECT_TRUE(w.written_once());
  const std::string bytes = read_all(path);
  std::uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  EXPECT_EQ(header_size, 4096u - 8) << "the header fills the reserve";
  EXPECT_EQ(bytes.size(), 4096u + 8000 + 8 + 32);
  EXPECT_LT(bytes.find("\"z.big\""), bytes.find("\"a.small\"")) << "arrival order in the header";
  const Trace t = Trace::open(path);
  ASSERT_EQ(t.entries().size(), 3u);
  EXPECT_EQ(t.entries()[0].name, "z.big") << "file order is arrival order";
  const auto* e = t.find("z.big");
  ASSERT_NE(e, nullptr);
  for (std::size_t i = 0; i < 1000; ++i) {
    double v = 0;
    std::memcpy(&v, e->view.data + 8 * i, 8);
    ASSERT_EQ(v, 0.5 * static_cast<double>(i) - 7) << i;
  }
  EXPECT_EQ(std::memcmp(t.find("a.small")->view.data, small.data(), 8), 0);
  EXPECT_EQ(std::memcmp(t.find("ids")->view.data, ids.data(), 32), 0);
  ASSERT_TRUE(t.metadata().has_value());
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
}

// Where writing once would break the format or its alignment, the trace is rewritten in the
// reference serializer's layout: the same bytes as write_trace.
TEST(TraceStreamWriterTest, RewrittenInTheReferenceLayoutWhenWritingOnceCannotBe) {
  const TempDir dir;
  std::vector<std::uint16_t> odd{1, 2, 3};  // 6 bytes: what follows would be misaligned
  std::vector<float> f{4, 5};
  const TensorView vo{DType::BF16, {3}, reinterpret_cast<const std::byte*>(odd.data())};
  const TensorView vf{DType::F32, {2}, reinterpret_cast<const std::byte*>(f.data())};
  write_trace(dir.file("whole.safetensors"), {{"odd", vo}, {"f", vf}});
  {
    TraceStreamWriter w(dir.file("misaligned.safetensors"), written_once_options());
    w.add("odd", vo);
    w.add("f", vf);
    w.close();
    EXPECT_FALSE(w.written_once());
  }
  EXPECT_EQ(read_all(dir.file("misaligned.safetensors")), read_all(dir.file("whole.safetensors")));

  // A header larger than the reserve: 200 long names.
  std::vector<NamedTensor> many;
  for (int i = 0; i < 200; ++i) many.push_back({"tensor.number." + std::to_string(i), vf});
  write_trace(dir.file("many.safetensors"), many);
  {
    TraceStreamWriter w(dir.file("streamed.safetensors"), written_once_options());
    for (const auto& t : many) w.add(t.name, t.view);
    w.close();
    EXPECT_FALSE(w.written_once());
  }
  EXPECT_EQ(read_all(dir.file("streamed.safetensors")), read_all(dir.file("many.safetensors")));

  // A reserve past the readers' cap on a header (100 MB): padding it would make a file they
  // refuse.
  StreamOptions huge = written_once_options();
  huge.header_reserve = std::uint64_t{128} << 20;
  {
    TraceStreamWriter w(dir.file("huge_reserve.safetensors"), huge);
    for (const auto& t : many) w.add(t.name, t.view);
    w.close();
    EXPECT_FALSE(w.written_once());
  }
  EXPECT_EQ(read_all(dir.file("huge_reserve.safetensors")), read_all(dir.file("many.safetensors")));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 5);
}

// A FIFO is written through: the data waits in an unnamed side file, then goes down the pipe
// in the reference layout, and the FIFO stays a FIFO.
TEST(TraceStreamWriterTest, AFifoGetsTheReferenceLayoutThroughThePipe) {
  const TempDir dir;
  std::vector<float> a(100000, 0.5f);
  std::vector<std::uint16_t> b{7, 8, 9};
  const TensorView va{DType::F32, {100000}, reinterpret_cast<const std::byte*>(a.data())};
  const TensorView vb{DType::BF16, {3}, reinterpret_cast<const std::byte*>(b.data())};
  write_trace(dir.file("whole.safetensors"), {{"a", va}, {"b", vb}});
  const std::string fifo = dir.file("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string got;
  std::thread reader([&] { got = read_all(fifo); });
  {
    TraceStreamWriter w(fifo, written_once_options());
    w.add("b", vb);
    w.add("a", va);
    w.close();
    EXPECT_FALSE(w.written_once());
  }
  reader.join();
  EXPECT_EQ(got, read_all(dir.file("whole.safetensors")));
  struct stat st {};
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 2);
}

// A write that fails in the background (here: past the largest file the file system takes)
// is reported by the next add() or close(), naming the file; the target is left alone.
TEST(TraceStreamWriterTest, AWriteErrorNamesTheFileAndLeavesItAlone) {
  const TempDir dir;
  const std::string path = dir.file("t.safetensors");
  std::ofstream(path) << "previous";
  std::vector<float> a(4096, 1.0f);
  const TensorView va{DType::F32, {4096}, reinterpret_cast<const std::byte*>(a.data())};
  StreamOptions o = written_once_options();
  o.header_reserve = std::uint64_t{1} << 62;  // past any file system's largest file
  try {
    TraceStreamWriter w(path, o);
    for (int i = 0; i < 50; ++i) w.add("a" + std::to_string(i), va);
    w.close();
    FAIL() << "written";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), path);
    EXPECT_NE(e.problem().find("cannot write tensor data"), std::string::npos) << e.problem();
  }
  EXPECT_EQ(read_all(path), "previous");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
}

}  // namespace
}  // namespace numalign
