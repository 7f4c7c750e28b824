// Short scheduler slices for the threads that carry collectives.
//
// Why: a collective crosses several threads of each rank: the communication stream's
// thread, c10d's Gloo worker threads and Gloo's I/O loop. Each step of a ring wakes one of
// them on a core where the training thread is computing. With the kernel's default slice
// (0.75-3 ms by core count; 1.4 ms on the 2-core bench machine) the woken thread may wait
// out the training thread's slice before it runs, at every hop: a 300 KB all-gather between
// two ranks took about 1 ms, and prefetch hid little of it. Since Linux 6.12 a thread of
// the normal policy can ask for a shorter slice (sched_attr.sched_runtime, 0.1-100 ms, no
// privilege needed), and a waking thread with a shorter slice than the running one
// preempts it. These threads work in short bursts, so a short slice costs them little;
// the training thread keeps the default.
//
// Older kernels ignore the request; a failure is ignored too (the default slice is only
// slower). EDIT_COMM_SLICE_US sets the slice in microseconds (default 100; 0 leaves every
// thread as it is), for before/after measurements in one run.
#pragma once

#include <cstdint>
#include <set>

namespace edit {

// The thread ids of this process now (Linux: /proc/self/task; empty elsewhere).
std::set<int> processThreads();

// The calling thread's id (gettid).
int currentThreadId();

// The slice a thread runs with, in nanoseconds, as the kernel reports it (sched_getattr's
// sched_runtime); 0 where the kernel reports none (before 6.12) or the call fails.
uint64_t threadSliceNanos(int tid);

// Asks the short slice for the calling thread.
void shortSliceForThisThread();

// Asks the short slice for every thread of this process not in `before` (the threads a
// library started since processThreads() returned `before`).
void shortSliceForThreadsSince(const std::set<int>& before);

}  // namespace edit
