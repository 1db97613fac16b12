// The Python module `kareus` (its compiled part, kareus._core): plans, the frequency controller,
// the energy monitor and the instruction hooks, built over the C API (include/kareus/c_api.h) the
// way XGBoost's Python package sits on its C API, so that both bindings share one implementation of
// the plan checks and of the hook order. A failing C call becomes a Python exception of the class
// that matches its status code, carrying the library's message (file, field, what is allowed).
#include <dlfcn.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kareus/c_api.h"

namespace py = pybind11;

namespace {

/// A failed C call: its status and kareus_last_error() at the time.
struct CallError {
  int status;
  std::string message;
};

void check(int status) {
  if (status != KAREUS_OK) throw CallError{status, kareus_last_error()};
}

/// `name` (kareus, kareus-freqd) as shipped with this module: an installed package keeps them in
/// bin/ next to the module file (python/CMakeLists.txt), the build tree where they were built
/// (`build_path`, empty in a wheel). "" when neither is an executable.
std::string bundled_binary(const char* name, const char* build_path) {
  static const int kAnchor = 0;  // any address inside this shared object
  Dl_info info{};
  if (dladdr(&kAnchor, &info) != 0 && info.dli_fname != nullptr) {
    std::string path = info.dli_fname;
    path = path.substr(0, path.find_last_of('/') + 1) + "bin/" + name;
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return access(build_path, X_OK) == 0 ? build_path : "";
}

#ifndef KAREUS_FREQD_BUILD_PATH
#define KAREUS_FREQD_BUILD_PATH ""
#endif
#ifndef KAREUS_CLI_BUILD_PATH
#define KAREUS_CLI_BUILD_PATH ""
#endif

const char* kind_name(int kind) { return kind == KAREUS_FORWARD ? "forward" : "backward"; }

int parse_kind(const py::object& kind) {
  if (py::isinstance<py::str>(kind)) {
    const auto s = kind.cast<std::string>();
    if (s == "forward" || s == "F" || s == "f") return KAREUS_FORWARD;
    if (s == "backward" || s == "B" || s == "b") return KAREUS_BACKWARD;
    throw py::value_error("kind '" + s + "': allowed 'forward', 'backward' (or 'F', 'B')");
  }
  if (py::isinstance<py::int_>(kind)) {
    const int k = kind.cast<int>();
    if (k == KAREUS_FORWARD || k == KAREUS_BACKWARD) return k;
  }
  throw py::value_error("kind: allowed 'forward', 'backward', kareus.FORWARD or kareus.BACKWARD");
}

struct MixEntry {
  int sms = 0;
  std::string slot, slot_op;
  int slot_op_index = 0, first_instance = 0, instances = 0;
};

struct Partition {
  std::string key;
  int sms = 0;
  std::string slot, slot_op;
  int slot_op_index = 0;
  bool recompute = false;
  int instances = 0;
  std::vector<MixEntry> mix;
};

struct Instruction {
  int index = 0;
  std::string kind;
  int microbatch = 0, chunk = 0, freq_mhz = 0;
  double start_s = 0, end_s = 0, time_s = 0;
  bool sequential = false;
  std::map<std::string, Partition> partitions;
};

/// Owns a C plan handle.
struct Handle {
  kareus_plan* h = nullptr;
  explicit Handle(kareus_plan* p) : h(p) {}
  ~Handle() { kareus_plan_close(h); }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
};

std::shared_ptr<Handle> open_plan(const std::string& plan, const std::string& workload, int rank) {
  kareus_plan* h = nullptr;
  check(kareus_plan_open(plan.c_str(), workload.c_str(), rank, &h));
  return std::make_shared<Handle>(h);
}

Instruction read_instruction(const kareus_plan* h, int index) {
  kareus_instruction_info info;
  check(kareus_plan_instruction(h, index, &info));
  Instruction in;
  in.index = index;
  in.kind = kind_name(info.kind);
  in.microbatch = info.microbatch;
  in.chunk = info.chunk;
  in.freq_mhz = info.freq_mhz;
  in.start_s = info.start_s;
  in.end_s = info.end_s;
  in.time_s = info.time_s;
  int sequential = 0;
  check(kareus_plan_instruction_sequential(h, index, &sequential));
  in.sequential = sequential != 0;
  for (int p = 0; p < info.partition_count; ++p) {
    kareus_partition_info pi;
    check(kareus_plan_partition(h, index, p, &pi));
    Partition part{pi.key,       pi.sms, pi.slot, pi.slot_op, pi.slot_op_index, pi.recompute != 0,
                   pi.instances, {}};
    for (int e = 0; e < pi.mix_count; ++e) {
      kareus_mix_info mi;
      check(kareus_plan_partition_mix(h, index, p, e, &mi));
      part.mix.push_back(
          {mi.sms, mi.slot, mi.slot_op, mi.slot_op_index, mi.first_instance, mi.instances});
    }
    in.partitions.emplace(part.key, std::move(part));
  }
  return in;
}

std::vector<Instruction> read_instructions(const kareus_plan* h) {
  int n = 0;
  check(kareus_plan_instruction_count(h, &n));
  std::vector<Instruction> out;
  for (int i = 0; i < n; ++i) out.push_back(read_instruction(h, i));
  return out;
}

/// A stage's order under the pipeline schedule, from the C API (the C++ Schedule).
std::vector<std::tuple<std::string, int, int>> schedule_order(int stages, int chunks,
                                                              int microbatches, int stage) {
  int n = 0;
  check(kareus_schedule_order(stages, chunks, microbatches, stage, nullptr, 0, &n));
  std::vector<kareus_scheduled_instruction> order(static_cast<std::size_t>(n));
  check(kareus_schedule_order(stages, chunks, microbatches, stage, order.data(), n, &n));
  std::vector<std::tuple<std::string, int, int>> out;
  for (const auto& x : order) out.emplace_back(kind_name(x.kind), x.chunk, x.microbatch);
  return out;
}

std::string schedule_name(int stages, int chunks, int microbatches) {
  const char* name = nullptr;
  check(kareus_schedule_name(stages, chunks, microbatches, &name));
  return name;
}

/// The workload's partitions from the C++ kernel graph, as Python objects (parsed from the C
/// API's JSON by the json module, so that this file needs no JSON library).
py::object workload_partitions(const std::string& workload_path) {
  const char* json = nullptr;
  check(kareus_workload_partitions_json(workload_path.c_str(), &json));
  return py::module_::import("json").attr("loads")(py::str(json)).attr("__getitem__")(
      "partitions");
}

class Plan {
 public:
  Plan(std::string path, std::string workload)
      : path_(std::move(path)), workload_(std::move(workload)) {
    handles_[0] = open_plan(path_, workload_, 0);
    check(kareus_plan_num_stages(first(), &stages_));
    check(kareus_plan_num_ranks(first(), &ranks_));
    check(kareus_plan_chunks(first(), &chunks_));
    const char* name = nullptr;
    check(kareus_plan_schedule_name(first(), &name));
    schedule_ = name;
  }

  const std::string& path() const { return path_; }
  const std::string& workload_path() const { return workload_; }
  int num_stages() const { return stages_; }
  int num_ranks() const { return ranks_; }
  int chunks() const { return chunks_; }
  const std::string& schedule() const { return schedule_; }
  /// A handle of the plan (rank 0's), for the C calls that take any handle of it.
  const kareus_plan* raw() const { return first(); }

  int stage_for_rank(int rank) const {
    int s = 0;
    check(kareus_plan_stage_of_rank(first(), rank, &s));
    return s;
  }

  std::vector<int> ranks_of_stage(int stage) const {
    int n = 0;
    check(kareus_plan_stage_ranks(first(), stage, nullptr, 0, &n));
    std::vector<int> r(static_cast<std::size_t>(n));
    check(kareus_plan_stage_ranks(first(), stage, r.data(), n, &n));
    return r;
  }

  std::vector<Instruction> instructions(int stage) { return read_instructions(handle(stage)); }

  Instruction settings(int stage, const py::object& kind, int microbatch,
                       std::optional<int> chunk) {
    int index = 0;
    if (chunk) {
      check(kareus_plan_find_instruction_chunk(handle(stage), parse_kind(kind), *chunk, microbatch,
                                               &index));
    } else {
      check(kareus_plan_find_instruction(handle(stage), parse_kind(kind), microbatch, &index));
    }
    return read_instruction(handle(stage), index);
  }

  /// (layers, model-wide index of the first layer) of chunk `chunk` of `stage`.
  std::pair<int, int> chunk_layers(int stage, int chunk) const {
    int layers = 0, first_layer = 0;
    check(kareus_plan_chunk_layers(handle(stage), chunk, &layers, &first_layer));
    return {layers, first_layer};
  }

  std::vector<int> clock_sequence(int stage, bool collapse) {
    std::vector<int> seq;
    for (const auto& in : instructions(stage)) {
      if (collapse && !seq.empty() && seq.back() == in.freq_mhz) continue;
      seq.push_back(in.freq_mhz);
    }
    return seq;
  }

  py::dict workload() const {
    kareus_workload_shape w;
    check(kareus_plan_workload_shape(first(), &w));
    py::dict d;
    d["layers"] = w.layers;
    d["hidden"] = w.hidden;
    d["ffn_hidden"] = w.ffn_hidden;
    d["heads"] = w.heads;
    d["kv_heads"] = w.kv_heads;
    d["head_dim"] = w.head_dim;
    d["vocab"] = w.vocab;
    d["qk_norm"] = w.qk_norm != 0;
    d["tied_embeddings"] = w.tied_embeddings != 0;
    d["tp"] = w.tp;
    d["cp"] = w.cp;
    d["pp"] = w.pp;
    d["dp"] = w.dp;
    d["sequence_parallel"] = w.sequence_parallel != 0;
    d["micro_batch"] = w.micro_batch;
    d["seq_len"] = w.seq_len;
    d["micro_batches"] = w.micro_batches;
    d["nano_batches"] = w.nano_batches;
    d["recompute"] = w.recompute != 0;
    d["virtual_pipeline"] = w.virtual_pipeline;
    std::vector<int> layers;
    for (int s = 0; s < stages_; ++s) {
      kareus_workload_shape ws;
      check(kareus_plan_workload_shape(handle(s), &ws));
      layers.push_back(ws.stage_layers);
    }
    d["stage_layers"] = layers;
    return d;
  }

 private:
  const kareus_plan* first() const { return handles_.at(0)->h; }
  /// A handle opened for the first rank of `stage` (queries only; hooks open their own).
  kareus_plan* handle(int stage) const {
    int n = 0;
    check(kareus_plan_stage_ranks(first(), stage, nullptr, 0, &n));  // validates `stage`
    auto it = handles_.find(stage);
    if (it == handles_.end()) {
      const auto ranks = ranks_of_stage(stage);
      it = handles_.emplace(stage, open_plan(path_, workload_, ranks.front())).first;
    }
    return it->second->h;
  }

  std::string path_, workload_, schedule_;
  int stages_ = 0, ranks_ = 0, chunks_ = 1;
  mutable std::map<int, std::shared_ptr<Handle>>
      handles_;  ///< by stage (0: rank 0's, also stage 0)
};

class Controller {
 public:
  Controller(int gpu_index, bool dry_run, const std::string& log_path,
             std::optional<std::string> executable, std::optional<std::string> nvml_library,
             bool coalesce, std::optional<std::string> gpu_uuid,
             std::optional<std::string> pci_bus_id) {
    std::string exe = executable.value_or("");
    // The binary is not next to python3: use the one shipped with this module unless the caller
    // or $KAREUS_FREQD names another.
    const char* env = std::getenv("KAREUS_FREQD");
    if (exe.empty() && (env == nullptr || *env == '\0')) {
      exe = bundled_binary("kareus-freqd", KAREUS_FREQD_BUILD_PATH);
    }
    kareus_controller_options o{};
    o.gpu_index = gpu_index;
    o.dry_run = dry_run ? 1 : 0;
    o.log_path = log_path.c_str();
    o.executable = exe.c_str();
    o.nvml_library = nvml_library ? nvml_library->c_str() : nullptr;
    o.coalesce = coalesce ? 1 : 0;
    o.gpu_uuid = gpu_uuid ? gpu_uuid->c_str() : nullptr;
    o.pci_bus_id = pci_bus_id ? pci_bus_id->c_str() : nullptr;
    kareus_controller* c = nullptr;
    int status = KAREUS_OK;
    {
      py::gil_scoped_release nogil;  // start-up waits for the process (seconds at worst)
      status = kareus_controller_start_ex(&o, &c);
    }
    check(status);
    c_ = c;
    check(kareus_controller_pid(c_, &pid_));
  }
  ~Controller() {
    // Stopping waits for the process (up to tens of seconds for one stuck in NVML): other
    // Python threads keep running meanwhile.
    py::gil_scoped_release nogil;
    kareus_controller_free(c_);
  }
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;

  void set_clock(int freq_mhz) {
    py::gil_scoped_release nogil;
    check(kareus_controller_set_clock(c_, freq_mhz));
  }
  void stop() {
    py::gil_scoped_release nogil;
    check(kareus_controller_stop(c_));
    running_ = false;
  }
  int pid() const { return pid_; }
  bool running() const { return running_; }
  kareus_controller* raw() const { return c_; }

 private:
  kareus_controller* c_ = nullptr;
  int pid_ = 0;
  bool running_ = true;
};

/// JSON text from the C API as Python objects (dicts, lists, None for null).
py::object from_json(const char* text) { return py::module_::import("json").attr("loads")(text); }

class Monitor {
 public:
  Monitor(int rank, int stage, std::optional<std::string> path, std::optional<std::string> gpu_uuid,
          std::optional<std::string> pci_bus_id, std::optional<int> gpu_index, bool nvml,
          std::optional<std::string> nvml_library, bool per_instruction, const py::object& plan,
          std::optional<double> tokens_per_iteration)
      : path_(path.value_or("")) {
    if (tokens_per_iteration && !(*tokens_per_iteration > 0)) {
      throw CallError{KAREUS_ERR_ARGUMENT, "Monitor: tokens_per_iteration must be > 0 (or None)"};
    }
    kareus_monitor_options o{};
    o.rank = rank;
    o.stage = stage;
    o.gpu_index = gpu_index.value_or(0);
    o.gpu_uuid = gpu_uuid ? gpu_uuid->c_str() : nullptr;
    o.pci_bus_id = pci_bus_id ? pci_bus_id->c_str() : nullptr;
    o.times_only = nvml ? 0 : 1;
    o.nvml_library = nvml_library ? nvml_library->c_str() : nullptr;
    o.per_instruction = per_instruction ? 1 : 0;
    o.out_path = path_.c_str();
    o.plan = plan.is_none() ? nullptr : plan.cast<const Plan&>().raw();
    o.tokens_per_iteration = tokens_per_iteration.value_or(0);
    check(kareus_monitor_create(&o, &m_));
    rank_ = rank;
    stage_ = stage;
  }
  ~Monitor() { kareus_monitor_destroy(m_); }
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;

  void begin_iteration() { check(kareus_monitor_begin_iteration(m_)); }
  py::object end_iteration() {
    kareus_iteration_record r;
    check(kareus_monitor_end_iteration(m_, &r));
    return from_json(r.json);
  }
  void begin_instruction(const py::object& kind, int microbatch, int chunk) {
    check(kareus_monitor_begin_instruction(m_, parse_kind(kind), chunk, microbatch));
  }
  void end_instruction(const py::object& kind, int microbatch, int chunk) {
    check(kareus_monitor_end_instruction(m_, parse_kind(kind), chunk, microbatch));
  }
  /// Every record so far; parsed once each, handed out as a new list.
  py::list records() {
    int n = 0;
    check(kareus_monitor_record_count(m_, &n));
    for (int i = static_cast<int>(records_.size()); i < n; ++i) {
      const char* json = nullptr;
      check(kareus_monitor_record_json(m_, i, &json));
      records_.append(from_json(json));
    }
    return py::list(records_);
  }
  py::object summary() {
    const char* json = nullptr;
    check(kareus_monitor_summary_json(m_, &json));
    return from_json(json);
  }
  void close() { check(kareus_monitor_close(m_)); }
  bool energy_available() const {
    int available = 0;
    check(kareus_monitor_energy_available(m_, &available, nullptr));
    return available != 0;
  }
  std::string times_only_reason() const {
    int available = 0;
    const char* reason = nullptr;
    check(kareus_monitor_energy_available(m_, &available, &reason));
    return reason;
  }
  int rank() const { return rank_; }
  int stage() const { return stage_; }
  std::optional<std::string> path() const {
    return path_.empty() ? std::nullopt : std::optional(path_);
  }
  kareus_monitor* raw() const { return m_; }

 private:
  kareus_monitor* m_ = nullptr;
  std::string path_;
  int rank_ = 0, stage_ = 0;
  py::list records_;
};

class Hooks {
 public:
  Hooks(py::object plan, int rank, py::object controller, py::object monitor)
      : plan_obj_(std::move(plan)),
        controller_obj_(std::move(controller)),
        monitor_obj_(std::move(monitor)) {
    const Plan& p = plan_obj_.cast<const Plan&>();
    handle_ = open_plan(p.path(), p.workload_path(), rank);
    check(kareus_plan_stage(handle_->h, &stage_));
    rank_ = rank;
    if (!controller_obj_.is_none()) {
      check(kareus_plan_attach_controller(handle_->h, controller_obj_.cast<Controller&>().raw()));
    }
    if (!monitor_obj_.is_none()) {
      check(kareus_plan_attach_monitor(handle_->h, monitor_obj_.cast<Monitor&>().raw()));
    }
  }

  /// Without `chunk`, the C API's chunk-less hooks (refused on an interleaved plan).
  Instruction begin(const py::object& kind, int microbatch, std::optional<int> chunk) {
    const int k = parse_kind(kind);
    if (chunk) {
      check(kareus_instruction_begin_chunk(handle_->h, k, *chunk, microbatch));
    } else {
      check(kareus_instruction_begin(handle_->h, k, microbatch));
    }
    int index = 0, open = 0;
    check(kareus_plan_position(handle_->h, &index, &open));
    return read_instruction(handle_->h, index);
  }

  void end(const py::object& kind, int microbatch, std::optional<int> chunk) {
    const int k = parse_kind(kind);
    if (chunk) {
      check(kareus_instruction_end_chunk(handle_->h, k, *chunk, microbatch));
    } else {
      check(kareus_instruction_end(handle_->h, k, microbatch));
    }
  }

  int chunks() const {
    int c = 1;
    check(kareus_plan_chunks(handle_->h, &c));
    return c;
  }

  std::pair<int, bool> position() const {
    int index = 0, open = 0;
    check(kareus_plan_position(handle_->h, &index, &open));
    return {index, open != 0};
  }

  void reset() { check(kareus_plan_reset_position(handle_->h)); }
  int stage() const { return stage_; }
  int rank() const { return rank_; }
  std::vector<Instruction> instructions() const { return read_instructions(handle_->h); }

 private:
  py::object plan_obj_, controller_obj_, monitor_obj_;  // kept alive while attached
  std::shared_ptr<Handle> handle_;
  int stage_ = 0, rank_ = 0;
};

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() =
      "Compiled part of the Kareus runtime (import `kareus`, not this module): plans, the "
      "per-GPU frequency controller and the instruction hooks, over the C API "
      "(include/kareus/c_api.h).";

  // Exception classes by status code. Error is the base of all; the input/argument ones are also
  // ValueErrors so that generic handlers catch them.
  // The classes live as long as the interpreter: plain handles, never released, so that no
  // destructor touches Python after finalization.
  static py::handle error = PyErr_NewExceptionWithDoc(
      "kareus.Error", "Base of every error of the Kareus runtime.", PyExc_RuntimeError, nullptr);
  auto sub = [&](const char* name, const char* doc, py::handle extra) -> py::handle {
    // Two statements: pybind11 3 gives make_tuple's results distinct typed-tuple types.
    py::tuple bases = py::make_tuple(error);
    if (extra) bases = py::make_tuple(error, extra);
    return PyErr_NewExceptionWithDoc(name, doc, bases.ptr(), nullptr);
  };
  py::handle value_error = PyExc_ValueError;
  static std::map<int, py::handle> by_status = {
      {KAREUS_ERR_ARGUMENT,
       sub("kareus.ArgumentError", "A bad argument (index out of range, unknown kind, None).",
           value_error)},
      {KAREUS_ERR_INVALID_INPUT,
       sub("kareus.InvalidInputError",
           "A bad plan or workload file, or a plan made for another workload; the message names "
           "the file, the field and what is allowed.",
           value_error)},
      {KAREUS_ERR_NOT_SUPPORTED,
       sub("kareus.NotSupportedError", "Not available in this build or on this machine.",
           py::handle())},
      {KAREUS_ERR_ORDER,
       sub("kareus.OrderError",
           "An instruction hook called out of the plan's order (the pipeline schedule's) for "
           "the rank's stage, or without its chunk on an interleaved plan.",
           py::handle())},
      {KAREUS_ERR_STATE,
       sub("kareus.StateError", "An object used in the wrong state (a stopped controller).",
           py::handle())},
      {KAREUS_ERR_INTERNAL,
       sub("kareus.InternalError", "A bug or an unexpected system failure.", py::handle())},
  };
  if (!error) throw py::error_already_set();
  m.attr("Error") = error;
  for (const auto& [status, cls] : by_status) {
    if (!cls) throw py::error_already_set();
    m.attr(cls.attr("__name__").cast<std::string>().c_str()) = cls;
  }
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const CallError& e) {
      auto it = by_status.find(e.status);
      PyErr_SetString(it == by_status.end() ? error.ptr() : it->second.ptr(), e.message.c_str());
    }
  });

  m.attr("FORWARD") = static_cast<int>(KAREUS_FORWARD);
  m.attr("BACKWARD") = static_cast<int>(KAREUS_BACKWARD);
  m.attr("PLAN_FORMAT_VERSION") = kareus_plan_format_version();
  m.attr("__version__") = kareus_version();

  m.attr("cli_path") = bundled_binary("kareus", KAREUS_CLI_BUILD_PATH);
  m.def("schedule_order", &schedule_order, py::arg("stages"), py::arg("chunks"),
        py::arg("microbatches"), py::arg("stage"),
        "Stage `stage`'s instructions in execution order as (kind, chunk, microbatch) tuples, "
        "from Kareus's pipeline schedule (the planner's and the plan checks'): synchronous 1F1B "
        "for chunks == 1, else interleaved 1F1B (Megatron-LM's virtual pipeline stages; chunk c "
        "of stage s is virtual stage c * stages + s). InvalidInputError for a shape the "
        "schedule does not allow.");
  m.def("workload_partitions", &workload_partitions, py::arg("workload_path"),
        "The partitions of the workload's kernel graph, the planner's: a list of dicts with "
        "'key', 'direction', 'ops' (compute op names in order), 'slots' ([{'name', "
        "'op_index'}]: the other nano-batch's collective is launched before ops[op_index]), "
        "'collective' ({'name', 'kind', 'group'}) and 'comm_tail' (kernels the communication "
        "stream runs after the collective).");
  m.def("schedule_name", &schedule_name, py::arg("stages"), py::arg("chunks"),
        py::arg("microbatches"), "'1f1b' or 'interleaved-1f1b'.");

  py::class_<MixEntry>(m, "MixEntry",
                       "One per-layer choice of a partition: instances [first_instance, "
                       "first_instance + instances) in execution order use sms and slot.")
      .def_readonly("sms", &MixEntry::sms)
      .def_readonly("slot", &MixEntry::slot)
      .def_readonly("slot_op", &MixEntry::slot_op)
      .def_readonly("slot_op_index", &MixEntry::slot_op_index)
      .def_readonly("first_instance", &MixEntry::first_instance)
      .def_readonly("instances", &MixEntry::instances)
      .def("__repr__", [](const MixEntry& e) {
        return py::str("MixEntry(sms={}, slot='{}', first_instance={}, instances={})")
            .format(e.sms, e.slot, e.first_instance, e.instances);
      });

  py::class_<Partition>(m, "Partition",
                        "How one partition runs in an instruction: the other nano-batch's "
                        "collective gets `sms` SMs (NCCL CTAs) and is launched right before "
                        "compute op `slot_op` (index `slot_op_index`) of this block. "
                        "`recompute`: a forward block re-run inside a backward instruction.")
      .def_readonly("key", &Partition::key)
      .def_readonly("sms", &Partition::sms)
      .def_readonly("slot", &Partition::slot)
      .def_readonly("slot_op", &Partition::slot_op)
      .def_readonly("slot_op_index", &Partition::slot_op_index)
      .def_readonly("recompute", &Partition::recompute)
      .def_readonly("instances", &Partition::instances)
      .def_readonly("mix", &Partition::mix)
      .def("__repr__", [](const Partition& p) {
        return py::str("Partition(key='{}', sms={}, slot='{}', slot_op='{}', recompute={})")
            .format(p.key, p.sms, p.slot, p.slot_op, p.recompute);
      });

  py::class_<Instruction>(m, "Instruction",
                          "One pipeline instruction of a stage: kind ('forward' or 'backward'), "
                          "micro-batch, model chunk of the stage, SM clock (MHz), predicted "
                          "start/end and run time (s), "
                          "its partitions by key, and whether it runs sequentially (the whole "
                          "micro-batch, no nano-batches, no partitions).")
      .def_readonly("index", &Instruction::index)
      .def_readonly("kind", &Instruction::kind)
      .def_readonly("microbatch", &Instruction::microbatch)
      .def_readonly("chunk", &Instruction::chunk)
      .def_readonly("freq_mhz", &Instruction::freq_mhz)
      .def_readonly("start_s", &Instruction::start_s)
      .def_readonly("end_s", &Instruction::end_s)
      .def_readonly("time_s", &Instruction::time_s)
      .def_readonly("sequential", &Instruction::sequential)
      .def_readonly("partitions", &Instruction::partitions)
      .def("__repr__", [](const Instruction& in) {
        return py::str("Instruction({} mb={} chunk={} freq_mhz={} partitions={})")
            .format(in.kind, in.microbatch, in.chunk, in.freq_mhz, in.partitions.size());
      });

  py::class_<Plan>(m, "Plan",
                   "A Kareus plan (format v2) validated against its workload file.\n\n"
                   "Plan(plan_path, workload_path) raises InvalidInputError naming the file and "
                   "field when the plan is malformed or made for another workload.")
      .def(py::init<std::string, std::string>(), py::arg("plan_path"), py::arg("workload_path"))
      .def_static(
          "load",
          [](const std::string& p, const std::string& w) { return std::make_unique<Plan>(p, w); },
          py::arg("plan_path"), py::arg("workload_path"), "Same as Plan(plan_path, workload_path).")
      .def_property_readonly("path", &Plan::path)
      .def_property_readonly("workload_path", &Plan::workload_path)
      .def_property_readonly("num_stages", &Plan::num_stages)
      .def_property_readonly("num_ranks", &Plan::num_ranks)
      .def_property_readonly("chunks", &Plan::chunks,
                             "Model chunks per stage (parallel.virtual_pipeline); 1: synchronous "
                             "1F1B.")
      .def_property_readonly("schedule", &Plan::schedule,
                             "The pipeline schedule: '1f1b' or 'interleaved-1f1b'.")
      .def_property_readonly("workload", &Plan::workload,
                             "The workload's shape (model, parallelism, batch) as a dict.")
      .def("stage_for_rank", &Plan::stage_for_rank, py::arg("rank"),
           "Pipeline stage of a global rank (Megatron-LM's default order tp-cp-dp-pp).")
      .def("ranks_of_stage", &Plan::ranks_of_stage, py::arg("stage"))
      .def("instructions", &Plan::instructions, py::arg("stage"),
           "The stage's instructions in the schedule's execution order.")
      .def("settings", &Plan::settings, py::arg("stage"), py::arg("kind"), py::arg("microbatch"),
           py::arg("chunk") = py::none(),
           "The Instruction (kind, chunk, micro-batch) of a stage; without chunk, refused "
           "(OrderError) on an interleaved plan.")
      .def("chunk_layers", &Plan::chunk_layers, py::arg("stage"), py::arg("chunk"),
           "(layers, model-wide index of the first layer) of model chunk `chunk` of `stage` "
           "(virtual stage chunk * num_stages + stage).")
      .def("clock_sequence", &Plan::clock_sequence, py::arg("stage"), py::arg("collapse") = true,
           "The stage's SM clocks in execution order (MHz); collapse=True merges repeats, which "
           "is what a controller applies.");

  py::class_<Controller>(m, "Controller",
                         "A frequency controller process (kareus-freqd) for one GPU, child of "
                         "this process. It applies clocks asynchronously, only when they change, "
                         "and resets the GPU's clocks when stopped, on SIGTERM/SIGINT and when "
                         "this process dies. dry_run=True logs transitions as JSON lines to "
                         "log_path instead of touching the GPU. Use as a context manager.")
      .def(py::init<int, bool, const std::string&, std::optional<std::string>,
                    std::optional<std::string>, bool, std::optional<std::string>,
                    std::optional<std::string>>(),
           py::arg("gpu_index") = 0, py::arg("dry_run") = false, py::arg("log_path") = "",
           py::arg("executable") = py::none(), py::arg("nvml_library") = py::none(),
           py::arg("coalesce") = false, py::arg("gpu_uuid") = py::none(),
           py::arg("pci_bus_id") = py::none(),
           "gpu_uuid (e.g. 'GPU-8f3c...') or pci_bus_id (e.g. '00000000:3B:00.0') select the GPU "
           "and override gpu_index, NVML's index (not CUDA's order, blind to "
           "CUDA_VISIBLE_DEVICES); kareus.torch.local_gpu_pci_bus_id() gives this process's.")
      .def_static(
          "start",
          [](int gpu, bool dry, const std::string& log, std::optional<std::string> exe,
             std::optional<std::string> nvml, bool coalesce, std::optional<std::string> uuid,
             std::optional<std::string> bus_id) {
            return std::make_unique<Controller>(gpu, dry, log, std::move(exe), std::move(nvml),
                                                coalesce, std::move(uuid), std::move(bus_id));
          },
          py::arg("gpu_index") = 0, py::arg("dry_run") = false, py::arg("log_path") = "",
          py::arg("executable") = py::none(), py::arg("nvml_library") = py::none(),
          py::arg("coalesce") = false, py::arg("gpu_uuid") = py::none(),
          py::arg("pci_bus_id") = py::none(), "Starts a controller and waits until it is ready.")
      .def("set_clock", &Controller::set_clock, py::arg("freq_mhz"),
           "Asks for an SM clock in MHz (0: default clocks). Never blocks on the controller.")
      .def("stop", &Controller::stop,
           "Resets the clocks and ends the process, waiting for it. Idempotent.")
      .def_property_readonly("pid", &Controller::pid)
      .def_property_readonly("running", &Controller::running)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](Controller& c, const py::object& exc_type, const py::object&, const py::object&) {
             if (exc_type.is_none()) {
               c.stop();
               return false;
             }
             // An exception is already propagating: a stop failure must not replace it.
             try {
               c.stop();
             } catch (const CallError& e) {
               const std::string message =
                   "kareus.Controller: stopping during an exception failed: " + e.message;
               if (PyErr_WarnEx(PyExc_RuntimeWarning, message.c_str(), 1) != 0) {
                 throw py::error_already_set();
               }
             }
             return false;
           });

  py::class_<Monitor>(
      m, "Monitor",
      "The energy monitor of one rank (docs/runtime.md, \"Energy monitor\"): call "
      "begin_iteration() and end_iteration() around every training iteration; instructions are "
      "timed by Hooks(..., monitor=this) or by begin_instruction/end_instruction. An "
      "iteration's energy is the difference of NVML's total-energy counter of this rank's GPU "
      "(NVML opened read-only); without NVML (nvml=False, no driver) it records times only, "
      "with 'energy_j': None and a 'note'. Every finished record is one JSON line appended to "
      "`path`; close() (or leaving the with block) appends the summary. With `plan` the summary "
      "compares with the plan's prediction for a GPU of `stage`; tokens_per_iteration (the "
      "whole job's) adds J/token. Select the GPU as for a Controller: gpu_uuid or pci_bus_id "
      "(kareus.torch.local_gpu_pci_bus_id()) rather than gpu_index (NVML's order; default 0).")
      .def(py::init<int, int, std::optional<std::string>, std::optional<std::string>,
                    std::optional<std::string>, std::optional<int>, bool,
                    std::optional<std::string>, bool, const py::object&, std::optional<double>>(),
           py::arg("rank"), py::arg("stage"), py::arg("path") = py::none(),
           py::arg("gpu_uuid") = py::none(), py::arg("pci_bus_id") = py::none(),
           py::arg("gpu_index") = py::none(), py::arg("nvml") = true,
           py::arg("nvml_library") = py::none(), py::arg("per_instruction") = false,
           py::arg("plan") = py::none(), py::arg("tokens_per_iteration") = py::none())
      .def("begin_iteration", &Monitor::begin_iteration,
           "Starts an iteration (StateError while one is open).")
      .def("end_iteration", &Monitor::end_iteration,
           "Ends the iteration, appends its record and returns it as a dict: record, rank, "
           "stage, iteration, start_unix_s, time_s, energy_j (None without energy), "
           "avg_power_w, busy_time_s (the instructions' time), instructions, gpu_uuid, and "
           "note where there is something to say.")
      .def("begin_instruction", &Monitor::begin_instruction, py::arg("kind"), py::arg("microbatch"),
           py::arg("chunk") = 0,
           "Times an instruction of the open iteration (Hooks with monitor= call this).")
      .def("end_instruction", &Monitor::end_instruction, py::arg("kind"), py::arg("microbatch"),
           py::arg("chunk") = 0, "Ends the open instruction, which must be this one.")
      .def_property_readonly("records", &Monitor::records,
                             "Every record so far as dicts (iteration, instruction with "
                             "per_instruction, the summary after close()), in order.")
      .def("summary", &Monitor::summary,
           "Totals so far and the comparison with the plan, as a dict (the summary record).")
      .def("close", &Monitor::close, "Appends the summary record. Idempotent.")
      .def_property_readonly("energy_available", &Monitor::energy_available,
                             "Whether NVML energy is read (False: times only).")
      .def_property_readonly("times_only_reason", &Monitor::times_only_reason,
                             "Why there is no energy ('' when there is).")
      .def_property_readonly("rank", &Monitor::rank)
      .def_property_readonly("stage", &Monitor::stage)
      .def_property_readonly("path", &Monitor::path)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](Monitor& mon, const py::object&, const py::object&, const py::object&) {
        mon.close();
        return false;
      });

  py::class_<Hooks>(m, "Hooks",
                    "The instruction hooks of one rank: call on_instruction_begin(kind, "
                    "microbatch, chunk) right before an instruction's compute and "
                    "on_instruction_end(kind, microbatch, chunk) right after it. Begin checks "
                    "the plan's order (its schedule's; OrderError otherwise), sends the clock to "
                    "the controller if one is given, times the instruction with the monitor if "
                    "one is given (StateError outside its iteration), and returns the "
                    "Instruction's settings. Without chunk the hooks name chunk 0 and refuse an "
                    "interleaved plan.")
      .def(py::init<py::object, int, py::object, py::object>(), py::arg("plan"), py::arg("rank"),
           py::arg("controller") = py::none(), py::arg("monitor") = py::none())
      .def("on_instruction_begin", &Hooks::begin, py::arg("kind"), py::arg("microbatch"),
           py::arg("chunk") = py::none())
      .def("on_instruction_end", &Hooks::end, py::arg("kind"), py::arg("microbatch"),
           py::arg("chunk") = py::none())
      .def_property_readonly("chunks", &Hooks::chunks)
      .def_property_readonly("position", &Hooks::position,
                             "(index of the next or open instruction, whether it is open)")
      .def("reset", &Hooks::reset, "Starts the order again at the first instruction.")
      .def_property_readonly("stage", &Hooks::stage)
      .def_property_readonly("rank", &Hooks::rank)
      .def_property_readonly("instructions", &Hooks::instructions);
}
