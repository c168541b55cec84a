// fault_guard.hpp: a mapped file that shrinks while it is read raises SIGBUS; inside a guarded
// call that fault becomes an Error naming the file, for the thread that read, and the process
// lives on.
#pragma once

#include <cstddef>
#include <string>

namespace numalign::detail {

// Mapped files register their bytes, so that a fault's address names its file. Registering
// the first one installs the SIGBUS handler (chained: a fault outside a guarded call goes to
// the handler that was there before, or kills the process as it would have).
void register_mapping(const void* begin, std::size_t size, const std::string& path);
void unregister_mapping(const void* begin);
// The path of the registered mapping that holds `address`, or "" when none does.
std::string mapped_file_at(const void* address);

// Calls fn(ctx). A SIGBUS on this thread during the call unwinds (siglongjmp) back here and
// throws Error(<the mapped file>, "changed while being read ..."). What the interrupted code
// held is not destroyed: code run here must only read (the metrics kernels, the checks).
// Costs one sigsetjmp without the signal mask (no system call) per call.
void call_guarded(void (*fn)(void*), void* ctx);

template <class F>
void guarded(F&& f) {
  call_guarded([](void* c) { (*static_cast<F*>(c))(); },
               const_cast<void*>(static_cast<const void*>(&f)));
}

}  // namespace numalign::detail
