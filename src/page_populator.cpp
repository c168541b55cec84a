// page_populator.cpp: windows of file mappings mapped once each, ahead of their first read.
#include "page_populator.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>

namespace numalign::detail {

PagePopulator::PagePopulator(std::span<const std::span<const std::byte>> regions) {
  for (const auto& r : regions) {
    if (r.empty()) continue;
    const std::size_t windows = (r.size() + kWindow - 1) / kWindow;
    regions_.push_back({r.data(), r.size(), std::make_unique<std::atomic<bool>[]>(windows),
                        std::make_unique<std::atomic<std::uint64_t>[]>(windows)});
  }
}

const PagePopulator::Region* PagePopulator::region_of(const std::byte* p) const {
  for (const Region& r : regions_) {
    if (p >= r.begin && p < r.begin + r.size) return &r;
  }
  return nullptr;
}

template <class F>
void PagePopulator::for_each_window(const Region& r, const std::byte* p, std::size_t bytes, F f) {
  const auto begin = static_cast<std::size_t>(p - r.begin);
  const std::size_t end = std::min(begin + bytes, r.size);
  for (std::size_t w = begin / kWindow; w * kWindow < end; ++w) {
    f(w, std::min(end, (w + 1) * kWindow) - std::max(begin, w * kWindow));
  }
}

void PagePopulator::will_read(const std::byte* p, std::size_t bytes) const {
  const Region* r = bytes ? region_of(p) : nullptr;
  if (!r) return;
  for_each_window(*r, p, bytes, [&](std::size_t w, std::size_t n) {
    r->unread[w].fetch_add(n, std::memory_order_relaxed);
  });
}

void PagePopulator::done_reading(const std::byte* p, std::size_t bytes) const {
  const Region* r = bytes ? region_of(p) : nullptr;
  if (!r) return;
  for_each_window(*r, p, bytes, [&](std::size_t w, std::size_t n) {
    // The reader that brings a window's count to 0 drops it: every other reader is done.
    if (r->unread[w].fetch_sub(n, std::memory_order_acq_rel) == n) {
      release_pages(r->begin + w * kWindow, std::min(kWindow, r->size - w * kWindow));
      r->taken[w].store(false, std::memory_order_relaxed);  // a later reader maps it ahead again
    }
  });
}

void PagePopulator::before_reading(const std::byte* p, std::size_t bytes) const {
#ifdef MADV_POPULATE_READ
  const Region* r = bytes ? region_of(p) : nullptr;
  if (!r) return;
  for_each_window(*r, p, bytes, [&](std::size_t w, std::size_t) {
    if (unsupported_.load(std::memory_order_relaxed)) return;
    // A load first: most calls find their window taken, and need not own its cache line.
    if (r->taken[w].load(std::memory_order_relaxed) || r->taken[w].exchange(true)) return;
    // Windows start a whole number of windows into a page-aligned mapping.
    void* at = const_cast<std::byte*>(r->begin + w * kWindow);
    const std::size_t length = std::min(kWindow, r->size - w * kWindow);
    if (::madvise(at, length, MADV_POPULATE_READ) != 0 && errno == EINVAL) {
      unsupported_.store(true, std::memory_order_relaxed);  // a kernel before 5.14
    }
  });
#else
  (void)p;
  (void)bytes;
#endif
}

void populate_for_writing(void* p, std::size_t bytes) {
#ifdef MADV_POPULATE_WRITE
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<std::uintptr_t>(p) + page - 1) / page * page;
  const auto end = (reinterpret_cast<std::uintptr_t>(p) + bytes) / page * page;
  if (end <= begin) return;
#ifdef MADV_HUGEPAGE
  // Only buffers that malloc maps apart (any above 32 MiB), which go back to the system
  // whole when freed: a smaller one may lie in the heap, whose other uses should not get
  // huge pages.
  if (end - begin >= (std::uintptr_t{64} << 20)) {
    ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
  }
#endif
  ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE);
#else
  (void)p;
  (void)bytes;
#endif
}

void release_pages(const void* p, std::size_t bytes) {
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<std::uintptr_t>(p) + page - 1) / page * page;
  const auto end = (reinterpret_cast<std::uintptr_t>(p) + bytes) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace numalign::detail
