#include "plugin/preload/tracer_config.h"

#include <charconv>
#include <cmath>
#include <string_view>

namespace dynaflow {
namespace {

// `text` as a whole number, or nothing.
bool ParseInt(std::string_view text, int64_t* out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  return ec == std::errc() && ptr == end && !text.empty();
}

// `text` as a non-negative, finite number of seconds, or nothing.
bool ParseSeconds(std::string_view text, std::chrono::nanoseconds* out) {
  double seconds = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, seconds);
  if (ec != std::errc() || ptr != end || text.empty() || !std::isfinite(seconds) ||
      seconds < 0 || seconds > 1e9) {
    return false;
  }
  *out = std::chrono::nanoseconds(static_cast<int64_t>(std::llround(seconds * 1e9)));
  return true;
}

class EnvReader {
 public:
  EnvReader(const std::function<const char*(const char*)>& getenv,
            std::vector<std::string>* problems)
      : getenv_(getenv), problems_(problems) {}

  // The variable's value; nullptr when unset or empty.
  const char* Get(const char* name) const {
    const char* value = getenv_(name);
    return value != nullptr && *value != '\0' ? value : nullptr;
  }

  void Problem(const char* name, const char* value, const char* expected) const {
    problems_->push_back(std::string(name) + "=" + value + " is not " + expected +
                         "; using the default");
  }

  void Seconds(const char* name, std::chrono::nanoseconds* out) const {
    const char* value = Get(name);
    if (value != nullptr && !ParseSeconds(value, out)) {
      Problem(name, value, "a number of seconds");
    }
  }

 private:
  const std::function<const char*(const char*)>& getenv_;
  std::vector<std::string>* problems_;
};

}  // namespace

TracerConfig ReadTracerConfig(const std::function<const char*(const char*)>& getenv,
                              std::vector<std::string>* problems) {
  const EnvReader env(getenv, problems);
  TracerConfig c;
  if (const char* dir = env.Get("DYNAFLOW_OUTPUT_DIR")) c.output_dir = dir;
  if (const char* ops = env.Get("DYNAFLOW_OPS")) {
    const std::string_view v(ops);
    if (v == "on" || v == "off") {
      c.record_ops = v == "on";
    } else {
      env.Problem("DYNAFLOW_OPS", ops, "on or off");
    }
  }
  env.Seconds("DYNAFLOW_DELAY_S", &c.delay);
  env.Seconds("DYNAFLOW_DURATION_S", &c.duration);
  if (const char* ms = env.Get("DYNAFLOW_FLUSH_MS")) {
    int64_t value = 0;
    if (ParseInt(ms, &value) && value > 0) {
      c.flush_interval = std::chrono::milliseconds(value);
    } else {
      env.Problem("DYNAFLOW_FLUSH_MS", ms, "a positive number of milliseconds");
    }
  }
  for (const char* name : {"DYNAFLOW_RANK", "RANK"}) {
    const char* rank = env.Get(name);
    if (rank == nullptr) continue;
    int64_t value = 0;
    if (ParseInt(rank, &value) && value >= 0 && value <= INT32_MAX) {
      c.rank = static_cast<int32_t>(value);
    } else {
      env.Problem(name, rank, "a rank (a non-negative integer)");
    }
    break;
  }
  if (const char* path = env.Get("DYNAFLOW_CUPTI_PATH")) c.cupti_path = path;
  return c;
}

}  // namespace dynaflow
