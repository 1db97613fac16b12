// Kernel graph of a Megatron-style decoder-only transformer (Llama/Qwen family: RMSNorm, GQA
// attention with RoPE, SwiGLU MLP) under tensor, context, pipeline and data parallelism.
//
// FLOP counts follow Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
// Clusters Using Megatron-LM" (SC '21), adapted to GQA and SwiGLU:
// per layer forward QKV 2*T*h*(a+2g)*d/t, attention 2*b*s^2*(a/t)*d (causal half), output
// projection 2*T*a*d*h/t, MLP 6*T*h*f/t; a backward GEMM is twice its forward. FlashAttention-2
// (Dao, 2023) backward performs 2.5x the forward's matmul work (it recomputes the scores); the
// model-FLOPs share stays 2x, as in the formula.
//
// The cut points (collectives) follow Megatron-LM's layer: row-parallel output projection and
// FC2 end in a TP AllReduce (ReduceScatter with sequence parallelism, which adds AllGathers before
// QKV and FC1); in backward the column-parallel QKV and FC1 input gradients are AllReduced.
// Context parallelism uses the all-gather style of Megatron/TransformerEngine: K,V are gathered
// before attention and dK,dV reduce-scattered after it (K,V are gathered again for backward).
// With full recompute every layer's forward (with its collectives) is re-run right before its
// backward, so recomputed blocks appear in the backward instruction.
//
// A mixture-of-experts layer (docs/moe.md) replaces the MLP with Megatron-Core's MoELayer and
// its all-to-all token dispatcher: router GEMM and top-k, permute, the dispatch all-to-all over
// the expert-parallel group, the local experts as grouped GEMMs (FC1 gate+up, SwiGLU, FC2), the
// combine all-to-all and the unpermute (weighted sum of each token's k expert outputs). Experts
// are not tensor-parallel (expert tensor parallelism 1, MoE parallel folding: Liu et al.,
// arXiv 2504.14960), so each TP rank routes its sequence-parallel share of the tokens. Routed
// experts count k GEMM passes per token in the model FLOPs (top-k active parameters).
#include "kareus/kernel_graph.h"

#include <fmt/format.h>

#include <algorithm>

#include "kareus/error.h"

namespace kareus {

const char* to_string(OpKind k) {
  switch (k) {
    case OpKind::kGemm:
      return "gemm";
    case OpKind::kAttention:
      return "attention";
    case OpKind::kNorm:
      return "norm";
    case OpKind::kElementwise:
      return "elementwise";
    case OpKind::kEmbedding:
      return "embedding";
    case OpKind::kLoss:
      return "loss";
    case OpKind::kCollective:
      return "collective";
  }
  return "?";
}

const char* to_string(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::kAllReduce:
      return "allreduce";
    case CollectiveKind::kAllGather:
      return "allgather";
    case CollectiveKind::kReduceScatter:
      return "reducescatter";
    case CollectiveKind::kP2P:
      return "p2p";
    case CollectiveKind::kAllToAll:
      return "alltoall";
  }
  return "?";
}

const char* short_name(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::kAllReduce:
      return "ar";
    case CollectiveKind::kAllGather:
      return "ag";
    case CollectiveKind::kReduceScatter:
      return "rs";
    case CollectiveKind::kP2P:
      return "p2p";
    case CollectiveKind::kAllToAll:
      return "a2a";
  }
  return "?";
}

const char* to_string(CommGroup g) {
  switch (g) {
    case CommGroup::kTp:
      return "tp";
    case CommGroup::kCp:
      return "cp";
    case CommGroup::kPp:
      return "pp";
    case CommGroup::kDp:
      return "dp";
    case CommGroup::kEmbedding:
      return "embedding";
    case CommGroup::kEp:
      return "ep";
    case CommGroup::kExpertDp:
      return "expert_dp";
  }
  return "?";
}

double Kernel::wire_bytes() const {
  if (!is_collective() || group_size <= 1)
    return collective == CollectiveKind::kP2P ? payload_bytes : 0.0;
  const double n = group_size;
  switch (collective) {
    case CollectiveKind::kAllReduce:
      return 2.0 * (n - 1.0) / n * payload_bytes;
    case CollectiveKind::kAllGather:
    case CollectiveKind::kReduceScatter:
      return (n - 1.0) / n * payload_bytes;
    case CollectiveKind::kP2P:
      return payload_bytes;
    case CollectiveKind::kAllToAll:
      return inter_node ? (n - node_ranks) / n * payload_bytes : (n - 1.0) / n * payload_bytes;
  }
  return 0.0;
}

namespace {

constexpr double kBf16 = 2.0;  // bytes per activation / weight element
constexpr double kFp32 = 4.0;  // gradients are reduced in fp32 (Megatron's main_grad)

// A block of one nano-batch's compute; the caller sets its collective.
Block make_block(std::string name, InstructionKind direction, bool recompute) {
  Block b;
  b.name = std::move(name);
  b.direction = direction;
  b.recompute = recompute;
  return b;
}

// Appends `k` to the block's compute; a slot name makes it a launch point of the other
// nano-batch's collective.
void add_op(Block& b, Kernel k, const char* slot = nullptr) {
  if (slot) b.slots.push_back({slot, static_cast<int>(b.ops.size())});
  b.ops.push_back(std::move(k));
}

// Builds kernels for one micro-batch slice of `tokens` local tokens.
class Builder {
 public:
  Builder(const Workload& w, double seqs) : w_(w), m_(w.model), p_(w.parallel) {
    const double s = w.batch.seq_len;
    seqs_ = seqs;
    tokens_ = seqs * s / p_.cp;                                     // local tokens (this CP rank)
    sp_tokens_ = p_.sequence_parallel ? tokens_ / p_.tp : tokens_;  // tokens outside TP regions
    h_ = m_.hidden;
    q_cols_ = static_cast<double>(m_.heads) / p_.tp * m_.head_dim;
    kv_cols_ = static_cast<double>(m_.kv_heads) / p_.tp * m_.head_dim;
    f_ = static_cast<double>(m_.ffn_hidden) / p_.tp;
    vocab_ = static_cast<double>(m_.vocab) / p_.tp;
    // Copies of this rank's tokens its experts process: top-k per token, times the busiest
    // rank's excess (ModelConfig::expert_imbalance).
    routed_rows_ = sp_tokens_ * m_.experts_per_token * m_.expert_imbalance;
    local_experts_ = m_.moe() ? m_.experts / p_.ep : 0;
  }

  Kernel gemm(const std::string& name, double m, double n, double k, bool model) const {
    Kernel g;
    g.name = name;
    g.kind = OpKind::kGemm;
    g.flops = 2.0 * m * n * k;
    g.model_flops = model ? g.flops : 0.0;
    g.bytes_read = (m * k + k * n) * kBf16;
    g.bytes_written = m * n * kBf16;
    g.m = static_cast<std::int64_t>(m);
    g.n = static_cast<std::int64_t>(n);
    g.k = static_cast<std::int64_t>(k);
    return g;
  }

  // `groups` GEMMs of m x n x k at once (the local experts' grouped GEMM, Megatron-Core's
  // GroupedMLP): every group reads its own weights.
  Kernel grouped_gemm(const std::string& name, double m, double n, double k, int groups,
                      bool model) const {
    Kernel g = gemm(name, m, n, k, model);
    const double G = groups;
    g.flops *= G;
    g.model_flops *= G;
    g.bytes_read *= G;
    g.bytes_written *= G;
    g.groups = groups;
    return g;
  }

  // Forward GEMM y[m,n] = x[m,k] W[k,n] and its backward pair (dgrad, wgrad).
  Kernel fwd_gemm(const std::string& name, double n, double k) const {
    return gemm(name, tokens_, n, k, true);
  }
  Kernel dgrad(const std::string& name, double n, double k) const {
    return gemm(name + "_dgrad", tokens_, k, n, true);
  }
  Kernel wgrad(const std::string& name, double n, double k) const {
    return gemm(name + "_wgrad", k, n, tokens_, true);
  }

  Kernel elementwise(const std::string& name, OpKind kind, double elems, double flops_per_elem,
                     double reads_per_elem, double writes_per_elem,
                     double elem_bytes = kBf16) const {
    Kernel e;
    e.name = name;
    e.kind = kind;
    e.flops = elems * flops_per_elem;
    e.bytes_read = elems * reads_per_elem * elem_bytes;
    e.bytes_written = elems * writes_per_elem * elem_bytes;
    return e;
  }

  Kernel residual_add(const std::string& name) const {
    return elementwise(name, OpKind::kElementwise, sp_tokens_ * h_, 1, 2, 1);
  }
  Kernel rmsnorm(const std::string& name) const {
    return elementwise(name, OpKind::kNorm, sp_tokens_ * h_, 4, 1, 1);
  }
  Kernel rmsnorm_bwd(const std::string& name) const {
    return elementwise(name, OpKind::kNorm, sp_tokens_ * h_, 8, 2, 1);
  }

  Kernel attention(bool backward) const {
    // Queries of this CP rank against all keys of the sequence; causal masking halves the work.
    const double s = w_.batch.seq_len;
    const double q_rows = seqs_ * s / p_.cp;
    const double kv_rows = seqs_ * s;
    const double fwd = 4.0 * q_rows * s * q_cols_ * 0.5;  // QK^T and PV, causal half
    Kernel k;
    k.name = backward ? "attention_bwd" : "attention";
    k.kind = OpKind::kAttention;
    k.flops = backward ? 2.5 * fwd : fwd;
    k.model_flops = backward ? 2.0 * fwd : fwd;
    const double qo = q_rows * q_cols_ * kBf16;
    const double kv = kv_rows * 2.0 * kv_cols_ * kBf16;
    k.bytes_read = backward ? 2.0 * qo + kv + qo : qo + kv;  // bwd also reads O and dO
    k.bytes_written = backward ? qo + kv / p_.cp : qo;
    // m counts query rows over all local heads, so that m / tile rows gives the CTA count.
    k.m = static_cast<std::int64_t>(q_rows * static_cast<double>(m_.heads) / p_.tp);
    k.n = static_cast<std::int64_t>(s);
    k.k = m_.head_dim;
    // Megatron-LM's context parallelism (Transformer Engine's ring attention over P2P, the
    // default cp_comm_type) runs one attention call per CP step, each over s / cp keys.
    k.kv_calls = p_.cp;
    return k;
  }

  Kernel collective(const std::string& name, CollectiveKind kind, CommGroup group,
                    double payload) const {
    Kernel c;
    c.name = name;
    c.kind = OpKind::kCollective;
    c.collective = kind;
    c.group = group;
    c.payload_bytes = payload;
    // Megatron's rank order is tp (fastest), cp, dp, pp: a group's ranks are `stride` apart.
    int stride = 1;
    switch (group) {
      case CommGroup::kTp:
        c.group_size = p_.tp;
        stride = 1;
        break;
      case CommGroup::kCp:
        c.group_size = p_.cp;
        stride = p_.tp;
        break;
      case CommGroup::kDp:
        c.group_size = p_.dp;
        stride = p_.tp * p_.cp;
        break;
      case CommGroup::kPp:
      case CommGroup::kEmbedding:
        c.group_size = 2;
        stride = p_.gpus_per_stage() * (group == CommGroup::kPp ? 1 : (p_.pp - 1));
        break;
      // The expert layers' ranks are ordered etp (1), ep, expert dp, pp (Megatron-Core's
      // expert rank generator): an expert-parallel group is ep consecutive ranks.
      case CommGroup::kEp:
        c.group_size = p_.ep;
        stride = 1;
        break;
      case CommGroup::kExpertDp:
        c.group_size = p_.expert_dp();
        stride = p_.ep;
        break;
    }
    const int gpn = w_.cluster.gpus_per_node;
    c.inter_node = stride * (c.group_size - 1) >= gpn;
    c.node_ranks = c.inter_node ? std::max(1, gpn / stride) : c.group_size;
    // NCCL 2.28's copy-engine collectives run inside one NVLink domain only.
    c.copy_engine = kind == CollectiveKind::kAllToAll && !c.inter_node &&
                    w_.cluster.nccl_version >= 228 && c.group_size > 1;
    return c;
  }

  // TP exit of a layer sub-block: AllReduce, or ReduceScatter under sequence parallelism.
  Kernel tp_exit(const std::string& name) const {
    return p_.sequence_parallel
               ? collective(name, CollectiveKind::kReduceScatter, CommGroup::kTp,
                            tokens_ * h_ * kBf16)
               : collective(name, CollectiveKind::kAllReduce, CommGroup::kTp, tokens_ * h_ * kBf16);
  }
  Kernel tp_entry(const std::string& name) const {
    return collective(name, CollectiveKind::kAllGather, CommGroup::kTp, tokens_ * h_ * kBf16);
  }
  Kernel kv_gather(const std::string& name, bool reduce_scatter) const {
    const double kv_full = seqs_ * w_.batch.seq_len * 2.0 * kv_cols_ * kBf16;
    return collective(name,
                      reduce_scatter ? CollectiveKind::kReduceScatter : CollectiveKind::kAllGather,
                      CommGroup::kCp, kv_full);
  }

  // A norm step (residual add and RMSNorm, or their backward), the start of block `b`; under
  // sequence parallelism a block of its own named `name`, ending in the TP AllGather, appended
  // to `out` before `b`.
  void norm_entry_into(std::vector<Block>& out, Block& b, const char* name, Kernel first,
                       Kernel second) const {
    Block own;
    Block& target = p_.sequence_parallel ? own : b;
    target.slots.push_back({"norm", static_cast<int>(target.ops.size())});
    target.ops.push_back(std::move(first));
    target.ops.push_back(std::move(second));
    if (!p_.sequence_parallel) return;
    own.name = name;
    own.direction = b.direction;
    own.recompute = b.recompute;
    own.collective = tp_entry("tp_allgather");
    out.push_back(std::move(own));
  }

  // ---- Forward blocks of one layer. Under sequence parallelism the norms run on the
  // sequence-sharded tokens between the TP ReduceScatter and AllGather (their own small blocks
  // here; fold_small_blocks moves them onto the communication chain).
  std::vector<Block> forward_layer(bool recompute, bool moe) const {
    std::vector<Block> out;
    const bool cp = p_.cp > 1;
    const bool sp = p_.sequence_parallel;
    auto mk = [&](std::string name) {
      return make_block(std::move(name), InstructionKind::kForward, recompute);
    };
    auto norm_entry = [&](Block& b, const char* block_name) {
      norm_entry_into(out, b, block_name, residual_add("residual_add"), rmsnorm("rmsnorm"));
    };
    const double qkv_n = q_cols_ + 2.0 * kv_cols_;
    const double qk_elems = tokens_ * (q_cols_ + kv_cols_);
    auto qkv_ops = [&](Block& b, const char* gemm_slot) {
      add_op(b, fwd_gemm("qkv_gemm", qkv_n, h_), gemm_slot);
      if (m_.qk_norm) add_op(b, elementwise("qk_norm", OpKind::kNorm, qk_elems, 4, 1, 1));
      add_op(b, elementwise("rope", OpKind::kElementwise, qk_elems, 3, 1, 1), "rope");
    };
    const char* exit_name = sp ? "tp_reducescatter" : "tp_allreduce";
    if (cp) {
      Block q = mk("qkv");
      norm_entry(q, "attn_norm");
      qkv_ops(q, "linear");
      q.collective = kv_gather("cp_allgather_kv", false);
      out.push_back(std::move(q));
      Block ao = mk("ao");
      add_op(ao, attention(false), "attn");
      add_op(ao, fwd_gemm("out_proj", h_, q_cols_), "linear");
      ao.collective = tp_exit(exit_name);
      out.push_back(std::move(ao));
    } else {
      Block at = mk("attn");
      norm_entry(at, "attn_norm");
      qkv_ops(at, "qkv");
      add_op(at, attention(false), "attn");
      add_op(at, fwd_gemm("out_proj", h_, q_cols_));
      at.collective = tp_exit(exit_name);
      out.push_back(std::move(at));
    }
    if (moe) {
      auto experts = moe_forward(recompute);
      out.insert(out.end(), experts.begin(), experts.end());
      return out;
    }
    Block ml = mk("mlp");
    norm_entry(ml, "mlp_norm");
    add_op(ml, fwd_gemm("fc1", 2.0 * f_, h_), "linear");
    add_op(ml, elementwise("swiglu", OpKind::kElementwise, tokens_ * f_, 5, 2, 1), "activation");
    add_op(ml, fwd_gemm("fc2", h_, f_));
    ml.collective = tp_exit(exit_name);
    out.push_back(std::move(ml));
    return out;
  }

  // ---- Mixture-of-experts MLP of one layer (Megatron-Core MoELayer, all-to-all dispatcher).
  // This rank's tokens (sequence-parallel share) as routed copies: each of them carries h bf16
  // values to its expert and back.
  Kernel ep_alltoall(const std::string& name) const {
    return collective(name, CollectiveKind::kAllToAll, CommGroup::kEp, routed_rows_ * h_ * kBf16);
  }
  // The experts' rows: routed copies over the local experts (at least one row each).
  double expert_rows() const { return std::max(1.0, routed_rows_ / local_experts_); }
  double shared_ffn() const {
    return static_cast<double>(m_.shared_experts) * m_.shared_expert_ffn_hidden;
  }

  // Forward: norm and routing ending in the dispatch, the experts ending in the combine, and
  // the unpermute (no tensor cores: it joins the combine's communication chain).
  std::vector<Block> moe_forward(bool recompute) const {
    std::vector<Block> out;
    auto mk = [&](std::string name) {
      return make_block(std::move(name), InstructionKind::kForward, recompute);
    };
    const double T = sp_tokens_, E = m_.experts, fe = m_.expert_ffn_hidden;
    Block route = mk("moe_route");
    add_op(route, residual_add("residual_add"), "norm");
    add_op(route, rmsnorm("rmsnorm"));
    // The router is replicated: every rank scores its own tokens against all experts.
    add_op(route, gemm("router_gemm", T, E, h_, true), "router");
    add_op(route, elementwise("router_topk", OpKind::kElementwise, T * E, 8, 1, 1, kFp32));
    add_op(route, elementwise("permute", OpKind::kElementwise, routed_rows_ * h_, 0, 1, 1),
           "permute");
    if (m_.shared_experts > 0) {
      // Shared experts run while the dispatch is in flight (--moe-shared-expert-overlap).
      add_op(route, gemm("shared_fc1", T, 2.0 * shared_ffn(), h_, true), "shared");
      add_op(route, elementwise("shared_swiglu", OpKind::kElementwise, T * shared_ffn(), 5, 2, 1));
      add_op(route, gemm("shared_fc2", T, h_, shared_ffn(), true));
    }
    route.collective = ep_alltoall("ep_dispatch");
    out.push_back(std::move(route));

    Block ex = mk("moe_experts");
    const double rows = expert_rows();
    add_op(ex, grouped_gemm("expert_fc1", rows, 2.0 * fe, h_, local_experts_, true), "linear");
    add_op(ex, elementwise("expert_swiglu", OpKind::kElementwise, routed_rows_ * fe, 5, 2, 1),
           "activation");
    add_op(ex, grouped_gemm("expert_fc2", rows, h_, fe, local_experts_, true));
    ex.collective = ep_alltoall("ep_combine");
    out.push_back(std::move(ex));

    Block un = mk("moe_unpermute");
    // Weighted sum of each token's k expert outputs.
    Kernel u = elementwise("unpermute", OpKind::kElementwise, routed_rows_ * h_, 2, 1, 0);
    u.bytes_written = T * h_ * kBf16;
    add_op(un, u);
    // No communication: fold_small_blocks adds the unpermute to the combine's chain.
    un.collective = collective("none", CollectiveKind::kAllReduce, CommGroup::kTp, 0.0);
    out.push_back(std::move(un));
    return out;
  }

  // Backward: the unpermute's backward ending in the combine's backward all-to-all (expert
  // gradients out), the experts' backward ending in the dispatch's backward all-to-all, and the
  // permute and router backward (and the shared experts').
  std::vector<Block> moe_backward() const {
    std::vector<Block> out;
    auto mk = [](std::string name) {
      return make_block(std::move(name), InstructionKind::kBackward, false);
    };
    const double T = sp_tokens_, E = m_.experts, fe = m_.expert_ffn_hidden;
    const double rows = expert_rows();
    const int G = local_experts_;
    Block ub = mk("moe_unpermute");
    add_op(ub, rmsnorm_bwd("rmsnorm_bwd"), "norm");
    add_op(ub, residual_add("residual_grad_add"));
    Kernel u = elementwise("unpermute_bwd", OpKind::kElementwise, routed_rows_ * h_, 2, 0, 1);
    u.bytes_read = (T + routed_rows_) * h_ * kBf16;  // dY and the saved expert outputs
    add_op(ub, u);
    ub.collective = ep_alltoall("ep_combine_bwd");
    out.push_back(std::move(ub));

    Block ex = mk("moe_experts");
    add_op(ex, grouped_gemm("expert_fc2_dgrad", rows, fe, h_, G, true), "linear");
    add_op(ex, grouped_gemm("expert_fc2_wgrad", fe, h_, rows, G, true));
    add_op(ex, elementwise("expert_swiglu_bwd", OpKind::kElementwise, routed_rows_ * fe, 8, 3, 2),
           "activation");
    add_op(ex, grouped_gemm("expert_fc1_dgrad", rows, h_, 2.0 * fe, G, true));
    add_op(ex, grouped_gemm("expert_fc1_wgrad", h_, 2.0 * fe, rows, G, true));
    ex.collective = ep_alltoall("ep_dispatch_bwd");
    out.push_back(std::move(ex));

    Block rb = mk("moe_route");
    add_op(rb, elementwise("permute_bwd", OpKind::kElementwise, routed_rows_ * h_, 1, 1, 0),
           "permute");
    add_op(rb, elementwise("router_topk_bwd", OpKind::kElementwise, T * E, 8, 2, 1, kFp32));
    add_op(rb, gemm("router_gemm_dgrad", T, h_, E, true), "router");
    add_op(rb, gemm("router_gemm_wgrad", h_, E, T, true));
    if (m_.shared_experts > 0) {
      const double fs = shared_ffn();
      add_op(rb, gemm("shared_fc2_dgrad", T, fs, h_, true), "shared");
      add_op(rb, gemm("shared_fc2_wgrad", fs, h_, T, true));
      add_op(rb, elementwise("shared_swiglu_bwd", OpKind::kElementwise, T * fs, 8, 3, 2));
      add_op(rb, gemm("shared_fc1_dgrad", T, h_, 2.0 * fs, true));
      add_op(rb, gemm("shared_fc1_wgrad", h_, 2.0 * fs, T, true));
    }
    out.push_back(std::move(rb));  // merged into the attention's backward (backward_layer)
    return out;
  }

  // Prepends block `i`'s compute (it ends in no collective) to block i + 1 and removes it.
  static void merge_into_next(std::vector<Block>& blocks, std::size_t i) {
    Block& from = blocks.at(i);
    Block& to = blocks.at(i + 1);
    const int shift = static_cast<int>(from.ops.size());
    for (auto& slot : to.slots) slot.op_index += shift;
    to.slots.insert(to.slots.begin(), from.slots.begin(), from.slots.end());
    to.ops.insert(to.ops.begin(), from.ops.begin(), from.ops.end());
    to.name = from.name + "_" + to.name;
    blocks.erase(blocks.begin() + static_cast<std::ptrdiff_t>(i));
  }

  // ---- Backward blocks of one layer (without its recompute).
  std::vector<Block> backward_layer(bool moe) const {
    const bool cp = p_.cp > 1;
    const bool sp = p_.sequence_parallel;
    auto mk = [](std::string name) {
      return make_block(std::move(name), InstructionKind::kBackward, false);
    };
    std::vector<Block> out;
    // The norm backward of the layer above (after its gradient's AllReduce) and the residual
    // gradient.
    auto norm_entry = [&](Block& b, const char* block_name) {
      norm_entry_into(out, b, block_name, rmsnorm_bwd("rmsnorm_bwd"),
                      residual_add("residual_grad_add"));
    };
    const double qkv_n = q_cols_ + 2.0 * kv_cols_;
    const double qk_elems = tokens_ * (q_cols_ + kv_cols_);
    // The input gradient of a column-parallel GEMM is AllReduced (ReduceScatter with SP).
    const char* exit_name = sp ? "tp_reducescatter" : "tp_allreduce";

    if (moe) {
      out = moe_backward();
    } else {
      Block ml = mk(sp ? "mlp_gemm" : "mlp");
      norm_entry(ml, "mlp");
      add_op(ml, dgrad("fc2", h_, f_), "linear");
      add_op(ml, wgrad("fc2", h_, f_));
      add_op(ml, elementwise("swiglu_bwd", OpKind::kElementwise, tokens_ * f_, 8, 3, 2),
             "activation");
      add_op(ml, dgrad("fc1", 2.0 * f_, h_));
      add_op(ml, wgrad("fc1", 2.0 * f_, h_));
      ml.collective = tp_exit(exit_name);
      out.push_back(std::move(ml));
    }
    const std::size_t attention_begin = out.size();

    auto qkv_tail = [&](Block& b) {
      add_op(b, elementwise("rope_bwd", OpKind::kElementwise, qk_elems, 3, 1, 1), "rope");
      if (m_.qk_norm) add_op(b, elementwise("qk_norm_bwd", OpKind::kNorm, qk_elems, 8, 2, 1));
      add_op(b, dgrad("qkv_gemm", qkv_n, h_), cp ? "linear" : nullptr);
      add_op(b, wgrad("qkv_gemm", qkv_n, h_));
    };
    if (cp) {
      Block o = mk("o");
      norm_entry(o, "o_norm");
      add_op(o, dgrad("out_proj", h_, q_cols_), "linear");
      add_op(o, wgrad("out_proj", h_, q_cols_));
      o.collective = kv_gather("cp_allgather_kv", false);  // K,V again for attention backward
      out.push_back(std::move(o));
      Block a = mk("a");
      add_op(a, attention(true), "attn");
      a.collective = kv_gather("cp_reducescatter_dkv", true);
      out.push_back(std::move(a));
      Block q = mk("qkv");
      qkv_tail(q);
      q.collective = tp_exit(exit_name);
      out.push_back(std::move(q));
    } else {
      Block at = mk("attn");
      norm_entry(at, "attn_norm");
      add_op(at, dgrad("out_proj", h_, q_cols_), "linear");
      add_op(at, wgrad("out_proj", h_, q_cols_));
      add_op(at, attention(true), "attn");
      qkv_tail(at);
      at.collective = tp_exit(exit_name);
      out.push_back(std::move(at));
    }
    // Nothing separates the permute and router backward from the attention's backward but
    // the (local) norm backward: they open the attention's first block.
    if (moe) merge_into_next(out, attention_begin - 1);
    return out;
  }

  // ---- Non-layer kernels (whole micro-batch: this builder must be made with the micro-batch).
  std::vector<Kernel> embedding_forward() const {
    std::vector<Kernel> k;
    Kernel e = elementwise("embedding", OpKind::kEmbedding, tokens_ * h_, 0, 1, 1);
    e.bytes_read += tokens_ * 4;  // token ids
    k.push_back(e);
    // Vocab-parallel embedding: partial rows are summed across TP.
    k.push_back(tp_exit(p_.sequence_parallel ? "embedding_reducescatter" : "embedding_allreduce"));
    return k;
  }
  std::vector<Kernel> embedding_backward() const {
    return {elementwise("embedding_bwd", OpKind::kEmbedding, tokens_ * h_, 1, 2, 1)};
  }
  std::vector<Kernel> output_forward() const {
    std::vector<Kernel> k;
    k.push_back(residual_add("final_residual_add"));
    k.push_back(rmsnorm("final_rmsnorm"));
    if (p_.sequence_parallel) k.push_back(tp_entry("output_allgather"));
    k.push_back(fwd_gemm("logits_gemm", vocab_, h_));
    k.push_back(elementwise("cross_entropy", OpKind::kLoss, tokens_ * vocab_, 5, 1, 0, kFp32));
    // Vocab-parallel cross entropy reduces max, sum-exp and target logit across TP (fp32).
    k.push_back(collective("loss_allreduce", CollectiveKind::kAllReduce, CommGroup::kTp,
                           3.0 * tokens_ * kFp32));
    return k;
  }
  std::vector<Kernel> output_backward() const {
    std::vector<Kernel> k;
    k.push_back(elementwise("cross_entropy_bwd", OpKind::kLoss, tokens_ * vocab_, 3, 1, 1, kFp32));
    k.push_back(dgrad("logits_gemm", vocab_, h_));
    k.push_back(wgrad("logits_gemm", vocab_, h_));
    k.push_back(
        tp_exit(p_.sequence_parallel ? "output_grad_reducescatter" : "output_grad_allreduce"));
    k.push_back(rmsnorm_bwd("final_rmsnorm_bwd"));
    return k;
  }

  // Parameters of one layer on one GPU: dense ones (reduced over data parallelism) and the
  // local routed experts (reduced over expert data parallelism).
  double layer_params(bool moe) const {
    const double attn = h_ * (q_cols_ + 2 * kv_cols_) + q_cols_ * h_ + 2.0 * h_ +
                        (m_.qk_norm ? 2.0 * m_.head_dim : 0.0);
    if (!moe) return attn + 3.0 * h_ * f_;
    return attn + h_ * m_.experts + 3.0 * h_ * shared_ffn();
  }
  double expert_params(bool moe) const {
    return moe ? local_experts_ * 3.0 * h_ * m_.expert_ffn_hidden : 0.0;
  }
  double vocab_params() const { return vocab_ * h_; }

  // With sequence parallelism a stage's output is already split over the TP ranks, and each
  // sends only its share (Megatron-LM's p2p tensor_shape is [s / cp / tp, b, h] then).
  Kernel p2p() const {
    return collective("p2p", CollectiveKind::kP2P, CommGroup::kPp, sp_tokens_ * h_ * kBf16);
  }

  // ZeRO-1: fp32 gradients reduce-scattered, bf16 parameters all-gathered (Megatron-LM's
  // distributed optimizer with its default fp32 gradient reduction).
  // Routed experts' gradients: reduce-scattered and their parameters all-gathered over the
  // ranks holding the same experts, once per iteration after the stage's last instruction.
  std::vector<Kernel> expert_dp_comm(double params) const {
    if (p_.expert_dp() <= 1 || params <= 0) return {};
    return {collective("expert_dp_grad_reducescatter", CollectiveKind::kReduceScatter,
                       CommGroup::kExpertDp, params * kFp32),
            collective("expert_dp_param_allgather", CollectiveKind::kAllGather,
                       CommGroup::kExpertDp, params * kBf16)};
  }

  DpComm dp_comm(double params, bool overlapped) const {
    DpComm d;
    d.grad_reduce_scatter = collective("dp_grad_reducescatter", CollectiveKind::kReduceScatter,
                                       CommGroup::kDp, params * kFp32);
    d.param_all_gather = collective("dp_param_allgather", CollectiveKind::kAllGather,
                                    CommGroup::kDp, params * kBf16);
    d.params = params;
    // Megatron-LM's DistributedDataParallel default: bucket_size = max(40M, 1M x dp) params.
    d.bucket_params = std::max(40e6, 1e6 * p_.dp);
    d.overlapped = overlapped;
    return d;
  }
  Kernel embedding_grad_reduce() const {
    return collective("tied_embedding_grad_allreduce", CollectiveKind::kAllReduce,
                      CommGroup::kEmbedding, vocab_params() * kFp32);
  }

 private:
  const Workload& w_;
  const ModelConfig& m_;
  const ParallelConfig& p_;
  double seqs_ = 0, tokens_ = 0, sp_tokens_ = 0, h_ = 0, q_cols_ = 0, kv_cols_ = 0, f_ = 0,
         vocab_ = 0, routed_rows_ = 0;
  int local_experts_ = 0;
};

bool uses_tensor_cores(const Block& b) {
  for (const auto& k : b.ops) {
    if (k.kind == OpKind::kGemm || k.kind == OpKind::kAttention) return true;
  }
  return false;
}

// Folds every block without tensor-core work (a residual add and norm between a ReduceScatter and
// an AllGather under sequence parallelism) into the communication chain of the block before it:
// such a block is too short to hide a collective behind, so with nano-batches it would leave two
// collectives exposed per norm. The kernel order of one nano-batch is unchanged, so sequential
// execution runs exactly the same kernels. The first block of an instruction stays (nothing
// precedes it).
std::vector<Block> fold_small_blocks(std::vector<Block> blocks) {
  std::vector<Block> out;
  out.reserve(blocks.size());
  for (auto& b : blocks) {
    if (!out.empty() && !uses_tensor_cores(b)) {
      auto& tail = out.back().comm_tail;
      tail.insert(tail.end(), b.ops.begin(), b.ops.end());
      // A block that ends in no communication (a MoE layer's unpermute) adds only its kernels.
      if (b.collective.wire_bytes() > 0) tail.push_back(std::move(b.collective));
      tail.insert(tail.end(), b.comm_tail.begin(), b.comm_tail.end());
      continue;
    }
    out.push_back(std::move(b));
  }
  return out;
}

double sum_model_flops(const std::vector<Kernel>& ks, bool include_recompute, bool recompute) {
  if (recompute && !include_recompute) return 0.0;
  double s = 0;
  for (const auto& k : ks) s += k.model_flops;
  return s;
}

double instruction_model_flops(const InstructionGraph& ig, bool include_recompute) {
  double per_nb = 0;
  // Communication tails hold no tensor-core work (fold_small_blocks), so no model FLOPs.
  for (const auto& b : ig.blocks) per_nb += sum_model_flops(b.ops, include_recompute, b.recompute);
  return per_nb * ig.nano_batches + sum_model_flops(ig.prologue, true, false) +
         sum_model_flops(ig.epilogue, true, false);
}

}  // namespace

KernelGraph build_kernel_graph(const Workload& w) {
  const auto& p = w.parallel;
  const int nb = w.batch.nano_batches;
  const Builder nano(w, static_cast<double>(w.batch.micro_batch) / nb);
  const Builder micro(w, static_cast<double>(w.batch.micro_batch));
  const bool recompute = w.recompute == Recompute::kFull;

  KernelGraph g;
  g.p2p = micro.p2p();
  // One stage graph per virtual stage (model chunk); without interleaving they are the stages.
  const int pp = p.pp, vstages = p.virtual_stages();
  for (int s = 0; s < vstages; ++s) {
    StageGraph sg;
    sg.stage = s;
    sg.layers = p.stage_layers.at(static_cast<std::size_t>(s));
    sg.forward.stage = sg.backward.stage = s;
    sg.forward.kind = InstructionKind::kForward;
    sg.backward.kind = InstructionKind::kBackward;
    sg.forward.nano_batches = sg.backward.nano_batches = nb;
    // Layer blocks by kind: [0] dense MLP, [1] mixture of experts (only for a MoE model).
    const bool moe = w.model.moe();
    const std::vector<Block> none;
    const std::vector<Block> fwd[2] = {nano.forward_layer(false, false),
                                       moe ? nano.forward_layer(false, true) : none};
    const std::vector<Block> rec[2] = {nano.forward_layer(true, false),
                                       moe ? nano.forward_layer(true, true) : none};
    const std::vector<Block> bwd[2] = {nano.backward_layer(false),
                                       moe ? nano.backward_layer(true) : none};
    const int first = p.first_layer(s);
    double params = 0, expert_params = 0;
    for (int l = 0; l < sg.layers; ++l) {
      const int kind = w.model.moe_layer(first + l) ? 1 : 0;
      sg.forward.blocks.insert(sg.forward.blocks.end(), fwd[kind].begin(), fwd[kind].end());
      params += nano.layer_params(kind == 1);
      expert_params += nano.expert_params(kind == 1);
    }
    // The backward runs the layers top down.
    for (int l = sg.layers - 1; l >= 0; --l) {
      const int kind = w.model.moe_layer(first + l) ? 1 : 0;
      auto& bb = sg.backward.blocks;
      if (recompute) bb.insert(bb.end(), rec[kind].begin(), rec[kind].end());
      bb.insert(bb.end(), bwd[kind].begin(), bwd[kind].end());
    }
    sg.forward.blocks = fold_small_blocks(std::move(sg.forward.blocks));
    sg.backward.blocks = fold_small_blocks(std::move(sg.backward.blocks));
    if (s == 0) {
      sg.forward.prologue = micro.embedding_forward();
      sg.backward.epilogue = micro.embedding_backward();
    }
    if (s == vstages - 1) {
      sg.forward.epilogue = micro.output_forward();
      sg.backward.prologue = micro.output_backward();
    }
    const bool holds_vocab = s == 0 || s == vstages - 1;
    if (holds_vocab) params += nano.vocab_params();
    if (pp == 1 && !w.model.tied_embeddings) params += nano.vocab_params();
    // Each chunk's gradients are reduced on their own (Megatron-LM's per-chunk buffers).
    if (p.dp > 1) {
      sg.dp = nano.dp_comm(params, p.overlap_dp_comm);
      if (!p.overlap_dp_comm) {
        sg.per_iteration.push_back(sg.dp->grad_reduce_scatter);
        sg.per_iteration.push_back(sg.dp->param_all_gather);
      }
    }
    if (pp > 1 && w.model.tied_embeddings && holds_vocab) {
      sg.per_iteration.push_back(nano.embedding_grad_reduce());
    }
    for (auto& k : nano.expert_dp_comm(expert_params)) sg.per_iteration.push_back(std::move(k));
    g.stages.push_back(std::move(sg));
  }

  // Whole-job FLOPs: every GPU of a stage runs micro_batches instructions of each kind.
  const double gpus_per_stage = p.gpus_per_stage();
  const double mbs = w.batch.micro_batches;
  for (const auto& sg : g.stages) {
    const double model =
        instruction_model_flops(sg.forward, false) + instruction_model_flops(sg.backward, false);
    const double hw =
        instruction_model_flops(sg.forward, true) + instruction_model_flops(sg.backward, true);
    g.model_flops_per_iteration += model * mbs * gpus_per_stage;
    g.hardware_flops_per_iteration += hw * mbs * gpus_per_stage;
  }
  return g;
}

}  // namespace kareus
