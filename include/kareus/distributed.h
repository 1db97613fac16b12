// Distributed profiling: one job of N ranks (MPI) where rank 0 runs the search and owns the
// profile store, and ranks 1..N-1 only measure. Rank 0 hands each point that the store lacks to
// the next free rank, one point per message (dynamic dispatch: a slow point does not hold up a
// batch), and commits every result as it arrives (CachedProfiler's parallel mode), so a killed
// job loses only the points in flight. Results are placed by index, so the same seeds give the
// same frontier as a single process.
//
// The MPI library is not linked into `kareus`: the transport lives in a plugin,
// libkareus_mpi.so, loaded with dlopen only when `--mpi` is given (open_mpi_transport), so a
// build with OpenMPI still starts without it and without mpirun. Everything else here is
// MPI-free and is tested with an in-process transport.
//
// Wire format: JSON text (nlohmann), doubles written with round-trip precision, so a worker's
// measurement reaches rank 0 bit for bit.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kareus/profiler.h"
#include "kareus/store.h"

namespace kareus::distributed {

/// Message tags of the protocol.
enum class Tag : int {
  kSetup = 1,    ///< 0 -> worker: create a backend (name, ProfilerOptions)
  kHello = 2,    ///< worker -> 0: the backend's fingerprint, GPU, static power, fixed clock
  kMeasure = 3,  ///< 0 -> worker: one point (partition or segment, configuration)
  kResult = 4,   ///< worker -> 0: its measurement
  kError = 5,    ///< worker -> 0: the request failed (kind and message)
  kStop = 6,     ///< 0 -> worker: no more work; finish
};

struct Message {
  int source = 0;
  Tag tag = Tag::kStop;
  std::string payload;
};

/// Point-to-point messages between the ranks of one job. Implementations: MPI (the plugin) and
/// an in-process one for tests. Not thread-safe: one thread at a time (the Coordinator
/// serializes its callers).
class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Position of this rank among the measuring ranks (all but rank 0) on its node, ordered by
  /// rank: 0, 1, ...; -1 on rank 0. A worker with index i owns GPU group i of its node.
  virtual int node_worker_index() const = 0;
  virtual std::string host() const = 0;
  virtual void send(int dest, Tag tag, const std::string& payload) = 0;
  /// Blocks until a message from `source` (-1: any rank) arrives. Waiting must not spin a
  /// core: ranks share CPUs with the search on rank 0.
  virtual Message receive(int source) = 0;
};

/// A backend whose points are measured on the worker ranks. Fingerprint, GPU, static power and
/// fixed clock are the workers' (they must all agree). measure() and measure_segment() use one
/// free worker; measure_all() keeps every worker busy. Thread-safe (the Coordinator locks).
class Coordinator;
class RemoteProfiler : public Profiler, public ParallelMeasurer {
 public:
  RemoteProfiler(Coordinator& c, int setup_id, std::string backend, GpuSpec gpu,
                 std::string fingerprint, double static_power_w, std::optional<int> fixed_freq);
  std::string name() const override { return backend_; }
  std::string fingerprint() const override { return fingerprint_; }
  const GpuSpec& gpu() const override { return gpu_; }
  double static_power_w() const override { return static_power_w_; }
  double measure_static_power_w() override;
  std::optional<int> fixed_freq_mhz() const override { return fixed_freq_; }
  Measurement measure(const Partition& p, const PartitionConfig& c) override;
  Measurement measure_segment(const Segment& s, int freq_mhz) override;
  void measure_all(const std::vector<MeasureRequest>& requests, const ResultFn& on_result) override;

 private:
  Coordinator& coord_;
  int setup_id_;
  std::string backend_;
  GpuSpec gpu_;
  std::string fingerprint_;
  double static_power_w_;
  std::optional<int> fixed_freq_;
};

/// Rank 0's side. Owns no store (the caller's CachedProfiler does). Thread-safe: one dispatch
/// at a time (eval --jobs shares it between threads).
class Coordinator {
 public:
  explicit Coordinator(Transport& t);
  ~Coordinator();
  int workers() const { return size_ - 1; }
  /// Creates backend `name` with options `o` on every worker; `group_gpus` is how many GPUs
  /// one partition group has (each cuda worker owns that many). Errors on a worker are thrown
  /// here with its rank and host. Workers must agree on the fingerprint.
  std::unique_ptr<RemoteProfiler> open_backend(const std::string& name, const ProfilerOptions& o,
                                               int group_gpus);
  /// Measures `requests` of setup `setup_id` on the workers, one point per message, each to
  /// the next free worker; on_result runs on this thread as each arrives.
  void measure_all(int setup_id, const std::vector<MeasureRequest>& requests,
                   const ParallelMeasurer::ResultFn& on_result);
  /// Static power measured by worker 1.
  double measure_static_power_w(int setup_id);
  /// Tells every worker to finish. Idempotent; the destructor calls it.
  void shutdown();
  /// Points sent to each worker so far (index 0: rank 1), for tests and the run summary.
  std::vector<int> points_per_worker() const;
  /// Wall time rank 0 has spent in measure_all (waiting for workers), in seconds.
  double measure_seconds() const;

 private:
  std::string encode(int worker, int setup_id, const MeasureRequest& r, std::size_t index);
  Transport& t_;
  int size_;
  int next_setup_ = 0;
  bool stopped_ = false;
  std::vector<std::set<std::string>> sent_;  ///< per worker: partitions/segments it holds
  std::vector<int> points_;
  double measure_s_ = 0;
  mutable std::mutex mu_;
};

/// A worker rank's whole life: serve rank 0's requests until it says stop. Errors while
/// measuring are sent to rank 0 (which ends the run with them), not thrown.
void run_worker(Transport& t);

/// Loads the MPI plugin and initializes MPI. Throws NotSupported when this build has no MPI or
/// the plugin cannot be loaded. Call once per process; the transport finalizes MPI when
/// destroyed.
std::unique_ptr<Transport> open_mpi_transport(int& argc, char**& argv);

/// JSON forms of the shapes a worker needs (exact: doubles round-trip).
std::string encode_partition(const Partition& p);
Partition decode_partition(const std::string& text);
std::string encode_segment(const Segment& s);
Segment decode_segment(const std::string& text);

/// CUDA_VISIBLE_DEVICES for GPU group `index` (group_gpus GPUs each) of a node. The node's pool
/// is `devices` (--devices: indices into `visible`) or else `visible` (the current
/// CUDA_VISIBLE_DEVICES, comma-separated; empty when unset: devices 0, 1, ...). Every worker
/// then sees its group as devices 0..group_gpus-1, so all workers share one fingerprint.
/// Throws InvalidInput when the pool is too short.
std::string group_devices(const std::string& visible, const std::vector<int>& devices, int index,
                          int group_gpus);

}  // namespace kareus::distributed
