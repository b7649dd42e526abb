// Replay accuracy on every real trace in ../shared/traces: every step of every
// device is rebuilt as a step graph (step_graph.h) and replayed by the
// simulator with the measured durations and no co-running penalty. Each replay
// must finish (a replay that cannot finish is a defect of the graph: a host
// waiting for work it has not issued), and every step's replay must stay
// within the bound on the maximum error (10%).
// Skips (GTEST_SKIP) where ../shared/traces is absent.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "analysis/advisor/advisor.h"
#include "analysis/importers/reader.h"
#include "analysis/importers/shared_traces_testing.h"

namespace dynaflow {
namespace {

namespace fs = std::filesystem;

TEST(ReplayTracesTest, EveryStepReplaysToTheEnd) {
  if (!fs::exists(SharedTraces())) GTEST_SKIP() << "no ../shared/traces beside the checkout";
  const std::vector<fs::path> files = SharedTraceFiles();
  ASSERT_FALSE(files.empty());
  for (const fs::path& f : files) {
    const std::string name = SharedTraceName(f);
    SCOPED_TRACE(name);
    Trace trace;
    const Status st = ImportFiles({f.string()}, ImportOptions(), &trace);
    ASSERT_TRUE(st.ok()) << st.message();
    const OperatorLinks links = LinkOperators(trace);
    const std::vector<DeviceResources> resources = ClassifyResources(trace, links, BoundOptions());
    CostCache costs(trace, &links);
    size_t replays = 0, failed = 0;
    double worst = 0;
    for (const DeviceResources& dr : resources) {
      const DeviceSteps steps = FindSteps(trace, dr);
      for (size_t i = 0; i < steps.steps.size(); ++i) {
        const StepGraph g = BuildStepGraph(trace, links, dr, steps, i, &costs, GraphOptions());
        if (g.tasks.empty()) continue;
        CandidateContext ctx;
        ctx.trace = &trace;
        ctx.graph = &g;
        ctx.peaks = dr.peaks;
        const std::optional<Candidate> c = MakeSequential(ctx);
        ASSERT_TRUE(c.has_value());
        const SimResult r = Simulate(c->schedule, ctx.params);
        ++replays;
        if (!r.ok) {
          ++failed;
          ADD_FAILURE() << "device " << dr.device_index << " step " << i << ": " << r.stall;
          continue;
        }
        const double err = 100.0 * (r.makespan_us - g.measured_us) / g.measured_us;
        worst = std::max(worst, std::abs(err));
      }
    }
    std::printf("%-44s %zu replays, %zu unfinished, worst |error| %.3f%%\n", name.c_str(), replays,
                failed, worst);
    EXPECT_LE(worst, 10.0) << "the issue's bound on the replay error";
  }
}

}  // namespace
}  // namespace dynaflow
