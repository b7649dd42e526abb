// Kernels replayed from CUDA graphs, attributed to the operators that
// captured them. Every kernel of a replay carries the correlation id of its
// cudaGraphLaunch, which links it to the operator that launched the graph (or
// none); its record also carries the id of the graph node that launched it
// (graphNodeId). CUPTI's resource callbacks say when each node is created
// (during stream capture: inside the capturing operator's push, on its
// thread) and cloned (cudaGraphClone, and cudaGraphInstantiate, whose
// executable graph's nodes are the ones replay records name). GraphAttribution
// remembers the operator of every node created while one was open, follows
// clones, and the writer gives replayed records that operator's id.
//
// CUPTI allows one subscriber per process, and torch.profiler's Kineto
// subscribes too (when it first prepares a trace). The tracer subscribes
// when it starts CUPTI and gives the subscription up while torch.profiler
// holds CUPTI (Tracer::LendCupti); whoever is second is refused, and where
// the tracer is refused it records "cupti_graph_attribution" = "unavailable:
// another CUPTI subscriber" and goes on: replayed kernels then link by their
// launch's correlation, as without this.
//
// The same subscription reports stream captures (graph_capture.h): the
// operators a thread begins while it captures are capture-time operators.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>

#include "analysis/base/status.h"
#include "plugin/preload/cupti_api.h"
#include "plugin/preload/graph_capture.h"

namespace dynaflow {

class GraphAttribution {
 public:
  // Nodes remembered at most (16 bytes each, plus the map's own); later
  // nodes are counted in forgotten_nodes() and stay unattributed.
  static constexpr size_t kMaxNodes = size_t{1} << 20;

  // `current_operator` is the innermost operator open on the calling thread
  // (0: none); it is called from CUDA's resource callbacks.
  GraphAttribution(CuptiApi& cupti, std::function<uint64_t()> current_operator,
                   size_t max_nodes = kMaxNodes);
  GraphAttribution(const GraphAttribution&) = delete;
  GraphAttribution& operator=(const GraphAttribution&) = delete;
  ~GraphAttribution();

  // Subscribes to CUPTI's callbacks and enables the graph node created and
  // cloned callbacks. Failure "another CUPTI subscriber" when another tool
  // holds the subscription, or with CUPTI's code when CUPTI lacks the calls.
  // The stream capture callbacks are enabled as well, each as far as this
  // CUPTI has it: captures begun through a call it lacks go unmarked.
  Status Subscribe();
  // Gives the subscription up (for another tool); the nodes stay remembered,
  // captures in progress are forgotten (their end would go unseen).
  void Unsubscribe();
  bool subscribed() const;

  // The operator that created `node` or the node it was cloned from; -1 when
  // unknown. Any thread.
  int64_t OperatorOf(uint64_t node) const;
  size_t forgotten_nodes() const;
  // Whether the calling thread is capturing a stream (graph_capture.h).
  bool CallingThreadCapturing() const { return capture_.CallingThreadCapturing(); }

  // The resource callbacks, public for the CUPTI callback trampoline.
  void OnNodeCreated(CUgraphNode node);
  void OnNodeCloned(CUgraphNode original, CUgraphNode clone);

 private:
  static void CUPTIAPI OnCallback(void* self, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                                  const void* data);
  void Remember(uint64_t node, uint64_t op);

  CuptiApi& cupti_;
  const std::function<uint64_t()> current_operator_;
  const size_t max_nodes_;
  mutable std::mutex mu_;
  CUpti_SubscriberHandle subscriber_ = nullptr;
  std::unordered_map<uint64_t, uint64_t> operators_;  // graph node id -> operator id
  size_t forgotten_ = 0;
  GraphCaptureTracker capture_;
};

}  // namespace dynaflow
