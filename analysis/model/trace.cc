#include "analysis/model/trace.h"

#include <algorithm>

namespace dynaflow {

StringTable::StringTable() { Intern(""); }

StringId StringTable::Intern(std::string_view s) {
  auto it = index_.find(s);
  if (it != index_.end()) return it->second;
  const std::string& stored = storage_.emplace_back(s);
  auto id = static_cast<StringId>(by_id_.size());
  by_id_.push_back(stored);
  index_.emplace(stored, id);
  return id;
}

void ImportStats::Add(std::string_view name, std::string_view severity,
                      std::string_view description, int64_t n) {
  for (ImportStat& s : stats_) {
    if (s.name == name) {
      s.count += n;
      return;
    }
  }
  stats_.push_back({std::string(name), std::string(severity), std::string(description), n});
}

int64_t ImportStats::Get(std::string_view name) const {
  for (const ImportStat& s : stats_) {
    if (s.name == name) return s.count;
  }
  return 0;
}

uint32_t Trace::DeviceIndex(int32_t rank, int32_t device) {
  const int64_t key = (static_cast<int64_t>(rank) << 32) | static_cast<uint32_t>(device);
  auto it = device_lookup_.find(key);
  if (it != device_lookup_.end()) return it->second;
  auto index = static_cast<uint32_t>(devices.size());
  DeviceInfo info;
  info.rank = rank;
  info.device = device;
  devices.push_back(std::move(info));
  device_lookup_.emplace(key, index);
  return index;
}

}  // namespace dynaflow

namespace dynaflow {
namespace {

template <typename Record>
void SetRank(std::vector<Record>& records, int32_t rank) {
  for (Record& r : records) r.rank = rank;
}

}  // namespace

Status Trace::CheckNewRank(int32_t rank, const std::string& source) const {
  auto in = [rank](const auto& records) {
    return std::any_of(records.begin(), records.end(),
                       [rank](const auto& r) { return r.rank == rank; });
  };
  if (!in(devices) && !in(processes) && !in(threads) && !in(api) && !in(ops) && !in(ranges)) {
    return Status::Ok();
  }
  return Status::BadInput(source + ": rank " + std::to_string(rank) +
                          " is also in an earlier input: give each rank's trace once");
}

void Trace::Append(Trace&& part, int32_t rank) {
  const bool empty = devices.empty() && gpu.empty() && api.empty() && ops.empty() &&
                     ranges.empty() && processes.empty() && strings.size() == 1 &&
                     metadata.empty() && stats.all().empty();
  if (empty) {
    // The common single-file case: take the part whole, no copies.
    *this = std::move(part);
    SetRank(devices, rank);
    SetRank(api, rank);
    SetRank(ops, rank);
    SetRank(ranges, rank);
    SetRank(processes, rank);
    SetRank(threads, rank);
    if (auto it = distributed_info.find(0); it != distributed_info.end() && rank != 0) {
      distributed_info[rank] = std::move(it->second);
      distributed_info.erase(0);
    }
    device_lookup_.clear();
    for (uint32_t i = 0; i < devices.size(); ++i) {
      const int64_t key =
          (static_cast<int64_t>(rank) << 32) | static_cast<uint32_t>(devices[i].device);
      device_lookup_.emplace(key, i);
    }
    return;
  }

  std::vector<StringId> sid(part.strings.size());
  for (size_t i = 0; i < sid.size(); ++i) sid[i] = strings.Intern(part.strings.Get(i));
  std::vector<uint32_t> did(part.devices.size());
  for (size_t i = 0; i < did.size(); ++i) {
    DeviceInfo info = part.devices[i];
    did[i] = DeviceIndex(rank, info.device);
    info.rank = rank;
    devices[did[i]] = std::move(info);
  }
  for (GpuActivity g : part.gpu) {
    g.device_index = did[g.device_index];
    g.name = sid[g.name];
    g.copy_kind = sid[g.copy_kind];
    g.collective = sid[g.collective];
    gpu.push_back(g);
  }
  for (ApiCall a : part.api) {
    a.rank = rank;
    a.name = sid[a.name];
    api.push_back(a);
  }
  for (Operator o : part.ops) {
    o.rank = rank;
    o.name = sid[o.name];
    o.input_shapes = sid[o.input_shapes];
    o.input_types = sid[o.input_types];
    o.concrete_inputs = sid[o.concrete_inputs];
    o.input_strides = sid[o.input_strides];
    o.collective = sid[o.collective];
    o.module_path = sid[o.module_path];
    ops.push_back(o);
  }
  for (Range r : part.ranges) {
    r.rank = rank;
    r.name = sid[r.name];
    if (r.device_index >= 0) r.device_index = static_cast<int32_t>(did[r.device_index]);
    ranges.push_back(r);
  }
  for (auto& [part_rank, info] : part.distributed_info) distributed_info[rank] = std::move(info);
  for (ProcessInfo p : part.processes) {
    p.rank = rank;
    processes.push_back(std::move(p));
  }
  for (ThreadInfo t : part.threads) {
    t.rank = rank;
    threads.push_back(std::move(t));
  }
  for (const ImportStat& s : part.stats.all()) stats.Add(s.name, s.severity, s.description, s.count);
  for (const auto& [key, value] : part.metadata) {
    std::string& v = metadata[key];
    v = v.empty() ? value : v + ";" + value;
  }
  part = Trace();
}

}  // namespace dynaflow
