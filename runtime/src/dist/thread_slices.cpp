#include "dist/thread_slices.h"

#include <dirent.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace edit {
namespace {

// struct sched_attr of <linux/sched/types.h> (glibc 2.36 declares no wrapper).
struct SchedAttr {
  uint32_t size;
  uint32_t policy;
  uint64_t flags;
  int32_t nice;
  uint32_t priority;
  uint64_t runtime, deadline, period;
  uint32_t utilMin, utilMax;
};

uint64_t sliceNanos() {
  static const uint64_t ns = [] {
    const char* e = std::getenv("EDIT_COMM_SLICE_US");
    const long us = e && *e ? std::strtol(e, nullptr, 10) : 100;
    return us > 0 ? static_cast<uint64_t>(us) * 1000 : uint64_t{0};
  }();
  return ns;
}

// The thread's scheduling attributes, if it runs under a policy with a slice (normal or
// batch; real-time threads have none).
bool sliceAttributes(int tid, SchedAttr& a) {
#if defined(__linux__) && defined(SYS_sched_getattr)
  std::memset(&a, 0, sizeof a);
  if (syscall(SYS_sched_getattr, tid, &a, sizeof a, 0) != 0) return false;
  return a.policy == SCHED_OTHER || a.policy == SCHED_BATCH;
#else
  (void)tid;
  (void)a;
  return false;
#endif
}

void shortSlice(int tid) {
  const uint64_t ns = sliceNanos();
  SchedAttr a;
  // Keep the thread's policy and nice value: only the slice changes.
  if (ns == 0 || !sliceAttributes(tid, a)) return;
  a.size = sizeof a;
  a.flags = 0;
  a.runtime = ns;
#ifdef SYS_sched_setattr
  (void)syscall(SYS_sched_setattr, tid, &a, 0);
#endif
}

}  // namespace

std::set<int> processThreads() {
  std::set<int> tids;
  if (DIR* d = opendir("/proc/self/task")) {
    while (const dirent* e = readdir(d))
      if (e->d_name[0] != '.') tids.insert(std::atoi(e->d_name));
    closedir(d);
  }
  return tids;
}

int currentThreadId() { return static_cast<int>(syscall(SYS_gettid)); }

uint64_t threadSliceNanos(int tid) {
  SchedAttr a;
  return sliceAttributes(tid, a) ? a.runtime : 0;
}

void shortSliceForThisThread() { shortSlice(currentThreadId()); }

void shortSliceForThreadsSince(const std::set<int>& before) {
  for (int tid : processThreads())
    if (!before.count(tid)) shortSlice(tid);
}

}  // namespace edit
