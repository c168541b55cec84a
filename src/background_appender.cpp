// background_appender.cpp: see background_appender.hpp.
#include "background_appender.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "numalign/error.hpp"

namespace numalign::detail {

BackgroundAppender::BackgroundAppender(int fd, std::uint64_t base, std::string what,
                                       Options options)
    : fd_(fd), what_(std::move(what)), options_(options), base_(base), next_offset_(base) {
  if (options_.blocks < 2) options_.blocks = 2;  // one filled while another is written
  if (options_.block_bytes == 0) options_.block_bytes = 1;
  blocks_.resize(options_.blocks);
  for (std::size_t i = options_.blocks; i-- > 0;) free_.push_back(i);
  thread_ = std::thread([this] { run(); });
}

BackgroundAppender::~BackgroundAppender() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    queue_.clear();
  }
  work_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void BackgroundAppender::throw_if_failed() const {
  if (!error_.empty()) fail(what_, error_);
}

void BackgroundAppender::append(const void* data, std::size_t n) {
  const auto* p = static_cast<const std::byte*>(data);
  while (n > 0) {
    if (!has_current_) {
      std::unique_lock<std::mutex> lock(mutex_);
      room_.wait(lock, [&] { return !free_.empty() || !error_.empty(); });
      throw_if_failed();
      current_ = free_.back();
      free_.pop_back();
      has_current_ = true;
      filled_ = 0;
      lock.unlock();
      if (!blocks_[current_]) blocks_[current_].reset(new std::byte[options_.block_bytes]);
    }
    const std::size_t k = std::min(n, options_.block_bytes - filled_);
    std::memcpy(blocks_[current_].get() + filled_, p, k);
    filled_ += k;
    p += k;
    n -= k;
    if (filled_ == options_.block_bytes) send_current();
  }
}

void BackgroundAppender::send_current() {
  if (!has_current_) return;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (filled_ > 0) {
      queue_.push_back({current_, next_offset_, filled_});
    } else {
      free_.push_back(current_);
    }
  }
  work_.notify_one();
  next_offset_ += filled_;
  has_current_ = false;
  filled_ = 0;
}

void BackgroundAppender::finish() {
  send_current();
  std::unique_lock<std::mutex> lock(mutex_);
  room_.wait(lock, [&] { return free_.size() == options_.blocks || !error_.empty(); });
  throw_if_failed();
}

void BackgroundAppender::write_block(const Pending& p) {
  const std::byte* data = blocks_[p.block].get();
  std::size_t n = p.size;
  auto at = static_cast<off_t>(p.offset);
  while (n > 0) {
    const ssize_t k = ::pwrite(fd_, data, n, at);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      const std::string why = "cannot write " + options_.written + ": " +
                              (k < 0 ? std::strerror(errno) : "nothing written");
      const std::lock_guard<std::mutex> lock(mutex_);
      if (error_.empty()) error_ = why;
      return;
    }
    data += k;
    at += k;
    n -= static_cast<std::size_t>(k);
  }
  if (written_ + p.size > options_.writeback_from) {
    // A hint only: where it is not supported the final fsync does all the work. The first
    // time, everything written so far (what was below writeback_from) goes with the block.
    const std::uint64_t from = writing_back_ ? p.offset : base_;
    writing_back_ = true;
    [[maybe_unused]] const int ignored =
        ::sync_file_range(fd_, static_cast<off_t>(from),
                          static_cast<off_t>(p.offset + p.size - from), SYNC_FILE_RANGE_WRITE);
  }
}

void BackgroundAppender::run() {
  for (;;) {
    Pending p{};
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_.wait(lock, [&] { return !queue_.empty() || stopping_; });
      if (queue_.empty()) return;  // stopping, nothing left
      p = queue_.front();
      queue_.pop_front();
      if (!error_.empty()) {  // after a failure the rest is dropped, its blocks freed
        free_.push_back(p.block);
        room_.notify_all();
        continue;
      }
    }
    write_block(p);
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      written_ += p.size;
      free_.push_back(p.block);
    }
    room_.notify_all();
  }
}

}  // namespace numalign::detail
