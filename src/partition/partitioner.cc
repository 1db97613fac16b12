// Partitioner: forms the partitions of the Kareus execution model (Wu, Chung, Chowdhury,
// "Kareus", OSDI '26, section on partitioned overlap execution) from the kernel graph.
//
// Keys follow the artifact's naming: direction + block name, with the collective's short name
// appended when the same block overlaps more than one kind of collective (context parallelism
// yields fwd_qkv_ar / fwd_qkv_ag and so on). Recomputed forward blocks inside the backward
// instruction have the forward blocks' shapes and share their keys.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <map>
#include <set>

#include "kareus/error.h"
#include "kareus/hash.h"
#include "kareus/instruction_settings.h"
#include "kareus/partition.h"

namespace kareus {

int Partition::repeats() const {
  int r = 0;
  for (const auto& o : occurrences) r += o.count;
  return r;
}

namespace {

std::string chain_name_of(const Kernel& collective, const std::vector<Kernel>& tail) {
  std::string name = short_name(collective.collective);
  for (const auto& k : tail) {
    if (k.is_collective()) name.append("_").append(short_name(k.collective));
  }
  return name;
}

}  // namespace

std::string Partition::chain_name() const { return chain_name_of(collective, comm_tail); }

double Partition::compute_flops() const {
  double f = 0;
  for (const auto& k : compute_ops) f += k.flops;
  return f;
}

std::vector<std::string> Partition::slot_names() const {
  std::vector<std::string> names;
  for (const auto& s : slots) names.push_back(s.name);
  return names;
}

bool copy_engine_eligible(const Partition& p) {
  bool any = false;
  auto check = [&](const Kernel& k) {
    if (!k.is_collective() || !(k.wire_bytes() > 0)) return true;
    any = any || k.copy_engine;
    return k.copy_engine;
  };
  if (!check(p.collective)) return false;
  for (const auto& k : p.comm_tail) {
    if (!check(k)) return false;
  }
  return any;
}

bool sms_allowed(const Partition& p, int sms) {
  if (sms == kCopyEngineSms) return copy_engine_eligible(p);
  return sms >= 1 && sms <= kMaxCollectiveSms;
}

std::string allowed_sms_text(const Partition& p) {
  return copy_engine_eligible(p) ? fmt::format("{} (copy engines) or 1..{} (NCCL's channel limit)",
                                               kCopyEngineSms, kMaxCollectiveSms)
                                 : fmt::format("1..{} (NCCL's channel limit)", kMaxCollectiveSms);
}

const Slot& Partition::slot(const std::string& name) const {
  for (const auto& s : slots) {
    if (s.name == name) return s;
  }
  throw InvalidInput(fmt::format("partition '{}': unknown launch slot '{}'; allowed: {}", key, name,
                                 fmt::join(slot_names(), ", ")));
}

const Partition& PartitionSet::partition(const std::string& key) const {
  std::vector<std::string> keys;
  for (const auto& p : partitions) {
    if (p.key == key) return p;
    keys.push_back(p.key);
  }
  throw InvalidInput(
      fmt::format("unknown partition '{}'; this workload has: {}", key, fmt::join(keys, ", ")));
}

const InstructionSteps& PartitionSet::instruction(int stage, InstructionKind kind) const {
  for (const auto& i : instructions) {
    if (i.stage == stage && i.kind == kind) return i;
  }
  throw InternalError(fmt::format("no instruction {} on stage {}", to_string(kind), stage));
}

namespace {

std::string kernel_text(const Kernel& k) {
  std::string s = fmt::format("{}|{}|{:.6e}|{:.6e}|{:.6e}|{}|{}|{}", k.name, to_string(k.kind),
                              k.flops, k.bytes_read, k.bytes_written, k.m, k.n, k.k);
  if (k.is_collective()) {
    s += fmt::format("|{}|{}|{}|{:.6e}|{}", to_string(k.collective), to_string(k.group),
                     k.group_size, k.payload_bytes, k.inter_node);
  }
  return s;
}

struct RawPartition {
  const Block* compute;
  const Block* communication;  ///< the block whose collective (and comm_tail) overlaps
  int stage;
  InstructionKind instruction;
};

std::string prefix(InstructionKind k) { return k == InstructionKind::kForward ? "fwd_" : "bwd_"; }

}  // namespace

namespace {

// Pass 1: the raw (compute block, collective) pairs in execution order, and which collective
// kinds each block meets. Nano-batching pairs block i of one nano-batch with the collective
// of block i-1 of the other.
std::vector<RawPartition> raw_partitions(const KernelGraph& g,
                                         std::map<std::string, std::set<std::string>>& kinds) {
  std::vector<RawPartition> raw;
  for (const auto& sg : g.stages) {
    for (const InstructionGraph* ig : {&sg.forward, &sg.backward}) {
      const auto& b = ig->blocks;
      for (std::size_t i = 1; i < 2 * b.size(); ++i) {
        const Block& c = b[i / 2];
        const Block& comm = b[(i - 1) / 2];
        raw.push_back({&c, &comm, sg.stage, ig->kind});
        kinds[prefix(c.direction) + c.name].insert(chain_name_of(comm.collective, comm.comm_tail));
      }
    }
  }
  return raw;
}

// Pass 2: key, signature and de-duplication. Returns the partition index of every raw pair.
std::vector<int> deduplicate(const std::vector<RawPartition>& raw,
                             const std::map<std::string, std::set<std::string>>& kinds,
                             PartitionSet& ps) {
  std::map<std::string, int> by_signature;
  std::map<std::string, int> versions_of_key;
  std::vector<int> raw_index(raw.size());
  for (std::size_t r = 0; r < raw.size(); ++r) {
    const auto& rp = raw[r];
    const std::string base = prefix(rp.compute->direction) + rp.compute->name;
    const Kernel& coll = rp.communication->collective;
    const auto& tail = rp.communication->comm_tail;
    std::string key = base;
    if (kinds.at(base).size() > 1) key.append("_").append(chain_name_of(coll, tail));
    std::string text = key;
    // Appended piecewise: "\n" + string trips GCC 12's false -Wrestrict once inlined here.
    for (const auto& k : rp.compute->ops) text.append("\n").append(kernel_text(k));
    for (const auto& s : rp.compute->slots) text += fmt::format("\nslot {}@{}", s.name, s.op_index);
    text.append("\n").append(kernel_text(coll));
    // A tail joins the signature only where there is one, so TP and CP signatures (the profile
    // store's keys) stay as they were.
    for (const auto& k : tail) text.append("\ntail ").append(kernel_text(k));
    const std::string sig = fmt::format("{:016x}", fnv1a(text));
    auto it = by_signature.find(sig);
    if (it == by_signature.end()) {
      const int v = ++versions_of_key[key];
      Partition p;
      p.key = v == 1 ? key : fmt::format("{}_v{}", key, v);
      p.direction = rp.compute->direction;
      p.compute_ops = rp.compute->ops;
      p.slots = rp.compute->slots;
      p.collective = coll;
      p.comm_tail = tail;
      p.signature = sig;
      it = by_signature.emplace(sig, static_cast<int>(ps.partitions.size())).first;
      ps.partitions.push_back(std::move(p));
    }
    raw_index[r] = it->second;
    auto& occ = ps.partitions[static_cast<std::size_t>(it->second)].occurrences;
    if (occ.empty() || occ.back().stage != rp.stage || occ.back().instruction != rp.instruction) {
      occ.push_back({rp.stage, rp.instruction, 0});
    }
    ++occ.back().count;
  }
  return raw_index;
}

void add_segment(PartitionSet& ps, InstructionSteps& is, std::string name,
                 std::vector<Kernel> kernels) {
  if (kernels.empty()) return;
  ps.segments.push_back({std::move(name), is.stage, to_string(is.kind), std::move(kernels)});
  is.steps.push_back({Step::Kind::kSegment, static_cast<int>(ps.segments.size()) - 1});
}

// Pass 3 for one instruction: its steps in execution order; `next_raw` walks raw_index.
InstructionSteps instruction_steps(PartitionSet& ps, const InstructionGraph& ig, int stage,
                                   bool overlap, const std::vector<int>& raw_index,
                                   std::size_t& next_raw) {
  InstructionSteps is;
  is.stage = stage;
  is.kind = ig.kind;
  const bool fwd = ig.kind == InstructionKind::kForward;
  add_segment(ps, is, fwd ? "embedding" : "output_layer_bwd", ig.prologue);
  const auto& b = ig.blocks;
  if (overlap && !b.empty()) {
    add_segment(ps, is, "stack_head", b.front().ops);
    for (std::size_t i = 1; i < 2 * b.size(); ++i) {
      is.steps.push_back({Step::Kind::kPartition, raw_index[next_raw++]});
    }
    std::vector<Kernel> tail = {b.back().collective};
    tail.insert(tail.end(), b.back().comm_tail.begin(), b.back().comm_tail.end());
    add_segment(ps, is, "stack_tail", tail);
  } else {
    std::vector<Kernel> seq;
    for (const auto& blk : b) {
      seq.insert(seq.end(), blk.ops.begin(), blk.ops.end());
      seq.push_back(blk.collective);
      seq.insert(seq.end(), blk.comm_tail.begin(), blk.comm_tail.end());
    }
    add_segment(ps, is, "layer_stack", seq);
  }
  add_segment(ps, is, fwd ? "output_layer" : "embedding_bwd", ig.epilogue);
  return is;
}

// The compute kernels of one micro-batch's instruction in execution order, collectives left
// out (both nano-batches' blocks; a tail's small kernels run on the compute units too).
std::vector<Kernel> compute_kernels(const InstructionGraph& ig) {
  std::vector<Kernel> out = ig.prologue;
  for (const auto& b : ig.blocks) {
    for (int nb = 0; nb < ig.nano_batches; ++nb) {
      out.insert(out.end(), b.ops.begin(), b.ops.end());
      for (const auto& k : b.comm_tail) {
        if (!k.is_collective()) out.push_back(k);
      }
    }
  }
  for (const auto& k : ig.epilogue) {
    if (!k.is_collective()) out.push_back(k);
  }
  std::erase_if(out, [](const Kernel& k) { return k.is_collective(); });
  return out;
}

DpGradOverlap dp_grad_overlap(const StageGraph& sg) {
  const DpComm& d = *sg.dp;
  DpGradOverlap o;
  o.stage = sg.stage;
  const std::vector<Kernel> ops = compute_kernels(sg.backward);
  o.compute = {"dp_overlap_compute", sg.stage, "backward", ops};
  const double buckets = std::ceil(d.params / d.bucket_params);
  const double last_params = d.params - (buckets - 1) * d.bucket_params;
  Kernel last = d.grad_reduce_scatter;
  last.name = "dp_grad_reducescatter_last_bucket";
  last.payload_bytes *= last_params / d.params;
  o.exposed = {"dp_grad_exposed", sg.stage, "backward", {last}};
  o.no_overlap = buckets < 2 || ops.empty();
  if (o.no_overlap) return o;
  // The first bucket's gradients are complete once that share of the backward's FLOPs ran.
  double total = 0;
  for (const auto& k : ops) total += k.flops;
  const double ready = total * d.bucket_params / d.params;
  // The collective launches before the first op after that share (the last op at the latest).
  int slot = 0;
  for (double acc = 0; slot + 1 < static_cast<int>(ops.size());) {
    acc += ops[static_cast<std::size_t>(slot)].flops;
    ++slot;
    if (acc >= ready) break;
  }
  Partition& p = o.overlapped;
  p.key = fmt::format("dp_grad_overlap_s{}", sg.stage);
  p.direction = InstructionKind::kBackward;
  p.compute_ops = ops;
  p.slots = {{"first_bucket", slot}};
  p.collective = d.grad_reduce_scatter;
  p.collective.name = "dp_grad_reducescatter_buckets";
  p.collective.payload_bytes -= last.payload_bytes;
  std::string text = p.key;
  for (const auto& k : ops) text.append("\n").append(kernel_text(k));
  text += fmt::format("\nslot first_bucket@{}", slot);
  text.append("\n").append(kernel_text(p.collective));
  p.signature = fmt::format("{:016x}", fnv1a(text));
  p.occurrences.push_back({sg.stage, InstructionKind::kBackward, 1});
  return o;
}

}  // namespace

PartitionSet partition_workload(const Workload& w) {
  PartitionSet ps;
  ps.graph = build_kernel_graph(w);
  const bool overlap = w.batch.nano_batches == 2;
  std::map<std::string, std::set<std::string>> kinds_of_block;
  const std::vector<RawPartition> raw =
      overlap ? raw_partitions(ps.graph, kinds_of_block) : std::vector<RawPartition>{};
  const std::vector<int> raw_index = deduplicate(raw, kinds_of_block, ps);
  std::size_t next_raw = 0;
  for (const auto& sg : ps.graph.stages) {
    for (const InstructionGraph* ig : {&sg.forward, &sg.backward}) {
      ps.instructions.push_back(instruction_steps(ps, *ig, sg.stage, overlap, raw_index, next_raw));
    }
    for (const auto& k : sg.per_iteration) {
      ps.segments.push_back({k.name, sg.stage, "iteration", {k}});
      ps.iteration_segments.push_back(static_cast<int>(ps.segments.size()) - 1);
    }
    if (sg.dp && sg.dp->overlapped) {
      ps.dp_grad_overlaps.push_back(dp_grad_overlap(sg));
      ps.dp_param_gathers.push_back(
          {"dp_param_allgather", sg.stage, "iteration", {sg.dp->param_all_gather}});
    }
  }
  if (next_raw != raw.size()) throw InternalError("partitioner lost track of partition instances");
  return ps;
}

}  // namespace kareus
