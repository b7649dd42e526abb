#include "reports/perfetto_export.h"

#include <charconv>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>

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
  void Dim3Field(std::string_view key, const int32_t v[3]) {
    Key(key);
    Raw("[");
    for (int i = 0; i < 3; ++i) {
      if (i > 0) Raw(",");
      Int(v[i]);
    }
    Raw("]");
  }
  // ts, and dur when `end` is given: microseconds with exactly three decimals.
  void Times(TimeNs start, TimeNs end) {
    Key("ts");
    Micros(start);
    Key("dur");
    Micros(end - start);
  }
  void Ts(TimeNs start) {
    Key("ts");
    Micros(start);
  }

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

void WriteNames(EventWriter& w, const RankView& v) {
  std::string host_name;
  for (const ProcessInfo& p : v.trace.processes) {
    if (p.rank != v.rank) continue;
    if (host_name.empty()) host_name = p.name;
    WriteMetadata(w, "process_name", p.pid, 0, "name", p.name);
    WriteMetadata(w, "process_labels", p.pid, 0, "labels", "CPU");
    WriteSortIndex(w, "process_sort_index", p.pid, 0, p.pid);
  }
  for (const ThreadInfo& t : v.trace.threads) {
    if (t.rank != v.rank) continue;
    WriteMetadata(w, "thread_name", t.pid, t.tid, "name", t.name);
    WriteSortIndex(w, "thread_sort_index", t.pid, t.tid, t.tid);
  }
  std::set<std::pair<int64_t, int64_t>> streams;  // (device, stream)
  for (const GpuActivity& g : v.trace.gpu) {
    if (v.Has(g)) streams.emplace(v.Device(g.device_index).device, g.stream);
  }
  for (const DeviceInfo& d : v.trace.devices) {
    if (d.rank != v.rank) continue;
    const std::string label = "GPU " + std::to_string(d.device);
    WriteMetadata(w, "process_name", d.device, 0, "name", host_name.empty() ? label : host_name);
    WriteMetadata(w, "process_labels", d.device, 0, "labels", label);
    WriteSortIndex(w, "process_sort_index", d.device, 0, kDeviceSortIndexBase + d.device);
  }
  for (const auto& [device, stream] : streams) {
    WriteMetadata(w, "thread_name", device, stream, "name", "stream " + std::to_string(stream));
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
    if (o.module_path != 0) w.Field("Module Hierarchy", v.S(o.module_path));
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

void WriteApiCalls(EventWriter& w, const RankView& v) {
  for (const ApiCall& a : v.trace.api) {
    if (a.rank != v.rank) continue;
    w.Open("X", ApiCategory(a.kind), v.S(a.name), a.pid, a.tid);
    w.Times(a.start, a.end);
    w.OpenArgs();
    WriteIdArgs(w, a.external_id, a.correlation);
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
               TimeNs ts) {
  w.Open(ph, "ac2g", "ac2g", pid, tid);
  w.Field("id", id);
  w.Ts(ts);
  if (ph == "f") w.Field("bp", "e");
  w.Close();
}

// One flow per correlation id: from the launching runtime or driver call to
// the first GPU activity it caused.
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
}

void WriteDeviceProperties(EventWriter& w, const RankView& v) {
  w.Raw("\"deviceProperties\":[");
  bool first = true;
  for (const DeviceInfo& d : v.trace.devices) {
    if (d.rank != v.rank) continue;
    w.Raw(first ? "\n{" : ",\n{");
    first = false;
    w.Raw("\"id\":" + std::to_string(d.device) + ",\"name\":");
    w.String(d.name);
    w.Raw(",\"totalGlobalMem\":" + std::to_string(d.memory_bytes) + ",\"computeMajor\":" +
          std::to_string(d.cc_major) + ",\"computeMinor\":" + std::to_string(d.cc_minor) +
          ",\"numSms\":" + std::to_string(d.sm_count) + "}");
  }
  w.Raw("],\n");
}

}  // namespace

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
  EventWriter w(out);
  w.Raw("{\"schemaVersion\":1,\n");
  WriteDeviceProperties(w, view);
  w.Raw("\"distributedInfo\":{\"rank\":" + std::to_string(rank) + "},\n\"traceEvents\":[");
  WriteNames(w, view);
  WriteOperators(w, view);
  WriteApiCalls(w, view);
  WriteGpuActivities(w, view);
  WriteRanges(w, view);
  WriteLaunchFlows(w, view);
  w.Raw("\n],\n\"displayTimeUnit\":\"ms\"}\n");
}

}  // namespace dynaflow
