// atomic_file.cpp: temporary file, fsync and rename, for every file the library writes.
#include "atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "numalign/error.hpp"

namespace numalign::detail {

AtomicFile::AtomicFile(std::string target) : target_(std::move(target)) {
  namespace fs = std::filesystem;
  const fs::path p(target_);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::string pattern = (dir / ("." + p.filename().string() + ".tmp.XXXXXX")).string();
  fd_ = ::mkstemp(pattern.data());
  if (fd_ < 0)
    fail(target_, std::string("cannot create a temporary file: ") + std::strerror(errno));
  tmp_ = std::move(pattern);
}

AtomicFile::~AtomicFile() {
  close_fd();
  if (!done_) ::unlink(tmp_.c_str());
}

void AtomicFile::close_fd() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void AtomicFile::write(const void* data, std::size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = ::write(fd_, p, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      fail(target_, std::string("write failed: ") + std::strerror(errno));
    }
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

void AtomicFile::append_from(int fd, std::uint64_t offset, std::uint64_t n) {
  auto at = static_cast<off_t>(offset);
  while (n > 0) {
    const ssize_t k = ::copy_file_range(fd, &at, fd_, nullptr, n, 0);
    if (k > 0) {
      n -= static_cast<std::uint64_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k == 0) fail(target_, "the data to copy ended early");
    break;  // not supported between these files: copy through a buffer
  }
  std::vector<char> buffer(std::min<std::uint64_t>(n, 1 << 20));
  while (n > 0) {
    const ssize_t k = ::pread(fd, buffer.data(), std::min<std::uint64_t>(n, buffer.size()), at);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) fail(target_, std::string("cannot read the data to copy: ") + std::strerror(errno));
    write(buffer.data(), static_cast<std::size_t>(k));
    at += k;
    n -= static_cast<std::uint64_t>(k);
  }
}

void AtomicFile::commit() {
  if (::fchmod(fd_, 0644) != 0 || ::fsync(fd_) != 0) {
    fail(target_, std::string("cannot flush: ") + std::strerror(errno));
  }
  close_fd();
  if (::rename(tmp_.c_str(), target_.c_str()) != 0) {
    fail(target_, std::string("cannot rename into place: ") + std::strerror(errno));
  }
  done_ = true;
}

void AtomicFile::abort() {
  close_fd();
  if (!done_) ::unlink(tmp_.c_str());
  done_ = true;
}

}  // namespace numalign::detail
