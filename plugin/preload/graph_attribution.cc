#include "plugin/preload/graph_attribution.h"

#include <array>
#include <string>
#include <utility>

namespace dynaflow {
namespace {

constexpr std::array<CUpti_CallbackIdResource, 2> kGraphCallbacks = {
    CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED,
    CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED,  // cudaGraphClone and cudaGraphInstantiate
};

}  // namespace

GraphAttribution::GraphAttribution(CuptiApi& cupti, std::function<uint64_t()> current_operator,
                                   size_t max_nodes)
    : cupti_(cupti), current_operator_(std::move(current_operator)), max_nodes_(max_nodes) {}

GraphAttribution::~GraphAttribution() { Unsubscribe(); }

Status GraphAttribution::Subscribe() {
  std::lock_guard<std::mutex> lock(mu_);
  if (subscriber_ != nullptr) return Status::Ok();
  const CUptiResult result = cupti_.Subscribe(&subscriber_, &OnCallback, this);
  if (result == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) {
    subscriber_ = nullptr;
    return Status::Failure("another CUPTI subscriber");
  }
  if (result != CUPTI_SUCCESS) {
    subscriber_ = nullptr;
    return Status::Failure("cuptiSubscribe: CUPTI error " + std::to_string(result));
  }
  for (CUpti_CallbackIdResource cbid : kGraphCallbacks) {
    const CUptiResult enabled = cupti_.EnableCallback(1, subscriber_, CUPTI_CB_DOMAIN_RESOURCE, cbid);
    if (enabled != CUPTI_SUCCESS) {
      (void)cupti_.Unsubscribe(subscriber_);
      subscriber_ = nullptr;
      return Status::Failure("cuptiEnableCallback: CUPTI error " + std::to_string(enabled));
    }
  }
  for (const CaptureCallback& c : GraphCaptureTracker::Callbacks()) {
    (void)cupti_.EnableCallback(1, subscriber_, c.domain, c.cbid);  // best effort
  }
  return Status::Ok();
}

void GraphAttribution::Unsubscribe() {
  std::lock_guard<std::mutex> lock(mu_);
  if (subscriber_ == nullptr) return;
  (void)cupti_.Unsubscribe(subscriber_);
  subscriber_ = nullptr;
  capture_.Forget();
}

bool GraphAttribution::subscribed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return subscriber_ != nullptr;
}

int64_t GraphAttribution::OperatorOf(uint64_t node) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = operators_.find(node);
  return it == operators_.end() ? -1 : static_cast<int64_t>(it->second);
}

size_t GraphAttribution::forgotten_nodes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return forgotten_;
}

void GraphAttribution::Remember(uint64_t node, uint64_t op) {
  std::lock_guard<std::mutex> lock(mu_);
  if (operators_.size() >= max_nodes_ && !operators_.count(node)) {
    ++forgotten_;
    return;
  }
  operators_[node] = op;
}

void GraphAttribution::OnNodeCreated(CUgraphNode node) {
  const uint64_t op = current_operator_();
  uint64_t id = 0;
  if (op == 0 || cupti_.GetGraphNodeId(node, &id) != CUPTI_SUCCESS) return;
  Remember(id, op);
}

void GraphAttribution::OnNodeCloned(CUgraphNode original, CUgraphNode clone) {
  uint64_t original_id = 0;
  uint64_t clone_id = 0;
  if (cupti_.GetGraphNodeId(original, &original_id) != CUPTI_SUCCESS ||
      cupti_.GetGraphNodeId(clone, &clone_id) != CUPTI_SUCCESS) {
    return;
  }
  const int64_t op = OperatorOf(original_id);
  if (op >= 0) Remember(clone_id, static_cast<uint64_t>(op));
}

void CUPTIAPI GraphAttribution::OnCallback(void* self, CUpti_CallbackDomain domain,
                                           CUpti_CallbackId cbid, const void* data) {
  if (self == nullptr || data == nullptr) return;
  auto* attribution = static_cast<GraphAttribution*>(self);
  if (domain == CUPTI_CB_DOMAIN_RUNTIME_API || domain == CUPTI_CB_DOMAIN_DRIVER_API) {
    try {
      attribution->capture_.OnApiCallback(domain, cbid,
                                          *static_cast<const CUpti_CallbackData*>(data));
    } catch (...) {
      // Out of memory inside CUDA's call: this capture goes unmarked.
    }
    return;
  }
  if (domain != CUPTI_CB_DOMAIN_RESOURCE) return;
  const auto* resource = static_cast<const CUpti_ResourceData*>(data);
  const auto* graph = static_cast<const CUpti_GraphData*>(resource->resourceDescriptor);
  if (graph == nullptr) return;
  try {
    if (cbid == CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED) {
      attribution->OnNodeCreated(graph->node);
    } else if (cbid == CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED) {
      attribution->OnNodeCloned(graph->originalNode, graph->node);
    }
  } catch (...) {
    // Out of memory inside CUDA's call: the node stays unattributed.
  }
}

}  // namespace dynaflow
