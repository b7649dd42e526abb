// The in-memory trace every importer fills and every analysis reads.
//
// Times are integer nanoseconds on the trace's own clock. Strings are interned
// once in `strings` and referenced by StringId, so millions of kernels with the
// same name cost one copy of the name. Records are plain arrays, one per kind of
// event, in the order the importer saw them (analyses sort what they need).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "analysis/base/status.h"

namespace dynaflow {

using TimeNs = int64_t;

// Importers reject times beyond +-3e18 ns (year 2065 in epoch nanoseconds), so
// the end of any activity and the difference of any two times fit in TimeNs.
inline constexpr TimeNs kMaxAbsTimeNs = 3'000'000'000'000'000'000;
using StringId = uint32_t;  // 0 is always the empty string.

class StringTable {
 public:
  StringTable();
  StringTable(const StringTable&) = delete;
  StringTable& operator=(const StringTable&) = delete;
  StringTable(StringTable&&) = default;
  StringTable& operator=(StringTable&&) = default;

  StringId Intern(std::string_view s);
  std::string_view Get(StringId id) const { return by_id_[id]; }
  size_t size() const { return by_id_.size(); }

 private:
  std::deque<std::string> storage_;  // stable addresses for the views below
  std::unordered_map<std::string_view, StringId> index_;
  std::vector<std::string_view> by_id_;
};

// One GPU, identified by (rank, device). Zero means "not known" for numbers.
struct DeviceInfo {
  int32_t rank = 0;
  int32_t device = 0;
  std::string name;
  int32_t sm_count = 0;
  int32_t cc_major = 0;
  int32_t cc_minor = 0;
  int64_t memory_bytes = 0;
  int32_t clock_khz = 0;
  double memory_bandwidth_gbps = 0;
  double peak_tflops_fp32 = 0;
  double peak_tflops_bf16 = 0;
  double peak_tflops_fp8 = 0;
  // The device's entry of Kineto's deviceProperties as the file wrote it (a
  // compact JSON object, every field kept), empty when none.
  std::string properties_json;
};

enum class GpuKind : uint8_t { kKernel = 0, kMemcpy = 1, kMemset = 2 };

// A kernel, memcpy or memset as it ran on a device.
struct GpuActivity {
  TimeNs start = 0;
  TimeNs end = 0;
  int64_t correlation = -1;  // CUDA correlation id of the launching API call
  int64_t external_id = -1;  // framework operator that caused it (External id)
  int64_t bytes = 0;         // memcpy and memset only
  int64_t graph_id = -1;     // CUDA graph launch, when known
  int64_t graph_node = -1;
  uint32_t device_index = 0;  // into Trace::devices
  int32_t stream = 0;
  StringId name = 0;
  StringId copy_kind = 0;  // "HtoD", "DtoD"... for memcpy
  GpuKind kind = GpuKind::kKernel;
  int32_t grid[3] = {0, 0, 0};
  int32_t block[3] = {0, 0, 0};
  int32_t registers = 0;
  int32_t shared_memory = 0;
  // Kineto's NCCL collective metadata of a kernel ("Collective name", "In msg
  // nelems", "Group size", "dtype", "Process Group Name", ...): the members of
  // a compact JSON object without its braces, e.g. "Collective name":"allreduce",
  // "Group size":2; 0 when none.
  StringId collective = 0;
  // The host process that launched it; -1 when the source does not say
  // (Kineto files give the device as the pid of GPU rows).
  int32_t pid = -1;
};

enum class ApiKind : uint8_t { kRuntime = 0, kDriver = 1, kSync = 2 };

// A CUDA runtime or driver call, or a synchronization, on a host thread.
struct ApiCall {
  TimeNs start = 0;
  TimeNs end = 0;
  int64_t correlation = -1;
  int64_t external_id = -1;
  int32_t rank = 0;
  int32_t pid = 0;
  int32_t tid = 0;
  StringId name = 0;
  ApiKind kind = ApiKind::kRuntime;
  // Synchronization records (kSync) only, from Kineto's cuda_sync args or the
  // tracer's CUPTI records; -1 when not recorded. In Kineto files `pid` and
  // `tid` of such records are the device and the stream (-1: the whole
  // device); the tracer's are the host thread that synchronized. A wait names
  // the event's last cudaEventRecord before it: the stream it was recorded on
  // and that call's correlation id (CrossStreamDependencies in
  // stream_dependencies.h turns these into edges).
  int32_t sync_device = -1;            // "device"
  int32_t sync_stream = -1;            // "stream"
  int32_t wait_on_stream = -1;         // "wait_on_stream"
  int64_t wait_event_id = -1;          // "wait_on_cuda_event_id"
  int64_t wait_event_correlation = -1; // "wait_on_cuda_event_record_corr_id"
};

enum class Pass : uint8_t { kUnknown = 0, kForward = 1, kBackward = 2 };

// A framework operator (aten::mm, a RecordFunction, ...) on a host thread.
struct Operator {
  TimeNs start = 0;
  TimeNs end = 0;
  int64_t external_id = -1;  // links to GpuActivity::external_id of the same rank
  int64_t sequence = -1;     // autograd sequence number
  int32_t rank = 0;
  int32_t pid = 0;
  int32_t tid = 0;
  StringId name = 0;
  StringId input_shapes = 0;  // compact JSON, e.g. [[8,4096],[4096,4096]]
  StringId input_types = 0;   // compact JSON, e.g. ["c10::BFloat16","float"]
  // Kineto's "Concrete Inputs": the values of scalar and int-list arguments as
  // strings, e.g. ["","","[2, 2]","1"]; 0 when not recorded.
  StringId concrete_inputs = 0;
  // Kineto's "Input Strides", compact JSON like input_shapes; 0 when not
  // recorded.
  StringId input_strides = 0;
  // Collective metadata of record_param_comms, as GpuActivity::collective
  // (from Kineto files or the torch extension); kept in trace.db.
  StringId collective = 0;
  StringId module_path = 0;
  Pass pass = Pass::kUnknown;
  // Began while its thread captured CUDA work into a graph: its launches
  // were recorded, not run, and its GPU time is the graph's replays'.
  bool in_graph_capture = false;
};

enum class RangeDomain : uint8_t { kUser = 0, kGpuUser = 1, kNvtx = 2 };

// An annotated range: a user annotation on a host thread, its projection on a
// device (`device_index` >= 0), or an NVTX range.
struct Range {
  TimeNs start = 0;
  TimeNs end = 0;
  int32_t rank = 0;
  int32_t pid = 0;
  int32_t tid = 0;
  int32_t device_index = -1;
  StringId name = 0;
  RangeDomain domain = RangeDomain::kUser;
};

struct ProcessInfo {
  int32_t rank = 0;
  int32_t pid = 0;
  std::string name;
  // Kineto's process_labels: "CPU" for host processes, "GPU N" for devices;
  // empty when none was read.
  std::string label;
  // What the process recorded of itself (the tracer's metadata: rank, CUPTI
  // status, exit signal...), one value per key; empty for imported files.
  std::map<std::string, std::string> metadata;
};

struct ThreadInfo {
  int32_t rank = 0;
  int32_t pid = 0;
  int32_t tid = 0;
  std::string name;
};

// Import statistics: malformed or skipped input, counted by a named category,
// as Perfetto's stats table does. Bad data is data, never a crash.
struct ImportStat {
  std::string name;
  std::string severity;  // "info" | "data_loss" | "error"
  std::string description;
  int64_t count = 0;
};

class ImportStats {
 public:
  // Adds `n` to the named counter. The first call for a name fixes its
  // severity and description.
  void Add(std::string_view name, std::string_view severity, std::string_view description,
           int64_t n = 1);
  int64_t Get(std::string_view name) const;
  const std::vector<ImportStat>& all() const { return stats_; }

 private:
  std::vector<ImportStat> stats_;
};

struct Trace {
  StringTable strings;
  std::vector<DeviceInfo> devices;
  std::vector<GpuActivity> gpu;
  std::vector<ApiCall> api;
  std::vector<Operator> ops;
  std::vector<Range> ranges;
  std::vector<ProcessInfo> processes;
  std::vector<ThreadInfo> threads;
  ImportStats stats;
  std::map<std::string, std::string> metadata;  // source files, formats, tool versions
  // Kineto's distributedInfo of each rank as its file wrote it (a compact JSON
  // object, every field kept), by rank.
  std::map<int32_t, std::string> distributed_info;

  // Index of the device (rank, device), created with defaults when new.
  uint32_t DeviceIndex(int32_t rank, int32_t device);

  // BadInput "<source>: rank N is also in an earlier input..." when a device,
  // process or record already belongs to `rank`: importers call it before
  // adding a file's rank, since two runs of one rank would merge into one
  // meaningless timeline.
  Status CheckNewRank(int32_t rank, const std::string& source) const;

  // Moves the records of `part` (one imported file) into this trace, giving
  // every record the rank `rank`: strings are re-interned, devices merged by
  // (rank, device), statistics added and metadata values joined with ';'
  // (a process's own metadata travels in its ProcessInfo).
  void Append(Trace&& part, int32_t rank);

 private:
  std::unordered_map<int64_t, uint32_t> device_lookup_;
};

}  // namespace dynaflow
