// regular_file.cpp: see regular_file.hpp.
#include "regular_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "numalign/error.hpp"

namespace numalign::detail {

void check_path(const std::string& path) {
  if (path.empty()) fail(path, "an empty path names no file");
  if (path.find('\0') != std::string::npos) {
    fail(path, "the path holds a NUL byte: no file has such a name");
  }
}

int open_regular_file(const std::string& path, struct stat& st, const std::string& what) {
  check_path(path);
  if (::stat(path.c_str(), &st) != 0)
    fail(path, std::string("cannot open: ") + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) fail(path, "is a directory, not a " + what);
  if (!S_ISREG(st.st_mode))
    fail(path, "not a regular file (a FIFO, device or socket is never read)");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, "not a regular file (a FIFO, device or socket is never read)");
  }
  return fd;
}

std::string read_regular_file(const std::string& path, const std::string& what,
                              std::size_t max_bytes) {
  struct stat st {};
  const int fd = open_regular_file(path, st, what);
  const auto too_large = [&] {
    ::close(fd);
    fail(path, "a " + what + " of more than " + std::to_string(max_bytes >> 20) +
                   " MiB: refused (is it the right file?)");
  };
  if (static_cast<std::size_t>(st.st_size) > max_bytes) too_large();
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t k = ::read(fd, buf, sizeof buf);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) {
      const int e = errno;
      ::close(fd);
      fail(path, std::string("cannot read: ") + std::strerror(e));
    }
    if (k == 0) break;
    if (out.size() + static_cast<std::size_t>(k) > max_bytes) too_large();
    out.append(buf, static_cast<std::size_t>(k));
  }
  ::close(fd);
  return out;
}

}  // namespace numalign::detail
