// Synchronous and interleaved 1F1B pipeline schedules (Narayanan et al., "Efficient Large-Scale
// Language Model Training on GPU Clusters Using Megatron-LM", SC '21, sections 2.2.1-2.2.2).
//
// Synchronous 1F1B: stage s runs min(p - s - 1, m) warm-up forwards, then alternates one
// forward and one backward, then drains the remaining backwards.
//
// Interleaved 1F1B, as Megatron-LM's forward_backward_pipelining_with_interleaving orders it:
// each stage runs v * m chunk passes of each kind. The k-th forward pass of a stage is chunk
// (k mod p*v) / p of micro-batch (k / (p*v)) * p + k mod p, so micro-batches go through the
// chunks in groups of p (hence m must be a multiple of p); the k-th backward pass takes the
// chunks in reverse. Stage s runs (p - s - 1) * 2 + (v - 1) * p warm-up forwards (all v * m
// when m == p), then one forward and one backward alternately, then the remaining backwards.
// The ideal bubble shrinks from (p - 1) / m to (p - 1) / (v * m) of the compute time.
#include "kareus/schedule.h"

#include <fmt/format.h>

#include <algorithm>

#include "kareus/error.h"

namespace kareus {

const char* to_string(InstructionKind k) {
  return k == InstructionKind::kForward ? "forward" : "backward";
}

Schedule::Schedule(int stages, int chunks, int microbatches)
    : stages_(stages), chunks_(chunks), microbatches_(microbatches) {
  if (stages < 1 || chunks < 1 || microbatches < 1) {
    throw InvalidInput(
        fmt::format("pipeline schedule: stages {}, chunks {}, micro-batches {}: each must be >= 1",
                    stages, chunks, microbatches));
  }
  if (chunks > 1 && stages < 2) {
    throw InvalidInput(fmt::format(
        "pipeline schedule: {} model chunks per stage need at least 2 pipeline stages", chunks));
  }
  if (chunks > 1 && microbatches % stages != 0) {
    throw InvalidInput(fmt::format(
        "pipeline schedule: interleaved 1F1B runs micro-batches in groups of the pipeline "
        "size: micro-batches ({}) must be a multiple of the pipeline stages ({})",
        microbatches, stages));
  }
  const int p = stages, v = chunks, total = chunks * microbatches;
  auto pass = [p, v](InstructionKind kind, int k) {
    const int in_group = k % (p * v);
    int chunk = in_group / p;
    if (kind == InstructionKind::kBackward) chunk = v - 1 - chunk;
    return ScheduledInstruction{kind, chunk, (k / (p * v)) * p + k % p};
  };
  for (int s = 0; s < p; ++s) {
    int warm = 0;
    if (v == 1) {
      warm = std::min(p - s - 1, microbatches);
    } else if (microbatches == p) {
      warm = total;
    } else {
      warm = std::min((p - s - 1) * 2 + (v - 1) * p, total);
    }
    std::vector<ScheduledInstruction> o;
    o.reserve(static_cast<std::size_t>(2 * total));
    int f = 0, b = 0;
    for (; f < warm; ++f) o.push_back(pass(InstructionKind::kForward, f));
    while (f < total) {
      o.push_back(pass(InstructionKind::kForward, f++));
      o.push_back(pass(InstructionKind::kBackward, b++));
    }
    while (b < total) o.push_back(pass(InstructionKind::kBackward, b++));
    orders_.push_back(std::move(o));
    warmup_.push_back(warm);
  }
}

const char* Schedule::name() const { return interleaved() ? "interleaved-1f1b" : "1f1b"; }

const std::vector<ScheduledInstruction>& Schedule::order(int stage) const {
  if (stage < 0 || stage >= stages_) {
    throw InternalError(fmt::format("Schedule::order: stage {} of {}", stage, stages_));
  }
  return orders_[static_cast<std::size_t>(stage)];
}

int Schedule::warmup(int stage) const {
  order(stage);  // range check
  return warmup_[static_cast<std::size_t>(stage)];
}

bool Schedule::input_of(const InstructionRef& i, InstructionRef* from) const {
  const int last = virtual_stages() - 1;
  if (i.kind == InstructionKind::kForward) {
    if (i.virtual_stage == 0) return false;
    *from = {InstructionKind::kForward, i.virtual_stage - 1, i.microbatch};
    return true;
  }
  if (i.virtual_stage == last) return false;
  *from = {InstructionKind::kBackward, i.virtual_stage + 1, i.microbatch};
  return true;
}

bool Schedule::sends(const InstructionRef& i) const {
  return i.kind == InstructionKind::kForward ? i.virtual_stage + 1 < virtual_stages()
                                             : i.virtual_stage > 0;
}

int Schedule::max_in_flight(int stage) const {
  int held = 0, most = 0;
  for (const auto& x : order(stage)) {
    held += x.kind == InstructionKind::kForward ? 1 : -1;
    most = std::max(most, held);
  }
  return most;
}

double Schedule::bubble_fraction() const {
  return static_cast<double>(stages_ - 1) / (static_cast<double>(chunks_) * microbatches_);
}

}  // namespace kareus
