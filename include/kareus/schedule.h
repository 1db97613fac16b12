// The pipeline schedule: for p pipeline stages (ranks), v model chunks per stage and m
// micro-batches, the order of instructions on every stage and the data dependencies between
// them. Every part of Kareus that knows an order asks this class: the iteration replay, the
// iteration DAG, the planner, the plan file and its validation, the C API's and the Python
// hooks' order checks, and the timeline.
//
// Model chunks and virtual stages: with v > 1 (Megatron-LM's interleaved 1F1B, Narayanan et
// al., SC '21, section 2.2) stage s holds chunks c = 0..v-1, and chunk c of stage s is virtual
// stage vs = c * p + s: the layers run through stages 0..p-1 of chunk 0, then 0..p-1 of chunk
// 1, and so on. With v = 1 the schedule is plain synchronous 1F1B and vs = s.
//
// Thread-safety: immutable after construction.
#pragma once

#include <string>
#include <vector>

namespace kareus {

enum class InstructionKind { kForward, kBackward };
const char* to_string(InstructionKind k);  ///< "forward", "backward"

/// One instruction of a stage's order: the forward or backward pass of one micro-batch through
/// one model chunk.
struct ScheduledInstruction {
  InstructionKind kind = InstructionKind::kForward;
  int chunk = 0;
  int microbatch = 0;
  bool operator==(const ScheduledInstruction&) const = default;
};

/// An instruction anywhere in the pipeline, named by its virtual stage.
struct InstructionRef {
  InstructionKind kind = InstructionKind::kForward;
  int virtual_stage = 0;
  int microbatch = 0;
  bool operator==(const InstructionRef&) const = default;
};

class Schedule {
 public:
  /// Synchronous 1F1B when chunks == 1, else interleaved 1F1B. Throws InvalidInput when
  /// stages < 1, chunks < 1, microbatches < 1, or, interleaved, stages < 2 or microbatches not
  /// a multiple of stages (Megatron-LM's constraint: micro-batches go through the chunks in
  /// groups of p).
  Schedule(int stages, int chunks, int microbatches);

  int stages() const { return stages_; }
  int chunks() const { return chunks_; }
  int microbatches() const { return microbatches_; }
  bool interleaved() const { return chunks_ > 1; }
  /// "1f1b" or "interleaved-1f1b".
  const char* name() const;

  int virtual_stages() const { return stages_ * chunks_; }
  int virtual_stage(int stage, int chunk) const { return chunk * stages_ + stage; }
  int stage_of(int virtual_stage) const { return virtual_stage % stages_; }
  int chunk_of(int virtual_stage) const { return virtual_stage / stages_; }

  /// Stage s's instructions in execution order: 2 * chunks * microbatches of them.
  const std::vector<ScheduledInstruction>& order(int stage) const;
  /// Forwards stage s runs before its first backward.
  int warmup(int stage) const;

  /// The instruction on another stage whose output (activations or gradients, one message)
  /// this one waits for; false where there is none (the first virtual stage's forwards, the
  /// last one's backwards, whose input is the stage's own forward).
  bool input_of(const InstructionRef& i, InstructionRef* from) const;
  /// Whether the instruction sends its output to another stage.
  bool sends(const InstructionRef& i) const;

  /// Most micro-batch chunks whose activations stage s holds at once (forward done, backward
  /// not yet): what the memory estimate multiplies one chunk's activations by.
  int max_in_flight(int stage) const;

  /// Ideal pipeline bubble as a fraction of the compute time: (p - 1) / (v * m).
  double bubble_fraction() const;

 private:
  int stages_, chunks_, microbatches_;
  std::vector<std::vector<ScheduledInstruction>> orders_;
  std::vector<int> warmup_;
};

}  // namespace kareus
