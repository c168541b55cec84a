// page_populator_test.cpp: the windows of file mappings mapped before the pass reads them
// (those read, and no others), and buffers populated for writing, whole pages only.
#include "page_populator.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <vector>

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
