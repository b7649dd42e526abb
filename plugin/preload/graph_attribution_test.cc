#include "plugin/preload/graph_attribution.h"

#include <gtest/gtest.h>

#include "plugin/preload/fake_cupti_api.h"

namespace dynaflow {
namespace {

CUpti_GraphData Created(uint64_t node) {
  CUpti_GraphData g = {};
  g.node = FakeCuptiApi::Node(node);
  return g;
}

CUpti_GraphData Cloned(uint64_t original, uint64_t clone) {
  CUpti_GraphData g = {};
  g.originalNode = FakeCuptiApi::Node(original);
  g.node = FakeCuptiApi::Node(clone);
  return g;
}

TEST(GraphAttributionTest, NodesTakeTheOperatorOpenAtCreationAndClonesFollow) {
  FakeCuptiApi cupti;
  uint64_t open_operator = 7;
  GraphAttribution graph(cupti, [&] { return open_operator; });
  ASSERT_TRUE(graph.Subscribe().ok());
  ASSERT_TRUE(cupti.EmitGraphCallback(CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED, Created(1)));
  open_operator = 0;  // created outside any operator: not remembered
  ASSERT_TRUE(cupti.EmitGraphCallback(CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED, Created(2)));
  ASSERT_TRUE(cupti.EmitGraphCallback(CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED, Cloned(1, 11)));
  ASSERT_TRUE(cupti.EmitGraphCallback(CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED, Cloned(11, 21)));
  ASSERT_TRUE(cupti.EmitGraphCallback(CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED, Cloned(2, 12)));
  EXPECT_EQ(graph.OperatorOf(1), 7);
  EXPECT_EQ(graph.OperatorOf(11), 7);
  EXPECT_EQ(graph.OperatorOf(21), 7);  // a clone of a clone
  EXPECT_EQ(graph.OperatorOf(2), -1);
  EXPECT_EQ(graph.OperatorOf(12), -1);
  EXPECT_EQ(graph.OperatorOf(99), -1);
  // Only the node callbacks are asked for.
  EXPECT_FALSE(cupti.callback_enabled(CUPTI_CB_DOMAIN_RESOURCE,
                                      CUPTI_CBID_RESOURCE_GRAPHEXEC_CREATED));
}

TEST(GraphAttributionTest, NodesBeyondTheBoundAreCountedNotRemembered) {
  FakeCuptiApi cupti;
  GraphAttribution graph(cupti, [] { return uint64_t{5}; }, /*max_nodes=*/2);
  ASSERT_TRUE(graph.Subscribe().ok());
  for (uint64_t node : {1, 2, 3, 4}) {
    ASSERT_TRUE(cupti.EmitGraphCallback(CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED, Created(node)));
  }
  ASSERT_TRUE(cupti.EmitGraphCallback(CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED, Created(2)));
  EXPECT_EQ(graph.OperatorOf(2), 5);
  EXPECT_EQ(graph.OperatorOf(3), -1);
  EXPECT_EQ(graph.forgotten_nodes(), 2u);
}

TEST(GraphAttributionTest, OneSubscriberPerProcess) {
  FakeCuptiApi cupti;
  cupti.HoldSubscriptionElsewhere(true);
  GraphAttribution graph(cupti, [] { return uint64_t{1}; });
  const Status refused = graph.Subscribe();
  EXPECT_FALSE(refused.ok());
  EXPECT_EQ(refused.message(), "another CUPTI subscriber");
  EXPECT_FALSE(graph.subscribed());
  cupti.HoldSubscriptionElsewhere(false);
  ASSERT_TRUE(graph.Subscribe().ok());
  EXPECT_TRUE(graph.Subscribe().ok());  // already: nothing more
  graph.Unsubscribe();
  EXPECT_FALSE(cupti.subscribed());
  EXPECT_FALSE(cupti.EmitGraphCallback(CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED, Created(1)));
}

}  // namespace
}  // namespace dynaflow
