#include "analysis/roofline/bound.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <string_view>
#include <unordered_map>

#include "analysis/roofline/device_table.h"

namespace dynaflow {
namespace {

// Streams of one device are few: a flat map with a one-entry cache.
class StreamEnds {
 public:
  TimeNs* Find(int32_t stream) {
    if (last_ < keys_.size() && keys_[last_] == stream) return &ends_[last_];
    for (size_t i = 0; i < keys_.size(); ++i) {
      if (keys_[i] == stream) {
        last_ = i;
        return &ends_[i];
      }
    }
    keys_.push_back(stream);
    ends_.push_back(-1);
    last_ = keys_.size() - 1;
    return &ends_.back();
  }

 private:
  std::vector<int32_t> keys_;
  std::vector<TimeNs> ends_;
  size_t last_ = 0;
};

// The bandwidth of a copy's path: HBM within the device, NVLink between
// devices, PCIe to or from the host.
double CopyPeak(const Trace& trace, const GpuActivity& g, const PeakRates& p) {
  std::string_view kind = trace.strings.Get(g.copy_kind);
  if (kind.empty()) kind = trace.strings.Get(g.name);
  if (kind.find("DtoD") != std::string_view::npos) return p.bytes_per_s;
  if (kind.find("PtoP") != std::string_view::npos || kind.find("Peer") != std::string_view::npos) {
    return p.link_bytes_per_s > 0 ? p.link_bytes_per_s : p.pcie_bytes_per_s;
  }
  return p.pcie_bytes_per_s;
}

}  // namespace

double ActivityPeak(Resource r, const Trace& trace, const GpuActivity& g, Precision precision,
                    const PeakRates& p) {
  switch (r) {
    case Resource::kCompute: return p.Flops(precision);
    case Resource::kMemory: return p.bytes_per_s;
    case Resource::kCommunication: return p.link_bytes_per_s;
    case Resource::kCopy: return g.kind == GpuKind::kMemcpy ? CopyPeak(trace, g, p) : p.bytes_per_s;
    case Resource::kLatency: return 0;
  }
  return 0;
}

const char* ResourceName(Resource r) {
  switch (r) {
    case Resource::kCompute: return "compute";
    case Resource::kMemory: return "memory";
    case Resource::kCommunication: return "communication";
    case Resource::kCopy: return "copy";
    case Resource::kLatency: return "latency";
  }
  return "memory";
}

double PeakRates::Flops(Precision p) const {
  switch (p) {
    case Precision::kFp8: return flops_fp8 > 0 ? flops_fp8 : flops_half;
    case Precision::kTf32: return flops_tf32 > 0 ? flops_tf32 : flops_fp32;
    case Precision::kFp32: return flops_fp32;
    case Precision::kFp64: return flops_fp32 / 2;
    case Precision::kHalf:
    case Precision::kInteger:
    case Precision::kUnknown: return flops_half;
  }
  return flops_half;
}

namespace {

// CUDA C++ Programming Guide, "Technical Specifications per Compute
// Capability": resident threads, blocks, 32-bit registers and shared memory
// (the most a block may configure) per SM.
void SetSmLimits(int major, int minor, PeakRates* p) {
  struct Limits {
    int major, minor, threads, blocks, shared_kib;
  };
  static constexpr Limits kLimits[] = {
      {7, 0, 2048, 32, 96},  {7, 5, 1024, 16, 64},  {8, 0, 2048, 32, 164}, {8, 6, 1536, 16, 100},
      {8, 9, 1536, 24, 100}, {9, 0, 2048, 32, 228}, {10, 0, 2048, 32, 228},
  };
  for (const Limits& l : kLimits) {
    if (l.major != major || l.minor != minor) continue;
    p->max_threads_per_sm = l.threads;
    p->max_blocks_per_sm = l.blocks;
    p->registers_per_sm = 65536;
    p->shared_memory_per_sm = l.shared_kib * 1024;
  }
}

}  // namespace

PeakRates PeakRatesFor(const DeviceInfo& d) {
  PeakRates p;
  p.name = d.name;
  const DevicePeaks* t = LookupDevice(d.name, d.sm_count);
  // An unknown part: the H100 SXM's numbers, so that the roofline still
  // separates compute from memory bound work; flagged as assumed.
  const DevicePeaks* fallback = LookupDevice("NVIDIA H100 SXM");
  const DevicePeaks& src = t != nullptr ? *t : *fallback;
  p.known = t != nullptr || (d.peak_tflops_bf16 > 0 && d.memory_bandwidth_gbps > 0);
  p.sm_count = d.sm_count > 0 ? d.sm_count : src.sm_count;
  p.flops_half = (d.peak_tflops_bf16 > 0 ? d.peak_tflops_bf16 : src.tflops_bf16) * 1e12;
  p.flops_fp8 = (d.peak_tflops_fp8 > 0 ? d.peak_tflops_fp8 : src.tflops_fp8) * 1e12;
  p.flops_fp32 = (d.peak_tflops_fp32 > 0 ? d.peak_tflops_fp32 : src.tflops_fp32) * 1e12;
  p.flops_tf32 = src.tflops_tf32 * 1e12;
  p.bytes_per_s = (d.memory_bandwidth_gbps > 0 ? d.memory_bandwidth_gbps : src.memory_bandwidth_gbps) * 1e9;
  p.link_bytes_per_s = src.interconnect_gbps * 1e9;
  // PCIe Gen5 x16 ~ 55 GB/s achieved for Hopper and Blackwell, Gen4 ~ 25 GB/s before.
  p.pcie_bytes_per_s = (src.cc_major >= 9 ? 55.0 : 25.0) * 1e9;
  if (t != nullptr && t->name.starts_with("NVIDIA")) SetSmLimits(t->cc_major, t->cc_minor, &p);
  return p;
}

double GridWaves(const GpuActivity& k, const PeakRates& p) {
  if (k.kind != GpuKind::kKernel || p.sm_count <= 0 || p.max_threads_per_sm <= 0) return 0;
  const double blocks = static_cast<double>(k.grid[0]) * std::max(1, k.grid[1]) * std::max(1, k.grid[2]);
  const int64_t threads = static_cast<int64_t>(k.block[0]) * std::max(1, k.block[1]) * std::max(1, k.block[2]);
  if (blocks <= 0 || threads <= 0) return 0;
  const int64_t warp_threads = (threads + 31) / 32 * 32;
  int64_t per_sm = std::min<int64_t>(p.max_blocks_per_sm, p.max_threads_per_sm / warp_threads);
  if (k.registers > 0) per_sm = std::min<int64_t>(per_sm, p.registers_per_sm / (k.registers * warp_threads));
  if (k.shared_memory > 0) per_sm = std::min<int64_t>(per_sm, p.shared_memory_per_sm / k.shared_memory);
  per_sm = std::max<int64_t>(per_sm, 1);  // it ran: at least one block fits
  return blocks / (static_cast<double>(per_sm) * p.sm_count);
}

namespace {

// Older Kineto traces (before PyTorch 2.0's ids) write the CUDA correlation id
// into the "External id" of kernels and runtime calls alike. A rank whose GPU
// activities nearly all carry external id == correlation is such a trace: its
// external ids do not name operators. The 90% threshold tolerates the odd
// coincidence of two independent counters in newer traces.
std::vector<int32_t> RanksWithCorrelationAsExternalId(const Trace& trace) {
  struct Count {
    int32_t rank;
    int64_t both = 0, equal = 0;
  };
  std::vector<Count> counts;
  for (const GpuActivity& g : trace.gpu) {
    if (g.external_id < 0 || g.correlation < 0 || g.device_index >= trace.devices.size()) continue;
    const int32_t rank = trace.devices[g.device_index].rank;
    auto it = std::find_if(counts.begin(), counts.end(), [rank](const Count& c) { return c.rank == rank; });
    if (it == counts.end()) it = counts.insert(counts.end(), Count{rank});
    ++it->both;
    if (g.external_id == g.correlation) ++it->equal;
  }
  std::vector<int32_t> out;
  for (const Count& c : counts) {
    if (c.both > 0 && c.equal * 10 >= c.both * 9) out.push_back(c.rank);
  }
  return out;
}

// (rank, External id) -> operator, then each GPU activity to the operator
// named by its external id (not on `skip_ranks`). Kineto's ids are dense per
// rank, so a plain array over [min, max] serves unless they are scattered.
void LinkByExternalId(const Trace& trace, const std::vector<int32_t>& skip_ranks, OperatorLinks* links) {
  struct RankIds {
    int32_t rank = 0;
    int64_t lo = INT64_MAX, hi = INT64_MIN, count = 0;
    std::vector<int32_t> dense;
    std::unordered_map<int64_t, int32_t> sparse;
  };
  std::vector<RankIds> ranks;
  auto rank_slot = [&ranks](int32_t rank) -> RankIds& {
    for (RankIds& r : ranks) {
      if (r.rank == rank) return r;
    }
    ranks.emplace_back();
    ranks.back().rank = rank;
    return ranks.back();
  };
  for (const Operator& o : trace.ops) {
    if (o.external_id < 0) continue;
    RankIds& r = rank_slot(o.rank);
    r.lo = std::min(r.lo, o.external_id);
    r.hi = std::max(r.hi, o.external_id);
    ++r.count;
  }
  for (RankIds& r : ranks) {
    if (r.hi - r.lo + 1 <= 4 * r.count + 1024) {
      r.dense.assign(static_cast<size_t>(r.hi - r.lo + 1), -1);
    } else {
      r.sparse.reserve(static_cast<size_t>(r.count));
    }
  }
  for (size_t i = 0; i < trace.ops.size(); ++i) {
    const Operator& o = trace.ops[i];
    if (o.external_id < 0) continue;
    RankIds& r = rank_slot(o.rank);
    int32_t* slot = r.dense.empty() ? &r.sparse.try_emplace(o.external_id, -1).first->second
                                    : &r.dense[static_cast<size_t>(o.external_id - r.lo)];
    // Duplicates (the same id on two records): the later-starting, innermost one.
    if (*slot < 0 || trace.ops[static_cast<size_t>(*slot)].start <= o.start) {
      *slot = static_cast<int32_t>(i);
    }
  }
  if (ranks.empty()) return;
  for (size_t i = 0; i < trace.gpu.size(); ++i) {
    const GpuActivity& g = trace.gpu[i];
    if (g.external_id < 0 || g.device_index >= trace.devices.size()) continue;
    const int32_t rank = trace.devices[g.device_index].rank;
    if (std::find(skip_ranks.begin(), skip_ranks.end(), rank) != skip_ranks.end()) continue;
    RankIds* r = nullptr;
    for (RankIds& x : ranks) {
      if (x.rank == rank) r = &x;
    }
    if (r == nullptr) continue;
    if (!r->dense.empty()) {
      if (g.external_id >= r->lo && g.external_id <= r->hi) {
        links->activity_op[i] = r->dense[static_cast<size_t>(g.external_id - r->lo)];
      }
    } else {
      auto it = r->sparse.find(g.external_id);
      if (it != r->sparse.end()) links->activity_op[i] = it->second;
    }
  }
}

uint64_t ThreadKey(int32_t rank, int32_t pid, int32_t tid) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(rank)) << 48) ^
         (static_cast<uint64_t>(static_cast<uint32_t>(pid)) << 24) ^ static_cast<uint32_t>(tid);
}

// The launching runtime (or driver) call of each GPU activity not linked yet,
// by (rank, correlation id); -1 where the trace has none.
std::vector<int32_t> LaunchCalls(const Trace& trace, const OperatorLinks& links) {
  std::unordered_map<uint64_t, int32_t> by_correlation;
  for (size_t i = 0; i < trace.api.size(); ++i) {
    const ApiCall& a = trace.api[i];
    if (a.correlation < 0 || a.kind == ApiKind::kSync) continue;
    by_correlation.emplace(ThreadKey(a.rank, 0, 0) ^ static_cast<uint64_t>(a.correlation), static_cast<int32_t>(i));
  }
  std::vector<int32_t> call(trace.gpu.size(), -1);
  if (by_correlation.empty()) return call;
  for (size_t i = 0; i < trace.gpu.size(); ++i) {
    const GpuActivity& g = trace.gpu[i];
    if (links.activity_op[i] >= 0 || g.correlation < 0 || g.device_index >= trace.devices.size()) continue;
    const int32_t rank = trace.devices[g.device_index].rank;
    auto it = by_correlation.find(ThreadKey(rank, 0, 0) ^ static_cast<uint64_t>(g.correlation));
    if (it != by_correlation.end()) call[i] = it->second;
  }
  return call;
}

// Operators grouped by host thread, each thread's in (start, longer first)
// order, with the API calls to resolve on the same threads in start order.
struct ThreadOrder {
  std::vector<uint32_t> offset;      // thread t's operators: ops[offset[t], offset[t + 1])
  std::vector<uint32_t> ops;
  std::vector<uint32_t> call_offset;  // likewise for calls
  std::vector<uint32_t> calls;
};

ThreadOrder OrderByThread(const Trace& trace, const std::vector<int32_t>& launch_call) {
  std::unordered_map<uint64_t, uint32_t> thread_ids;
  std::vector<uint32_t> thread_of(trace.ops.size());
  std::vector<uint32_t> counts;
  for (size_t i = 0; i < trace.ops.size(); ++i) {
    const Operator& o = trace.ops[i];
    auto [it, fresh] = thread_ids.try_emplace(ThreadKey(o.rank, o.pid, o.tid), static_cast<uint32_t>(counts.size()));
    if (fresh) counts.push_back(0);
    thread_of[i] = it->second;
    ++counts[it->second];
  }
  ThreadOrder order;
  order.offset.assign(counts.size() + 1, 0);
  for (size_t t = 0; t < counts.size(); ++t) order.offset[t + 1] = order.offset[t] + counts[t];
  order.ops.resize(trace.ops.size());
  std::vector<uint32_t> fill(order.offset.begin(), order.offset.end() - 1);
  for (size_t i = 0; i < trace.ops.size(); ++i) order.ops[fill[thread_of[i]]++] = static_cast<uint32_t>(i);
  auto before = [&trace](uint32_t a, uint32_t b) {
    const Operator& x = trace.ops[a];
    const Operator& y = trace.ops[b];
    return x.start != y.start ? x.start < y.start : x.end > y.end;
  };
  for (size_t t = 0; t < counts.size(); ++t) {
    auto first = order.ops.begin() + order.offset[t];
    auto last = order.ops.begin() + order.offset[t + 1];
    if (!std::is_sorted(first, last, before)) std::sort(first, last, before);
  }
  // Calls that some activity needs, on threads that have operators.
  std::vector<std::pair<uint32_t, uint32_t>> calls;  // (thread, call)
  std::vector<bool> seen(trace.api.size(), false);
  for (int32_t c : launch_call) {
    if (c < 0 || seen[static_cast<size_t>(c)]) continue;
    seen[static_cast<size_t>(c)] = true;
    const ApiCall& a = trace.api[static_cast<size_t>(c)];
    auto it = thread_ids.find(ThreadKey(a.rank, a.pid, a.tid));
    if (it != thread_ids.end()) calls.emplace_back(it->second, static_cast<uint32_t>(c));
  }
  std::sort(calls.begin(), calls.end(), [&trace](const auto& x, const auto& y) {
    return x.first != y.first ? x.first < y.first : trace.api[x.second].start < trace.api[y.second].start;
  });
  order.call_offset.assign(counts.size() + 1, 0);
  for (const auto& c : calls) ++order.call_offset[c.first + 1];
  for (size_t t = 0; t < counts.size(); ++t) order.call_offset[t + 1] += order.call_offset[t];
  for (const auto& c : calls) order.calls.push_back(c.second);
  return order;
}

// One stack pass per thread: each operator's outermost and innermost
// enclosing operators, and each listed call's innermost enclosing operator
// (an operator starting with the call encloses it), in `call_op`.
void NestOperators(const Trace& trace, const ThreadOrder& order, OperatorLinks* links,
                   std::unordered_map<uint32_t, int32_t>* call_op) {
  std::vector<uint32_t> stack;
  for (size_t t = 0; t + 1 < order.offset.size(); ++t) {
    stack.clear();
    uint32_t c = order.call_offset[t];
    auto resolve_calls_before = [&](TimeNs limit, bool inclusive) {
      for (; c < order.call_offset[t + 1]; ++c) {
        const ApiCall& a = trace.api[order.calls[c]];
        if (inclusive ? a.start > limit : a.start >= limit) break;
        while (!stack.empty() && trace.ops[stack.back()].end <= a.start) stack.pop_back();
        if (!stack.empty()) call_op->emplace(order.calls[c], static_cast<int32_t>(stack.back()));
      }
    };
    for (uint32_t k = order.offset[t]; k < order.offset[t + 1]; ++k) {
      const uint32_t i = order.ops[k];
      const Operator& o = trace.ops[i];
      resolve_calls_before(o.start, false);
      while (!stack.empty() && trace.ops[stack.back()].end <= o.start) stack.pop_back();
      links->op_top[i] = static_cast<int32_t>(stack.empty() ? i : stack.front());
      links->op_parent[i] = stack.empty() ? -1 : static_cast<int32_t>(stack.back());
      stack.push_back(i);
    }
    resolve_calls_before(std::numeric_limits<TimeNs>::max(), true);
  }
}

}  // namespace

OperatorGpuTime::OperatorGpuTime(const Trace& trace)
    : trace_(trace), once_ns_(trace.ops.size(), 0.0) {}

int64_t OperatorGpuTime::Replay(int32_t op, const GpuActivity& g) const {
  return trace_.ops[static_cast<size_t>(op)].in_graph_capture ? g.correlation : -1;
}

void OperatorGpuTime::Add(int32_t op, const GpuActivity& g) {
  const double ns = static_cast<double>(g.end - g.start);
  const int64_t replay = Replay(op, g);
  if (replay < 0) {
    once_ns_[static_cast<size_t>(op)] += ns;
  } else {
    replay_ns_[{op, replay}] += ns;
  }
}

double OperatorGpuTime::Of(int32_t op, const GpuActivity& g) const {
  const int64_t replay = Replay(op, g);
  if (replay < 0) return once_ns_[static_cast<size_t>(op)];
  auto it = replay_ns_.find({op, replay});
  return it == replay_ns_.end() ? 0.0 : it->second;
}

OperatorLinks LinkOperators(const Trace& trace) {
  OperatorLinks links;
  links.activity_op.assign(trace.gpu.size(), -1);
  links.op_top.resize(trace.ops.size());
  links.op_parent.assign(trace.ops.size(), -1);
  LinkByExternalId(trace, RanksWithCorrelationAsExternalId(trace), &links);
  // What external ids left unlinked: through the launching call's correlation
  // to the innermost operator around that call on its thread.
  const std::vector<int32_t> launch_call = LaunchCalls(trace, links);
  const ThreadOrder order = OrderByThread(trace, launch_call);
  std::unordered_map<uint32_t, int32_t> call_op;
  NestOperators(trace, order, &links, &call_op);
  for (size_t i = 0; i < trace.gpu.size(); ++i) {
    if (launch_call[i] < 0) continue;
    auto it = call_op.find(static_cast<uint32_t>(launch_call[i]));
    if (it != call_op.end()) links.activity_op[i] = it->second;
  }
  return links;
}

StringId DisplayOperator(const Trace& trace, const OperatorLinks& links, size_t activity) {
  const int32_t op = links.activity_op[activity];
  if (op < 0) return 0;
  const Operator& o = trace.ops[static_cast<size_t>(op)];
  const int32_t parent = links.op_parent.empty() ? -1 : links.op_parent[static_cast<size_t>(op)];
  if (parent >= 0 && trace.strings.Get(o.name) == "record_param_comms") {
    return trace.ops[static_cast<size_t>(parent)].name;
  }
  return o.name;
}

Resource ClassifyKernelName(std::string_view n) {
  if (ContainsAny(n, {"nccl", "rccl", "all_reduce", "allreduce", "all_gather", "allgather",
                      "reduce_scatter", "multimem"})) {
    return Resource::kCommunication;
  }
  if (ContainsIgnoringCase(n, "memcpy")) return Resource::kCopy;
  // Memory-bound members of compute families first.
  if (ContainsAny(n, {"gemv", "splitkreduce", "splitk_reduce", "splitkv", "decode", "paged",
                      "flash_fwd_combine", "triton_poi", "triton_red", "triton_per",
                      "flash_bwd_dot_do_o", "flash_bwd_convert", "bn_fw", "bn_bw", "batch_norm",
                      "layer_norm", "softmax", "elementwise", "reduce_kernel"})) {
    return Resource::kMemory;
  }
  // Without shapes a GEMM kernel is taken as compute bound (shapes, when
  // linked, decide first: ResourceFromCost). nvjet_: cuBLAS's own Hopper and
  // Blackwell GEMMs; cijk_: rocBLAS/Tensile and hipBLASLt GEMMs on AMD parts.
  if (ContainsAny(n, {"gemm", "xmma", "cutlass", "cublas", "nvjet", "wgmma", "matmul", "hmma", "triton_mm",
                      "triton_tem", "flash", "fmha", "attention", "conv", "implicit", "winograd",
                      "fprop", "dgrad", "wgrad", "cudnn", "sm80_", "sm90_", "sm100_", "volta_",
                      "ampere_", "turing_", "cijk_"})) {
    return Resource::kCompute;
  }
  return Resource::kMemory;  // elementwise, reductions, norms, copies, unknown
}

const Operator* CostCache::Parent(const Operator& op) const {
  if (links_ == nullptr || trace_.ops.empty() || &op < trace_.ops.data() ||
      &op >= trace_.ops.data() + trace_.ops.size()) {
    return nullptr;
  }
  const int32_t parent = links_->op_parent[static_cast<size_t>(&op - trace_.ops.data())];
  return parent >= 0 ? &trace_.ops[static_cast<size_t>(parent)] : nullptr;
}

std::string_view CostCache::ConvolutionOutput(const Operator& op) {
  std::string key;
  if (!ConvolutionForwardInputs(trace_.strings.Get(op.name), trace_.strings.Get(op.input_shapes), &key)) {
    return {};
  }
  if (!conv_outputs_built_) {
    conv_outputs_built_ = true;
    std::string inputs, output;
    for (const Operator& o : trace_.ops) {
      if (ConvolutionOutputFromBackward(trace_.strings.Get(o.name), trace_.strings.Get(o.input_shapes),
                                        &inputs, &output)) {
        conv_outputs_.emplace(inputs, output);
      }
    }
  }
  auto it = conv_outputs_.find(key);
  return it != conv_outputs_.end() ? std::string_view(it->second) : std::string_view();
}

const OpCost& CostCache::Get(const Operator& op) {
  const Operator* parent = Parent(op);
  Key k{op.name, op.input_shapes, op.input_types, op.concrete_inputs,
        parent != nullptr ? parent->name : StringId{0}, parent != nullptr ? parent->input_shapes : StringId{0}};
  auto it = cache_.find(k);
  if (it != cache_.end()) return it->second;
  OpContext context;
  context.concrete_inputs = trace_.strings.Get(op.concrete_inputs);
  context.parent_name = trace_.strings.Get(k.parent_name);
  context.parent_shapes = trace_.strings.Get(k.parent_shapes);
  context.output_shape = ConvolutionOutput(op);
  OpCost c = EstimateOpCost(trace_.strings.Get(op.name), trace_.strings.Get(op.input_shapes),
                            trace_.strings.Get(op.input_types), context);
  return cache_.emplace(k, c).first->second;
}

Resource ResourceFromCost(const OpCost& c, const PeakRates& p, Resource fallback) {
  if (c.kind == OpKind::kCommunication) return Resource::kCommunication;
  if (!c.known() || p.bytes_per_s <= 0) return fallback;
  const double peak = p.Flops(c.precision);
  const double t_compute = peak > 0 ? c.flops / peak : 0;
  const double t_memory = c.bytes / p.bytes_per_s;
  return t_compute >= t_memory ? Resource::kCompute : Resource::kMemory;
}

namespace {

// What one GPU activity did: its class, and the work it is credited with.
struct ActivityWork {
  Resource resource = Resource::kMemory;
  const OpCost* cost = nullptr;  // its operator's, when linked
  double flops = 0;
  double bytes = 0;
};

// The per-operator aggregate while a device's activities are walked.
struct OperatorAgg {
  OperatorRoofline r;
  double by_resource[kResourceCount] = {};  // ns per class
  double peak_work[kResourceCount] = {};    // sum of duration x ActivityPeak per class
};

// Classifies one device's activities and sums them per class and per operator.
// Trace-wide state (cost cache, kernel-name classes, operators' GPU time) is
// shared across devices.
class DeviceClassifier {
 public:
  DeviceClassifier(const Trace& trace, const OperatorLinks& links, const BoundOptions& options)
      : trace_(trace),
        links_(links),
        options_(options),
        costs_(trace, &links),
        name_class_(trace.strings.size(), -1),
        op_gpu_time_(trace) {
    // GPU time of each operator's execution over its kernels, to share its cost among them.
    for (size_t i = 0; i < trace.gpu.size(); ++i) {
      const int32_t op = links.activity_op[i];
      const GpuActivity& g = trace.gpu[i];
      if (op >= 0 && g.kind == GpuKind::kKernel && g.end > g.start) op_gpu_time_.Add(op, g);
    }
  }

  // `dr` has its device, peaks and `order` set; fills the rest.
  void Classify(DeviceResources* dr) {
    dr->resource.resize(dr->order.size());
    std::unordered_map<uint64_t, size_t> agg_index;
    std::vector<OperatorAgg> aggs;
    StreamEnds stream_end;
    for (size_t k = 0; k < dr->order.size(); ++k) {
      const uint32_t i = dr->order[k];
      ActivityWork w = Work(i, dr);
      w.resource = LatencyOr(trace_.gpu[i], w.resource, &stream_end);
      dr->resource[k] = w.resource;
      AddToTotals(i, w, dr);
      AddToOperator(i, w, dr->peaks, &agg_index, &aggs);
    }
    FinishTotals(dr);
    FinishOperators(std::move(aggs), dr);
  }

 private:
  // The class from the activity's kind, its operator's cost, or its kernel
  // name; the work its operator's cost credits it with (kernels, in proportion
  // to their durations) or the bytes it recorded (copies and memsets).
  ActivityWork Work(uint32_t i, DeviceResources* dr) {
    const GpuActivity& g = trace_.gpu[i];
    ActivityWork w;
    if (g.kind != GpuKind::kKernel) {
      w.resource = g.kind == GpuKind::kMemcpy ? Resource::kCopy : Resource::kMemory;
      w.bytes = static_cast<double>(g.bytes);
      return w;
    }
    int8_t& cached = name_class_[g.name];  // the name rules, once per distinct name
    if (cached < 0) cached = static_cast<int8_t>(ClassifyKernelName(trace_.strings.Get(g.name)));
    const Resource by_name = static_cast<Resource>(cached);
    w.resource = by_name;
    const int32_t op = links_.activity_op[i];
    if (op < 0) return w;
    ++dr->linked_kernels;
    w.cost = &costs_.Get(trace_.ops[static_cast<size_t>(op)]);
    if (by_name != Resource::kCommunication) w.resource = ResourceFromCost(*w.cost, dr->peaks, by_name);
    if (!w.cost->known()) return w;
    ++dr->costed_kernels;
    const double share = static_cast<double>(g.end - g.start) / std::max(1.0, op_gpu_time_.Of(op, g));
    w.flops = w.cost->flops * share;
    w.bytes = w.cost->bytes * share;
    return w;
  }

  // Latency bound: a short kernel after an idle gap on its stream at least as
  // long as itself.
  Resource LatencyOr(const GpuActivity& g, Resource r, StreamEnds* stream_end) const {
    const TimeNs dur = g.end - g.start;
    TimeNs* prev_end = stream_end->Find(g.stream);
    const bool latency = g.kind == GpuKind::kKernel && r != Resource::kCommunication &&
                         dur < static_cast<TimeNs>(options_.latency_kernel_us * 1000.0) && *prev_end >= 0 &&
                         g.start - *prev_end >= dur;
    *prev_end = std::max(*prev_end, g.end);
    return latency ? Resource::kLatency : r;
  }

  static Precision PrecisionOf(const ActivityWork& w) {
    return w.cost != nullptr ? w.cost->precision : Precision::kUnknown;
  }

  void AddToTotals(uint32_t i, const ActivityWork& w, DeviceResources* dr) const {
    const GpuActivity& g = trace_.gpu[i];
    const double dur_us = static_cast<double>(g.end - g.start) / 1000.0;
    ResourceTotals& t = dr->totals[static_cast<int>(w.resource)];
    ++t.count;
    t.time_us += dur_us;
    t.flops += w.flops;
    t.bytes += w.bytes;
    if (w.flops > 0 || w.bytes > 0) {
      t.costed_time_us += dur_us;
      t.peak_work += dur_us * 1e-6 * ActivityPeak(w.resource, trace_, g, PrecisionOf(w), dr->peaks);
    }
  }

  // Per operator name; kernels without an operator under their own name.
  void AddToOperator(uint32_t i, const ActivityWork& w, const PeakRates& peaks,
                     std::unordered_map<uint64_t, size_t>* agg_index, std::vector<OperatorAgg>* aggs) const {
    const GpuActivity& g = trace_.gpu[i];
    const bool named_by_op = links_.activity_op[i] >= 0;
    const StringId name = named_by_op ? DisplayOperator(trace_, links_, i) : g.name;
    const uint64_t key = (static_cast<uint64_t>(named_by_op) << 32) | name;
    auto [it, fresh] = agg_index->try_emplace(key, aggs->size());
    if (fresh) {
      aggs->emplace_back();
      aggs->back().r.from_kernel_name = !named_by_op;
      aggs->back().r.name = std::string(trace_.strings.Get(name));
    }
    OperatorAgg& a = (*aggs)[it->second];
    const double dur = static_cast<double>(g.end - g.start);
    ++a.r.kernels;
    a.r.gpu_us += dur / 1000.0;
    a.r.flops += w.flops;
    a.r.bytes += w.bytes;
    a.by_resource[static_cast<int>(w.resource)] += dur;
    for (int c = 0; c < kResourceCount; ++c) {
      a.peak_work[c] += dur * 1e-9 * ActivityPeak(static_cast<Resource>(c), trace_, g, PrecisionOf(w), peaks);
    }
    if (w.cost != nullptr && a.r.kind == OpKind::kUnknown) a.r.kind = w.cost->kind;
  }

  static void FinishTotals(DeviceResources* dr) {
    for (int c = 0; c < kResourceCount; ++c) {
      ResourceTotals& t = dr->totals[c];
      if (t.costed_time_us <= 0) continue;
      const double s = t.costed_time_us * 1e-6;
      t.achieved_tflops = t.flops / s / 1e12;
      t.achieved_gbps = t.bytes / s / 1e9;
      const double rate = c == static_cast<int>(Resource::kCompute) ? t.flops : t.bytes;
      t.pct_of_peak = t.peak_work > 0 ? 100.0 * rate / t.peak_work : 0;
    }
  }

  // The top operators by GPU time, each in the class holding most of its time
  // and rated against that class's peaks over all its time.
  void FinishOperators(std::vector<OperatorAgg> aggs, DeviceResources* dr) const {
    std::sort(aggs.begin(), aggs.end(), [](const OperatorAgg& a, const OperatorAgg& b) {
      return a.r.gpu_us != b.r.gpu_us ? a.r.gpu_us > b.r.gpu_us : a.r.name < b.r.name;
    });
    if (aggs.size() > options_.top_operators) aggs.resize(options_.top_operators);
    for (OperatorAgg& a : aggs) {
      int best = 0;
      for (int c = 1; c < kResourceCount; ++c) {
        if (a.by_resource[c] > a.by_resource[best]) best = c;
      }
      a.r.resource = static_cast<Resource>(best);
      const double s = a.r.gpu_us * 1e-6;
      if (s > 0) {
        a.r.achieved_tflops = a.r.flops / s / 1e12;
        a.r.achieved_gbps = a.r.bytes / s / 1e9;
        const double rate = a.r.resource == Resource::kCompute ? a.r.flops : a.r.bytes;
        a.r.pct_of_peak = a.peak_work[best] > 0 ? 100.0 * rate / a.peak_work[best] : 0;
      }
      a.r.intensity = a.r.bytes > 0 ? a.r.flops / a.r.bytes : 0;
      dr->operators.push_back(std::move(a.r));
    }
  }

  const Trace& trace_;
  const OperatorLinks& links_;
  const BoundOptions& options_;
  CostCache costs_;
  std::vector<int8_t> name_class_;  // ClassifyKernelName per name id, -1 until asked
  OperatorGpuTime op_gpu_time_;
};

}  // namespace

std::vector<DeviceResources> ClassifyResources(const Trace& trace, const OperatorLinks& links,
                                               const BoundOptions& options) {
  const size_t n_devices = trace.devices.size();
  std::vector<std::vector<uint32_t>> per_device(n_devices);
  for (size_t i = 0; i < trace.gpu.size(); ++i) {
    const GpuActivity& g = trace.gpu[i];
    if (g.end > g.start && g.device_index < n_devices) {
      per_device[g.device_index].push_back(static_cast<uint32_t>(i));
    }
  }
  DeviceClassifier classifier(trace, links, options);
  std::vector<DeviceResources> out;
  for (uint32_t d = 0; d < n_devices; ++d) {
    if (per_device[d].empty()) continue;
    DeviceResources dr;
    dr.device_index = d;
    dr.peaks = PeakRatesFor(trace.devices[d]);
    dr.order = std::move(per_device[d]);
    auto by_start = [&trace](uint32_t a, uint32_t b) { return trace.gpu[a].start < trace.gpu[b].start; };
    if (!std::is_sorted(dr.order.begin(), dr.order.end(), by_start)) {
      std::stable_sort(dr.order.begin(), dr.order.end(), by_start);
    }
    classifier.Classify(&dr);
    out.push_back(std::move(dr));
  }
  return out;
}

}  // namespace dynaflow
