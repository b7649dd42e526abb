// plan.json: what `dynaflow apply` needs to run a schedule, and what the
// advisor predicted for it. Schema dynaflow.plan/1, described by
// schemas/plan.schema.json; ValidatePlanJson checks the same rules in C++ (the
// subset of JSON Schema that file uses: types, required keys, enums, minimums,
// maximums, string and list lengths, no extra keys where the schema forbids
// them). plan_schema_test validates a corpus of good and bad plans with both
// and demands the same verdict for each.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "analysis/base/status.h"
#include "analysis/sim/candidates.h"

namespace dynaflow {

inline constexpr const char* kPlanSchema = "dynaflow.plan/1";

// Upper bounds of a plan, stated with the same numbers in
// schemas/plan.schema.json. A plan is a few kilobytes; the bounds keep a
// corrupt or hostile one from exhausting the program `dynaflow apply` runs
// (100000 splits made the runtime start 100000 threads; 2M module patterns
// hung the Python side).
struct PlanLimits {
  // Micro-batches per call: the runtime runs one stream (one worker thread on
  // the CPU) per micro-batch; `advise --splits` accepts 2..16.
  static constexpr int kMaxSplits = 16;
  static constexpr int kMaxStreams = 16;  // streams of a bucket; ids 0..kMaxStreams-1
  // Characters (Unicode code points, as JSON Schema's maxLength counts) of
  // any string: names, module patterns, operator names, trace paths (PATH_MAX).
  static constexpr size_t kMaxString = 4096;
  static constexpr size_t kMaxItems = 4096;   // operators, modules, traces, a bucket's rules
  static constexpr size_t kMaxRules = 256;    // partition_rules
  static constexpr size_t kMaxBuckets = 64;   // advise writes one per workload point, ~10
  // Segments of a staggered region: stage calls per forward (two per layer of
  // a 128-layer model is 256); `apply` keeps one CUDA event per segment and
  // micro-batch.
  static constexpr int kMaxSegments = 4096;
  static constexpr int64_t kMaxInt = 2147483647;  // rank, device, sm_count (C int)
  static constexpr int64_t kMaxCount = 9007199254740991;  // kernels_per_step: 2^53-1
};

struct PlanRule {
  std::string name;  // "<strategy>.<role>", referenced by buckets
  // split | stage | compute | memory | communication | copy | side_stream | fused.
  // A bucket with `segments` names a split rule (the unit) and a stage rule
  // (the module patterns whose calls cut the unit into segments).
  std::string role;
  std::vector<std::string> operators;
  std::vector<std::string> modules;
  friend bool operator==(const PlanRule&, const PlanRule&) = default;
};

struct PlanStream {
  int id = 0;
  std::string role;  // compute | memory | communication
  friend bool operator==(const PlanStream&, const PlanStream&) = default;
};

struct PlanBucket {
  double min_tokens = 0;
  std::optional<double> max_tokens;  // none: no upper bound
  Strategy strategy = Strategy::kSequential;
  int splits = 1;
  // > 0: the split unit runs as one region, the schedule the prediction
  // simulated: nanobatch_overlap runtime::BuildStaggeredRegion(segments,
  // splits) (segments cut at the stage rule's modules), dual_batch_overlap
  // runtime::BuildDualBatchRegion(segments) (segments = collective calls).
  // 0: absent (each unit call runs its micro-batches side by side).
  int segments = 0;
  // The phase of the calls this bucket is for ("prefill", "decode", "mixed",
  // "training"), simulated on a step of that phase; empty: every call that no
  // phase's buckets are for. The buckets of one phase are consecutive and
  // tile [0, inf) by tokens, each phase its own tiling.
  std::string phase;
  std::vector<std::string> rules;  // PlanRule names
  std::vector<PlanStream> streams;
  double predicted_speedup = 1;
  double baseline_step_us = 0;
  double predicted_step_us = 0;
  double extra_memory_bytes = 0;
  friend bool operator==(const PlanBucket&, const PlanBucket&) = default;
};

struct Plan {
  std::string schema = kPlanSchema;
  std::string generator = "dynaflow 0.1.0";
  // Source.
  std::vector<std::string> traces;
  std::string trace_fingerprint;
  // Device.
  std::string device_name;
  int rank = 0;
  int device = 0;
  int sm_count = 0;
  double memory_bandwidth_gbps = 0;
  double peak_tflops_bf16 = 0;
  bool peaks_known = false;
  // Model.
  std::string model_fingerprint;
  // The split units' root module's structure as `dynaflow trace` recorded it
  // (metadata module_fingerprint.<root class>); empty when the trace has none.
  // `dynaflow apply` compares it with the program's model.
  std::string module_fingerprint;
  double tokens_per_step = 0;  // 0: unknown
  // The phase of the observed step, the one `strategy`, `splits` and the
  // top-level prediction are for: "prefill", "decode", "mixed" or "training"
  // (analysis/steps/steps.h PhaseName); empty when unknown (absent from the
  // JSON). The buckets without a phase were simulated on a step of this
  // phase; a trace with steps of several phases also gets a tiling for each
  // other phase (PlanBucket::phase): a prefill's tokens are not a decode
  // batch's.
  std::string phase;
  int64_t kernels_per_step = 0;
  // Decision.
  bool forced = false;
  Strategy strategy = Strategy::kSequential;  // at the observed workload
  int splits = 1;
  std::vector<PlanRule> partition_rules;
  std::vector<PlanBucket> buckets;  // per phase, by min_tokens, covering [0, inf)
  // Prediction at the observed workload.
  double baseline_step_us = 0;
  double predicted_step_us = 0;
  double predicted_speedup = 1;
  double extra_memory_bytes = 0;
  friend bool operator==(const Plan&, const Plan&) = default;
};

nlohmann::json PlanToJson(const Plan& plan);

// Validates, then reads. BadInput names the first offending key.
StatusOr<Plan> PlanFromJson(const nlohmann::json& j);

// The rules of schemas/plan.schema.json.
Status ValidatePlanJson(const nlohmann::json& j);

// The keys ValidatePlanJson requires at the top level and in each bucket: the
// schema file's "required" lists must be the same (plan_test checks).
const std::vector<std::string>& PlanRequiredKeys();
const std::vector<std::string>& PlanBucketRequiredKeys();

// The streams a strategy uses.
std::vector<PlanStream> StreamsFor(Strategy s);

// Whether some bucket that splits the batch (nanobatch or dual-batch overlap)
// names a split rule with modules: what `dynaflow apply` can run split.
bool SplitsModules(const Plan& plan);

// Whether some comm_overlap bucket names a side_stream rule with modules:
// what `dynaflow apply` can run with its collectives overlapped.
bool OverlapsModules(const Plan& plan);

}  // namespace dynaflow
