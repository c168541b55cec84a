// regular_file.hpp: the one way numalign opens a file it reads by name (traces, their
// indexes, map and policy files): regular files only, refused before and after the open (a
// FIFO or device could block the open, or never end), and small files read whole within a
// bound.
#pragma once

#include <sys/stat.h>

#include <cstddef>
#include <string>

namespace numalign::detail {

// Throws Error when `path` cannot name a file: empty, or holding a NUL byte (the system would
// read it cut at the NUL, another file). Every path numalign opens or writes goes through it.
void check_path(const std::string& path);

// An open descriptor of the regular file `path` (O_NONBLOCK, O_CLOEXEC), its stat in `st`;
// throws Error naming the path, and `what` it should have been, otherwise.
int open_regular_file(const std::string& path, struct stat& st, const std::string& what);

// The bytes of the regular file `path`, at most `max_bytes` of them (more is an error, also
// when the file grows while it is read).
std::string read_regular_file(const std::string& path, const std::string& what,
                              std::size_t max_bytes);

// The bound on the map and policy files numalign reads: far beyond any real one.
inline constexpr std::size_t kMaxSettingsFile = std::size_t{64} << 20;

}  // namespace numalign::detail
