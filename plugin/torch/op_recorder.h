// Records torch operators into the tracer through at::RecordFunction.
//
// Global callbacks (every thread, the autograd engine's too) on the FUNCTION
// and BACKWARD_FUNCTION scopes. While the tracer is active each operator
// becomes one DynaflowOperatorRecord: name, OS thread, start and end on the
// tracer's clock, autograd sequence number, pass, input shapes and dtypes
// (input_encoding.h) and the innermost nn.Module (module_stack.h). Around the
// operator its id is pushed as the CUPTI external correlation id, so the GPU
// work it launches links to it.
//
// Pass: backward inside the autograd engine's evaluation of a node (its
// BACKWARD_FUNCTION range, or "autograd::engine::evaluate_function: ...")
// and in every operator it calls; forward for other
// operators that have an autograd sequence number or run inside a module's
// forward; unknown otherwise (an optimizer step, say).
//
// Sampling: with sample_every = N, one top-level operator in N is recorded
// per thread (the 2nd, the N+2nd, ...), with everything it calls, so
// recorded call trees stay whole. The decision is made before an operator
// starts, so a skipped one boxes no inputs (unless another thread records an
// operator at the same time).
//
// Cost while the tracer is inactive (--delay, after --duration): only a
// callback without inputs runs, which keeps the per-thread nesting count;
// the recording callback is switched off, so torch boxes no inputs and
// nothing is allocated (op_recorder.cc).
#pragma once

#include <cstdint>

#include "plugin/torch/tracer_abi.h"

namespace dynaflow {

struct OpRecorderOptions {
  int64_t sample_every = 1;  // record 1 top-level operator in this many
};

// Registers the callbacks once per process; later calls do nothing and
// return true. False when torch refused the registration.
bool InstallOpRecorder(const TracerAbi& abi, const OpRecorderOptions& options);

}  // namespace dynaflow
