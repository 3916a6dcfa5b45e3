/* base/timer: monotonic wall-clock time, and the calling thread's CPU time. */
#ifndef CT_BASE_TIMER_H
#define CT_BASE_TIMER_H

#include <time.h>

static inline double timer_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU seconds the calling thread has run (not time it slept or waited for a core). */
static inline double timer_thread_cpu(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
