#include "plugin/preload/graph_capture.h"

#include <cupti_driver_cbid.h>
#include <cupti_runtime_cbid.h>
#include <gtest/gtest.h>

#include <thread>

#include "plugin/preload/fake_cupti_api.h"
#include "plugin/preload/graph_attribution.h"

namespace dynaflow {
namespace {

constexpr int kSuccess = 0;

cudaStream_t Stream(uintptr_t handle) { return reinterpret_cast<cudaStream_t>(handle); }

// Capture calls as CUPTI reports them to the subscriber: a callback at the
// entry and one at the exit.
class Cuda {
 public:
  explicit Cuda(FakeCuptiApi& cupti) : cupti_(cupti) {}

  void BeginCapture(uintptr_t stream, int result = kSuccess) {
    EXPECT_TRUE(cupti_.EmitBeginCapture(stream, result));
  }
  void EndCapture(uintptr_t stream, int result = kSuccess) {
    EXPECT_TRUE(cupti_.EmitEndCapture(stream, result));
  }
  // The driver calls cudaStreamBeginCapture and cudaStreamEndCapture make.
  void DriverBeginCapture(uintptr_t stream) {
    cuStreamBeginCapture_v2_params p = {reinterpret_cast<CUstream>(stream),
                                        CU_STREAM_CAPTURE_MODE_GLOBAL};
    Driver(CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2, &p);
  }
  void DriverEndCapture(uintptr_t stream) {
    CUgraph graph = nullptr;
    cuStreamEndCapture_params p = {reinterpret_cast<CUstream>(stream), &graph};
    Driver(CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture, &p);
  }

 private:
  void Driver(CUpti_CallbackId cbid, const void* params) {
    constexpr CUpti_CallbackDomain kDriver = CUPTI_CB_DOMAIN_DRIVER_API;
    EXPECT_TRUE(cupti_.EmitApiCallback(kDriver, cbid, CUPTI_API_ENTER, params, 0));
    EXPECT_TRUE(cupti_.EmitApiCallback(kDriver, cbid, CUPTI_API_EXIT, params, kSuccess));
  }
  FakeCuptiApi& cupti_;
};

bool CapturingOnAnotherThread(const GraphAttribution& graph) {
  bool capturing = true;
  std::thread([&] { capturing = graph.CallingThreadCapturing(); }).join();
  return capturing;
}

class GraphCaptureTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(graph_.Subscribe().ok()); }
  FakeCuptiApi cupti_;
  GraphAttribution graph_{cupti_, [] { return uint64_t{0}; }};
  Cuda cuda_{cupti_};
};

TEST_F(GraphCaptureTest, TheCapturingThreadCapturesFromBeginToEnd) {
  EXPECT_FALSE(graph_.CallingThreadCapturing());
  cuda_.BeginCapture(0x10);
  EXPECT_TRUE(graph_.CallingThreadCapturing());
  EXPECT_FALSE(CapturingOnAnotherThread(graph_));
  cuda_.EndCapture(0x10);
  EXPECT_FALSE(graph_.CallingThreadCapturing());
}

TEST_F(GraphCaptureTest, EveryCaptureCallIsSubscribedAndNothingElse) {
  for (const CaptureCallback& c : GraphCaptureTracker::Callbacks()) {
    EXPECT_TRUE(cupti_.callback_enabled(c.domain, c.cbid)) << c.domain << " " << c.cbid;
  }
  EXPECT_EQ(GraphCaptureTracker::Callbacks().size(), 14u);
  EXPECT_TRUE(cupti_.callback_enabled(CUPTI_CB_DOMAIN_DRIVER_API,
                                      CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph_ptsz));
  EXPECT_FALSE(cupti_.callback_enabled(CUPTI_CB_DOMAIN_RUNTIME_API,
                                       CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000));
}

TEST_F(GraphCaptureTest, TheRuntimeCallAndItsDriverCallAreOneCapture) {
  cuda_.DriverBeginCapture(0x10);  // inside cudaStreamBeginCapture, which returns after it
  cuda_.BeginCapture(0x10);
  cuda_.DriverEndCapture(0x10);
  EXPECT_FALSE(graph_.CallingThreadCapturing());
  cuda_.EndCapture(0x10);
  EXPECT_FALSE(graph_.CallingThreadCapturing());
}

TEST_F(GraphCaptureTest, ANestedCaptureOfAnotherStreamEndsWithTheLast) {
  cuda_.BeginCapture(0x10);
  cuda_.BeginCapture(0x20);
  cuda_.EndCapture(0x20);
  EXPECT_TRUE(graph_.CallingThreadCapturing());
  cuda_.EndCapture(0x10);
  EXPECT_FALSE(graph_.CallingThreadCapturing());
}

TEST_F(GraphCaptureTest, FailedCallsChangeOnlyWhatCudaChanges) {
  cuda_.BeginCapture(0x10, /*cudaErrorStreamCaptureUnsupported*/ 900);
  EXPECT_FALSE(graph_.CallingThreadCapturing());
  cuda_.BeginCapture(0x10);
  // Ending from a thread that may not: the capture goes on.
  std::thread([&] { cuda_.EndCapture(0x10, /*cudaErrorStreamCaptureWrongThread*/ 908); }).join();
  EXPECT_TRUE(graph_.CallingThreadCapturing());
  // An invalidated capture ends all the same; so does an end from another
  // thread where the mode allows it (relaxed).
  cuda_.EndCapture(0x10, /*cudaErrorStreamCaptureInvalidated*/ 901);
  EXPECT_FALSE(graph_.CallingThreadCapturing());
  cuda_.BeginCapture(0x10);
  std::thread([&] { cuda_.EndCapture(0x10); }).join();
  EXPECT_FALSE(graph_.CallingThreadCapturing());
  cuda_.EndCapture(0x30);  // never begun
  EXPECT_FALSE(graph_.CallingThreadCapturing());
}

TEST_F(GraphCaptureTest, EntriesAndMissingParametersAreIgnored) {
  cudaStreamBeginCapture_v10000_params p = {Stream(0x10), cudaStreamCaptureModeGlobal};
  ASSERT_TRUE(cupti_.EmitApiCallback(CUPTI_CB_DOMAIN_RUNTIME_API,
                                     CUPTI_RUNTIME_TRACE_CBID_cudaStreamBeginCapture_v10000,
                                     CUPTI_API_ENTER, &p, 0));
  ASSERT_TRUE(cupti_.EmitApiCallback(CUPTI_CB_DOMAIN_RUNTIME_API,
                                     CUPTI_RUNTIME_TRACE_CBID_cudaStreamBeginCapture_v10000,
                                     CUPTI_API_EXIT, nullptr, kSuccess));
  EXPECT_FALSE(graph_.CallingThreadCapturing());
}

TEST_F(GraphCaptureTest, GivingTheSubscriptionUpForgetsCaptures) {
  cuda_.BeginCapture(0x10);
  graph_.Unsubscribe();  // its end would go unseen
  EXPECT_FALSE(graph_.CallingThreadCapturing());
  EXPECT_FALSE(cupti_.callback_enabled(CUPTI_CB_DOMAIN_RUNTIME_API,
                                       CUPTI_RUNTIME_TRACE_CBID_cudaStreamEndCapture_v10000));
}

TEST_F(GraphCaptureTest, PerThreadDefaultStreamsAreEachThreadsOwn) {
  constexpr uintptr_t kPerThread = 0x2;  // cudaStreamPerThread
  cuda_.BeginCapture(kPerThread);
  std::thread([&] {
    cuda_.BeginCapture(kPerThread);
    cuda_.EndCapture(kPerThread);
    EXPECT_FALSE(graph_.CallingThreadCapturing());
  }).join();
  EXPECT_TRUE(graph_.CallingThreadCapturing());  // not ended by the other thread's end
  cuda_.EndCapture(kPerThread);
  EXPECT_FALSE(graph_.CallingThreadCapturing());
}

TEST(GraphCaptureTrackerTest, CountsStreamsOfEveryThread) {
  GraphCaptureTracker tracker;
  tracker.OnBeginCapture(1, true);
  std::thread([&] { tracker.OnBeginCapture(2, true); }).join();
  EXPECT_EQ(tracker.capturing_streams(), 2u);
  EXPECT_TRUE(tracker.CallingThreadCapturing());
  tracker.OnEndCapture(1, false);
  EXPECT_EQ(tracker.capturing_streams(), 1u);
  EXPECT_FALSE(tracker.CallingThreadCapturing());  // stream 2 is another thread's
  tracker.Forget();
  EXPECT_EQ(tracker.capturing_streams(), 0u);
}

}  // namespace
}  // namespace dynaflow
