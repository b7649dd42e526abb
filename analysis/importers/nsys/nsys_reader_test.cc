#include "analysis/importers/nsys/nsys_reader.h"

#include <SQLiteCpp/SQLiteCpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dynaflow {
namespace {

namespace fs = std::filesystem;

// A globalTid as nsys writes it: machine id 1, then pid, then tid.
constexpr int64_t GlobalTid(int64_t pid, int64_t tid) { return (1LL << 48) | (pid << 24) | tid; }

// A SQLite file in the temp directory, built from SQL, removed at the end.
class TempDb {
 public:
  explicit TempDb(const std::string& sql) {
    static std::atomic<int> counter{0};
    path_ = (fs::temp_directory_path() / ("nsys_reader_test_" + std::to_string(getpid()) + "_" +
                                          std::to_string(counter++) + ".sqlite"))
                .string();
    SQLite::Database db(path_, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
    db.exec(sql);
  }
  ~TempDb() { fs::remove(path_); }
  TempDb(const TempDb&) = delete;
  TempDb& operator=(const TempDb&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// What the registry's probe would report for a SQLite file.
FileProbe ProbeSqlite(const std::string& path) {
  FileProbe probe;
  probe.path = path;
  probe.sqlite = true;
  SQLite::Database db(path, SQLite::OPEN_READONLY);
  SQLite::Statement tables(db, "SELECT name FROM sqlite_master WHERE type = 'table'");
  while (tables.executeStep()) probe.sql_tables.push_back(tables.getColumn(0).getString());
  return probe;
}

Status ReadInto(const std::string& path, int ordinal, Trace* trace,
                const ImportOptions& options = {}) {
  FileProbe probe;
  probe.path = path;
  probe.sqlite = true;
  return MakeNsysReader()->Read(probe, ordinal, options, trace);
}

std::string Name(const Trace& trace, StringId id) { return std::string(trace.strings.Get(id)); }

std::vector<const GpuActivity*> OfKind(const Trace& trace, GpuKind kind) {
  std::vector<const GpuActivity*> out;
  for (const GpuActivity& a : trace.gpu) {
    if (a.kind == kind) out.push_back(&a);
  }
  return out;
}

const ImportStat* FindStat(const Trace& trace, std::string_view name) {
  for (const ImportStat& s : trace.stats.all()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

// Every table a recent nsys (2024+) writes that the importer reads, with
// columns as nsys declares them (a subset; the importer ignores the rest).
constexpr char kModernSchema[] = R"sql(
CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO StringIds VALUES (0, ''), (1, 'void gemm<float>(float *, int)'), (2, 'gemm'),
  (3, 'cudaLaunchKernel_v7000'), (4, 'cuLaunchKernel'), (5, 'pt_main_thread'),
  (6, 'ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096>)'),
  (7, 'step'), (8, 'cudaStreamSynchronize_v3020'), (9, 'ncclDevKernel_AllReduce');
CREATE TABLE ENUM_CUDA_MEMCPY_OPER (id INTEGER PRIMARY KEY, name TEXT, label TEXT);
INSERT INTO ENUM_CUDA_MEMCPY_OPER VALUES (1, 'CUDA_MEMCPY_KIND_HTOD', 'Host-to-Device'),
  (10, 'CUDA_MEMCPY_KIND_PTOP', 'Peer-to-Peer');
CREATE TABLE ENUM_CUPTI_SYNC_TYPE (id INTEGER PRIMARY KEY, name TEXT, label TEXT);
INSERT INTO ENUM_CUPTI_SYNC_TYPE VALUES
  (3, 'CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE', 'Stream sync');
CREATE TABLE ENUM_NSYS_EVENT_CLASS (id INTEGER PRIMARY KEY, name TEXT, label TEXT);
INSERT INTO ENUM_NSYS_EVENT_CLASS VALUES (0, 'TRACE_PROCESS_EVENT_CUDA_RUNTIME', 'CUDA runtime'),
  (1, 'TRACE_PROCESS_EVENT_CUDA_DRIVER', 'CUDA driver'),
  (67, 'TRACE_PROCESS_EVENT_CUDABACKTRACE', 'CUDA backtrace');
CREATE TABLE ENUM_NSYS_EVENT_TYPE (id INTEGER PRIMARY KEY, name TEXT, label TEXT);
INSERT INTO ENUM_NSYS_EVENT_TYPE VALUES (34, 'NvtxMark', 'NvtxMark'),
  (59, 'NvtxPushPopRange', 'NvtxPushPopRange'), (60, 'NvtxStartEndRange', 'NvtxStartEndRange');
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,
  deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, greenContextId INTEGER,
  streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
  demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, mangledName INTEGER,
  registersPerThread INTEGER NOT NULL, gridX INTEGER NOT NULL, gridY INTEGER NOT NULL,
  gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL, blockY INTEGER NOT NULL,
  blockZ INTEGER NOT NULL, staticSharedMemory INTEGER NOT NULL,
  dynamicSharedMemory INTEGER NOT NULL, graphNodeId INTEGER, graphId INTEGER);
INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES
  (100, 200, 0, 1, NULL, 7, 11, 0, 1, 2, NULL, 32, 4, 2, 1, 128, 1, 1, 1024, 2048, 9, 5),
  (150, 400, 1, 2, NULL, 13, 21, 0, 6, 9, NULL, 96, 8, 1, 1, 512, 1, 1, 0, 4096, NULL, NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, end INTEGER NOT NULL,
  deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
  correlationId INTEGER, globalPid INTEGER, bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL,
  srcDeviceId INTEGER, dstDeviceId INTEGER, graphNodeId INTEGER);
INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES
  (50, 90, 0, 1, 7, 12, 0, 1000, 1, NULL, NULL, NULL),
  (410, 420, 1, 2, 13, 22, 0, 4096, 10, 1, 0, NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INTEGER NOT NULL, end INTEGER NOT NULL,
  deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
  correlationId INTEGER, globalPid INTEGER, value INTEGER NOT NULL, bytes INTEGER NOT NULL,
  graphNodeId INTEGER, memKind INTEGER);
INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES (430, 431, 1, 2, 13, 23, 0, 0, 64, NULL, 1);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL,
  eventClass INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER,
  nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL, callchainId INTEGER);
INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES
  (90, 95, 0, 281546145665171, 11, 3, 0, NULL),
  (91, 94, 1, 281546145665171, 11, 4, 0, NULL),
  (89, 96, 67, 281546145665171, 11, 3, 0, NULL),
  (500, 700, 0, 281546145665172, 13, 8, 0, NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (start INTEGER NOT NULL, end INTEGER NOT NULL,
  deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
  correlationId INTEGER, globalPid INTEGER, syncType INTEGER NOT NULL, eventId INTEGER NOT NULL);
INSERT INTO CUPTI_ACTIVITY_KIND_SYNCHRONIZATION VALUES
  (510, 690, 1, 2, 13, 13, 281546145660928, 3, 0);
CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL,
  rangeId INTEGER, category INTEGER, color INTEGER, text TEXT, globalTid INTEGER,
  endGlobalTid INTEGER, textId INTEGER, domainId INTEGER);
INSERT INTO NVTX_EVENTS VALUES
  (10, 600, 59, NULL, NULL, NULL, 'forward', 281546145665171, NULL, NULL, 0),
  (20, 650, 60, 1, NULL, NULL, NULL, 281546145665172, 281546145665171, 7, 0),
  (30, NULL, 34, NULL, NULL, NULL, 'a mark', 281546145665171, NULL, NULL, 0);
CREATE TABLE TARGET_INFO_GPU (vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT,
  totalMemory INTEGER, memoryBandwidth INTEGER, clockRate INTEGER, smCount INTEGER,
  computeMajor INTEGER, computeMinor INTEGER);
INSERT INTO TARGET_INFO_GPU VALUES
  (281474976710656, 0, 'NVIDIA H100 80GB HBM3', 85520809984, 3352320000000, 1980000000, 132, 9, 0),
  (281474976710656, 1, 'NVIDIA H200', 150754820096, 4800000000000, 1980000000, 132, 9, 0),
  (281474976710656, 2, 'NVIDIA L4', 23580639232, 300000000000, 2040000000, 58, 8, 9);
CREATE TABLE TARGET_INFO_CUDA_DEVICE (gpuId INTEGER, cudaId INTEGER NOT NULL,
  pid INTEGER NOT NULL, uuid TEXT, numMultiprocessors INTEGER);
INSERT INTO TARGET_INFO_CUDA_DEVICE VALUES (1, 0, 4242, NULL, 132), (0, 1, 4242, NULL, 132);
CREATE TABLE PROCESSES (globalPid INTEGER, pid INTEGER, name TEXT);
INSERT INTO PROCESSES VALUES (281546145660928, 4242, 'python3');
CREATE TABLE ThreadNames (nameId INTEGER NOT NULL, priority INTEGER, globalTid INTEGER);
INSERT INTO ThreadNames VALUES (5, 20, 281546145665171);
)sql";

// An export in the shape of older nsys versions (around 2021): no memset or
// sync table, no enum tables, no graphId/greenContextId/eventClass/textId
// columns, a kernel name stored inline as text and the API name only in a
// text column.
constexpr char kOldSchema[] = R"sql(
CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO StringIds VALUES (1, 'saxpy');
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,
  deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
  correlationId INTEGER, globalPid INTEGER, demangledName, shortName INTEGER NOT NULL,
  registersPerThread INTEGER NOT NULL, gridX INTEGER NOT NULL, gridY INTEGER NOT NULL,
  gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL, blockY INTEGER NOT NULL,
  blockZ INTEGER NOT NULL, staticSharedMemory INTEGER NOT NULL,
  dynamicSharedMemory INTEGER NOT NULL, graphNodeId INTEGER);
INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES
  (1000, 3000, 0, 1, 7, 140, 0, 'saxpy(double *, double *, double, int)', 1, 26, 2, 1, 1,
   512, 1, 1, 0, 0, NULL),
  (4000, 5000, 0, 1, 7, 141, 0, NULL, 1, 26, 2, 1, 1, 512, 1, 1, 0, 0, NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, end INTEGER NOT NULL,
  deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
  correlationId INTEGER, bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL);
INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (3100, 3900, 0, 1, 7, 142, 8, 2),
  (5100, 5200, 0, 1, 7, 143, 8, 99);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL,
  globalTid INTEGER, correlationId INTEGER, name TEXT);
INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (3050, 3950, 281546145665171, 142, 'cudaMemcpy_v3020');
CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL,
  text TEXT, globalTid INTEGER);
INSERT INTO NVTX_EVENTS VALUES (900, 5500, 59, 'saxpy loop', 281546145665171),
  (800, NULL, 75, 'MPI', 281546145665171), (850, NULL, 39, 'MPI Rank 0', 281546145665171);
CREATE TABLE TARGET_INFO_GPU (vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT);
INSERT INTO TARGET_INFO_GPU VALUES (281474976710656, 0, 'NVIDIA A100-SXM4-40GB');
)sql";

TEST(NsysGlobalTid, DecodesPidAndTidBelowTheMachineBits) {
  const NsysThreadId t = DecodeNsysGlobalTid(GlobalTid(4242, 4243));
  EXPECT_EQ(t.pid, 4242);
  EXPECT_EQ(t.tid, 4243);
  // Values from the shared samples, checked against their PROCESSES tables.
  EXPECT_EQ(DecodeNsysGlobalTid(281475010265113).pid, 2);
  EXPECT_EQ(DecodeNsysGlobalTid(281475010265113).tid, 25);
  EXPECT_EQ(DecodeNsysGlobalTid(302119224788637).pid, 1230493);
  EXPECT_EQ(DecodeNsysGlobalTid(302119224788637).tid, 1230493);
  EXPECT_EQ(DecodeNsysGlobalTid(281482794893312).pid, 466);  // a globalPid: tid part 0
  EXPECT_EQ(DecodeNsysGlobalTid(281482794893312).tid, 0);
  EXPECT_EQ(GlobalTid(4242, 4243), 281546145665171);  // the value the SQL fixtures use
}

TEST(NsysNames, CopyKindsFollowCuptiNumbering) {
  EXPECT_EQ(NsysCopyKindName(1), "HtoD");
  EXPECT_EQ(NsysCopyKindName(2), "DtoH");
  EXPECT_EQ(NsysCopyKindName(3), "HtoA");
  EXPECT_EQ(NsysCopyKindName(4), "AtoH");
  EXPECT_EQ(NsysCopyKindName(5), "AtoA");
  EXPECT_EQ(NsysCopyKindName(6), "AtoD");
  EXPECT_EQ(NsysCopyKindName(7), "DtoA");
  EXPECT_EQ(NsysCopyKindName(8), "DtoD");
  EXPECT_EQ(NsysCopyKindName(9), "HtoH");
  EXPECT_EQ(NsysCopyKindName(10), "PtoP");
  EXPECT_EQ(NsysCopyKindName(11), "UVM HtoD");
  EXPECT_EQ(NsysCopyKindName(0), "Unknown");
  EXPECT_EQ(NsysCopyKindName(99), "Unknown");
  EXPECT_EQ(NsysCopyKindName(-1), "Unknown");
  EXPECT_EQ(NsysCopyKindFromEnumName("CUDA_MEMCPY_KIND_UVM_DTOD"), "UVM DtoD");
  EXPECT_EQ(NsysCopyKindFromEnumName(""), "Unknown");
}

TEST(NsysNames, StripsApiVersionSuffix) {
  EXPECT_EQ(StripNsysApiVersion("cudaLaunchKernel_v7000"), "cudaLaunchKernel");
  EXPECT_EQ(StripNsysApiVersion("cudaLaunchKernel_ptsz_v7000"), "cudaLaunchKernel_ptsz");
  EXPECT_EQ(StripNsysApiVersion("cuLaunchKernel"), "cuLaunchKernel");
  EXPECT_EQ(StripNsysApiVersion("my_var"), "my_var");
  EXPECT_EQ(StripNsysApiVersion("f_v"), "f_v");
  EXPECT_EQ(StripNsysApiVersion("_v12"), "_v12");
}

TEST(NsysReader, AcceptsNsysExportsOnly) {
  auto reader = MakeNsysReader();
  EXPECT_EQ(reader->format(), "nsys");

  TempDb nsys(kModernSchema);
  EXPECT_TRUE(reader->Accepts(ProbeSqlite(nsys.path())));

  TempDb nvtx_only("CREATE TABLE NVTX_EVENTS (start INTEGER, end INTEGER, eventType INTEGER);");
  EXPECT_TRUE(reader->Accepts(ProbeSqlite(nvtx_only.path())));

  TempDb other(
      "CREATE TABLE kernels (start INTEGER, end INTEGER);"
      "CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);");
  EXPECT_FALSE(reader->Accepts(ProbeSqlite(other.path())));

  FileProbe not_sqlite;
  not_sqlite.sql_tables = {"CUPTI_ACTIVITY_KIND_KERNEL"};
  EXPECT_FALSE(reader->Accepts(not_sqlite));
}

TEST(NsysReader, ReadsModernSchema) {
  TempDb db(kModernSchema);
  Trace trace;
  ASSERT_TRUE(ReadInto(db.path(), 0, &trace).ok());

  // Devices: only the two with activity; CUDA id 0 is GPU 1 per TARGET_INFO_CUDA_DEVICE.
  ASSERT_EQ(trace.devices.size(), 2u);
  const DeviceInfo& d0 = trace.devices[trace.DeviceIndex(0, 0)];
  const DeviceInfo& d1 = trace.devices[trace.DeviceIndex(0, 1)];
  EXPECT_EQ(d0.name, "NVIDIA H200");
  EXPECT_EQ(d0.memory_bytes, 150754820096);
  EXPECT_DOUBLE_EQ(d0.memory_bandwidth_gbps, 4800.0);
  EXPECT_EQ(d1.name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(d1.sm_count, 132);
  EXPECT_EQ(d1.cc_major, 9);
  EXPECT_EQ(d1.cc_minor, 0);
  EXPECT_EQ(d1.clock_khz, 1980000);
  EXPECT_DOUBLE_EQ(d1.memory_bandwidth_gbps, 3352.32);

  const auto kernels = OfKind(trace, GpuKind::kKernel);
  ASSERT_EQ(kernels.size(), 2u);
  const GpuActivity& gemm = *kernels[0];
  EXPECT_EQ(Name(trace, gemm.name), "void gemm<float>(float *, int)");
  EXPECT_EQ(gemm.start, 100);
  EXPECT_EQ(gemm.end, 200);
  EXPECT_EQ(gemm.device_index, trace.DeviceIndex(0, 0));
  EXPECT_EQ(gemm.stream, 7);
  EXPECT_EQ(gemm.correlation, 11);
  EXPECT_EQ(gemm.grid[0], 4);
  EXPECT_EQ(gemm.grid[1], 2);
  EXPECT_EQ(gemm.grid[2], 1);
  EXPECT_EQ(gemm.block[0], 128);
  EXPECT_EQ(gemm.registers, 32);
  EXPECT_EQ(gemm.shared_memory, 3072);
  EXPECT_EQ(gemm.graph_id, 5);
  EXPECT_EQ(gemm.graph_node, 9);
  const GpuActivity& nccl = *kernels[1];
  EXPECT_EQ(Name(trace, nccl.name),
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096>)");
  EXPECT_EQ(nccl.device_index, trace.DeviceIndex(0, 1));
  EXPECT_EQ(nccl.graph_id, -1);
  EXPECT_EQ(nccl.graph_node, -1);

  const auto memcpys = OfKind(trace, GpuKind::kMemcpy);
  ASSERT_EQ(memcpys.size(), 2u);
  EXPECT_EQ(Name(trace, memcpys[0]->copy_kind), "HtoD");
  EXPECT_EQ(Name(trace, memcpys[0]->name), "Memcpy HtoD");
  EXPECT_EQ(memcpys[0]->bytes, 1000);
  EXPECT_EQ(memcpys[0]->correlation, 12);
  EXPECT_EQ(Name(trace, memcpys[1]->copy_kind), "PtoP");

  const auto memsets = OfKind(trace, GpuKind::kMemset);
  ASSERT_EQ(memsets.size(), 1u);
  EXPECT_EQ(Name(trace, memsets[0]->name), "Memset");
  EXPECT_EQ(memsets[0]->bytes, 64);
  EXPECT_EQ(memsets[0]->stream, 13);

  // Runtime: the backtrace copy (event class 67) is skipped; names lose "_vNNNN".
  ASSERT_EQ(trace.api.size(), 4u);
  EXPECT_EQ(Name(trace, trace.api[0].name), "cudaLaunchKernel");
  EXPECT_EQ(trace.api[0].kind, ApiKind::kRuntime);
  EXPECT_EQ(trace.api[0].pid, 4242);
  EXPECT_EQ(trace.api[0].tid, 4243);
  EXPECT_EQ(trace.api[0].correlation, 11);
  EXPECT_EQ(trace.api[0].start, 90);
  EXPECT_EQ(trace.api[0].end, 95);
  EXPECT_EQ(Name(trace, trace.api[1].name), "cuLaunchKernel");
  EXPECT_EQ(trace.api[1].kind, ApiKind::kDriver);
  EXPECT_EQ(Name(trace, trace.api[2].name), "cudaStreamSynchronize");
  EXPECT_EQ(trace.stats.Get("nsys_runtime_other_class"), 1);

  // Sync: named from syncType, thread taken from the runtime call it belongs to.
  const ApiCall& sync = trace.api[3];
  EXPECT_EQ(sync.kind, ApiKind::kSync);
  EXPECT_EQ(Name(trace, sync.name), "cudaStreamSynchronize");
  EXPECT_EQ(sync.pid, 4242);
  EXPECT_EQ(sync.tid, 4244);
  EXPECT_EQ(sync.correlation, 13);
  EXPECT_EQ(sync.start, 510);

  // NVTX: a push/pop range with inline text, a start/end range with textId; the mark is skipped.
  ASSERT_EQ(trace.ranges.size(), 2u);
  EXPECT_EQ(Name(trace, trace.ranges[0].name), "forward");
  EXPECT_EQ(trace.ranges[0].domain, RangeDomain::kNvtx);
  EXPECT_EQ(trace.ranges[0].device_index, -1);
  EXPECT_EQ(trace.ranges[0].tid, 4243);
  EXPECT_EQ(trace.ranges[0].end, 600);
  EXPECT_EQ(Name(trace, trace.ranges[1].name), "step");
  EXPECT_EQ(trace.ranges[1].tid, 4244);

  ASSERT_EQ(trace.processes.size(), 1u);
  EXPECT_EQ(trace.processes[0].pid, 4242);
  EXPECT_EQ(trace.processes[0].name, "python3");
  ASSERT_EQ(trace.threads.size(), 1u);
  EXPECT_EQ(trace.threads[0].tid, 4243);
  EXPECT_EQ(trace.threads[0].name, "pt_main_thread");

  // Nothing malformed: the only statistic is the informative one above.
  EXPECT_EQ(trace.stats.all().size(), 1u);
  EXPECT_EQ(trace.metadata["format"], "nsys");
  EXPECT_EQ(trace.metadata["source"], db.path());
}

TEST(NsysReader, ReadsOldSchemaWithMissingTablesAndColumns) {
  TempDb db(kOldSchema);
  Trace trace;
  ASSERT_TRUE(ReadInto(db.path(), 0, &trace).ok());

  ASSERT_EQ(trace.devices.size(), 1u);
  EXPECT_EQ(trace.devices[0].name, "NVIDIA A100-SXM4-40GB");
  EXPECT_EQ(trace.devices[0].sm_count, 0);  // not in this export

  const auto kernels = OfKind(trace, GpuKind::kKernel);
  ASSERT_EQ(kernels.size(), 2u);
  EXPECT_EQ(Name(trace, kernels[0]->name), "saxpy(double *, double *, double, int)");
  EXPECT_EQ(Name(trace, kernels[1]->name), "saxpy");  // NULL demangledName: shortName
  EXPECT_EQ(kernels[0]->graph_id, -1);
  EXPECT_EQ(kernels[0]->graph_node, -1);
  EXPECT_EQ(kernels[0]->block[0], 512);

  const auto memcpys = OfKind(trace, GpuKind::kMemcpy);
  ASSERT_EQ(memcpys.size(), 2u);
  EXPECT_EQ(Name(trace, memcpys[0]->copy_kind), "DtoH");  // CUPTI numbering, no enum table
  EXPECT_EQ(Name(trace, memcpys[1]->name), "Memcpy Unknown");
  EXPECT_TRUE(OfKind(trace, GpuKind::kMemset).empty());

  ASSERT_EQ(trace.api.size(), 1u);
  EXPECT_EQ(Name(trace, trace.api[0].name), "cudaMemcpy");
  EXPECT_EQ(trace.api[0].kind, ApiKind::kRuntime);
  EXPECT_EQ(trace.api[0].tid, 4243);

  ASSERT_EQ(trace.ranges.size(), 1u);  // domain creation (75) and thread naming (39) skipped
  EXPECT_EQ(Name(trace, trace.ranges[0].name), "saxpy loop");

  EXPECT_TRUE(trace.processes.empty());
  EXPECT_TRUE(trace.threads.empty());
  EXPECT_TRUE(trace.stats.all().empty());
}

TEST(NsysReader, EnumTablesOverrideCuptiNumbering) {
  TempDb db(R"sql(
    CREATE TABLE ENUM_CUDA_MEMCPY_OPER (id INTEGER PRIMARY KEY, name TEXT, label TEXT);
    INSERT INTO ENUM_CUDA_MEMCPY_OPER VALUES (1, 'CUDA_MEMCPY_KIND_DTOD', 'Device-to-Device');
    CREATE TABLE ENUM_CUPTI_SYNC_TYPE (id INTEGER PRIMARY KEY, name TEXT, label TEXT);
    INSERT INTO ENUM_CUPTI_SYNC_TYPE VALUES
      (1, 'CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE', 'Context sync');
    CREATE TABLE ENUM_NSYS_EVENT_TYPE (id INTEGER PRIMARY KEY, name TEXT, label TEXT);
    INSERT INTO ENUM_NSYS_EVENT_TYPE VALUES (59, 'NvtxMark', ''), (90, 'NvtxPushPopRange', '');
    CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER, end INTEGER, deviceId INTEGER,
      bytes INTEGER, copyKind INTEGER);
    INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (1, 2, 0, 8, 1);
    CREATE TABLE CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (start INTEGER, end INTEGER,
      syncType INTEGER);
    INSERT INTO CUPTI_ACTIVITY_KIND_SYNCHRONIZATION VALUES (3, 4, 1);
    CREATE TABLE NVTX_EVENTS (start INTEGER, end INTEGER, eventType INTEGER, text TEXT);
    INSERT INTO NVTX_EVENTS VALUES (1, 5, 59, 'not a range here'), (1, 5, 90, 'a range');
  )sql");
  Trace trace;
  ASSERT_TRUE(ReadInto(db.path(), 0, &trace).ok());
  ASSERT_EQ(trace.gpu.size(), 1u);
  EXPECT_EQ(Name(trace, trace.gpu[0].copy_kind), "DtoD");
  ASSERT_EQ(trace.api.size(), 1u);
  EXPECT_EQ(Name(trace, trace.api[0].name), "cudaDeviceSynchronize");
  EXPECT_EQ(trace.api[0].tid, 0);  // no runtime call to take it from
  ASSERT_EQ(trace.ranges.size(), 1u);
  EXPECT_EQ(Name(trace, trace.ranges[0].name), "a range");
}

TEST(NsysReader, ResolvesSparseStringIds) {
  // Ids far apart (nsys 2026 numbers strings up to ~330k for ~140 strings)
  // and one beyond any sensible dense table.
  TempDb db(R"sql(
    CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
    INSERT INTO StringIds VALUES (5, 'near'), (1099511627776, 'far');
    CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER,
      demangledName INTEGER);
    INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (1, 2, 0, 1099511627776), (3, 4, 0, 5),
      (5, 6, 0, 6);
  )sql");
  Trace trace;
  ASSERT_TRUE(ReadInto(db.path(), 0, &trace).ok());
  ASSERT_EQ(trace.gpu.size(), 3u);
  EXPECT_EQ(Name(trace, trace.gpu[0].name), "far");
  EXPECT_EQ(Name(trace, trace.gpu[1].name), "near");
  EXPECT_EQ(trace.gpu[2].name, 0u);
  EXPECT_EQ(trace.stats.Get("nsys_unknown_string_id"), 1);
}

TEST(NsysReader, CountsMalformedRowsAndSkipsThem) {
  TempDb db(R"sql(
    CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
    INSERT INTO StringIds VALUES (1, 'k');
    CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER,
      streamId INTEGER, demangledName INTEGER, shortName INTEGER);
    INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES
      (NULL, 10, 0, 7, 1, 1),
      (20, 10, 3, 7, 1, 1),
      (5, 10, NULL, 7, 1, 1),
      (30, 40, 0, 7, 999, NULL),
      (50, 50, 0, 7, 1, 1);
    CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER, end INTEGER, deviceId INTEGER,
      bytes INTEGER, copyKind INTEGER);
    INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (60, NULL, 4, 8, 1);
    CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER, end INTEGER, globalTid INTEGER,
      correlationId INTEGER, nameId INTEGER);
    INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (100, 90, 281546145665171, 1, 1);
    CREATE TABLE NVTX_EVENTS (start INTEGER, end INTEGER, eventType INTEGER, text TEXT);
    INSERT INTO NVTX_EVENTS VALUES (1, NULL, 59, 'never popped'), (9, 3, 60, 'inverted');
    CREATE TABLE TARGET_INFO_GPU (vmId INTEGER, id INTEGER, name TEXT);
    INSERT INTO TARGET_INFO_GPU VALUES (0, 3, 'only in a bad row'), (0, 4, 'only in a bad row');
  )sql");
  Trace trace;
  ASSERT_TRUE(ReadInto(db.path(), 0, &trace).ok());

  // Kept: the kernel with an unknown name id (empty name) and the zero-length kernel.
  ASSERT_EQ(trace.gpu.size(), 2u);
  EXPECT_EQ(trace.gpu[0].name, 0u);
  EXPECT_EQ(trace.gpu[0].start, 30);
  EXPECT_EQ(Name(trace, trace.gpu[1].name), "k");
  EXPECT_TRUE(trace.api.empty());
  EXPECT_TRUE(trace.ranges.empty());

  // Devices 3 and 4 appear only in skipped rows.
  ASSERT_EQ(trace.devices.size(), 1u);
  EXPECT_EQ(trace.devices[0].device, 0);

  EXPECT_EQ(trace.stats.Get("nsys_kernel_bad_row"), 3);
  EXPECT_EQ(trace.stats.Get("nsys_memcpy_bad_row"), 1);
  EXPECT_EQ(trace.stats.Get("nsys_runtime_bad_row"), 1);
  EXPECT_EQ(trace.stats.Get("nsys_nvtx_bad_row"), 1);
  EXPECT_EQ(trace.stats.Get("nsys_nvtx_unterminated"), 1);
  EXPECT_EQ(trace.stats.Get("nsys_unknown_string_id"), 1);
  for (const ImportStat& s : trace.stats.all()) {
    EXPECT_EQ(s.severity, "data_loss") << s.name;
    EXPECT_FALSE(s.description.empty()) << s.name;
  }
}

TEST(NsysReader, SkipsTableWithoutEssentialColumn) {
  TempDb db(R"sql(
    CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, streamId INTEGER);
    INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (1, 2, 7);
    CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INTEGER, end INTEGER, deviceId INTEGER);
    INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES (1, 2, 0);
  )sql");
  Trace trace;
  ASSERT_TRUE(ReadInto(db.path(), 0, &trace).ok());
  EXPECT_EQ(trace.stats.Get("nsys_kernel_unusable"), 1);
  ASSERT_EQ(trace.gpu.size(), 1u);
  EXPECT_EQ(trace.gpu[0].kind, GpuKind::kMemset);
  EXPECT_EQ(trace.gpu[0].bytes, 0);
}

TEST(NsysReader, ExportWithoutGpuActivityHasNoDevices) {
  TempDb db(R"sql(
    CREATE TABLE NVTX_EVENTS (start INTEGER, end INTEGER, eventType INTEGER, text TEXT);
    INSERT INTO NVTX_EVENTS VALUES (1, 5, 59, 'cpu only');
    CREATE TABLE TARGET_INFO_GPU (vmId INTEGER, id INTEGER, name TEXT);
    INSERT INTO TARGET_INFO_GPU VALUES (0, 0, 'idle GPU');
  )sql");
  Trace trace;
  ASSERT_TRUE(ReadInto(db.path(), 0, &trace).ok());
  EXPECT_TRUE(trace.devices.empty());
  EXPECT_EQ(trace.ranges.size(), 1u);
  const ImportStat* stat = FindStat(trace, "nsys_no_gpu_activity");
  ASSERT_NE(stat, nullptr);
  EXPECT_EQ(stat->severity, "info");
}

TEST(NsysReader, UsesOrdinalAsRankAndAppendsMetadata) {
  TempDb db(kModernSchema);
  Trace trace;
  trace.metadata["format"] = "kineto";
  trace.metadata["source"] = "rank0.json";
  ASSERT_TRUE(ReadInto(db.path(), 3, &trace).ok());
  for (const DeviceInfo& d : trace.devices) EXPECT_EQ(d.rank, 3);
  for (const ApiCall& c : trace.api) EXPECT_EQ(c.rank, 3);
  for (const Range& r : trace.ranges) EXPECT_EQ(r.rank, 3);
  EXPECT_EQ(trace.processes[0].rank, 3);
  EXPECT_EQ(trace.metadata["format"], "kineto;nsys");
  EXPECT_EQ(trace.metadata["source"], "rank0.json;" + db.path());

  ASSERT_TRUE(ReadInto(db.path(), 4, &trace).ok());
  EXPECT_EQ(trace.metadata["format"], "kineto;nsys");
  EXPECT_EQ(trace.metadata["source"], "rank0.json;" + db.path() + ";" + db.path());
  EXPECT_EQ(trace.devices.size(), 4u);
}

TEST(NsysReader, ReportsProgressInRows) {
  TempDb db(kModernSchema);
  Trace trace;
  std::vector<std::pair<int64_t, int64_t>> calls;
  ImportOptions options;
  options.progress = [&](int64_t done, int64_t total) { calls.emplace_back(done, total); };
  ASSERT_TRUE(ReadInto(db.path(), 0, &trace, options).ok());
  ASSERT_FALSE(calls.empty());
  // 2 kernels, 2 memcpys, 1 memset, 4 runtime, 1 sync, 3 NVTX rows.
  EXPECT_EQ(calls.back(), std::make_pair(int64_t{13}, int64_t{13}));
}

TEST(NsysReader, BrokenFileIsBadInput) {
  const std::string path =
      (fs::temp_directory_path() / ("nsys_reader_test_broken_" + std::to_string(getpid())))
          .string();
  {
    std::ofstream out(path, std::ios::binary);
    out << std::string("SQLite format 3\0", 16) << std::string(4080, '\x5a');
  }
  Trace trace;
  const Status st = ReadInto(path, 0, &trace);
  fs::remove(path);
  EXPECT_EQ(st.code(), StatusCode::kBadInput);
  EXPECT_EQ(st.message().rfind(path + ": ", 0), 0u) << st.message();
  EXPECT_EQ(st.message().find('\n'), std::string::npos);

  const Status missing = ReadInto(path + ".absent", 0, &trace);
  EXPECT_EQ(missing.code(), StatusCode::kBadInput);
}

// The exports under shared/traces/nsys; the counts below were checked with
// sqlite3 queries on the files themselves.
std::string SharedTrace(const std::string& name) {
  return std::string(DYNAFLOW_SOURCE_DIR) + "/../shared/traces/nsys/" + name;
}

#define SKIP_IF_ABSENT(path)              \
  if (!fs::exists(path)) {                \
    GTEST_SKIP() << "missing " << (path); \
  }

struct Counts {
  std::map<std::pair<int32_t, GpuKind>, int> gpu;  // (device, kind) -> rows
  std::map<std::string, int> copy_kinds;
  std::map<ApiKind, int> api;
  std::map<std::string, int> api_names;
};

Counts Count(const Trace& trace) {
  Counts c;
  for (const GpuActivity& a : trace.gpu) {
    ++c.gpu[{trace.devices[a.device_index].device, a.kind}];
    if (a.kind == GpuKind::kMemcpy) ++c.copy_kinds[Name(trace, a.copy_kind)];
  }
  for (const ApiCall& a : trace.api) {
    ++c.api[a.kind];
    ++c.api_names[Name(trace, a.name)];
  }
  return c;
}

TEST(NsysSamples, H100TwoGpus) {
  const std::string path = SharedTrace("nsysai_h100_2gpu_1s.sqlite");
  SKIP_IF_ABSENT(path)
  EXPECT_TRUE(MakeNsysReader()->Accepts(ProbeSqlite(path)));
  Trace trace;
  const Status st = ReadInto(path, 0, &trace);
  ASSERT_TRUE(st.ok()) << st.message();

  ASSERT_EQ(trace.devices.size(), 2u);
  EXPECT_EQ(trace.devices[0].device, 0);
  EXPECT_EQ(trace.devices[1].device, 1);
  EXPECT_EQ(trace.devices[0].name, "");  // this export has no TARGET_INFO_GPU

  const Counts c = Count(trace);
  for (int32_t device : {0, 1}) {
    EXPECT_EQ((c.gpu.at({device, GpuKind::kKernel})), 1721) << device;
    EXPECT_EQ((c.gpu.at({device, GpuKind::kMemcpy})), 452) << device;
    EXPECT_EQ((c.gpu.at({device, GpuKind::kMemset})), 11) << device;
  }
  EXPECT_EQ(c.copy_kinds.at("HtoD"), 450);
  EXPECT_EQ(c.copy_kinds.at("DtoH"), 4);
  EXPECT_EQ(c.copy_kinds.at("DtoD"), 450);

  int64_t device0_kernel_ns = 0;
  for (const GpuActivity& a : trace.gpu) {
    if (a.kind == GpuKind::kKernel && trace.devices[a.device_index].device == 0) {
      device0_kernel_ns += a.end - a.start;
    }
  }
  EXPECT_EQ(device0_kernel_ns, 22385163);

  EXPECT_EQ(c.api.at(ApiKind::kRuntime), 5796);
  EXPECT_EQ(c.api.at(ApiKind::kSync), 244);
  EXPECT_EQ(c.api.count(ApiKind::kDriver), 0u);
  EXPECT_EQ(c.api_names.at("cudaLaunchKernel"), 2788);
  EXPECT_EQ(c.api_names.at("cudaStreamWaitEvent"), 236 + 236);  // API calls + sync records
  EXPECT_EQ(c.api_names.at("cudaStreamSynchronize"), 8 + 8);
  std::map<int32_t, int> runtime_per_pid;
  for (const ApiCall& a : trace.api) {
    if (a.kind == ApiKind::kRuntime) ++runtime_per_pid[a.pid];
  }
  EXPECT_EQ(runtime_per_pid, (std::map<int32_t, int>{{111, 2898}, {112, 2898}}));
  for (const ApiCall& a : trace.api) {
    if (a.kind == ApiKind::kSync) {
      EXPECT_EQ(a.tid, a.pid);  // each process's main thread synchronized
    }
  }

  EXPECT_EQ(trace.ranges.size(), 16782u);
  EXPECT_EQ(trace.processes.size(), 159u);
  EXPECT_EQ(trace.threads.size(), 843u);
  EXPECT_TRUE(trace.stats.all().empty());
}

TEST(NsysSamples, MockRtx3080) {
  const std::string path = SharedTrace("nsysai_mock_rtx3080.sqlite");
  SKIP_IF_ABSENT(path)
  Trace trace;
  const Status st = ReadInto(path, 0, &trace);
  ASSERT_TRUE(st.ok()) << st.message();

  ASSERT_EQ(trace.devices.size(), 1u);
  const DeviceInfo& d = trace.devices[0];
  EXPECT_EQ(d.name, "NVIDIA GeForce RTX 3080");
  EXPECT_EQ(d.sm_count, 68);
  EXPECT_EQ(d.cc_major, 8);
  EXPECT_EQ(d.cc_minor, 6);
  EXPECT_EQ(d.memory_bytes, 10736893952);
  EXPECT_EQ(d.clock_khz, 1710000);
  EXPECT_DOUBLE_EQ(d.memory_bandwidth_gbps, 760.08);

  const Counts c = Count(trace);
  EXPECT_EQ((c.gpu.at({0, GpuKind::kKernel})), 2);
  EXPECT_EQ((c.gpu.at({0, GpuKind::kMemcpy})), 1);
  EXPECT_EQ(c.copy_kinds.at("DtoH"), 1);
  EXPECT_EQ(c.api.at(ApiKind::kRuntime), 8);
  EXPECT_EQ(c.api.at(ApiKind::kDriver), 1);
  EXPECT_EQ(c.api.at(ApiKind::kSync), 1);
  EXPECT_TRUE(trace.ranges.empty());
  EXPECT_EQ(trace.processes.size(), 81u);
  EXPECT_EQ(trace.threads.size(), 411u);
  EXPECT_EQ(trace.stats.Get("nsys_no_gpu_activity"), 0);
}

TEST(NsysSamples, PipitSaxpyA100) {
  const std::string path = SharedTrace("pipit_saxpy_a100.sqlite");
  SKIP_IF_ABSENT(path)
  Trace trace;
  const Status st = ReadInto(path, 0, &trace);
  ASSERT_TRUE(st.ok()) << st.message();

  ASSERT_EQ(trace.devices.size(), 1u);
  EXPECT_EQ(trace.devices[0].name, "NVIDIA A100-SXM4-40GB");
  EXPECT_EQ(trace.devices[0].sm_count, 108);
  EXPECT_EQ(trace.devices[0].cc_major, 8);
  EXPECT_EQ(trace.devices[0].cc_minor, 0);
  EXPECT_EQ(trace.devices[0].memory_bytes, 42297524224);

  const Counts c = Count(trace);
  EXPECT_EQ((c.gpu.at({0, GpuKind::kKernel})), 5);
  EXPECT_EQ((c.gpu.at({0, GpuKind::kMemcpy})), 15);
  EXPECT_EQ((c.gpu.count({0, GpuKind::kMemset})), 0u);
  EXPECT_EQ(c.copy_kinds.at("HtoD"), 10);
  EXPECT_EQ(c.copy_kinds.at("DtoH"), 5);
  EXPECT_EQ(Name(trace, trace.gpu[0].name), "saxpy(double *, double *, double *, double, int)");

  // 56 runtime + 1 driver call; the 38 "CUDA backtrace" copies are skipped.
  EXPECT_EQ(c.api.at(ApiKind::kRuntime), 56);
  EXPECT_EQ(c.api.at(ApiKind::kDriver), 1);
  EXPECT_EQ(c.api_names.at("cudaMalloc"), 15);
  EXPECT_EQ(trace.stats.Get("nsys_runtime_other_class"), 38);
  for (const ApiCall& a : trace.api) {
    EXPECT_EQ(a.pid, 1230493);
    EXPECT_EQ(a.tid, 1230493);
  }

  ASSERT_EQ(trace.ranges.size(), 22u);
  std::map<std::string, int> ranges;
  for (const Range& r : trace.ranges) ++ranges[Name(trace, r.name)];
  EXPECT_EQ(ranges.at("MPI_Send"), 10);
  EXPECT_EQ(ranges.at("saxpy"), 5);
  EXPECT_EQ(trace.processes.size(), 1667u);
  EXPECT_EQ(trace.threads.size(), 6u);
}

TEST(NsysSamples, TwoFilesKeepTheirRanks) {
  const std::string mock = SharedTrace("nsysai_mock_rtx3080.sqlite");
  const std::string a100 = SharedTrace("pipit_saxpy_a100.sqlite");
  SKIP_IF_ABSENT(mock)
  SKIP_IF_ABSENT(a100)
  Trace trace;
  ASSERT_TRUE(ReadInto(mock, 0, &trace).ok());
  ASSERT_TRUE(ReadInto(a100, 1, &trace).ok());
  ASSERT_EQ(trace.devices.size(), 2u);
  EXPECT_EQ(trace.devices[trace.DeviceIndex(0, 0)].name, "NVIDIA GeForce RTX 3080");
  EXPECT_EQ(trace.devices[trace.DeviceIndex(1, 0)].name, "NVIDIA A100-SXM4-40GB");
  EXPECT_EQ(trace.metadata["format"], "nsys");
  EXPECT_EQ(trace.metadata["source"], mock + ";" + a100);
}

}  // namespace
}  // namespace dynaflow
