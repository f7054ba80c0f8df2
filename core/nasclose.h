/* nasclose.h - NAS descriptors closed where a hung NAS holds no caller.
 *
 * The last close of a NAS file is a call to the server: NFSv4 sends CLOSE
 * and waits for it (a hard mount waits for ever while the server hangs), a
 * FUSE client sends FLUSH.  Closed on a FUSE worker at an open's release,
 * such a descriptor takes the worker with it, and once every worker is
 * taken the mount stops answering -- local copies included, which must
 * keep serving while the NAS hangs (nasgate.h).  So the fs glue gives its
 * NAS descriptors to one thread of their own, which closes them in turn:
 * a close stuck there holds back only the NAS closes queued behind it.
 * A descriptor is the closer's from nas_close_later on: the caller never
 * touches it again.
 *
 * Knows nothing of FUSE.
 */
#ifndef WFS_NASCLOSE_H
#define WFS_NASCLOSE_H

#include <pthread.h>
#include <stdint.h>

struct nas_closer_q;

struct nas_closer {
	/* shared with the thread (outlives us if it is stuck); NULL: no
	 * thread runs (never started, or stopped) */
	struct nas_closer_q *q;
	pthread_t thread;
};

/* Start the thread.  0, or -errno (then nas_close_later closes on the
 * caller's thread, as if there were no closer). */
int nas_closer_init(struct nas_closer *c);
/* Close @fd (>= 0) on the closer's thread, soon.  Never waits for the NAS.
 * Without a closer (init failed or not made: tools, tests) or memory to
 * queue it, @fd is closed here. */
void nas_close_later(struct nas_closer *c, int fd);
/* Stop by @deadline_ms (stopby.h: CLOCK_MONOTONIC ms, < 0 none): what is
 * queued is closed first; a thread still stuck in a close then is left to
 * end on its own (it owns what it holds).  Returns how many descriptors
 * were left so.  Safe on a closer never started or stopped already. */
unsigned nas_closer_stop_by(struct nas_closer *c, int64_t deadline_ms);

#endif
