#include "plugin/preload/tracer.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <thread>

#include <cupti_driver_cbid.h>
#include <cupti_runtime_cbid.h>

#include "analysis/store/store.h"
#include "plugin/preload/fake_cupti_api.h"

namespace dynaflow {
namespace {

using std::chrono::milliseconds;

CUpti_ActivityKernel10 Kernel(uint32_t correlation) {
  CUpti_ActivityKernel10 k = {};
  k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  k.correlationId = correlation;
  k.name = "sm90_gemm";
  k.start = 1000;
  k.end = 2000;
  return k;
}

CUpti_ActivityExternalCorrelation External(uint32_t correlation, uint64_t id) {
  CUpti_ActivityExternalCorrelation e = {};
  e.kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
  e.externalKind = kOperatorCorrelationKind;
  e.correlationId = correlation;
  e.externalId = id;
  return e;
}

DynaflowOperatorRecord Op(uint64_t id) {
  DynaflowOperatorRecord op = {};
  op.id = id;
  op.start_ns = RealtimeNs();
  op.end_ns = op.start_ns + 1000;
  op.sequence = -1;
  op.tid = static_cast<int32_t>(gettid());
  op.name = "aten::mm";
  return op;
}

// torch.profiler's Kineto as CUPTI sees it: its own buffer callbacks and
// clock, and the buffers it was handed.
struct FakeKineto {
  static inline std::atomic<int> buffers{0};
  static void CUPTIAPI Request(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, 1 << 16));
    *size = 1 << 16;
    *max_records = 0;
  }
  static void CUPTIAPI Complete(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t) {
    ++buffers;
    std::free(buffer);
  }
  static uint64_t CUPTIAPI Clock() { return 7; }

  // What Kineto calls when torch.profiler prepares its trace.
  static void Start(FakeCuptiApi& cupti) {
    buffers = 0;
    cupti.ActivityRegisterTimestampCallback(&Clock);
    cupti.ActivityRegisterCallbacks(&Request, &Complete);
    cupti.ActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  }
  // What Kineto disables when it stops (CuptiActivityApi::disableCuptiActivities).
  static void Stop(FakeCuptiApi& cupti) {
    for (CUpti_ActivityKind kind :
         {CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET,
          CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
          CUPTI_ACTIVITY_KIND_SYNCHRONIZATION, CUPTI_ACTIVITY_KIND_RUNTIME,
          CUPTI_ACTIVITY_KIND_DRIVER}) {
      cupti.ActivityDisable(kind);
    }
  }
};

class TracerTest : public ::testing::Test {
 protected:
  TracerTest()
      : dir_(std::filesystem::temp_directory_path() /
             ("tracer-test-" + std::to_string(getpid()))) {
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    config_.output_dir = dir_.string();
    config_.rank = 3;
    config_.flush_interval = milliseconds(20);
  }
  ~TracerTest() override { std::filesystem::remove_all(dir_); }
  // Open operators are per thread, and every test runs on the same one.
  void TearDown() override { EXPECT_EQ(Tracer::CurrentOperator(), 0u); }

  // A loader that hands out a FakeCuptiApi and keeps a pointer to it.
  CuptiLoader FakeLoader() {
    return [this](std::string*) {
      auto fake = std::make_unique<FakeCuptiApi>();
      fake_ = fake.get();
      return std::unique_ptr<CuptiApi>(std::move(fake));
    };
  }

  static CuptiLoader FailingLoader() {
    return [](std::string* error) {
      *error = "cannot load libcupti (test)";
      return std::unique_ptr<CuptiApi>();
    };
  }

  Trace ReadStore() const {
    Trace t;
    const std::string path = (dir_ / (std::to_string(getpid()) + ".db")).string();
    Status st = ReadTraceDb(path, &t);
    EXPECT_TRUE(st.ok()) << st.message();
    return t;
  }

  // The fake the tracer loaded last; the loader may run on the writer thread.
  FakeCuptiApi* fake() const { return fake_.load(); }

  std::filesystem::path dir_;
  TracerConfig config_;
  std::atomic<FakeCuptiApi*> fake_{nullptr};
};

TEST_F(TracerTest, RecordsOperatorsAndLinkedKernelsOnceCudaInitialises) {
  Tracer tracer(config_, FakeLoader(), CuptiStart::kAtCudaInit);
  tracer.StartWriter();
  EXPECT_EQ(fake(), nullptr);  // lazily: no CUDA, no CUPTI
  tracer.OnCudaInit();
  ASSERT_NE(fake(), nullptr);
  EXPECT_TRUE(fake()->callbacks_registered());
  EXPECT_TRUE(fake()->timestamp_callback_registered());
  EXPECT_TRUE(fake()->enabled(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  EXPECT_TRUE(fake()->enabled(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION));
  EXPECT_TRUE(fake()->enabled(CUPTI_ACTIVITY_KIND_CUDA_EVENT));
  EXPECT_TRUE(fake()->enabled(CUPTI_ACTIVITY_KIND_MARKER));

  tracer.PushOperator(42);
  FakeActivityBuffer buffer;
  buffer.Add(External(5, 42)).Add(Kernel(5));
  ASSERT_TRUE(fake()->CompleteBuffer(buffer));
  tracer.PopOperator();
  tracer.RecordOperator(Op(42));
  EXPECT_EQ(fake()->external_id_log(), (std::vector<int64_t>{42, -42}));
  tracer.Shutdown();
  EXPECT_FALSE(fake()->enabled(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));

  Trace t = ReadStore();
  ASSERT_EQ(t.ops.size(), 1u);
  EXPECT_EQ(t.ops[0].rank, 3);
  EXPECT_EQ(t.ops[0].pid, getpid());
  ASSERT_EQ(t.gpu.size(), 1u);
  EXPECT_EQ(t.gpu[0].external_id, 42);
  EXPECT_EQ(t.metadata["cupti"], "enabled");
  EXPECT_EQ(t.metadata["cupti_api_version"], std::to_string(CUPTI_API_VERSION));
  EXPECT_EQ(t.metadata["cuda_driver_version"], "13.2");  // FakeCuptiApi::kFakeDriverVersion
  // The hot driver and runtime calls' records are off; launches, copies,
  // events and synchronising calls stay on.
  EXPECT_EQ(t.metadata["cupti_skipped_apis"], "41");
  EXPECT_TRUE(fake()->disabled_driver_apis().count(CUPTI_DRIVER_TRACE_CBID_cuCtxGetCurrent));
  EXPECT_TRUE(fake()->disabled_driver_apis().count(CUPTI_DRIVER_TRACE_CBID_cuKernelGetAttribute));
  EXPECT_TRUE(
      fake()->disabled_runtime_apis().count(CUPTI_RUNTIME_TRACE_CBID_cudaStreamIsCapturing_v10000));
  for (CUpti_CallbackId kept : {CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000,
                                CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020,
                                CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_v3020,
                                CUPTI_RUNTIME_TRACE_CBID_cudaEventRecord_v3020,
                                CUPTI_RUNTIME_TRACE_CBID_cudaStreamWaitEvent_v3020}) {
    EXPECT_FALSE(fake()->disabled_runtime_apis().count(kept)) << kept;
  }
  for (CUpti_CallbackId kept : {CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
                                CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize,
                                CUPTI_DRIVER_TRACE_CBID_cuEventRecord}) {
    EXPECT_FALSE(fake()->disabled_driver_apis().count(kept)) << kept;
  }
  EXPECT_EQ(t.metadata["cuda_toolkit_built"],
            std::to_string(CUDA_VERSION / 1000) + "." + std::to_string(CUDA_VERSION % 1000 / 10));
  EXPECT_EQ(t.metadata["format"], "dynaflow");
  EXPECT_EQ(t.metadata["pid"], std::to_string(getpid()));
  EXPECT_EQ(t.metadata["rank"], "3");
  EXPECT_EQ(t.metadata["ops"], "on");
  EXPECT_EQ(t.metadata["dropped_records"], "0");
  EXPECT_FALSE(t.metadata["command_line"].empty());
  EXPECT_FALSE(t.metadata["start_time_ns"].empty());
}

// A fault inside CUPTI while the tracer holds its CUPTI lock: at exit, the
// C exit handler's Shutdown disables CUPTI, which may already be torn down
// (an H200 run under --ops off died of SIGSEGV with nothing recorded). The
// signal handler's flush must not wait for that lock: it writes what the
// writer holds and names the signal, without asking CUPTI again.
class FaultInForcedFlushCupti : public FakeCuptiApi {
 public:
  std::function<void()> on_forced_flush;
  CUptiResult ActivityFlushAll(uint32_t flag) override {
    if ((flag & CUPTI_ACTIVITY_FLAG_FLUSH_FORCED) != 0 && on_forced_flush) {
      std::function<void()> fault = std::move(on_forced_flush);
      on_forced_flush = nullptr;
      fault();
    }
    return FakeCuptiApi::ActivityFlushAll(flag);
  }
};

TEST_F(TracerTest, AFaultInsideCuptiAtExitIsRecordedWithoutWaitingForIt) {
  FaultInForcedFlushCupti* cupti = nullptr;
  Tracer tracer(
      config_,
      [&cupti](std::string*) {
        auto fake = std::make_unique<FaultInForcedFlushCupti>();
        cupti = fake.get();
        return std::unique_ptr<CuptiApi>(std::move(fake));
      },
      CuptiStart::kAtCudaInit);
  tracer.StartWriter();
  tracer.OnCudaInit();
  ASSERT_NE(cupti, nullptr);
  tracer.RecordOperator(Op(7));
  bool answered = false;
  double waited_s = -1;
  Trace at_signal;
  cupti->on_forced_flush = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    answered = tracer.FinishOnSignal(SIGSEGV, milliseconds(3000));
    waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    at_signal = ReadStore();
  };
  tracer.Shutdown();  // the C exit handler's
  EXPECT_TRUE(answered);
  EXPECT_LT(waited_s, 1.0);
  EXPECT_EQ(at_signal.metadata["exit_signal"], "SIGSEGV");
  EXPECT_EQ(at_signal.metadata["final_flush"], "c_exit");
  EXPECT_EQ(at_signal.ops.size(), 1u);
}

TEST_F(TracerTest, WithoutCuptiRecordsOperatorsOnlyAndSaysWhy) {
  Tracer tracer(config_, FailingLoader(), CuptiStart::kAtCudaInit);
  tracer.StartWriter();
  tracer.OnCudaInit();
  tracer.PushOperator(1);
  tracer.RecordOperator(Op(1));
  tracer.PopOperator();
  tracer.Shutdown();
  Trace t = ReadStore();
  EXPECT_EQ(t.ops.size(), 1u);
  EXPECT_EQ(t.metadata["cupti"], "unavailable: cannot load libcupti (test)");
}

TEST_F(TracerTest, ProcessThatNeverInitialisesCudaNeverLoadsCupti) {
  Tracer tracer(config_, FakeLoader(), CuptiStart::kAtCudaInit);
  tracer.StartWriter();
  tracer.Shutdown();
  EXPECT_EQ(fake(), nullptr);
  EXPECT_EQ(ReadStore().metadata["cupti"].rfind("unavailable: CUPTI was not started", 0), 0u);
}

TEST_F(TracerTest, EnableFailureMakesCuptiUnavailable) {
  CuptiLoader refusing = [this](std::string*) {
    auto fake = std::make_unique<FakeCuptiApi>();
    fake->FailEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ERROR_NOT_INITIALIZED);
    fake_ = fake.get();
    return std::unique_ptr<CuptiApi>(std::move(fake));
  };
  Tracer tracer(config_, refusing, CuptiStart::kAtCudaInit);
  tracer.StartWriter();
  tracer.OnCudaInit();
  tracer.Shutdown();
  EXPECT_EQ(ReadStore().metadata["cupti"],
            "unavailable: cuptiActivityEnable(CONCURRENT_KERNEL): CUPTI_ERROR_FAKE");
}

TEST_F(TracerTest, ACuptiWithoutPerApiControlRecordsEveryApi) {
  CuptiLoader older = [this](std::string*) {
    auto fake = std::make_unique<FakeCuptiApi>();
    fake->LackPerApiControl();  // a CUPTI before cuptiActivityEnable{Driver,Runtime}Api
    fake_ = fake.get();
    return std::unique_ptr<CuptiApi>(std::move(fake));
  };
  Tracer tracer(config_, older, CuptiStart::kAtCudaInit);
  tracer.StartWriter();
  tracer.OnCudaInit();
  tracer.Shutdown();
  const Trace t = ReadStore();
  EXPECT_EQ(t.metadata.at("cupti"), "enabled");
  EXPECT_EQ(t.metadata.at("cupti_skipped_apis"), "0");
}

TEST_F(TracerTest, NothingIsRecordedBeforeTheWindowOpens) {
  config_.delay = std::chrono::hours(1);
  Tracer tracer(config_, FakeLoader(), CuptiStart::kAtCudaInit);
  tracer.StartWriter();
  EXPECT_FALSE(tracer.Active());
  tracer.RecordOperator(Op(1));
  tracer.OnCudaInit();
  ASSERT_NE(fake(), nullptr);
  EXPECT_TRUE(fake()->callbacks_registered());  // started, not enabled
  EXPECT_FALSE(fake()->enabled(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  tracer.Shutdown();
  EXPECT_TRUE(ReadStore().ops.empty());
}

TEST_F(TracerTest, WindowOfLimitedDurationCloses) {
  config_.duration = milliseconds(1);
  Tracer tracer(config_, FakeLoader(), CuptiStart::kAtCudaInit);
  std::this_thread::sleep_for(milliseconds(5));
  EXPECT_FALSE(tracer.Active());
}

TEST_F(TracerTest, PopMatchesOnlyPushesThatReachedCupti) {
  Tracer tracer(config_, FakeLoader(), CuptiStart::kAtCudaInit);
  tracer.StartWriter();
  tracer.PushOperator(1);  // before CUPTI: not pushed to it
  tracer.OnCudaInit();
  tracer.PushOperator(2);
  tracer.PopOperator();
  tracer.PopOperator();
  tracer.PopOperator();  // unbalanced: ignored
  EXPECT_EQ(fake()->external_id_log(), (std::vector<int64_t>{2, -2}));
  tracer.Shutdown();
}

TEST_F(TracerTest, RecordsCuptiHoldsAtExitAreWritten) {
  Tracer tracer(config_, FakeLoader(), CuptiStart::kAtCudaInit);
  tracer.StartWriter();
  tracer.OnCudaInit();
  FakeActivityBuffer held;
  held.Add(Kernel(9));
  fake()->CompleteAtNextFlush(std::move(held));
  tracer.Shutdown();  // disabling CUPTI flushes it
  EXPECT_EQ(ReadStore().gpu.size(), 1u);
}

TEST_F(TracerTest, StartsCuptiWhenTheWindowOpensIfCudaInjectionIsNotOurs) {
  Tracer tracer(config_, FakeLoader(), CuptiStart::kAtWindowOpen);
  tracer.StartWriter();
  // The writer thread loads and enables CUPTI at its first flush.
  for (int i = 0; i < 500 && !(fake() && fake()->enabled(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
       ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_NE(fake(), nullptr);
  EXPECT_TRUE(fake()->enabled(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  EXPECT_GT(fake()->flush_count(), 0);
  tracer.Shutdown();
  EXPECT_EQ(ReadStore().metadata["cupti"], "enabled");
}

TEST_F(TracerTest, NvtxInitialisationIsHandedToCupti) {
  Tracer tracer(config_, FakeLoader(), CuptiStart::kAtCudaInit);
  EXPECT_EQ(tracer.OnNvtxInit(nullptr), 1);
  ASSERT_NE(fake(), nullptr);
  EXPECT_EQ(fake()->nvtx_initializations(), 1);
  Tracer without(config_, FailingLoader(), CuptiStart::kAtCudaInit);
  EXPECT_EQ(without.OnNvtxInit(nullptr), 0);
}

TEST_F(TracerTest, FlushAndFinishAreAnsweredWithoutAWriter) {
  Tracer tracer(config_, FakeLoader(), CuptiStart::kAtCudaInit);
  EXPECT_TRUE(tracer.Flush(milliseconds(10)));
  tracer.StartWriter();
  tracer.RecordOperator(Op(1));
  EXPECT_TRUE(tracer.Finish(milliseconds(10000)));
  EXPECT_EQ(ReadStore().ops.size(), 1u);
}

TEST_F(TracerTest, TakesCuptiBackAfterTorchProfilerAndSaysWhatWentToIt) {
  config_.flush_interval = std::chrono::hours(1);  // only the tracer's own calls flush
  Tracer tracer(config_, FakeLoader(), CuptiStart::kAtCudaInit);
  tracer.StartWriter();
  tracer.OnCudaInit();
  FakeActivityBuffer before;
  before.Add(External(1, 7)).Add(Kernel(1));
  fake()->CompleteAtNextFlush(std::move(before));
  const int64_t lent_at = RealtimeNs();
  tracer.LendCupti();  // flushes while the callbacks are still the tracer's
  EXPECT_EQ(fake()->flush_count(), 1);
  FakeKineto::Start(*fake());

  tracer.PushOperator(8);  // lent: not pushed, but counted
  tracer.PopOperator();
  FakeActivityBuffer during;
  during.Add(Kernel(2));
  ASSERT_TRUE(fake()->CompleteBuffer(during));
  EXPECT_EQ(FakeKineto::buffers.load(), 1);
  tracer.OnCudaInit();  // a second context: CUPTI stays the profiler's
  EXPECT_EQ(fake()->timestamp_callback(), &FakeKineto::Clock);
  FakeKineto::Stop(*fake());
  EXPECT_FALSE(fake()->enabled(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));

  tracer.ReclaimCupti();
  const int64_t reclaimed_at = RealtimeNs();
  EXPECT_NE(fake()->timestamp_callback(), &FakeKineto::Clock);
  for (CUpti_ActivityKind kind :
       {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
        CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
        CUPTI_ACTIVITY_KIND_SYNCHRONIZATION, CUPTI_ACTIVITY_KIND_RUNTIME,
        CUPTI_ACTIVITY_KIND_DRIVER}) {
    EXPECT_TRUE(fake()->enabled(kind)) << kind;
  }
  tracer.PushOperator(9);
  FakeActivityBuffer after;
  after.Add(External(3, 9)).Add(Kernel(3));
  ASSERT_TRUE(fake()->CompleteBuffer(after));
  tracer.PopOperator();
  EXPECT_EQ(FakeKineto::buffers.load(), 1);  // the tracer's callbacks again
  EXPECT_EQ(fake()->external_id_log(), (std::vector<int64_t>{9, -9}));
  tracer.ReclaimCupti();  // a stop without a start (emit_nvtx, say): nothing
  tracer.Shutdown();

  Trace t = ReadStore();
  ASSERT_EQ(t.gpu.size(), 2u);
  EXPECT_EQ(t.gpu[0].external_id, 7);
  EXPECT_EQ(t.gpu[1].external_id, 9);
  EXPECT_EQ(t.metadata["cupti"], "enabled");
  EXPECT_EQ(t.metadata["torch_profiler_windows"], "1");
  EXPECT_EQ(t.metadata["cupti_kineto_window_count"], "1");
  EXPECT_EQ(t.metadata["cupti_kineto_operators"], "1");
  const std::string window = t.metadata["cupti_kineto_windows"];
  const size_t dash = window.find('-');
  ASSERT_NE(dash, std::string::npos) << window;
  const int64_t start = std::stoll(window.substr(0, dash));
  const int64_t end = std::stoll(window.substr(dash + 1));
  EXPECT_LE(lent_at, start);
  EXPECT_LE(start, end);
  EXPECT_LE(end, reclaimed_at);
}

TEST_F(TracerTest, CudaInitialisedWhileTorchProfilerHoldsCuptiStartsItAtTheReclaim) {
  Tracer tracer(config_, FakeLoader(), CuptiStart::kAtCudaInit);
  tracer.StartWriter();
  tracer.LendCupti();
  tracer.OnCudaInit();
  EXPECT_EQ(fake(), nullptr);  // not even loaded: starting would register callbacks
  tracer.ReclaimCupti();
  ASSERT_NE(fake(), nullptr);
  EXPECT_TRUE(fake()->callbacks_registered());
  EXPECT_TRUE(fake()->enabled(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  tracer.Shutdown();
  Trace t = ReadStore();
  EXPECT_EQ(t.metadata["cupti"], "enabled");
  EXPECT_EQ(t.metadata["torch_profiler_windows"], "1");
  EXPECT_EQ(t.metadata.count("cupti_kineto_window_count"), 0u);  // no CUPTI, nothing lost
}

TEST_F(TracerTest, ExitWhileTorchProfilerHoldsCuptiLeavesItToTheProfiler) {
  Tracer tracer(config_, FakeLoader(), CuptiStart::kAtCudaInit);
  tracer.StartWriter();
  tracer.OnCudaInit();
  tracer.LendCupti();
  tracer.LendCupti();  // a prepare, then a start: one window
  FakeKineto::Start(*fake());
  tracer.PushOperator(1);
  tracer.PushOperator(2);
  tracer.PopOperator();
  tracer.PopOperator();
  tracer.Shutdown();
  EXPECT_TRUE(fake()->enabled(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  FakeActivityBuffer records;
  records.Add(Kernel(1));
  ASSERT_TRUE(fake()->CompleteBuffer(records));
  EXPECT_EQ(FakeKineto::buffers.load(), 1);
  Trace t = ReadStore();
  EXPECT_EQ(t.metadata["torch_profiler_windows"], "1");
  EXPECT_EQ(t.metadata["cupti_kineto_window_count"], "1");
  EXPECT_EQ(t.metadata["cupti_kineto_operators"], "2");
  const std::string window = t.metadata["cupti_kineto_windows"];
  ASSERT_FALSE(window.empty());
  EXPECT_EQ(window.back(), '-');  // still open
}

TEST_F(TracerTest, CuptiRefusingTheReclaimIsUnavailableFromThenOn) {
  Tracer tracer(config_, FakeLoader(), CuptiStart::kAtCudaInit);
  tracer.StartWriter();
  tracer.OnCudaInit();
  tracer.LendCupti();
  FakeKineto::Start(*fake());
  FakeKineto::Stop(*fake());
  fake()->FailEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ERROR_NOT_INITIALIZED);
  tracer.ReclaimCupti();
  tracer.PushOperator(5);  // the session is disabled: nothing pushed
  tracer.PopOperator();
  tracer.Shutdown();
  EXPECT_TRUE(fake()->external_id_log().empty());
  EXPECT_EQ(ReadStore().metadata["cupti"],
            "unavailable: after torch.profiler: cuptiActivityEnable(CONCURRENT_KERNEL): "
            "CUPTI_ERROR_FAKE");
}

// A kernel of a CUDA graph replay: the cudaGraphLaunch's correlation, the
// node of the executable graph that launched it.
CUpti_ActivityKernel10 ReplayedKernel(uint32_t launch_correlation, uint64_t node) {
  CUpti_ActivityKernel10 k = Kernel(launch_correlation);
  k.graphId = 3;
  k.graphNodeId = node;
  return k;
}

CUpti_GraphData NodeCreated(uint64_t node) {
  CUpti_GraphData g = {};
  g.node = FakeCuptiApi::Node(node);
  return g;
}

CUpti_GraphData NodeCloned(uint64_t original, uint64_t clone) {
  CUpti_GraphData g = {};
  g.originalNode = FakeCuptiApi::Node(original);
  g.node = FakeCuptiApi::Node(clone);
  return g;
}

TEST_F(TracerTest, ReplayedGraphKernelsLinkToTheOperatorsThatCapturedThem) {
  Tracer tracer(config_, FakeLoader(), CuptiStart::kAtCudaInit);
  tracer.StartWriter();
  tracer.OnCudaInit();
  ASSERT_TRUE(fake()->subscribed());
  EXPECT_TRUE(fake()->callback_enabled(CUPTI_CB_DOMAIN_RESOURCE,
                                       CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED));
  EXPECT_TRUE(fake()->callback_enabled(CUPTI_CB_DOMAIN_RESOURCE,
                                       CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED));
  // Capture: operator 11 (nested in 10) launches node 101, operator 12 node
  // 102; node 103 is created outside any operator.
  tracer.PushOperator(10);
  tracer.PushOperator(11);
  ASSERT_TRUE(fake()->EmitGraphCallback(CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED, NodeCreated(101)));
  tracer.PopOperator();
  tracer.PushOperator(12);
  ASSERT_TRUE(fake()->EmitGraphCallback(CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED, NodeCreated(102)));
  tracer.PopOperator();
  tracer.PopOperator();
  ASSERT_TRUE(fake()->EmitGraphCallback(CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED, NodeCreated(103)));
  // Instantiation clones every node into the executable graph (201, 202, 203).
  for (uint64_t node : {101, 102, 103}) {
    ASSERT_TRUE(fake()->EmitGraphCallback(CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED,
                                          NodeCloned(node, node + 100)));
  }
  // Two replays launched by operator 50: every kernel has its launch's correlation.
  tracer.PushOperator(50);
  FakeActivityBuffer replays;
  replays.Add(External(7, 50)).Add(ReplayedKernel(7, 201)).Add(ReplayedKernel(7, 202));
  replays.Add(ReplayedKernel(7, 203));
  replays.Add(External(8, 50)).Add(ReplayedKernel(8, 201)).Add(ReplayedKernel(8, 202));
  ASSERT_TRUE(fake()->CompleteBuffer(replays));
  tracer.PopOperator();
  tracer.Shutdown();

  Trace t = ReadStore();
  ASSERT_EQ(t.gpu.size(), 5u);
  std::vector<int64_t> linked;
  for (const GpuActivity& g : t.gpu) linked.push_back(g.external_id);
  // The captured operators; node 103 had none and keeps its launch's.
  EXPECT_EQ(linked, (std::vector<int64_t>{11, 12, 50, 11, 12}));
  EXPECT_EQ(t.metadata["cupti_graph_attribution"], "enabled");
}

TEST_F(TracerTest, AnotherCuptiSubscriberLeavesGraphKernelsToTheirLaunch) {
  CuptiLoader held = [this](std::string*) {
    auto fake = std::make_unique<FakeCuptiApi>();
    fake->HoldSubscriptionElsewhere(true);
    fake_ = fake.get();
    return std::unique_ptr<CuptiApi>(std::move(fake));
  };
  Tracer tracer(config_, held, CuptiStart::kAtCudaInit);
  tracer.StartWriter();
  tracer.OnCudaInit();
  EXPECT_FALSE(fake()->subscribed());
  tracer.PushOperator(11);
  EXPECT_FALSE(fake()->EmitGraphCallback(CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED, NodeCreated(101)));
  tracer.PopOperator();
  FakeActivityBuffer replay;
  replay.Add(External(7, 50)).Add(ReplayedKernel(7, 101));
  ASSERT_TRUE(fake()->CompleteBuffer(replay));
  tracer.Shutdown();
  Trace t = ReadStore();
  ASSERT_EQ(t.gpu.size(), 1u);
  EXPECT_EQ(t.gpu[0].external_id, 50);
  EXPECT_EQ(t.metadata["cupti"], "enabled");  // the tracer goes on
  EXPECT_EQ(t.metadata["cupti_graph_attribution"], "unavailable: another CUPTI subscriber");
}

TEST_F(TracerTest, TorchProfilerGetsTheSubscriptionDuringItsWindow) {
  Tracer tracer(config_, FakeLoader(), CuptiStart::kAtCudaInit);
  tracer.StartWriter();
  tracer.OnCudaInit();
  ASSERT_TRUE(fake()->subscribed());
  tracer.LendCupti();
  EXPECT_FALSE(fake()->subscribed());  // free for Kineto
  fake()->HoldSubscriptionElsewhere(true);  // Kineto subscribed, for good
  tracer.ReclaimCupti();
  EXPECT_FALSE(fake()->subscribed());
  tracer.Shutdown();
  EXPECT_EQ(ReadStore().metadata["cupti_graph_attribution"],
            "unavailable: after torch.profiler: another CUPTI subscriber");
}

TEST_F(TracerTest, TheSubscriptionComesBackAfterAWindowWhereNobodyTookIt) {
  Tracer tracer(config_, FakeLoader(), CuptiStart::kAtCudaInit);
  tracer.StartWriter();
  tracer.OnCudaInit();
  tracer.LendCupti();
  tracer.ReclaimCupti();
  EXPECT_TRUE(fake()->subscribed());
  EXPECT_TRUE(fake()->callback_enabled(CUPTI_CB_DOMAIN_RESOURCE,
                                       CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED));
  tracer.Shutdown();
  EXPECT_EQ(ReadStore().metadata["cupti_graph_attribution"], "enabled");
}

// Each operator's in_graph_capture by external id.
std::map<int64_t, bool> CaptureTimeOperators(const Trace& t) {
  std::map<int64_t, bool> marked;
  for (const Operator& o : t.ops) marked[o.external_id] = o.in_graph_capture;
  return marked;
}

// The torch extension's order: push at the operator's start, pop then record
// at its end.
void RunOperator(Tracer& tracer, uint64_t id) {
  tracer.PushOperator(id);
  tracer.PopOperator();
  tracer.RecordOperator(Op(id));
}

TEST_F(TracerTest, OperatorsBegunWhileTheirThreadCapturesAreCaptureTimeOperators) {
  Tracer tracer(config_, FakeLoader(), CuptiStart::kAtCudaInit);
  tracer.StartWriter();
  tracer.OnCudaInit();
  RunOperator(tracer, 1);
  tracer.PushOperator(2);  // begins before the capture, ends inside it
  ASSERT_TRUE(fake()->EmitBeginCapture(0x10));
  tracer.PushOperator(3);
  RunOperator(tracer, 4);  // nested in 3
  tracer.PopOperator();
  tracer.RecordOperator(Op(3));
  std::thread([&tracer] { RunOperator(tracer, 5); }).join();  // another thread
  tracer.PushOperator(6);  // begins inside, ends after the capture
  ASSERT_TRUE(fake()->EmitEndCapture(0x10));
  tracer.PopOperator();
  tracer.RecordOperator(Op(6));
  tracer.PopOperator();
  tracer.RecordOperator(Op(2));
  RunOperator(tracer, 7);
  tracer.RecordOperator(Op(8));  // never pushed
  tracer.Shutdown();
  EXPECT_EQ(CaptureTimeOperators(ReadStore()),
            (std::map<int64_t, bool>{{1, false}, {2, false}, {3, true}, {4, true}, {5, false},
                                     {6, true}, {7, false}, {8, false}}));
}

TEST_F(TracerTest, FailedAndForgottenCapturesMarkNothing) {
  Tracer tracer(config_, FakeLoader(), CuptiStart::kAtCudaInit);
  tracer.StartWriter();
  tracer.OnCudaInit();
  ASSERT_TRUE(fake()->EmitBeginCapture(0x10, /*cudaErrorStreamCaptureUnsupported*/ 900));
  RunOperator(tracer, 1);
  ASSERT_TRUE(fake()->EmitBeginCapture(0x20));
  RunOperator(tracer, 2);
  // torch.profiler takes CUPTI's subscription: the capture's end would go
  // unseen, so it is forgotten.
  tracer.LendCupti();
  tracer.ReclaimCupti();
  RunOperator(tracer, 3);
  tracer.Shutdown();
  EXPECT_EQ(CaptureTimeOperators(ReadStore()),
            (std::map<int64_t, bool>{{1, false}, {2, true}, {3, false}}));
}

}  // namespace
}  // namespace dynaflow
