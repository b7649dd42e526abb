// Golden and robustness tests of the importers on the real traces in
// ../shared/traces and on malformed files.
#include "analysis/importers/reader.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "analysis/store/store.h"
#include "analysis/timeline/timeline.h"
#include "tests/temp_path.h"

namespace dynaflow {
namespace {

namespace fs = std::filesystem;

fs::path SharedTraces() { return fs::path(DYNAFLOW_SOURCE_DIR) / ".." / "shared" / "traces"; }

#define REQUIRE_SHARED()                                                        \
  if (!fs::exists(SharedTraces())) GTEST_SKIP() << "no ../shared/traces here"

std::string Shared(const std::string& rel) { return (SharedTraces() / rel).string(); }

std::vector<DeviceTimeline> Analyze(const std::vector<std::string>& paths, Trace* trace) {
  Status st = ImportFiles(paths, ImportOptions(), trace);
  EXPECT_TRUE(st.ok()) << st.message();
  return AnalyzeTimelines(*trace, TimelineOptions());
}

void ExpectConsistent(const TimelineBreakdown& t, const std::string& what) {
  EXPECT_NEAR(t.computation_us + t.exposed_comm_us + t.exposed_memcpy_us + t.idle_us, t.total_us,
              1e-6)
      << what;
  EXPECT_LE(t.busy_us, t.total_us + 1e-9) << what;
  EXPECT_LE(t.exposed_comm_us, t.total_comm_us + 1e-9) << what;
  EXPECT_LE(t.exposed_memcpy_us, t.total_memcpy_us + 1e-9) << what;
  EXPECT_GE(t.idle_us, -1e-9) << what;
}

// TraceLens's own gpu_timeline.csv for the same trace, in milliseconds.
std::map<std::string, double> ReadTraceLensCsv(const std::string& path) {
  std::map<std::string, double> out;
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);  // header: type,time ms,percent
  while (std::getline(f, line)) {
    std::stringstream row(line);
    std::string type, ms;
    std::getline(row, type, ',');
    std::getline(row, ms, ',');
    out[type] = std::stod(ms);
  }
  return out;
}

TEST(GoldenTest, MatchesTraceLensOnMi300Bert) {
  REQUIRE_SHARED();
  Trace trace;
  auto devices = Analyze({Shared("kineto/tracelens_mi300_bert_small.json.gz")}, &trace);
  auto expected = ReadTraceLensCsv(Shared("kineto/tracelens_mi300_bert_small.gpu_timeline.csv"));
  ASSERT_EQ(devices.size(), 1u);
  ASSERT_EQ(expected.size(), 8u);
  const TimelineBreakdown& t = devices[0].timeline;
  const double kTolMs = 1e-6;
  EXPECT_NEAR(t.computation_us / 1000, expected["computation_time"], kTolMs);
  EXPECT_NEAR(t.exposed_comm_us / 1000, expected["exposed_comm_time"], kTolMs);
  EXPECT_NEAR(t.exposed_memcpy_us / 1000, expected["exposed_memcpy_time"], kTolMs);
  EXPECT_NEAR(t.busy_us / 1000, expected["busy_time"], kTolMs);
  EXPECT_NEAR(t.idle_us / 1000, expected["idle_time"], kTolMs);
  EXPECT_NEAR(t.total_us / 1000, expected["total_time"], kTolMs);
  EXPECT_NEAR(t.total_comm_us / 1000, expected["total_comm_time"], kTolMs);
  EXPECT_NEAR(t.total_memcpy_us / 1000, expected["total_memcpy_time"], kTolMs);
  EXPECT_EQ(devices[0].profiler_steps, 1);
}

// Expected values computed independently, in exact decimal arithmetic, by
// scripts/timeline_reference.py from the same files.
struct Golden {
  const char* file;
  int64_t events;
  double computation, exposed_comm, exposed_memcpy, busy, total, total_comm, total_memcpy;
};

class KinetoGoldenTest : public ::testing::TestWithParam<Golden> {};

TEST_P(KinetoGoldenTest, TimelineMatchesReference) {
  REQUIRE_SHARED();
  const Golden& g = GetParam();
  Trace trace;
  auto devices = Analyze({Shared(std::string("kineto/") + g.file)}, &trace);
  ASSERT_EQ(devices.size(), 1u);
  const TimelineBreakdown& t = devices[0].timeline;
  const double kTolUs = 1e-6;
  EXPECT_EQ(devices[0].events, g.events);
  EXPECT_NEAR(t.computation_us, g.computation, kTolUs);
  EXPECT_NEAR(t.exposed_comm_us, g.exposed_comm, kTolUs);
  EXPECT_NEAR(t.exposed_memcpy_us, g.exposed_memcpy, kTolUs);
  EXPECT_NEAR(t.busy_us, g.busy, kTolUs);
  EXPECT_NEAR(t.total_us, g.total, kTolUs);
  EXPECT_NEAR(t.total_comm_us, g.total_comm, kTolUs);
  EXPECT_NEAR(t.total_memcpy_us, g.total_memcpy, kTolUs);
}

INSTANTIATE_TEST_SUITE_P(
    RealTraces, KinetoGoldenTest,
    ::testing::Values(
        Golden{"hta_a100_nccl_2ranks.json.gz", 3774, 116046.564, 39529.327, 1924.123, 157500.014,
               660551.005, 46876.493, 2262.781},
        // ns-resolution timestamps (~1.7e15 us): doubles would lose a quarter microsecond.
        Golden{"hta_v100_ns_resolution_rank0.json.gz", 6095, 468739.037, 0, 3715.404, 472454.441,
               480029.179, 0, 3715.404},
        Golden{"kineto_legacy_v100_resnet50.json.gz", 8460, 592066, 0, 11492, 603558, 996477, 0,
               11492},
        Golden{"tracelens_b200_eager.json.gz", 929, 10771.685, 21.953, 802.844, 11596.482,
               84487.178, 21.953, 802.844},
        Golden{"hta_a100_alexnet.json.gz", 98, 10638, 0, 55503, 66141, 12920244, 0, 55503}),
    // Test names from the file names: "hta_a100_alexnet.json.gz" -> "hta_a100_alexnet".
    [](const ::testing::TestParamInfo<Golden>& info) {
      std::string name(info.param.file);
      name = name.substr(0, name.find('.'));
      for (char& c : name) {
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return name;
    });

TEST(RealTracesTest, EveryFileImportsAndGetsAConsistentTimeline) {
  REQUIRE_SHARED();
  int files = 0;
  for (const char* dir : {"kineto", "nsys"}) {
    for (const auto& entry : fs::directory_iterator(SharedTraces() / dir)) {
      const std::string path = entry.path().string();
      if (path.ends_with(".csv")) continue;
      ++files;
      Trace trace;
      auto devices = Analyze({path}, &trace);
      if (path.find("cpu_only") != std::string::npos) {
        EXPECT_TRUE(devices.empty()) << path;
        EXPECT_FALSE(trace.ops.empty()) << path;
        continue;
      }
      ASSERT_FALSE(devices.empty()) << path;
      for (const DeviceTimeline& d : devices) {
        EXPECT_GT(d.events, 0) << path;
        EXPECT_GT(d.timeline.busy_us, 0) << path;
        EXPECT_FALSE(d.streams.empty()) << path;
        ExpectConsistent(d.timeline, path);
      }
    }
  }
  EXPECT_GE(files, 15);
}

TEST(RealTracesTest, SeveralRankFilesAtOnce) {
  REQUIRE_SHARED();
  Trace trace;
  auto devices = Analyze(
      {Shared("kineto/hta_sampled_rank-0.json.gz"), Shared("kineto/hta_sampled_rank-1.json.gz")},
      &trace);
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0].rank, 0);
  EXPECT_EQ(devices[1].rank, 1);
  EXPECT_EQ(devices[0].events, 1204);
  EXPECT_EQ(devices[1].events, 1154);
  EXPECT_NEAR(*devices[0].timeline.comm_hidden_pct,
              100.0 * (396199.0 - 336981.0) / 396199.0, 1e-9);
}

TEST(RealTracesTest, NsysExportHasOneDevicePerDeviceId) {
  REQUIRE_SHARED();
  Trace trace;
  auto devices = Analyze({Shared("nsys/nsysai_h100_2gpu_1s.sqlite")}, &trace);
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0].device, 0);
  EXPECT_EQ(devices[1].device, 1);
  // 1721 kernels + 452 memcpy + 11 memset per device.
  EXPECT_EQ(devices[0].events, 2184);
}

TEST(RealTracesTest, TraceDbRoundTripKeepsTheTimeline) {
  REQUIRE_SHARED();
  Trace direct;
  auto expected = Analyze({Shared("kineto/hta_a100_nccl_2ranks.json.gz")}, &direct);
  const std::string db = TempPath("roundtrip.db");
  ASSERT_TRUE(WriteTraceDb(direct, db).ok());
  Trace reloaded;
  auto actual = Analyze({db}, &reloaded);
  ASSERT_EQ(actual.size(), expected.size());
  EXPECT_EQ(actual[0].events, expected[0].events);
  EXPECT_DOUBLE_EQ(actual[0].timeline.busy_us, expected[0].timeline.busy_us);
  EXPECT_DOUBLE_EQ(actual[0].timeline.exposed_comm_us, expected[0].timeline.exposed_comm_us);
  EXPECT_EQ(reloaded.ops.size(), direct.ops.size());
  EXPECT_EQ(reloaded.api.size(), direct.api.size());
  EXPECT_EQ(reloaded.stats.Get("kineto_flow_events"), direct.stats.Get("kineto_flow_events"));
  fs::remove(db);
}

// Malformed inputs: one clear BadInput, never a crash.
Status ImportBytes(const std::string& name, const std::string& bytes) {
  const std::string path = TempPath(name);
  std::ofstream(path, std::ios::binary) << bytes;
  Trace trace;
  Status st = ImportFiles({path}, ImportOptions(), &trace);
  fs::remove(path);
  return st;
}

TEST(MalformedInputTest, EmptyFile) {
  Status st = ImportBytes("empty.json", "");
  EXPECT_EQ(st.code(), StatusCode::kBadInput);
  EXPECT_NE(st.message().find("empty"), std::string::npos) << st.message();
}

TEST(MalformedInputTest, JsonThatIsNotATrace) {
  Status st = ImportBytes("config.json", "{\"model\": \"llama\", \"layers\": 32}");
  EXPECT_EQ(st.code(), StatusCode::kBadInput);
  EXPECT_NE(st.message().find("traceEvents"), std::string::npos) << st.message();
}

TEST(MalformedInputTest, BinaryGarbage) {
  Status st = ImportBytes("garbage.bin", std::string("\x7f" "ELF\x02\x01\x01\0\0\0", 10));
  EXPECT_EQ(st.code(), StatusCode::kBadInput);
  EXPECT_NE(st.message().find("not a trace"), std::string::npos) << st.message();
}

TEST(MalformedInputTest, TruncatedGzipOfARealTrace) {
  REQUIRE_SHARED();
  std::ifstream f(Shared("kineto/hta_a100_alexnet.json.gz"), std::ios::binary);
  std::string gz((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  Status st = ImportBytes("truncated.json.gz", gz.substr(0, gz.size() / 2));
  EXPECT_EQ(st.code(), StatusCode::kBadInput);
  EXPECT_NE(st.message().find("truncated"), std::string::npos) << st.message();
}

TEST(MalformedInputTest, SqliteWithoutNsysTables) {
  const std::string path = TempPath("other.sqlite");
  fs::remove(path);
  ASSERT_EQ(std::system(("sqlite3 " + path + " 'CREATE TABLE users(id INTEGER);'").c_str()), 0);
  Trace trace;
  Status st = ImportFiles({path}, ImportOptions(), &trace);
  EXPECT_EQ(st.code(), StatusCode::kBadInput);
  EXPECT_NE(st.message().find("without Nsight Systems"), std::string::npos) << st.message();
  fs::remove(path);
}

TEST(MalformedInputTest, MissingFileAndDirectory) {
  Trace trace;
  EXPECT_EQ(ImportFiles({"/nonexistent/trace.json"}, ImportOptions(), &trace).code(),
            StatusCode::kBadInput);
  EXPECT_EQ(ImportFiles({fs::temp_directory_path().string()}, ImportOptions(), &trace).code(),
            StatusCode::kBadInput);
}

// Inputs that would merge two runs into one timeline are refused.
TEST(SeveralInputsTest, TheSameFileTwiceIsRefused) {
  const std::string path = TempPath("twice.json");
  std::ofstream(path) << "{\"traceEvents\": []}";
  Trace trace;
  Status st = ImportFiles({path, path}, ImportOptions(), &trace);
  EXPECT_EQ(st.code(), StatusCode::kBadInput);
  EXPECT_EQ(st.message(), path + ": given twice (also as " + path + ")");
  fs::remove(path);
}

TEST(SeveralInputsTest, TwoFilesOfOneRankAreRefused) {
  const std::string kernel =
      "{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"k\", \"pid\": 0, \"tid\": 7, "
      "\"ts\": 1, \"dur\": 2, \"args\": {\"device\": 0, \"stream\": 7}}";
  auto rank_file = [&](const std::string& name, int rank) {
    const std::string path = TempPath(name);
    std::ofstream(path) << "{\"distributedInfo\": {\"rank\": " << rank
                        << "}, \"traceEvents\": [" << kernel << "]}";
    return path;
  };
  const std::string a = rank_file("rank3-a.json", 3);
  const std::string b = rank_file("rank3-b.json", 3);
  const std::string c = rank_file("rank4.json", 4);
  Trace trace;
  Status st = ImportFiles({a, b}, ImportOptions(), &trace);
  EXPECT_EQ(st.code(), StatusCode::kBadInput);
  EXPECT_EQ(st.message(), b + ": rank 3 is also in an earlier input: give each rank's trace once");
  Trace ok;
  ASSERT_TRUE(ImportFiles({a, c}, ImportOptions(), &ok).ok());
  ASSERT_EQ(ok.devices.size(), 2u);
  EXPECT_EQ(ok.devices[0].rank, 3);
  EXPECT_EQ(ok.devices[1].rank, 4);
  for (const std::string& p : {a, b, c}) fs::remove(p);
}

TEST(ReaderRegistryTest, DetectsFormatByContentNotName) {
  const std::string path = TempPath("misnamed.sqlite");  // JSON despite the name
  std::ofstream(path) << "{\"traceEvents\": [{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"k\","
                         " \"pid\": 0, \"tid\": 7, \"ts\": 1, \"dur\": 2}]}";
  auto probe = ProbeFile(path);
  ASSERT_TRUE(probe.ok());
  auto reader = FindReader(*probe);
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->format(), "kineto");
  fs::remove(path);
}

}  // namespace
}  // namespace dynaflow
