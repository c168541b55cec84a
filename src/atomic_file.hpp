// atomic_file.hpp: every file the library writes. A regular file (or a new one) is written
// under a temporary name beside its target and renamed into place only once complete, so that
// a crash never leaves a partial file there; what is not a regular file (a terminal, a device,
// a FIFO, "-" for stdout) is written through, never renamed over.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace numalign::detail {

// Temporary files are named "<kTempPrefix><pid>.<16 random hex digits>" in the target's
// folder (a rename is atomic only within one file system), created exclusively (O_EXCL, so a
// planted link is never followed) and no more open than the file they replace, and locked
// (flock) by their writer until renamed. They are removed on abort, on destruction, on SIGINT,
// SIGTERM, SIGHUP and SIGXFSZ (when the process left those signals at their default), and, for
// one left by a process that died (SIGKILL), by the next AtomicFile in that folder: one whose
// lock nobody holds, so that a live writer in another pid namespace, or on another NFS client
// where locks reach the server (not under `nolock` or `local_lock=flock`), keeps its own.
inline constexpr std::string_view kTempPrefix = ".numalign-tmp.";

class AtomicFile {
 public:
  // `target`: "-" is stdout; a symlink is followed to the file it names (a dangling one
  // creates it); a character or block device, FIFO or socket is opened and written through;
  // a directory is refused. Every failure throws Error naming the target.
  explicit AtomicFile(std::string target);
  // Removes the temporary file unless it was committed.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Appends n bytes (retrying short writes and EINTR).
  void write(const void* data, std::size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  // Writes n bytes at `offset` of the temporary file (not for a file written through).
  void write_at(const void* data, std::size_t n, std::uint64_t offset);
  // Appends n bytes of the open file `fd` from `offset`, copied in the kernel where the file
  // systems allow it (copy_file_range), else through a small buffer.
  void append_from(int fd, std::uint64_t offset, std::uint64_t n);
  // A replaced file keeps the mode (and, where allowed, the owner) of the file it replaces;
  // the data is flushed to disk and renamed over the target. Written through: nothing more.
  void commit();
  // Removes the temporary file now; the target is left as it was (what was written through
  // a device or FIFO is gone already).
  void abort();

  const std::string& target() const { return target_; }
  // Whether the target is written through (stdout, a device, a FIFO) rather than replaced.
  bool written_through() const { return tmp_.empty(); }
  // The open file, readable and writable when it is the temporary (for positional writes
  // from another thread, and to read back what was written).
  int fd() const { return fd_; }

 private:
  void close_fd();
  std::string target_;
  std::string final_;  // the regular file to replace: the target with its links resolved
  std::string tmp_;    // the temporary file; empty when written through
  int fd_ = -1;
  bool owns_fd_ = true;  // false for stdout and the process's own descriptors
  bool existed_ = false;
  mode_t mode_ = 0;  // the replaced file's mode, uid and gid
  uid_t uid_ = 0;
  gid_t gid_ = 0;
  int slot_ = -1;      // its place among the temporaries removed on a signal
  bool done_ = false;  // committed or aborted: nothing left to remove
};

}  // namespace numalign::detail
