// The SDPA operation graphs as data (see cudnn_sdpa.h). Each builder mirrors cudnn-frontend's
// composite lowering for cuDNN 9.x < 9.21: which tensors are virtual, which intermediates are
// bf16 (the softmax output P and the transposed P, dS that feed matmuls), int32 (generated
// indices) or boolean (the mask), the by-value scalars expanded to rank 4, the float dQ
// accumulator and row-sum tensor the backward engine writes, and the odd strides of the
// dO * O product (b, h, s, d with the sequence stride h*d) the frontend hands to the engine.
#include "cudnn_sdpa.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <limits>

#include "kareus/error.h"

namespace kareus::cuda::sdpa {
namespace {

using Dims = std::vector<std::int64_t>;

std::size_t element_bytes(DataType t) {
  switch (t) {
    case DataType::kBf16:
      return 2;
    case DataType::kFloat:
    case DataType::kInt32:
      return 4;
    case DataType::kBool:
      return 1;
  }
  return 4;
}

// Builds one graph: tensors get uids in creation order from kFirstInternal unless fixed.
class Builder {
 public:
  explicit Builder(Graph& g) : g_(g) {}

  std::int64_t io(std::int64_t id, const char* name, Dims dims, Dims strides, DataType t) {
    Tensor x;
    x.uid = id;
    x.name = name;
    x.dims = std::move(dims);
    x.strides = std::move(strides);
    x.type = t;
    g_.tensors.push_back(std::move(x));
    return id;
  }
  std::int64_t virt(const std::string& name, Dims dims, Dims strides, DataType t) {
    Tensor x;
    x.uid = next_++;
    x.name = name;
    x.dims = std::move(dims);
    x.strides = std::move(strides);
    x.type = t;
    x.is_virtual = true;
    g_.tensors.push_back(std::move(x));
    return next_ - 1;
  }
  // cudnn-frontend expands a fused scalar to the rank of the op's other operands: [1,1,1,1].
  std::int64_t scalar(const std::string& name, double value, DataType t) {
    Tensor x;
    x.uid = next_++;
    x.name = name;
    x.dims = {1, 1, 1, 1};
    x.strides = {1, 1, 1, 1};
    x.type = t;
    x.by_value = true;
    x.value = value;
    g_.tensors.push_back(std::move(x));
    return next_ - 1;
  }
  const Tensor& t(std::int64_t id) const { return g_.tensor(id); }

  void matmul(const std::string& name, std::int64_t a, std::int64_t b, std::int64_t c) {
    Op op;
    op.name = name;
    op.kind = OpKind::kMatmul;
    op.x = a;
    op.b = b;
    op.y = c;
    g_.ops.push_back(op);
  }
  void pointwise(const std::string& name, PointwiseMode m, std::int64_t x, std::int64_t b,
                 std::int64_t y, DataType compute = DataType::kFloat, std::int64_t t = 0,
                 std::int64_t axis = -1) {
    Op op;
    op.name = name;
    op.kind = OpKind::kPointwise;
    op.pointwise = m;
    op.compute = compute;
    op.x = x;
    op.b = b;
    op.t = t;
    op.y = y;
    op.axis = axis;
    g_.ops.push_back(op);
  }
  void reduction(const std::string& name, ReductionMode m, std::int64_t x, std::int64_t y) {
    Op op;
    op.name = name;
    op.kind = OpKind::kReduction;
    op.reduction = m;
    op.x = x;
    op.y = y;
    g_.ops.push_back(op);
  }
  void reshape(const std::string& name, std::int64_t x, std::int64_t y) {
    Op op;
    op.name = name;
    op.kind = OpKind::kReshape;
    op.x = x;
    op.y = y;
    g_.ops.push_back(op);
  }

  // Causal mask on `score` ([b,h,sq,skv] float): keeps key j for query i when
  // i + (skv - sq) >= j, else -inf. Top-left alignment (sq == skv) needs no shift.
  std::int64_t causal_mask(std::int64_t score, const std::string& prefix) {
    const Tensor s = t(score);  // copy: g_.tensors grows below
    auto like = [&](const std::string& n, DataType dt) {
      return virt(prefix + n, s.dims, s.strides, dt);
    };
    std::int64_t row = like("row_index", DataType::kInt32);
    pointwise(prefix + "gen_row_index", PointwiseMode::kGenIndex, score, 0, row, DataType::kFloat,
              0, 2);
    const std::int64_t col = like("col_index", DataType::kInt32);
    pointwise(prefix + "gen_col_index", PointwiseMode::kGenIndex, score, 0, col, DataType::kFloat,
              0, 3);
    if (g_.bottom_right) {
      const std::int64_t skv =
          scalar(prefix + "s_kv", static_cast<double>(g_.shape.kv_len), DataType::kInt32);
      const std::int64_t row_skv = like("row+skv", DataType::kInt32);
      pointwise(prefix + "row+skv", PointwiseMode::kAdd, row, skv, row_skv, DataType::kInt32);
      const std::int64_t sq =
          scalar(prefix + "s_q", static_cast<double>(g_.shape.q_len), DataType::kInt32);
      const std::int64_t row_shift = like("row+skv-sq", DataType::kInt32);
      pointwise(prefix + "row+skv-sq", PointwiseMode::kSub, row_skv, sq, row_shift,
                DataType::kInt32);
      row = row_shift;
    }
    const std::int64_t keep = like("causal_keep", DataType::kBool);
    pointwise(prefix + "row>=col", PointwiseMode::kCmpGe, row, col, keep, DataType::kBool);
    const std::int64_t neg_inf =
        scalar(prefix + "negative_inf", -std::numeric_limits<double>::infinity(), DataType::kFloat);
    const std::int64_t out = like("masked", DataType::kFloat);
    pointwise(prefix + "binary_select", PointwiseMode::kBinarySelect, score, neg_inf, out,
              DataType::kFloat, keep);
    return out;
  }

 private:
  Graph& g_;
  std::int64_t next_ = uid::kFirstInternal;
};

void check_supported(const AttentionShape& s) {
  const std::string why = unsupported_reason(s);
  if (!why.empty()) throw InvalidInput("cuDNN fused attention: " + why);
}

Graph base(const AttentionShape& s, Direction d) {
  check_supported(s);
  Graph g;
  g.direction = d;
  g.shape = s;
  g.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.head_dim)));
  g.bottom_right = s.q_len != s.kv_len;
  return g;
}

}  // namespace

const char* to_string(DataType t) {
  switch (t) {
    case DataType::kBf16:
      return "bf16";
    case DataType::kFloat:
      return "float";
    case DataType::kInt32:
      return "int32";
    case DataType::kBool:
      return "bool";
  }
  return "?";
}

const char* to_string(OpKind k) {
  switch (k) {
    case OpKind::kMatmul:
      return "matmul";
    case OpKind::kPointwise:
      return "pointwise";
    case OpKind::kReduction:
      return "reduction";
    case OpKind::kReshape:
      return "reshape";
  }
  return "?";
}

const char* to_string(PointwiseMode m) {
  switch (m) {
    case PointwiseMode::kAdd:
      return "add";
    case PointwiseMode::kSub:
      return "sub";
    case PointwiseMode::kMul:
      return "mul";
    case PointwiseMode::kDiv:
      return "div";
    case PointwiseMode::kExp:
      return "exp";
    case PointwiseMode::kLog:
      return "log";
    case PointwiseMode::kIdentity:
      return "identity";
    case PointwiseMode::kGenIndex:
      return "gen_index";
    case PointwiseMode::kCmpGe:
      return "cmp_ge";
    case PointwiseMode::kBinarySelect:
      return "binary_select";
  }
  return "?";
}

const char* to_string(Direction d) { return d == Direction::kForward ? "forward" : "backward"; }

const Tensor& Graph::tensor(std::int64_t id) const {
  for (const auto& t : tensors)
    if (t.uid == id) return t;
  throw InternalError(fmt::format("SDPA graph has no tensor with uid {}", id));
}

std::vector<std::int64_t> Graph::buffer_uids() const {
  std::vector<std::int64_t> u;
  for (const auto& t : tensors)
    if (!t.is_virtual && !t.by_value) u.push_back(t.uid);
  return u;
}

std::size_t Graph::dq_accum_bytes() const {
  for (const auto& t : tensors)
    if (t.uid == uid::kDQAccum) return span_bytes(t);
  return 0;
}

std::size_t span_bytes(const Tensor& t) {
  std::int64_t last = 0;
  for (std::size_t i = 0; i < t.dims.size(); ++i) last += (t.dims[i] - 1) * t.strides[i];
  return static_cast<std::size_t>(last + 1) * element_bytes(t.type);
}

std::string unsupported_reason(const AttentionShape& s) {
  if (s.groups < 1 || s.q_heads_per_group < 1 || s.q_len < 1 || s.kv_len < 1 || s.head_dim < 1) {
    return fmt::format("empty shape (groups {}, heads {}, q_len {}, kv_len {}, head dim {})",
                       s.groups, s.q_heads_per_group, s.q_len, s.kv_len, s.head_dim);
  }
  if (s.head_dim % 8 != 0 || s.head_dim > 256) {
    return fmt::format("head dim {} is not a multiple of 8 up to 256", s.head_dim);
  }
  if (s.q_len > s.kv_len) {
    // The bottom-right causal diagonal is defined for q_len <= kv_len only (cudnn-frontend).
    return fmt::format("q_len {} exceeds kv_len {}", s.q_len, s.kv_len);
  }
  return "";
}

Graph forward_graph(const AttentionShape& s) {
  Graph g = base(s, Direction::kForward);
  Builder b(g);
  const std::int64_t n = s.groups, h = s.q_heads_per_group, sq = s.q_len, skv = s.kv_len,
                     d = s.head_dim;
  const Dims score_dims = {n, h, sq, skv}, score_strides = {h * sq * skv, sq * skv, skv, 1};
  const Dims row_dims = {n, h, sq, 1}, row_strides = {h * sq, sq, 1, 1};

  const auto q = b.io(uid::kQ, "Q", {n, h, sq, d}, {h * sq * d, sq * d, d, 1}, DataType::kBf16);
  // The backend's first matmul takes K^T: K's dims and strides with the last two swapped.
  const auto kt = b.io(uid::kK, "K^T", {n, 1, d, skv}, {skv * d, skv * d, 1, d}, DataType::kBf16);
  const auto v = b.io(uid::kV, "V", {n, 1, skv, d}, {skv * d, skv * d, d, 1}, DataType::kBf16);
  const auto o = b.io(uid::kO, "O", {n, h, sq, d}, {h * sq * d, sq * d, d, 1}, DataType::kBf16);
  const auto stats = b.io(uid::kStats, "Stats", row_dims, row_strides, DataType::kFloat);

  const auto s1 = b.virt("bmm1", score_dims, score_strides, DataType::kFloat);
  b.matmul("bmm1", q, kt, s1);
  const auto scale = b.scalar("attn_scale", g.scale, DataType::kFloat);
  const auto s2 = b.virt("attn_scale_out", score_dims, score_strides, DataType::kFloat);
  b.pointwise("attn_scale", PointwiseMode::kMul, s1, scale, s2);
  const auto s3 = b.causal_mask(s2, "");
  // Softmax with statistics: Stats = max + log(sum(exp(s - max))), the log-sum-exp.
  const auto mx = b.virt("Max", row_dims, row_strides, DataType::kFloat);
  b.reduction("Max", ReductionMode::kMax, s3, mx);
  const auto sub = b.virt("sub_M", score_dims, score_strides, DataType::kFloat);
  b.pointwise("sub", PointwiseMode::kSub, s3, mx, sub);
  const auto ex = b.virt("exp_sub_M", score_dims, score_strides, DataType::kFloat);
  b.pointwise("exp", PointwiseMode::kExp, sub, 0, ex);
  const auto sum = b.virt("SumExp", row_dims, row_strides, DataType::kFloat);
  b.reduction("sum", ReductionMode::kAdd, ex, sum);
  const auto lg = b.virt("log_SumExp", row_dims, row_strides, DataType::kFloat);
  b.pointwise("log", PointwiseMode::kLog, sum, 0, lg);
  b.pointwise("add", PointwiseMode::kAdd, mx, lg, stats);
  // P feeds the second matmul: the backend wants it in the I/O type.
  const auto p = b.virt("P", score_dims, score_strides, DataType::kBf16);
  b.pointwise("div", PointwiseMode::kDiv, ex, sum, p);
  b.matmul("bmm2", p, v, o);
  return g;
}

// Node names of a KV-head gradient product (cuDNN frontend's names, kept for its logs).
struct HeadSumNames {
  const char* full;    ///< the per-query-head product
  const char* matmul;  ///< the matmul node
  const char* reduce;  ///< the sum over query heads
};

// out = lhs rhs for a gradient of K or V. With GQA (several query heads per KV head) the product
// is formed per query head, [n, h, skv, d], and summed over the heads that share a KV head.
void head_summed_matmul(Builder& b, const HeadSumNames& names, std::int64_t lhs, std::int64_t rhs,
                        std::int64_t out, const AttentionShape& s) {
  const std::int64_t n = s.groups, h = s.q_heads_per_group, skv = s.kv_len, d = s.head_dim;
  if (h == 1) {
    b.matmul(names.matmul, lhs, rhs, out);
    return;
  }
  const auto full =
      b.virt(names.full, {n, h, skv, d}, {h * skv * d, skv * d, d, 1}, DataType::kBf16);
  b.matmul(names.matmul, lhs, rhs, full);
  b.reduction(names.reduce, ReductionMode::kAdd, full, out);
}

Graph backward_graph(const AttentionShape& s) {
  Graph g = base(s, Direction::kBackward);
  Builder b(g);
  const std::int64_t n = s.groups, h = s.q_heads_per_group, sq = s.q_len, skv = s.kv_len,
                     d = s.head_dim;
  const Dims score_dims = {n, h, sq, skv}, score_strides = {h * sq * skv, sq * skv, skv, 1};
  // Transposed views of [b,h,sq,skv]: [b,h,skv,sq] over the same memory.
  const Dims score_t_dims = {n, h, skv, sq}, score_t_strides = {h * sq * skv, sq * skv, 1, skv};
  const Dims row_dims = {n, h, sq, 1}, row_strides = {h * sq, sq, 1, 1};
  const Dims qd = {n, h, sq, d}, qs = {h * sq * d, sq * d, d, 1};
  const Dims kvd = {n, 1, skv, d}, kvs = {skv * d, skv * d, d, 1};
  const Dims kvtd = {n, 1, d, skv}, kvts = {skv * d, skv * d, 1, d};

  const auto q = b.io(uid::kQ, "Q", qd, qs, DataType::kBf16);
  const auto kt = b.io(uid::kK, "K^T", kvtd, kvts, DataType::kBf16);
  const auto vt = b.io(uid::kV, "V^T", kvtd, kvts, DataType::kBf16);
  const auto o = b.io(uid::kO, "O", qd, qs, DataType::kBf16);
  const auto stats = b.io(uid::kStats, "Stats", row_dims, row_strides, DataType::kFloat);
  const auto d_o = b.io(uid::kDO, "dO", qd, qs, DataType::kBf16);
  const auto dq = b.io(uid::kDQ, "dQ", qd, qs, DataType::kBf16);
  const auto dk = b.io(uid::kDK, "dK", kvd, kvs, DataType::kBf16);
  const auto dv = b.io(uid::kDV, "dV", kvd, kvs, DataType::kBf16);
  const auto softmax_sum =
      b.io(uid::kSoftmaxSum, "softmax_sum", row_dims, row_strides, DataType::kFloat);
  const auto dq_accum = b.io(uid::kDQAccum, "dQ_accum", qd, qs, DataType::kFloat);

  // softmax_sum = rowsum(dO * O) (times the inverse dropout scale, 1 here).
  const auto dot = b.virt("mul_dO_O", qd, {h * sq * d, sq * d, h * d, 1}, DataType::kFloat);
  b.pointwise("mul_dO_O", PointwiseMode::kMul, d_o, o, dot);
  const auto rowsum = b.virt("reduce_dO_o", row_dims, row_strides, DataType::kFloat);
  b.reduction("reduce_dO_o", ReductionMode::kAdd, dot, rowsum);
  const auto one = b.scalar("one", 1.0, DataType::kFloat);
  b.pointwise("scale_dropout_inv", PointwiseMode::kMul, rowsum, one, softmax_sum);

  // Recompute P = exp(scale * Q.K^T - Stats) under the causal mask.
  const auto s1 = b.virt("matmul_Q_KT", score_dims, score_strides, DataType::kFloat);
  b.matmul("matmul_Q_KT", q, kt, s1);
  const auto scale = b.scalar("attn_scale", g.scale, DataType::kFloat);
  const auto s2 = b.virt("mul_s_attn_scale", score_dims, score_strides, DataType::kFloat);
  b.pointwise("mul_s_attn_scale", PointwiseMode::kMul, s1, scale, s2);
  const auto s3 = b.virt("sub_s_m", score_dims, score_strides, DataType::kFloat);
  b.pointwise("sub_s_m", PointwiseMode::kSub, s2, stats, s3);
  const auto s4 = b.causal_mask(s3, "bprop_");
  const auto p = b.virt("exp_s", score_dims, score_strides, DataType::kFloat);
  b.pointwise("exp_s", PointwiseMode::kExp, s4, 0, p);

  // dV = P^T dO, summed over the query heads that share a KV head.
  const auto pt = b.virt("reshape_p", score_t_dims, score_t_strides, DataType::kBf16);
  b.reshape("reshape_p", p, pt);
  head_summed_matmul(b, {"dV_fullhead", "matmul_pT_dO", "red_dV_head"}, pt, d_o, dv, s);

  // dS = scale * P * (dO V^T - softmax_sum).
  const auto dp = b.virt("matmul_dO_VT", score_dims, score_strides, DataType::kFloat);
  b.matmul("matmul_dO_VT", d_o, vt, dp);
  const auto t1 = b.virt("sub_dP_softmax_sum", score_dims, score_strides, DataType::kFloat);
  b.pointwise("sub_dP_softmax_sum", PointwiseMode::kSub, dp, softmax_sum, t1);
  const auto t2 = b.virt("mul_dP_exp_s", score_dims, score_strides, DataType::kFloat);
  b.pointwise("mul_dP_exp_s", PointwiseMode::kMul, t1, p, t2);
  const auto ds = b.virt("mul_dS_attn_scale", score_dims, score_strides, DataType::kFloat);
  b.pointwise("mul_dS_attn_scale", PointwiseMode::kMul, t2, scale, ds);

  // dK = dS^T Q, summed over the query heads of a KV head.
  const auto dst = b.virt("reshape_dS", score_t_dims, score_t_strides, DataType::kBf16);
  b.reshape("reshape_dS", ds, dst);
  head_summed_matmul(b, {"dK_fullhead", "matmul_dST_Q", "red_dK_head"}, dst, q, dk, s);

  // dQ = dS K, accumulated in float by the engine, then converted.
  const auto k = b.virt("reshape_k", kvd, kvs, DataType::kFloat);
  b.reshape("reshape_k", kt, k);
  b.matmul("matmul_dS_K", ds, k, dq_accum);
  b.pointwise("identity_dQ", PointwiseMode::kIdentity, dq_accum, 0, dq);
  return g;
}

// ---- AttentionPath ----

bool AttentionPath::fused() const {
  std::lock_guard<std::mutex> l(mu_);
  return fused_;
}

std::string AttentionPath::backend() const { return fused() ? "cudnn-fused" : "fallback kernel"; }

std::string AttentionPath::fingerprint_field() const {
  return fused() ? "attention=cudnn-fused" : "attention=fallback";
}

std::string AttentionPath::fail(const StepError& e, const AttentionShape& s, Direction d) {
  const std::string where =
      s.groups > 0
          ? fmt::format(" ({}, groups {} x {} query heads, q_len {}, kv_len {}, head dim {})",
                        to_string(d), s.groups, s.q_heads_per_group, s.q_len, s.kv_len, s.head_dim)
          : std::string();
  std::string text = fmt::format(
      "kareus: warning: cuDNN fused attention{} failed at step '{}': {} (cuDNN status {}); "
      "attention runs on the fallback kernel from now on (measurements say attention=fallback)",
      where, e.step, e.status_text, e.status);
  Sink sink;
  {
    std::lock_guard<std::mutex> l(mu_);
    ++failures_;
    if (!fused_) return text;
    fused_ = false;
    sink = sink_;
  }
  if (sink) {
    sink(text);
  } else {
    std::fprintf(stderr, "%s\n", text.c_str());
  }
  return text;
}

int AttentionPath::failures() const {
  std::lock_guard<std::mutex> l(mu_);
  return failures_;
}

AttentionPath::Sink AttentionPath::set_sink(Sink sink) {
  std::lock_guard<std::mutex> l(mu_);
  std::swap(sink, sink_);
  return sink;
}

void AttentionPath::reset() {
  std::lock_guard<std::mutex> l(mu_);
  fused_ = true;
  failures_ = 0;
}

AttentionPath& attention_path() {
  static AttentionPath p;
  return p;
}

}  // namespace kareus::cuda::sdpa
