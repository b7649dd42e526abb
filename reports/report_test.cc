#include "reports/report.h"

#include <gtest/gtest.h>

#include "reports/format.h"

namespace dynaflow {
namespace {

AdviseReport SampleReport(Trace* trace) {
  uint32_t d = trace->DeviceIndex(0, 0);
  trace->devices[d].name = "NVIDIA H200";
  auto add = [&](const char* name, TimeNs s, TimeNs e, int32_t stream) {
    GpuActivity g;
    g.device_index = d;
    g.stream = stream;
    g.start = s;
    g.end = e;
    g.name = trace->strings.Intern(name);
    trace->gpu.push_back(g);
  };
  add("sm90_gemm<<<>>>", 0, 10000, 7);
  add("ncclDevKernel_AllReduce", 5000, 25000, 20);
  trace->stats.Add("kineto_malformed_event", "data_loss", "events that are not valid JSON");
  AdviseReport report;
  report.inputs = {"trace.json.gz"};
  report.trace = trace;
  report.devices = AnalyzeTimelines(*trace, TimelineOptions());
  return report;
}

TEST(JsonReportTest, FollowsTheContract) {
  Trace trace;
  nlohmann::json j = ReportToJson(SampleReport(&trace));
  EXPECT_EQ(j["schema"], "dynaflow.report/1");
  ASSERT_EQ(j["devices"].size(), 1u);
  const auto& dev = j["devices"][0];
  EXPECT_EQ(dev["rank"], 0);
  EXPECT_EQ(dev["device"], 0);
  EXPECT_EQ(dev["name"], "NVIDIA H200");
  const auto& t = dev["timeline"];
  for (const char* key : {"computation_us", "exposed_comm_us", "exposed_memcpy_us", "busy_us",
                          "idle_us", "total_us", "total_comm_us", "total_memcpy_us",
                          "comm_hidden_pct"}) {
    EXPECT_TRUE(t.contains(key)) << key;
  }
  EXPECT_DOUBLE_EQ(t["computation_us"].get<double>(), 10);
  EXPECT_DOUBLE_EQ(t["exposed_comm_us"].get<double>(), 15);
  EXPECT_DOUBLE_EQ(t["total_us"].get<double>(), 25);
  EXPECT_DOUBLE_EQ(t["comm_hidden_pct"].get<double>(), 25);
  ASSERT_EQ(dev["streams"].size(), 2u);
  EXPECT_EQ(dev["streams"][1]["stream"], 20);
  EXPECT_TRUE(dev["streams"][0]["idle_breakdown"].contains("host_wait_us"));
  EXPECT_TRUE(dev["idle_windows"].is_array());
  EXPECT_EQ(dev["top_kernels"][0]["name"], "ncclDevKernel_AllReduce");
  EXPECT_EQ(dev["top_kernels"][0]["class"], "communication");
  EXPECT_TRUE(j["recommendations"].is_array());
  EXPECT_EQ(j["import_stats"][0]["name"], "kineto_malformed_event");
}

TEST(JsonReportTest, NullHiddenShareWithoutCommunication) {
  Trace trace;
  AdviseReport report = SampleReport(&trace);
  report.devices[0].timeline.comm_hidden_pct.reset();
  EXPECT_TRUE(ReportToJson(report)["devices"][0]["timeline"]["comm_hidden_pct"].is_null());
}

TEST(TextReportTest, ReadsAtAGlance) {
  Trace trace;
  std::string text = ReportToText(SampleReport(&trace));
  EXPECT_NE(text.find("rank 0 · device 0 · NVIDIA H200"), std::string::npos) << text;
  EXPECT_NE(text.find("exposed communication"), std::string::npos);
  EXPECT_NE(text.find("15.0 us"), std::string::npos) << text;
  EXPECT_NE(text.find("kineto_malformed_event: 1"), std::string::npos) << text;
}

TEST(HtmlReportTest, SelfContainedWithEscapedNames) {
  Trace trace;
  std::string html = ReportToHtml(SampleReport(&trace));
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_NE(html.find("sm90_gemm&lt;&lt;&lt;&gt;&gt;&gt;"), std::string::npos);
  EXPECT_EQ(html.find("src=\"http"), std::string::npos);
}

// A tab, newline or NUL byte in a name (a trace is user data) is written as a
// C escape: it cannot split a table row, and no NUL byte reaches the HTML.
TEST(ReportTest, ControlCharactersInNamesAreEscaped) {
  Trace trace;
  AdviseReport report = SampleReport(&trace);
  report.devices[0].name = std::string("GPU\tA\nB\0C", 9);
  report.devices[0].top_kernels[0].name = std::string("k\tx\ny\0z\x7f", 8);
  const std::string text = ReportToText(report);
  EXPECT_NE(text.find("rank 0 · device 0 · GPU\\tA\\nB\\x00C\n"), std::string::npos) << text;
  EXPECT_NE(text.find("k\\tx\\ny\\x00z\\x7F\n"), std::string::npos) << text;
  EXPECT_EQ(text.find('\t'), std::string::npos);
  EXPECT_EQ(text.find('\0'), std::string::npos);
  const std::string html = ReportToHtml(report);
  EXPECT_EQ(html.find('\0'), std::string::npos);
  EXPECT_EQ(html.find('\x7f'), std::string::npos);
  EXPECT_NE(html.find("GPU\\tA\\nB\\x00C"), std::string::npos);
  EXPECT_NE(html.find("k\\tx\\ny\\x00z\\x7F"), std::string::npos);
  EXPECT_EQ(Printable("plain · UTF-8"), "plain · UTF-8");
  EXPECT_EQ(Shorten(std::string("a\tb", 3), 10), "a\\tb");
}

TEST(FormatTest, Durations) {
  EXPECT_EQ(FormatDuration(0.42), "420 ns");
  EXPECT_EQ(FormatDuration(388.34), "388.3 us");
  EXPECT_EQ(FormatDuration(3495.976), "3.496 ms");
  EXPECT_EQ(FormatDuration(2.1e6), "2.100 s");
  EXPECT_EQ(FormatPercent(1, 0), "-");
  EXPECT_EQ(FormatPercent(1, 8), "12.5%");
  EXPECT_EQ(Shorten("abcdefghij", 6), "abc...");
}

}  // namespace
}  // namespace dynaflow
