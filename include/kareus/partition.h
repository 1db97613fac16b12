// Partitions: the repeating units Kareus optimizes (Wu, Chung, Chowdhury, OSDI '26). With two
// nano-batches the layer stack of an instruction runs as an interleaving NB0 b0, NB1 b0, NB0 b1,
// NB1 b1, ... of compute blocks; each compute block runs concurrently with the collective that the
// other nano-batch issued just before. Such a pair is a partition. The first compute block (nothing
// to overlap yet) and the last collective (nothing left to overlap with) are segments, as are the
// embedding, the output layer and loss, and the pipeline/data-parallel communication.
//
// Partitions with the same key and shapes are stored once with a repeat count; every
// instruction refers to them through an ordered list of steps.
#pragma once

#include <string>
#include <vector>

#include "kareus/kernel_graph.h"

namespace kareus {

struct PartitionOccurrence {
  int stage = 0;
  InstructionKind instruction = InstructionKind::kForward;
  int count = 0;  ///< instances per micro-batch in this stage's instruction
};

struct Partition {
  std::string key;  ///< e.g. "fwd_attn", "bwd_qkv_rs"
  InstructionKind direction = InstructionKind::kForward;
  std::vector<Kernel> compute_ops;  ///< one nano-batch's compute, in order
  std::vector<Slot> slots;          ///< launch points of `collective` among compute_ops
  Kernel collective;                ///< the other nano-batch's collective
  /// What the other nano-batch's communication stream runs after `collective` (Block::
  /// comm_tail): under sequence parallelism its norm and AllGather. Empty without sequence
  /// parallelism.
  std::vector<Kernel> comm_tail;
  std::string signature;  ///< stable hash of every shape above (profile-store key)
  std::vector<PartitionOccurrence> occurrences;

  int repeats() const;  ///< instances per micro-batch, all stages and instructions together
  /// The collectives' short names joined by '_', e.g. "ar", "rs_ag" (a chain with a tail).
  std::string chain_name() const;
  double compute_flops() const;
  const Slot& slot(const std::string& name) const;  ///< throws InvalidInput listing the slots
  std::vector<std::string> slot_names() const;
};

/// Work outside partitions: run alone, without overlap.
struct Segment {
  std::string name;
  int stage = 0;
  std::string instruction;  ///< "forward", "backward" or "iteration" (once per iteration)
  std::vector<Kernel> kernels;
};

/// One element of an instruction's execution order.
struct Step {
  enum class Kind { kPartition, kSegment } kind = Kind::kPartition;
  int index = 0;  ///< into PartitionSet::partitions or PartitionSet::segments
};

struct InstructionSteps {
  int stage = 0;
  InstructionKind kind = InstructionKind::kForward;
  std::vector<Step> steps;
};

/// A chunk's data-parallel gradient reduce-scatter under its last backward (KernelGraph DpComm):
/// the bucket of the last layers is ready first, so the collective of every bucket but the
/// last runs under the rest of the backward, launched where the first bucket's gradients are
/// complete; the last bucket (the chunk's first layers) runs after the backward. The backward
/// then costs its own time plus increment = overlapped - compute + exposed, each measured
/// like any partition or segment.
struct DpGradOverlap {
  int stage = 0;  ///< virtual stage
  /// The backward's compute kernels for one micro-batch (collectives left out) with the
  /// overlapped buckets' reduce-scatter; no_overlap when the chunk's gradients fit one bucket.
  Partition overlapped;
  bool no_overlap = false;
  Segment compute;  ///< the same compute kernels alone
  Segment exposed;  ///< the last bucket's reduce-scatter
};

struct PartitionSet {
  KernelGraph graph;
  std::vector<Partition> partitions;  ///< distinct partitions, in first-seen order
  std::vector<Segment> segments;
  std::vector<InstructionSteps> instructions;  ///< stage-major: (0,fwd), (0,bwd), (1,fwd), ...
  std::vector<int> iteration_segments;         ///< per-iteration segments (DP, tied embedding)
  /// With overlapped data-parallel communication, per virtual stage: the gradient
  /// reduce-scatter under the chunk's last backward, and the parameter all-gather, which runs
  /// on the DP stream from the iteration start and must end before the chunk's first forward.
  std::vector<DpGradOverlap> dp_grad_overlaps;
  std::vector<Segment> dp_param_gathers;

  const Partition& partition(const std::string& key) const;  ///< throws InvalidInput
  const InstructionSteps& instruction(int stage, InstructionKind kind) const;
};

/// Whether the partition's communication chain can run with no SMs (kCopyEngineSms): every
/// collective that moves data is copy-engine capable (Kernel::copy_engine) and at least one
/// does; its small tail kernels then take the whole GPU in turn with the compute.
bool copy_engine_eligible(const Partition& p);
/// The one rule for a partition's SM count (search space, `kareus profile`, plans):
/// 1..kMaxCollectiveSms, and kCopyEngineSms where copy_engine_eligible.
bool sms_allowed(const Partition& p, int sms);
/// "0 (copy engines) or 1..32" or "1..32 (NCCL's channel limit)", for error messages.
std::string allowed_sms_text(const Partition& p);

/// Cuts every instruction at its collectives and forms the partitions.
PartitionSet partition_workload(const Workload& w);

}  // namespace kareus
