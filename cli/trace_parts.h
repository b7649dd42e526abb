// The per-process stores `dynaflow trace` collects in a hidden parts folder
// (.<output>.parts-XXXXXX/<pid>.db, one per traced process) and their merge
// into one trace. `trace` merges them when the program ends; `import` and
// `info` read a parts folder left behind when dynaflow itself died.
#pragma once

#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "analysis/model/trace.h"

namespace dynaflow {

// What the merged processes said about themselves (their meta).
struct PartsSummary {
  int processes = 0;
  int64_t dropped_records = 0;
  std::set<std::string> cupti;       // distinct non-empty "cupti" statuses
  std::vector<std::string> crashes;  // "<pid> died of SIGSEGV": meta "exit_signal"
  std::vector<int32_t> shared_ranks;  // ranks that several processes recorded GPU work as
};

// "<pid>.db": what the tracer writes. Anything else (a writer's temporary or
// journal file) is not a part.
bool IsPart(const std::filesystem::path& p);

// A directory that holds at least one part.
bool IsPartsFolder(const std::filesystem::path& p);

// Reads every part of `parts_dir` into `merged`. A process's store holds one
// rank (meta "rank": the torch.distributed rank, else the tracer's
// DYNAFLOW_RANK or RANK); its records keep it. An unreadable part (a process
// killed while creating it) is skipped with a line.
PartsSummary MergeParts(const std::string& parts_dir, Trace* merged);

// One line per rank that several processes recorded GPU work as.
void WarnSharedRanks(const PartsSummary& summary);

}  // namespace dynaflow
