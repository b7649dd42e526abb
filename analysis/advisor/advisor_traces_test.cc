// The physical bound (physical_bound.h) held on every real trace in
// ../shared/traces: no candidate, at any workload point, predicts a step
// shorter than its resources allow, and none needed clamping to get there.
// Skips (GTEST_SKIP, reported by ctest as skipped) where ../shared/traces is
// absent.
#include <gtest/gtest.h>

#include <algorithm>
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

// One line per trace: the best recommendation, the speedup its bound allows,
// and the candidate that came closest to its bound (simulated / bound).
void PrintSummary(const std::string& name, const AdviceResult& a) {
  if (a.recommendations.empty()) {
    std::printf("%-44s no step to simulate\n", name.c_str());
    return;
  }
  const Recommendation& best = a.recommendations.front();
  double bound_us = 0;
  const BoundCheck* tightest = nullptr;
  for (const BoundCheck& c : a.bound_checks) {
    if (c.strategy == best.strategy && c.splits == best.splits && c.tokens == best.bucket.tokens) {
      bound_us = c.bound_step_us;
    }
    if (tightest == nullptr || c.simulated_step_us / c.bound_step_us <
                                   tightest->simulated_step_us / tightest->bound_step_us) {
      tightest = &c;
    }
  }
  std::printf("%-44s best %s x%d %.3fx, its bound allows %.3fx; closest: %s x%d at %.0f tokens, "
              "simulated/bound %.3f\n",
              name.c_str(), StrategyName(best.strategy), best.splits, best.predicted_speedup,
              bound_us > 0 ? best.baseline_step_us / bound_us : 0.0,
              StrategyName(tightest->strategy), tightest->splits, tightest->tokens,
              tightest->simulated_step_us / tightest->bound_step_us);
}

TEST(AdvisorTracesTest, NoCandidateBelowItsPhysicalBound) {
  if (!fs::exists(SharedTraces())) GTEST_SKIP() << "no ../shared/traces beside the checkout";
  const std::vector<fs::path> files = SharedTraceFiles();
  ASSERT_FALSE(files.empty());
  for (const fs::path& f : files) {
    const std::string name = SharedTraceName(f);
    SCOPED_TRACE(name);
    Trace trace;
    const Status st = ImportFiles({f.string()}, ImportOptions(), &trace);
    ASSERT_TRUE(st.ok()) << st.message();
    const AdviceResult a = Advise(trace, {f.string()}, AdviseOptions{});
    PrintSummary(name, a);
    for (const BoundCheck& c : a.bound_checks) {
      const std::string what = std::string(StrategyName(c.strategy)) + " x" +
                               std::to_string(c.splits) + " at " + std::to_string(c.tokens) +
                               " tokens, bound by " + ResourceName(c.binding);
      EXPECT_FALSE(c.clamped) << what << ": simulated " << c.simulated_step_us << " us below its bound "
                              << c.bound_step_us << " us";
      EXPECT_GE(c.predicted_step_us, c.bound_step_us * (1 - 1e-9)) << what;
    }
    for (const Recommendation& r : a.recommendations) {
      for (const BoundCheck& c : a.bound_checks) {
        if (c.strategy == r.strategy && c.splits == r.splits && c.tokens == r.bucket.tokens) {
          EXPECT_GE(r.predicted_step_us, c.bound_step_us * (1 - 1e-9)) << StrategyName(r.strategy);
        }
      }
    }
  }
}

}  // namespace
}  // namespace dynaflow
