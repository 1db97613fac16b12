// Whole-iteration emulation under the job's pipeline schedule (synchronous or interleaved 1F1B,
// Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
// Megatron-LM", SC '21; the orders are include/kareus/schedule.h's). Each stage runs its order;
// a forward waits for the previous virtual stage's forward of its micro-batch plus the
// activation message, a backward for the next virtual stage's backward plus the gradient
// message. A GPU that waits burns static power only, which is how pipeline bubbles cost energy.
//
// Clock changes: when an instruction's SM clock differs from the previous instruction's on the
// same stage, the stage stalls `clock_switch_s` at static power once the instruction's inputs
// are ready, then runs it. This is the pessimistic reading of a locked-clock call that takes
// 10-20 ms (src/hw/catalogue.cc, [SWITCH]): a controller that applies clocks asynchronously
// (Perseus) instead keeps running at the old clock during the change, which costs less time
// but runs that part of the instruction at the wrong clock. The stall keeps the accounting
// exact and simple: every change on the critical path adds exactly clock_switch_s. The first
// instruction of an iteration never pays: its clock is set during the previous iteration's
// optimizer step, which the plan does not cover.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "kareus/emulator.h"
#include "kareus/error.h"

namespace kareus {

double IterationResult::energy_j_per_gpu_sum_over_stages() const {
  double e = 0;
  for (const auto& s : stages) e += s.energy_j_per_gpu;
  return e;
}

InstructionCost emulate_instruction(const PartitionSet& ps, const EmulatorModel& m,
                                    ExecutionMode mode, int stage, InstructionKind kind,
                                    const InstructionSettings& s) {
  if (s.sequential && mode == ExecutionMode::kOverlapped) {
    throw InternalError(
        "emulate_instruction: a sequential instruction is costed on the workload partitioned "
        "without nano-batches (emulate_iteration does so), not on the overlapped partitions");
  }
  InstructionCost cost;
  const auto& is = ps.instruction(stage, kind);
  const int default_sms = m.gpu().segment_collective_sms();
  std::map<std::string, int> seen;  // occurrences of each partition so far
  for (const auto& step : is.steps) {
    SimResult r;
    if (step.kind == Step::Kind::kSegment) {
      r = m.simulate_sequence(ps.segments[static_cast<std::size_t>(step.index)].kernels, s.freq_mhz,
                              default_sms);
    } else {
      if (mode != ExecutionMode::kOverlapped) {
        throw InternalError("sequential schedule reached an overlapped partition");
      }
      const auto& part = ps.partitions[static_cast<std::size_t>(step.index)];
      PartitionConfig c;
      const int occurrence = seen[part.key]++;
      auto it = s.partitions.find(part.key);
      auto mix = s.mixes.find(part.key);
      if (mix != s.mixes.end() && !mix->second.empty()) {
        int upto = 0;
        c = mix->second.back().config;
        for (const auto& share : mix->second) {
          upto += share.instances;
          if (occurrence < upto) {
            c = share.config;
            break;
          }
        }
      } else if (it != s.partitions.end()) {
        c = it->second;
      } else {
        c.sms = m.default_collective_sms(part.collective);
        c.slot = part.slots.front().name;
      }
      c.freq_mhz = s.freq_mhz;
      r = m.simulate_partition(part, c);
    }
    cost.time_s += r.time_s;
    cost.dynamic_energy_j += r.dynamic_energy_j;
  }
  return cost;
}

SimResult dp_grad_increment(const EmulatorModel& m, const DpGradOverlap& o) {
  const int fmax = m.gpu().p2p_reduction_freq_mhz(), sms = m.gpu().segment_collective_sms();
  SimResult inc = m.simulate_sequence(o.exposed.kernels, fmax, sms);
  if (o.no_overlap) return inc;
  const SimResult with = m.simulate_partition(o.overlapped, {fmax, sms, "first_bucket"});
  const SimResult alone = m.simulate_sequence(o.compute.kernels, fmax, sms);
  inc.time_s += std::max(0.0, with.time_s - alone.time_s);
  inc.dynamic_energy_j += std::max(0.0, with.dynamic_energy_j - alone.dynamic_energy_j);
  return inc;
}

namespace {

// Instruction costs, memoized per distinct settings: a pipeline repeats the same few
// instructions.
// An overlapped schedule may run single instructions sequentially (InstructionSettings::
// sequential): those are costed on the workload partitioned without nano-batches.
class CostMemo {
 public:
  CostMemo(const PartitionSet& ps, const PartitionSet* sequential_ps, const EmulatorModel& m,
           ExecutionMode mode)
      : ps_(ps), seq_ps_(sequential_ps), m_(m), mode_(mode) {}

  const InstructionCost& operator()(int s, InstructionKind k, const InstructionSettings& st) {
    const bool seq = st.sequential && mode_ == ExecutionMode::kOverlapped;
    if (seq && !seq_ps_) throw InternalError("sequential instruction without its partitions");
    std::string key =
        fmt::format("{}|{}|{}|{}", s, static_cast<int>(k), st.freq_mhz, seq ? "seq" : "ovl");
    for (const auto& [pk, c] : st.partitions) key += fmt::format("|{}:{}:{}", pk, c.sms, c.slot);
    for (const auto& [pk, shares] : st.mixes) {
      for (const auto& sh : shares) {
        key += fmt::format("|{}:{}:{}x{}", pk, sh.config.sms, sh.config.slot, sh.instances);
      }
    }
    auto it = memo_.find(key);
    if (it == memo_.end()) {
      it = memo_
               .emplace(key, seq ? emulate_instruction(*seq_ps_, m_, ExecutionMode::kSequential, s,
                                                       k, st)
                                 : emulate_instruction(ps_, m_, mode_, s, k, st))
               .first;
    }
    return it->second;
  }

 private:
  const PartitionSet& ps_;
  const PartitionSet* seq_ps_;
  const EmulatorModel& m_;
  ExecutionMode mode_;
  std::map<std::string, InstructionCost> memo_;
};

// Data-parallel communication that overlaps the pipeline (PartitionSet::dp_grad_overlaps and
// dp_param_gathers), costed at the settings the planner assumes for it: the maximum clock and
// NCCL's default CTAs. By virtual stage: what a chunk's last backward costs on top of its own
// time, and when the chunk's parameters have arrived for its first forward.
struct DpCosts {
  std::vector<InstructionCost> grad_increment;
  std::vector<double> params_ready_s;
  std::vector<double> gather_energy_j;  ///< dynamic, per GPU, on the chunk's stage
  bool empty() const { return grad_increment.empty() && params_ready_s.empty(); }
};

// One stage's progress through its order (Schedule::order).
struct StageState {
  const std::vector<ScheduledInstruction>* order = nullptr;
  std::size_t next = 0;  ///< index into order of the next instruction
  double clock = 0, dyn = 0, busy = 0;
  int last_freq = 0, changes = 0;
  std::vector<InstructionTiming> timing;
};

// The replay of every stage: instructions run in their stage's order as soon as their inputs
// have arrived.
class Replay {
 public:
  Replay(const Schedule& sched, double p2p_t, double p2p_e, double clock_switch_s,
         const DpCosts& dp, const std::vector<double>& stage_time_factor)
      : sched_(sched),
        dp_(dp),
        factor_(stage_time_factor),
        stages_(static_cast<std::size_t>(sched.stages())),
        end_(2 * static_cast<std::size_t>(sched.virtual_stages() * sched.microbatches()), -1),
        p2p_t_(p2p_t),
        p2p_e_(p2p_e),
        clock_switch_s_(clock_switch_s) {
    for (int s = 0; s < sched.stages(); ++s) {
      stages_[static_cast<std::size_t>(s)].order = &sched.order(s);
      // The position of each chunk's first forward and last backward on its stage.
      const auto& o = sched.order(s);
      for (std::size_t i = 0; i < o.size(); ++i) {
        const int vs = sched.virtual_stage(s, o[i].chunk);
        if (o[i].kind == InstructionKind::kForward && !first_fwd_.count(vs)) first_fwd_[vs] = i;
        if (o[i].kind == InstructionKind::kBackward) last_bwd_[vs] = i;
      }
    }
  }

  // Runs every stage until all are done; throws InternalError if the schedule deadlocks.
  std::vector<StageState>& run(const SettingsFn& settings, CostMemo& cost) {
    bool progress = true;
    while (progress) {
      progress = false;
      for (std::size_t s = 0; s < stages_.size(); ++s) progress |= advance(s, settings, cost);
    }
    for (const auto& st : stages_) {
      if (st.next != st.order->size()) {
        throw InternalError(fmt::format("{} schedule deadlocked", sched_.name()));
      }
    }
    return stages_;
  }

 private:
  // End time of an instruction, -1 while it has not run.
  double& end_of(const InstructionRef& r) {
    return end_[2 * static_cast<std::size_t>(r.virtual_stage * sched_.microbatches() +
                                             r.microbatch) +
                (r.kind == InstructionKind::kBackward ? 1 : 0)];
  }

  // Runs stage s's instructions until one waits for another stage; true if any ran.
  bool advance(std::size_t s, const SettingsFn& settings, CostMemo& cost) {
    StageState& st = stages_[s];
    bool progress = false;
    while (st.next < st.order->size()) {
      const ScheduledInstruction& x = (*st.order)[st.next];
      const InstructionRef me{x.kind, sched_.virtual_stage(static_cast<int>(s), x.chunk),
                              x.microbatch};
      double ready = st.clock;
      InstructionRef from;
      if (sched_.input_of(me, &from)) {
        const double prev = end_of(from);
        if (prev < 0) break;
        ready = std::max(ready, prev + p2p_t_);
      }
      const auto vsi = static_cast<std::size_t>(me.virtual_stage);
      if (!dp_.params_ready_s.empty() && first_fwd_.at(me.virtual_stage) == st.next) {
        ready = std::max(ready, dp_.params_ready_s[vsi]);
        st.dyn += dp_.gather_energy_j[vsi];
      }
      const InstructionSettings set = settings(me.virtual_stage, x.kind, x.microbatch);
      InstructionCost c = cost(me.virtual_stage, x.kind, set);
      if (!factor_.empty()) c.time_s *= factor_[s];
      const bool switches = st.last_freq != 0 && set.freq_mhz != st.last_freq;
      st.last_freq = set.freq_mhz;
      if (switches) ++st.changes;
      const double end = ready + (switches ? clock_switch_s_ : 0.0) + c.time_s;
      st.timing.push_back({x.kind, x.microbatch, set.freq_mhz, ready, end, switches, x.chunk});
      end_of(me) = end;
      st.clock = end;
      st.dyn += c.dynamic_energy_j;
      st.busy += c.time_s;
      if (sched_.sends(me)) st.dyn += p2p_e_;
      if (!dp_.grad_increment.empty() && last_bwd_.at(me.virtual_stage) == st.next) {
        // The stage's compute stream waits for the exposed part of the gradient reduction.
        st.clock += dp_.grad_increment[vsi].time_s;
        st.busy += dp_.grad_increment[vsi].time_s;
        st.dyn += dp_.grad_increment[vsi].dynamic_energy_j;
      }
      ++st.next;
      progress = true;
    }
    return progress;
  }

  const Schedule& sched_;
  const DpCosts& dp_;
  const std::vector<double>& factor_;                ///< per stage; empty: every stage as planned
  std::map<int, std::size_t> first_fwd_, last_bwd_;  ///< by virtual stage: index in its order
  std::vector<StageState> stages_;
  std::vector<double> end_;  ///< by (virtual stage, micro-batch, kind)
  double p2p_t_, p2p_e_, clock_switch_s_;
};

}  // namespace

IterationResult emulate_iteration(const Workload& w, const EmulatorModel& m, ExecutionMode mode,
                                  const SettingsFn& settings, double clock_switch_s,
                                  const std::vector<double>& stage_time_factor) {
  if (!(clock_switch_s >= 0)) {
    throw InvalidInput(fmt::format("clock switch time {} s: must be >= 0", clock_switch_s));
  }
  if (!stage_time_factor.empty() &&
      stage_time_factor.size() != static_cast<std::size_t>(w.parallel.pp)) {
    throw InvalidInput(fmt::format("stage slowdown: {} factors for {} pipeline stages",
                                   stage_time_factor.size(), w.parallel.pp));
  }
  for (const double x : stage_time_factor) {
    if (!(std::isfinite(x) && x > 0)) {
      throw InvalidInput(fmt::format("stage slowdown factor {}: must be finite and > 0", x));
    }
  }
  Workload wl = w;
  if (mode == ExecutionMode::kSequential) wl.batch.nano_batches = 1;
  const PartitionSet ps = partition_workload(wl);
  const int pp = w.parallel.pp;
  // Messages between stages and once-per-iteration reductions: the settings the planner assumes.
  const int fmax = m.gpu().p2p_reduction_freq_mhz(), sms = m.gpu().segment_collective_sms();
  const SimResult p2p = pp > 1 ? m.simulate_sequence({ps.graph.p2p}, fmax, sms) : SimResult{};
  std::optional<PartitionSet> seq_ps;
  if (mode == ExecutionMode::kOverlapped) {
    Workload seq = w;
    seq.batch.nano_batches = 1;
    seq_ps = partition_workload(seq);
  }
  CostMemo cost(ps, seq_ps ? &*seq_ps : nullptr, m, mode);
  const Schedule sched = w.schedule();
  DpCosts dp;
  if (!ps.dp_grad_overlaps.empty()) {
    dp.grad_increment.resize(static_cast<std::size_t>(sched.virtual_stages()));
    for (const auto& o : ps.dp_grad_overlaps) {
      const SimResult inc = dp_grad_increment(m, o);
      dp.grad_increment[static_cast<std::size_t>(o.stage)] = {inc.time_s, inc.dynamic_energy_j};
    }
  }
  if (!ps.dp_param_gathers.empty()) {
    // Each stage's DP stream gathers its chunks' parameters in chunk order from the start.
    dp.params_ready_s.assign(static_cast<std::size_t>(sched.virtual_stages()), 0);
    dp.gather_energy_j.assign(static_cast<std::size_t>(sched.virtual_stages()), 0);
    std::vector<double> stream(static_cast<std::size_t>(pp), 0);
    for (const auto& g : ps.dp_param_gathers) {
      const SimResult r = m.simulate_sequence(g.kernels, fmax, sms);
      double& t = stream[static_cast<std::size_t>(sched.stage_of(g.stage))];
      t += r.time_s;
      dp.params_ready_s[static_cast<std::size_t>(g.stage)] = t;
      dp.gather_energy_j[static_cast<std::size_t>(g.stage)] = r.dynamic_energy_j;
    }
  }
  Replay replay(sched, p2p.time_s, p2p.dynamic_energy_j, clock_switch_s, dp, stage_time_factor);
  std::vector<StageState>& stages = replay.run(settings, cost);
  // Once-per-iteration reductions after the last backward (DP gradients, tied embeddings).
  for (int idx : ps.iteration_segments) {
    const auto& seg = ps.segments[static_cast<std::size_t>(idx)];
    const SimResult r = m.simulate_sequence(seg.kernels, fmax, sms);
    auto& st = stages[static_cast<std::size_t>(w.parallel.stage_of(seg.stage))];
    st.clock += r.time_s;
    st.dyn += r.dynamic_energy_j;
    st.busy += r.time_s;
  }
  IterationResult res;
  for (const auto& st : stages) res.iteration_time_s = std::max(res.iteration_time_s, st.clock);
  const double gpus_per_stage = w.parallel.gpus_per_stage();
  for (int s = 0; s < pp; ++s) {
    auto& st = stages[static_cast<std::size_t>(s)];
    StageResult sr;
    sr.stage = s;
    sr.dynamic_energy_j_per_gpu = st.dyn;
    sr.energy_j_per_gpu = st.dyn + m.gpu().static_power_w * res.iteration_time_s;
    sr.busy_time_s = st.busy;
    sr.clock_changes = st.changes;
    sr.instructions = std::move(st.timing);
    res.energy_j += sr.energy_j_per_gpu * gpus_per_stage;
    res.stages.push_back(sr);
  }
  return res;
}

IterationResult emulate_iteration(const Workload& w, const EmulatorModel& m, ExecutionMode mode,
                                  const SettingsFn& settings) {
  return emulate_iteration(w, m, mode, settings, m.gpu().clock_switch_s);
}

IterationResult emulate_iteration(const Workload& w, const EmulatorModel& m, ExecutionMode mode,
                                  const SettingsFn& settings, double clock_switch_s) {
  return emulate_iteration(w, m, mode, settings, clock_switch_s, {});
}

IterationResult emulate_schedule(const Workload& w, const EmulatorModel& m,
                                 const std::string& schedule, int freq_mhz) {
  InstructionSettings st;
  st.freq_mhz = freq_mhz;
  auto fn = [st](int, InstructionKind, int) { return st; };
  // The schedules by name: Megatron-LM's sequential one, and nano-batch overlap.
  static const std::map<std::string, ExecutionMode> kSchedules = {
      {"megatron", ExecutionMode::kSequential}, {"nanobatch", ExecutionMode::kOverlapped}};
  const auto it = kSchedules.find(schedule);
  if (it == kSchedules.end()) {
    throw InvalidInput(
        fmt::format("unknown schedule '{}'; allowed: megatron, nanobatch", schedule));
  }
  if (it->second == ExecutionMode::kOverlapped && w.batch.nano_batches != 2) {
    throw InvalidInput("schedule 'nanobatch' needs batch.nano_batches: 2 in the workload");
  }
  return emulate_iteration(w, m, it->second, fn);
}

}  // namespace kareus
