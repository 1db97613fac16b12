// The interrupt flag (kareus/interrupt.h): one lock-free atomic, so a signal handler may set it.
#include "kareus/interrupt.h"

#include <atomic>

#include "kareus/error.h"

namespace kareus {
namespace {

std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the flag is set from a signal handler");

}  // namespace

void request_interrupt(int signal) noexcept {
  int none = 0;
  g_signal.compare_exchange_strong(none, signal);
}

int interrupt_requested() noexcept { return g_signal.load(std::memory_order_relaxed); }

void throw_if_interrupted() {
  if (const int s = interrupt_requested(); s != 0) throw Interrupted(s);
}

void clear_interrupt() noexcept { g_signal.store(0); }

}  // namespace kareus
