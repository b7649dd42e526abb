// The phase and token count of each step, for steps without a serving
// framework's annotation (analysis/steps/steps.h), from what the step ran:
//   * phase: a training iteration when the step has a backward pass (a
//     backward operator or kernel); otherwise decode or prefill from the
//     attention operators' shapes (the cost model's decode test: at most 16
//     query tokens per sequence against a context over 4x longer), then from
//     attention kernel names (decode: split-KV, paged and decode kernels;
//     prefill: prefill and context kernels); both in one step is kMixed;
//   * tokens: attention's query rows, batch x sequence for a prefill or
//     training forward, batch for decode (OpCost::tokens of the attention
//     operator, the most common value in the step: one per layer).
// A step whose annotation gave a phase or tokens keeps them. A step without
// attention shapes keeps 0 tokens: the step graph then falls back to the
// GEMM row count (TokenSource::kGemmRows).
#pragma once

#include <string_view>

#include "analysis/model/trace.h"
#include "analysis/roofline/bound.h"
#include "analysis/steps/steps.h"

namespace dynaflow {

// The phase an attention kernel's name says, kUnknown when it says none.
StepPhase AttentionKernelPhase(std::string_view kernel_name);

// Fills Step::phase, tokens and tokens_source of every step of `steps` that
// its annotation left unknown. Never fails: what cannot be told stays unknown.
void InferWorkloads(const Trace& trace, const OperatorLinks& links, const DeviceResources& dev,
                    CostCache* costs, DeviceSteps* steps);

}  // namespace dynaflow
