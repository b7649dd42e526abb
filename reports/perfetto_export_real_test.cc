// The export on real Kineto traces (../shared/traces): import -> export ->
// import gives back every record with every field the model keeps, including
// those trace.db does not (strides, concrete inputs, collective metadata,
// sync ids, distributedInfo, deviceProperties, process labels). Skipped when
// ../shared/traces is absent.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "analysis/importers/kineto/kineto_parser.h"
#include "analysis/importers/reader.h"
#include "reports/perfetto_export.h"

namespace dynaflow {
namespace {

namespace fs = std::filesystem;

fs::path SharedTraces() { return fs::path(DYNAFLOW_SOURCE_DIR) / ".." / "shared" / "traces"; }

std::string S(const Trace& t, StringId id) { return std::string(t.strings.Get(id)); }

// Every rank of `t` exported and read back into one trace.
Trace ExportAndImport(const Trace& t) {
  Trace back;
  for (int32_t rank : TraceRanks(t)) {
    std::ostringstream out;
    WritePerfettoJson(t, rank, out);
    const Status st = ParseKinetoJson(out.str(), rank, &back);
    EXPECT_TRUE(st.ok()) << st.message();
  }
  return back;
}

void ExpectSameOps(const Trace& t, const Trace& back) {
  ASSERT_EQ(back.ops.size(), t.ops.size());
  for (size_t i = 0; i < t.ops.size(); ++i) {
    const Operator& a = t.ops[i];
    const Operator& b = back.ops[i];
    ASSERT_EQ(std::tie(b.start, b.end, b.rank, b.pid, b.tid, b.external_id, b.sequence),
              std::tie(a.start, a.end, a.rank, a.pid, a.tid, a.external_id, a.sequence))
        << "operator " << i << " " << S(t, a.name);
    ASSERT_EQ(S(back, b.name), S(t, a.name));
    ASSERT_EQ(S(back, b.input_shapes), S(t, a.input_shapes)) << i;
    ASSERT_EQ(S(back, b.input_types), S(t, a.input_types)) << i;
    ASSERT_EQ(S(back, b.input_strides), S(t, a.input_strides)) << i;
    ASSERT_EQ(S(back, b.concrete_inputs), S(t, a.concrete_inputs)) << i;
    ASSERT_EQ(S(back, b.collective), S(t, a.collective)) << i;
    ASSERT_EQ(S(back, b.module_path), S(t, a.module_path)) << i;
  }
}

void ExpectSameApi(const Trace& t, const Trace& back) {
  ASSERT_EQ(back.api.size(), t.api.size());
  for (size_t i = 0; i < t.api.size(); ++i) {
    const ApiCall& a = t.api[i];
    const ApiCall& b = back.api[i];
    ASSERT_EQ(std::tie(b.start, b.end, b.rank, b.pid, b.tid, b.correlation, b.external_id, b.kind,
                       b.sync_device, b.sync_stream, b.wait_on_stream, b.wait_event_id,
                       b.wait_event_correlation),
              std::tie(a.start, a.end, a.rank, a.pid, a.tid, a.correlation, a.external_id, a.kind,
                       a.sync_device, a.sync_stream, a.wait_on_stream, a.wait_event_id,
                       a.wait_event_correlation))
        << "API call " << i << " " << S(t, a.name);
    ASSERT_EQ(S(back, b.name), S(t, a.name));
  }
}

void ExpectSameGpu(const Trace& t, const Trace& back) {
  ASSERT_EQ(back.gpu.size(), t.gpu.size());
  for (size_t i = 0; i < t.gpu.size(); ++i) {
    const GpuActivity& a = t.gpu[i];
    const GpuActivity& b = back.gpu[i];
    const DeviceInfo& da = t.devices[a.device_index];
    const DeviceInfo& db = back.devices[b.device_index];
    ASSERT_EQ(std::tie(b.start, b.end, db.rank, db.device, b.stream, b.correlation, b.external_id,
                       b.bytes, b.kind, b.registers, b.shared_memory),
              std::tie(a.start, a.end, da.rank, da.device, a.stream, a.correlation, a.external_id,
                       a.bytes, a.kind, a.registers, a.shared_memory))
        << "GPU activity " << i << " " << S(t, a.name);
    for (int d = 0; d < 3; ++d) {
      ASSERT_EQ(b.grid[d], a.grid[d]);
      ASSERT_EQ(b.block[d], a.block[d]);
    }
    ASSERT_EQ(S(back, b.name), S(t, a.name));
    ASSERT_EQ(S(back, b.copy_kind), S(t, a.copy_kind));
    ASSERT_EQ(S(back, b.collective), S(t, a.collective)) << i;
  }
}

void ExpectSameRest(const Trace& t, const Trace& back) {
  ASSERT_EQ(back.ranges.size(), t.ranges.size());
  for (size_t i = 0; i < t.ranges.size(); ++i) {
    const Range& a = t.ranges[i];
    const Range& b = back.ranges[i];
    ASSERT_EQ(std::tie(b.start, b.end, b.rank, b.pid, b.tid, b.domain),
              std::tie(a.start, a.end, a.rank, a.pid, a.tid, a.domain))
        << "range " << i;
    ASSERT_EQ(S(back, b.name), S(t, a.name));
  }
  ASSERT_EQ(back.devices.size(), t.devices.size());
  for (size_t i = 0; i < t.devices.size(); ++i) {
    const DeviceInfo& a = t.devices[i];
    const DeviceInfo& b = back.devices[i];
    EXPECT_EQ(std::tie(b.rank, b.device, b.name, b.sm_count, b.cc_major, b.cc_minor,
                       b.memory_bytes),
              std::tie(a.rank, a.device, a.name, a.sm_count, a.cc_major, a.cc_minor,
                       a.memory_bytes));
    // A device the file had no entry for may get one built from the model.
    if (!a.properties_json.empty()) EXPECT_EQ(b.properties_json, a.properties_json);
  }
  // A process or thread named twice alike is written once.
  using P = std::tuple<int32_t, int32_t, std::string, std::string>;
  std::set<P> pa, pb;
  for (const ProcessInfo& p : t.processes) pa.emplace(p.rank, p.pid, p.name, p.label);
  for (const ProcessInfo& p : back.processes) pb.emplace(p.rank, p.pid, p.name, p.label);
  EXPECT_EQ(pb, pa);
  using Th = std::tuple<int32_t, int32_t, int32_t, std::string>;
  std::set<Th> ta, tb;
  for (const ThreadInfo& th : t.threads) ta.emplace(th.rank, th.pid, th.tid, th.name);
  for (const ThreadInfo& th : back.threads) tb.emplace(th.rank, th.pid, th.tid, th.name);
  EXPECT_EQ(tb, ta);
  for (const auto& [rank, info] : t.distributed_info) {
    ASSERT_EQ(back.distributed_info.count(rank), 1u);
    EXPECT_EQ(back.distributed_info.at(rank), info);
  }
}

class PerfettoExportRealTest : public testing::TestWithParam<std::vector<std::string>> {};

TEST_P(PerfettoExportRealTest, ImportExportImportKeepsEveryField) {
  if (!fs::exists(SharedTraces())) GTEST_SKIP() << "no ../shared/traces here";
  std::vector<std::string> paths;
  for (const std::string& rel : GetParam()) paths.push_back((SharedTraces() / rel).string());
  Trace t;
  const Status st = ImportFiles(paths, ImportOptions{}, &t);
  ASSERT_TRUE(st.ok()) << st.message();
  const Trace back = ExportAndImport(t);
  ExpectSameOps(t, back);
  ExpectSameApi(t, back);
  ExpectSameGpu(t, back);
  ExpectSameRest(t, back);
}

INSTANTIATE_TEST_SUITE_P(
    SharedTraces, PerfettoExportRealTest,
    testing::Values(std::vector<std::string>{"kineto/hta_a100_nccl_2ranks.json.gz"},
                    std::vector<std::string>{"kineto/hta_event_sync_multi_stream.json.gz"},
                    std::vector<std::string>{"kineto/tracelens_b200_eager.json.gz"},
                    std::vector<std::string>{"kineto/hta_sampled_rank-0.json.gz",
                                             "kineto/hta_sampled_rank-1.json.gz"},
                    std::vector<std::string>{"kineto/kineto_legacy_v100_resnet50.json.gz"},
                    std::vector<std::string>{"kineto/tracelens_mi300_bert_small.json.gz"},
                    std::vector<std::string>{"kineto/hta_v100_ns_resolution_rank0.json.gz"}));

}  // namespace
}  // namespace dynaflow
