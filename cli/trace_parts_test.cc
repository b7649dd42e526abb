#include "cli/trace_parts.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "analysis/store/store.h"
#include "tests/temp_path.h"

namespace dynaflow {
namespace {

// A parts folder of processes that said only their metadata.
class PartsFolder {
 public:
  PartsFolder() : dir_(TempPath("parts")) { std::filesystem::create_directories(dir_); }
  ~PartsFolder() { std::filesystem::remove_all(dir_); }
  void Add(int pid, std::map<std::string, std::string> meta) {
    Trace part;
    part.metadata = std::move(meta);
    part.metadata["pid"] = std::to_string(pid);
    const Status st = WriteTraceDb(part, dir_ + "/" + std::to_string(pid) + ".db");
    ASSERT_TRUE(st.ok()) << st.message();
  }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

TEST(MergePartsTest, WindowsLentToTorchProfilerAreCountedAsDataLoss) {
  PartsFolder parts;
  parts.Add(100, {{"cupti", "enabled"},
                  {"torch_profiler_windows", "2"},
                  {"cupti_kineto_window_count", "2"},
                  {"cupti_kineto_windows", "10-20,30-40"},
                  {"cupti_kineto_operators", "5"}});
  parts.Add(101, {{"cupti", "enabled"},
                  {"cupti_kineto_window_count", "1"},
                  {"cupti_kineto_windows", "50-"},
                  {"cupti_kineto_operators", "3"}});
  parts.Add(102, {{"cupti", "unavailable: CUPTI was not started"},
                  {"torch_profiler_windows", "4"}});  // nothing recorded, nothing lost
  Trace merged;
  const PartsSummary summary = MergeParts(parts.dir(), &merged);
  EXPECT_EQ(summary.processes, 3);
  EXPECT_EQ(merged.stats.Get("cupti_lent_to_torch_profiler"), 3);
  EXPECT_EQ(merged.stats.Get("operators_in_torch_profiler_windows"), 8);
  for (const ImportStat& stat : merged.stats.all()) {
    if (stat.name == "cupti_lent_to_torch_profiler") EXPECT_EQ(stat.severity, "data_loss");
  }
}

TEST(MergePartsTest, NoTorchProfilerNoStatistic) {
  PartsFolder parts;
  parts.Add(100, {{"cupti", "enabled"}});
  Trace merged;
  MergeParts(parts.dir(), &merged);
  EXPECT_EQ(merged.stats.Get("cupti_lent_to_torch_profiler"), 0);
  EXPECT_EQ(merged.stats.Get("operators_in_torch_profiler_windows"), 0);
}

}  // namespace
}  // namespace dynaflow
