/* stopby.h - the daemon's stop, bounded: a thread is waited for until a
 * deadline, not until the NAS lets it go.
 *
 * A thread that reads the NAS (a copy, the record's rebuild, a ref pin's
 * listing, a wfsctl walk, the start-up scan of links) is told to stop and
 * stops at its next step; but a step is a system call on the NAS, and a
 * frozen NFS server holds it in the kernel for as long as it stays frozen.
 * So each *_stop_by() tells its threads to stop and joins them until
 * @deadline_ms (CLOCK_MONOTONIC ms; < 0: no deadline).  A thread still
 * running then is left behind (detached) and the call returns -ETIMEDOUT:
 * nothing of its object is freed, ever -- the thread may still use it.
 *
 * The daemon's contract (fs/main.c): every stop gets one deadline,
 * nas_timeout after the stop begins; when a thread was left behind, the
 * store writes its index and keeps its locks until the process ends
 * (store_leave), and the process exits without freeing or joining
 * anything more.  A thread left behind may still end its NAS call (the
 * NAS let go in between) but can then only finish its own file (a copy's
 * in tmp/, which the next start empties, or renamed into data/ if it was
 * past its last NAS read: no index names it, the next start removes it; a
 * range of a partial file that no index lists) and block on a lock the
 * leaving daemon holds (record.json is not written again: record.h); the
 * process's exit ends the calls still stuck (a FUSE NAS gets an
 * interrupt, an NFS mount's wait is killable) -- all but a FUSE NAS's
 * FLUSH, which the kernel waits out (nasclose.h). */
#ifndef WFS_STOPBY_H
#define WFS_STOPBY_H

#include "clock.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>

/* Join @t, or by @deadline_ms leave it behind (detached): 0 or -ETIMEDOUT.
 * A handle left behind is the thread's own from then on: the caller forgets
 * it (joining a detached thread is undefined).  (Not pthread_clockjoin_np:
 * gcc 12's ThreadSanitizer does not intercept it.) */
static inline int join_by(pthread_t t, int64_t deadline_ms)
{
	struct timespec ts;
	int64_t left;

	if (deadline_ms < 0)
		return -pthread_join(t, NULL);
	/* pthread_timedjoin_np counts on CLOCK_REALTIME: the time left on
	 * the monotonic clock, from now on that one */
	left = deadline_ms - mono_ms();
	clock_gettime(CLOCK_REALTIME, &ts);
	if (left > 0) {
		ts.tv_sec += (time_t)(left / 1000);
		ts.tv_nsec += (long)(left % 1000) * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
	}
	if (pthread_timedjoin_np(t, NULL, &ts) == 0)
		return 0;
	pthread_detach(t);
	return -ETIMEDOUT;
}

#endif
