// read_limit: the machine's limit for a streaming pass over trace files. Maps each file and
// sums its 64-bit words on N threads (warm page cache), the least work any judge must do;
// each piece's pages are mapped at once before it is read (see populate).
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

// The first read of a mapping faults every 64 KiB or so; having the kernel map each 8 MiB
// piece at once before reading it is faster (as numalign judge does), so the limit does it
// too. Where the kernel lacks MADV_POPULATE_READ the reads fault as usual.
constexpr std::size_t kPieceWords = (std::size_t{8} << 20) / 8;

void populate(const std::uint64_t* from, const std::uint64_t* to) {
#ifdef MADV_POPULATE_READ
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto start = reinterpret_cast<std::uintptr_t>(from) & ~(page - 1);
  ::madvise(reinterpret_cast<void*>(start), reinterpret_cast<std::uintptr_t>(to) - start,
            MADV_POPULATE_READ);
#else
  (void)from;
  (void)to;
#endif
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
        for (std::size_t piece = lo; piece < hi; piece += kPieceWords) {
          const std::size_t piece_end = std::min(hi, piece + kPieceWords);
          populate(w + piece, w + piece_end);
          std::size_t i = piece;
          for (; i + 4 <= piece_end; i += 4) {
            s0 += w[i];
            s1 += w[i + 1];
            s2 += w[i + 2];
            s3 += w[i + 3];
          }
          for (; i < piece_end; ++i) s0 += w[i];
        }
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
