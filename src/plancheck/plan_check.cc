// Validation of a plan against its workload (include/kareus/plan_check.h): digest, identity,
// per-stage instruction order, clocks and every partition setting. Split from the plan format
// (src/plan/plan.cc, kareus_plan) because it needs the workload and the partitioner.
#include "kareus/plan_check.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <utility>
#include <vector>

#include "kareus/error.h"
#include "kareus/hash.h"
#include "kareus/schedule.h"
#include "kareus/search_space.h"  // default_collective_sms (inline), for the messages

namespace kareus {

namespace {

std::string index_path(const std::string& path, std::size_t i) {
  return fmt::format("{}[{}]", path, i);
}

// Names the file and the JSON path of the field that fails a check, as the parser does.
class Reader {
 public:
  explicit Reader(const std::string& source) : source_(source) {}
  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw_plan_field_error(source_, path, what);
  }

 private:
  const std::string& source_;
};

}  // namespace

std::string workload_digest(const Workload& w) { return workload_digest(w, partition_workload(w)); }

std::string workload_digest(const Workload& w, const PartitionSet& ps) {
  std::string text =
      fmt::format("{}|{}|{}|{}|{}|{}", w.gpu_name, w.parallel.pp, w.batch.micro_batches,
                  w.cluster.gpus(), w.parallel.dp, w.batch.nano_batches);
  for (int l : w.parallel.stage_layers) text += fmt::format("|{}", l);
  // Interleaving changes the order and the chunks; 1F1B digests stay what they were.
  if (w.parallel.virtual_pipeline > 1) text += fmt::format("|v{}", w.parallel.virtual_pipeline);
  for (const auto& p : ps.partitions) text += "|" + p.key + ":" + p.signature;
  return fmt::format("{:016x}", fnv1a(text));
}

namespace {

// Checks one partition setting (top level or a mix entry) against the workload's partition.
void check_setting(const Reader& r, const std::string& path, const Partition& part, int sms,
                   const std::string& slot, const std::string& slot_op, int slot_op_index) {
  // One rule for SM counts, shared with the search space and `kareus profile`
  // (sms_allowed, src/partition/partitioner.cc).
  if (!sms_allowed(part, sms)) {
    r.fail(path + ".sms",
           fmt::format("{}: partition {} allows {}; the search default for this {} is {}", sms,
                       part.key, allowed_sms_text(part), to_string(part.collective.collective),
                       fmt::join(default_collective_sms(part.collective.collective), ",")));
  }
  const Slot* found = nullptr;
  for (const auto& s : part.slots) {
    if (s.name == slot) found = &s;
  }
  if (!found) {
    r.fail(path + ".slot", fmt::format("'{}': partition {} has launch slots {}", slot, part.key,
                                       fmt::join(part.slot_names(), ", ")));
  }
  const auto& op = part.compute_ops.at(static_cast<std::size_t>(found->op_index));
  if (slot_op != op.name || slot_op_index != found->op_index) {
    r.fail(path + ".launch_before",
           fmt::format("slot '{}' of {} launches before op '{}' (index {}), not '{}' (index {})",
                       slot, part.key, op.name, found->op_index, slot_op, slot_op_index));
  }
}

// Digest, GPU, GPU count, rank layout and stage count against the workload.
void check_plan_identity(const Reader& r, const Plan& p, const Workload& w,
                         const std::string& digest) {
  if (p.workload_digest != digest) {
    r.fail(
        "workload.digest",
        fmt::format("the plan was made for workload '{}' (digest {}), not for {} (digest {}); "
                    "plan this workload with `kareus plan`",
                    p.workload, p.workload_digest, w.source.empty() ? w.name : w.source, digest));
  }
  if (p.gpu != w.gpu_name) {
    r.fail("workload.gpu", fmt::format("'{}': the workload runs on '{}'", p.gpu, w.gpu_name));
  }
  if (p.gpus != w.cluster.gpus()) {
    r.fail("workload.gpus", fmt::format("{}: the workload has {} GPUs", p.gpus, w.cluster.gpus()));
  }
  const RankLayout want{w.parallel.tp, w.parallel.cp, w.parallel.dp, w.parallel.pp};
  if (!(p.layout == want)) {
    r.fail("parallel", fmt::format("tp={} cp={} dp={} pp={}: the workload has tp={} cp={} dp={} "
                                   "pp={}",
                                   p.layout.tp, p.layout.cp, p.layout.dp, p.layout.pp, want.tp,
                                   want.cp, want.dp, want.pp));
  }
  if (p.chunks != w.parallel.virtual_pipeline) {
    r.fail("parallel.virtual_pipeline",
           fmt::format("{}: the workload runs {} model chunks per stage", p.chunks,
                       w.parallel.virtual_pipeline));
  }
  if (static_cast<int>(p.stages.size()) != w.parallel.pp) {
    r.fail("stages",
           fmt::format("{} stages: the workload has pp = {}", p.stages.size(), w.parallel.pp));
  }
}

// One partition's setting in an instruction: SMs, slot, recompute flag, instances, mix.
void check_partition(const Reader& r, const std::string& pp_path, const PlanPartition& c,
                     const Partition& part, InstructionKind kind, int count) {
  check_setting(r, pp_path, part, c.sms, c.slot, c.slot_op, c.slot_op_index);
  const bool recompute =
      kind == InstructionKind::kBackward && part.direction == InstructionKind::kForward;
  if (c.recompute != recompute) {
    r.fail(pp_path + ".recompute",
           fmt::format("{}: partition {} in a {} instruction is {}", c.recompute, part.key,
                       to_string(kind),
                       recompute ? "a recomputed forward block (true)" : "not recomputed (false)"));
  }
  if (c.instances != count) {
    r.fail(pp_path + ".instances",
           fmt::format("{}: the instruction runs {} instances", c.instances, count));
  }
  int next = 0;
  for (std::size_t mi = 0; mi < c.mix.size(); ++mi) {
    const auto& e = c.mix[mi];
    const std::string mp = index_path(pp_path + ".mix", mi);
    check_setting(r, mp, part, e.sms, e.slot, e.slot_op, e.slot_op_index);
    if (e.first_instance != next || e.instances < 1) {
      r.fail(mp, fmt::format("instances {}..{}: mix entries cover the instances in "
                             "execution order, this one must start at {} with at least 1",
                             e.first_instance, e.first_instance + e.instances - 1, next));
    }
    next += e.instances;
  }
  if (!c.mix.empty() && next != count) {
    r.fail(pp_path + ".mix",
           fmt::format("covers {} instances: the instruction runs {}", next, count));
  }
}

// The partitions of an overlapped instruction: exactly the workload's, each set validly.
void check_instruction_partitions(const Reader& r, const std::string& ip, const PlanInstruction& in,
                                  const PartitionSet& ps, int stage) {
  // The instruction's partitions and their instance counts, in execution order.
  std::map<std::string, int> count;
  std::vector<std::string> keys;
  for (const auto& step : ps.instruction(stage, in.kind).steps) {
    if (step.kind != Step::Kind::kPartition) continue;
    const auto& key = ps.partitions[static_cast<std::size_t>(step.index)].key;
    if (count[key]++ == 0) keys.push_back(key);
  }
  for (const auto& [key, c] : in.partitions) {
    if (!count.count(key)) {
      r.fail(ip + ".partitions." + key, fmt::format("unknown partition; this {} instruction has {}",
                                                    to_string(in.kind), fmt::join(keys, ", ")));
    }
  }
  for (const auto& key : keys) {
    auto it = in.partitions.find(key);
    const std::string pp_path = ip + ".partitions." + key;
    if (it == in.partitions.end()) r.fail(pp_path, "missing (every partition needs a setting)");
    check_partition(r, pp_path, it->second, ps.partition(key), in.kind, count[key]);
  }
}

// An instruction's place in the schedule's order, its clock and its clock_switch flag.
void check_instruction_clock(const Reader& r, const std::string& ip, const PlanInstruction& in,
                             const PlanInstruction* prev, const ScheduledInstruction& slot,
                             const Schedule& sched, const GpuSpec& gpu) {
  if (in.kind != slot.kind || in.microbatch != slot.microbatch || in.chunk != slot.chunk) {
    r.fail(ip, fmt::format("{} of micro-batch {} (chunk {}): the {} schedule runs {} of "
                           "micro-batch {} (chunk {}) here",
                           to_string(in.kind), in.microbatch, in.chunk, sched.name(),
                           to_string(slot.kind), slot.microbatch, slot.chunk));
  }
  if (!gpu.supports_freq(in.freq_mhz)) {
    r.fail(ip + ".freq_mhz",
           fmt::format("{}: {} supports {}..{} MHz in {} MHz steps", in.freq_mhz, gpu.name,
                       gpu.min_freq_mhz, gpu.max_freq_mhz, gpu.freq_step_mhz));
  }
  // clock_switch and clock_changes are derived from the freq_mhz sequence; the controller and
  // the prediction both rely on them agreeing with it. Checked after the clocks themselves, so
  // that a bad clock is reported as such.
  const bool switches = prev && prev->freq_mhz != in.freq_mhz;
  if (in.clock_switch != switches) {
    r.fail(ip + ".clock_switch",
           prev ? fmt::format("{}: freq_mhz {} {} the previous instruction's {}: expected {}",
                              in.clock_switch, in.freq_mhz, switches ? "differs from" : "equals",
                              prev->freq_mhz, switches)
                : fmt::format("{}: the stage's first instruction never switches: expected "
                              "false",
                              in.clock_switch));
  }
}

void check_stage(const Reader& r, const Plan& p, int s, const Workload& w, const PartitionSet& ps) {
  const PlanStage& st = p.stages[static_cast<std::size_t>(s)];
  const std::string sp = index_path("stages", static_cast<std::size_t>(s));
  const Schedule sched = w.schedule();
  const int mbs = w.batch.micro_batches * w.parallel.virtual_pipeline;
  if (st.stage != s) r.fail(sp + ".stage", fmt::format("{}: expected {}", st.stage, s));
  if (st.ranks != p.layout.stage_ranks(s)) {
    r.fail(sp + ".ranks",
           fmt::format("[{}]: stage {} is ranks [{}] (order {})", fmt::join(st.ranks, ","), s,
                       fmt::join(p.layout.stage_ranks(s), ","), RankLayout::kOrder));
  }
  const auto& order = sched.order(s);
  if (st.instructions.size() != order.size()) {
    r.fail(sp + ".instructions",
           fmt::format("{} instructions: stage {} of the workload's {} schedule has {} ({} "
                       "forward and {} backward)",
                       st.instructions.size(), s, sched.name(), order.size(), mbs, mbs));
  }
  for (std::size_t i = 0; i < order.size(); ++i) {
    const PlanInstruction& in = st.instructions[i];
    const std::string ip = index_path(sp + ".instructions", i);
    const PlanInstruction* prev = i == 0 ? nullptr : &st.instructions[i - 1];
    check_instruction_clock(r, ip, in, prev, order[i], sched, w.gpu());
    if (p.execution == ExecutionMode::kSequential || in.sequential) {
      if (!in.partitions.empty()) {
        r.fail(ip + ".partitions",
               p.execution == ExecutionMode::kSequential
                   ? "a sequential plan runs no partitions: expected {}"
                   : "a sequential instruction runs no partitions: expected {}");
      }
      continue;
    }
    check_instruction_partitions(r, ip, in, ps, sched.virtual_stage(s, in.chunk));
  }
  const int changes = static_cast<int>(st.clock_runs().size()) - (st.instructions.empty() ? 0 : 1);
  if (st.clock_changes != changes) {
    r.fail(sp + ".clock_changes",
           fmt::format("{}: the stage's freq_mhz sequence changes {} times: expected {}",
                       st.clock_changes, changes, changes));
  }
}

}  // namespace

void validate_plan(const Plan& p, const Workload& w, const std::string& source) {
  const Reader r(source);
  const PartitionSet ps = partition_workload(w);
  check_plan_identity(r, p, w, workload_digest(w, ps));
  for (int s = 0; s < w.parallel.pp; ++s) check_stage(r, p, s, w, ps);
}

Plan load_plan(const std::string& path, const Workload& w) {
  Plan p = load_plan(path);
  validate_plan(p, w, path);
  return p;
}

}  // namespace kareus
