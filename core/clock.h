/* clock.h - clock readings as the plain integers the code compares, and
 * file times compared.
 *
 * Deadlines, ages and profiles all count on CLOCK_MONOTONIC (never set back,
 * never jumps with the wall clock); only the profile reads thread CPU time
 * through clock_ns().  clock_gettime() of these clocks cannot fail with a
 * valid id, so the result is not checked.
 */
#ifndef WFS_CLOCK_H
#define WFS_CLOCK_H

#include <stdint.h>
#include <sys/stat.h>
#include <time.h>

/* Are two file times (a stat's mtime, ctime) the same instant? */
static inline int same_ts(const struct timespec *a, const struct timespec *b)
{
	return a->tv_sec == b->tv_sec && a->tv_nsec == b->tv_nsec;
}

/* Is @now (an fstat of the same descriptor, later) the file @was was,
 * unchanged: same inode, size, mtime and ctime?  A file rewritten in place
 * at the same size keeps its inode and size: only the times tell. */
static inline int same_file_state(const struct stat *was, const struct stat *now)
{
	return was->st_dev == now->st_dev && was->st_ino == now->st_ino &&
	       was->st_size == now->st_size && same_ts(&was->st_mtim, &now->st_mtim) &&
	       same_ts(&was->st_ctim, &now->st_ctim);
}

static inline int64_t clock_ns(clockid_t id)
{
	struct timespec t;

	clock_gettime(id, &t);
	return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static inline int64_t mono_ns(void)
{
	return clock_ns(CLOCK_MONOTONIC);
}

static inline int64_t mono_ms(void)
{
	return mono_ns() / 1000000;
}

/* A CLOCK_MONOTONIC time in ms (mono_ms's scale) as the timespec that
 * pthread_cond_timedwait takes on a cond set to that clock. */
static inline struct timespec mono_timespec(int64_t ms)
{
	return (struct timespec){ .tv_sec = (time_t)(ms / 1000),
				  .tv_nsec = (long)(ms % 1000) * 1000000L };
}

#endif
