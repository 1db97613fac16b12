// Whole-iteration emulation under the synchronous 1F1B pipeline schedule (Narayanan et al.,
// "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", SC '21):
// stage s runs min(pp-s-1, M) warm-up forwards, then alternates one forward and one backward,
// then drains the remaining backwards. F(s,m) waits for F(s-1,m) plus the activation message,
// B(s,m) for B(s+1,m) plus the gradient message. A GPU that waits burns static power only,
// which is how pipeline bubbles cost energy.
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

std::vector<std::pair<InstructionKind, int>> one_f_one_b_order(int stage, int stages, int mbs) {
  std::vector<std::pair<InstructionKind, int>> order;
  const int warmup = std::min(stages - stage - 1, mbs);
  int f = 0, b = 0;
  for (; f < warmup; ++f) order.push_back({InstructionKind::kForward, f});
  while (f < mbs) {
    order.push_back({InstructionKind::kForward, f++});
    order.push_back({InstructionKind::kBackward, b++});
  }
  while (b < mbs) order.push_back({InstructionKind::kBackward, b++});
  return order;
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

namespace {

// Instruction costs, memoized per distinct settings: 1F1B repeats the same few instructions.
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

// One stage's progress through its 1F1B order.
struct StageState {
  std::vector<std::pair<InstructionKind, int>> order;
  std::size_t next = 0;            ///< index into order of the next instruction
  std::vector<double> fend, bend;  ///< end of F/B per micro-batch, -1 while not yet scheduled
  double clock = 0, dyn = 0, busy = 0;
  int last_freq = 0, changes = 0;
  std::vector<InstructionTiming> timing;
};

// The 1F1B replay of every stage: instructions run as soon as their inputs have arrived.
class Replay {
 public:
  Replay(int pp, int mbs, double p2p_t, double p2p_e, double clock_switch_s)
      : stages_(static_cast<std::size_t>(pp)),
        p2p_t_(p2p_t),
        p2p_e_(p2p_e),
        clock_switch_s_(clock_switch_s) {
    for (int s = 0; s < pp; ++s) {
      auto& st = stages_[static_cast<std::size_t>(s)];
      st.order = one_f_one_b_order(s, pp, mbs);
      st.fend.assign(static_cast<std::size_t>(mbs), -1);
      st.bend.assign(static_cast<std::size_t>(mbs), -1);
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
      if (st.next != st.order.size()) throw InternalError("1F1B schedule deadlocked");
    }
    return stages_;
  }

 private:
  // When the inputs of stage s's next instruction are ready, or -1 while they are not.
  double ready_time(std::size_t s) const {
    const StageState& st = stages_[s];
    const auto [kind, mb] = st.order[st.next];
    const auto m = static_cast<std::size_t>(mb);
    if (kind == InstructionKind::kForward && s > 0) {
      const double prev = stages_[s - 1].fend[m];
      return prev < 0 ? -1 : std::max(st.clock, prev + p2p_t_);
    }
    if (kind == InstructionKind::kBackward && s + 1 < stages_.size()) {
      const double prev = stages_[s + 1].bend[m];
      return prev < 0 ? -1 : std::max(st.clock, prev + p2p_t_);
    }
    return st.clock;
  }

  // Runs stage s's instructions until one waits for another stage; true if any ran.
  bool advance(std::size_t s, const SettingsFn& settings, CostMemo& cost) {
    StageState& st = stages_[s];
    bool progress = false;
    while (st.next < st.order.size()) {
      const double ready = ready_time(s);
      if (ready < 0) break;
      const auto [kind, mb] = st.order[st.next];
      const InstructionSettings set = settings(static_cast<int>(s), kind, mb);
      const InstructionCost& c = cost(static_cast<int>(s), kind, set);
      const bool switches = st.last_freq != 0 && set.freq_mhz != st.last_freq;
      st.last_freq = set.freq_mhz;
      if (switches) ++st.changes;
      const double end = ready + (switches ? clock_switch_s_ : 0.0) + c.time_s;
      st.timing.push_back({kind, mb, set.freq_mhz, ready, end, switches});
      (kind == InstructionKind::kForward ? st.fend : st.bend)[static_cast<std::size_t>(mb)] = end;
      st.clock = end;
      st.dyn += c.dynamic_energy_j;
      st.busy += c.time_s;
      const bool sends = kind == InstructionKind::kForward ? s + 1 < stages_.size() : s > 0;
      if (sends) st.dyn += p2p_e_;
      ++st.next;
      progress = true;
    }
    return progress;
  }

  std::vector<StageState> stages_;
  double p2p_t_, p2p_e_, clock_switch_s_;
};

}  // namespace

IterationResult emulate_iteration(const Workload& w, const EmulatorModel& m, ExecutionMode mode,
                                  const SettingsFn& settings, double clock_switch_s) {
  if (!(clock_switch_s >= 0)) {
    throw InvalidInput(fmt::format("clock switch time {} s: must be >= 0", clock_switch_s));
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
  Replay replay(pp, w.batch.micro_batches, p2p.time_s, p2p.dynamic_energy_j, clock_switch_s);
  std::vector<StageState>& stages = replay.run(settings, cost);
  // Once-per-iteration reductions after the last backward (DP gradients, tied embeddings).
  for (int idx : ps.iteration_segments) {
    const auto& seg = ps.segments[static_cast<std::size_t>(idx)];
    const SimResult r = m.simulate_sequence(seg.kernels, fmax, sms);
    auto& st = stages[static_cast<std::size_t>(seg.stage)];
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
