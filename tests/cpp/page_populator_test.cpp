// page_populator_test.cpp: the windows of file mappings mapped before the pass reads them
// (those read, and no others) and dropped once read, and buffers populated for writing, whole
// pages only.
#include "page_populator.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "numalign/judge.hpp"
#include "numalign/trace.hpp"
#include "temp_dir.hpp"

namespace numalign {
namespace {

using testing::TempDir;

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

// A trace of one U8 tensor "big" of three windows of 7s, written into `dir` and opened: one
// file, one mapping.
Trace three_window_trace(const TempDir& dir) {
  const std::string path = dir.file("big.safetensors");
  const std::vector<std::uint8_t> data(3 * detail::PagePopulator::kWindow, 7);
  write_trace(
      path,
      {{"big",
        TensorView{DType::U8, {data.size()}, reinterpret_cast<const std::byte*>(data.data())}}});
  Trace t = Trace::open(path);
  if (t.mappings().size() != 1) throw std::runtime_error("big.safetensors: not one mapping");
  return t;
}

TEST(PagePopulatorTest, MapsTheWindowsOfWhatIsReadAndNoOthers) {
  using detail::PagePopulator;
  TempDir dir;
  const Trace t = three_window_trace(dir);
  const auto mapped = t.mappings();
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

TEST(PagePopulatorTest, DropsAWindowOnceEveryAnnouncedByteOfItIsRead) {
  using detail::PagePopulator;
  constexpr std::size_t kWindow = PagePopulator::kWindow;
  TempDir dir;
  const Trace t = three_window_trace(dir);
  const auto mapped = t.mappings();
  const std::byte* base = mapped[0].data();
  const PagePopulator pages(mapped);
  // Two ranges announced: one across the end of window 0 into window 1, one inside window 1.
  // Window 2 is read without being announced.
  pages.will_read(base + kWindow - 100, 200);
  pages.will_read(base + kWindow + 5000, 10);
  pages.before_reading(base, 3 * kWindow);
  ASSERT_TRUE(page_mapped(base + kWindow / 2));
  ASSERT_TRUE(page_mapped(base + kWindow + kWindow / 2));
  ASSERT_TRUE(page_mapped(base + 2 * kWindow + kWindow / 2));
  // Reading the first range finishes window 0 (dropped) but not window 1 (10 bytes to go).
  pages.done_reading(base + kWindow - 100, 200);
  EXPECT_FALSE(page_mapped(base + kWindow / 2));
  EXPECT_TRUE(page_mapped(base + kWindow + kWindow / 2));
  pages.done_reading(base + kWindow + 5000, 10);
  EXPECT_FALSE(page_mapped(base + kWindow + kWindow / 2));
  EXPECT_TRUE(page_mapped(base + 2 * kWindow + kWindow / 2));  // never announced: kept
  // A dropped window reads the file's bytes again.
  const std::byte* big = t.find("big")->view.data;
  EXPECT_EQ(std::count(big, big + 3 * kWindow, std::byte{7}),
            static_cast<std::ptrdiff_t>(3 * kWindow));
}

TEST(PagePopulatorTest, AJudgeOfFilesLeavesNoneOfTheirDataMapped) {
  constexpr std::size_t kWindow = detail::PagePopulator::kWindow;
  TempDir dir;
  std::vector<float> values(kWindow / 2, 1.5f);  // each tensor 2 windows; 3 tensors a file
  const auto* bytes = reinterpret_cast<const std::byte*>(values.data());
  const TensorView v{DType::F32, {values.size()}, bytes};
  const std::vector<NamedTensor> tensors{{"a", v}, {"b", v}, {"c", v}};
  write_trace(dir.file("test.safetensors"), tensors);
  write_trace(dir.file("ref.safetensors"), tensors);
  const Trace test = Trace::open(dir.file("test.safetensors"));
  const Trace ref = Trace::open(dir.file("ref.safetensors"));
  const Report report = judge(test, ref, nullptr, JudgeOptions{});
  ASSERT_EQ(report.tensors.size(), 3u);
  for (const Trace* trace : {&test, &ref}) {
    for (const auto& e : trace->entries()) {
      for (std::size_t at = 0; at < e.view.nbytes(); at += kWindow / 4) {
        EXPECT_FALSE(page_mapped(e.view.data + at)) << e.name << " byte " << at;
      }
    }
  }
  // The traces still read as before.
  EXPECT_EQ(judge(test, ref, nullptr, JudgeOptions{}).tensors.size(), 3u);
  const float* c = reinterpret_cast<const float*>(ref.find("c")->view.data);
  EXPECT_EQ(c[values.size() - 1], 1.5f);
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
