// The NVML layer: one class per concern behind small interfaces, one table that maps NVML return
// codes to typed errors (Zeus's habit). NVML has no header on the build machines and no driver on
// CI, so the library is loaded at run time with dlopen("libnvidia-ml.so.1") (or the path in
// $KAREUS_NVML_LIBRARY, which the tests point at a fake). Nothing here links against NVML.
//
// Safety: the layer opens read-only unless the caller asks for clock control. In read-only mode
// every setter throws NvmlReadOnly before reaching NVML, so a measurement run can never change a
// card setting by accident. Clocks locked through a ClockGuard are reset on normal exit, on an
// exception (the guard's destructor), on SIGINT/SIGTERM/SIGHUP (a handler resets every clock the
// process locked, then re-raises), and, when Options::reset_on_parent_death asks for it, when the
// parent process dies (PR_SET_PDEATHSIG delivers SIGTERM, which takes the same path).
//
// Device selection: NVML's index order is its own (neither CUDA's default order nor filtered by
// CUDA_VISIBLE_DEVICES), so a process that knows its CUDA device should select the NVML device by
// UUID or PCI bus id (device_by_uuid, device_by_pci_bus_id), not by index.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kareus/error.h"

namespace kareus::nvml {

/// An NVML call failed. `code()` is the raw nvmlReturn_t; the subclasses below are the codes a
/// caller may want to handle. Messages name the call, the device and what to do.
class NvmlError : public Error {
 public:
  NvmlError(int code, const std::string& message) : Error(message), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};
/// NVML_ERROR_NOT_SUPPORTED: the device or driver lacks the feature.
class NvmlNotSupported : public NvmlError {
 public:
  using NvmlError::NvmlError;
};
/// NVML_ERROR_NO_PERMISSION: clock control needs root or the admin's persistence/permission setup.
class NvmlNoPermission : public NvmlError {
 public:
  using NvmlError::NvmlError;
};
/// NVML_ERROR_GPU_IS_LOST and friends: the device fell off the bus.
class NvmlGpuLost : public NvmlError {
 public:
  using NvmlError::NvmlError;
};
/// The library could not be loaded (no driver) or lacks a symbol.
class NvmlUnavailable : public NvmlError {
 public:
  using NvmlError::NvmlError;
};
/// A setter was called on a layer opened read-only. Never reaches NVML.
class NvmlReadOnly : public NvmlError {
 public:
  using NvmlError::NvmlError;
};

/// Throws the typed error for `code` (no-op for NVML_SUCCESS = 0). `what` names the call and
/// device, e.g. "nvmlDeviceSetGpuLockedClocks(gpu 3)". The single error table lives here.
void check(int code, const std::string& what, const std::string& detail = "");

enum class Access { kReadOnly, kClockControl };

/// The nvmlClocksEventReasons bits that bias a measurement; every other module names them from
/// here (the thermal model raises them, the protocol decides which repeat a window).
inline constexpr std::uint64_t kReasonSwPowerCap = 0x4;
inline constexpr std::uint64_t kReasonHwSlowdown = 0x8;
inline constexpr std::uint64_t kReasonSwThermalSlowdown = 0x20;
inline constexpr std::uint64_t kReasonHwThermalSlowdown = 0x40;
inline constexpr std::uint64_t kReasonHwPowerBrake = 0x80;
inline constexpr std::uint64_t kBiasingReasons = kReasonSwPowerCap | kReasonHwSlowdown |
                                                 kReasonSwThermalSlowdown |
                                                 kReasonHwThermalSlowdown | kReasonHwPowerBrake;

/// Reasons the clock is below the requested one (nvmlClocksEventReasons bits). `throttled()` is
/// true for the reasons that bias a measurement: power cap, thermal slowdown (hardware or
/// software), hardware slowdown, power brake. Idle and application-clock settings are not.
struct ClockEventReasons {
  std::uint64_t mask = 0;
  bool throttled() const;
  std::string describe() const;  ///< e.g. "sw_power_cap|sw_thermal_slowdown", "none"
};

/// One GPU. Readers are cheap; units in names.
class Device {
 public:
  virtual ~Device() = default;
  virtual int index() const = 0;
  virtual std::string name() = 0;
  virtual std::string uuid() = 0;
  /// Energy since the driver loaded (nvmlDeviceGetTotalEnergyConsumption, mJ -> J).
  virtual double total_energy_j() = 0;
  virtual double power_w() = 0;
  virtual double temperature_c() = 0;
  virtual int sm_clock_mhz() = 0;
  virtual int max_sm_clock_mhz() = 0;
  virtual ClockEventReasons clock_event_reasons() = 0;
  /// Supported graphics clocks at the highest memory clock, ascending.
  virtual std::vector<int> supported_sm_clocks_mhz() = 0;
  /// nvmlDeviceSetGpuLockedClocks(min, max). Throws NvmlReadOnly in read-only mode (before any
  /// NVML call) and InvalidInput unless 0 < min <= max. A locked device joins the process-wide
  /// reset registry (signals, atexit, parent death, destruction of the Nvml object) until
  /// reset_sm_clock succeeds; prefer ClockGuard, which also resets on scope exit.
  virtual void lock_sm_clock(int min_mhz, int max_mhz) = 0;
  /// nvmlDeviceResetGpuLockedClocks. Throws NvmlReadOnly in read-only mode.
  virtual void reset_sm_clock() = 0;
  /// Whether this process's reset registry still holds the device (a lock succeeded and neither
  /// reset_sm_clock nor the signal/atexit path has reset it since). Default: false.
  virtual bool lock_registered() const { return false; }
};

struct Options {
  Access access = Access::kReadOnly;
  std::string library;  ///< empty: $KAREUS_NVML_LIBRARY, else "libnvidia-ml.so.1"
  /// Arm PR_SET_PDEATHSIG(SIGTERM) at the first clock lock, so the clocks are reset when the
  /// parent process dies. A process-wide setting with effects beyond this library (the host then
  /// dies with its parent), so off unless the host is a dedicated process such as kareus-freqd.
  bool reset_on_parent_death = false;
};

/// The loaded library. Initialises NVML on construction; on destruction resets every clock it
/// locked and still holds, then shuts NVML down. Thread-safety: device() may be called from any
/// thread; one Device must not be used by two threads at once.
class Nvml {
 public:
  virtual ~Nvml() = default;
  virtual int device_count() = 0;
  /// Devices are owned by the Nvml object and live as long as it.
  virtual Device& device(int index) = 0;
  /// The device with this UUID ("GPU-..." as nvidia-smi -L and torch print it), via
  /// nvmlDeviceGetHandleByUUID. InvalidInput when no device has it.
  virtual Device& device_by_uuid(const std::string& uuid) = 0;
  /// The device at this PCI bus id ("domain:bus:device.function" in hex, e.g. "00000000:3B:00.0"
  /// as `nvidia-smi --query-gpu=pci.bus_id` prints it), via nvmlDeviceGetHandleByPciBusId_v2.
  /// InvalidInput when no device has it.
  virtual Device& device_by_pci_bus_id(const std::string& pci_bus_id) = 0;
  virtual Access access() const = 0;
  virtual std::string driver_version() = 0;
};

/// Loads NVML. Throws NvmlUnavailable with a clear message when the library is missing or lacks
/// a required entry point; throws the typed error of nvmlInit_v2 when it fails. The library stays
/// loaded until the process ends (the reset path may call into it from a signal handler).
std::unique_ptr<Nvml> open(const Options& o = {});

/// Locks the SM clock of devices and guarantees the reset: on destruction, and through a
/// process-wide registry on SIGINT/SIGTERM/SIGHUP (installs the handlers on first use) and, with
/// Options::reset_on_parent_death, parent death. Locking is skipped when the target equals the
/// current lock and the registry still holds the device.
/// The guard must not outlive `nvml`. PR_SET_PDEATHSIG fires when the *thread* that created this
/// process exits, and is left alone if the caller already chose a death signal. A signal that was
/// ignored (SIG_IGN) stays ignored; a previous handler is restored and runs after the reset.
/// Thread-safe.
class ClockGuard {
 public:
  explicit ClockGuard(Nvml& nvml);
  ~ClockGuard();  ///< resets every device this guard locked (a failure is printed, not thrown)
  ClockGuard(const ClockGuard&) = delete;
  ClockGuard& operator=(const ClockGuard&) = delete;
  /// Locks the SM clock of `device_index` to exactly `freq_mhz` (> 0; InvalidInput otherwise).
  void lock(int device_index, int freq_mhz);
  /// Resets one device if this guard locked it (no NVML call otherwise).
  void reset(int device_index);
  /// The clock this guard holds on `device_index`, 0 when none.
  int locked_mhz(int device_index) const;
  /// Resets every device this guard locked; tries all, then throws the first error.
  void reset_all();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kareus::nvml
