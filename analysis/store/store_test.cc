#include "analysis/store/store.h"

#include <SQLiteCpp/SQLiteCpp.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "schemas/trace_sql.h"
#include "tests/temp_path.h"

namespace dynaflow {
namespace {

Trace SampleTrace() {
  Trace t;
  uint32_t d = t.DeviceIndex(1, 2);
  t.devices[d].name = "NVIDIA H200";
  t.devices[d].sm_count = 132;
  t.devices[d].cc_major = 9;
  t.devices[d].memory_bandwidth_gbps = 4800;
  t.devices[d].peak_tflops_bf16 = 989;
  GpuActivity k;
  k.device_index = d;
  k.stream = 7;
  k.start = 1000;
  k.end = 5000;
  k.name = t.strings.Intern("sm90_gemm");
  k.correlation = 11;
  k.external_id = 3;
  k.grid[0] = 132;
  k.block[0] = 256;
  k.registers = 168;
  k.shared_memory = 65536;
  k.graph_id = 4;
  k.pid = 10;
  k.collective = t.strings.Intern("\"Collective name\":\"allreduce\",\"Group size\":2");
  t.gpu.push_back(k);
  GpuActivity c;
  c.kind = GpuKind::kMemcpy;
  c.device_index = d;
  c.start = 6000;
  c.end = 7000;
  c.name = t.strings.Intern("Memcpy HtoD");
  c.copy_kind = t.strings.Intern("HtoD");
  c.bytes = 4096;
  c.graph_id = 4;  // a copy node of the kernel's graph
  c.graph_node = 17;
  c.pid = 10;
  t.gpu.push_back(c);
  GpuActivity m;
  m.kind = GpuKind::kMemset;
  m.device_index = d;
  m.start = 7000;
  m.end = 7100;
  m.name = t.strings.Intern("Memset");
  m.bytes = 64;
  t.gpu.push_back(m);
  ApiCall a;
  a.rank = 1;
  a.pid = 10;
  a.tid = 11;
  a.start = 500;
  a.end = 900;
  a.correlation = 11;
  a.name = t.strings.Intern("cudaLaunchKernel");
  a.kind = ApiKind::kDriver;
  t.api.push_back(a);
  Operator o;
  o.rank = 1;
  o.pid = 10;
  o.tid = 11;
  o.start = 400;
  o.end = 950;
  o.external_id = 3;
  o.sequence = 42;
  o.pass = Pass::kBackward;
  o.name = t.strings.Intern("aten::mm");
  o.input_shapes = t.strings.Intern("[[8,4096],[4096,4096]]");
  o.input_types = t.strings.Intern("[\"c10::BFloat16\",\"c10::BFloat16\"]");
  o.module_path = t.strings.Intern("model.layers.0.mlp");
  o.concrete_inputs = t.strings.Intern("[\"\",\"\"]");
  o.input_strides = t.strings.Intern("[[4096,1],[4096,1]]");
  o.in_graph_capture = true;
  t.ops.push_back(o);
  Operator comms = o;
  comms.in_graph_capture = false;
  comms.external_id = 4;
  comms.name = t.strings.Intern("record_param_comms");
  comms.collective =
      t.strings.Intern("\"Collective name\":\"allreduce\",\"In msg nelems\":1024");
  t.ops.push_back(comms);
  ApiCall wait;  // cudaStreamWaitEvent on stream 8 for event 5, recorded on stream 7
  wait.rank = 1;
  wait.pid = 10;
  wait.tid = 11;
  wait.start = 950;
  wait.end = 960;
  wait.correlation = 12;
  wait.name = t.strings.Intern("cudaStreamWaitEvent");
  wait.kind = ApiKind::kSync;
  wait.sync_device = 2;
  wait.sync_stream = 8;
  wait.wait_on_stream = 7;
  wait.wait_event_id = 5;
  wait.wait_event_correlation = 11;
  t.api.push_back(wait);
  Range r;
  r.rank = 1;
  r.device_index = static_cast<int32_t>(d);
  r.domain = RangeDomain::kGpuUser;
  r.start = 0;
  r.end = 8000;
  r.name = t.strings.Intern("ProfilerStep#1");
  t.ranges.push_back(r);
  t.processes.push_back({1, 10, "python", "CPU", {{"rank", "1"}, {"cupti", "enabled"}}});
  t.threads.push_back({1, 10, 11, "main"});
  t.threads.push_back({1, 10, 11, "pt_autograd_0"});  // renamed: both names are kept
  t.devices[d].properties_json = R"({"id":2,"name":"NVIDIA H200","numSms":132})";
  t.distributed_info[1] = R"({"backend":"nccl","rank":1,"world_size":2})";
  t.stats.Add("kineto_malformed_event", "data_loss", "bad events", 3);
  t.metadata["format"] = "kineto";
  return t;
}

TEST(StoreTest, RoundTripKeepsEveryRecord) {
  const std::string path = TempPath("store-roundtrip.db");
  Trace in = SampleTrace();
  ASSERT_TRUE(WriteTraceDb(in, path).ok());
  Trace out;
  Status st = ReadTraceDb(path, &out);
  ASSERT_TRUE(st.ok()) << st.message();

  ASSERT_EQ(out.devices.size(), 1u);
  EXPECT_EQ(out.devices[0].rank, 1);
  EXPECT_EQ(out.devices[0].device, 2);
  EXPECT_EQ(out.devices[0].name, "NVIDIA H200");
  EXPECT_EQ(out.devices[0].sm_count, 132);
  EXPECT_DOUBLE_EQ(out.devices[0].peak_tflops_bf16, 989);
  ASSERT_EQ(out.gpu.size(), 3u);
  const GpuActivity& k = out.gpu[0];
  EXPECT_EQ(out.strings.Get(k.name), "sm90_gemm");
  EXPECT_EQ(k.start, 1000);
  EXPECT_EQ(k.end, 5000);
  EXPECT_EQ(k.stream, 7);
  EXPECT_EQ(k.correlation, 11);
  EXPECT_EQ(k.external_id, 3);
  EXPECT_EQ(k.grid[0], 132);
  EXPECT_EQ(k.block[0], 256);
  EXPECT_EQ(k.registers, 168);
  EXPECT_EQ(k.shared_memory, 65536);
  EXPECT_EQ(k.graph_id, 4);
  EXPECT_EQ(k.graph_node, -1);
  EXPECT_EQ(out.gpu[1].kind, GpuKind::kMemcpy);
  EXPECT_EQ(out.strings.Get(out.gpu[1].copy_kind), "HtoD");
  EXPECT_EQ(out.gpu[1].bytes, 4096);
  EXPECT_EQ(out.gpu[1].correlation, -1);
  EXPECT_EQ(out.gpu[1].graph_id, 4);
  EXPECT_EQ(out.gpu[1].graph_node, 17);
  EXPECT_EQ(out.gpu[2].graph_id, -1);
  EXPECT_EQ(out.gpu[2].kind, GpuKind::kMemset);
  ASSERT_EQ(out.api.size(), 2u);
  EXPECT_EQ(out.api[0].kind, ApiKind::kDriver);
  EXPECT_EQ(out.api[0].tid, 11);
  ASSERT_EQ(out.ops.size(), 2u);
  EXPECT_EQ(out.ops[0].pass, Pass::kBackward);
  EXPECT_EQ(out.ops[0].sequence, 42);
  EXPECT_EQ(out.strings.Get(out.ops[0].input_shapes), "[[8,4096],[4096,4096]]");
  EXPECT_EQ(out.strings.Get(out.ops[0].module_path), "model.layers.0.mlp");
  ASSERT_EQ(out.ranges.size(), 1u);
  EXPECT_EQ(out.ranges[0].device_index, 0);
  EXPECT_EQ(out.ranges[0].domain, RangeDomain::kGpuUser);
  ASSERT_EQ(out.processes.size(), 1u);
  ASSERT_EQ(out.threads.size(), 2u);
  EXPECT_EQ(out.threads[0].name, "main");
  EXPECT_EQ(out.threads[1].name, "pt_autograd_0");
  EXPECT_EQ(out.stats.Get("kineto_malformed_event"), 3);
  EXPECT_EQ(out.metadata["format"], "kineto");
  std::filesystem::remove(path);
}

TEST(StoreTest, RoundTripKeepsSynchronizationIdsAndCollectiveMetadata) {
  const std::string path = TempPath("store-sync.db");
  ASSERT_TRUE(WriteTraceDb(SampleTrace(), path).ok());
  Trace out;
  ASSERT_TRUE(ReadTraceDb(path, &out).ok());
  ASSERT_EQ(out.api.size(), 2u);
  EXPECT_EQ(out.api[0].sync_stream, -1);  // a launch: NULL, read as not known
  EXPECT_EQ(out.api[0].wait_event_correlation, -1);
  const ApiCall& wait = out.api[1];
  EXPECT_EQ(wait.kind, ApiKind::kSync);
  EXPECT_EQ(wait.sync_device, 2);
  EXPECT_EQ(wait.sync_stream, 8);
  EXPECT_EQ(wait.wait_on_stream, 7);
  EXPECT_EQ(wait.wait_event_id, 5);
  EXPECT_EQ(wait.wait_event_correlation, 11);
  ASSERT_EQ(out.ops.size(), 2u);
  EXPECT_EQ(out.strings.Get(out.ops[0].collective), "");
  EXPECT_EQ(out.strings.Get(out.ops[1].collective),
            "\"Collective name\":\"allreduce\",\"In msg nelems\":1024");
  std::filesystem::remove(path);
}

// What version 3 added for an export from the store to equal one from the
// imported file (trace.sql): device properties, process labels and metadata,
// distributedInfo, operators' concrete inputs and strides, the kernel's
// collective metadata and the launching pid of GPU rows.
TEST(StoreTest, RoundTripKeepsWhatTheImportedFileCarried) {
  const std::string path = TempPath("store-v3.db");
  ASSERT_TRUE(WriteTraceDb(SampleTrace(), path).ok());
  Trace out;
  ASSERT_TRUE(ReadTraceDb(path, &out).ok());
  ASSERT_EQ(out.devices.size(), 1u);
  EXPECT_EQ(out.devices[0].properties_json, R"({"id":2,"name":"NVIDIA H200","numSms":132})");
  ASSERT_EQ(out.processes.size(), 1u);
  EXPECT_EQ(out.processes[0].label, "CPU");
  EXPECT_EQ(out.processes[0].metadata,
            (std::map<std::string, std::string>{{"cupti", "enabled"}, {"rank", "1"}}));
  EXPECT_EQ(out.metadata.count("cupti"), 0u);  // a process's own, not the trace's
  EXPECT_EQ(out.distributed_info.at(1), R"({"backend":"nccl","rank":1,"world_size":2})");
  ASSERT_EQ(out.ops.size(), 2u);
  EXPECT_EQ(out.strings.Get(out.ops[0].concrete_inputs), "[\"\",\"\"]");
  EXPECT_EQ(out.strings.Get(out.ops[0].input_strides), "[[4096,1],[4096,1]]");
  ASSERT_EQ(out.gpu.size(), 3u);
  EXPECT_EQ(out.gpu[0].pid, 10);
  EXPECT_EQ(out.strings.Get(out.gpu[0].collective),
            "\"Collective name\":\"allreduce\",\"Group size\":2");
  EXPECT_EQ(out.gpu[1].pid, 10);
  EXPECT_EQ(out.gpu[2].pid, -1);  // not known: NULL
  std::filesystem::remove(path);
}

void DropViews(SQLite::Database& db) {
  for (const char* view : {"gpu_activity", "operator_gpu_links", "operators_named",
                           "api_calls_named", "ranges_named"}) {
    db.exec(std::string("DROP VIEW IF EXISTS ") + view);
  }
}

TEST(StoreTest, RoundTripKeepsCaptureTimeOperators) {
  const std::string path = TempPath("store-v4.db");
  ASSERT_TRUE(WriteTraceDb(SampleTrace(), path).ok());
  {
    SQLite::Database db(path, SQLite::OPEN_READONLY);
    EXPECT_EQ(db.execAndGet("SELECT group_concat(in_graph_capture) FROM "
                            "(SELECT in_graph_capture FROM operators_named ORDER BY external_id)")
                  .getString(),
              "1,0");
  }
  Trace out;
  ASSERT_TRUE(ReadTraceDb(path, &out).ok());
  ASSERT_EQ(out.ops.size(), 2u);
  EXPECT_TRUE(out.ops[0].in_graph_capture);
  EXPECT_FALSE(out.ops[1].in_graph_capture);
  std::filesystem::remove(path);
}

// A store of schema version 3, as earlier builds wrote it: today's store
// without what version 4 added (trace.sql).
void DowngradeToVersion3(const std::string& path) {
  SQLite::Database db(path, SQLite::OPEN_READWRITE);
  DropViews(db);
  db.exec("ALTER TABLE operators DROP COLUMN in_graph_capture");
  db.exec("PRAGMA user_version = 3");
}

TEST(StoreTest, ReadsVersion3StoresWithNoCaptureTimeOperators) {
  const std::string path = TempPath("store-v3-read.db");
  ASSERT_TRUE(WriteTraceDb(SampleTrace(), path).ok());
  DowngradeToVersion3(path);
  Trace out;
  Status st = ReadTraceDb(path, &out);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(out.ops.size(), 2u);
  EXPECT_FALSE(out.ops[0].in_graph_capture);
  EXPECT_FALSE(out.ops[1].in_graph_capture);
  EXPECT_EQ(out.strings.Get(out.ops[0].input_strides), "[[4096,1],[4096,1]]");  // version 3's
  ASSERT_EQ(out.processes.size(), 1u);
  EXPECT_EQ(out.processes[0].label, "CPU");
  std::filesystem::remove(path);
}

// A store of schema version 2, as earlier builds wrote it: today's store
// without what versions 3 and 4 added (trace.sql).
void DowngradeToVersion2(const std::string& path) {
  DowngradeToVersion3(path);
  SQLite::Database db(path, SQLite::OPEN_READWRITE);
  db.exec("DROP TABLE process_meta");
  db.exec("DROP TABLE distributed_info");
  db.exec("ALTER TABLE devices DROP COLUMN properties_json");
  db.exec("ALTER TABLE processes DROP COLUMN label");
  db.exec("ALTER TABLE operators DROP COLUMN input_strides_id");
  db.exec("ALTER TABLE operators DROP COLUMN concrete_inputs_id");
  db.exec("ALTER TABLE kernels DROP COLUMN collective_id");
  for (const char* table : {"kernels", "memcpy", "memset"}) {
    db.exec(std::string("ALTER TABLE ") + table + " DROP COLUMN pid");
  }
  db.exec("PRAGMA user_version = 2");
}

TEST(StoreTest, ReadsVersion2StoresWithTheNewColumnsUnknown) {
  const std::string path = TempPath("store-v2.db");
  ASSERT_TRUE(WriteTraceDb(SampleTrace(), path).ok());
  DowngradeToVersion2(path);
  Trace out;
  Status st = ReadTraceDb(path, &out);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(out.devices.size(), 1u);
  EXPECT_EQ(out.devices[0].name, "NVIDIA H200");
  EXPECT_EQ(out.devices[0].properties_json, "");
  ASSERT_EQ(out.processes.size(), 1u);
  EXPECT_EQ(out.processes[0].name, "python");
  EXPECT_EQ(out.processes[0].label, "");
  EXPECT_TRUE(out.processes[0].metadata.empty());
  EXPECT_TRUE(out.distributed_info.empty());
  ASSERT_EQ(out.ops.size(), 2u);
  EXPECT_EQ(out.ops[0].input_strides, 0u);
  EXPECT_FALSE(out.ops[0].in_graph_capture);
  EXPECT_EQ(out.strings.Get(out.ops[1].collective),
            "\"Collective name\":\"allreduce\",\"In msg nelems\":1024");
  ASSERT_EQ(out.gpu.size(), 3u);
  EXPECT_EQ(out.gpu[0].pid, -1);
  EXPECT_EQ(out.gpu[0].collective, 0u);
  EXPECT_EQ(out.gpu[0].graph_id, 4);
  EXPECT_EQ(out.gpu[1].graph_node, 17);  // a version 2 column
  std::filesystem::remove(path);
}

// A store of schema version 1, as earlier builds wrote it: today's store
// without the version 2, 3 and 4 columns (trace.sql).
void DowngradeToVersion1(const std::string& path) {
  DowngradeToVersion2(path);
  SQLite::Database db(path, SQLite::OPEN_READWRITE);
  for (const char* column : {"sync_device", "sync_stream", "wait_on_stream", "wait_event_id",
                             "wait_event_correlation"}) {
    db.exec(std::string("ALTER TABLE api_calls DROP COLUMN ") + column);
  }
  db.exec("ALTER TABLE operators DROP COLUMN collective_id");
  for (const char* table : {"memcpy", "memset"}) {
    db.exec(std::string("ALTER TABLE ") + table + " DROP COLUMN graph_id");
    db.exec(std::string("ALTER TABLE ") + table + " DROP COLUMN graph_node");
  }
  db.exec("PRAGMA user_version = 1");
}

TEST(StoreTest, ReadsVersion1StoresWithTheNewColumnsUnknown) {
  const std::string path = TempPath("store-v1.db");
  ASSERT_TRUE(WriteTraceDb(SampleTrace(), path).ok());
  DowngradeToVersion1(path);
  Trace out;
  Status st = ReadTraceDb(path, &out);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(out.api.size(), 2u);
  EXPECT_EQ(out.strings.Get(out.api[1].name), "cudaStreamWaitEvent");
  EXPECT_EQ(out.api[1].correlation, 12);
  EXPECT_EQ(out.api[1].sync_stream, -1);
  EXPECT_EQ(out.api[1].wait_on_stream, -1);
  EXPECT_EQ(out.api[1].wait_event_correlation, -1);
  ASSERT_EQ(out.ops.size(), 2u);
  EXPECT_EQ(out.strings.Get(out.ops[1].name), "record_param_comms");
  EXPECT_EQ(out.ops[1].external_id, 4);
  EXPECT_EQ(out.ops[1].collective, 0u);
  EXPECT_FALSE(out.ops[0].in_graph_capture);
  ASSERT_EQ(out.gpu.size(), 3u);
  EXPECT_EQ(out.gpu[1].bytes, 4096);
  EXPECT_EQ(out.gpu[1].graph_id, -1);
  EXPECT_EQ(out.gpu[2].bytes, 64);
  std::filesystem::remove(path);
}

TEST(StoreTest, SchemaVersionAndViewsAreQueryable) {
  const std::string path = TempPath("store-views.db");
  ASSERT_TRUE(WriteTraceDb(SampleTrace(), path).ok());
  SQLite::Database db(path, SQLite::OPEN_READONLY);
  EXPECT_EQ(db.execAndGet("PRAGMA user_version").getInt(), kTraceSchemaVersion);
  EXPECT_EQ(db.execAndGet("SELECT count(*) FROM gpu_activity").getInt(), 3);
  EXPECT_EQ(db.execAndGet("SELECT sum(dur_ns) FROM gpu_activity WHERE kind = 'kernel'").getInt(),
            4000);
  EXPECT_EQ(db.execAndGet("SELECT gpu_name FROM operator_gpu_links WHERE name = 'aten::mm'")
                .getString(),
            "sm90_gemm");
  EXPECT_EQ(db.execAndGet("SELECT device FROM ranges_named").getInt(), 2);
  EXPECT_EQ(db.execAndGet("SELECT wait_on_stream FROM api_calls_named WHERE kind = 'sync'")
                .getInt(),
            7);
  EXPECT_EQ(db.execAndGet("SELECT collective FROM operators_named WHERE external_id = 4")
                .getString(),
            "\"Collective name\":\"allreduce\",\"In msg nelems\":1024");
  std::filesystem::remove(path);
}

TEST(StoreTest, FailedWriteLeavesNoFile) {
  const std::string path = "/nonexistent-dir-for-dynaflow/trace.db";
  Status st = WriteTraceDb(SampleTrace(), path);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kFailure);
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(StoreTest, RejectsUnknownSchemaVersion) {
  const std::string path = TempPath("store-version.db");
  ASSERT_TRUE(WriteTraceDb(SampleTrace(), path).ok());
  {
    SQLite::Database db(path, SQLite::OPEN_READWRITE);
    db.exec("PRAGMA user_version = 99");
  }
  Trace out;
  Status st = ReadTraceDb(path, &out);
  EXPECT_EQ(st.code(), StatusCode::kBadInput);
  EXPECT_NE(st.message().find("version 99"), std::string::npos);
  std::filesystem::remove(path);
}

TEST(StoreTest, RefusesARankTheTraceAlreadyHas) {
  const std::string path = TempPath("store-rank.db");
  ASSERT_TRUE(WriteTraceDb(SampleTrace(), path).ok());  // rank 1
  Trace two;
  ASSERT_TRUE(ReadTraceDb(path, &two).ok());
  const size_t gpu = two.gpu.size();
  Status st = ReadTraceDb(path, &two);
  EXPECT_EQ(st.code(), StatusCode::kBadInput);
  EXPECT_EQ(st.message(), path + ": rank 1 is also in an earlier input: give each rank's trace once");
  EXPECT_EQ(two.gpu.size(), gpu);  // nothing appended
  Trace other;
  other.DeviceIndex(0, 0);
  ASSERT_TRUE(ReadTraceDb(path, &other).ok());
  EXPECT_EQ(other.devices.size(), 2u);
  std::filesystem::remove(path);
}

TEST(StoreTest, LooksLikeTraceDb) {
  EXPECT_TRUE(LooksLikeTraceDb({"meta", "strings", "kernels", "operators", "devices"}));
  EXPECT_FALSE(LooksLikeTraceDb({"CUPTI_ACTIVITY_KIND_KERNEL", "StringIds"}));
}

}  // namespace
}  // namespace dynaflow
