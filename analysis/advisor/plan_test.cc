#include "analysis/advisor/plan.h"

#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <sstream>

namespace dynaflow {
namespace {

Plan Sample() {
  Plan p;
  p.traces = {"rank0.json.gz"};
  p.trace_fingerprint = "00112233aabbccdd";
  p.device_name = "NVIDIA H200";
  p.sm_count = 132;
  p.memory_bandwidth_gbps = 4800;
  p.peak_tflops_bf16 = 989.4;
  p.peaks_known = true;
  p.model_fingerprint = "ffeeddccbbaa9988";
  p.tokens_per_step = 512;
  p.kernels_per_step = 300;
  p.strategy = Strategy::kNanobatchOverlap;
  p.splits = 2;
  p.partition_rules = {{"nanobatch_overlap.compute", "compute", {"aten::mm"}, {}},
                       {"nanobatch_overlap.memory", "memory", {"aten::_flash_attention_forward"}, {}},
                       {"nanobatch_overlap.split", "split", {}, {"model.layers.0.self_attn"}}};
  PlanBucket small;
  small.min_tokens = 0;
  small.max_tokens = 181;
  small.streams = StreamsFor(Strategy::kSequential);
  small.baseline_step_us = 900;
  small.predicted_step_us = 900;
  PlanBucket large;
  large.min_tokens = 181;
  large.strategy = Strategy::kNanobatchOverlap;
  large.splits = 2;
  large.rules = {"nanobatch_overlap.compute", "nanobatch_overlap.memory", "nanobatch_overlap.split"};
  large.streams = StreamsFor(Strategy::kNanobatchOverlap);
  large.predicted_speedup = 1.2;
  large.baseline_step_us = 3600;
  large.predicted_step_us = 3000;
  large.extra_memory_bytes = 33554432;
  p.buckets = {small, large};
  p.baseline_step_us = 3600;
  p.predicted_step_us = 3000;
  p.predicted_speedup = 1.2;
  p.extra_memory_bytes = 33554432;
  return p;
}

TEST(PlanTest, RoundTripsThroughJson) {
  const Plan p = Sample();
  const nlohmann::json j = PlanToJson(p);
  ASSERT_TRUE(ValidatePlanJson(j).ok()) << ValidatePlanJson(j).message();
  // Through text as well, as a file would.
  StatusOr<Plan> back = PlanFromJson(nlohmann::json::parse(j.dump(2)));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back.value(), p);
  EXPECT_EQ(PlanToJson(back.value()), j);
  EXPECT_TRUE(j["buckets"][1]["max_tokens"].is_null());
  EXPECT_EQ(j["buckets"][1]["strategy"], "nanobatch_overlap");
  EXPECT_FALSE(j["model"].contains("module_fingerprint"));  // unknown: absent

  Plan q = Sample();
  q.module_fingerprint = "1b225ad95c61f3fb";
  const nlohmann::json k = PlanToJson(q);
  EXPECT_EQ(k["model"]["module_fingerprint"], "1b225ad95c61f3fb");
  StatusOr<Plan> q_back = PlanFromJson(k);
  ASSERT_TRUE(q_back.ok()) << q_back.status().message();
  EXPECT_EQ(q_back.value(), q);
  EXPECT_FALSE(j["model"].contains("phase"));  // unknown: absent

  Plan r = Sample();
  r.phase = "decode";
  const nlohmann::json l = PlanToJson(r);
  EXPECT_EQ(l["model"]["phase"], "decode");
  StatusOr<Plan> r_back = PlanFromJson(l);
  ASSERT_TRUE(r_back.ok()) << r_back.status().message();
  EXPECT_EQ(r_back.value().phase, "decode");
  EXPECT_FALSE(l["buckets"][0].contains("phase"));  // for every call: absent
}

// A tiling per phase: each phase's buckets consecutive, from 0 to an open end.
TEST(PlanTest, BucketsOfEachPhaseTileTheirOwnTokens) {
  Plan p = Sample();
  std::vector<PlanBucket> decode = p.buckets;
  for (PlanBucket& b : p.buckets) b.phase = "prefill";
  for (PlanBucket& b : decode) b.phase = "decode";
  p.buckets.insert(p.buckets.end(), decode.begin(), decode.end());
  const nlohmann::json j = PlanToJson(p);
  EXPECT_EQ(j["buckets"][2]["phase"], "decode");
  StatusOr<Plan> back = PlanFromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back.value(), p);

  nlohmann::json apart = j;  // prefill, decode, prefill
  apart["buckets"].push_back(j["buckets"][0]);
  apart["buckets"].push_back(j["buckets"][1]);
  EXPECT_EQ(ValidatePlanJson(apart).message(),
            "plan: buckets[4].phase: the prefill buckets must be consecutive");
  nlohmann::json closed = j;
  closed["buckets"][1]["max_tokens"] = 4096;
  EXPECT_EQ(ValidatePlanJson(closed).message(),
            "plan: buckets[1].max_tokens: the last prefill bucket must be open (null)");
}

TEST(PlanTest, SplitsModulesOnlyThroughASplitBucketsSplitRule) {
  Plan p = Sample();
  EXPECT_TRUE(SplitsModules(p));
  p.buckets[1].strategy = Strategy::kFusion;  // the rule is named, not by a split bucket
  EXPECT_FALSE(SplitsModules(p));
  p = Sample();
  p.partition_rules[2].modules.clear();
  EXPECT_FALSE(SplitsModules(p));
}

TEST(PlanTest, RejectsWhatTheSchemaRejects) {
  {
    nlohmann::json j = PlanToJson(Sample());
    j["model"]["module_fingerprint"] = 7;
    EXPECT_EQ(ValidatePlanJson(j).message(), "plan: model.module_fingerprint: must be a string");
  }
  {
    nlohmann::json j = PlanToJson(Sample());
    j["model"]["phase"] = "warmup";
    EXPECT_FALSE(ValidatePlanJson(j).ok());
    EXPECT_NE(ValidatePlanJson(j).message().find("model.phase"), std::string::npos);
  }
  const nlohmann::json good = PlanToJson(Sample());
  auto broken = [&](const std::function<void(nlohmann::json&)>& f) {
    nlohmann::json j = good;
    f(j);
    return ValidatePlanJson(j);
  };
  Status s = broken([](nlohmann::json& j) { j.erase("buckets"); });
  EXPECT_EQ(s.code(), StatusCode::kBadInput);
  EXPECT_EQ(s.message(), "plan: missing required key \"buckets\"");
  EXPECT_EQ(broken([](nlohmann::json& j) { j["device"]["sm_count"] = -1; }).message(),
            "plan: device.sm_count: must be an integer in [0, 2147483647]");
  EXPECT_EQ(ValidatePlanJson(nlohmann::json::array()).message(), "plan: must be an object");
  EXPECT_FALSE(broken([](nlohmann::json& j) { j["schema"] = "dynaflow.plan/2"; }).ok());
  EXPECT_FALSE(broken([](nlohmann::json& j) { j["strategy"] = "magic"; }).ok());
  EXPECT_FALSE(broken([](nlohmann::json& j) { j["splits"] = 0; }).ok());
  EXPECT_FALSE(broken([](nlohmann::json& j) { j["extra"] = 1; }).ok());
  EXPECT_FALSE(broken([](nlohmann::json& j) { j["buckets"][0]["streams"] = nlohmann::json::array(); }).ok());
  EXPECT_FALSE(broken([](nlohmann::json& j) { j["buckets"][0]["streams"][0]["role"] = "gpu"; }).ok());
  EXPECT_FALSE(broken([](nlohmann::json& j) { j["partition_rules"][0]["role"] = "other"; }).ok());
  EXPECT_FALSE(broken([](nlohmann::json& j) { j["device"]["sm_count"] = -1; }).ok());
  EXPECT_FALSE(broken([](nlohmann::json& j) { j["predicted"]["speedup"] = "fast"; }).ok());
  // Beyond JSON Schema: buckets tile [0, inf) and rules exist.
  EXPECT_FALSE(broken([](nlohmann::json& j) { j["buckets"][1]["min_tokens"] = 200; }).ok());
  EXPECT_FALSE(broken([](nlohmann::json& j) { j["buckets"][1]["max_tokens"] = 4096; }).ok());
  EXPECT_FALSE(broken([](nlohmann::json& j) { j["buckets"][1]["rules"][0] = "nope"; }).ok());
  EXPECT_FALSE(PlanFromJson(nlohmann::json::array()).ok());
}

// Upper bounds (PlanLimits): past each, one line naming the key; long values
// are quoted cut. tests/plan_schema_test.py checks the schema file agrees.
TEST(PlanTest, RefusesWhatExceedsTheLimits) {
  const nlohmann::json good = PlanToJson(Sample());
  auto broken = [&](const std::function<void(nlohmann::json&)>& f) {
    nlohmann::json j = good;
    f(j);
    return ValidatePlanJson(j);
  };
  EXPECT_TRUE(broken([](nlohmann::json& j) { j["buckets"][1]["splits"] = PlanLimits::kMaxSplits; }).ok());
  EXPECT_EQ(broken([](nlohmann::json& j) { j["splits"] = 100000; }).message(),
            "plan: splits: must be an integer in [1, 16]");
  EXPECT_EQ(broken([](nlohmann::json& j) { j["buckets"][1]["splits"] = 17; }).message(),
            "plan: buckets[1].splits: must be an integer in [1, 16]");
  EXPECT_FALSE(broken([](nlohmann::json& j) { j["buckets"][1]["splits"] = 1e300; }).ok());
  EXPECT_FALSE(broken([](nlohmann::json& j) { j["buckets"][1]["splits"] = 18446744073709551615ull; }).ok());
  EXPECT_TRUE(broken([](nlohmann::json& j) { j["splits"] = 2.0; }).ok());  // JSON Schema's integer
  EXPECT_FALSE(broken([](nlohmann::json& j) { j["splits"] = 2.5; }).ok());
  const std::string at_bound(PlanLimits::kMaxString, 'm');
  EXPECT_TRUE(broken([&](nlohmann::json& j) { j["partition_rules"][2]["modules"] = {at_bound}; }).ok());
  EXPECT_EQ(broken([&](nlohmann::json& j) { j["partition_rules"][2]["modules"] = {at_bound + "m"}; }).message(),
            "plan: partition_rules[2].modules[0]: is longer than 4096 characters (4097)");
  std::string accents;
  for (size_t i = 0; i < PlanLimits::kMaxString; ++i) accents += "\xc3\xa9";  // 2 bytes, 1 character
  EXPECT_TRUE(broken([&](nlohmann::json& j) { j["device"]["name"] = accents; }).ok());
  EXPECT_FALSE(broken([&](nlohmann::json& j) { j["device"]["name"] = accents + "e"; }).ok());
  EXPECT_EQ(broken([](nlohmann::json& j) {
              j["partition_rules"][2]["modules"] = std::vector<std::string>(PlanLimits::kMaxItems + 1, "m");
            }).message(),
            "plan: partition_rules[2].modules: has 4097 items; at most 4096");
  EXPECT_FALSE(broken([](nlohmann::json& j) {
                 j["partition_rules"] = std::vector<nlohmann::json>(PlanLimits::kMaxRules + 1, j["partition_rules"][0]);
               }).ok());
  EXPECT_FALSE(broken([](nlohmann::json& j) {
                 j["buckets"][1]["streams"] = std::vector<nlohmann::json>(17, j["buckets"][1]["streams"][0]);
               }).ok());
  EXPECT_FALSE(broken([](nlohmann::json& j) { j["buckets"][1]["streams"][0]["id"] = 16; }).ok());
  EXPECT_FALSE(broken([](nlohmann::json& j) { j["device"]["rank"] = 2147483648ll; }).ok());
  EXPECT_FALSE(broken([](nlohmann::json& j) { j["buckets"][0]["max_tokens"] = 1e16; }).ok());
  // A 1 MB unknown key or rule name is quoted cut: 200 bytes, then its length.
  const std::string huge(1 << 20, 'k');
  const std::string msg = broken([&](nlohmann::json& j) { j[huge] = 1; }).message();
  EXPECT_EQ(msg, "plan: unexpected key \"" + huge.substr(0, 200) + "...\" (1048576 bytes)");
  EXPECT_LT(broken([&](nlohmann::json& j) { j["buckets"][1]["rules"][0] = huge; }).message().size(), 300u);
}

// schemas/plan.schema.json and ValidatePlanJson describe the same document.
TEST(PlanTest, SchemaFileAgreesWithTheValidator) {
  std::ifstream f(std::string(DYNAFLOW_SOURCE_DIR) + "/schemas/plan.schema.json");
  ASSERT_TRUE(f.good());
  std::stringstream text;
  text << f.rdbuf();
  const nlohmann::json schema = nlohmann::json::parse(text.str(), nullptr, false);
  ASSERT_FALSE(schema.is_discarded()) << "plan.schema.json is not valid JSON";
  EXPECT_EQ(schema["properties"]["schema"]["const"], kPlanSchema);
  EXPECT_EQ(schema["required"].get<std::vector<std::string>>(), PlanRequiredKeys());
  EXPECT_EQ(schema["properties"]["buckets"]["items"]["required"].get<std::vector<std::string>>(),
            PlanBucketRequiredKeys());
  std::vector<std::string> strategies;
  for (int i = 0; i < kStrategyCount; ++i) strategies.emplace_back(StrategyName(static_cast<Strategy>(i)));
  EXPECT_EQ(schema["$defs"]["strategy"]["enum"].get<std::vector<std::string>>(), strategies);
  // Every top-level property the schema lists is one the writer emits.
  const nlohmann::json j = PlanToJson(Sample());
  for (auto it = schema["properties"].begin(); it != schema["properties"].end(); ++it) {
    EXPECT_TRUE(j.contains(it.key())) << it.key();
  }
  EXPECT_EQ(j.size(), schema["properties"].size());
}

}  // namespace
}  // namespace dynaflow
