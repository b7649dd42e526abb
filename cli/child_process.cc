#include "cli/child_process.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace dynaflow {

namespace fs = std::filesystem;

fs::path BinaryDir() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path(".") : exe.parent_path();
}

std::string EnvOr(const char* name, const fs::path& fallback) {
  const char* value = getenv(name);
  return value != nullptr && *value != '\0' ? std::string(value) : fallback.string();
}

std::vector<std::string> CurrentEnvironment() {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  return env;
}

// `name=value` prepended to the colon-separated list already in `env`.
void PrependEnv(std::vector<std::string>* env, const std::string& name, const std::string& value) {
  const std::string prefix = name + "=";
  for (std::string& entry : *env) {
    if (entry.compare(0, prefix.size(), prefix) == 0) {
      const std::string old = entry.substr(prefix.size());
      entry = prefix + value + (old.empty() ? "" : ":" + old);
      return;
    }
  }
  env->push_back(prefix + value);
}

// `name=value` in `env`, replacing any value there.
void ReplaceEnv(std::vector<std::string>* env, const std::string& name, const std::string& value) {
  const std::string prefix = name + "=";
  std::erase_if(*env,
                [&](const std::string& e) { return e.compare(0, prefix.size(), prefix) == 0; });
  env->push_back(prefix + value);
}

namespace {

std::vector<char*> CStrings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// The running child, for the signal handler; 0 when there is none.
volatile sig_atomic_t g_child = 0;
constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP};

// Forwards a signal sent to dynaflow by another process (kill). A terminal's
// Ctrl-C or hang-up (SI_KERNEL) already reached the child, which shares the
// foreground process group, and is not sent twice.
void ForwardSignal(int signal, siginfo_t* info, void* /*context*/) {
  if (g_child > 0 && info->si_code != SI_KERNEL) kill(static_cast<pid_t>(g_child), signal);
}

// Blocks or unblocks the forwarded signals; returns the previous mask.
sigset_t MaskForwarded(int how) {
  sigset_t set;
  sigset_t old;
  sigemptyset(&set);
  for (int s : kForwardedSignals) sigaddset(&set, s);
  sigprocmask(how, &set, &old);
  return old;
}

struct Spawned {
  pid_t pid = -1;
  int exec_errno = 0;  // why CMD could not be executed; 0 when it was
};

// In the child, between fork and exec: async-signal-safe calls only. CMD gets
// SIGTERM when dynaflow dies (SIGKILL, say) rather than running on orphaned:
// the tracer in it then finishes its store, which the next `dynaflow import`
// of the parts folder finds. `parent` is dynaflow's pid: had it died before
// the prctl, the child is already orphaned and ends itself.
[[noreturn]] void ExecChild(char** argv, char** envp, int error_pipe, const sigset_t& mask,
                            pid_t parent) {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int s : kForwardedSignals) sigaction(s, &dfl, nullptr);
  (void)prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent) _exit(128 + SIGTERM);
  sigprocmask(SIG_SETMASK, &mask, nullptr);
  execvpe(argv[0], argv, envp);
  const int err = errno;
  (void)!write(error_pipe, &err, sizeof(err));
  _exit(127);
}

// Starts `command` with forwarding handlers in place. exec's errno comes back
// through a close-on-exec pipe: nothing to read means exec succeeded.
StatusOr<Spawned> Spawn(std::vector<std::string> command, std::vector<std::string> env) {
  std::vector<char*> argv = CStrings(command);
  std::vector<char*> envp = CStrings(env);
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0)
    return Status::Failure(std::string("pipe: ") + strerror(errno));

  struct sigaction forward {};
  forward.sa_sigaction = &ForwardSignal;
  forward.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&forward.sa_mask);
  const sigset_t old_mask = MaskForwarded(SIG_BLOCK);
  for (int s : kForwardedSignals) sigaction(s, &forward, nullptr);

  Spawned spawned;
  const pid_t self = getpid();
  spawned.pid = fork();
  if (spawned.pid == 0) ExecChild(argv.data(), envp.data(), pipe_fds[1], old_mask, self);
  const int fork_errno = errno;
  if (spawned.pid > 0) g_child = spawned.pid;
  sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  close(pipe_fds[1]);
  if (spawned.pid < 0) {
    close(pipe_fds[0]);
    return Status::Failure(std::string("fork: ") + strerror(fork_errno));
  }
  int err = 0;
  ssize_t n;
  do {
    n = read(pipe_fds[0], &err, sizeof(err));
  } while (n < 0 && errno == EINTR);
  close(pipe_fds[0]);
  if (n == static_cast<ssize_t>(sizeof(err))) spawned.exec_errno = err;
  return spawned;
}

// Waits for the child; its exit code, or 128+N when signal N killed it. The
// forwarded signals get their default action back (dynaflow has no handlers
// of its own): an interrupt while the trace is merged stops dynaflow.
int WaitForChild(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const sigset_t old_mask = MaskForwarded(SIG_BLOCK);
  g_child = 0;
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int s : kForwardedSignals) sigaction(s, &dfl, nullptr);
  sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

StatusOr<ChildExit> RunChild(std::vector<std::string> command, std::vector<std::string> env) {
  StatusOr<Spawned> child = Spawn(std::move(command), std::move(env));
  if (!child.ok()) return child.status();
  ChildExit out;
  out.exit_code = WaitForChild(child->pid);
  out.exec_errno = child->exec_errno;
  return out;
}

std::string ExecFailure(const std::string& program, int err) {
  return program + ": " + (err == ENOENT ? "command not found" : strerror(err));
}

int ExecExitCode(int err) { return err == ENOENT ? 127 : 126; }

}  // namespace dynaflow
