// The advise report in its three renderings. Reports read the model and the
// analysis results, never the store.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "analysis/advisor/advisor.h"
#include "analysis/model/trace.h"
#include "analysis/timeline/timeline.h"

namespace dynaflow {

struct AdviseReport {
  std::vector<std::string> inputs;
  const Trace* trace = nullptr;
  std::vector<DeviceTimeline> devices;
  // Idle-resource windows, roofline, steps and recommendations; null renders
  // the timeline alone (empty idle_windows and recommendations).
  const AdviceResult* advice = nullptr;
};

// The contract of DESIGN.md ("Report JSON contract"), schema dynaflow.report/1.
nlohmann::json ReportToJson(const AdviseReport& report);

// A report that reads at a glance in a terminal.
std::string ReportToText(const AdviseReport& report);

// One self-contained HTML page.
std::string ReportToHtml(const AdviseReport& report);

}  // namespace dynaflow
