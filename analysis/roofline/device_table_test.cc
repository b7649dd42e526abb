#include "analysis/roofline/device_table.h"

#include <gtest/gtest.h>

namespace dynaflow {
namespace {

TEST(DeviceTableTest, MatchesReportedNames) {
  EXPECT_EQ(LookupDevice("NVIDIA H200")->sm_count, 132);
  EXPECT_DOUBLE_EQ(LookupDevice("NVIDIA H200")->memory_bandwidth_gbps, 4800);
  EXPECT_EQ(LookupDevice("NVIDIA H100 80GB HBM3")->name, "NVIDIA H100 SXM");
  EXPECT_EQ(LookupDevice("NVIDIA H100 PCIe")->sm_count, 114);
  EXPECT_EQ(LookupDevice("NVIDIA A100-SXM4-40GB")->name, "NVIDIA A100 40GB");
  EXPECT_EQ(LookupDevice("NVIDIA A100-PG509-200")->name, "NVIDIA A100");
  EXPECT_EQ(LookupDevice("Tesla V100-SXM2-32GB")->cc_major, 7);
  EXPECT_EQ(LookupDevice("NVIDIA GeForce RTX 4090")->cc_minor, 9);
  EXPECT_EQ(LookupDevice("AMD Instinct MI300X VF")->sm_count, 304);
  EXPECT_EQ(LookupDevice("NVIDIA L4")->sm_count, 58);
  EXPECT_EQ(LookupDevice("NVIDIA L40S")->sm_count, 142);
  EXPECT_EQ(LookupDevice("Some Future GPU"), nullptr);
  EXPECT_EQ(LookupDevice(""), nullptr);
}

TEST(DeviceTableTest, H200RidgePointIsAbout206FlopPerByte) {
  const DevicePeaks* h200 = LookupDevice("NVIDIA H200");
  EXPECT_NEAR(h200->tflops_bf16 * 1e12 / (h200->memory_bandwidth_gbps * 1e9), 206, 1);
}

TEST(DeviceTableTest, FillKeepsWhatTheTraceRecorded) {
  DeviceInfo d;
  d.name = "NVIDIA H100 80GB HBM3";
  d.sm_count = 130;  // as the trace reported it
  ASSERT_TRUE(FillFromDeviceTable(&d));
  EXPECT_EQ(d.sm_count, 130);
  EXPECT_EQ(d.cc_major, 9);
  EXPECT_DOUBLE_EQ(d.peak_tflops_bf16, 989.4);
  EXPECT_DOUBLE_EQ(d.memory_bandwidth_gbps, 3350);
  DeviceInfo unknown;
  unknown.name = "mystery";
  EXPECT_FALSE(FillFromDeviceTable(&unknown));
  EXPECT_EQ(unknown.sm_count, 0);
}

}  // namespace
}  // namespace dynaflow
