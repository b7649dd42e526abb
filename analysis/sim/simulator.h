// A discrete-event simulator of one step on one device.
//
// A Schedule is a DAG of nodes (kernels, or parts of kernels for split
// batches). A node starts when
//   * all its dependencies finished, plus its GPU-side `delay_us`;
//   * the host issued it (nodes in `host_order`, issued one after another as
//     step_graph.h describes, a blocking call waiting for its `sync_node`, or
//     for everything issued before it);
//   * no running node holds its exclusive group (a stream shared by several
//     micro-batches, or one class of work at a time for nano-batches);
// and, among the nodes that may start, lower `priority` first. Running nodes
// progress at the speeds of the sharing model (model.h) until the next start
// or finish: a fluid model, exact between events.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "analysis/roofline/bound.h"
#include "analysis/sim/model.h"

namespace dynaflow {

struct SimNode {
  int32_t task = -1;   // StepGraph task it comes from
  int32_t chain = 0;   // micro-batch (0 when not split)
  int32_t lane = 0;    // display lane: one per (chain, stream) or role
  Resource resource = Resource::kMemory;
  double work_us = 0;  // duration alone
  double hbm = 0;      // HBM fraction at full speed
  double sm = 0;       // SM fraction its grid needs at full speed (SmNeed), 0 unknown
  double delay_us = 0;
  int32_t group = -1;  // exclusive group, -1 none
  int64_t priority = 0;
  // Host issue (for nodes listed in Schedule::host_order).
  double host_delta_us = 0;
  double post_sync_us = -1;
  int32_t sync_node = -1;  // with post_sync_us: the node the blocking call waits for (-1: all issued)
  double launch_latency_us = 0;
};

struct Schedule {
  std::vector<SimNode> nodes;
  std::vector<int32_t> dep_begin;  // CSR, size nodes + 1
  std::vector<int32_t> deps;
  std::vector<int32_t> host_order;  // nodes in issue order
  int32_t groups = 0;
  int32_t lanes = 0;
  std::vector<std::string> lane_names;  // for display, size `lanes`
  double tail_us = 0;  // idle kept after the last node (host time before the next step)
  // The host's issue of the next step's first node, which ends this step (its
  // host fields as a node in host_order would have them, issued after the
  // last one): the step lasts until then, or until its last node ends.
  std::optional<SimNode> end_issue;

  // Appends a node with the given dependencies; returns its index.
  int32_t Add(const SimNode& node, const std::vector<int32_t>& node_deps);
};

struct SimResult {
  bool ok = false;        // false: a dependency cycle or an unissued node blocked progress
  // Why a replay could not finish (empty when ok): the host waiting on a node
  // it has not issued (or one that waits on such a node), or nodes whose
  // dependencies never finish. Names node indices and their tasks.
  std::string stall;
  double makespan_us = 0;  // last finish + tail
  std::vector<double> start_us;
  std::vector<double> end_us;
};

SimResult Simulate(const Schedule& schedule, const SimParams& params);

}  // namespace dynaflow
