// The profile store: every measurement Kareus takes, in an SQLite database in WAL mode.
// Each measurement is committed before the next one starts, so a run killed at any moment
// (SIGKILL included) loses nothing it finished; re-running with the same database measures only
// what is missing. Measurements are keyed by GPU type, backend fingerprint (model parameters,
// noise and seed, or trace contents), partition signature (shapes, not just the key) and
// configuration, so a point is reused only when it is the same measurement.
#pragma once

#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kareus/error.h"
#include "kareus/profiler.h"

namespace kareus {

/// Ask/tell profiling: a batch contains points the backend cannot produce (a trace that lacks
/// them). Carries every such point of the batch, in the batch's order, so that the caller can
/// have them measured elsewhere and rerun. Not an input error: the CLI maps it to exit code 3.
class MeasurementsNeeded : public Error {
 public:
  MeasurementsNeeded(std::string partition, std::vector<PartitionConfig> configs);
  const std::string& partition() const { return partition_; }  ///< Partition::key
  const std::vector<PartitionConfig>& configs() const { return configs_; }

 private:
  std::string partition_;
  std::vector<PartitionConfig> configs_;
};

struct StoreKey {
  std::string gpu;
  std::string backend;    ///< Profiler::fingerprint()
  std::string signature;  ///< Partition::signature, or a segment's signature
  std::string label;      ///< partition key or segment name, for people reading the database
  int freq_mhz = 0;
  int sms = 0;
  std::string slot;
};

/// The shape of a stored partition, what a warm start (kareus/search_prior.h) needs to relate
/// it to another: written to the store's `partition_shapes` table when the partition is first
/// measured.
struct PartitionShape {
  std::string signature;           ///< Partition::signature
  std::string key;                 ///< Partition::key, the partition kind ("fwd_mlp")
  double compute_flops = 0;        ///< one nano-batch's compute
  double compute_bytes = 0;        ///< its HBM bytes read and written
  double collective_bytes = 0;     ///< payload of the collective and its tail
  int group_size = 1;              ///< ranks of the collective's group
  std::vector<std::string> slots;  ///< launch slots, in chain order
};

PartitionShape partition_shape(const Partition& p);

/// The measured points of one stored partition under one backend.
struct StoredPartition {
  PartitionShape shape;
  std::string backend;
  std::vector<std::pair<PartitionConfig, Measurement>> points;
};

class ProfileStore {
 public:
  /// Opens or creates the store at `path`. A file that is not SQLite, an SQLite database that
  /// is not a Kareus store, a newer format, or a corrupt file throws InvalidInput.
  explicit ProfileStore(const std::string& path);
  ~ProfileStore();
  ProfileStore(const ProfileStore&) = delete;
  ProfileStore& operator=(const ProfileStore&) = delete;

  std::optional<Measurement> find(const StoreKey& k) const;
  /// Inserts and commits (a point already stored is kept, not overwritten).
  void put(const StoreKey& k, const Measurement& m);
  /// Measurements stored for one partition under one backend.
  std::size_t count(const std::string& gpu, const std::string& backend,
                    const std::string& signature) const;
  std::size_t count_all() const;
  /// Records a partition's shape (kept if already there).
  void put_shape(const PartitionShape& s);
  std::optional<PartitionShape> shape(const std::string& signature) const;
  /// Every partition of kind `key` measured on `gpu` whose shape is recorded, except the one
  /// with signature `exclude`: one entry per (signature, backend), with the points measured
  /// before `measured_before_s` (seconds since the epoch, as measured_at).
  std::vector<StoredPartition> related(
      const std::string& gpu, const std::string& key, const std::string& exclude,
      double measured_before_s = std::numeric_limits<double>::infinity()) const;
  const std::string& path() const { return path_; }

  static constexpr int kFormatVersion = 1;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
};

/// One point to measure: a partition under a configuration, or a segment (`segment` set) at
/// config.freq_mhz. The pointers are borrowed for the duration of the call they are passed to.
struct MeasureRequest {
  const Partition* partition = nullptr;
  const Segment* segment = nullptr;
  PartitionConfig config;
};

/// Measures several points at once, elsewhere (distributed profiling, kareus/distributed.h).
/// Not thread-safe unless the implementation says so.
class ParallelMeasurer {
 public:
  virtual ~ParallelMeasurer() = default;
  /// Called on the caller's thread as each point arrives, in any order: (index into the
  /// requests, measurement, fingerprint of the backend that measured it).
  using ResultFn = std::function<void(std::size_t, const Measurement&, const std::string&)>;
  /// Measures every request; returns when all have arrived. On a failure it waits for the
  /// points in flight (still passing them to on_result) and then throws.
  virtual void measure_all(const std::vector<MeasureRequest>& requests,
                           const ResultFn& on_result) = 0;
};

/// A profiler with a store in front: stored points are returned without measuring; new ones are
/// measured and committed at once. Points already served in this run are remembered (also
/// without a store), so a point is measured at most once. `measured` and `reused` count distinct
/// points.
///
/// Interruption: before and after every new measurement it calls throw_if_interrupted()
/// (kareus/interrupt.h), so a run asked to stop (SIGINT, SIGTERM) ends between two measurements
/// with Interrupted, every point finished before the request committed; the point in flight
/// when it came is dropped (the signal may have disturbed it: locked clocks are reset on a
/// signal). In parallel mode points measured elsewhere are committed as they arrive.
///
/// Ask mode (ask/tell profiling): measure_batch() first serves every point it can (memo, store,
/// or a backend whose can_measure() is true) and then, if any point of the batch is missing,
/// throws MeasurementsNeeded with all of them. Outside ask mode a batch is exactly a sequence of
/// measure() calls.
///
/// Parallel mode (set_parallel, distributed profiling): measure_batch() and measure_segments()
/// serve what the memo and the store have, hand the rest to the ParallelMeasurer at once and
/// commit each point to the store as it arrives, so a killed run loses only the points in
/// flight. Results are placed by index and on_point is called in the batch's order, so callers
/// see exactly what a sequential run would.
class CachedProfiler {
 public:
  CachedProfiler(Profiler& backend, ProfileStore* store) : backend_(backend), store_(store) {}
  Measurement measure(const Partition& p, const PartitionConfig& c);
  /// Called as each point of a batch is served: (index in the batch, measurement).
  using BatchCallback = std::function<void(std::size_t, const Measurement&)>;
  /// Measures a batch in order; see the class comment for ask mode.
  std::vector<Measurement> measure_batch(const Partition& p,
                                         const std::vector<PartitionConfig>& configs,
                                         const BatchCallback& on_point = {});
  void set_ask_mode(bool on) { ask_ = on; }
  bool ask_mode() const { return ask_; }
  Measurement measure_segment(const Segment& s, int freq_mhz);
  /// Measures segments ahead of their use (each pair: segment, SM clock in MHz), in parallel
  /// in parallel mode; afterwards measure_segment() serves them from the memo. Without parallel
  /// mode it is the same sequence of measure_segment() calls.
  void measure_segments(const std::vector<std::pair<const Segment*, int>>& points);
  /// Parallel mode: `m` (borrowed, may be null to turn it off) measures every point that the
  /// memo and the store lack. Ignored in ask mode.
  void set_parallel(ParallelMeasurer* m) { parallel_ = m; }
  /// True when the point is already in the store (no measurement needed).
  bool stored(const Partition& p, const PartitionConfig& c) const;
  Profiler& backend() { return backend_; }
  int measured() const { return measured_; }
  int reused() const { return reused_; }

 private:
  StoreKey key(const Partition& p, const PartitionConfig& c) const;
  Measurement serve(const StoreKey& k, const std::function<Measurement()>& measure);
  static std::string memo_key(const StoreKey& k);
  StoreKey segment_key(const Segment& s, int freq_mhz) const;
  /// Parallel mode: serves `keys` from memo/store, measures the rest through parallel_, and
  /// calls on_point(i, m) in index order as a prefix completes.
  std::vector<Measurement> serve_parallel(const std::vector<StoreKey>& keys,
                                          const std::vector<MeasureRequest>& requests,
                                          const BatchCallback& on_point);
  Profiler& backend_;
  ProfileStore* store_;
  std::map<std::string, Measurement> memo_;
  int measured_ = 0;
  int reused_ = 0;
  bool ask_ = false;
  ParallelMeasurer* parallel_ = nullptr;
  std::set<std::string> shapes_written_;  ///< signatures whose shape this run has stored
  void note_shape(const Partition& p);
};

/// Signature of a segment's work (kernel shapes), for store keys.
std::string segment_signature(const Segment& s);

}  // namespace kareus
