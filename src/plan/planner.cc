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

#include "kareus/error.h"
#include "kareus/pareto.h"

namespace kareus {

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
                 PlannerProgress progress)
    : w_(w),
      ps_(partition_workload(w)),
      digest_(workload_digest(w_, ps_)),
      profiler_(profiler),
      o_(std::move(o)),
      progress_(std::move(progress)) {
  freqs_ = o_.freqs_mhz.empty() ? w_.gpu().search_freqs_mhz() : o_.freqs_mhz;
  for (int f : freqs_) {
    if (!w_.gpu().supports_freq(f)) {
      throw InvalidInput(fmt::format("frequency {} MHz: {} supports {}..{} MHz in {} MHz steps", f,
                                     w_.gpu().name, w_.gpu().min_freq_mhz, w_.gpu().max_freq_mhz,
                                     w_.gpu().freq_step_mhz));
    }
  }
  if (w_.batch.nano_batches != 2) {
    throw InvalidInput(
        fmt::format("{}: key 'batch.nano_batches': planning needs 2 (the partitioned "
                    "overlap model)",
                    w_.source));
  }
}

const PartitionSet& Planner::sequential_partitions() {
  if (!seq_ps_) {
    Workload seq = w_;
    seq.batch.nano_batches = 1;
    seq_ps_ = partition_workload(seq);
  }
  return *seq_ps_;
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
    const SearchResult r = strategy->run(p, spaces[i], profiler_, o_.search, [&](int done, int) {
      if (progress_) progress_("search", done_before + static_cast<std::size_t>(done), total);
    });
    done_before += static_cast<std::size_t>(r.evaluations);
    PartitionSearchSummary s{p.key, spaces[i].size(), r.evaluations, r.resumed, 0};
    PartitionFronts fronts;
    for (const auto& [f, idx] : r.fronts_per_frequency()) {
      for (std::size_t k : idx) {
        const auto& pt = r.points[k];
        fronts[f].push_back({pt.config, pt.m.time_s, pt.m.dynamic_energy_j});
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

PartitionOption Planner::segment_cost(const Segment& s, int freq_mhz) {
  const Measurement m = profiler_.measure_segment(s, freq_mhz);
  return {{freq_mhz, 0, "-"}, m.time_s, m.dynamic_energy_j};
}

std::vector<InstructionOption> Planner::instruction_options(Method m, int stage, InstructionKind k,
                                                            bool per_instance) {
  const int fmax = *std::max_element(freqs_.begin(), freqs_.end());
  ComposeOptions co;
  co.per_instance = per_instance;
  const bool all_clocks =
      m == Method::kKareus || m == Method::kNanobatchPerseus || m == Method::kPerseus;
  co.freqs_mhz = all_clocks ? freqs_ : std::vector<int>{fmax};
  SegmentCostFn seg = [this](const Segment& s, int f) { return segment_cost(s, f); };
  if (m == Method::kPerseus || m == Method::kMegatron) {
    return compose_instruction(sequential_partitions(), stage, k, {}, seg, co);
  }
  std::map<std::string, PartitionFronts> fronts;
  if (m == Method::kKareus || m == Method::kKareusMaxClock) {
    search_partitions();
    fronts = searched_fronts_;
  } else {
    // NCCL's defaults: its default CTA count, launched at the partition start.
    for (const auto& p : ps_.partitions) {
      for (int f : co.freqs_mhz) {
        const PartitionConfig c{f, w_.gpu().nccl_default_channels, p.slots.front().name};
        const Measurement meas = profiler_.measure(p, c);
        fronts[p.key][f] = {{c, meas.time_s, meas.dynamic_energy_j}};
      }
    }
  }
  return compose_instruction(ps_, stage, k, fronts, seg, co);
}

MethodFrontier Planner::frontier(Method m) {
  if (!o_.per_layer) return frontier_with(m, false);
  // Per-layer choices are a superset of uniform ones, but the solver is a heuristic on
  // non-convex options: keep the uniform frontier's points too, mapped onto the per-layer DAG
  // (each node to the cheapest per-layer option no slower than its uniform choice), so the
  // per-layer frontier is never worse.
  const MethodFrontier uniform = frontier_with(m, false);
  MethodFrontier mf = frontier_with(m, true);
  for (const FrontierPoint& up : uniform.points) {
    FrontierPoint p;
    p.choice.resize(mf.dag.nodes.size());
    for (std::size_t i = 0; i < mf.dag.nodes.size(); ++i) {
      const DagOption& want = uniform.dag.nodes[i].options[static_cast<std::size_t>(up.choice[i])];
      const auto& opts = mf.dag.nodes[i].options;
      int best = 0;
      for (std::size_t j = 0; j < opts.size(); ++j) {
        const bool fits = opts[j].time_s <= want.time_s * (1 + 1e-12);
        const bool best_fits =
            opts[static_cast<std::size_t>(best)].time_s <= want.time_s * (1 + 1e-12);
        if (fits &&
            (!best_fits || opts[j].energy_j < opts[static_cast<std::size_t>(best)].energy_j)) {
          best = static_cast<int>(j);
        }
      }
      p.choice[i] = best;
    }
    p.time_s = mf.dag.makespan_s(p.choice);
    for (std::size_t i = 0; i < p.choice.size(); ++i) {
      p.dynamic_energy_j += mf.dag.nodes[i].options[static_cast<std::size_t>(p.choice[i])].energy_j;
    }
    p.energy_j = p.dynamic_energy_j + mf.dag.gpus * mf.dag.static_power_w * p.time_s;
    mf.points.push_back(std::move(p));
  }
  mf.points = pareto_frontier(mf.points);
  return mf;
}

MethodFrontier Planner::frontier_with(Method m, bool per_instance) {
  MethodFrontier mf;
  mf.method = m;
  mf.execution = (m == Method::kPerseus || m == Method::kMegatron) ? ExecutionMode::kSequential
                                                                   : ExecutionMode::kOverlapped;
  const int pp = w_.parallel.pp, mbs = w_.batch.micro_batches;
  const double per_stage = static_cast<double>(w_.parallel.tp) * w_.parallel.cp * w_.parallel.dp;
  IterationDag& dag = mf.dag;
  dag.static_power_w = profiler_.backend().static_power_w();
  dag.gpus = w_.cluster.gpus();

  std::map<std::pair<int, int>, std::vector<InstructionOption>> opts;
  for (int s = 0; s < pp; ++s) {
    for (InstructionKind k : {InstructionKind::kForward, InstructionKind::kBackward}) {
      opts[{s, static_cast<int>(k)}] = instruction_options(m, s, k, per_instance);
    }
  }
  auto add_node = [&](int stage, const std::string& instr, int mb, std::vector<DagOption> o,
                      std::vector<InstructionOption> io) {
    DagNode n;
    n.id = static_cast<int>(dag.nodes.size());
    n.stage = stage;
    n.instruction = instr;
    n.microbatch = mb;
    n.options = std::move(o);
    dag.nodes.push_back(std::move(n));
    mf.node_options.push_back(std::move(io));
    return dag.nodes.back().id;
  };
  // Messages between stages and the once-per-iteration reductions: one option each, at the
  // maximum clock with NCCL's default CTAs.
  const int fmax = w_.gpu().max_freq_mhz;
  const Segment p2p{"p2p", 0, "p2p", {ps_.graph.p2p}};
  const PartitionOption p2p_cost = pp > 1 ? segment_cost(p2p, fmax) : PartitionOption{};
  std::map<std::tuple<int, int, int>, int> node_of;  // (stage, kind, mb) -> node
  std::vector<int> last(static_cast<std::size_t>(pp), -1);
  for (int s = 0; s < pp; ++s) {
    for (const auto& [k, mb] : one_f_one_b_order(s, pp, mbs)) {
      const auto& io = opts.at({s, static_cast<int>(k)});
      if (io.empty()) {
        throw InternalError(fmt::format("no option for {} on stage {}", to_string(k), s));
      }
      std::vector<DagOption> o;
      for (const auto& x : io) o.push_back({x.time_s, x.dynamic_energy_j * per_stage});
      const int id = add_node(s, to_string(k), mb, std::move(o), io);
      node_of[{s, static_cast<int>(k), mb}] = id;
      if (last[static_cast<std::size_t>(s)] >= 0)
        dag.edges.push_back({last[static_cast<std::size_t>(s)], id});
      last[static_cast<std::size_t>(s)] = id;
    }
  }
  for (int mb = 0; mb < mbs; ++mb) {
    for (int s = 0; s + 1 < pp; ++s) {
      const int f = node_of.at({s, 0, mb}), f2 = node_of.at({s + 1, 0, mb});
      const int msg =
          add_node(s, "p2p", mb, {{p2p_cost.time_s, p2p_cost.dynamic_energy_j * per_stage}}, {});
      dag.edges.push_back({f, msg});
      dag.edges.push_back({msg, f2});
      const int b = node_of.at({s + 1, 1, mb}), b2 = node_of.at({s, 1, mb});
      const int back = add_node(s + 1, "p2p", mb,
                                {{p2p_cost.time_s, p2p_cost.dynamic_energy_j * per_stage}}, {});
      dag.edges.push_back({b, back});
      dag.edges.push_back({back, b2});
    }
  }
  for (int idx : ps_.iteration_segments) {
    const Segment& seg = ps_.segments[static_cast<std::size_t>(idx)];
    const PartitionOption c = segment_cost(seg, fmax);
    const int id =
        add_node(seg.stage, "iteration", -1, {{c.time_s, c.dynamic_energy_j * per_stage}}, {});
    dag.edges.push_back({last[static_cast<std::size_t>(seg.stage)], id});
    last[static_cast<std::size_t>(seg.stage)] = id;
  }
  FrontierOptions fo;
  fo.unit_s = o_.unit_s;
  mf.points = solve_frontier(dag, fo, &mf.stats);
  if (progress_) progress_(fmt::format("frontier {}", to_string(m)), 1, 1);
  return mf;
}

Plan Planner::make_plan(const MethodFrontier& f, std::size_t point, const std::string& goal) const {
  const FrontierPoint& fp = f.points.at(point);
  Plan p;
  p.workload = w_.name;
  p.workload_digest = digest_;
  p.gpu = w_.gpu_name;
  p.gpus = w_.cluster.gpus();
  p.method = to_string(f.method);
  p.execution = f.execution;
  p.goal = goal;
  p.iteration_time_s = fp.time_s;
  p.energy_j = fp.energy_j;
  p.static_power_w = f.dag.static_power_w;
  for (int s = 0; s < w_.parallel.pp; ++s) p.stages.push_back({s, {}});
  for (std::size_t i = 0; i < f.dag.nodes.size(); ++i) {
    const DagNode& n = f.dag.nodes[i];
    if (f.node_options[i].empty()) continue;  // messages and reductions are not instructions
    const InstructionOption& o = f.node_options[i][static_cast<std::size_t>(fp.choice[i])];
    PlanInstruction in;
    in.kind = n.instruction == "forward" ? InstructionKind::kForward : InstructionKind::kBackward;
    in.microbatch = n.microbatch;
    in.freq_mhz = o.freq_mhz;
    in.time_s = o.time_s;
    in.dynamic_energy_j = o.dynamic_energy_j;
    in.partitions = o.partitions;
    in.mixes = o.mixes;
    p.stages[static_cast<std::size_t>(n.stage)].instructions.push_back(std::move(in));
  }
  return p;
}

nlohmann::json dag_to_json(const IterationDag& dag) {
  nlohmann::json j;
  j["static_power_w"] = dag.static_power_w;
  j["gpus"] = dag.gpus;
  j["nodes"] = nlohmann::json::array();
  for (const auto& n : dag.nodes) {
    nlohmann::json nj = {{"id", n.id},
                         {"stage", n.stage},
                         {"instruction", n.instruction},
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
