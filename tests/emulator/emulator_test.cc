// Physical sanity of the emulator, checked on every partition of several workloads, and
// hand-computed cases of the roofline and the ring.
#include "kareus/emulator.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kareus/error.h"
#include "kareus/search_space.h"
#include "test_util.h"

namespace kareus {
namespace {

const char* kWorkloads[] = {"llama3.2-3b_tp8_mbs8_seq4096", "qwen3-1.7b_cp2tp4_mbs8_seq8192",
                            "llama3.3-70b_tp8_mbs2_seq4096"};

TEST(Emulator, TimeNeverRisesWithClock) {
  for (const char* name : kWorkloads) {
    const auto w = load_workload(test::paper_workload(name));
    const EmulatorModel m(w.gpu());
    const auto ps = partition_workload(w);
    for (const auto& p : ps.partitions) {
      const auto space = make_search_space(p, w.gpu());
      for (int sms : space.sms) {
        for (const auto& slot : space.slots) {
          double prev = 1e30;  // clocks ascend from 900 to 1410 in this loop
          for (auto it = space.freqs_mhz.rbegin(); it != space.freqs_mhz.rend(); ++it) {
            const double t = m.simulate_partition(p, {*it, sms, slot}).time_s;
            EXPECT_LE(t, prev * (1 + 1e-12)) << name << " " << p.key << " " << *it << " " << sms;
            prev = t;
          }
        }
      }
    }
  }
}

TEST(Emulator, ComputeBoundDynamicEnergyFallsWithClock) {
  // 70B backward MLP: large GEMMs, the collective finishes well before the compute.
  const auto w = load_workload(test::paper_workload("llama3.3-70b_tp8_mbs4_seq4096"));
  const EmulatorModel m(w.gpu());
  const auto ps = partition_workload(w);
  const auto& p = ps.partition("bwd_mlp");
  const auto r = m.simulate_partition(p, {1410, 24, "norm"});
  ASSERT_LT(r.collective_end_s, 0.5 * r.compute_end_s) << "not compute-bound";
  double prev = 0;
  for (int f = 1410; f >= 900; f -= 30) {
    const double e = m.simulate_partition(p, {f, 24, "norm"}).dynamic_energy_j;
    if (f < 1410) {
      EXPECT_LE(e, prev * (1 + 1e-12)) << f;
    }
    prev = e;
  }
  EXPECT_LT(m.simulate_partition(p, {900, 24, "norm"}).dynamic_energy_j,
            0.8 * m.simulate_partition(p, {1410, 24, "norm"}).dynamic_energy_j);
}

TEST(Emulator, MoreSmsShortenCollectiveAndLengthenCompute) {
  for (const char* name : kWorkloads) {
    const auto w = load_workload(test::paper_workload(name));
    const EmulatorModel m(w.gpu());
    for (const auto& p : partition_workload(w).partitions) {
      const auto few = m.simulate_partition(p, {1410, 3, p.slots.front().name});
      const auto many = m.simulate_partition(p, {1410, 30, p.slots.front().name});
      EXPECT_LT(many.collective_end_s, few.collective_end_s) << name << " " << p.key;
      EXPECT_GT(many.compute_end_s, few.compute_end_s) << name << " " << p.key;
    }
  }
}

TEST(Emulator, EmptyPayloadGivesComputeAloneAtEverySlot) {
  const auto w = load_workload(test::paper_workload("qwen3-1.7b_tp8_mbs8_seq4096"));
  const EmulatorModel m(w.gpu());
  for (auto p : partition_workload(w).partitions) {
    p.collective.payload_bytes = 0;
    // The compute alone, plus the join of the two streams every overlapped partition pays.
    const double alone =
        m.simulate_sequence(p.compute_ops, 1200, 24).time_s + m.params().partition_sync_s;
    for (const auto& s : p.slot_names()) {
      EXPECT_DOUBLE_EQ(m.simulate_partition(p, {1200, 12, s}).time_s, alone) << p.key << " " << s;
    }
  }
}

TEST(Emulator, RooflineByHand) {
  // A square bf16 GEMM, 8192^3, on all 108 SMs at 1410 MHz: compute-bound.
  const auto& gpu = gpu_by_name("a100-sxm4-40gb");
  EmulatorParams prm;
  // The roofline alone: at 1410 MHz this GEMM is power-capped on a 400 W A100
  // (PowerModel.CapBindsOnA100GemmInTimeAndEnergy checks that part).
  prm.power_limit_w = 1e4;
  const EmulatorModel m(gpu, prm);
  const Kernel g = test::big_gemm();
  // 64 x 32 = 2048 tiles over 108 SMs: 19 waves, wave efficiency 2048 / 2052.
  // The A100's best-case GEMM efficiency: cuBLAS 271 of 312 TFLOP/s.
  const double eff =
      0.87 * prm.achieved_fraction * (2048.0 / (19 * 108)) * (8192.0 / (8192 + prm.gemm_k_half));
  const double expect = g.flops / (312e12 * eff) + prm.launch_overhead_s;
  const auto r = m.simulate_sequence({g}, 1410, 24);
  // Unless the power cap throttled it, time is exactly the compute roof.
  EXPECT_NEAR(r.time_s, expect, expect * 1e-9);
  // Half the clock, twice the time (the voltage floor does not change time).
  const auto h = m.simulate_sequence({g}, 705, 24);
  EXPECT_NEAR(h.time_s - prm.launch_overhead_s, 2 * (expect - prm.launch_overhead_s), 1e-9);
}

TEST(Emulator, AttentionByHandWithContextParallelCalls) {
  // Causal attention of 8 x 2048 queries x 32 heads of 128 against 4096 keys, in one call and
  // in two calls of 2048 keys (context parallelism's ring): compute-bound on all 108 SMs.
  const auto& gpu = gpu_by_name("a100-sxm4-40gb");
  EmulatorParams prm;
  prm.power_limit_w = 1e4;
  prm.attn_kv_half = 500;
  const EmulatorModel m(gpu, prm);
  Kernel a;
  a.name = "attention";
  a.kind = OpKind::kAttention;
  a.m = 8 * 2048 * 32;  // 4096 tiles of 128 rows: 37.9 waves on 108 SMs -> 38
  a.n = 4096;
  a.k = 128;
  a.flops = 4.0 * 8 * 2048 * 4096 * 32 * 128 * 0.5;
  const double wave = 4096.0 / (38 * 108);
  const double best = m.params().attn_fwd_best_efficiency * prm.achieved_fraction * wave;
  const double one = a.flops / (312e12 * best * 4096 / (4096 + 500)) + prm.launch_overhead_s;
  EXPECT_NEAR(m.simulate_sequence({a}, 1410, 24).time_s, one, one * 1e-9);
  a.kv_calls = 2;
  // Each ring step's exchange (1 ms here) runs under the step's attention (about 5 ms of the
  // call's 11), so only the shorter calls' lower efficiency shows.
  prm.cp_step_s = 1e-3;
  const double compute = a.flops / (312e12 * best * 2048 / (2048 + 500));
  ASSERT_GT(compute, 2 * prm.cp_step_s);
  const double two = compute + prm.launch_overhead_s;
  EXPECT_NEAR(EmulatorModel(gpu, prm).simulate_sequence({a}, 1410, 24).time_s, two, two * 1e-9);
  // With 10 ms per exchange the ring waits for the keys: two steps of 10 ms.
  prm.cp_step_s = 10e-3;
  const double exposed = 2 * prm.cp_step_s + prm.launch_overhead_s;
  EXPECT_NEAR(EmulatorModel(gpu, prm).simulate_sequence({a}, 1410, 24).time_s, exposed,
              exposed * 1e-9);
}

TEST(Emulator, PartitionSyncIsIdleTimeOnEveryOverlappedPartition) {
  const auto& gpu = gpu_by_name("a100-sxm4-40gb");
  const PartitionSet ps = partition_workload(load_workload(test::paper_workload(kWorkloads[0])));
  EmulatorParams off, with;
  off.partition_sync_s = 0;
  with.partition_sync_s = 1e-4;
  const EmulatorModel m0(gpu, off), m1(gpu, with);
  for (const auto& part : ps.partitions) {
    const PartitionConfig c{1410, 24, part.slots.front().name};
    const SimResult a = m0.simulate_partition(part, c), b = m1.simulate_partition(part, c);
    EXPECT_NEAR(b.time_s, a.time_s + 1e-4, 1e-12) << part.key;
    EXPECT_DOUBLE_EQ(b.dynamic_energy_j, a.dynamic_energy_j) << part.key;  // static power only
  }
}

Kernel ring_collective(const char* name, CollectiveKind kind, int group_size, double bytes) {
  Kernel c;
  c.name = name;
  c.kind = OpKind::kCollective;
  c.collective = kind;
  c.group_size = group_size;
  c.payload_bytes = bytes;
  return c;
}

TEST(Emulator, RingAllReduceByHand) {
  const auto& gpu = gpu_by_name("a100-sxm4-40gb");
  EmulatorParams prm;
  const EmulatorModel m(gpu, prm);
  const Kernel c = ring_collective("ar", CollectiveKind::kAllReduce, 8, 256e6);
  // 24 CTAs saturate the 230 GB/s ring: time = latency + 2*7/8*256 MB / 230 GB/s.
  const double link = 230e9;
  const double expect = prm.collective_latency_s + 2.0 * 7 / 8 * 256e6 / link;
  EXPECT_NEAR(m.simulate_sequence({c}, 1410, 24).time_s, expect, 1e-9);
  // 4 CTAs at 1410 MHz: bound by 4 x 230/16 GB/s.
  const double per_cta = 230e9 / prm.nccl_sms_to_saturate;
  const double expect4 = (2.0 * 7 / 8 * 256e6 + prm.collective_latency_s * link) / (4 * per_cta);
  EXPECT_NEAR(m.simulate_sequence({c}, 1410, 4).time_s, expect4, 1e-9);
}

// A communication chain (sequence parallelism: RS, then the norm on the shard, then AG).
// Alone (nothing to overlap) it takes exactly its three kernels one after another, the norm on
// the whole GPU; under a GEMM it takes at least the longer of the two and at most their sum,
// and the chain costs more than its first collective alone.
TEST(Emulator, CommunicationChainByHand) {
  const auto& gpu = gpu_by_name("a100-sxm4-40gb");
  EmulatorParams prm;
  prm.power_limit_w = 1e4;  // no capping: the sequence caps per kernel, the overlap per call
  const EmulatorModel m(gpu, prm);
  const Kernel rs = ring_collective("rs", CollectiveKind::kReduceScatter, 4, 100e6);
  const Kernel ag = ring_collective("ag", CollectiveKind::kAllGather, 4, 100e6);
  Kernel norm;
  norm.name = "rmsnorm";
  norm.kind = OpKind::kNorm;
  norm.flops = 4 * 12.5e6;
  norm.bytes_read = norm.bytes_written = 2 * 12.5e6;
  const std::vector<Kernel> tail = {norm, ag};
  for (int sms : {4, 16, 24}) {
    const SimResult chain = m.simulate_overlap({}, &rs, 0, sms, 1200, tail);
    const SimResult seq = m.simulate_sequence({rs, norm, ag}, 1200, sms);
    EXPECT_NEAR(chain.time_s, seq.time_s, 1e-12 * seq.time_s) << sms;
    EXPECT_NEAR(chain.dynamic_energy_j, seq.dynamic_energy_j, 1e-9 * seq.dynamic_energy_j) << sms;
    EXPECT_NEAR(chain.collective_end_s, chain.time_s, 1e-15);
    const Kernel g = test::big_gemm();
    const double gemm = m.simulate_sequence({g}, 1200, sms).time_s;
    const SimResult both = m.simulate_overlap({g}, &rs, 0, sms, 1200, tail);
    EXPECT_GE(both.time_s, std::max(gemm, seq.time_s)) << sms;
    EXPECT_LE(both.time_s, gemm + seq.time_s) << sms;
    EXPECT_GT(both.collective_end_s, m.simulate_overlap({g}, &rs, 0, sms, 1200).collective_end_s)
        << sms;
  }
  // A partition carries its chain: simulate_partition runs the tail too.
  Partition p;
  p.key = "x";
  p.compute_ops = {test::big_gemm()};
  p.slots = {{"start", 0}};
  p.collective = rs;
  p.comm_tail = tail;
  EXPECT_DOUBLE_EQ(m.simulate_partition(p, {1200, 16, "start"}).time_s,
                   m.simulate_overlap(p.compute_ops, &rs, 0, 16, 1200, tail).time_s +
                       m.params().partition_sync_s);
}

TEST(Emulator, VoltageCurveHasFloor) {
  const EmulatorModel m(gpu_by_name("a100-sxm4-40gb"));
  EXPECT_DOUBLE_EQ(m.relative_voltage(855), 1.0);
  EXPECT_DOUBLE_EQ(m.relative_voltage(900), 1.0);  // below the fitted knee, 900.07 MHz
  EXPECT_DOUBLE_EQ(m.relative_voltage(1410), m.params().voltage_ratio);
  EXPECT_GT(m.relative_voltage(1200), 1.0);
}

TEST(EmulatorProfiler, StaticEnergyIsStaticPowerTimesTime) {
  const auto w = load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096"));
  EmulatorProfiler prof(test::emulator_options(w.gpu_name, 0.01, 7));
  for (const auto& p : partition_workload(w).partitions) {
    const auto m = prof.measure(p, {1200, 9, p.slots.back().name});
    EXPECT_DOUBLE_EQ(m.static_energy_j, 85.0 * m.time_s);
    EXPECT_DOUBLE_EQ(m.dynamic_energy_j, m.energy_j - m.static_energy_j);
  }
}

TEST(EmulatorProfiler, NoiseIsSeededAndSized) {
  const auto w = load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096"));
  const auto ps = partition_workload(w);
  const auto& p = ps.partition("fwd_mlp");
  EmulatorProfiler exact(test::emulator_options(w.gpu_name, 0.0, 1));
  EmulatorProfiler a(test::emulator_options(w.gpu_name, 0.01, 1)),
      b(test::emulator_options(w.gpu_name, 0.01, 1)),
      c(test::emulator_options(w.gpu_name, 0.01, 2));
  const EmulatorModel model(w.gpu());
  const auto e = exact.measure(p, {1410, 12, "norm"});
  EXPECT_DOUBLE_EQ(e.time_s, model.simulate_partition(p, {1410, 12, "norm"}).time_s);
  EXPECT_EQ(a.measure(p, {1410, 12, "norm"}).time_s, b.measure(p, {1410, 12, "norm"}).time_s);
  EXPECT_NE(a.measure(p, {1410, 12, "norm"}).time_s, c.measure(p, {1410, 12, "norm"}).time_s);
  EXPECT_NE(a.fingerprint(), c.fingerprint());
  // Relative deviations over the whole space (540 points): energy's standard deviation near
  // --noise, time's near kTimeNoiseShare x --noise (an H200's repeatability), or --time-noise
  // when given; the means near 0.
  auto sd_mean = [&](EmulatorProfiler& prof, bool time) {
    double sum = 0, sum2 = 0;
    int n = 0;
    for (const auto& cfg : make_search_space(p, w.gpu()).configs()) {
      const Measurement m = prof.measure(p, cfg), x = exact.measure(p, cfg);
      const double d = time ? m.time_s / x.time_s - 1.0 : m.energy_j / x.energy_j - 1.0;
      sum += d;
      sum2 += d * d;
      ++n;
    }
    return std::pair{std::sqrt(sum2 / n - (sum / n) * (sum / n)), sum / n};
  };
  ASSERT_EQ(kTimeNoiseShare, 0.1);
  auto [sd_e, mean_e] = sd_mean(a, false);
  EXPECT_NEAR(sd_e, 0.01, 0.002);
  EXPECT_NEAR(mean_e, 0.0, 0.002);
  auto [sd_t, mean_t] = sd_mean(a, true);
  EXPECT_NEAR(sd_t, 0.001, 0.0002);
  EXPECT_NEAR(mean_t, 0.0, 0.0002);
  EXPECT_EQ(a.noise_rel(), (NoiseRel{0.001, 0.01}));
  auto o = test::emulator_options(w.gpu_name, 0.01, 1);
  o.time_noise = 0.02;
  EmulatorProfiler d(o);
  EXPECT_NEAR(sd_mean(d, true).first, 0.02, 0.004);
  EXPECT_NEAR(sd_mean(d, false).first, sd_e, 1e-12);  // the energy draws do not change
  EXPECT_NE(d.fingerprint(), a.fingerprint());
  for (double bad : {-0.5, 0.6, std::nan("")}) {
    o.time_noise = bad;
    EXPECT_THROW(EmulatorProfiler{o}, InvalidInput) << bad;
  }
}

// A shorter window is noisier by the H200's measured ratio (1.60% at 2 s against 1.06% at
// 5 s), draws again, and is another store entry; the reference window changes nothing.
TEST(EmulatorProfiler, NoiseFollowsTheWindow) {
  const auto w = load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096"));
  const auto ps = partition_workload(w);
  const auto& p = ps.partition("fwd_mlp");
  auto o = test::emulator_options(w.gpu_name, 0.01, 1);
  EmulatorProfiler ref(o), exact(test::emulator_options(w.gpu_name, 0.0, 1));
  o.window_s = kReferenceWindowS;
  EmulatorProfiler same(o);
  o.window_s = 2.0;
  EmulatorProfiler shorter(o);
  EXPECT_EQ(same.fingerprint(), ref.fingerprint());
  EXPECT_NE(shorter.fingerprint(), ref.fingerprint());
  EXPECT_NE(shorter.fingerprint().find("window_s=2"), std::string::npos);
  ASSERT_TRUE(shorter.noise_rel().has_value());
  EXPECT_NEAR(shorter.noise_rel()->energy, 0.01 * 0.0160 / 0.0106, 1e-12);
  EXPECT_DOUBLE_EQ(shorter.noise_rel()->time, 0.001);
  double sum2 = 0, cross = 0;
  int n = 0;
  for (const auto& cfg : make_search_space(p, w.gpu()).configs()) {
    const double x = exact.measure(p, cfg).energy_j;
    const double d2 = shorter.measure(p, cfg).energy_j / x - 1,
                 d5 = ref.measure(p, cfg).energy_j / x - 1;
    sum2 += d2 * d2;
    cross += d2 * d5;
    ++n;
  }
  EXPECT_NEAR(std::sqrt(sum2 / n), 0.01 * 0.0160 / 0.0106, 0.003);
  // Independent draws: the correlation of the two windows' errors is near 0 (540 points).
  EXPECT_LT(std::abs(cross / n) / (0.01 * 0.0151), 0.15);
  for (double bad : {0.0, -1.0, std::nan("")}) {
    o.window_s = bad;
    EXPECT_THROW(EmulatorProfiler{o}, InvalidInput) << bad;
  }
}

TEST(ProfilerRegistry, UnknownNameListsBackends) {
  try {
    create_profiler("cuda-magic", test::emulator_options("a100-sxm4-40gb", 0));
    FAIL();
  } catch (const InvalidInput& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("emulator"), std::string::npos);
    EXPECT_NE(msg.find("trace"), std::string::npos);
  }
}

TEST(Iteration, PipelineEnergyAccounting) {
  // Every GPU burns static power for the whole iteration, dynamic power only while busy.
  const auto w = load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096"));
  const EmulatorModel m(w.gpu());
  const auto r = emulate_schedule(w, m, "megatron", 1410);
  ASSERT_EQ(r.stages.size(), 2u);
  for (const auto& s : r.stages) {
    EXPECT_LT(s.busy_time_s, r.iteration_time_s);
    EXPECT_GT(s.busy_time_s, 0.7 * r.iteration_time_s);
    EXPECT_NEAR(s.energy_j_per_gpu - s.dynamic_energy_j_per_gpu, 85.0 * r.iteration_time_s, 1e-6);
  }
  EXPECT_NEAR(r.energy_j, 8 * r.energy_j_per_gpu_sum_over_stages(), 1e-6);
  // Nano-batching overlaps communication: faster at the same clock.
  EXPECT_LT(emulate_schedule(w, m, "nanobatch", 1410).iteration_time_s, r.iteration_time_s);
  EXPECT_THROW(emulate_schedule(w, m, "zero-bubble", 1410), InvalidInput);
}

}  // namespace
}  // namespace kareus

namespace kareus {
namespace {

IterationResult megatron_at_fmax(const Workload& w) {
  const EmulatorModel m(w.gpu());
  return emulate_schedule(w, m, "megatron", w.gpu().max_freq_mhz);
}

// Interleaving removes the bubble the formula says: going from 1 to v chunks saves
// (p - 1) / m x (1 - 1 / v) of a stage's compute time (Narayanan et al., SC '21, 2.2.2).
TEST(Interleaved, MegatronSavesTheBubbleFormula) {
  const Workload w1 = load_workload(
      test::source_path("workloads/zoo/llama3.1-70b_h100_tp8_sp_pp8_seq4k_mb32.yaml"));
  const IterationResult r1 = megatron_at_fmax(w1);
  double compute_s = 0;  // mean busy time of a stage: its instructions and messages
  for (const auto& s : r1.stages)
    compute_s += s.busy_time_s / static_cast<double>(r1.stages.size());
  const double p = 8, m = 32;
  for (int v : {2, 5}) {
    const Workload wv = load_workload(test::source_path(
        "workloads/zoo/llama3.1-70b_h100_tp8_sp_pp8_vp" + std::to_string(v) + "_seq4k_mb32.yaml"));
    ASSERT_EQ(wv.parallel.virtual_pipeline, v);
    const IterationResult rv = megatron_at_fmax(wv);
    const double saved_s = r1.iteration_time_s - rv.iteration_time_s;
    const double formula_s = compute_s * (p - 1) / m * (1.0 - 1.0 / v);
    EXPECT_GT(saved_s, 0) << "v=" << v;
    EXPECT_NEAR(saved_s, formula_s, 0.02 * rv.iteration_time_s)
        << "v=" << v << ": saved " << saved_s << " s, formula " << formula_s << " s";
    // Same work: every stage is as busy as without interleaving (chunks split its layers).
    for (std::size_t s = 0; s < rv.stages.size(); ++s) {
      EXPECT_NEAR(rv.stages[s].busy_time_s, r1.stages[s].busy_time_s,
                  0.03 * r1.stages[s].busy_time_s);
    }
  }
}

// Data-parallel communication on a job without a pipeline: sequentially after the last
// backward it adds exactly its reduce-scatter and all-gather to the dp = 1 job; overlapped, the
// all-gather plus what the reduce-scatter adds to the last backward, which is less than the
// reduce-scatter and at least its last bucket.
TEST(DataParallel, OverlappedGradientReductionBeatsTheSequentialSegment) {
  const std::string text =
      "model: llama3.2-3b\ngpu: h100-sxm\ncluster: {nodes: 8, gpus_per_node: 8}\n"
      "parallel: {tp: 8, dp: 8, sequence_parallel: true, overlap_dp_comm: OVL}\n"
      "batch: {micro_batch: 2, seq_len: 4096, micro_batches: 4}\nrecompute: full\n";
  auto job = [&](bool overlap, int dp) {
    std::string t = text;
    t.replace(t.find("OVL"), 3, overlap ? "true" : "false");
    if (dp == 1) {
      t.replace(t.find("nodes: 8"), 8, "nodes: 1");
      t.replace(t.find("dp: 8"), 5, "dp: 1");
    }
    return parse_workload(t, "dp.yaml");
  };
  const Workload ovl = job(true, 8), seq = job(false, 8), single = job(true, 1);
  const EmulatorModel m(ovl.gpu());
  const int f = ovl.gpu().max_freq_mhz, sms = ovl.gpu().segment_collective_sms();
  const PartitionSet ps = partition_workload(seq);
  ASSERT_EQ(ps.graph.stages.size(), 1u);
  const DpComm& d = *ps.graph.stages[0].dp;
  // 3.2B parameters over tp 8: 40M-parameter buckets, fp32 gradients, bf16 parameters.
  EXPECT_NEAR(d.grad_reduce_scatter.payload_bytes, 4 * d.params, 1);
  EXPECT_NEAR(d.param_all_gather.payload_bytes, 2 * d.params, 1);
  EXPECT_DOUBLE_EQ(d.bucket_params, 40e6);
  EXPECT_TRUE(d.grad_reduce_scatter.inter_node);
  const double rs_s = m.simulate_sequence({d.grad_reduce_scatter}, f, sms).time_s;
  const double ag_s = m.simulate_sequence({d.param_all_gather}, f, sms).time_s;
  const double t1 = megatron_at_fmax(single).iteration_time_s;
  const double t_seq = megatron_at_fmax(seq).iteration_time_s;
  const double t_ovl = megatron_at_fmax(ovl).iteration_time_s;
  EXPECT_NEAR(t_seq, t1 + rs_s + ag_s, 1e-9 * t_seq);
  // Megatron-LM's schedule runs whole micro-batches: its partitioning has one nano-batch.
  Workload ovl1 = ovl;
  ovl1.batch.nano_batches = 1;
  const PartitionSet pso = partition_workload(ovl1);
  ASSERT_EQ(pso.dp_grad_overlaps.size(), 1u);
  ASSERT_FALSE(pso.dp_grad_overlaps[0].no_overlap);
  const double inc_s = dp_grad_increment(m, pso.dp_grad_overlaps[0]).time_s;
  const double last_bucket_s =
      m.simulate_sequence(pso.dp_grad_overlaps[0].exposed.kernels, f, sms).time_s;
  EXPECT_NEAR(t_ovl, t1 + ag_s + inc_s, 1e-9 * t_ovl);
  EXPECT_LT(inc_s, rs_s);
  EXPECT_GE(inc_s, last_bucket_s);
  EXPECT_LT(t_ovl, t_seq);
}

}  // namespace
}  // namespace kareus
