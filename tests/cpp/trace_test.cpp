// trace_test.cpp: shards, entries in data order, and one malformed file of each kind with its
// specific message (writing and round trips: trace_writer_test.cpp).
#include "numalign/trace.hpp"

#include <gtest/gtest.h>
#include <simdjson.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <thread>

#include "numalign/error.hpp"
#include "temp_dir.hpp"

namespace numalign {
namespace {

namespace fs = std::filesystem;

using testing::TempDir;

std::string json_string_for_test(const std::string& s) {
  std::string out = "\"";
  for (char c : s) out += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
  return out + "\"";
}

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
  // Bytes a caller owns are read, never dropped or changed (a file's header pages are).
  EXPECT_EQ(bytes, bytes_of(file_image(header, data)));
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

// The index of names is built by the first find(), not kept from opening: threads that look
// names up at once all find them, and a copy of the trace finds its own entries.
TEST(TraceReadTest, NamesAreFoundFromManyThreadsAndInCopies) {
  constexpr int kTensors = 2000;
  std::string header = "{";
  for (int i = kTensors - 1; i >= 0; --i) {  // listed against data order: the entries move
    header += (header.size() > 1 ? "," : "") + ("\"t" + std::to_string(i) + "\"") +
              ":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[" + std::to_string(4 * i) + "," +
              std::to_string(4 * i + 4) + "]}";
  }
  header += "}";
  std::string data(4 * kTensors, '\0');
  for (int i = 0; i < kTensors; ++i) std::memcpy(&data[4 * i], &i, 4);
  const auto bytes = bytes_of(file_image(header, data));
  const Trace t = Trace::parse(bytes, "names.safetensors");
  std::vector<int> wrong(4, 0);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int j = 0; j < kTensors; ++j) {
        const int i = (j * 7 + k * 500) % kTensors;
        const TraceEntry* e = t.find("t" + std::to_string(i));
        int v = -1;
        if (e) std::memcpy(&v, e->view.data, 4);
        wrong[k] += v != i;
      }
      wrong[k] += t.find("t" + std::to_string(kTensors)) != nullptr;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong, std::vector<int>(4, 0));
  const Trace copy = t;
  for (int i : {0, 1, 999, kTensors - 1}) {
    const TraceEntry* e = copy.find("t" + std::to_string(i));
    ASSERT_NE(e, nullptr);
    EXPECT_GE(e, copy.entries().data());
    EXPECT_LT(e, copy.entries().data() + copy.entries().size()) << "an entry of the copy";
    EXPECT_EQ(e->name, "t" + std::to_string(i));
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

// ---- hostile inputs (issue 20) ----

std::string problem_of(const std::string& path) {
  try {
    Trace::open(path);
  } catch (const Error& e) {
    return e.problem();
  }
  return "(accepted)";
}

void write_small_trace(const std::string& path, const std::string& name) {
  static const float v[2] = {1, 2};
  write_trace(path, {{name, {DType::F32, {2}, reinterpret_cast<const std::byte*>(v)}}});
}

TEST(TraceHostileTest, AnIndexMayNameOnlyFilesInsideItsFolder) {
  TempDir dir;
  fs::create_directories(dir.file("ckpt"));
  write_small_trace(dir.file("outside.safetensors"), "w");
  write_small_trace(dir.file("ckpt/in.safetensors"), "v");
  fs::create_symlink(dir.file("outside.safetensors"), dir.file("ckpt/escape.safetensors"));
  const std::string index = dir.file("ckpt/model.safetensors.index.json");
  auto index_naming = [&](const std::string& shard) {
    std::ofstream(index) << R"({"weight_map": {"v": "in.safetensors", "w": )"
                         << std::string(json_string_for_test(shard)) << "}}";
    return problem_of(index);
  };
  for (const std::string& shard :
       std::vector<std::string>{"../outside.safetensors", dir.file("outside.safetensors"),
                                "sub/../../outside.safetensors", "escape.safetensors",
                                "../../../../../../etc/passwd", "/etc/passwd"}) {
    const std::string problem = index_naming(shard);
    EXPECT_NE(problem.find("outside the index's folder"), std::string::npos)
        << shard << ": " << problem;
    EXPECT_EQ(problem.find("header length"), std::string::npos) << "never read: " << problem;
  }
  // Inside the folder, through a sub-folder or a link that stays inside, is fine.
  fs::create_directories(dir.file("ckpt/sub"));
  write_small_trace(dir.file("ckpt/sub/w.safetensors"), "w");
  fs::create_symlink("sub/w.safetensors", dir.file("ckpt/inner_link.safetensors"));
  EXPECT_EQ(index_naming("sub/w.safetensors"), "(accepted)");
  EXPECT_EQ(index_naming("./sub/../sub/w.safetensors"), "(accepted)");
  EXPECT_EQ(index_naming("inner_link.safetensors"), "(accepted)");
}

TEST(TraceHostileTest, PathsEqualAfterNormalisationAreOneShard) {
  TempDir dir;
  const float v[2] = {1, 2};
  write_trace(dir.file("a.safetensors"),
              {{"x", {DType::F32, {2}, reinterpret_cast<const std::byte*>(v)}},
               {"y", {DType::F32, {2}, reinterpret_cast<const std::byte*>(v)}}});
  const std::string index = dir.file("m.safetensors.index.json");
  std::ofstream(index)
      << R"({"weight_map": {"x": "a.safetensors", "y": "./a.safetensors", "z": "sub/../a.safetensors"}})";
  const Trace t = Trace::open(index);
  EXPECT_EQ(t.files().size(), 1u);
  EXPECT_EQ(t.entries().size(), 2u);
}

// simdjson's DOM counts an array's elements up to 0xFFFFFF, which means "that many or
// more": a shape of more dimensions (33 MB of header, under the 100 MB limit) is read whole,
// never written past the room made for it.
TEST(TraceHostileTest, AShapePastWhatTheParserCountsIsReadWhole) {
  for (const std::size_t rank :
       {std::size_t{0xFFFFFE}, std::size_t{0xFFFFFF}, std::size_t{0x1000001}}) {
    std::string shape;
    shape.reserve(2 * rank + 2);
    shape += '[';
    for (std::size_t i = 0; i < rank; ++i) shape += i ? ",1" : "1";
    shape += ']';
    const auto bytes = bytes_of(file_image(
        R"({"x":{"dtype":"F32","shape":)" + shape + R"(,"data_offsets":[0,4]}})", "abcd"));
    const Trace t = Trace::parse(bytes, "rank.safetensors");
    ASSERT_EQ(t.entries().size(), 1u);
    const Shape& s = t.entries()[0].view.shape;
    EXPECT_EQ(s.size(), rank);
    EXPECT_EQ(std::count(s.begin(), s.end(), 1u), static_cast<std::ptrdiff_t>(rank));
    EXPECT_EQ(t.entries()[0].view.numel(), 1u);
  }
}

TEST(TraceHostileTest, OnlyRegularFilesAreRead) {
  TempDir dir;
  const std::string fifo = dir.file("f.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(problem_of(fifo).find("not a regular file"), std::string::npos) << problem_of(fifo);
  // Through an index (the index checked before any shard is opened) and a folder's link.
  fs::create_directories(dir.file("ckpt"));
  fs::create_symlink(fifo, dir.file("ckpt/link.safetensors"));
  EXPECT_NE(problem_of(dir.file("ckpt")).find("not a regular file"), std::string::npos);
  const std::string fifo_in = dir.file("ckpt/p.safetensors");
  ASSERT_EQ(::mkfifo(fifo_in.c_str(), 0600), 0);
  const std::string index = dir.file("ckpt/m.safetensors.index.json");
  std::ofstream(index) << R"({"weight_map": {"a": "p.safetensors"}})";
  EXPECT_NE(problem_of(index).find("not a regular file"), std::string::npos) << problem_of(index);
  // The index itself a FIFO.
  const std::string fifo_index = dir.file("f.safetensors.index.json");
  ASSERT_EQ(::mkfifo(fifo_index.c_str(), 0600), 0);
  EXPECT_NE(problem_of(fifo_index).find("not a regular file"), std::string::npos)
      << problem_of(fifo_index);
}

TEST(TraceHostileTest, ErrorsNeverPrintTheBytesOfAFileThatIsNotATrace) {
  TempDir dir;
  for (const std::string& text :
       {std::string("root:x:0:0:root:/root:/bin/bash\n"), std::string("ab\0\0\0\0\0\0xyz", 11)}) {
    const std::string path = dir.file("not_a_trace");
    std::ofstream(path, std::ios::binary) << text;
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<std::uint8_t>(text[i]);
    const std::string problem = problem_of(path);
    EXPECT_EQ(problem.find(std::to_string(n)), std::string::npos) << problem;
    EXPECT_NE(problem.find("not a safetensors file"), std::string::npos) << problem;
  }
}

// serde_json, as the reference parser reads a shape into usize, refuses these.
TEST(TraceHostileTest, ShapesHoldOnlyNonNegativeIntegers) {
  for (const char* dim : {"-0", "0.0", "1.0", "1e0", "-1", "-18"}) {
    const std::string header =
        std::string(R"({"x":{"dtype":"U8","shape":[)") + dim + R"(],"data_offsets":[0,0]}})";
    const auto bytes = bytes_of(file_image(header));
    try {
      Trace::parse(bytes, "s.safetensors");
      ADD_FAILURE() << dim << ": accepted";
    } catch (const Error& e) {
      EXPECT_NE(e.problem().find("non-negative integers"), std::string::npos) << e.problem();
    }
  }
  const auto zero =
      bytes_of(file_image(R"({"x":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})"));
  EXPECT_EQ(Trace::parse(zero, "z.safetensors").entries().size(), 1u);
}

// A file's header pages are dropped once parsed; the check for "-0", which reads the header a
// second time, still finds one at its end, and a name holding "-0" is no number.
TEST(TraceHostileTest, ANegativeZeroAtTheEndOfALargeFileHeaderIsFound) {
  TempDir dir;
  std::string header = "{";
  for (int i = 0; i < 20000; ++i) {
    header += "\"t-0." + std::to_string(i) +
              "\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]},";
  }
  const std::string good = header + R"("x":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})";
  const std::string bad = header + R"("x":{"dtype":"U8","shape":[-0],"data_offsets":[0,0]}})";
  for (const auto& [name, text] : {std::pair{"good", good}, std::pair{"bad", bad}}) {
    const std::string path = dir.file(std::string(name) + ".safetensors");
    std::ofstream(path, std::ios::binary) << file_image(text);
  }
  EXPECT_EQ(Trace::open(dir.file("good.safetensors")).entries().size(), 20001u);
  try {
    Trace::open(dir.file("bad.safetensors"));
    ADD_FAILURE() << "-0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.problem().find("non-negative integers"), std::string::npos) << e.problem();
  }
}

}  // namespace
}  // namespace numalign
