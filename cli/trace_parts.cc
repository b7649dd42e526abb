#include "cli/trace_parts.h"

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <map>
#include <set>
#include <string>

#include "analysis/store/store.h"

namespace dynaflow {
namespace {

namespace fs = std::filesystem;

int64_t MetaInt(const Trace& t, const std::string& key) {
  auto it = t.metadata.find(key);
  if (it == t.metadata.end()) return 0;
  return std::strtoll(it->second.c_str(), nullptr, 10);
}

std::vector<fs::path> Parts(const fs::path& dir) {
  std::vector<fs::path> parts;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (IsPart(entry.path())) parts.push_back(entry.path());
  }
  std::sort(parts.begin(), parts.end());
  return parts;
}

// The part's metadata becomes its process's own (one value per process and
// key, process_meta in the store); the trace-wide meta gets what every process
// that recorded a key agrees on (SharedMetadata).
void KeepAsProcessMetadata(Trace* part) {
  for (ProcessInfo& p : part->processes) p.metadata = part->metadata;
  part->metadata.clear();
}

void SharedMetadata(Trace* merged) {
  std::map<std::string, std::string> shared;
  std::set<std::string> differing;
  for (const ProcessInfo& p : merged->processes) {
    for (const auto& [key, value] : p.metadata) {
      if (differing.contains(key)) continue;
      auto [it, inserted] = shared.emplace(key, value);
      if (!inserted && it->second != value) {
        shared.erase(it);
        differing.insert(key);
      }
    }
  }
  for (auto& [key, value] : shared) merged->metadata[key] = std::move(value);
}

// The GPU records of the windows in which torch.profiler held CUPTI went to
// torch.profiler's trace (Tracer::LendCupti): data lost to this one.
void CountTorchProfilerWindows(const Trace& part, ImportStats* stats) {
  const int64_t windows = MetaInt(part, "cupti_kineto_window_count");
  if (windows == 0) return;
  stats->Add("cupti_lent_to_torch_profiler", "data_loss",
             "windows in which torch.profiler held CUPTI: the GPU records between their start "
             "and end (meta cupti_kineto_windows, ns) are in torch.profiler's trace, not here",
             windows);
  stats->Add("operators_in_torch_profiler_windows", "data_loss",
             "operators launched while torch.profiler held CUPTI: their GPU work is not linked "
             "here",
             MetaInt(part, "cupti_kineto_operators"));
}

}  // namespace

bool IsPart(const fs::path& p) {
  const std::string stem = p.stem().string();
  return p.extension() == ".db" && !stem.empty() &&
         std::all_of(stem.begin(), stem.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool IsPartsFolder(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec) && !Parts(p).empty();
}

PartsSummary MergeParts(const std::string& parts_dir, Trace* merged) {
  PartsSummary summary;
  std::map<int32_t, int> gpu_processes;  // per rank, the processes that recorded GPU work
  for (const fs::path& path : Parts(parts_dir)) {
    Trace part;
    Status st = ReadTraceDb(path.string(), &part);
    if (!st.ok()) {
      std::cerr << "dynaflow: skipped " << st.message() << "\n";
      continue;
    }
    ++summary.processes;
    summary.dropped_records += MetaInt(part, "dropped_records");
    auto cupti = part.metadata.find("cupti");
    if (cupti != part.metadata.end() && !cupti->second.empty()) summary.cupti.insert(cupti->second);
    if (auto signal = part.metadata.find("exit_signal"); signal != part.metadata.end()) {
      summary.crashes.push_back(path.stem().string() + " died of " + signal->second);
    }
    CountTorchProfilerWindows(part, &merged->stats);
    const auto rank = static_cast<int32_t>(MetaInt(part, "rank"));
    if (!part.gpu.empty()) ++gpu_processes[rank];
    KeepAsProcessMetadata(&part);
    merged->Append(std::move(part), rank);
  }
  for (const auto& [rank, n] : gpu_processes) {
    if (n < 2) continue;
    // Their devices become one rank's: the same device number of two
    // processes merges, and per-rank analysis mixes them.
    summary.shared_ranks.push_back(rank);
    merged->stats.Add("rank_with_several_gpu_processes", "info",
                      "processes of one rank that each recorded GPU work (set RANK per process, or "
                      "call torch.distributed.init_process_group in each)",
                      n);
  }
  SharedMetadata(merged);
  // Totals over the processes.
  merged->metadata["format"] = "dynaflow";
  merged->metadata["dropped_records"] = std::to_string(summary.dropped_records);
  merged->metadata["processes"] = std::to_string(summary.processes);
  return summary;
}

void WarnSharedRanks(const PartsSummary& summary) {
  for (const int32_t rank : summary.shared_ranks) {
    std::cerr << "dynaflow: warning: several processes recorded GPU work as rank " << rank
              << "; their devices are merged (set RANK per process, or call "
                 "torch.distributed.init_process_group in each)\n";
  }
}

}  // namespace dynaflow
