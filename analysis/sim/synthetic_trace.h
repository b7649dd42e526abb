// Test support: traces with known answers, built in memory the way the Kineto
// importer fills the model (operators with shapes and External ids, launch
// calls with correlation ids, kernels on streams, ProfilerStep ranges).
//
// The host is a clock: each launch advances it by the operator's host time and
// the launch call's duration; a kernel starts when its stream is free, its
// explicit dependency finished, and the launch has had `launch_latency_us`.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "analysis/model/trace.h"

namespace dynaflow::testing {

// Roofline durations on an H200 at the efficiencies DESIGN.md quotes (GEMMs
// at 70% of peak, memory-bound kernels at 90% of bandwidth), plus 2 us of
// kernel overhead.
double GemmUs(double m, double n, double k);
double MemoryUs(double bytes);

class SyntheticTrace {
 public:
  explicit SyntheticTrace(std::string device_name = "NVIDIA H200", int32_t rank = 0);

  Trace& trace() { return trace_; }

  // Enclosing operators (module-like scopes) on the host thread.
  void Open(const std::string& name);
  void Close();

  struct Kernel {
    std::string op;      // launching operator; "" launches outside any operator
    std::string shapes;  // compact JSON Input Dims
    std::string types;   // compact JSON Input type
    std::string kernel;
    int32_t stream = 7;
    double dur_us = 10;
    double host_us = 6;          // host time of the operator before its launch
    TimeNs after = -1;           // GPU time it must also wait for (another kernel's end)
  };
  // Returns the kernel's end time.
  TimeNs Launch(const Kernel& k);

  // A ProfilerStep#N range on the host and its projection on the device.
  void StepBegin(int64_t number);
  void StepEnd();
  // The same for a range of any name (a serving framework's step annotation).
  void RangeBegin(const std::string& name);
  void RangeEnd();

  // Host time passes without launches (data loading, Python).
  void HostIdle(double us) { cpu_ += static_cast<TimeNs>(us * 1000); }

  double launch_latency_us = 5;
  double launch_call_us = 4;

 private:
  Trace trace_;
  uint32_t device_ = 0;
  TimeNs cpu_ = 1'000'000;
  int64_t next_ext_ = 1;
  int64_t next_corr_ = 1;
  std::map<int32_t, TimeNs> stream_free_;
  std::vector<size_t> open_;  // indices into trace_.ops
  std::string range_name_;
  TimeNs step_cpu_start_ = 0;
  TimeNs step_gpu_start_ = -1;
  TimeNs step_gpu_end_ = -1;
};

// An 8-layer data-parallel backward (DDP without bucketing overlap): each
// layer's weight-gradient GEMM, then its gradient all-reduce on the NCCL
// stream under AccumulateGrad, which the next layer's GEMM waits for. The
// exposed communication per step is layers * allreduce_us.
Trace DdpSerializedAllReduce(int layers = 8, double allreduce_us = 150, int steps = 3);

// Decode steps of a Llama-3-8B-shaped decoder (hidden 4096, 32 query and 8 KV
// heads of 128, FFN 14336) on one H200: `batch` sequences, each with a KV
// cache of `context` tokens, `layers` layers; eager launches.
Trace LlamaDecode(int batch, int context, int layers = 4, int steps = 3);

// One serving-framework decode forward of the LlamaDecode decoder, as a
// serving framework runs it: an embedding, `layers` layers, the LM head and
// sampling, no ProfilerStep. With `annotated`, vLLM's step annotation
// `execute_context_0(0)_generation_<batch>(<batch>)` encloses it (host and
// device).
Trace ServingDecodeForward(int batch, int context, int layers, bool annotated);

// A serving session of the LlamaDecode decoder, each forward under vLLM's
// step annotation: one prefill of a `prompt_tokens`-token prompt, then
// `decode_steps` decode forwards of `batch` sequences at `context` tokens of
// KV cache (growing by one per step).
Trace ServingSession(int prompt_tokens, int batch, int context, int layers, int decode_steps);

// The forward pass of a Llama-3-8B-shaped decoder with tensor parallelism over
// two GPUs (rank 0's view), prefilling `tokens` tokens: after the attention
// output and the MLP down projection, an all-reduce on the NCCL stream that
// the residual add and the next RMSNorm wait for (Megatron-style, exposed).
Trace TensorParallelForward(int tokens, double allreduce_us, int layers = 4, int steps = 3);

// A memory-dominated forward, the shape of issue 10's video transformer (6% of
// its kernel time compute-bound): per layer a small GEMM ([rows, 1024] x
// [1024, 1024]) and two softmaxes over [rows, 32, 1024], all on one stream.
// Overlap can hide at most the GEMMs' time under the softmaxes.
Trace MemoryDominatedForward(int rows, int layers = 4, int steps = 3);

}  // namespace dynaflow::testing
