// Dispatch overhead of the runtime on the CPU backend: the time the executor
// spends per task (queueing, events between streams, waking workers, reference
// counts) with tasks that do nothing, so all of it is overhead.
//
//   build-*/runtime/runtime_dispatch_bench [--runs N] [--calls M]
//
// Each configuration is timed over `runs` runs of `calls` calls (Submit, then
// Wait) after a warm-up; a run's figure is its time divided by its calls x
// tasks, and the median, minimum and maximum over runs are printed. The last
// two lines time BucketPolicy::Pick, the per-call cost of choosing a schedule:
// below the first overlapped bucket, and by binary search.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/cpu/cpu_executor.h"
#include "runtime/policy.h"

namespace dynaflow::runtime {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int runs = 9;
  int calls = 2000;
};

struct Summary {
  double median = 0, min = 0, max = 0;
};

Summary Summarize(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return {values[values.size() / 2], values.front(), values.back()};
}

Status Noop(TaskContext&) { return Status::Ok(); }

// `layers` stages alternating between streams 0 and 1 (when two streams),
// each run on `micro_batches` micro-batches: every stage after the first waits
// for the previous one on the other stream.
Schedule LayerSchedule(int layers, int streams, int micro_batches) {
  std::vector<Stage> stages;
  for (int k = 0; k < layers; ++k) {
    stages.push_back({"layer" + std::to_string(k), k % streams, Noop});
  }
  auto schedule = BuildMicroBatchSplit(std::move(stages), micro_batches);
  if (!schedule.ok()) {
    std::fprintf(stderr, "%s\n", schedule.status().message().c_str());
    std::exit(1);
  }
  return std::move(*schedule);
}

// Microseconds per task, one figure per run.
std::vector<double> TimeDispatch(const Schedule& schedule, const Call& call, const Options& opt) {
  CpuExecutor executor(schedule.num_streams());
  auto run_calls = [&](int n) {
    for (int i = 0; i < n; ++i) {
      if (!executor.Submit(schedule, call).ok() || !executor.Wait().ok()) std::abort();
    }
  };
  run_calls(opt.calls / 10);  // warm-up: threads scheduled, memory touched
  std::vector<double> per_task_us;
  for (int r = 0; r < opt.runs; ++r) {
    auto start = Clock::now();
    run_calls(opt.calls);
    std::chrono::duration<double, std::micro> elapsed = Clock::now() - start;
    per_task_us.push_back(elapsed.count() / (static_cast<double>(opt.calls) * schedule.size()));
  }
  return per_task_us;
}

// Nanoseconds per Pick, one figure per run, for steps of `tokens` tokens.
std::vector<double> TimePick(const BucketPolicy& policy, std::int64_t tokens, const Options& opt) {
  constexpr int kPicks = 1'000'000;
  std::vector<double> per_pick_ns;
  volatile int sink = 0;
  for (int r = 0; r < opt.runs; ++r) {
    auto start = Clock::now();
    for (int i = 0; i < kPicks; ++i) {
      // volatile read: the compiler must not hoist the pick out of the loop
      sink = sink + policy.Pick(tokens + (i & 1)).schedule;
    }
    std::chrono::duration<double, std::nano> elapsed = Clock::now() - start;
    per_pick_ns.push_back(elapsed.count() / kPicks);
  }
  return per_pick_ns;
}

void Print(const char* what, const char* unit, const Summary& s) {
  std::printf("%-58s median %7.3f %s  (min %.3f, max %.3f)\n", what, s.median, unit, s.min, s.max);
}

Options ParseArgs(int argc, char** argv) {
  Options opt;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    int value = std::atoi(argv[i + 1]);
    if (flag == "--runs" && value > 0) {
      opt.runs = value;
    } else if (flag == "--calls" && value > 0) {
      opt.calls = value;
    } else {
      std::fprintf(stderr, "usage: %s [--runs N] [--calls M]\n", argv[0]);
      std::exit(2);
    }
  }
  return opt;
}

int Main(int argc, char** argv) {
  Options opt = ParseArgs(argc, argv);
  std::printf("runs %d, calls per run %d, tasks do nothing\n", opt.runs, opt.calls);

  Schedule two_streams = LayerSchedule(64, 2, 2);  // 2 streams x 64 tasks
  Schedule one_stream = LayerSchedule(128, 1, 1);  // 1 stream x 128 tasks
  Call counted{.release = [](TaskId) {}};
  Print("2 streams x 64 tasks, cross-stream deps", "us/task",
        Summarize(TimeDispatch(two_streams, Call{}, opt)));
  Print("2 streams x 64 tasks, cross-stream deps, ref counting", "us/task",
        Summarize(TimeDispatch(two_streams, counted, opt)));
  Print("1 stream x 128 tasks, sequential", "us/task",
        Summarize(TimeDispatch(one_stream, Call{}, opt)));

  // Sequential up to 32 tokens, then eight overlapped buckets up to 8192.
  std::vector<Bucket> buckets = {{32, BucketPolicy::kSequential}};
  for (std::int64_t max = 64; max <= 8192; max *= 2) buckets.push_back({max, 0});
  auto policy = BucketPolicy::Create(std::move(buckets), 1);

  Print("BucketPolicy::Pick, below the first overlapped bucket", "ns",
        Summarize(TimePick(*policy, 16, opt)));
  Print("BucketPolicy::Pick, binary search over 9 buckets", "ns",
        Summarize(TimePick(*policy, 3000, opt)));
  return 0;
}

}  // namespace
}  // namespace dynaflow::runtime

int main(int argc, char** argv) { return dynaflow::runtime::Main(argc, argv); }
