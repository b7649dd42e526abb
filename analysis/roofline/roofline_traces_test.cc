// The cost model held on every real trace in ../shared/traces: no costed
// operator, and no resource class, achieves more than its peak. Skips
// (GTEST_SKIP, reported by ctest as skipped) where ../shared/traces is absent.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "analysis/importers/reader.h"
#include "analysis/importers/shared_traces_testing.h"
#include "analysis/roofline/bound.h"

namespace dynaflow {
namespace {

namespace fs = std::filesystem;

// The one operator still above its peak, and why. In ResNet-50's backward
// (kineto_legacy_v100_resnet50), aten::div divides the mean's gradient, a
// [32,2048] tensor expand()ed to [32,2048,7,7] with zero strides, by 49: the
// profiler records the expanded shape and no strides, so the ideal bytes count
// 49x the elements actually read. 25.7 MB in 24 us is 1070 GB/s of the
// V100's 900 (119%). Held below 125% so any other growth fails.
struct KnownExcess {
  const char* trace;
  const char* op;
  double max_pct;
};
constexpr KnownExcess kKnownExcess[] = {{"kineto_legacy_v100_resnet50.json.gz", "aten::div", 125.0}};

double AllowedPct(const std::string& trace, const std::string& op) {
  for (const KnownExcess& k : kKnownExcess) {
    if (trace.ends_with(k.trace) && op == k.op) return k.max_pct;
  }
  return 100.0;
}

TEST(RooflineTracesTest, NoCostedOperatorAboveItsPeak) {
  if (!fs::exists(SharedTraces())) GTEST_SKIP() << "no ../shared/traces beside the checkout";
  const std::vector<fs::path> files = SharedTraceFiles();
  ASSERT_FALSE(files.empty());
  BoundOptions options;
  options.top_operators = std::numeric_limits<size_t>::max();  // every operator, not the report's top
  for (const fs::path& f : files) {
    const std::string name = SharedTraceName(f);
    SCOPED_TRACE(name);
    Trace trace;
    const Status st = ImportFiles({f.string()}, ImportOptions(), &trace);
    ASSERT_TRUE(st.ok()) << st.message();
    const OperatorLinks links = LinkOperators(trace);
    for (const DeviceResources& d : ClassifyResources(trace, links, options)) {
      double highest = 0;
      for (int c = 0; c < kResourceCount; ++c) {
        EXPECT_LE(d.totals[c].pct_of_peak, 100.0) << ResourceName(static_cast<Resource>(c)) << " class";
        highest = std::max(highest, d.totals[c].pct_of_peak);
      }
      for (const OperatorRoofline& o : d.operators) {
        EXPECT_LE(o.pct_of_peak, AllowedPct(name, o.name)) << o.name << " (" << ResourceName(o.resource) << ")";
        highest = std::max(highest, o.pct_of_peak);
      }
      std::printf("%-44s device %u %-28s linked %lld costed %lld, highest %.1f%% of peak\n", name.c_str(),
                  d.device_index, d.peaks.name.c_str(), static_cast<long long>(d.linked_kernels),
                  static_cast<long long>(d.costed_kernels), highest);
    }
  }
}

// What the fixes changed, on the traces that showed each defect.
TEST(RooflineTracesTest, LinksAndPeaksOnTheDefectsTraces) {
  if (!fs::exists(SharedTraces())) GTEST_SKIP() << "no ../shared/traces beside the checkout";
  auto load = [](const char* file, Trace* t) {
    const Status st = ImportFiles({(SharedTraces() / "kineto" / file).string()}, ImportOptions(), t);
    ASSERT_TRUE(st.ok()) << st.message();
  };
  {
    // Correlation ids in "External id": 0 of 1154 kernels linked before.
    Trace t;
    load("hta_sampled_rank-0.json.gz", &t);
    const OperatorLinks links = LinkOperators(t);
    const int64_t linked = std::count_if(links.activity_op.begin(), links.activity_op.end(),
                                         [](int32_t op) { return op >= 0; });
    EXPECT_GT(linked, 1000);
  }
  {
    // ROCm: deviceProperties id 0, events on device 2: MI300X peaks, not the fallback.
    Trace t;
    load("tracelens_mi300_bert_small.json.gz", &t);
    const std::vector<DeviceResources> d = ClassifyResources(t, LinkOperators(t), BoundOptions{});
    ASSERT_EQ(d.size(), 1u);
    EXPECT_TRUE(d[0].peaks.known);
    EXPECT_DOUBLE_EQ(d[0].peaks.bytes_per_s, 5300e9);
  }
}

}  // namespace
}  // namespace dynaflow
