/* C API of the Kareus runtime: what a training job written in any language needs to run a plan.
 *
 * A training process opens the plan for its global rank (the plan maps ranks to pipeline
 * stages), optionally starts a frequency controller for its GPU and attaches it, and calls
 * kareus_instruction_begin_chunk / kareus_instruction_end_chunk around every pipeline
 * instruction. Begin checks that the call follows the stage's order in the plan (the pipeline
 * schedule's: synchronous 1F1B, or interleaved 1F1B when the stage holds several model chunks)
 * and sends the instruction's SM clock to the controller (which applies it asynchronously, only
 * when it changes); the instruction's partition settings (SM count and launch slot of each
 * collective) are read with the query functions and applied by the framework (e.g.
 * kareus.torch).
 *
 * Instructions are named by (kind, chunk, microbatch): the forward or backward pass of one
 * micro-batch through one model chunk of the stage. Chunk c of stage s is virtual stage
 * c * pp + s (include/kareus/schedule.h). A plan with one chunk per stage (synchronous 1F1B)
 * has only chunk 0, and the functions without `_chunk` (kareus_instruction_begin, ...) are
 * their chunk-0 forms; on an interleaved plan (kareus_plan_chunks > 1) (kind, microbatch) names
 * several instructions and those forms fail with KAREUS_ERR_ORDER, naming the _chunk function.
 *
 * Conventions (XGBoost's C API style):
 *  - Every function that can fail returns an int status, KAREUS_OK (0) on success. On failure
 *    kareus_last_error() returns a message for the calling thread (the C++ library's message:
 *    it names the file, the field and what is allowed); it stays valid until the next failing
 *    call on that thread. No C++ exception crosses this boundary.
 *  - Handles are opaque. A kareus_plan is not thread-safe: use one per thread (one per rank is
 *    the normal case). Distinct handles may be used concurrently.
 *  - Strings returned through out-parameters (partition keys, slot names) are owned by the plan
 *    handle and valid until kareus_plan_close.
 *  - Kinds are KAREUS_FORWARD (0) and KAREUS_BACKWARD (1). Clocks are in MHz.
 *  - Structs may grow at their end in later versions; zero-initialise them.
 */
#ifndef KAREUS_C_API_H_
#define KAREUS_C_API_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Status codes. */
enum {
  KAREUS_OK = 0,
  KAREUS_ERR_ARGUMENT = 1,      /* null pointer, index out of range, unknown kind */
  KAREUS_ERR_INVALID_INPUT = 2, /* bad plan or workload file, plan of another workload */
  KAREUS_ERR_NOT_SUPPORTED = 3, /* feature unavailable in this build or on this machine */
  KAREUS_ERR_ORDER = 4,         /* instruction call out of the plan's order, or without its
                                   chunk on an interleaved plan */
  KAREUS_ERR_STATE = 5,         /* e.g. using a stopped controller */
  KAREUS_ERR_INTERNAL = 6       /* a bug or an unexpected system failure */
};

enum { KAREUS_FORWARD = 0, KAREUS_BACKWARD = 1 };

/* Message of the calling thread's last failure ("" if none). Never NULL. */
const char* kareus_last_error(void);
/* Symbolic name of a status code ("KAREUS_ERR_ORDER", ...; "unknown" for others). */
const char* kareus_status_name(int status);
/* Library version, e.g. "0.1.0"; plan format version it reads. */
const char* kareus_version(void);
int kareus_plan_format_version(void);

/* ---- Plans. */
typedef struct kareus_plan kareus_plan;
typedef struct kareus_controller kareus_controller;

/* Opens `plan_path` (a kareus-plan JSON file, version 2) for global rank `global_rank`,
 * validating it against the workload file `workload_path` (YAML): digest, stage and instruction
 * counts, clocks, SM counts, slots. The rank's stage comes from the plan's rank layout. */
int kareus_plan_open(const char* plan_path, const char* workload_path, int global_rank,
                     kareus_plan** out);
/* Closes the handle (NULL is ignored). Does not stop an attached controller. */
void kareus_plan_close(kareus_plan* plan);

int kareus_plan_rank(const kareus_plan* plan, int* global_rank);
int kareus_plan_stage(const kareus_plan* plan, int* stage);
int kareus_plan_num_stages(const kareus_plan* plan, int* stages);
int kareus_plan_num_ranks(const kareus_plan* plan, int* ranks);
/* Stage of any global rank of the job. */
int kareus_plan_stage_of_rank(const kareus_plan* plan, int global_rank, int* stage);
/* The global ranks of `stage`, ascending: writes min(count, capacity) ranks to `ranks` (may be
 * NULL when capacity is 0) and the full count to `*count`. */
int kareus_plan_stage_ranks(const kareus_plan* plan, int stage, int* ranks, int capacity,
                            int* count);
/* Model chunks per stage (the workload's parallel.virtual_pipeline): 1 for synchronous 1F1B,
 * more for interleaved 1F1B. */
int kareus_plan_chunks(const kareus_plan* plan, int* chunks);
/* Name of the plan's pipeline schedule: "1f1b" or "interleaved-1f1b" (static storage). */
int kareus_plan_schedule_name(const kareus_plan* plan, const char** name);
/* Layers of model chunk `chunk` of this handle's stage (virtual stage chunk * pp + stage) and
 * the model-wide index of its first layer (0-based); either out-parameter may be NULL. */
int kareus_plan_chunk_layers(const kareus_plan* plan, int chunk, int* layers, int* first_layer);

/* Shape of the workload the plan was validated against (so a job can check its model). */
typedef struct kareus_workload_shape {
  int layers, hidden, ffn_hidden, heads, kv_heads, head_dim, vocab;
  int qk_norm, tied_embeddings;
  int tp, cp, pp, dp, sequence_parallel;
  int micro_batch, seq_len, micro_batches, nano_batches;
  int recompute;        /* 1: full recompute */
  int stage_layers;     /* layers of this handle's stage, all its chunks together */
  int virtual_pipeline; /* model chunks per stage (kareus_plan_chunks) */
} kareus_workload_shape;
int kareus_plan_workload_shape(const kareus_plan* plan, kareus_workload_shape* out);

/* The rank's stage's instructions, in the execution order of the plan's schedule. */
int kareus_plan_instruction_count(const kareus_plan* plan, int* count);
typedef struct kareus_instruction_info {
  int kind; /* KAREUS_FORWARD or KAREUS_BACKWARD */
  int microbatch;
  int freq_mhz;
  int partition_count;
  double start_s, end_s; /* predicted, seconds from the iteration start */
  double time_s;         /* predicted run time on one GPU */
  int chunk;             /* model chunk of the stage (0 unless interleaved) */
} kareus_instruction_info;
int kareus_plan_instruction(const kareus_plan* plan, int index, kareus_instruction_info* out);
/* Index of the instruction (kind, chunk, microbatch) on the rank's stage (KAREUS_ERR_ARGUMENT
 * when the stage has none). */
int kareus_plan_find_instruction_chunk(const kareus_plan* plan, int kind, int chunk, int microbatch,
                                       int* index);
/* Chunk-0 form; KAREUS_ERR_ORDER on an interleaved plan, where (kind, microbatch) is ambiguous. */
int kareus_plan_find_instruction(const kareus_plan* plan, int kind, int microbatch, int* index);
/* 1 when the instruction runs its micro-batch whole, kernels in sequence (no nano-batches and
   partition_count 0; every instruction of a sequential plan, and those of an overlapped Kareus
   plan where overlap does not pay), else 0. */
int kareus_plan_instruction_sequential(const kareus_plan* plan, int index, int* sequential);

typedef struct kareus_partition_info {
  const char* key;     /* e.g. "fwd_attn" */
  int sms;             /* SMs (NCCL CTAs) of the collective; 0: the copy engines (NCCL CE) */
  const char* slot;    /* launch slot name, e.g. "qkv" */
  const char* slot_op; /* compute op the collective is launched before, e.g. "qkv_gemm" */
  int slot_op_index;   /* its index among the block's compute ops */
  int recompute;       /* 1: a forward block re-run inside a backward instruction */
  int instances;       /* occurrences per micro-batch in this instruction */
  int mix_count;       /* per-layer choices; 0: every instance uses sms/slot */
} kareus_partition_info;
/* Partitions of an instruction, ordered by key. */
int kareus_plan_partition(const kareus_plan* plan, int instruction, int partition,
                          kareus_partition_info* out);
typedef struct kareus_mix_info {
  int sms;
  const char* slot;
  const char* slot_op;
  int slot_op_index;
  int first_instance; /* first occurrence (0-based, execution order) using this entry */
  int instances;
} kareus_mix_info;
int kareus_plan_partition_mix(const kareus_plan* plan, int instruction, int partition, int entry,
                              kareus_mix_info* out);

/* ---- Pipeline schedules (the same implementation the planner and the plan checks use). */
typedef struct kareus_scheduled_instruction {
  int kind; /* KAREUS_FORWARD or KAREUS_BACKWARD */
  int chunk;
  int microbatch;
} kareus_scheduled_instruction;
/* Stage `stage`'s instructions in execution order under the schedule of `stages` pipeline
 * stages, `chunks` model chunks per stage (1: synchronous 1F1B, more: interleaved 1F1B, which
 * needs stages >= 2 and microbatches a multiple of stages) and `microbatches` micro-batches:
 * writes min(count, capacity) of them to `out` (may be NULL when capacity is 0) and the full
 * count, 2 * chunks * microbatches, to `*count`. KAREUS_ERR_INVALID_INPUT for a shape the
 * schedule does not allow, KAREUS_ERR_ARGUMENT for a stage out of range. */
int kareus_schedule_order(int stages, int chunks, int microbatches, int stage,
                          kareus_scheduled_instruction* out, int capacity, int* count);
/* Name of that schedule: "1f1b" or "interleaved-1f1b" (static storage). */
int kareus_schedule_name(int stages, int chunks, int microbatches, const char** name);

/* The partitions of a workload's kernel graph (the planner's, src/partition/partitioner.cc),
 * so that an executor runs the same ops with the same slot names: a JSON document
 * {"partitions": [{"key", "direction" ("forward"|"backward"), "ops": [op names, in order],
 * "slots": [{"name", "op_index"}], "collective": {"name", "kind", "group"},
 * "comm_tail": [kernel names]}, ...]} (keys in first-seen order). The string stays valid until
 * the calling thread's next call of this function. KAREUS_ERR_INVALID_INPUT for a bad
 * workload file (the message names file and field). */
int kareus_workload_partitions_json(const char* workload_path, const char** json);

/* ---- Frequency controller: one process (kareus-freqd) per GPU, child of the caller. */
typedef struct kareus_controller_options {
  /* Which GPU: gpu_uuid if set, else pci_bus_id if set, else gpu_index (NVML's index, which is
   * neither CUDA's order nor filtered by CUDA_VISIBLE_DEVICES: prefer the UUID or bus id of the
   * process's CUDA device; docs/runtime.md, "Which GPU"). */
  int gpu_index;
  int dry_run;              /* 1: log transitions as JSON lines instead of touching NVML */
  const char* log_path;     /* JSON-lines log of transitions (required when dry_run) */
  const char* executable;   /* kareus-freqd; NULL/"": $KAREUS_FREQD, next to the binary, PATH */
  const char* nvml_library; /* NULL/"": the system's libnvidia-ml.so.1 */
  int coalesce; /* 1: apply only the newest waiting target (instructions shorter than a switch) */
  const char* gpu_uuid;   /* NULL/"": unused; e.g. "GPU-8f3c..." (nvidia-smi -L) */
  const char* pci_bus_id; /* NULL/"": unused; e.g. "00000000:3B:00.0"; not with gpu_uuid */
} kareus_controller_options;
/* Starts a controller and waits until it is ready. Locking clocks needs root (CAP_SYS_ADMIN;
 * NVML: "requires root/admin permissions"); without it the controller logs the failure and the
 * GPU keeps its default clock (docs/runtime-controller.md). */
int kareus_controller_start(int gpu_index, int dry_run, const char* log_path,
                            kareus_controller** out);
int kareus_controller_start_ex(const kareus_controller_options* options, kareus_controller** out);
/* Asks for `freq_mhz` (0: reset to default clocks); never blocks on the controller. */
int kareus_controller_set_clock(kareus_controller* controller, int freq_mhz);
int kareus_controller_pid(const kareus_controller* controller, int* pid);
/* Resets the clocks and ends the process, waiting for it (seconds; up to about 45 s for a
 * controller stuck in NVML before it is killed). Idempotent; the handle stays valid (set_clock
 * then fails with KAREUS_ERR_STATE) until freed. */
int kareus_controller_stop(kareus_controller* controller);
/* Stops the controller if needed and frees the handle (NULL is ignored). Plans it is still
 * attached to are detached (their hooks then run without a controller). */
void kareus_controller_free(kareus_controller* controller);

/* ---- Energy monitor: what an iteration actually costs on this rank's GPU (docs/runtime.md,
 * "Energy monitor"; records in docs/formats.md). One per rank, used by one thread. The energy of
 * a window is the difference of NVML's total-energy counter of the rank's GPU (NVML opened
 * read-only: no card setting is ever changed); times come from a steady clock. Without NVML
 * (times_only, no driver, a GPU without the counter) it records times only and says so in every
 * record. Every finished iteration (and, with per_instruction, instruction) is one JSON line
 * appended to out_path with one write(), so a killed run keeps every finished record; closing
 * appends the summary. Call sequence errors (an end without its begin, an instruction ended that
 * is not the open one, an instruction outside an iteration, any call after close) are
 * KAREUS_ERR_STATE and change nothing. */
typedef struct kareus_monitor kareus_monitor;
typedef struct kareus_monitor_options {
  int rank;  /* global rank, written into every record */
  int stage; /* the plan's pipeline stage of the rank */
  /* Which GPU: gpu_uuid if set, else pci_bus_id if set, else gpu_index, as for a controller
   * (prefer the UUID or bus id of the rank's CUDA device). */
  int gpu_index;
  const char* gpu_uuid;     /* NULL/"": unused */
  const char* pci_bus_id;   /* NULL/"": unused; not with gpu_uuid */
  int times_only;           /* 1: never load NVML, record times only */
  const char* nvml_library; /* NULL/"": $KAREUS_NVML_LIBRARY, else libnvidia-ml.so.1 */
  int per_instruction;      /* 1: an energy window and a record per instruction too */
  const char* out_path;     /* JSON-lines file, appended to; NULL/"": records kept in memory */
  /* A plan (any rank's handle of it) whose prediction the summary compares with: its
   * iteration_time_s and the energy of one GPU of `stage`; the plan must put `rank` in
   * `stage`. Read at creation only. NULL: no comparison. */
  const kareus_plan* plan;
  double tokens_per_iteration; /* tokens of the whole job per iteration, for J/token; 0: none */
} kareus_monitor_options;
/* Creates a monitor. KAREUS_ERR_INVALID_INPUT for bad options, a GPU NVML does not have or an
 * out_path that cannot be opened; a missing NVML is not an error (times only). */
int kareus_monitor_create(const kareus_monitor_options* options, kareus_monitor** out);
/* Closes the monitor if needed (writing the summary) and frees it (NULL is ignored). Plans it
 * is attached to are detached. */
void kareus_monitor_destroy(kareus_monitor* monitor);
int kareus_monitor_begin_iteration(kareus_monitor* monitor);
/* One finished iteration of the rank. Strings are owned by the monitor and valid until its
 * next kareus_monitor_end_iteration or its destruction. */
typedef struct kareus_iteration_record {
  int rank, stage;
  int iteration;       /* 0-based count of this monitor's iterations */
  double start_unix_s; /* wall clock at the begin, s since the Unix epoch (microseconds) */
  double time_s;       /* begin to end, steady clock */
  int has_energy;      /* 0: times only or a counter problem (note says which) */
  double energy_j;     /* this GPU's NVML counter difference (0 without energy) */
  double avg_power_w;  /* energy_j / time_s (0 without energy) */
  double busy_time_s;  /* sum of the iteration's instruction times */
  int instructions;    /* instructions ended in the iteration */
  const char* note;    /* "" or why there is no energy */
  const char* json;    /* the record's JSON line (without the newline) */
} kareus_iteration_record;
/* Ends the open iteration, appends its record and fills `out` (may be NULL). */
int kareus_monitor_end_iteration(kareus_monitor* monitor, kareus_iteration_record* out);
/* Times an instruction of the open iteration (the hooks call these for an attached monitor). */
int kareus_monitor_begin_instruction(kareus_monitor* monitor, int kind, int chunk, int microbatch);
int kareus_monitor_end_instruction(kareus_monitor* monitor, int kind, int chunk, int microbatch);
/* The totals so far and the comparison with the plan, as a JSON object (the summary record):
 * owned by the monitor, valid until the next call of this function or its destruction. */
int kareus_monitor_summary_json(kareus_monitor* monitor, const char** json);
/* Records so far (iteration, instruction with per_instruction, the summary after close):
 * `*count`, and record `index`'s JSON line, owned by the monitor until its destruction. */
int kareus_monitor_record_count(const kareus_monitor* monitor, int* count);
int kareus_monitor_record_json(const kareus_monitor* monitor, int index, const char** json);
/* 1 when NVML energy is being read; else 0 and `*reason` (may be NULL; owned by the monitor,
 * valid until the next call) says why. */
int kareus_monitor_energy_available(kareus_monitor* monitor, int* available, const char** reason);
/* Appends the summary record; idempotent. Later begin/end calls are KAREUS_ERR_STATE. */
int kareus_monitor_close(kareus_monitor* monitor);

/* ---- Instruction hooks. */
/* Attaches a controller to the plan (NULL detaches). Not owned: it must outlive the attachment. */
int kareus_plan_attach_controller(kareus_plan* plan, kareus_controller* controller);
/* Attaches an energy monitor (NULL detaches): the hooks then time every instruction with it
 * (kareus_monitor_begin_instruction / _end_instruction), and a hook fails with the monitor's
 * status (KAREUS_ERR_STATE outside an iteration: call kareus_monitor_begin_iteration at the
 * start of every training iteration), changing nothing. The monitor's rank must be the plan's
 * (KAREUS_ERR_ARGUMENT otherwise). Not owned: it must outlive the attachment. */
int kareus_plan_attach_monitor(kareus_plan* plan, kareus_monitor* monitor);
/* Call right before the instruction's compute. Fails with KAREUS_ERR_ORDER, changing nothing,
 * unless (kind, chunk, microbatch) is the next instruction of the stage in the plan's order (the
 * schedule's) and no instruction is open; the message names the schedule and the expected
 * (kind, chunk, microbatch). Sends the instruction's clock to the attached controller. After the
 * last instruction of an iteration the order starts again at the first. If the controller has
 * died, the hook prints one warning on stderr, detaches it and succeeds: training goes on at
 * default clocks (only the energy saving is lost). A controller stopped by the caller is
 * KAREUS_ERR_STATE. */
int kareus_instruction_begin_chunk(kareus_plan* plan, int kind, int chunk, int microbatch);
/* Call right after the instruction's compute; (kind, chunk, microbatch) must be the open
 * instruction. */
int kareus_instruction_end_chunk(kareus_plan* plan, int kind, int chunk, int microbatch);
/* Chunk-0 forms of the two hooks; KAREUS_ERR_ORDER on an interleaved plan (naming the _chunk
 * function), where (kind, microbatch) is ambiguous. */
int kareus_instruction_begin(kareus_plan* plan, int kind, int microbatch);
int kareus_instruction_end(kareus_plan* plan, int kind, int microbatch);
/* Where the hooks stand: index of the next (or open) instruction and whether it is open. */
int kareus_plan_position(const kareus_plan* plan, int* next_index, int* open);
/* Starts the order again at the first instruction (e.g. after an aborted iteration); an
 * instruction left open is dropped from an attached monitor too (no record, no busy time). */
int kareus_plan_reset_position(kareus_plan* plan);

#ifdef __cplusplus
}
#endif

#endif /* KAREUS_C_API_H_ */
