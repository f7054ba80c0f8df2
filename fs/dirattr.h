/* dirattr.h - a listed directory's attributes put back in the kernel.
 *
 * The kernel workaround this file keeps (fs/fuse/readdir.c, 6.x): every
 * listing read from the daemon ends with fuse_invalidate_atime() on the
 * directory, unless the superblock is read-only.  That marks the
 * directory's atime stale, and the next stat of it -- whatever its
 * attr_timeout -- waits for a GETATTR round trip.  A tree walk lstats each
 * directory before it lists it, so a second walk right after the first
 * pays one round trip per directory (the 156 GETATTRs of the bench's warm
 * walk); a third pays none.
 *
 * Rules:
 * - A worker that replied with the end of a listing (the empty reply:
 *   the kernel invalidates after it too) notes the directory here.  A note
 *   never blocks and never fails the reply: a full queue drops it.
 * - A thread of the queue's own stats the directory through the mount, off
 *   every reader's path, so that the GETATTR it causes is answered (from
 *   the attributes the daemon just read) before a reader needs them.
 * - The stat must come after the reader took in that empty reply, which
 *   the daemon cannot see: it is made DIR_ATTRS_SOON_MS after the note and
 *   again DIR_ATTRS_LATE_MS after it.  The second costs a path walk and
 *   nothing else when the first came late enough (attributes still valid:
 *   no request); it repairs the first when the reader was slower.
 * - Nothing here changes what a reader sees: the attributes are the ones
 *   a stat would have fetched, and they expire after attr_timeout as any
 *   others.  With -o ro the kernel does not invalidate, and the stats send
 *   nothing.
 * - The thread must be stopped after the mount is gone (fuse_session_
 *   unmount): a stat in flight then fails at once instead of waiting for
 *   a worker.
 */
#ifndef WFS_DIRATTR_H
#define WFS_DIRATTR_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DIR_ATTRS_CAPACITY 512 /* stats queued before notes are dropped */
#define DIR_ATTRS_SOON_MS 2
#define DIR_ATTRS_LATE_MS 250

struct dir_attr_item {
	char *rel;      /* below the mount ("" for its root); malloc'ed */
	int64_t due_ns; /* CLOCK_MONOTONIC */
};

/* Stats in the order they are due (each ring's delay is fixed). */
struct dir_attr_ring {
	struct dir_attr_item v[DIR_ATTRS_CAPACITY];
	size_t head, count;
};

struct dir_attrs {
	char mnt[PATH_MAX];           /* set by dir_attrs_init, read-only after */
	_Atomic uint64_t *refreshed;  /* stats made (may be NULL) */
	pthread_mutex_t lock;         /* a leaf: guards what follows */
	pthread_cond_t work;          /* CLOCK_MONOTONIC */
	struct dir_attr_ring soon, late;
	bool stop, started;
	pthread_t thread;
};

/* 0 or -errno.  @mnt: the mount's absolute path; @refreshed: counted. */
int dir_attrs_init(struct dir_attrs *q, const char *mnt, _Atomic uint64_t *refreshed);
int dir_attrs_start(struct dir_attrs *q);
/* The listing of the directory @rel (below the mount) ended just now. */
void dir_attrs_note(struct dir_attrs *q, const char *rel);
/* Joins the thread and drops what is queued; a no-op when not started.
 * May be called again. */
void dir_attrs_stop(struct dir_attrs *q);

#endif
