#include "reports/perfetto_export.h"

#include <charconv>
#include <map>
#include <tuple>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "analysis/model/stream_dependencies.h"

namespace dynaflow {
namespace {

// Kineto sorts device processes after host ones with this index base.
constexpr int64_t kDeviceSortIndexBase = 0x1000000;
// Kineto's id of the first thread that ran operators: see the header.
constexpr int64_t kForwardThreadId = 1;
constexpr size_t kFlushBytes = 1 << 20;

// Length of the UTF-8 sequence at s[i], 0 when it is not valid UTF-8.
size_t Utf8Length(std::string_view s, size_t i) {
  auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  auto cont = [&](size_t k, unsigned lo = 0x80, unsigned hi = 0xBF) {
    return k < s.size() && byte(k) >= lo && byte(k) <= hi;
  };
  const unsigned c = byte(i);
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(i + 1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    const unsigned lo = c == 0xE0 ? 0xA0 : 0x80;
    const unsigned hi = c == 0xED ? 0x9F : 0xBF;
    return cont(i + 1, lo, hi) && cont(i + 2) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    const unsigned lo = c == 0xF0 ? 0x90 : 0x80;
    const unsigned hi = c == 0xF4 ? 0x8F : 0xBF;
    return cont(i + 1, lo, hi) && cont(i + 2) && cont(i + 3) ? 4 : 0;
  }
  return 0;
}

// JSON text of traceEvents, built in a buffer that goes to the stream in
// large pieces. Fields know whether they open their object.
class EventWriter {
 public:
  explicit EventWriter(std::ostream& out) : out_(out) {}
  ~EventWriter() { Flush(); }

  void Raw(std::string_view s) {
    buf_.append(s);
    if (buf_.size() >= kFlushBytes) Flush();
  }

  // Starts an element of traceEvents with its common fields.
  void Open(std::string_view ph, std::string_view cat, std::string_view name, int64_t pid,
            int64_t tid) {
    Raw(events_ == 0 ? "\n{" : ",\n{");
    ++events_;
    first_ = true;
    Field("ph", ph);
    if (!cat.empty()) Field("cat", cat);
    Field("name", name);
    Field("pid", pid);
    Field("tid", tid);
  }
  void Close() { Raw("}"); }

  void OpenArgs() {
    Key("args");
    Raw("{");
    first_ = true;
  }
  void CloseArgs() {
    Raw("}");
    first_ = false;
  }

  void Field(std::string_view key, std::string_view value) {
    Key(key);
    String(value);
  }
  void Field(std::string_view key, const char* value) { Field(key, std::string_view(value)); }
  void Field(std::string_view key, int64_t value) {
    Key(key);
    Int(value);
  }
  void Field(std::string_view key, int32_t value) { Field(key, static_cast<int64_t>(value)); }
  void Field(std::string_view key, double value) {
    Key(key);
    char text[32];
    auto res = std::to_chars(text, text + sizeof(text), value, std::chars_format::general, 6);
    Raw(std::string_view(text, res.ptr - text));
  }
  void RawField(std::string_view key, std::string_view json) {
    Key(key);
    Raw(json);
  }
  // Members of an object, "a":1,"b":2, written into the object now open.
  void RawMembers(std::string_view members) {
    if (members.empty()) return;
    if (!first_) buf_.push_back(',');
    first_ = false;
    Raw(members);
  }
  void Dim3Field(std::string_view key, const int32_t v[3]) {
    Key(key);
    Raw("[");
    for (int i = 0; i < 3; ++i) {
      if (i > 0) Raw(",");
      Int(v[i]);
    }
    Raw("]");
  }
  // ts (relative to the document's base time) and dur: microseconds with
  // exactly three decimals.
  void Times(TimeNs start, TimeNs end) {
    Key("ts");
    Micros(start - base_ns_);
    Key("dur");
    Micros(end - start);
  }
  void Ts(TimeNs start) {
    Key("ts");
    Micros(start - base_ns_);
  }
  void SetBase(TimeNs base_ns) { base_ns_ = base_ns; }

  void String(std::string_view s) {
    buf_.push_back('"');
    for (size_t i = 0; i < s.size();) {
      const char c = s[i];
      const size_t n = Utf8Length(s, i);
      if (n == 0) {
        buf_.append("\\ufffd");
        ++i;
      } else if (c == '"' || c == '\\') {
        buf_.push_back('\\');
        buf_.push_back(c);
        ++i;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        static constexpr char kHex[] = "0123456789abcdef";
        buf_.append("\\u00");
        buf_.push_back(kHex[(c >> 4) & 0xF]);
        buf_.push_back(kHex[c & 0xF]);
        ++i;
      } else {
        buf_.append(s.substr(i, n));
        i += n;
      }
    }
    buf_.push_back('"');
  }

  void Flush() {
    out_.write(buf_.data(), static_cast<std::streamsize>(buf_.size()));
    buf_.clear();
  }

 private:
  void Key(std::string_view key) {
    if (!first_) buf_.push_back(',');
    first_ = false;
    String(key);
    buf_.push_back(':');
  }
  void Int(int64_t v) {
    char text[24];
    auto res = std::to_chars(text, text + sizeof(text), v);
    buf_.append(text, res.ptr);
  }
  void Micros(int64_t ns) {
    // Unsigned: the magnitude of INT64_MIN does not fit int64.
    uint64_t magnitude = ns < 0 ? 0 - static_cast<uint64_t>(ns) : static_cast<uint64_t>(ns);
    if (ns < 0) buf_.push_back('-');
    char text[24];
    auto res = std::to_chars(text, text + sizeof(text), magnitude / 1000);
    buf_.append(text, res.ptr);
    const auto frac = static_cast<unsigned>(magnitude % 1000);
    buf_.push_back('.');
    buf_.push_back(static_cast<char>('0' + frac / 100));
    buf_.push_back(static_cast<char>('0' + frac / 10 % 10));
    buf_.push_back(static_cast<char>('0' + frac % 10));
  }

  std::ostream& out_;
  std::string buf_;
  int64_t events_ = 0;
  bool first_ = true;
  TimeNs base_ns_ = 0;
};

// The records of one rank, with what the events need from the rest.
struct RankView {
  const Trace& trace;
  int32_t rank;

  const DeviceInfo& Device(uint32_t index) const { return trace.devices[index]; }
  bool Has(const GpuActivity& g) const { return Device(g.device_index).rank == rank; }
  std::string_view S(StringId id) const { return trace.strings.Get(id); }
};

void WriteMetadata(EventWriter& w, std::string_view what, int64_t pid, int64_t tid,
                   std::string_view key, std::string_view text) {
  w.Open("M", "", what, pid, tid);
  w.OpenArgs();
  w.Field(key, text);
  w.CloseArgs();
  w.Close();
}

void WriteSortIndex(EventWriter& w, std::string_view what, int64_t pid, int64_t tid,
                    int64_t index) {
  w.Open("M", "", what, pid, tid);
  w.OpenArgs();
  w.Field("sort_index", index);
  w.CloseArgs();
  w.Close();
}

// One process label and sort index per pid, and its name when the trace has
// one (names are records: the export adds none, so a round trip keeps the
// store's rows). The label is the one the file had; else a device's pid
// (Kineto's convention: pid = device) is labelled "GPU N" and any other pid
// "CPU". Thread names as the trace has them (Kineto may name one thread
// twice); a sort index for every named thread and device stream.
void WriteNames(EventWriter& w, const RankView& v) {
  struct Named {
    std::string_view name;
    std::string label;
  };
  std::set<int64_t> devices;
  for (const DeviceInfo& d : v.trace.devices) {
    if (d.rank == v.rank) devices.insert(d.device);
  }
  std::map<int64_t, Named> pids;
  for (const ProcessInfo& p : v.trace.processes) {
    if (p.rank != v.rank) continue;
    Named& n = pids[p.pid];
    if (n.name.empty()) n.name = p.name;
    if (n.label.empty()) n.label = p.label;
  }
  for (int64_t device : devices) pids.try_emplace(device);
  for (auto& [pid, n] : pids) {
    const bool device = devices.count(pid) != 0;
    if (n.label.empty()) n.label = device ? "GPU " + std::to_string(pid) : "CPU";
    const bool gpu = n.label.rfind("GPU", 0) == 0;
    if (!n.name.empty()) WriteMetadata(w, "process_name", pid, 0, "name", n.name);
    WriteMetadata(w, "process_labels", pid, 0, "labels", n.label);
    WriteSortIndex(w, "process_sort_index", pid, 0, gpu ? kDeviceSortIndexBase + pid : pid);
  }
  std::set<std::pair<int64_t, int64_t>> named_threads;  // (pid, tid)
  std::set<std::tuple<int64_t, int64_t, std::string_view>> written;
  for (const ThreadInfo& t : v.trace.threads) {
    if (t.rank != v.rank || !written.emplace(t.pid, t.tid, t.name).second) continue;
    WriteMetadata(w, "thread_name", t.pid, t.tid, "name", t.name);
    if (named_threads.emplace(t.pid, t.tid).second) {
      WriteSortIndex(w, "thread_sort_index", t.pid, t.tid, t.tid);
    }
  }
  std::set<std::pair<int64_t, int64_t>> streams;  // (device, stream)
  for (const GpuActivity& g : v.trace.gpu) {
    if (v.Has(g)) streams.emplace(v.Device(g.device_index).device, g.stream);
  }
  for (const auto& [device, stream] : streams) {
    if (named_threads.count({device, stream}) != 0) continue;
    WriteSortIndex(w, "thread_sort_index", device, stream, stream);
  }
}

void WriteIdArgs(EventWriter& w, int64_t external_id, int64_t correlation) {
  if (external_id >= 0) w.Field("External id", external_id);
  if (correlation >= 0) w.Field("correlation", correlation);
}

// Stored shapes and types are JSON text; anything else is left out.
void WriteJsonArg(EventWriter& w, std::string_view key, std::string_view json) {
  if (!json.empty() && nlohmann::json::accept(json)) w.RawField(key, json);
}

// Collective metadata: members of a JSON object (trace.h); left out unless
// they are valid JSON.
void WriteCollectiveArgs(EventWriter& w, std::string_view members) {
  if (members.empty()) return;
  std::string object;
  object.reserve(members.size() + 2);
  object.append("{").append(members).append("}");
  if (nlohmann::json::accept(object)) w.RawMembers(members);
}

void WriteOperators(EventWriter& w, const RankView& v) {
  for (const Operator& o : v.trace.ops) {
    if (o.rank != v.rank) continue;
    w.Open("X", "cpu_op", v.S(o.name), o.pid, o.tid);
    w.Times(o.start, o.end);
    w.OpenArgs();
    if (o.external_id >= 0) w.Field("External id", o.external_id);
    if (o.sequence >= 0) w.Field("Sequence number", o.sequence);
    if (o.pass == Pass::kBackward) w.Field("Fwd thread id", kForwardThreadId);
    WriteJsonArg(w, "Input Dims", v.S(o.input_shapes));
    WriteJsonArg(w, "Input type", v.S(o.input_types));
    WriteJsonArg(w, "Input Strides", v.S(o.input_strides));
    WriteJsonArg(w, "Concrete Inputs", v.S(o.concrete_inputs));
    if (o.module_path != 0) w.Field("Module Hierarchy", v.S(o.module_path));
    if (o.in_graph_capture) w.Field("Graph capture", 1);
    WriteCollectiveArgs(w, v.S(o.collective));
    w.CloseArgs();
    w.Close();
  }
}

std::string_view ApiCategory(ApiKind kind) {
  switch (kind) {
    case ApiKind::kRuntime: return "cuda_runtime";
    case ApiKind::kDriver: return "cuda_driver";
    case ApiKind::kSync: return "cuda_sync";
  }
  return "cuda_runtime";
}

// Kineto's cuda_sync args. Kineto writes the wait_on_* fields (-1 when not
// applicable) on event syncs and stream waits; other kinds get them only
// when known.
void WriteSyncArgs(EventWriter& w, const RankView& v, const ApiCall& a) {
  if (a.external_id >= 0) w.Field("External id", a.external_id);
  const std::string_view kind = v.S(a.name);
  w.Field("cuda_sync_kind", kind);
  const bool waits = kind == "Event Sync" || kind == "Stream Wait Event";
  if (waits || a.wait_on_stream != -1) w.Field("wait_on_stream", a.wait_on_stream);
  if (waits || a.wait_event_correlation != -1) {
    w.Field("wait_on_cuda_event_record_corr_id", a.wait_event_correlation);
  }
  if (waits || a.wait_event_id != -1) w.Field("wait_on_cuda_event_id", a.wait_event_id);
  if (a.sync_stream != -1 || a.sync_device >= 0) w.Field("stream", a.sync_stream);
  if (a.correlation >= 0) w.Field("correlation", a.correlation);
  if (a.sync_device >= 0) w.Field("device", a.sync_device);
}

void WriteApiCalls(EventWriter& w, const RankView& v) {
  for (const ApiCall& a : v.trace.api) {
    if (a.rank != v.rank) continue;
    w.Open("X", ApiCategory(a.kind), v.S(a.name), a.pid, a.tid);
    w.Times(a.start, a.end);
    w.OpenArgs();
    if (a.kind == ApiKind::kSync) {
      WriteSyncArgs(w, v, a);
    } else {
      WriteIdArgs(w, a.external_id, a.correlation);
    }
    w.CloseArgs();
    w.Close();
  }
}

std::string_view GpuCategory(GpuKind kind) {
  switch (kind) {
    case GpuKind::kKernel: return "kernel";
    case GpuKind::kMemcpy: return "gpu_memcpy";
    case GpuKind::kMemset: return "gpu_memset";
  }
  return "kernel";
}

void WriteGpuArgs(EventWriter& w, const RankView& v, const GpuActivity& g) {
  w.OpenArgs();
  if (g.external_id >= 0) w.Field("External id", g.external_id);
  w.Field("device", static_cast<int64_t>(v.Device(g.device_index).device));
  w.Field("stream", static_cast<int64_t>(g.stream));
  if (g.correlation >= 0) w.Field("correlation", g.correlation);
  if (g.kind == GpuKind::kKernel) {
    w.Field("registers per thread", static_cast<int64_t>(g.registers));
    w.Field("shared memory", static_cast<int64_t>(g.shared_memory));
    w.Dim3Field("grid", g.grid);
    w.Dim3Field("block", g.block);
    WriteCollectiveArgs(w, v.S(g.collective));
  } else {
    w.Field("bytes", g.bytes);
    if (g.end > g.start) {  // bytes per nanosecond is GB/s
      w.Field("memory bandwidth (GB/s)",
              static_cast<double>(g.bytes) / static_cast<double>(g.end - g.start));
    }
    if (g.kind == GpuKind::kMemcpy && g.copy_kind != 0) w.Field("kind", v.S(g.copy_kind));
  }
  w.CloseArgs();
}

void WriteGpuActivities(EventWriter& w, const RankView& v) {
  for (const GpuActivity& g : v.trace.gpu) {
    if (!v.Has(g)) continue;
    w.Open("X", GpuCategory(g.kind), v.S(g.name), v.Device(g.device_index).device, g.stream);
    w.Times(g.start, g.end);
    WriteGpuArgs(w, v, g);
    w.Close();
  }
}

void WriteRanges(EventWriter& w, const RankView& v) {
  for (const Range& r : v.trace.ranges) {
    if (r.rank != v.rank) continue;
    const bool on_device = r.domain == RangeDomain::kGpuUser && r.device_index >= 0;
    w.Open("X", on_device ? "gpu_user_annotation" : "user_annotation", v.S(r.name), r.pid, r.tid);
    w.Times(r.start, r.end);
    if (on_device) {
      w.OpenArgs();
      w.Field("device", static_cast<int64_t>(v.Device(r.device_index).device));
      w.CloseArgs();
    }
    w.Close();
  }
}

void WriteFlow(EventWriter& w, std::string_view ph, int64_t id, int64_t pid, int64_t tid,
               TimeNs ts, std::string_view cat = "ac2g") {
  w.Open(ph, cat, cat, pid, tid);
  w.Field("id", id);
  w.Ts(ts);
  if (ph == "f") w.Field("bp", "e");
  w.Close();
}

// One flow per correlation id, as Kineto writes them: from the runtime or
// driver call to the first GPU activity it caused (launches, copies), or to
// the synchronization record it caused (cudaEventSynchronize -> Event Sync,
// cudaStreamWaitEvent -> Stream Wait Event, cudaDeviceSynchronize...).
void WriteLaunchFlows(EventWriter& w, const RankView& v) {
  std::unordered_map<int64_t, const ApiCall*> launches;
  for (const ApiCall& a : v.trace.api) {
    if (a.rank == v.rank && a.correlation >= 0 && a.kind != ApiKind::kSync) {
      launches.emplace(a.correlation, &a);
    }
  }
  std::unordered_set<int64_t> linked;
  for (const GpuActivity& g : v.trace.gpu) {
    if (!v.Has(g) || g.correlation < 0) continue;
    auto it = launches.find(g.correlation);
    if (it == launches.end() || !linked.insert(g.correlation).second) continue;
    const ApiCall& a = *it->second;
    WriteFlow(w, "s", g.correlation, a.pid, a.tid, a.start);
    WriteFlow(w, "f", g.correlation, v.Device(g.device_index).device, g.stream, g.start);
  }
  for (const ApiCall& sync : v.trace.api) {
    if (sync.rank != v.rank || sync.kind != ApiKind::kSync || sync.correlation < 0) continue;
    auto it = launches.find(sync.correlation);
    if (it == launches.end() || !linked.insert(sync.correlation).second) continue;
    const ApiCall& a = *it->second;
    WriteFlow(w, "s", sync.correlation, a.pid, a.tid, a.start);
    WriteFlow(w, "f", sync.correlation, sync.pid, sync.tid, sync.start);
  }
}

// Cross-stream dependencies (stream_dependencies.h), which Kineto does not
// draw: s at the last activity on the event's stream before its record, f at
// the first activity on the waiting stream after the wait, with the wait's
// correlation id, so the arrow crosses from stream to stream where
// cudaStreamWaitEvent joined them. An edge with an end outside the trace is
// not drawn.
void WriteStreamDependencyFlows(EventWriter& w, const RankView& v) {
  constexpr std::string_view kCategory = "cuda_stream_wait";
  for (const StreamDependency& e : CrossStreamDependencies(v.trace)) {
    const ApiCall& wait = v.trace.api[e.wait];
    if (wait.rank != v.rank || e.from < 0 || e.to < 0) continue;
    const GpuActivity& from = v.trace.gpu[static_cast<size_t>(e.from)];
    const GpuActivity& to = v.trace.gpu[static_cast<size_t>(e.to)];
    WriteFlow(w, "s", wait.correlation, v.Device(from.device_index).device, from.stream,
              from.start, kCategory);
    WriteFlow(w, "f", wait.correlation, v.Device(to.device_index).device, to.stream, to.start,
              kCategory);
  }
}

// Kineto's fwdbwd flows, rebuilt from sequence numbers (the importer counts
// flow events and keeps none): per (pid, sequence number), s at the forward
// operator that starts last (the innermost that carries the number), f at
// the first backward operator that is not autograd's evaluate_function
// wrapper. On hta_a100_nccl_2ranks this gives exactly Kineto's 543 flows.
void WriteForwardBackwardFlows(EventWriter& w, const RankView& v) {
  constexpr std::string_view kWrapper = "autograd::engine::evaluate_function";
  std::map<std::pair<int64_t, int64_t>, std::pair<const Operator*, const Operator*>> links;
  for (const Operator& o : v.trace.ops) {
    if (o.rank != v.rank || o.sequence < 0) continue;
    auto& [forward, backward] = links[{o.pid, o.sequence}];
    if (o.pass == Pass::kForward) {
      const bool later = forward == nullptr || o.start > forward->start ||
                         (o.start == forward->start && o.end < forward->end);
      if (later) forward = &o;
    } else if (o.pass == Pass::kBackward && v.S(o.name).substr(0, kWrapper.size()) != kWrapper) {
      if (backward == nullptr || o.start < backward->start) backward = &o;
    }
  }
  int64_t id = 0;
  for (const auto& [key, link] : links) {
    const auto& [forward, backward] = link;
    if (forward == nullptr || backward == nullptr) continue;
    ++id;
    WriteFlow(w, "s", id, forward->pid, forward->tid, forward->start, "fwdbwd");
    WriteFlow(w, "f", id, backward->pid, backward->tid, backward->start, "fwdbwd");
  }
}

// The entries the file had, verbatim (every field torch.profiler wrote, the
// file's own ids: the importer maps them to devices again as it did the
// first time), once each; else one built from the model for each device
// that knows anything (0 is "not known").
void WriteDeviceProperties(EventWriter& w, const RankView& v) {
  w.Raw("\"deviceProperties\":[");
  bool first = true;
  std::set<std::string_view> written;
  for (const DeviceInfo& d : v.trace.devices) {
    if (d.rank != v.rank) continue;
    const bool file_entry =
        !d.properties_json.empty() && nlohmann::json::accept(d.properties_json);
    if (file_entry ? !written.insert(d.properties_json).second
                   : d.name.empty() && d.sm_count == 0 && d.memory_bytes == 0) {
      continue;
    }
    w.Raw(first ? "\n" : ",\n");
    first = false;
    if (file_entry) {
      w.Raw(d.properties_json);
      continue;
    }
    w.Raw("{");
    w.Raw("\"id\":" + std::to_string(d.device) + ",\"name\":");
    w.String(d.name);
    w.Raw(",\"totalGlobalMem\":" + std::to_string(d.memory_bytes) + ",\"computeMajor\":" +
          std::to_string(d.cc_major) + ",\"computeMinor\":" + std::to_string(d.cc_minor) +
          ",\"numSms\":" + std::to_string(d.sm_count) + "}");
  }
  w.Raw("],\n");
}

// The rank's distributedInfo as its file wrote it, its rank set to `rank`.
std::string DistributedInfo(const RankView& v) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (auto it = v.trace.distributed_info.find(v.rank); it != v.trace.distributed_info.end()) {
    auto parsed = nlohmann::ordered_json::parse(it->second, nullptr, false);
    if (parsed.is_object()) j = std::move(parsed);
  }
  j["rank"] = v.rank;
  // torch.profiler's spacing ("rank": 0): HTA finds a file's rank with the
  // regular expression "rank":\s+(\d+) on the first line that matches.
  std::string text = "{";
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it != j.begin()) text += ", ";
    text += nlohmann::ordered_json(it.key()).dump(-1, ' ', false,
                                                  nlohmann::json::error_handler_t::replace);
    text += ": ";
    text += it.value().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  return text + "}";
}

}  // namespace

TimeNs ExportBaseTimeNs(const Trace& trace) {
  constexpr TimeNs kSecond = 1'000'000'000;
  bool any = false;
  TimeNs first = 0;
  auto visit = [&](const auto& records) {
    for (const auto& r : records) {
      if (!any || r.start < first) first = r.start;
      any = true;
    }
  };
  visit(trace.gpu);
  visit(trace.api);
  visit(trace.ops);
  visit(trace.ranges);
  if (!any) return 0;
  TimeNs base = first / kSecond * kSecond;
  if (base > first) base -= kSecond;  // floor for negative times
  return base;
}

std::vector<int32_t> TraceRanks(const Trace& trace) {
  std::set<int32_t> ranks;
  for (const DeviceInfo& d : trace.devices) ranks.insert(d.rank);
  for (const ApiCall& a : trace.api) ranks.insert(a.rank);
  for (const Operator& o : trace.ops) ranks.insert(o.rank);
  for (const Range& r : trace.ranges) ranks.insert(r.rank);
  for (const ProcessInfo& p : trace.processes) ranks.insert(p.rank);
  for (const ThreadInfo& t : trace.threads) ranks.insert(t.rank);
  return {ranks.begin(), ranks.end()};
}

void WritePerfettoJson(const Trace& trace, int32_t rank, std::ostream& out) {
  const RankView view{trace, rank};
  const TimeNs base = ExportBaseTimeNs(trace);
  EventWriter w(out);
  w.SetBase(base);
  w.Raw("{\"schemaVersion\":1,\n");
  WriteDeviceProperties(w, view);
  w.Raw("\"distributedInfo\":" + DistributedInfo(view) + ",\n");
  w.Raw("\"baseTimeNanoseconds\":" + std::to_string(base) + ",\n\"traceEvents\":[");
  WriteNames(w, view);
  WriteOperators(w, view);
  WriteApiCalls(w, view);
  WriteGpuActivities(w, view);
  WriteRanges(w, view);
  WriteLaunchFlows(w, view);
  WriteStreamDependencyFlows(w, view);
  WriteForwardBackwardFlows(w, view);
  w.Raw("\n],\n\"displayTimeUnit\":\"ms\"}\n");
}

}  // namespace dynaflow
