#include "analysis/store/trace_db_bulk_writer.h"

#include <SQLiteCpp/SQLiteCpp.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "analysis/store/trace_db_writer.h"
#include "tests/temp_path.h"

namespace dynaflow {
namespace {

// Every row of every table, in rowid order, as text: equal dumps mean equal
// stores.
std::string Dump(const std::string& path) {
  SQLite::Database db(path, SQLite::OPEN_READONLY);
  std::string out = "user_version " + db.execAndGet("PRAGMA user_version").getString() + "\n";
  SQLite::Statement tables(db, "SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name");
  while (tables.executeStep()) {
    const std::string table = tables.getColumn(0).getString();
    out += "table " + table + "\n";
    SQLite::Statement rows(db, "SELECT * FROM " + table + " ORDER BY rowid");
    while (rows.executeStep()) {
      for (int i = 0; i < rows.getColumnCount(); ++i) {
        const SQLite::Column c = rows.getColumn(i);
        out += c.isNull() ? std::string("NULL") : std::to_string(c.getType()) + ":" + c.getString();
        out += '|';
      }
      out += '\n';
    }
  }
  return out;
}

// Appends `n` events of every kind to `t` (rank 0, as a parser leaves them).
void AddEvents(Trace* t, int first, int n) {
  for (int i = first; i < first + n; ++i) {
    const uint32_t d = t->DeviceIndex(0, i % 3);
    GpuActivity g;
    g.kind = static_cast<GpuKind>(i % 3);
    g.device_index = d;
    g.stream = 7 + i % 2;
    g.start = 1000 * i;
    g.end = 1000 * i + 500;
    g.name = t->strings.Intern("kernel_" + std::to_string(i % 17));
    g.correlation = i % 5 == 0 ? -1 : i;
    g.external_id = i;
    g.grid[0] = i;
    g.block[2] = 3;
    g.bytes = g.kind == GpuKind::kKernel ? 0 : 64 * i;
    if (g.kind == GpuKind::kMemcpy) g.copy_kind = t->strings.Intern(i % 2 ? "HtoD" : "DtoH");
    g.graph_id = i % 4 == 0 ? 9 : -1;
    t->gpu.push_back(g);
    ApiCall a;
    a.pid = 10;
    a.tid = 11 + i % 2;
    a.start = 1000 * i - 100;
    a.end = 1000 * i - 50;
    a.kind = static_cast<ApiKind>(i % 3);
    a.name = t->strings.Intern("cudaLaunchKernel");
    a.correlation = i;
    if (a.kind == ApiKind::kSync) {
      a.sync_device = i % 3;
      a.sync_stream = 8;
      a.wait_on_stream = i % 4 == 0 ? 7 : -1;
      a.wait_event_id = i % 4 == 0 ? i : -1;
      a.wait_event_correlation = i % 4 == 0 ? i - 1 : -1;
    }
    t->api.push_back(a);
    Operator o;
    o.pid = 10;
    o.tid = 11;
    o.start = 1000 * i - 200;
    o.end = 1000 * i;
    o.name = t->strings.Intern("aten::op" + std::to_string(i % 11));
    o.input_shapes = t->strings.Intern("[[" + std::to_string(i % 13) + "]]");
    o.pass = static_cast<Pass>(i % 3);
    o.sequence = i % 2 ? i : -1;
    o.external_id = i;
    o.in_graph_capture = i % 4 == 1;
    if (i % 7 == 0) {
      o.collective = t->strings.Intern("\"Collective name\":\"allreduce\",\"In msg nelems\":" +
                                       std::to_string(i));
    }
    t->ops.push_back(o);
    if (i % 10 == 0) {
      Range r;
      r.pid = 10;
      r.device_index = i % 20 == 0 ? static_cast<int32_t>(d) : -1;
      r.domain = i % 20 == 0 ? RangeDomain::kGpuUser : RangeDomain::kUser;
      r.start = 1000 * i;
      r.end = 1000 * i + 9000;
      r.name = t->strings.Intern("ProfilerStep#" + std::to_string(i / 10));
      t->ranges.push_back(r);
    }
  }
}

void AddSmallTables(Trace* t, int32_t rank) {
  t->devices[0].name = "NVIDIA H200";
  t->devices[0].sm_count = 132;
  t->devices[1].peak_tflops_bf16 = 989.5;
  t->processes.push_back({rank, 10, "python", "", {}});
  t->processes.push_back({rank, 10, "python again", "", {}});  // same key: the first is kept
  t->threads.push_back({rank, 10, 11, "main"});
  t->stats.Add("kineto_flow_events", "info", "flows", 12);
  t->metadata["format"] = "kineto";
  t->metadata["source"] = "x.json";
}

void SetRank(Trace* t, int32_t rank) {
  for (auto& d : t->devices) d.rank = rank;
  for (auto& a : t->api) a.rank = rank;
  for (auto& o : t->ops) o.rank = rank;
  for (auto& r : t->ranges) r.rank = rank;
}

// The reference: the whole trace through TraceDbWriter, as imports did before.
std::string ReferenceDump(int32_t rank, int events) {
  Trace t;
  AddEvents(&t, 0, events);
  SetRank(&t, rank);
  AddSmallTables(&t, rank);
  const std::string path = TempPath("bulk-reference.db");
  {
    auto w = TraceDbWriter::Create(path, TraceDbDurability::kBulk);
    EXPECT_TRUE(w.ok());
    EXPECT_TRUE((*w)->Write(t).ok());
    EXPECT_TRUE((*w)->Close().ok());
  }
  std::string dump = Dump(path);
  std::filesystem::remove(path);
  return dump;
}

TEST(TraceDbBulkWriterTest, WholeTraceMatchesTraceDbWriter) {
  Trace t;
  AddEvents(&t, 0, 500);
  SetRank(&t, 3);
  AddSmallTables(&t, 3);
  const std::string path = TempPath("bulk-whole.db");
  auto w = TraceDbBulkWriter::Start(path);
  ASSERT_TRUE(w.ok()) << w.status().message();
  ASSERT_TRUE((*w)->Finish(t, 3).ok());
  EXPECT_EQ((*w)->gpu_rows(), 500);
  EXPECT_EQ((*w)->api_rows(), 500);
  EXPECT_EQ((*w)->op_rows(), 500);
  EXPECT_EQ(Dump(path), ReferenceDump(3, 500));
  std::filesystem::remove(path);
}

TEST(TraceDbBulkWriterTest, TakenBatchesMatchTraceDbWriter) {
  for (int32_t rank : {0, 5}) {
    Trace part;
    const std::string path = TempPath("bulk-taken.db");
    auto w = TraceDbBulkWriter::Start(path, /*queue_batches=*/2);
    ASSERT_TRUE(w.ok());
    int done = 0;
    for (int n : {1, 37, 0, 200, 64, 98}) {  // 400 events in uneven batches
      AddEvents(&part, done, n);
      done += n;
      (*w)->Take(&part);
      EXPECT_TRUE(part.gpu.empty());
      EXPECT_TRUE(part.ops.empty());
    }
    AddEvents(&part, done, 100);  // left for Finish, with the final rank
    SetRank(&part, rank);
    AddSmallTables(&part, rank);
    Status st = (*w)->Finish(part, rank);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ((*w)->gpu_rows(), 500);
    EXPECT_EQ(Dump(path), ReferenceDump(rank, 500)) << "rank " << rank;
    std::filesystem::remove(path);
  }
}

// Kineto's baseTimeNanoseconds is known only at the end of a file: the taken
// rows get it in Finish, the rows still in the trace have it already.
TEST(TraceDbBulkWriterTest, TakenRowsGetTheTimeOffset) {
  constexpr int64_t kOffset = 1711964646000000000;
  auto shift = [](Trace* t) {
    for (auto& g : t->gpu) g.start += kOffset, g.end += kOffset;
    for (auto& a : t->api) a.start += kOffset, a.end += kOffset;
    for (auto& o : t->ops) o.start += kOffset, o.end += kOffset;
    for (auto& r : t->ranges) r.start += kOffset, r.end += kOffset;
  };
  Trace reference;
  AddEvents(&reference, 0, 500);
  shift(&reference);
  SetRank(&reference, 2);
  AddSmallTables(&reference, 2);
  const std::string ref_path = TempPath("bulk-offset-reference.db");
  {
    auto w = TraceDbWriter::Create(ref_path, TraceDbDurability::kBulk);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Write(reference).ok());
    ASSERT_TRUE((*w)->Close().ok());
  }

  Trace part;
  const std::string path = TempPath("bulk-offset.db");
  auto w = TraceDbBulkWriter::Start(path, /*queue_batches=*/2);
  ASSERT_TRUE(w.ok());
  int done = 0;
  for (int n : {3, 200, 197}) {
    AddEvents(&part, done, n);
    done += n;
    (*w)->Take(&part);
  }
  AddEvents(&part, done, 100);
  shift(&part);  // as KinetoParser::Finish does to what it still holds
  SetRank(&part, 2);
  AddSmallTables(&part, 2);
  Status st = (*w)->Finish(part, 2, kOffset);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(Dump(path), Dump(ref_path));
  std::filesystem::remove(path);
  std::filesystem::remove(ref_path);
}

TEST(TraceDbBulkWriterTest, SmallTablesKeepTheirChecks) {
  const std::string path = TempPath("bulk-check.db");
  std::filesystem::remove(path);
  auto w = TraceDbBulkWriter::Start(path);
  ASSERT_TRUE(w.ok());
  Trace t;
  AddEvents(&t, 0, 10);
  t.stats.Add("odd", "bogus-severity", "not one of info, data_loss, error");
  Status st = (*w)->Finish(t);
  EXPECT_EQ(st.code(), StatusCode::kFailure);
  EXPECT_NE(st.message().find("CHECK"), std::string::npos) << st.message();
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(TraceDbBulkWriterTest, AbortLeavesNoFile) {
  const std::string path = TempPath("bulk-abort.db");
  std::filesystem::remove(path);
  {
    auto w = TraceDbBulkWriter::Start(path);
    ASSERT_TRUE(w.ok());
    Trace part;
    AddEvents(&part, 0, 100);
    (*w)->Take(&part);
  }  // destroyed without Finish
  EXPECT_FALSE(std::filesystem::exists(path));
  for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::path(path).parent_path())) {
    EXPECT_EQ(entry.path().filename().string().rfind(std::filesystem::path(path).filename().string() + ".tmp-", 0),
              std::string::npos)
        << entry.path();
  }
}

TEST(TraceDbBulkWriterTest, ReplacesAnExistingFile) {
  const std::string path = TempPath("bulk-replace.db");
  { std::FILE* f = std::fopen(path.c_str(), "w"); std::fputs("not a database", f); std::fclose(f); }
  auto w = TraceDbBulkWriter::Start(path);
  ASSERT_TRUE(w.ok());
  Trace t;
  AddEvents(&t, 0, 10);
  ASSERT_TRUE((*w)->Finish(t).ok());
  SQLite::Database db(path, SQLite::OPEN_READONLY);
  EXPECT_EQ(db.execAndGet("SELECT count(*) FROM api_calls").getInt(), 10);
  std::filesystem::remove(path);
}

TEST(TraceDbBulkWriterTest, RefusesNonRegularTargetAndMissingDirectory) {
  auto dev = TraceDbBulkWriter::Start("/dev/null");
  ASSERT_FALSE(dev.ok());
  EXPECT_EQ(dev.status().code(), StatusCode::kBadInput);
  auto missing = TraceDbBulkWriter::Start("/nonexistent-dir-for-dynaflow/trace.db");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kFailure);
  EXPECT_FALSE(std::filesystem::exists("/nonexistent-dir-for-dynaflow/trace.db"));
}

}  // namespace
}  // namespace dynaflow
