// atomic_file.hpp: a file written under a temporary name beside its target and renamed
// into place only once complete, so that a crash never leaves a partial file there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace numalign::detail {

// The temporary file is created in the target's folder (a rename is atomic only within one
// file system) as ".<name>.tmp.XXXXXX". Every failure throws Error naming the target.
class AtomicFile {
 public:
  explicit AtomicFile(std::string target);
  // Removes the temporary file unless it was committed.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Appends n bytes (retrying short writes and EINTR).
  void write(const void* data, std::size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  // Appends n bytes of the open file `fd` from `offset`, copied in the kernel where the file
  // systems allow it (copy_file_range), else through a small buffer.
  void append_from(int fd, std::uint64_t offset, std::uint64_t n);
  // Makes the file readable by all (0644), flushes it to disk and renames it over the target.
  void commit();
  // Removes the temporary file now; the target is left as it was.
  void abort();

  const std::string& target() const { return target_; }

 private:
  void close_fd();
  std::string target_, tmp_;
  int fd_ = -1;
  bool done_ = false;  // committed or aborted: nothing left to remove
};

}  // namespace numalign::detail
