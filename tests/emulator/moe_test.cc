// The emulator's all-to-all (intra-node NVLink, inter-node NIC, SM scaling, copy engines) and
// grouped GEMM against hand-computed figures, and the 0-SM option of the search space.
#include <gtest/gtest.h>

#include "kareus/emulator.h"
#include "kareus/error.h"
#include "kareus/search_space.h"
#include "test_util.h"

namespace kareus {
namespace {

Kernel alltoall(int group_size, double payload, bool inter_node, int node_ranks, bool ce) {
  Kernel c;
  c.name = "ep_dispatch";
  c.kind = OpKind::kCollective;
  c.collective = CollectiveKind::kAllToAll;
  c.group = CommGroup::kEp;
  c.group_size = group_size;
  c.payload_bytes = payload;
  c.inter_node = inter_node;
  c.node_ranks = node_ranks;
  c.copy_engine = ce;
  return c;
}

TEST(MoeEmulator, AllToAllByHandInsideAndAcrossNodes) {
  const auto& gpu = gpu_by_name("h100-sxm");
  const EmulatorParams prm;
  const EmulatorModel m(gpu, prm);
  const double payload = 134217728;  // Qwen3-30B-A3B: 4096 tokens x top 8 x 2048 x 2 B
  // Inside one node (EP8): 7/8 of the buffer over NVLink at NCCL's 370 GB/s bus bandwidth
  // (32 CTAs saturate it), plus the collective's latency.
  const Kernel intra = alltoall(8, payload, false, 8, true);
  const double link = 370e9;
  const double t_intra = prm.collective_latency_s + 7.0 / 8 * payload / link;
  EXPECT_NEAR(m.simulate_sequence({intra}, 1980, 32).time_s, t_intra, 1e-9);
  // Across two nodes (EP16, 8 per node): the other node's half over one 400 Gb/s NIC
  // (50 GB/s, 90% achievable).
  const Kernel inter = alltoall(16, payload, true, 8, false);
  const double nic = 50e9 * prm.internode_efficiency;
  const double t_inter = prm.collective_latency_s + 0.5 * payload / nic;
  EXPECT_NEAR(m.simulate_sequence({inter}, 1980, 32).time_s, t_inter, 1e-9);
  // Few CTAs: bound by CTAs x (370 GB/s / CTAs to saturate) at the running clock.
  const double per_cta = link / prm.nccl_sms_to_saturate;
  const double t4 = (7.0 / 8 * payload + prm.collective_latency_s * link) / (4 * per_cta);
  EXPECT_NEAR(m.simulate_sequence({intra}, 1980, 4).time_s, t4, 1e-9);
  // The copy engines: the link rate with no SMs, at any clock.
  const auto ce_fast = m.simulate_sequence({intra}, 1980, 0);
  const auto ce_slow = m.simulate_sequence({intra}, 1005, 0);
  EXPECT_NEAR(ce_fast.time_s, t_intra, 1e-9);
  EXPECT_NEAR(ce_slow.time_s, t_intra, 1e-9);
  // No SM holds a CTA: the dynamic energy is the links' and HBM's only, the same at any clock.
  EXPECT_NEAR(ce_slow.dynamic_energy_j, ce_fast.dynamic_energy_j, 1e-12);
  const double expect_w = (prm.link_pj_per_bit + prm.hbm_pj_per_bit * prm.collective_hbm_factor) *
                          8e-12 * (7.0 / 8 * payload + prm.collective_latency_s * link) / t_intra;
  EXPECT_NEAR(ce_fast.dynamic_energy_j / ce_fast.time_s, expect_w, expect_w * 1e-9);
  // A collective the copy engines cannot run refuses 0 SMs.
  EXPECT_THROW(m.simulate_sequence({inter}, 1980, 0), InvalidInput);
}

TEST(MoeEmulator, MoreSmsNeverSlowTheAllToAll) {
  const auto& gpu = gpu_by_name("h100-sxm");
  const EmulatorModel m(gpu);
  for (const bool inter : {false, true}) {
    const Kernel c = alltoall(inter ? 16 : 8, 64e6, inter, 8, !inter);
    double prev = 1e300;
    for (int sms = 1; sms <= kMaxCollectiveSms; ++sms) {
      const double t = m.simulate_sequence({c}, 1980, sms).time_s;
      EXPECT_LE(t, prev * (1 + 1e-12)) << "inter " << inter << " sms " << sms;
      prev = t;
    }
    // The NIC saturates with fewer CTAs than NVLink: 45 GB/s needs 45/370 of the CTAs. Inside
    // the node 32 CTAs reach the link rate and 8 reach 8 / nccl_sms_to_saturate of it.
    const double t8 = m.simulate_sequence({c}, 1980, 8).time_s;
    const double t32 = m.simulate_sequence({c}, 1980, 32).time_s;
    if (inter) {
      EXPECT_NEAR(t8, t32, 1e-12);
    } else {
      ASSERT_LT(m.params().nccl_sms_to_saturate, 32);
      EXPECT_NEAR(t8 / t32, m.params().nccl_sms_to_saturate / 8, 1e-9);
    }
  }
}

TEST(MoeEmulator, CopyEnginesLeaveTheSmsToTheOverlappedCompute) {
  const auto& gpu = gpu_by_name("h100-sxm");
  EmulatorParams prm;
  prm.power_limit_w = 1e4;  // no power cap: the same clock in every call
  const EmulatorModel m(gpu, prm);
  const Kernel c = alltoall(8, 134217728, false, 8, true);
  const Kernel g = test::big_gemm();
  const double alone = m.simulate_overlap({g}, nullptr, 0, 0, 1980).compute_end_s;
  const double ce = m.simulate_overlap({g}, &c, 0, 0, 1980).compute_end_s;
  const double sm32 = m.simulate_overlap({g}, &c, 0, 32, 1980).compute_end_s;
  // The traffic still slows the compute (HBM and L2 interference), but it keeps all 132 SMs.
  EXPECT_GT(ce, alone);
  EXPECT_LT(ce, sm32);
  // A tail kernel without SMs of its own takes the GPU in turn: the chain's kernel time adds to
  // the compute's.
  Kernel unpermute;
  unpermute.name = "unpermute";
  unpermute.kind = OpKind::kElementwise;
  unpermute.bytes_read = 134217728;
  unpermute.bytes_written = 16777216;
  const auto with_tail = m.simulate_overlap({g}, &c, 0, 0, 1980, {unpermute});
  const double tail_alone = m.simulate_sequence({unpermute}, 1980, 0).time_s;
  EXPECT_NEAR(with_tail.compute_end_s, ce + tail_alone, 1e-9);
}

TEST(MoeEmulator, FewRowsPerExpertWasteTheirTiles) {
  // Grouped GEMMs of 4 experts, n 2560 (10 tiles of 256), k 4096 on all 132 SMs: 64 or 128 rows
  // per expert both fill one row of 128-row tiles, so the time is the same although the first
  // has half the FLOPs; 256 rows (80 tiles) still run in one wave, in the same time; 512 rows
  // (160 tiles) need two waves, twice the time.
  const auto& gpu = gpu_by_name("h100-sxm");
  EmulatorParams prm;
  prm.power_limit_w = 1e4;  // the roofline alone
  const EmulatorModel m(gpu, prm);
  auto grouped = [](double rows) {
    Kernel g;
    g.name = "expert_fc1";
    g.kind = OpKind::kGemm;
    g.groups = 4;
    g.m = static_cast<std::int64_t>(rows);
    g.n = 2560;
    g.k = 4096;
    g.flops = 4 * 2.0 * rows * 2560 * 4096;
    g.bytes_read = 4 * (rows * 4096 + 4096.0 * 2560) * 2;
    g.bytes_written = 4 * rows * 2560 * 2;
    return g;
  };
  const double t64 = m.simulate_sequence({grouped(64)}, 1980, 0).time_s;
  const double t128 = m.simulate_sequence({grouped(128)}, 1980, 0).time_s;
  const double t256 = m.simulate_sequence({grouped(256)}, 1980, 0).time_s;
  const double t512 = m.simulate_sequence({grouped(512)}, 1980, 0).time_s;
  // By hand: 40 tiles in one wave; efficiency best x achieved x 40/132 x (4096/(4096+64)).
  const EmulatorParams& q = m.params();
  const double eff = q.gemm_best_efficiency * q.achieved_fraction * (40.0 / 132) *
                     (4096.0 / (4096 + q.gemm_k_half));
  const double expect128 = grouped(128).flops / (989e12 * eff) + q.launch_overhead_s;
  EXPECT_NEAR(t128, expect128, expect128 * 1e-9);
  EXPECT_NEAR(t64, t128, t128 * 1e-9);
  EXPECT_NEAR(t256, t128, t128 * 1e-9);
  EXPECT_NEAR(t512 - prm.launch_overhead_s, 2 * (t128 - prm.launch_overhead_s), t128 * 1e-9);
}

TEST(MoeEmulator, ZeroSmsInTheSearchSpaceExactlyInsideANode) {
  const auto& gpu = gpu_by_name("h100-sxm");
  const PartitionSet in = partition_workload(
      load_workload(test::source_path("workloads/moe/qwen3-30b-a3b_h100_ep8_dp8.yaml")));
  const PartitionSet across = partition_workload(
      load_workload(test::source_path("workloads/moe/qwen3-30b-a3b_h100_ep16_dp16.yaml")));
  const Partition& p = in.partition("fwd_moe_experts_a2a");
  const SearchSpace s = make_search_space(p, gpu);
  ASSERT_FALSE(s.sms.empty());
  EXPECT_EQ(s.sms.front(), 0);
  // 0, then 2, 4, ..., 32 (NCCL's default 32 is among them).
  EXPECT_EQ(s.sms.size(), 17u);
  EXPECT_EQ(s.sms.back(), 32);
  const SearchSpace x = make_search_space(across.partition("fwd_moe_experts_a2a"), gpu);
  EXPECT_EQ(x.sms.front(), 2);
  EXPECT_EQ(x.sms.size(), 16u);
  // The rule is enforced for explicit configurations too.
  EXPECT_NO_THROW(validate_config(p, gpu, {1980, 0, "linear"}));
  try {
    validate_config(across.partition("fwd_moe_experts_a2a"), gpu, {1980, 0, "linear"});
    ADD_FAILURE() << "0 SMs across nodes accepted";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("allows 1..32 (NCCL's channel limit)"), std::string::npos)
        << e.what();
  }
  // The emulator's measurement of a 0-SM configuration runs (no "needs an SM" error).
  const EmulatorModel m(gpu);
  const SimResult r = m.simulate_partition(p, {1980, 0, "linear"});
  EXPECT_GT(r.time_s, 0);
  EXPECT_GT(r.collective_end_s, 0);
}

}  // namespace
}  // namespace kareus
