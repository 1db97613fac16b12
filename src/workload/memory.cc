// Per-GPU memory of a training job, so that a job that cannot fit its GPUs is refused before it
// is "optimized". Mixed-precision training with Adam keeps, per parameter, bf16 weights (2 B),
// bf16 gradients (2 B) and the fp32 optimizer state (master weights, momentum, variance: 12 B),
// 16 B in all (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
// Parameter Models", SC '20, section 3.1, K = 12); a distributed optimizer (ZeRO stage 1, as in
// Megatron-LM's --use-distributed-optimizer) shards the 12 B over the data-parallel ranks.
// Activations per layer and micro-batch follow Korthikanti et al., "Reducing Activation
// Recomputation in Large Transformer Models" (MLSys '23, arXiv 2205.05198), section 4: with
// tensor parallelism t, s*b*h*(10 + 24/t + 5*a*s/(h*t)) bytes, and with sequence parallelism
// s*b*h*(34 + 5*a*s/h)/t. The 5*a*s/h term is the s x s attention matrices, which a fused
// attention kernel (FlashAttention, Dao et al., NeurIPS '22) never stores, so it is left out;
// the constants are the paper's (GPT layer, 4h MLP), an approximation for SwiGLU and GQA. Full
// recompute keeps only each layer's input, 2*s*b*h bytes (divided by t with sequence
// parallelism), plus one layer's activations while it is recomputed (section 4.2). Context
// parallelism divides s by cp. Under 1F1B, stage i keeps the activations of min(pp - i,
// micro_batches) micro-batches at once (Narayanan et al., SC '21, section 2.2.1); under
// interleaved 1F1B it holds up to Schedule::max_in_flight(i) chunk passes, each over 1/v of the
// stage's layers (about (1 + (p - 1) / (p v)) times the 1F1B figure on stage 0). Everything
// left out (CUDA context, NCCL buffers, logits, fragmentation) makes the estimate a lower bound.
// A mixture-of-experts layer holds its local experts (experts / ep, not tensor-parallel), the
// replicated router and shared experts; the experts' optimizer state is sharded over the
// expert-data-parallel ranks (Megatron-Core's distributed optimizer shards each parameter over
// the group that reduces its gradient). Its stored activations replace Korthikanti's 19sbh MLP
// term by the tensors the MoE layer keeps per token: the router input (2h) and probabilities
// (4E, fp32), and per routed copy the permuted input (2h), FC1's output (4 f_e), the SwiGLU
// output (2 f_e) and the expert output (2h).
#include <fmt/format.h>

#include <algorithm>

#include "kareus/error.h"
#include "kareus/workload.h"

namespace kareus {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kWeightBytes = 2;      // bf16
constexpr double kGradientBytes = 2;    // bf16 (ZeRO's mixed-precision accounting)
constexpr double kOptimizerBytes = 12;  // fp32 master weights, Adam momentum and variance

// Parameters one GPU of stage `s` holds: its layers' matrices split over tp (norm weights are
// replicated), the vocabulary-parallel embedding on the first stage, the final norm and the
// output layer on the last (a tied output layer still needs its own copy when pp > 1, as in
// Megatron-LM).
struct StageParameters {
  double all = 0;
  double experts = 0;  ///< routed experts, of `all`
};
StageParameters stage_parameters(const Workload& w, int s) {
  const ModelConfig& m = w.model;
  const auto& par = w.parallel;
  const double h = m.hidden, d = m.head_dim, t = par.tp;
  const double attn = h * (m.heads + 2.0 * m.kv_heads) * d + m.heads * d * h;
  const double norms = 2.0 * h + (m.qk_norm ? 2.0 * d : 0.0);
  StageParameters p;
  for (int vs = s; vs < par.virtual_stages(); vs += par.pp) {
    const int first = par.first_layer(vs);
    for (int l = first; l < first + par.stage_layers.at(static_cast<std::size_t>(vs)); ++l) {
      if (!m.moe_layer(l)) {
        p.all += (attn + 3.0 * h * m.ffn_hidden) / t + norms;
        continue;
      }
      const double experts =
          static_cast<double>(m.experts) / par.ep * 3.0 * h * m.expert_ffn_hidden;
      const double shared = 3.0 * h * m.shared_experts * m.shared_expert_ffn_hidden;
      p.all += attn / t + norms + h * m.experts + shared + experts;
      p.experts += experts;
    }
  }
  const int last = par.pp - 1;
  if (s == 0) p.all += static_cast<double>(m.vocab) * h / t;
  if (s == last) {
    p.all += h;
    if (!m.tied_embeddings || last > 0) p.all += static_cast<double>(m.vocab) * h / t;
  }
  return p;
}

// Bytes of one layer's activations for one micro-batch without recompute (Korthikanti et al.,
// without the attention-matrix term), and of its input alone.
double layer_activation_bytes(const Workload& w, bool moe) {
  const double sb = static_cast<double>(w.batch.seq_len) / w.parallel.cp * w.batch.micro_batch;
  const double sbh = sb * w.model.hidden;
  const double t = w.parallel.tp;
  const bool sp = w.parallel.sequence_parallel;
  const double dense = sp ? sbh * 34.0 / t : sbh * (10.0 + 24.0 / t);
  if (!moe) return dense;
  const ModelConfig& m = w.model;
  // Attention and norms: Korthikanti's total without the MLP's 19sbh (divided by t under SP).
  const double attention = dense - sbh * 19.0 / t;
  const double tokens = sp ? sb / t : sb;  // MoE layers require SP when t > 1
  const double h = m.hidden, fe = m.expert_ffn_hidden;
  const double routed = tokens * m.experts_per_token * m.expert_imbalance;
  return attention + tokens * (2.0 * h + 4.0 * m.experts) + routed * (4.0 * h + 6.0 * fe);
}
double layer_activation_bytes(const Workload& w) {
  return std::max(layer_activation_bytes(w, false),
                  w.model.moe() ? layer_activation_bytes(w, true) : 0.0);
}
double layer_input_bytes(const Workload& w) {
  const double sbh =
      static_cast<double>(w.batch.seq_len) / w.parallel.cp * w.batch.micro_batch * w.model.hidden;
  return w.parallel.sequence_parallel ? 2.0 * sbh / w.parallel.tp : 2.0 * sbh;
}

std::string gib(double bytes) { return fmt::format("{:.1f} GiB", bytes / kGiB); }

}  // namespace

double MemoryEstimate::total_bytes() const {
  return weights_bytes + gradients_bytes + optimizer_bytes + activations_bytes;
}
double MemoryEstimate::total_distributed_bytes() const {
  return weights_bytes + gradients_bytes + optimizer_distributed_bytes + activations_bytes;
}

double gpu_memory_bytes(const std::string& gpu_name) {
  // Datasheet capacities: NVIDIA A100 Tensor Core GPU datasheet (40 GB and 80 GB HBM2/HBM2e),
  // NVIDIA A40 datasheet (48 GB GDDR6), NVIDIA H100 datasheet (SXM: 80 GB HBM3), NVIDIA H200
  // datasheet (141 GB HBM3e). Taken as GiB, the unit nvidia-smi reports them in.
  static const std::pair<const char*, double> kCapacityGib[] = {
      {"a100-sxm4-40gb", 40}, {"a100-sxm4-80gb", 80}, {"a40", 48}, {"h100-sxm", 80}, {"h200", 141}};
  for (const auto& [name, cap] : kCapacityGib) {
    if (gpu_name == name) return cap * kGiB;
  }
  throw InvalidInput(fmt::format("GPU '{}': no memory capacity in the catalogue", gpu_name));
}

MemoryEstimate estimate_memory(const Workload& w) {
  MemoryEstimate best;
  const int pp = w.parallel.pp;
  const Schedule sched = w.schedule();
  for (int s = 0; s < pp; ++s) {
    MemoryEstimate e;
    e.stage = s;
    const StageParameters params = stage_parameters(w, s);
    e.parameters = params.all;
    e.expert_parameters = params.experts;
    e.weights_bytes = kWeightBytes * e.parameters;
    e.gradients_bytes = kGradientBytes * e.parameters;
    e.optimizer_bytes = kOptimizerBytes * e.parameters;
    e.optimizer_distributed_bytes =
        kOptimizerBytes *
        ((params.all - params.experts) / w.parallel.dp + params.experts / w.parallel.expert_dp());
    e.inflight_microbatches = sched.max_in_flight(s);
    // Layers of one chunk pass: the stage's layers over its chunks.
    const double layers =
        static_cast<double>(w.parallel.layers_of_stage(s)) / w.parallel.virtual_pipeline;
    e.activations_bytes =
        w.recompute == Recompute::kFull
            ? e.inflight_microbatches * layers * layer_input_bytes(w) + layer_activation_bytes(w)
            : e.inflight_microbatches * layers * layer_activation_bytes(w);
    e.hbm_bytes = gpu_memory_bytes(w.gpu_name);
    if (s == 0 || e.total_bytes() > best.total_bytes()) best = e;
  }
  return best;
}

void require_memory_fit(const Workload& w) {
  if (w.what_if) return;
  const MemoryEstimate m = estimate_memory(w);
  if (m.fits()) return;
  throw InvalidInput(fmt::format(
      "{}: the job does not fit in GPU memory: stage {} needs at least {} per GPU with a "
      "distributed optimizer ({} without) on {} ({} per GPU): weights {}, gradients {}, optimizer "
      "state {} ({} sharded over dp = {}), activations {} ({} micro-batches in flight, recompute "
      "{}); use more GPUs (tp, pp), a smaller micro_batch or seq_len, or mark the file "
      "'what_if: true' to emulate it anyway",
      w.source.empty() ? w.name : w.source, m.stage, gib(m.total_distributed_bytes()),
      gib(m.total_bytes()), w.gpu_name, gib(m.hbm_bytes), gib(m.weights_bytes),
      gib(m.gradients_bytes), gib(m.optimizer_bytes), gib(m.optimizer_distributed_bytes),
      w.parallel.dp, gib(m.activations_bytes), m.inflight_microbatches,
      w.recompute == Recompute::kFull ? "full" : "none"));
}

std::vector<std::string> workload_warnings(const Workload& w) {
  std::vector<std::string> out;
  if (w.batch.micro_batches < w.parallel.pp) {
    out.push_back(fmt::format(
        "{}: batch.micro_batches ({}) < parallel.pp ({}): the 1F1B pipeline never fills, so "
        "stages sit idle most of the iteration; use at least {} micro-batches",
        w.source.empty() ? w.name : w.source, w.batch.micro_batches, w.parallel.pp, w.parallel.pp));
  }
  if (w.batch.nano_batches == 1) {
    out.push_back(fmt::format(
        "{}: one nano-batch per micro-batch (micro_batch {}): Kareus plans the clock only "
        "(Perseus-style); overlapping communication needs a micro-batch of at least 2",
        w.source.empty() ? w.name : w.source, w.batch.micro_batch));
  }
  return out;
}

}  // namespace kareus
