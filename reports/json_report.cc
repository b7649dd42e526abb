#include "reports/report.h"

namespace dynaflow {
namespace {

const char* ClassName(GpuClass c) {
  switch (c) {
    case GpuClass::kComputation: return "computation";
    case GpuClass::kCommunication: return "communication";
    case GpuClass::kMemcpy: return "memcpy";
  }
  return "computation";
}

nlohmann::json TimelineJson(const TimelineBreakdown& t) {
  nlohmann::json j = {
      {"computation_us", t.computation_us},   {"exposed_comm_us", t.exposed_comm_us},
      {"exposed_memcpy_us", t.exposed_memcpy_us}, {"busy_us", t.busy_us},
      {"idle_us", t.idle_us},                 {"total_us", t.total_us},
      {"total_comm_us", t.total_comm_us},     {"total_memcpy_us", t.total_memcpy_us},
  };
  j["comm_hidden_pct"] = t.comm_hidden_pct ? nlohmann::json(*t.comm_hidden_pct) : nullptr;
  return j;
}

nlohmann::json StreamJson(const StreamStats& s) {
  return {{"stream", s.stream},
          {"kernels", s.kernels},
          {"memcpys", s.memcpys},
          {"memsets", s.memsets},
          {"busy_us", s.busy_us},
          {"span_us", s.span_us},
          {"idle_us", s.idle_us},
          {"idle_breakdown",
           {{"host_wait_us", s.host_wait_us},
            {"kernel_wait_us", s.kernel_wait_us},
            {"other_us", s.other_wait_us}}}};
}

}  // namespace

nlohmann::json ReportToJson(const AdviseReport& report) {
  nlohmann::json devices = nlohmann::json::array();
  for (const DeviceTimeline& d : report.devices) {
    nlohmann::json streams = nlohmann::json::array();
    for (const StreamStats& s : d.streams) streams.push_back(StreamJson(s));
    nlohmann::json classes = nlohmann::json::array();
    for (const ClassStats& c : d.classes) {
      classes.push_back({{"class", c.name}, {"count", c.count}, {"time_us", c.time_us}});
    }
    nlohmann::json kernels = nlohmann::json::array();
    for (const KernelStats& k : d.top_kernels) {
      kernels.push_back({{"name", k.name},
                         {"class", ClassName(k.gpu_class)},
                         {"count", k.count},
                         {"total_us", k.total_us},
                         {"mean_us", k.mean_us},
                         {"min_us", k.min_us},
                         {"max_us", k.max_us},
                         {"share_of_busy_pct", k.share_pct}});
    }
    devices.push_back({{"rank", d.rank},
                       {"device", d.device},
                       {"name", d.name},
                       {"events", d.events},
                       {"profiler_steps", d.profiler_steps},
                       {"timeline", TimelineJson(d.timeline)},
                       {"streams", streams},
                       {"kernel_classes", classes},
                       {"top_kernels", kernels},
                       {"idle_windows", nlohmann::json::array()}});
  }
  nlohmann::json stats = nlohmann::json::array();
  if (report.trace != nullptr) {
    for (const ImportStat& s : report.trace->stats.all()) {
      stats.push_back({{"name", s.name}, {"severity", s.severity}, {"count", s.count}});
    }
  }
  return {{"schema", "dynaflow.report/1"},
          {"inputs", report.inputs},
          {"devices", devices},
          {"import_stats", stats},
          {"recommendations", nlohmann::json::array()}};
}

}  // namespace dynaflow
