#include "analysis/store/trace_db_writer.h"

#include <SQLiteCpp/SQLiteCpp.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "analysis/store/store.h"
#include "tests/temp_path.h"

namespace dynaflow {
namespace {

std::unique_ptr<TraceDbWriter> CreateOrDie(const std::string& path) {
  StatusOr<std::unique_ptr<TraceDbWriter>> writer = TraceDbWriter::Create(path);
  EXPECT_TRUE(writer.ok()) << writer.status().message();
  return writer.ok() ? std::move(*writer) : nullptr;
}

void AddKernel(Trace* t, int32_t device, std::string_view name, TimeNs start) {
  GpuActivity k;
  k.device_index = t->DeviceIndex(0, device);
  k.start = start;
  k.end = start + 100;
  k.name = t->strings.Intern(name);
  t->gpu.push_back(k);
}

void AddOperator(Trace* t, std::string_view name, std::string_view module) {
  Operator o;
  o.name = t->strings.Intern(name);
  o.module_path = t->strings.Intern(module);
  o.external_id = 7;
  t->ops.push_back(o);
}

// Batch 1 knows device 0's properties; batch 2 mentions device 0 again with
// none of them, adds device 1, and reuses and adds strings.
Trace FirstBatch() {
  Trace t;
  DeviceInfo& d = t.devices[t.DeviceIndex(0, 0)];
  d.name = "NVIDIA H200";
  d.sm_count = 132;
  d.cc_major = 9;
  d.peak_tflops_bf16 = 989.4;
  AddKernel(&t, 0, "sm90_gemm", 1000);
  AddOperator(&t, "aten::mm", "model.mlp");
  t.stats.Add("tracer_queue_full", "data_loss", "records dropped", 2);
  t.metadata["cupti"] = "pending";
  t.processes.push_back({0, 42, "python", "", {}});
  return t;
}

Trace SecondBatch() {
  Trace t;
  t.strings.Intern("only in the second batch, unused");
  AddKernel(&t, 1, "flash_fwd", 2000);
  AddKernel(&t, 0, "sm90_gemm", 3000);
  AddOperator(&t, "aten::mm", "model.attn");
  t.stats.Add("tracer_queue_full", "data_loss", "records dropped", 3);
  t.metadata["cupti"] = "enabled";
  t.processes.push_back({0, 42, "python", "", {}});
  return t;
}

TEST(TraceDbWriterTest, BatchesShareStringsAndDevices) {
  const std::string path = TempPath("writer-batches.db");
  std::unique_ptr<TraceDbWriter> w = CreateOrDie(path);
  ASSERT_TRUE(w);
  ASSERT_TRUE(w->Write(FirstBatch()).ok());
  ASSERT_TRUE(w->Write(SecondBatch()).ok());
  Trace clock_only;
  clock_only.devices[clock_only.DeviceIndex(0, 0)].clock_khz = 1980000;
  ASSERT_TRUE(w->Write(clock_only).ok());
  ASSERT_TRUE(w->Close().ok());

  Trace out;
  Status st = ReadTraceDb(path, &out);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(out.devices.size(), 2u);
  EXPECT_EQ(out.devices[0].device, 0);
  EXPECT_EQ(out.devices[0].name, "NVIDIA H200");  // kept: later rows knew no name
  EXPECT_EQ(out.devices[0].sm_count, 132);
  EXPECT_EQ(out.devices[0].cc_major, 9);
  EXPECT_DOUBLE_EQ(out.devices[0].peak_tflops_bf16, 989.4);
  EXPECT_EQ(out.devices[0].clock_khz, 1980000);  // added by the third batch
  EXPECT_EQ(out.devices[1].device, 1);
  EXPECT_EQ(out.devices[1].name, "");

  ASSERT_EQ(out.gpu.size(), 3u);
  EXPECT_EQ(out.strings.Get(out.gpu[0].name), "sm90_gemm");
  EXPECT_EQ(out.strings.Get(out.gpu[1].name), "flash_fwd");
  EXPECT_EQ(out.gpu[1].device_index, 1u);
  EXPECT_EQ(out.strings.Get(out.gpu[2].name), "sm90_gemm");
  EXPECT_EQ(out.gpu[2].device_index, 0u);
  ASSERT_EQ(out.ops.size(), 2u);
  EXPECT_EQ(out.strings.Get(out.ops[0].module_path), "model.mlp");
  EXPECT_EQ(out.strings.Get(out.ops[1].module_path), "model.attn");
  EXPECT_EQ(out.stats.Get("tracer_queue_full"), 5);
  EXPECT_EQ(out.metadata["cupti"], "enabled");
  EXPECT_EQ(out.processes.size(), 1u);

  SQLite::Database db(path, SQLite::OPEN_READONLY);
  EXPECT_EQ(db.execAndGet("SELECT count(*) - count(DISTINCT value) FROM strings").getInt(), 0);
  EXPECT_EQ(db.execAndGet("SELECT value FROM strings WHERE id = 0").getString(), "");
  std::filesystem::remove(path);
}

TEST(TraceDbWriterTest, KeepsSynchronizationIdsAndCollectiveMetadata) {
  const std::string path = TempPath("writer-sync.db");
  std::unique_ptr<TraceDbWriter> w = CreateOrDie(path);
  ASSERT_TRUE(w);
  Trace t;
  ApiCall wait;
  wait.kind = ApiKind::kSync;
  wait.name = t.strings.Intern("cudaStreamWaitEvent");
  wait.sync_device = 1;
  wait.sync_stream = 8;
  wait.wait_on_stream = 7;
  wait.wait_event_id = 5;
  wait.wait_event_correlation = 60;
  t.api.push_back(wait);
  AddOperator(&t, "record_param_comms", "");
  t.ops.back().collective = t.strings.Intern("\"Collective name\":\"allgather\"");
  ASSERT_TRUE(w->Write(t).ok());
  ASSERT_TRUE(w->Close().ok());

  Trace out;
  ASSERT_TRUE(ReadTraceDb(path, &out).ok());
  ASSERT_EQ(out.api.size(), 1u);
  EXPECT_EQ(out.api[0].sync_device, 1);
  EXPECT_EQ(out.api[0].sync_stream, 8);
  EXPECT_EQ(out.api[0].wait_on_stream, 7);
  EXPECT_EQ(out.api[0].wait_event_id, 5);
  EXPECT_EQ(out.api[0].wait_event_correlation, 60);
  ASSERT_EQ(out.ops.size(), 1u);
  EXPECT_EQ(out.strings.Get(out.ops[0].collective), "\"Collective name\":\"allgather\"");
  std::filesystem::remove(path);
}

// A process's metadata is upserted per key as batches bring new values; the
// launching pid of GPU rows and a thread's second name are kept.
TEST(TraceDbWriterTest, KeepsProcessMetadataPerKeyAndGpuPids) {
  const std::string path = TempPath("writer-process-meta.db");
  std::unique_ptr<TraceDbWriter> w = CreateOrDie(path);
  ASSERT_TRUE(w);
  Trace first;
  first.processes.push_back({0, 42, "python", "", {{"cupti", "pending"}, {"rank", "0"}}});
  first.threads.push_back({0, 42, 43, "pt_main_thread"});
  AddKernel(&first, 0, "sm90_gemm", 1000);
  first.gpu.back().pid = 42;
  ASSERT_TRUE(w->Write(first).ok());
  Trace second;
  second.processes.push_back({0, 42, "python", "", {{"cupti", "enabled"}}});
  second.threads.push_back({0, 42, 43, "pt_main_thread"});  // the same name again
  second.threads.push_back({0, 42, 43, "pt_autograd_0"});
  second.distributed_info[0] = R"({"rank":0,"world_size":2})";
  ASSERT_TRUE(w->Write(second).ok());
  ASSERT_TRUE(w->Close().ok());

  Trace out;
  ASSERT_TRUE(ReadTraceDb(path, &out).ok());
  ASSERT_EQ(out.processes.size(), 1u);
  EXPECT_EQ(out.processes[0].metadata,
            (std::map<std::string, std::string>{{"cupti", "enabled"}, {"rank", "0"}}));
  ASSERT_EQ(out.threads.size(), 2u);
  EXPECT_EQ(out.threads[1].name, "pt_autograd_0");
  ASSERT_EQ(out.gpu.size(), 1u);
  EXPECT_EQ(out.gpu[0].pid, 42);
  EXPECT_EQ(out.distributed_info.at(0), R"({"rank":0,"world_size":2})");
  std::filesystem::remove(path);
}

TEST(TraceDbWriterTest, ReaderSeesCommittedBatchesWhileWriterIsOpen) {
  const std::string path = TempPath("writer-concurrent.db");
  std::unique_ptr<TraceDbWriter> w = CreateOrDie(path);
  ASSERT_TRUE(w);
  ASSERT_TRUE(w->Write(FirstBatch()).ok());
  {
    Trace seen;
    ASSERT_TRUE(ReadTraceDb(path, &seen).ok());
    EXPECT_EQ(seen.gpu.size(), 1u);
    EXPECT_EQ(seen.metadata["cupti"], "pending");
  }
  ASSERT_TRUE(w->Write(SecondBatch()).ok());
  ASSERT_TRUE(w->SetMeta("dropped_records", "0").ok());
  {
    Trace seen;
    ASSERT_TRUE(ReadTraceDb(path, &seen).ok());
    EXPECT_EQ(seen.gpu.size(), 3u);
    EXPECT_EQ(seen.metadata["dropped_records"], "0");
  }
  EXPECT_TRUE(std::filesystem::exists(path + "-wal"));
  ASSERT_TRUE(w->Close().ok());
  EXPECT_FALSE(std::filesystem::exists(path + "-wal"));
  EXPECT_FALSE(std::filesystem::exists(path + "-shm"));
  SQLite::Database db(path, SQLite::OPEN_READONLY);
  EXPECT_EQ(db.execAndGet("PRAGMA journal_mode").getString(), "delete");
  EXPECT_EQ(db.execAndGet("PRAGMA integrity_check").getString(), "ok");
  std::filesystem::remove(path);
}

TEST(TraceDbWriterTest, FailedBatchIsRolledBackAndWriterStaysUsable) {
  const std::string path = TempPath("writer-rollback.db");
  std::unique_ptr<TraceDbWriter> w = CreateOrDie(path);
  ASSERT_TRUE(w);
  Trace bad;
  AddKernel(&bad, 3, "never_stored", 10);
  bad.stats.Add("broken", "no such severity", "violates the CHECK constraint");
  EXPECT_FALSE(w->Write(bad).ok());

  Trace good;
  AddKernel(&good, 3, "never_stored", 20);
  ASSERT_TRUE(w->Write(good).ok());
  ASSERT_TRUE(w->Close().ok());

  Trace out;
  ASSERT_TRUE(ReadTraceDb(path, &out).ok());
  ASSERT_EQ(out.gpu.size(), 1u);
  EXPECT_EQ(out.gpu[0].start, 20);
  EXPECT_EQ(out.strings.Get(out.gpu[0].name), "never_stored");
  ASSERT_EQ(out.devices.size(), 1u);
  EXPECT_EQ(out.devices[0].device, 3);
  EXPECT_EQ(out.stats.Get("broken"), 0);
  std::filesystem::remove(path);
}

TEST(TraceDbWriterTest, CreateReplacesAnOldStoreAndItsWal) {
  const std::string path = TempPath("writer-replace.db");
  std::ofstream(path) << "not a database";
  std::ofstream(path + "-wal") << "stale";
  std::unique_ptr<TraceDbWriter> w = CreateOrDie(path);
  ASSERT_TRUE(w);
  ASSERT_TRUE(w->Close().ok());
  EXPECT_FALSE(w->Write(FirstBatch()).ok());  // closed
  Trace out;
  ASSERT_TRUE(ReadTraceDb(path, &out).ok());
  EXPECT_TRUE(out.gpu.empty());
  std::filesystem::remove(path);
}

TEST(TraceDbWriterTest, CreateFailsCleanlyInMissingDirectory) {
  StatusOr<std::unique_ptr<TraceDbWriter>> w =
      TraceDbWriter::Create("/nonexistent-dir-for-dynaflow/trace.db");
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kFailure);
  EXPECT_NE(w.status().message().find("cannot create trace store"), std::string::npos);
}

}  // namespace
}  // namespace dynaflow
