// JSON forms of partitions and segments for the distributed-profiling wire format. Enums travel
// as integers (both ends are the same build); doubles are written by nlohmann with round-trip
// precision, so a worker simulates exactly the shapes rank 0 holds.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "kareus/distributed.h"
#include "kareus/error.h"

namespace kareus::distributed {
namespace {

using nlohmann::json;

json kernel_json(const Kernel& k) {
  return {{"name", k.name},
          {"kind", static_cast<int>(k.kind)},
          {"flops", k.flops},
          {"model_flops", k.model_flops},
          {"bytes_read", k.bytes_read},
          {"bytes_written", k.bytes_written},
          {"m", k.m},
          {"n", k.n},
          {"k", k.k},
          {"groups", k.groups},
          {"kv_calls", k.kv_calls},
          {"collective", static_cast<int>(k.collective)},
          {"group", static_cast<int>(k.group)},
          {"group_size", k.group_size},
          {"payload_bytes", k.payload_bytes},
          {"inter_node", k.inter_node},
          {"node_ranks", k.node_ranks},
          {"copy_engine", k.copy_engine}};
}

Kernel kernel_from(const json& j) {
  Kernel k;
  k.name = j.at("name").get<std::string>();
  k.kind = static_cast<OpKind>(j.at("kind").get<int>());
  k.flops = j.at("flops").get<double>();
  k.model_flops = j.at("model_flops").get<double>();
  k.bytes_read = j.at("bytes_read").get<double>();
  k.bytes_written = j.at("bytes_written").get<double>();
  k.m = j.at("m").get<std::int64_t>();
  k.n = j.at("n").get<std::int64_t>();
  k.k = j.at("k").get<std::int64_t>();
  k.groups = j.at("groups").get<int>();
  k.kv_calls = j.value("kv_calls", 1);
  k.collective = static_cast<CollectiveKind>(j.at("collective").get<int>());
  k.group = static_cast<CommGroup>(j.at("group").get<int>());
  k.group_size = j.at("group_size").get<int>();
  k.payload_bytes = j.at("payload_bytes").get<double>();
  k.inter_node = j.at("inter_node").get<bool>();
  k.node_ranks = j.at("node_ranks").get<int>();
  k.copy_engine = j.at("copy_engine").get<bool>();
  return k;
}

json kernels_json(const std::vector<Kernel>& ks) {
  json a = json::array();
  for (const auto& k : ks) a.push_back(kernel_json(k));
  return a;
}

std::vector<Kernel> kernels_from(const json& a) {
  std::vector<Kernel> out;
  for (const auto& k : a) out.push_back(kernel_from(k));
  return out;
}

json parse(const std::string& text, const char* what) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw InternalError(
        fmt::format("distributed profiling: malformed {} message: {}", what, e.what()));
  }
}

}  // namespace

std::string encode_partition(const Partition& p) {
  json slots = json::array();
  for (const auto& s : p.slots) slots.push_back({s.name, s.op_index});
  json occ = json::array();
  for (const auto& o : p.occurrences) {
    occ.push_back({o.stage, static_cast<int>(o.instruction), o.count});
  }
  const json j = {{"key", p.key},
                  {"direction", static_cast<int>(p.direction)},
                  {"compute_ops", kernels_json(p.compute_ops)},
                  {"slots", slots},
                  {"collective", kernel_json(p.collective)},
                  {"comm_tail", kernels_json(p.comm_tail)},
                  {"signature", p.signature},
                  {"occurrences", occ}};
  return j.dump();
}

Partition decode_partition(const std::string& text) {
  const json j = parse(text, "partition");
  try {
    Partition p;
    p.key = j.at("key").get<std::string>();
    p.direction = static_cast<InstructionKind>(j.at("direction").get<int>());
    p.compute_ops = kernels_from(j.at("compute_ops"));
    for (const auto& s : j.at("slots")) {
      p.slots.push_back({s.at(0).get<std::string>(), s.at(1).get<int>()});
    }
    p.collective = kernel_from(j.at("collective"));
    p.comm_tail = kernels_from(j.at("comm_tail"));
    p.signature = j.at("signature").get<std::string>();
    for (const auto& o : j.at("occurrences")) {
      p.occurrences.push_back({o.at(0).get<int>(), static_cast<InstructionKind>(o.at(1).get<int>()),
                               o.at(2).get<int>()});
    }
    return p;
  } catch (const json::exception& e) {
    throw InternalError(fmt::format("distributed profiling: malformed partition: {}", e.what()));
  }
}

std::string encode_segment(const Segment& s) {
  const json j = {{"name", s.name},
                  {"stage", s.stage},
                  {"instruction", s.instruction},
                  {"kernels", kernels_json(s.kernels)}};
  return j.dump();
}

Segment decode_segment(const std::string& text) {
  const json j = parse(text, "segment");
  try {
    Segment s;
    s.name = j.at("name").get<std::string>();
    s.stage = j.at("stage").get<int>();
    s.instruction = j.at("instruction").get<std::string>();
    s.kernels = kernels_from(j.at("kernels"));
    return s;
  } catch (const json::exception& e) {
    throw InternalError(fmt::format("distributed profiling: malformed segment: {}", e.what()));
  }
}

}  // namespace kareus::distributed
