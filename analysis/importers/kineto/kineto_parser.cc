#include "analysis/importers/kineto/kineto_parser.h"

#include <simdjson.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <unordered_map>
#include <vector>

#include "analysis/importers/io/byte_stream.h"

namespace dynaflow {
namespace {

namespace od = simdjson::ondemand;

enum class Category {
  kKernel,
  kMemcpy,
  kMemset,
  kRuntime,
  kDriver,
  kSync,
  kOperator,
  kUserAnnotation,
  kGpuUserAnnotation,
  kPythonFunction,
  kOther,
};

Category ClassifyCategory(std::string_view cat) {
  if (cat == "kernel" || cat == "Kernel") return Category::kKernel;
  if (cat == "gpu_memcpy" || cat == "Memcpy") return Category::kMemcpy;
  if (cat == "gpu_memset" || cat == "Memset") return Category::kMemset;
  if (cat == "cuda_runtime" || cat == "Runtime") return Category::kRuntime;
  if (cat == "cuda_driver") return Category::kDriver;
  if (cat == "cuda_sync") return Category::kSync;
  if (cat == "cpu_op" || cat == "Operator" || cat == "operator") return Category::kOperator;
  if (cat == "user_annotation") return Category::kUserAnnotation;
  if (cat == "gpu_user_annotation") return Category::kGpuUserAnnotation;
  if (cat == "python_function") return Category::kPythonFunction;
  return Category::kOther;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\r' ||
                        s.back() == '\t')) {
    s.remove_suffix(1);
  }
  return s;
}

// "stream 7" -> 7, "25738" -> 25738; false when there is no trailing number.
bool TrailingInteger(std::string_view s, int64_t* out) {
  size_t end = s.size();
  size_t begin = end;
  while (begin > 0 && s[begin - 1] >= '0' && s[begin - 1] <= '9') --begin;
  if (begin == end) return false;
  bool negative = begin > 0 && s[begin - 1] == '-';
  int64_t v = 0;
  auto res = std::from_chars(s.data() + begin, s.data() + end, v);
  if (res.ec != std::errc()) return false;
  *out = negative ? -v : v;
  return true;
}

// Removes whitespace outside strings: "[[1, 512], []]" -> "[[1,512],[]]".
// Writes into `out` (cleared first) so one buffer serves every event.
std::string_view CompactJson(std::string_view raw, std::string* buffer) {
  std::string& out = *buffer;
  out.clear();
  bool in_string = false;
  bool escape = false;
  for (char c : raw) {
    if (in_string) {
      out.push_back(c);
      if (escape) {
        escape = false;
      } else if (c == '\\') {
        escape = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    if (c == '"') in_string = true;
    out.push_back(c);
  }
  return out;
}

std::string_view RawArray(od::value v) {
  od::array array = v.get_array();
  return array.raw_json().value();
}

// The fields of one event that any category needs. Views point into the
// event text or simdjson's string buffer and live until the next event.
struct RawEvent {
  std::string_view ph;
  std::string_view cat;
  std::string_view name;
  bool has_ts = false;
  bool has_dur = false;
  bool ts_bad = false;
  int64_t ts = 0;
  int64_t dur = 0;
  int64_t pid = 0;
  int64_t tid = 0;

  int64_t device = -1;
  int64_t stream = -1;
  int64_t correlation = -1;
  int64_t external_id = -1;
  int64_t bytes = 0;
  int64_t sequence = -1;
  int64_t registers = 0;
  int64_t shared_memory = 0;
  int64_t grid[3] = {0, 0, 0};
  int64_t block[3] = {0, 0, 0};
  bool backward_thread = false;  // "Fwd thread id" marks an autograd (backward) op
  bool graph_capture = false;    // "Graph capture": 1 marks a capture-time op (dynaflow's)
  std::string_view arg_name;     // metadata events: args.name
  std::string_view labels;       // metadata events: args.labels
  std::string_view copy_kind;    // args.kind of memcpy
  std::string_view input_dims;   // raw JSON arrays, compacted when interned
  std::string_view input_types;
  std::string_view concrete_inputs;
  std::string_view input_strides;
  std::string_view module_path;
  // cuda_sync records
  int64_t wait_on_stream = -1;
  int64_t wait_event_id = -1;
  int64_t wait_event_correlation = -1;
  // Collective metadata: members of a compact JSON object, see trace.h.
  std::string collective;
};

// Kineto's NCCL collective metadata (kernels and record_param_comms), kept
// verbatim in GpuActivity::collective and Operator::collective.
constexpr std::string_view kCollectiveKeys[] = {
    "Collective name",     "In msg nelems",       "Out msg nelems",
    "Group size",          "dtype",               "In split size",
    "Out split size",      "Process Group Name",  "Process Group Description",
    "Process Group Ranks", "Global rank start",   "Global rank stride",
};

bool IsCollectiveKey(std::string_view key) {
  for (std::string_view k : kCollectiveKeys) {
    if (k == key) return true;
  }
  return false;
}

// Appends "key":value (the value's JSON text, compacted) to `members`.
void AppendMember(std::string_view key, od::value v, std::string* members) {
  std::string_view raw;
  const od::json_type type = v.type();
  if (type == od::json_type::array) {
    raw = RawArray(v);
  } else if (type == od::json_type::object) {
    od::object object = v.get_object();
    raw = object.raw_json().value();
  } else {
    raw = Trim(v.raw_json_token());
  }
  std::string compact;
  CompactJson(raw, &compact);
  if (!members->empty()) members->push_back(',');
  members->push_back('"');
  members->append(key);  // one of kCollectiveKeys: nothing to escape
  members->append("\":");
  members->append(compact);
}

// Reads an integer that may be written as a number or a string.
int64_t ReadId(od::value v) {
  od::json_type type = v.type();
  if (type == od::json_type::number) {
    std::string_view tok = Trim(v.raw_json_token());
    int64_t out = 0;
    auto res = std::from_chars(tok.data(), tok.data() + tok.size(), out);
    if (res.ec == std::errc()) return out;
    const double d = std::strtod(std::string(tok).c_str(), nullptr);
    // Out-of-range doubles (1e300, inf) have no integer value: treat as absent.
    return std::fabs(d) < 9e18 ? static_cast<int64_t>(d) : 0;
  }
  if (type == od::json_type::string) {
    int64_t out = 0;
    if (TrailingInteger(v.get_string().value(), &out)) return out;
  }
  return 0;
}

bool ReadMicros(od::value v, int64_t* ns) {
  od::json_type type = v.type();
  if (type == od::json_type::number) return MicrosToNs(Trim(v.raw_json_token()), ns);
  if (type == od::json_type::string) return MicrosToNs(v.get_string().value(), ns);
  return false;
}

void ReadDim3(od::value v, int64_t out[3]) {
  int i = 0;
  for (auto element : v.get_array()) {
    if (i == 3) break;
    out[i++] = element.get_int64().value();
  }
}

void ReadArgs(od::object args, RawEvent* e) {
  for (auto field : args) {
    std::string_view key = field.unescaped_key().value();
    od::value v = field.value().value();
    if (key.empty()) continue;
    switch (key[0]) {
      case 'd':
        if (key == "device") {
          e->device = ReadId(v);
        } else if (key == "dtype") {
          AppendMember(key, v, &e->collective);
        }
        break;
      case 's':
        if (key == "stream") {
          e->stream = ReadId(v);
        } else if (key == "shared memory") {
          e->shared_memory = ReadId(v);
        }
        break;
      case 'c':
        if (key == "correlation") e->correlation = ReadId(v);
        break;
      case 'E':
      case 'e':
        if (key == "External id" || key == "external id") e->external_id = ReadId(v);
        break;
      case 'b':
        if (key == "bytes") {
          e->bytes = ReadId(v);
        } else if (key == "block") {
          ReadDim3(v, e->block);
        }
        break;
      case 'g':
        if (key == "grid") ReadDim3(v, e->grid);
        break;
      case 'r':
        if (key == "registers per thread") e->registers = ReadId(v);
        break;
      case 'S':
        if (key == "Sequence number") e->sequence = ReadId(v);
        break;
      case 'F':
        // PyTorch writes "Fwd thread id" on every op with a sequence number:
        // 0 on forward ops, the forward thread's id on autograd (backward) ops.
        if (key == "Fwd thread id") e->backward_thread = ReadId(v) != 0;
        break;
      case 'I':
        if (key == "Input Dims") {
          e->input_dims = RawArray(v);
        } else if (key == "Input type") {
          e->input_types = RawArray(v);
        } else if (key == "Input Strides") {
          e->input_strides = RawArray(v);
        } else if (key == "In msg nelems" || key == "In split size") {
          AppendMember(key, v, &e->collective);
        }
        break;
      case 'C':
        if (key == "Concrete Inputs") {
          e->concrete_inputs = RawArray(v);
        } else if (key == "Collective name") {
          AppendMember(key, v, &e->collective);
        }
        break;
      case 'G':
        if (key == "Graph capture") {
          e->graph_capture = ReadId(v) == 1;
        } else if (IsCollectiveKey(key)) {  // "Group size"
          AppendMember(key, v, &e->collective);
        }
        break;
      case 'M':
        if (key == "Module Hierarchy" && v.type() == od::json_type::string) {
          e->module_path = v.get_string().value();
        }
        break;
      case 'n':
        if (key == "name" && v.type() == od::json_type::string) e->arg_name = v.get_string().value();
        break;
      case 'k':
        if (key == "kind" && v.type() == od::json_type::string) e->copy_kind = v.get_string().value();
        break;
      case 'l':
        if (key == "labels" && v.type() == od::json_type::string) e->labels = v.get_string().value();
        break;
      case 'w':
        if (key == "wait_on_stream") {
          e->wait_on_stream = ReadId(v);
        } else if (key == "wait_on_cuda_event_id") {
          e->wait_event_id = ReadId(v);
        } else if (key == "wait_on_cuda_event_record_corr_id") {
          e->wait_event_correlation = ReadId(v);
        }
        break;
      default:
        if (IsCollectiveKey(key)) AppendMember(key, v, &e->collective);
        break;
    }
  }
}

void ReadEvent(od::object obj, RawEvent* e) {
  for (auto field : obj) {
    std::string_view key = field.unescaped_key().value();
    od::value v = field.value().value();
    if (key == "ph") {
      e->ph = v.get_string().value();
    } else if (key == "cat") {
      e->cat = v.get_string().value();
    } else if (key == "name") {
      if (v.type() == od::json_type::string) e->name = v.get_string().value();
    } else if (key == "ts") {
      e->has_ts = ReadMicros(v, &e->ts);
      e->ts_bad = !e->has_ts;
    } else if (key == "dur") {
      e->has_dur = ReadMicros(v, &e->dur);
    } else if (key == "pid") {
      e->pid = ReadId(v);
    } else if (key == "tid") {
      e->tid = ReadId(v);
    } else if (key == "args") {
      if (v.type() == od::json_type::object) ReadArgs(v.get_object().value(), e);
    }
  }
}

// "Memcpy HtoD (Pageable -> Device)" -> "HtoD".
std::string_view CopyKindFromName(std::string_view name) {
  constexpr std::string_view kPrefix = "Memcpy ";
  if (name.substr(0, kPrefix.size()) != kPrefix) return {};
  name.remove_prefix(kPrefix.size());
  return name.substr(0, name.find(' '));
}

constexpr const char* kFlowEventsDescription =
    "flow events (ac2g, fwdbwd); launches are linked by correlation id instead";

// Flow events (ph "s", "f", "t": a third of a typical trace) are only
// counted, so the plainest of them skip simdjson. True only when `json` is an
// object of plain fields whose last "ph" is "s", "f" or "t" and whose every
// "cat" is a string, which the full parse would count as a flow event too:
// keys and string values of printable ASCII without escapes, values that are
// such strings or JSON numbers, nothing nested. Anything else (false) goes
// through the full parse, so malformed events are judged exactly as before.
// Kineto writes "ph" first; other first keys return false at once.
bool IsPlainFlowEvent(std::string_view json) {
  const char* p = json.data();
  const char* const end = p + json.size();
  auto space = [&] {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) ++p;
  };
  // A string without escapes or control characters; its body in *out.
  auto string = [&](std::string_view* out) {
    if (p == end || *p != '"') return false;
    const char* begin = ++p;
    while (p < end && *p != '"') {
      const auto c = static_cast<unsigned char>(*p);
      if (c < 0x20 || c > 0x7E || c == '\\') return false;
      ++p;
    }
    if (p == end) return false;
    *out = std::string_view(begin, static_cast<size_t>(p - begin));
    ++p;
    return true;
  };
  auto digits = [&] {
    const char* begin = p;
    while (p < end && *p >= '0' && *p <= '9') ++p;
    return p > begin;
  };
  // -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
  auto number = [&] {
    if (p < end && *p == '-') ++p;
    if (p == end) return false;
    if (*p == '0') {
      ++p;
    } else if (!digits()) {
      return false;
    }
    if (p < end && *p == '.') {
      ++p;
      if (!digits()) return false;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
      ++p;
      if (p < end && (*p == '+' || *p == '-')) ++p;
      if (!digits()) return false;
    }
    return true;
  };

  space();
  if (p == end || *p != '{') return false;
  ++p;
  space();
  // The cheap gate: the first key is "ph" and its value is "s", "f" or "t".
  if (static_cast<size_t>(end - p) < 4 || std::string_view(p, 4) != "\"ph\"") return false;
  std::string_view ph;
  for (bool first = true;; first = false) {
    if (!first) {
      space();
      if (p == end) return false;
      if (*p == '}') {
        ++p;
        break;
      }
      if (*p != ',') return false;
      ++p;
      space();
    }
    std::string_view key;
    if (!string(&key)) return false;
    space();
    if (p == end || *p != ':') return false;
    ++p;
    space();
    if (p == end) return false;
    if (*p == '"') {
      std::string_view value;
      if (!string(&value)) return false;
      if (key == "ph") ph = value;
    } else {
      if (key == "ph" || key == "cat" || !number()) return false;
    }
    if (first && ph != "s" && ph != "f" && ph != "t") return false;
  }
  space();
  return p == end && (ph == "s" || ph == "f" || ph == "t");
}

struct DeviceProps {
  std::string name;
  int32_t sm_count = 0;
  int32_t cc_major = 0;
  int32_t cc_minor = 0;
  int64_t memory_bytes = 0;
  std::string json;  // the whole entry, compact
};

}  // namespace

bool MicrosToNs(std::string_view tok, int64_t* ns) {
  constexpr int64_t kMaxAbsUs = kMaxAbsTimeNs / 1000;  // see trace.h
  if (tok.empty()) return false;
  size_t i = 0;
  bool negative = false;
  if (tok[0] == '-') {
    negative = true;
    i = 1;
  }
  int64_t whole = 0;
  size_t digits = 0;
  for (; i < tok.size() && tok[i] >= '0' && tok[i] <= '9'; ++i, ++digits) {
    if (whole > kMaxAbsUs) return false;
    whole = whole * 10 + (tok[i] - '0');
  }
  int64_t frac = 0;  // nanoseconds
  bool round_up = false;
  if (i < tok.size() && tok[i] == '.') {
    ++i;
    int frac_digits = 0;
    for (; i < tok.size() && tok[i] >= '0' && tok[i] <= '9'; ++i, ++digits) {
      if (frac_digits < 3) {
        frac = frac * 10 + (tok[i] - '0');
      } else if (frac_digits == 3) {
        round_up = tok[i] >= '5';
      }
      ++frac_digits;
    }
    for (; frac_digits < 3; ++frac_digits) frac *= 10;
  }
  if (digits == 0) return false;
  if (i < tok.size()) {
    // Exponent or anything unusual: fall back to floating point.
    char* end = nullptr;
    std::string copy(tok);
    double us = std::strtod(copy.c_str(), &end);
    if (end == copy.c_str() || *end != '\0') return false;
    if (!(std::fabs(us) <= static_cast<double>(kMaxAbsUs))) return false;  // also NaN
    *ns = static_cast<int64_t>(us * 1000.0 + (us >= 0 ? 0.5 : -0.5));
    return true;
  }
  if (whole > kMaxAbsUs) return false;
  int64_t v = whole * 1000 + frac + (round_up ? 1 : 0);
  *ns = negative ? -v : v;
  return true;
}

int64_t ShiftTimes(Trace* trace, int64_t offset_ns) {
  int64_t removed = 0;
  auto shift = [offset_ns, &removed](auto& records) {
    size_t kept = 0;
    for (auto& r : records) {
      r.start += offset_ns;  // both within +-2 * kMaxAbsTimeNs: no overflow
      r.end += offset_ns;
      if (r.start < -kMaxAbsTimeNs || r.start > kMaxAbsTimeNs || r.end < -kMaxAbsTimeNs ||
          r.end > kMaxAbsTimeNs) {
        ++removed;
        continue;
      }
      records[kept++] = r;
    }
    records.resize(kept);
  };
  shift(trace->gpu);
  shift(trace->api);
  shift(trace->ops);
  shift(trace->ranges);
  return removed;
}

struct KinetoParser::Impl {
  od::parser parser;
  std::string compact;  // scratch for CompactJson
  std::unordered_map<int64_t, DeviceProps> props;  // deviceProperties by id
};

KinetoParser::KinetoParser(Trace* part) : impl_(std::make_unique<Impl>()), part_(part) {}
KinetoParser::~KinetoParser() = default;

void KinetoParser::OnNonObjectEvent() {
  part_->stats.Add("kineto_non_object_event", "data_loss",
                   "elements of traceEvents that are not JSON objects");
}

void KinetoParser::OnTopLevel(std::string_view key, std::string_view json) {
  if (key == "baseTimeNanoseconds") {
    std::string_view tok = Trim(json);
    while (!tok.empty() && (tok.front() == ' ' || tok.front() == '\n' || tok.front() == '\r' ||
                            tok.front() == '\t')) {
      tok.remove_prefix(1);
    }
    int64_t base = 0;
    auto res = std::from_chars(tok.data(), tok.data() + tok.size(), base);
    if (res.ec != std::errc() || res.ptr != tok.data() + tok.size() || base < -kMaxBaseTimeNs ||
        base > kMaxBaseTimeNs) {
      part_->stats.Add("kineto_bad_base_time", "data_loss",
                       "baseTimeNanoseconds that is not an integer within +-3e18: ignored, "
                       "times stay relative to it");
      return;
    }
    base_time_ns_ = base;
    return;
  }
  if (key != "distributedInfo" && key != "deviceProperties") return;
  simdjson::padded_string padded(json);
  try {
    od::document doc = impl_->parser.iterate(padded);
    if (key == "distributedInfo") {
      std::string compact;
      part_->distributed_info[0] = std::string(CompactJson(json, &compact));
      for (auto field : doc.get_object()) {
        if (field.unescaped_key().value() == "rank") {
          rank_ = static_cast<int32_t>(ReadId(field.value().value()));
        }
      }
      return;
    }
    std::vector<std::string> raws;
    for (auto element : doc.get_array()) {
      std::string compact;
      od::object object = element.get_object();
      raws.emplace_back(CompactJson(object.raw_json().value(), &compact));
    }
    for (const std::string& raw : raws) {
      simdjson::padded_string one(raw);
      od::document element = impl_->parser.iterate(one);
      DeviceProps p;
      p.json = raw;
      int64_t id = -1;
      for (auto field : element.get_object()) {
        std::string_view k = field.unescaped_key().value();
        od::value v = field.value().value();
        if (k == "id") {
          id = ReadId(v);
        } else if (k == "name") {
          p.name = std::string(v.get_string().value());
        } else if (k == "numSms") {
          p.sm_count = static_cast<int32_t>(ReadId(v));
        } else if (k == "computeMajor") {
          p.cc_major = static_cast<int32_t>(ReadId(v));
        } else if (k == "computeMinor") {
          p.cc_minor = static_cast<int32_t>(ReadId(v));
        } else if (k == "totalGlobalMem") {
          p.memory_bytes = ReadId(v);
        }
      }
      if (id >= 0) impl_->props[id] = std::move(p);
    }
  } catch (const simdjson::simdjson_error&) {
    part_->stats.Add("kineto_bad_" + std::string(key), "data_loss",
                     "a top-level metadata value that could not be parsed");
  }
}

void KinetoParser::OnEvent(std::string_view json) {
  if (IsPlainFlowEvent(json)) {
    part_->stats.Add("kineto_flow_events", "info", kFlowEventsDescription);
    return;
  }
  RawEvent e;
  try {
    od::document doc = impl_->parser.iterate(
        simdjson::padded_string_view(json.data(), json.size(), json.size() + kChunkPadding));
    ReadEvent(doc.get_object(), &e);
  } catch (const simdjson::simdjson_error&) {
    part_->stats.Add("kineto_malformed_event", "data_loss",
                     "events that are not valid JSON or have fields of the wrong type");
    return;
  }
  Trace& t = *part_;

  if (e.ph == "M") {
    if (e.name == "process_name" && !e.arg_name.empty()) {
      t.processes.push_back({0, static_cast<int32_t>(e.pid), std::string(e.arg_name), "", {}});
    } else if (e.name == "process_labels" && !e.labels.empty()) {
      // Kineto names a process before it labels it: the label goes to the
      // latest process of that pid.
      auto it = std::find_if(t.processes.rbegin(), t.processes.rend(),
                             [&](const ProcessInfo& p) { return p.pid == e.pid; });
      if (it != t.processes.rend()) it->label = std::string(e.labels);
    } else if (e.name == "thread_name" && !e.arg_name.empty()) {
      t.threads.push_back({0, static_cast<int32_t>(e.pid), static_cast<int32_t>(e.tid),
                           std::string(e.arg_name)});
    }
    return;
  }
  if (e.ph == "s" || e.ph == "f" || e.ph == "t") {
    t.stats.Add("kineto_flow_events", "info", kFlowEventsDescription);
    return;
  }
  if (e.ph != "X") {
    t.stats.Add("kineto_other_phase_events", "info",
                "instant, counter and other non-duration events, not imported");
    return;
  }
  if (!e.has_ts || !e.has_dur) {
    t.stats.Add("kineto_missing_time", "data_loss",
                "duration events without a valid ts or dur, skipped");
    return;
  }

  const Category category = ClassifyCategory(e.cat);
  const TimeNs start = e.ts;
  const TimeNs end = e.ts + e.dur;  // both within +-kMaxAbsTimeNs: no overflow
  switch (category) {
    case Category::kKernel:
    case Category::kMemcpy:
    case Category::kMemset: {
      GpuActivity g;
      g.start = start;
      g.end = end;
      const int64_t device = e.device >= 0 ? e.device : e.pid;
      g.device_index = t.DeviceIndex(0, static_cast<int32_t>(device));
      g.stream = static_cast<int32_t>(e.stream >= 0 ? e.stream : e.tid);
      g.name = t.strings.Intern(e.name);
      g.correlation = e.correlation;
      g.external_id = e.external_id;
      if (category == Category::kKernel) {
        g.kind = GpuKind::kKernel;
        for (int i = 0; i < 3; ++i) {
          g.grid[i] = static_cast<int32_t>(e.grid[i]);
          g.block[i] = static_cast<int32_t>(e.block[i]);
        }
        g.registers = static_cast<int32_t>(e.registers);
        g.shared_memory = static_cast<int32_t>(e.shared_memory);
        g.collective = t.strings.Intern(e.collective);
      } else {
        g.kind = category == Category::kMemcpy ? GpuKind::kMemcpy : GpuKind::kMemset;
        g.bytes = e.bytes;
        if (category == Category::kMemcpy) {
          g.copy_kind =
              t.strings.Intern(e.copy_kind.empty() ? CopyKindFromName(e.name) : e.copy_kind);
        }
      }
      t.gpu.push_back(g);
      return;
    }
    case Category::kRuntime:
    case Category::kDriver:
    case Category::kSync: {
      ApiCall a;
      a.start = start;
      a.end = end;
      a.pid = static_cast<int32_t>(e.pid);
      a.tid = static_cast<int32_t>(e.tid);
      a.name = t.strings.Intern(e.name);
      a.correlation = e.correlation;
      a.external_id = e.external_id;
      a.kind = category == Category::kRuntime  ? ApiKind::kRuntime
               : category == Category::kDriver ? ApiKind::kDriver
                                               : ApiKind::kSync;
      if (a.kind == ApiKind::kSync) {
        a.sync_device = static_cast<int32_t>(e.device);
        a.sync_stream = static_cast<int32_t>(e.stream);
        a.wait_on_stream = static_cast<int32_t>(e.wait_on_stream);
        a.wait_event_id = e.wait_event_id;
        a.wait_event_correlation = e.wait_event_correlation;
      }
      t.api.push_back(a);
      return;
    }
    case Category::kOperator: {
      Operator o;
      o.start = start;
      o.end = end;
      o.pid = static_cast<int32_t>(e.pid);
      o.tid = static_cast<int32_t>(e.tid);
      o.name = t.strings.Intern(e.name);
      o.external_id = e.external_id;
      o.sequence = e.sequence;
      o.input_shapes = t.strings.Intern(CompactJson(e.input_dims, &impl_->compact));
      o.input_types = t.strings.Intern(CompactJson(e.input_types, &impl_->compact));
      o.concrete_inputs = t.strings.Intern(CompactJson(e.concrete_inputs, &impl_->compact));
      o.input_strides = t.strings.Intern(CompactJson(e.input_strides, &impl_->compact));
      o.collective = t.strings.Intern(e.collective);
      o.module_path = t.strings.Intern(e.module_path);
      o.in_graph_capture = e.graph_capture;
      if (e.backward_thread || e.name.rfind("autograd::engine::evaluate_function", 0) == 0) {
        o.pass = Pass::kBackward;
      } else if (e.sequence >= 0) {
        o.pass = Pass::kForward;
      }
      t.ops.push_back(o);
      return;
    }
    case Category::kUserAnnotation:
    case Category::kGpuUserAnnotation: {
      Range r;
      r.start = start;
      r.end = end;
      r.pid = static_cast<int32_t>(e.pid);
      r.tid = static_cast<int32_t>(e.tid);
      r.name = t.strings.Intern(e.name);
      if (category == Category::kGpuUserAnnotation) {
        r.domain = RangeDomain::kGpuUser;
        const int64_t device = e.device >= 0 ? e.device : e.pid;
        r.device_index = static_cast<int32_t>(t.DeviceIndex(0, static_cast<int32_t>(device)));
      }
      t.ranges.push_back(r);
      return;
    }
    case Category::kPythonFunction:
      t.stats.Add("kineto_python_function_events", "info",
                  "Python stack events (with_stack), not imported");
      return;
    case Category::kOther:
      t.stats.Add("kineto_other_category_events", "info",
                  "duration events of categories dynaflow does not use (Trace, overhead...)");
      return;
  }
}

namespace {

// The deviceProperties entry of device `device` as the trace's events name it.
// CUDA traces list properties by the same index. ROCm traces list them by the
// process's visible index (0..n-1) while events name the physical index (2,
// 9...), so an index without an entry takes the entry all entries agree with
// (a node of one GPU model, the common case), else none.
const DeviceProps* PropsFor(const std::unordered_map<int64_t, DeviceProps>& props, int32_t device) {
  auto it = props.find(device);
  if (it != props.end()) return &it->second;
  const DeviceProps* common = nullptr;
  for (const auto& [id, p] : props) {
    if (common != nullptr && (common->name != p.name || common->sm_count != p.sm_count)) return nullptr;
    common = &p;
  }
  return common;
}

}  // namespace

void KinetoParser::Finish() {
  for (DeviceInfo& d : part_->devices) {
    const DeviceProps* found = PropsFor(impl_->props, d.device);
    if (found == nullptr) continue;
    const DeviceProps& p = *found;
    d.name = p.name;
    d.sm_count = p.sm_count;
    d.cc_major = p.cc_major;
    d.cc_minor = p.cc_minor;
    d.memory_bytes = p.memory_bytes;
    d.properties_json = p.json;
  }
  if (base_time_ns_ != 0) {
    const int64_t removed = ShiftTimes(part_, base_time_ns_);
    if (removed > 0) {
      part_->stats.Add("kineto_time_beyond_range", "data_loss",
                       "events whose time plus baseTimeNanoseconds is beyond +-3e18 ns, skipped",
                       removed);
    }
  }
  part_->metadata["format"] = "kineto";
}

Status ParseKinetoJson(std::string_view json, int32_t default_rank, Trace* trace) {
  Trace part;
  KinetoParser parser(&part);
  ChromeJsonTokenizer tokenizer(&parser);
  std::string padded(json);
  padded.append(kChunkPadding, ' ');
  DF_RETURN_IF_ERROR(tokenizer.Feed(std::string_view(padded.data(), json.size())));
  DF_RETURN_IF_ERROR(tokenizer.Finish());
  parser.Finish();
  trace->Append(std::move(part), parser.rank() >= 0 ? parser.rank() : default_rank);
  return Status::Ok();
}

}  // namespace dynaflow
