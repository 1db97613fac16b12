// C API of the Kareus runtime (include/kareus/c_api.h), over kareus::Plan (format v2) and
// runtime::FrequencyController and runtime::EnergyMonitor. Follows XGBoost's C API pattern: every
// entry point catches every exception, stores its message in a thread-local string and returns a
// status code, so no C++ exception crosses the boundary. The instruction hooks enforce the order of
// the stage's instruction list in the plan (validated against the workload's pipeline schedule when
// the plan is opened) because a training loop that drifts from it would apply the wrong clocks and
// slots silently.
#include "kareus/c_api.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "kareus/error.h"
#include "kareus/monitor.h"
#include "kareus/partition.h"
#include "kareus/plan.h"
#include "kareus/plan_check.h"
#include "kareus/runtime.h"
#include "kareus/schedule.h"
#include "kareus/workload.h"

namespace {

thread_local std::string g_last_error;

/// Errors of the C layer itself that have no counterpart in kareus/error.h.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, const std::string& what) : std::runtime_error(what), status_(status) {}
  int status() const { return status_; }

 private:
  int status_;
};

[[noreturn]] void fail(int status, const std::string& what) { throw ApiError(status, what); }

template <typename F>
int guarded(const char* function, F&& body) {
  try {
    body();
    return KAREUS_OK;
  } catch (const ApiError& e) {
    g_last_error = fmt::format("{}: {}", function, e.what());
    return e.status();
  } catch (const kareus::InvalidInput& e) {
    g_last_error = e.what();
    return KAREUS_ERR_INVALID_INPUT;
  } catch (const kareus::NotSupported& e) {
    g_last_error = e.what();
    return KAREUS_ERR_NOT_SUPPORTED;
  } catch (const kareus::StateError& e) {
    g_last_error = e.what();
    return KAREUS_ERR_STATE;
  } catch (const kareus::Error& e) {
    g_last_error = e.what();
    return KAREUS_ERR_INTERNAL;
  } catch (const std::bad_alloc&) {
    g_last_error = fmt::format("{}: out of memory", function);
    return KAREUS_ERR_INTERNAL;
  } catch (const std::exception& e) {
    g_last_error = fmt::format("{}: {}", function, e.what());
    return KAREUS_ERR_INTERNAL;
  } catch (...) {
    g_last_error = fmt::format("{}: unknown exception", function);
    return KAREUS_ERR_INTERNAL;
  }
}

template <typename T>
T* need(T* p, const char* name) {
  if (p == nullptr) fail(KAREUS_ERR_ARGUMENT, fmt::format("'{}' is NULL", name));
  return p;
}

kareus::InstructionKind to_kind(int kind) {
  if (kind == KAREUS_FORWARD) return kareus::InstructionKind::kForward;
  if (kind == KAREUS_BACKWARD) return kareus::InstructionKind::kBackward;
  fail(KAREUS_ERR_ARGUMENT,
       fmt::format("kind {}: allowed KAREUS_FORWARD (0), KAREUS_BACKWARD (1)", kind));
}

int from_kind(kareus::InstructionKind k) {
  return k == kareus::InstructionKind::kForward ? KAREUS_FORWARD : KAREUS_BACKWARD;
}

/// "forward of micro-batch 1 (chunk 0)", as the plan checks write an instruction.
std::string name_of(kareus::InstructionKind k, int chunk, int microbatch) {
  return fmt::format("{} of micro-batch {} (chunk {})", kareus::to_string(k), microbatch, chunk);
}

}  // namespace

struct kareus_controller {
  std::unique_ptr<kareus::runtime::FrequencyController> impl;
  pid_t pid = 0;
  bool stopped = false;
  /// Plans attached to this controller, so freeing it can detach them instead of leaving them a
  /// dangling pointer.
  std::vector<kareus_plan*> plans;
};

struct kareus_monitor {
  std::unique_ptr<kareus::runtime::EnergyMonitor> impl;
  /// Plans whose hooks time instructions with this monitor (detached when it is destroyed).
  std::vector<kareus_plan*> plans;
  std::string note, summary, reason;  ///< storage of the strings handed out
};

struct kareus_plan {
  kareus::Workload workload;
  kareus::Plan plan;
  std::string path;
  int rank = 0;
  int stage = 0;
  const char* schedule = "1f1b";  ///< Schedule::name() of the workload's schedule
  /// Partitions of each instruction of the stage, ordered by key (the plan's map order).
  std::vector<std::vector<std::pair<const std::string*, const kareus::PlanPartition*>>> parts;
  kareus_controller* controller = nullptr;
  kareus_monitor* monitor = nullptr;
  std::size_t next = 0;  ///< index of the next (or open) instruction
  bool open = false;

  const kareus::PlanStage& st() const { return plan.stages.at(static_cast<std::size_t>(stage)); }
  const kareus::PlanInstruction& instruction(int index) const {
    const auto& ins = st().instructions;
    if (index < 0 || static_cast<std::size_t>(index) >= ins.size()) {
      fail(KAREUS_ERR_ARGUMENT, fmt::format("instruction index {}: stage {} has {} (0..{})", index,
                                            stage, ins.size(), ins.size() - 1));
    }
    return ins[static_cast<std::size_t>(index)];
  }
  std::pair<const std::string*, const kareus::PlanPartition*> partition(int index, int p) const {
    instruction(index);
    const auto& list = parts[static_cast<std::size_t>(index)];
    if (p < 0 || static_cast<std::size_t>(p) >= list.size()) {
      fail(KAREUS_ERR_ARGUMENT,
           fmt::format("partition index {}: instruction {} has {}", p, index, list.size()));
    }
    return list[static_cast<std::size_t>(p)];
  }
  std::string describe(std::size_t index) const {
    const auto& in = st().instructions[index];
    return fmt::format("{} (instruction {} of {})", name_of(in.kind, in.chunk, in.microbatch),
                       index, st().instructions.size());
  }
  /// Checks a chunk argument: KAREUS_ERR_ARGUMENT outside 0..chunks-1.
  void check_chunk(int chunk) const {
    if (chunk < 0 || chunk >= plan.chunks) {
      fail(KAREUS_ERR_ARGUMENT,
           fmt::format("chunk {}: the plan's stages hold {} model chunk{} (0..{})", chunk,
                       plan.chunks, plan.chunks == 1 ? "" : "s", plan.chunks - 1));
    }
  }
  /// The chunk-less forms of the instruction functions name chunk 0: refused where that is
  /// ambiguous (an interleaved plan), pointing at the `_chunk` function.
  void check_unchunked(const char* function, kareus::InstructionKind k, int microbatch) const {
    if (plan.chunks == 1) return;
    fail(KAREUS_ERR_ORDER,
         fmt::format("rank {} (stage {}): {} of micro-batch {} without a chunk: the plan runs "
                     "the {} schedule with {} model chunks per stage, where (kind, micro-batch) "
                     "names {} instructions; call {}_chunk (next in the plan: {})",
                     rank, stage, kareus::to_string(k), microbatch, schedule, plan.chunks,
                     plan.chunks, function, describe(next)));
  }
};

namespace {

// Removes the plan from its controller's list and clears its pointer.
void detach(kareus_plan* plan) {
  kareus_controller* c = plan->controller;
  if (c == nullptr) return;
  std::erase(c->plans, plan);
  plan->controller = nullptr;
}

// The same for its monitor.
void detach_monitor(kareus_plan* plan) {
  kareus_monitor* m = plan->monitor;
  if (m == nullptr) return;
  std::erase(m->plans, plan);
  plan->monitor = nullptr;
}

}  // namespace

extern "C" {

const char* kareus_last_error(void) { return g_last_error.c_str(); }

const char* kareus_status_name(int status) {
  switch (status) {
    case KAREUS_OK:
      return "KAREUS_OK";
    case KAREUS_ERR_ARGUMENT:
      return "KAREUS_ERR_ARGUMENT";
    case KAREUS_ERR_INVALID_INPUT:
      return "KAREUS_ERR_INVALID_INPUT";
    case KAREUS_ERR_NOT_SUPPORTED:
      return "KAREUS_ERR_NOT_SUPPORTED";
    case KAREUS_ERR_ORDER:
      return "KAREUS_ERR_ORDER";
    case KAREUS_ERR_STATE:
      return "KAREUS_ERR_STATE";
    case KAREUS_ERR_INTERNAL:
      return "KAREUS_ERR_INTERNAL";
    default:
      return "unknown";
  }
}

const char* kareus_version(void) { return "0.1.0"; }

int kareus_plan_format_version(void) { return kareus::Plan::kVersion; }

int kareus_plan_open(const char* plan_path, const char* workload_path, int global_rank,
                     kareus_plan** out) {
  return guarded(__func__, [&] {
    need(out, "out");
    *out = nullptr;
    need(plan_path, "plan_path");
    need(workload_path, "workload_path");
    auto h = std::make_unique<kareus_plan>();
    h->path = plan_path;
    h->workload = kareus::load_workload(workload_path);
    h->plan = kareus::load_plan(plan_path, h->workload);
    try {
      h->stage = h->plan.stage_of_rank(global_rank);
    } catch (const kareus::InvalidInput& e) {
      throw kareus::InvalidInput(fmt::format("{}: global rank: {}", plan_path, e.what()));
    }
    h->rank = global_rank;
    h->schedule = h->workload.schedule().name();
    for (const auto& in : h->st().instructions) {
      auto& list = h->parts.emplace_back();
      for (const auto& [key, part] : in.partitions) list.push_back({&key, &part});
    }
    *out = h.release();
  });
}

void kareus_plan_close(kareus_plan* plan) {
  if (plan == nullptr) return;
  detach(plan);
  detach_monitor(plan);
  delete plan;
}

int kareus_plan_rank(const kareus_plan* plan, int* global_rank) {
  return guarded(__func__, [&] { *need(global_rank, "global_rank") = need(plan, "plan")->rank; });
}

int kareus_plan_stage(const kareus_plan* plan, int* stage) {
  return guarded(__func__, [&] { *need(stage, "stage") = need(plan, "plan")->stage; });
}

int kareus_plan_num_stages(const kareus_plan* plan, int* stages) {
  return guarded(__func__, [&] {
    *need(stages, "stages") = static_cast<int>(need(plan, "plan")->plan.stages.size());
  });
}

int kareus_plan_num_ranks(const kareus_plan* plan, int* ranks) {
  return guarded(__func__, [&] { *need(ranks, "ranks") = need(plan, "plan")->plan.layout.gpus(); });
}

int kareus_plan_stage_of_rank(const kareus_plan* plan, int global_rank, int* stage) {
  return guarded(__func__, [&] {
    need(stage, "stage");
    *stage = need(plan, "plan")->plan.stage_of_rank(global_rank);
  });
}

int kareus_plan_stage_ranks(const kareus_plan* plan, int stage, int* ranks, int capacity,
                            int* count) {
  return guarded(__func__, [&] {
    need(count, "count");
    if (capacity < 0) fail(KAREUS_ERR_ARGUMENT, fmt::format("capacity {} < 0", capacity));
    if (capacity > 0) need(ranks, "ranks");
    const auto r = need(plan, "plan")->plan.layout.stage_ranks(stage);
    for (std::size_t i = 0; i < r.size() && static_cast<int>(i) < capacity; ++i) ranks[i] = r[i];
    *count = static_cast<int>(r.size());
  });
}

int kareus_plan_chunks(const kareus_plan* plan, int* chunks) {
  return guarded(__func__, [&] { *need(chunks, "chunks") = need(plan, "plan")->plan.chunks; });
}

int kareus_plan_schedule_name(const kareus_plan* plan, const char** name) {
  return guarded(__func__, [&] { *need(name, "name") = need(plan, "plan")->schedule; });
}

int kareus_plan_chunk_layers(const kareus_plan* plan, int chunk, int* layers, int* first_layer) {
  return guarded(__func__, [&] {
    need(plan, "plan")->check_chunk(chunk);
    const auto& par = plan->workload.parallel;
    const auto vs = static_cast<std::size_t>(chunk * par.pp + plan->stage);
    int first = 0;
    for (std::size_t i = 0; i < vs; ++i) first += par.stage_layers.at(i);
    if (layers != nullptr) *layers = par.stage_layers.at(vs);
    if (first_layer != nullptr) *first_layer = first;
  });
}

int kareus_plan_workload_shape(const kareus_plan* plan, kareus_workload_shape* out) {
  return guarded(__func__, [&] {
    need(out, "out");
    const auto& w = need(plan, "plan")->workload;
    const auto& m = w.model;
    *out = {};
    out->layers = m.layers;
    out->hidden = m.hidden;
    out->ffn_hidden = m.ffn_hidden;
    out->heads = m.heads;
    out->kv_heads = m.kv_heads;
    out->head_dim = m.head_dim;
    out->vocab = m.vocab;
    out->qk_norm = m.qk_norm ? 1 : 0;
    out->tied_embeddings = m.tied_embeddings ? 1 : 0;
    out->tp = w.parallel.tp;
    out->cp = w.parallel.cp;
    out->pp = w.parallel.pp;
    out->dp = w.parallel.dp;
    out->sequence_parallel = w.parallel.sequence_parallel ? 1 : 0;
    out->micro_batch = w.batch.micro_batch;
    out->seq_len = w.batch.seq_len;
    out->micro_batches = w.batch.micro_batches;
    out->nano_batches = w.batch.nano_batches;
    out->recompute = w.recompute == kareus::Recompute::kFull ? 1 : 0;
    out->stage_layers = w.parallel.layers_of_stage(plan->stage);
    out->virtual_pipeline = w.parallel.virtual_pipeline;
  });
}

int kareus_plan_instruction_count(const kareus_plan* plan, int* count) {
  return guarded(__func__, [&] {
    *need(count, "count") = static_cast<int>(need(plan, "plan")->st().instructions.size());
  });
}

int kareus_plan_instruction(const kareus_plan* plan, int index, kareus_instruction_info* out) {
  return guarded(__func__, [&] {
    need(out, "out");
    const auto& in = need(plan, "plan")->instruction(index);
    *out = {};
    out->kind = from_kind(in.kind);
    out->microbatch = in.microbatch;
    out->freq_mhz = in.freq_mhz;
    out->partition_count = static_cast<int>(in.partitions.size());
    out->start_s = in.start_s;
    out->end_s = in.end_s;
    out->time_s = in.time_s;
    out->chunk = in.chunk;
  });
}

int kareus_plan_instruction_sequential(const kareus_plan* plan, int index, int* sequential) {
  return guarded(__func__, [&] {
    need(sequential, "sequential");
    *sequential = need(plan, "plan")->instruction(index).sequential ? 1 : 0;
  });
}

}  // extern "C"

namespace {

int find_instruction(const kareus_plan* plan, int kind, int chunk, int microbatch) {
  const auto k = to_kind(kind);
  plan->check_chunk(chunk);
  const auto& ins = plan->st().instructions;
  for (std::size_t i = 0; i < ins.size(); ++i) {
    if (ins[i].kind == k && ins[i].chunk == chunk && ins[i].microbatch == microbatch) {
      return static_cast<int>(i);
    }
  }
  fail(KAREUS_ERR_ARGUMENT,
       fmt::format("stage {} has no {}", plan->stage, name_of(k, chunk, microbatch)));
}

}  // namespace

extern "C" {

int kareus_plan_find_instruction_chunk(const kareus_plan* plan, int kind, int chunk, int microbatch,
                                       int* index) {
  return guarded(__func__, [&] {
    need(index, "index");
    *index = find_instruction(need(plan, "plan"), kind, chunk, microbatch);
  });
}

int kareus_plan_find_instruction(const kareus_plan* plan, int kind, int microbatch, int* index) {
  return guarded(__func__, [&] {
    need(index, "index");
    need(plan, "plan")->check_unchunked("kareus_plan_find_instruction", to_kind(kind), microbatch);
    *index = find_instruction(plan, kind, 0, microbatch);
  });
}

int kareus_schedule_order(int stages, int chunks, int microbatches, int stage,
                          kareus_scheduled_instruction* out, int capacity, int* count) {
  return guarded(__func__, [&] {
    need(count, "count");
    if (capacity < 0) fail(KAREUS_ERR_ARGUMENT, fmt::format("capacity {} < 0", capacity));
    if (capacity > 0) need(out, "out");
    const kareus::Schedule sched(stages, chunks, microbatches);
    if (stage < 0 || stage >= stages) {
      fail(KAREUS_ERR_ARGUMENT,
           fmt::format("stage {}: the schedule has {} stages (0..{})", stage, stages, stages - 1));
    }
    const auto& order = sched.order(stage);
    for (std::size_t i = 0; i < order.size() && static_cast<int>(i) < capacity; ++i) {
      out[i] = {from_kind(order[i].kind), order[i].chunk, order[i].microbatch};
    }
    *count = static_cast<int>(order.size());
  });
}

int kareus_schedule_name(int stages, int chunks, int microbatches, const char** name) {
  return guarded(__func__, [&] {
    need(name, "name");
    *name = kareus::Schedule(stages, chunks, microbatches).name();
  });
}

int kareus_workload_partitions_json(const char* workload_path, const char** json) {
  thread_local std::string text;
  return guarded(__func__, [&] {
    need(json, "json");
    const auto set = kareus::partition_workload(kareus::load_workload(need(workload_path,
                                                                          "workload_path")));
    nlohmann::json parts = nlohmann::json::array();
    for (const auto& p : set.partitions) {
      nlohmann::json ops = nlohmann::json::array(), slots = nlohmann::json::array(),
                     tail = nlohmann::json::array();
      for (const auto& k : p.compute_ops) ops.push_back(k.name);
      for (const auto& s : p.slots) slots.push_back({{"name", s.name}, {"op_index", s.op_index}});
      for (const auto& k : p.comm_tail) tail.push_back(k.name);
      parts.push_back({{"key", p.key},
                       {"direction", kareus::to_string(p.direction)},
                       {"ops", ops},
                       {"slots", slots},
                       {"collective", {{"name", p.collective.name},
                                       {"kind", kareus::to_string(p.collective.collective)},
                                       {"group", kareus::to_string(p.collective.group)}}},
                       {"comm_tail", tail}});
    }
    text = nlohmann::json{{"partitions", parts}}.dump();
    *json = text.c_str();
  });
}

int kareus_plan_partition(const kareus_plan* plan, int instruction, int partition,
                          kareus_partition_info* out) {
  return guarded(__func__, [&] {
    need(out, "out");
    const auto [key, p] = need(plan, "plan")->partition(instruction, partition);
    *out = {};
    out->key = key->c_str();
    out->sms = p->sms;
    out->slot = p->slot.c_str();
    out->slot_op = p->slot_op.c_str();
    out->slot_op_index = p->slot_op_index;
    out->recompute = p->recompute ? 1 : 0;
    out->instances = p->instances;
    out->mix_count = static_cast<int>(p->mix.size());
  });
}

int kareus_plan_partition_mix(const kareus_plan* plan, int instruction, int partition, int entry,
                              kareus_mix_info* out) {
  return guarded(__func__, [&] {
    need(out, "out");
    const auto [key, p] = need(plan, "plan")->partition(instruction, partition);
    if (entry < 0 || static_cast<std::size_t>(entry) >= p->mix.size()) {
      fail(KAREUS_ERR_ARGUMENT,
           fmt::format("mix entry {}: partition '{}' has {}", entry, *key, p->mix.size()));
    }
    const auto& e = p->mix[static_cast<std::size_t>(entry)];
    *out = {};
    out->sms = e.sms;
    out->slot = e.slot.c_str();
    out->slot_op = e.slot_op.c_str();
    out->slot_op_index = e.slot_op_index;
    out->first_instance = e.first_instance;
    out->instances = e.instances;
  });
}

int kareus_controller_start(int gpu_index, int dry_run, const char* log_path,
                            kareus_controller** out) {
  kareus_controller_options o{};
  o.gpu_index = gpu_index;
  o.dry_run = dry_run;
  o.log_path = log_path;
  return kareus_controller_start_ex(&o, out);
}

int kareus_controller_start_ex(const kareus_controller_options* options, kareus_controller** out) {
  return guarded(__func__, [&] {
    need(out, "out");
    *out = nullptr;
    need(options, "options");
    if (options->gpu_index < 0) {
      fail(KAREUS_ERR_ARGUMENT, fmt::format("gpu_index {} < 0", options->gpu_index));
    }
    kareus::runtime::ControllerOptions o;
    o.gpu_index = options->gpu_index;
    o.dry_run = options->dry_run != 0;
    if (options->log_path) o.log_path = options->log_path;
    if (options->executable) o.executable = options->executable;
    if (options->nvml_library) o.nvml_library = options->nvml_library;
    if (options->gpu_uuid) o.gpu_uuid = options->gpu_uuid;
    if (options->pci_bus_id) o.pci_bus_id = options->pci_bus_id;
    o.coalesce = options->coalesce != 0;
    if (o.dry_run && o.log_path.empty()) {
      fail(KAREUS_ERR_ARGUMENT, "a dry-run controller needs log_path (its JSON-lines log)");
    }
    auto c = std::make_unique<kareus_controller>();
    c->impl = kareus::runtime::FrequencyController::start(o);
    c->pid = c->impl->pid();
    *out = c.release();
  });
}

int kareus_controller_set_clock(kareus_controller* controller, int freq_mhz) {
  return guarded(__func__, [&] {
    need(controller, "controller");
    if (freq_mhz < 0) fail(KAREUS_ERR_ARGUMENT, fmt::format("freq_mhz {} < 0", freq_mhz));
    if (controller->stopped) {
      fail(KAREUS_ERR_STATE, fmt::format("controller (pid {}) is stopped", controller->pid));
    }
    controller->impl->set_clock(freq_mhz);
  });
}

int kareus_controller_pid(const kareus_controller* controller, int* pid) {
  return guarded(
      __func__, [&] { *need(pid, "pid") = static_cast<int>(need(controller, "controller")->pid); });
}

int kareus_controller_stop(kareus_controller* controller) {
  return guarded(__func__, [&] {
    need(controller, "controller");
    if (controller->stopped) return;
    controller->stopped = true;
    controller->impl->stop();
  });
}

void kareus_controller_free(kareus_controller* controller) {
  if (controller == nullptr) return;
  // Stop first, here, where a failure can be caught: it must not escape into C.
  (void)kareus_controller_stop(controller);
  for (kareus_plan* plan : controller->plans) plan->controller = nullptr;
  delete controller;
}

int kareus_plan_attach_controller(kareus_plan* plan, kareus_controller* controller) {
  return guarded(__func__, [&] {
    need(plan, "plan");
    detach(plan);
    if (controller != nullptr) {
      controller->plans.push_back(plan);
      plan->controller = controller;
    }
  });
}

}  // extern "C"

namespace {

void instruction_begin(kareus_plan* plan, int kind, int chunk, int microbatch) {
  const auto k = to_kind(kind);
  plan->check_chunk(chunk);
  const auto& ins = plan->st().instructions;
  if (plan->open) {
    fail(KAREUS_ERR_ORDER, fmt::format("rank {} (stage {}): begin of {} while {} is open; call "
                                       "kareus_instruction_end_chunk first",
                                       plan->rank, plan->stage, name_of(k, chunk, microbatch),
                                       plan->describe(plan->next)));
  }
  const auto& want = ins.at(plan->next);
  if (want.kind != k || want.chunk != chunk || want.microbatch != microbatch) {
    fail(KAREUS_ERR_ORDER,
         fmt::format("rank {} (stage {}): begin of {}, but the plan's {} order runs {} next",
                     plan->rank, plan->stage, name_of(k, chunk, microbatch), plan->schedule,
                     plan->describe(plan->next)));
  }
  if (plan->controller != nullptr && plan->controller->stopped) {
    fail(KAREUS_ERR_STATE,
         fmt::format("the attached controller (pid {}) is stopped", plan->controller->pid));
  }
  // The last check that can fail: nothing has changed when it throws.
  if (plan->monitor != nullptr) plan->monitor->impl->begin_instruction(k, microbatch, chunk);
  if (plan->controller != nullptr) {
    try {
      plan->controller->impl->set_clock(want.freq_mhz);
    } catch (const kareus::Error& e) {
      // The controller died (its own reset ran, or its parent-death path will): failing every
      // later hook would kill a training job that only lost its energy saving.
      std::fprintf(stderr,
                   "kareus: warning: rank %d: %s; detaching the frequency controller, training "
                   "continues at the GPU's default clocks\n",
                   plan->rank, e.what());
      detach(plan);
    }
  }
  plan->open = true;
}

void instruction_end(kareus_plan* plan, int kind, int chunk, int microbatch) {
  const auto k = to_kind(kind);
  plan->check_chunk(chunk);
  const auto& ins = plan->st().instructions;
  const auto& want = ins.at(plan->next);
  if (!plan->open) {
    fail(KAREUS_ERR_ORDER,
         fmt::format("rank {} (stage {}): end of {} without a begin; next in the plan's {} "
                     "order is {}",
                     plan->rank, plan->stage, name_of(k, chunk, microbatch), plan->schedule,
                     plan->describe(plan->next)));
  }
  if (want.kind != k || want.chunk != chunk || want.microbatch != microbatch) {
    fail(KAREUS_ERR_ORDER,
         fmt::format("rank {} (stage {}): end of {}, but the open instruction is {}", plan->rank,
                     plan->stage, name_of(k, chunk, microbatch), plan->describe(plan->next)));
  }
  if (plan->monitor != nullptr) plan->monitor->impl->end_instruction(k, microbatch, chunk);
  plan->open = false;
  plan->next = (plan->next + 1) % ins.size();
}

}  // namespace

extern "C" {

int kareus_instruction_begin_chunk(kareus_plan* plan, int kind, int chunk, int microbatch) {
  return guarded(__func__, [&] { instruction_begin(need(plan, "plan"), kind, chunk, microbatch); });
}

int kareus_instruction_end_chunk(kareus_plan* plan, int kind, int chunk, int microbatch) {
  return guarded(__func__, [&] { instruction_end(need(plan, "plan"), kind, chunk, microbatch); });
}

int kareus_instruction_begin(kareus_plan* plan, int kind, int microbatch) {
  return guarded(__func__, [&] {
    need(plan, "plan")->check_unchunked("kareus_instruction_begin", to_kind(kind), microbatch);
    instruction_begin(plan, kind, 0, microbatch);
  });
}

int kareus_instruction_end(kareus_plan* plan, int kind, int microbatch) {
  return guarded(__func__, [&] {
    need(plan, "plan")->check_unchunked("kareus_instruction_end", to_kind(kind), microbatch);
    instruction_end(plan, kind, 0, microbatch);
  });
}

int kareus_plan_position(const kareus_plan* plan, int* next_index, int* open) {
  return guarded(__func__, [&] {
    need(plan, "plan");
    *need(next_index, "next_index") = static_cast<int>(plan->next);
    *need(open, "open") = plan->open ? 1 : 0;
  });
}

int kareus_plan_reset_position(kareus_plan* plan) {
  return guarded(__func__, [&] {
    need(plan, "plan")->next = 0;
    if (plan->open && plan->monitor != nullptr) plan->monitor->impl->cancel_instruction();
    plan->open = false;
  });
}

}  // extern "C"

// ---- Energy monitor.

namespace {

kareus::runtime::MonitorOptions monitor_options(const kareus_monitor_options& c) {
  for (const auto& [value, name] : {std::pair{c.rank, "rank"}, std::pair{c.stage, "stage"},
                                    std::pair{c.gpu_index, "gpu_index"}}) {
    if (value < 0) fail(KAREUS_ERR_ARGUMENT, fmt::format("{} {} < 0", name, value));
  }
  if (!(std::isfinite(c.tokens_per_iteration) && c.tokens_per_iteration >= 0)) {
    fail(KAREUS_ERR_ARGUMENT, fmt::format("tokens_per_iteration {}: allowed 0 (none) or a finite "
                                          "number > 0",
                                          c.tokens_per_iteration));
  }
  kareus::runtime::MonitorOptions o;
  o.rank = c.rank;
  o.stage = c.stage;
  o.gpu_index = c.gpu_index;
  if (c.gpu_uuid) o.gpu_uuid = c.gpu_uuid;
  if (c.pci_bus_id) o.pci_bus_id = c.pci_bus_id;
  o.nvml = c.times_only == 0;
  if (c.nvml_library) o.nvml_library = c.nvml_library;
  o.per_instruction = c.per_instruction != 0;
  if (c.out_path) o.out_path = c.out_path;
  if (c.tokens_per_iteration > 0) o.tokens_per_iteration = c.tokens_per_iteration;
  if (c.plan != nullptr) {
    const kareus::Plan& p = c.plan->plan;
    const int stage = p.stage_of_rank(c.rank);
    if (stage != c.stage) {
      fail(KAREUS_ERR_ARGUMENT, fmt::format("rank {} is in stage {} of the plan {}, not stage {}",
                                            c.rank, stage, c.plan->path, c.stage));
    }
    o.prediction = kareus::runtime::MonitorPrediction::from_plan(p, c.stage, c.plan->path);
  }
  return o;
}

const std::string& record_at(const kareus_monitor* m, int index) {
  const auto& records = m->impl->records();
  if (index < 0 || static_cast<std::size_t>(index) >= records.size()) {
    fail(KAREUS_ERR_ARGUMENT,
         fmt::format("record index {}: the monitor holds {}", index, records.size()));
  }
  return records[static_cast<std::size_t>(index)];
}

}  // namespace

extern "C" {

int kareus_monitor_create(const kareus_monitor_options* options, kareus_monitor** out) {
  return guarded(__func__, [&] {
    need(out, "out");
    *out = nullptr;
    const auto o = monitor_options(*need(options, "options"));
    auto m = std::make_unique<kareus_monitor>();
    m->impl = std::make_unique<kareus::runtime::EnergyMonitor>(o);
    *out = m.release();
  });
}

void kareus_monitor_destroy(kareus_monitor* monitor) {
  if (monitor == nullptr) return;
  // Close here, where a failure can be caught: it must not escape into C.
  (void)kareus_monitor_close(monitor);
  for (kareus_plan* plan : monitor->plans) plan->monitor = nullptr;
  delete monitor;
}

int kareus_monitor_begin_iteration(kareus_monitor* monitor) {
  return guarded(__func__, [&] { need(monitor, "monitor")->impl->begin_iteration(); });
}

int kareus_monitor_end_iteration(kareus_monitor* monitor, kareus_iteration_record* out) {
  return guarded(__func__, [&] {
    const auto r = need(monitor, "monitor")->impl->end_iteration();
    monitor->note = r.note;
    if (out == nullptr) return;
    *out = {};
    out->rank = r.rank;
    out->stage = r.stage;
    out->iteration = r.iteration;
    out->start_unix_s = r.start_unix_s;
    out->time_s = r.time_s;
    out->has_energy = r.energy_j ? 1 : 0;
    out->energy_j = r.energy_j.value_or(0.0);
    out->avg_power_w = r.avg_power_w.value_or(0.0);
    out->busy_time_s = r.busy_time_s;
    out->instructions = r.instructions;
    out->note = monitor->note.c_str();
    out->json = monitor->impl->records().back().c_str();
  });
}

int kareus_monitor_begin_instruction(kareus_monitor* monitor, int kind, int chunk, int microbatch) {
  return guarded(__func__, [&] {
    need(monitor, "monitor")->impl->begin_instruction(to_kind(kind), microbatch, chunk);
  });
}

int kareus_monitor_end_instruction(kareus_monitor* monitor, int kind, int chunk, int microbatch) {
  return guarded(__func__, [&] {
    need(monitor, "monitor")->impl->end_instruction(to_kind(kind), microbatch, chunk);
  });
}

int kareus_monitor_summary_json(kareus_monitor* monitor, const char** json) {
  return guarded(__func__, [&] {
    need(json, "json");
    need(monitor, "monitor")->summary = monitor->impl->summary().to_json().dump();
    *json = monitor->summary.c_str();
  });
}

int kareus_monitor_record_count(const kareus_monitor* monitor, int* count) {
  return guarded(__func__, [&] {
    *need(count, "count") = static_cast<int>(need(monitor, "monitor")->impl->records().size());
  });
}

int kareus_monitor_record_json(const kareus_monitor* monitor, int index, const char** json) {
  return guarded(__func__, [&] {
    need(json, "json");
    *json = record_at(need(monitor, "monitor"), index).c_str();
  });
}

int kareus_monitor_energy_available(kareus_monitor* monitor, int* available, const char** reason) {
  return guarded(__func__, [&] {
    need(available, "available");
    *available = need(monitor, "monitor")->impl->energy_available() ? 1 : 0;
    monitor->reason = monitor->impl->times_only_reason();
    if (reason != nullptr) *reason = monitor->reason.c_str();
  });
}

int kareus_monitor_close(kareus_monitor* monitor) {
  return guarded(__func__, [&] { need(monitor, "monitor")->impl->close(); });
}

int kareus_plan_attach_monitor(kareus_plan* plan, kareus_monitor* monitor) {
  return guarded(__func__, [&] {
    need(plan, "plan");
    if (plan->open) {
      fail(KAREUS_ERR_STATE,
           fmt::format("rank {}: attach a monitor between instructions, not while {} is open",
                       plan->rank, plan->describe(plan->next)));
    }
    if (monitor != nullptr &&
        (monitor->impl->rank() != plan->rank || monitor->impl->stage() != plan->stage)) {
      fail(KAREUS_ERR_ARGUMENT,
           fmt::format("the monitor is rank {} (stage {}), the plan handle rank {} (stage {})",
                       monitor->impl->rank(), monitor->impl->stage(), plan->rank, plan->stage));
    }
    detach_monitor(plan);
    if (monitor != nullptr) {
      monitor->plans.push_back(plan);
      plan->monitor = monitor;
    }
  });
}

}  // extern "C"
