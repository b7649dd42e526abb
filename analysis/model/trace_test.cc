#include "analysis/model/trace.h"

#include <gtest/gtest.h>

namespace dynaflow {
namespace {

TEST(StringTableTest, InternsOnceAndKeepsEmptyAtZero) {
  StringTable t;
  EXPECT_EQ(t.Get(0), "");
  StringId a = t.Intern("aten::mm");
  StringId b = t.Intern("aten::add");
  EXPECT_NE(a, b);
  EXPECT_EQ(t.Intern("aten::mm"), a);
  EXPECT_EQ(t.Intern(""), 0u);
  EXPECT_EQ(t.Get(b), "aten::add");
  EXPECT_EQ(t.size(), 3u);
}

TEST(ImportStatsTest, AddsByName) {
  ImportStats s;
  s.Add("bad", "data_loss", "bad events");
  s.Add("bad", "data_loss", "ignored description", 4);
  s.Add("info", "info", "x");
  EXPECT_EQ(s.Get("bad"), 5);
  EXPECT_EQ(s.Get("info"), 1);
  EXPECT_EQ(s.Get("missing"), 0);
  ASSERT_EQ(s.all().size(), 2u);
  EXPECT_EQ(s.all()[0].description, "bad events");
}

TEST(TraceTest, DeviceIndexIsStablePerRankAndDevice) {
  Trace t;
  uint32_t a = t.DeviceIndex(0, 3);
  uint32_t b = t.DeviceIndex(1, 3);
  EXPECT_NE(a, b);
  EXPECT_EQ(t.DeviceIndex(0, 3), a);
  EXPECT_EQ(t.devices[b].rank, 1);
  EXPECT_EQ(t.devices[b].device, 3);
}

Trace OneFile(const char* kernel) {
  Trace part;
  uint32_t d = part.DeviceIndex(0, 0);
  part.devices[d].name = "NVIDIA H200";
  GpuActivity g;
  g.device_index = d;
  g.start = 10;
  g.end = 20;
  g.name = part.strings.Intern(kernel);
  part.gpu.push_back(g);
  Operator o;
  o.name = part.strings.Intern("aten::mm");
  part.ops.push_back(o);
  Range r;
  r.device_index = static_cast<int32_t>(d);
  r.name = part.strings.Intern("ProfilerStep#1");
  part.ranges.push_back(r);
  part.stats.Add("kineto_flow_events", "info", "flows", 2);
  part.metadata["source"] = kernel;
  return part;
}

TEST(TraceTest, AppendAssignsRankAndRemapsStringsAndDevices) {
  Trace t;
  t.Append(OneFile("gemm"), 0);
  t.Append(OneFile("nccl_allreduce"), 1);
  ASSERT_EQ(t.devices.size(), 2u);
  EXPECT_EQ(t.devices[1].rank, 1);
  EXPECT_EQ(t.devices[1].name, "NVIDIA H200");
  ASSERT_EQ(t.gpu.size(), 2u);
  EXPECT_EQ(t.strings.Get(t.gpu[0].name), "gemm");
  EXPECT_EQ(t.strings.Get(t.gpu[1].name), "nccl_allreduce");
  EXPECT_EQ(t.gpu[1].device_index, 1u);
  EXPECT_EQ(t.ops[1].rank, 1);
  EXPECT_EQ(t.strings.Get(t.ops[1].name), "aten::mm");
  EXPECT_EQ(t.ranges[1].device_index, 1);
  EXPECT_EQ(t.stats.Get("kineto_flow_events"), 4);
  EXPECT_EQ(t.metadata["source"], "gemm;nccl_allreduce");
  // The first file was taken whole but its rank still applies.
  EXPECT_EQ(t.DeviceIndex(0, 0), 0u);
}

TEST(TraceTest, CheckNewRankSeesRanksOfEveryKindOfRecord) {
  Trace t;
  EXPECT_TRUE(t.CheckNewRank(0, "a.json").ok());
  t.DeviceIndex(2, 0);
  Operator op;
  op.rank = 5;  // a CPU-only rank: operators, no device or process
  t.ops.push_back(op);
  EXPECT_TRUE(t.CheckNewRank(0, "a.json").ok());
  const Status device_rank = t.CheckNewRank(2, "b.json");
  EXPECT_EQ(device_rank.code(), StatusCode::kBadInput);
  EXPECT_EQ(device_rank.message(),
            "b.json: rank 2 is also in an earlier input: give each rank's trace once");
  EXPECT_FALSE(t.CheckNewRank(5, "c.json").ok());
}

TEST(TraceTest, AppendIntoEmptyTraceUsesGivenRank) {
  Trace t;
  t.Append(OneFile("gemm"), 7);
  ASSERT_EQ(t.devices.size(), 1u);
  EXPECT_EQ(t.devices[0].rank, 7);
  EXPECT_EQ(t.ops[0].rank, 7);
  EXPECT_EQ(t.DeviceIndex(7, 0), 0u);
  EXPECT_EQ(t.devices.size(), 1u);
}

}  // namespace
}  // namespace dynaflow
