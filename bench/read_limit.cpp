// read_limit: the machine's limit for a streaming pass over trace files. Maps each file and
// sums its 64-bit words on N threads (warm page cache), the least work any judge must do.
// Prints one JSON line: {"bytes": B, "seconds": S, "threads": N, "checksum": C}.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Mapping {
  const std::uint64_t* words = nullptr;
  std::size_t count = 0;  // whole 64-bit words; a trailing partial word is skipped
};

Mapping map_file(const char* path) {
  const int fd = open(path, O_RDONLY);
  struct stat st {};
  if (fd < 0 || fstat(fd, &st) != 0) {
    std::fprintf(stderr, "read_limit: %s: %s\n", path, std::strerror(errno));
    std::exit(2);
  }
  Mapping m;
  m.count = static_cast<std::size_t>(st.st_size) / 8;
  if (m.count) {
    void* p = mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      std::fprintf(stderr, "read_limit: %s: mmap: %s\n", path, std::strerror(errno));
      std::exit(2);
    }
    m.words = static_cast<const std::uint64_t*>(p);
  }
  close(fd);
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: read_limit THREADS FILE...\n");
    return 2;
  }
  const int threads = std::max(1, std::atoi(argv[1]));
  const auto start = std::chrono::steady_clock::now();
  std::vector<Mapping> files;
  std::size_t total_words = 0;
  for (int i = 2; i < argc; ++i) {
    files.push_back(map_file(argv[i]));
    total_words += files.back().count;
  }
  // Each thread takes one contiguous share of the concatenated words.
  std::vector<std::uint64_t> sums(static_cast<std::size_t>(threads), 0);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const std::size_t begin = total_words * static_cast<std::size_t>(t) / threads;
      const std::size_t end = total_words * static_cast<std::size_t>(t + 1) / threads;
      std::uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      std::size_t offset = 0;
      for (const Mapping& f : files) {
        const std::size_t lo = std::max(begin, offset), hi = std::min(end, offset + f.count);
        const std::uint64_t* w = f.words - offset;
        std::size_t i = lo;
        for (; i + 4 <= hi; i += 4) {
          s0 += w[i];
          s1 += w[i + 1];
          s2 += w[i + 2];
          s3 += w[i + 3];
        }
        for (; i < hi; ++i) s0 += w[i];
        offset += f.count;
      }
      sums[static_cast<std::size_t>(t)] = s0 + s1 + s2 + s3;
    });
  }
  std::uint64_t checksum = 0;
  for (int t = 0; t < threads; ++t) {
    pool[static_cast<std::size_t>(t)].join();
    checksum += sums[static_cast<std::size_t>(t)];
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("{\"bytes\": %zu, \"seconds\": %.6f, \"threads\": %d, \"checksum\": %llu}\n",
              total_words * 8, seconds, threads, static_cast<unsigned long long>(checksum));
  return 0;
}
