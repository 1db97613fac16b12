// The energy monitor of one rank (include/kareus/monitor.h). Energy is a difference of NVML's
// total-energy counter, the way Zeus measures a window (ml-energy/zeus, ZeusMonitor
// begin_window/end_window on Volta and newer): two reads of a monotonic board counter are
// cheaper and more exact than integrating sampled power. The layer is opened read-only.
#include "kareus/monitor.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "kareus/nvml.h"
#include "kareus/plan.h"

namespace kareus::runtime {
namespace {

using Clock = std::chrono::steady_clock;

/// Seconds since the Unix epoch, rounded to the microsecond (so the JSON holds 6 decimals).
double unix_now_s() {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  return static_cast<double>(us) / 1e6;
}

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

nlohmann::json or_null(const std::optional<double>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

nlohmann::json or_null(const std::string& s) {
  return s.empty() ? nlohmann::json(nullptr) : nlohmann::json(s);
}

std::string describe(InstructionKind kind, int microbatch, int chunk) {
  return fmt::format("{} of micro-batch {} (chunk {})", to_string(kind), microbatch, chunk);
}

/// measured / predicted - 1, or null when either is missing.
nlohmann::json relative_error(const std::optional<double>& measured, double predicted) {
  if (!measured || !(predicted > 0)) return nullptr;
  return *measured / predicted - 1;
}

void check_options(const MonitorOptions& o) {
  auto bad = [](const std::string& what) { throw InvalidInput("MonitorOptions." + what); };
  if (o.rank < 0) bad(fmt::format("rank must be >= 0, got {}", o.rank));
  if (o.stage < 0) bad(fmt::format("stage must be >= 0, got {}", o.stage));
  if (o.gpu_index < 0) bad(fmt::format("gpu_index must be >= 0, got {}", o.gpu_index));
  if (!o.gpu_uuid.empty() && !o.pci_bus_id.empty()) {
    bad(fmt::format("gpu_uuid '{}' and pci_bus_id '{}' are both set; give one of them", o.gpu_uuid,
                    o.pci_bus_id));
  }
  if (o.tokens_per_iteration &&
      !(std::isfinite(*o.tokens_per_iteration) && *o.tokens_per_iteration > 0)) {
    bad(fmt::format("tokens_per_iteration must be a finite number > 0, got {}",
                    *o.tokens_per_iteration));
  }
  if (o.prediction) {
    const auto& p = *o.prediction;
    if (!(std::isfinite(p.iteration_time_s) && p.iteration_time_s > 0 &&
          std::isfinite(p.energy_j) && p.energy_j > 0)) {
      bad(fmt::format("prediction must have an iteration time and an energy > 0, got {} s, {} J",
                      p.iteration_time_s, p.energy_j));
    }
  }
}

}  // namespace

MonitorPrediction MonitorPrediction::from_plan(const Plan& plan, int stage, std::string source) {
  return {plan.iteration_time_s, plan.gpu_energy_j(stage), std::move(source)};
}

nlohmann::json IterationRecord::to_json() const {
  nlohmann::json j = {{"record", "iteration"},
                      {"rank", rank},
                      {"stage", stage},
                      {"iteration", iteration},
                      {"start_unix_s", start_unix_s},
                      {"time_s", time_s},
                      {"energy_j", or_null(energy_j)},
                      {"avg_power_w", or_null(avg_power_w)},
                      {"busy_time_s", busy_time_s},
                      {"instructions", instructions},
                      {"gpu_uuid", or_null(gpu_uuid)}};
  if (!note.empty()) j["note"] = note;
  return j;
}

nlohmann::json InstructionRecord::to_json() const {
  nlohmann::json j = {{"record", "instruction"},
                      {"rank", rank},
                      {"stage", stage},
                      {"iteration", iteration},
                      {"kind", to_string(kind)},
                      {"microbatch", microbatch},
                      {"chunk", chunk},
                      {"start_unix_s", start_unix_s},
                      {"time_s", time_s},
                      {"energy_j", or_null(energy_j)},
                      {"avg_power_w", or_null(avg_power_w)}};
  if (!note.empty()) j["note"] = note;
  return j;
}

std::optional<double> MonitorSummary::time_per_iteration_s() const {
  if (iterations == 0) return std::nullopt;
  return time_s / iterations;
}

std::optional<double> MonitorSummary::energy_per_iteration_j() const {
  if (energy_iterations == 0) return std::nullopt;
  return energy_j / energy_iterations;
}

std::optional<double> MonitorSummary::avg_power_w() const {
  if (energy_iterations == 0 || !(energy_time_s > 0)) return std::nullopt;
  return energy_j / energy_time_s;
}

std::optional<double> MonitorSummary::energy_per_token_j() const {
  const auto e = energy_per_iteration_j();
  if (!e || !tokens_per_iteration) return std::nullopt;
  return *e / *tokens_per_iteration;
}

nlohmann::json MonitorSummary::to_json() const {
  nlohmann::json j = {{"record", "summary"},
                      {"rank", rank},
                      {"stage", stage},
                      {"gpu_uuid", or_null(gpu_uuid)},
                      {"iterations", iterations},
                      {"time_s", time_s},
                      {"time_per_iteration_s", or_null(time_per_iteration_s())},
                      {"energy_iterations", energy_iterations},
                      {"energy_j", energy_iterations > 0 ? nlohmann::json(energy_j) : nullptr},
                      {"energy_per_iteration_j", or_null(energy_per_iteration_j())},
                      {"avg_power_w", or_null(avg_power_w())},
                      {"busy_time_s", busy_time_s},
                      {"instructions", instructions}};
  if (tokens_per_iteration) {
    j["tokens_per_iteration"] = *tokens_per_iteration;
    j["energy_per_token_j"] = or_null(energy_per_token_j());
  }
  if (prediction) {
    const auto& p = *prediction;
    nlohmann::json pj = {{"source", p.source},
                         {"iteration_time_s", p.iteration_time_s},
                         {"energy_per_iteration_j", p.energy_j},
                         {"avg_power_w", p.energy_j / p.iteration_time_s}};
    nlohmann::json ej = {
        {"iteration_time", relative_error(time_per_iteration_s(), p.iteration_time_s)},
        {"energy_per_iteration", relative_error(energy_per_iteration_j(), p.energy_j)},
        {"avg_power", relative_error(avg_power_w(), p.energy_j / p.iteration_time_s)}};
    if (tokens_per_iteration) {
      pj["energy_per_token_j"] = p.energy_j / *tokens_per_iteration;
      ej["energy_per_token"] =
          relative_error(energy_per_token_j(), p.energy_j / *tokens_per_iteration);
    }
    j["prediction"] = std::move(pj);
    j["error"] = std::move(ej);
  }
  if (!note.empty()) j["note"] = note;
  return j;
}

// ---- The monitor.

struct EnergyMonitor::Impl {
  /// An open measurement window: its start on both clocks and the counter.
  struct Window {
    Clock::time_point start;
    double start_unix_s = 0;
    std::optional<double> energy_j;  ///< the counter at the start
    std::string note;                ///< why there is no counter value
  };

  MonitorOptions o;
  std::unique_ptr<nvml::Nvml> nvml;
  nvml::Device* device = nullptr;  ///< null: times only
  std::string gpu_uuid;
  std::string times_only;  ///< the reason, or empty
  int fd = -1;
  pid_t owner_pid = getpid();  ///< a forked child (a data-loader worker) never writes the file
  bool write_failed = false;
  bool closed = false;

  std::optional<Window> iteration;
  int next_iteration = 0;
  double busy_time_s = 0;
  int instructions = 0;
  std::optional<Window> instruction;
  InstructionKind kind = InstructionKind::kForward;
  int microbatch = 0, chunk = 0;

  MonitorSummary totals;
  int iterations_without_energy = 0;
  std::deque<std::string> records;

  void open_nvml() {
    if (!o.nvml) {
      times_only = "NVML not asked for (nvml = false)";
      return;
    }
    try {
      nvml::Options no;
      no.access = nvml::Access::kReadOnly;
      no.library = o.nvml_library;
      nvml = nvml::open(no);
      device = !o.gpu_uuid.empty()     ? &nvml->device_by_uuid(o.gpu_uuid)
               : !o.pci_bus_id.empty() ? &nvml->device_by_pci_bus_id(o.pci_bus_id)
                                       : &nvml->device(o.gpu_index);
    } catch (const nvml::NvmlError& e) {
      device = nullptr;
      nvml.reset();
      times_only = fmt::format("NVML unavailable: {}", e.what());
      return;
    }
    try {
      gpu_uuid = device->uuid();
    } catch (const nvml::NvmlError&) {
      gpu_uuid.clear();  // the energy still counts; merging cannot check for a shared GPU
    }
  }

  void open_file() {
    if (o.out_path.empty()) return;
    fd = ::open(o.out_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
      throw InvalidInput(fmt::format("MonitorOptions.out_path '{}': cannot open for appending: {}",
                                     o.out_path, std::strerror(errno)));
    }
  }

  /// Keeps the record and appends it to the file with one write(), so a reader or a kill sees
  /// whole lines only. A failed write is reported once and the run goes on.
  void emit(const nlohmann::json& j) {
    // A note may quote a driver's message: bytes that are not UTF-8 are replaced, not thrown.
    records.push_back(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    if (fd < 0 || getpid() != owner_pid) return;
    const std::string line = records.back() + "\n";
    ssize_t n = 0;
    do {
      n = ::write(fd, line.data(), line.size());
    } while (n < 0 && errno == EINTR);
    if (n == static_cast<ssize_t>(line.size()) || write_failed) return;
    write_failed = true;
    std::fprintf(stderr,
                 "kareus: warning: energy monitor of rank %d: writing %s failed (%s); the "
                 "records are kept in memory only\n",
                 o.rank, o.out_path.c_str(), n < 0 ? std::strerror(errno) : "short write");
  }

  /// Reads the counter for a window; on failure the window's note says why.
  Window open_window() {
    Window w;
    w.start_unix_s = unix_now_s();
    w.start = Clock::now();
    w.energy_j = read_energy(&w.note);
    return w;
  }

  std::optional<double> read_energy(std::string* note) {
    if (device == nullptr) {
      *note = "times only: " + times_only;
      return std::nullopt;
    }
    try {
      return device->total_energy_j();
    } catch (const nvml::NvmlNotSupported& e) {
      // No counter on this GPU (older than Volta): every later window would fail the same way.
      device = nullptr;
      times_only = fmt::format("this GPU has no total-energy counter: {}", e.what());
      *note = "times only: " + times_only;
    } catch (const nvml::NvmlError& e) {
      *note = fmt::format("reading the energy counter failed: {}", e.what());
    }
    return std::nullopt;
  }

  /// Closes a window: its time, and its energy unless a read failed or the counter went down.
  void close_window(const Window& w, double* time_s, std::optional<double>* energy_j,
                    std::optional<double>* power_w, std::string* note) {
    std::string end_note;
    const std::optional<double> end_j = read_energy(&end_note);
    *time_s = seconds_between(w.start, Clock::now());
    *note = !w.note.empty() ? w.note : end_note;
    if (!w.energy_j || !end_j) return;
    if (*end_j < *w.energy_j) {
      *note = fmt::format(
          "NVML's energy counter went down from {} J to {} J (the driver reloaded or the "
          "counter wrapped): no energy for this window",
          *w.energy_j, *end_j);
      return;
    }
    *energy_j = *end_j - *w.energy_j;
    if (*time_s > 0) *power_w = **energy_j / *time_s;
  }

  void refuse_if_closed(const char* what) const {
    if (closed) {
      throw StateError(fmt::format("energy monitor of rank {}: {} after close()", o.rank, what));
    }
  }
};

EnergyMonitor::EnergyMonitor(const MonitorOptions& o) : impl_(std::make_unique<Impl>()) {
  check_options(o);
  impl_->o = o;
  impl_->totals.rank = o.rank;
  impl_->totals.stage = o.stage;
  impl_->totals.tokens_per_iteration = o.tokens_per_iteration;
  impl_->totals.prediction = o.prediction;
  impl_->open_nvml();
  impl_->totals.gpu_uuid = impl_->gpu_uuid;
  impl_->open_file();
}

EnergyMonitor::~EnergyMonitor() {
  try {
    close();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kareus: warning: energy monitor: closing failed: %s\n", e.what());
  }
  if (impl_->fd >= 0) ::close(impl_->fd);
}

void EnergyMonitor::begin_iteration() {
  Impl& m = *impl_;
  m.refuse_if_closed("begin_iteration");
  if (m.iteration) {
    throw StateError(
        fmt::format("energy monitor of rank {}: begin_iteration while iteration {} is open; call "
                    "end_iteration first",
                    m.o.rank, m.next_iteration));
  }
  m.busy_time_s = 0;
  m.instructions = 0;
  m.iteration = m.open_window();
}

IterationRecord EnergyMonitor::end_iteration() {
  Impl& m = *impl_;
  m.refuse_if_closed("end_iteration");
  if (!m.iteration) {
    throw StateError(
        fmt::format("energy monitor of rank {}: end_iteration without an open iteration; call "
                    "begin_iteration first",
                    m.o.rank));
  }
  if (m.instruction) {
    throw StateError(fmt::format(
        "energy monitor of rank {}: end_iteration while {} is open; end the instruction first",
        m.o.rank, describe(m.kind, m.microbatch, m.chunk)));
  }
  IterationRecord r;
  r.rank = m.o.rank;
  r.stage = m.o.stage;
  r.iteration = m.next_iteration++;
  r.start_unix_s = m.iteration->start_unix_s;
  m.close_window(*m.iteration, &r.time_s, &r.energy_j, &r.avg_power_w, &r.note);
  m.iteration.reset();
  r.busy_time_s = m.busy_time_s;
  r.instructions = m.instructions;
  if (r.energy_j) r.gpu_uuid = m.gpu_uuid;

  MonitorSummary& t = m.totals;
  ++t.iterations;
  t.time_s += r.time_s;
  t.busy_time_s += r.busy_time_s;
  t.instructions += r.instructions;
  if (r.energy_j) {
    ++t.energy_iterations;
    t.energy_time_s += r.time_s;
    t.energy_j += *r.energy_j;
  } else {
    ++m.iterations_without_energy;
  }
  m.emit(r.to_json());
  return r;
}

void EnergyMonitor::begin_instruction(InstructionKind kind, int microbatch, int chunk) {
  Impl& m = *impl_;
  m.refuse_if_closed("begin_instruction");
  if (microbatch < 0 || chunk < 0) {
    throw InvalidInput(fmt::format(
        "energy monitor of rank {}: begin_instruction: micro-batch {} and chunk {} must be >= 0",
        m.o.rank, microbatch, chunk));
  }
  if (!m.iteration) {
    throw StateError(fmt::format(
        "energy monitor of rank {}: begin of {} outside an iteration; call begin_iteration "
        "at the start of every training iteration",
        m.o.rank, describe(kind, microbatch, chunk)));
  }
  if (m.instruction) {
    throw StateError(fmt::format("energy monitor of rank {}: begin of {} while {} is open",
                                 m.o.rank, describe(kind, microbatch, chunk),
                                 describe(m.kind, m.microbatch, m.chunk)));
  }
  m.kind = kind;
  m.microbatch = microbatch;
  m.chunk = chunk;
  if (m.o.per_instruction) {
    m.instruction = m.open_window();
  } else {
    m.instruction = Impl::Window{Clock::now(), unix_now_s(), std::nullopt, ""};
  }
}

InstructionRecord EnergyMonitor::end_instruction(InstructionKind kind, int microbatch, int chunk) {
  Impl& m = *impl_;
  m.refuse_if_closed("end_instruction");
  if (!m.instruction) {
    throw StateError(fmt::format("energy monitor of rank {}: end of {} without a begin", m.o.rank,
                                 describe(kind, microbatch, chunk)));
  }
  if (kind != m.kind || microbatch != m.microbatch || chunk != m.chunk) {
    throw StateError(fmt::format("energy monitor of rank {}: end of {}, but {} is open", m.o.rank,
                                 describe(kind, microbatch, chunk),
                                 describe(m.kind, m.microbatch, m.chunk)));
  }
  InstructionRecord r;
  r.rank = m.o.rank;
  r.stage = m.o.stage;
  r.iteration = m.next_iteration;
  r.kind = kind;
  r.microbatch = microbatch;
  r.chunk = chunk;
  r.start_unix_s = m.instruction->start_unix_s;
  if (m.o.per_instruction) {
    m.close_window(*m.instruction, &r.time_s, &r.energy_j, &r.avg_power_w, &r.note);
  } else {
    r.time_s = seconds_between(m.instruction->start, Clock::now());
  }
  m.instruction.reset();
  m.busy_time_s += r.time_s;
  ++m.instructions;
  if (m.o.per_instruction) m.emit(r.to_json());
  return r;
}

MonitorSummary EnergyMonitor::summary() const {
  const Impl& m = *impl_;
  MonitorSummary s = m.totals;
  if (!m.times_only.empty()) {
    s.note = "times only: " + m.times_only;
  } else if (m.iterations_without_energy > 0) {
    s.note = fmt::format(
        "{} of {} iterations have no energy (see their notes); energy figures are over the "
        "others",
        m.iterations_without_energy, s.iterations);
  }
  return s;
}

void EnergyMonitor::close() {
  Impl& m = *impl_;
  if (m.closed) return;
  m.closed = true;
  m.emit(summary().to_json());
}

void EnergyMonitor::cancel_instruction() { impl_->instruction.reset(); }

bool EnergyMonitor::closed() const { return impl_->closed; }
int EnergyMonitor::rank() const { return impl_->o.rank; }
int EnergyMonitor::stage() const { return impl_->o.stage; }
bool EnergyMonitor::iteration_open() const { return impl_->iteration.has_value(); }
bool EnergyMonitor::energy_available() const { return impl_->device != nullptr; }
std::string EnergyMonitor::times_only_reason() const { return impl_->times_only; }
const std::deque<std::string>& EnergyMonitor::records() const { return impl_->records; }

}  // namespace kareus::runtime
