// atomic_file_test.cpp: the target changes only on commit; an abort or an exception leaves it
// as it was and no temporary file behind.
#include "atomic_file.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "numalign/error.hpp"
#include "temp_dir.hpp"

namespace numalign::detail {
namespace {

namespace fs = std::filesystem;
using numalign::testing::TempDir;

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::size_t files_in(const TempDir& dir) {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path())) ++n;
  return n;
}

TEST(AtomicFileTest, TheTargetAppearsOnlyOnCommitWithEverythingWritten) {
  TempDir dir;
  const std::string target = dir.file("out.bin");
  {
    AtomicFile f(target);
    EXPECT_EQ(f.target(), target);
    f.write("abc");
    const char more[2] = {'\0', 'd'};
    f.write(more, 2);
    EXPECT_FALSE(fs::exists(target));
    EXPECT_EQ(files_in(dir), 1u) << "the temporary file, in the target's folder";
    f.commit();
  }
  EXPECT_EQ(read_all(target), std::string("abc\0d", 5));
  EXPECT_EQ(files_in(dir), 1u);
}

TEST(AtomicFileTest, AbortAndDestructionLeaveThePreviousFileAndNoTemporary) {
  TempDir dir;
  const std::string target = dir.file("keep.txt");
  std::ofstream(target) << "before";
  {
    AtomicFile f(target);
    f.write("after");
    f.abort();
    EXPECT_EQ(files_in(dir), 1u) << "abort removes the temporary at once";
  }
  EXPECT_EQ(read_all(target), "before");
  try {
    AtomicFile f(target);
    f.write("after");
    throw std::runtime_error("a writer failed midway");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(read_all(target), "before");
  EXPECT_EQ(files_in(dir), 1u);
}

TEST(AtomicFileTest, FailuresNameTheTarget) {
  TempDir dir;
  const std::string nowhere = dir.file("missing/out.bin");
  try {
    AtomicFile f(nowhere);
    FAIL() << "created";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), nowhere);
  }
  // A directory is refused before anything is written: it stays, and no temporary is left.
  const std::string folder = dir.file("folder");
  fs::create_directory(folder);
  fs::create_directory(dir.file("folder/inside"));
  try {
    AtomicFile f(folder);
    f.write("x");
    f.commit();
    FAIL() << "wrote over a directory";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), folder);
    EXPECT_NE(e.problem().find("directory"), std::string::npos) << e.problem();
  }
  EXPECT_TRUE(fs::is_directory(folder));
  EXPECT_EQ(files_in(dir), 1u);
}

// A path with a NUL would be cut there by the system and write another file: refused, and
// nothing is written, as is an empty path.
TEST(AtomicFileTest, APathWithANulOrNoNameIsRefused) {
  TempDir dir;
  for (const std::string& bad :
       {dir.file("out.json") + std::string(1, '\0') + "x", std::string()}) {
    try {
      AtomicFile f(bad);
      FAIL() << "opened " << bad;
    } catch (const Error& e) {
      EXPECT_NE(e.problem().find(bad.empty() ? "empty path" : "NUL byte"), std::string::npos)
          << e.problem();
    }
  }
  EXPECT_EQ(files_in(dir), 0u);
}

// ---- hostile targets (issue 20) ----

mode_t mode_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

void write_all(const std::string& target, const std::string& text) {
  AtomicFile f(target);
  f.write(text);
  f.commit();
}

TEST(AtomicFileTest, AnExistingFileKeepsItsModeAndANewOneHonoursTheUmask) {
  TempDir dir;
  const std::string kept = dir.file("private.txt");
  std::ofstream(kept) << "old";
  ASSERT_EQ(::chmod(kept.c_str(), 0600), 0);
  write_all(kept, "new");
  EXPECT_EQ(read_all(kept), "new");
  EXPECT_EQ(mode_of(kept), 0600u);
  ASSERT_EQ(::chmod(kept.c_str(), 0755), 0);
  write_all(kept, "newer");
  EXPECT_EQ(mode_of(kept), 0755u);

  const mode_t old_mask = ::umask(027);
  write_all(dir.file("fresh.txt"), "x");
  ::umask(077);
  write_all(dir.file("fresher.txt"), "x");
  ::umask(old_mask);
  EXPECT_EQ(mode_of(dir.file("fresh.txt")), 0640u);
  EXPECT_EQ(mode_of(dir.file("fresher.txt")), 0600u);
}

// While a report replacing a private file is written, its temporary is as private: others
// could read it there before (the temporary was created 0644 under umask 022).
TEST(AtomicFileTest, TheTemporaryIsNoMoreOpenThanTheFileItReplaces) {
  TempDir dir;
  const std::string kept = dir.file("private.txt");
  std::ofstream(kept) << "old";
  ASSERT_EQ(::chmod(kept.c_str(), 0600), 0);
  const mode_t old_mask = ::umask(022);
  {
    AtomicFile f(kept);
    f.write("secret");
    std::vector<std::string> temporaries;
    for (const auto& e : fs::directory_iterator(dir.path())) {
      if (e.path().string() != kept) temporaries.push_back(e.path().string());
    }
    ASSERT_EQ(temporaries.size(), 1u);
    EXPECT_EQ(mode_of(temporaries[0]), 0600u);
    f.commit();
  }
  ::umask(old_mask);
  EXPECT_EQ(mode_of(kept), 0600u);
  EXPECT_EQ(read_all(kept), "secret");
}

// A write-only target's temporary is still readable by its owner: a cleaner opens it to take
// its lock once its writer is gone, or a SIGKILL'd writer's temporary would stay for ever.
TEST(AtomicFileTest, AWriteOnlyTargetsTemporaryIsReadableByItsOwner) {
  TempDir dir;
  const std::string target = dir.file("write-only.txt");
  std::ofstream(target) << "old";
  ASSERT_EQ(::chmod(target.c_str(), 0200), 0);
  AtomicFile f(target);
  std::string tmp;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    if (e.path().string() != target) tmp = e.path().string();
  }
  EXPECT_EQ(mode_of(tmp), 0600u);
  f.write("new");
  f.commit();
  EXPECT_EQ(mode_of(target), 0200u);
}

TEST(AtomicFileTest, ASymlinkIsResolvedAndItsTargetReplaced) {
  TempDir dir;
  fs::create_directory(dir.file("real"));
  const std::string real = dir.file("real/report.json");
  std::ofstream(real) << "old";
  const std::string link = dir.file("link.json");
  fs::create_symlink("real/report.json", link);  // relative to the link's folder
  const std::string chain = dir.file("chain.json");
  fs::create_symlink(link, chain);
  write_all(chain, "new");
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_TRUE(fs::is_symlink(chain));
  EXPECT_EQ(read_all(real), "new");
  // A dangling link creates its target, as a shell's redirection would.
  const std::string dangling = dir.file("dangling.json");
  fs::create_symlink("real/created.json", dangling);
  write_all(dangling, "made");
  EXPECT_TRUE(fs::is_symlink(dangling));
  EXPECT_EQ(read_all(dir.file("real/created.json")), "made");
  EXPECT_EQ(files_in(dir), 4u) << "no temporary left beside the links";
}

TEST(AtomicFileTest, AFifoIsWrittenThroughNotRenamedOver) {
  TempDir dir;
  const std::string fifo = dir.file("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string got;
  std::thread reader([&] {
    std::ifstream in(fifo, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    got = ss.str();
  });
  {
    AtomicFile f(fifo);
    f.write("through ");
    f.write("the pipe");
    f.commit();
  }
  reader.join();
  EXPECT_EQ(got, "through the pipe");
  struct stat st {};
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode)) << "the FIFO is still a FIFO";
  EXPECT_EQ(files_in(dir), 1u);
}

// Temporary names carry the process id and a random part; two writers never share one.
TEST(AtomicFileTest, TemporariesAreUnpredictableAndRecognisable) {
  TempDir dir;
  AtomicFile a(dir.file("out")), b(dir.file("out"));
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path())) names.push_back(e.path().filename());
  ASSERT_EQ(names.size(), 2u);
  EXPECT_NE(names[0], names[1]);
  const std::string prefix = ".numalign-tmp." + std::to_string(::getpid()) + ".";
  for (const auto& n : names) {
    EXPECT_EQ(n.rfind(prefix, 0), 0u) << n;
    EXPECT_GE(n.size(), prefix.size() + 16) << "a random part of 64 bits: " << n;
  }
}

pid_t a_dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  return child;
}

TEST(AtomicFileTest, TemporariesLeftByADeadProcessAreRemovedOnTheNextWrite) {
  TempDir dir;
  const std::string stale =
      dir.file(".numalign-tmp." + std::to_string(a_dead_pid()) + ".0123456789abcdef");
  const std::string live = dir.file(".numalign-tmp.1.0123456789abcdef");  // pid 1 is alive
  const std::string other = dir.file(".numalign-tmp.not-ours");
  for (const auto& p : {stale, live, other}) std::ofstream(p) << "x";
  write_all(dir.file("out"), "new");
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live)) << "its writer may still be running";
  EXPECT_TRUE(fs::exists(other));
}

// A writer in another pid namespace, or on another machine sharing the folder, has a pid that
// is dead (or someone else's) here: its lock, not its pid, says it is alive (issue 36, 7).
TEST(AtomicFileTest, ATemporaryWhoseWriterHoldsItsLockIsKeptWhateverItsPid) {
  TempDir dir;
  const std::string foreign =
      dir.file(".numalign-tmp." + std::to_string(a_dead_pid()) + ".00000000000000aa");
  std::ofstream(foreign) << "a report being written";
  const int held = ::open(foreign.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX), 0);
  write_all(dir.file("out"), "new");
  EXPECT_TRUE(fs::exists(foreign)) << "its writer holds the lock: it is alive";
  ::close(held);  // the writer died
  write_all(dir.file("out"), "newer");
  EXPECT_FALSE(fs::exists(foreign)) << "once nobody holds it, it is stale";
}

TEST(AtomicFileTest, AWriterHoldsTheLockOnItsTemporaryUntilCommit) {
  TempDir dir;
  AtomicFile f(dir.file("out"));
  std::string tmp;
  for (const auto& e : fs::directory_iterator(dir.path())) tmp = e.path();
  const int probe = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(probe, 0);
  EXPECT_EQ(::flock(probe, LOCK_SH | LOCK_NB), -1);
  EXPECT_EQ(errno, EWOULDBLOCK);
  ::close(probe);
  f.write("x");
  f.commit();
  EXPECT_EQ(read_all(dir.file("out")), "x");
}

// A write past RLIMIT_FSIZE raises SIGXFSZ, whose default action kills: the temporary goes
// first, and the process still dies of the signal (issue 36, 15).
TEST(AtomicFileTest, SigxfszRemovesTheTemporary) {
  TempDir dir;
  const pid_t child = ::fork();
  if (child == 0) {
    ::signal(SIGXFSZ, SIG_DFL);
    const struct rlimit limit { 4096, 4096 };
    ::setrlimit(RLIMIT_FSIZE, &limit);
    AtomicFile f(dir.file("big.bin"));
    f.write(std::string(1 << 16, 'x'));
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGXFSZ) << "status " << status;
  EXPECT_EQ(files_in(dir), 0u) << "no temporary left";
}

// SIGTERM and SIGINT (when the process had not set a handler of its own) remove the temporary
// before the process dies of the signal.
TEST(AtomicFileTest, SigtermAndSigintRemoveTheTemporary) {
  for (const int sig : {SIGTERM, SIGINT}) {
    TempDir dir;
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    const pid_t child = ::fork();
    if (child == 0) {
      ::signal(sig, SIG_DFL);
      AtomicFile f(dir.file("big.bin"));
      f.write(std::string(1 << 16, 'x'));
      (void)!::write(ready[1], "r", 1);
      for (;;) ::pause();
    }
    char c;
    ASSERT_EQ(::read(ready[0], &c, 1), 1);
    EXPECT_EQ(files_in(dir), 1u) << "the temporary exists while writing";
    ::kill(child, sig);
    int status = 0;
    ::waitpid(child, &status, 0);
    ::close(ready[0]);
    ::close(ready[1]);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig) << "died of the signal " << sig;
    EXPECT_EQ(files_in(dir), 0u) << "signal " << sig;
  }
}

TEST(AtomicFileTest, APlantedSymlinkIsNeverFollowed) {
  // Whatever name a temporary gets, it is created exclusively: a link planted under the
  // name a predictable writer would use is never written through.
  TempDir dir;
  const std::string victim = dir.file("victim");
  std::ofstream(victim) << "precious";
  for (int i = 0; i < 64; ++i) {
    fs::create_symlink(
        victim, dir.file(".numalign-tmp." + std::to_string(::getpid()) + "." + std::to_string(i)));
  }
  write_all(dir.file("out"), "new");
  EXPECT_EQ(read_all(victim), "precious");
  EXPECT_EQ(read_all(dir.file("out")), "new");
}

}  // namespace
}  // namespace numalign::detail
