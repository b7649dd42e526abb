#include "analysis/importers/nsys/nsys_reader.h"

#include <climits>

#include <SQLiteCpp/SQLiteCpp.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <exception>
#include <initializer_list>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dynaflow {
namespace {

// A table the importer reads, and the short name its statistics use.
struct Source {
  std::string_view table;
  std::string_view category;
};

constexpr Source kKernels{"CUPTI_ACTIVITY_KIND_KERNEL", "kernel"};
constexpr Source kMemcpys{"CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy"};
constexpr Source kMemsets{"CUPTI_ACTIVITY_KIND_MEMSET", "memset"};
constexpr Source kRuntime{"CUPTI_ACTIVITY_KIND_RUNTIME", "runtime"};
constexpr Source kSync{"CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "sync"};
constexpr Source kNvtx{"NVTX_EVENTS", "nvtx"};
constexpr Source kStringIds{"StringIds", "strings"};
constexpr Source kProcesses{"PROCESSES", "process"};
constexpr Source kThreads{"ThreadNames", "thread"};
constexpr Source kTargetGpus{"TARGET_INFO_GPU", "gpu_info"};
constexpr Source kCudaDevices{"TARGET_INFO_CUDA_DEVICE", "cuda_device_info"};

// Any of these marks an nsys export, even one without GPU activity.
constexpr std::array<std::string_view, 6> kMarkerTables = {"CUPTI_ACTIVITY_KIND_KERNEL",
                                                           "CUPTI_ACTIVITY_KIND_MEMCPY",
                                                           "CUPTI_ACTIVITY_KIND_MEMSET",
                                                           "CUPTI_ACTIVITY_KIND_RUNTIME",
                                                           "NVTX_EVENTS",
                                                           "TARGET_INFO_GPU"};

// The event tables, whose rows the progress callback counts.
constexpr std::array<Source, 6> kEventSources = {kKernels, kMemcpys, kMemsets,
                                                 kRuntime, kSync,    kNvtx};

constexpr int64_t kProgressEveryRows = 1 << 16;

// Labels of nsys's enum tables by value, for exports that lack the table.
// They follow CUPTI's numbering (CUpti_ActivityMemcpyKind, nsys's UVM kinds
// after it; CUpti_ActivitySynchronizationType).
constexpr std::array<std::string_view, 14> kMemcpyKindLabels = {
    "CUDA_MEMCPY_KIND_UNKNOWN",  "CUDA_MEMCPY_KIND_HTOD",    "CUDA_MEMCPY_KIND_DTOH",
    "CUDA_MEMCPY_KIND_HTOA",     "CUDA_MEMCPY_KIND_ATOH",    "CUDA_MEMCPY_KIND_ATOA",
    "CUDA_MEMCPY_KIND_ATOD",     "CUDA_MEMCPY_KIND_DTOA",    "CUDA_MEMCPY_KIND_DTOD",
    "CUDA_MEMCPY_KIND_HTOH",     "CUDA_MEMCPY_KIND_PTOP",    "CUDA_MEMCPY_KIND_UVM_HTOD",
    "CUDA_MEMCPY_KIND_UVM_DTOH", "CUDA_MEMCPY_KIND_UVM_DTOD"};
constexpr std::array<std::string_view, 5> kSyncTypeLabels = {
    "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_UNKNOWN",
    "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE",
    "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT",
    "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE",
    "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE"};
constexpr std::string_view kRuntimeClass = "TRACE_PROCESS_EVENT_CUDA_RUNTIME";
constexpr std::string_view kDriverClass = "TRACE_PROCESS_EVENT_CUDA_DRIVER";
constexpr std::array<std::string_view, 2> kEventClassLabels = {kRuntimeClass, kDriverClass};
// NVTX range event types (push/pop and start/end, NVTX and NVTXT) when the
// export lacks ENUM_NSYS_EVENT_TYPE; marks (34) and other events are not ranges.
constexpr std::array<int64_t, 4> kNvtxRangeTypes = {59, 60, 70, 71};

using EnumLabels = std::unordered_map<int64_t, std::string>;

// The text of a column, valid until the cursor moves.
std::string_view TextOf(const SQLite::Column& c) {
  const char* text = c.getText();  // sqlite3 wants the text before its length
  return std::string_view(text, static_cast<size_t>(c.getBytes()));
}

// A SELECT over one table that asks only for the columns the table has, so
// every nsys version reads through the same code. Select() the columns, then
// Start() and Step() through the rows.
class TableCursor {
 public:
  // Reads the table's column names; exists() is false when the export lacks it.
  TableCursor(SQLite::Database& db, const Source& source)
      : db_(db), table_(source.table), category_(source.category) {
    SQLite::Statement info(db, "PRAGMA table_info(\"" + table_ + "\")");
    while (info.executeStep()) columns_.push_back(info.getColumn(1).getString());
  }

  bool exists() const { return !columns_.empty(); }
  const std::string& table() const { return table_; }
  std::string_view category() const { return category_; }

  // The position of column `name` in each row, or -1 when the table lacks it;
  // a missing column reads as NULL.
  int Select(std::string_view name) {
    if (std::find(columns_.begin(), columns_.end(), name) == columns_.end()) return -1;
    selected_.emplace_back(name);
    return static_cast<int>(selected_.size()) - 1;
  }

  // Prepares the query. Precondition: at least one column was selected.
  void Start() {
    std::string sql = "SELECT ";
    for (size_t i = 0; i < selected_.size(); ++i) {
      sql += (i == 0 ? "\"" : ", \"") + selected_[i] + "\"";
    }
    sql += " FROM \"" + table_ + "\"";
    stmt_.emplace(db_, sql);
  }

  bool Step() { return stmt_->executeStep(); }

  // The integer at `pos`; nullopt when NULL or missing.
  std::optional<int64_t> Int(int pos) const {
    if (pos < 0) return std::nullopt;
    SQLite::Column c = stmt_->getColumn(pos);
    if (c.isNull()) return std::nullopt;
    return c.getInt64();
  }
  int64_t IntOr(int pos, int64_t fallback) const { return Int(pos).value_or(fallback); }
  bool IsNull(int pos) const { return pos < 0 || stmt_->isColumnNull(pos); }
  // Precondition: pos >= 0.
  SQLite::Column Column(int pos) const { return stmt_->getColumn(pos); }

 private:
  SQLite::Database& db_;
  std::string table_;
  std::string_view category_;
  std::vector<std::string> columns_;
  std::vector<std::string> selected_;
  std::optional<SQLite::Statement> stmt_;
};

// An nsys ENUM_* table as value -> name; empty when the export lacks it.
EnumLabels LoadEnum(SQLite::Database& db, std::string_view table) {
  TableCursor t(db, Source{table, "enum"});
  const int id = t.Select("id");
  const int name = t.Select("name");
  EnumLabels labels;
  if (id < 0 || name < 0) return labels;
  t.Start();
  while (t.Step()) {
    const std::optional<int64_t> value = t.Int(id);
    if (value && !t.IsNull(name)) labels.emplace(*value, std::string(TextOf(t.Column(name))));
  }
  return labels;
}

// The label of `value`: from the export's enum table when it has one, else
// from `fallback` (indexed by value); empty when neither names it.
std::string_view LabelOf(const EnumLabels& from_export, std::span<const std::string_view> fallback,
                         int64_t value) {
  if (!from_export.empty()) {
    auto it = from_export.find(value);
    return it == from_export.end() ? std::string_view() : std::string_view(it->second);
  }
  if (value < 0 || static_cast<size_t>(value) >= fallback.size()) return {};
  return fallback[static_cast<size_t>(value)];
}

// The CUDA API a synchronization record stands for, from its type's label.
std::string_view SyncApiName(std::string_view label) {
  if (label.ends_with("EVENT_SYNCHRONIZE")) return "cudaEventSynchronize";
  if (label.ends_with("STREAM_WAIT_EVENT")) return "cudaStreamWaitEvent";
  if (label.ends_with("STREAM_SYNCHRONIZE")) return "cudaStreamSynchronize";
  if (label.ends_with("CONTEXT_SYNCHRONIZE")) return "cudaDeviceSynchronize";
  return "cudaSynchronize";
}

// StringIds, the export's string table: nsys id -> the trace's StringId.
class NsysStrings {
 public:
  // Interns every string of StringIds into `strings`; none when the table or
  // its id/value columns are missing.
  void Load(SQLite::Database& db, StringTable* strings) {
    TableCursor t(db, kStringIds);
    const int id = t.Select("id");
    const int value = t.Select("value");
    if (id < 0 || value < 0) return;
    SQLite::Statement range(db, "SELECT MIN(id), MAX(id), COUNT(*) FROM StringIds");
    range.executeStep();
    const int64_t min_id = range.getColumn(0).getInt64();
    const int64_t max_id = range.getColumn(1).getInt64();
    const int64_t count = range.getColumn(2).getInt64();
    // Ids are mostly dense; a vector indexed by id keeps each row's lookup cheap.
    const bool dense = min_id >= 0 && max_id < 8 * count + (1 << 20);
    if (dense) dense_.assign(static_cast<size_t>(max_id) + 1, kAbsent);
    t.Start();
    while (t.Step()) {
      const std::optional<int64_t> key = t.Int(id);
      if (!key) continue;
      const StringId interned = t.IsNull(value) ? 0 : strings->Intern(TextOf(t.Column(value)));
      // MAX(id) ignores nothing: a text id sorts above every integer and
      // reads as 0, so the range can be wrong; ids outside it go to sparse_.
      if (dense && *key >= 0 && static_cast<uint64_t>(*key) < dense_.size()) {
        dense_[static_cast<size_t>(*key)] = interned;
      } else {
        sparse_[*key] = interned;
      }
    }
  }

  // nullopt when the export has no string with this id.
  std::optional<StringId> Find(int64_t id) const {
    if (id >= 0 && static_cast<uint64_t>(id) < dense_.size()) {
      const StringId s = dense_[static_cast<size_t>(id)];
      if (s == kAbsent) return std::nullopt;
      return s;
    }
    auto it = sparse_.find(id);
    if (it == sparse_.end()) return std::nullopt;
    return it->second;
  }

 private:
  static constexpr StringId kAbsent = UINT32_MAX;
  std::vector<StringId> dense_;
  std::unordered_map<int64_t, StringId> sparse_;
};

// What TARGET_INFO_GPU says about one GPU; zero when not given.
struct GpuProperties {
  std::string name;
  int64_t sm_count = 0;
  int64_t cc_major = 0;
  int64_t cc_minor = 0;
  int64_t memory_bytes = 0;
  int64_t clock_hz = 0;
  int64_t bandwidth_bytes_per_s = 0;
};

// TARGET_INFO_CUDA_DEVICE: a CUDA device id as the process saw it.
struct CudaDevice {
  int64_t gpu_id = -1;  // TARGET_INFO_GPU.id
  int64_t sm_count = 0;
};

// One Read of one export. The methods throw SQLite::Exception when the file
// is broken; NsysReader::Read turns that into a Status.
class NsysImport {
 public:
  NsysImport(SQLite::Database& db, int32_t rank, const ImportOptions& options, Trace* trace)
      : db_(db), rank_(rank), options_(options), trace_(trace) {}

  void Run() {
    strings_.Load(db_, &trace_->strings);
    rows_total_ = EstimateRows();
    if (!db_.tableExists(std::string(kKernels.table)) &&
        !db_.tableExists(std::string(kMemcpys.table)) &&
        !db_.tableExists(std::string(kMemsets.table))) {
      trace_->stats.Add("nsys_no_gpu_activity", "info",
                        "export has no CUDA kernel, memcpy or memset table");
    }
    ReadKernels();
    ReadMemcpys();
    ReadMemsets();
    const size_t runtime_begin = trace_->api.size();
    ReadRuntime();
    ReadSync(runtime_begin);
    ReadNvtx();
    ReadProcesses();
    ReadThreads();
    FillDevices();
    if (options_.progress) options_.progress(rows_done_, std::max(rows_done_, rows_total_));
  }

 private:
  struct GpuColumns {
    int start;
    int end;
    int device;
    int stream;
    int correlation;
  };

  // Rows in the event tables, estimated by their largest rowid (cheap).
  int64_t EstimateRows() {
    int64_t total = 0;
    for (const Source& s : kEventSources) {
      if (!db_.tableExists(std::string(s.table))) continue;
      try {
        SQLite::Statement max_rowid(db_, "SELECT MAX(rowid) FROM \"" + std::string(s.table) + "\"");
        if (max_rowid.executeStep()) {
          // Rowids may be anything up to INT64_MAX: saturate rather than overflow.
          const int64_t rows = std::max<int64_t>(0, max_rowid.getColumn(0).getInt64());
          total = rows > INT64_MAX - total ? INT64_MAX : total + rows;
        }
      } catch (const SQLite::Exception&) {
        // A WITHOUT ROWID table has no estimate; progress just undercounts.
      }
    }
    return total;
  }

  // Steps to the next row and reports progress now and then.
  bool Next(TableCursor& t) {
    if (!t.Step()) return false;
    if (++rows_done_ % kProgressEveryRows == 0 && options_.progress) {
      options_.progress(rows_done_, std::max(rows_done_, rows_total_));
    }
    return true;
  }

  // False, with a statistic, when the table lacks a column it cannot do without.
  bool Usable(const TableCursor& t, std::initializer_list<int> essential) {
    if (std::all_of(essential.begin(), essential.end(), [](int pos) { return pos >= 0; })) {
      return true;
    }
    trace_->stats.Add("nsys_" + std::string(t.category()) + "_unusable", "data_loss",
                      t.table() +
                          " lacks an essential column (start, end, deviceId...); "
                          "its rows were skipped");
    return false;
  }

  // Static plus dynamic shared memory; values no GPU has (negative, or a sum
  // beyond int32) read as 0 rather than overflow.
  static int32_t SharedMemoryBytes(int64_t static_bytes, int64_t dynamic_bytes) {
    constexpr int64_t kMax = INT32_MAX;
    if (static_bytes < 0 || dynamic_bytes < 0 || static_bytes > kMax || dynamic_bytes > kMax ||
        static_bytes + dynamic_bytes > kMax) {
      return 0;
    }
    return static_cast<int32_t>(static_bytes + dynamic_bytes);
  }

  void CountBadRow(const TableCursor& t) {
    trace_->stats.Add("nsys_" + std::string(t.category()) + "_bad_row", "data_loss",
                      t.table() +
                          " rows with a NULL start, end or deviceId, end < start, or a time "
                          "beyond +-3e18 ns; "
                          "skipped");
  }

  // The row's [start, end]; false, counting the row, when either is NULL,
  // end < start, or a time lies beyond +-kMaxAbsTimeNs.
  bool ReadSpan(const TableCursor& t, int start_pos, int end_pos, TimeNs* start, TimeNs* end) {
    const std::optional<int64_t> s = t.Int(start_pos);
    const std::optional<int64_t> e = t.Int(end_pos);
    auto in_range = [](int64_t v) { return v >= -kMaxAbsTimeNs && v <= kMaxAbsTimeNs; };
    if (!s || !e || *e < *s || !in_range(*s) || !in_range(*e)) {
      CountBadRow(t);
      return false;
    }
    *start = *s;
    *end = *e;
    return true;
  }

  GpuColumns SelectGpuColumns(TableCursor& t) {
    return GpuColumns{t.Select("start"), t.Select("end"), t.Select("deviceId"),
                      t.Select("streamId"), t.Select("correlationId")};
  }

  // Fills the fields every GPU activity table shares, registering the device;
  // false, counting the row, when it has no valid span or device.
  bool ReadGpuRow(const TableCursor& t, const GpuColumns& c, GpuActivity* a) {
    const std::optional<int64_t> device = t.Int(c.device);
    if (!device) {
      CountBadRow(t);
      return false;
    }
    if (!ReadSpan(t, c.start, c.end, &a->start, &a->end)) return false;
    a->device_index = trace_->DeviceIndex(rank_, static_cast<int32_t>(*device));
    a->stream = static_cast<int32_t>(t.IntOr(c.stream, 0));
    a->correlation = t.IntOr(c.correlation, -1);
    return true;
  }

  // The first non-NULL name among `positions`: text is taken as-is, an integer
  // is a StringIds reference. 0 (empty) when all are NULL; also 0, counted,
  // when the references name no string.
  StringId NameAt(const TableCursor& t, std::initializer_list<int> positions) {
    bool unknown_id = false;
    for (int pos : positions) {
      if (pos < 0) continue;
      const SQLite::Column c = t.Column(pos);
      if (c.isNull()) continue;
      if (!c.isInteger()) return trace_->strings.Intern(TextOf(c));
      if (std::optional<StringId> s = strings_.Find(c.getInt64())) return *s;
      unknown_id = true;
    }
    if (unknown_id) {
      trace_->stats.Add("nsys_unknown_string_id", "data_loss",
                        "names that reference an id missing from StringIds; left empty");
    }
    return 0;
  }

  void ReadKernels() {
    TableCursor t(db_, kKernels);
    if (!t.exists()) return;
    const GpuColumns gpu = SelectGpuColumns(t);
    const int demangled = t.Select("demangledName");
    const int short_name = t.Select("shortName");
    const int grid[3] = {t.Select("gridX"), t.Select("gridY"), t.Select("gridZ")};
    const int block[3] = {t.Select("blockX"), t.Select("blockY"), t.Select("blockZ")};
    const int registers = t.Select("registersPerThread");
    const int static_shared = t.Select("staticSharedMemory");
    const int dynamic_shared = t.Select("dynamicSharedMemory");
    const int graph = t.Select("graphId");
    const int graph_node = t.Select("graphNodeId");
    if (!Usable(t, {gpu.start, gpu.end, gpu.device})) return;
    t.Start();
    while (Next(t)) {
      GpuActivity a;
      if (!ReadGpuRow(t, gpu, &a)) continue;
      a.kind = GpuKind::kKernel;
      a.name = NameAt(t, {demangled, short_name});
      for (int i = 0; i < 3; ++i) {
        a.grid[i] = static_cast<int32_t>(t.IntOr(grid[i], 0));
        a.block[i] = static_cast<int32_t>(t.IntOr(block[i], 0));
      }
      a.registers = static_cast<int32_t>(t.IntOr(registers, 0));
      a.shared_memory = SharedMemoryBytes(t.IntOr(static_shared, 0), t.IntOr(dynamic_shared, 0));
      a.graph_id = t.IntOr(graph, -1);
      a.graph_node = t.IntOr(graph_node, -1);
      trace_->gpu.push_back(a);
    }
  }

  void ReadMemcpys() {
    TableCursor t(db_, kMemcpys);
    if (!t.exists()) return;
    const GpuColumns gpu = SelectGpuColumns(t);
    const int bytes = t.Select("bytes");
    const int copy_kind = t.Select("copyKind");
    const int graph_node = t.Select("graphNodeId");
    if (!Usable(t, {gpu.start, gpu.end, gpu.device})) return;
    const EnumLabels labels = LoadEnum(db_, "ENUM_CUDA_MEMCPY_OPER");
    // copyKind value -> (kind, name), interned on first sight.
    std::unordered_map<int64_t, std::pair<StringId, StringId>> names;
    t.Start();
    while (Next(t)) {
      GpuActivity a;
      if (!ReadGpuRow(t, gpu, &a)) continue;
      a.kind = GpuKind::kMemcpy;
      a.bytes = t.IntOr(bytes, 0);
      a.graph_node = t.IntOr(graph_node, -1);
      const int64_t kind_value = t.IntOr(copy_kind, 0);
      auto [it, inserted] = names.try_emplace(kind_value);
      if (inserted) {
        const std::string kind =
            NsysCopyKindFromEnumName(LabelOf(labels, kMemcpyKindLabels, kind_value));
        it->second = {trace_->strings.Intern(kind), trace_->strings.Intern("Memcpy " + kind)};
      }
      a.copy_kind = it->second.first;
      a.name = it->second.second;
      trace_->gpu.push_back(a);
    }
  }

  void ReadMemsets() {
    TableCursor t(db_, kMemsets);
    if (!t.exists()) return;
    const GpuColumns gpu = SelectGpuColumns(t);
    const int bytes = t.Select("bytes");
    const int graph_node = t.Select("graphNodeId");
    if (!Usable(t, {gpu.start, gpu.end, gpu.device})) return;
    const StringId name = trace_->strings.Intern("Memset");
    t.Start();
    while (Next(t)) {
      GpuActivity a;
      if (!ReadGpuRow(t, gpu, &a)) continue;
      a.kind = GpuKind::kMemset;
      a.bytes = t.IntOr(bytes, 0);
      a.graph_node = t.IntOr(graph_node, -1);
      a.name = name;
      trace_->gpu.push_back(a);
    }
  }

  // CUDA runtime and driver calls. nsys also files other event classes here
  // (e.g. "CUDA backtrace" copies of the calls); those are skipped.
  void ReadRuntime() {
    TableCursor t(db_, kRuntime);
    if (!t.exists()) return;
    const int start = t.Select("start");
    const int end = t.Select("end");
    const int event_class = t.Select("eventClass");
    const int global_tid = t.Select("globalTid");
    const int correlation = t.Select("correlationId");
    const int name_id = t.Select("nameId");
    const int name_text = t.Select("name");
    if (!Usable(t, {start, end})) return;
    const EnumLabels classes = LoadEnum(db_, "ENUM_NSYS_EVENT_CLASS");
    std::unordered_map<StringId, StringId> unversioned;
    t.Start();
    while (Next(t)) {
      ApiCall c;
      if (const std::optional<int64_t> cls = t.Int(event_class)) {
        const std::string_view label = LabelOf(classes, kEventClassLabels, *cls);
        if (label == kDriverClass) {
          c.kind = ApiKind::kDriver;
        } else if (label != kRuntimeClass) {
          trace_->stats.Add("nsys_runtime_other_class", "info",
                            "CUPTI_ACTIVITY_KIND_RUNTIME rows of other event classes "
                            "(e.g. CUDA backtrace copies); skipped");
          continue;
        }
      }
      if (!ReadSpan(t, start, end, &c.start, &c.end)) continue;
      const NsysThreadId thread = DecodeNsysGlobalTid(t.IntOr(global_tid, 0));
      c.rank = rank_;
      c.pid = thread.pid;
      c.tid = thread.tid;
      c.correlation = t.IntOr(correlation, -1);
      c.name = Unversioned(NameAt(t, {name_id, name_text}), &unversioned);
      trace_->api.push_back(c);
    }
  }

  // `name` without nsys's "_vNNNN" suffix, memoized in `cache`.
  StringId Unversioned(StringId name, std::unordered_map<StringId, StringId>* cache) {
    auto [it, inserted] = cache->try_emplace(name, name);
    if (inserted) {
      it->second = trace_->strings.Intern(StripNsysApiVersion(trace_->strings.Get(name)));
    }
    return it->second;
  }

  // Synchronization records, as kSync calls named after the CUDA API that
  // synchronized. `runtime_begin` is where this file's runtime calls start.
  void ReadSync(size_t runtime_begin) {
    TableCursor t(db_, kSync);
    if (!t.exists()) return;
    const int start = t.Select("start");
    const int end = t.Select("end");
    const int global_pid = t.Select("globalPid");
    const int correlation = t.Select("correlationId");
    const int sync_type = t.Select("syncType");
    if (!Usable(t, {start, end})) return;
    const EnumLabels labels = LoadEnum(db_, "ENUM_CUPTI_SYNC_TYPE");
    std::unordered_map<int64_t, StringId> names;  // by syncType
    const size_t sync_begin = trace_->api.size();
    t.Start();
    while (Next(t)) {
      ApiCall c;
      if (!ReadSpan(t, start, end, &c.start, &c.end)) continue;
      c.kind = ApiKind::kSync;
      c.rank = rank_;
      c.pid = DecodeNsysGlobalTid(t.IntOr(global_pid, 0)).pid;
      c.correlation = t.IntOr(correlation, -1);
      const int64_t type = t.IntOr(sync_type, 0);
      auto [it, inserted] = names.try_emplace(type);
      if (inserted) {
        it->second = trace_->strings.Intern(SyncApiName(LabelOf(labels, kSyncTypeLabels, type)));
      }
      c.name = it->second;
      trace_->api.push_back(c);
    }
    AttachSyncThreads(runtime_begin, sync_begin);
  }

  // Synchronization records name no thread: each takes the thread of the
  // runtime call with the same process and correlation id; 0 when none.
  void AttachSyncThreads(size_t runtime_begin, size_t sync_begin) {
    std::vector<ApiCall>& api = trace_->api;
    std::map<std::pair<int32_t, int64_t>, int32_t> tids;
    for (size_t i = sync_begin; i < api.size(); ++i) {
      if (api[i].correlation >= 0) tids.emplace(std::pair(api[i].pid, api[i].correlation), 0);
    }
    if (tids.empty()) return;
    for (size_t i = runtime_begin; i < sync_begin; ++i) {
      auto it = tids.find(std::pair(api[i].pid, api[i].correlation));
      if (it != tids.end()) it->second = api[i].tid;
    }
    for (size_t i = sync_begin; i < api.size(); ++i) {
      auto it = tids.find(std::pair(api[i].pid, api[i].correlation));
      if (it != tids.end()) api[i].tid = it->second;
    }
  }

  // The event types of NVTX ranges: from ENUM_NSYS_EVENT_TYPE when present.
  std::vector<int64_t> NvtxRangeTypes() {
    const EnumLabels labels = LoadEnum(db_, "ENUM_NSYS_EVENT_TYPE");
    if (labels.empty()) return {kNvtxRangeTypes.begin(), kNvtxRangeTypes.end()};
    std::vector<int64_t> types;
    for (const auto& [value, label] : labels) {
      if (label.ends_with("PushPopRange") || label.ends_with("StartEndRange")) {
        types.push_back(value);
      }
    }
    return types;
  }

  void ReadNvtx() {
    TableCursor t(db_, kNvtx);
    if (!t.exists()) return;
    const int start = t.Select("start");
    const int end = t.Select("end");
    const int event_type = t.Select("eventType");
    const int global_tid = t.Select("globalTid");
    const int text = t.Select("text");
    const int text_id = t.Select("textId");
    if (!Usable(t, {start, end, event_type})) return;
    const std::vector<int64_t> range_types = NvtxRangeTypes();
    t.Start();
    while (Next(t)) {
      const int64_t type = t.IntOr(event_type, -1);
      if (std::find(range_types.begin(), range_types.end(), type) == range_types.end()) continue;
      if (t.IsNull(end)) {
        trace_->stats.Add("nsys_nvtx_unterminated", "data_loss",
                          "NVTX ranges that never ended (no pop or end); skipped");
        continue;
      }
      Range r;
      if (!ReadSpan(t, start, end, &r.start, &r.end)) continue;
      const NsysThreadId thread = DecodeNsysGlobalTid(t.IntOr(global_tid, 0));
      r.rank = rank_;
      r.pid = thread.pid;
      r.tid = thread.tid;
      r.device_index = -1;
      r.domain = RangeDomain::kNvtx;
      r.name = NameAt(t, {text, text_id});
      trace_->ranges.push_back(r);
    }
  }

  void ReadProcesses() {
    TableCursor t(db_, kProcesses);
    const int global_pid = t.Select("globalPid");
    const int pid = t.Select("pid");
    const int name = t.Select("name");
    if (global_pid < 0 && pid < 0) return;
    t.Start();
    while (t.Step()) {
      ProcessInfo p;
      p.rank = rank_;
      const std::optional<int64_t> plain_pid = t.Int(pid);
      p.pid = plain_pid ? static_cast<int32_t>(*plain_pid)
                        : DecodeNsysGlobalTid(t.IntOr(global_pid, 0)).pid;
      p.name = std::string(trace_->strings.Get(NameAt(t, {name})));
      trace_->processes.push_back(std::move(p));
    }
  }

  void ReadThreads() {
    TableCursor t(db_, kThreads);
    const int global_tid = t.Select("globalTid");
    const int name_id = t.Select("nameId");
    if (global_tid < 0) return;
    t.Start();
    while (t.Step()) {
      const std::optional<int64_t> id = t.Int(global_tid);
      if (!id) continue;
      const NsysThreadId thread = DecodeNsysGlobalTid(*id);
      trace_->threads.push_back(ThreadInfo{rank_, thread.pid, thread.tid,
                                           std::string(trace_->strings.Get(NameAt(t, {name_id})))});
    }
  }

  std::unordered_map<int64_t, GpuProperties> ReadGpuProperties() {
    TableCursor t(db_, kTargetGpus);
    const int id = t.Select("id");
    const int name = t.Select("name");
    const int sm_count = t.Select("smCount");
    const int cc_major = t.Select("computeMajor");
    const int cc_minor = t.Select("computeMinor");
    const int memory = t.Select("totalMemory");
    const int clock = t.Select("clockRate");
    const int bandwidth = t.Select("memoryBandwidth");
    std::unordered_map<int64_t, GpuProperties> gpus;
    if (id < 0) return gpus;
    t.Start();
    while (t.Step()) {
      const std::optional<int64_t> key = t.Int(id);
      if (!key) continue;
      gpus.try_emplace(
          *key, GpuProperties{std::string(trace_->strings.Get(NameAt(t, {name}))),
                              t.IntOr(sm_count, 0), t.IntOr(cc_major, 0), t.IntOr(cc_minor, 0),
                              t.IntOr(memory, 0), t.IntOr(clock, 0), t.IntOr(bandwidth, 0)});
    }
    return gpus;
  }

  // By cudaId, the device id GPU activity carries. Should processes disagree
  // on what a CUDA id means, the first row wins.
  std::unordered_map<int64_t, CudaDevice> ReadCudaDevices() {
    TableCursor t(db_, kCudaDevices);
    const int cuda_id = t.Select("cudaId");
    const int gpu_id = t.Select("gpuId");
    const int sm_count = t.Select("numMultiprocessors");
    std::unordered_map<int64_t, CudaDevice> devices;
    if (cuda_id < 0) return devices;
    t.Start();
    while (t.Step()) {
      const std::optional<int64_t> key = t.Int(cuda_id);
      if (key) devices.try_emplace(*key, CudaDevice{t.IntOr(gpu_id, -1), t.IntOr(sm_count, 0)});
    }
    return devices;
  }

  // Describes this file's devices (those with GPU activity) from the target
  // info tables. A device's deviceId is its CUDA id; TARGET_INFO_CUDA_DEVICE
  // maps it to a TARGET_INFO_GPU id, else the two ids are taken as equal.
  void FillDevices() {
    const std::unordered_map<int64_t, GpuProperties> gpus = ReadGpuProperties();
    const std::unordered_map<int64_t, CudaDevice> cuda = ReadCudaDevices();
    for (DeviceInfo& d : trace_->devices) {
      if (d.rank != rank_) continue;
      int64_t gpu_id = d.device;
      int64_t cuda_sm_count = 0;
      if (auto it = cuda.find(d.device); it != cuda.end()) {
        if (it->second.gpu_id >= 0) gpu_id = it->second.gpu_id;
        cuda_sm_count = it->second.sm_count;
      }
      if (auto it = gpus.find(gpu_id); it != gpus.end()) Describe(it->second, &d);
      if (d.sm_count == 0) d.sm_count = static_cast<int32_t>(cuda_sm_count);
    }
  }

  // Copies the known (non-zero) properties into `d`.
  static void Describe(const GpuProperties& g, DeviceInfo* d) {
    if (!g.name.empty()) d->name = g.name;
    if (g.sm_count > 0) d->sm_count = static_cast<int32_t>(g.sm_count);
    if (g.cc_major > 0) {
      d->cc_major = static_cast<int32_t>(g.cc_major);
      d->cc_minor = static_cast<int32_t>(g.cc_minor);
    }
    if (g.memory_bytes > 0) d->memory_bytes = g.memory_bytes;
    if (g.clock_hz > 0) d->clock_khz = static_cast<int32_t>(g.clock_hz / 1000);
    if (g.bandwidth_bytes_per_s > 0) d->memory_bandwidth_gbps = g.bandwidth_bytes_per_s / 1e9;
  }

  SQLite::Database& db_;
  const int32_t rank_;
  const ImportOptions& options_;
  Trace* trace_;
  NsysStrings strings_;
  int64_t rows_done_ = 0;
  int64_t rows_total_ = 0;
};

// Appends `value` to the ';'-separated list metadata[key]; with `unique`, a
// value already listed is not repeated.
void AppendMetadata(Trace* trace, const std::string& key, std::string_view value, bool unique) {
  std::string& list = trace->metadata[key];
  if (unique) {
    size_t begin = 0;
    while (begin <= list.size()) {
      const size_t stop = std::min(list.find(';', begin), list.size());
      if (std::string_view(list).substr(begin, stop - begin) == value) return;
      begin = stop + 1;
    }
  }
  if (!list.empty()) list += ';';
  list += value;
}

class NsysReader final : public TraceReader {
 public:
  std::string_view format() const override { return "nsys"; }

  bool Accepts(const FileProbe& probe) const override {
    if (!probe.sqlite) return false;
    return std::any_of(probe.sql_tables.begin(), probe.sql_tables.end(), [](const std::string& t) {
      return std::find(kMarkerTables.begin(), kMarkerTables.end(), t) != kMarkerTables.end();
    });
  }

  Status Read(const FileProbe& probe, int ordinal, const ImportOptions& options,
              Trace* trace) override {
    try {
      // Only this thread uses the connection: skip SQLite's per-call mutex.
      SQLite::Database db(probe.path, SQLite::OPEN_READONLY | SQLite::OPEN_NOMUTEX);
      NsysImport(db, ordinal, options, trace).Run();
    } catch (const SQLite::Exception& e) {
      return Status::BadInput(probe.path + ": unreadable Nsight Systems export: " + e.what());
    } catch (const std::exception& e) {
      return Status::Failure(probe.path + ": Nsight Systems import failed: " + e.what());
    }
    AppendMetadata(trace, "format", "nsys", /*unique=*/true);
    AppendMetadata(trace, "source", probe.path, /*unique=*/false);
    return Status::Ok();
  }
};

}  // namespace

std::unique_ptr<TraceReader> MakeNsysReader() { return std::make_unique<NsysReader>(); }

NsysThreadId DecodeNsysGlobalTid(int64_t global_tid) {
  return NsysThreadId{static_cast<int32_t>((global_tid >> 24) & 0xFFFFFF),
                      static_cast<int32_t>(global_tid & 0xFFFFFF)};
}

std::string NsysCopyKindName(int64_t copy_kind) {
  return NsysCopyKindFromEnumName(LabelOf({}, kMemcpyKindLabels, copy_kind));
}

std::string NsysCopyKindFromEnumName(std::string_view enum_name) {
  if (const size_t kind = enum_name.find("KIND_"); kind != std::string_view::npos) {
    enum_name.remove_prefix(kind + 5);
  }
  std::string out;
  while (!enum_name.empty()) {
    const size_t stop = std::min(enum_name.find('_'), enum_name.size());
    const std::string_view word = enum_name.substr(0, stop);
    enum_name.remove_prefix(std::min(stop + 1, enum_name.size()));
    if (word.empty() || word == "UNKNOWN") continue;
    if (!out.empty()) out += ' ';
    if (word.size() == 4 && word.substr(1, 2) == "TO") {  // HTOD -> HtoD
      out += word[0];
      out += "to";
      out += word[3];
    } else {
      out += word;
    }
  }
  return out.empty() ? "Unknown" : out;
}

std::string_view StripNsysApiVersion(std::string_view name) {
  const size_t v = name.rfind("_v");
  if (v == std::string_view::npos || v == 0 || v + 2 == name.size()) return name;
  const std::string_view digits = name.substr(v + 2);
  const bool all_digits = std::all_of(digits.begin(), digits.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c));
  });
  return all_digits ? name.substr(0, v) : name;
}

}  // namespace dynaflow
