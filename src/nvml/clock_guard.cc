// Guaranteed reset of locked GPU clocks. A locked clock outlives the process that set it, so a
// crash or a kill must not leave a card slowed down (or pinned high) for the next job. Every lock
// registers the device in a fixed-size, lock-free table before calling NVML; the table is read by
// a SIGINT/SIGTERM/SIGHUP handler (which resets, restores the previous disposition and re-raises),
// by an atexit hook, and (for hosts that opt in: it is process-wide) through
// PR_SET_PDEATHSIG(SIGTERM) when the parent dies. Zeus resets
// clocks the same way at exit (zeus/device/gpu/nvidia.py); the signal path is ours.
//
// The handler calls the cached nvmlDeviceResetGpuLockedClocks pointers directly and touches only
// atomics, write() and sigaction(). NVML itself does not promise async-signal safety, so a signal
// that interrupts an NVML call holding an internal lock could in principle stall the handler;
// that is the residual risk of resetting from signal context.
#include <fmt/format.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

#include "kareus/nvml.h"
#include "nvml_api.h"

namespace kareus::nvml {
namespace detail {
namespace {

struct Slot {
  std::atomic<nvmlDevice_t> device{nullptr};
  std::atomic<ResetFn> reset{nullptr};
  std::atomic<const void*> owner{nullptr};
};
static_assert(std::atomic<nvmlDevice_t>::is_always_lock_free);
static_assert(std::atomic<ResetFn>::is_always_lock_free);

constexpr std::size_t kMaxLocked = 64;  // far more GPUs than one process drives
constexpr std::array<int, 3> kSignals = {SIGINT, SIGTERM, SIGHUP};

std::array<Slot, kMaxLocked> g_slots;
std::mutex g_mu;  // serialises writers; the signal path never takes it
struct sigaction g_previous[kSignals.size()];
std::atomic<bool> g_installed[kSignals.size()];
std::once_flag g_once;
std::once_flag g_pdeath_once;

// Each slot is claimed with exchange, so a device is reset once even if the atexit hook and a
// signal race.
void reset_every_slot() {
  for (auto& slot : g_slots) {
    nvmlDevice_t device = slot.device.exchange(nullptr);
    if (device == nullptr) continue;
    ResetFn reset = slot.reset.load();
    if (reset != nullptr) reset(device);
  }
}

void on_signal(int sig) {
  const int saved_errno = errno;
  reset_every_slot();
  static constexpr char kMessage[] = "kareus: reset locked GPU clocks on a signal\n";
  [[maybe_unused]] const ssize_t n = write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
  for (std::size_t i = 0; i < kSignals.size(); ++i) {
    if (kSignals[i] != sig) continue;
    sigaction(sig, &g_previous[i], nullptr);
    g_installed[i].store(false);
  }
  errno = saved_errno;
  // Delivered once this handler returns, to the previous disposition (usually: terminate).
  raise(sig);
}

void reset_at_exit() { reset_every_slot(); }

// Called with g_mu held.
void install_safety_net(bool reset_on_parent_death) {
  std::call_once(g_once, [] { std::atexit(reset_at_exit); });
  if (reset_on_parent_death) {
    std::call_once(g_pdeath_once, [] {
      // A caller that chose its own death signal keeps it.
      int current = 0;
      if (prctl(PR_GET_PDEATHSIG, &current) == 0 && current == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
      }
    });
  }
  for (std::size_t i = 0; i < kSignals.size(); ++i) {
    if (g_installed[i].load()) continue;
    struct sigaction previous = {};
    if (sigaction(kSignals[i], nullptr, &previous) != 0) continue;
    // An ignored signal does not end the process, so there is nothing to reset for it.
    if ((previous.sa_flags & SA_SIGINFO) == 0 && previous.sa_handler == SIG_IGN) continue;
    struct sigaction ours = {};
    ours.sa_handler = on_signal;
    sigfillset(&ours.sa_mask);  // no second handler may interleave with the resets
    ours.sa_flags = SA_RESTART;
    g_previous[i] = previous;
    if (sigaction(kSignals[i], &ours, nullptr) == 0) g_installed[i].store(true);
  }
}

}  // namespace

bool register_locked(nvmlDevice_t device, ResetFn reset, const void* owner,
                     bool reset_on_parent_death) {
  std::lock_guard lock(g_mu);
  install_safety_net(reset_on_parent_death);
  Slot* free_slot = nullptr;
  for (auto& slot : g_slots) {
    if (slot.device.load() == device) {
      slot.owner.store(owner);
      slot.reset.store(reset);
      return false;
    }
    if (free_slot == nullptr && slot.device.load() == nullptr) free_slot = &slot;
  }
  if (free_slot == nullptr) {
    throw InternalError(fmt::format("more than {} GPUs locked by one process", kMaxLocked));
  }
  free_slot->owner.store(owner);
  free_slot->reset.store(reset);
  free_slot->device.store(device);  // last: publishes the slot to the signal handler
  return true;
}

bool is_registered(nvmlDevice_t device) {
  for (const auto& slot : g_slots) {
    if (slot.device.load() == device) return true;
  }
  return false;
}

void unregister_locked(nvmlDevice_t device) {
  std::lock_guard lock(g_mu);
  for (auto& slot : g_slots) {
    nvmlDevice_t expected = device;
    slot.device.compare_exchange_strong(expected, nullptr);
  }
}

void reset_registered(const void* owner) {
  std::lock_guard lock(g_mu);
  for (auto& slot : g_slots) {
    if (slot.owner.load() != owner) continue;
    nvmlDevice_t device = slot.device.exchange(nullptr);
    if (device == nullptr) continue;
    ResetFn reset = slot.reset.load();
    if (reset != nullptr) reset(device);
  }
}

}  // namespace detail

struct ClockGuard::Impl {
  explicit Impl(Nvml& n) : nvml(n) {}
  Nvml& nvml;
  std::mutex mu;
  std::map<int, int> locked_mhz;  // device index -> locked SM clock
};

ClockGuard::ClockGuard(Nvml& nvml) : impl_(std::make_unique<Impl>(nvml)) {}

ClockGuard::~ClockGuard() {
  try {
    reset_all();
  } catch (const std::exception& e) {
    // A destructor cannot throw; a clock left locked must not pass silently either.
    std::fprintf(stderr, "kareus: warning: could not reset a locked GPU clock: %s\n", e.what());
  }
}

void ClockGuard::lock(int device_index, int freq_mhz) {
  if (freq_mhz <= 0) {
    throw InvalidInput(
        fmt::format("ClockGuard::lock(gpu {}): freq_mhz must be positive, got {} "
                    "(use reset() for default clocks)",
                    device_index, freq_mhz));
  }
  std::lock_guard lock(impl_->mu);
  auto it = impl_->locked_mhz.find(device_index);
  Device& device = impl_->nvml.device(device_index);
  // The signal path may have reset the device (a host handler that did not exit), so the
  // shortcut also needs the registry to still hold it.
  if (it != impl_->locked_mhz.end() && it->second == freq_mhz && device.lock_registered()) return;
  device.lock_sm_clock(freq_mhz, freq_mhz);
  impl_->locked_mhz[device_index] = freq_mhz;
}

void ClockGuard::reset(int device_index) {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->locked_mhz.find(device_index);
  if (it == impl_->locked_mhz.end()) return;
  impl_->nvml.device(device_index).reset_sm_clock();
  impl_->locked_mhz.erase(it);
}

int ClockGuard::locked_mhz(int device_index) const {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->locked_mhz.find(device_index);
  return it == impl_->locked_mhz.end() ? 0 : it->second;
}

void ClockGuard::reset_all() {
  std::lock_guard lock(impl_->mu);
  std::exception_ptr first_error;
  for (auto it = impl_->locked_mhz.begin(); it != impl_->locked_mhz.end();) {
    try {
      impl_->nvml.device(it->first).reset_sm_clock();
      it = impl_->locked_mhz.erase(it);
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
      it = impl_->locked_mhz.erase(it);  // one attempt each; the signal/atexit path still holds it
    }
  }
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace kareus::nvml
