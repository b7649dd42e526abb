#include "reports/report.h"

#include <cmath>

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

const DeviceAdvice* AdviceFor(const AdviseReport& report, uint32_t device_index) {
  if (report.advice == nullptr) return nullptr;
  for (const DeviceAdvice& a : report.advice->devices) {
    if (a.device_index == device_index) return &a;
  }
  return nullptr;
}

nlohmann::json NamedTimes(const std::vector<std::pair<std::string, double>>& v) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [name, us] : v) out.push_back({{"name", name}, {"us_per_step", us}});
  return out;
}

nlohmann::json IdleWindowsJson(const DeviceAdvice* a, TimeNs step_start) {
  nlohmann::json out = nlohmann::json::array();
  if (a == nullptr) return out;
  for (const IdleWindow& w : a->windows.windows) {
    nlohmann::json examples = nlohmann::json::array();
    for (const KindInterval& k : w.examples) {
      examples.push_back({{"start_us", static_cast<double>(k.start - step_start) / 1000.0},
                          {"end_us", static_cast<double>(k.end - step_start) / 1000.0}});
    }
    out.push_back({{"kind", WindowKindName(w.kind)},
                   {"saturated", WindowSaturated(w.kind)},
                   {"idle", WindowIdle(w.kind)},
                   {"label", w.label},
                   {"cause", w.cause != IdleCause::kNone ? nlohmann::json(IdleCauseName(w.cause)) : nullptr},
                   {"occurrences", w.occurrences},
                   {"total_us", w.total_us},
                   {"per_step_us", w.per_step_us},
                   {"share_of_step_pct", w.share_of_step_pct},
                   {"recoverable_us", w.recoverable_us},
                   {"recoverable_source", w.recoverable_simulated ? "simulated" : "upper_bound"},
                   {"operators", NamedTimes(w.operators)},
                   {"modules", NamedTimes(w.modules)},
                   {"examples_in_representative_step", examples}});
  }
  return out;
}

nlohmann::json StepsJson(const DeviceAdvice& a) {
  nlohmann::json per_step = nlohmann::json::array();
  for (const Step& s : a.steps) {
    per_step.push_back({{"number", s.number},
                        {"duration_us", s.duration_us()},
                        {"phase", PhaseName(s.phase)},
                        {"tokens", s.tokens > 0 ? nlohmann::json(s.tokens) : nullptr},
                        {"tokens_source", TokenSourceName(s.tokens_source)}});
  }
  return {{"source", StepSourceName(a.step_source)},
          {"count", a.steps.size()},
          {"representative", a.steps.empty() ? 0 : a.steps[a.representative].number},
          {"mean_us", a.step_mean_us},
          {"median_us", a.step_median_us},
          {"min_us", a.step_min_us},
          {"max_us", a.step_max_us},
          {"stdev_us", a.step_stdev_us},
          {"cv_pct", a.step_cv_pct},
          {"layers", a.step_layers},
          {"steps", per_step}};
}

nlohmann::json RooflineJson(const DeviceAdvice& a) {
  nlohmann::json classes = nlohmann::json::object();
  for (int c = 0; c < kResourceCount; ++c) {
    const ResourceTotals& t = a.totals[c];
    classes[ResourceName(static_cast<Resource>(c))] = {
        {"count", t.count},         {"time_us", t.time_us},
        {"costed_time_us", t.costed_time_us},
        {"flops", t.flops},         {"bytes", t.bytes},
        {"achieved_tflops", t.achieved_tflops}, {"achieved_gbps", t.achieved_gbps},
        {"pct_of_peak", t.pct_of_peak}};
  }
  nlohmann::json ops = nlohmann::json::array();
  for (const OperatorRoofline& o : a.operators) {
    ops.push_back({{"name", o.name},
                   {"named_by", o.from_kernel_name ? "kernel" : "operator"},
                   {"kind", OpKindName(o.kind)},
                   {"bound", ResourceName(o.resource)},
                   {"kernels", o.kernels},
                   {"gpu_us", o.gpu_us},
                   {"flops", o.flops},
                   {"bytes", o.bytes},
                   {"intensity", o.intensity},
                   {"achieved_tflops", o.achieved_tflops},
                   {"achieved_gbps", o.achieved_gbps},
                   {"pct_of_peak", o.pct_of_peak}});
  }
  const PeakRates& p = a.peaks;
  return {{"peaks",
           {{"name", p.name},
            {"known", p.known},
            {"sm_count", p.sm_count},
            {"tflops_bf16", p.flops_half / 1e12},
            {"tflops_fp8", p.flops_fp8 / 1e12},
            {"tflops_tf32", p.flops_tf32 / 1e12},  // 0: no TF32, FP32 math at tflops_fp32
            {"tflops_fp32", p.flops_fp32 / 1e12},
            {"hbm_gbps", p.bytes_per_s / 1e9},
            {"ridge_flop_per_byte", p.Ridge()}}},
          {"linked_kernels", a.linked_kernels},
          {"costed_kernels", a.costed_kernels},
          {"classes", classes},
          {"operators", ops}};
}

nlohmann::json RecommendationsJson(const AdviseReport& report) {
  nlohmann::json out = nlohmann::json::array();
  if (report.advice == nullptr) return out;
  for (const Recommendation& r : report.advice->recommendations) {
    const Partition& p = r.partition;
    out.push_back(
        {{"strategy", StrategyName(r.strategy)},
         {"predicted_speedup", r.predicted_speedup},
         {"baseline_step_us", r.baseline_step_us},
         {"predicted_step_us", r.predicted_step_us},
         {"extra_memory_bytes", r.extra_memory_bytes},
         {"bucket",
          {{"min_tokens", r.bucket.min_tokens},
           {"max_tokens", r.bucket.max_tokens ? nlohmann::json(*r.bucket.max_tokens) : nullptr},
           {"tokens", r.bucket.tokens > 0 ? nlohmann::json(r.bucket.tokens) : nullptr}}},
         {"partition",
          {{"split", p.split},
           {"splits", p.splits},
           {"modules", p.modules},
           {"operators",
            {{"compute", p.compute_ops},
             {"memory", p.memory_ops},
             {"communication", p.communication_ops},
             {"copy", p.copy_ops}}},
           {"side_stream", p.side_stream},
           {"fused", p.fused}}},
         {"rationale", r.rationale},
         {"splits", r.splits},
         {"rank", r.rank},
         {"device", r.device}});
  }
  return out;
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
    const DeviceAdvice* advice = AdviceFor(report, d.device_index);
    const TimeNs step_start =
        advice != nullptr && !advice->steps.empty() ? advice->steps[advice->representative].start : 0;
    devices.push_back({{"rank", d.rank},
                       {"device", d.device},
                       {"name", d.name},
                       {"events", d.events},
                       {"profiler_steps", d.profiler_steps},
                       {"timeline", TimelineJson(d.timeline)},
                       {"streams", streams},
                       {"kernel_classes", classes},
                       {"top_kernels", kernels},
                       {"idle_windows", IdleWindowsJson(advice, step_start)}});
    if (advice != nullptr) {
      devices.back()["steps"] = StepsJson(*advice);
      devices.back()["roofline"] = RooflineJson(*advice);
    }
  }
  nlohmann::json stats = nlohmann::json::array();
  if (report.trace != nullptr) {
    for (const ImportStat& s : report.trace->stats.all()) {
      stats.push_back({{"name", s.name}, {"severity", s.severity}, {"count", s.count}});
    }
  }
  nlohmann::json out = {{"schema", "dynaflow.report/1"},
                        {"inputs", report.inputs},
                        {"devices", devices},
                        {"import_stats", stats},
                        {"recommendations", RecommendationsJson(report)}};
  if (report.advice != nullptr && report.advice->has_graph) {
    const AdviceResult& a = *report.advice;
    out["simulation"] = {{"rank", a.plan.rank},
                         {"device", a.plan.device},
                         {"tokens_per_step", a.plan.tokens_per_step > 0 ? nlohmann::json(a.plan.tokens_per_step) : nullptr},
                         {"tokens_source", TokenSourceName(a.tokens_source)},
                         {"phase", PhaseName(a.phase)},
                         {"kernels_per_step", a.plan.kernels_per_step},
                         {"replay_error_pct", a.replay_unfinished.empty() ? nlohmann::json(a.replay_error_pct) : nullptr},
                         {"replay_error_without_gaps_pct",
                          a.replay_unfinished.empty() && std::isfinite(a.replay_error_without_gaps_pct)
                              ? nlohmann::json(a.replay_error_without_gaps_pct) : nullptr},
                         {"replay_unfinished", a.replay_unfinished.empty() ? nlohmann::json(nullptr) : nlohmann::json(a.replay_unfinished)},
                         {"plan_strategy", StrategyName(a.plan.strategy)}};
  }
  return out;
}

}  // namespace dynaflow
