// background_appender.hpp: bytes appended to a file by a background thread, through a few
// staging blocks, so that a capture's writes overlap the model's compute.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace numalign::detail {

// append() copies the bytes into a staging block and returns; full blocks are written by one
// background thread at increasing offsets from `base`. The caller may reuse or change its
// bytes as soon as append() returns (a capture's tensors are updated in place by the model),
// and memory stays bounded: when every block is in flight, append() waits for one.
class BackgroundAppender {
 public:
  struct Options {
    std::size_t block_bytes = std::size_t{1} << 20;
    std::size_t blocks = 8;
    // From this many bytes written on, each block's writeback to disk is started as it is
    // written (sync_file_range), so that the final fsync has little left to wait for.
    std::uint64_t writeback_from = 0;
    // What the bytes are, in errors: "cannot write <written>: <why>".
    std::string written = "tensor data";
  };
  // `what` names the file in errors.
  BackgroundAppender(int fd, std::uint64_t base, std::string what, Options options);
  ~BackgroundAppender();  // stops the thread; what was not written is dropped
  BackgroundAppender(const BackgroundAppender&) = delete;
  BackgroundAppender& operator=(const BackgroundAppender&) = delete;

  // Throws Error when an earlier write failed (a full disk).
  void append(const void* data, std::size_t n);
  // Writes what is staged and waits for every write; throws Error when one failed.
  void finish();

 private:
  struct Pending {
    std::size_t block;
    std::uint64_t offset;
    std::size_t size;
  };
  void run();
  void send_current();           // queues the current block (caller holds no lock)
  void throw_if_failed() const;  // caller holds mutex_
  void write_block(const Pending& p);

  int fd_;
  std::string what_;
  Options options_;
  std::vector<std::unique_ptr<std::byte[]>> blocks_;
  std::uint64_t base_;
  bool writing_back_ = false;  // the thread's: writeback started for everything written
  std::uint64_t next_offset_;  // where the current block's bytes go
  std::size_t current_ = 0;    // the block being filled (valid when filled_ or has_current_)
  bool has_current_ = false;
  std::size_t filled_ = 0;

  mutable std::mutex mutex_;
  std::condition_variable work_, room_;
  std::deque<Pending> queue_;
  std::vector<std::size_t> free_;
  std::uint64_t written_ = 0;  // bytes written so far (the thread's count)
  std::string error_;          // the first write error
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace numalign::detail
