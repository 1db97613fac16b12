// cuDNN's fused scaled-dot-product attention (the flash-attention engine TransformerEngine runs)
// as a pure description of the backend operation graph, and the process-wide choice between it
// and the fallback kernel (kernels.h). The description lists every tensor (dims, strides, uid,
// data type, virtual or not, by-value scalar) and every operation (matmul, pointwise, reduction,
// reshape) exactly as cudnn-frontend's composite SDPA nodes lower a causal, GQA, bf16 attention
// with softmax statistics for cuDNN 9 before 9.21 (before the single-operation softmax and band
// mask): forward Q.K^T -> scale -> causal mask (GEN_INDEX, CMP_GE, BINARY_SELECT) -> softmax as
// max, sub, exp, sum, div with Stats = max + log(sum) -> P.V; backward from dO, O and Stats to
// dQ, dK, dV with the row sums rowsum(dO * O). cudnn_sdpa_backend.cc turns a description into
// cuDNN backend descriptors; this file needs no CUDA and is unit-tested on machines without one.
// Source of the facts: NVIDIA/cudnn-frontend (MIT), include/cudnn_frontend/node/
// scaled_dot_product_flash_attention.h, softmax.h, diagonal_band_mask.h; Dao et al.,
// "FlashAttention" (2022).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "op_plan.h"

namespace kareus::cuda::sdpa {

enum class DataType { kBf16, kFloat, kInt32, kBool };
enum class OpKind { kMatmul, kPointwise, kReduction, kReshape };
enum class PointwiseMode {
  kAdd,
  kSub,
  kMul,
  kDiv,
  kExp,
  kLog,
  kIdentity,
  kGenIndex,
  kCmpGe,
  kBinarySelect
};
enum class ReductionMode { kAdd, kMax };
enum class Direction { kForward, kBackward };

const char* to_string(DataType t);
const char* to_string(OpKind k);
const char* to_string(PointwiseMode m);
const char* to_string(Direction d);

/// Uids of the tensors the caller binds to device buffers; fixed, so that a variant pack does
/// not depend on the order in which the graph was built. Intermediates start at kFirstInternal.
namespace uid {
constexpr std::int64_t kQ = 1, kK = 2, kV = 3, kO = 4, kStats = 5, kDO = 6, kDQ = 7, kDK = 8,
                       kDV = 9, kSoftmaxSum = 10, kDQAccum = 11, kFirstInternal = 100;
}

struct Tensor {
  std::int64_t uid = 0;
  std::string name;
  std::vector<std::int64_t> dims, strides;  ///< always rank 4
  DataType type = DataType::kFloat;
  bool is_virtual = false;  ///< an intermediate the fused kernel never writes to memory
  bool by_value = false;    ///< a host scalar passed through the variant pack
  double value = 0;         ///< the by-value scalar (stored as `type`: float or int32)
  std::int64_t alignment = 16;
};

/// One backend operation. Ports by kind: matmul A = x, B = b, C = y; pointwise X = x, B = b
/// (binary modes), T = t (BINARY_SELECT: y = t ? x : b), Y = y; reduction and reshape X = x,
/// Y = y. Unused ports are 0.
struct Op {
  std::string name;
  OpKind kind = OpKind::kPointwise;
  PointwiseMode pointwise = PointwiseMode::kIdentity;
  ReductionMode reduction = ReductionMode::kAdd;
  std::int64_t axis = -1;               ///< GEN_INDEX: dimension whose index is generated
  DataType compute = DataType::kFloat;  ///< math precision of the op
  std::int64_t x = 0, b = 0, t = 0, y = 0;
};

/// The operation graph of one attention call. The cuDNN view of an AttentionShape: batch =
/// groups (batch x KV heads, independent), query heads h_q = q_heads_per_group, KV heads h_k = 1
/// (GQA/MQA), so Q, O are [groups][h_q][q_len][d] and K, V [groups][1][kv_len][d], both dense
/// row-major: the layout the executor allocates (op_plan.h).
struct Graph {
  Direction direction = Direction::kForward;
  AttentionShape shape;
  float scale = 1.f;          ///< 1/sqrt(head_dim)
  bool bottom_right = false;  ///< causal diagonal aligned bottom-right (q_len < kv_len)
  std::vector<Tensor> tensors;
  std::vector<Op> ops;

  const Tensor& tensor(std::int64_t uid) const;  ///< throws InternalError when absent
  /// Uids of the non-virtual, non-scalar tensors: the device buffers of the variant pack.
  std::vector<std::int64_t> buffer_uids() const;
  /// Bytes of the float dQ accumulator the caller provides (backward; 0 forward).
  std::size_t dq_accum_bytes() const;
};

/// Bytes a dense tensor spans (largest offset + 1, times the element size).
std::size_t span_bytes(const Tensor& t);

/// Empty when the fused engine can take the shape; otherwise why not (the caller then runs the
/// fallback). Limits are those of cuDNN 9's flash attention for bf16 on sm80/sm90.
std::string unsupported_reason(const AttentionShape& s);

/// The graphs; throw InvalidInput naming the limit when unsupported_reason() is not empty.
Graph forward_graph(const AttentionShape& s);
Graph backward_graph(const AttentionShape& s);

/// A step of building or running the fused graph that failed, with cuDNN's status.
struct StepError {
  std::string step;         ///< e.g. "execution plan finalize"
  int status = 0;           ///< cudnnStatus_t (0 when the failure is not a cuDNN status)
  std::string status_text;  ///< cudnnGetErrorString, or the exception's message
};

/// Which attention implementation the cuda backend runs. Starts on cuDNN's fused attention; the
/// first failure of any step (library load, descriptor finalize, no engine from the
/// heuristics, execute error) switches the whole process to the fallback kernel for good and is
/// reported once through the warning sink, so one process never mixes the two in its
/// measurements and the profiler's fingerprint names the one that ran. Thread-safe.
class AttentionPath {
 public:
  using Sink = std::function<void(const std::string&)>;
  bool fused() const;
  /// "cudnn-fused" or "fallback kernel".
  std::string backend() const;
  /// Fingerprint field: "attention=cudnn-fused" or "attention=fallback" (the label earlier
  /// builds stored fallback measurements under).
  std::string fingerprint_field() const;
  /// Records a failure; returns the warning text (also sent to the sink the first time).
  std::string fail(const StepError& e, const AttentionShape& s, Direction d);
  /// Number of failures recorded (the first switched the path).
  int failures() const;
  /// The warning sink (default: one line on stderr). Returns the previous one.
  Sink set_sink(Sink sink);
  /// Back to the fused path (tests only: a real process never switches back).
  void reset();

 private:
  mutable std::mutex mu_;
  bool fused_ = true;
  int failures_ = 0;
  Sink sink_;
};

/// The process's path.
AttentionPath& attention_path();

}  // namespace kareus::cuda::sdpa
