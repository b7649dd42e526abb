#include "analysis/model/stream_dependencies.h"

#include <gtest/gtest.h>

namespace dynaflow {
namespace {

constexpr int32_t kRank = 0;

class StreamDependenciesTest : public ::testing::Test {
 protected:
  // A kernel of `correlation` on (device, stream); returns its index.
  int64_t Kernel(int32_t device, int32_t stream, int64_t correlation, TimeNs start, TimeNs end) {
    GpuActivity g;
    g.device_index = t_.DeviceIndex(kRank, device);
    g.stream = stream;
    g.correlation = correlation;
    g.start = start;
    g.end = end;
    t_.gpu.push_back(g);
    return static_cast<int64_t>(t_.gpu.size() - 1);
  }
  // cudaStreamWaitEvent(stream, event recorded on `on_stream` by `record_correlation`).
  void Wait(int32_t device, int32_t stream, int64_t correlation, int32_t on_stream,
            int64_t record_correlation) {
    ApiCall a;
    a.kind = ApiKind::kSync;
    a.rank = kRank;
    a.correlation = correlation;
    a.sync_device = device;
    a.sync_stream = stream;
    a.wait_on_stream = on_stream;
    a.wait_event_id = 1;
    a.wait_event_correlation = record_correlation;
    t_.api.push_back(a);
  }

  Trace t_;
};

TEST_F(StreamDependenciesTest, WaitJoinsLastWorkBeforeTheRecordToFirstWorkAfterTheWait) {
  Kernel(0, 7, 10, 100, 200);
  const int64_t producer = Kernel(0, 7, 11, 200, 900);
  Kernel(0, 7, 14, 900, 1000);  // launched after the record: not waited for
  Kernel(0, 8, 9, 50, 60);      // before the wait on the waiting stream
  const int64_t consumer = Kernel(0, 8, 16, 900, 950);
  Kernel(0, 8, 17, 950, 990);
  Kernel(1, 8, 15, 300, 400);   // another device's stream 8
  Wait(0, /*stream=*/8, /*correlation=*/13, /*on_stream=*/7, /*record_correlation=*/12);
  const std::vector<StreamDependency> edges = CrossStreamDependencies(t_);
  ASSERT_EQ(edges.size(), 1u);
  EXPECT_EQ(edges[0].wait, 0u);
  EXPECT_EQ(edges[0].from, producer);
  EXPECT_EQ(edges[0].to, consumer);
}

// Two processes of one rank hand out the same correlation ids: a wait joins
// the work of its own process (GPU rows name it, store version 3).
TEST_F(StreamDependenciesTest, WaitJoinsOnlyItsOwnProcesssWork) {
  const int64_t producer = Kernel(0, 7, 11, 200, 900);
  const int64_t consumer = Kernel(0, 8, 16, 900, 950);
  t_.gpu[producer].pid = 100;
  t_.gpu[consumer].pid = 100;
  const int64_t other_producer = Kernel(0, 7, 11, 100, 990);  // ends later, same correlation
  const int64_t other_consumer = Kernel(0, 8, 14, 300, 400);  // starts earlier, nearer the wait
  t_.gpu[other_producer].pid = 200;
  t_.gpu[other_consumer].pid = 200;
  Wait(0, /*stream=*/8, /*correlation=*/13, /*on_stream=*/7, /*record_correlation=*/12);
  t_.api.back().pid = 100;
  const std::vector<StreamDependency> edges = CrossStreamDependencies(t_);
  ASSERT_EQ(edges.size(), 1u);
  EXPECT_EQ(edges[0].from, producer);
  EXPECT_EQ(edges[0].to, consumer);
}

TEST_F(StreamDependenciesTest, GraphLaunchGivesTheNodeThatEndsLastAndTheOneThatStartsFirst) {
  Kernel(0, 7, 20, 100, 500);
  const int64_t last = Kernel(0, 7, 20, 100, 700);  // one cudaGraphLaunch, two nodes
  Kernel(0, 8, 23, 800, 900);
  const int64_t first = Kernel(0, 8, 23, 750, 760);
  Wait(0, 8, 22, 7, 21);
  const std::vector<StreamDependency> edges = CrossStreamDependencies(t_);
  ASSERT_EQ(edges.size(), 1u);
  EXPECT_EQ(edges[0].from, last);
  EXPECT_EQ(edges[0].to, first);
}

TEST_F(StreamDependenciesTest, EndsOutsideTheTraceAreMinusOne) {
  Wait(0, 8, 13, 7, 12);
  const std::vector<StreamDependency> edges = CrossStreamDependencies(t_);
  ASSERT_EQ(edges.size(), 1u);
  EXPECT_EQ(edges[0].from, -1);
  EXPECT_EQ(edges[0].to, -1);
}

TEST_F(StreamDependenciesTest, OnlyWaitsOfOneStreamOnAnotherAreEdges) {
  Kernel(0, 7, 10, 100, 200);
  Wait(0, 7, 13, 7, 12);  // a stream waiting on itself
  Wait(0, 8, 14, -1, 12); // the event's stream not known
  Wait(0, 8, 15, 7, -1);  // the record call not known
  ApiCall sync;           // cudaEventSynchronize: the host waits, no stream does
  sync.kind = ApiKind::kSync;
  sync.correlation = 16;
  sync.wait_on_stream = 7;
  sync.wait_event_correlation = 12;
  t_.api.push_back(sync);
  ApiCall launch;  // not a synchronization at all
  launch.kind = ApiKind::kRuntime;
  launch.correlation = 17;
  launch.sync_stream = 8;
  launch.wait_on_stream = 7;
  launch.wait_event_correlation = 12;
  t_.api.push_back(launch);
  EXPECT_TRUE(CrossStreamDependencies(t_).empty());
}

}  // namespace
}  // namespace dynaflow
