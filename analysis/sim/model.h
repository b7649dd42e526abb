// The device model of the simulator: what a task costs when its batch is
// scaled or split, and how co-running tasks share the GPU.
//
// 1. Work of a part. A task measured at d0 microseconds on the observed batch
//    takes, on a fraction `s` of it (s = 1/k for one of k micro-batches, or
//    T/T0 for another workload bucket),
//        d(s) = f + (d0 - f) * g(s)
//    where f is a fixed cost that does not shrink with the batch (kernel ramp
//    and tail `kernel_fixed_us`, a collective's latency `comm_fixed_us`, a DMA
//    setup `copy_fixed_us`; at most half of d0), and g is the roofline ratio
//        g(s) = R(s) / R(1),
//        R(s) = max( F*s / (P * e(M*s)),  (W + A*s) / (B * hbm_efficiency) )
//    with F the FLOPs, P the peak for its precision, W the weight bytes (read
//    once per micro-batch whatever its size: the extra weight read each extra
//    micro-batch costs), A the other bytes, B the HBM bandwidth, and
//        e(M) = gemm_efficiency_max * M / (M + gemm_half_rows)
//    the efficiency of a GEMM of M rows (tile and wave quantisation). Without
//    FLOPs and bytes, g(s) = s. Latency-bound kernels keep d0; per-step work
//    (optimizer, gradient zeroing) is not split and does not scale.
//
// 2. Sharing. Running tasks progress at speeds in [0, 1] (1 = as measured
//    alone), recomputed at every start and finish. A task's class (bound.h)
//    is the unit it saturates alone, so tasks of one class share that unit:
//    the speeds of a class sum to at most its capacity (physical_bound.h),
//    which keeps every simulation at or above BoundOf(schedule).
//    a. SMs: a task needs the SM fraction its grid occupies (its footprint,
//       from the launch configuration: GridWaves, blocks over resident
//       blocks per SM times SMs; a split part's grid shrinks with its rows,
//       but for a persistent grid; at most 1, SmNeed), or, where the launch
//       configuration is unknown, its class's default: all of them for
//       compute, sm_comm and sm_latency each, sm_memory for all memory tasks
//       together. When every running
//       task's footprint is known, they claim SMs in the order they started,
//       as the block scheduler dispatches an earlier kernel's blocks first:
//       kernels of small grids run side by side, and a grid of a wave or
//       more holds the device until it ends (two such kernels on an H200
//       gained 1.1% at most side by side, docs/performance.md); a memory
//       task runs at full speed on sm_memory of the SMs. With a footprint
//       unknown: when the running tasks need no more than the device, none
//       slows on SMs; otherwise communication, latency and
//       memory tasks first get what they need (scaled down together if they
//       ask for more than 1 - sm_compute_min), compute tasks share the rest
//       equally and run at min(1, share / need): two kernels that each fill
//       the device share it. Memory tasks split the memory class's speed
//       equally (n of them: 1/n each): two kernels that each saturate HBM
//       alone take twice as long side by side. Copies use copy engines, no
//       SMs.
//    b. HBM: each task asks `hbm` of the bandwidth at full speed (its measured
//       bytes / time when known, within [hbm_min, hbm_max], else a per-class
//       default); if the sum of speed * hbm exceeds 1, every bandwidth user
//       slows by that factor.
//    c. Interconnect: concurrent collectives share the link; more than
//       kCopyEngines concurrent copies share the copy engines.
//    d. Interference: every co-runner costs each task a further
//       1 / (1 + interference) (L2 thrashing, block scheduling).
//    A task alone runs at speed 1, so replaying a trace whose kernels never
//    overlapped reproduces it exactly.
//
// Calibration against ../shared/DESIGN.md: good BF16 GEMMs reach 60-80% of
// peak (gemm_efficiency_max 0.80: e(512) = 0.67, e(2048) = 0.76); memory-bound attention
// reaches ~90% of bandwidth (hbm_memory 0.90); NanoFlow loses ~13% when it
// splits without overlap (a 70B-class tensor-parallel layer at 2048 tokens
// split in four costs 8-18% more run back to back: sim_test); equal amounts of
// GEMM and decode-attention work overlapped take 1/1.30 of their sequential
// time (sim_test bounds it to 1.15-1.5x), which, after split costs and the
// rest of a step, is in line with DynaFlow's measured whole-step gains (up to
// 1.29x for NanoFlow in vLLM). The host model (step_graph.h) passes extra
// launches of split schedules on to launch-bound steps.
#pragma once

#include "analysis/roofline/bound.h"
#include "analysis/sim/step_graph.h"

namespace dynaflow {

// Where each number comes from. Calibrated: gemm_efficiency_max,
// gemm_half_rows and hbm_efficiency to DESIGN.md's GEMM and attention
// efficiencies and NanoFlow's 13% split loss (the calibration paragraph
// above; sim_test recomputes it); region_turn_us measured (below). The
// sharing of kernels with a launch configuration (start order, a.) follows
// overlap_micro.py's pairs on an H200 (advisor_captures_test holds it). Not
// measured, first estimates: the fixed costs, the SM needs of kernels without
// a launch configuration, the HBM fractions of kernels without costed bytes,
// sm_compute_min and interference (the H200's two GEMMs side by side lost
// 13%, which interference's 5% does not explain; a fit is open). Kernels with
// a launch configuration and costed bytes use their own footprint (GridWaves)
// and achieved bandwidth instead of these defaults.
struct SimParams {
  // Splitting.
  double gemm_efficiency_max = 0.80;
  double gemm_half_rows = 96;
  double hbm_efficiency = 0.90;
  double kernel_fixed_us = 2.0;  // launch ramp and tail of a kernel
  double comm_fixed_us = 8.0;    // a small collective's latency
  double copy_fixed_us = 2.0;    // a DMA's setup
  // Sharing: SM fraction needed for full speed. sm_memory is for the memory
  // class as a whole: the SMs that keep enough loads in flight to saturate
  // HBM, which more memory kernels do not raise.
  double sm_memory = 0.40;
  double sm_latency = 0.25;
  double sm_comm = 0.12;  // 16 NCCL channels on 132 SMs
  // The SM fraction compute tasks keep however much the other classes ask:
  // thread blocks already resident finish their waves (kept from the model's
  // first calibration, not measured).
  double sm_compute_min = 0.10;
  // Sharing: HBM fraction used at full speed when the bytes are unknown.
  double hbm_compute = 0.30;
  double hbm_memory = 0.90;
  double hbm_comm = 0.10;
  double hbm_copy = 0.05;
  double hbm_latency = 0.20;
  // Bounds on a fraction measured from bytes / time. No kernel reaches more
  // than hbm_max of peak (DESIGN.md: memory-bound attention ~90%); hbm_min
  // keeps a task with costed bytes a bandwidth user. A memory-bound task is
  // held to at least hbm_memory_min (half of hbm_memory, from the model's
  // first calibration, not measured): costed bytes may understate what a
  // memory-bound kernel moves. The floors only slow co-runners of other
  // classes; tasks of the memory class share it whatever their fractions.
  double hbm_min = 0.02;
  double hbm_max = 0.95;
  double hbm_memory_min = 0.45;
  double interference = 0.05;
  // Host time of one turn of a region's sequencer (runtime/sequencer.h):
  // `apply` hands the turn between the micro-batches' Python threads at
  // every segment boundary. Measured on the CPU by bench/apply_overhead.py
  // (docs/performance.md: about 42 us per turn on a 2-core VM); charged
  // before the first launch of each segment but the first.
  double region_turn_us = 42.0;
};

// d(s) of the header comment.
double PartDuration(const SimTask& task, double s, const PeakRates& peaks, const SimParams& p);

// The HBM fraction `task` uses at full speed.
double HbmDemand(const SimTask& task, const PeakRates& peaks, const SimParams& p);

// The SM fraction a part of `task` on a fraction `s` of its batch occupies:
// its footprint, scaled with its rows for token-scaled work (a GEMM's grid
// tiles its rows), at most 1; 0 when the footprint is unknown. A persistent
// grid keeps its footprint.
double SmNeed(const SimTask& task, double s);

// Whether `task`'s grid is exactly the device's resident capacity, as a
// persistent kernel sizes it (cuBLAS's nvjet GEMMs and cuDNN's flash attention
// of a 4096-token prefill on an H200 launch 132 blocks, one per SM, and loop
// over their tiles: tests/data/h200_predict). Splitting its rows leaves it
// fewer tiles per block, not fewer blocks, so a part still fills the device.
// A grid that tiles its rows hits the capacity exactly only by chance.
bool PersistentGrid(const SimTask& task);

}  // namespace dynaflow
