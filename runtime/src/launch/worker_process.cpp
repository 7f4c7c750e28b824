#include "launch/worker_process.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "launch/blas_env.h"

namespace edit {

bool spawnWorker(Worker& w, const WorkerLaunch& l, const char* join, int replicas) {
  const int r = w.rank;
  int out[2], err[2];
  if (::pipe(out) != 0 || ::pipe(err) != 0) {
    std::perror("edit-run: pipe");
    return false;
  }
  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    // The launcher killed, even with SIGKILL: the workers get SIGTERM (checkpoint and
    // exit) instead of training on as orphans (the signal follows the forking thread: the
    // launcher spawns from its only thread). Checked again in case it died before the prctl.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != launcher) ::_exit(1);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::close(out[0]);
    ::close(err[0]);
    ::setpgid(0, 0);  // Ctrl-C reaches the launcher only; it forwards SIGTERM
    auto set = [](const char* k, const std::string& v) { ::setenv(k, v.c_str(), 1); };
    set("RANK", std::to_string(r));
    set("WORLD_SIZE", std::to_string(replicas * l.shards));
    set("EDIT_REPLICAS", std::to_string(replicas));
    set("EDIT_SHARDS", std::to_string(l.shards));
    set("MASTER_ADDR", "127.0.0.1");
    set("MASTER_PORT", std::to_string(l.masterPort));
    set("EDIT_BIND_ADDR", "127.0.0.1");
    set("EDIT_LOCAL_WORLD_SIZE", std::to_string(l.localWorld));
    set("LOCAL_RANK", std::to_string(r));  // GPU builds: worker r uses GPU r % count
    set("EDIT_JOIN", join);
    if (!l.scaleAt.empty()) set("EDIT_SCALE_AT", l.scaleAt);
    if (!l.coreType.empty()) set("OPENBLAS_CORETYPE", l.coreType);
    if (!ompWaitPolicy().empty()) set("OMP_WAIT_POLICY", ompWaitPolicy());
    if (l.metricsPort >= 0) set("EDIT_METRICS_PORT", std::to_string(l.metricsPort + r));
    std::vector<std::string> args{l.binary};
    args.insert(args.end(), l.args.begin(), l.args.end());
    std::vector<char*> cargs;
    for (auto& a : args) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    ::execvp(cargs[0], cargs.data());
    std::perror("edit-run: exec edit-train");
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  w.pid = pid;
  w.out = out[0];
  w.err = err[0];
  w.started = true;
  w.exited = false;
  w.excused = false;
  w.code = 0;
  w.last = nlohmann::json();
  w.summary = nlohmann::json();
  return true;
}

void drainLines(int fd, std::string& buf, bool& open, const std::function<void(const std::string&)>& onLine) {
  char tmp[65536];
  const ssize_t n = ::read(fd, tmp, sizeof(tmp));
  if (n <= 0) {
    open = false;
    if (!buf.empty()) onLine(buf);
    buf.clear();
    return;
  }
  buf.append(tmp, static_cast<size_t>(n));
  size_t pos;
  while ((pos = buf.find('\n')) != std::string::npos) {
    onLine(buf.substr(0, pos));
    buf.erase(0, pos + 1);
  }
}

std::string workerBinary() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n > 0) {
    buf[n] = 0;
    std::string dir(buf);
    dir = dir.substr(0, dir.rfind('/'));
    if (::access((dir + "/edit-train").c_str(), X_OK) == 0) return dir + "/edit-train";
  }
  return "edit-train";  // from PATH
}

int freeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    return 29500;
  }
  const int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

}  // namespace edit
