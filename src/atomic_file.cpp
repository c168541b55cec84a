// atomic_file.cpp: temporary file, fsync and rename, for every file the library writes; write
// through for what is not a regular file; temporaries removed on signals and after a SIGKILL.
#include "atomic_file.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "fault_guard.hpp"
#include "numalign/error.hpp"
#include "numalign/trace_writer.hpp"
#include "regular_file.hpp"

namespace numalign::detail {

namespace {

namespace fs = std::filesystem;

std::string errno_text(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// A write that failed with EFAULT read from a mapped input that shrank under it (the kernel
// reports EFAULT, not SIGBUS, for a copy from pages past the file's end): the error names that
// input rather than the output. Otherwise the failure names the target.
[[noreturn]] void fail_write(const std::string& target, const void* data, std::size_t n) {
  const int error = errno;
  if (error == EFAULT && n > 0) {
    const auto* p = static_cast<const char*>(data);
    std::string source = mapped_file_at(p);
    if (source.empty()) source = mapped_file_at(p + n - 1);
    if (!source.empty()) {
      fail(source, "changed while being copied to " + target +
                       " (it shrank: truncated or rewritten meanwhile); copy a file that nothing "
                       "writes to");
    }
  }
  fail(target, std::string("write failed: ") + std::strerror(error));
}

// ---- the temporaries a signal removes ----
// Fixed slots, so that the handler touches no allocator: 0 free, 1 being changed, 2 live.
constexpr int kSlots = 64;
struct TempSlot {
  std::atomic<int> state{0};
  char path[PATH_MAX];
};
TempSlot g_slots[kSlots];

extern "C" void remove_temporaries_and_die(int sig) {
  for (auto& s : g_slots) {
    if (s.state.load(std::memory_order_acquire) == 2) ::unlink(s.path);
  }
  // The handler was installed with SA_RESETHAND: the default action (death by this signal,
  // as the parent expects to see) runs once the handler returns and the signal is unblocked.
  ::raise(sig);
}

// Installed over the default action only (checked at each temporary: the handler resets
// itself when it runs, and a process may reset it): a process that handles or ignores these
// signals itself (Python's SIGINT handler, `nohup`) keeps its own behaviour.
// SIGXFSZ (a write past RLIMIT_FSIZE) is among them: its default action kills the process.
void install_handlers() {
  for (const int sig : {SIGINT, SIGTERM, SIGHUP, SIGXFSZ}) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0 || (old.sa_flags & SA_SIGINFO) ||
        old.sa_handler != SIG_DFL) {
      continue;
    }
    struct sigaction sa {};
    sa.sa_handler = remove_temporaries_and_die;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND;
    ::sigaction(sig, &sa, nullptr);
  }
}

// The slot holding `path`, or -1 when all are taken (the temporary is then removed only by
// the next run in its folder).
int register_temporary(const std::string& path) {
  if (path.size() >= PATH_MAX) return -1;
  install_handlers();
  for (int i = 0; i < kSlots; ++i) {
    int expected = 0;
    if (g_slots[i].state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
      std::memcpy(g_slots[i].path, path.c_str(), path.size() + 1);
      g_slots[i].state.store(2, std::memory_order_release);
      return i;
    }
  }
  return -1;
}

void unregister_temporary(int slot) {
  if (slot >= 0) g_slots[slot].state.store(0, std::memory_order_release);
}

// ---- names ----

std::string random_hex16() {
  std::uint64_t r = 0;
  if (::getrandom(&r, sizeof r, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof r)) {
    std::random_device rd;
    r = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(r));
  return buf;
}

// Whether no writer holds the temporary `name` in `dfd`: its writer holds an exclusive lock on
// it from creation to rename, so a shared lock is granted only once that writer is gone. A
// process id cannot tell this across pid namespaces (containers sharing a folder) or machines
// (NFS), where a live writer's pid is unknown here; it is trusted alone only on a file system
// without locks. Opened without following links or blocking; a file that cannot be opened, is
// held, is not a regular file of this user, or was replaced meanwhile, is left alone. On true,
// `fd` holds the lock (where there is one) until the caller closes it.
bool writer_is_gone(int dfd, const char* name, int& fd) {
  fd = ::openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return false;
  struct stat opened {
  }, named{};
  const bool gone = ::fstat(fd, &opened) == 0 && S_ISREG(opened.st_mode) &&
                    opened.st_uid == ::geteuid() &&
                    (::flock(fd, LOCK_SH | LOCK_NB) == 0 || errno != EWOULDBLOCK) &&
                    ::fstatat(dfd, name, &named, AT_SYMLINK_NOFOLLOW) == 0 &&
                    named.st_dev == opened.st_dev && named.st_ino == opened.st_ino;
  if (!gone) {
    ::close(fd);
    fd = -1;
  }
  return gone;
}

// Removes temporaries that a process killed by SIGKILL (or a power cut) left in `dir`: files
// with our prefix, owned by this user, whose writer is neither a live process here nor holds
// the file's lock (see writer_is_gone).
void remove_stale_temporaries(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  const int dfd = ::dirfd(d);
  const pid_t self = ::getpid();
  while (const dirent* e = ::readdir(d)) {
    const std::string_view name = e->d_name;
    if (!name.starts_with(kTempPrefix)) continue;
    const std::string_view rest = name.substr(kTempPrefix.size());
    pid_t pid = 0;
    const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), pid);
    if (ec != std::errc() || end == rest.data() || *end != '.' || pid <= 0 || pid == self) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to ask
    int fd = -1;
    if (!writer_is_gone(dfd, e->d_name, fd)) continue;
    ::unlinkat(dfd, e->d_name, 0);  // under the lock: a writer that locks it now finds it gone
    ::close(fd);
  }
  ::closedir(d);
}

// Creates and locks a new temporary `name` (see writer_is_gone): -1 with errno EEXIST when
// the name is taken, or when another process locked the file before its writer could (a
// cleaner, which removes it; else it is removed here): the caller tries another name. On a
// file system without locks the file is kept unlocked.
int create_locked_temporary(const std::string& name, mode_t mode) {
  const int fd = ::open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) return -1;
  const bool held_by_another = ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  struct stat opened {
  }, named{};
  const bool still_named = ::fstat(fd, &opened) == 0 && ::lstat(name.c_str(), &named) == 0 &&
                           named.st_dev == opened.st_dev && named.st_ino == opened.st_ino;
  if (held_by_another || !still_named) {
    if (still_named) ::unlink(name.c_str());
    ::close(fd);
    errno = EEXIST;
    return -1;
  }
  return fd;
}

// The descriptor a /dev/stdout-like path names, or -1: such a path is a link into /proc that
// names no file to replace.
int own_descriptor(const std::string& path) {
  if (path == "-" || path == "/dev/stdout") return STDOUT_FILENO;
  if (path == "/dev/stderr") return STDERR_FILENO;
  for (const std::string_view prefix : {"/dev/fd/", "/proc/self/fd/"}) {
    if (!path.starts_with(prefix)) continue;
    int fd = -1;
    const char* b = path.data() + prefix.size();
    const char* e = path.data() + path.size();
    const auto [end, ec] = std::from_chars(b, e, fd);
    if (ec == std::errc() && end == e && b != e && fd >= 0) return fd;
  }
  return -1;
}

}  // namespace

AtomicFile::AtomicFile(std::string target) : target_(std::move(target)) {
  check_path(target_);
  if (const int fd = own_descriptor(target_); fd >= 0) {
    std::fflush(fd == STDERR_FILENO ? stderr : stdout);  // what stdio holds goes first
    fd_ = fd;
    owns_fd_ = false;
    return;
  }
  // Follow links one at a time to the file they name.
  fs::path p(target_);
  struct stat st {};
  bool through = false;
  for (int hops = 0;; ++hops) {
    if (hops > 40) fail(target_, "too many levels of symbolic links");
    if (::lstat(p.c_str(), &st) != 0) {
      if (errno != ENOENT) fail(target_, errno_text("cannot look at it"));
      break;  // a new file
    }
    if (S_ISLNK(st.st_mode)) {
      std::string link(PATH_MAX, '\0');
      const ssize_t n = ::readlink(p.c_str(), link.data(), link.size());
      if (n < 0) fail(target_, errno_text("cannot read the link"));
      link.resize(static_cast<std::size_t>(n));
      if (link.starts_with("/proc/")) {  // a descriptor's magic link: open it, never replace
        through = true;
        break;
      }
      p = fs::path(link).is_absolute() ? fs::path(link) : p.parent_path() / link;
      continue;
    }
    if (S_ISDIR(st.st_mode)) fail(target_, "is a directory");
    if (!S_ISREG(st.st_mode)) through = true;  // a device, FIFO or socket
    existed_ = !through;
    break;
  }
  if (through) {
    // Opened as a shell's `>` would open it (a FIFO waits for its reader); never created.
    fd_ = ::open(target_.c_str(), O_WRONLY | O_NOCTTY | O_CLOEXEC);
    if (fd_ < 0) fail(target_, errno_text("cannot open for writing"));
    struct stat opened {};
    if (::fstat(fd_, &opened) == 0 && S_ISREG(opened.st_mode)) {
      // A magic link to a regular file (a redirected stdout): written from its start.
      if (::ftruncate(fd_, 0) != 0) {
        close_fd();
        fail(target_, errno_text("cannot truncate"));
      }
    }
    return;
  }
  if (existed_) {
    mode_ = st.st_mode & 07777;
    uid_ = st.st_uid;
    gid_ = st.st_gid;
  }
  final_ = p.string();
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  remove_stale_temporaries(dir.string());
  const std::string stem = (dir / kTempPrefix).string() + std::to_string(::getpid()) + ".";
  // No more open than the file it replaces while it is written (commit sets the mode).
  // Readable by its owner whatever the target's mode (commit sets that), so that a cleaner
  // can open it to take its lock once its writer is gone.
  const mode_t create_mode = existed_ ? ((mode_ & 0666) | S_IRUSR) : 0666;
  for (int attempt = 0; attempt < 100 && fd_ < 0; ++attempt) {
    std::string name = stem + random_hex16();
    fd_ = create_locked_temporary(name, create_mode);
    if (fd_ >= 0) {
      tmp_ = std::move(name);
    } else if (errno != EEXIST) {
      fail(target_, errno_text("cannot create a temporary file"));
    }
  }
  if (fd_ < 0) fail(target_, "cannot create a temporary file: every name tried was taken");
  slot_ = register_temporary(tmp_);
}

AtomicFile::~AtomicFile() {
  close_fd();
  if (!done_ && !tmp_.empty()) ::unlink(tmp_.c_str());
  unregister_temporary(slot_);
}

void AtomicFile::close_fd() {
  if (fd_ >= 0 && owns_fd_) ::close(fd_);
  fd_ = -1;
}

void AtomicFile::write(const void* data, std::size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = ::write(fd_, p, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      fail_write(target_, p, n);
    }
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

void AtomicFile::write_at(const void* data, std::size_t n, std::uint64_t offset) {
  if (written_through()) fail(target_, "cannot write at an offset of a file written through");
  const auto* p = static_cast<const char*>(data);
  auto at = static_cast<off_t>(offset);
  while (n > 0) {
    const ssize_t k = ::pwrite(fd_, p, n, at);
    if (k <= 0) {
      if (k < 0 && errno == EINTR) continue;
      if (k < 0) fail_write(target_, p, n);
      fail(target_, "write failed: nothing written");
    }
    p += k;
    at += k;
    n -= static_cast<std::size_t>(k);
  }
}

void AtomicFile::append_from(int fd, std::uint64_t offset, std::uint64_t n) {
  auto at = static_cast<off_t>(offset);
  while (n > 0 && !written_through()) {
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
    if (k <= 0) fail(target_, errno_text("cannot read the data to copy"));
    write(buffer.data(), static_cast<std::size_t>(k));
    at += k;
    n -= static_cast<std::uint64_t>(k);
  }
}

void AtomicFile::commit() {
  if (written_through()) {
    close_fd();
    done_ = true;
    return;
  }
  if (existed_) {
    // The owner first (a chown clears set-id bits), then the mode; a user who may not give
    // the file away keeps it as their own.
    struct stat st {};
    if (::fstat(fd_, &st) == 0 && (st.st_uid != uid_ || st.st_gid != gid_)) {
      [[maybe_unused]] const int ignored = ::fchown(fd_, uid_, gid_);
    }
    if (::fchmod(fd_, mode_) != 0) fail(target_, errno_text("cannot set the mode"));
  }
  if (::fsync(fd_) != 0) fail(target_, errno_text("cannot flush"));
  // Renamed while still open, so still locked: a cleaner elsewhere cannot take it for stale
  // between the last write and the rename.
  if (::rename(tmp_.c_str(), final_.c_str()) != 0) {
    fail(target_, errno_text("cannot rename into place"));
  }
  close_fd();
  done_ = true;
  unregister_temporary(slot_);
  slot_ = -1;
}

void AtomicFile::abort() {
  close_fd();
  if (!done_ && !tmp_.empty()) ::unlink(tmp_.c_str());
  done_ = true;
  unregister_temporary(slot_);
  slot_ = -1;
}

}  // namespace numalign::detail

namespace numalign {

void refuse_output_over_input(const std::string& output, const std::vector<std::string>& inputs) {
  if (output == "-") return;
  struct stat out {};
  if (::stat(output.c_str(), &out) != 0 || !S_ISREG(out.st_mode)) return;
  for (const auto& in : inputs) {
    struct stat st {};
    if (in.empty() || ::stat(in.c_str(), &st) != 0) continue;
    if (st.st_dev == out.st_dev && st.st_ino == out.st_ino) {
      fail(output, "is the same file as the input " + in + "; refusing to overwrite an input");
    }
  }
}

}  // namespace numalign
