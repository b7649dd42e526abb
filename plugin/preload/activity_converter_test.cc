#include "plugin/preload/activity_converter.h"

#include <gtest/gtest.h>

#include "plugin/preload/fake_cupti_api.h"

namespace dynaflow {
namespace {

constexpr int32_t kRank = 2;
constexpr int32_t kPid = 4242;

CUpti_ActivityKernel10 Kernel(uint32_t correlation, const char* name, uint64_t start) {
  CUpti_ActivityKernel10 k = {};
  k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  k.correlationId = correlation;
  k.name = name;
  k.start = start;
  k.end = start + 1000;
  k.deviceId = 0;
  k.streamId = 7;
  return k;
}

CUpti_ActivityAPI Api(CUpti_ActivityKind kind, uint32_t correlation, uint32_t cbid,
                      uint32_t tid) {
  CUpti_ActivityAPI a = {};
  a.kind = kind;
  a.correlationId = correlation;
  a.cbid = cbid;
  a.start = 100;
  a.end = 200;
  a.processId = kPid;
  a.threadId = tid;
  return a;
}

CUpti_ActivityExternalCorrelation External(uint32_t correlation, uint64_t external_id,
                                           CUpti_ExternalCorrelationKind kind =
                                               kOperatorCorrelationKind) {
  CUpti_ActivityExternalCorrelation e = {};
  e.kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
  e.externalKind = kind;
  e.externalId = external_id;
  e.correlationId = correlation;
  return e;
}

CUpti_ActivitySynchronization2 Sync(uint32_t correlation) {
  CUpti_ActivitySynchronization2 s = {};
  s.kind = CUPTI_ACTIVITY_KIND_SYNCHRONIZATION;
  s.type = CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE;
  s.correlationId = correlation;
  s.start = 300;
  s.end = 900;
  return s;
}

// cudaEventRecord(event, stream) in context 1, with its correlation id.
CUpti_ActivityCudaEvent2 EventRecord(uint32_t correlation, uint32_t event, uint32_t stream,
                                     uint32_t device) {
  CUpti_ActivityCudaEvent2 e = {};
  e.kind = CUPTI_ACTIVITY_KIND_CUDA_EVENT;
  e.correlationId = correlation;
  e.contextId = 1;
  e.streamId = stream;
  e.eventId = event;
  e.deviceId = device;
  return e;
}

// A wait of `type` in context 1 on `event` (CUPTI_SYNCHRONIZATION_INVALID_VALUE: none).
CUpti_ActivitySynchronization2 EventWait(CUpti_ActivitySynchronizationType type,
                                         uint32_t correlation, uint32_t stream, uint32_t event) {
  CUpti_ActivitySynchronization2 s = Sync(correlation);
  s.type = type;
  s.contextId = 1;
  s.streamId = stream;
  s.cudaEventId = event;
  return s;
}

CUpti_ActivityMarker2 Marker(CUpti_ActivityFlag flag, uint32_t id, uint64_t timestamp,
                             const char* name) {
  CUpti_ActivityMarker2 m = {};
  m.kind = CUPTI_ACTIVITY_KIND_MARKER;
  m.flags = flag;
  m.id = id;
  m.timestamp = timestamp;
  m.name = name;
  m.objectKind = CUPTI_ACTIVITY_OBJECT_THREAD;
  m.objectId.pt.processId = kPid;
  m.objectId.pt.threadId = 11;
  return m;
}

template <typename Record>
const CUpti_Activity& AsActivity(const Record& r) {
  return reinterpret_cast<const CUpti_Activity&>(r);
}

class ActivityConverterTest : public ::testing::Test {
 protected:
  ActivityConverterTest() : converter_(ConverterOptions{.rank = kRank, .pid = kPid}) {
    converter_.set_cupti(&cupti_);
    cupti_.SetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, 211, "cudaLaunchKernel_v7000");
    cupti_.SetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, 131, "cudaStreamSynchronize_v3020");
  }

  template <typename Record>
  void Add(const Record& r) {
    converter_.AddRecord(AsActivity(r));
  }

  std::string_view Name(const Trace& t, StringId id) const { return t.strings.Get(id); }

  FakeCuptiApi cupti_;
  ActivityConverter converter_;
};

TEST_F(ActivityConverterTest, KernelRecordBecomesOneGpuActivity) {
  CUpti_ActivityKernel10 k = Kernel(11, "_Z6kernelPf", 5000);
  k.deviceId = 1;
  k.gridX = 132;
  k.gridY = 2;
  k.gridZ = 1;
  k.blockX = 256;
  k.blockY = 1;
  k.blockZ = 1;
  k.registersPerThread = 168;
  k.staticSharedMemory = 1024;
  k.dynamicSharedMemory = 64512;
  Add(k);
  Trace t = converter_.TakeBatch(/*release_all=*/true);

  ASSERT_EQ(t.gpu.size(), 1u);
  const GpuActivity& g = t.gpu[0];
  EXPECT_EQ(g.kind, GpuKind::kKernel);
  EXPECT_EQ(Name(t, g.name), "kernel(float*)");  // demangled
  EXPECT_EQ(g.start, 5000);
  EXPECT_EQ(g.end, 6000);
  EXPECT_EQ(g.stream, 7);
  EXPECT_EQ(g.correlation, 11);
  EXPECT_EQ(g.external_id, -1);
  EXPECT_EQ(g.grid[0], 132);
  EXPECT_EQ(g.grid[1], 2);
  EXPECT_EQ(g.block[0], 256);
  EXPECT_EQ(g.registers, 168);
  EXPECT_EQ(g.shared_memory, 65536);
  EXPECT_EQ(g.graph_id, -1);
  EXPECT_EQ(g.graph_node, -1);
  EXPECT_EQ(g.pid, kPid);  // the launching process (store version 3)
  ASSERT_EQ(t.devices.size(), 1u);
  EXPECT_EQ(t.devices[g.device_index].rank, kRank);
  EXPECT_EQ(t.devices[g.device_index].device, 1);
  EXPECT_TRUE(t.api.empty());
  EXPECT_TRUE(t.stats.all().empty());
}

TEST_F(ActivityConverterTest, GraphLaunchedKernelKeepsGraphAndNode) {
  CUpti_ActivityKernel10 k = Kernel(12, "graph_kernel", 10);
  k.graphId = 4;
  k.graphNodeId = 90;
  Add(k);
  Trace t = converter_.TakeBatch(true);
  ASSERT_EQ(t.gpu.size(), 1u);
  EXPECT_EQ(t.gpu[0].graph_id, 4);
  EXPECT_EQ(t.gpu[0].graph_node, 90);
}

TEST_F(ActivityConverterTest, NcclKernelsKeepTheirNames) {
  Add(Kernel(1, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 10));
  Add(Kernel(2, "_Z40ncclDevKernel_AllReduce_Sum_bf16_RING_LL24ncclDevKernelArgsStorageILm4096EE",
             10));
  Trace t = converter_.TakeBatch(true);
  ASSERT_EQ(t.gpu.size(), 2u);
  EXPECT_EQ(Name(t, t.gpu[0].name), "ncclDevKernel_AllReduce_Sum_bf16_RING_LL");
  EXPECT_EQ(Name(t, t.gpu[1].name),
            "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)");
}

TEST_F(ActivityConverterTest, MemcpyPeerMemcpyAndMemset) {
  CUpti_ActivityMemcpy6 copy = {};
  copy.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
  copy.copyKind = CUPTI_ACTIVITY_MEMCPY_KIND_HTOD;
  copy.bytes = 4096;
  copy.start = 10;
  copy.end = 20;
  copy.deviceId = 0;
  copy.streamId = 3;
  copy.correlationId = 30;
  copy.graphId = 5;  // a copy node of a replayed CUDA graph
  copy.graphNodeId = 51;
  Add(copy);
  CUpti_ActivityMemcpyPtoP4 peer = {};
  peer.kind = CUPTI_ACTIVITY_KIND_MEMCPY2;
  peer.copyKind = CUPTI_ACTIVITY_MEMCPY_KIND_PTOP;
  peer.bytes = 1 << 20;
  peer.start = 30;
  peer.end = 40;
  peer.deviceId = 1;
  peer.srcDeviceId = 0;
  peer.dstDeviceId = 1;
  peer.correlationId = 31;
  Add(peer);
  CUpti_ActivityMemset4 fill = {};
  fill.kind = CUPTI_ACTIVITY_KIND_MEMSET;
  fill.bytes = 64;
  fill.start = 50;
  fill.end = 55;
  fill.correlationId = 32;
  fill.graphId = 5;
  fill.graphNodeId = 52;
  Add(fill);
  Trace t = converter_.TakeBatch(true);

  ASSERT_EQ(t.gpu.size(), 3u);
  EXPECT_EQ(t.gpu[0].kind, GpuKind::kMemcpy);
  EXPECT_EQ(Name(t, t.gpu[0].name), "Memcpy HtoD");
  EXPECT_EQ(Name(t, t.gpu[0].copy_kind), "HtoD");
  EXPECT_EQ(t.gpu[0].bytes, 4096);
  EXPECT_EQ(t.gpu[0].stream, 3);
  EXPECT_EQ(t.gpu[0].correlation, 30);
  EXPECT_EQ(t.gpu[0].graph_id, 5);
  EXPECT_EQ(t.gpu[0].graph_node, 51);
  EXPECT_EQ(t.gpu[0].pid, kPid);
  EXPECT_EQ(t.gpu[1].kind, GpuKind::kMemcpy);
  EXPECT_EQ(t.gpu[1].graph_id, -1);  // not from a graph
  EXPECT_EQ(Name(t, t.gpu[1].name), "Memcpy PtoP");
  EXPECT_EQ(Name(t, t.gpu[1].copy_kind), "PtoP");
  EXPECT_EQ(t.gpu[1].bytes, 1 << 20);
  EXPECT_EQ(t.devices[t.gpu[1].device_index].device, 1);
  EXPECT_EQ(t.gpu[2].kind, GpuKind::kMemset);
  EXPECT_EQ(Name(t, t.gpu[2].name), "Memset");
  EXPECT_EQ(t.gpu[2].bytes, 64);
  EXPECT_EQ(t.gpu[2].graph_id, 5);
  EXPECT_EQ(t.gpu[2].graph_node, 52);
}

TEST_F(ActivityConverterTest, RuntimeAndDriverCallsAreNamedWithoutVersion) {
  Add(Api(CUPTI_ACTIVITY_KIND_RUNTIME, 40, 211, 77));
  Add(Api(CUPTI_ACTIVITY_KIND_DRIVER, 41, 999, 78));
  Trace t = converter_.TakeBatch(true);
  ASSERT_EQ(t.api.size(), 2u);
  EXPECT_EQ(t.api[0].kind, ApiKind::kRuntime);
  EXPECT_EQ(Name(t, t.api[0].name), "cudaLaunchKernel");
  EXPECT_EQ(t.api[0].start, 100);
  EXPECT_EQ(t.api[0].end, 200);
  EXPECT_EQ(t.api[0].rank, kRank);
  EXPECT_EQ(t.api[0].pid, kPid);
  EXPECT_EQ(t.api[0].tid, 77);
  EXPECT_EQ(t.api[0].correlation, 40);
  EXPECT_EQ(t.api[1].kind, ApiKind::kDriver);
  EXPECT_EQ(Name(t, t.api[1].name), "CUDA driver API 999");  // CUPTI knows no name
}

TEST_F(ActivityConverterTest, SynchronizationTakesTheThreadOfItsCallInEitherOrder) {
  Add(Sync(50));                                         // before its API record
  Add(Api(CUPTI_ACTIVITY_KIND_RUNTIME, 50, 131, 77));
  Add(Api(CUPTI_ACTIVITY_KIND_RUNTIME, 51, 131, 78));
  Add(Sync(51));                                         // after it
  Trace t = converter_.TakeBatch(true);
  ASSERT_EQ(t.api.size(), 4u);
  EXPECT_EQ(t.api[0].kind, ApiKind::kSync);
  EXPECT_EQ(Name(t, t.api[0].name), "cudaStreamSynchronize");
  EXPECT_EQ(t.api[0].tid, 77);
  EXPECT_EQ(t.api[0].pid, kPid);
  EXPECT_EQ(t.api[0].start, 300);
  EXPECT_EQ(t.api[0].end, 900);
  EXPECT_EQ(t.api[3].kind, ApiKind::kSync);
  EXPECT_EQ(t.api[3].tid, 78);
}

TEST_F(ActivityConverterTest, StreamWaitEventNamesTheStreamAndRecordCallItWaitsFor) {
  Add(EventRecord(/*correlation=*/60, /*event=*/5, /*stream=*/7, /*device=*/2));
  Add(EventRecord(/*correlation=*/61, /*event=*/6, /*stream=*/9, /*device=*/2));
  Add(EventRecord(/*correlation=*/62, /*event=*/5, /*stream=*/13, /*device=*/2));  // re-recorded
  Add(EventWait(CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT, 63, /*stream=*/8, 5));
  Add(EventWait(CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE, 64,
                CUPTI_SYNCHRONIZATION_INVALID_VALUE, 6));
  Trace t = converter_.TakeBatch(true);
  ASSERT_EQ(t.api.size(), 2u);  // CUDA_EVENT records are no rows of their own
  const ApiCall& wait = t.api[0];
  EXPECT_EQ(Name(t, wait.name), "cudaStreamWaitEvent");
  EXPECT_EQ(wait.sync_stream, 8);
  EXPECT_EQ(wait.sync_device, 2);  // the context's device, from its event records
  EXPECT_EQ(wait.wait_event_id, 5);
  EXPECT_EQ(wait.wait_on_stream, 13);  // the event's latest record
  EXPECT_EQ(wait.wait_event_correlation, 62);
  const ApiCall& sync = t.api[1];
  EXPECT_EQ(Name(t, sync.name), "cudaEventSynchronize");
  EXPECT_EQ(sync.sync_stream, -1);  // an event sync names no stream
  EXPECT_EQ(sync.wait_on_stream, 9);
  EXPECT_EQ(sync.wait_event_correlation, 61);
  EXPECT_EQ(t.stats.Get("cupti_wait_on_unrecorded_event"), 0);
}

TEST_F(ActivityConverterTest, WaitOnAnUnrecordedEventKeepsItsIdAndIsCounted) {
  Add(EventRecord(60, /*event=*/5, 7, 0));
  Add(EventWait(CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT, 63, 8, /*event=*/4));
  Add(EventWait(CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE, 64, 8,
                CUPTI_SYNCHRONIZATION_INVALID_VALUE));
  Trace t = converter_.TakeBatch(true);
  ASSERT_EQ(t.api.size(), 2u);
  EXPECT_EQ(t.api[0].wait_event_id, 4);
  EXPECT_EQ(t.api[0].wait_on_stream, -1);
  EXPECT_EQ(t.api[0].wait_event_correlation, -1);
  EXPECT_EQ(t.api[1].sync_stream, 8);
  EXPECT_EQ(t.api[1].wait_event_id, -1);  // a stream sync waits on no event
  EXPECT_EQ(t.stats.Get("cupti_wait_on_unrecorded_event"), 1);
}

TEST(ActivityConverterEventsTest, AnEventWhoseSlotANewerOneTookIsForgotten) {
  ActivityConverter converter(ConverterOptions{.rank = kRank, .pid = kPid, .event_slots = 4});
  auto add = [&](const auto& r) { converter.AddRecord(AsActivity(r)); };
  add(EventRecord(60, /*event=*/1, /*stream=*/7, 0));
  add(EventRecord(61, /*event=*/5, /*stream=*/9, 0));  // the slot of event 1 (5 & 3 == 1)
  add(EventWait(CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT, 62, 8, /*event=*/1));
  add(EventWait(CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT, 63, 8, /*event=*/5));
  Trace t = converter.TakeBatch(true);
  ASSERT_EQ(t.api.size(), 2u);
  EXPECT_EQ(t.api[0].wait_on_stream, -1);
  EXPECT_EQ(t.api[1].wait_on_stream, 9);
  EXPECT_EQ(t.api[1].wait_event_correlation, 61);
  EXPECT_EQ(t.stats.Get("cupti_wait_on_unrecorded_event"), 1);
}

TEST_F(ActivityConverterTest, ExternalCorrelationLinksRecordsInBothArrivalOrders) {
  Add(External(5, 1001));  // before the launch and its kernel
  Add(Api(CUPTI_ACTIVITY_KIND_RUNTIME, 5, 211, 77));
  Add(Kernel(5, "early", 10));
  Add(Kernel(6, "late", 10));  // kernel and launch first, then the link
  Add(Api(CUPTI_ACTIVITY_KIND_RUNTIME, 6, 211, 77));
  Add(External(6, 1002));
  Trace t = converter_.TakeBatch(false);
  ASSERT_EQ(t.gpu.size(), 2u);
  ASSERT_EQ(t.api.size(), 2u);
  EXPECT_EQ(t.gpu[0].external_id, 1001);
  EXPECT_EQ(t.api[0].external_id, 1001);
  EXPECT_EQ(t.gpu[1].external_id, 1002);
  EXPECT_EQ(t.api[1].external_id, 1002);
}

TEST_F(ActivityConverterTest, LateLinkReachesARecordHeldOverOneBatch) {
  CUpti_ActivityKernel10 waiting = Kernel(7, "waits", 10);
  waiting.deviceId = 3;
  Add(waiting);
  Add(Kernel(8, "never_linked", 10));
  Trace first = converter_.TakeBatch(false);
  EXPECT_TRUE(first.gpu.empty());  // both wait for a link, in the next batch

  Add(External(7, 1003));
  Trace second = converter_.TakeBatch(false);  // waited once: written either way
  ASSERT_EQ(second.gpu.size(), 2u);
  const GpuActivity& linked = second.gpu[0].start == 0 ? second.gpu[0] : second.gpu[1];
  const GpuActivity& unlinked = second.gpu[0].start == 0 ? second.gpu[1] : second.gpu[0];
  EXPECT_EQ(second.strings.Get(linked.name), "waits");
  EXPECT_EQ(linked.external_id, 1003);
  EXPECT_EQ(second.devices[linked.device_index].device, 3);
  EXPECT_EQ(second.strings.Get(unlinked.name), "never_linked");
  EXPECT_EQ(unlinked.external_id, -1);
  EXPECT_EQ(unlinked.correlation, 8);
  EXPECT_TRUE(converter_.TakeBatch(false).gpu.empty());
}

TEST_F(ActivityConverterTest, ForeignExternalCorrelationIsCountedNotLinked) {
  Add(External(9, 77, CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0));  // Kineto's
  Add(Kernel(9, "k", 10));
  Trace t = converter_.TakeBatch(true);
  ASSERT_EQ(t.gpu.size(), 1u);
  EXPECT_EQ(t.gpu[0].external_id, -1);
  EXPECT_EQ(t.stats.Get("cupti_foreign_external_correlation"), 1);
}

TEST_F(ActivityConverterTest, NvtxMarkersBecomeRanges) {
  Add(Marker(CUPTI_ACTIVITY_FLAG_MARKER_START, 1, 1000, "ncclAllReduce(bytes=1048576)"));
  Add(Marker(CUPTI_ACTIVITY_FLAG_MARKER_START, 2, 1100, "forward"));
  Add(Marker(CUPTI_ACTIVITY_FLAG_MARKER_END, 1, 2000, nullptr));
  Add(Marker(CUPTI_ACTIVITY_FLAG_MARKER_END, 3, 2100, nullptr));  // no start
  Add(Marker(CUPTI_ACTIVITY_FLAG_MARKER_INSTANTANEOUS, 4, 2200, "mark"));
  converter_.EndOfTrace();  // range 2 never ends
  Trace t = converter_.TakeBatch(true);
  ASSERT_EQ(t.ranges.size(), 1u);
  const Range& r = t.ranges[0];
  EXPECT_EQ(r.domain, RangeDomain::kNvtx);
  EXPECT_EQ(Name(t, r.name), "ncclAllReduce(bytes=1048576)");
  EXPECT_EQ(r.start, 1000);
  EXPECT_EQ(r.end, 2000);
  EXPECT_EQ(r.pid, kPid);
  EXPECT_EQ(r.tid, 11);
  EXPECT_EQ(r.rank, kRank);
  EXPECT_EQ(r.device_index, -1);
  EXPECT_EQ(t.stats.Get("nvtx_unmatched_range_end"), 1);
  EXPECT_EQ(t.stats.Get("nvtx_mark"), 1);
  EXPECT_EQ(t.stats.Get("nvtx_unterminated_range"), 1);
}

TEST_F(ActivityConverterTest, DeviceRecordDescribesTheDeviceOnce) {
  CUpti_ActivityDevice5 d = {};
  d.kind = CUPTI_ACTIVITY_KIND_DEVICE;
  d.id = 0;
  d.name = "NVIDIA H200";
  d.numMultiprocessors = 132;
  d.computeCapabilityMajor = 9;
  d.computeCapabilityMinor = 0;
  d.globalMemorySize = 150ull << 30;
  d.globalMemoryBandwidth = 4800000000ull;  // KB/s
  d.coreClockRate = 1980000;
  d.l2CacheSize = 50 << 20;
  Add(d);
  Add(Kernel(1, "k", 10));
  Trace t = converter_.TakeBatch(true);
  ASSERT_EQ(t.devices.size(), 1u);
  const DeviceInfo& info = t.devices[0];
  EXPECT_EQ(info.rank, kRank);
  EXPECT_EQ(info.device, 0);
  EXPECT_EQ(info.name, "NVIDIA H200");
  EXPECT_EQ(info.sm_count, 132);
  EXPECT_EQ(info.cc_major, 9);
  EXPECT_EQ(info.memory_bytes, int64_t{150} << 30);
  EXPECT_EQ(info.clock_khz, 1980000);
  EXPECT_DOUBLE_EQ(info.memory_bandwidth_gbps, 4800);
  EXPECT_DOUBLE_EQ(info.peak_tflops_bf16, 989.4);  // from the device table
  EXPECT_EQ(t.metadata["device0.l2_cache_bytes"], std::to_string(50 << 20));
  EXPECT_EQ(t.gpu[0].device_index, 0u);

  d.name = "renamed";
  Add(d);  // the same device again: already described
  Trace again = converter_.TakeBatch(true);
  EXPECT_TRUE(again.devices.empty());
}

// A forced flush at exit hands over records the GPU has not completed: a zero
// start, or an end before the start. Dropped and counted, never written.
TEST_F(ActivityConverterTest, UntimedRecordsAreDroppedAndCounted) {
  Add(Kernel(1, "zero_start", 0));
  CUpti_ActivityKernel10 inverted = Kernel(2, "inverted", 5000);
  inverted.end = 4000;
  Add(inverted);
  CUpti_ActivityAPI api = Api(CUPTI_ACTIVITY_KIND_RUNTIME, 3, 211, 77);
  api.start = 0;
  Add(api);
  Add(Kernel(4, "fine", 7000));
  Trace t = converter_.TakeBatch(true);
  ASSERT_EQ(t.gpu.size(), 1u);
  EXPECT_EQ(Name(t, t.gpu[0].name), "fine");
  EXPECT_TRUE(t.api.empty());
  EXPECT_EQ(t.stats.Get("cupti_untimed_record"), 3);
}

TEST_F(ActivityConverterTest, UnknownKindIsCountedNotFatal) {
  CUpti_ActivityContext3 context = {};
  context.kind = CUPTI_ACTIVITY_KIND_CONTEXT;
  Add(context);
  Add(context);
  Add(Kernel(1, "k", 10));
  Trace t = converter_.TakeBatch(true);
  EXPECT_EQ(t.stats.Get("cupti_unknown_activity_kind"), 2);
  EXPECT_EQ(t.gpu.size(), 1u);
}

TEST_F(ActivityConverterTest, BufferIsReadRecordByRecordThroughCupti) {
  FakeActivityBuffer buffer;
  buffer.Add(External(5, 9)).Add(Kernel(5, "a", 5)).Add(Kernel(6, "b", 10));
  std::vector<uint8_t> bytes(buffer.data(), buffer.data() + buffer.size());
  EXPECT_EQ(CountActivityRecords(cupti_, bytes.data(), bytes.size()), 3u);
  converter_.AddBuffer(bytes.data(), bytes.size());
  EXPECT_EQ(converter_.batch_rows(), 2u);
  Trace t = converter_.TakeBatch(true);
  ASSERT_EQ(t.gpu.size(), 2u);
  EXPECT_EQ(t.gpu[0].external_id, 9);
}

TEST_F(ActivityConverterTest, OperatorRecordBecomesAnOperator) {
  DynaflowOperatorRecord op = {};
  op.id = 1001;
  op.start_ns = 10;
  op.end_ns = 90;
  op.sequence = 5;
  op.tid = 77;
  op.pass = DYNAFLOW_PASS_BACKWARD;
  op.name = "aten::mm";
  op.input_shapes = "[[8,4096],[4096,4096]]";
  op.input_types = nullptr;
  op.module_path = "model.layers.0.mlp";
  op.collective = R"("Collective name":"broadcast")";
  converter_.AddOperator(op, /*in_graph_capture=*/true);
  op.id = 0;  // no external id
  op.collective = nullptr;
  op.pass = 9;  // not a pass
  converter_.AddOperator(op);
  Trace t = converter_.TakeBatch(true);
  ASSERT_EQ(t.ops.size(), 2u);
  const Operator& o = t.ops[0];
  EXPECT_EQ(o.external_id, 1001);
  EXPECT_EQ(o.start, 10);
  EXPECT_EQ(o.end, 90);
  EXPECT_EQ(o.sequence, 5);
  EXPECT_EQ(o.rank, kRank);
  EXPECT_EQ(o.pid, kPid);
  EXPECT_EQ(o.tid, 77);
  EXPECT_EQ(o.pass, Pass::kBackward);
  EXPECT_EQ(Name(t, o.name), "aten::mm");
  EXPECT_EQ(Name(t, o.input_shapes), "[[8,4096],[4096,4096]]");
  EXPECT_EQ(Name(t, o.input_types), "");
  EXPECT_EQ(Name(t, o.module_path), "model.layers.0.mlp");
  EXPECT_EQ(Name(t, o.collective), R"("Collective name":"broadcast")");
  EXPECT_EQ(Name(t, t.ops[1].collective), "");
  EXPECT_EQ(t.ops[1].external_id, -1);
  EXPECT_EQ(t.ops[1].pass, Pass::kUnknown);
  EXPECT_TRUE(o.in_graph_capture);
  EXPECT_FALSE(t.ops[1].in_graph_capture);
}

TEST(CorrelationTableTest, RemembersTheMostRecentIdsOfEachSlot) {
  CorrelationTable table(4);
  table.Upsert(1).external_id = 10;
  EXPECT_EQ(table.Find(1)->external_id, 10);
  EXPECT_EQ(table.Find(2), nullptr);
  table.Upsert(5).tid = 3;  // same slot as 1, which is forgotten
  EXPECT_EQ(table.Find(1), nullptr);
  EXPECT_EQ(table.Find(5)->tid, 3);
  EXPECT_EQ(table.Find(5)->external_id, -1);
  EXPECT_EQ(table.Find(0), nullptr);
}

}  // namespace
}  // namespace dynaflow
