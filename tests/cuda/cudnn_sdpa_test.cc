// The cuDNN SDPA graph descriptions (src/cuda/cudnn_sdpa.h), checked against dims and strides
// computed by hand for Llama 3.2 3B at TP=8 (per GPU: 4 sequences x 1 KV head, 3 query heads
// each, 4096 tokens, head dim 128) and a context-parallel GQA case (2048 local queries over 4096
// keys, 8 groups of 3 query heads), plus the graph's well-formedness and the fallback switch.
#include "cuda/cudnn_sdpa.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "cuda/op_plan.h"
#include "kareus/error.h"
#include "kareus/partition.h"
#include "kareus/workload.h"
#include "test_util.h"

namespace kareus::cuda::sdpa {
namespace {

using Dims = std::vector<std::int64_t>;

const AttentionShape kLlamaTp8{4, 3, 4096, 4096, 128};
const AttentionShape kCpGqa{8, 3, 2048, 4096, 128};

const Tensor* by_name(const Graph& g, const std::string& name) {
  for (const auto& t : g.tensors)
    if (t.name == name) return &t;
  return nullptr;
}

std::vector<std::string> op_names(const Graph& g) {
  std::vector<std::string> n;
  for (const auto& op : g.ops) n.push_back(op.name);
  return n;
}

// Every op port names a tensor; each virtual tensor is written by exactly one op and read by at
// least one; non-virtual tensors are written at most once; uids are unique.
void expect_well_formed(const Graph& g) {
  std::set<std::int64_t> uids;
  for (const auto& t : g.tensors) {
    EXPECT_TRUE(uids.insert(t.uid).second) << "duplicate uid " << t.uid;
    EXPECT_EQ(t.dims.size(), 4u) << t.name;
    EXPECT_EQ(t.strides.size(), 4u) << t.name;
    EXPECT_FALSE(t.is_virtual && t.by_value) << t.name;
  }
  std::map<std::int64_t, int> writes, reads;
  for (const auto& op : g.ops) {
    for (std::int64_t u : {op.x, op.b, op.t}) {
      if (u == 0) continue;
      EXPECT_TRUE(uids.count(u)) << op.name << " reads unknown uid " << u;
      ++reads[u];
    }
    ASSERT_NE(op.y, 0) << op.name;
    ++writes[op.y];
    EXPECT_FALSE(g.tensor(op.y).by_value) << op.name << " writes a scalar";
  }
  for (const auto& t : g.tensors) {
    if (t.is_virtual) {
      EXPECT_EQ(writes[t.uid], 1) << t.name;
      EXPECT_GE(reads[t.uid], 1) << t.name << " is never read";
    } else {
      EXPECT_LE(writes[t.uid], 1) << t.name;
    }
  }
}

TEST(CudnnSdpaGraph, ForwardLlamaTp8DimsStridesAndOps) {
  const Graph g = forward_graph(kLlamaTp8);
  expect_well_formed(g);
  EXPECT_FALSE(g.bottom_right);
  // Q, O: [4][3][4096][128] dense; K^T is K [4][1][4096][128] with the last two axes swapped.
  const Tensor& q = g.tensor(uid::kQ);
  EXPECT_EQ(q.dims, (Dims{4, 3, 4096, 128}));
  EXPECT_EQ(q.strides, (Dims{3 * 4096 * 128, 4096 * 128, 128, 1}));
  EXPECT_EQ(q.type, DataType::kBf16);
  EXPECT_FALSE(q.is_virtual);
  EXPECT_EQ(g.tensor(uid::kO).strides, q.strides);
  const Tensor& kt = g.tensor(uid::kK);
  EXPECT_EQ(kt.dims, (Dims{4, 1, 128, 4096}));
  EXPECT_EQ(kt.strides, (Dims{524288, 524288, 1, 128}));
  const Tensor& v = g.tensor(uid::kV);
  EXPECT_EQ(v.dims, (Dims{4, 1, 4096, 128}));
  EXPECT_EQ(v.strides, (Dims{524288, 524288, 128, 1}));
  const Tensor& stats = g.tensor(uid::kStats);
  EXPECT_EQ(stats.dims, (Dims{4, 3, 4096, 1}));
  EXPECT_EQ(stats.strides, (Dims{12288, 4096, 1, 1}));
  EXPECT_EQ(stats.type, DataType::kFloat);
  // Only the five I/O tensors are buffers; everything else is virtual or a scalar.
  EXPECT_EQ(g.buffer_uids(), (Dims{uid::kQ, uid::kK, uid::kV, uid::kO, uid::kStats}));
  EXPECT_EQ(g.dq_accum_bytes(), 0u);

  EXPECT_EQ(op_names(g),
            (std::vector<std::string>{"bmm1", "attn_scale", "gen_row_index", "gen_col_index",
                                      "row>=col", "binary_select", "Max", "sub", "exp", "sum",
                                      "log", "add", "div", "bmm2"}));
  const Op& bmm1 = g.ops[0];
  EXPECT_EQ(bmm1.kind, OpKind::kMatmul);
  EXPECT_EQ(bmm1.x, uid::kQ);
  EXPECT_EQ(bmm1.b, uid::kK);
  const Tensor& s = g.tensor(bmm1.y);
  EXPECT_TRUE(s.is_virtual);
  EXPECT_EQ(s.type, DataType::kFloat);
  EXPECT_EQ(s.dims, (Dims{4, 3, 4096, 4096}));
  EXPECT_EQ(s.strides, (Dims{3LL * 4096 * 4096, 4096LL * 4096, 4096, 1}));
  // The scale is a by-value float of 1/sqrt(128), expanded to rank 4.
  const Tensor& scale = g.tensor(g.ops[1].b);
  EXPECT_TRUE(scale.by_value);
  EXPECT_EQ(scale.dims, (Dims{1, 1, 1, 1}));
  // 1/sqrt(128) = 0.0883883476..., passed as a float.
  EXPECT_EQ(scale.value, static_cast<double>(static_cast<float>(0.08838834764831845)));
  EXPECT_FLOAT_EQ(g.scale, 0.088388346f);
  // Causal mask: row/col indices (int32), row >= col (bool), select -inf where false.
  EXPECT_EQ(g.ops[2].pointwise, PointwiseMode::kGenIndex);
  EXPECT_EQ(g.ops[2].axis, 2);
  EXPECT_EQ(g.ops[3].axis, 3);
  EXPECT_EQ(g.tensor(g.ops[2].y).type, DataType::kInt32);
  EXPECT_EQ(g.ops[4].pointwise, PointwiseMode::kCmpGe);
  EXPECT_EQ(g.ops[4].x, g.ops[2].y);
  EXPECT_EQ(g.ops[4].b, g.ops[3].y);
  EXPECT_EQ(g.ops[4].compute, DataType::kBool);
  const Op& select = g.ops[5];
  EXPECT_EQ(select.pointwise, PointwiseMode::kBinarySelect);
  EXPECT_EQ(select.x, g.ops[1].y);
  EXPECT_EQ(select.t, g.ops[4].y);
  EXPECT_TRUE(std::isinf(g.tensor(select.b).value) && g.tensor(select.b).value < 0);
  // Softmax: Stats = max + log(sum), P = exp / sum in bf16 for the second matmul.
  const Tensor& mx = g.tensor(g.ops[6].y);
  EXPECT_EQ(mx.dims, (Dims{4, 3, 4096, 1}));
  EXPECT_EQ(g.ops[6].reduction, ReductionMode::kMax);
  EXPECT_EQ(g.ops[9].reduction, ReductionMode::kAdd);
  EXPECT_EQ(g.ops[11].y, uid::kStats);
  EXPECT_EQ(g.ops[11].x, g.ops[6].y);
  EXPECT_EQ(g.ops[11].b, g.ops[10].y);
  const Tensor& p = g.tensor(g.ops[12].y);
  EXPECT_EQ(p.type, DataType::kBf16);
  EXPECT_TRUE(p.is_virtual);
  EXPECT_EQ(g.ops[13].x, p.uid);
  EXPECT_EQ(g.ops[13].b, uid::kV);
  EXPECT_EQ(g.ops[13].y, uid::kO);
}

TEST(CudnnSdpaGraph, BackwardLlamaTp8GqaReductionsAndAccumulator) {
  const Graph g = backward_graph(kLlamaTp8);
  expect_well_formed(g);
  EXPECT_EQ(g.buffer_uids(), (Dims{uid::kQ, uid::kK, uid::kV, uid::kO, uid::kStats, uid::kDO,
                                   uid::kDQ, uid::kDK, uid::kDV, uid::kSoftmaxSum, uid::kDQAccum}));
  EXPECT_EQ(op_names(g), (std::vector<std::string>{"mul_dO_O",
                                                   "reduce_dO_o",
                                                   "scale_dropout_inv",
                                                   "matmul_Q_KT",
                                                   "mul_s_attn_scale",
                                                   "sub_s_m",
                                                   "bprop_gen_row_index",
                                                   "bprop_gen_col_index",
                                                   "bprop_row>=col",
                                                   "bprop_binary_select",
                                                   "exp_s",
                                                   "reshape_p",
                                                   "matmul_pT_dO",
                                                   "red_dV_head",
                                                   "matmul_dO_VT",
                                                   "sub_dP_softmax_sum",
                                                   "mul_dP_exp_s",
                                                   "mul_dS_attn_scale",
                                                   "reshape_dS",
                                                   "matmul_dST_Q",
                                                   "red_dK_head",
                                                   "reshape_k",
                                                   "matmul_dS_K",
                                                   "identity_dQ"}));
  // V enters the backward transposed like K.
  EXPECT_EQ(g.tensor(uid::kV).dims, (Dims{4, 1, 128, 4096}));
  EXPECT_EQ(g.tensor(uid::kV).strides, (Dims{524288, 524288, 1, 128}));
  EXPECT_EQ(g.tensor(uid::kDK).dims, (Dims{4, 1, 4096, 128}));
  EXPECT_EQ(g.tensor(uid::kDK).strides, (Dims{524288, 524288, 128, 1}));
  // dO * O as cudnn-frontend hands it over: sequence stride h * d.
  const Tensor* dot = by_name(g, "mul_dO_O");
  ASSERT_NE(dot, nullptr);
  EXPECT_EQ(dot->strides, (Dims{1572864, 524288, 384, 1}));
  const Tensor& sum = g.tensor(uid::kSoftmaxSum);
  EXPECT_EQ(sum.dims, (Dims{4, 3, 4096, 1}));
  EXPECT_EQ(sum.type, DataType::kFloat);
  EXPECT_FALSE(sum.is_virtual);
  // GQA: dV and dK are computed per query head, then summed over the 3 heads of a KV head.
  const Tensor* dv_full = by_name(g, "dV_fullhead");
  ASSERT_NE(dv_full, nullptr);
  EXPECT_EQ(dv_full->dims, (Dims{4, 3, 4096, 128}));
  EXPECT_EQ(dv_full->strides, (Dims{1572864, 524288, 128, 1}));
  EXPECT_EQ(dv_full->type, DataType::kBf16);
  EXPECT_EQ(g.ops[13].x, dv_full->uid);
  EXPECT_EQ(g.ops[13].y, uid::kDV);
  EXPECT_EQ(g.ops[20].y, uid::kDK);
  // P^T and dS^T are [b,h,skv,sq] views of the score memory, bf16.
  const Tensor* pt = by_name(g, "reshape_p");
  ASSERT_NE(pt, nullptr);
  EXPECT_EQ(pt->dims, (Dims{4, 3, 4096, 4096}));
  EXPECT_EQ(pt->strides, (Dims{3LL * 4096 * 4096, 4096LL * 4096, 1, 4096}));
  EXPECT_EQ(pt->type, DataType::kBf16);
  // dQ is accumulated in float (4 x 3 x 4096 x 128 x 4 bytes) then converted.
  EXPECT_EQ(g.dq_accum_bytes(), 4u * 3 * 4096 * 128 * 4);
  EXPECT_EQ(g.ops[22].y, uid::kDQAccum);
  EXPECT_EQ(g.ops[23].x, uid::kDQAccum);
  EXPECT_EQ(g.ops[23].y, uid::kDQ);
  // The softmax sum is rowsum(dO * O) times a by-value 1.
  EXPECT_EQ(g.ops[2].y, uid::kSoftmaxSum);
  EXPECT_EQ(g.tensor(g.ops[2].b).value, 1.0);
}

TEST(CudnnSdpaGraph, ContextParallelGqaUsesBottomRightDiagonal) {
  const Graph g = forward_graph(kCpGqa);
  expect_well_formed(g);
  EXPECT_TRUE(g.bottom_right);
  EXPECT_EQ(g.tensor(uid::kQ).dims, (Dims{8, 3, 2048, 128}));
  EXPECT_EQ(g.tensor(uid::kQ).strides, (Dims{786432, 262144, 128, 1}));
  EXPECT_EQ(g.tensor(uid::kK).dims, (Dims{8, 1, 128, 4096}));
  EXPECT_EQ(g.tensor(uid::kK).strides, (Dims{524288, 524288, 1, 128}));
  EXPECT_EQ(g.tensor(uid::kStats).strides, (Dims{6144, 2048, 1, 1}));
  const Tensor& s = g.tensor(g.ops[0].y);
  EXPECT_EQ(s.dims, (Dims{8, 3, 2048, 4096}));
  EXPECT_EQ(s.strides, (Dims{3LL * 2048 * 4096, 2048LL * 4096, 4096, 1}));
  // Query i sees keys j <= i + (4096 - 2048): row + s_kv - s_q >= col, in int32.
  ASSERT_EQ(g.ops[4].name, "row+skv");
  EXPECT_EQ(g.ops[4].pointwise, PointwiseMode::kAdd);
  EXPECT_EQ(g.ops[4].compute, DataType::kInt32);
  EXPECT_EQ(g.tensor(g.ops[4].b).value, 4096);
  EXPECT_EQ(g.tensor(g.ops[4].b).type, DataType::kInt32);
  ASSERT_EQ(g.ops[5].name, "row+skv-sq");
  EXPECT_EQ(g.ops[5].pointwise, PointwiseMode::kSub);
  EXPECT_EQ(g.tensor(g.ops[5].b).value, 2048);
  EXPECT_EQ(g.ops[6].pointwise, PointwiseMode::kCmpGe);
  EXPECT_EQ(g.ops[6].x, g.ops[5].y);
  EXPECT_EQ(g.ops.size(), 16u);
  const Graph b = backward_graph(kCpGqa);
  expect_well_formed(b);
  EXPECT_EQ(b.dq_accum_bytes(), 8u * 3 * 2048 * 128 * 4);
}

TEST(CudnnSdpaGraph, MhaWritesDkDvWithoutHeadReduction) {
  const Graph g = backward_graph({2, 1, 256, 256, 64});
  expect_well_formed(g);
  int reductions = 0;
  for (const auto& op : g.ops) {
    if (op.kind == OpKind::kReduction) ++reductions;
    if (op.name == "matmul_pT_dO") {
      EXPECT_EQ(op.y, uid::kDV);
    }
    if (op.name == "matmul_dST_Q") {
      EXPECT_EQ(op.y, uid::kDK);
    }
  }
  EXPECT_EQ(reductions, 1);  // only rowsum(dO * O)
  EXPECT_EQ(g.ops.size(), 22u);
  EXPECT_EQ(by_name(g, "dV_fullhead"), nullptr);
}

// The graph's buffers are exactly the executor's (op_plan.cc): same byte sizes, same order.
TEST(CudnnSdpaGraph, BuffersMatchTheExecutorsAttentionBuffers) {
  const PartitionSet ps =
      partition_workload(load_workload(test::paper_workload("llama3.2-3b_tp8_mbs8_seq4096")));
  for (const char* part : {"fwd_attn", "bwd_attn"}) {
    const ExecutionPlan plan = plan_partition(ps.partition(part), "attn");
    for (const auto& op : plan.ops) {
      if (op.type == OpType::kAttentionForward) {
        const Graph g = forward_graph(op.attn);
        ASSERT_EQ(op.input_bytes.size(), 3u);
        EXPECT_EQ(span_bytes(g.tensor(uid::kQ)), op.input_bytes[0]);
        EXPECT_EQ(span_bytes(g.tensor(uid::kK)), op.input_bytes[1]);
        EXPECT_EQ(span_bytes(g.tensor(uid::kV)), op.input_bytes[2]);
        EXPECT_EQ(span_bytes(g.tensor(uid::kO)), op.output_bytes[0]);
        EXPECT_EQ(span_bytes(g.tensor(uid::kStats)), op.output_bytes[1]);
      } else if (op.type == OpType::kAttentionBackward) {
        const Graph g = backward_graph(op.attn);
        const std::int64_t in[] = {uid::kQ, uid::kK, uid::kV, uid::kO, uid::kDO, uid::kStats};
        for (std::size_t i = 0; i < 6; ++i) {
          EXPECT_EQ(span_bytes(g.tensor(in[i])), op.input_bytes[i]) << i;
        }
        const std::int64_t out[] = {uid::kDQ, uid::kDK, uid::kDV, uid::kSoftmaxSum};
        for (std::size_t i = 0; i < 4; ++i) {
          EXPECT_EQ(span_bytes(g.tensor(out[i])), op.output_bytes[i]) << i;
        }
      }
    }
  }
}

TEST(CudnnSdpaGraph, UnsupportedShapesAreNamed) {
  EXPECT_EQ(unsupported_reason(kLlamaTp8), "");
  EXPECT_NE(unsupported_reason({1, 1, 128, 128, 100}).find("head dim 100"), std::string::npos);
  EXPECT_NE(unsupported_reason({1, 1, 128, 128, 512}).find("head dim 512"), std::string::npos);
  EXPECT_NE(unsupported_reason({1, 1, 256, 128, 128}).find("q_len 256 exceeds kv_len 128"),
            std::string::npos);
  EXPECT_THROW(forward_graph({1, 1, 128, 128, 100}), InvalidInput);
  EXPECT_THROW(backward_graph({0, 1, 128, 128, 128}), InvalidInput);
}

TEST(CudnnSdpaPath, FirstFailureSwitchesToFallbackAndWarnsOnce) {
  AttentionPath path;
  std::vector<std::string> warnings;
  path.set_sink([&](const std::string& w) { warnings.push_back(w); });
  EXPECT_TRUE(path.fused());
  EXPECT_EQ(path.backend(), "cudnn-fused");
  EXPECT_EQ(path.fingerprint_field(), "attention=cudnn-fused");
  path.fail(
      {"execution plan finalize (3 engine configs tried)", 3000, "CUDNN_STATUS_NOT_SUPPORTED"},
      kLlamaTp8, Direction::kBackward);
  EXPECT_FALSE(path.fused());
  EXPECT_EQ(path.backend(), "fallback kernel");
  EXPECT_EQ(path.fingerprint_field(), "attention=fallback");
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("failed at step 'execution plan finalize (3 engine configs tried)'"),
            std::string::npos)
      << warnings[0];
  EXPECT_NE(warnings[0].find("CUDNN_STATUS_NOT_SUPPORTED (cuDNN status 3000)"), std::string::npos);
  EXPECT_NE(warnings[0].find("backward, groups 4 x 3 query heads, q_len 4096"), std::string::npos);
  path.fail({"execute", 5000, "CUDNN_STATUS_EXECUTION_FAILED"}, kLlamaTp8, Direction::kForward);
  EXPECT_EQ(warnings.size(), 1u);  // one warning per process
  EXPECT_EQ(path.failures(), 2);
  path.reset();
  EXPECT_TRUE(path.fused());
}

}  // namespace
}  // namespace kareus::cuda::sdpa
