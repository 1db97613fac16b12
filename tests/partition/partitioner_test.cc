#include <gtest/gtest.h>

#include <set>

#include "kareus/error.h"
#include "kareus/partition.h"
#include "test_util.h"

namespace kareus {
namespace {

std::set<std::string> keys(const PartitionSet& ps) {
  std::set<std::string> k;
  for (const auto& p : ps.partitions) k.insert(p.key);
  return k;
}

TEST(Partitioner, TpWorkloadsHaveExactlyFourKeys) {
  for (const char* name : {"llama3.2-3b_tp8_mbs8_seq4096", "qwen3-1.7b_tp8_mbs16_seq4096",
                           "llama3.3-70b_tp8_mbs4_seq4096"}) {
    const auto ps = partition_workload(load_workload(test::paper_workload(name)));
    EXPECT_EQ(keys(ps), (std::set<std::string>{"fwd_attn", "fwd_mlp", "bwd_attn", "bwd_mlp"}))
        << name;
  }
}

TEST(Partitioner, CpWorkloadsHaveTheArtifactsTwelveKeys) {
  const auto ps =
      partition_workload(load_workload(test::paper_workload("qwen3-1.7b_cp2tp4_mbs8_seq4096")));
  EXPECT_EQ(keys(ps), (std::set<std::string>{"fwd_qkv_ar", "fwd_qkv_ag", "fwd_ao_ag", "fwd_ao_ar",
                                             "fwd_mlp", "bwd_qkv_ar", "bwd_qkv_rs", "bwd_a_rs",
                                             "bwd_a_ag", "bwd_o_ag", "bwd_o_ar", "bwd_mlp"}));
}

TEST(Partitioner, RepeatCountsByHand) {
  // Stage with L layers, 2 blocks per layer and nano-batch: the forward interleaves 4L compute
  // blocks; the first runs alone, so 4L-1 partitions: fwd_attn 2L-1, fwd_mlp 2L.
  // Backward (recompute + backward): 8L blocks, 8L-1 partitions; the stack starts with the last
  // layer's recomputed attention, so recomputed fwd_attn 2L-1, fwd_mlp 2L, bwd_mlp 2L, bwd_attn 2L.
  const auto ps =
      partition_workload(load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096")));
  auto count = [&](const std::string& key, int stage, InstructionKind kind) {
    for (const auto& o : ps.partition(key).occurrences) {
      if (o.stage == stage && o.instruction == kind) return o.count;
    }
    return 0;
  };
  const auto F = InstructionKind::kForward, B = InstructionKind::kBackward;
  EXPECT_EQ(count("fwd_attn", 0, F), 29);
  EXPECT_EQ(count("fwd_mlp", 0, F), 30);
  EXPECT_EQ(count("fwd_attn", 1, F), 25);
  EXPECT_EQ(count("fwd_attn", 0, B), 29);
  EXPECT_EQ(count("fwd_mlp", 0, B), 30);
  EXPECT_EQ(count("bwd_mlp", 0, B), 30);
  EXPECT_EQ(count("bwd_attn", 0, B), 30);
  EXPECT_EQ(ps.partition("fwd_attn").repeats(), 29 + 25 + 29 + 25);
  // Steps of stage 0 forward: embedding, stack head, 59 partitions, stack tail.
  const auto& is = ps.instruction(0, F);
  EXPECT_EQ(is.steps.size(), 1u + 1 + 59 + 1);
  // Last stage forward ends with the output layer; backward starts with its gradient.
  const auto& last_b = ps.instruction(1, B);
  EXPECT_EQ(ps.segments[static_cast<std::size_t>(last_b.steps.front().index)].name,
            "output_layer_bwd");
}

TEST(Partitioner, LaunchSlotsFollowTheArtifact) {
  const auto ps =
      partition_workload(load_workload(test::paper_workload("qwen3-1.7b_tp8_mbs8_seq4096")));
  EXPECT_EQ(ps.partition("fwd_attn").slot_names(),
            (std::vector<std::string>{"norm", "qkv", "rope", "attn"}));
  EXPECT_EQ(ps.partition("fwd_mlp").slot_names(),
            (std::vector<std::string>{"norm", "linear", "activation"}));
  EXPECT_EQ(ps.partition("bwd_attn").slot_names(),
            (std::vector<std::string>{"norm", "linear", "attn", "rope"}));
  EXPECT_EQ(ps.partition("bwd_mlp").slot_names(),
            (std::vector<std::string>{"norm", "linear", "activation"}));
  // The first slot launches the collective at the partition start.
  for (const auto& p : ps.partitions) EXPECT_EQ(p.slots.front().op_index, 0) << p.key;
  // Qwen3's QK-norm sits between the QKV GEMM and RoPE.
  const auto& ops = ps.partition("fwd_attn").compute_ops;
  EXPECT_EQ(ops[3].name, "qk_norm");
  EXPECT_EQ(ps.partition("fwd_attn").slot("rope").op_index, 4);
  EXPECT_THROW(ps.partition("fwd_attn").slot("fc1"), InvalidInput);
  EXPECT_THROW(ps.partition("fwd_ffn"), InvalidInput);
}

TEST(Partitioner, PartitionPairsComputeWithOtherNanoBatchCollective) {
  const auto ps =
      partition_workload(load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096")));
  const auto& p = ps.partition("fwd_mlp");
  EXPECT_EQ(p.collective.collective, CollectiveKind::kAllReduce);
  EXPECT_DOUBLE_EQ(p.collective.payload_bytes, 16384.0 * 3072 * 2);
  // Signatures are stable and distinct.
  EXPECT_EQ(p.signature.size(), 16u);
  EXPECT_NE(p.signature, ps.partition("fwd_attn").signature);
  const auto again =
      partition_workload(load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096")));
  EXPECT_EQ(again.partition("fwd_mlp").signature, p.signature);
  // A different shape gives a different signature.
  const auto other =
      partition_workload(load_workload(test::paper_workload("llama3.2-3b_tp8_mbs16_seq4096")));
  EXPECT_NE(other.partition("fwd_mlp").signature, p.signature);
}

TEST(Partitioner, WithoutNanoBatchesEverythingIsASegment) {
  auto w = load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096"));
  w.batch.nano_batches = 1;
  const auto ps = partition_workload(w);
  EXPECT_TRUE(ps.partitions.empty());
  int stacks = 0;
  for (const auto& s : ps.segments) stacks += s.name == "layer_stack";
  EXPECT_EQ(stacks, 4);
}

}  // namespace
}  // namespace kareus
