// The advice parts of the three renderings, on a synthetic trace whose answer
// is known (gradient all-reduces serialized after every layer).
#include <gtest/gtest.h>

#include "analysis/advisor/advisor.h"
#include "analysis/sim/synthetic_trace.h"
#include "reports/report.h"

namespace dynaflow {
namespace {

struct Fixture {
  Fixture() : trace(testing::DdpSerializedAllReduce(8, 150, 3)) {
    report.inputs = {"ddp.json"};
    report.trace = &trace;
    report.devices = AnalyzeTimelines(trace, TimelineOptions());
    advice = Advise(trace, report.inputs, AdviseOptions{});
    report.advice = &advice;
  }
  Trace trace;
  AdviceResult advice;
  AdviseReport report;
};

TEST(AdviceJsonTest, IdleWindowsAndRecommendations) {
  Fixture f;
  const nlohmann::json j = ReportToJson(f.report);
  // The foundation's keys are all still there.
  for (const char* key : {"schema", "inputs", "devices", "import_stats", "recommendations"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  const auto& dev = j["devices"][0];
  for (const char* key : {"rank", "device", "name", "timeline", "streams", "idle_windows"}) {
    EXPECT_TRUE(dev.contains(key)) << key;
  }
  ASSERT_FALSE(dev["idle_windows"].empty());
  const auto& w = dev["idle_windows"][0];
  EXPECT_EQ(w["kind"], "communication_exposed");
  EXPECT_EQ(w["saturated"], "communication");
  EXPECT_EQ(w["idle"], "sm");
  EXPECT_NEAR(w["per_step_us"].get<double>(), 8 * 150, 1.0);
  // What the simulator recovers (the best communication strategy's saving per
  // step), not the whole exposed communication.
  EXPECT_EQ(w["recoverable_source"], "simulated");
  EXPECT_LT(w["recoverable_us"].get<double>(), 8 * 150);
  {
    const auto& best = j["recommendations"][0];
    EXPECT_NEAR(w["recoverable_us"].get<double>(),
                best["baseline_step_us"].get<double>() - best["predicted_step_us"].get<double>(), 1e-6);
  }
  EXPECT_GT(w["share_of_step_pct"].get<double>(), 20);
  EXPECT_EQ(w["operators"][0]["name"], "c10d::allreduce_");
  EXPECT_EQ(w["modules"][0]["name"], "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad");
  EXPECT_EQ(dev["steps"]["source"], "profiler_step_gpu");
  EXPECT_EQ(dev["steps"]["count"], 3);
  // Additional fields (the contract's keys stay): each step's phase and
  // tokens; a training iteration without attention has no tokens of its own,
  // the simulation takes the GEMM rows and says so.
  EXPECT_EQ(dev["steps"]["steps"][0]["phase"], "training");
  EXPECT_TRUE(dev["steps"]["steps"][0]["tokens"].is_null());
  EXPECT_EQ(dev["steps"]["steps"][0]["tokens_source"], "none");
  EXPECT_EQ(j["simulation"]["tokens_source"], "gemm_rows");
  EXPECT_EQ(j["simulation"]["phase"], "training");
  EXPECT_EQ(j["simulation"]["tokens_per_step"], 4096);
  EXPECT_EQ(dev["roofline"]["classes"]["compute"]["count"], 24);

  ASSERT_FALSE(j["recommendations"].empty());
  const auto& r = j["recommendations"][0];
  for (const char* key : {"strategy", "predicted_speedup", "baseline_step_us", "predicted_step_us",
                          "extra_memory_bytes", "bucket", "partition", "rationale"}) {
    EXPECT_TRUE(r.contains(key)) << key;
  }
  EXPECT_EQ(r["strategy"], "comm_overlap");
  EXPECT_GT(r["predicted_speedup"].get<double>(), 1.2);
  EXPECT_NEAR(r["predicted_step_us"].get<double>(),
              r["baseline_step_us"].get<double>() / r["predicted_speedup"].get<double>(), 1e-6);
  EXPECT_EQ(r["bucket"]["min_tokens"], 0);
  EXPECT_TRUE(r["bucket"]["max_tokens"].is_null());
  EXPECT_EQ(r["bucket"]["tokens"], 4096);
  EXPECT_EQ(r["partition"]["side_stream"][0], "c10d::allreduce_");
  EXPECT_NE(r["rationale"].get<std::string>().find("side stream"), std::string::npos);
  // Sequential is always among them, at 1x.
  bool sequential = false;
  for (const auto& x : j["recommendations"]) {
    if (x["strategy"] == "sequential") {
      sequential = true;
      EXPECT_EQ(x["predicted_speedup"], 1.0);
    }
  }
  EXPECT_TRUE(sequential);
  EXPECT_NEAR(j["simulation"]["replay_error_pct"].get<double>(), 0, 0.1);
}

TEST(AdviceJsonTest, WithoutAdviceTheArraysStayEmpty) {
  Fixture f;
  f.report.advice = nullptr;
  const nlohmann::json j = ReportToJson(f.report);
  EXPECT_TRUE(j["recommendations"].empty());
  EXPECT_TRUE(j["devices"][0]["idle_windows"].empty());
  EXPECT_FALSE(j.contains("simulation"));
}

TEST(AdviceTextTest, HasWindowsAndRecommendations) {
  Fixture f;
  const std::string text = ReportToText(f.report);
  EXPECT_NE(text.find("Idle-resource windows"), std::string::npos) << text;
  EXPECT_NE(text.find("SMs idle while c10d::allreduce_ communicates"), std::string::npos) << text;
  EXPECT_NE(text.find("Recommendations"), std::string::npos);
  EXPECT_NE(text.find("comm_overlap"), std::string::npos);
  EXPECT_NE(text.find("Plan by tokens per step of training steps\n"), std::string::npos) << text;
  // The steps' phase; the simulation's tokens and where they came from.
  EXPECT_NE(text.find("    3 training step(s)\n"), std::string::npos) << text;
  EXPECT_NE(text.find("4096 tokens from gemm_rows, training)"), std::string::npos) << text;
}

// A serving framework's decode forward of 8 layers without annotations: one
// step of the layer stack, decode, 32 tokens from the attention shapes.
TEST(AdviceTextTest, ServingDecodeForwardIsOneDecodeStep) {
  const Trace trace = testing::ServingDecodeForward(32, 512, 8, false);
  AdviseReport report;
  report.inputs = {"serve.json"};
  report.trace = &trace;
  report.devices = AnalyzeTimelines(trace, TimelineOptions());
  const AdviceResult advice = Advise(trace, report.inputs, AdviseOptions{});
  report.advice = &advice;
  const std::string text = ReportToText(report);
  EXPECT_NE(text.find("    1 step(s): "), std::string::npos) << text;
  EXPECT_NE(text.find("    one forward of 8 repeating layers: one step, not one per layer\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("    1 decode step(s), median 32 tokens (attention_shapes)\n"), std::string::npos) << text;
  const nlohmann::json j = ReportToJson(report);
  const auto& steps = j["devices"][0]["steps"];
  EXPECT_EQ(steps["layers"], 8);
  EXPECT_EQ(steps["steps"][0]["phase"], "decode");
  EXPECT_EQ(steps["steps"][0]["tokens"], 32);
  EXPECT_EQ(steps["steps"][0]["tokens_source"], "attention_shapes");
  EXPECT_EQ(j["simulation"]["phase"], "decode");
}

TEST(AdviceHtmlTest, TimelinesOfTheMeasuredAndPredictedStep) {
  Fixture f;
  const std::string html = ReportToHtml(f.report);
  EXPECT_NE(html.find("data-role=\"measured\""), std::string::npos);
  EXPECT_NE(html.find("data-role=\"predicted\""), std::string::npos);
  EXPECT_NE(html.find("class=\"window\""), std::string::npos);  // idle windows marked
  EXPECT_NE(html.find("predicted under comm_overlap"), std::string::npos);
  EXPECT_NE(html.find("side stream (communication)"), std::string::npos);
  EXPECT_NE(html.find("GPU time by bound resource"), std::string::npos);
  // Self-contained: nothing fetched.
  EXPECT_EQ(html.find("src=\"http"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
}

}  // namespace
}  // namespace dynaflow
