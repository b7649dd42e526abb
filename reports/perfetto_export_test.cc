#include "reports/perfetto_export.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "analysis/importers/kineto/kineto_parser.h"

namespace dynaflow {
namespace {

constexpr TimeNs kBase = 1767189312123456789;  // epoch nanoseconds: needs every digit

// A trace of one rank as the tracer records it: a host process with a named
// thread, forward and backward operators, launches, and GPU work on a device.
class TraceBuilder {
 public:
  explicit TraceBuilder(Trace* t, int32_t rank) : t_(*t), rank_(rank) {
    device_ = t_.DeviceIndex(rank, rank);  // device id = rank, as one GPU per rank
    DeviceInfo& d = t_.devices[device_];
    d.name = "NVIDIA H200";
    d.sm_count = 132;
    d.cc_major = 9;
    d.cc_minor = 0;
    d.memory_bytes = 150105227264;
    t_.processes.push_back({rank, 4242, "python3", "", {}});
    t_.threads.push_back({rank, 4242, 4243, "thread 4243 (python3)"});
  }

  Operator& Op(const char* name, TimeNs start, TimeNs end, Pass pass, int64_t sequence,
               const char* module, int64_t external_id) {
    Operator o;
    o.rank = rank_;
    o.pid = 4242;
    o.tid = 4243;
    o.start = kBase + start;
    o.end = kBase + end;
    o.name = t_.strings.Intern(name);
    o.pass = pass;
    o.sequence = sequence;
    o.module_path = t_.strings.Intern(module);
    o.external_id = external_id;
    o.input_shapes = t_.strings.Intern("[[8,4096],[4096,4096]]");
    o.input_types = t_.strings.Intern(R"(["c10::BFloat16","c10::BFloat16"])");
    return t_.ops.emplace_back(o);
  }

  void Api(ApiKind kind, const char* name, TimeNs start, TimeNs end, int64_t correlation,
           int64_t external_id) {
    ApiCall a;
    a.rank = rank_;
    a.pid = 4242;
    a.tid = 4243;
    a.kind = kind;
    a.name = t_.strings.Intern(name);
    a.start = kBase + start;
    a.end = kBase + end;
    a.correlation = correlation;
    a.external_id = external_id;
    t_.api.push_back(a);
  }

  GpuActivity& Gpu(GpuKind kind, const char* name, TimeNs start, TimeNs end, int64_t correlation,
                   int64_t external_id) {
    GpuActivity g;
    g.kind = kind;
    g.device_index = device_;
    g.stream = 7;
    g.name = t_.strings.Intern(name);
    g.start = kBase + start;
    g.end = kBase + end;
    g.correlation = correlation;
    g.external_id = external_id;
    return t_.gpu.emplace_back(g);
  }

  void Range(RangeDomain domain, const char* name, TimeNs start, TimeNs end) {
    dynaflow::Range r;
    r.rank = rank_;
    r.domain = domain;
    r.name = t_.strings.Intern(name);
    r.start = kBase + start;
    r.end = kBase + end;
    r.pid = 4242;
    r.tid = 4243;
    if (domain == RangeDomain::kGpuUser) {
      r.device_index = static_cast<int32_t>(device_);
      r.pid = t_.devices[device_].device;
      r.tid = 7;
    }
    t_.ranges.push_back(r);
  }

 private:
  Trace& t_;
  int32_t rank_;
  uint32_t device_;
};

void FillRank(Trace* t, int32_t rank) {
  TraceBuilder b(t, rank);
  b.Range(RangeDomain::kUser, "ProfilerStep#3", 0, 9000);
  b.Op("aten::linear", 100, 2000, Pass::kForward, 12, "Llama.layers.0.mlp.up", 1);
  b.Op("aten::mm", 150, 1900, Pass::kForward, 13, "Llama.layers.0.mlp.up", 2);
  b.Op("autograd::engine::evaluate_function: MmBackward0", 3000, 5000, Pass::kBackward, 13, "", 3);
  b.Op("aten::add_", 6000, 6500, Pass::kUnknown, -1, "", 4);
  t->ops[1].in_graph_capture = true;  // aten::mm, captured into a CUDA graph
  b.Api(ApiKind::kRuntime, "cudaLaunchKernel", 200, 260, 901, 2);
  b.Api(ApiKind::kDriver, "cuLaunchKernelEx", 3100, 3160, 902, 3);
  b.Api(ApiKind::kRuntime, "cudaMemcpyAsync", 6100, 6150, 903, 4);
  b.Api(ApiKind::kSync, "cudaStreamSynchronize", 6200, 8000, 904, -1);
  GpuActivity& k =
      b.Gpu(GpuKind::kKernel, "sm90_xmma_gemm_bf16 \"quoted\\\" <<<>>>\n\ttabs", 300, 1800, 901, 2);
  k.grid[0] = 132;
  k.block[0] = 256;
  k.block[1] = 2;
  k.registers = 168;
  k.shared_memory = 232448;
  b.Gpu(GpuKind::kKernel, "backward_kernel_\xc3\xa9", 3200, 4800, 902, 3);
  GpuActivity& m = b.Gpu(GpuKind::kMemcpy, "Memcpy HtoD (Pinned -> Device)", 6300, 7300, 903, 4);
  m.bytes = 1 << 20;
  m.copy_kind = t->strings.Intern("HtoD");
  GpuActivity& s = b.Gpu(GpuKind::kMemset, "Memset (Device)", 7400, 7500, -1, -1);
  s.bytes = 4096;
  b.Range(RangeDomain::kGpuUser, "ProfilerStep#3", 300, 7500);
}

Trace RoundTrip(const Trace& t, int32_t rank) {
  std::ostringstream out;
  WritePerfettoJson(t, rank, out);
  Trace back;
  const Status st = ParseKinetoJson(out.str(), /*default_rank=*/99, &back);
  EXPECT_TRUE(st.ok()) << st.message();
  return back;
}

std::string S(const Trace& t, StringId id) { return std::string(t.strings.Get(id)); }

TEST(PerfettoExportTest, KinetoImporterGetsEveryEventBack) {
  Trace t;
  FillRank(&t, 0);
  Trace back = RoundTrip(t, 0);

  ASSERT_EQ(back.ops.size(), t.ops.size());
  for (size_t i = 0; i < t.ops.size(); ++i) {
    const Operator& a = t.ops[i];
    const Operator& b = back.ops[i];
    EXPECT_EQ(S(back, b.name), S(t, a.name));
    EXPECT_EQ(b.start, a.start);
    EXPECT_EQ(b.end, a.end);
    EXPECT_EQ(b.rank, a.rank);
    EXPECT_EQ(b.pid, a.pid);
    EXPECT_EQ(b.tid, a.tid);
    EXPECT_EQ(b.external_id, a.external_id);
    EXPECT_EQ(b.sequence, a.sequence);
    EXPECT_EQ(S(back, b.input_shapes), S(t, a.input_shapes));
    EXPECT_EQ(S(back, b.input_types), S(t, a.input_types));
    EXPECT_EQ(S(back, b.module_path), S(t, a.module_path));
    EXPECT_EQ(b.pass, a.pass) << S(t, a.name);
    EXPECT_EQ(b.in_graph_capture, a.in_graph_capture) << S(t, a.name);
  }
  EXPECT_TRUE(back.ops[1].in_graph_capture);

  ASSERT_EQ(back.api.size(), t.api.size());
  for (size_t i = 0; i < t.api.size(); ++i) {
    const ApiCall& a = t.api[i];
    const ApiCall& b = back.api[i];
    EXPECT_EQ(S(back, b.name), S(t, a.name));
    EXPECT_EQ(b.kind, a.kind);
    EXPECT_EQ(b.start, a.start);
    EXPECT_EQ(b.end, a.end);
    EXPECT_EQ(b.pid, a.pid);
    EXPECT_EQ(b.tid, a.tid);
    EXPECT_EQ(b.correlation, a.correlation);
    EXPECT_EQ(b.external_id, a.external_id);
  }

  ASSERT_EQ(back.gpu.size(), t.gpu.size());
  for (size_t i = 0; i < t.gpu.size(); ++i) {
    const GpuActivity& a = t.gpu[i];
    const GpuActivity& b = back.gpu[i];
    EXPECT_EQ(S(back, b.name), S(t, a.name));
    EXPECT_EQ(b.kind, a.kind);
    EXPECT_EQ(b.start, a.start);
    EXPECT_EQ(b.end, a.end);
    EXPECT_EQ(back.devices[b.device_index].device, t.devices[a.device_index].device);
    EXPECT_EQ(b.stream, a.stream);
    EXPECT_EQ(b.correlation, a.correlation);
    EXPECT_EQ(b.external_id, a.external_id);
    EXPECT_EQ(b.bytes, a.bytes);
    EXPECT_EQ(S(back, b.copy_kind), S(t, a.copy_kind));
    for (int d = 0; d < 3; ++d) {
      EXPECT_EQ(b.grid[d], a.grid[d]);
      EXPECT_EQ(b.block[d], a.block[d]);
    }
    EXPECT_EQ(b.registers, a.registers);
    EXPECT_EQ(b.shared_memory, a.shared_memory);
  }

  ASSERT_EQ(back.ranges.size(), t.ranges.size());
  for (size_t i = 0; i < t.ranges.size(); ++i) {
    const Range& a = t.ranges[i];
    const Range& b = back.ranges[i];
    EXPECT_EQ(S(back, b.name), S(t, a.name));
    EXPECT_EQ(b.domain, a.domain);
    EXPECT_EQ(b.start, a.start);
    EXPECT_EQ(b.end, a.end);
    EXPECT_EQ(b.pid, a.pid);
    EXPECT_EQ(b.tid, a.tid);
    EXPECT_EQ(b.device_index >= 0, a.device_index >= 0);
  }

  ASSERT_EQ(back.devices.size(), 1u);
  EXPECT_EQ(back.devices[0].name, "NVIDIA H200");
  EXPECT_EQ(back.devices[0].sm_count, 132);
  EXPECT_EQ(back.devices[0].cc_major, 9);
  EXPECT_EQ(back.devices[0].memory_bytes, 150105227264);
  // The importer also keeps the names of the device "processes" and streams.
  EXPECT_EQ(back.processes[0].pid, 4242);
  EXPECT_EQ(back.processes[0].name, "python3");
  EXPECT_EQ(back.threads[0].name, "thread 4243 (python3)");
  EXPECT_EQ(back.stats.Get("kineto_malformed_event"), 0);
  EXPECT_EQ(back.stats.Get("kineto_flow_events"), 6);  // s and f for three launches
}

TEST(PerfettoExportTest, EachRankIsOneDocumentThatNamesItsRank) {
  Trace t;
  FillRank(&t, 0);
  FillRank(&t, 1);
  ASSERT_EQ(TraceRanks(t), (std::vector<int32_t>{0, 1}));
  for (int32_t rank : {0, 1}) {
    Trace back = RoundTrip(t, rank);
    EXPECT_EQ(back.ops.size(), t.ops.size() / 2);
    EXPECT_EQ(back.gpu.size(), t.gpu.size() / 2);
    ASSERT_FALSE(back.ops.empty());
    EXPECT_EQ(back.ops[0].rank, rank);
    ASSERT_EQ(back.devices.size(), 1u);
    EXPECT_EQ(back.devices[0].rank, rank);
    EXPECT_EQ(back.devices[0].device, rank);
  }
}

TEST(PerfettoExportTest, TimesAreExactMicrosecondsAndNamesAreValidJson) {
  Trace t;
  const uint32_t d = t.DeviceIndex(0, 0);
  GpuActivity g;
  g.device_index = d;
  g.start = kBase;
  g.end = kBase + 1;
  g.name = t.strings.Intern("bad\xff utf8 \x01");
  t.gpu.push_back(g);
  Operator o;
  o.start = -1500;
  o.end = 7;
  o.name = t.strings.Intern("negative");
  o.input_shapes = t.strings.Intern("[[1,2");  // not JSON: left out
  t.ops.push_back(o);

  std::ostringstream out;
  WritePerfettoJson(t, 0, out);
  const nlohmann::json j = nlohmann::json::parse(out.str());  // throws when invalid
  const std::string text = out.str();
  // The base is the earliest time (-1500 ns) rounded down to a whole second.
  EXPECT_EQ(j["baseTimeNanoseconds"], -1000000000);
  EXPECT_NE(text.find("\"ts\":1767189313123456.789,\"dur\":0.001"), std::string::npos);
  EXPECT_NE(text.find("\"ts\":999998.500,\"dur\":1.507"), std::string::npos);
  EXPECT_EQ(text.find("Input Dims"), std::string::npos);
  Trace back = RoundTrip(t, 0);
  ASSERT_EQ(back.gpu.size(), 1u);
  EXPECT_EQ(S(back, back.gpu[0].name), "bad\xef\xbf\xbd utf8 \x01");
  EXPECT_EQ(back.gpu[0].end - back.gpu[0].start, 1);
  ASSERT_EQ(back.ops.size(), 1u);
  EXPECT_EQ(back.ops[0].start, -1500);
}

TEST(PerfettoExportTest, TimesAreRelativeToASharedWholeSecondBase) {
  Trace t;
  FillRank(&t, 0);
  FillRank(&t, 1);
  EXPECT_EQ(ExportBaseTimeNs(t), 1767189312000000000);
  std::ostringstream out;
  WritePerfettoJson(t, 1, out);
  const nlohmann::json j = nlohmann::json::parse(out.str());
  EXPECT_EQ(j["baseTimeNanoseconds"], 1767189312000000000);
  // kBase + 100 ns: 123456.789 us + 0.100 us past the base, every digit kept.
  EXPECT_NE(out.str().find("\"ts\":123456.889,\"dur\":1.900"), std::string::npos);
  EXPECT_EQ(ExportBaseTimeNs(Trace()), 0);
}

// pid 0 is both the device and, in Kineto files, a named process: one name,
// one label ("GPU 0") and one sort index, never "CPU".
TEST(PerfettoExportTest, OneLabelPerPid) {
  Trace t;
  FillRank(&t, 0);  // device 0; host process 4242
  t.processes.push_back({0, 0, "python3", "GPU 0", {}});
  t.processes.push_back({0, 0, "python3", "", {}});  // named twice, no label
  t.threads.push_back({0, 0, 7, "stream 7 "});
  std::ostringstream out;
  WritePerfettoJson(t, 0, out);
  const nlohmann::json j = nlohmann::json::parse(out.str());
  std::map<std::pair<int64_t, std::string>, std::vector<std::string>> meta;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] != "M") continue;
    const auto& args = e["args"];
    std::string value = args.contains("labels") ? args["labels"].get<std::string>()
                        : args.contains("name") ? args["name"].get<std::string>()
                                                : std::to_string(args["sort_index"].get<int64_t>());
    if (e["name"].get<std::string>().rfind("process", 0) == 0) {
      meta[{e["pid"].get<int64_t>(), e["name"]}].push_back(value);
    }
  }
  using V = std::vector<std::string>;
  EXPECT_EQ((meta[{0, "process_labels"}]), V{"GPU 0"});
  EXPECT_EQ((meta[{0, "process_name"}]), V{"python3"});
  EXPECT_EQ((meta[{0, "process_sort_index"}]), V{"16777216"});
  EXPECT_EQ((meta[{4242, "process_labels"}]), V{"CPU"});
  EXPECT_EQ((meta[{4242, "process_name"}]), V{"python3"});
  Trace back = RoundTrip(t, 0);
  ASSERT_EQ(back.processes.size(), 2u);
  EXPECT_EQ(back.processes[0].label, "GPU 0");
  EXPECT_EQ(back.processes[1].label, "CPU");
}

// A Kineto file with what the model keeps beyond the store: sync records
// and their flows, strides, concrete inputs, collective metadata,
// distributedInfo and deviceProperties; the export gives all of it back.
TEST(PerfettoExportTest, KinetoFieldsSurviveExportAndImport) {
  const std::string kinetoJson = R"({
  "schemaVersion": 1,
  "deviceProperties": [{"id": 0, "name": "NVIDIA A100", "totalGlobalMem": 42297524224,
     "computeMajor": 8, "computeMinor": 0, "maxThreadsPerBlock": 1024, "numSms": 108,
     "regsPerBlock": 65536}],
  "distributedInfo": {"backend": "nccl", "rank": 1, "world_size": 2,
     "pg_config": [{"pg_name": "0", "ranks": [0, 1]}], "nccl_version": "2.17.1"},
  "traceEvents": [
    {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 9, "tid": 9,
     "ts": 10.5, "dur": 3, "args": {"External id": 7, "Collective name": "allreduce",
     "In msg nelems": 4096, "Group size": 2, "dtype": "Float",
     "Process Group Ranks": "[0, 1]", "Input Strides": [[4096, 1], []],
     "Concrete Inputs": ["", "2"]}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 9, "tid": 9,
     "ts": 11, "dur": 1, "args": {"External id": 7, "correlation": 40}},
    {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce", "pid": 0, "tid": 40,
     "ts": 12.001, "dur": 2.002, "args": {"External id": 7, "device": 0, "stream": 40,
     "correlation": 40, "Collective name": "allreduce", "Out msg nelems": 4096,
     "In split size": "[]", "Process Group Name": "0"}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamWaitEvent", "pid": 9, "tid": 9,
     "ts": 20, "dur": 1, "args": {"External id": 8, "correlation": 41}},
    {"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": 24,
     "ts": 20.5, "dur": 0.25, "args": {"External id": 8, "cuda_sync_kind": "Stream Wait Event",
     "wait_on_stream": 40, "wait_on_cuda_event_record_corr_id": 39,
     "wait_on_cuda_event_id": 19, "stream": 24, "correlation": 41, "device": 0}}
  ],
  "baseTimeNanoseconds": 1711964646000000000
})";
  Trace t;
  ASSERT_TRUE(ParseKinetoJson(kinetoJson, 0, &t).ok());
  ASSERT_EQ(t.ops.size(), 1u);
  EXPECT_EQ(t.ops[0].start, 1711964646000010500);  // base honoured
  EXPECT_EQ(S(t, t.ops[0].input_strides), "[[4096,1],[]]");
  EXPECT_EQ(S(t, t.ops[0].concrete_inputs), R"(["","2"])");
  EXPECT_EQ(S(t, t.ops[0].collective),
            R"("Collective name":"allreduce","In msg nelems":4096,"Group size":2,)"
            R"("dtype":"Float","Process Group Ranks":"[0, 1]")");
  ASSERT_EQ(t.api.size(), 3u);
  EXPECT_EQ(t.api[2].wait_on_stream, 40);
  EXPECT_EQ(t.api[2].wait_event_id, 19);
  EXPECT_EQ(t.api[2].wait_event_correlation, 39);
  EXPECT_EQ(t.api[2].sync_stream, 24);
  EXPECT_EQ(t.api[2].sync_device, 0);

  std::ostringstream out;
  WritePerfettoJson(t, 1, out);
  const std::string text = out.str();
  const nlohmann::json j = nlohmann::json::parse(text);
  // HTA finds the rank with the regex "rank":\s+(\d+).
  EXPECT_NE(text.find(R"("distributedInfo":{"backend": "nccl", "rank": 1, "world_size": 2,)"),
            std::string::npos);
  EXPECT_EQ(j["distributedInfo"]["pg_config"][0]["ranks"], nlohmann::json({0, 1}));
  EXPECT_EQ(j["deviceProperties"][0]["maxThreadsPerBlock"], 1024);
  EXPECT_EQ(j["deviceProperties"][0]["regsPerBlock"], 65536);
  EXPECT_EQ(j["baseTimeNanoseconds"], 1711964646000000000);
  int flows_to_sync = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "f" && e["pid"] == 0 && e["tid"] == 24) ++flows_to_sync;
    if (e["ph"] == "X" && e["cat"] == "kernel") {
      EXPECT_EQ(e["args"]["Collective name"], "allreduce");
      EXPECT_EQ(e["args"]["Process Group Name"], "0");
    }
  }
  EXPECT_EQ(flows_to_sync, 1);

  Trace back;
  ASSERT_TRUE(ParseKinetoJson(text, 0, &back).ok());
  ASSERT_EQ(back.ops.size(), 1u);
  EXPECT_EQ(back.ops[0].rank, 1);
  EXPECT_EQ(back.ops[0].start, t.ops[0].start);
  EXPECT_EQ(S(back, back.ops[0].input_strides), S(t, t.ops[0].input_strides));
  EXPECT_EQ(S(back, back.ops[0].concrete_inputs), S(t, t.ops[0].concrete_inputs));
  EXPECT_EQ(S(back, back.ops[0].collective), S(t, t.ops[0].collective));
  ASSERT_EQ(back.gpu.size(), 1u);
  EXPECT_EQ(back.gpu[0].start, t.gpu[0].start);
  EXPECT_EQ(back.gpu[0].end - back.gpu[0].start, 2002);
  EXPECT_EQ(S(back, back.gpu[0].collective), S(t, t.gpu[0].collective));
  ASSERT_EQ(back.api.size(), 3u);
  const ApiCall& a = t.api[2];
  const ApiCall& b = back.api[2];
  EXPECT_EQ(b.kind, ApiKind::kSync);
  EXPECT_EQ(b.start, a.start);
  EXPECT_EQ(b.end, a.end);
  EXPECT_EQ(b.pid, a.pid);
  EXPECT_EQ(b.tid, a.tid);
  EXPECT_EQ(b.correlation, a.correlation);
  EXPECT_EQ(b.wait_on_stream, a.wait_on_stream);
  EXPECT_EQ(b.wait_event_id, a.wait_event_id);
  EXPECT_EQ(b.wait_event_correlation, a.wait_event_correlation);
  EXPECT_EQ(b.sync_stream, a.sync_stream);
  EXPECT_EQ(b.sync_device, a.sync_device);
  EXPECT_EQ(back.distributed_info.at(1), t.distributed_info.at(1));
  EXPECT_EQ(back.devices[0].properties_json, t.devices[0].properties_json);
  EXPECT_EQ(back.stats.Get("kineto_flow_events"), 4);  // launch -> kernel, wait -> sync
}

// fwdbwd flows as Kineto draws them: from the innermost forward operator of a
// sequence number to its backward operator (not the evaluate_function wrapper).
TEST(PerfettoExportTest, ForwardBackwardFlowsFollowSequenceNumbers) {
  Trace t;
  TraceBuilder b(&t, 0);
  b.Op("aten::linear", 0, 50, Pass::kForward, 5, "", 1);
  b.Op("aten::mm", 10, 40, Pass::kForward, 5, "", 2);
  b.Op("autograd::engine::evaluate_function: MmBackward0", 100, 200, Pass::kBackward, 5, "", 3);
  b.Op("MmBackward0", 110, 190, Pass::kBackward, 5, "", 4);
  b.Op("aten::relu", 60, 70, Pass::kForward, 6, "", 5);  // no backward: no flow
  std::ostringstream out;
  WritePerfettoJson(t, 0, out);
  const nlohmann::json j = nlohmann::json::parse(out.str());
  std::vector<nlohmann::json> flows;
  for (const auto& e : j["traceEvents"]) {
    if (e.value("cat", "") == "fwdbwd") flows.push_back(e);
  }
  ASSERT_EQ(flows.size(), 2u);
  EXPECT_EQ(flows[0]["ph"], "s");
  EXPECT_EQ(flows[1]["ph"], "f");
  EXPECT_EQ(flows[0]["id"], flows[1]["id"]);
  // kBase is 123456.789 us past the whole-second base.
  EXPECT_DOUBLE_EQ(flows[0]["ts"].get<double>(), 123456.799);  // aten::mm
  EXPECT_DOUBLE_EQ(flows[1]["ts"].get<double>(), 123456.899);  // MmBackward0
}

TEST(PerfettoExportTest, StreamWaitEventIsAFlowFromStreamToStream) {
  Trace t;
  TraceBuilder b(&t, 2);
  b.Gpu(GpuKind::kKernel, "producer", 100, 500, 30, -1);  // stream 7, before the record (31)
  b.Gpu(GpuKind::kKernel, "consumer", 600, 700, 33, -1).stream = 8;  // after the wait (32)
  b.Api(ApiKind::kSync, "cudaStreamWaitEvent", 50, 60, 32, -1);
  ApiCall& wait = t.api.back();
  wait.sync_device = 2;
  wait.sync_stream = 8;
  wait.wait_on_stream = 7;
  wait.wait_event_id = 4;
  wait.wait_event_correlation = 31;
  std::ostringstream out;
  WritePerfettoJson(t, 2, out);
  const nlohmann::json j = nlohmann::json::parse(out.str());
  std::vector<nlohmann::json> flows;
  nlohmann::json sync;
  for (const auto& e : j["traceEvents"]) {
    if (e.value("cat", "") == "cuda_stream_wait") flows.push_back(e);
    if (e.value("cat", "") == "cuda_sync") sync = e;
  }
  ASSERT_EQ(flows.size(), 2u);
  EXPECT_EQ(flows[0]["ph"], "s");
  EXPECT_EQ(flows[0]["id"], 32);
  EXPECT_EQ(flows[0]["pid"], 2);  // the device
  EXPECT_EQ(flows[0]["tid"], 7);  // the recorded stream
  EXPECT_DOUBLE_EQ(flows[0]["ts"].get<double>(), 123456.889);  // producer's start
  EXPECT_EQ(flows[1]["ph"], "f");
  EXPECT_EQ(flows[1]["id"], 32);
  EXPECT_EQ(flows[1]["tid"], 8);  // the waiting stream
  EXPECT_EQ(flows[1]["bp"], "e");
  EXPECT_DOUBLE_EQ(flows[1]["ts"].get<double>(), 123457.389);  // consumer's start
  ASSERT_TRUE(sync.is_object());
  EXPECT_EQ(sync["args"]["wait_on_stream"], 7);
  EXPECT_EQ(sync["args"]["wait_on_cuda_event_record_corr_id"], 31);
  EXPECT_EQ(sync["args"]["wait_on_cuda_event_id"], 4);
  EXPECT_EQ(sync["args"]["stream"], 8);
  EXPECT_EQ(sync["args"]["device"], 2);

  const Trace back = RoundTrip(t, 2);  // the Kineto importer reads the same fields
  ASSERT_EQ(back.api.size(), 1u);
  EXPECT_EQ(back.api[0].wait_on_stream, 7);
  EXPECT_EQ(back.api[0].wait_event_correlation, 31);
  EXPECT_EQ(back.api[0].wait_event_id, 4);
  EXPECT_EQ(back.api[0].sync_stream, 8);
  EXPECT_EQ(back.api[0].sync_device, 2);
}

TEST(PerfettoExportTest, CollectiveMetadataOfAnOperatorIsInItsArgs) {
  Trace t;
  TraceBuilder b(&t, 0);
  b.Op("record_param_comms", 0, 50, Pass::kForward, -1, "", 1).collective = t.strings.Intern(
      R"("Collective name":"allreduce","Process Group Name":"0","In msg nelems":1024,)"
      R"("Out msg nelems":1024,"dtype":"Float","Group size":2)");
  std::ostringstream out;
  WritePerfettoJson(t, 0, out);
  const nlohmann::json j = nlohmann::json::parse(out.str());
  nlohmann::json op;
  for (const auto& e : j["traceEvents"]) {
    if (e.value("cat", "") == "cpu_op") op = e;
  }
  ASSERT_TRUE(op.is_object());
  EXPECT_EQ(op["args"]["Collective name"], "allreduce");
  EXPECT_EQ(op["args"]["Process Group Name"], "0");
  EXPECT_EQ(op["args"]["In msg nelems"], 1024);
  EXPECT_EQ(op["args"]["Group size"], 2);
}

}  // namespace
}  // namespace dynaflow
