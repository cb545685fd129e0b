// `coremesh run`: starts the PEs of a job and watches them.
//
// The job control block is a POSIX shm segment whose name is unlinked right
// after creation; the PEs inherit its file descriptor. Heap segments are
// named "/cm-<job id>-<pe>" and data segments (global variables)
// "/cm-<job id>-<pe>-data" (128-bit random id, mode 0600); the PEs unlink
// them once everybody has mapped them, and the launcher unlinks them all
// again on exit for PEs that died before.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "coremesh/core/error.hpp"
#include "coremesh/shmem/launch.hpp"
#include "layout.hpp"
#include "wait.hpp"

namespace coremesh::shmem {

namespace {

using Clock = std::chrono::steady_clock;

std::string random_job_id() {
  unsigned char bytes[16];
  CM_CHECK(getrandom(bytes, sizeof bytes, 0) == static_cast<ssize_t>(sizeof bytes),
           "the kernel must provide getrandom()", "cannot draw a random job id: {}",
           std::strerror(errno));
  std::string id;
  for (unsigned char b : bytes) id += fmt::format("{:02x}", b);
  return id;
}

std::string describe_status(int status) {
  if (WIFSIGNALED(status))
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return fmt::format("exited with status {}", WEXITSTATUS(status));
}
int status_code(int status) {
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}
// A PE that ended because of a stop signal: killed by one (no handler), or
// exited 128 + its number (a handler that stopped in order, as `coremesh train`).
bool stopped_by_signal(int status) {
  const int code = status_code(status);
  return code == 128 + SIGINT || code == 128 + SIGTERM || code == 128 + SIGHUP;
}
std::string signal_name(int sig) { return sigabbrev_np(sig) ? std::string("SIG") + sigabbrev_np(sig) : "a signal"; }

// Splits a PE's output into lines and prefixes them with "[pe k] ".
struct TaggedStream {
  int fd = -1;      // read end, -1 when closed
  int out = 1;      // where the lines go
  std::string prefix;
  std::string partial;

  void flush_lines(bool all) {
    size_t start = 0;
    for (size_t nl; (nl = partial.find('\n', start)) != std::string::npos; start = nl + 1) {
      std::string line = prefix + partial.substr(start, nl - start + 1);
      (void)!write(out, line.data(), line.size());
    }
    partial.erase(0, start);
    if (all && !partial.empty()) {
      std::string line = prefix + partial + "\n";
      (void)!write(out, line.data(), line.size());
      partial.clear();
    }
  }
  // Reads what is available; returns false at end of file.
  bool pump() {
    char buf[65536];
    ssize_t got = read(fd, buf, sizeof buf);
    if (got > 0) {
      partial.append(buf, static_cast<size_t>(got));
      flush_lines(false);
      return true;
    }
    if (got < 0 && (errno == EAGAIN || errno == EINTR)) return true;
    flush_lines(true);
    close(fd);
    fd = -1;
    return false;
  }
};

struct Pe {
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  bool failed_on_its_own = false;
};

class Job {
 public:
  explicit Job(const LaunchOptions& options) : options_(options), id_(random_job_id()) {}
  ~Job() { cleanup(); }
  int run();

 private:
  void create_control_block();
  void start_pe(int pe, int stdout_fd, int stderr_fd);
  void reap();
  void forward(int sig);
  // `cause`: the PE that stops the job, not counted among the others while it runs.
  void begin_stop(const std::string& why, int cause = -1);
  void kill_orphans();
  std::vector<pid_t> children_before_;  // the launcher's children when the job began
  void cleanup();
  int live() const {
    int n = 0;
    for (const Pe& p : pes_) n += p.running;
    return n;
  }

  LaunchOptions options_;
  std::string id_;
  int control_fd_ = -1;
  internal::JobControl* job_ = nullptr;
  size_t job_bytes_ = 0;
  int signal_fd_ = -1;
  sigset_t old_mask_{};
  bool mask_set_ = false;
  std::vector<Pe> pes_;
  std::vector<TaggedStream> streams_;
  bool stopping_ = false;
  int forwarded_ = 0;  // the stop signal passed on to the PEs, 0: none yet
  int stop_code_ = 0;
  Clock::time_point kill_at_{};
  bool killed_ = false;
};

void Job::create_control_block() {
  const std::string name = "/cm-" + id_ + "-ctl";
  control_fd_ = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  CM_CHECK(control_fd_ >= 0, "check that /dev/shm is mounted and writable",
           "cannot create the job control block: {}", std::strerror(errno));
  shm_unlink(name.c_str());  // the PEs inherit the descriptor; no name is needed
  job_bytes_ = internal::job_control_bytes(options_.n_pes);
  CM_CHECK(ftruncate(control_fd_, static_cast<off_t>(job_bytes_)) == 0, "free space in /dev/shm",
           "cannot size the job control block: {}", std::strerror(errno));
  void* p = mmap(nullptr, job_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, control_fd_, 0);
  CM_CHECK(p != MAP_FAILED, "free memory", "cannot map the job control block: {}",
           std::strerror(errno));
  job_ = static_cast<internal::JobControl*>(p);
  job_->magic = internal::kJobMagic;
  job_->n_pes = static_cast<uint32_t>(options_.n_pes);
}

void Job::start_pe(int pe, int stdout_fd, int stderr_fd) {
  const pid_t launcher = getpid();
  const pid_t pid = fork();
  CM_CHECK(pid >= 0, "raise the process limit (ulimit -u)", "cannot fork PE {}: {}", pe,
           std::strerror(errno));
  if (pid > 0) {
    pes_[pe].pid = pid;
    pes_[pe].running = true;
    return;
  }
  // Child: die with the launcher, restore signals, wire output, exec.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != launcher) _exit(127);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE}) signal(sig, SIG_DFL);
  sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
  if (stdout_fd >= 0) dup2(stdout_fd, 1);
  if (stderr_fd >= 0) dup2(stderr_fd, 2);
  const int flags = fcntl(control_fd_, F_GETFD);
  fcntl(control_fd_, F_SETFD, flags & ~FD_CLOEXEC);
  setenv(kJobIdEnv, id_.c_str(), 1);
  setenv(kJobFdEnv, std::to_string(control_fd_).c_str(), 1);
  setenv(kPeEnv, std::to_string(pe).c_str(), 1);
  setenv(kNumPesEnv, std::to_string(options_.n_pes).c_str(), 1);
  if (options_.heap_bytes) setenv("COREMESH_HEAP_SIZE", std::to_string(*options_.heap_bytes).c_str(), 1);
  std::vector<char*> argv;
  for (const std::string& a : options_.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  std::string msg = fmt::format("coremesh run: PE {}: cannot start '{}': {}\n", pe, argv[0],
                                std::strerror(errno));
  (void)!write(2, msg.data(), msg.size());
  _exit(127);
}

// The first SIGINT/SIGTERM/SIGHUP goes on to the PEs: a program that handles
// it (coremesh train: finish the step, save a checkpoint) ends in order, one
// that does not dies of it. A second one stops the job at once (begin_stop).
void Job::forward(int sig) {
  forwarded_ = sig;
  stop_code_ = 128 + sig;
  std::string msg = fmt::format("coremesh run: received {}; passed it on to the {} PEs (send it again to stop them at once)\n",
                                signal_name(sig), live());
  (void)!write(2, msg.data(), msg.size());
  for (const Pe& p : pes_)
    if (p.running) kill(p.pid, sig);
}

void Job::begin_stop(const std::string& why, int cause) {
  if (stopping_) return;
  stopping_ = true;
  const bool cause_runs = cause >= 0 && cause < static_cast<int>(pes_.size()) && pes_[cause].running;
  std::string msg = fmt::format("coremesh run: {}; stopping the other {} PEs\n", why, live() - cause_runs);
  (void)!write(2, msg.data(), msg.size());
  if (!job_->global_exit) std::snprintf(job_->stop_reason, sizeof job_->stop_reason, "%s", why.c_str());
  internal::ring(job_->abort);  // PEs blocked in waits notice within 100 ms
  for (const Pe& p : pes_)
    if (p.running) kill(p.pid, SIGTERM);
  kill_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                std::chrono::duration<double>(options_.kill_grace_s));
}

void Job::reap() {
  // shmem_global_exit names the cause even when a peer that noticed the
  // abort exits before the caller is reaped.
  if (!stopping_ && job_->global_exit) {
    stop_code_ = job_->abort_status;
    begin_stop(fmt::format("PE {} called shmem_global_exit({})", job_->abort_pe, job_->abort_status),
               job_->abort_pe);
  }
  for (int pe = 0; pe < static_cast<int>(pes_.size()); ++pe) {
    Pe& p = pes_[pe];
    if (!p.running) continue;
    int status = 0;
    if (waitpid(p.pid, &status, WNOHANG) != p.pid) continue;
    p.running = false;
    p.status = status;
    if (status == 0 && job_->pes[pe].state.load(std::memory_order_acquire) != internal::pe_finalized)
      job_->pes[pe].state.store(internal::pe_exited, std::memory_order_release);  // peers waiting for it stop
    if (status == 0 || stopping_) continue;  // stopped ones do not count
    if (forwarded_ && stopped_by_signal(status)) continue;  // ended as the signal asked
    p.failed_on_its_own = true;
    const bool global_exit = job_->global_exit && job_->abort_pe == pe;
    stop_code_ = status_code(status);
    begin_stop(global_exit ? fmt::format("PE {} called shmem_global_exit({})", pe,
                                         WEXITSTATUS(status))
                           : fmt::format("PE {} {}", pe, describe_status(status)));
  }
}

// The launcher's children by /proc (pid -> parent is the launcher).
std::vector<pid_t> children_of_this_process() {
  std::vector<pid_t> out;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return out;
  const pid_t me = getpid();
  while (const dirent* entry = readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    // read(2), not a stream: a process that ends meanwhile fails the read with ESRCH, which
    // libstdc++'s filebuf throws as an exception (it stopped a launcher under load)
    std::string text(512, '\0');
    const int fd = open(fmt::format("/proc/{}/stat", pid).c_str(), O_RDONLY | O_CLOEXEC);
    const ssize_t n = fd >= 0 ? read(fd, text.data(), text.size()) : -1;
    if (fd >= 0) close(fd);
    text.resize(size_t(std::max<ssize_t>(n, 0)));
    const size_t close_paren = text.rfind(')');  // the command may hold spaces and parentheses
    if (close_paren == std::string::npos) continue;
    char state = 0;
    long parent = 0;
    if (std::sscanf(text.c_str() + close_paren + 1, " %c %ld", &state, &parent) == 2 && parent == me)
      out.push_back(pid_t(pid));
  }
  closedir(proc);
  return out;
}

// The processes a stopped PE left behind (a shell's background job) are
// reparented to the launcher, a child subreaper: they go with the job. Not
// the children it had before the job (`tool & exec coremesh run ...`).
void Job::kill_orphans() {
  for (const pid_t pid : children_of_this_process()) {
    if (std::find(children_before_.begin(), children_before_.end(), pid) != children_before_.end()) continue;
    if (std::any_of(pes_.begin(), pes_.end(), [&](const Pe& p) { return p.running && p.pid == pid; })) continue;
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
}

int Job::run() {
  CM_CHECK(options_.n_pes >= 1 && options_.n_pes <= internal::kMaxPes,
           "choose between 1 and 256 PEs", "cannot start {} PEs", options_.n_pes);
  CM_CHECK(!options_.argv.empty(), "name the program to run: coremesh run -n N prog args...",
           "no program to run");
  create_control_block();
  children_before_ = children_of_this_process();
  prctl(PR_SET_CHILD_SUBREAPER, 1);

  sigset_t mask;
  sigemptyset(&mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&mask, sig);
  sigprocmask(SIG_BLOCK, &mask, &old_mask_);
  mask_set_ = true;
  signal_fd_ = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);

  pes_.resize(options_.n_pes);
  for (int pe = 0; pe < options_.n_pes; ++pe) {
    int out[2] = {-1, -1}, err[2] = {-1, -1};
    if (options_.tag_output) {
      CM_CHECK(pipe2(out, O_CLOEXEC) == 0 && pipe2(err, O_CLOEXEC) == 0, "raise ulimit -n",
               "cannot create output pipes: {}", std::strerror(errno));
    }
    start_pe(pe, out[1], err[1]);
    if (options_.tag_output) {
      close(out[1]);
      close(err[1]);
      fcntl(out[0], F_SETFL, O_NONBLOCK);
      fcntl(err[0], F_SETFL, O_NONBLOCK);
      const std::string prefix = fmt::format("[pe {}] ", pe);
      streams_.push_back({out[0], 1, prefix, {}});
      streams_.push_back({err[0], 2, prefix, {}});
    }
  }

  for (;;) {
    reap();
    if (live() == 0) break;
    if (stopping_ && !killed_ && Clock::now() >= kill_at_) {
      for (const Pe& p : pes_)
        if (p.running) kill(p.pid, SIGKILL);
      killed_ = true;
    }
    std::vector<pollfd> fds{{signal_fd_, POLLIN, 0}};
    for (const TaggedStream& s : streams_)
      if (s.fd >= 0) fds.push_back({s.fd, POLLIN, 0});
    poll(fds.data(), fds.size(), 20);  // the timeout also covers lost SIGCHLDs
    signalfd_siginfo info;
    while (read(signal_fd_, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
      const int sig = static_cast<int>(info.ssi_signo);
      if (sig == SIGCHLD) continue;
      if (!stopping_ && !forwarded_) {
        forward(sig);
        continue;
      }
      begin_stop(fmt::format("received {} while the PEs stop", signal_name(sig)));
    }
    for (TaggedStream& s : streams_)
      if (s.fd >= 0) s.pump();
  }
  if (stopping_) kill_orphans();
  prctl(PR_SET_CHILD_SUBREAPER, 0);  // orphans made after the job (calibrate's mpirun) are not ours
  // Drain what the PEs wrote before exiting (grandchildren may keep a pipe
  // open; we do not wait for them).
  for (TaggedStream& s : streams_) {
    while (s.fd >= 0) {
      pollfd fd{s.fd, POLLIN, 0};
      if (poll(&fd, 1, 0) <= 0) {
        s.flush_lines(true);
        close(s.fd);
        s.fd = -1;
        break;
      }
      s.pump();
    }
  }
  int worst = stop_code_;
  for (const Pe& p : pes_)
    if (p.failed_on_its_own || !stopping_) worst = std::max(worst, status_code(p.status));
  return worst;
}

void Job::cleanup() {
  for (Pe& p : pes_) {
    if (!p.running) continue;
    kill(p.pid, SIGKILL);
    waitpid(p.pid, nullptr, 0);
    p.running = false;
  }
  if (stopping_) kill_orphans();
  prctl(PR_SET_CHILD_SUBREAPER, 0);
  for (int pe = 0; pe < options_.n_pes; ++pe) {
    shm_unlink(fmt::format("/cm-{}-{}", id_, pe).c_str());
    shm_unlink(fmt::format("/cm-{}-{}-data", id_, pe).c_str());  // global variables
  }
  for (TaggedStream& s : streams_)
    if (s.fd >= 0) close(s.fd);
  streams_.clear();
  if (job_ != nullptr) munmap(job_, job_bytes_);
  job_ = nullptr;
  if (control_fd_ >= 0) close(control_fd_);
  control_fd_ = -1;
  if (signal_fd_ >= 0) close(signal_fd_);
  signal_fd_ = -1;
  if (mask_set_) {
    // Signals that arrived while blocked stay pending; drop the ones we handled.
    sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
    mask_set_ = false;
  }
}

}  // namespace

int launch(const LaunchOptions& options) {
  Job job(options);
  return job.run();
}

}  // namespace coremesh::shmem
