#include "plugin/preload/writer_thread.h"

#include <SQLiteCpp/SQLiteCpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "analysis/store/store.h"
#include "plugin/preload/cupti_session.h"
#include "plugin/preload/fake_cupti_api.h"
#include "tests/temp_path.h"

namespace dynaflow {
namespace {

using std::chrono::milliseconds;

WriterOptions Options(const std::string& path) {
  WriterOptions o;
  o.path = path;
  o.rank = 1;
  o.pid = 4242;
  o.process_name = "python";
  o.meta = {{"format", "dynaflow"}, {"pid", "4242"}};
  return o;
}

DynaflowOperatorRecord Op(uint64_t id, const char* name = "aten::mm") {
  DynaflowOperatorRecord op = {};
  op.id = id;
  op.start_ns = static_cast<int64_t>(id) * 10;
  op.end_ns = op.start_ns + 5;
  op.sequence = -1;
  op.tid = 7;
  op.name = name;
  op.input_shapes = "[[8,4096],[4096,4096]]";
  op.module_path = "model.layers.0.mlp";
  op.collective = R"("Collective name":"allreduce","Group size":2)";
  return op;
}

CUpti_ActivityKernel10 Kernel(uint32_t correlation) {
  CUpti_ActivityKernel10 k = {};
  k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  k.correlationId = correlation;
  k.name = "sm90_gemm";
  k.start = 1000 + correlation;
  k.end = 2000 + correlation;
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

Trace ReadOrDie(const std::string& path) {
  Trace t;
  Status st = ReadTraceDb(path, &t);
  EXPECT_TRUE(st.ok()) << st.message();
  return t;
}

int64_t OperatorRows(const std::string& path) {
  SQLite::Database db(path, SQLite::OPEN_READONLY);
  return db.execAndGet("SELECT count(*) FROM operators").getInt64();
}

// A CUPTI session delivering the fake's buffers to `writer`.
CuptiSink SinkInto(WriterThread& writer) {
  return CuptiSink{
      .buffer = [&writer](ActivityBuffer b) { writer.EnqueueBuffer(std::move(b)); },
      .dropped = [&writer](size_t n) { writer.AddCuptiDropped(n); }};
}

TEST(WriterThreadTest, OperatorsAndCuptiBuffersReachTheStore) {
  const std::string path = TempPath("writer-flow.db");
  FakeCuptiApi cupti;
  cupti.SetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, 211, "cudaLaunchKernel_v7000");
  WriterThread writer(Options(path));
  writer.Start();
  writer.AttachCupti(&cupti);
  CuptiSession session(cupti, SinkInto(writer));
  ASSERT_TRUE(session.Start().ok());
  ASSERT_TRUE(session.Enable().ok());

  CUpti_ActivityDevice5 device = {};
  device.kind = CUPTI_ACTIVITY_KIND_DEVICE;
  device.name = "NVIDIA H200";
  device.numMultiprocessors = 132;
  CUpti_ActivityAPI launch = {};
  launch.kind = CUPTI_ACTIVITY_KIND_RUNTIME;
  launch.cbid = 211;
  launch.correlationId = 1;
  launch.threadId = 7;
  launch.start = 900;
  launch.end = 950;
  FakeActivityBuffer buffer;
  buffer.Add(device).Add(External(1, 42)).Add(launch).Add(Kernel(1)).Add(Kernel(2)).Add(Kernel(3));
  ASSERT_TRUE(cupti.CompleteBuffer(buffer, /*dropped=*/5));
  ASSERT_TRUE(writer.EnqueueOperator(Op(42)));
  session.Disable();
  ASSERT_TRUE(writer.Stop().ok());

  Trace t = ReadOrDie(path);
  ASSERT_EQ(t.ops.size(), 1u);
  EXPECT_EQ(t.ops[0].external_id, 42);
  EXPECT_EQ(t.ops[0].rank, 1);
  EXPECT_EQ(t.ops[0].pid, 4242);
  EXPECT_EQ(t.strings.Get(t.ops[0].module_path), "model.layers.0.mlp");
  EXPECT_EQ(t.strings.Get(t.ops[0].collective), R"("Collective name":"allreduce","Group size":2)");
  ASSERT_EQ(t.gpu.size(), 3u);
  ASSERT_EQ(t.api.size(), 1u);
  EXPECT_EQ(t.strings.Get(t.api[0].name), "cudaLaunchKernel");
  EXPECT_EQ(t.api[0].external_id, 42);
  int linked = 0;
  for (const GpuActivity& g : t.gpu) linked += g.external_id == 42;
  EXPECT_EQ(linked, 1);
  ASSERT_EQ(t.devices.size(), 1u);
  EXPECT_EQ(t.devices[0].name, "NVIDIA H200");
  EXPECT_EQ(t.metadata["format"], "dynaflow");
  EXPECT_EQ(t.metadata["dropped_records"], "5");
  EXPECT_EQ(t.stats.Get("cupti_dropped_records"), 5);
  EXPECT_EQ(t.processes.size(), 1u);
  EXPECT_FALSE(std::filesystem::exists(path + "-wal"));
  std::filesystem::remove(path);
}

TEST(WriterThreadTest, FlushCommitsWhatIsQueuedWhileRunning) {
  const std::string path = TempPath("writer-flush.db");
  WriterOptions options = Options(path);
  options.flush_interval = milliseconds(3600 * 1000);  // only explicit flushes
  WriterThread writer(std::move(options));
  writer.Start();
  for (uint64_t id = 1; id <= 10; ++id) ASSERT_TRUE(writer.EnqueueOperator(Op(id)));
  writer.SetMeta("cupti", "enabled");
  ASSERT_TRUE(writer.Flush(milliseconds(10000)));
  EXPECT_EQ(OperatorRows(path), 10);
  EXPECT_EQ(ReadOrDie(path).metadata["cupti"], "enabled");
  ASSERT_TRUE(writer.Finish(milliseconds(10000)));
  EXPECT_FALSE(writer.EnqueueOperator(Op(11)));  // finished: dropped
  EXPECT_TRUE(writer.Stop().ok());
  std::filesystem::remove(path);
}

TEST(WriterThreadTest, WritesPeriodicallyWithoutBeingAsked) {
  const std::string path = TempPath("writer-periodic.db");
  WriterOptions options = Options(path);
  options.flush_interval = milliseconds(20);
  int hook_calls = 0;
  options.before_flush = [&hook_calls](bool) { ++hook_calls; };
  WriterThread writer(std::move(options));
  writer.Start();
  ASSERT_TRUE(writer.EnqueueOperator(Op(1)));
  for (int i = 0; i < 500 && writer.counters().batches_written < 3; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_EQ(OperatorRows(path), 1);
  EXPECT_TRUE(writer.Stop().ok());
  EXPECT_GE(hook_calls, 3);
  std::filesystem::remove(path);
}

// A signal handler asks for a flush while the faulting thread may hold the
// tracer's CUPTI lock: that flush does not call before_flush (CUPTI), a later
// one does. A fault on the writer thread itself does not wait for itself.
TEST(WriterThreadTest, AFlushAskedByASignalLeavesCuptiAlone) {
  const std::string path = TempPath("writer-signal.db");
  WriterOptions options = Options(path);
  options.flush_interval = milliseconds(3600 * 1000);  // only explicit flushes
  std::atomic<int> hook_calls{0};
  WriterThread* self = nullptr;
  std::atomic<bool> self_answered{true};
  std::atomic<double> self_waited_s{-1};
  options.before_flush = [&](bool) {
    if (hook_calls.fetch_add(1) != 1) return;
    const auto t0 = std::chrono::steady_clock::now();
    self_answered = self->Flush(milliseconds(2000));  // as the handler would on this thread
    self_waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  WriterThread writer(std::move(options));
  self = &writer;
  writer.Start();
  ASSERT_TRUE(writer.EnqueueOperator(Op(1)));
  writer.NoteSignalFlush();
  ASSERT_TRUE(writer.Flush(milliseconds(10000)));
  EXPECT_EQ(hook_calls.load(), 0);
  EXPECT_EQ(OperatorRows(path), 1);
  ASSERT_TRUE(writer.Flush(milliseconds(10000)));  // an ordinary flush asks CUPTI
  EXPECT_EQ(hook_calls.load(), 1);
  ASSERT_TRUE(writer.Flush(milliseconds(10000)));  // the hook waits on its own thread
  EXPECT_GE(hook_calls.load(), 2);
  EXPECT_FALSE(self_answered.load());
  EXPECT_LT(self_waited_s.load(), 0.5);
  EXPECT_GE(self_waited_s.load(), 0.0);
  // The hook's own request runs one more flush, maybe after the one above.
  ASSERT_TRUE(writer.Flush(milliseconds(10000)));
  const int before_finish = hook_calls.load();
  writer.NoteExitSignal(SIGSEGV);
  ASSERT_TRUE(writer.Finish(milliseconds(10000)));
  EXPECT_EQ(hook_calls.load(), before_finish);  // the final flush of a dying process neither
  EXPECT_TRUE(writer.Stop().ok());
  EXPECT_EQ(ReadOrDie(path).metadata["exit_signal"], "SIGSEGV");
  std::filesystem::remove(path);
}

// Several threads enqueue `per_thread` operators each as fast as they can.
void Burst(WriterThread& writer, int threads, int per_thread) {
  std::vector<std::thread> producers;
  for (int t = 0; t < threads; ++t) {
    producers.emplace_back([&writer, t, per_thread] {
      for (int i = 0; i < per_thread; ++i) {
        writer.EnqueueOperator(Op(static_cast<uint64_t>(t) * per_thread + i + 1));
      }
    });
  }
  for (std::thread& p : producers) p.join();
}

TEST(WriterThreadTest, MillionOperatorsFromSeveralThreadsWithoutLoss) {
  const std::string path = TempPath("writer-million.db");
  WriterOptions options = Options(path);
  options.max_queued_bytes = size_t{1} << 30;
  WriterThread writer(std::move(options));
  writer.Start();
  Burst(writer, 4, 250000);
  ASSERT_TRUE(writer.Stop().ok());
  const WriterCounters c = writer.counters();
  EXPECT_EQ(c.operators_queued, 1000000u);
  EXPECT_EQ(c.dropped_records, 0u);
  EXPECT_LE(c.peak_queued_bytes, size_t{1} << 30);
  EXPECT_EQ(OperatorRows(path), 1000000);
  SQLite::Database db(path, SQLite::OPEN_READONLY);
  EXPECT_EQ(db.execAndGet("SELECT count(DISTINCT external_id) FROM operators").getInt64(), 1000000);
  EXPECT_EQ(db.execAndGet("SELECT value FROM meta WHERE key = 'dropped_records'").getString(), "0");
  std::filesystem::remove(path);
}

TEST(WriterThreadTest, SmallQueueStaysBoundedAndCountsEveryDrop) {
  const std::string path = TempPath("writer-bounded.db");
  constexpr size_t kBound = 64 << 10;
  FakeCuptiApi cupti;
  WriterOptions options = Options(path);
  options.max_queued_bytes = kBound;
  WriterThread writer(std::move(options));
  writer.Start();
  writer.AttachCupti(&cupti);
  CuptiSession session(cupti, SinkInto(writer));
  ASSERT_TRUE(session.Start().ok());
  Burst(writer, 4, 50000);
  // A CUPTI buffer is larger than the whole bound: its 3 records are dropped.
  FakeActivityBuffer buffer;
  buffer.Add(Kernel(1)).Add(Kernel(2)).Add(Kernel(3));
  ASSERT_TRUE(cupti.CompleteBuffer(buffer));
  ASSERT_TRUE(writer.Stop().ok());

  const WriterCounters c = writer.counters();
  EXPECT_LE(c.peak_queued_bytes, kBound);
  EXPECT_GT(c.dropped_records, 3u);
  EXPECT_EQ(c.buffers_queued, 0u);
  const int64_t written = OperatorRows(path);
  Trace t = ReadOrDie(path);
  EXPECT_EQ(static_cast<uint64_t>(written) + c.dropped_records, 200000u + 3u);
  EXPECT_EQ(t.metadata["dropped_records"], std::to_string(c.dropped_records));
  EXPECT_EQ(t.stats.Get("tracer_queue_full"), static_cast<int64_t>(c.dropped_records));
  EXPECT_TRUE(t.gpu.empty());
  std::filesystem::remove(path);
}

TEST(WriterThreadTest, SigkillMidRecordingLeavesAValidStore) {
  const std::string path = TempPath("writer-sigkill.db");
  int committed[2];
  ASSERT_EQ(pipe(committed), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Records until killed, writing every 20 ms; says so once the first
    // hundred operators are committed, so that a slow machine cannot make
    // the parent kill it before its first flush.
    WriterOptions options = Options(path);
    options.flush_interval = milliseconds(20);
    WriterThread writer(std::move(options));
    writer.Start();
    for (uint64_t id = 1;; ++id) {
      writer.EnqueueOperator(Op(id));
      if (id == 100 && writer.Flush(milliseconds(60000))) {
        ssize_t ignored = write(committed[1], "x", 1);
        (void)ignored;
      }
      if (id % 100 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  close(committed[1]);
  char byte;
  ASSERT_EQ(read(committed[0], &byte, 1), 1);
  close(committed[0]);
  std::this_thread::sleep_for(milliseconds(300));
  ASSERT_EQ(kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));

  ASSERT_TRUE(std::filesystem::exists(path + "-wal"));  // what a killed writer leaves
  Trace t = ReadOrDie(path);                             // read-only, through the WAL
  EXPECT_GE(t.ops.size(), 100u);
  EXPECT_EQ(t.metadata["format"], "dynaflow");
  {
    SQLite::Database db(path, SQLite::OPEN_READWRITE);
    EXPECT_EQ(db.execAndGet("PRAGMA integrity_check").getString(), "ok");
    EXPECT_EQ(db.execAndGet("SELECT count(*) FROM operators").getInt64(),
              static_cast<int64_t>(t.ops.size()));
  }
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path + suffix);
}

TEST(WriterThreadTest, StoreThatCannotBeCreatedIsReportedNotThrown) {
  WriterThread writer(Options("/nonexistent-dir-for-dynaflow/1.db"));
  writer.Start();
  writer.EnqueueOperator(Op(1));
  const Status st = writer.Stop();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("cannot create trace store"), std::string::npos);
}

}  // namespace
}  // namespace dynaflow
