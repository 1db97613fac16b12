// A measuring rank of distributed profiling: it creates the backends rank 0 asks for, measures
// one point per request and replies, until rank 0 says stop. It never opens the profile store
// and writes no files. With the cuda backend it owns one partition group of its node's GPUs:
// CUDA_VISIBLE_DEVICES is narrowed to that group before CUDA starts, so every worker sees its
// group as devices 0..n-1 and all workers share one backend fingerprint (one store key).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kareus/distributed.h"
#include "kareus/error.h"

namespace kareus::distributed {
namespace {

using nlohmann::json;

void reply_error(Transport& t, const std::string& kind, const std::string& what) {
  const json j = {{"kind", kind},
                  {"message", fmt::format("rank {} ({}): {}", t.rank(), t.host(), what)}};
  t.send(0, Tag::kError, j.dump());
}

ProfilerOptions options_from(const json& j) {
  ProfilerOptions o;
  o.gpu = j.at("gpu").get<std::string>();
  o.noise = j.at("noise").get<double>();
  o.time_noise = j.at("time_noise").get<double>();
  o.seed = j.at("seed").get<std::uint64_t>();
  o.delay_ms = j.at("delay_ms").get<int>();
  o.trace_path = j.at("trace_path").get<std::string>();
  o.allow_clock_control = j.at("allow_clock_control").get<bool>();
  o.devices = j.at("devices").get<std::vector<int>>();
  o.window_s = j.at("window_s").get<double>();
  o.cooldown_s = j.at("cooldown_s").get<double>();
  return o;
}

class Worker {
 public:
  explicit Worker(Transport& t) : t_(t) {}

  void setup(const json& j) {
    const int id = j.at("setup").get<int>();
    const std::string name = j.at("backend").get<std::string>();
    ProfilerOptions o = options_from(j.at("options"));
    if (name == "cuda") {
      const char* env = std::getenv("CUDA_VISIBLE_DEVICES");
      const std::string visible = env ? env : "";
      if (!gpus_bound_) {
        bound_ = group_devices(visible, o.devices, t_.node_worker_index(),
                               j.at("group_gpus").get<int>());
        // Before the backend's first CUDA call, which fixes the visible set for the process.
        setenv("CUDA_VISIBLE_DEVICES", bound_.c_str(), 1);
        gpus_bound_ = true;
      }
      o.devices.clear();  // the whole (narrowed) visible set is this rank's group
    }
    auto b = create_profiler(name, o);
    const auto fixed = b->fixed_freq_mhz();
    const json h = {{"setup", id},
                    {"fingerprint", b->fingerprint()},
                    {"gpu", b->gpu().name},
                    {"static_power_w", b->static_power_w()},
                    {"fixed_freq_mhz", fixed ? json(*fixed) : json(nullptr)},
                    {"host", t_.host()}};
    backends_[id] = std::move(b);
    t_.send(0, Tag::kHello, h.dump());
  }

  void measure(const json& j) {
    const int id = j.at("setup").get<int>();
    auto it = backends_.find(id);
    if (it == backends_.end()) throw InternalError(fmt::format("unknown backend setup {}", id));
    Profiler& b = *it->second;
    const std::string kind = j.at("kind").get<std::string>();
    json r = {{"index", j.at("index")}};
    if (kind == "static") {
      r["static_power_w"] = b.measure_static_power_w();
      t_.send(0, Tag::kResult, r.dump());
      return;
    }
    const std::string key = j.at("id").get<std::string>();
    const auto& cfg = j.at("config");
    const PartitionConfig c{cfg.at(0).get<int>(), cfg.at(1).get<int>(),
                            cfg.at(2).get<std::string>()};
    Measurement m;
    if (kind == "partition") {
      if (j.contains("body")) partitions_[key] = decode_partition(j.at("body").get<std::string>());
      auto p = partitions_.find(key);
      if (p == partitions_.end()) throw InternalError("partition " + key + " was never sent");
      m = b.measure(p->second, c);
    } else {
      if (j.contains("body")) segments_[key] = decode_segment(j.at("body").get<std::string>());
      auto s = segments_.find(key);
      if (s == segments_.end()) throw InternalError("segment " + key + " was never sent");
      m = b.measure_segment(s->second, c.freq_mhz);
    }
    r["time_s"] = m.time_s;
    r["energy_j"] = m.energy_j;
    r["dynamic_energy_j"] = m.dynamic_energy_j;
    r["static_energy_j"] = m.static_energy_j;
    r["fingerprint"] = b.fingerprint();
    t_.send(0, Tag::kResult, r.dump());
  }

 private:
  Transport& t_;
  std::map<int, std::unique_ptr<Profiler>> backends_;
  std::map<std::string, Partition> partitions_;
  std::map<std::string, Segment> segments_;
  bool gpus_bound_ = false;
  std::string bound_;
};

}  // namespace

std::string group_devices(const std::string& visible, const std::vector<int>& devices, int index,
                          int group_gpus) {
  if (group_gpus < 1) throw InvalidInput(fmt::format("GPU group of {} GPUs", group_gpus));
  if (index < 0) throw InternalError("rank 0 owns no GPU group");
  std::vector<std::string> listed;
  std::stringstream in(visible);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) listed.push_back(item);
  }
  std::vector<std::string> pool;
  if (!devices.empty()) {
    for (int d : devices) {
      if (listed.empty()) {
        pool.push_back(std::to_string(d));
      } else if (d >= 0 && static_cast<std::size_t>(d) < listed.size()) {
        pool.push_back(listed[static_cast<std::size_t>(d)]);
      } else {
        throw InvalidInput(
            fmt::format("--devices: GPU {} is not among CUDA_VISIBLE_DEVICES={}", d, visible));
      }
    }
  } else {
    pool = listed;
  }
  const std::size_t first = static_cast<std::size_t>(index) * static_cast<std::size_t>(group_gpus);
  std::vector<std::string> group;
  for (std::size_t i = first; i < first + static_cast<std::size_t>(group_gpus); ++i) {
    if (pool.empty()) {
      group.push_back(std::to_string(i));  // unset: the node's devices 0, 1, ...
    } else if (i < pool.size()) {
      group.push_back(pool[i]);
    } else {
      throw InvalidInput(fmt::format(
          "--mpi: this node's measuring rank {} needs GPUs {}..{} of its pool ({}), which has "
          "{}: start at most {} measuring rank(s) per node (partition groups of {} GPUs)",
          index, first, first + static_cast<std::size_t>(group_gpus) - 1, fmt::join(pool, ","),
          pool.size(), pool.size() / static_cast<std::size_t>(group_gpus), group_gpus));
    }
  }
  return fmt::format("{}", fmt::join(group, ","));
}

void run_worker(Transport& t) {
  Worker w(t);
  for (;;) {
    const Message m = t.receive(0);
    if (m.tag == Tag::kStop) return;
    try {
      const json j = json::parse(m.payload);
      if (m.tag == Tag::kSetup) {
        w.setup(j);
      } else if (m.tag == Tag::kMeasure) {
        w.measure(j);
      } else {
        throw InternalError(fmt::format("unexpected message tag {}", static_cast<int>(m.tag)));
      }
    } catch (const InvalidInput& e) {
      reply_error(t, "invalid", e.what());
    } catch (const NotSupported& e) {
      reply_error(t, "not_supported", e.what());
    } catch (const InternalError& e) {
      reply_error(t, "internal", e.what());
    } catch (const Error& e) {
      reply_error(t, "error", e.what());
    } catch (const std::exception& e) {
      reply_error(t, "internal", e.what());
    }
  }
}

}  // namespace kareus::distributed
