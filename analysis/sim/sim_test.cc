#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <optional>
#include <vector>

#include "analysis/roofline/device_table.h"
#include "analysis/sim/candidates.h"
#include "analysis/sim/physical_bound.h"
#include "analysis/sim/region_split.h"
#include "analysis/sim/simulator.h"
#include "runtime/schedule.h"
#include "analysis/sim/synthetic_trace.h"

namespace dynaflow {
namespace {

SimNode Node(Resource r, double work, double hbm = 0.3) {
  SimNode n;
  n.resource = r;
  n.work_us = work;
  n.hbm = hbm;
  return n;
}

TEST(SimulatorTest, ChainsGroupsAndTheHost) {
  SimParams p;
  // A chain runs back to back; delays add.
  Schedule chain;
  chain.Add(Node(Resource::kCompute, 100), {});
  SimNode second = Node(Resource::kMemory, 50, 0.9);
  second.delay_us = 5;
  chain.Add(second, {0});
  chain.tail_us = 10;
  SimResult r = Simulate(chain, p);
  ASSERT_TRUE(r.ok);
  EXPECT_DOUBLE_EQ(r.end_us[0], 100);
  EXPECT_DOUBLE_EQ(r.start_us[1], 105);
  EXPECT_DOUBLE_EQ(r.makespan_us, 165);

  // An exclusive group serialises independent nodes, lower priority first.
  Schedule group;
  group.groups = 1;
  SimNode a = Node(Resource::kCompute, 100);
  a.group = 0;
  a.priority = 1;
  SimNode b = a;
  b.priority = 0;
  group.Add(a, {});
  group.Add(b, {});
  r = Simulate(group, p);
  EXPECT_DOUBLE_EQ(r.start_us[1], 0);
  EXPECT_DOUBLE_EQ(r.start_us[0], 100);
  EXPECT_DOUBLE_EQ(r.makespan_us, 200);

  // The host issues node 1 only after node 0 finished (a blocking call), plus
  // 20 us of host time and 5 us of launch latency.
  Schedule host;
  SimNode h0 = Node(Resource::kCompute, 100);
  h0.host_delta_us = 0;
  SimNode h1 = Node(Resource::kCompute, 10);
  h1.host_delta_us = 3;
  h1.post_sync_us = 20;
  h1.launch_latency_us = 5;
  host.Add(h0, {});
  host.Add(h1, {});
  host.host_order = {0, 1};
  r = Simulate(host, p);
  EXPECT_DOUBLE_EQ(r.start_us[1], 125);

  // A blocking call that waited for one node: issued when that node ends,
  // whatever else still runs.
  Schedule waits;
  SimNode w0 = Node(Resource::kCompute, 100);
  SimNode w1 = Node(Resource::kCopy, 400);  // still running when the call returns
  SimNode w2 = Node(Resource::kCompute, 10);
  w2.host_delta_us = 1;
  w2.post_sync_us = 4;
  w2.sync_node = 0;
  waits.Add(w0, {});
  waits.Add(w1, {});
  waits.Add(w2, {});
  waits.host_order = {0, 1, 2};
  r = Simulate(waits, p);
  EXPECT_NEAR(r.start_us[2], r.end_us[0] + 4, 1e-9);
  EXPECT_LT(r.start_us[2], r.end_us[1]);

  // A cycle cannot finish.
  Schedule cycle;
  cycle.Add(Node(Resource::kCompute, 1), {1});
  cycle.Add(Node(Resource::kCompute, 1), {0});
  EXPECT_FALSE(Simulate(cycle, p).ok);
}

TEST(SimulatorTest, SharingFollowsTheDocumentedModel) {
  SimParams p;
  // GEMM (hbm 0.3) beside decode attention (hbm 0.9), equal work of 100 us.
  // SMs: attention takes sm_memory = 0.4, the GEMM the other 0.6.
  // HBM: 0.6*0.3 + 1.0*0.9 = 1.08 > 1, both slow by 1/1.08.
  // Interference: one co-runner, 1/1.05.
  Schedule s;
  s.Add(Node(Resource::kCompute, 100, 0.3), {});
  s.Add(Node(Resource::kMemory, 100, 0.9), {});
  const SimResult r = Simulate(s, p);
  const double v_gemm = 0.6 / 1.08 / 1.05;
  const double v_attn = 1.0 / 1.08 / 1.05;
  const double t_attn = 100 / v_attn;
  EXPECT_NEAR(r.end_us[1], t_attn, 1e-6);
  const double gemm_left = 100 - v_gemm * t_attn;
  EXPECT_NEAR(r.end_us[0], t_attn + gemm_left, 1e-6);
  // Calibration: DynaFlow reports overlap gains up to 1.29x over whole steps;
  // this best case pair (equal, perfectly complementary work) may exceed that
  // but not the 2x of free overlap.
  const double pair_speedup = 200 / r.makespan_us;
  EXPECT_GT(pair_speedup, 1.15);
  EXPECT_LT(pair_speedup, 1.5);

  // Two collectives share the link; two GEMMs gain nothing from co-running.
  Schedule two;
  two.Add(Node(Resource::kCompute, 100), {});
  two.Add(Node(Resource::kCompute, 100), {});
  EXPECT_GT(Simulate(two, p).makespan_us, 200);
}

// Issue 10, item 1: a kernel's SM footprint from its launch configuration.
// Two GEMMs whose grids each take 30% of the SMs run side by side at full
// speed; of two that each fill the device, the one started first holds it
// (the block scheduler's order, as measured on an H200); the bound counts
// SM-time.
TEST(SimulatorTest, SmallGridsRunSideBySideFullGridsShare) {
  SimParams p;
  auto gemm = [](double sm) {
    SimNode n = Node(Resource::kCompute, 100, 0.1);
    n.sm = sm;
    return n;
  };
  Schedule small;
  small.Add(gemm(0.3), {});
  small.Add(gemm(0.3), {});
  const SimResult s = Simulate(small, p);
  // No SM slowdown; one co-runner's interference: 100 * 1.05.
  EXPECT_NEAR(s.makespan_us, 105, 1e-6);
  EXPECT_NEAR(BoundOf(small).bound_us, 60, 1e-9);  // 2 x 100 us x 0.3 of the SMs
  EXPECT_GE(s.makespan_us, BoundOf(small).bound_us);

  // The first runs at 1 / 1.05 beside the second, which waits: 105 + 100.
  Schedule full;
  full.Add(gemm(1.0), {});
  full.Add(gemm(1.0), {});
  const SimResult f = Simulate(full, p);
  EXPECT_NEAR(f.end_us[0], 105, 1e-3);
  EXPECT_NEAR(f.makespan_us, 205, 1e-3);
  EXPECT_NEAR(BoundOf(full).bound_us, 200, 1e-9);

  // 0.7 + 0.7 exceed the device: the first keeps its 0.7 (full speed), the
  // second runs on the 0.3 left, at 0.3 / 0.7, until the first ends at 105.
  Schedule over;
  over.Add(gemm(0.7), {});
  over.Add(gemm(0.7), {});
  const SimResult o = Simulate(over, p);
  EXPECT_NEAR(o.end_us[0], 105, 1e-6);
  EXPECT_NEAR(o.makespan_us, 105 + (100 - 0.3 / 0.7 * 100), 1e-6);
  EXPECT_GE(o.makespan_us, BoundOf(over).bound_us);

  // A memory kernel filling the device, started first, holds it: a GEMM
  // launched beside it waits (an 8192^3 GEMM and a 2 GiB add on an H200 gained
  // 1.1% side by side, overlap_micro.py).
  Schedule memory_first;
  SimNode add = Node(Resource::kMemory, 100, 0.9);
  add.sm = 1.0;
  memory_first.Add(add, {});
  memory_first.Add(gemm(1.0), {});
  EXPECT_NEAR(Simulate(memory_first, p).makespan_us, 205, 1e-3);
  // With the footprints unknown, the class model shares the SMs instead.
  Schedule memory_unknown;
  memory_unknown.Add(Node(Resource::kMemory, 100, 0.9), {});
  memory_unknown.Add(Node(Resource::kCompute, 100, 0.1), {});
  EXPECT_LT(Simulate(memory_unknown, p).makespan_us, 190);

  // A communication kernel on 16 of 132 SMs beside a small GEMM: both fit.
  Schedule comm;
  SimNode nccl = Node(Resource::kCommunication, 100, 0.1);
  nccl.sm = 16.0 / 132;
  comm.Add(nccl, {});
  comm.Add(gemm(0.5), {});
  EXPECT_NEAR(Simulate(comm, p).makespan_us, 105, 1e-6);

  // Unknown footprints keep the class defaults: a GEMM beside a collective
  // runs on what the collective leaves (sm_comm) until the collective ends
  // (at 105 us), then alone.
  Schedule unknown;
  unknown.Add(Node(Resource::kCommunication, 100, 0.1), {});
  unknown.Add(Node(Resource::kCompute, 100, 0.1), {});
  const SimResult u = Simulate(unknown, p);
  EXPECT_NEAR(u.end_us[0], 105, 1e-6);
  EXPECT_NEAR(u.end_us[1], 105 + (100 - 105 * (1 - p.sm_comm) / 1.05), 1e-6);
}

// Issue 10: kernels of one bound resource side by side share it.
TEST(SimulatorTest, OneClassSharesItsResource) {
  SimParams p;
  // Two memory-bound kernels that each fill the device (hbm 0.9 alone): the
  // memory class runs at speed 1 in all, 1/2 each; HBM 2 * 0.5 * 0.9 = 0.9
  // fits; one co-runner costs 1/1.05. Both end at 100 / (0.5 / 1.05) = 210 us:
  // no gain over the 200 us back to back.
  Schedule mem;
  mem.Add(Node(Resource::kMemory, 100, 0.9), {});
  mem.Add(Node(Resource::kMemory, 100, 0.9), {});
  const SimResult m = Simulate(mem, p);
  EXPECT_NEAR(m.end_us[0], 210, 1e-6);
  EXPECT_NEAR(m.makespan_us, 210, 1e-6);
  EXPECT_DOUBLE_EQ(BoundOf(mem).bound_us, 200);
  EXPECT_EQ(BoundOf(mem).binding, Resource::kMemory);
  // Also when the bytes showed a low fraction (the floor, hbm_memory_min): the
  // class is shared whatever the fractions.
  Schedule low;
  low.Add(Node(Resource::kMemory, 100, 0.45), {});
  low.Add(Node(Resource::kMemory, 100, 0.45), {});
  EXPECT_NEAR(Simulate(low, p).makespan_us, 210, 1e-6);

  // A GEMM (200 us, hbm 0.3) beside two memory kernels (100 us each, hbm 0.9)
  // may gain up to the bound max(200, 200) = 200 us, from 400 us back to back.
  // While all three run: SMs 0.4 to the memory class (0.2 each), 0.6 to the
  // GEMM; HBM 0.6 * 0.3 + 2 * 0.5 * 0.9 = 1.08 > 1; two co-runners: 1/1.1.
  // The memory kernels end at 100 / (0.5 / 1.08 / 1.1) = 237.6 us, the GEMM
  // has done 0.6 / 0.5 * 100 = 120 us of its work and runs the last 80 alone.
  Schedule mix;
  mix.Add(Node(Resource::kCompute, 200, 0.3), {});
  mix.Add(Node(Resource::kMemory, 100, 0.9), {});
  mix.Add(Node(Resource::kMemory, 100, 0.9), {});
  const SimResult x = Simulate(mix, p);
  const double t_mem = 100 / (0.5 / 1.08 / 1.1);
  EXPECT_NEAR(x.end_us[1], t_mem, 1e-6);
  EXPECT_NEAR(x.end_us[0], t_mem + (200 - 0.6 / 0.5 * 100), 1e-6);
  EXPECT_DOUBLE_EQ(BoundOf(mix).bound_us, 200);
  EXPECT_GE(x.makespan_us, BoundOf(mix).bound_us);
  EXPECT_LT(400 / x.makespan_us, 400 / BoundOf(mix).bound_us);  // 1.26x of at most 2x

  // Copies: kCopyEngines run side by side at full speed, a third shares them;
  // latency-bound kernels bound nothing.
  Schedule copies;
  for (int i = 0; i < 3; ++i) copies.Add(Node(Resource::kCopy, 100, 0), {});
  copies.Add(Node(Resource::kLatency, 50, 0), {});
  const PhysicalBound cb = BoundOf(copies);
  EXPECT_DOUBLE_EQ(cb.class_work_us[static_cast<int>(Resource::kCopy)], 300);
  EXPECT_DOUBLE_EQ(cb.class_work_us[static_cast<int>(Resource::kLatency)], 50);
  EXPECT_DOUBLE_EQ(cb.bound_us, 150);
  EXPECT_EQ(cb.binding, Resource::kCopy);
  EXPECT_GE(Simulate(copies, p).makespan_us, cb.bound_us);
}

// Splits cost their extra weight reads in the nodes' work, so the bound of a
// split schedule grows with them: four nano-batches of a weight-bound GEMV
// bound the step at four weight reads, not one.
TEST(SimulatorTest, BoundCountsTheSplitsWeightReads) {
  SimParams p;
  const PeakRates h200 = PeakRatesFor(DeviceInfo{0, 0, "NVIDIA H200"});
  SimTask gemv;
  gemv.resource = Resource::kMemory;
  gemv.dur_us = 40;
  gemv.flops = 2.0 * 8 * 8192 * 8192;
  gemv.weight_bytes = 2.0 * 8192 * 8192;
  gemv.bytes = gemv.weight_bytes + 2.0 * 2 * 8 * 8192;
  const double quarter = PartDuration(gemv, 0.25, h200, p);
  EXPECT_GT(4 * quarter, 0.99 * 4 * (gemv.dur_us - p.kernel_fixed_us));  // each part reads all weights
  Schedule split;
  for (int c = 0; c < 4; ++c) split.Add(Node(Resource::kMemory, quarter, 0.9), {});
  EXPECT_NEAR(BoundOf(split).bound_us, 4 * quarter, 1e-9);
  EXPECT_GE(Simulate(split, p).makespan_us, 4 * quarter);
}

TEST(ModelTest, SplitCosts) {
  SimParams p;
  const PeakRates h200 = PeakRatesFor(DeviceInfo{0, 0, "NVIDIA H200"});
  // A compute-bound GEMM of 2048 rows: half the batch costs half the work
  // divided by the efficiency ratio e(1024)/e(2048), plus the fixed 2 us.
  SimTask gemm;
  gemm.resource = Resource::kCompute;
  gemm.dur_us = 200;
  gemm.flops = 2.0 * 2048 * 8192 * 8192;
  gemm.weight_bytes = 2.0 * 8192 * 8192;
  gemm.bytes = gemm.weight_bytes + 2.0 * 2 * 2048 * 8192;
  gemm.rows = 2048;
  auto e = [&p](double m) { return m / (m + p.gemm_half_rows); };
  EXPECT_NEAR(PartDuration(gemm, 0.5, h200, p), 2 + 198 * 0.5 * e(2048) / e(1024), 1e-9);
  EXPECT_DOUBLE_EQ(PartDuration(gemm, 1.0, h200, p), 200);
  // A decode GEMM is bound by its weight read: a half batch costs nearly all
  // of it (the extra weight read per micro-batch).
  SimTask gemv = gemm;
  gemv.resource = Resource::kMemory;
  gemv.rows = 8;
  gemv.flops = 2.0 * 8 * 8192 * 8192;
  gemv.bytes = gemv.weight_bytes + 2.0 * 2 * 8 * 8192;
  gemv.dur_us = 35;
  EXPECT_GT(PartDuration(gemv, 0.5, h200, p), 0.99 * 35);
  // A collective keeps its latency.
  SimTask ar;
  ar.resource = Resource::kCommunication;
  ar.dur_us = 108;
  EXPECT_DOUBLE_EQ(PartDuration(ar, 0.5, h200, p), 8 + 100 * 0.5);
  // Per-step work does not scale.
  SimTask adam;
  adam.resource = Resource::kMemory;
  adam.dur_us = 500;
  adam.token_scaled = false;
  EXPECT_DOUBLE_EQ(PartDuration(adam, 0.25, h200, p), 500);
}

// A split part's footprint: a grid that tiles its rows shrinks with them; a
// persistent grid (one block per SM of an H200, as its nvjet GEMMs of a
// 4096-token prefill launch) keeps every SM, and a kernel beside it waits.
TEST(ModelTest, APersistentGridKeepsItsFootprintWhenSplit) {
  SimTask tiled;
  tiled.resource = Resource::kCompute;
  tiled.grid_waves = 0.8;
  EXPECT_FALSE(PersistentGrid(tiled));
  EXPECT_DOUBLE_EQ(SmNeed(tiled, 0.5), 0.4);
  tiled.grid_waves = 3.0;
  EXPECT_DOUBLE_EQ(SmNeed(tiled, 0.25), 0.75);
  SimTask persistent = tiled;
  persistent.grid_waves = 1.0;
  EXPECT_TRUE(PersistentGrid(persistent));
  EXPECT_DOUBLE_EQ(SmNeed(persistent, 0.5), 1.0);
  SimTask unknown;
  EXPECT_FALSE(PersistentGrid(unknown));
  EXPECT_DOUBLE_EQ(SmNeed(unknown, 0.5), 0.0);
}

// NanoFlow's measurement: splitting into nano-batches without overlapping
// costs ~13% (LLaMA-2-70B, 8 x A100, dense batch of 2048 tokens). One layer
// of that setup: tensor-parallel GEMMs (8192 hidden, 1280 QKV, 7168 gate-up,
// 3584 down per GPU), decode attention over a 1024-token context, two
// all-reduces; split four ways and run back to back.
TEST(ModelTest, CalibratedToNanoFlowsSplitOverhead) {
  SimParams p;
  const PeakRates a100 = PeakRatesFor(DeviceInfo{0, 0, "NVIDIA A100-SXM4-80GB"});
  const double peak = a100.flops_half, bw = a100.bytes_per_s;
  std::vector<SimTask> layer;
  auto gemm = [&](double n, double k) {
    SimTask t;
    t.resource = Resource::kCompute;
    t.rows = 2048;
    t.flops = 2.0 * 2048 * n * k;
    t.weight_bytes = 2.0 * n * k;
    t.bytes = t.weight_bytes + 2.0 * 2048 * (n + k);
    t.dur_us = t.flops / (peak * 0.75) * 1e6;  // measured at 75% of peak
    layer.push_back(t);
  };
  auto memory = [&](double bytes) {
    SimTask t;
    t.resource = Resource::kMemory;
    t.bytes = bytes;
    t.dur_us = bytes / (bw * 0.9) * 1e6 + 2;
    layer.push_back(t);
  };
  auto allreduce = [&]() {
    SimTask t;
    t.resource = Resource::kCommunication;
    t.dur_us = 2048.0 * 8192 * 2 * 2 * 7 / 8 / 240e9 * 1e6 + 8;  // ring, 240 GB/s bus
    layer.push_back(t);
  };
  memory(2.0 * 2048 * 8192 * 2);  // RMSNorm
  gemm(1280, 8192);                // QKV
  memory(2048.0 * 1024 * 256 * 2);  // decode attention over the KV cache
  gemm(8192, 1024);                // O
  allreduce();
  memory(3.0 * 2048 * 8192 * 2);  // residual add + RMSNorm
  gemm(7168, 8192);                // gate-up
  memory(3.0 * 2048 * 3584 * 2);  // SiLU * up
  gemm(8192, 3584);                // down
  allreduce();
  double whole = 0, split = 0;
  for (const SimTask& t : layer) {
    whole += t.dur_us;
    split += 4 * PartDuration(t, 0.25, a100, p);
  }
  const double overhead = split / whole - 1;
  // 13% +- 5 points: the figure is one measurement of one setup.
  EXPECT_GT(overhead, 0.08) << overhead;
  EXPECT_LT(overhead, 0.18) << overhead;
}

struct Built {
  Trace trace;
  OperatorLinks links;
  std::vector<DeviceResources> res;
  DeviceSteps steps;
  StepGraph graph;
};

Built Build(Trace t) {
  Built b;
  b.trace = std::move(t);
  b.links = LinkOperators(b.trace);
  b.res = ClassifyResources(b.trace, b.links, BoundOptions{});
  b.steps = FindSteps(b.trace, b.res.at(0));
  CostCache costs(b.trace);
  b.graph = BuildStepGraph(b.trace, b.links, b.res[0], b.steps, b.steps.representative, &costs,
                           GraphOptions{});
  return b;
}

TEST(StepGraphTest, ReplayReproducesTheMeasuredStep) {
  for (int batch : {8, 512}) {
    Built b = Build(testing::LlamaDecode(batch, 1024));
    CandidateContext ctx;
    ctx.trace = &b.trace;
    ctx.graph = &b.graph;
    ctx.peaks = b.res[0].peaks;
    const SimResult r = Simulate(MakeSequential(ctx)->schedule, ctx.params);
    ASSERT_TRUE(r.ok);
    // No kernels overlap in these traces, so the replay is exact up to the
    // nanosecond rounding of the trace; the step ends when the host issues
    // the next step's first kernel (launch plus latency), which the synthetic
    // GPU starts 1 us after its stream frees: the replay, which reads neither
    // that gap nor the measured step time, ends the step up to 1 us early.
    EXPECT_LE(r.makespan_us, b.graph.measured_us + 0.01) << batch;
    EXPECT_GE(r.makespan_us, b.graph.measured_us - 1.01) << batch;
    EXPECT_TRUE(b.graph.end_known);
    EXPECT_DOUBLE_EQ(b.graph.tail_us, 0);
    for (size_t i = 0; i < b.graph.tasks.size(); ++i) {
      ASSERT_NEAR(r.start_us[i], b.graph.tasks[i].start_us, 0.01) << batch << " task " << i;
    }
  }
}

TEST(StepGraphTest, FindsWaitsTokensAndDeferrableCollectives) {
  Built b = Build(testing::DdpSerializedAllReduce(8, 150));
  const StepGraph& g = b.graph;
  ASSERT_EQ(g.tasks.size(), 16u);
  EXPECT_DOUBLE_EQ(g.tokens, 4096);
  EXPECT_EQ(g.lane_streams.size(), 2u);
  for (size_t t = 0; t < g.tasks.size(); ++t) {
    const SimTask& s = g.tasks[t];
    if (t % 2 == 1) {
      EXPECT_EQ(s.resource, Resource::kCommunication);
      EXPECT_TRUE(s.deferrable);
      EXPECT_FALSE(s.token_scaled);  // gradient-sized, once per step
      // Waits on the GEMM before it (cross-stream).
      EXPECT_NE(std::find(g.deps.begin() + g.dep_begin[t], g.deps.begin() + g.dep_begin[t + 1],
                          static_cast<int32_t>(t - 1)),
                g.deps.begin() + g.dep_begin[t + 1]);
    } else {
      EXPECT_EQ(s.resource, Resource::kCompute);
      if (t > 0) {  // ... and the next GEMM waits on it.
        EXPECT_NE(std::find(g.deps.begin() + g.dep_begin[t], g.deps.begin() + g.dep_begin[t + 1],
                            static_cast<int32_t>(t - 1)),
                  g.deps.begin() + g.dep_begin[t + 1]);
      }
    }
  }
}

// A raw trace for host-side cases: one H200, kernels and calls placed by hand
// (microseconds).
struct HandTrace {
  Trace t;
  HandTrace() {
    t.devices.push_back(DeviceInfo{});
    t.devices[0].name = "NVIDIA H200";
  }
  void Kernel(int64_t corr, double start, double end, int32_t stream) {
    GpuActivity g;
    g.start = static_cast<TimeNs>(start * 1000);
    g.end = static_cast<TimeNs>(end * 1000);
    g.correlation = corr;
    g.stream = stream;
    g.name = t.strings.Intern("elementwise_kernel_" + std::to_string(corr));
    t.gpu.push_back(g);
  }
  void Call(int64_t corr, double start, double end, int32_t tid, const char* name,
            int32_t pid = 100) {
    ApiCall c;
    c.start = static_cast<TimeNs>(start * 1000);
    c.end = static_cast<TimeNs>(end * 1000);
    c.correlation = corr;
    c.pid = pid;
    c.tid = tid;
    c.name = t.strings.Intern(name);
    t.api.push_back(c);
  }
};

// Three threads launch on one device. Thread 1 blocks in a synchronize until
// kernel 1 ends; thread 2 launches kernel 4 just after thread 1's next launch,
// and kernel 4 ends within the sync's tolerance of the call's return. The host
// waits for kernel 1 (issued before), never for kernel 4 (issued after: the
// replay would wait forever and the report say "no step to simulate").
// Thread 3 launches kernel 5 before the sync, and in the second case another
// kernel while thread 1 blocks: the sync still belongs to thread 1's launch.
TEST(StepGraphTest, ThreeLaunchingThreadsReplayToTheEnd) {
  for (bool launch_during_sync : {false, true}) {
    SCOPED_TRACE(launch_during_sync);
    HandTrace h;
    h.Call(1, 0, 1, 1, "cudaLaunchKernel");
    h.Kernel(1, 10, 110, 7);
    h.Call(5, 2, 3, 3, "cudaLaunchKernel");
    h.Kernel(5, 4, 8, 9);
    h.Call(-1, 5, 111, 1, "cudaStreamSynchronize");
    if (launch_during_sync) {
      h.Call(6, 50, 54, 3, "cudaLaunchKernel");
      h.Kernel(6, 60, 70, 9);
    }
    h.Call(3, 111.2, 115, 1, "cudaLaunchKernel");
    h.Kernel(3, 120, 130, 7);
    h.Call(4, 111.3, 111.6, 2, "cudaLaunchKernel");
    h.Kernel(4, 111.8, 112.5, 8);
    std::sort(h.t.gpu.begin(), h.t.gpu.end(),
              [](const GpuActivity& a, const GpuActivity& b) { return a.start < b.start; });
    Built b = Build(std::move(h.t));
    const StepGraph& g = b.graph;
    const size_t n = launch_during_sync ? 5 : 4;
    ASSERT_EQ(g.tasks.size(), n);
    ASSERT_EQ(g.host_order.size(), n);
    // By start: kernel 5, kernel 1, [kernel 6,] kernel 4, kernel 3.
    const size_t k1 = 1, k3 = n - 1;
    EXPECT_EQ(g.tasks[k3].sync_task, static_cast<int32_t>(k1));
    EXPECT_NEAR(g.tasks[k3].post_sync_us, 1.2, 1e-9);  // from kernel 1's end
    CandidateContext ctx;
    ctx.trace = &b.trace;
    ctx.graph = &g;
    ctx.peaks = b.res[0].peaks;
    const SimResult r = Simulate(MakeSequential(ctx)->schedule, ctx.params);
    ASSERT_TRUE(r.ok) << r.stall;
    // Kernel 3 is issued when kernel 1 ends (stretched by the sharing model
    // where kernel 6 co-runs), 1.2 us of host time later, plus its latency.
    EXPECT_NEAR(r.start_us[k3], r.end_us[k1] + 1.2 + 8.8, 1e-6);
    // Without co-running kernels the replay is the measured step.
    if (!launch_during_sync) EXPECT_NEAR(r.makespan_us, g.measured_us, 1e-6);
  }
}

// A synchronous copy waits for its own copy; the host then works 2 ms (a
// long cudaMalloc among it, itself a "blocking" call that waited on nothing)
// before the next launch. The host resumes when the copy ends, and the 2 ms
// (plus the 5 us the call took to return) stay host time: they were lost
// when the wait was taken to end with the last blocking call (pipit's saxpy
// replayed 66% short), and the rest of a blocking call after the task it
// waited for (AlexNet's 560 ms cudaMalloc: 29% short).
// The first launch call takes 5 ms (lazy module loading): its kernel starts
// at the call's return, host-explained, not GPU-side delay.
TEST(StepGraphTest, HostTimeAfterASyncAndLongLaunchCalls) {
  HandTrace h;
  h.Call(1, 0, 5000, 1, "cudaLaunchKernel");
  h.Kernel(1, 5004, 5010, 7);
  h.Call(2, 5020, 5200, 1, "cudaMemcpy");
  h.Kernel(2, 5030, 5195, 7);
  h.Call(-1, 5300, 5800, 1, "cudaMalloc");
  h.Call(3, 7200, 7205, 1, "cudaLaunchKernel");
  h.Kernel(3, 7210, 7300, 7);
  Built b = Build(std::move(h.t));
  const StepGraph& g = b.graph;
  ASSERT_EQ(g.tasks.size(), 3u);
  EXPECT_NEAR(g.tasks[0].launch_latency_us, 5004, 1e-9);
  EXPECT_DOUBLE_EQ(g.tasks[0].delay_us, 0);
  EXPECT_EQ(g.tasks[2].sync_task, 1);
  EXPECT_NEAR(g.tasks[2].post_sync_us, 2005, 1e-9);
  CandidateContext ctx;
  ctx.trace = &b.trace;
  ctx.graph = &g;
  ctx.peaks = b.res[0].peaks;
  const SimResult r = Simulate(MakeSequential(ctx)->schedule, ctx.params);
  ASSERT_TRUE(r.ok) << r.stall;
  // The copy ends at 191 us of the step, then 2005 us of host time and 10 us
  // of launch latency.
  EXPECT_NEAR(r.start_us[2], 191 + 2005 + 10, 1e-6);
  EXPECT_NEAR(r.makespan_us, g.measured_us, 1e-6);
}

// One export of two processes, each with its own correlation ids: process
// 200's calls reuse the ids of process 100's launches but come after the
// kernels they would launch. The step takes the launching process's calls.
TEST(StepGraphTest, LaunchesComeFromTheLaunchingProcess) {
  HandTrace h;
  h.Call(1, 1000, 1004, 7, "cudaLaunchKernel", 200);
  h.Call(2, 1010, 1014, 7, "cudaLaunchKernel", 200);
  h.Call(1, 0, 4, 1, "cudaLaunchKernel");
  h.Kernel(1, 10, 50, 7);
  h.Call(2, 20, 24, 1, "cudaLaunchKernel");
  h.Kernel(2, 60, 70, 7);
  Built b = Build(std::move(h.t));
  const StepGraph& g = b.graph;
  ASSERT_EQ(g.host_order.size(), 2u);
  EXPECT_EQ(g.host_order[0], 0);
  EXPECT_NEAR(g.tasks[1].host_delta_us, 20, 1e-9);
  EXPECT_NEAR(g.tasks[0].launch_latency_us, 10, 1e-9);
}

// A replay that cannot finish says why.
TEST(SimulatorTest, AStuckReplaySaysWhy) {
  Schedule s;
  SimNode a = Node(Resource::kCompute, 10);
  SimNode b = Node(Resource::kCompute, 10);
  b.post_sync_us = 0;
  b.sync_node = 1;  // blocks until itself finishes
  s.Add(a, {});
  s.Add(b, {});
  s.host_order = {0, 1};
  const SimResult r = Simulate(s, SimParams{});
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.stall.find("1 of 2 nodes never ran"), std::string::npos) << r.stall;
  EXPECT_NE(r.stall.find("the host issues only later"), std::string::npos) << r.stall;
}

TEST(CandidatesTest, ApplyWhereTheyShould) {
  Built ddp = Build(testing::DdpSerializedAllReduce(8, 150));
  CandidateContext ctx;
  ctx.trace = &ddp.trace;
  ctx.graph = &ddp.graph;
  ctx.peaks = ddp.res[0].peaks;
  const double seq = Simulate(MakeSequential(ctx)->schedule, ctx.params).makespan_us;
  auto overlap = MakeCommOverlap(ctx);
  ASSERT_TRUE(overlap.has_value());
  EXPECT_EQ(overlap->partition.side_stream, std::vector<std::string>{"c10d::allreduce_"});
  EXPECT_EQ(overlap->partition.modules,
            std::vector<std::string>{"autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"});
  const SimResult r = Simulate(overlap->schedule, ctx.params);
  ASSERT_TRUE(r.ok);
  // Seven of the eight 150 us all-reduces hide under the next GEMM (1050 us);
  // the GEMMs under them lose ~17% speed for 150 us each (NCCL's SM share and
  // interference), ~25 us apiece.
  EXPECT_LT(r.makespan_us, seq - 1050 + 7 * 30);
  EXPECT_GT(r.makespan_us, seq - 1050);
  EXPECT_FALSE(MakeFusion(ctx).has_value());  // nothing elementwise consumes a gradient
  // The same schedule with each collective read by the next compute part
  // (as a synchronous collective is) hides nothing.
  std::optional<Schedule> read_next = sim_internal::CommOverlapSchedule(ctx, /*read_at_end=*/false);
  ASSERT_TRUE(read_next.has_value());
  const SimResult next = Simulate(*read_next, ctx.params);
  ASSERT_TRUE(next.ok) << next.stall;
  EXPECT_NEAR(next.makespan_us, seq, 1e-6 * seq);

  Built decode = Build(testing::LlamaDecode(512, 1024));
  ctx.graph = &decode.graph;
  ctx.trace = &decode.trace;
  EXPECT_FALSE(MakeCommOverlap(ctx).has_value());  // no collective
  EXPECT_FALSE(MakeDualBatchOverlap(ctx).has_value());
  ctx.splits = 2;
  auto nano = MakeNanobatchOverlap(ctx);
  ASSERT_TRUE(nano.has_value());
  EXPECT_EQ(nano->splits, 2);
  EXPECT_EQ(nano->partition.memory_ops.front(), "aten::_scaled_dot_product_flash_attention");
  EXPECT_EQ(nano->partition.compute_ops.front(), "aten::mm");
  EXPECT_GT(nano->extra_memory_bytes, 0);
}

// Nano-batch overlap as `apply` runs it: the decoder stack ("model") split in
// two micro-batches that flow through all layers, cut at the attention and
// MLP calls and staggered by one segment. The simulated schedule is the
// runtime's: the host issues the segments in its issue order, each segment
// starts only after the one it waits for in the runtime schedule, and the
// micro-batches' work lands on their own lanes.
TEST(CandidatesTest, RegionSplitSimulatesTheRuntimeSchedule) {
  Built decode = Build(testing::LlamaDecode(512, 1024, 4, 3));
  const std::optional<SplitRegion> region = FindSplitRegion(decode.trace, decode.graph);
  ASSERT_TRUE(region.has_value());
  EXPECT_EQ(region->unit, "model");
  EXPECT_EQ(region->stages,
            (std::vector<std::string>{"model.layers.*.self_attn", "model.layers.*.mlp"}));
  EXPECT_EQ(region->segments, 8);

  CandidateContext ctx;
  ctx.trace = &decode.trace;
  ctx.graph = &decode.graph;
  ctx.peaks = decode.res[0].peaks;
  ctx.region = &*region;
  ctx.splits = 2;
  const std::optional<RegionSchedule> split = BuildRegionSplit(ctx, *region, 2);
  ASSERT_TRUE(split.has_value());
  const Schedule& sim = split->schedule;
  auto runtime_schedule = runtime::BuildStaggeredRegion(region->segments, 2);
  ASSERT_TRUE(runtime_schedule.ok());
  auto runtime_task = [&](int32_t node) { return split->runtime_task[static_cast<size_t>(node)]; };
  // The host issues whole segments in the runtime schedule's issue order.
  std::vector<int> issued;
  for (int32_t node : sim.host_order) {
    const int rt = runtime_task(node);
    if (rt >= 0 && (issued.empty() || issued.back() != rt)) issued.push_back(rt);
  }
  const auto order = runtime_schedule->issue_order();
  EXPECT_EQ(issued, std::vector<int>(order.begin(), order.end()));

  const SimResult r = Simulate(sim, ctx.params);
  ASSERT_TRUE(r.ok) << r.stall;
  // Per runtime task: its simulated span; each starts after the tasks it waits for end.
  std::vector<double> start(order.size(), 1e300), end(order.size(), 0);
  int outside = 0;
  for (size_t i = 0; i < sim.nodes.size(); ++i) {
    const int rt = runtime_task(static_cast<int32_t>(i));
    if (rt < 0) {
      ++outside;
      continue;
    }
    start[static_cast<size_t>(rt)] = std::min(start[static_cast<size_t>(rt)], r.start_us[i]);
    end[static_cast<size_t>(rt)] = std::max(end[static_cast<size_t>(rt)], r.end_us[i]);
    EXPECT_EQ(rt % 2, sim.nodes[i].chain);
    EXPECT_EQ(sim.nodes[i].lane / static_cast<int32_t>(decode.graph.lane_streams.size()),
              sim.nodes[i].chain);
  }
  EXPECT_GT(outside, 0);  // the residual add after the last call of the unit runs once
  for (runtime::TaskId t : order) {
    for (runtime::TaskId w : runtime_schedule->cross_stream_waits(t)) {
      EXPECT_GE(start[static_cast<size_t>(t)], end[static_cast<size_t>(w)] - 1e-6)
          << runtime_schedule->task(t).name << " starts before " << runtime_schedule->task(w).name;
    }
  }
  // Micro-batch 1's attention runs beside micro-batch 0's MLP: a gain, within
  // the step's physical bound.
  const double seq = Simulate(MakeSequential(ctx)->schedule, ctx.params).makespan_us;
  EXPECT_LT(r.makespan_us, seq * 0.97);
  EXPECT_GE(r.makespan_us, BoundOf(sim).bound_us * (1 - 1e-9));
  auto nano = MakeNanobatchOverlap(ctx);
  ASSERT_TRUE(nano.has_value());
  EXPECT_EQ(nano->partition.modules, std::vector<std::string>{"model"});
  EXPECT_EQ(nano->partition.segments, 8);

  // Every sequencer turn (each task after the first) costs the host
  // region_turn_us before the task's first launch.
  auto host_time = [](const Schedule& sc) {
    double sum = 0;
    for (const SimNode& n : sc.nodes) sum += n.host_delta_us;
    return sum;
  };
  CandidateContext no_turns = ctx;
  no_turns.params.region_turn_us = 0;
  EXPECT_NEAR(host_time(sim) - host_time(BuildRegionSplit(no_turns, *region, 2)->schedule),
              ctx.params.region_turn_us * static_cast<double>(order.size() - 1), 1e-6);

  // A plan whose segment count differs from the step's stage calls does not
  // describe this step: no prediction from it.
  SplitRegion other = *region;
  other.segments = 4;
  EXPECT_FALSE(BuildRegionSplit(ctx, other, 2).has_value());
}

// Dual-batch overlap as `apply` runs it: the tensor-parallel stack ("model")
// in two micro-batches, cut at its all-reduces; compute of both shares the
// compute stream in the runtime schedule's issue order, and one
// micro-batch's all-reduce runs beside the other's compute.
TEST(CandidatesTest, DualBatchRegionSimulatesTheRuntimeSchedule) {
  Built tp = Build(testing::TensorParallelForward(4096, 400, 4, 3));
  const std::optional<SplitRegion> region = FindSplitRegion(tp.trace, tp.graph);
  ASSERT_TRUE(region.has_value());
  EXPECT_EQ(region->unit, "model");
  CandidateContext ctx;
  ctx.trace = &tp.trace;
  ctx.graph = &tp.graph;
  ctx.peaks = tp.res[0].peaks;
  ctx.region = &*region;
  int collectives = 0;
  const std::optional<RegionSchedule> split = BuildDualBatchRegionSplit(ctx, *region, &collectives);
  ASSERT_TRUE(split.has_value());
  EXPECT_EQ(collectives, 8);  // two all-reduces per layer
  auto rt = runtime::BuildDualBatchRegion(collectives);
  ASSERT_TRUE(rt.ok());
  std::vector<int> issued;
  for (int32_t node : split->schedule.host_order) {
    const int task = split->runtime_task[static_cast<size_t>(node)];
    if (task >= 0 && (issued.empty() || issued.back() != task)) issued.push_back(task);
  }
  EXPECT_EQ(issued, std::vector<int>(rt->issue_order().begin(), rt->issue_order().end()));

  const SimResult r = Simulate(split->schedule, ctx.params);
  ASSERT_TRUE(r.ok) << r.stall;
  // Stream order: nodes of one lane never overlap, whichever micro-batch.
  std::map<int32_t, std::vector<std::pair<double, double>>> by_lane;
  for (size_t i = 0; i < split->schedule.nodes.size(); ++i) {
    by_lane[split->schedule.nodes[i].lane].push_back({r.start_us[i], r.end_us[i]});
  }
  for (auto& [lane, spans] : by_lane) {
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) EXPECT_GE(spans[i].first, spans[i - 1].second - 1e-6);
  }
  // An all-reduce of one micro-batch overlaps the other's compute: the
  // exposed all-reduces shrink.
  const double seq = Simulate(MakeSequential(ctx)->schedule, ctx.params).makespan_us;
  EXPECT_LT(r.makespan_us, seq * 0.95);
  EXPECT_GE(r.makespan_us, BoundOf(split->schedule).bound_us * (1 - 1e-9));
  auto dbo = MakeDualBatchOverlap(ctx);
  ASSERT_TRUE(dbo.has_value());
  EXPECT_EQ(dbo->partition.modules, std::vector<std::string>{"model"});
  EXPECT_EQ(dbo->partition.segments, 8);
}

// A tensor-parallel forward: the all-reduces are consumed at once (no
// overlap without splitting), but their consumers (residual add, RMSNorm) can
// fuse into them, and two micro-batches can hide them.
TEST(CandidatesTest, TensorParallelForward) {
  Built tp = Build(testing::TensorParallelForward(4096, 400));
  CandidateContext ctx;
  ctx.trace = &tp.trace;
  ctx.graph = &tp.graph;
  ctx.peaks = tp.res[0].peaks;
  const double seq = Simulate(MakeSequential(ctx)->schedule, ctx.params).makespan_us;
  EXPECT_NEAR(seq, tp.graph.measured_us, 1.01);  // see ReplayReproducesTheMeasuredStep
  EXPECT_FALSE(MakeCommOverlap(ctx).has_value());
  auto fusion = MakeFusion(ctx);
  ASSERT_TRUE(fusion.has_value());
  EXPECT_EQ(fusion->partition.fused.front(), "c10d::allreduce_");
  EXPECT_NE(std::find(fusion->partition.fused.begin(), fusion->partition.fused.end(), "aten::add"),
            fusion->partition.fused.end());
  const SimResult f = Simulate(fusion->schedule, ctx.params);
  ASSERT_TRUE(f.ok);
  EXPECT_LT(f.makespan_us, seq);  // the add and norm kernels fold into the all-reduce
  auto dbo = MakeDualBatchOverlap(ctx);
  ASSERT_TRUE(dbo.has_value());
  const SimResult d = Simulate(dbo->schedule, ctx.params);
  ASSERT_TRUE(d.ok);
  // Eight 400 us all-reduces per step are exposed; one micro-batch's hide
  // under the other's compute.
  EXPECT_LT(d.makespan_us, seq * 0.95);
}

// Every candidate of every synthetic trace, at workloads from 1/16 to 4x the
// observed one, simulates at or above its schedule's physical bound.
TEST(CandidatesTest, NoneFinishesBelowItsBound) {
  std::vector<Built> built;
  built.push_back(Build(testing::DdpSerializedAllReduce(8, 150)));
  built.push_back(Build(testing::LlamaDecode(512, 1024)));
  built.push_back(Build(testing::TensorParallelForward(4096, 400)));
  built.push_back(Build(testing::MemoryDominatedForward(2048)));
  for (size_t b = 0; b < built.size(); ++b) {
    CandidateContext ctx;
    ctx.trace = &built[b].trace;
    ctx.graph = &built[b].graph;
    ctx.peaks = built[b].res[0].peaks;
    for (double scale : {1.0 / 16, 1.0, 4.0}) {
      ctx.scale = scale;
      std::vector<std::optional<Candidate>> cands = {MakeSequential(ctx), MakeCommOverlap(ctx),
                                                     MakeFusion(ctx), MakeDualBatchOverlap(ctx)};
      for (int k : {2, 4}) {
        ctx.splits = k;
        cands.push_back(MakeNanobatchOverlap(ctx));
      }
      for (const std::optional<Candidate>& c : cands) {
        if (!c) continue;
        const SimResult r = Simulate(c->schedule, ctx.params);
        ASSERT_TRUE(r.ok);
        EXPECT_GE(r.makespan_us, BoundOf(c->schedule).bound_us * (1 - 1e-9))
            << "trace " << b << ", " << StrategyName(c->strategy) << " x" << c->splits << " at scale "
            << scale;
      }
    }
  }
}

}  // namespace
}  // namespace dynaflow
