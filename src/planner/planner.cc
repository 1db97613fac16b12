// The pipeline driver. Each method is the same composition and the same frontier solver over a
// different set of per-partition options:
//   kareus             every clock x the searched Pareto-optimal (SMs, slot) per clock
//   kareus_max_clock   the maximum clock x the searched Pareto-optimal (SMs, slot)
//   nanobatch_perseus  every clock x NCCL's default CTAs, collective at the partition start
//   nanobatch          the maximum clock x NCCL's defaults
//   perseus            every clock, kernels in sequence (no nano-batches)
//   megatron           the maximum clock, kernels in sequence
#include "kareus/planner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <functional>
#include <iterator>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

#include "kareus/error.h"
#include "kareus/interrupt.h"
#include "kareus/pareto.h"

namespace kareus {

const char* display_name(Method m) {
  switch (m) {
    case Method::kKareus:
      return "Kareus";
    case Method::kKareusMaxClock:
      return "Kareus w/o freq. scaling";
    case Method::kNanobatchPerseus:
      return "Nanobatching+Perseus";
    case Method::kNanobatch:
      return "Nanobatching";
    case Method::kPerseus:
      return "Perseus";
    case Method::kMegatron:
      return "Megatron-LM";
  }
  return "?";
}

const char* to_string(Method m) {
  switch (m) {
    case Method::kKareus:
      return "kareus";
    case Method::kKareusMaxClock:
      return "kareus_max_clock";
    case Method::kNanobatchPerseus:
      return "nanobatch_perseus";
    case Method::kNanobatch:
      return "nanobatch";
    case Method::kPerseus:
      return "perseus";
    case Method::kMegatron:
      return "megatron";
  }
  return "?";
}

Method method_from_string(const std::string& name) {
  for (Method m : {Method::kKareus, Method::kKareusMaxClock, Method::kNanobatchPerseus,
                   Method::kNanobatch, Method::kPerseus, Method::kMegatron}) {
    if (name == to_string(m)) return m;
  }
  throw InvalidInput(fmt::format(
      "unknown method '{}'; available: kareus, kareus_max_clock, nanobatch_perseus, nanobatch, "
      "perseus, megatron",
      name));
}

Planner::Planner(const Workload& w, CachedProfiler& profiler, PlannerOptions o,
                 PlannerProgress progress, CachedProfiler* screen)
    : w_(w),
      ps_(partition_workload(w)),
      digest_(workload_digest(w_, ps_)),
      profiler_(profiler),
      screen_(screen),
      o_(std::move(o)),
      progress_(std::move(progress)) {
  freqs_ = o_.freqs_mhz.empty() ? w_.gpu().candidate_freqs_mhz() : o_.freqs_mhz;
  if (const auto fixed = profiler_.backend().fixed_freq_mhz()) {
    // A real GPU without clock control can only be measured at the clock it runs.
    if (!o_.freqs_mhz.empty() && o_.freqs_mhz != std::vector<int>{*fixed}) {
      throw InvalidInput(fmt::format(
          "backend '{}' measures only at the card's current clock, {} MHz (clock control is "
          "off); drop the frequency list or pass --allow-clock-control",
          profiler_.backend().name(), *fixed));
    }
    freqs_ = {*fixed};
  }
  if (o_.sweep_stride < 1) {
    throw InvalidInput(fmt::format("sweep stride {}: must be at least 1", o_.sweep_stride));
  }
  if (!o_.focus_clocks_mhz.empty() && o_.focus_points_per_clock < 1) {
    throw InvalidInput(
        fmt::format("focus points per clock {}: must be at least 1", o_.focus_points_per_clock));
  }
  for (int f : freqs_) {
    if (!w_.gpu().supports_freq(f)) {
      throw InvalidInput(fmt::format("frequency {} MHz: {} supports {}..{} MHz in {} MHz steps", f,
                                     w_.gpu().name, w_.gpu().min_freq_mhz, w_.gpu().max_freq_mhz,
                                     w_.gpu().freq_step_mhz));
    }
  }
}

// Adds to `table` each option of `other` that no option of `table` at its clock matches or
// beats. Why: a table is Pareto-filtered across clocks, so an option at one clock can remove
// another clock's. Points of another frontier (the uniform one under --per-layer, a baseline's)
// are mapped onto this table's DAG at their own clocks, to keep their clock-switch stalls;
// without that clock's option a mapped point moves to a costlier option or to another clock,
// with other stalls, and the frontier could lose to the one it was mapped from.
static void keep_clock_options(std::vector<InstructionOption>& table,
                               const std::vector<InstructionOption>& uniform) {
  const std::size_t n = table.size();
  for (const InstructionOption& u : uniform) {
    bool covered = false;
    for (std::size_t j = 0; j < n && !covered; ++j) {
      covered = table[j].freq_mhz == u.freq_mhz && table[j].time_s <= u.time_s &&
                table[j].dynamic_energy_j <= u.dynamic_energy_j;
    }
    if (!covered) table.push_back(u);
  }
}

// With one nano-batch per micro-batch nothing can overlap: each overlapped method plans as its
// sequential counterpart (the clock per instruction is all that is left to choose).
static Method sequential_counterpart(const Workload& w, Method m) {
  if (w.batch.nano_batches != 1) return m;
  if (m == Method::kKareus || m == Method::kNanobatchPerseus) return Method::kPerseus;
  if (m == Method::kKareusMaxClock || m == Method::kNanobatch) return Method::kMegatron;
  return m;
}

const PartitionSet& Planner::sequential_partitions() {
  if (!seq_ps_) {
    Workload seq = w_;
    seq.batch.nano_batches = 1;
    seq_ps_ = partition_workload(seq);
  }
  return *seq_ps_;
}

// Nanobatching's setting of a partition: NCCL's default CTA count, launched at the start.
PartitionConfig Planner::baseline_config(const Partition& p, int freq_mhz) const {
  return {freq_mhz, w_.gpu().nccl_default_channels, p.slots.front().name};
}

// A search spends its points where the whole partition's (time, energy) front is, but a plan
// picks one option per clock, and the iso-time plans of the paper suite run at the middle
// clocks, where that front has few points (frontier_truth: the plan from 56-point profiles runs
// a faster clock with a worse SM count, up to 3.5% more energy than the exhaustive plan). The
// SM count and launch slot that are best at one clock are nearly best at the next (the search's
// additive model, strategies.cc), so each clock is completed with the choices of the recommended
// points at the nearest clock on either side.
int Planner::complete_clocks(const Partition& p, const SearchSpace& space, SearchResult& r) {
  std::set<std::string> have;
  auto key = [](const PartitionConfig& c) {
    return fmt::format("{}|{}|{}", c.freq_mhz, c.sms, c.slot);
  };
  for (const auto& pt : r.points) have.insert(key(pt.config));
  std::vector<PartitionConfig> extra;
  for (int f : freqs_) {
    const SearchPoint* below = nullptr;
    const SearchPoint* above = nullptr;
    for (std::size_t k : r.selected) {
      const SearchPoint& q = r.points[k];
      const int g = q.config.freq_mhz;
      if (g <= f && (!below || g > below->config.freq_mhz)) below = &q;
      if (g >= f && (!above || g < above->config.freq_mhz)) above = &q;
    }
    for (const SearchPoint* q : {below, above}) {
      if (!q) continue;
      PartitionConfig c = q->config;
      c.freq_mhz = f;
      if (have.insert(key(c)).second) extra.push_back(c);
    }
  }
  return add_points(p, space, r, extra);
}

bool add_focus_clocks(PlannerOptions& o, const Plan& plan) {
  std::set<int> clocks(o.focus_clocks_mhz.begin(), o.focus_clocks_mhz.end());
  const std::size_t before = clocks.size();
  for (const PlanStage& st : plan.stages) {
    for (const PlanInstruction& ins : st.instructions) clocks.insert(ins.freq_mhz);
  }
  o.focus_clocks_mhz.assign(clocks.begin(), clocks.end());
  return clocks.size() > before;
}

int Planner::focus_clocks(const Partition& p, const SearchSpace& space, SearchResult& r) {
  std::vector<PartitionConfig> extra;
  const auto per_clock = static_cast<std::size_t>(std::max(0, o_.focus_points_per_clock));
  for (int f : o_.focus_clocks_mhz) {
    for (const PartitionConfig& c : predicted_clock_front(r.points, space, o_.search, f, per_clock))
      extra.push_back(c);
  }
  return add_points(p, space, r, extra);
}

// Screened: the full window's noise, the one screened_search confirmed with and
// pooled_at_full_window scales every point to. Not screened: the noise the search estimated
// with (measurement_noise: the options' or the backend's repeatability). Why not the options as
// given: left unset they mean the measured H200 repeatability, which on a backend that repeats
// exactly (the emulator with --noise 0) pulled the exact measurements of focus and completion
// points toward the model's predictions.
SearchOptions Planner::estimate_options() const {
  SearchOptions o = o_.search;
  const NoiseRel noise = screen_ ? screening_noise(profiler_.backend(), o_.screening.full_window_s)
                                 : measurement_noise(o_.search, profiler_.backend());
  o.noise_rel = noise.energy;
  o.time_noise_rel = noise.time;
  return o;
}

int Planner::add_points(const Partition& p, const SearchSpace& space, SearchResult& r,
                        const std::vector<PartitionConfig>& extra) {
  if (extra.empty()) return 0;
  const std::vector<Measurement> m = profiler_.measure_batch(p, extra);
  for (std::size_t k = 0; k < extra.size(); ++k) r.points.push_back({extra[k], m[k], false});
  r.estimates = smoothed_estimates(r.points, space, estimate_options());
  return static_cast<int>(extra.size());
}

const std::vector<PartitionSearchSummary>& Planner::search_partitions() {
  if (searched_) return summaries_;
  auto strategy = create_search_strategy(o_.strategy);
  const GpuSpec& gpu = w_.gpu();
  std::size_t total = 0;
  std::vector<SearchSpace> spaces;
  for (const auto& p : ps_.partitions) {
    spaces.push_back(make_search_space(p, gpu, {freqs_, {}}));
    total += o_.strategy == "exhaustive"
                 ? spaces.back().size()
                 : std::min<std::size_t>(spaces.back().size(),
                                         static_cast<std::size_t>(std::max(o_.search.budget, 1)));
  }
  std::size_t done_before = 0;
  for (std::size_t i = 0; i < ps_.partitions.size(); ++i) {
    const Partition& p = ps_.partitions[i];
    const SearchProgress on_point = [&](int done, int) {
      if (progress_) progress_("search", done_before + static_cast<std::size_t>(done), total);
    };
    SearchResult r;
    int confirmed = 0;
    if (screen_) {
      ScreenedSearch sc = screened_search(*strategy, p, spaces[i], *screen_, profiler_, o_.search,
                                          o_.screening, on_point);
      confirmed = static_cast<int>(sc.confirmed.size());
      r = pooled_at_full_window(std::move(sc));
      // The per-clock fronts the plan is composed from: every point at its own repeatability
      // (confirmation weighs only the few near the whole front; a clock's front also holds
      // screening-only points, whose lucky draws a raw estimate would hand to the plan).
      r.estimates = smoothed_estimates(r.points, spaces[i], estimate_options());
    } else {
      r = strategy->run(p, spaces[i], profiler_, o_.search, on_point);
    }
    done_before += static_cast<std::size_t>(r.evaluations);
    PartitionSearchSummary s{p.key, spaces[i].size(),   r.evaluations, r.resumed,
                             0,     screen_ != nullptr, confirmed};
    s.prior = r.prior;
    s.prior_seeded = r.prior_seeded;
    if (o_.clock_completion) s.completion_points = complete_clocks(p, spaces[i], r);
    if (!o_.focus_clocks_mhz.empty()) s.focus_points = focus_clocks(p, spaces[i], r);
    PartitionFronts fronts;
    for (const auto& [f, idx] : r.fronts_per_frequency()) {
      for (std::size_t k : idx) {
        const Measurement& m = r.estimate(k);
        fronts[f].push_back({r.points[k].config, m.time_s, m.dynamic_energy_j});
      }
    }
    // Every clock needs at least one measured configuration: where the search left a clock
    // empty, measure the fastest configuration of the nearest clock that has one.
    for (int f : freqs_) {
      if (fronts.count(f)) continue;
      const PartitionOption* src = nullptr;
      int dist = 1 << 30;
      for (const auto& [g, opts] : fronts) {
        if (!opts.empty() && std::abs(g - f) < dist) {
          dist = std::abs(g - f);
          src = &opts.front();
        }
      }
      PartitionConfig c =
          src ? src->config : PartitionConfig{f, spaces[i].sms.front(), p.slots.front().name};
      c.freq_mhz = f;
      const Measurement m = profiler_.measure(p, c);
      fronts[f].push_back({c, m.time_s, m.dynamic_energy_j});
      ++s.coverage_points;
    }
    searched_fronts_[p.key] = std::move(fronts);
    summaries_.push_back(s);
  }
  searched_ = true;
  return summaries_;
}

const PartitionFronts& Planner::searched_fronts(const std::string& key) {
  search_partitions();
  const auto it = searched_fronts_.find(key);
  if (it == searched_fronts_.end()) {
    std::vector<std::string> keys;
    for (const auto& [k, f] : searched_fronts_) keys.push_back(k);
    throw InvalidInput(fmt::format("no partition '{}' in {}; partitions: {}", key, w_.name,
                                   fmt::join(keys, ", ")));
  }
  return it->second;
}

PartitionOption Planner::segment_cost(const Segment& s, int freq_mhz) {
  const Measurement m = profiler_.measure_segment(s, freq_mhz);
  return {{freq_mhz, 0, "-"}, m.time_s, m.dynamic_energy_j};
}

std::vector<int> Planner::smoothing_clocks() const {
  if (!o_.smooth_sweeps || freqs_.size() < 4) return {};
  // Exact measurements (the emulator with --noise 0, the oracle) need no smoothing, and no
  // clock is skipped: every sweep is measured whole.
  const NoiseRel noise = measurement_noise(o_.search, profiler_.backend());
  if (noise.time <= 0 && noise.energy <= 0) return {};
  std::vector<int> f = freqs_;
  std::sort(f.begin(), f.end());
  return f;
}

std::vector<int> Planner::sweep_clocks() const {
  const std::vector<int> all = smoothing_clocks();
  std::vector<int> some;
  const auto stride = static_cast<std::size_t>(std::max(1, o_.sweep_stride));
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (i == 0 || (all.size() - 1 - i) % stride == 0) some.push_back(all[i]);
  }
  return some;
}

const std::map<int, Measurement>& Planner::smoothed_sweep(
    const std::string& key,
    const std::function<std::vector<Measurement>(const std::vector<int>&)>& measure) {
  auto it = smoothed_.find(key);
  if (it != smoothed_.end()) return it->second;
  const std::vector<int> clocks = smoothing_clocks(), measured = sweep_clocks();
  const std::vector<Measurement> sweep = smooth_clock_sweep(
      measured, measure(measured), measurement_noise(o_.search, profiler_.backend()), clocks);
  std::map<int, Measurement> by_clock;
  for (std::size_t i = 0; i < clocks.size(); ++i) by_clock[clocks[i]] = sweep[i];
  return smoothed_.emplace(key, std::move(by_clock)).first->second;
}

PartitionOption Planner::instruction_segment_cost(const Segment& s, int freq_mhz) {
  const std::vector<int> clocks = smoothing_clocks();
  if (clocks.empty() || !std::binary_search(clocks.begin(), clocks.end(), freq_mhz)) {
    return segment_cost(s, freq_mhz);
  }
  const Measurement& m =
      smoothed_sweep(segment_signature(s) + "/" + s.name, [&](const std::vector<int>& measured) {
        std::vector<std::pair<const Segment*, int>> points;
        points.reserve(measured.size());
        for (int f : measured) points.emplace_back(&s, f);
        profiler_.measure_segments(points);
        std::vector<Measurement> sweep;
        sweep.reserve(measured.size());
        for (int f : measured) sweep.push_back(profiler_.measure_segment(s, f));
        return sweep;
      }).at(freq_mhz);
  return {{freq_mhz, 0, "-"}, m.time_s, m.dynamic_energy_j};
}

std::vector<Measurement> Planner::sweep_measurements(const Partition& p,
                                                     const std::vector<PartitionConfig>& configs) {
  const std::vector<int> clocks = smoothing_clocks();
  if (clocks.empty()) return profiler_.measure_batch(p, configs);
  std::vector<Measurement> out;
  out.reserve(configs.size());
  for (const PartitionConfig& c : configs) {
    if (!std::binary_search(clocks.begin(), clocks.end(), c.freq_mhz)) {
      out.push_back(profiler_.measure(p, c));
      continue;
    }
    const auto& sweep = smoothed_sweep(fmt::format("{}/{}/{}", p.key, c.sms, c.slot),
                                       [&](const std::vector<int>& measured) {
                                         std::vector<PartitionConfig> sweep_configs;
                                         sweep_configs.reserve(measured.size());
                                         for (int f : measured)
                                           sweep_configs.push_back({f, c.sms, c.slot});
                                         return profiler_.measure_batch(p, sweep_configs);
                                       });
    out.push_back(sweep.at(c.freq_mhz));
  }
  return out;
}

// Measures, in compose_instruction's order, every segment cost it is about to ask for: one call,
// so that distributed profiling (CachedProfiler's parallel mode) measures them side by side.
static void prefetch_segments(CachedProfiler& prof, const PartitionSet& ps, int stage,
                              InstructionKind k, const std::vector<int>& freqs_mhz) {
  std::vector<std::pair<const Segment*, int>> points;
  for (int f : freqs_mhz) {
    for (const auto& st : ps.instruction(stage, k).steps) {
      if (st.kind == Step::Kind::kSegment) {
        points.emplace_back(&ps.segments[static_cast<std::size_t>(st.index)], f);
      }
    }
  }
  prof.measure_segments(points);
}

// The method's own composition at the given clocks, Pareto-filtered across them.
std::vector<InstructionOption> Planner::compose_method(Method m, int stage, InstructionKind k,
                                                       bool per_instance,
                                                       const std::vector<int>& freqs_mhz) {
  ComposeOptions co;
  co.per_instance = per_instance;
  co.freqs_mhz = freqs_mhz;
  SegmentCostFn seg = [this](const Segment& s, int f) { return instruction_segment_cost(s, f); };
  // The clocks the segments are measured at: with smoothed sweeps, those of the sweep.
  const std::vector<int> segment_clocks =
      smoothing_clocks().empty() ? co.freqs_mhz : sweep_clocks();
  if (m == Method::kPerseus || m == Method::kMegatron) {
    prefetch_segments(profiler_, sequential_partitions(), stage, k, segment_clocks);
    std::vector<InstructionOption> seq =
        compose_instruction(sequential_partitions(), stage, k, {}, seg, co);
    for (auto& o : seq) o.sequential = true;
    return seq;
  }
  std::map<std::string, PartitionFronts> fronts;
  if (m == Method::kKareus || m == Method::kKareusMaxClock) {
    search_partitions();
    fronts = searched_fronts_;
  } else {
    // NCCL's defaults: its default CTA count, launched at the partition start.
    // One batch per partition (the same points in the same order as one at a time), so that
    // distributed profiling measures them side by side.
    for (const auto& p : ps_.partitions) {
      std::vector<PartitionConfig> configs;
      for (int f : co.freqs_mhz) configs.push_back(baseline_config(p, f));
      const std::vector<Measurement> meas = sweep_measurements(p, configs);
      for (std::size_t i = 0; i < configs.size(); ++i) {
        fronts[p.key][configs[i].freq_mhz] = {
            {configs[i], meas[i].time_s, meas[i].dynamic_energy_j}};
      }
    }
  }
  prefetch_segments(profiler_, ps_, stage, k, segment_clocks);
  return compose_instruction(ps_, stage, k, fronts, seg, co);
}

std::vector<InstructionOption> Planner::instruction_options(Method m, int stage, InstructionKind k,
                                                            bool per_instance) {
  m = sequential_counterpart(w_, m);
  const int fmax = *std::max_element(freqs_.begin(), freqs_.end());
  const bool all_clocks =
      m == Method::kKareus || m == Method::kNanobatchPerseus || m == Method::kPerseus;
  std::vector<InstructionOption> table =
      compose_method(m, stage, k, per_instance, all_clocks ? freqs_ : std::vector<int>{fmax});
  // Honest fast end: the maximum-clock options stay in the table even where a lower clock
  // dominates them (under the power cap the top clocks run at about the same effective clock,
  // so measurement noise decides), so the method's maximum-clock plan is always a candidate
  // (Planner::frontier adds it).
  const std::vector<InstructionOption> top =
      all_clocks ? compose_method(m, stage, k, per_instance, {fmax}) : table;
  keep_clock_options(table, top);
  if (m != Method::kKareus && m != Method::kKareusMaxClock) return table;
  // Kareus's space holds both baselines' ways of running an instruction: nano-batched with
  // NCCL's defaults at the partition start, and whole, kernels in sequence, where overlap does
  // not pay (small GEMMs after the split, a collective with nothing to hide behind). Each
  // instruction may run either way (sequential options join the Pareto set), and the baselines'
  // options stay available at their own clocks (keep_clock_options), so that every baseline
  // plan maps onto Kareus's options with the same clock-switch stalls and the frontier never
  // loses to a baseline, whatever the search missed. The baseline's options join at the
  // instruction level, not as raw measurements among the searched per-clock fronts: there a
  // raw measurement's lucky noise wins against the search's smoothed estimates and the plans
  // replay worse (0.2-0.5% more energy at iso-time on the paper suite).
  const bool fast_only = m == Method::kKareusMaxClock;
  const std::vector<InstructionOption> seq =
      instruction_options(fast_only ? Method::kMegatron : Method::kPerseus, stage, k, per_instance);
  const std::vector<InstructionOption> nbp = instruction_options(
      fast_only ? Method::kNanobatch : Method::kNanobatchPerseus, stage, k, per_instance);
  std::vector<InstructionOption> all = table;
  all.insert(all.end(), seq.begin(), seq.end());
  table = pareto_filter(std::move(all));
  keep_clock_options(table, top);
  keep_clock_options(table, seq);
  keep_clock_options(table, nbp);
  return table;
}

const std::vector<InstructionOption>& MethodFrontier::node_options(std::size_t node) const {
  static const std::vector<InstructionOption> kNone;
  const int t = node < node_table.size() ? node_table[node] : -1;
  return t < 0 ? kNone : tables[static_cast<std::size_t>(t)];
}

static std::vector<int> map_uniform_choice(const MethodFrontier& uniform, const MethodFrontier& mf,
                                           const std::vector<int>& choice, bool same_clock) {
  std::vector<int> out(mf.dag.nodes.size(), 0);
  for (std::size_t i = 0; i < mf.dag.nodes.size(); ++i) {
    const DagOption& want = uniform.dag.nodes[i].options[static_cast<std::size_t>(choice[i])];
    const auto& opts = mf.dag.nodes[i].options;
    const bool instruction = !mf.node_options(i).empty();
    const int want_freq =
        instruction ? uniform.node_options(i)[static_cast<std::size_t>(choice[i])].freq_mhz : 0;
    auto pick = [&](bool clock_only) {
      int best = -1;
      for (std::size_t j = 0; j < opts.size(); ++j) {
        if (clock_only && mf.node_options(i)[j].freq_mhz != want_freq) continue;
        const bool fits = opts[j].time_s <= want.time_s * (1 + 1e-12);
        const bool best_fits =
            best >= 0 && opts[static_cast<std::size_t>(best)].time_s <= want.time_s * (1 + 1e-12);
        // The cheapest option that fits; while none does, the fastest.
        const auto& b = opts[static_cast<std::size_t>(std::max(best, 0))];
        if (best < 0 || (fits && (!best_fits || opts[j].energy_j < b.energy_j)) ||
            (!fits && !best_fits && opts[j].time_s < b.time_s)) {
          best = static_cast<int>(j);
        }
      }
      return best;
    };
    int best = same_clock && instruction ? pick(true) : -1;
    if (best >= 0 && opts[static_cast<std::size_t>(best)].time_s > want.time_s * (1 + 1e-12)) {
      best = -1;
    }
    if (best < 0) best = pick(false);
    out[i] = best;
  }
  return out;
}

namespace {

// A choice evaluated with its clock-switch stalls, as every frontier point is.
FrontierPoint evaluated_point(const MethodFrontier& f, std::vector<int> choice) {
  const ClockSchedule sch = schedule_with_switches(f, choice, f.clock_switch_s);
  return {sch.makespan_s, sch.energy_j, sch.dynamic_energy_j, std::move(choice)};
}

// The method's maximum-clock plan: every instruction at `fmax_mhz` with its fastest option
// there (the table keeps them, instruction_options), so no clock changes.
std::vector<int> max_clock_choice(const MethodFrontier& f, int fmax_mhz) {
  std::vector<int> choice(f.dag.nodes.size(), 0);
  for (std::size_t i = 0; i < choice.size(); ++i) {
    const auto& opts = f.node_options(i);
    const auto& dag_opts = f.dag.nodes[i].options;
    int best = -1;
    for (bool at_max : {true, false}) {
      for (std::size_t j = 0; j < dag_opts.size(); ++j) {
        if (at_max && !opts.empty() && opts[j].freq_mhz != fmax_mhz) continue;
        if (best < 0 || dag_opts[j].time_s < dag_opts[static_cast<std::size_t>(best)].time_s) {
          best = static_cast<int>(j);
        }
      }
      if (best >= 0) break;
    }
    choice[i] = std::max(best, 0);
  }
  return choice;
}

// The frontiers whose plans a method's options contain (instruction_options): Kareus holds
// both baselines' and its own ablation's, the ablation those at the maximum clock.
std::vector<Method> contained_methods(Method m) {
  if (m == Method::kKareus) {
    return {Method::kPerseus, Method::kNanobatchPerseus, Method::kKareusMaxClock};
  }
  if (m == Method::kKareusMaxClock) return {Method::kMegatron, Method::kNanobatch};
  return {};
}

}  // namespace

// The solver is exact only on the convex envelope of each node's options (phillips_dessouky.cc)
// and the clock holds are a heuristic, so the frontier also takes, as candidates, plans known to
// lie in the method's space: its maximum-clock plan (frontier_layers: so its fastest point is
// never slower than running it at the maximum clock), and for Kareus every point of the
// frontiers whose options its own contain, mapped onto its options at the same clocks (so the
// same stalls). The result never loses to those frontiers, by construction rather than by a
// fallback to their plans.
MethodFrontier Planner::frontier(Method m) {
  if (auto it = frontiers_.find(m); it != frontiers_.end()) return it->second;
  if (const Method run_as = sequential_counterpart(w_, m); run_as != m) {
    // One nano-batch: the method plans exactly as its sequential counterpart (same tables, same
    // DAG), so its frontier is that one under its own name.
    MethodFrontier same = frontier(run_as);
    same.method = m;
    return frontiers_.emplace(m, std::move(same)).first->second;
  }
  MethodFrontier mf = frontier_layers(m);
  // A mapped choice keeps the source's clocks but may take faster options, so a run of one clock
  // can fall below --min-clock-hold-ms: the holds are applied again (nothing changes otherwise).
  auto take_points_of = [&mf, this](const MethodFrontier& other) {
    for (const FrontierPoint& p : other.points) {
      std::vector<int> choice = map_uniform_choice(other, mf, p.choice, true);
      if (o_.min_clock_hold_s > 0) choice = hold_clocks(mf, choice, o_.min_clock_hold_s, true);
      mf.points.push_back(evaluated_point(mf, std::move(choice)));
    }
  };
  for (Method c : contained_methods(m)) take_points_of(frontier(c));
  if (o_.per_layer && !contained_methods(m).empty()) {
    // The uniform frontier's candidates map onto the per-layer options no slower node by node
    // but not always as fast as on the uniform options, so the per-layer frontier also takes
    // every point of the uniform planner's frontier (the same searched fronts): --per-layer
    // never loses to the frontier without it.
    if (!uniform_planner_) {
      PlannerOptions uniform_o = o_;
      uniform_o.per_layer = false;
      uniform_planner_ = std::make_shared<Planner>(w_, profiler_, uniform_o, progress_, screen_);
      uniform_planner_->searched_fronts_ = searched_fronts_;
      uniform_planner_->summaries_ = summaries_;
      uniform_planner_->searched_ = searched_;
    }
    take_points_of(uniform_planner_->frontier(m));
  }
  mf.points = pareto_frontier(mf.points);
  return frontiers_.emplace(m, std::move(mf)).first->second;
}

MethodFrontier Planner::frontier_layers(Method m) {
  const int fmax = *std::max_element(freqs_.begin(), freqs_.end());
  auto add_max_clock_plan = [fmax](MethodFrontier& f) {
    f.points.push_back(evaluated_point(f, max_clock_choice(f, fmax)));
    f.points = pareto_frontier(f.points);
  };
  if (!o_.per_layer) {
    MethodFrontier mf = frontier_with(m);
    apply_clock_switch_cost(mf);
    add_max_clock_plan(mf);
    return mf;
  }
  // Per-layer choices are a superset of uniform ones, but the solver is a heuristic on
  // non-convex options: keep the uniform frontier's points too, mapped onto the per-layer DAG
  // (each node to the cheapest per-layer option no slower than its uniform choice), so the
  // per-layer frontier is never worse. With clock-switch stalls, the uniform frontier's
  // post-processed points are mapped at their own clocks, so they keep their stalls.
  MethodFrontier uniform = frontier_with(m);
  MethodFrontier mf = frontier_with(m, &uniform.tables);
  for (const FrontierPoint& up : uniform.points) {
    FrontierPoint p;
    p.choice = map_uniform_choice(uniform, mf, up.choice, false);
    p.time_s = mf.dag.makespan_s(p.choice);
    for (std::size_t i = 0; i < p.choice.size(); ++i) {
      p.dynamic_energy_j += mf.dag.nodes[i].options[static_cast<std::size_t>(p.choice[i])].energy_j;
    }
    p.energy_j = p.dynamic_energy_j + mf.dag.gpus * mf.dag.static_power_w * p.time_s;
    mf.points.push_back(std::move(p));
  }
  mf.points = pareto_frontier(mf.points);
  apply_clock_switch_cost(mf);
  apply_clock_switch_cost(uniform);
  add_max_clock_plan(uniform);  // the uniform frontier as `frontier` would return it
  for (const FrontierPoint& up : uniform.points) {
    mf.points.push_back(evaluated_point(mf, map_uniform_choice(uniform, mf, up.choice, true)));
  }
  add_max_clock_plan(mf);
  return mf;
}

// Instruction options of every (virtual stage, kind), then the costs of messages and
// reductions: one option each, at the maximum clock with NCCL's default CTAs.
void Planner::compose_tables(MethodFrontier& mf,
                             const std::vector<std::vector<InstructionOption>>* uniform) {
  const int pp = w_.parallel.pp, vstages = w_.parallel.virtual_stages();
  const std::size_t total = 2 * static_cast<std::size_t>(vstages);
  const std::string label = fmt::format("compose {}", to_string(mf.method));
  mf.tables.assign(total, {});
  std::size_t done = 0;
  for (int s = 0; s < vstages; ++s) {
    for (InstructionKind k : {InstructionKind::kForward, InstructionKind::kBackward}) {
      const std::size_t t = 2 * static_cast<std::size_t>(s) + static_cast<std::size_t>(k);
      auto& table = mf.tables[t];
      table = instruction_options(mf.method, s, k, uniform != nullptr);
      if (uniform) keep_clock_options(table, (*uniform)[t]);
      if (table.empty()) {
        throw InternalError(fmt::format("no option for {} on stage {}", to_string(k), s));
      }
      if (progress_) progress_(label, ++done, total);
    }
  }
  const int fmax = w_.gpu().max_freq_mhz;
  if (pp > 1) {
    const PartitionOption c = segment_cost(Segment{"p2p", 0, "p2p", {ps_.graph.p2p}}, fmax);
    mf.p2p = {c.time_s, c.dynamic_energy_j};
  }
  mf.reductions.clear();
  for (int idx : ps_.iteration_segments) {
    const PartitionOption c = segment_cost(ps_.segments[static_cast<std::size_t>(idx)], fmax);
    mf.reductions.push_back({c.time_s, c.dynamic_energy_j});
  }
  // Overlapped data-parallel communication, measured at the settings the emulator's replay
  // assumes (dp_grad_increment): the maximum clock, NCCL's default CTAs. On the partitions the
  // method's instructions run on.
  const PartitionSet& dps =
      mf.execution == ExecutionMode::kSequential ? sequential_partitions() : ps_;
  const int sms = w_.gpu().segment_collective_sms();
  mf.dp_grad.clear();
  for (const auto& o : dps.dp_grad_overlaps) {
    PartitionOption inc = segment_cost(o.exposed, fmax);
    if (!o.no_overlap) {
      const Measurement with = profiler_.measure(o.overlapped, {fmax, sms, "first_bucket"});
      const PartitionOption alone = segment_cost(o.compute, fmax);
      inc.time_s += std::max(0.0, with.time_s - alone.time_s);
      inc.dynamic_energy_j += std::max(0.0, with.dynamic_energy_j - alone.dynamic_energy_j);
    }
    mf.dp_grad.push_back({inc.time_s, inc.dynamic_energy_j});
  }
  mf.dp_gather.clear();
  for (const auto& g : dps.dp_param_gathers) {
    const PartitionOption c = segment_cost(g, fmax);
    mf.dp_gather.push_back({c.time_s, c.dynamic_energy_j});
  }
}

void build_iteration_dag(const Workload& w, const PartitionSet& ps, MethodFrontier& mf) {
  const Schedule sched = w.schedule();
  const int pp = sched.stages(), mbs = sched.microbatches();
  const double per_stage = static_cast<double>(w.parallel.tp) * w.parallel.cp * w.parallel.dp;
  if (mf.tables.size() != 2 * static_cast<std::size_t>(sched.virtual_stages()) ||
      mf.reductions.size() != ps.iteration_segments.size() ||
      mf.dp_grad.size() != ps.dp_grad_overlaps.size() ||
      mf.dp_gather.size() != ps.dp_param_gathers.size()) {
    throw InternalError("build_iteration_dag: option tables do not match the workload");
  }
  IterationDag& dag = mf.dag;
  dag.nodes.clear();
  dag.edges.clear();
  mf.node_table.clear();
  auto add_node = [&](int stage, int chunk, DagNodeKind kind, int mb, std::vector<DagOption> o,
                      int table) {
    DagNode n;
    n.id = static_cast<int>(dag.nodes.size());
    n.stage = stage;
    n.chunk = chunk;
    n.instruction = kind;
    n.microbatch = mb;
    n.options = std::move(o);
    dag.nodes.push_back(std::move(n));
    mf.node_table.push_back(table);
    return dag.nodes.back().id;
  };
  // DAG options of each table, energies over the stage's GPUs.
  std::vector<std::vector<DagOption>> dag_options(mf.tables.size());
  for (std::size_t t = 0; t < mf.tables.size(); ++t) {
    for (const auto& x : mf.tables[t])
      dag_options[t].push_back({x.time_s, x.dynamic_energy_j * per_stage});
  }
  // Instruction nodes, stage by stage in the schedule's order: node ids of one stage ascend in
  // execution order (stage_instructions relies on it).
  std::map<std::tuple<int, int, int>, int> node_of;  // (kind, virtual stage, mb) -> node
  std::vector<int> last(static_cast<std::size_t>(pp), -1);
  // Data-parallel costs by virtual stage (PartitionSet::dp_grad_overlaps, dp_param_gathers).
  std::map<int, SegmentRun> grad_of, gather_of;
  for (std::size_t i = 0; i < ps.dp_grad_overlaps.size(); ++i) {
    grad_of[ps.dp_grad_overlaps[i].stage] = mf.dp_grad[i];
  }
  for (std::size_t i = 0; i < ps.dp_param_gathers.size(); ++i) {
    gather_of[ps.dp_param_gathers[i].stage] = mf.dp_gather[i];
  }
  // The parameter all-gathers: each stage's DP stream, in chunk order from the iteration start.
  std::map<int, int> gather_node;  // virtual stage -> node
  for (int s = 0; s < pp; ++s) {
    int prev = -1;
    for (int c = 0; c < sched.chunks(); ++c) {
      const int vs = sched.virtual_stage(s, c);
      auto g = gather_of.find(vs);
      if (g == gather_of.end()) continue;
      const int id = add_node(s, c, DagNodeKind::kDataParallel, -1,
                              {{g->second.time_s, g->second.dynamic_energy_j * per_stage}}, -1);
      if (prev >= 0) dag.edges.push_back({prev, id});
      gather_node[vs] = prev = id;
    }
  }
  for (int s = 0; s < pp; ++s) {
    const auto& order = sched.order(s);
    std::map<int, std::size_t> last_bwd;  // chunk -> index of its last backward in the order
    for (std::size_t i = 0; i < order.size(); ++i) {
      if (order[i].kind == InstructionKind::kBackward) last_bwd[order[i].chunk] = i;
    }
    std::set<int> started;  // chunks whose first forward has been added
    for (std::size_t i = 0; i < order.size(); ++i) {
      const auto& x = order[i];
      const int vs = sched.virtual_stage(s, x.chunk);
      const int t = 2 * vs + static_cast<int>(x.kind);
      const int id = add_node(s, x.chunk, dag_node_kind(x.kind), x.microbatch,
                              dag_options[static_cast<std::size_t>(t)], t);
      node_of[{static_cast<int>(x.kind), vs, x.microbatch}] = id;
      auto& prev = last[static_cast<std::size_t>(s)];
      if (prev >= 0) dag.edges.push_back({prev, id});
      prev = id;
      if (x.kind == InstructionKind::kForward && started.insert(x.chunk).second) {
        if (auto g = gather_node.find(vs); g != gather_node.end()) {
          dag.edges.push_back({g->second, id});
        }
      }
      // The gradient reduction's exposed cost follows the chunk's last backward on the stage.
      if (x.kind == InstructionKind::kBackward && last_bwd.at(x.chunk) == i) {
        if (auto g = grad_of.find(vs); g != grad_of.end()) {
          const int d = add_node(s, x.chunk, DagNodeKind::kDataParallel, x.microbatch,
                                 {{g->second.time_s, g->second.dynamic_energy_j * per_stage}}, -1);
          dag.edges.push_back({prev, d});
          prev = d;
        }
      }
    }
  }
  // A message between every pair of consecutive virtual stages, each way, on the sender.
  const DagOption msg{mf.p2p.time_s, mf.p2p.dynamic_energy_j * per_stage};
  for (int mb = 0; mb < mbs; ++mb) {
    for (int vs = 0; vs < sched.virtual_stages(); ++vs) {
      for (InstructionKind k : {InstructionKind::kForward, InstructionKind::kBackward}) {
        const InstructionRef to{k, vs, mb};
        InstructionRef from;
        if (!sched.input_of(to, &from)) continue;
        const int sender = node_of.at({static_cast<int>(from.kind), from.virtual_stage, mb});
        const int m =
            add_node(sched.stage_of(from.virtual_stage), sched.chunk_of(from.virtual_stage),
                     DagNodeKind::kP2p, mb, {msg}, -1);
        dag.edges.push_back({sender, m});
        dag.edges.push_back({m, node_of.at({static_cast<int>(k), vs, mb})});
      }
    }
  }
  for (std::size_t r = 0; r < ps.iteration_segments.size(); ++r) {
    const Segment& seg = ps.segments[static_cast<std::size_t>(ps.iteration_segments[r])];
    const SegmentRun& c = mf.reductions[r];
    const int stage = sched.stage_of(seg.stage);
    const int id = add_node(stage, sched.chunk_of(seg.stage), DagNodeKind::kIteration, -1,
                            {{c.time_s, c.dynamic_energy_j * per_stage}}, -1);
    auto& prev = last[static_cast<std::size_t>(stage)];
    dag.edges.push_back({prev, id});
    prev = id;
  }
}

FrontierMemory frontier_memory(const MethodFrontier& f, double unit_s) {
  FrontierMemory m;
  const std::size_t n = f.dag.nodes.size();
  // The fastest and slowest option of each node by time: tables keep options past their
  // Pareto-sorted part (keep_clock_options), so neither end is known by position.
  std::vector<int> fastest(n, 0), slowest(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const auto& opts = f.dag.nodes[i].options;
    m.bytes += static_cast<double>(sizeof(DagNode) + opts.size() * sizeof(DagOption));
    for (std::size_t j = 0; j < opts.size(); ++j) {
      const int jj = static_cast<int>(j);
      if (opts[j].time_s < opts[static_cast<std::size_t>(fastest[i])].time_s) fastest[i] = jj;
      if (opts[j].time_s > opts[static_cast<std::size_t>(slowest[i])].time_s) slowest[i] = jj;
    }
  }
  m.bytes += static_cast<double>(f.dag.edges.size() * sizeof(std::pair<int, int>));
  for (const auto& table : f.tables) {
    m.options += table.size();
    for (const auto& o : table) {
      // A map node of a partition setting is about 128 bytes with its key.
      std::size_t shares = 0;
      for (const auto& [key, v] : o.mixes) shares += v.size();
      m.bytes += static_cast<double>(sizeof(InstructionOption) +
                                     128 * (o.partitions.size() + o.mixes.size()) +
                                     shares * sizeof(ConfigShare));
    }
  }
  if (n == 0 || !(unit_s > 0)) return m;
  const double range_s = f.dag.makespan_s(slowest) - f.dag.makespan_s(fastest);
  m.solver_steps = std::max(0.0, range_s) / unit_s + 1;
  m.bytes += m.solver_steps * static_cast<double>(n * sizeof(int) + sizeof(FrontierPoint));
  return m;
}

void Planner::check_frontier_memory(const MethodFrontier& mf) const {
  const FrontierMemory m = frontier_memory(mf, o_.unit_s);
  const double need_mb = m.bytes / (1024.0 * 1024.0);
  if (need_mb <= o_.frontier_memory_mb) return;
  throw InvalidInput(fmt::format(
      "{}: the {} frontier would take about {:.0f} MiB ({} DAG nodes, {} instruction options, "
      "up to {:.0f} solver steps at --unit {:g} s), over the frontier memory budget of {:g} MiB "
      "(--frontier-memory-mb); use a coarser --unit, fewer micro-batches or a larger budget",
      w_.source.empty() ? w_.name : w_.source, to_string(mf.method), need_mb, mf.dag.nodes.size(),
      m.options, m.solver_steps, o_.unit_s, o_.frontier_memory_mb));
}

MethodFrontier Planner::frontier_with(Method m,
                                      const std::vector<std::vector<InstructionOption>>* uniform) {
  MethodFrontier mf;
  mf.method = m;
  const Method run_as = sequential_counterpart(w_, m);
  mf.execution = (run_as == Method::kPerseus || run_as == Method::kMegatron)
                     ? ExecutionMode::kSequential
                     : ExecutionMode::kOverlapped;
  mf.dag.static_power_w = profiler_.backend().static_power_w();
  mf.dag.gpus = w_.cluster.gpus();
  compose_tables(mf, uniform);
  build_iteration_dag(w_, ps_, mf);
  check_frontier_memory(mf);
  FrontierOptions fo;
  fo.unit_s = o_.unit_s;
  // The solver reports (steps done, step bound); the bar ends once the frontier is complete.
  const std::string label = fmt::format("frontier {}", to_string(m));
  std::size_t steps = 1;
  if (progress_) {
    fo.progress = [this, &label, &steps](std::size_t done, std::size_t total) {
      steps = std::max<std::size_t>(total, 1);
      progress_(label, std::min(done, steps - 1), steps);
    };
  }
  mf.points = solve_frontier(mf.dag, fo, &mf.stats);
  if (progress_) progress_(label, steps, steps);
  return mf;
}

namespace {

// Instruction nodes of each stage, in execution order (build_iteration_dag adds them so).
std::vector<std::vector<int>> stage_instructions(const MethodFrontier& f) {
  int stages = 0;
  for (const auto& n : f.dag.nodes) stages = std::max(stages, n.stage + 1);
  std::vector<std::vector<int>> out(static_cast<std::size_t>(stages));
  for (std::size_t i = 0; i < f.dag.nodes.size(); ++i) {
    if (!f.node_options(i).empty()) {
      out[static_cast<std::size_t>(f.dag.nodes[i].stage)].push_back(static_cast<int>(i));
    }
  }
  return out;
}

const InstructionOption& option_of(const MethodFrontier& f, const std::vector<int>& choice,
                                   int node) {
  return f.node_options(static_cast<std::size_t>(
      node))[static_cast<std::size_t>(choice[static_cast<std::size_t>(node)])];
}

}  // namespace

DagTopology::DagTopology(const MethodFrontier& f)
    : stages(stage_instructions(f)), preds(f.dag.nodes.size()), order(f.dag.topological_order()) {
  for (const auto& [a, b] : f.dag.edges) preds[static_cast<std::size_t>(b)].push_back(a);
}

namespace {

ClockSchedule schedule_on(const MethodFrontier& f, const DagTopology& t,
                          const std::vector<int>& choice, double clock_switch_s) {
  const auto& dag = f.dag;
  const std::size_t n = dag.nodes.size();
  if (choice.size() != n) throw InternalError("schedule_with_switches: choice size mismatch");
  ClockSchedule sch;
  sch.start_s.assign(n, 0);
  sch.end_s.assign(n, 0);
  sch.clock_switch.assign(n, false);
  const auto& stages = t.stages;
  sch.clock_changes.assign(stages.size(), 0);
  for (std::size_t s = 0; s < stages.size(); ++s) {
    for (std::size_t k = 1; k < stages[s].size(); ++k) {
      if (option_of(f, choice, stages[s][k]).freq_mhz !=
          option_of(f, choice, stages[s][k - 1]).freq_mhz) {
        sch.clock_switch[static_cast<std::size_t>(stages[s][k])] = true;
        ++sch.clock_changes[s];
      }
    }
  }
  const auto& preds = t.preds;
  for (int v : t.order) {
    const auto vi = static_cast<std::size_t>(v);
    double start = 0;
    for (int u : preds[vi]) start = std::max(start, sch.end_s[static_cast<std::size_t>(u)]);
    const DagOption& o = dag.nodes[vi].options[static_cast<std::size_t>(choice[vi])];
    sch.start_s[vi] = start;
    sch.end_s[vi] = start + (sch.clock_switch[vi] ? clock_switch_s : 0.0) + o.time_s;
    sch.makespan_s = std::max(sch.makespan_s, sch.end_s[vi]);
    sch.dynamic_energy_j += o.energy_j;
  }
  sch.energy_j = sch.dynamic_energy_j + dag.gpus * dag.static_power_w * sch.makespan_s;
  return sch;
}

}  // namespace

ClockSchedule schedule_with_switches(const MethodFrontier& f, const std::vector<int>& choice,
                                     double clock_switch_s) {
  return schedule_on(f, DagTopology(f), choice, clock_switch_s);
}

ClockSchedule schedule_with_switches(const MethodFrontier& f, const DagTopology& t,
                                     const std::vector<int>& choice, double clock_switch_s) {
  return schedule_on(f, t, choice, clock_switch_s);
}

double peak_instruction_power_w(const MethodFrontier& f, const std::vector<int>& choice) {
  if (choice.size() != f.dag.nodes.size()) {
    throw InternalError("peak_instruction_power_w: choice size mismatch");
  }
  double peak = 0;
  for (std::size_t i = 0; i < choice.size(); ++i) {
    const auto& opts = f.node_options(i);
    if (opts.empty()) continue;  // messages, reductions, data-parallel collectives
    peak = std::max(peak, instruction_power_w(opts.at(static_cast<std::size_t>(choice[i])),
                                              f.dag.static_power_w));
  }
  return peak;
}

namespace {

// A run of equal clocks on one stage: nodes[begin, end) of the stage's instruction nodes.
struct ClockRun {
  std::size_t begin, end;
  int freq;
  double time_s;
};

std::vector<ClockRun> clock_runs(const MethodFrontier& f, const std::vector<int>& nodes,
                                 const std::vector<int>& choice, std::size_t from = 0,
                                 std::size_t to = std::numeric_limits<std::size_t>::max()) {
  std::vector<ClockRun> runs;
  for (std::size_t k = from; k < std::min(to, nodes.size()); ++k) {
    const InstructionOption& o = option_of(f, choice, nodes[k]);
    if (runs.empty() || runs.back().freq != o.freq_mhz) runs.push_back({k, k, o.freq_mhz, 0});
    runs.back().end = k + 1;
    runs.back().time_s += o.time_s;
  }
  return runs;
}

// Candidate moves for merging run r (which run takes which clock), best first. Toward the
// faster side: the short run takes a faster neighbour's clock, or else (it is the fastest
// around) its shorter slower neighbour takes its clock; so merging never slows a run down.
// Toward the slower side, symmetrically.
std::vector<std::pair<std::size_t, int>> merge_moves(const std::vector<ClockRun>& runs,
                                                     std::size_t r, bool toward_faster) {
  auto better = [toward_faster](int a, int b) { return toward_faster ? a > b : a < b; };
  std::vector<std::size_t> nbs;
  if (r > 0) nbs.push_back(r - 1);
  if (r + 1 < runs.size()) nbs.push_back(r + 1);
  std::vector<std::size_t> up = nbs, down = nbs;
  std::erase_if(up, [&](std::size_t n) { return !better(runs[n].freq, runs[r].freq); });
  std::erase_if(down, [&](std::size_t n) { return better(runs[n].freq, runs[r].freq); });
  std::stable_sort(up.begin(), up.end(), [&](std::size_t a, std::size_t b) {
    return better(runs[a].freq, runs[b].freq);
  });
  std::stable_sort(down.begin(), down.end(),
                   [&](std::size_t a, std::size_t b) { return runs[a].time_s < runs[b].time_s; });
  std::vector<std::pair<std::size_t, int>> moves;
  moves.reserve(up.size() + down.size());
  for (std::size_t n : up) moves.push_back({r, runs[n].freq});
  for (std::size_t n : down) moves.push_back({n, runs[r].freq});
  return moves;
}

// Moves every instruction of `run` to clock `target`: each takes the least-energy option at
// that clock no slower than its current one, else the fastest. False (nothing changed) when
// some instruction has no option at `target`.
bool retarget_run(const MethodFrontier& f, const std::vector<int>& nodes, const ClockRun& run,
                  int target, std::vector<int>& out) {
  std::vector<int> picks;
  for (std::size_t k = run.begin; k < run.end; ++k) {
    const auto& opts = f.node_options(static_cast<std::size_t>(nodes[k]));
    const double now_s = option_of(f, out, nodes[k]).time_s;
    int best = -1, fastest = -1;
    for (std::size_t j = 0; j < opts.size(); ++j) {
      if (opts[j].freq_mhz != target) continue;
      const int jj = static_cast<int>(j);
      if (fastest < 0 || opts[j].time_s < opts[static_cast<std::size_t>(fastest)].time_s) {
        fastest = jj;
      }
      if (opts[j].time_s <= now_s &&
          (best < 0 ||
           opts[j].dynamic_energy_j < opts[static_cast<std::size_t>(best)].dynamic_energy_j)) {
        best = jj;
      }
    }
    if (fastest < 0) return false;
    picks.push_back(best >= 0 ? best : fastest);
  }
  for (std::size_t k = run.begin; k < run.end; ++k) {
    out[static_cast<std::size_t>(nodes[k])] = picks[k - run.begin];
  }
  return true;
}

// The clocks at which every instruction of `run` has an option, ascending. Sorted vectors, not
// sets: this runs for every failed merge of every stage of every frontier point.
std::vector<int> clocks_of_run(const MethodFrontier& f, const std::vector<int>& nodes,
                               const ClockRun& run) {
  std::vector<int> common, mine, both;
  for (std::size_t k = run.begin; k < run.end; ++k) {
    mine.clear();
    for (const auto& o : f.node_options(static_cast<std::size_t>(nodes[k]))) {
      mine.push_back(o.freq_mhz);
    }
    std::sort(mine.begin(), mine.end());
    mine.erase(std::unique(mine.begin(), mine.end()), mine.end());
    if (k == run.begin) {
      common.swap(mine);
    } else {
      both.clear();
      std::set_intersection(common.begin(), common.end(), mine.begin(), mine.end(),
                            std::back_inserter(both));
      common.swap(both);
    }
    if (common.empty()) break;
  }
  return common;
}

// When neither run's clock exists in the other's options (a search measures each partition at
// the clocks it chose, so two partitions need not share every clock), both runs move to a clock
// they all have: the one nearest the faster run's clock (toward the faster side) or the slower
// run's. Neighbours are tried shorter first. False when no neighbour shares any clock.
bool retarget_pair_to_common_clock(const MethodFrontier& f, const std::vector<int>& nodes,
                                   const std::vector<ClockRun>& runs, std::size_t r,
                                   bool toward_faster, std::vector<int>& out) {
  std::vector<std::size_t> nbs;
  if (r > 0) nbs.push_back(r - 1);
  if (r + 1 < runs.size()) nbs.push_back(r + 1);
  std::stable_sort(nbs.begin(), nbs.end(),
                   [&](std::size_t a, std::size_t b) { return runs[a].time_s < runs[b].time_s; });
  const std::vector<int> own = clocks_of_run(f, nodes, runs[r]);
  for (std::size_t n : nbs) {
    const std::vector<int> theirs = clocks_of_run(f, nodes, runs[n]);
    std::vector<int> common;
    std::set_intersection(own.begin(), own.end(), theirs.begin(), theirs.end(),
                          std::back_inserter(common));
    if (common.empty()) continue;
    const int aim =
        toward_faster ? std::max(runs[r].freq, runs[n].freq) : std::min(runs[r].freq, runs[n].freq);
    int target = *common.begin();
    for (int c : common) {
      if (std::abs(c - aim) < std::abs(target - aim)) target = c;
    }
    // Both succeed: every instruction of both runs has an option at `target`.
    retarget_run(f, nodes, runs[r], target, out);
    retarget_run(f, nodes, runs[n], target, out);
    return true;
  }
  return false;
}

// After runs r - 2 .. r + 2 changed clocks (a merge touches run r and a neighbour), the runs of
// that window again; runs outside it keep their clocks, which differ from the window's ends, so
// nothing merges across it.
void refresh_runs(const MethodFrontier& f, const std::vector<int>& nodes,
                  const std::vector<int>& out, std::vector<ClockRun>& runs, std::size_t r) {
  const std::size_t lo = r >= 2 ? r - 2 : 0, hi = std::min(runs.size() - 1, r + 2);
  std::vector<ClockRun> mid = clock_runs(f, nodes, out, runs[lo].begin, runs[hi].end);
  runs.erase(runs.begin() + static_cast<std::ptrdiff_t>(lo),
             runs.begin() + static_cast<std::ptrdiff_t>(hi + 1));
  runs.insert(runs.begin() + static_cast<std::ptrdiff_t>(lo), mid.begin(), mid.end());
}

// One step of hold_clocks on one stage: merges (or, when no neighbour can take part, freezes)
// the shortest run below `min_hold_s`. False when every run lasts long enough. `runs` are the
// stage's clock runs under `out`, kept up to date.
bool merge_shortest_run(const MethodFrontier& f, const std::vector<int>& nodes, double min_hold_s,
                        bool toward_faster, std::vector<int>& out, std::set<int>& frozen,
                        std::vector<ClockRun>& runs) {
  if (runs.size() <= 1) return false;
  // The shortest run (first on ties); independent of min_hold_s, so a longer hold only
  // continues the same sequence of merges.
  std::optional<std::size_t> shortest;
  for (std::size_t r = 0; r < runs.size(); ++r) {
    if (frozen.count(nodes[runs[r].begin])) continue;
    if (!shortest || runs[r].time_s < runs[*shortest].time_s) shortest = r;
  }
  if (!shortest || runs[*shortest].time_s >= min_hold_s) return false;
  for (const auto& [which, target] : merge_moves(runs, *shortest, toward_faster)) {
    if (retarget_run(f, nodes, runs[which], target, out)) {
      refresh_runs(f, nodes, out, runs, *shortest);
      return true;
    }
  }
  if (retarget_pair_to_common_clock(f, nodes, runs, *shortest, toward_faster, out)) {
    refresh_runs(f, nodes, out, runs, *shortest);
    return true;
  }
  frozen.insert(nodes[runs[*shortest].begin]);  // no neighbour's clock can take it
  return true;
}

}  // namespace

namespace {

std::vector<std::vector<int>> hold_sequence_on(const MethodFrontier& f,
                                               const std::vector<std::vector<int>>& stages,
                                               const std::vector<int>& choice,
                                               const std::vector<double>& min_holds_s,
                                               bool toward_faster) {
  std::vector<std::vector<int>> results(min_holds_s.size(), choice);
  std::vector<int> out = choice;
  for (const auto& nodes : stages) {
    std::set<int> frozen;  // first node of runs that no neighbour's clock can take
    std::vector<ClockRun> runs = clock_runs(f, nodes, out);
    for (std::size_t k = 0; k < min_holds_s.size(); ++k) {
      const double hold = min_holds_s[k];
      if (k > 0 && hold < min_holds_s[k - 1]) {
        throw InternalError("hold_clocks_sequence: holds must be ascending");
      }
      if (hold > 0) {
        while (merge_shortest_run(f, nodes, hold, toward_faster, out, frozen, runs)) {
        }
      }
      for (int node : nodes) {
        results[k][static_cast<std::size_t>(node)] = out[static_cast<std::size_t>(node)];
      }
    }
  }
  return results;
}

}  // namespace

std::vector<std::vector<int>> hold_clocks_sequence(const MethodFrontier& f,
                                                   const std::vector<int>& choice,
                                                   const std::vector<double>& min_holds_s,
                                                   bool toward_faster) {
  return hold_sequence_on(f, stage_instructions(f), choice, min_holds_s, toward_faster);
}

std::vector<int> hold_clocks(const MethodFrontier& f, const std::vector<int>& choice,
                             double min_hold_s, bool toward_faster) {
  return hold_clocks_sequence(f, choice, {min_hold_s}, toward_faster).front();
}

void Planner::apply_clock_switch_cost(MethodFrontier& mf) const {
  const double cs = o_.clock_switch_s < 0 ? w_.gpu().clock_switch_s : o_.clock_switch_s;
  mf.clock_switch_s = cs;
  mf.min_clock_hold_s = o_.min_clock_hold_s;
  mf.points_without_switch_cost = mf.points;
  if (cs == 0 && o_.min_clock_hold_s == 0) return;  // the solver's points are exact already
  // The solver treats clock changes as free. Every point is re-evaluated with its stalls after
  // holding clocks for at least the requested time, and, since merging short runs can pay for
  // itself, also after longer holds (multiples of the switch time up to one clock per stage),
  // merging toward the faster and toward the slower neighbour; the Pareto set of all of them
  // is the frontier.
  std::vector<double> holds = {0};
  if (cs > 0) holds = {0, cs, 2 * cs, 4 * cs, 8 * cs, 16 * cs, 32 * cs, 64 * cs, 1e300};
  for (double& h : holds) h = std::max(h, o_.min_clock_hold_s);
  const std::string label = fmt::format("clock holds {}", to_string(mf.method));
  const DagTopology topo(mf);
  // One point's held variants, the Pareto set of them.
  auto variants = [&](std::size_t i) {
    std::vector<FrontierPoint> out;
    for (bool faster : {true, false}) {
      std::vector<int> previous;
      for (std::vector<int>& choice :
           hold_sequence_on(mf, topo.stages, mf.points[i].choice, holds, faster)) {
        if (choice == previous) continue;
        const ClockSchedule sch = schedule_on(mf, topo, choice, cs);
        previous = choice;
        out.push_back({sch.makespan_s, sch.energy_j, sch.dynamic_energy_j, std::move(choice)});
      }
    }
    return pareto_frontier(out);
  };
  // Points are independent: worked out on every core, a block at a time, and folded into the
  // running Pareto set in point order, so the result does not depend on the thread count and
  // memory holds the frontier and one block, not every candidate (thousands of points times
  // a choice per DAG node on a 405B-sized job).
  const std::size_t n = mf.points.size();
  const std::size_t threads = std::clamp<std::size_t>(std::thread::hardware_concurrency(), 1, 8);
  const std::size_t block = 8 * threads;
  std::vector<FrontierPoint> front;
  for (std::size_t b = 0; b < n; b += block) {
    throw_if_interrupted();
    const std::size_t e = std::min(n, b + block);
    std::vector<std::vector<FrontierPoint>> got(e - b);
    std::atomic<std::size_t> next{b};
    std::exception_ptr failed;
    std::mutex failed_mu;
    auto work = [&] {
      for (std::size_t i = next++; i < e; i = next++) {
        try {
          got[i - b] = variants(i);
        } catch (...) {
          const std::lock_guard<std::mutex> lock(failed_mu);
          if (!failed) failed = std::current_exception();
        }
      }
    };
    std::vector<std::thread> pool;
    for (std::size_t t = 1; t < std::min(threads, e - b); ++t) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
    if (failed) std::rethrow_exception(failed);
    for (auto& g : got) std::move(g.begin(), g.end(), std::back_inserter(front));
    front = pareto_frontier(front);
    if (progress_) progress_(label, e, n);
  }
  mf.points = std::move(front);
}

namespace {

// The plan's identity, totals and empty stages.
Plan plan_header(const Workload& w, const std::string& digest, const MethodFrontier& f,
                 const ClockSchedule& sch, const std::string& goal) {
  Plan p;
  p.workload = w.name;
  p.workload_digest = digest;
  p.gpu = w.gpu_name;
  p.gpus = w.cluster.gpus();
  p.layout = {w.parallel.tp, w.parallel.cp, w.parallel.dp, w.parallel.pp};
  p.chunks = w.parallel.virtual_pipeline;
  p.method = to_string(f.method);
  p.label = display_name(f.method);
  p.power_calibrated = w.gpu().power_calibrated;
  p.power_source = w.gpu().power_source;
  p.execution = f.execution;
  p.goal = goal;
  p.iteration_time_s = sch.makespan_s;
  p.energy_j = sch.energy_j;
  p.static_power_w = f.dag.static_power_w;
  p.clock_switch_s = f.clock_switch_s;
  p.min_clock_hold_s = f.min_clock_hold_s;
  for (int s = 0; s < w.parallel.pp; ++s) {
    PlanStage st;
    st.stage = s;
    st.ranks = p.layout.stage_ranks(s);
    st.clock_changes = s < static_cast<int>(sch.clock_changes.size())
                           ? sch.clock_changes[static_cast<std::size_t>(s)]
                           : 0;
    p.stages.push_back(std::move(st));
  }
  return p;
}

// Per (virtual stage, kind): each partition's instance count, for the plan's `instances`.
using InstanceCounts = std::map<std::pair<int, int>, std::map<std::string, int>>;
InstanceCounts instance_counts(const PartitionSet& ps, ExecutionMode execution) {
  InstanceCounts out;
  if (execution != ExecutionMode::kOverlapped) return out;
  for (const auto& is : ps.instructions) {
    auto& m = out[{is.stage, static_cast<int>(is.kind)}];
    for (const auto& step : is.steps) {
      if (step.kind == Step::Kind::kPartition)
        ++m[ps.partitions[static_cast<std::size_t>(step.index)].key];
    }
  }
  return out;
}

// How one partition runs inside an instruction of kind `kind` with configuration `c` (and the
// per-layer shares `mix`, if any).
PlanPartition plan_partition(const Partition& part, const PartitionConfig& c, InstructionKind kind,
                             int instances, const std::vector<ConfigShare>* mix) {
  auto describe = [&part](const std::string& slot_name) {
    const Slot& sl = part.slot(slot_name);
    return std::pair<std::string, int>{
        part.compute_ops.at(static_cast<std::size_t>(sl.op_index)).name, sl.op_index};
  };
  PlanPartition pp;
  pp.sms = c.sms;
  pp.slot = c.slot;
  std::tie(pp.slot_op, pp.slot_op_index) = describe(c.slot);
  pp.recompute = kind == InstructionKind::kBackward && part.direction == InstructionKind::kForward;
  pp.instances = instances;
  if (!mix) return pp;
  int first = 0;
  for (const auto& sh : *mix) {
    PlanMixEntry e;
    e.sms = sh.config.sms;
    e.slot = sh.config.slot;
    std::tie(e.slot_op, e.slot_op_index) = describe(sh.config.slot);
    e.first_instance = first;
    e.instances = sh.instances;
    first += sh.instances;
    pp.mix.push_back(std::move(e));
  }
  return pp;
}

PlanInstruction plan_instruction(const PartitionSet& ps, const DagNode& n,
                                 const InstructionOption& o, const ClockSchedule& sch,
                                 const std::map<std::string, int>& counts) {
  const auto i = static_cast<std::size_t>(n.id);
  PlanInstruction in;
  in.kind = n.instruction == DagNodeKind::kForward ? InstructionKind::kForward
                                                   : InstructionKind::kBackward;
  in.microbatch = n.microbatch;
  in.chunk = n.chunk;
  in.freq_mhz = o.freq_mhz;
  in.time_s = o.time_s;
  in.dynamic_energy_j = o.dynamic_energy_j;
  in.start_s = sch.start_s[i];
  in.end_s = sch.end_s[i];
  in.clock_switch = sch.clock_switch[i];
  in.sequential = o.sequential;
  for (const auto& [key, c] : o.partitions) {
    auto cnt = counts.find(key);
    auto mix = o.mixes.find(key);
    in.partitions.emplace(
        key, plan_partition(ps.partition(key), c, in.kind, cnt == counts.end() ? 0 : cnt->second,
                            mix == o.mixes.end() ? nullptr : &mix->second));
  }
  return in;
}

}  // namespace

Plan materialize_plan(const Workload& w, const PartitionSet& ps, const std::string& digest,
                      const MethodFrontier& f, const std::vector<int>& choice,
                      const std::string& goal) {
  const ClockSchedule sch = schedule_with_switches(f, choice, f.clock_switch_s);
  Plan p = plan_header(w, digest, f, sch, goal);
  p.avg_power_per_gpu_w = average_power_per_gpu_w(p.energy_j, p.iteration_time_s, p.gpus);
  p.peak_instruction_power_w = peak_instruction_power_w(f, choice);
  const InstanceCounts instances = instance_counts(ps, f.execution);
  static const std::map<std::string, int> kNoCounts;
  for (std::size_t i = 0; i < f.dag.nodes.size(); ++i) {
    const DagNode& n = f.dag.nodes[i];
    PlanStage& st = p.stages[static_cast<std::size_t>(n.stage)];
    if (n.instruction != DagNodeKind::kP2p) st.end_s = std::max(st.end_s, sch.end_s[i]);
    if (n.instruction == DagNodeKind::kDataParallel) {
      // A gradient node follows its backward (node i - 1, build_iteration_dag), whose buckets
      // it reduces while that runs; a gather has no micro-batch.
      const bool grad = n.microbatch >= 0;
      st.dp_collectives.push_back({grad ? "grad_reducescatter" : "param_allgather", n.chunk,
                                   grad ? sch.start_s[i - 1] : sch.start_s[i], sch.end_s[i]});
      continue;
    }
    const auto& opts = f.node_options(i);
    if (opts.empty()) continue;  // messages and reductions are not instructions
    const InstructionOption& o = opts.at(static_cast<std::size_t>(choice[i]));
    const InstructionKind kind = n.instruction == DagNodeKind::kForward
                                     ? InstructionKind::kForward
                                     : InstructionKind::kBackward;
    const int vs = n.chunk * w.parallel.pp + n.stage;
    auto counts = instances.find({vs, static_cast<int>(kind)});
    st.instructions.push_back(
        plan_instruction(ps, n, o, sch, counts == instances.end() ? kNoCounts : counts->second));
  }
  return p;
}

Plan Planner::make_plan(const MethodFrontier& f, std::size_t point, const std::string& goal) const {
  return materialize_plan(w_, ps_, digest_, f, f.points.at(point).choice, goal);
}

nlohmann::json dag_to_json(const IterationDag& dag) {
  nlohmann::json j;
  j["static_power_w"] = dag.static_power_w;
  j["gpus"] = dag.gpus;
  j["nodes"] = nlohmann::json::array();
  for (const auto& n : dag.nodes) {
    nlohmann::json nj = {{"id", n.id},
                         {"stage", n.stage},
                         {"chunk", n.chunk},
                         {"instruction", to_string(n.instruction)},
                         {"microbatch", n.microbatch},
                         {"options", nlohmann::json::array()}};
    for (const auto& o : n.options)
      nj["options"].push_back({{"time_s", o.time_s}, {"energy_j", o.energy_j}});
    j["nodes"].push_back(nj);
  }
  j["edges"] = nlohmann::json::array();
  for (const auto& [a, b] : dag.edges) j["edges"].push_back({a, b});
  return j;
}

}  // namespace kareus
