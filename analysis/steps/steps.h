// Training or serving steps of one device, found in this order:
//   1. ProfilerStep#N ranges projected on the device (gpu_user_annotation):
//      an activity belongs to the step whose window its start falls in;
//   2. ProfilerStep#N ranges on the host of the same rank: an activity belongs
//      to the step during which its launch call started (correlation id), or
//      whose range its start falls in when the launch is unknown;
//   3. a serving framework's per-forward annotations (vLLM's
//      `execute_context_C(T)_generation_G(U)`), on the device, else on the host
//      of the same rank (as 1 and 2): one step per forward, with its phase and
//      tokens from the annotation;
//   4. the repeating kernel sequence: the rarest kernel name that recurs at a
//      constant period (in kernels) covering most of the trace marks the step
//      boundaries, unless the period is one layer of a stack inside one
//      forward (kernels that run once before the first period, an embedding,
//      and once after the last, a head): then the forward is the one step;
//   5. otherwise the whole trace is one step.
// A step is one forward or one training iteration, never one layer.
// A step's window runs from its first activity's start to the next step's
// first start (the last step ends at its last activity's end), so the steps
// tile the device's timeline and GPU idle time between steps, while the host
// prepares the next one, belongs to the step that waits.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "analysis/model/trace.h"
#include "analysis/roofline/bound.h"

namespace dynaflow {

enum class StepSource {
  kGpuAnnotation = 0,
  kHostAnnotation = 1,
  kRepeat = 2,
  kWhole = 3,
  kServingGpu = 4,
  kServingHost = 5,
};

// "profiler_step_gpu", "profiler_step_host", "repeating_sequence", "whole_trace",
// "serving_step_gpu", "serving_step_host".
const char* StepSourceName(StepSource s);

// What a step runs: a forward over new prompts (prefill), a forward of one new
// token per sequence (decode), both in one batch (mixed, chunked prefill), or a
// training iteration (it has a backward pass).
enum class StepPhase : uint8_t { kUnknown = 0, kPrefill = 1, kDecode = 2, kMixed = 3, kTraining = 4 };

// "unknown", "prefill", "decode", "mixed", "training".
const char* PhaseName(StepPhase p);

// Where a step's token count comes from, best first.
enum class TokenSource : uint8_t {
  kNone = 0,
  kAnnotation = 1,       // the serving framework's annotation
  kAttentionShapes = 2,  // attention's query shape: batch x sequence (prefill), batch (decode)
  kGemmRows = 3,         // the most common GEMM row count (analysis/sim/step_graph.cc)
  kBatchRows = 4,        // no GEMM: a convolution's batch or an embedding's rows
};

// "none", "annotation", "attention_shapes", "gemm_rows", "batch_rows".
const char* TokenSourceName(TokenSource s);

// A serving framework's per-forward annotation, parsed, from what each
// framework's own source writes:
//   * vLLM (v1 model runner) names each forward
//     `execute_context_C(T)_generation_G(U)`: C prefill requests of T tokens
//     in all (newer versions append `_S`, the sum of the squared prompt
//     lengths: `(888_788544)`) and G decode requests of U tokens;
//   * TensorRT-LLM's PyTorch backend, `[Executor] _forward_step N: C ctx
//     reqs, G gen reqs` (older: without N or the prefix): C context (prefill)
//     and G generation requests, no token counts (0: inferred from shapes);
//   * SGLang's scheduler, `scheduler.run_batch` (with
//     SGLANG_SCHEDULER_ENABLE_NVTX=1): one forward, nothing more (phase and
//     tokens inferred).
struct ServingAnnotation {
  int64_t context_requests = 0;
  int64_t context_tokens = 0;
  int64_t generation_requests = 0;
  int64_t generation_tokens = 0;
  StepPhase phase() const;
  int64_t tokens() const { return context_tokens + generation_tokens; }
};

// False when `name` is not such an annotation (then `out` is untouched).
bool ParseServingAnnotation(std::string_view name, ServingAnnotation* out);

struct Step {
  int64_t number = 0;  // N of ProfilerStep#N, else the ordinal
  TimeNs start = 0;    // first activity's start
  TimeNs end = 0;      // next step's first start, or the last activity's end
  TimeNs busy_end = 0;  // the step's last activity's end
  int64_t activities = 0;
  // From the serving framework's annotation of the step; without one,
  // InferWorkloads (analysis/steps/workload.h) infers them from the kernels
  // and operator shapes. kUnknown and 0 when unknown.
  StepPhase phase = StepPhase::kUnknown;
  int64_t tokens = 0;
  TokenSource tokens_source = TokenSource::kNone;
  double duration_us() const { return static_cast<double>(end - start) / 1000.0; }
};

struct DeviceSteps {
  StepSource source = StepSource::kWhole;
  std::vector<Step> steps;  // by start
  // Step index of each activity of DeviceResources::order; -1 outside every step.
  std::vector<int32_t> step_of;
  size_t representative = 0;  // the step of median duration
  double mean_us = 0;
  double median_us = 0;
  double min_us = 0;
  double max_us = 0;
  double stdev_us = 0;
  double cv_pct = 0;  // stdev / mean
  // Repeats of the layer stack found inside one step (source kWhole after a
  // repeating sequence was recognised as layers of one forward); 0 when none.
  int64_t layers = 0;
};

DeviceSteps FindSteps(const Trace& trace, const DeviceResources& device);

// The representative of `steps` (DeviceSteps::representative), or of those of
// `phase`: the one of median duration (the upper median), leaving out the last
// step of three or more, whose end is its last activity's (cut short), unless
// it is the only candidate. Precondition: a step of `phase` exists.
size_t RepresentativeStep(const std::vector<Step>& steps, std::optional<StepPhase> phase = std::nullopt);

}  // namespace dynaflow
