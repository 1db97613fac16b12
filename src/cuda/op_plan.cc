// Partition -> executable op list for the cuda backend (see op_plan.h). The mapping is by kernel
// kind and name as the kernel graph (src/workload/kernel_graph.cc) emits them; sizes are derived
// from the kernel's shape and byte counts only, so a new model family that reuses the kernel
// names gets correct buffers without touching this file. Unknown names fall back to a
// memory-bound stream of the kernel's exact traffic (labelled kStream).
#include "op_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <iterator>

#include "kareus/error.h"
#include "kareus/instruction_settings.h"

namespace kareus::cuda {
namespace {

constexpr std::size_t kBf16 = 2;
constexpr std::size_t kFp32 = 4;
constexpr std::int64_t kDefaultHeadDim = 128;

std::size_t to_size(double bytes) {
  return bytes <= 0 ? 0 : static_cast<std::size_t>(std::llround(bytes));
}

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

// The kernel name without a mixture-of-experts prefix: the routed experts' ("expert_fc1") and
// the shared experts' ("shared_fc1") layers have the dense MLP's shapes and roles.
std::string base_name(const std::string& name) {
  for (const char* p : {"expert_", "shared_"}) {
    if (starts_with(name, p)) return name.substr(std::char_traits<char>::length(p));
  }
  return name;
}

std::int64_t head_dim_of(const std::vector<Kernel>& kernels) {
  for (const auto& k : kernels)
    if (k.kind == OpKind::kAttention && k.k > 0) return k.k;
  return kDefaultHeadDim;
}

// Largest power of two <= 8192 dividing `elements`: a row length for a norm whose layer has no
// GEMM to name the hidden size (the cost of a memory-bound norm barely depends on it).
std::int64_t fallback_cols(std::int64_t elements) {
  std::int64_t c = 8192;
  while (c > 1 && elements % c != 0) c /= 2;
  return c;
}

}  // namespace

const char* to_string(OpType t) {
  switch (t) {
    case OpType::kGemm:
      return "gemm";
    case OpType::kAttentionForward:
      return "attention_fwd";
    case OpType::kAttentionBackward:
      return "attention_bwd";
    case OpType::kRmsNorm:
      return "rmsnorm";
    case OpType::kRmsNormBackward:
      return "rmsnorm_bwd";
    case OpType::kRope:
      return "rope";
    case OpType::kSwiglu:
      return "swiglu";
    case OpType::kSwigluBackward:
      return "swiglu_bwd";
    case OpType::kAdd:
      return "add";
    case OpType::kStream:
      return "stream";
    case OpType::kCollective:
      return "collective";
  }
  return "?";
}

std::size_t OpStep::bytes() const {
  std::size_t b = 0;
  for (auto x : input_bytes) b += x;
  for (auto x : output_bytes) b += x;
  return b;
}

std::size_t ExecutionPlan::buffer_bytes() const {
  std::size_t b = 0;
  for (const auto& op : ops) b += op.bytes();
  if (overlap) b += overlap->send_bytes + overlap->recv_bytes;
  return b;
}

int ExecutionPlan::group_size() const {
  int g = overlap ? overlap->group_size : 1;
  for (const auto& op : ops)
    if (op.type == OpType::kCollective) g = std::max(g, op.collective.group_size);
  return std::max(g, 1);
}

void check_sms(int sms) {
  if (sms < 1) {
    throw InvalidInput(fmt::format("SMs of the collective must be >= 1 (got {})", sms));
  }
}

void check_plan_sms(const ExecutionPlan& plan, int sms) {
  if (sms != kCopyEngineSms) return check_sms(sms);
  if (plan.overlap && plan.overlap->copy_engine) return;
  throw InvalidInput(fmt::format(
      "SMs of the collective: {} (the copy engines) needs a copy-engine capable collective (an "
      "all-to-all inside one node, NCCL >= 2.28); {} is not: use 1 or more",
      kCopyEngineSms, plan.overlap ? "'" + plan.overlap->name + "'" : "a segment"));
}

std::int64_t infer_hidden(const std::vector<Kernel>& kernels) {
  for (const auto& k : kernels) {
    if (k.kind != OpKind::kGemm) continue;
    const std::string n = base_name(k.name);
    if (n == "router_gemm") return k.k;
    if (n == "router_gemm_dgrad") return k.n;
    if (n == "router_gemm_wgrad") return k.m;
    if (n == "qkv_gemm" || n == "fc1" || n == "logits_gemm" || n == "fc2_dgrad" ||
        n == "out_proj_dgrad")
      return k.k;
    if (n == "out_proj" || n == "fc2" || n == "qkv_gemm_dgrad" || n == "fc1_dgrad" ||
        n == "logits_gemm_dgrad" || n == "out_proj_wgrad" || n == "fc2_wgrad")
      return k.n;
    // wgrad(W[k,n]) is the GEMM dW[k,n] = x^T[k,tokens] dy[tokens,n]: m is W's input dim.
    if (n == "qkv_gemm_wgrad" || n == "fc1_wgrad" || n == "logits_gemm_wgrad") return k.m;
  }
  return 0;
}

AttentionShape attention_shape(const Kernel& k) {
  if (k.kind != OpKind::kAttention || k.m <= 0 || k.n <= 0 || k.k <= 0) {
    throw InternalError(fmt::format("kernel '{}' is not an attention kernel with a shape", k.name));
  }
  const bool backward = ends_with(k.name, "_bwd");
  const double qo = static_cast<double>(k.m) * static_cast<double>(k.k) * kBf16;
  // Forward reads Q and K,V; backward reads Q, O, dO and K,V (kernel_graph.cc, attention()).
  const double kv = k.bytes_read - (backward ? 3.0 : 1.0) * qo;
  AttentionShape a;
  a.head_dim = k.k;
  a.kv_len = k.n;
  a.groups = std::max<std::int64_t>(
      1, std::llround(kv / (2.0 * kBf16 * static_cast<double>(k.n) * static_cast<double>(k.k))));
  const std::int64_t rows_per_group = std::max<std::int64_t>(1, k.m / a.groups);
  a.q_len = rows_per_group;
  a.q_heads_per_group = 1;
  for (std::int64_t cp = 1; cp <= 64; cp *= 2) {
    if (k.n % cp != 0) break;
    const std::int64_t q_len = k.n / cp;
    if (rows_per_group % q_len == 0) {
      a.q_len = q_len;
      a.q_heads_per_group = rows_per_group / q_len;
      break;
    }
  }
  return a;
}

CollectiveStep collective_step(const Kernel& k) {
  if (!k.is_collective()) {
    throw InternalError(fmt::format("kernel '{}' is not a collective", k.name));
  }
  CollectiveStep c;
  c.name = k.name;
  c.kind = k.collective;
  c.group_size = std::max(1, k.group_size);
  const std::size_t elems = to_size(k.payload_bytes) / kBf16;
  const std::size_t n = static_cast<std::size_t>(c.group_size);
  // AllGather/ReduceScatter split the payload into n equal shards: round to a multiple of n.
  const std::size_t shard = elems / n;
  c.payload_bytes = elems * kBf16;
  c.copy_engine = k.copy_engine;
  switch (k.collective) {
    case CollectiveKind::kAllReduce:
      c.send_bytes = c.recv_bytes = elems * kBf16;
      c.nccl_count = elems;
      break;
    case CollectiveKind::kAllGather:
      c.payload_bytes = shard * n * kBf16;
      c.send_bytes = shard * kBf16;
      c.recv_bytes = shard * n * kBf16;
      c.nccl_count = shard;
      break;
    case CollectiveKind::kReduceScatter:
      c.payload_bytes = shard * n * kBf16;
      c.send_bytes = shard * n * kBf16;
      c.recv_bytes = shard * kBf16;
      c.nccl_count = shard;
      break;
    case CollectiveKind::kP2P:
      c.send_bytes = c.recv_bytes = elems * kBf16;
      c.nccl_count = elems;
      break;
    case CollectiveKind::kAllToAll:
      // Equal splits: `shard` elements to every rank (ncclAlltoAll's count); the shard for this
      // rank itself stays on the GPU.
      c.payload_bytes = shard * n * kBf16;
      c.send_bytes = c.recv_bytes = shard * n * kBf16;
      c.nccl_count = shard;
      c.proxy_bytes = shard * (n - 1) * kBf16;
      return c;
  }
  c.proxy_bytes = c.payload_bytes;
  return c;
}

namespace {

void plan_gemm(const Kernel& k, OpStep& op) {
  op.type = OpType::kGemm;
  // The kernel graph (src/workload/kernel_graph.cc) names the backward pair of y = x W
  // (W stored [k,n]) "<name>_dgrad", dx = dy W^T, and "<name>_wgrad", dW = x^T dy.
  // A grouped GEMM (groups > 1: the local experts) is one strided batched matmul: all groups
  // share the shape m x n x k, each reads and writes its own matrices.
  op.gemm = {k.m,
             k.n,
             k.k,
             ends_with(k.name, "_wgrad"),
             ends_with(k.name, "_dgrad"),
             std::max(1, k.groups)};
  const auto m = static_cast<std::size_t>(k.m), n = static_cast<std::size_t>(k.n),
             kk = static_cast<std::size_t>(k.k), g = static_cast<std::size_t>(op.gemm.batch);
  op.input_bytes = {g * m * kk * kBf16, g * kk * n * kBf16};
  op.output_bytes = {g * m * n * kBf16};
}

void plan_attention(const Kernel& k, bool bwd, OpStep& op) {
  op.attn = attention_shape(k);
  const auto q = static_cast<std::size_t>(op.attn.q_rows() * op.attn.head_dim) * kBf16;
  const auto kv =
      static_cast<std::size_t>(op.attn.groups * op.attn.kv_len * op.attn.head_dim) * kBf16;
  const auto stats = static_cast<std::size_t>(op.attn.q_rows()) * kFp32;
  if (bwd) {
    op.type = OpType::kAttentionBackward;
    // Q, K, V, O, dO, LSE  ->  dQ, dK, dV, and the row sums D = rowsum(dO * O).
    op.input_bytes = {q, kv, kv, q, q, stats};
    op.output_bytes = {q, kv, kv, stats};
  } else {
    op.type = OpType::kAttentionForward;
    op.input_bytes = {q, kv, kv};
    op.output_bytes = {q, stats};
  }
}

void plan_norm(const Kernel& k, bool bwd, std::int64_t hidden, std::int64_t head_dim, OpStep& op) {
  const bool qk = starts_with(k.name, "qk_norm");
  op.type = bwd ? OpType::kRmsNormBackward : OpType::kRmsNorm;
  op.elements = static_cast<std::int64_t>(to_size(k.bytes_written) / kBf16);
  op.cols = qk ? head_dim
               : (hidden > 0 && op.elements % hidden == 0 ? hidden : fallback_cols(op.elements));
  op.rows = op.elements / op.cols;
  const auto x = static_cast<std::size_t>(op.elements) * kBf16;
  const auto w = static_cast<std::size_t>(op.cols) * kBf16;
  op.input_bytes = bwd ? std::vector<std::size_t>{x, x, w} : std::vector<std::size_t>{x, w};
  op.output_bytes = {x};
}

// Elementwise ops the executor has a kernel for; false for the rest (run as plain streams).
bool plan_elementwise(const Kernel& k, std::int64_t head_dim, OpStep& op) {
  const auto written = to_size(k.bytes_written);
  const std::string name = base_name(k.name);
  if (starts_with(k.name, "rope")) {
    op.type = OpType::kRope;
    op.elements = static_cast<std::int64_t>(written / kBf16);
    op.cols = head_dim;
    op.rows = op.elements / std::max<std::int64_t>(1, head_dim);
    op.input_bytes = {written};
    op.output_bytes = {written};
    return true;
  }
  if (name == "swiglu") {
    op.type = OpType::kSwiglu;
    op.elements = static_cast<std::int64_t>(written / kBf16);
    op.input_bytes = {written, written};  // gate, up
    op.output_bytes = {written};
    return true;
  }
  if (name == "swiglu_bwd") {
    op.type = OpType::kSwigluBackward;
    op.elements = static_cast<std::int64_t>(written / (2 * kBf16));
    const auto e = static_cast<std::size_t>(op.elements) * kBf16;
    op.input_bytes = {e, e, e};  // gate, up, dy
    op.output_bytes = {e, e};    // dgate, dup
    return true;
  }
  if (k.name.find("residual") != std::string::npos) {
    op.type = OpType::kAdd;
    op.elements = static_cast<std::int64_t>(written / kBf16);
    op.input_bytes = {written, written};
    op.output_bytes = {written};
    return true;
  }
  return false;
}

}  // namespace

OpStep plan_op(const Kernel& k, std::int64_t hidden, std::int64_t head_dim) {
  OpStep op;
  op.name = k.name;
  const bool bwd = ends_with(k.name, "_bwd");
  switch (k.kind) {
    case OpKind::kGemm:
      plan_gemm(k, op);
      return op;
    case OpKind::kAttention:
      plan_attention(k, bwd, op);
      return op;
    case OpKind::kNorm:
      plan_norm(k, bwd, hidden, head_dim, op);
      return op;
    case OpKind::kElementwise:
      if (plan_elementwise(k, head_dim, op)) return op;
      break;
    case OpKind::kCollective:
      op.type = OpType::kCollective;
      op.collective = collective_step(k);
      op.input_bytes = {op.collective.send_bytes};
      op.output_bytes = {op.collective.recv_bytes};
      return op;
    case OpKind::kEmbedding:
    case OpKind::kLoss:
      break;
  }
  op.type = OpType::kStream;
  op.input_bytes = {to_size(k.bytes_read)};
  op.output_bytes = {to_size(k.bytes_written)};
  return op;
}

ExecutionPlan plan_kernels(const std::vector<Kernel>& kernels) {
  ExecutionPlan plan;
  const std::int64_t hidden = infer_hidden(kernels);
  const std::int64_t head_dim = head_dim_of(kernels);
  for (const auto& k : kernels) plan.ops.push_back(plan_op(k, hidden, head_dim));
  return plan;
}

ExecutionPlan plan_partition(const Partition& p, const std::string& slot) {
  const Slot& s = p.slot(slot);  // throws InvalidInput listing the slots
  if (s.op_index < 0 || s.op_index > static_cast<int>(p.compute_ops.size())) {
    throw InternalError(fmt::format("partition {}: slot {} at op {} of {}", p.key, s.name,
                                    s.op_index, p.compute_ops.size()));
  }
  for (const auto& k : p.compute_ops) {
    if (k.is_collective()) {
      throw InternalError(
          fmt::format("partition {}: compute op {} is a collective", p.key, k.name));
    }
  }
  if (!p.comm_tail.empty()) {
    // Sequence parallelism's RS -> norm -> AG chain needs the norm and the second collective
    // enqueued on the communication stream after the first; the executor runs one collective.
    throw NotSupported(fmt::format(
        "partition {}: its communication chain ({}: a collective, the norm on the sequence "
        "shard, then another collective) is not run by the cuda backend yet; profile "
        "sequence-parallel jobs with --backend emulator, or measure them in your framework and "
        "replay them with --backend trace",
        p.key, p.chain_name()));
  }
  ExecutionPlan plan = plan_kernels(p.compute_ops);
  plan.overlap = collective_step(p.collective);
  plan.slot_index = s.op_index;
  plan.slot = s.name;
  return plan;
}

std::string kernel_shape_key(const OpStep& op) {
  if (op.type == OpType::kGemm) {
    const GemmShape& g = op.gemm;
    return fmt::format("gemm m{} n{} k{} {}{} x{}", g.m, g.n, g.k, g.transa ? 'T' : 'N',
                       g.transb ? 'T' : 'N', g.batch);
  }
  if (op.type != OpType::kAttentionForward && op.type != OpType::kAttentionBackward) {
    throw InternalError(fmt::format("kernel_shape_key: {} is not a GEMM or attention", op.name));
  }
  const AttentionShape& a = op.attn;
  return fmt::format("{} g{} h{} q{} kv{} d{}",
                     op.type == OpType::kAttentionForward ? "attn_fwd" : "attn_bwd", a.groups,
                     a.q_heads_per_group, a.q_len, a.kv_len, a.head_dim);
}

void KernelShapeSet::add_kernels(const std::string& use_prefix,
                                 const std::vector<Kernel>& kernels) {
  const ExecutionPlan plan = plan_kernels(kernels);
  for (std::size_t i = 0; i < plan.ops.size(); ++i) {
    const OpStep& op = plan.ops[i];
    if (op.type != OpType::kGemm && op.type != OpType::kAttentionForward &&
        op.type != OpType::kAttentionBackward) {
      continue;
    }
    const std::string key = kernel_shape_key(op);
    auto [it, fresh] = index_.emplace(key, shapes_.size());
    if (fresh) shapes_.push_back({key, op, kernels[i], {}});
    shapes_[it->second].uses.push_back(use_prefix + op.name);
  }
}

void KernelShapeSet::add(const std::string& workload, const PartitionSet& ps) {
  for (const Partition& p : ps.partitions) add_kernels(workload + "/" + p.key + "/", p.compute_ops);
  for (const Segment& s : ps.segments) add_kernels(workload + "/" + s.name + "/", s.kernels);
}

ExecutionPlan plan_segment(const Segment& s) {
  if (s.kernels.empty()) throw InvalidInput(fmt::format("segment {} has no kernels", s.name));
  return plan_kernels(s.kernels);
}

}  // namespace kareus::cuda

namespace kareus::cuda {

std::string catalogue_gpu_for_device(const std::string& device_name) {
  std::string n = device_name;
  for (auto& ch : n) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
  if (has("PCIE") || has(" NVL")) return "";
  if (has("H200")) return "h200";
  if (has("H100")) return "h100-sxm";
  if (has("A100")) return has("80GB") ? "a100-sxm4-80gb" : "a100-sxm4-40gb";
  if (has("A40")) return "a40";
  return "";
}

int snap_to_clock_grid(const GpuSpec& g, int mhz) {
  const auto clocks = g.supported_freqs_mhz();
  if (clocks.empty()) return mhz;
  return *std::min_element(clocks.begin(), clocks.end(),
                           [mhz](int a, int b) { return std::abs(a - mhz) < std::abs(b - mhz); });
}

int clock_grid_steps(const GpuSpec& g, int a_mhz, int b_mhz) {
  const auto clocks = g.supported_freqs_mhz();
  if (clocks.empty()) return a_mhz == b_mhz ? 0 : 1;
  const auto a = std::find(clocks.begin(), clocks.end(), snap_to_clock_grid(g, a_mhz));
  const auto b = std::find(clocks.begin(), clocks.end(), snap_to_clock_grid(g, b_mhz));
  return static_cast<int>(std::abs(std::distance(a, b)));
}

}  // namespace kareus::cuda
