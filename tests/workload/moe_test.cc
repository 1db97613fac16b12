// Mixture-of-experts workloads: the file's keys and Megatron-LM's rules, the kernel graph's
// all-to-alls and grouped GEMMs, model FLOPs and memory, each against numbers computed here by
// hand from the published model configurations.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "kareus/error.h"
#include "kareus/kernel_graph.h"
#include "kareus/partition.h"
#include "kareus/workload.h"
#include "test_util.h"

namespace kareus {
namespace {

// Qwen3-30B-A3B (hidden 2048, 48 layers, 32 heads of 128, 4 KV heads, 128 experts, top 8,
// expert FFN 768, vocab 151936) on one node of 8 H100, EP8.
std::string qwen30b(const std::string& parallel = "{tp: 1, pp: 1, dp: 8, ep: 8}",
                    const std::string& cluster = "{nodes: 1, gpus_per_node: 8}") {
  return "model: qwen3-30b-a3b\ngpu: h100-sxm\ncluster: " + cluster + "\nparallel: " + parallel +
         "\nbatch: {micro_batch: 2, seq_len: 4096, micro_batches: 8}\nrecompute: full\n";
}

std::string error_of(const std::string& yaml) {
  try {
    parse_workload(yaml, "moe.yaml");
  } catch (const InvalidInput& e) {
    return e.what();
  }
  return "";
}

const Kernel* find_kernel(const std::vector<Block>& blocks, const std::string& name) {
  for (const auto& b : blocks) {
    for (const auto& k : b.ops) {
      if (k.name == name) return &k;
    }
    if (b.collective.name == name) return &b.collective;
    for (const auto& k : b.comm_tail) {
      if (k.name == name) return &k;
    }
  }
  return nullptr;
}

TEST(Moe, PresetsMatchPublishedConfigs) {
  const ModelConfig mix = model_preset("mixtral-8x7b");
  EXPECT_EQ(mix.layers, 32);
  EXPECT_EQ(mix.hidden, 4096);
  EXPECT_EQ(mix.experts, 8);
  EXPECT_EQ(mix.experts_per_token, 2);
  EXPECT_EQ(mix.expert_ffn_hidden, 14336);
  EXPECT_EQ(mix.kv_heads, 8);
  EXPECT_EQ(mix.vocab, 32000);
  const ModelConfig q30 = model_preset("qwen3-30b-a3b");
  EXPECT_EQ(q30.layers, 48);
  EXPECT_EQ(q30.hidden, 2048);
  EXPECT_EQ(q30.heads, 32);
  EXPECT_EQ(q30.kv_heads, 4);
  EXPECT_EQ(q30.experts, 128);
  EXPECT_EQ(q30.experts_per_token, 8);
  EXPECT_EQ(q30.expert_ffn_hidden, 768);
  EXPECT_TRUE(q30.qk_norm);
  const ModelConfig q235 = model_preset("qwen3-235b-a22b");
  EXPECT_EQ(q235.layers, 94);
  EXPECT_EQ(q235.heads, 64);
  EXPECT_EQ(q235.expert_ffn_hidden, 1536);
  // Total parameters of the published names: 30.5B and 235B (Qwen3 technical report).
  auto total = [](const ModelConfig& m) {
    const double h = m.hidden, d = m.head_dim;
    const double attn = h * (m.heads + 2.0 * m.kv_heads) * d + m.heads * d * h;
    const double moe = m.experts * 3.0 * h * m.expert_ffn_hidden + h * m.experts;
    return m.layers * (attn + moe) + 2.0 * m.vocab * h;
  };
  EXPECT_NEAR(total(q30) / 1e9, 30.5, 0.3);
  EXPECT_NEAR(total(q235) / 1e9, 235, 2);
  EXPECT_NEAR(total(mix) / 1e9, 46.7, 0.3);  // Mistral AI: 46.7B total parameters
}

TEST(Moe, KeysAndMegatronsRulesAreChecked) {
  // A dense key a new user tries first is refused, listing the MoE keys.
  const std::string custom =
      "model: {layers: 4, hidden: 1024, ffn_hidden: 4096, heads: 8, kv_heads: 8, head_dim: 128, "
      "vocab: 32000, num_experts: 8}\ngpu: h100-sxm\ncluster: {nodes: 1, gpus_per_node: 8}\n"
      "parallel: {dp: 8}\nbatch: {micro_batch: 2, seq_len: 4096, micro_batches: 8}\n";
  const std::string e1 = error_of(custom);
  EXPECT_NE(e1.find("moe.yaml: key 'model.num_experts': unknown key"), std::string::npos) << e1;
  EXPECT_NE(e1.find("experts_per_token"), std::string::npos) << e1;
  // ep without experts.
  const std::string dense =
      "model: qwen3-1.7b\ngpu: h100-sxm\ncluster: {nodes: 1, gpus_per_node: 8}\n"
      "parallel: {tp: 1, dp: 8, ep: 8}\nbatch: {micro_batch: 2, seq_len: 4096, "
      "micro_batches: 8}\n";
  EXPECT_NE(error_of(dense).find("key 'parallel.ep': expert parallelism needs a mixture"),
            std::string::npos)
      << error_of(dense);
  // ep must divide tp * cp * dp and the experts.
  EXPECT_NE(error_of(qwen30b("{tp: 1, dp: 8, ep: 3}")).find("ep (3) must divide the GPUs"),
            std::string::npos);
  EXPECT_NE(error_of(qwen30b("{tp: 1, dp: 8, ep: 16}")).find("ep (16) must divide the GPUs"),
            std::string::npos);
  // TP with experts needs sequence parallelism.
  EXPECT_NE(error_of(qwen30b("{tp: 2, dp: 4, ep: 8}")).find("needs sequence_parallel: true"),
            std::string::npos);
  EXPECT_EQ(error_of(qwen30b("{tp: 2, dp: 4, ep: 8, sequence_parallel: true}")), "");
  // The NCCL version is major.minor.
  EXPECT_NE(error_of(qwen30b("{tp: 1, dp: 8, ep: 8}", "{nodes: 1, gpus_per_node: 8, nccl: 2}"))
                .find("key 'cluster.nccl': expected a version as major.minor"),
            std::string::npos);
  // The imbalance lies in [1, ep].
  const std::string custom_moe =
      "model: {layers: 4, hidden: 1024, ffn_hidden: 4096, heads: 8, kv_heads: 8, head_dim: 128, "
      "vocab: 32000, experts: 8, experts_per_token: 2, expert_ffn_hidden: 512, "
      "expert_imbalance: 9}\ngpu: h100-sxm\ncluster: {nodes: 1, gpus_per_node: 8}\n"
      "parallel: {dp: 8, ep: 8}\nbatch: {micro_batch: 2, seq_len: 4096, micro_batches: 8}\n";
  EXPECT_NE(error_of(custom_moe)
                .find("key 'model.expert_imbalance': allowed 1 (balanced) up to "
                      "parallel.ep = 8"),
            std::string::npos)
      << error_of(custom_moe);
  // Every class of error exits 2 through the CLI, before any work.
  test::TempDir tmp;
  const auto r = test::run_cli("workload show " + tmp.write("bad.yaml", custom));
  EXPECT_EQ(r.exit_code, 2) << r.err;
}

TEST(Moe, AllToAllAndGroupedGemmShapesByHand) {
  const Workload w = parse_workload(qwen30b(), "q30.yaml");
  const KernelGraph g = build_kernel_graph(w);
  const auto& fwd = g.stages.at(0).forward.blocks;
  // One nano-batch: 1 sequence of 4096 tokens; 8 routed copies each of 2048 bf16 values.
  const double routed = 4096.0 * 8;
  const Kernel* dispatch = find_kernel(fwd, "ep_dispatch");
  ASSERT_NE(dispatch, nullptr);
  EXPECT_EQ(dispatch->collective, CollectiveKind::kAllToAll);
  EXPECT_EQ(dispatch->group, CommGroup::kEp);
  EXPECT_EQ(dispatch->group_size, 8);
  EXPECT_DOUBLE_EQ(dispatch->payload_bytes, routed * 2048 * 2);  // 134,217,728 B
  EXPECT_DOUBLE_EQ(dispatch->wire_bytes(), 7.0 / 8 * routed * 2048 * 2);
  EXPECT_FALSE(dispatch->inter_node);
  EXPECT_TRUE(dispatch->copy_engine);
  // 16 local experts, 2048 rows each; FC1 is gate and up: 2 x 768 columns.
  const Kernel* fc1 = find_kernel(fwd, "expert_fc1");
  ASSERT_NE(fc1, nullptr);
  EXPECT_EQ(fc1->groups, 16);
  EXPECT_EQ(fc1->m, 2048);
  EXPECT_EQ(fc1->n, 1536);
  EXPECT_EQ(fc1->k, 2048);
  EXPECT_DOUBLE_EQ(fc1->flops, 16 * 2.0 * 2048 * 1536 * 2048);
  // Each expert reads its own weights.
  EXPECT_DOUBLE_EQ(fc1->bytes_read, 16 * (2048.0 * 2048 + 2048.0 * 1536) * 2);
  const Kernel* router = find_kernel(fwd, "router_gemm");
  ASSERT_NE(router, nullptr);
  EXPECT_DOUBLE_EQ(router->flops, 2.0 * 4096 * 128 * 2048);

  // Across two nodes (EP16): half the buffer goes to the other node, over the NIC; no copy
  // engines.
  const Workload w16 =
      parse_workload(qwen30b("{tp: 1, dp: 16, ep: 16}", "{nodes: 2, gpus_per_node: 8}"), "q.yaml");
  const KernelGraph g16 = build_kernel_graph(w16);
  const Kernel* d16 = find_kernel(g16.stages.at(0).forward.blocks, "ep_dispatch");
  ASSERT_NE(d16, nullptr);
  EXPECT_TRUE(d16->inter_node);
  EXPECT_EQ(d16->node_ranks, 8);
  EXPECT_DOUBLE_EQ(d16->wire_bytes(), 0.5 * routed * 2048 * 2);
  EXPECT_FALSE(d16->copy_engine);
  // An NCCL before 2.28 has no copy-engine all-to-all.
  const Workload old = parse_workload(
      qwen30b("{tp: 1, dp: 8, ep: 8}", "{nodes: 1, gpus_per_node: 8, nccl: \"2.27\"}"), "q.yaml");
  EXPECT_FALSE(
      find_kernel(build_kernel_graph(old).stages.at(0).forward.blocks, "ep_dispatch")->copy_engine);
}

TEST(Moe, ModelFlopsCountTheTopKExpertsByHand) {
  const Workload w = parse_workload(qwen30b(), "q30.yaml");
  const KernelGraph g = build_kernel_graph(w);
  // Forward FLOPs per token: QKV 2h(a+2g)d, output 2(ad)h, causal attention 4 s (ad) / 2,
  // router 2hE, k experts of 6 h f_e each; the logits 2hV; backward twice the forward.
  const double h = 2048, ad = 32 * 128, gd = 4 * 128, s = 4096;
  const double layer =
      2 * h * (ad + 2 * gd) + 2 * ad * h + 4 * s * ad / 2 + 2 * h * 128 + 8 * 6 * h * 768;
  const double per_token = 3 * (48 * layer + 2 * h * 151936);
  const double tokens = 2 * 4096.0 * 8 * 8;  // micro-batch x seq x micro-batches x dp
  EXPECT_NEAR(g.model_flops_per_iteration / (per_token * tokens), 1.0, 1e-12);
}

TEST(Moe, CopyEnginesOnlyWhereTheWholeChainCanUseThem) {
  // EP8 in one node, TP1: the dispatch and combine partitions may take 0 SMs.
  const PartitionSet ps = partition_workload(parse_workload(qwen30b(), "q30.yaml"));
  EXPECT_TRUE(copy_engine_eligible(ps.partition("fwd_moe_experts_a2a")));
  EXPECT_TRUE(sms_allowed(ps.partition("fwd_moe_experts_a2a"), 0));
  EXPECT_FALSE(copy_engine_eligible(ps.partition("fwd_moe_route_ar")));  // an empty TP reduce
  EXPECT_FALSE(sms_allowed(ps.partition("fwd_moe_route_ar"), 0));
  // Mixtral TP2 SP EP8: the combine's chain ends in the next layer's TP AllGather, which needs
  // SMs; the dispatch alone may use the copy engines.
  const PartitionSet mix = partition_workload(
      load_workload(test::source_path("workloads/moe/mixtral-8x7b_h100_tp2_sp_ep8_dp8.yaml")));
  EXPECT_TRUE(copy_engine_eligible(mix.partition("fwd_moe_experts_a2a")));
  EXPECT_FALSE(copy_engine_eligible(mix.partition("fwd_moe_experts_a2a_ag")));
  // Across nodes never.
  const PartitionSet x = partition_workload(
      load_workload(test::source_path("workloads/moe/qwen3-30b-a3b_h100_ep16_dp16.yaml")));
  for (const auto& p : x.partitions) EXPECT_FALSE(copy_engine_eligible(p)) << p.key;
}

TEST(Moe, MemoryShardsTheExpertsOverEp) {
  const Workload w = parse_workload(qwen30b(), "q30.yaml");
  const MemoryEstimate m = estimate_memory(w);
  // 48 layers x 16 local experts x 3 x 2048 x 768.
  const double experts = 48 * 16 * 3.0 * 2048 * 768;
  const double attn = 2048.0 * (32 + 8) * 128 + 32 * 128 * 2048.0;
  const double norms = 2 * 2048 + 2 * 128;
  const double dense = 48 * (attn + norms + 2048 * 128) + 2 * 151936 * 2048.0 + 2048;
  EXPECT_DOUBLE_EQ(m.expert_parameters, experts);
  EXPECT_NEAR(m.parameters, experts + dense, 1.0);
  // Expert dp is 8 / 8 = 1: the experts' optimizer state is not sharded, the rest over dp 8.
  EXPECT_NEAR(m.optimizer_distributed_bytes, 12 * (dense / 8 + experts), 16.0);
  // EP4 holds twice the experts per GPU, sharded over expert dp 2.
  const MemoryEstimate m4 = estimate_memory(parse_workload(qwen30b("{tp: 1, dp: 8, ep: 4}"), "x"));
  EXPECT_DOUBLE_EQ(m4.expert_parameters, 2 * experts);
  EXPECT_NEAR(m4.optimizer_distributed_bytes, 12 * (dense / 8 + 2 * experts / 2), 16.0);
}

// `kareus workload show --json` on each MoE preset's suite file: the dispatch's payload and the
// expert block's FLOPs by hand. Tokens of one nano-batch on one rank T = seq / cp / tp (one
// sequence per nano-batch; SP shards them over TP); routed copies R = T x top-k; payload R x h x
// 2 B; experts block 6 h f_e FLOPs per routed copy (FC1 gate+up and FC2) plus SwiGLU's 5 per
// element of R x f_e.
TEST(Moe, WorkloadShowListsTheAllToAllsOfEveryPreset) {
  struct Case {
    const char* file;
    double tokens, top_k, hidden, expert_ffn, experts_per_gpu;
  };
  const Case cases[] = {
      {"workloads/moe/mixtral-8x7b_h100_tp2_sp_ep8_dp8.yaml", 4096.0 / 2, 2, 4096, 14336, 1},
      {"workloads/moe/qwen3-30b-a3b_h100_ep8_dp8.yaml", 4096, 8, 2048, 768, 16},
      {"workloads/moe/qwen3-235b-a22b_h100_tp4_sp_cp2_pp16_ep8.yaml", 4096.0 / 2 / 4, 8, 4096, 1536,
       16},
  };
  for (const Case& c : cases) {
    const auto r =
        test::run_cli(std::string("workload show ") + test::source_path(c.file) + " --json");
    ASSERT_EQ(r.exit_code, 0) << c.file << ": " << r.err;
    const auto j = nlohmann::json::parse(r.out);
    const double routed = c.tokens * c.top_k;
    bool found = false;
    for (const auto& p : j.at("partitions")) {
      if (p.at("key") != "fwd_moe_experts_a2a") continue;
      found = true;
      EXPECT_EQ(p.at("collective").at("kind"), "alltoall") << c.file;
      EXPECT_EQ(p.at("collective").at("group"), "ep") << c.file;
      EXPECT_EQ(p.at("collective").at("group_size"), 8) << c.file;
      EXPECT_DOUBLE_EQ(p.at("collective").at("bytes").get<double>(), routed * c.hidden * 2)
          << c.file;
      const double flops = routed * 6 * c.hidden * c.expert_ffn + 5 * routed * c.expert_ffn;
      EXPECT_NEAR(p.at("compute_flops").get<double>() / flops, 1.0, 1e-12) << c.file;
      EXPECT_TRUE(p.at("copy_engine").get<bool>()) << c.file;
      const auto& fc1 = p.at("compute_ops").at(0);
      EXPECT_EQ(fc1.at("name"), "expert_fc1");
      EXPECT_EQ(fc1.value("groups", 1), c.experts_per_gpu) << c.file;  // absent: one
    }
    EXPECT_TRUE(found) << c.file;
    EXPECT_GT(j.at("memory").at("expert_parameters").get<double>(), 0) << c.file;
  }
}

}  // namespace
}  // namespace kareus
