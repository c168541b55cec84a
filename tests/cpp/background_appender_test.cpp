// background_appender_test.cpp: bytes appended through two tiny staging blocks land in order
// at their offsets, whatever the sizes; the caller's buffer is reusable once append returns;
// an appender destroyed with blocks in flight stops cleanly (also run under ThreadSanitizer
// while it was written: no report).
#include "background_appender.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <vector>

namespace numalign::detail {
namespace {

std::size_t piece_size(int i) { return 1 + static_cast<std::size_t>(i * 37) % 1000; }

TEST(BackgroundAppenderTest, PiecesLandInOrderAtTheirOffsets) {
  for (int round = 0; round < 20; ++round) {
    const int fd = ::open(std::filesystem::temp_directory_path().c_str(), O_TMPFILE | O_RDWR, 0600);
    ASSERT_GE(fd, 0);
    std::uint64_t total = 0;
    {
      BackgroundAppender a(fd, 4096, "test", {64, 2, 1000});
      std::vector<char> buffer(1000);
      for (int i = 0; i < 200; ++i) {
        std::memset(buffer.data(), i, buffer.size());  // reused for every piece
        a.append(buffer.data(), piece_size(i));
        total += piece_size(i);
      }
      if (round % 2 == 0) a.finish();  // odd rounds: destroyed with blocks in flight
    }
    if (round % 2 == 0) {
      struct stat st {};
      ASSERT_EQ(::fstat(fd, &st), 0);
      ASSERT_EQ(static_cast<std::uint64_t>(st.st_size), 4096 + total);
      std::vector<char> back(total);
      ASSERT_EQ(::pread(fd, back.data(), total, 4096), static_cast<ssize_t>(total));
      std::uint64_t at = 0;
      for (int i = 0; i < 200; ++i) {
        for (std::size_t k = 0; k < piece_size(i); ++k) {
          ASSERT_EQ(back[at + k], static_cast<char>(i)) << "piece " << i << " byte " << k;
        }
        at += piece_size(i);
      }
    }
    ::close(fd);
  }
}

}  // namespace
}  // namespace numalign::detail
