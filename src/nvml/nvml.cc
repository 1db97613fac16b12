// NVML behind Kareus's interface: the library is dlopen'ed at run time (no header or driver on
// CI), each reading converts to SI units with the unit in its name, and every nvmlReturn_t goes
// through one table that picks the typed error and the advice in the message. The layout follows
// Zeus's GPU abstraction (ml-energy/zeus, zeus/device/gpu/nvidia.py: one class per vendor, one
// exception table); return-code values and units are from NVIDIA's NVML API Reference.
#include "kareus/nvml.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>

#include "nvml_api.h"

namespace kareus::nvml {
namespace {

using detail::Api;
using detail::nvmlDevice_t;
using detail::nvmlReturn_t;

enum class Kind { kGeneric, kNotSupported, kNoPermission, kGpuLost, kUnavailable };

struct ErrorEntry {
  int code;
  const char* name;
  Kind kind;
  const char* meaning;
  const char* advice;  // empty: none
};

constexpr const char* kPermissionAdvice =
    "changing GPU clocks needs root: run the job (or its clock controller kareus-freqd) as root, "
    "or have an administrator grant it; clocks are only ever changed when asked for with "
    "--allow-clock-control";

// The single error table (nvmlReturn_t values from the NVML API Reference).
constexpr ErrorEntry kErrorTable[] = {
    {1, "NVML_ERROR_UNINITIALIZED", Kind::kGeneric, "NVML was not initialized", ""},
    {2, "NVML_ERROR_INVALID_ARGUMENT", Kind::kGeneric, "an argument is invalid", ""},
    {3, "NVML_ERROR_NOT_SUPPORTED", Kind::kNotSupported,
     "the device or driver does not support this operation", ""},
    {4, "NVML_ERROR_NO_PERMISSION", Kind::kNoPermission,
     "the current user lacks permission for this operation", kPermissionAdvice},
    {5, "NVML_ERROR_ALREADY_INITIALIZED", Kind::kGeneric, "NVML is already initialized", ""},
    {6, "NVML_ERROR_NOT_FOUND", Kind::kGeneric, "the object was not found", ""},
    {7, "NVML_ERROR_INSUFFICIENT_SIZE", Kind::kGeneric, "a buffer is too small", ""},
    {8, "NVML_ERROR_INSUFFICIENT_POWER", Kind::kGeneric,
     "the device's external power cables are not properly attached", ""},
    {9, "NVML_ERROR_DRIVER_NOT_LOADED", Kind::kUnavailable, "the NVIDIA driver is not loaded",
     "load the nvidia kernel module (is this a machine with a GPU?)"},
    {10, "NVML_ERROR_TIMEOUT", Kind::kGeneric, "the call timed out", ""},
    {11, "NVML_ERROR_IRQ_ISSUE", Kind::kGeneric, "the kernel detected an interrupt issue", ""},
    {12, "NVML_ERROR_LIBRARY_NOT_FOUND", Kind::kUnavailable, "the NVML library was not found", ""},
    {13, "NVML_ERROR_FUNCTION_NOT_FOUND", Kind::kUnavailable,
     "this NVML version does not implement the function", "update the NVIDIA driver"},
    {14, "NVML_ERROR_CORRUPTED_INFOROM", Kind::kGeneric, "the infoROM is corrupted", ""},
    {15, "NVML_ERROR_GPU_IS_LOST", Kind::kGpuLost,
     "the GPU has fallen off the bus or is otherwise inaccessible",
     "the node needs attention (check dmesg for Xid errors)"},
    {16, "NVML_ERROR_RESET_REQUIRED", Kind::kGpuLost, "the GPU needs a reset", ""},
    {17, "NVML_ERROR_OPERATING_SYSTEM", Kind::kUnavailable,
     "the operating system or a cgroup blocked the GPU control device", ""},
    {18, "NVML_ERROR_LIB_RM_VERSION_MISMATCH", Kind::kUnavailable,
     "the NVML library and the kernel driver have different versions",
     "reboot or reload the nvidia kernel module after a driver update"},
    {19, "NVML_ERROR_IN_USE", Kind::kGeneric, "the GPU is in use", ""},
    {20, "NVML_ERROR_MEMORY", Kind::kGeneric, "out of memory", ""},
    {21, "NVML_ERROR_NO_DATA", Kind::kGeneric, "no data", ""},
    {22, "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED", Kind::kNotSupported,
     "ECC is not supported on this vGPU", ""},
    {23, "NVML_ERROR_INSUFFICIENT_RESOURCES", Kind::kGeneric, "insufficient resources", ""},
    {24, "NVML_ERROR_FREQ_NOT_SUPPORTED", Kind::kNotSupported,
     "the requested frequency is not supported", ""},
    {25, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", Kind::kGeneric,
     "the argument struct version does not match", ""},
    {26, "NVML_ERROR_DEPRECATED", Kind::kNotSupported, "the function is deprecated", ""},
    {27, "NVML_ERROR_NOT_READY", Kind::kGeneric, "the system is not ready", ""},
    {28, "NVML_ERROR_GPU_NOT_FOUND", Kind::kGpuLost, "the GPU was not found", ""},
    {29, "NVML_ERROR_INVALID_STATE", Kind::kGeneric, "the GPU is in an invalid state", ""},
    {999, "NVML_ERROR_UNKNOWN", Kind::kGeneric, "unknown error", ""},
};

// Set once a library is loaded, so check() can quote the driver's own text for codes the table
// does not know.
std::atomic<const char* (*)(nvmlReturn_t)> g_error_string{nullptr};

[[noreturn]] void throw_kind(Kind kind, int code, const std::string& message) {
  switch (kind) {
    case Kind::kNotSupported:
      throw NvmlNotSupported(code, message);
    case Kind::kNoPermission:
      throw NvmlNoPermission(code, message);
    case Kind::kGpuLost:
      throw NvmlGpuLost(code, message);
    case Kind::kUnavailable:
      throw NvmlUnavailable(code, message);
    case Kind::kGeneric:
      break;
  }
  throw NvmlError(code, message);
}

std::string default_library() {
  const char* env = std::getenv("KAREUS_NVML_LIBRARY");
  return env != nullptr && *env != '\0' ? env : "libnvidia-ml.so.1";
}

template <typename Fn>
void resolve(Api& api, Fn& slot, const char* symbol) {
  slot = reinterpret_cast<Fn>(dlsym(api.handle, symbol));
}

// The layer's constants for bits of nvmlClocksEventReasons, in bit order.
constexpr std::pair<std::uint64_t, const char*> kReasonNames[] = {
    {0x1, "gpu_idle"},
    {0x2, "applications_clocks_setting"},
    {0x4, "sw_power_cap"},
    {0x8, "hw_slowdown"},
    {0x10, "sync_boost"},
    {0x20, "sw_thermal_slowdown"},
    {0x40, "hw_thermal_slowdown"},
    {0x80, "hw_power_brake_slowdown"},
    {0x100, "display_clock_setting"},
};

class DeviceImpl : public Device {
 public:
  DeviceImpl(const Api& api, Access access, int index, nvmlDevice_t handle, const void* owner,
             bool reset_on_parent_death)
      : api_(api),
        access_(access),
        index_(index),
        handle_(handle),
        owner_(owner),
        reset_on_parent_death_(reset_on_parent_death) {}

  int index() const override { return index_; }

  std::string name() override {
    char buf[detail::kNameBufferSize] = {};
    call(need(api_.device_get_name, "nvmlDeviceGetName")(handle_, buf, sizeof buf),
         "nvmlDeviceGetName");
    return buf;
  }

  std::string uuid() override {
    char buf[detail::kUuidBufferSize] = {};
    call(need(api_.device_get_uuid, "nvmlDeviceGetUUID")(handle_, buf, sizeof buf),
         "nvmlDeviceGetUUID");
    return buf;
  }

  double total_energy_j() override {
    unsigned long long energy_mj = 0;
    call(need(api_.device_get_total_energy_consumption, "nvmlDeviceGetTotalEnergyConsumption")(
             handle_, &energy_mj),
         "nvmlDeviceGetTotalEnergyConsumption");
    return static_cast<double>(energy_mj) / 1e3;
  }

  double power_w() override {
    unsigned power_mw = 0;
    call(need(api_.device_get_power_usage, "nvmlDeviceGetPowerUsage")(handle_, &power_mw),
         "nvmlDeviceGetPowerUsage");
    return static_cast<double>(power_mw) / 1e3;
  }

  double temperature_c() override {
    unsigned temp_c = 0;
    call(need(api_.device_get_temperature, "nvmlDeviceGetTemperature")(
             handle_, detail::kNvmlTemperatureGpu, &temp_c),
         "nvmlDeviceGetTemperature");
    return static_cast<double>(temp_c);
  }

  int sm_clock_mhz() override {
    unsigned mhz = 0;
    call(need(api_.device_get_clock_info, "nvmlDeviceGetClockInfo")(handle_, detail::kNvmlClockSm,
                                                                    &mhz),
         "nvmlDeviceGetClockInfo");
    return static_cast<int>(mhz);
  }

  int max_sm_clock_mhz() override {
    unsigned mhz = 0;
    call(need(api_.device_get_max_clock_info, "nvmlDeviceGetMaxClockInfo")(
             handle_, detail::kNvmlClockSm, &mhz),
         "nvmlDeviceGetMaxClockInfo");
    return static_cast<int>(mhz);
  }

  ClockEventReasons clock_event_reasons() override {
    unsigned long long mask = 0;
    if (api_.device_get_current_clocks_event_reasons != nullptr) {
      call(api_.device_get_current_clocks_event_reasons(handle_, &mask),
           "nvmlDeviceGetCurrentClocksEventReasons");
    } else {
      call(need(api_.device_get_current_clocks_throttle_reasons,
                "nvmlDeviceGetCurrentClocksEventReasons or "
                "nvmlDeviceGetCurrentClocksThrottleReasons")(handle_, &mask),
           "nvmlDeviceGetCurrentClocksThrottleReasons");
    }
    return ClockEventReasons{mask};
  }

  std::vector<int> supported_sm_clocks_mhz() override {
    const auto memory = query_list(
        [&](unsigned* count, unsigned* out) {
          return need(api_.device_get_supported_memory_clocks,
                      "nvmlDeviceGetSupportedMemoryClocks")(handle_, count, out);
        },
        "nvmlDeviceGetSupportedMemoryClocks");
    if (memory.empty()) {
      throw NvmlNotSupported(3, fmt::format("nvmlDeviceGetSupportedMemoryClocks(gpu {}): the "
                                            "driver reports no memory clocks",
                                            index_));
    }
    const unsigned memory_mhz = *std::max_element(memory.begin(), memory.end());
    auto graphics = query_list(
        [&](unsigned* count, unsigned* out) {
          return need(api_.device_get_supported_graphics_clocks,
                      "nvmlDeviceGetSupportedGraphicsClocks")(handle_, memory_mhz, count, out);
        },
        "nvmlDeviceGetSupportedGraphicsClocks");
    std::vector<int> clocks(graphics.begin(), graphics.end());
    std::sort(clocks.begin(), clocks.end());
    clocks.erase(std::unique(clocks.begin(), clocks.end()), clocks.end());
    return clocks;
  }

  void lock_sm_clock(int min_mhz, int max_mhz) override {
    const std::string what = fmt::format("nvmlDeviceSetGpuLockedClocks(gpu {})", index_);
    refuse_if_read_only(what);
    if (min_mhz <= 0 || max_mhz < min_mhz) {
      throw InvalidInput(
          fmt::format("{}: clock range [{}, {}] MHz is invalid (need 0 < min <= "
                      "max)",
                      what, min_mhz, max_mhz));
    }
    auto* set = need(api_.device_set_gpu_locked_clocks, "nvmlDeviceSetGpuLockedClocks");
    auto* reset = need(api_.device_reset_gpu_locked_clocks, "nvmlDeviceResetGpuLockedClocks");
    // Registered before the call, so a signal that lands during it still resets the clock.
    const bool added = detail::register_locked(handle_, reset, owner_, reset_on_parent_death_);
    const nvmlReturn_t rc =
        set(handle_, static_cast<unsigned>(min_mhz), static_cast<unsigned>(max_mhz));
    if (rc != detail::kNvmlSuccess) {
      // A failed re-lock leaves the device at its previous lock, which still needs the reset.
      if (added) detail::unregister_locked(handle_);
      check(rc, what, fmt::format("locking the SM clock to [{}, {}] MHz", min_mhz, max_mhz));
    }
  }

  void reset_sm_clock() override {
    const std::string what = fmt::format("nvmlDeviceResetGpuLockedClocks(gpu {})", index_);
    refuse_if_read_only(what);
    auto* reset = need(api_.device_reset_gpu_locked_clocks, "nvmlDeviceResetGpuLockedClocks");
    const nvmlReturn_t rc = reset(handle_);
    check(rc, what);
    detail::unregister_locked(handle_);
  }

  bool lock_registered() const override { return detail::is_registered(handle_); }

 private:
  template <typename Fn>
  Fn need(Fn fn, const char* symbol) const {
    if (fn == nullptr) {
      throw NvmlUnavailable(detail::kNvmlErrorFunctionNotFound,
                            fmt::format("{} (gpu {}): the NVML library {} lacks this function; "
                                        "the NVIDIA driver is probably too old",
                                        symbol, index_, api_.path));
    }
    return fn;
  }

  void call(nvmlReturn_t rc, const char* fn) const {
    if (rc != detail::kNvmlSuccess) check(rc, fmt::format("{}(gpu {})", fn, index_));
  }

  void refuse_if_read_only(const std::string& what) const {
    if (access_ == Access::kReadOnly) {
      throw NvmlReadOnly(
          -1, fmt::format("{}: NVML was opened read-only, so no card setting is changed; clock "
                          "control must be asked for explicitly (--allow-clock-control)",
                          what));
    }
  }

  // NVML's list queries take a capacity and answer INSUFFICIENT_SIZE with the needed count.
  template <typename Query>
  std::vector<unsigned> query_list(Query query, const char* fn) const {
    std::vector<unsigned> out(128);
    for (int attempt = 0; attempt < 4; ++attempt) {
      unsigned count = static_cast<unsigned>(out.size());
      const nvmlReturn_t rc = query(&count, out.data());
      if (rc == detail::kNvmlErrorInsufficientSize && count > out.size()) {
        out.resize(count);
        continue;
      }
      call(rc, fn);
      out.resize(std::min<std::size_t>(count, out.size()));
      return out;
    }
    check(detail::kNvmlErrorInsufficientSize, fmt::format("{}(gpu {})", fn, index_));
    return {};
  }

  const Api& api_;
  Access access_;
  int index_;
  nvmlDevice_t handle_;
  const void* owner_;
  bool reset_on_parent_death_;
};

class NvmlImpl : public Nvml {
 public:
  NvmlImpl(const Api& api, const Options& o)
      : api_(api), access_(o.access), reset_on_parent_death_(o.reset_on_parent_death) {
    check(api_.init_v2(), fmt::format("nvmlInit_v2 ({})", api_.path));
  }

  ~NvmlImpl() override {
    // Handles die with nvmlShutdown, so whatever this object locked is reset first.
    detail::reset_registered(this);
    api_.shutdown();
  }

  int device_count() override {
    unsigned count = 0;
    check(api_.device_get_count_v2(&count), "nvmlDeviceGetCount_v2");
    return static_cast<int>(count);
  }

  Device& device(int index) override {
    std::lock_guard lock(mu_);
    auto it = devices_.find(index);
    if (it != devices_.end()) return *it->second;
    const int count = device_count();
    if (index < 0 || index >= count) {
      throw InvalidInput(
          fmt::format("GPU index {} is out of range: NVML sees {} device(s) "
                      "(indices 0..{})",
                      index, count, count - 1));
    }
    nvmlDevice_t handle = nullptr;
    check(api_.device_get_handle_by_index_v2(static_cast<unsigned>(index), &handle),
          fmt::format("nvmlDeviceGetHandleByIndex_v2(gpu {})", index));
    auto [pos, inserted] = devices_.emplace(
        index,
        std::make_unique<DeviceImpl>(api_, access_, index, handle, this, reset_on_parent_death_));
    return *pos->second;
  }

  Device& device_by_uuid(const std::string& uuid) override {
    return by_identity(api_.device_get_handle_by_uuid, "nvmlDeviceGetHandleByUUID", "UUID", uuid,
                       "as `nvidia-smi -L` prints it, e.g. GPU-8f3c...");
  }

  Device& device_by_pci_bus_id(const std::string& pci_bus_id) override {
    return by_identity(api_.device_get_handle_by_pci_bus_id_v2, "nvmlDeviceGetHandleByPciBusId_v2",
                       "PCI bus id", pci_bus_id,
                       "domain:bus:device.function in hex, as `nvidia-smi --query-gpu=pci.bus_id "
                       "--format=csv` prints it, e.g. 00000000:3B:00.0");
  }

  Access access() const override { return access_; }

 private:
  using ByIdentityFn = nvmlReturn_t (*)(const char*, nvmlDevice_t*);

  // NVML hands out one handle per device, so the index is the one whose handle matches.
  Device& by_identity(ByIdentityFn fn, const char* symbol, const char* what, const std::string& id,
                      const char* format) {
    if (id.empty()) throw InvalidInput(fmt::format("GPU {}: empty ({})", what, format));
    if (fn == nullptr) {
      throw NvmlUnavailable(detail::kNvmlErrorFunctionNotFound,
                            fmt::format("{}: missing from {}; the NVIDIA driver is too old to "
                                        "select a GPU by {} (select it by index instead)",
                                        symbol, api_.path, what));
    }
    nvmlDevice_t handle = nullptr;
    const nvmlReturn_t rc = fn(id.c_str(), &handle);
    // NOT_FOUND (6) and INVALID_ARGUMENT (2): no such device, or a malformed id.
    if (rc == 6 || rc == 2) {
      throw InvalidInput(fmt::format("GPU {} '{}': NVML has no such device ({}; expected {})", what,
                                     id, rc == 6 ? "not found" : "invalid argument", format));
    }
    check(rc, fmt::format("{}({})", symbol, id));
    const int count = device_count();
    for (int i = 0; i < count; ++i) {
      nvmlDevice_t other = nullptr;
      check(api_.device_get_handle_by_index_v2(static_cast<unsigned>(i), &other),
            fmt::format("nvmlDeviceGetHandleByIndex_v2(gpu {})", i));
      if (other == handle) return device(i);
    }
    throw InternalError(
        fmt::format("{}({}): NVML returned a handle that no device index has", symbol, id));
  }

 public:
  std::string driver_version() override {
    if (api_.system_get_driver_version == nullptr) {
      throw NvmlUnavailable(detail::kNvmlErrorFunctionNotFound,
                            fmt::format("nvmlSystemGetDriverVersion: missing from {}", api_.path));
    }
    char buf[detail::kDriverVersionBufferSize] = {};
    check(api_.system_get_driver_version(buf, sizeof buf), "nvmlSystemGetDriverVersion");
    return buf;
  }

 private:
  const Api& api_;
  Access access_;
  bool reset_on_parent_death_;
  std::mutex mu_;
  std::map<int, std::unique_ptr<DeviceImpl>> devices_;
};

}  // namespace

void check(int code, const std::string& what, const std::string& detail) {
  if (code == 0) return;  // NVML_SUCCESS
  const ErrorEntry* entry = nullptr;
  for (const auto& e : kErrorTable) {
    if (e.code == code) entry = &e;
  }
  std::string message;
  if (entry != nullptr) {
    message = fmt::format("{}: {} ({}): {}", what, entry->name, code, entry->meaning);
  } else {
    const auto error_string = g_error_string.load();
    message = fmt::format("{}: NVML error {}{}{}", what, code, error_string ? ": " : "",
                          error_string ? error_string(code) : "");
  }
  if (!detail.empty()) message += fmt::format(" (while {})", detail);
  if (entry != nullptr && *entry->advice != '\0') message += fmt::format("; {}", entry->advice);
  throw_kind(entry != nullptr ? entry->kind : Kind::kGeneric, code, message);
}

bool ClockEventReasons::throttled() const { return (mask & kBiasingReasons) != 0; }

std::string ClockEventReasons::describe() const {
  std::string out;
  std::uint64_t known = 0;
  for (const auto& [bit, name] : kReasonNames) {
    known |= bit;
    if ((mask & bit) == 0) continue;
    if (!out.empty()) out += '|';
    out += name;
  }
  if ((mask & ~known) != 0) {
    if (!out.empty()) out += '|';
    out += fmt::format("0x{:x}", mask & ~known);
  }
  return out.empty() ? "none" : out;
}

namespace detail {

const Api& load_api(const std::string& path) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Api>> loaded;  // never unloaded, see header
  std::lock_guard lock(mu);
  if (auto it = loaded.find(path); it != loaded.end()) return *it->second;
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    throw NvmlUnavailable(
        12, fmt::format("cannot load NVML from '{}': {}. NVML ships with the NVIDIA driver: "
                        "this machine has no driver installed, or set $KAREUS_NVML_LIBRARY to "
                        "the library's path",
                        path, err != nullptr ? err : "unknown dlopen error"));
  }
  auto api = std::make_unique<Api>();
  api->path = path;
  api->handle = handle;
  resolve(*api, api->init_v2, "nvmlInit_v2");
  resolve(*api, api->shutdown, "nvmlShutdown");
  resolve(*api, api->device_get_count_v2, "nvmlDeviceGetCount_v2");
  resolve(*api, api->device_get_handle_by_index_v2, "nvmlDeviceGetHandleByIndex_v2");
  const std::pair<bool, const char*> required[] = {
      {api->init_v2 != nullptr, "nvmlInit_v2"},
      {api->shutdown != nullptr, "nvmlShutdown"},
      {api->device_get_count_v2 != nullptr, "nvmlDeviceGetCount_v2"},
      {api->device_get_handle_by_index_v2 != nullptr, "nvmlDeviceGetHandleByIndex_v2"},
  };
  for (const auto& [found, symbol] : required) {
    if (!found) {
      dlclose(handle);
      throw NvmlUnavailable(kNvmlErrorFunctionNotFound,
                            fmt::format("'{}' is not a usable NVML library: it lacks {} (the "
                                        "NVIDIA driver is too old or this is another library)",
                                        path, symbol));
    }
  }
  resolve(*api, api->error_string, "nvmlErrorString");
  resolve(*api, api->device_get_handle_by_uuid, "nvmlDeviceGetHandleByUUID");
  resolve(*api, api->device_get_handle_by_pci_bus_id_v2, "nvmlDeviceGetHandleByPciBusId_v2");
  resolve(*api, api->system_get_driver_version, "nvmlSystemGetDriverVersion");
  resolve(*api, api->device_get_name, "nvmlDeviceGetName");
  resolve(*api, api->device_get_uuid, "nvmlDeviceGetUUID");
  resolve(*api, api->device_get_total_energy_consumption, "nvmlDeviceGetTotalEnergyConsumption");
  resolve(*api, api->device_get_power_usage, "nvmlDeviceGetPowerUsage");
  resolve(*api, api->device_get_temperature, "nvmlDeviceGetTemperature");
  resolve(*api, api->device_get_clock_info, "nvmlDeviceGetClockInfo");
  resolve(*api, api->device_get_max_clock_info, "nvmlDeviceGetMaxClockInfo");
  resolve(*api, api->device_get_current_clocks_event_reasons,
          "nvmlDeviceGetCurrentClocksEventReasons");
  resolve(*api, api->device_get_current_clocks_throttle_reasons,
          "nvmlDeviceGetCurrentClocksThrottleReasons");
  resolve(*api, api->device_get_supported_memory_clocks, "nvmlDeviceGetSupportedMemoryClocks");
  resolve(*api, api->device_get_supported_graphics_clocks, "nvmlDeviceGetSupportedGraphicsClocks");
  resolve(*api, api->device_set_gpu_locked_clocks, "nvmlDeviceSetGpuLockedClocks");
  resolve(*api, api->device_reset_gpu_locked_clocks, "nvmlDeviceResetGpuLockedClocks");
  if (api->error_string != nullptr) g_error_string.store(api->error_string);
  auto [pos, inserted] = loaded.emplace(path, std::move(api));
  return *pos->second;
}

}  // namespace detail

std::unique_ptr<Nvml> open(const Options& o) {
  const std::string path = o.library.empty() ? default_library() : o.library;
  return std::make_unique<NvmlImpl>(detail::load_api(path), o);
}

}  // namespace kareus::nvml
