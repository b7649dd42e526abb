// libFuzzer target for the Nsight Systems importer (ProbeFile, FindReader,
// the nsys reader's Read) and the GPU timeline analysis of what it read.
//
// Random bytes are almost never a SQLite database, so the input is not the
// file: it is a little script that edits a small, valid nsys-shaped export
// built once at start-up (StringIds, kernels, memcpys, memsets, runtime and
// synchronization calls, NVTX ranges, GPU and CUDA device info, processes,
// threads, enum tables). The script inserts rows whose values are mostly
// plausible (times near the other rows, small ids that hit StringIds and
// correlation ids) and sometimes hostile (NULL, text where an integer belongs,
// blobs, reals, INT64_MIN/MAX, negative times, ids out of range); it updates
// and deletes the base rows, drops tables and columns (the schema drift
// between nsys versions), replaces StringIds by a table without a primary key
// (so ids may repeat, be negative or text), and may corrupt bytes of the
// finished file. The empty input reads the base export unchanged. An input
// that starts with SQLite's magic is taken as the database itself, so that a
// regression can be a file written with the sqlite3 shell.
//
// The database is written to one temporary file per process, reused; set
// NSYS_FUZZER_KEEP_DB=<path> to keep a copy of the one an input produces.

#include <fuzzer/FuzzedDataProvider.h>
#include <signal.h>
#include <unistd.h>

#include <SQLiteCpp/SQLiteCpp.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "analysis/importers/reader.h"
#include "analysis/model/trace.h"
#include "analysis/timeline/timeline.h"

namespace dynaflow {
namespace {

constexpr int64_t kT0 = 1'000'000'000;  // the base export's first timestamp (ns)
constexpr int64_t kPid = 4242;
constexpr int64_t GlobalTid(int64_t pid, int64_t tid) { return (pid << 24) | tid; }

constexpr int kMaxOps = 64;
constexpr std::string_view kSqliteMagic{"SQLite format 3\0", 16};
constexpr int kMaxBulkRows = 32;

// How plausible values of a column are generated.
enum class Role {
  kStart,        // a timestamp near kT0
  kEnd,          // the row's start plus a short duration
  kDevice,       // a CUDA device id, 0..3
  kStream,       // 0..31
  kCorrelation,  // 0..15, so launches and activities meet
  kStringRef,    // a StringIds id, 0..15 (the base export uses 1..10)
  kStringId,     // StringIds.id itself
  kGlobalTid,    // nsys's serialized (pid, tid)
  kText,         // a name
  kSmall,        // a count or size, 0..1024
  kBytes,        // 0..2^32
  kEventType,    // NVTX_EVENTS.eventType
  kEnumId,       // an enum value, 0..15
  kEnumLabel,    // an nsys enum label
};

struct ColumnSpec {
  const char* name;
  const char* type;
  Role role;
};

struct TableSpec {
  const char* name;
  std::vector<ColumnSpec> columns;
};

// The tables the nsys reader looks at, with the columns it reads and a few it
// ignores. Columns are nullable so that NULLs can be inserted; SQLite stores
// text or reals in an INTEGER column when they do not convert losslessly.
const std::vector<TableSpec>& Tables() {
  static const std::vector<TableSpec> tables = {
      {"StringIds", {{"id", "INTEGER NOT NULL PRIMARY KEY", Role::kStringId},
                     {"value", "TEXT", Role::kText}}},
      {"CUPTI_ACTIVITY_KIND_KERNEL",
       {{"start", "INTEGER", Role::kStart},         {"end", "INTEGER", Role::kEnd},
        {"deviceId", "INTEGER", Role::kDevice},     {"contextId", "INTEGER", Role::kSmall},
        {"streamId", "INTEGER", Role::kStream},     {"correlationId", "INTEGER", Role::kCorrelation},
        {"globalPid", "INTEGER", Role::kGlobalTid}, {"demangledName", "INTEGER", Role::kStringRef},
        {"shortName", "INTEGER", Role::kStringRef}, {"registersPerThread", "INTEGER", Role::kSmall},
        {"gridX", "INTEGER", Role::kSmall},         {"gridY", "INTEGER", Role::kSmall},
        {"gridZ", "INTEGER", Role::kSmall},         {"blockX", "INTEGER", Role::kSmall},
        {"blockY", "INTEGER", Role::kSmall},        {"blockZ", "INTEGER", Role::kSmall},
        {"staticSharedMemory", "INTEGER", Role::kBytes},
        {"dynamicSharedMemory", "INTEGER", Role::kBytes},
        {"graphNodeId", "INTEGER", Role::kSmall},   {"graphId", "INTEGER", Role::kSmall}}},
      {"CUPTI_ACTIVITY_KIND_MEMCPY",
       {{"start", "INTEGER", Role::kStart},         {"end", "INTEGER", Role::kEnd},
        {"deviceId", "INTEGER", Role::kDevice},     {"contextId", "INTEGER", Role::kSmall},
        {"streamId", "INTEGER", Role::kStream},     {"correlationId", "INTEGER", Role::kCorrelation},
        {"globalPid", "INTEGER", Role::kGlobalTid}, {"bytes", "INTEGER", Role::kBytes},
        {"copyKind", "INTEGER", Role::kEnumId},     {"graphNodeId", "INTEGER", Role::kSmall}}},
      {"CUPTI_ACTIVITY_KIND_MEMSET",
       {{"start", "INTEGER", Role::kStart},         {"end", "INTEGER", Role::kEnd},
        {"deviceId", "INTEGER", Role::kDevice},     {"contextId", "INTEGER", Role::kSmall},
        {"streamId", "INTEGER", Role::kStream},     {"correlationId", "INTEGER", Role::kCorrelation},
        {"globalPid", "INTEGER", Role::kGlobalTid}, {"value", "INTEGER", Role::kSmall},
        {"bytes", "INTEGER", Role::kBytes},         {"graphNodeId", "INTEGER", Role::kSmall}}},
      {"CUPTI_ACTIVITY_KIND_RUNTIME",
       {{"start", "INTEGER", Role::kStart},         {"end", "INTEGER", Role::kEnd},
        {"eventClass", "INTEGER", Role::kEnumId},   {"globalTid", "INTEGER", Role::kGlobalTid},
        {"correlationId", "INTEGER", Role::kCorrelation},
        {"nameId", "INTEGER", Role::kStringRef},    {"returnValue", "INTEGER", Role::kSmall}}},
      {"CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
       {{"start", "INTEGER", Role::kStart},         {"end", "INTEGER", Role::kEnd},
        {"deviceId", "INTEGER", Role::kDevice},     {"contextId", "INTEGER", Role::kSmall},
        {"streamId", "INTEGER", Role::kStream},     {"correlationId", "INTEGER", Role::kCorrelation},
        {"globalPid", "INTEGER", Role::kGlobalTid}, {"syncType", "INTEGER", Role::kEnumId},
        {"eventId", "INTEGER", Role::kSmall}}},
      {"NVTX_EVENTS",
       {{"start", "INTEGER", Role::kStart},         {"end", "INTEGER", Role::kEnd},
        {"eventType", "INTEGER", Role::kEventType}, {"rangeId", "INTEGER", Role::kSmall},
        {"text", "TEXT", Role::kText},              {"globalTid", "INTEGER", Role::kGlobalTid},
        {"endGlobalTid", "INTEGER", Role::kGlobalTid},
        {"textId", "INTEGER", Role::kStringRef},    {"domainId", "INTEGER", Role::kSmall}}},
      {"TARGET_INFO_GPU",
       {{"vmId", "INTEGER", Role::kSmall},          {"id", "INTEGER", Role::kDevice},
        {"name", "TEXT", Role::kText},              {"totalMemory", "INTEGER", Role::kBytes},
        {"memoryBandwidth", "INTEGER", Role::kBytes},
        {"clockRate", "INTEGER", Role::kBytes},     {"smCount", "INTEGER", Role::kSmall},
        {"computeMajor", "INTEGER", Role::kEnumId}, {"computeMinor", "INTEGER", Role::kEnumId}}},
      {"TARGET_INFO_CUDA_DEVICE",
       {{"gpuId", "INTEGER", Role::kDevice},        {"cudaId", "INTEGER", Role::kDevice},
        {"pid", "INTEGER", Role::kSmall},           {"numMultiprocessors", "INTEGER", Role::kSmall}}},
      {"PROCESSES",
       {{"globalPid", "INTEGER", Role::kGlobalTid}, {"pid", "INTEGER", Role::kSmall},
        {"name", "TEXT", Role::kText}}},
      {"ThreadNames",
       {{"nameId", "INTEGER", Role::kStringRef},    {"priority", "INTEGER", Role::kSmall},
        {"globalTid", "INTEGER", Role::kGlobalTid}}},
      {"ENUM_NSYS_EVENT_CLASS",
       {{"id", "INTEGER", Role::kEnumId}, {"name", "TEXT", Role::kEnumLabel}}},
      {"ENUM_CUDA_MEMCPY_OPER",
       {{"id", "INTEGER", Role::kEnumId}, {"name", "TEXT", Role::kEnumLabel}}},
      {"ENUM_NSYS_EVENT_TYPE",
       {{"id", "INTEGER", Role::kEventType}, {"name", "TEXT", Role::kEnumLabel}}},
      {"ENUM_CUPTI_SYNC_TYPE",
       {{"id", "INTEGER", Role::kEnumId}, {"name", "TEXT", Role::kEnumLabel}}},
  };
  return tables;
}

constexpr std::array<const char*, 12> kNames = {
    "",
    "void gemm_kernel<float>(float*, int)",
    "gemm_kernel",
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
    "cudaLaunchKernel_v7000",
    "cudaMemcpyAsync_v3020",
    "ProfilerStep#1",
    "_v",
    "x_v12a",
    "NVIDIA H100 80GB HBM3",
    "\xff\xfe not utf-8 \xc3",
    "RCCL",
};

constexpr std::array<const char*, 14> kLabels = {
    "TRACE_PROCESS_EVENT_CUDA_RUNTIME",
    "TRACE_PROCESS_EVENT_CUDA_DRIVER",
    "TRACE_PROCESS_EVENT_CUDA_BACKTRACE",
    "CUDA_MEMCPY_KIND_HTOD",
    "CUDA_MEMCPY_KIND_UVM_DTOH",
    "CUDA_MEMCPY_KIND_",
    "KIND_",
    "_UNKNOWN__",
    "NvtxPushPopRange",
    "NvtxtStartEndRange",
    "NvtxMark",
    "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT",
    "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE",
    "",
};

constexpr std::array<int64_t, 8> kEventTypes = {59, 60, 70, 71, 34, 75, 0, 1};

struct Blob {
  std::vector<uint8_t> bytes;
};
using Value = std::variant<std::monostate, int64_t, double, std::string, Blob>;

// The row being generated, so that its end can follow its start.
struct RowContext {
  int64_t start = kT0;
};

Value Plausible(FuzzedDataProvider& fdp, Role role, RowContext* row) {
  switch (role) {
    case Role::kStart:
      row->start = kT0 + fdp.ConsumeIntegralInRange<int64_t>(-1000, 20000);
      return row->start;
    case Role::kEnd:
      return row->start + fdp.ConsumeIntegralInRange<int64_t>(0, 5000);
    case Role::kDevice:
      return fdp.ConsumeIntegralInRange<int64_t>(0, 3);
    case Role::kStream:
      return fdp.ConsumeIntegralInRange<int64_t>(0, 31);
    case Role::kCorrelation:
    case Role::kStringRef:
    case Role::kEnumId:
      return fdp.ConsumeIntegralInRange<int64_t>(0, 15);
    case Role::kStringId:
      return fdp.ConsumeIntegralInRange<int64_t>(0, 40);
    case Role::kGlobalTid: {
      const int64_t machine = fdp.ConsumeBool() ? 0 : int64_t{1} << 48;
      return machine | GlobalTid(kPid + fdp.ConsumeIntegralInRange<int64_t>(0, 1),
                                 kPid + fdp.ConsumeIntegralInRange<int64_t>(0, 3));
    }
    case Role::kText:
      return std::string(kNames[fdp.ConsumeIntegralInRange<size_t>(0, kNames.size() - 1)]);
    case Role::kSmall:
      return fdp.ConsumeIntegralInRange<int64_t>(0, 1024);
    case Role::kBytes:
      return fdp.ConsumeIntegralInRange<int64_t>(0, int64_t{1} << 32);
    case Role::kEventType:
      return kEventTypes[fdp.ConsumeIntegralInRange<size_t>(0, kEventTypes.size() - 1)];
    case Role::kEnumLabel:
      return std::string(kLabels[fdp.ConsumeIntegralInRange<size_t>(0, kLabels.size() - 1)]);
  }
  return std::monostate();
}

Value Hostile(FuzzedDataProvider& fdp) {
  switch (fdp.ConsumeIntegralInRange<int>(0, 10)) {
    case 0: return std::monostate();
    case 1: return std::numeric_limits<int64_t>::min();
    case 2: return std::numeric_limits<int64_t>::max();
    case 3: return int64_t{-1};
    case 4: return fdp.ConsumeIntegral<int64_t>();
    case 5: return fdp.ConsumeFloatingPoint<double>();
    case 6: return fdp.ConsumeRandomLengthString(24);
    case 7: return std::to_string(fdp.ConsumeIntegral<int32_t>());  // numeric text
    case 8: return Blob{fdp.ConsumeBytes<uint8_t>(fdp.ConsumeIntegralInRange<size_t>(0, 16))};
    case 9: return int64_t{1} << fdp.ConsumeIntegralInRange<int>(24, 62);
    default: return -(int64_t{1} << fdp.ConsumeIntegralInRange<int>(24, 62));
  }
}

// Mostly plausible; about one value in three is hostile. Running out of
// input yields plausible values, so short scripts stay near a valid export.
Value Generate(FuzzedDataProvider& fdp, Role role, RowContext* row) {
  if (fdp.ConsumeIntegral<uint8_t>() < 170) return Plausible(fdp, role, row);
  return Hostile(fdp);
}

void Bind(SQLite::Statement& stmt, int index, const Value& v) {
  if (std::holds_alternative<int64_t>(v)) {
    stmt.bind(index, std::get<int64_t>(v));
  } else if (std::holds_alternative<double>(v)) {
    stmt.bind(index, std::get<double>(v));
  } else if (std::holds_alternative<std::string>(v)) {
    stmt.bind(index, std::get<std::string>(v));
  } else if (std::holds_alternative<Blob>(v)) {
    const std::vector<uint8_t>& b = std::get<Blob>(v).bytes;
    stmt.bind(index, b.data(), static_cast<int>(b.size()));
  } else {
    stmt.bind(index);
  }
}

std::string Quote(std::string_view name) { return "\"" + std::string(name) + "\""; }

// Inserts one row given all of a table's columns. Throws SQLite::Exception
// when SQLite refuses it (the caller's script then moves on).
void InsertRow(SQLite::Database& db, const TableSpec& table, const std::vector<Value>& values) {
  std::string sql = "INSERT INTO " + Quote(table.name) + " (";
  std::string params;
  for (size_t i = 0; i < table.columns.size(); ++i) {
    sql += (i ? ", " : "") + Quote(table.columns[i].name);
    params += i ? ", ?" : "?";
  }
  sql += ") VALUES (" + params + ")";
  SQLite::Statement stmt(db, sql);
  for (size_t i = 0; i < values.size(); ++i) Bind(stmt, static_cast<int>(i) + 1, values[i]);
  stmt.exec();
}

const TableSpec& TableNamed(std::string_view name) {
  for (const TableSpec& t : Tables()) {
    if (name == t.name) return t;
  }
  std::abort();
}

void Insert(SQLite::Database& db, std::string_view table, std::vector<Value> values) {
  InsertRow(db, TableNamed(table), values);
}

// The valid export every script starts from: one process with two threads,
// two devices (device 1 without a TARGET_INFO_GPU row), compute overlapping
// communication on device 0, a memcpy, a memset, a stream synchronization,
// NVTX ranges (one unterminated) and a mark.
void BuildBaseExport(SQLite::Database& db) {
  for (const TableSpec& t : Tables()) {
    std::string sql = "CREATE TABLE " + Quote(t.name) + " (";
    for (size_t i = 0; i < t.columns.size(); ++i) {
      sql += (i ? ", " : "") + Quote(t.columns[i].name) + " " + t.columns[i].type;
    }
    db.exec(sql + ")");
  }
  const std::array<const char*, 10> strings = {
      "void gemm_kernel<float>(float*, int)",
      "gemm_kernel",
      "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
      "ncclDevKernel_AllReduce",
      "cudaLaunchKernel_v7000",
      "cudaMemcpyAsync_v3020",
      "cudaStreamSynchronize_v3020",
      "ProfilerStep#1",
      "python3",
      "aten::mm"};
  for (size_t i = 0; i < strings.size(); ++i) {
    Insert(db, "StringIds", {static_cast<int64_t>(i + 1), std::string(strings[i])});
  }
  const int64_t gpid = GlobalTid(kPid, 0);
  const int64_t gtid = GlobalTid(kPid, kPid + 1);
  const std::monostate null;
  using I = int64_t;
  // start, end, deviceId, contextId, streamId, correlationId, globalPid,
  // demangledName, shortName, registers, grid xyz, block xyz, static and
  // dynamic shared memory, graphNodeId, graphId.
  Insert(db, "CUPTI_ACTIVITY_KIND_KERNEL",
         {kT0 + 1000, kT0 + 5000, I{0}, I{1}, I{7}, I{1}, gpid, I{1}, I{2}, I{32}, I{128}, I{1},
          I{1}, I{256}, I{1}, I{1}, I{0}, I{1024}, null, null});
  Insert(db, "CUPTI_ACTIVITY_KIND_KERNEL",
         {kT0 + 3000, kT0 + 9000, I{0}, I{1}, I{13}, I{2}, gpid, I{3}, I{4}, I{64}, I{8}, I{1},
          I{1}, I{640}, I{1}, I{1}, I{0}, I{0}, I{5}, I{1}});
  Insert(db, "CUPTI_ACTIVITY_KIND_KERNEL",
         {kT0 + 2000, kT0 + 2500, I{1}, I{2}, I{7}, I{3}, gpid, I{1}, I{2}, I{32}, I{1}, I{1},
          I{1}, I{32}, I{1}, I{1}, I{48}, I{0}, null, null});
  Insert(db, "CUPTI_ACTIVITY_KIND_MEMCPY",
         {kT0 + 500, kT0 + 900, I{0}, I{1}, I{7}, I{4}, gpid, I{4096}, I{1}, null});
  Insert(db, "CUPTI_ACTIVITY_KIND_MEMSET",
         {kT0 + 9500, kT0 + 9600, I{0}, I{1}, I{7}, I{5}, gpid, I{0}, I{1024}, null});
  // start, end, eventClass, globalTid, correlationId, nameId, returnValue.
  Insert(db, "CUPTI_ACTIVITY_KIND_RUNTIME", {kT0 + 100, kT0 + 900, I{0}, gtid, I{1}, I{5}, I{0}});
  Insert(db, "CUPTI_ACTIVITY_KIND_RUNTIME", {kT0 + 950, kT0 + 990, I{0}, gtid, I{2}, I{5}, I{0}});
  Insert(db, "CUPTI_ACTIVITY_KIND_RUNTIME",
         {kT0 + 1995, kT0 + 1999, I{1}, gtid, I{3}, I{5}, I{0}});
  Insert(db, "CUPTI_ACTIVITY_KIND_RUNTIME", {kT0 + 300, kT0 + 450, I{0}, gtid, I{4}, I{6}, I{0}});
  Insert(db, "CUPTI_ACTIVITY_KIND_RUNTIME",
         {kT0 + 9000, kT0 + 9700, I{0}, gtid, I{6}, I{7}, I{0}});
  Insert(db, "CUPTI_ACTIVITY_KIND_RUNTIME", {kT0 + 9000, kT0 + 9700, I{2}, gtid, I{6}, I{7}, I{0}});
  // start, end, deviceId, contextId, streamId, correlationId, globalPid,
  // syncType, eventId.
  Insert(db, "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
         {kT0 + 9000, kT0 + 9700, I{0}, I{1}, I{7}, I{6}, gpid, I{3}, I{0}});
  // start, end, eventType, rangeId, text, globalTid, endGlobalTid, textId,
  // domainId.
  Insert(db, "NVTX_EVENTS", {kT0, kT0 + 10000, I{59}, null, null, gtid, null, I{8}, I{0}});
  Insert(db, "NVTX_EVENTS",
         {kT0 + 1000, kT0 + 5000, I{60}, I{1}, std::string("aten::mm"), gtid, gtid, null, I{0}});
  Insert(db, "NVTX_EVENTS", {kT0 + 7000, null, I{34}, null, std::string("mark"), gtid, null, null,
                             I{0}});
  Insert(db, "NVTX_EVENTS", {kT0 + 8000, null, I{59}, null, null, gtid, null, I{10}, I{0}});
  // vmId, id, name, totalMemory, memoryBandwidth, clockRate, smCount,
  // computeMajor, computeMinor.
  Insert(db, "TARGET_INFO_GPU",
         {I{0}, I{0}, std::string("NVIDIA H100 80GB HBM3"), I{85899345920}, I{3352320000000},
          I{1980000000}, I{132}, I{9}, I{0}});
  // gpuId, cudaId, pid, numMultiprocessors.
  Insert(db, "TARGET_INFO_CUDA_DEVICE", {I{0}, I{0}, kPid, I{132}});
  Insert(db, "TARGET_INFO_CUDA_DEVICE", {I{1}, I{1}, kPid, I{108}});
  Insert(db, "PROCESSES", {gpid, kPid, std::string("python3")});
  Insert(db, "ThreadNames", {I{9}, I{0}, gtid});
  Insert(db, "ENUM_NSYS_EVENT_CLASS", {I{0}, std::string("TRACE_PROCESS_EVENT_CUDA_RUNTIME")});
  Insert(db, "ENUM_NSYS_EVENT_CLASS", {I{1}, std::string("TRACE_PROCESS_EVENT_CUDA_DRIVER")});
  Insert(db, "ENUM_NSYS_EVENT_CLASS", {I{2}, std::string("TRACE_PROCESS_EVENT_CUDA_BACKTRACE")});
  Insert(db, "ENUM_CUDA_MEMCPY_OPER", {I{0}, std::string("CUDA_MEMCPY_KIND_UNKNOWN")});
  Insert(db, "ENUM_CUDA_MEMCPY_OPER", {I{1}, std::string("CUDA_MEMCPY_KIND_HTOD")});
  Insert(db, "ENUM_CUDA_MEMCPY_OPER", {I{2}, std::string("CUDA_MEMCPY_KIND_DTOH")});
  Insert(db, "ENUM_CUDA_MEMCPY_OPER", {I{8}, std::string("CUDA_MEMCPY_KIND_DTOD")});
  // ENUM_NSYS_EVENT_TYPE and ENUM_CUPTI_SYNC_TYPE stay empty: the reader then
  // uses its built-in labels until the script adds rows.
}

struct State {
  std::string path;      // the reused temporary database
  std::string template_bytes;  // BuildBaseExport's file
};

State* g_state = nullptr;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bool WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return static_cast<bool>(out);
}

void RemoveTemporaryFile() {
  if (g_state != nullptr) std::remove(g_state->path.c_str());
}

constexpr std::string_view kFilePrefix = "dynaflow_nsys_fuzz_";

// A crashed run cannot remove its file (libFuzzer owns the death callback):
// removes those of processes that no longer exist.
void RemoveStaleFiles(const std::filesystem::path& dir) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(kFilePrefix)) continue;
    const long pid = std::strtol(name.c_str() + kFilePrefix.size(), nullptr, 10);
    if (pid > 0 && kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      std::filesystem::remove(entry.path(), ec);
    }
  }
}

// Runs the script against the open copy of the base export. Statements that
// SQLite refuses are skipped. Returns byte patches for the closed file.
std::vector<std::pair<uint32_t, uint8_t>> RunScript(FuzzedDataProvider& fdp,
                                                    SQLite::Database& db) {
  const std::vector<TableSpec>& tables = Tables();
  std::vector<std::pair<uint32_t, uint8_t>> patches;
  for (int op = 0; op < kMaxOps && fdp.remaining_bytes() > 0; ++op) {
    const uint8_t code = fdp.ConsumeIntegral<uint8_t>() % 17;
    const TableSpec& table = tables[fdp.ConsumeIntegralInRange<size_t>(0, tables.size() - 1)];
    try {
      if (code <= 5) {  // insert a row
        RowContext row;
        std::vector<Value> values;
        for (const ColumnSpec& c : table.columns) values.push_back(Generate(fdp, c.role, &row));
        InsertRow(db, table, values);
      } else if (code <= 8) {  // change one value of an existing row
        const ColumnSpec& c =
            table.columns[fdp.ConsumeIntegralInRange<size_t>(0, table.columns.size() - 1)];
        RowContext row;
        SQLite::Statement stmt(db, "UPDATE " + Quote(table.name) + " SET " + Quote(c.name) +
                                       " = ? WHERE rowid = ?");
        Bind(stmt, 1, Generate(fdp, c.role, &row));
        stmt.bind(2, fdp.ConsumeIntegralInRange<int64_t>(1, 12));
        stmt.exec();
      } else if (code == 9) {  // delete a row
        SQLite::Statement stmt(db, "DELETE FROM " + Quote(table.name) + " WHERE rowid = ?");
        stmt.bind(1, fdp.ConsumeIntegralInRange<int64_t>(1, 12));
        stmt.exec();
      } else if (code == 10) {  // a table this nsys version does not export
        db.exec("DROP TABLE IF EXISTS " + Quote(table.name));
      } else if (code == 11) {  // a column this nsys version does not export
        const ColumnSpec& c =
            table.columns[fdp.ConsumeIntegralInRange<size_t>(0, table.columns.size() - 1)];
        db.exec("ALTER TABLE " + Quote(table.name) + " DROP COLUMN " + Quote(c.name));
      } else if (code == 12) {  // StringIds without a primary key
        db.exec("ALTER TABLE StringIds RENAME TO StringIds_old");
        db.exec("CREATE TABLE StringIds (id, value)");
        db.exec("INSERT INTO StringIds SELECT * FROM StringIds_old");
        db.exec("DROP TABLE StringIds_old");
      } else if (code == 13) {  // many rows spread over time
        const int n = fdp.ConsumeIntegralInRange<int>(2, kMaxBulkRows);
        const int64_t step = fdp.ConsumeIntegralInRange<int64_t>(-100, 100000);
        std::vector<Value> values;
        RowContext row;
        for (const ColumnSpec& c : table.columns) values.push_back(Generate(fdp, c.role, &row));
        for (int i = 0; i < n; ++i) {
          for (size_t k = 0; k < values.size(); ++k) {
            const Role role = table.columns[k].role;
            if ((role == Role::kStart || role == Role::kEnd) &&
                std::holds_alternative<int64_t>(values[k])) {
              values[k] = static_cast<int64_t>(static_cast<uint64_t>(std::get<int64_t>(values[k])) +
                                               static_cast<uint64_t>(step));
            }
          }
          InsertRow(db, table, values);
        }
      } else if (code == 14) {  // empty a table
        db.exec("DELETE FROM " + Quote(table.name));
      } else if (code == 15) {  // a row with a chosen rowid (MAX(rowid) near INT64_MAX)
        SQLite::Statement stmt(db, "INSERT INTO " + Quote(table.name) + " (rowid, " +
                                       Quote(table.columns[0].name) + ") VALUES (?, ?)");
        const int64_t rowid = fdp.ConsumeBool() ? std::numeric_limits<int64_t>::max() -
                                                      fdp.ConsumeIntegralInRange<int64_t>(0, 3)
                                                : fdp.ConsumeIntegral<int64_t>();
        stmt.bind(1, rowid);
        RowContext row;
        Bind(stmt, 2, Generate(fdp, table.columns[0].role, &row));
        stmt.exec();
      } else {  // corrupt the finished file
        patches.emplace_back(fdp.ConsumeIntegral<uint32_t>(), fdp.ConsumeIntegral<uint8_t>());
      }
    } catch (const SQLite::Exception&) {
      // SQLite refused (a constraint, a dropped table or column): next step.
    }
  }
  return patches;
}

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "nsys_fuzzer: %s\n", what);
  std::abort();
}

// What the importer promises about every trace it returns.
void CheckTrace(const Trace& t) {
  const size_t n = t.strings.size();
  for (const GpuActivity& g : t.gpu) {
    if (g.name >= n || g.copy_kind >= n) Fail("gpu activity with an unknown StringId");
    if (g.device_index >= t.devices.size()) Fail("gpu activity with an unknown device");
    if (g.end < g.start) Fail("gpu activity that ends before it starts");
  }
  for (const ApiCall& a : t.api) {
    if (a.name >= n) Fail("api call with an unknown StringId");
    if (a.end < a.start) Fail("api call that ends before it starts");
  }
  for (const Range& r : t.ranges) {
    if (r.name >= n) Fail("range with an unknown StringId");
    if (r.end < r.start) Fail("range that ends before it starts");
  }
}

}  // namespace
}  // namespace dynaflow

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  using namespace dynaflow;
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path dir = fs::is_directory("/dev/shm", ec) ? fs::path("/dev/shm") : fs::temp_directory_path();
  RemoveStaleFiles(dir);
  g_state = new State;
  g_state->path =
      (dir / (std::string(kFilePrefix) + std::to_string(getpid()) + ".sqlite")).string();
  std::remove(g_state->path.c_str());
  {
    SQLite::Database db(g_state->path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
    db.exec("PRAGMA page_size = 1024");  // a small file to copy for every input
    db.exec("PRAGMA journal_mode = MEMORY");
    SQLite::Transaction tx(db);
    BuildBaseExport(db);
    tx.commit();
  }
  g_state->template_bytes = ReadAll(g_state->path);
  std::atexit(RemoveTemporaryFile);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dynaflow;
  FuzzedDataProvider fdp(data, size);
  const uint8_t flags = fdp.ConsumeIntegral<uint8_t>();
  const bool read_twice = flags & 1;     // a second "file" as rank 1
  const bool with_progress = flags & 2;

  std::vector<std::pair<uint32_t, uint8_t>> patches;
  if (std::string_view(reinterpret_cast<const char*>(data), size).starts_with(kSqliteMagic)) {
    // A database as it is (regression inputs written with sqlite3).
    if (!WriteAll(g_state->path, std::string(reinterpret_cast<const char*>(data), size))) {
      Fail("cannot write the temporary file");
    }
  } else {
    if (!WriteAll(g_state->path, g_state->template_bytes)) Fail("cannot write the temporary file");
    SQLite::Database db(g_state->path, SQLite::OPEN_READWRITE);
    db.exec("PRAGMA journal_mode = MEMORY");
    db.exec("PRAGMA synchronous = OFF");
    SQLite::Transaction tx(db);
    patches = RunScript(fdp, db);
    tx.commit();
  }
  if (!patches.empty()) {
    std::string bytes = ReadAll(g_state->path);
    for (const auto& [offset, value] : patches) {
      if (!bytes.empty()) bytes[offset % bytes.size()] = static_cast<char>(value);
    }
    WriteAll(g_state->path, bytes);
  }

  // To see what an input does: NSYS_FUZZER_KEEP_DB=x.sqlite nsys_fuzzer input
  if (const char* keep = std::getenv("NSYS_FUZZER_KEEP_DB")) {
    WriteAll(keep, ReadAll(g_state->path));
  }

  StatusOr<FileProbe> probe = ProbeFile(g_state->path);
  if (!probe.ok()) return 0;
  StatusOr<TraceReader*> reader = FindReader(*probe);
  if (!reader.ok()) return 0;
  ImportOptions options;
  if (with_progress) {
    options.progress = [](int64_t done, int64_t total) {
      if (done < 0 || (total > 0 && done > total)) Fail("progress beyond its total");
    };
  }
  Trace trace;
  if (!(*reader)->Read(*probe, 0, options, &trace).ok()) return 0;
  if (read_twice && !(*reader)->Read(*probe, 1, options, &trace).ok()) return 0;
  CheckTrace(trace);
  AnalyzeTimelines(trace, TimelineOptions{});
  return 0;
}
