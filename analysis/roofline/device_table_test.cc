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

namespace dynaflow {
namespace {

TEST(DeviceTableTest, CoversTheIssuesParts) {
  for (const char* name : {"NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA B200",
                           "NVIDIA L40S", "Tesla V100-SXM2-32GB", "AMD Instinct MI250X", "AMD Instinct MI300X",
                           "AMD Instinct MI325X"}) {
    const DevicePeaks* p = LookupDevice(name);
    ASSERT_NE(p, nullptr) << name;
    EXPECT_GT(p->tflops_bf16, p->tflops_fp32) << name;
    EXPECT_GT(p->memory_bandwidth_gbps, 0) << name;
  }
  EXPECT_DOUBLE_EQ(LookupDevice("AMD Instinct MI325X")->memory_bandwidth_gbps, 6000);
  EXPECT_DOUBLE_EQ(LookupDevice("AMD Instinct MI300X")->memory_bandwidth_gbps, 5300);
  EXPECT_DOUBLE_EQ(LookupDevice("NVIDIA B200")->tflops_bf16, 2250);
  EXPECT_DOUBLE_EQ(LookupDevice("NVIDIA H100 NVL")->memory_bandwidth_gbps, 3900);
  EXPECT_DOUBLE_EQ(LookupDevice("Tesla V100-SXM2-32GB")->tflops_tf32, 0);
  // One GCD of an MI250X, as ROCm shows it.
  EXPECT_EQ(LookupDevice("AMD Instinct MI250X")->sm_count, 110);
  EXPECT_DOUBLE_EQ(LookupDevice("AMD Instinct MI250X")->tflops_bf16, 191.5);
}

// ROCm names parts missing from its table "AMD Radeon Graphics" (hta_mi250_minitoy:
// 104 CUs, one MI250 GCD); the CU count names them.
TEST(DeviceTableTest, GenericAmdNameByComputeUnits) {
  EXPECT_EQ(LookupDevice("AMD Radeon Graphics", 104)->name, "AMD Instinct MI250 (one GCD)");
  EXPECT_EQ(LookupDevice("AMD Radeon Graphics", 304), nullptr);  // MI300X or MI325X
  EXPECT_EQ(LookupDevice("AMD Radeon Graphics", 12), nullptr);
  EXPECT_EQ(LookupDevice("AMD Radeon Graphics"), nullptr);
}

}  // namespace
}  // namespace dynaflow
