// The resource that bounds each GPU activity, and achieved rates against the
// device's peaks (roofline).
//
// Every kernel, memcpy and memset is put in one class:
//   compute        tensor cores / SMs: arithmetic intensity at or above the ridge
//   memory         HBM bandwidth: below the ridge, and memsets
//   communication  NCCL/RCCL kernels and kernels of collective operators
//   copy           memcpy over PCIe or NVLink (copy engines)
//   latency        launch/latency bound: a short kernel after an idle gap on its
//                  stream at least as long as itself
// The FLOPs and bytes come from the launching operator's shapes (External id
// link, flops_bytes.h), shared among that operator's kernels in proportion to
// their durations. Kernels without a usable operator fall back to rules on
// the kernel name (ClassifyKernelName).
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "analysis/model/trace.h"
#include "analysis/roofline/flops_bytes.h"

namespace dynaflow {

enum class Resource : uint8_t {
  kCompute = 0,
  kMemory = 1,
  kCommunication = 2,
  kCopy = 3,
  kLatency = 4,
};
inline constexpr int kResourceCount = 5;

// "compute", "memory", "communication", "copy", "latency".
const char* ResourceName(Resource r);

// Peak rates of one device in SI units. What the trace recorded wins over the
// device table; an unknown part gets H100-SXM-like numbers with `known` false.
struct PeakRates {
  std::string name;
  bool known = false;
  int sm_count = 0;
  double flops_fp8 = 0;   // FLOP/s
  double flops_half = 0;  // BF16/FP16 tensor cores
  double flops_tf32 = 0;
  double flops_fp32 = 0;
  double bytes_per_s = 0;       // HBM
  double link_bytes_per_s = 0;  // NVLink per direction (0: none)
  double pcie_bytes_per_s = 0;
  // Per-SM residency limits of the part's compute capability (CUDA C++
  // Programming Guide, "Technical Specifications per Compute Capability");
  // 0 where unknown (AMD parts, whose compute units schedule wavefronts by
  // other rules, and capabilities not listed).
  int max_threads_per_sm = 0;
  int max_blocks_per_sm = 0;
  int registers_per_sm = 0;
  int shared_memory_per_sm = 0;  // bytes

  double Flops(Precision p) const;
  // FLOP per byte where BF16 math and HBM take equal time.
  double Ridge() const { return bytes_per_s > 0 ? flops_half / bytes_per_s : 0; }
};

PeakRates PeakRatesFor(const DeviceInfo& device);

// A kernel's grid in waves of the device, from its launch configuration:
// blocks / (resident blocks per SM x SMs); below 1, the fraction of the SMs it
// occupies, from 1 on, it fills the device until its tail. Resident blocks per
// SM are limited by threads (whole warps), blocks, registers and shared memory
// per SM. 0 when unknown: no launch configuration (memcpy, memset, traces
// without it) or no limits for the part.
double GridWaves(const GpuActivity& kernel, const PeakRates& peaks);

// Links between the trace's records, built once per trace in linear time
// (plus one sort of the operators per thread). A GPU activity links to the
// operator its External id names; failing that (older Kineto traces write the
// correlation id there, nsys has none), to the innermost operator around its
// launching runtime call (same rank and correlation id) on that call's thread.
struct OperatorLinks {
  std::vector<int32_t> activity_op;  // per Trace::gpu: the launching operator, -1 when none
  std::vector<int32_t> op_top;       // per Trace::ops: outermost enclosing operator on its thread
  std::vector<int32_t> op_parent;    // per Trace::ops: innermost enclosing operator, -1 at top level
};

OperatorLinks LinkOperators(const Trace& trace);

// The name to show for the operator that launched activity `i` (0 when none):
// the operator's, except profiler bookkeeping (record_param_comms) which is
// named after the collective that encloses it (c10d::allreduce_...).
StringId DisplayOperator(const Trace& trace, const OperatorLinks& links, size_t activity);

// The GPU time of each execution of the operators activities link to: an
// operator's cost (its FLOPs and bytes, for one execution) is shared among
// the activities of one execution in proportion to their durations. An
// operator executes once, except a capture-time operator
// (Operator::in_graph_capture): the kernels linked to it run at every replay
// of its CUDA graph, and each replay (the activities of one cudaGraphLaunch
// share its correlation id) is one execution, credited with the whole cost.
class OperatorGpuTime {
 public:
  explicit OperatorGpuTime(const Trace& trace);
  // Adds activity `g`'s duration to the execution of operator `op` it belongs to.
  void Add(int32_t op, const GpuActivity& g);
  // The time added for the execution `g` belongs to; 0 when none.
  double Of(int32_t op, const GpuActivity& g) const;

 private:
  // The replay `g` belongs to when `op` is a capture-time operator; -1 otherwise.
  int64_t Replay(int32_t op, const GpuActivity& g) const;
  struct ReplayHash {
    size_t operator()(const std::pair<int32_t, int64_t>& k) const {
      return std::hash<int64_t>()(k.second) * 31 + static_cast<size_t>(k.first);
    }
  };
  const Trace& trace_;
  std::vector<double> once_ns_;  // per Trace::ops
  std::unordered_map<std::pair<int32_t, int64_t>, double, ReplayHash> replay_ns_;
};

// The class a kernel's name suggests, for kernels without operator shapes.
Resource ClassifyKernelName(std::string_view kernel_name);

struct BoundOptions {
  // A kernel shorter than this, after an idle gap on its stream at least as
  // long as itself, is launch/latency bound.
  double latency_kernel_us = 10.0;
  size_t top_operators = 15;
};

struct ResourceTotals {
  int64_t count = 0;
  double time_us = 0;         // sum of durations
  double costed_time_us = 0;  // ... of the activities whose FLOPs or bytes are known
  double flops = 0;
  double bytes = 0;
  double achieved_tflops = 0;  // flops / costed time
  double achieved_gbps = 0;    // bytes / costed time
  // Of the work the class's peaks allow in its costed time (ActivityPeak):
  // compute at each operator's precision (FP8, BF16/FP16, TF32, FP32), HBM
  // for memory, the link for communication, each copy's own path.
  double pct_of_peak = 0;
  double peak_work = 0;  // sum over costed activities of duration x ActivityPeak
};

// One operator name (or kernel name when no operator is linked) on a device.
struct OperatorRoofline {
  std::string name;
  bool from_kernel_name = false;  // no linked operator: named after the kernel
  OpKind kind = OpKind::kUnknown;
  Resource resource = Resource::kMemory;  // the class holding most of its time
  int64_t kernels = 0;
  double gpu_us = 0;
  double flops = 0;
  double bytes = 0;
  double intensity = 0;  // FLOP per byte, 0 when unknown
  double achieved_tflops = 0;
  double achieved_gbps = 0;
  double pct_of_peak = 0;  // of the peak of its bound resource, as ResourceTotals
};

struct DeviceResources {
  uint32_t device_index = 0;
  PeakRates peaks;
  std::vector<uint32_t> order;     // Trace::gpu indices of this device (end > start), by start
  std::vector<Resource> resource;  // parallel to `order`
  ResourceTotals totals[kResourceCount];
  std::vector<OperatorRoofline> operators;  // by GPU time, at most top_operators
  int64_t linked_kernels = 0;     // kernels whose launching operator is known
  int64_t costed_kernels = 0;     // ... and whose operator's FLOPs/bytes are known
};

// One entry per device with GPU activity, in Trace::devices order.
std::vector<DeviceResources> ClassifyResources(const Trace& trace, const OperatorLinks& links,
                                               const BoundOptions& options);

// The operator cost of `op`, memoised per (name, shapes, types, concrete
// inputs, enclosing operator): call through one CostCache per trace. With
// `links`, an operator whose own shapes are incomplete (a convolution's
// weight gradient) reads what it lacks from its enclosing operator. A forward
// convolution takes its output size from the backward of the same shapes
// when the trace has one (older profilers record no stride or padding).
class CostCache {
 public:
  explicit CostCache(const Trace& trace, const OperatorLinks* links = nullptr)
      : trace_(trace), links_(links) {}
  // `op` is an element of trace.ops (its parent is found by its position).
  const OpCost& Get(const Operator& op);

 private:
  struct Key {
    StringId name, shapes, types, concrete, parent_name, parent_shapes;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return (static_cast<size_t>(k.name) * 0x9E3779B97F4A7C15ull) ^
             (static_cast<size_t>(k.shapes) * 0xC2B2AE3D27D4EB4Full) ^ k.types ^
             (static_cast<size_t>(k.concrete) << 20) ^ (static_cast<size_t>(k.parent_shapes) << 40) ^
             (static_cast<size_t>(k.parent_name) * 0x165667B19E3779F9ull);
    }
  };
  const Operator* Parent(const Operator& op) const;
  // Forward convolutions' output shapes by "[x,w]", from the trace's
  // convolution backwards (ConvolutionOutputFromBackward); built on first use.
  std::string_view ConvolutionOutput(const Operator& op);
  const Trace& trace_;
  const OperatorLinks* links_;
  std::unordered_map<Key, OpCost, KeyHash> cache_;
  bool conv_outputs_built_ = false;
  std::unordered_map<std::string, std::string> conv_outputs_;
};

// The bound resource of an operator's kernels from its cost, or nullopt-like
// `fallback` when the cost is unknown. GEMMs and every other kind alike: the
// FLOPs at the operator's precision against its bytes at HBM bandwidth, so a
// decode GEMM (small M) is memory bound whatever its kernel's name.
Resource ResourceFromCost(const OpCost& cost, const PeakRates& peaks, Resource fallback);

// The peak rate (FLOP/s for compute, byte/s otherwise) activity `g`'s work is
// measured against when it is in class `r`: compute at `precision`, memory at
// HBM, communication on the link, a memcpy on its own path (HBM for
// device-to-device, the link for peer copies, PCIe to or from the host).
double ActivityPeak(Resource r, const Trace& trace, const GpuActivity& g, Precision precision,
                    const PeakRates& peaks);

}  // namespace dynaflow
