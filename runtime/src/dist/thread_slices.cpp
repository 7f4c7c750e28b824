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

void shortSlice(int tid) {
#if defined(__linux__) && defined(SYS_sched_setattr) && defined(SYS_sched_getattr)
  const uint64_t ns = sliceNanos();
  if (ns == 0) return;
  SchedAttr a;
  std::memset(&a, 0, sizeof a);
  // Keep the thread's policy and nice value: only the slice changes, and only for the
  // normal and batch policies (real-time threads have no slice to shorten).
  if (syscall(SYS_sched_getattr, tid, &a, sizeof a, 0) != 0) return;
  if (a.policy != SCHED_OTHER && a.policy != SCHED_BATCH) return;
  a.size = sizeof a;
  a.flags = 0;
  a.runtime = ns;
  (void)syscall(SYS_sched_setattr, tid, &a, 0);
#else
  (void)tid;
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
#if defined(__linux__) && defined(SYS_sched_getattr)
  SchedAttr a;
  std::memset(&a, 0, sizeof a);
  if (syscall(SYS_sched_getattr, tid, &a, sizeof a, 0) != 0) return 0;
  return a.policy == SCHED_OTHER || a.policy == SCHED_BATCH ? a.runtime : 0;
#else
  (void)tid;
  return 0;
#endif
}

void shortSliceForThisThread() { shortSlice(currentThreadId()); }

void shortSliceForThreadsSince(const std::set<int>& before) {
  for (int tid : processThreads())
    if (!before.count(tid)) shortSlice(tid);
}

}  // namespace edit
