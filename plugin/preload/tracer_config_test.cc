#include "plugin/preload/tracer_config.h"

#include <gtest/gtest.h>

#include <map>

namespace dynaflow {
namespace {

TracerConfig Read(const std::map<std::string, std::string>& env,
                  std::vector<std::string>* problems) {
  return ReadTracerConfig(
      [&env](const char* name) -> const char* {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
      },
      problems);
}

TEST(TracerConfigTest, DefaultsLeaveTheTracerOff) {
  std::vector<std::string> problems;
  const TracerConfig c = Read({}, &problems);
  EXPECT_TRUE(c.output_dir.empty());
  EXPECT_TRUE(c.record_ops);
  EXPECT_EQ(c.delay.count(), 0);
  EXPECT_EQ(c.duration.count(), 0);
  EXPECT_EQ(c.flush_interval.count(), 1000);
  EXPECT_EQ(c.rank, 0);
  EXPECT_TRUE(problems.empty());
}

TEST(TracerConfigTest, ReadsEveryVariable) {
  std::vector<std::string> problems;
  const TracerConfig c = Read({{"DYNAFLOW_OUTPUT_DIR", "/tmp/out"},
                               {"DYNAFLOW_OPS", "off"},
                               {"DYNAFLOW_DELAY_S", "2.5"},
                               {"DYNAFLOW_DURATION_S", "10"},
                               {"DYNAFLOW_FLUSH_MS", "250"},
                               {"DYNAFLOW_RANK", "3"},
                               {"RANK", "7"},
                               {"DYNAFLOW_CUPTI_PATH", "/opt/libcupti.so"}},
                              &problems);
  EXPECT_EQ(c.output_dir, "/tmp/out");
  EXPECT_FALSE(c.record_ops);
  EXPECT_EQ(c.delay, std::chrono::milliseconds(2500));
  EXPECT_EQ(c.duration, std::chrono::seconds(10));
  EXPECT_EQ(c.flush_interval.count(), 250);
  EXPECT_EQ(c.rank, 3);  // DYNAFLOW_RANK wins over RANK
  EXPECT_EQ(c.cupti_path, "/opt/libcupti.so");
  EXPECT_TRUE(problems.empty());
}

TEST(TracerConfigTest, RankFallsBackToTorchrunsRank) {
  std::vector<std::string> problems;
  EXPECT_EQ(Read({{"RANK", "5"}}, &problems).rank, 5);
}

TEST(TracerConfigTest, MalformedValuesKeepDefaultsAndAreReported) {
  std::vector<std::string> problems;
  const TracerConfig c = Read({{"DYNAFLOW_OUTPUT_DIR", "/tmp/out"},
                               {"DYNAFLOW_OPS", "maybe"},
                               {"DYNAFLOW_DELAY_S", "-1"},
                               {"DYNAFLOW_DURATION_S", "soon"},
                               {"DYNAFLOW_FLUSH_MS", "0"},
                               {"RANK", "x"}},
                              &problems);
  EXPECT_TRUE(c.record_ops);
  EXPECT_EQ(c.delay.count(), 0);
  EXPECT_EQ(c.duration.count(), 0);
  EXPECT_EQ(c.flush_interval.count(), 1000);
  EXPECT_EQ(c.rank, 0);
  ASSERT_EQ(problems.size(), 5u);
  EXPECT_EQ(problems[0], "DYNAFLOW_OPS=maybe is not on or off; using the default");
}

}  // namespace
}  // namespace dynaflow
