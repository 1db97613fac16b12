// `kareus workload show FILE [--json]`: the partitions and segments of a workload and the
// memory one GPU needs (src/workload/memory.cc).
#include <fmt/format.h>

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "commands.h"
#include "kareus/instruction_settings.h"
#include "kareus/partition.h"
#include "kareus/table.h"

namespace kareus::cli {
namespace {

// The name a trace row uses for a segment (src/profiler/trace_profiler.cc looks this up first,
// then the bare name).
std::string segment_trace_name(const Segment& s) {
  return fmt::format("{}@{}/{}", s.name, s.stage, s.instruction);
}

nlohmann::json kernel_json(const Kernel& k) {
  nlohmann::json j = {
      {"name", k.name},     {"kind", to_string(k.kind)},  {"flops", k.flops},
      {"bytes", k.bytes()}, {"bytes_read", k.bytes_read}, {"bytes_written", k.bytes_written}};
  if (k.kind == OpKind::kGemm) j["shape"] = {k.m, k.n, k.k};
  if (k.groups > 1) j["groups"] = k.groups;
  if (k.is_collective()) {
    j["collective"] = to_string(k.collective);
    j["group"] = to_string(k.group);
    j["group_size"] = k.group_size;
    j["payload_bytes"] = k.payload_bytes;
    j["wire_bytes"] = k.wire_bytes();
    j["inter_node"] = k.inter_node;
    if (k.collective == CollectiveKind::kAllToAll) {
      j["node_ranks"] = k.node_ranks;
      j["copy_engine"] = k.copy_engine;
    }
  }
  return j;
}

nlohmann::json workload_json(const Workload& w, const PartitionSet& ps) {
  nlohmann::json j;
  j["workload"] = w.name;
  j["gpu"] = w.gpu_name;
  j["gpus"] = w.cluster.gpus();
  j["model_flops_per_iteration"] = ps.graph.model_flops_per_iteration;
  j["hardware_flops_per_iteration"] = ps.graph.hardware_flops_per_iteration;
  const Schedule sched = w.schedule();
  j["schedule"] = {{"name", sched.name()},
                   {"virtual_pipeline", sched.chunks()},
                   {"ideal_bubble_fraction", sched.bubble_fraction()}};
  j["partitions"] = nlohmann::json::array();
  for (const auto& p : ps.partitions) {
    nlohmann::json pj;
    pj["key"] = p.key;
    pj["instruction"] = to_string(p.direction);
    pj["signature"] = p.signature;
    pj["repeats"] = p.repeats();
    pj["collective"] = {{"kind", to_string(p.collective.collective)},
                        {"group", to_string(p.collective.group)},
                        {"bytes", p.collective.payload_bytes},
                        {"group_size", p.collective.group_size}};
    // Under sequence parallelism: what the communication stream runs after the collective.
    if (!p.comm_tail.empty()) {
      pj["comm_tail"] = nlohmann::json::array();
      for (const auto& k : p.comm_tail) pj["comm_tail"].push_back(kernel_json(k));
    }
    pj["launch_slots"] = p.slot_names();
    pj["copy_engine"] = copy_engine_eligible(p);
    pj["compute_ops"] = nlohmann::json::array();
    for (const auto& k : p.compute_ops) pj["compute_ops"].push_back(kernel_json(k));
    pj["compute_flops"] = p.compute_flops();
    pj["occurrences"] = nlohmann::json::array();
    for (const auto& o : p.occurrences) {
      pj["occurrences"].push_back(
          {{"stage", o.stage}, {"instruction", to_string(o.instruction)}, {"count", o.count}});
    }
    j["partitions"].push_back(pj);
  }
  const MemoryEstimate m = estimate_memory(w);
  j["memory"] = {{"stage", m.stage},
                 {"parameters", m.parameters},
                 {"expert_parameters", m.expert_parameters},
                 {"weights_bytes", m.weights_bytes},
                 {"gradients_bytes", m.gradients_bytes},
                 {"optimizer_bytes", m.optimizer_bytes},
                 {"optimizer_distributed_bytes", m.optimizer_distributed_bytes},
                 {"activations_bytes", m.activations_bytes},
                 {"inflight_microbatches", m.inflight_microbatches},
                 {"total_bytes", m.total_bytes()},
                 {"total_distributed_bytes", m.total_distributed_bytes()},
                 {"hbm_bytes", m.hbm_bytes},
                 {"fits", m.fits()},
                 {"what_if", w.what_if}};
  j["warnings"] = workload_warnings(w);
  j["dp_collectives"] = nlohmann::json::array();
  for (std::size_t i = 0; i < ps.dp_grad_overlaps.size(); ++i) {
    const auto& o = ps.dp_grad_overlaps[i];
    nlohmann::json dj = {{"stage", o.stage},
                         {"compute_trace_name", segment_trace_name(o.compute)},
                         {"last_bucket_trace_name", segment_trace_name(o.exposed)}};
    if (!o.no_overlap) dj["partition"] = o.overlapped.key;
    if (i < ps.dp_param_gathers.size()) {
      dj["param_allgather_trace_name"] = segment_trace_name(ps.dp_param_gathers[i]);
    }
    j["dp_collectives"].push_back(std::move(dj));
  }
  j["segments"] = nlohmann::json::array();
  for (const auto& s : ps.segments) {
    nlohmann::json sj = {{"name", s.name},
                         {"stage", s.stage},
                         {"instruction", s.instruction},
                         {"trace_name", segment_trace_name(s)}};
    sj["kernels"] = nlohmann::json::array();
    for (const auto& k : s.kernels) sj["kernels"].push_back(kernel_json(k));
    j["segments"].push_back(sj);
  }
  return j;
}

std::string gib(double bytes) { return fmt::format("{:.2f} GiB", bytes / (1024.0 * 1024 * 1024)); }

// Per-GPU memory of the stage that needs the most (a lower bound; memory.cc cites the formulas).
std::string memory_text(const Workload& w) {
  const MemoryEstimate m = estimate_memory(w);
  TextTable t({"per GPU (stage " + std::to_string(m.stage) + ")", "memory", "formula"});
  t.add_row({"weights (bf16)", gib(m.weights_bytes),
             fmt::format("2 B x {:.3g} parameters", m.parameters)});
  t.add_row({"gradients (bf16)", gib(m.gradients_bytes), "2 B/parameter"});
  t.add_row(
      {"optimizer state (Adam, fp32)", gib(m.optimizer_bytes), "12 B/parameter (ZeRO, SC '20)"});
  t.add_row({"  with distributed optimizer", gib(m.optimizer_distributed_bytes),
             w.model.moe()
                 ? fmt::format("12 B/parameter / dp {}; routed experts ({:.3g} "
                               "parameters, {} of {} per GPU) / expert dp {}",
                               w.parallel.dp, m.expert_parameters, w.model.experts / w.parallel.ep,
                               w.model.experts, w.parallel.expert_dp())
                 : fmt::format("12 B/parameter / dp {}", w.parallel.dp)});
  t.add_row(
      {"activations", gib(m.activations_bytes),
       fmt::format("{} micro-batches in flight, recompute {} (Korthikanti et al. '22)",
                   m.inflight_microbatches, w.recompute == Recompute::kFull ? "full" : "none")});
  t.add_row({"total", gib(m.total_bytes()), "without distributed optimizer"});
  t.add_row({"total", gib(m.total_distributed_bytes()), "with distributed optimizer"});
  t.add_row({"GPU memory", gib(m.hbm_bytes), w.gpu_name});
  std::string out =
      "memory per GPU (lower bound: no CUDA context, NCCL buffers or fragmentation):\n";
  out += t.render();
  out += m.fits() ? "fits\n"
                  : (w.what_if ? "does NOT fit: a what-if emulation (what_if: true)\n"
                               : "does NOT fit\n");
  return out;
}

std::string workload_text(const Workload& w, const PartitionSet& ps) {
  std::string out = fmt::format(
      "workload {}: {} on {} x {} ({} GPUs), tp {} cp {} pp {} dp {}{}{}, micro-batch {} x seq "
      "{}, {} micro-batches, {} nano-batches\n",
      w.name, w.model.name, w.cluster.nodes, w.cluster.gpus_per_node, w.cluster.gpus(),
      w.parallel.tp, w.parallel.cp, w.parallel.pp, w.parallel.dp,
      w.parallel.sequence_parallel ? " (sequence parallel)" : "",
      w.model.moe() ? fmt::format(" ep {} (expert dp {})", w.parallel.ep, w.parallel.expert_dp())
                    : std::string(),
      w.batch.micro_batch, w.batch.seq_len, w.batch.micro_batches, w.batch.nano_batches);
  if (w.model.moe()) {
    const auto& m = w.model;
    out += fmt::format(
        "mixture of experts: {} routed experts (top {}, FFN {}), {} shared, {} leading dense "
        "layers, {} experts per GPU, load imbalance {:g}, NCCL {}.{}\n",
        m.experts, m.experts_per_token, m.expert_ffn_hidden, m.shared_experts, m.dense_layers,
        m.experts / w.parallel.ep, m.expert_imbalance, w.cluster.nccl_version / 100,
        w.cluster.nccl_version % 100);
  }
  const Schedule sched = w.schedule();
  out += fmt::format(
      "schedule {}{}: ideal bubble (p-1)/(v*m) = {:.1f}% of the compute\n", sched.name(),
      sched.interleaved() ? fmt::format(", {} model chunks per stage", sched.chunks())
                          : std::string(),
      100 * sched.bubble_fraction());
  out += fmt::format("model FLOPs per iteration {}, hardware FLOPs (with recompute) {}\n\n",
                     human_flops(ps.graph.model_flops_per_iteration),
                     human_flops(ps.graph.hardware_flops_per_iteration));
  out += memory_text(w) + "\n";
  TextTable t(
      {"partition", "collective", "payload", "SMs", "launch slots", "repeats", "compute FLOPs"});
  for (const auto& p : ps.partitions) {
    std::string slots;
    for (const auto& s : p.slot_names()) slots += (slots.empty() ? "" : ",") + s;
    // A chain shows every collective in it, e.g. "reducescatter+norm+allgather tp/4".
    std::string chain = to_string(p.collective.collective);
    bool kernels = false;
    for (const auto& k : p.comm_tail) {
      if (!k.is_collective()) {
        if (!kernels) chain += "+norm";
        kernels = true;
        continue;
      }
      kernels = false;
      chain.append("+").append(to_string(k.collective));
    }
    t.add_row(
        {p.key,
         fmt::format("{} {}/{}", chain, to_string(p.collective.group), p.collective.group_size),
         human_bytes(p.collective.payload_bytes),
         copy_engine_eligible(p) ? fmt::format("0 (CE), 1..{}", kMaxCollectiveSms)
                                 : fmt::format("1..{}", kMaxCollectiveSms),
         slots, std::to_string(p.repeats()), human_flops(p.compute_flops())});
  }
  out += t.render();
  out += "\nsegments (run without overlap):\n";
  TextTable s({"segment", "stage", "instruction", "trace name", "kernels"});
  for (const auto& seg : ps.segments) {
    std::string names;
    for (const auto& k : seg.kernels) names += (names.empty() ? "" : ",") + k.name;
    if (names.size() > 60) names = names.substr(0, 57) + "...";
    s.add_row(
        {seg.name, std::to_string(seg.stage), seg.instruction, segment_trace_name(seg), names});
  }
  out += s.render();
  if (!ps.dp_grad_overlaps.empty()) {
    // Measured at the maximum clock with NCCL's default CTAs (docs/design.md).
    out +=
        "\ndata-parallel collectives that overlap (measured at the maximum clock, NCCL's "
        "default CTAs):\n";
    TextTable d({"virtual stage", "gradient reduce-scatter partition", "slot", "compute alone",
                 "last bucket", "parameter all-gather"});
    for (std::size_t i = 0; i < ps.dp_grad_overlaps.size(); ++i) {
      const auto& o = ps.dp_grad_overlaps[i];
      d.add_row(
          {std::to_string(o.stage), o.no_overlap ? "- (one bucket)" : o.overlapped.key,
           o.no_overlap ? "-" : "first_bucket", segment_trace_name(o.compute),
           segment_trace_name(o.exposed),
           i < ps.dp_param_gathers.size() ? segment_trace_name(ps.dp_param_gathers[i]) : "-"});
    }
    out += d.render();
  }
  out +=
      "\na trace (--backend trace) for planning needs a row per partition configuration the "
      "search measures and, per segment, a row at every clock: partition column = the trace "
      "name above, sms 0, slot -\n";
  return out;
}

}  // namespace

void register_workload(CLI::App& app, Action& action) {
  auto* wl = app.add_subcommand("workload", "Inspect a workload file");
  wl->require_subcommand(1);
  auto* show = wl->add_subcommand("show", "Show the partitions and segments of a workload");
  // Owned by the subcommand's callback.
  struct Args {
    std::string file;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  show->add_option("FILE", args->file, "workload YAML file")->required();
  show->add_flag("--json", args->json, "machine-readable output");
  show->callback([&action, args] {
    action = [args] {
      const Workload w = load_job(args->file);
      const PartitionSet ps = partition_workload(w);
      if (args->json) {
        std::cout << workload_json(w, ps).dump(2) << "\n";
      } else {
        std::cout << workload_text(w, ps);
      }
      return 0;
    };
  });
}

}  // namespace kareus::cli
