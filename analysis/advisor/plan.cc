#include "analysis/advisor/plan.h"

#include <cmath>
#include <cstdint>
#include <set>

namespace dynaflow {
namespace {

using nlohmann::json;

const std::vector<std::string> kRoles = {"split", "stage",       "compute", "memory",
                                         "communication", "copy", "side_stream", "fused"};
const std::vector<std::string> kStreamRoles = {"compute", "memory", "communication"};
// model.phase and buckets[].phase: the step phases of analysis/steps/steps.h,
// less "unknown" (absent).
const std::vector<std::string> kPhases = {"prefill", "decode", "mixed", "training"};

json Strings(const std::vector<std::string>& v) { return json(v); }

// A value of the plan quoted in a message: at most kQuoted bytes, then an
// ellipsis and its length (a 100 MB module name is not echoed whole).
constexpr size_t kQuoted = 200;
std::string Quote(const std::string& s) {
  if (s.size() <= kQuoted) return "\"" + s + "\"";
  size_t n = kQuoted;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;  // whole UTF-8 characters
  return "\"" + s.substr(0, n) + "...\" (" + std::to_string(s.size()) + " bytes)";
}

// Unicode code points of UTF-8 text: what JSON Schema's maxLength counts.
size_t CodePoints(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// Small checking helpers: each returns an error naming `where`, the key path
// ("" for the top level).
Status Expect(bool ok, const std::string& where, const std::string& what) {
  if (ok) return Status::Ok();
  return Status::BadInput("plan: " + (where.empty() ? what : where + ": " + what));
}

Status Object(const json& j, const std::string& where, const std::vector<std::string>& required,
              const std::vector<std::string>& optional) {
  DF_RETURN_IF_ERROR(Expect(j.is_object(), where, "must be an object"));
  for (const std::string& k : required) {
    DF_RETURN_IF_ERROR(Expect(j.contains(k), where, "missing required key \"" + k + "\""));
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool known = false;
    for (const std::string& k : required) known = known || it.key() == k;
    for (const std::string& k : optional) known = known || it.key() == k;
    DF_RETURN_IF_ERROR(Expect(known, where, "unexpected key " + Quote(it.key())));
  }
  return Status::Ok();
}

Status Number(const json& j, const std::string& where, double minimum) {
  DF_RETURN_IF_ERROR(Expect(j.is_number(), where, "must be a number"));
  return Expect(j.get<double>() >= minimum, where, "must be >= " + json(minimum).dump());
}

Status Number(const json& j, const std::string& where, double minimum, double maximum) {
  DF_RETURN_IF_ERROR(Number(j, where, minimum));
  return Expect(j.get<double>() <= maximum, where, "must be <= " + json(maximum).dump());
}

// An integer in [minimum, maximum]. As JSON Schema, a number with a zero
// fraction (2.0) is an integer.
Status Integer(const json& j, const std::string& where, int64_t minimum, int64_t maximum) {
  bool in_range = false;
  if (j.is_number_unsigned()) {
    const uint64_t u = j.get<uint64_t>();
    in_range = minimum <= 0 || u >= static_cast<uint64_t>(minimum);
    in_range = in_range && maximum >= 0 && u <= static_cast<uint64_t>(maximum);
  } else if (j.is_number_integer()) {
    const int64_t i = j.get<int64_t>();
    in_range = i >= minimum && i <= maximum;
  } else {
    const bool integral = j.is_number_float() && std::isfinite(j.get<double>()) &&
                          std::floor(j.get<double>()) == j.get<double>();
    DF_RETURN_IF_ERROR(Expect(integral, where, "must be an integer"));
    const double d = j.get<double>();
    in_range = d >= static_cast<double>(minimum) && d <= static_cast<double>(maximum);
  }
  return Expect(in_range, where,
                "must be an integer in [" + std::to_string(minimum) + ", " + std::to_string(maximum) + "]");
}

Status String(const json& j, const std::string& where) {
  DF_RETURN_IF_ERROR(Expect(j.is_string(), where, "must be a string"));
  const std::string& s = j.get_ref<const std::string&>();
  return Expect(CodePoints(s) <= PlanLimits::kMaxString, where,
                "is longer than " + std::to_string(PlanLimits::kMaxString) + " characters (" +
                    std::to_string(CodePoints(s)) + ")");
}

// An array of at most `max_items` items.
Status Array(const json& j, const std::string& where, size_t max_items) {
  DF_RETURN_IF_ERROR(Expect(j.is_array(), where, "must be an array"));
  return Expect(j.size() <= max_items, where,
                "has " + std::to_string(j.size()) + " items; at most " + std::to_string(max_items));
}

Status StringArray(const json& j, const std::string& where) {
  DF_RETURN_IF_ERROR(Array(j, where, PlanLimits::kMaxItems));
  for (size_t i = 0; i < j.size(); ++i) {
    DF_RETURN_IF_ERROR(String(j[i], where + "[" + std::to_string(i) + "]"));
  }
  return Status::Ok();
}

Status Enum(const json& j, const std::string& where, const std::vector<std::string>& values) {
  DF_RETURN_IF_ERROR(Expect(j.is_string(), where, "must be a string"));
  for (const std::string& v : values) {
    if (j.get<std::string>() == v) return Status::Ok();
  }
  return Status::BadInput("plan: " + where + ": " + Quote(j.get<std::string>()) + " is not allowed");
}

std::vector<std::string> StrategyNames() {
  std::vector<std::string> v;
  for (int i = 0; i < kStrategyCount; ++i) v.emplace_back(StrategyName(static_cast<Strategy>(i)));
  return v;
}

Status ValidateStreams(const json& j, const std::string& where) {
  DF_RETURN_IF_ERROR(Array(j, where, PlanLimits::kMaxStreams));
  DF_RETURN_IF_ERROR(Expect(!j.empty(), where, "must be a non-empty array"));
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string w = where + "[" + std::to_string(i) + "]";
    DF_RETURN_IF_ERROR(Object(j[i], w, {"id", "role"}, {}));
    DF_RETURN_IF_ERROR(Integer(j[i]["id"], w + ".id", 0, PlanLimits::kMaxStreams - 1));
    DF_RETURN_IF_ERROR(Enum(j[i]["role"], w + ".role", kStreamRoles));
  }
  return Status::Ok();
}

}  // namespace

const std::vector<std::string>& PlanRequiredKeys() {
  static const std::vector<std::string> k = {"schema",   "generator", "source",          "device",
                                             "model",    "forced",    "strategy",        "splits",
                                             "partition_rules",       "buckets",         "predicted"};
  return k;
}

const std::vector<std::string>& PlanBucketRequiredKeys() {
  static const std::vector<std::string> k = {
      "min_tokens",        "max_tokens",       "strategy",          "splits",
      "rules",             "streams",          "predicted_speedup", "baseline_step_us",
      "predicted_step_us", "extra_memory_bytes"};
  return k;
}

std::vector<PlanStream> StreamsFor(Strategy s) {
  switch (s) {
    case Strategy::kSequential:
    case Strategy::kFusion: return {{0, "compute"}};
    case Strategy::kCommOverlap:
    case Strategy::kDualBatchOverlap: return {{0, "compute"}, {1, "communication"}};
    case Strategy::kNanobatchOverlap: return {{0, "compute"}, {1, "memory"}, {2, "communication"}};
  }
  return {{0, "compute"}};
}

bool SplitsModules(const Plan& plan) {
  for (const PlanBucket& b : plan.buckets) {
    if (b.strategy != Strategy::kNanobatchOverlap && b.strategy != Strategy::kDualBatchOverlap) continue;
    for (const std::string& name : b.rules) {
      for (const PlanRule& r : plan.partition_rules) {
        if (r.name == name && r.role == "split" && !r.modules.empty()) return true;
      }
    }
  }
  return false;
}

bool OverlapsModules(const Plan& plan) {
  for (const PlanBucket& b : plan.buckets) {
    if (b.strategy != Strategy::kCommOverlap) continue;
    for (const std::string& name : b.rules) {
      for (const PlanRule& r : plan.partition_rules) {
        if (r.name == name && r.role == "side_stream" && !r.modules.empty()) return true;
      }
    }
  }
  return false;
}

json PlanToJson(const Plan& p) {
  json rules = json::array();
  for (const PlanRule& r : p.partition_rules) {
    rules.push_back({{"name", r.name},
                     {"role", r.role},
                     {"operators", Strings(r.operators)},
                     {"modules", Strings(r.modules)}});
  }
  json buckets = json::array();
  for (const PlanBucket& b : p.buckets) {
    json streams = json::array();
    for (const PlanStream& s : b.streams) streams.push_back({{"id", s.id}, {"role", s.role}});
    buckets.push_back({{"min_tokens", b.min_tokens},
                       {"max_tokens", b.max_tokens ? json(*b.max_tokens) : json(nullptr)},
                       {"strategy", StrategyName(b.strategy)},
                       {"splits", b.splits},
                       {"rules", Strings(b.rules)},
                       {"streams", streams},
                       {"predicted_speedup", b.predicted_speedup},
                       {"baseline_step_us", b.baseline_step_us},
                       {"predicted_step_us", b.predicted_step_us},
                       {"extra_memory_bytes", b.extra_memory_bytes}});
    if (b.segments > 0) buckets.back()["segments"] = b.segments;
    if (!b.phase.empty()) buckets.back()["phase"] = b.phase;
  }
  json out = {{"schema", p.schema},
              {"generator", p.generator},
              {"source", {{"traces", Strings(p.traces)}, {"fingerprint", p.trace_fingerprint}}},
              {"device",
               {{"name", p.device_name},
                {"rank", p.rank},
                {"device", p.device},
                {"sm_count", p.sm_count},
                {"memory_bandwidth_gbps", p.memory_bandwidth_gbps},
                {"peak_tflops_bf16", p.peak_tflops_bf16},
                {"peaks_known", p.peaks_known}}},
              {"model",
               {{"fingerprint", p.model_fingerprint},
                {"tokens_per_step", p.tokens_per_step > 0 ? json(p.tokens_per_step) : json(nullptr)},
                {"kernels_per_step", p.kernels_per_step}}},
              {"forced", p.forced},
              {"strategy", StrategyName(p.strategy)},
              {"splits", p.splits},
              {"partition_rules", rules},
              {"buckets", buckets},
              {"predicted",
               {{"baseline_step_us", p.baseline_step_us},
                {"predicted_step_us", p.predicted_step_us},
                {"speedup", p.predicted_speedup},
                {"extra_memory_bytes", p.extra_memory_bytes}}}};
  if (!p.module_fingerprint.empty()) out["model"]["module_fingerprint"] = p.module_fingerprint;
  if (!p.phase.empty()) out["model"]["phase"] = p.phase;
  return out;
}

Status ValidatePlanJson(const json& j) {
  DF_RETURN_IF_ERROR(Object(j, "", PlanRequiredKeys(), {}));
  DF_RETURN_IF_ERROR(Expect(j["schema"] == kPlanSchema, "schema", "must be \"" + std::string(kPlanSchema) + "\""));
  DF_RETURN_IF_ERROR(String(j["generator"], "generator"));
  const json& src = j["source"];
  DF_RETURN_IF_ERROR(Object(src, "source", {"traces", "fingerprint"}, {}));
  DF_RETURN_IF_ERROR(StringArray(src["traces"], "source.traces"));
  DF_RETURN_IF_ERROR(String(src["fingerprint"], "source.fingerprint"));
  const json& dev = j["device"];
  DF_RETURN_IF_ERROR(Object(dev, "device",
                            {"name", "rank", "device", "sm_count", "memory_bandwidth_gbps",
                             "peak_tflops_bf16", "peaks_known"},
                            {}));
  DF_RETURN_IF_ERROR(String(dev["name"], "device.name"));
  DF_RETURN_IF_ERROR(Integer(dev["rank"], "device.rank", 0, PlanLimits::kMaxInt));
  DF_RETURN_IF_ERROR(Integer(dev["device"], "device.device", 0, PlanLimits::kMaxInt));
  DF_RETURN_IF_ERROR(Integer(dev["sm_count"], "device.sm_count", 0, PlanLimits::kMaxInt));
  DF_RETURN_IF_ERROR(Number(dev["memory_bandwidth_gbps"], "device.memory_bandwidth_gbps", 0));
  DF_RETURN_IF_ERROR(Number(dev["peak_tflops_bf16"], "device.peak_tflops_bf16", 0));
  DF_RETURN_IF_ERROR(Expect(dev["peaks_known"].is_boolean(), "device.peaks_known", "must be a boolean"));
  const json& model = j["model"];
  DF_RETURN_IF_ERROR(Object(model, "model", {"fingerprint", "tokens_per_step", "kernels_per_step"},
                            {"module_fingerprint", "phase"}));
  DF_RETURN_IF_ERROR(String(model["fingerprint"], "model.fingerprint"));
  if (model.contains("module_fingerprint")) {
    DF_RETURN_IF_ERROR(String(model["module_fingerprint"], "model.module_fingerprint"));
  }
  if (model.contains("phase")) DF_RETURN_IF_ERROR(Enum(model["phase"], "model.phase", kPhases));
  if (!model["tokens_per_step"].is_null()) {
    DF_RETURN_IF_ERROR(Number(model["tokens_per_step"], "model.tokens_per_step", 0, PlanLimits::kMaxCount));
  }
  DF_RETURN_IF_ERROR(Integer(model["kernels_per_step"], "model.kernels_per_step", 0, PlanLimits::kMaxCount));
  DF_RETURN_IF_ERROR(Expect(j["forced"].is_boolean(), "forced", "must be a boolean"));
  DF_RETURN_IF_ERROR(Enum(j["strategy"], "strategy", StrategyNames()));
  DF_RETURN_IF_ERROR(Integer(j["splits"], "splits", 1, PlanLimits::kMaxSplits));

  std::set<std::string> rule_names;
  const json& rules = j["partition_rules"];
  DF_RETURN_IF_ERROR(Array(rules, "partition_rules", PlanLimits::kMaxRules));
  for (size_t i = 0; i < rules.size(); ++i) {
    const std::string w = "partition_rules[" + std::to_string(i) + "]";
    DF_RETURN_IF_ERROR(Object(rules[i], w, {"name", "role", "operators", "modules"}, {}));
    DF_RETURN_IF_ERROR(String(rules[i]["name"], w + ".name"));
    DF_RETURN_IF_ERROR(Enum(rules[i]["role"], w + ".role", kRoles));
    DF_RETURN_IF_ERROR(StringArray(rules[i]["operators"], w + ".operators"));
    DF_RETURN_IF_ERROR(StringArray(rules[i]["modules"], w + ".modules"));
    rule_names.insert(rules[i]["name"].get<std::string>());
  }

  const json& buckets = j["buckets"];
  DF_RETURN_IF_ERROR(Array(buckets, "buckets", PlanLimits::kMaxBuckets));
  DF_RETURN_IF_ERROR(Expect(!buckets.empty(), "buckets", "must be a non-empty array"));
  std::set<std::string> phases_seen;
  for (size_t i = 0; i < buckets.size(); ++i) {
    const json& b = buckets[i];
    const std::string w = "buckets[" + std::to_string(i) + "]";
    DF_RETURN_IF_ERROR(Object(b, w, PlanBucketRequiredKeys(), {"segments", "phase"}));
    DF_RETURN_IF_ERROR(Number(b["min_tokens"], w + ".min_tokens", 0, PlanLimits::kMaxCount));
    if (!b["max_tokens"].is_null()) {
      DF_RETURN_IF_ERROR(Number(b["max_tokens"], w + ".max_tokens", 0, PlanLimits::kMaxCount));
      DF_RETURN_IF_ERROR(Expect(b["max_tokens"].get<double>() > b["min_tokens"].get<double>(), w + ".max_tokens",
                                "must exceed min_tokens"));
    }
    DF_RETURN_IF_ERROR(Enum(b["strategy"], w + ".strategy", StrategyNames()));
    DF_RETURN_IF_ERROR(Integer(b["splits"], w + ".splits", 1, PlanLimits::kMaxSplits));
    if (b.contains("segments")) {
      DF_RETURN_IF_ERROR(Integer(b["segments"], w + ".segments", 1, PlanLimits::kMaxSegments));
    }
    DF_RETURN_IF_ERROR(StringArray(b["rules"], w + ".rules"));
    for (const json& r : b["rules"]) {
      DF_RETURN_IF_ERROR(Expect(rule_names.count(r.get<std::string>()) > 0, w + ".rules",
                                "names no partition rule " + Quote(r.get<std::string>())));
    }
    DF_RETURN_IF_ERROR(ValidateStreams(b["streams"], w + ".streams"));
    DF_RETURN_IF_ERROR(Number(b["predicted_speedup"], w + ".predicted_speedup", 0));
    DF_RETURN_IF_ERROR(Number(b["baseline_step_us"], w + ".baseline_step_us", 0));
    DF_RETURN_IF_ERROR(Number(b["predicted_step_us"], w + ".predicted_step_us", 0));
    DF_RETURN_IF_ERROR(Number(b["extra_memory_bytes"], w + ".extra_memory_bytes", 0));
    if (b.contains("phase")) DF_RETURN_IF_ERROR(Enum(b["phase"], w + ".phase", kPhases));
  }
  // The buckets of each phase (absent: of every call no other group is for)
  // are consecutive and tile [0, inf) in order (beyond what JSON Schema can
  // say). After every bucket is known to be well formed.
  for (size_t i = 0; i < buckets.size(); ++i) {
    const json& b = buckets[i];
    const std::string w = "buckets[" + std::to_string(i) + "]";
    const std::string phase = b.value("phase", "");
    const bool group_starts = i == 0 || buckets[i - 1].value("phase", "") != phase;
    const bool group_ends = i + 1 == buckets.size() || buckets[i + 1].value("phase", "") != phase;
    const std::string group = phase.empty() ? "bucket" : phase + " bucket";
    const double lo = b["min_tokens"].get<double>();
    if (group_starts) {
      DF_RETURN_IF_ERROR(Expect(phases_seen.insert(phase).second, w + ".phase",
                                "the " + group + "s must be consecutive"));
      DF_RETURN_IF_ERROR(Expect(lo == 0, w + ".min_tokens", "the first " + group + " must start at 0"));
    } else {
      const json& prev_hi = buckets[i - 1]["max_tokens"];
      DF_RETURN_IF_ERROR(Expect(prev_hi.is_number() && prev_hi.get<double>() == lo, w + ".min_tokens",
                                "must equal the previous bucket's max_tokens"));
    }
    if (group_ends) {
      DF_RETURN_IF_ERROR(Expect(b["max_tokens"].is_null(), w + ".max_tokens",
                                "the last " + group + " must be open (null)"));
    }
  }
  const json& pred = j["predicted"];
  DF_RETURN_IF_ERROR(Object(pred, "predicted",
                            {"baseline_step_us", "predicted_step_us", "speedup", "extra_memory_bytes"}, {}));
  DF_RETURN_IF_ERROR(Number(pred["baseline_step_us"], "predicted.baseline_step_us", 0));
  DF_RETURN_IF_ERROR(Number(pred["predicted_step_us"], "predicted.predicted_step_us", 0));
  DF_RETURN_IF_ERROR(Number(pred["speedup"], "predicted.speedup", 0));
  DF_RETURN_IF_ERROR(Number(pred["extra_memory_bytes"], "predicted.extra_memory_bytes", 0));
  return Status::Ok();
}

StatusOr<Plan> PlanFromJson(const json& j) {
  Status st = ValidatePlanJson(j);
  if (!st.ok()) return st;
  Plan p;
  p.schema = j["schema"].get<std::string>();
  p.generator = j["generator"].get<std::string>();
  p.traces = j["source"]["traces"].get<std::vector<std::string>>();
  p.trace_fingerprint = j["source"]["fingerprint"].get<std::string>();
  const json& d = j["device"];
  p.device_name = d["name"].get<std::string>();
  p.rank = d["rank"].get<int>();
  p.device = d["device"].get<int>();
  p.sm_count = d["sm_count"].get<int>();
  p.memory_bandwidth_gbps = d["memory_bandwidth_gbps"].get<double>();
  p.peak_tflops_bf16 = d["peak_tflops_bf16"].get<double>();
  p.peaks_known = d["peaks_known"].get<bool>();
  const json& m = j["model"];
  p.model_fingerprint = m["fingerprint"].get<std::string>();
  if (m.contains("module_fingerprint")) p.module_fingerprint = m["module_fingerprint"].get<std::string>();
  if (m.contains("phase")) p.phase = m["phase"].get<std::string>();
  p.tokens_per_step = m["tokens_per_step"].is_null() ? 0 : m["tokens_per_step"].get<double>();
  p.kernels_per_step = m["kernels_per_step"].get<int64_t>();
  p.forced = j["forced"].get<bool>();
  ParseStrategy(j["strategy"].get<std::string>(), &p.strategy);
  p.splits = j["splits"].get<int>();
  for (const json& r : j["partition_rules"]) {
    p.partition_rules.push_back({r["name"].get<std::string>(), r["role"].get<std::string>(),
                                 r["operators"].get<std::vector<std::string>>(),
                                 r["modules"].get<std::vector<std::string>>()});
  }
  for (const json& b : j["buckets"]) {
    PlanBucket pb;
    pb.min_tokens = b["min_tokens"].get<double>();
    if (!b["max_tokens"].is_null()) pb.max_tokens = b["max_tokens"].get<double>();
    ParseStrategy(b["strategy"].get<std::string>(), &pb.strategy);
    pb.splits = b["splits"].get<int>();
    pb.segments = b.value("segments", 0);
    pb.phase = b.value("phase", "");
    pb.rules = b["rules"].get<std::vector<std::string>>();
    for (const json& s : b["streams"]) pb.streams.push_back({s["id"].get<int>(), s["role"].get<std::string>()});
    pb.predicted_speedup = b["predicted_speedup"].get<double>();
    pb.baseline_step_us = b["baseline_step_us"].get<double>();
    pb.predicted_step_us = b["predicted_step_us"].get<double>();
    pb.extra_memory_bytes = b["extra_memory_bytes"].get<double>();
    p.buckets.push_back(std::move(pb));
  }
  const json& pred = j["predicted"];
  p.baseline_step_us = pred["baseline_step_us"].get<double>();
  p.predicted_step_us = pred["predicted_step_us"].get<double>();
  p.predicted_speedup = pred["speedup"].get<double>();
  p.extra_memory_bytes = pred["extra_memory_bytes"].get<double>();
  return p;
}

}  // namespace dynaflow
