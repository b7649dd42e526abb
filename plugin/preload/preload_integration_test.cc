// libdynaflow_preload.so inside real processes: LD_PRELOADed into programs
// that know nothing of it (no GPU or driver here, so CUPTI is unavailable),
// and linked into a program that records a burst through the C ABI.
#include <SQLiteCpp/SQLiteCpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <thread>

#include "analysis/store/store.h"
#include "plugin/preload/tracer.h"

namespace dynaflow {
namespace {

namespace fs = std::filesystem;

// An instrumented library cannot be preloaded into uninstrumented programs:
// the sanitizer runtime has to come first in the process. Those tests are
// skipped in sanitizer builds (the burst test, which links the library
// instead, runs everywhere).
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

#define SKIP_IF_SANITIZED()                                                         \
  if (kSanitized) GTEST_SKIP() << "a sanitized library cannot be LD_PRELOADed into " \
                                  "uninstrumented programs"

struct Child {
  pid_t pid = -1;
  int stdout_fd = -1;
};

// Starts `argv` with `env` added to this process's environment, stdout to a
// pipe.
Child Start(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  int out[2];
  if (pipe(out) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    close(out[0]);
    close(out[1]);
    for (const std::string& var : env) putenv(const_cast<char*>(var.c_str()));
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(out[1]);
  return {pid, out[0]};
}

// Waits for `child`; returns its wait status, and its stdout in *output.
int Wait(const Child& child, std::string* output = nullptr) {
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = read(child.stdout_fd, buf, sizeof(buf))) > 0) text.append(buf, n);
  close(child.stdout_fd);
  int status = -1;
  waitpid(child.pid, &status, 0);
  if (output != nullptr) *output = text;
  return status;
}

int RunToEnd(const std::vector<std::string>& argv, const std::vector<std::string>& env,
        pid_t* pid = nullptr, std::string* output = nullptr) {
  const Child child = Start(argv, env);
  if (pid != nullptr) *pid = child.pid;
  return Wait(child, output);
}

class PreloadTest : public ::testing::Test {
 protected:
  PreloadTest()
      : dir_(fs::temp_directory_path() /
             ("preload-" + std::string(::testing::UnitTest::GetInstance()
                                           ->current_test_info()
                                           ->name()) +
              "-" + std::to_string(getpid()))) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~PreloadTest() override { fs::remove_all(dir_); }

  std::vector<std::string> TracedEnv() const {
    return {"LD_PRELOAD=" DYNAFLOW_PRELOAD_LIB, "DYNAFLOW_OUTPUT_DIR=" + dir_.string()};
  }

  // The stores in the output directory, by pid.
  std::set<std::string> Stores() const {
    std::set<std::string> out;
    for (const fs::directory_entry& e : fs::directory_iterator(dir_)) {
      out.insert(e.path().filename().string());
    }
    return out;
  }

  std::string StorePath(pid_t pid) const { return (dir_ / (std::to_string(pid) + ".db")).string(); }

  Trace Read(pid_t pid) const {
    Trace t;
    const Status st = ReadTraceDb(StorePath(pid), &t);
    EXPECT_TRUE(st.ok()) << st.message();
    return t;
  }

  fs::path dir_;
};

TEST_F(PreloadTest, ProgramsKeepTheirExitCodeAndLeaveOneStore) {
  SKIP_IF_SANITIZED();
  pid_t pid;
  const int status = RunToEnd({"/bin/true"}, TracedEnv(), &pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(Stores(), std::set<std::string>{std::to_string(pid) + ".db"});  // no -wal, no -shm
  Trace t = Read(pid);
  EXPECT_EQ(t.metadata["format"], "dynaflow");
  EXPECT_EQ(t.metadata["pid"], std::to_string(pid));
  EXPECT_EQ(t.metadata["cupti"].rfind("unavailable: ", 0), 0u) << t.metadata["cupti"];
  EXPECT_EQ(t.metadata["command_line"], "/bin/true");
  EXPECT_EQ(t.metadata["dropped_records"], "0");
  EXPECT_EQ(t.metadata["final_flush"], "c_exit");  // the constructor's exit handler

  fs::remove(StorePath(pid));
  const int seven = RunToEnd({"/bin/sh", "-c", "exit 7"}, TracedEnv(), &pid);
  ASSERT_TRUE(WIFEXITED(seven));
  EXPECT_EQ(WEXITSTATUS(seven), 7);
  EXPECT_EQ(Stores(), std::set<std::string>{std::to_string(pid) + ".db"});
}

// A program that initialises CUDA gets its final flush from an exit handler
// registered at cuInit (InitializeInjection), after libcuda and libcupti
// loaded: exit() runs it before their static destructors. (CUPTI is kept out
// here: no GPU, so a CUPTI that cannot load.)
TEST_F(PreloadTest, AfterCudaInitTheFinalFlushRunsBeforeCudasTeardown) {
  SKIP_IF_SANITIZED();
  pid_t pid;
  std::vector<std::string> env = TracedEnv();
  env.push_back("DYNAFLOW_CUPTI_PATH=" + (dir_ / "no-libcupti.so").string());
  const int status = RunToEnd({DYNAFLOW_INJECTION_HELPER}, env, &pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  Trace t = Read(pid);
  EXPECT_EQ(t.metadata["final_flush"], "c_exit_after_cuda_init");
  EXPECT_EQ(t.metadata["cupti"].rfind("unavailable: ", 0), 0u) << t.metadata["cupti"];
}

TEST_F(PreloadTest, WithoutOutputDirectoryTheLibraryDoesNothing) {
  SKIP_IF_SANITIZED();
  std::string environment;
  const int status = RunToEnd({"/usr/bin/env"}, {"LD_PRELOAD=" DYNAFLOW_PRELOAD_LIB}, nullptr,
                              &environment);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(environment.find("CUDA_INJECTION64_PATH"), std::string::npos);
  EXPECT_EQ(environment.find("NVTX_INJECTION64_PATH"), std::string::npos);
  EXPECT_TRUE(Stores().empty());

  // Traced, the library claims both injection hooks for itself.
  RunToEnd({"/usr/bin/env"}, TracedEnv(), nullptr, &environment);
  const std::string own = fs::canonical(DYNAFLOW_PRELOAD_LIB).string();
  EXPECT_NE(environment.find("CUDA_INJECTION64_PATH=" + own + "\n"), std::string::npos);
  EXPECT_NE(environment.find("NVTX_INJECTION64_PATH=" + own + "\n"), std::string::npos);
}

TEST_F(PreloadTest, ForkedChildrenAreTracedUnderTheirOwnPids) {
  SKIP_IF_SANITIZED();
  pid_t parent;
  const int status = RunToEnd({DYNAFLOW_FORK_HELPER}, TracedEnv(), &parent);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 5);  // the parent saw its children exit with 3 and 4
  const std::set<std::string> stores = Stores();
  ASSERT_EQ(stores.size(), 3u);
  ASSERT_EQ(stores.count(std::to_string(parent) + ".db"), 1u);
  Trace p = Read(parent);
  ASSERT_EQ(p.ops.size(), 1u);
  EXPECT_EQ(p.strings.Get(p.ops[0].name), "parent_op");
  // Ids unique across the processes: the parent's second, the child's first.
  EXPECT_EQ(p.ops[0].external_id, static_cast<int64_t>(FirstOperatorId(parent) + 1));
  int recording_children = 0;
  int idle_children = 0;
  for (const std::string& name : stores) {
    const pid_t child = std::stoi(name);
    if (child == parent) continue;
    Trace c = Read(child);
    EXPECT_EQ(c.metadata["pid"], std::to_string(child));
    if (c.ops.empty()) {
      ++idle_children;
      continue;
    }
    ++recording_children;
    ASSERT_EQ(c.ops.size(), 1u);
    EXPECT_EQ(c.strings.Get(c.ops[0].name), "child_op");
    EXPECT_EQ(c.ops[0].pid, child);
    EXPECT_EQ(c.ops[0].external_id, static_cast<int64_t>(FirstOperatorId(child)));
  }
  EXPECT_EQ(recording_children, 1);
  EXPECT_EQ(idle_children, 1);
}

TEST_F(PreloadTest, SigtermKeepsItsExitStatusAndLeavesTheStore) {
  SKIP_IF_SANITIZED();
  const Child sleeper = Start({"/bin/sleep", "30"}, TracedEnv());
  const std::string store = StorePath(sleeper.pid);
  for (int i = 0; i < 500 && !fs::exists(store); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(fs::exists(store));
  ASSERT_EQ(kill(sleeper.pid, SIGTERM), 0);
  const int status = Wait(sleeper);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  EXPECT_EQ(Stores(), std::set<std::string>{std::to_string(sleeper.pid) + ".db"});
  EXPECT_EQ(Read(sleeper.pid).metadata["format"], "dynaflow");
  SQLite::Database db(store, SQLite::OPEN_READONLY);
  EXPECT_EQ(db.execAndGet("PRAGMA integrity_check").getString(), "ok");
}

TEST_F(PreloadTest, MillionOperatorsThroughTheCAbiWithoutLoss) {
  pid_t pid;
  const int status = RunToEnd({DYNAFLOW_BURST_HELPER, "4", "250000"},
                              {"DYNAFLOW_OUTPUT_DIR=" + dir_.string()}, &pid);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  SQLite::Database db(StorePath(pid), SQLite::OPEN_READONLY);
  EXPECT_EQ(db.execAndGet("SELECT count(*) FROM operators").getInt64(), 1000000);
  EXPECT_EQ(db.execAndGet("SELECT count(DISTINCT external_id) FROM operators").getInt64(),
            1000000);
  EXPECT_EQ(db.execAndGet("SELECT value FROM meta WHERE key = 'dropped_records'").getString(),
            "0");
  EXPECT_EQ(db.execAndGet("SELECT count(*) FROM import_stats").getInt64(), 0);
}

// A stack overflow leaves no stack for the crash handler: it runs on the
// alternate stack the library gives the main thread, every thread started
// after it, and a thread it did not start at its first operator, so the
// program still dies of SIGSEGV and keeps what it recorded (less than the
// writer's one second between timed flushes, so without the handler it would
// keep nothing).
class StackOverflowTest : public PreloadTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(StackOverflowTest, KeepsWhatWasRecorded) {
  if (kSanitized) GTEST_SKIP() << "the sanitizer runtime handles stack overflows itself";
  pid_t pid;
  const int status = RunToEnd({DYNAFLOW_BURST_HELPER, "2", "500", GetParam()},
                              {"DYNAFLOW_OUTPUT_DIR=" + dir_.string()}, &pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << status;
  EXPECT_EQ(WTERMSIG(status), SIGSEGV);
  SQLite::Database db(StorePath(pid), SQLite::OPEN_READONLY);
  // The raw thread's own operator besides the burst's.
  const int64_t expected = std::strcmp(GetParam(), "raw_thread_overflow") == 0 ? 1001 : 1000;
  EXPECT_EQ(db.execAndGet("SELECT count(*) FROM operators").getInt64(), expected);
  EXPECT_EQ(db.execAndGet("SELECT value FROM meta WHERE key = 'exit_signal'").getString(),
            "SIGSEGV");
  EXPECT_EQ(db.execAndGet("PRAGMA integrity_check").getString(), "ok");
}

INSTANTIATE_TEST_SUITE_P(OnTheMainThreadAndOnOtherThreads, StackOverflowTest,
                         ::testing::Values("overflow", "thread_overflow", "raw_thread_overflow"));

}  // namespace
}  // namespace dynaflow
