#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <vector>

#include "analysis/importers/reader.h"
#include "cli/commands.h"
#include "cli/trace_parts.h"
#include "reports/format.h"

namespace dynaflow {

namespace {

// A validator that parses the value as a number and checks it with `ok`.
CLI::Validator NumberCheck(bool (*ok)(double), const char* rule) {
  return CLI::Validator(
      [ok, rule](std::string& value) -> std::string {
        double number = 0;
        if (!CLI::detail::lexical_cast(value, number) || !ok(number)) {
          return "must be a number " + std::string(rule) + ", not " + value;
        }
        return {};
      },
      std::string("NUMBER ") + rule);
}

}  // namespace

const CLI::Validator kNonNegative = NumberCheck([](double v) { return v >= 0; }, ">= 0");
const CLI::Validator kPositive = NumberCheck([](double v) { return v > 0; }, "> 0");

int Fail(const Status& status) {
  std::cerr << "dynaflow: " << status.message() << "\n";
  return status.exit_code();
}

namespace {

bool ProgressShown() { return isatty(STDERR_FILENO) != 0; }

// Progress on stderr, only when it is a terminal, at most four times a second:
// "importing NAME: 45%". `display` maps a path to the name shown.
ImportOptions ProgressOptions(std::function<std::string(const std::string&)> display) {
  ImportOptions options;
  if (!ProgressShown()) return options;
  struct State {
    std::chrono::steady_clock::time_point last;
    std::string name;
  };
  auto state = std::make_shared<State>();
  options.on_file = [state, display](const std::string& path) {
    state->name = std::filesystem::path(display(path)).filename().string();
    state->last = {};  // show the new name at once
  };
  options.progress = [state](int64_t done, int64_t total) {
    auto now = std::chrono::steady_clock::now();
    if (now - state->last < std::chrono::milliseconds(250)) return;
    state->last = now;
    const std::string name = Shorten(state->name, 40);
    if (total > 0) {
      std::fprintf(stderr, "\r\033[Kimporting %s: %3d%%", name.c_str(),
                   static_cast<int>(100 * done / total));
    } else {
      std::fprintf(stderr, "\r\033[Kimporting %s: %.1f MB", name.c_str(),
                   static_cast<double>(done) / 1e6);
    }
    std::fflush(stderr);
  };
  return options;
}

}  // namespace

namespace {

// Standard input copied into a fresh temporary file, removed on destruction:
// the readers need a file (SQLite opens one; gzip and format detection probe
// its head before reading).
class StdinSpool {
 public:
  ~StdinSpool() {
    if (!path_.empty()) std::remove(path_.c_str());
  }
  const std::string& path() const { return path_; }

  Status Fill() {
    if (isatty(STDIN_FILENO) != 0) {
      return Status::BadInput("-: standard input is a terminal; pipe a trace into it");
    }
    std::string templ = (std::filesystem::temp_directory_path() / "dynaflow-stdin-XXXXXX").string();
    const int fd = mkstemp(templ.data());
    if (fd < 0) return Status::Failure("cannot create a temporary file in " + templ + ": " + std::strerror(errno));
    path_ = templ;
    std::FILE* out = fdopen(fd, "wb");
    if (out == nullptr) {
      close(fd);
      return CannotWrite(path_);
    }
    std::vector<char> buf(1 << 20);
    size_t n = 0;
    bool ok = true;
    while (ok && (n = std::fread(buf.data(), 1, buf.size(), stdin)) > 0) {
      ok = std::fwrite(buf.data(), 1, n, out) == n;
    }
    ok = ok && !std::ferror(stdin);
    const bool closed = std::fclose(out) == 0;
    if (!ok || !closed) return Status::Failure("-: cannot copy standard input to " + path_);
    return Status::Ok();
  }

 private:
  std::string path_;
};

// `message` with every `from` replaced by `to`.
std::string ReplaceAll(std::string message, const std::string& from, const std::string& to) {
  for (size_t at = message.find(from); at != std::string::npos; at = message.find(from, at + to.size())) {
    message.replace(at, from.size(), to);
  }
  return message;
}

}  // namespace

// A parts folder that `dynaflow trace` left when it died (the traced
// processes' own stores, finished by them): merged as `trace` would have.
Status LoadPartsFolder(const std::string& dir, Trace* trace) {
  const PartsSummary summary = MergeParts(dir, trace);
  if (summary.processes == 0) return Status::BadInput(dir + ": no readable process store in it");
  WarnSharedRanks(summary);
  std::cerr << "dynaflow: recovered " << summary.processes
            << (summary.processes == 1 ? " process store" : " process stores") << " from " << dir
            << "\n";
  return Status::Ok();
}

Status LoadInputs(const std::vector<std::string>& inputs, Trace* trace, RecordSink* sink) {
  for (const std::string& input : inputs) {
    if (!IsPartsFolder(input)) continue;
    if (inputs.size() > 1) {
      return Status::BadInput(input + ": a parts folder is read alone, not with other inputs");
    }
    return LoadPartsFolder(input, trace);
  }
  // "-" is standard input, once.
  std::vector<std::string> paths = inputs;
  StdinSpool spool;
  for (std::string& path : paths) {
    if (path != "-") continue;
    if (!spool.path().empty()) return Status::BadInput("-: standard input given twice");
    DF_RETURN_IF_ERROR(spool.Fill());
    path = spool.path();
  }
  const std::string spooled = spool.path();
  ImportOptions options = ProgressOptions(
      [spooled](const std::string& path) { return !spooled.empty() && path == spooled ? "-" : path; });
  options.sink = sink;
  Status st = ImportFiles(paths, options, trace);
  ShowPhase("");
  if (!st.ok() && !spool.path().empty()) {
    // Messages name the input as the user did.
    const std::string message = ReplaceAll(st.message(), spool.path(), "-");
    return st.code() == StatusCode::kBadInput ? Status::BadInput(message) : Status::Failure(message);
  }
  return st;
}

void ShowPhase(const std::string& phase) {
  if (!ProgressShown()) return;
  if (phase.empty()) {
    std::fprintf(stderr, "\r\033[K");
  } else {
    std::fprintf(stderr, "\r\033[K%s...", phase.c_str());
  }
  std::fflush(stderr);
}

Status CannotWrite(const std::string& path) {
  return Status::Failure(path + ": cannot write: " + std::strerror(errno));
}

Status CheckOutputPath(const std::string& path) {
  if (path.empty() || path == "-") return Status::Ok();
  std::error_code probe;
  const auto status = std::filesystem::status(path, probe);
  if (std::filesystem::is_directory(status)) return Status::BadInput(path + ": cannot write: is a directory");
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) return Status::Ok();
  const std::string tmp = path + ".tmp-" + std::to_string(getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return Status::BadInput(path + ": cannot write: " + std::strerror(errno));
  std::fclose(f);
  std::remove(tmp.c_str());
  return Status::Ok();
}

Status WriteOutput(const std::string& path, const std::string& text) {
  if (path.empty() || path == "-") {
    std::cout << text;
    std::cout.flush();
    return std::cout ? Status::Ok() : Status::Failure("cannot write to stdout");
  }
  // A device or FIFO (-o /dev/null) is written in place: renaming a temporary
  // file over it would replace it with a regular file.
  std::error_code probe;
  const auto status = std::filesystem::status(path, probe);
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    std::ofstream f(path, std::ios::binary);
    if (f) f << text;
    return f ? Status::Ok() : CannotWrite(path);
  }
  const std::string tmp = path + ".tmp-" + std::to_string(getpid());
  {
    std::ofstream f(tmp, std::ios::binary);
    if (f) f << text;
    if (!f) {
      const Status st = CannotWrite(path);
      std::remove(tmp.c_str());
      return st;
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    return Status::Failure(path + ": cannot write: " + ec.message());
  }
  return Status::Ok();
}

}  // namespace dynaflow
