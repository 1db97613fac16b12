// A fake libnvidia-ml.so.1 for machines without a GPU. It exports the NVML entry points Kareus
// uses, answers from environment variables read at nvmlInit_v2, and appends one line per call
// (pid, function, arguments, return code) to $KAREUS_FAKE_NVML_LOG, so a test can see exactly
// what reached "the driver" from any process, including from a signal handler: the line is built
// on the stack and written with a single write() on an O_APPEND descriptor.
//
// Environment (all optional):
//   KAREUS_FAKE_NVML_LOG            call log path
//   KAREUS_FAKE_NVML_DEVICES        device count (default 1, at most 8)
//   KAREUS_FAKE_NVML_NAME           device name (default "NVIDIA A100-SXM4-40GB")
//   KAREUS_FAKE_NVML_POWER_W        power; the energy counter grows by it per second (default 100)
//   KAREUS_FAKE_NVML_ENERGY_MJ      comma list: successive energy readings in mJ (last repeats)
//   KAREUS_FAKE_NVML_TEMP_C         temperature (default 45)
//   KAREUS_FAKE_NVML_SM_CLOCK_MHZ   current SM clock when not locked (default 1410)
//   KAREUS_FAKE_NVML_MAX_CLOCK_MHZ  max SM clock (default 1410)
//   KAREUS_FAKE_NVML_REASONS        clock event reasons mask (strtoull base 0, default 0)
//   KAREUS_FAKE_NVML_DENY=1         setters answer NVML_ERROR_NO_PERMISSION (4)
//   KAREUS_FAKE_NVML_LOCK_DELAY_MS  nvmlDeviceSetGpuLockedClocks takes this long (a slow driver)
//   KAREUS_FAKE_NVML_REJECT_MHZ     a lock whose max is this clock answers
//                                   NVML_ERROR_FREQ_NOT_SUPPORTED (24) and changes nothing
//   KAREUS_FAKE_NVML_FAIL           "fn=code,fn=code": force a return code for a function
// Identity: device i has UUID "GPU-fake-0000-<i>" and PCI bus id "00000000:<80 - 16 i, hex>:00.0",
// so bus order is the reverse of index order (as NVML's order need not match CUDA's).
// Supported clocks: memory {405, 1215} MHz (in that order); graphics at 1215 MHz: max clock down
// to 210 MHz in steps of 15 (descending, as NVML lists them); at 405 MHz: {405, 390}.
// Built twice: the "old driver" variant (KAREUS_FAKE_NVML_OLD_DRIVER) lacks
// nvmlDeviceGetCurrentClocksEventReasons, like drivers before R535.
#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace {

constexpr int kSuccess = 0;
constexpr int kUninitialized = 1;
constexpr int kInvalidArgument = 2;
constexpr int kNoPermission = 4;
constexpr int kNotFound = 6;
constexpr int kInsufficientSize = 7;
constexpr int kMaxDevices = 8;

struct FakeDevice {
  int index;
  unsigned locked_mhz;  // 0: not locked
  int energy_step;
};

struct Config {
  int devices = 1;
  char name[96] = "NVIDIA A100-SXM4-40GB";
  double power_w = 100;
  unsigned long long energy_mj[64] = {};
  int energy_steps = 0;
  unsigned temp_c = 45;
  unsigned sm_clock_mhz = 1410;
  unsigned max_clock_mhz = 1410;
  unsigned long long reasons = 0;
  bool deny = false;
  unsigned reject_mhz = 0;
  unsigned lock_delay_ms = 0;
  char fail[512] = "";
};

Config g_config;
FakeDevice g_devices[kMaxDevices];
int g_init_count = 0;
char g_log_path[4096] = "";
timespec g_t0 = {0, 0};

// --- one-line, allocation-free log writer (usable from a signal handler) ---
struct Line {
  char buf[512];
  std::size_t len = 0;
  void put(const char* s) {
    while (*s != '\0' && len + 1 < sizeof buf) buf[len++] = *s++;
  }
  void put_u(unsigned long long v) {
    char tmp[24];
    int n = 0;
    do {
      tmp[n++] = static_cast<char>('0' + v % 10);
      v /= 10;
    } while (v != 0);
    while (n > 0 && len + 1 < sizeof buf) buf[len++] = tmp[--n];
  }
  void put_i(long long v) {
    if (v < 0) {
      put("-");
      put_u(static_cast<unsigned long long>(-v));
    } else {
      put_u(static_cast<unsigned long long>(v));
    }
  }
  void kv(const char* key, unsigned long long v) {
    put(" ");
    put(key);
    put("=");
    put_u(v);
  }
};

int finish(Line& line, int rc) {
  line.put(" rc=");
  line.put_i(rc);
  line.put("\n");
  const char* path = g_log_path[0] != '\0' ? g_log_path : std::getenv("KAREUS_FAKE_NVML_LOG");
  if (path == nullptr || *path == '\0') return rc;
  const int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return rc;
  [[maybe_unused]] const ssize_t n = write(fd, line.buf, line.len);
  close(fd);
  return rc;
}

Line begin(const char* fn) {
  Line line;
  line.put("pid=");
  line.put_i(getpid());
  line.put(" ");
  line.put(fn);
  return line;
}

// A forced return code for `fn` from KAREUS_FAKE_NVML_FAIL, or -1.
int forced(const char* fn) {
  const std::size_t n = std::strlen(fn);
  for (const char* p = g_config.fail; *p != '\0';) {
    const char* eq = std::strchr(p, '=');
    if (eq == nullptr) break;
    const char* end = std::strchr(eq, ',');
    if (static_cast<std::size_t>(eq - p) == n && std::strncmp(p, fn, n) == 0) {
      return std::atoi(eq + 1);
    }
    if (end == nullptr) break;
    p = end + 1;
  }
  return -1;
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

void copy(char* dst, std::size_t cap, const char* src) {
  std::strncpy(dst, src, cap - 1);
  dst[cap - 1] = '\0';
}

void read_config() {
  g_config = Config{};
  g_log_path[0] = '\0';
  if (const char* v = env("KAREUS_FAKE_NVML_LOG")) copy(g_log_path, sizeof g_log_path, v);
  if (const char* v = env("KAREUS_FAKE_NVML_DEVICES")) g_config.devices = std::atoi(v);
  if (g_config.devices < 0) g_config.devices = 0;
  if (g_config.devices > kMaxDevices) g_config.devices = kMaxDevices;
  if (const char* v = env("KAREUS_FAKE_NVML_NAME")) copy(g_config.name, sizeof g_config.name, v);
  if (const char* v = env("KAREUS_FAKE_NVML_POWER_W")) g_config.power_w = std::atof(v);
  if (const char* v = env("KAREUS_FAKE_NVML_ENERGY_MJ")) {
    const char* p = v;
    while (*p != '\0' && g_config.energy_steps < 64) {
      char* end = nullptr;
      g_config.energy_mj[g_config.energy_steps++] = std::strtoull(p, &end, 10);
      if (end == p || *end != ',') break;
      p = end + 1;
    }
  }
  if (const char* v = env("KAREUS_FAKE_NVML_TEMP_C")) g_config.temp_c = std::atoi(v);
  if (const char* v = env("KAREUS_FAKE_NVML_SM_CLOCK_MHZ")) g_config.sm_clock_mhz = std::atoi(v);
  if (const char* v = env("KAREUS_FAKE_NVML_MAX_CLOCK_MHZ")) g_config.max_clock_mhz = std::atoi(v);
  if (const char* v = env("KAREUS_FAKE_NVML_REASONS"))
    g_config.reasons = std::strtoull(v, nullptr, 0);
  if (const char* v = env("KAREUS_FAKE_NVML_DENY")) g_config.deny = std::strcmp(v, "1") == 0;
  if (const char* v = env("KAREUS_FAKE_NVML_REJECT_MHZ")) g_config.reject_mhz = std::atoi(v);
  if (const char* v = env("KAREUS_FAKE_NVML_LOCK_DELAY_MS")) g_config.lock_delay_ms = std::atoi(v);
  if (const char* v = env("KAREUS_FAKE_NVML_FAIL")) copy(g_config.fail, sizeof g_config.fail, v);
}

FakeDevice* device_of(void* handle) {
  for (auto& d : g_devices) {
    if (&d == handle) return &d;
  }
  return nullptr;
}

// Common prologue of a device call: logs, checks init, handle and forced failures.
int device_prologue(const char* fn, void* handle, Line& line, FakeDevice** out) {
  FakeDevice* d = device_of(handle);
  line.kv("gpu", d != nullptr ? static_cast<unsigned long long>(d->index) : 999);
  if (g_init_count <= 0) return kUninitialized;
  if (d == nullptr || d->index >= g_config.devices) return kInvalidArgument;
  if (const int rc = forced(fn); rc >= 0) return rc;
  *out = d;
  return kSuccess;
}

int list_reply(const unsigned* values, unsigned n, unsigned* count, unsigned* out) {
  if (count == nullptr) return kInvalidArgument;
  if (*count < n || out == nullptr) {
    *count = n;
    return kInsufficientSize;
  }
  for (unsigned i = 0; i < n; ++i) out[i] = values[i];
  *count = n;
  return kSuccess;
}

}  // namespace

extern "C" {

int nvmlInit_v2() {
  read_config();
  Line line = begin("nvmlInit_v2");
  if (const int rc = forced("nvmlInit_v2"); rc >= 0) return finish(line, rc);
  if (g_init_count++ == 0) {
    for (int i = 0; i < kMaxDevices; ++i) g_devices[i] = FakeDevice{i, 0, 0};
    clock_gettime(CLOCK_MONOTONIC, &g_t0);
  }
  return finish(line, kSuccess);
}

int nvmlShutdown() {
  Line line = begin("nvmlShutdown");
  if (g_init_count <= 0) return finish(line, kUninitialized);
  --g_init_count;
  return finish(line, kSuccess);
}

const char* nvmlErrorString(int rc) { return rc == 0 ? "Success" : "fake NVML error"; }

int nvmlSystemGetDriverVersion(char* version, unsigned length) {
  Line line = begin("nvmlSystemGetDriverVersion");
  if (g_init_count <= 0) return finish(line, kUninitialized);
  if (version == nullptr || length < 8) return finish(line, kInsufficientSize);
  copy(version, length, "999.99-fake");
  return finish(line, kSuccess);
}

int nvmlDeviceGetCount_v2(unsigned* count) {
  Line line = begin("nvmlDeviceGetCount_v2");
  if (g_init_count <= 0) return finish(line, kUninitialized);
  if (const int rc = forced("nvmlDeviceGetCount_v2"); rc >= 0) return finish(line, rc);
  *count = static_cast<unsigned>(g_config.devices);
  return finish(line, kSuccess);
}

int nvmlDeviceGetHandleByIndex_v2(unsigned index, void** device) {
  Line line = begin("nvmlDeviceGetHandleByIndex_v2");
  line.kv("index", index);
  if (g_init_count <= 0) return finish(line, kUninitialized);
  if (const int rc = forced("nvmlDeviceGetHandleByIndex_v2"); rc >= 0) return finish(line, rc);
  if (index >= static_cast<unsigned>(g_config.devices)) return finish(line, kInvalidArgument);
  *device = &g_devices[index];
  return finish(line, kSuccess);
}

// "domain:bus:device.function" or "bus:device.function", hex, any case (as NVML accepts).
int nvmlDeviceGetHandleByPciBusId_v2(const char* bus_id, void** device) {
  Line line = begin("nvmlDeviceGetHandleByPciBusId_v2");
  line.put(" id=");
  line.put(bus_id != nullptr ? bus_id : "(null)");
  if (g_init_count <= 0) return finish(line, kUninitialized);
  if (const int rc = forced("nvmlDeviceGetHandleByPciBusId_v2"); rc >= 0) return finish(line, rc);
  if (bus_id == nullptr || device == nullptr) return finish(line, kInvalidArgument);
  unsigned domain = 0, bus = 0, dev = 0, fn = 0;
  char tail = 0;
  if (std::sscanf(bus_id, "%x:%x:%x.%x%c", &domain, &bus, &dev, &fn, &tail) != 4) {
    domain = 0;
    if (std::sscanf(bus_id, "%x:%x.%x%c", &bus, &dev, &fn, &tail) != 3) {
      return finish(line, kInvalidArgument);
    }
  }
  for (int i = 0; i < g_config.devices; ++i) {
    if (domain == 0 && bus == static_cast<unsigned>(0x80 - 0x10 * i) && dev == 0 && fn == 0) {
      *device = &g_devices[i];
      return finish(line, kSuccess);
    }
  }
  return finish(line, kNotFound);
}

int nvmlDeviceGetHandleByUUID(const char* uuid, void** device) {
  Line line = begin("nvmlDeviceGetHandleByUUID");
  line.put(" id=");
  line.put(uuid != nullptr ? uuid : "(null)");
  if (g_init_count <= 0) return finish(line, kUninitialized);
  if (const int rc = forced("nvmlDeviceGetHandleByUUID"); rc >= 0) return finish(line, rc);
  if (uuid == nullptr || device == nullptr) return finish(line, kInvalidArgument);
  constexpr char kPrefix[] = "GPU-fake-0000-";
  if (std::strncmp(uuid, kPrefix, sizeof kPrefix - 1) == 0) {
    const char* digits = uuid + sizeof kPrefix - 1;
    char* end = nullptr;
    const long i = std::strtol(digits, &end, 10);
    if (end != digits && *end == '\0' && i >= 0 && i < g_config.devices) {
      *device = &g_devices[i];
      return finish(line, kSuccess);
    }
  }
  return finish(line, kNotFound);
}

int nvmlDeviceGetName(void* device, char* name, unsigned length) {
  Line line = begin("nvmlDeviceGetName");
  FakeDevice* d = nullptr;
  if (const int rc = device_prologue("nvmlDeviceGetName", device, line, &d); rc != 0) {
    return finish(line, rc);
  }
  copy(name, length, g_config.name);
  return finish(line, kSuccess);
}

int nvmlDeviceGetUUID(void* device, char* uuid, unsigned length) {
  Line line = begin("nvmlDeviceGetUUID");
  FakeDevice* d = nullptr;
  if (const int rc = device_prologue("nvmlDeviceGetUUID", device, line, &d); rc != 0) {
    return finish(line, rc);
  }
  char text[64] = "GPU-fake-0000-";
  Line id;
  id.put(text);
  id.put_u(static_cast<unsigned long long>(d->index));
  id.buf[id.len] = '\0';
  copy(uuid, length, id.buf);
  return finish(line, kSuccess);
}

int nvmlDeviceGetTotalEnergyConsumption(void* device, unsigned long long* energy_mj) {
  Line line = begin("nvmlDeviceGetTotalEnergyConsumption");
  FakeDevice* d = nullptr;
  if (const int rc = device_prologue("nvmlDeviceGetTotalEnergyConsumption", device, line, &d);
      rc != 0) {
    return finish(line, rc);
  }
  if (g_config.energy_steps > 0) {
    const int i =
        d->energy_step < g_config.energy_steps ? d->energy_step++ : g_config.energy_steps - 1;
    *energy_mj = g_config.energy_mj[i];
  } else {
    timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    const double elapsed_s =
        static_cast<double>(now.tv_sec - g_t0.tv_sec) + 1e-9 * (now.tv_nsec - g_t0.tv_nsec);
    *energy_mj = 1000000ULL + static_cast<unsigned long long>(g_config.power_w * elapsed_s * 1e3);
  }
  line.kv("energy_mj", *energy_mj);
  return finish(line, kSuccess);
}

int nvmlDeviceGetPowerUsage(void* device, unsigned* power_mw) {
  Line line = begin("nvmlDeviceGetPowerUsage");
  FakeDevice* d = nullptr;
  if (const int rc = device_prologue("nvmlDeviceGetPowerUsage", device, line, &d); rc != 0) {
    return finish(line, rc);
  }
  *power_mw = static_cast<unsigned>(std::lround(g_config.power_w * 1e3));
  return finish(line, kSuccess);
}

int nvmlDeviceGetTemperature(void* device, int sensor, unsigned* temp_c) {
  Line line = begin("nvmlDeviceGetTemperature");
  FakeDevice* d = nullptr;
  if (const int rc = device_prologue("nvmlDeviceGetTemperature", device, line, &d); rc != 0) {
    return finish(line, rc);
  }
  line.kv("sensor", static_cast<unsigned long long>(sensor));
  if (sensor != 0) return finish(line, kInvalidArgument);
  *temp_c = g_config.temp_c;
  return finish(line, kSuccess);
}

int nvmlDeviceGetClockInfo(void* device, int type, unsigned* clock_mhz) {
  Line line = begin("nvmlDeviceGetClockInfo");
  FakeDevice* d = nullptr;
  if (const int rc = device_prologue("nvmlDeviceGetClockInfo", device, line, &d); rc != 0) {
    return finish(line, rc);
  }
  line.kv("type", static_cast<unsigned long long>(type));
  if (type != 1) return finish(line, kInvalidArgument);  // only NVML_CLOCK_SM is modelled
  *clock_mhz = d->locked_mhz != 0 ? d->locked_mhz : g_config.sm_clock_mhz;
  return finish(line, kSuccess);
}

int nvmlDeviceGetMaxClockInfo(void* device, int type, unsigned* clock_mhz) {
  Line line = begin("nvmlDeviceGetMaxClockInfo");
  FakeDevice* d = nullptr;
  if (const int rc = device_prologue("nvmlDeviceGetMaxClockInfo", device, line, &d); rc != 0) {
    return finish(line, rc);
  }
  line.kv("type", static_cast<unsigned long long>(type));
  if (type != 1) return finish(line, kInvalidArgument);
  *clock_mhz = g_config.max_clock_mhz;
  return finish(line, kSuccess);
}

#ifndef KAREUS_FAKE_NVML_OLD_DRIVER
int nvmlDeviceGetCurrentClocksEventReasons(void* device, unsigned long long* reasons) {
  Line line = begin("nvmlDeviceGetCurrentClocksEventReasons");
  FakeDevice* d = nullptr;
  if (const int rc = device_prologue("nvmlDeviceGetCurrentClocksEventReasons", device, line, &d);
      rc != 0) {
    return finish(line, rc);
  }
  *reasons = g_config.reasons;
  return finish(line, kSuccess);
}
#endif

int nvmlDeviceGetCurrentClocksThrottleReasons(void* device, unsigned long long* reasons) {
  Line line = begin("nvmlDeviceGetCurrentClocksThrottleReasons");
  FakeDevice* d = nullptr;
  if (const int rc = device_prologue("nvmlDeviceGetCurrentClocksThrottleReasons", device, line, &d);
      rc != 0) {
    return finish(line, rc);
  }
  *reasons = g_config.reasons;
  return finish(line, kSuccess);
}

int nvmlDeviceGetSupportedMemoryClocks(void* device, unsigned* count, unsigned* clocks_mhz) {
  Line line = begin("nvmlDeviceGetSupportedMemoryClocks");
  FakeDevice* d = nullptr;
  if (const int rc = device_prologue("nvmlDeviceGetSupportedMemoryClocks", device, line, &d);
      rc != 0) {
    return finish(line, rc);
  }
  static const unsigned kMemory[] = {405, 1215};
  return finish(line, list_reply(kMemory, 2, count, clocks_mhz));
}

int nvmlDeviceGetSupportedGraphicsClocks(void* device, unsigned memory_mhz, unsigned* count,
                                         unsigned* clocks_mhz) {
  Line line = begin("nvmlDeviceGetSupportedGraphicsClocks");
  FakeDevice* d = nullptr;
  if (const int rc = device_prologue("nvmlDeviceGetSupportedGraphicsClocks", device, line, &d);
      rc != 0) {
    return finish(line, rc);
  }
  line.kv("memory_mhz", memory_mhz);
  unsigned values[256];
  unsigned n = 0;
  if (memory_mhz == 1215) {
    for (unsigned f = g_config.max_clock_mhz; f >= 210 && n < 256; f -= 15) values[n++] = f;
  } else if (memory_mhz == 405) {
    values[n++] = 405;
    values[n++] = 390;
  } else {
    return finish(line, kInvalidArgument);
  }
  return finish(line, list_reply(values, n, count, clocks_mhz));
}

int nvmlDeviceSetGpuLockedClocks(void* device, unsigned min_mhz, unsigned max_mhz) {
  Line line = begin("nvmlDeviceSetGpuLockedClocks");
  FakeDevice* d = nullptr;
  const int rc = device_prologue("nvmlDeviceSetGpuLockedClocks", device, line, &d);
  line.kv("min", min_mhz);
  line.kv("max", max_mhz);
  if (rc != 0) return finish(line, rc);
  if (g_config.deny) return finish(line, kNoPermission);
  if (min_mhz > max_mhz) return finish(line, kInvalidArgument);
  if (g_config.lock_delay_ms != 0) usleep(g_config.lock_delay_ms * 1000);
  if (g_config.reject_mhz != 0 && max_mhz == g_config.reject_mhz) return finish(line, 24);
  d->locked_mhz = max_mhz;
  return finish(line, kSuccess);
}

int nvmlDeviceResetGpuLockedClocks(void* device) {
  Line line = begin("nvmlDeviceResetGpuLockedClocks");
  FakeDevice* d = nullptr;
  if (const int rc = device_prologue("nvmlDeviceResetGpuLockedClocks", device, line, &d); rc != 0) {
    return finish(line, rc);
  }
  if (g_config.deny) return finish(line, kNoPermission);
  d->locked_mhz = 0;
  return finish(line, kSuccess);
}

}  // extern "C"
