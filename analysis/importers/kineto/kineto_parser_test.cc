#include "analysis/importers/kineto/kineto_parser.h"

#include <gtest/gtest.h>

namespace dynaflow {
namespace {

TEST(MicrosToNsTest, ConvertsDecimalsExactly) {
  int64_t ns = 0;
  ASSERT_TRUE(MicrosToNs("2204338330237.582", &ns));
  EXPECT_EQ(ns, 2204338330237582);
  ASSERT_TRUE(MicrosToNs("1623142623460111", &ns));
  EXPECT_EQ(ns, 1623142623460111000);
  ASSERT_TRUE(MicrosToNs("3.5", &ns));
  EXPECT_EQ(ns, 3500);
  ASSERT_TRUE(MicrosToNs("0.0004", &ns));
  EXPECT_EQ(ns, 0);
  ASSERT_TRUE(MicrosToNs("0.0005", &ns));
  EXPECT_EQ(ns, 1);
  ASSERT_TRUE(MicrosToNs("-2.25", &ns));
  EXPECT_EQ(ns, -2250);
  ASSERT_TRUE(MicrosToNs("1.5e3", &ns));
  EXPECT_EQ(ns, 1500000);
  // Beyond +-3e15 us the sums and differences of times could overflow int64.
  EXPECT_FALSE(MicrosToNs("3000000000000001", &ns));
  EXPECT_FALSE(MicrosToNs("99999999999999999999.5", &ns));
  EXPECT_FALSE(MicrosToNs("1e300", &ns));
  EXPECT_FALSE(MicrosToNs("-1e300", &ns));
  ASSERT_TRUE(MicrosToNs("3000000000000000", &ns));
  EXPECT_EQ(ns, 3000000000000000000);
  EXPECT_FALSE(MicrosToNs("", &ns));
  EXPECT_FALSE(MicrosToNs("abc", &ns));
  EXPECT_FALSE(MicrosToNs("1.2.3", &ns));
}

// A current-style trace, with distributedInfo after the events.
const char* kCurrent = R"json({
  "schemaVersion": 1,
  "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85045231616,
                        "computeMajor": 9, "computeMinor": 0, "numSms": 132}],
  "traceEvents": [
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 100, "tid": 101,
     "ts": 1000.5, "dur": 20.25,
     "args": {"External id": 7, "Sequence number": 3, "Fwd thread id": 0,
              "Input Dims": [[8, 4096], [4096, 4096]],
              "Input type": ["c10::BFloat16", "c10::BFloat16"], "Record function id": 0}},
    {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: MmBackward0",
     "pid": 100, "tid": 102, "ts": 2000, "dur": 5, "args": {"External id": 9, "Fwd thread id": 1}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 101,
     "ts": 1005, "dur": 4, "args": {"correlation": 55, "External id": 7, "cbid": 211}},
    {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm", "pid": 0, "tid": 7,
     "ts": 1010.001, "dur": 100.999,
     "args": {"device": 0, "stream": 7, "correlation": 55, "External id": 7,
              "grid": [132, 1, 1], "block": [384, 1, 1], "registers per thread": 168,
              "shared memory": 232448}},
    {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce", "pid": 0, "tid": 20,
     "ts": 1050, "dur": 80, "args": {"device": 0, "stream": 20, "correlation": 56}},
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "pid": 0,
     "tid": 24, "ts": 900, "dur": 10, "args": {"device": 0, "stream": 24, "bytes": 2048}},
    {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": 0, "tid": 7,
     "ts": 950, "dur": 1, "args": {"device": 0, "stream": 7, "bytes": 64}},
    {"ph": "X", "cat": "cuda_sync", "name": "cudaStreamSynchronize", "pid": 100, "tid": 101,
     "ts": 1200, "dur": 30, "args": {}},
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4", "pid": 100, "tid": 101,
     "ts": 990, "dur": 300},
    {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#4", "pid": 0, "tid": 7,
     "ts": 995, "dur": 290, "args": {"device": 0}},
    {"ph": "s", "id": 55, "pid": 100, "tid": 101, "ts": 1005, "cat": "ac2g", "name": "ac2g"},
    {"ph": "f", "id": 55, "pid": 0, "tid": 7, "ts": 1010, "cat": "ac2g", "name": "ac2g", "bp": "e"},
    {"name": "process_name", "ph": "M", "pid": 100, "tid": 0, "args": {"name": "python"}},
    {"name": "thread_name", "ph": "M", "pid": 100, "tid": 101, "args": {"name": "main"}},
    {"ph": "X", "cat": "kernel", "name": "no_time", "pid": 0, "tid": 7},
    {"ph": "X", "cat": "kernel", "name": "bad_ts", "pid": 0, "tid": 7, "ts": {}, "dur": 1},
    {"ph": "X", "cat": "python_function", "name": "f.py(1): g", "pid": 100, "tid": 101,
     "ts": 1, "dur": 1}
  ],
  "distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 4}
})json";

TEST(KinetoParserTest, CurrentSpelling) {
  Trace t;
  ASSERT_TRUE(ParseKinetoJson(kCurrent, 0, &t).ok());
  ASSERT_EQ(t.devices.size(), 1u);
  EXPECT_EQ(t.devices[0].rank, 3);  // distributedInfo after traceEvents still applies
  EXPECT_EQ(t.devices[0].name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(t.devices[0].sm_count, 132);
  EXPECT_EQ(t.devices[0].cc_major, 9);
  EXPECT_EQ(t.devices[0].memory_bytes, 85045231616);

  ASSERT_EQ(t.gpu.size(), 4u);
  const GpuActivity& k = t.gpu[0];
  EXPECT_EQ(t.strings.Get(k.name), "sm90_xmma_gemm");
  EXPECT_EQ(k.start, 1010001);
  EXPECT_EQ(k.end, 1111000);
  EXPECT_EQ(k.stream, 7);
  EXPECT_EQ(k.correlation, 55);
  EXPECT_EQ(k.external_id, 7);
  EXPECT_EQ(k.grid[0], 132);
  EXPECT_EQ(k.block[0], 384);
  EXPECT_EQ(k.registers, 168);
  EXPECT_EQ(k.shared_memory, 232448);
  EXPECT_EQ(t.gpu[1].stream, 20);
  EXPECT_EQ(t.gpu[2].kind, GpuKind::kMemcpy);
  EXPECT_EQ(t.strings.Get(t.gpu[2].copy_kind), "HtoD");
  EXPECT_EQ(t.gpu[2].bytes, 2048);
  EXPECT_EQ(t.gpu[3].kind, GpuKind::kMemset);

  ASSERT_EQ(t.ops.size(), 2u);
  const Operator& mm = t.ops[0];
  EXPECT_EQ(t.strings.Get(mm.name), "aten::mm");
  EXPECT_EQ(mm.start, 1000500);
  EXPECT_EQ(mm.end, 1020750);
  EXPECT_EQ(mm.rank, 3);
  EXPECT_EQ(mm.sequence, 3);
  EXPECT_EQ(mm.pass, Pass::kForward);
  EXPECT_EQ(t.strings.Get(mm.input_shapes), "[[8,4096],[4096,4096]]");
  EXPECT_EQ(t.strings.Get(mm.input_types), "[\"c10::BFloat16\",\"c10::BFloat16\"]");
  EXPECT_EQ(t.ops[1].pass, Pass::kBackward);

  ASSERT_EQ(t.api.size(), 2u);
  EXPECT_EQ(t.api[0].kind, ApiKind::kRuntime);
  EXPECT_EQ(t.api[0].correlation, 55);
  EXPECT_EQ(t.api[1].kind, ApiKind::kSync);
  ASSERT_EQ(t.ranges.size(), 2u);
  EXPECT_EQ(t.ranges[0].domain, RangeDomain::kUser);
  EXPECT_EQ(t.ranges[1].domain, RangeDomain::kGpuUser);
  EXPECT_EQ(t.ranges[1].device_index, 0);
  ASSERT_EQ(t.processes.size(), 1u);
  EXPECT_EQ(t.processes[0].name, "python");
  ASSERT_EQ(t.threads.size(), 1u);

  EXPECT_EQ(t.stats.Get("kineto_flow_events"), 2);
  EXPECT_EQ(t.stats.Get("kineto_missing_time"), 2);  // no ts, and a ts that is no number
  EXPECT_EQ(t.stats.Get("kineto_python_function_events"), 1);
}

// The 2021 format: capitalised categories, "external id", "tid": "stream 7",
// GPU events on pid 0 without args.device, string thread ids.
const char* kLegacy = R"json({
  "schemaVersion": 1,
  "traceEvents": [
    {"ph": "X", "cat": "Operator", "name": "aten::conv2d", "pid": 25738, "tid": "25738",
     "ts": 1623142623460111, "dur": 25, "args": {"Device": 25738, "External id": 2,
     "Input Dims": [[32, 3, 224, 224], [64, 3, 7, 7]]}},
    {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 25738, "tid": "25738",
     "ts": 1623142623460120, "dur": 5, "args": {"cbid": 211, "correlation": 34441,
     "external id": 2}},
    {"ph": "X", "cat": "Kernel", "name": "implicit_convolve_sgemm", "pid": 0, "tid": "stream 7",
     "ts": 1623142623460130, "dur": 40, "args": {"queued": 0, "device": 0, "context": 1,
     "stream": 7, "correlation": 34441, "external id": 2}},
    {"ph": "X", "cat": "Memcpy", "name": "Memcpy DtoH (Device -> Pageable)", "pid": 0,
     "tid": "stream 7", "ts": 1623142623460200, "dur": 3, "args": {"bytes": 4}},
    {"ph": "X", "cat": "Memset", "name": "Memset (Device)", "pid": 0, "tid": "stream 9",
     "ts": 1623142623460210, "dur": 1, "args": {}}
  ]
})json";

TEST(KinetoParserTest, LegacySpelling) {
  Trace t;
  ASSERT_TRUE(ParseKinetoJson(kLegacy, 5, &t).ok());
  ASSERT_EQ(t.devices.size(), 1u);
  EXPECT_EQ(t.devices[0].rank, 5);  // no distributedInfo: the caller's rank
  ASSERT_EQ(t.gpu.size(), 3u);
  EXPECT_EQ(t.gpu[0].external_id, 2);
  EXPECT_EQ(t.gpu[0].start, 1623142623460130000);
  EXPECT_EQ(t.gpu[1].stream, 7);  // from "stream 7", as args has no stream
  EXPECT_EQ(t.strings.Get(t.gpu[1].copy_kind), "DtoH");
  EXPECT_EQ(t.gpu[2].stream, 9);
  EXPECT_EQ(t.gpu[2].kind, GpuKind::kMemset);
  ASSERT_EQ(t.ops.size(), 1u);
  EXPECT_EQ(t.ops[0].tid, 25738);
  EXPECT_EQ(t.ops[0].external_id, 2);
  ASSERT_EQ(t.api.size(), 1u);
  EXPECT_EQ(t.api[0].external_id, 2);
}

TEST(KinetoParserTest, MalformedEventsAreCountedNotFatal) {
  Trace t;
  Status st = ParseKinetoJson(
      R"({"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1, "dur": 1, "args": {"grid": "x"}},
         {"ph": 7}, 12, {"ph": "X", "cat": "kernel", "name": "ok", "ts": 2, "dur": 1}]})",
      0, &t);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(t.gpu.size(), 1u);
  EXPECT_EQ(t.stats.Get("kineto_malformed_event"), 2);
  EXPECT_EQ(t.stats.Get("kineto_non_object_event"), 1);
}

TEST(KinetoParserTest, FlowEventsAreJudgedAsByTheFullParse) {
  // Plain flow events take a shortcut past simdjson; every other spelling must
  // come out exactly as the full parse judges it (figures checked against the
  // build before the shortcut: 8 flow events, 4 malformed, 1 kernel, 1 op).
  Trace t;
  Status st = ParseKinetoJson(R"({"traceEvents": [
    {"ph": "s", "id": 1, "pid": 2, "tid": 3, "ts": 1700000000421.780, "cat": "ac2g", "name": "ac2g"},
    {"ph": "f", "id": 1, "pid": 0, "tid": 24, "ts": 1.5e3, "cat": "ac2g", "name": "ac2g", "bp": "e"},
    { "ph":"t","id":-0 },
    {"ph": "s", "cat": 5},
    {"ph": "s", "ph": "X", "ts": 1, "dur": 2, "cat": "kernel", "name": "k", "pid": 0, "tid": 7},
    {"ph": "s", "ts": tru},
    {"ph": "s", "name": "a\"b"},
    {"ph": "s", "args": {"x": 1}},
    {"ph": "s", "id": 01},
    {"ph": "f", "ts": 12,},
    {"ph": "s", "ph": 5},
    {"ph": "f", "name": "café"},
    {"ph": "s" "id": 1},
    {"ph": "X", "ts": 1, "dur": 2, "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1}
  ]})",
                              0, &t);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(t.stats.Get("kineto_flow_events"), 8);
  EXPECT_EQ(t.stats.Get("kineto_malformed_event"), 4);
  EXPECT_EQ(t.gpu.size(), 1u);
  EXPECT_EQ(t.ops.size(), 1u);
  EXPECT_EQ(t.stats.all().size(), 2u);
}

TEST(KinetoParserTest, TruncatedDocumentIsBadInput) {
  Trace t;
  std::string doc = kCurrent;
  Status st = ParseKinetoJson(doc.substr(0, doc.size() / 2), 0, &t);
  EXPECT_EQ(st.code(), StatusCode::kBadInput);
  EXPECT_TRUE(t.gpu.empty());  // nothing of a failed file reaches the caller's trace
}

}  // namespace
}  // namespace dynaflow

namespace dynaflow {
namespace {

// ROCm lists deviceProperties by the process's visible index (0) while its
// events name the physical device (2), as tracelens_mi300_bert_small does.
TEST(KinetoParserTest, RocmDevicePropertiesMatchThePhysicalIndex) {
  Trace t;
  ASSERT_TRUE(ParseKinetoJson(R"json({
  "deviceProperties": [{"id": 0, "name": "AMD Instinct MI300X VF", "numSms": 304}],
  "traceEvents": [
    {"ph": "X", "cat": "kernel", "name": "Cijk_Alik_Bljk_BBS_BH_MT64x16x64", "pid": 2, "tid": 1,
     "ts": 10, "dur": 5, "args": {"device": 2, "stream": 1, "correlation": 7}}
  ]})json", 0, &t).ok());
  ASSERT_EQ(t.devices.size(), 1u);
  EXPECT_EQ(t.devices[0].device, 2);
  EXPECT_EQ(t.devices[0].name, "AMD Instinct MI300X VF");
  EXPECT_EQ(t.devices[0].sm_count, 304);
}

// With properties of different parts, an unlisted index is left unnamed
// rather than guessed.
TEST(KinetoParserTest, MixedDevicePropertiesAreNotGuessed) {
  Trace t;
  ASSERT_TRUE(ParseKinetoJson(R"json({
  "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132},
                       {"id": 1, "name": "NVIDIA A100-SXM4-40GB", "numSms": 108}],
  "traceEvents": [
    {"ph": "X", "cat": "kernel", "name": "k", "pid": 5, "tid": 1, "ts": 10, "dur": 5,
     "args": {"device": 5, "stream": 1}},
    {"ph": "X", "cat": "kernel", "name": "k", "pid": 1, "tid": 1, "ts": 10, "dur": 5,
     "args": {"device": 1, "stream": 1}}
  ]})json", 0, &t).ok());
  ASSERT_EQ(t.devices.size(), 2u);
  for (const DeviceInfo& d : t.devices) {
    EXPECT_EQ(d.name, d.device == 1 ? "NVIDIA A100-SXM4-40GB" : "") << d.device;
  }
}

// "Concrete Inputs" are kept for the cost model (a convolution's stride).
TEST(KinetoParserTest, KeepsConcreteInputs) {
  Trace t;
  ASSERT_TRUE(ParseKinetoJson(R"json({"traceEvents": [
    {"ph": "X", "cat": "cpu_op", "name": "aten::convolution", "pid": 1, "tid": 1, "ts": 1, "dur": 9,
     "args": {"External id": 3, "Input Dims": [[1, 3, 8, 8], [4, 3, 3, 3]],
              "Concrete Inputs": ["", "", "[2, 2]"]}}
  ]})json", 0, &t).ok());
  ASSERT_EQ(t.ops.size(), 1u);
  EXPECT_EQ(t.strings.Get(t.ops[0].concrete_inputs), R"(["","","[2, 2]"])");
}

// dynaflow's export marks capture-time operators "Graph capture": 1; any
// other value, or none, is an ordinary operator.
TEST(KinetoParserTest, ReadsCaptureTimeOperators) {
  Trace t;
  ASSERT_TRUE(ParseKinetoJson(R"json({"traceEvents": [
    {"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1,
     "args": {"Graph capture": 1}},
    {"ph": "X", "cat": "cpu_op", "name": "b", "pid": 1, "tid": 1, "ts": 2, "dur": 1,
     "args": {"Graph capture": 0}},
    {"ph": "X", "cat": "cpu_op", "name": "c", "pid": 1, "tid": 1, "ts": 3, "dur": 1,
     "args": {"Graph capture": "yes"}},
    {"ph": "X", "cat": "cpu_op", "name": "d", "pid": 1, "tid": 1, "ts": 4, "dur": 1,
     "args": {"Graph capture": [1]}},
    {"ph": "X", "cat": "cpu_op", "name": "e", "pid": 1, "tid": 1, "ts": 5, "dur": 1}
  ]})json", 0, &t).ok());
  ASSERT_EQ(t.ops.size(), 5u);
  std::vector<bool> marked;
  for (const Operator& o : t.ops) marked.push_back(o.in_graph_capture);
  EXPECT_EQ(marked, (std::vector<bool>{true, false, false, false, false}));
}

// Recent Kineto writes ts relative to baseTimeNanoseconds, after the events;
// the importer adds the base to every record, wherever the key stands.
TEST(KinetoParserTest, BaseTimeNanosecondsIsAddedToEveryTime) {
  for (const bool base_first : {false, true}) {
    const std::string base = R"("baseTimeNanoseconds": 1711964646000000000)";
    const std::string events = R"("traceEvents": [
      {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 4458676983543.183,
       "dur": 0.002, "args": {"device": 0, "stream": 7}},
      {"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": 1.5, "dur": 1},
      {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
       "ts": 2, "dur": 1},
      {"ph": "X", "cat": "user_annotation", "name": "r", "pid": 1, "tid": 1, "ts": 0, "dur": 9}])";
    const std::string doc =
        "{" + (base_first ? base + ",\n" + events : events + ",\n" + base) + "}";
    Trace t;
    ASSERT_TRUE(ParseKinetoJson(doc, 0, &t).ok());
    ASSERT_EQ(t.gpu.size(), 1u);
    EXPECT_EQ(t.gpu[0].start, 1711964646000000000 + 4458676983543183);
    EXPECT_EQ(t.gpu[0].end - t.gpu[0].start, 2);
    EXPECT_EQ(t.ops[0].start, 1711964646000001500);
    EXPECT_EQ(t.api[0].end, 1711964646000003000);
    EXPECT_EQ(t.ranges[0].start, 1711964646000000000);
  }
}

TEST(KinetoParserTest, BadBaseTimeIsCountedAndIgnored) {
  for (const char* base : {"1.5e9", "\"12\"", "9000000000000000000"}) {
    Trace t;
    const std::string doc = std::string(R"({"baseTimeNanoseconds": )") + base + R"(,
      "traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1,
                       "ts": 1.5, "dur": 1}]})";
    ASSERT_TRUE(ParseKinetoJson(doc, 0, &t).ok()) << base;
    EXPECT_EQ(t.stats.Get("kineto_bad_base_time"), 1) << base;
    ASSERT_EQ(t.ops.size(), 1u);
    EXPECT_EQ(t.ops[0].start, 1500) << base;
  }
  // A valid base that moves a time beyond +-3e18 ns drops that record.
  Trace t;
  ASSERT_TRUE(ParseKinetoJson(R"({"baseTimeNanoseconds": 2000000000000000000,
      "traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "far", "pid": 1, "tid": 1,
                       "ts": 2000000000000000, "dur": 1},
                      {"ph": "X", "cat": "cpu_op", "name": "near", "pid": 1, "tid": 1,
                       "ts": 1, "dur": 1}]})", 0, &t).ok());
  ASSERT_EQ(t.ops.size(), 1u);
  EXPECT_EQ(t.strings.Get(t.ops[0].name), "near");
  EXPECT_EQ(t.stats.Get("kineto_time_beyond_range"), 1);
}

// Args the export writes back: strides, collective metadata, sync ids, labels.
TEST(KinetoParserTest, KeepsStridesCollectivesSyncIdsAndLabels) {
  Trace t;
  ASSERT_TRUE(ParseKinetoJson(R"json({
  "distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 4},
  "traceEvents": [
    {"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "python3.10"}},
    {"name": "process_labels", "ph": "M", "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 1, "dur": 9,
     "args": {"Input Strides": [[4, 1], []], "Collective name": "allreduce", "Group size": 4}},
    {"ph": "X", "cat": "cuda_sync", "name": "Event Sync", "pid": 0, "tid": -1, "ts": 2,
     "dur": 1, "args": {"cuda_sync_kind": "Event Sync", "wait_on_stream": 20,
     "wait_on_cuda_event_record_corr_id": 32, "wait_on_cuda_event_id": 9, "stream": -1,
     "correlation": 54, "device": 0}}
  ]})json", 0, &t).ok());
  EXPECT_EQ(t.distributed_info.at(3), R"({"backend":"nccl","rank":3,"world_size":4})");
  ASSERT_EQ(t.processes.size(), 1u);
  EXPECT_EQ(t.processes[0].label, "GPU 0");
  ASSERT_EQ(t.ops.size(), 1u);
  EXPECT_EQ(t.strings.Get(t.ops[0].input_strides), "[[4,1],[]]");
  EXPECT_EQ(t.strings.Get(t.ops[0].collective), R"("Collective name":"allreduce","Group size":4)");
  ASSERT_EQ(t.api.size(), 1u);
  EXPECT_EQ(t.api[0].kind, ApiKind::kSync);
  EXPECT_EQ(t.api[0].wait_on_stream, 20);
  EXPECT_EQ(t.api[0].wait_event_correlation, 32);
  EXPECT_EQ(t.api[0].wait_event_id, 9);
  EXPECT_EQ(t.api[0].sync_stream, -1);
  EXPECT_EQ(t.api[0].sync_device, 0);
}

}  // namespace
}  // namespace dynaflow

