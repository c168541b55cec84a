// trace_test.cpp: shards, entries in data order, and one malformed file of each kind with its
// specific message (writing and round trips: trace_writer_test.cpp).
#include "numalign/trace.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <simdjson.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>

#include "numalign/error.hpp"
#include "page_populator.hpp"
#include "temp_dir.hpp"

namespace numalign {
namespace {

namespace fs = std::filesystem;

using testing::TempDir;

std::vector<std::byte> bytes_of(const std::string& s) {
  std::vector<std::byte> b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}

// A file image: 8-byte length, header, data.
std::string file_image(const std::string& header, const std::string& data = "") {
  std::string out(8, '\0');
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + header + data;
}

TEST(TraceReadTest, ShardsFromADirectoryAndAnIndex) {
  TempDir dir;
  const float a[2] = {1, 2}, b[3] = {3, 4, 5};
  fs::create_directories(dir.file("ckpt"));
  write_trace(dir.file("ckpt/model-00001-of-00002.safetensors"),
              {{"a", {DType::F32, {2}, reinterpret_cast<const std::byte*>(a)}}});
  write_trace(dir.file("ckpt/model-00002-of-00002.safetensors"),
              {{"b", {DType::F32, {3}, reinterpret_cast<const std::byte*>(b)}}});
  std::ofstream(dir.file("ckpt/model.safetensors.index.json"))
      << R"({"metadata": {"total_size": 20}, "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})";
  for (const std::string& p : {dir.file("ckpt"), dir.file("ckpt/model.safetensors.index.json")}) {
    const Trace t = Trace::open(p);
    ASSERT_EQ(t.entries().size(), 2u) << p;
    ASSERT_NE(t.find("b"), nullptr);
    float v;
    std::memcpy(&v, t.find("b")->view.data + 8, 4);
    EXPECT_EQ(v, 5.0f);
  }
  // The same tensor in two shards is an error naming both.
  write_trace(dir.file("ckpt/model-00003.safetensors"),
              {{"a", {DType::F32, {2}, reinterpret_cast<const std::byte*>(a)}}});
  try {
    Trace::open(dir.file("ckpt"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.problem().find("is also in"), std::string::npos) << e.what();
  }
}

// The malformed-file corpus and its expected messages (tests/data/make_malformed.py).
TEST(TraceReadTest, EveryMalformedKindGetsItsMessage) {
  const fs::path corpus = fs::path(NUMALIGN_TEST_DATA) / "malformed";
  simdjson::dom::parser parser;
  simdjson::dom::object expected;
  ASSERT_FALSE(parser.load((corpus / "expected.json").string()).get(expected));
  std::size_t checked = 0;
  for (auto [file, want] : expected) {
    const std::string path = (corpus / std::string(file)).string();
    std::string_view message, prefix;
    const bool exact = !want["message"].get(message);
    if (!exact) {
      ASSERT_FALSE(want["prefix"].get(prefix)) << file;
    }
    try {
      Trace::open(path);
      ADD_FAILURE() << file << ": accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.where(), path);
      if (exact) {
        EXPECT_EQ(e.problem(), message) << file;
      } else {
        EXPECT_EQ(e.problem().rfind(prefix, 0), 0u) << file << ": " << e.problem();
      }
    }
    ++checked;
  }
  EXPECT_GE(checked, 30u);
}

TEST(TraceReadTest, WhatTheReferenceAcceptsWeAccept) {
  // The smallest valid file, whitespace around the JSON, zero-size dims, scalars,
  // unknown entry fields and a null __metadata__.
  for (
      const std::string& image :
      {file_image("{}"), file_image("  {}  "),
       file_image(
           R"({"__metadata__":null,"e":{"dtype":"F16","shape":[0,3],"data_offsets":[0,0],"extra":1},"s":{"dtype":"F64","shape":[],"data_offsets":[0,8]}})",
           std::string(8, 'a'))}) {
    const auto bytes = bytes_of(image);
    EXPECT_NO_THROW(Trace::parse(bytes, "ok.safetensors")) << image.substr(8);
  }
  EXPECT_EQ(file_image("{}").size(), 10u);
}

// Entries come out in data order and are found by name whatever order the header lists
// them in (here shuffled, with enough names to grow the name index many times over).
TEST(TraceReadTest, EntriesInDataOrderAndFoundByNameWhateverTheHeaderOrder) {
  constexpr int kTensors = 3000;
  std::vector<int> listed(kTensors);
  std::iota(listed.begin(), listed.end(), 0);
  std::mt19937 rng(5);
  std::shuffle(listed.begin(), listed.end(), rng);
  auto entry = [](int i) {
    return "\"tensor." + std::to_string(i) +
           "\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[" + std::to_string(4 * i) + "," +
           std::to_string(4 * i + 4) + "]}";
  };
  std::string header = "{";
  for (int i : listed) header += (header.size() > 1 ? "," : "") + entry(i);
  header += "}";
  std::string data(4 * kTensors, '\0');
  for (int i = 0; i < kTensors; ++i) std::memcpy(&data[4 * i], &i, 4);
  const auto bytes = bytes_of(file_image(header, data));
  const Trace t = Trace::parse(bytes, "shuffled.safetensors");
  ASSERT_EQ(t.entries().size(), static_cast<std::size_t>(kTensors));
  for (int i = 0; i < kTensors; ++i) {
    const std::string name = "tensor." + std::to_string(i);
    EXPECT_EQ(t.entries()[i].name, name);
    const TraceEntry* e = t.find(name);
    ASSERT_NE(e, nullptr) << name;
    int v;
    std::memcpy(&v, e->view.data, 4);
    EXPECT_EQ(v, i) << name;
  }
  EXPECT_EQ(t.find("tensor.3000"), nullptr);
  EXPECT_EQ(t.find("tensor."), nullptr);
  // A name listed twice is found among thousands.
  const auto twice =
      bytes_of(file_image(header.substr(0, header.size() - 1) + "," + entry(17) + "}", data));
  try {
    Trace::parse(twice, "twice.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.problem(),
              "tensor \"tensor.17\" appears twice in the header (names must be unique)");
  }
}

// The header is parsed in place when data follows it: bytes after the header are never
// read as JSON, even when they would continue it.
TEST(TraceReadTest, BytesAfterTheHeaderAreNotParsed) {
  const std::string header = R"({"x":{"dtype":"U8","shape":[80],"data_offsets":[0,80]}})";
  std::string data = R"(,"y":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  data.resize(80, ' ');
  const auto bytes = bytes_of(file_image(header, data));
  const Trace t = Trace::parse(bytes, "in_place.safetensors");
  ASSERT_EQ(t.entries().size(), 1u);
  EXPECT_EQ(std::memcmp(t.find("x")->view.data, data.data(), data.size()), 0);
  // A header cut short is an error, whatever the bytes after it would make of it.
  const auto cut = bytes_of(file_image(header.substr(0, header.size() - 1), "}" + data));
  EXPECT_THROW(Trace::parse(cut, "cut.safetensors"), Error);
}

TEST(TraceReadTest, PathProblemsNameThePath) {
  TempDir dir;
  try {
    Trace::open(dir.file("missing.safetensors"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), dir.file("missing.safetensors"));
    EXPECT_NE(e.problem().find("cannot open"), std::string::npos);
  }
  fs::create_directories(dir.file("empty_dir"));
  EXPECT_THROW(Trace::open(dir.file("empty_dir")), Error);
  std::ofstream(dir.file("zero.safetensors")).close();
  try {
    Trace::open(dir.file("zero.safetensors"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.problem().find("0 bytes"), std::string::npos);
  }
}

// Whether this process's page table maps the page at p (bit 63 of its /proc/self/pagemap
// entry; readable without privileges, which only hide the frame number).
bool page_mapped(const std::byte* p) {
  const int fd = ::open("/proc/self/pagemap", O_RDONLY);
  EXPECT_GE(fd, 0) << "cannot read /proc/self/pagemap";
  std::uint64_t entry = 0;
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto at = static_cast<off_t>(reinterpret_cast<std::uintptr_t>(p) / page * sizeof(entry));
  EXPECT_EQ(::pread(fd, &entry, sizeof(entry), at), static_cast<ssize_t>(sizeof(entry)));
  ::close(fd);
  return entry >> 63;
}

TEST(PagePopulatorTest, MapsTheWindowsOfWhatIsReadAndNoOthers) {
  using detail::PagePopulator;
  TempDir dir;
  const std::string path = dir.file("big.safetensors");
  std::vector<std::uint8_t> data(3 * PagePopulator::kWindow, 7);
  write_trace(
      path,
      {{"big",
        TensorView{DType::U8, {data.size()}, reinterpret_cast<const std::byte*>(data.data())}}});
  const Trace t = Trace::open(path);
  const auto mapped = t.mappings();
  ASSERT_EQ(mapped.size(), 1u);
  const std::byte* base = mapped[0].data();
  const PagePopulator pages(mapped);
  // A few bytes inside the second window map all of it, and nothing of the third.
  pages.before_reading(base + PagePopulator::kWindow + 100, 10);
  for (std::size_t at = PagePopulator::kWindow; at < 2 * PagePopulator::kWindow; at += 4096)
    ASSERT_TRUE(page_mapped(base + at)) << "byte " << at;
  EXPECT_FALSE(page_mapped(base + 2 * PagePopulator::kWindow + PagePopulator::kWindow / 2));
  // The last, partial window ends with the file; memory outside every mapping is left alone.
  pages.before_reading(base + mapped[0].size() - 1, 1);
  EXPECT_TRUE(page_mapped(base + mapped[0].size() - 1));
  const std::vector<std::byte> elsewhere(100);
  pages.before_reading(elsewhere.data(), elsewhere.size());
  // What is judged through the populated mapping reads the file's bytes.
  EXPECT_EQ(std::to_integer<int>(t.find("big")->view.data[PagePopulator::kWindow + 100]), 7);
}

TEST(PagePopulatorTest, PopulatesTheWholePagesOfABufferForWriting) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  void* m = ::mmap(nullptr, 16 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* base = static_cast<std::byte*>(m);
  // From the middle of page 2 to the middle of page 9: pages 3 to 8 are whole.
  detail::populate_for_writing(base + 2 * page + page / 2, 7 * page);
  EXPECT_FALSE(page_mapped(base + 2 * page));
  for (std::size_t k = 3; k <= 8; ++k) EXPECT_TRUE(page_mapped(base + k * page)) << "page " << k;
  EXPECT_FALSE(page_mapped(base + 9 * page));
  // Populated pages read as zeros, as fresh anonymous memory does.
  EXPECT_EQ(std::count(base + 3 * page, base + 9 * page, std::byte{0}),
            static_cast<std::ptrdiff_t>(6 * page));
  ::munmap(m, 16 * page);
}

}  // namespace
}  // namespace numalign
