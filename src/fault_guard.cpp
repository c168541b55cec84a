// fault_guard.cpp: SIGBUS from a shrunk mapping turned into an Error for the reading thread.
#include "fault_guard.hpp"

#include <setjmp.h>
#include <signal.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "numalign/error.hpp"

namespace numalign::detail {

namespace {

struct Mapping {
  const std::byte* begin;
  std::size_t size;
  std::string path;
};

std::mutex g_mutex;
std::vector<Mapping> g_mappings;
struct sigaction g_previous {};

thread_local sigjmp_buf* t_jump = nullptr;
thread_local const void* t_fault = nullptr;

extern "C" void on_sigbus(int sig, siginfo_t* info, void* /*context*/) {
  if (sigjmp_buf* jump = t_jump; jump != nullptr && info && info->si_code > 0) {
    t_jump = nullptr;
    t_fault = info->si_addr;
    siglongjmp(*jump, 1);
  }
  // Not a fault of a guarded read: what was there before handles it (returning re-runs the
  // faulting access under it; a signal sent by kill is raised again).
  ::sigaction(SIGBUS, &g_previous, nullptr);
  if (!info || info->si_code <= 0) ::raise(sig);
}

void install_handler() {
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
  ::sigaction(SIGBUS, &sa, &g_previous);
}

}  // namespace

void register_mapping(const void* begin, std::size_t size, const std::string& path) {
  static std::once_flag once;
  std::call_once(once, install_handler);
  const std::lock_guard<std::mutex> lock(g_mutex);
  g_mappings.push_back({static_cast<const std::byte*>(begin), size, path});
}

std::string mapped_file_at(const void* address) {
  const auto* a = static_cast<const std::byte*>(address);
  const std::lock_guard<std::mutex> lock(g_mutex);
  for (const Mapping& m : g_mappings) {
    if (a >= m.begin && a < m.begin + m.size) return m.path;
  }
  return "";
}

void unregister_mapping(const void* begin) {
  const std::lock_guard<std::mutex> lock(g_mutex);
  const auto it = std::find_if(g_mappings.begin(), g_mappings.end(),
                               [&](const Mapping& m) { return m.begin == begin; });
  if (it != g_mappings.end()) g_mappings.erase(it);
}

void call_guarded(void (*fn)(void*), void* ctx) {
  sigjmp_buf jump;
  sigjmp_buf* const outer = t_jump;
  if (sigsetjmp(jump, 0) != 0) {
    t_jump = outer;
    // SA_NODEFER left SIGBUS unblocked; the jump kept the mask as it was.
    const std::string file = mapped_file_at(t_fault);
    fail(file.empty() ? "a mapped file" : file,
         "changed while being read (it shrank: truncated or rewritten during the pass); "
         "judge a copy that nothing writes to");
  }
  t_jump = &jump;
  try {
    fn(ctx);
  } catch (...) {
    t_jump = outer;
    throw;
  }
  t_jump = outer;
}

}  // namespace numalign::detail
