// The launcher, end to end: exit statuses, faults, signals, and that no
// process and no /dev/shm name of the job survives any of it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

namespace {

struct RunResult {
  int status = -1;  // exit code of the launcher (128 + signal if killed)
  std::string output;
  double seconds = 0;
  std::vector<int> pids;
  std::string job;
};

// Runs `coremesh run -n N fault_prog mode`; with `signal_on_ready`, sends
// that signal to the launcher once every PE has printed "ready" (`times`
// times, half a second apart).
RunResult run_job(int n, const std::string& mode, int signal_on_ready = 0,
                  const std::vector<std::string>& env = {}, int times = 1) {
  int out[2];
  EXPECT_EQ(pipe(out), 0);
  const auto start = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(out[1], 2);
    close(out[0]);
    for (const std::string& e : env) putenv(const_cast<char*>(e.c_str()));
    const std::string np = std::to_string(n);
    execl(CM_SHMEM_RUN, CM_SHMEM_RUN, "run", "-n", np.c_str(), CM_SHMEM_FAULT_PROG, mode.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  RunResult r;
  bool signalled = false;
  char buf[4096];
  for (;;) {
    pollfd p{out[0], POLLIN, 0};
    poll(&p, 1, 100);
    const ssize_t got = read(out[0], buf, sizeof buf);
    if (got == 0) break;
    if (got > 0) r.output.append(buf, static_cast<size_t>(got));
    size_t ready = 0;
    for (size_t at = 0; (at = r.output.find("ready\n", at)) != std::string::npos; ++at) ++ready;
    if (signal_on_ready && !signalled && ready == static_cast<size_t>(n)) {
      usleep(200'000);  // let them fall asleep in the wait
      for (int i = 0; i < times; ++i) {
        if (i > 0) usleep(500'000);
        kill(pid, signal_on_ready);
      }
      signalled = true;
    }
  }
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::regex line(R"(pe (\d+) pid (\d+) job (\w+))");
  for (std::sregex_iterator it(r.output.begin(), r.output.end(), line), end; it != end; ++it) {
    r.pids.push_back(std::stoi((*it)[2]));
    r.job = (*it)[3];
  }
  return r;
}

void expect_nothing_left(const RunResult& r) {
  for (int pid : r.pids) EXPECT_NE(kill(pid, 0), 0) << "PE process " << pid << " survived";
  EXPECT_FALSE(r.job.empty());
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm"))
    EXPECT_EQ(entry.path().filename().string().find("cm-" + r.job), std::string::npos)
        << entry.path() << " survived";
}

}  // namespace

TEST(Launcher, HappyPathReturnsZero) {
  RunResult r = run_job(3, "ok");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.pids.size(), 3u) << r.output;
  expect_nothing_left(r);
}

TEST(Launcher, KilledPeStopsTheOthersAndIsNamed) {
  RunResult r = run_job(4, "kill9");
  EXPECT_EQ(r.status, 128 + 9) << r.output;
  EXPECT_NE(r.output.find("PE 1 was killed by signal 9"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 5.0) << r.output;
  expect_nothing_left(r);
}

TEST(Launcher, ExitStatusOfFailingPeIsReturned) {
  RunResult r = run_job(3, "exit3");
  EXPECT_EQ(r.status, 3) << r.output;
  EXPECT_NE(r.output.find("PE 2 exited with status 3"), std::string::npos) << r.output;
  // the others, stopped in their barrier, name the same cause (they blamed "PE 0 ... status 0")
  EXPECT_EQ(r.output.find("status 0"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 5.0);
  expect_nothing_left(r);
}

TEST(Launcher, GlobalExitStopsEveryone) {
  RunResult r = run_job(4, "global_exit");
  EXPECT_EQ(r.status, 7) << r.output;
  EXPECT_NE(r.output.find("PE 3 called shmem_global_exit(7); stopping the other 3 PEs"), std::string::npos)
      << r.output;
  EXPECT_LT(r.seconds, 5.0);
  expect_nothing_left(r);
}

TEST(Launcher, MismatchedAllocationFailsOnEveryPe) {
  RunResult r = run_job(3, "mismatch");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("PE 0: 1024 B at alignment 128, PE 1: 4096 B at alignment 128, PE 2: "
                          "1024 B at alignment 128"),
            std::string::npos)
      << r.output;
  expect_nothing_left(r);
}

TEST(Launcher, ExhaustedHeapIsExplained) {
  RunResult r = run_job(2, "exhaust");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("symmetric heap exhausted"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("B used in"), std::string::npos) << r.output;
  expect_nothing_left(r);
}

TEST(Launcher, WatchdogNamesTheMissingPe) {
  RunResult r = run_job(3, "watchdog", 0, {"COREMESH_WAIT_TIMEOUT_S=1"});
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("for PEs 0 to arrive"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 10.0);
  expect_nothing_left(r);
}

TEST(Launcher, SigintAndSigtermToLauncherCleanUp) {
  for (int sig : {SIGINT, SIGTERM}) {
    RunResult r = run_job(4, "hang", sig);
    EXPECT_EQ(r.status, 128 + sig) << r.output;
    EXPECT_LT(r.seconds, 10.0) << r.output;
    expect_nothing_left(r);
  }
}

// The first stop signal reaches every PE, which may end in order (a
// training job saves a checkpoint): the PEs exiting 128 + signal are not
// failures, and the job's status is 128 + signal.
TEST(Launcher, FirstStopSignalIsPassedOnAndPesEndInOrder) {
  for (int sig : {SIGINT, SIGTERM}) {
    RunResult r = run_job(3, "graceful", sig);
    EXPECT_EQ(r.status, 128 + sig) << r.output;
    EXPECT_NE(r.output.find("passed it on to the 3 PEs"), std::string::npos) << r.output;
    for (int pe = 0; pe < 3; ++pe)
      EXPECT_NE(r.output.find(fmt::format("pe {} stopped in order", pe)), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("stopping the other"), std::string::npos) << r.output;
    expect_nothing_left(r);
  }
}

// A second one stops PEs that do not end (SIGTERM, then SIGKILL).
TEST(Launcher, SecondStopSignalStopsTheJobAtOnce) {
  RunResult r = run_job(3, "stubborn", SIGINT, {}, 2);
  EXPECT_EQ(r.status, 128 + SIGINT) << r.output;
  EXPECT_NE(r.output.find("received SIGINT while the PEs stop"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 10.0) << r.output;
  expect_nothing_left(r);
}

// Globals are moved into shared memory at init; another thread's writes could
// be lost then, so a thread started before init is refused, clearly.
TEST(Launcher, ThreadBeforeInitIsRefused) {
  RunResult r = run_job(2, "thread_first");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("call shmem_init before starting threads"), std::string::npos)
      << r.output;
  expect_nothing_left(r);
}

// The launcher's job works with COREMESH_SYMMETRIC_DATA=0 (no data segment).
TEST(Launcher, SymmetricDataCanBeTurnedOff) {
  RunResult r = run_job(3, "ok", 0, {"COREMESH_SYMMETRIC_DATA=0"});
  EXPECT_EQ(r.status, 0) << r.output;
  expect_nothing_left(r);
}

TEST(Launcher, MissingProgramIsReported) {
  int status = std::system(CM_SHMEM_RUN " run -n 2 /nonexistent/prog > /tmp/cm_missing.txt 2>&1");
  EXPECT_NE(WEXITSTATUS(status), 0);
}
