// Rank 0 of distributed profiling: dynamic dispatch of single points to the measuring ranks.
// Every free worker gets the next point of the batch; a worker's reply makes it free again, so
// the batch finishes in about (points / workers) measurement times however uneven the points
// are (the "self-scheduling" loop of master-worker task farms, e.g. Gropp, Lusk, Skjellum,
// "Using MPI", ch. 3). A worker gets a partition's or segment's shapes once and refers to them
// by key afterwards.
#include <fmt/format.h>

#include <chrono>
#include <deque>
#include <exception>
#include <nlohmann/json.hpp>

#include "kareus/distributed.h"
#include "kareus/error.h"

namespace kareus::distributed {
namespace {

using nlohmann::json;

json parse_reply(const Message& m) {
  try {
    return json::parse(m.payload);
  } catch (const json::exception& e) {
    throw InternalError(
        fmt::format("distributed profiling: malformed reply from rank {}: {}", m.source, e.what()));
  }
}

// A worker's error, rethrown on rank 0 with its original kind.
std::exception_ptr worker_error(const Message& m) {
  const json j = parse_reply(m);
  const std::string kind = j.value("kind", "internal");
  const std::string msg = j.value("message", "unknown error");
  if (kind == "invalid") return std::make_exception_ptr(InvalidInput(msg));
  if (kind == "not_supported") return std::make_exception_ptr(NotSupported(msg));
  if (kind == "error") return std::make_exception_ptr(Error(msg));
  return std::make_exception_ptr(InternalError(msg));
}

std::string cache_id(const MeasureRequest& r) {
  if (r.partition) return "p|" + r.partition->key + "|" + r.partition->signature;
  return fmt::format("s|{}|{}|{}|{}", segment_signature(*r.segment), r.segment->name,
                     r.segment->stage, r.segment->instruction);
}

}  // namespace

Coordinator::Coordinator(Transport& t)
    : t_(t),
      size_(t.size()),
      sent_(static_cast<std::size_t>(std::max(size_ - 1, 0))),
      points_(static_cast<std::size_t>(std::max(size_ - 1, 0)), 0) {}

Coordinator::~Coordinator() {
  try {
    shutdown();
  } catch (...) {
    // A transport that fails while the job ends has nothing left to tell.
  }
}

std::vector<int> Coordinator::points_per_worker() const {
  std::lock_guard<std::mutex> lock(mu_);
  return points_;
}

double Coordinator::measure_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return measure_s_;
}

std::unique_ptr<RemoteProfiler> Coordinator::open_backend(const std::string& name,
                                                          const ProfilerOptions& o,
                                                          int group_gpus) {
  std::lock_guard<std::mutex> lock(mu_);
  if (size_ < 2) {
    throw InvalidInput(
        "--mpi: the job has 1 rank; rank 0 only searches, so start at least 2 (mpirun -np 2 or "
        "more), or drop --mpi");
  }
  const int id = next_setup_++;
  const json setup = {{"setup", id},
                      {"backend", name},
                      {"group_gpus", group_gpus},
                      {"options",
                       {{"gpu", o.gpu},
                        {"noise", o.noise},
                        {"time_noise", o.time_noise},
                        {"seed", o.seed},
                        {"delay_ms", o.delay_ms},
                        {"trace_path", o.trace_path},
                        {"allow_clock_control", o.allow_clock_control},
                        {"devices", o.devices},
                        {"window_s", o.window_s},
                        {"cooldown_s", o.cooldown_s}}}};
  const std::string text = setup.dump();
  for (int w = 1; w < size_; ++w) t_.send(w, Tag::kSetup, text);
  std::exception_ptr err;
  std::vector<json> hellos(static_cast<std::size_t>(size_));
  for (int n = 1; n < size_; ++n) {
    const Message m = t_.receive(-1);
    if (m.tag == Tag::kHello) {
      hellos[static_cast<std::size_t>(m.source)] = parse_reply(m);
    } else if (m.tag == Tag::kError) {
      if (!err) err = worker_error(m);
    } else {
      throw InternalError(fmt::format("distributed profiling: rank {} answered setup with tag {}",
                                      m.source, static_cast<int>(m.tag)));
    }
  }
  if (err) std::rethrow_exception(err);
  const json& h1 = hellos[1];
  for (int w = 2; w < size_; ++w) {
    const json& h = hellos[static_cast<std::size_t>(w)];
    if (h.at("fingerprint") != h1.at("fingerprint")) {
      throw InvalidInput(fmt::format(
          "--mpi: ranks measure with different backends, so their points cannot share one "
          "store: rank 1 ({}) has '{}', rank {} ({}) has '{}' (give every rank the same GPU "
          "model, driver and libraries)",
          h1.value("host", "?"), h1.at("fingerprint").get<std::string>(), w, h.value("host", "?"),
          h.at("fingerprint").get<std::string>()));
    }
  }
  std::optional<int> fixed;
  if (!h1.at("fixed_freq_mhz").is_null()) fixed = h1.at("fixed_freq_mhz").get<int>();
  return std::make_unique<RemoteProfiler>(
      *this, id, name, gpu_by_name(h1.at("gpu").get<std::string>()),
      h1.at("fingerprint").get<std::string>(), h1.at("static_power_w").get<double>(), fixed);
}

std::string Coordinator::encode(int worker, int setup_id, const MeasureRequest& r,
                                std::size_t index) {
  json j = {{"setup", setup_id}, {"index", index}};
  const std::string id = cache_id(r);
  j["id"] = id;
  j["kind"] = r.partition ? "partition" : "segment";
  j["config"] = {r.config.freq_mhz, r.config.sms, r.config.slot};
  auto& held = sent_[static_cast<std::size_t>(worker - 1)];
  if (!held.count(id)) {
    j["body"] = r.partition ? encode_partition(*r.partition) : encode_segment(*r.segment);
    held.insert(id);
  }
  return j.dump();
}

void Coordinator::measure_all(int setup_id, const std::vector<MeasureRequest>& requests,
                              const ParallelMeasurer::ResultFn& on_result) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) throw InternalError("distributed profiling: measuring after shutdown");
  const auto t0 = std::chrono::steady_clock::now();
  struct Clock {
    double& total;
    std::chrono::steady_clock::time_point t0;
    ~Clock() {
      total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  } clock{measure_s_, t0};
  std::deque<int> idle;
  for (int w = 1; w < size_; ++w) idle.push_back(w);
  std::size_t next = 0;
  int in_flight = 0;
  std::exception_ptr err;
  bool callback_failed = false;
  while ((next < requests.size() && !err) || in_flight > 0) {
    while (!err && next < requests.size() && !idle.empty()) {
      const int w = idle.front();
      idle.pop_front();
      t_.send(w, Tag::kMeasure, encode(w, setup_id, requests[next], next));
      ++points_[static_cast<std::size_t>(w - 1)];
      ++next;
      ++in_flight;
    }
    if (in_flight == 0) break;
    const Message m = t_.receive(-1);
    --in_flight;
    idle.push_back(m.source);
    if (m.tag == Tag::kError) {
      if (!err) err = worker_error(m);
      continue;
    }
    if (m.tag != Tag::kResult) {
      if (!err) {
        err = std::make_exception_ptr(InternalError(
            fmt::format("distributed profiling: rank {} answered a measurement with tag {}",
                        m.source, static_cast<int>(m.tag))));
      }
      continue;
    }
    if (callback_failed) continue;
    const json r = parse_reply(m);
    Measurement meas;
    meas.time_s = r.at("time_s").get<double>();
    meas.energy_j = r.at("energy_j").get<double>();
    meas.dynamic_energy_j = r.at("dynamic_energy_j").get<double>();
    meas.static_energy_j = r.at("static_energy_j").get<double>();
    try {
      // Arrivals after a worker error are still handed over (committed): they are paid for.
      on_result(r.at("index").get<std::size_t>(), meas, r.at("fingerprint").get<std::string>());
    } catch (...) {
      callback_failed = true;
      if (!err) err = std::current_exception();
    }
  }
  if (err) std::rethrow_exception(err);
}

double Coordinator::measure_static_power_w(int setup_id) {
  std::lock_guard<std::mutex> lock(mu_);
  const json j = {{"setup", setup_id}, {"kind", "static"}, {"index", 0}};
  t_.send(1, Tag::kMeasure, j.dump());
  const Message m = t_.receive(1);
  if (m.tag == Tag::kError) std::rethrow_exception(worker_error(m));
  return parse_reply(m).at("static_power_w").get<double>();
}

void Coordinator::shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return;
  stopped_ = true;
  for (int w = 1; w < size_; ++w) t_.send(w, Tag::kStop, "");
}

// ---- RemoteProfiler

RemoteProfiler::RemoteProfiler(Coordinator& c, int setup_id, std::string backend, GpuSpec gpu,
                               std::string fingerprint, double static_power_w,
                               std::optional<int> fixed_freq)
    : coord_(c),
      setup_id_(setup_id),
      backend_(std::move(backend)),
      gpu_(std::move(gpu)),
      fingerprint_(std::move(fingerprint)),
      static_power_w_(static_power_w),
      fixed_freq_(fixed_freq) {}

double RemoteProfiler::measure_static_power_w() { return coord_.measure_static_power_w(setup_id_); }

void RemoteProfiler::measure_all(const std::vector<MeasureRequest>& requests,
                                 const ResultFn& on_result) {
  coord_.measure_all(setup_id_, requests, on_result);
}

Measurement RemoteProfiler::measure(const Partition& p, const PartitionConfig& c) {
  Measurement out;
  coord_.measure_all(setup_id_, {{&p, nullptr, c}},
                     [&](std::size_t, const Measurement& m, const std::string&) { out = m; });
  return out;
}

Measurement RemoteProfiler::measure_segment(const Segment& s, int freq_mhz) {
  Measurement out;
  coord_.measure_all(setup_id_, {{nullptr, &s, {freq_mhz, 0, "-"}}},
                     [&](std::size_t, const Measurement& m, const std::string&) { out = m; });
  return out;
}

}  // namespace kareus::distributed
