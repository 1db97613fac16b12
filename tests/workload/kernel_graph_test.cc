// Kernel shapes checked against hand calculations from the brief's formulas (section 9).
#include "kareus/kernel_graph.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace kareus {
namespace {

const Kernel& find(const std::vector<Kernel>& ks, const std::string& name) {
  for (const auto& k : ks) {
    if (k.name == name) return k;
  }
  throw std::runtime_error("no kernel " + name);
}

TEST(KernelGraph, TpLayerShapesByHand) {
  const auto w = load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096"));
  const auto g = build_kernel_graph(w);
  ASSERT_EQ(g.stages.size(), 2u);
  const auto& fwd = g.stages[0].forward;
  ASSERT_EQ(fwd.blocks.size(), 2u * 15);  // attn + mlp per layer
  // Nano-batch: 4 sequences x 4096 = 16384 tokens on each TP rank.
  const double T = 16384, h = 3072;
  const auto& attn = fwd.blocks[0];
  EXPECT_EQ(attn.name, "attn");
  const auto& qkv = find(attn.ops, "qkv_gemm");
  EXPECT_DOUBLE_EQ(qkv.flops, 2 * T * h * (24 + 16) * 128 / 8.0);
  EXPECT_EQ(qkv.n, (3 + 2) * 128);  // 3 query heads + 2x1 kv heads per rank
  const auto& at = find(attn.ops, "attention");
  EXPECT_DOUBLE_EQ(at.flops, 2.0 * 4 * 4096.0 * 4096 * 3 * 128);
  EXPECT_DOUBLE_EQ(find(attn.ops, "out_proj").flops, 2 * T * 24 * 128 * h / 8);
  const auto& mlp = fwd.blocks[1];
  EXPECT_DOUBLE_EQ(find(mlp.ops, "fc1").flops + find(mlp.ops, "fc2").flops, 6 * T * h * 8192 / 8);
  // TP AllReduce payload T*h*2 bytes; a ring moves 2(t-1)/t of it.
  EXPECT_DOUBLE_EQ(attn.collective.payload_bytes, T * h * 2);
  EXPECT_DOUBLE_EQ(attn.collective.wire_bytes(), T * h * 2 * 2 * 7 / 8);
  EXPECT_EQ(attn.collective.group_size, 8);
  EXPECT_FALSE(attn.collective.inter_node);
  // Pipeline P2P: b*s*h*2 bytes per micro-batch, between nodes here.
  EXPECT_DOUBLE_EQ(g.p2p.payload_bytes, 8 * 4096.0 * h * 2);
  EXPECT_TRUE(g.p2p.inter_node);
}

TEST(KernelGraph, BackwardIsTwiceForwardPlusRecompute) {
  const auto w = load_workload(test::paper_workload("qwen3-1.7b_tp8_mbs8_seq4096"));
  const auto g = build_kernel_graph(w);
  auto gemm_flops = [](const InstructionGraph& ig, bool recompute) {
    double f = 0;
    for (const auto& b : ig.blocks) {
      if (b.recompute != recompute) continue;
      for (const auto& k : b.ops) f += k.model_flops;
    }
    return f;
  };
  const auto& s = g.stages[1];
  EXPECT_NEAR(gemm_flops(s.backward, false) / gemm_flops(s.forward, false), 2.0, 1e-9);
  EXPECT_NEAR(gemm_flops(s.backward, true) / gemm_flops(s.forward, false), 1.0, 1e-9);
  // Embedding on the first stage, output layer on the last.
  EXPECT_FALSE(g.stages[0].forward.prologue.empty());
  EXPECT_TRUE(g.stages[0].forward.epilogue.empty());
  EXPECT_FALSE(g.stages[1].forward.epilogue.empty());
}

TEST(KernelGraph, ContextParallelGathersKv) {
  const auto w = load_workload(test::paper_workload("llama3.2-3b_cp2tp4_mbs8_seq4096"));
  const auto g = build_kernel_graph(w);
  const auto& qkv = g.stages[0].forward.blocks[0];
  EXPECT_EQ(qkv.name, "qkv");
  EXPECT_EQ(qkv.collective.collective, CollectiveKind::kAllGather);
  EXPECT_EQ(qkv.collective.group, CommGroup::kCp);
  // Full-sequence K and V of 2 kv heads per rank: 4 x 4096 x 2 x 256 x 2 bytes.
  EXPECT_DOUBLE_EQ(qkv.collective.payload_bytes, 4 * 4096.0 * 2 * 2 * 128 * 2);
  EXPECT_DOUBLE_EQ(qkv.collective.wire_bytes(), qkv.collective.payload_bytes / 2);
  // Each CP rank computes half of the causal attention.
  const auto& attn = find(g.stages[0].forward.blocks[1].ops, "attention");
  EXPECT_DOUBLE_EQ(attn.flops, 2.0 * 4 * 4096.0 * 4096 * 6 * 128 / 2);
}

TEST(KernelGraph, SequenceAndDataParallel) {
  const auto w =
      load_workload(test::source_path("workloads/examples/llama3.2-3b_h100_tp4_sp_dp2.yaml"));
  const auto g = build_kernel_graph(w);
  bool has_ag = false, has_rs = false;
  for (const auto& b : g.stages[0].forward.blocks) {
    has_ag |= b.collective.collective == CollectiveKind::kAllGather;
    has_rs |= b.collective.collective == CollectiveKind::kReduceScatter;
  }
  EXPECT_TRUE(has_ag);
  EXPECT_TRUE(has_rs);
  // ZeRO-1 with overlap (the default): no sequential DP segment (only the tied embedding's
  // reduction, pp = 2); the chunk's whole parameter count in fp32 gradients and bf16 parameters.
  ASSERT_EQ(g.stages[0].per_iteration.size(), 1u);
  EXPECT_EQ(g.stages[0].per_iteration[0].group, CommGroup::kEmbedding);
  ASSERT_TRUE(g.stages[0].dp.has_value());
  const DpComm& dp = *g.stages[0].dp;
  EXPECT_TRUE(dp.overlapped);
  for (const Kernel* k : {&dp.grad_reduce_scatter, &dp.param_all_gather}) {
    EXPECT_EQ(k->group, CommGroup::kDp);
    EXPECT_EQ(k->group_size, 2);
  }
  EXPECT_EQ(dp.grad_reduce_scatter.collective, CollectiveKind::kReduceScatter);
  EXPECT_EQ(dp.param_all_gather.collective, CollectiveKind::kAllGather);
  // Llama 3.2 3B over tp 4, stage 0 of 2, from the shape by hand: 14 layers' matrices / 4 with
  // their two norms replicated, and the embedding.
  const double h = 3072, f = 8192, a = 24, g_kv = 8, d = 128, v = 128256, t = 4;
  const double layer = (h * (a + 2 * g_kv) * d + a * d * h + 3 * h * f) / t + 2 * h;
  EXPECT_NEAR(dp.params, 14 * layer + v * h / t, 1e-6 * dp.params);
  EXPECT_NEAR(dp.grad_reduce_scatter.payload_bytes, 4 * dp.params, 1);
  EXPECT_NEAR(dp.param_all_gather.payload_bytes, 2 * dp.params, 1);
  // Without overlap both run once per iteration after the last instruction.
  Workload seq = w;
  seq.parallel.overlap_dp_comm = false;
  const auto gs = build_kernel_graph(seq);
  ASSERT_EQ(gs.stages[0].per_iteration.size(), 3u);
  EXPECT_EQ(gs.stages[0].per_iteration[0].name, "dp_grad_reducescatter");
  EXPECT_EQ(gs.stages[0].per_iteration[1].name, "dp_param_allgather");
}

}  // namespace
}  // namespace kareus
