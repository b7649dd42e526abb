// Candidate schedules, one generator per strategy of DESIGN.md. Each turns the
// measured step graph into a Schedule for the simulator, at a workload scale
// `scale` (tokens / observed tokens), and names what it changes in the user's
// terms (operators and modules seen in the trace).
//
//   sequential          the step as measured (scaled): the baseline of every bucket
//   comm_overlap        gradient-synchronisation collectives (deferrable: only
//                       the optimizer consumes them) move to a side stream and
//                       stop blocking the compute stream
//   fusion              a collective and the elementwise/normalisation kernels
//                       that consume it (residual add, RMSNorm) become one kernel
//                       on few SMs (TokenWeave): those kernels and their
//                       launches disappear, their work hides in the collective
//   dual_batch_overlap  two micro-batches; one computes (one SM stream shared)
//                       while the other communicates (vLLM DBO, SGLang TBO)
//   nanobatch_overlap   k nano-batches; with module paths, the split region
//                       staggered by one segment (region_split.h: the object
//                       `apply` executes); without, at most one task per bound
//                       resource at a time, so differently-bound work of
//                       different nano-batches overlaps (GEMM with decode
//                       attention with collectives: NanoFlow)
// A generator returns nullopt where its strategy does not apply (no collective,
// nothing to fuse, nothing to split).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "analysis/model/trace.h"
#include "analysis/sim/simulator.h"
#include "analysis/sim/step_graph.h"

namespace dynaflow {

enum class Strategy : uint8_t {
  kSequential = 0,
  kNanobatchOverlap = 1,
  kDualBatchOverlap = 2,
  kCommOverlap = 3,
  kFusion = 4,
};
inline constexpr int kStrategyCount = 5;

// "sequential", "nanobatch_overlap", "dual_batch_overlap", "comm_overlap", "fusion".
const char* StrategyName(Strategy s);
bool ParseStrategy(std::string_view name, Strategy* out);

// What a schedule changes, in the user's terms.
struct Partition {
  std::string split = "none";  // "none" or "batch"
  int splits = 1;
  std::vector<std::string> modules;       // module paths or top-level operators involved
  std::vector<std::string> compute_ops;   // operators in each overlap role
  std::vector<std::string> memory_ops;
  std::vector<std::string> communication_ops;
  std::vector<std::string> copy_ops;
  std::vector<std::string> side_stream;   // operators moved to a side stream
  std::vector<std::string> fused;         // operators fused into one kernel
  // A staggered region (region_split.h): the module patterns whose calls cut
  // the split unit (`modules`, one path) into `segments` segments.
  std::vector<std::string> stages;
  int segments = 0;
};

struct Candidate {
  Strategy strategy = Strategy::kSequential;
  int splits = 1;
  Schedule schedule;
  double extra_memory_bytes = 0;
  Partition partition;
};

struct SplitRegion;

struct CandidateContext {
  const Trace* trace = nullptr;  // for names
  const StepGraph* graph = nullptr;
  PeakRates peaks;
  SimParams params;
  double scale = 1.0;  // tokens of the bucket / observed tokens
  int splits = 2;      // nano-batches (dual-batch overlap always uses 2)
  // The step's split region (FindSplitRegion), when its tasks have module
  // paths: nano-batch overlap then simulates the staggered schedule `apply`
  // runs. Null: the kernel-level model below, which no `apply` can run.
  const SplitRegion* region = nullptr;
};

std::optional<Candidate> MakeSequential(const CandidateContext& ctx);
std::optional<Candidate> MakeCommOverlap(const CandidateContext& ctx);
std::optional<Candidate> MakeFusion(const CandidateContext& ctx);
std::optional<Candidate> MakeDualBatchOverlap(const CandidateContext& ctx);
std::optional<Candidate> MakeNanobatchOverlap(const CandidateContext& ctx);

// Shared by the generators (schedule_builder.cc).
namespace sim_internal {

// The step split into `k` chains: each token-scaled task becomes k parts of
// 1/k of the (scaled) batch, per-step tasks stay single and join the chains.
// `group_of(task)` gives the exclusive group of a part, -1 for none.
// Node index of task t's part c: parts[t * k + c] (the same node for all c when
// the task is per-step).
struct SplitSchedule {
  Schedule schedule;
  std::vector<int32_t> parts;
};
SplitSchedule BuildSplit(const CandidateContext& ctx, int k, int groups,
                         const std::function<int32_t(const SimTask&)>& group_of);

// A node of task `t` on a fraction `scale` of the observed batch (work, HBM
// and SM needs, GPU-side delay, launch latency); the caller sets its chain,
// lane, priority and host fields.
SimNode PartNode(const CandidateContext& ctx, size_t t, double scale);

// What blocking calls wait for: each node issued after a blocking call, and
// the step's end, wait for `awaited(task, waiting)`, a node made of the task
// the call waited for; `waiting` is the node issued after the call, -1 for the
// step's end. The node must be one the host issues before `waiting`.
void LinkSyncs(const StepGraph& g,
               const std::function<int32_t(int32_t task, int32_t waiting)>& awaited,
               Schedule* schedule);

// Distinct names (operator, else kernel) of the tasks for which `pick` holds,
// by their total measured time, at most `limit`.
// With `modules`, the tasks' modules (module path or top-level operator) instead.
std::vector<std::string> TopNames(const CandidateContext& ctx,
                                  const std::function<bool(const SimTask&)>& pick, bool modules,
                                  size_t limit = 6);

// The step with its deferrable collectives launched asynchronously, as
// runtime::BuildCommOverlapRegion orders a comm_overlap call: collective j
// (in launch order) on a side lane, and compute part p (the tasks launched
// after p collectives) waiting for the collectives it reads: none before the
// step's end with `read_at_end`, else collective p - 1 (each read by the next
// compute, as a synchronous collective is). Node ids are the graph's task
// ids. nullopt without a deferrable collective.
std::optional<Schedule> CommOverlapSchedule(const CandidateContext& ctx, bool read_at_end);

// The largest collective message of the step, in bytes (0 without one).
double LargestMessageBytes(const StepGraph& graph);

// cuBLAS's workspace per extra stream on Hopper and later (32 MiB).
inline constexpr double kStreamWorkspaceBytes = 32.0 * 1024 * 1024;

}  // namespace sim_internal
}  // namespace dynaflow
