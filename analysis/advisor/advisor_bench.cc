// Where advise's time goes on a trace: import, the timeline (what advise did
// before the advisor), and each advisor phase, timed in-process with the
// CPU time of this thread (the host's load does not inflate it) and wall time.
//
//   build-advise/analysis/advisor/advisor_bench TRACE... [--reps N]
//
// Prints one line per phase: median wall and CPU seconds over the repetitions,
// and the advisor's total against import + timeline.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "analysis/advisor/advisor.h"
#include "analysis/importers/reader.h"
#include "analysis/timeline/timeline.h"

namespace {

double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Phase {
  std::string name;
  std::vector<double> wall, cpu;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dynaflow;
  std::vector<std::string> inputs;
  int reps = 3;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else {
      inputs.emplace_back(argv[i]);
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "usage: advisor_bench TRACE... [--reps N]\n");
    return 2;
  }
  std::vector<Phase> phases;
  auto timed = [&phases](const char* name, const std::function<void()>& f) {
    auto it = std::find_if(phases.begin(), phases.end(), [&](const Phase& p) { return p.name == name; });
    if (it == phases.end()) {
      phases.push_back({name, {}, {}});
      it = phases.end() - 1;
    }
    const auto w0 = std::chrono::steady_clock::now();
    const double c0 = CpuSeconds();
    f();
    it->cpu.push_back(CpuSeconds() - c0);
    it->wall.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count());
  };
  size_t gpu = 0, ops = 0;
  for (int r = 0; r < reps; ++r) {
    Trace trace;
    Status st;
    timed("import (reference)", [&] { st = ImportFiles(inputs, ImportOptions{}, &trace); });
    if (!st.ok()) {
      std::fprintf(stderr, "advisor_bench: %s\n", st.message().c_str());
      return st.exit_code();
    }
    gpu = trace.gpu.size();
    ops = trace.ops.size();
    timed("timeline (reference)", [&] { (void)AnalyzeTimelines(trace, TimelineOptions{}); });
    OperatorLinks links;
    std::vector<DeviceResources> res;
    std::vector<DeviceSteps> steps;
    timed("links", [&] { links = LinkOperators(trace); });
    timed("classify", [&] { res = ClassifyResources(trace, links, BoundOptions{}); });
    timed("steps", [&] {
      steps.clear();
      for (const DeviceResources& d : res) steps.push_back(FindSteps(trace, d));
    });
    timed("windows", [&] {
      for (size_t d = 0; d < res.size(); ++d) (void)FindIdleWindows(trace, links, res[d], steps[d], WindowOptions{});
    });
    timed("step graph", [&] {
      CostCache costs(trace);
      for (size_t d = 0; d < res.size(); ++d) {
        (void)BuildStepGraph(trace, links, res[d], steps[d], steps[d].representative, &costs, GraphOptions{});
      }
    });
    timed("Advise (all phases + simulation)", [&] { (void)Advise(trace, inputs, AdviseOptions{}); });
  }
  std::printf("%zu GPU activities, %zu operators, %d repetition(s)\n", gpu, ops, reps);
  std::printf("%-36s %10s %10s\n", "phase", "wall s", "cpu s");
  for (const Phase& p : phases) std::printf("%-36s %10.3f %10.3f\n", p.name.c_str(), Median(p.wall), Median(p.cpu));
  const double base = Median(phases[0].cpu) + Median(phases[1].cpu);
  const double advise = Median(phases.back().cpu);
  std::printf("advisor cpu / (import + timeline) cpu: %.3f\n", base > 0 ? advise / base : 0);
  return 0;
}
