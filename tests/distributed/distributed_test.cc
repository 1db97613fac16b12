// Distributed profiling without MPI: rank 0's Coordinator and worker ranks (run_worker) on
// threads, connected by an in-process transport with the same contract as the MPI plugin.
#include "kareus/distributed.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <thread>

#include "kareus/emulator.h"
#include "kareus/error.h"
#include "kareus/partition.h"
#include "kareus/store.h"
#include "kareus/workload.h"
#include "test_util.h"

namespace kareus::distributed {
namespace {

// Mailboxes per rank; receive(source) takes the oldest message from that source (or any).
class Hub {
 public:
  explicit Hub(int n) : boxes_(static_cast<std::size_t>(n)) {}
  void put(int dest, Message m) {
    std::lock_guard<std::mutex> l(mu_);
    boxes_[static_cast<std::size_t>(dest)].push_back(std::move(m));
    cv_.notify_all();
  }
  Message take(int rank, int source) {
    std::unique_lock<std::mutex> l(mu_);
    auto& box = boxes_[static_cast<std::size_t>(rank)];
    for (;;) {
      for (auto it = box.begin(); it != box.end(); ++it) {
        if (source < 0 || it->source == source) {
          Message m = std::move(*it);
          box.erase(it);
          return m;
        }
      }
      cv_.wait(l);
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::deque<Message>> boxes_;
};

class HubTransport : public Transport {
 public:
  HubTransport(Hub& h, int rank, int size) : hub_(h), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int node_worker_index() const override { return rank_ - 1; }
  std::string host() const override { return "test-node"; }
  void send(int dest, Tag tag, const std::string& payload) override {
    hub_.put(dest, {rank_, tag, payload});
  }
  Message receive(int source) override { return hub_.take(rank_, source); }

 private:
  Hub& hub_;
  int rank_, size_;
};

// A job of `n` ranks: workers on threads, rank 0's transport and coordinator for the test.
struct Job {
  explicit Job(int n) : hub(n), t0(hub, 0, n), coord(t0) {
    for (int r = 1; r < n; ++r) {
      ts.push_back(std::make_unique<HubTransport>(hub, r, n));
      threads.emplace_back([t = ts.back().get()] { run_worker(*t); });
    }
  }
  ~Job() {
    coord.shutdown();
    for (auto& t : threads) t.join();
  }
  Hub hub;
  HubTransport t0;
  Coordinator coord;
  std::vector<std::unique_ptr<HubTransport>> ts;
  std::vector<std::thread> threads;
};

ProfilerOptions a100_options() {
  ProfilerOptions o;
  o.gpu = "a100-sxm4-40gb";
  o.noise = 0.01;
  o.seed = 7;
  return o;
}

const PartitionSet& tiny_partitions() {
  static const PartitionSet ps = partition_workload(
      load_workload(std::string(KAREUS_SOURCE_DIR) + "/tests/runtime/data/tiny_tp2_pp2.yaml"));
  return ps;
}

std::vector<PartitionConfig> some_configs(const Partition& p) {
  std::vector<PartitionConfig> cs;
  for (int f : {1410, 1200, 1005, 810}) {
    for (int sms : {4, 8, 16}) cs.push_back({f, sms, p.slots.back().name});
  }
  return cs;
}

TEST(DistributedSerialize, PartitionAndSegmentRoundTripExactly) {
  const PartitionSet& ps = tiny_partitions();
  const Partition& p = ps.partitions.front();
  const Partition q = decode_partition(encode_partition(p));
  EXPECT_EQ(q.key, p.key);
  EXPECT_EQ(q.signature, p.signature);
  ASSERT_EQ(q.compute_ops.size(), p.compute_ops.size());
  for (std::size_t i = 0; i < p.compute_ops.size(); ++i) {
    EXPECT_EQ(q.compute_ops[i].flops, p.compute_ops[i].flops);  // bit for bit
    EXPECT_EQ(q.compute_ops[i].bytes_read, p.compute_ops[i].bytes_read);
    EXPECT_EQ(q.compute_ops[i].kind, p.compute_ops[i].kind);
  }
  EXPECT_EQ(q.collective.payload_bytes, p.collective.payload_bytes);
  EXPECT_EQ(q.slot_names(), p.slot_names());
  EXPECT_EQ(q.repeats(), p.repeats());
  const Segment& s = ps.segments.front();
  const Segment t = decode_segment(encode_segment(s));
  EXPECT_EQ(segment_signature(t), segment_signature(s));
  EXPECT_EQ(t.stage, s.stage);
  EXPECT_THROW(decode_partition("{\"key\": 1}"), InternalError);
  // A sequence-parallel partition's communication chain travels too: a worker measures the
  // RS, the norm and the AG, and gets the same emulated result as rank 0.
  const PartitionSet sp = partition_workload(
      load_workload(test::source_path("workloads/examples/llama3.2-3b_h100_tp4_sp_dp2.yaml")));
  const Partition& c = sp.partition("fwd_attn_rs_ag");
  ASSERT_EQ(c.comm_tail.size(), 3u);
  const Partition d = decode_partition(encode_partition(c));
  ASSERT_EQ(d.comm_tail.size(), c.comm_tail.size());
  for (std::size_t i = 0; i < c.comm_tail.size(); ++i) {
    EXPECT_EQ(d.comm_tail[i].name, c.comm_tail[i].name);
    EXPECT_EQ(d.comm_tail[i].payload_bytes, c.comm_tail[i].payload_bytes);
    EXPECT_EQ(d.comm_tail[i].bytes_read, c.comm_tail[i].bytes_read);
  }
  const EmulatorModel m(gpu_by_name("h100-sxm"));
  EXPECT_EQ(m.simulate_partition(d, {1980, 8, "qkv"}).time_s,
            m.simulate_partition(c, {1980, 8, "qkv"}).time_s);
  // A mixture of experts' partition: the grouped GEMM's groups and the all-to-all's copy-engine
  // capability travel, so a worker measures 0 SMs (the copy engines) as rank 0 would.
  const PartitionSet moe = partition_workload(
      load_workload(test::source_path("workloads/moe/qwen3-30b-a3b_h100_ep8_dp8.yaml")));
  const Partition& e = moe.partition("fwd_moe_experts_a2a");
  const Partition f = decode_partition(encode_partition(e));
  EXPECT_EQ(f.compute_ops.front().groups, 16);
  EXPECT_TRUE(f.collective.copy_engine);
  EXPECT_EQ(f.collective.node_ranks, e.collective.node_ranks);
  EXPECT_EQ(m.simulate_partition(f, {1980, 0, "linear"}).time_s,
            m.simulate_partition(e, {1980, 0, "linear"}).time_s);
}

TEST(DistributedProfiling, BatchEqualsLocalMeasurementsInOrderAndUsesEveryWorker) {
  const Partition& p = tiny_partitions().partitions.front();
  const auto configs = some_configs(p);
  auto local = create_profiler("emulator", a100_options());
  CachedProfiler reference(*local, nullptr);
  const auto expected = reference.measure_batch(p, configs);

  Job job(4);
  auto remote = job.coord.open_backend("emulator", a100_options(), 2);
  EXPECT_EQ(remote->fingerprint(), local->fingerprint());
  EXPECT_EQ(remote->static_power_w(), local->static_power_w());
  CachedProfiler cached(*remote, nullptr);
  cached.set_parallel(remote.get());
  std::vector<std::size_t> order;
  const auto got = cached.measure_batch(
      p, configs, [&](std::size_t i, const Measurement&) { order.push_back(i); });
  ASSERT_EQ(got.size(), expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].time_s, expected[i].time_s) << i;  // same bits, placed by index
    EXPECT_EQ(got[i].energy_j, expected[i].energy_j) << i;
    EXPECT_EQ(order[i], i);  // callbacks in the batch's order whatever the arrival order
  }
  EXPECT_EQ(cached.measured(), static_cast<int>(configs.size()));
  const auto per = job.coord.points_per_worker();
  ASSERT_EQ(per.size(), 3u);
  EXPECT_EQ(per[0] + per[1] + per[2], static_cast<int>(configs.size()));
  for (int n : per) EXPECT_GT(n, 0);
  // Segments and single points go through the workers as well.
  const Segment& s = tiny_partitions().segments.front();
  EXPECT_EQ(cached.measure_segment(s, 1200).time_s, local->measure_segment(s, 1200).time_s);
}

TEST(DistributedProfiling, StoreCommitsOnArrivalAndRerunMeasuresOnlyWhatIsMissing) {
  const Partition& p = tiny_partitions().partitions.front();
  const auto configs = some_configs(p);
  test::TempDir dir;
  const std::string db = dir.file("store.db");
  Job job(3);
  auto remote = job.coord.open_backend("emulator", a100_options(), 2);
  {
    ProfileStore store(db);
    CachedProfiler cached(*remote, &store);
    cached.set_parallel(remote.get());
    // The first half only: as if the job had been killed after those points.
    cached.measure_batch(p, std::vector<PartitionConfig>(configs.begin(), configs.begin() + 5));
    EXPECT_EQ(store.count_all(), 5u);
  }
  ProfileStore store(db);
  CachedProfiler cached(*remote, &store);
  cached.set_parallel(remote.get());
  const auto before = job.coord.points_per_worker();
  cached.measure_batch(p, configs);
  const auto after = job.coord.points_per_worker();
  EXPECT_EQ(cached.reused(), 5);
  EXPECT_EQ(cached.measured(), static_cast<int>(configs.size()) - 5);
  EXPECT_EQ((after[0] + after[1]) - (before[0] + before[1]), static_cast<int>(configs.size()) - 5);
  EXPECT_EQ(store.count_all(), configs.size());
}

TEST(DistributedProfiling, WorkerErrorsReachRankZeroWithTheirKindAndRank) {
  Job job(3);
  ProfilerOptions o = a100_options();
  o.gpu = "no such GPU";
  try {
    job.coord.open_backend("emulator", o, 2);
    FAIL() << "expected InvalidInput";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("rank "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no such GPU"), std::string::npos) << e.what();
  }
  // The workers are still serving: a good setup works afterwards.
  auto remote = job.coord.open_backend("emulator", a100_options(), 2);
  Partition broken = tiny_partitions().partitions.front();
  CachedProfiler cached(*remote, nullptr);
  cached.set_parallel(remote.get());
  EXPECT_THROW(cached.measure_batch(broken, {{1410, 4, "no-such-slot"}}), InvalidInput);
}

TEST(DistributedProfiling, OneRankJobIsRejected) {
  Hub hub(1);
  HubTransport t(hub, 0, 1);
  Coordinator c(t);
  EXPECT_THROW(c.open_backend("emulator", a100_options(), 1), InvalidInput);
}

TEST(DistributedGroupDevices, EachWorkerGetsItsOwnGroup) {
  EXPECT_EQ(group_devices("", {}, 0, 4), "0,1,2,3");
  EXPECT_EQ(group_devices("", {}, 1, 4), "4,5,6,7");
  EXPECT_EQ(group_devices("3,5,6,7", {}, 1, 2), "6,7");
  EXPECT_EQ(group_devices("GPU-a,GPU-b,GPU-c,GPU-d", {}, 0, 2), "GPU-a,GPU-b");
  EXPECT_EQ(group_devices("", {4, 5, 6, 7}, 1, 2), "6,7");
  EXPECT_EQ(group_devices("10,11,12,13", {2, 3}, 0, 2), "12,13");
  EXPECT_THROW(group_devices("0,1,2,3", {}, 1, 4), InvalidInput);
  EXPECT_THROW(group_devices("0,1", {5}, 0, 1), InvalidInput);
}

}  // namespace
}  // namespace kareus::distributed
