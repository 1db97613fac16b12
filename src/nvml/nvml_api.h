// The slice of the NVML C API that Kareus uses, declared here because the build machines have no
// nvml.h. Values follow NVIDIA's NVML API Reference (nvmlReturn_t, nvmlClockType_t,
// nvmlTemperatureSensors_t, nvmlClocksEventReasons); the library itself is loaded with dlopen.
#pragma once

#include <string>

namespace kareus::nvml::detail {

struct nvmlDevice_st;
using nvmlDevice_t = nvmlDevice_st*;  // opaque handle owned by the driver
using nvmlReturn_t = int;

inline constexpr nvmlReturn_t kNvmlSuccess = 0;
inline constexpr nvmlReturn_t kNvmlErrorInsufficientSize = 7;
inline constexpr nvmlReturn_t kNvmlErrorFunctionNotFound = 13;
inline constexpr unsigned kNvmlClockSm = 1;         // NVML_CLOCK_SM
inline constexpr unsigned kNvmlTemperatureGpu = 0;  // NVML_TEMPERATURE_GPU
// NVML_DEVICE_NAME_V2_BUFFER_SIZE, NVML_DEVICE_UUID_V2_BUFFER_SIZE,
// NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE.
inline constexpr unsigned kNameBufferSize = 96;
inline constexpr unsigned kUuidBufferSize = 96;
inline constexpr unsigned kDriverVersionBufferSize = 80;

using ResetFn = nvmlReturn_t (*)(nvmlDevice_t);

/// Entry points resolved by dlsym. The four marked required must exist for open() to succeed;
/// a missing optional one becomes NvmlUnavailable when it is first used.
struct Api {
  std::string path;
  void* handle = nullptr;
  nvmlReturn_t (*init_v2)() = nullptr;                                               // required
  nvmlReturn_t (*shutdown)() = nullptr;                                              // required
  nvmlReturn_t (*device_get_count_v2)(unsigned*) = nullptr;                          // required
  nvmlReturn_t (*device_get_handle_by_index_v2)(unsigned, nvmlDevice_t*) = nullptr;  // required
  // Selection by identity, because NVML's index order is neither CUDA's nor filtered by
  // CUDA_VISIBLE_DEVICES.
  nvmlReturn_t (*device_get_handle_by_uuid)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*device_get_handle_by_pci_bus_id_v2)(const char*, nvmlDevice_t*) = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*system_get_driver_version)(char*, unsigned) = nullptr;
  nvmlReturn_t (*device_get_name)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*device_get_uuid)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*device_get_total_energy_consumption)(nvmlDevice_t, unsigned long long*) = nullptr;
  nvmlReturn_t (*device_get_power_usage)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*device_get_temperature)(nvmlDevice_t, unsigned, unsigned*) = nullptr;
  nvmlReturn_t (*device_get_clock_info)(nvmlDevice_t, unsigned, unsigned*) = nullptr;
  nvmlReturn_t (*device_get_max_clock_info)(nvmlDevice_t, unsigned, unsigned*) = nullptr;
  // Drivers from R535 name it "event reasons"; older ones only have the "throttle" spelling.
  nvmlReturn_t (*device_get_current_clocks_event_reasons)(nvmlDevice_t,
                                                          unsigned long long*) = nullptr;
  nvmlReturn_t (*device_get_current_clocks_throttle_reasons)(nvmlDevice_t,
                                                             unsigned long long*) = nullptr;
  nvmlReturn_t (*device_get_supported_memory_clocks)(nvmlDevice_t, unsigned*, unsigned*) = nullptr;
  nvmlReturn_t (*device_get_supported_graphics_clocks)(nvmlDevice_t, unsigned, unsigned*,
                                                       unsigned*) = nullptr;
  nvmlReturn_t (*device_set_gpu_locked_clocks)(nvmlDevice_t, unsigned, unsigned) = nullptr;
  ResetFn device_reset_gpu_locked_clocks = nullptr;
};

/// Loads (once per path, never unloaded: signal handlers may call into it until the process
/// ends) the library at `path`. Throws NvmlUnavailable naming the path and dlerror().
const Api& load_api(const std::string& path);

/// Process-wide registry of locked devices, read by the signal/atexit/parent-death reset path.
/// `owner` identifies the Nvml object, so its destructor can reset what it locked before
/// nvmlShutdown invalidates the handles. Registering installs the safety net on first use.
/// Returns true when this call added the device (false: it was registered already).
/// `reset_on_parent_death` also arms PR_SET_PDEATHSIG(SIGTERM) (once, unless the process chose
/// its own death signal): a process-wide setting, so only hosts that ask for it get it.
bool register_locked(nvmlDevice_t device, ResetFn reset, const void* owner,
                     bool reset_on_parent_death);
void unregister_locked(nvmlDevice_t device);
/// Whether `device` is in the registry (the signal path may have reset and removed it).
bool is_registered(nvmlDevice_t device);
/// Resets and unregisters every device registered by `owner` (normal context; errors ignored).
void reset_registered(const void* owner);

}  // namespace kareus::nvml::detail
