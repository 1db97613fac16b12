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

#include <map>

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
  InstructionCost cost;
  const auto& is = ps.instruction(stage, kind);
  const int default_sms = m.gpu().nccl_default_channels;
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

IterationResult emulate_iteration(const Workload& w, const EmulatorModel& m, ExecutionMode mode,
                                  const SettingsFn& settings) {
  return emulate_iteration(w, m, mode, settings, m.gpu().clock_switch_s);
}

IterationResult emulate_iteration(const Workload& w, const EmulatorModel& m, ExecutionMode mode,
                                  const SettingsFn& settings, double clock_switch_s) {
  if (!(clock_switch_s >= 0)) {
    throw InvalidInput(fmt::format("clock switch time {} s: must be >= 0", clock_switch_s));
  }
  Workload wl = w;
  if (mode == ExecutionMode::kSequential) wl.batch.nano_batches = 1;
  const PartitionSet ps = partition_workload(wl);
  const int pp = w.parallel.pp;
  const int mbs = w.batch.micro_batches;
  // Messages between stages and once-per-iteration reductions run at the maximum clock with
  // NCCL's default CTAs, as the planner assumes (src/plan/planner.cc).
  const int fmax = m.gpu().max_freq_mhz, sms = m.gpu().nccl_default_channels;
  const SimResult p2p = pp > 1 ? m.simulate_sequence({ps.graph.p2p}, fmax, sms) : SimResult{};
  const double p2p_t = p2p.time_s, p2p_e = p2p.dynamic_energy_j;

  // Instruction costs, memoized per distinct settings.
  std::map<std::string, InstructionCost> memo;
  auto cost_of = [&](int s, InstructionKind k, const InstructionSettings& st) {
    std::string key = fmt::format("{}|{}|{}", s, static_cast<int>(k), st.freq_mhz);
    for (const auto& [pk, c] : st.partitions) key += fmt::format("|{}:{}:{}", pk, c.sms, c.slot);
    for (const auto& [pk, shares] : st.mixes) {
      for (const auto& sh : shares) {
        key += fmt::format("|{}:{}:{}x{}", pk, sh.config.sms, sh.config.slot, sh.instances);
      }
    }
    auto it = memo.find(key);
    if (it == memo.end()) it = memo.emplace(key, emulate_instruction(ps, m, mode, s, k, st)).first;
    return it->second;
  };

  std::vector<std::vector<std::pair<InstructionKind, int>>> order(static_cast<std::size_t>(pp));
  for (int s = 0; s < pp; ++s) order[static_cast<std::size_t>(s)] = one_f_one_b_order(s, pp, mbs);
  // end[s][kind][mb], -1 while not yet scheduled.
  std::vector<std::vector<double>> fend(pp, std::vector<double>(mbs, -1)),
      bend(pp, std::vector<double>(mbs, -1));
  std::vector<std::size_t> next(pp, 0);
  std::vector<double> clock(pp, 0.0), dyn(pp, 0.0), busy(pp, 0.0);
  std::vector<int> last_freq(pp, 0), changes(pp, 0);
  std::vector<std::vector<InstructionTiming>> timing(static_cast<std::size_t>(pp));
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < pp; ++s) {
      auto& ns = next[static_cast<std::size_t>(s)];
      const auto& ord = order[static_cast<std::size_t>(s)];
      while (ns < ord.size()) {
        const auto [kind, mb] = ord[ns];
        double ready = clock[s];
        if (kind == InstructionKind::kForward && s > 0) {
          if (fend[s - 1][mb] < 0) break;
          ready = std::max(ready, fend[s - 1][mb] + p2p_t);
        }
        if (kind == InstructionKind::kBackward && s < pp - 1) {
          if (bend[s + 1][mb] < 0) break;
          ready = std::max(ready, bend[s + 1][mb] + p2p_t);
        }
        const InstructionSettings st = settings(s, kind, mb);
        const InstructionCost c = cost_of(s, kind, st);
        const bool switches = last_freq[s] != 0 && st.freq_mhz != last_freq[s];
        last_freq[s] = st.freq_mhz;
        if (switches) ++changes[s];
        const double end = ready + (switches ? clock_switch_s : 0.0) + c.time_s;
        timing[static_cast<std::size_t>(s)].push_back(
            {kind, mb, st.freq_mhz, ready, end, switches});
        (kind == InstructionKind::kForward ? fend : bend)[s][mb] = end;
        clock[s] = end;
        dyn[s] += c.dynamic_energy_j;
        busy[s] += c.time_s;
        const bool sends = kind == InstructionKind::kForward ? s < pp - 1 : s > 0;
        if (sends) dyn[s] += p2p_e;
        ++ns;
        progress = true;
      }
    }
  }
  for (int s = 0; s < pp; ++s) {
    if (next[s] != order[s].size()) throw InternalError("1F1B schedule deadlocked");
  }
  // Once-per-iteration reductions after the last backward (DP gradients, tied embeddings).
  for (int idx : ps.iteration_segments) {
    const auto& seg = ps.segments[static_cast<std::size_t>(idx)];
    const SimResult r = m.simulate_sequence(seg.kernels, fmax, sms);
    clock[seg.stage] += r.time_s;
    dyn[seg.stage] += r.dynamic_energy_j;
    busy[seg.stage] += r.time_s;
  }
  IterationResult res;
  for (int s = 0; s < pp; ++s) res.iteration_time_s = std::max(res.iteration_time_s, clock[s]);
  const double gpus_per_stage = static_cast<double>(w.parallel.tp) * w.parallel.cp * w.parallel.dp;
  for (int s = 0; s < pp; ++s) {
    StageResult sr;
    sr.stage = s;
    sr.dynamic_energy_j_per_gpu = dyn[s];
    sr.energy_j_per_gpu = dyn[s] + m.gpu().static_power_w * res.iteration_time_s;
    sr.busy_time_s = busy[s];
    sr.clock_changes = changes[s];
    sr.instructions = std::move(timing[static_cast<std::size_t>(s)]);
    res.energy_j += sr.energy_j_per_gpu * gpus_per_stage;
    res.stages.push_back(sr);
  }
  return res;
}

IterationResult emulate_schedule(const Workload& w, const EmulatorModel& m,
                                 const std::string& schedule, int freq_mhz) {
  InstructionSettings st;
  st.freq_mhz = freq_mhz;
  auto fn = [st](int, InstructionKind, int) { return st; };
  if (schedule == "megatron") return emulate_iteration(w, m, ExecutionMode::kSequential, fn);
  if (schedule == "nanobatch") {
    if (w.batch.nano_batches != 2) {
      throw InvalidInput("schedule 'nanobatch' needs batch.nano_batches: 2 in the workload");
    }
    return emulate_iteration(w, m, ExecutionMode::kOverlapped, fn);
  }
  throw InvalidInput(fmt::format("unknown schedule '{}'; allowed: megatron, nanobatch", schedule));
}

}  // namespace kareus
