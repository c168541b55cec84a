// page_populator.hpp: maps the pages of file mappings before the pass reads them.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace numalign::detail {

// A first read of a file mapping takes a page fault per 64 KiB or so; asking the kernel to
// map a whole window at once (MADV_POPULATE_READ) costs less than those faults, and it
// reads no data. Each window of each region is mapped once, by the first thread that is
// about to read it; a thread that finds a window taken reads on (its faults are then
// resolved as usual). Only the windows of what is judged are mapped (`--only` keeps the
// rest untouched). Where the kernel lacks the call, nothing is mapped ahead.
class PagePopulator {
 public:
  static constexpr std::size_t kWindow = std::size_t{8} << 20;

  explicit PagePopulator(std::span<const std::span<const std::byte>> regions);

  // Maps every window of a region that [p, p + bytes) touches and that no thread has yet.
  // Bytes outside every region (memory the caller owns) are left alone.
  void before_reading(const std::byte* p, std::size_t bytes) const;

  // Drop-behind: the pass reads each byte once, so a window whose every announced byte has
  // been read is dropped from the process (release_pages) and the judge's resident memory
  // stays a few windows whatever the files' size. Before the pass, one thread announces
  // each range it will read (will_read); each reader reports the same range once it is
  // read (done_reading). A window nobody announced is never dropped; a later read of a
  // dropped window maps it again from the page cache.
  void will_read(const std::byte* p, std::size_t bytes) const;
  void done_reading(const std::byte* p, std::size_t bytes) const;

 private:
  struct Region {
    const std::byte* begin;
    std::size_t size;
    std::unique_ptr<std::atomic<bool>[]> taken;  // one flag per window
    // Announced bytes of each window not read yet; 0 for a window nobody announced.
    std::unique_ptr<std::atomic<std::uint64_t>[]> unread;
  };
  // The region holding p, or null for memory outside every region.
  const Region* region_of(const std::byte* p) const;
  // Calls f(window, bytes of [p, p + bytes) inside it) for each window of r it touches.
  template <class F>
  static void for_each_window(const Region& r, const std::byte* p, std::size_t bytes, F f);
  std::vector<Region> regions_;
  mutable std::atomic<bool> unsupported_{false};
};

// Maps the whole pages inside [p, p + bytes) for writing in one call (MADV_POPULATE_WRITE):
// for a large buffer about to be filled, cheaper than the fault per page its first writes
// would take. For a buffer of 64 MiB or more, huge pages are asked for first (MADV_HUGEPAGE,
// where the system gives them on request): half the time again for hundreds of MB. Does nothing
// where the kernel lacks the calls; the writes then fault as usual.
void populate_for_writing(void* p, std::size_t bytes);

// Drops the whole pages inside [p, p + bytes) of a read-only file mapping from this process
// (MADV_DONTNEED); a later read maps them again from the page cache, unchanged. For what has
// been read and is not needed soon: a million tensors' three headers are 240 MB that would
// otherwise count in the judge's resident memory until it exits.
void release_pages(const void* p, std::size_t bytes);

}  // namespace numalign::detail
