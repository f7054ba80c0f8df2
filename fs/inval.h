/* inval.h - kernel cache invalidations, queued without ever blocking.
 *
 * The store reports that a blob's bytes may have changed while it holds its
 * own lock, and telling the kernel can wait: the kernel's invalidation waits
 * for the pages a read in flight holds, and that read may need the store
 * lock.  So a report only records the inode in a bounded queue (no I/O, no
 * allocation, a short leaf lock), and a thread of the queue's own pops and
 * notifies with no lock held.
 *
 * When the queue is full, reports are coalesced rather than waited for or
 * lost: the queue is marked overflowed, and the thread then calls
 * notify_all, which must invalidate every inode that may need it (the
 * daemon: every node that has a blob).  An inode already queued is not
 * queued twice.
 *
 * Knows nothing of FUSE: the notifications are callbacks (test/unit/
 * test_inval.c drives it with stalled and counting ones).
 */
#ifndef WFS_INVAL_H
#define WFS_INVAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define INVAL_CAPACITY 1024 /* inodes queued before reports coalesce */

struct inval_hooks {
	void *arg;
	/* Drop the kernel's cached pages of @ino.  Called from the queue's
	 * thread with no lock held; may block (not forever: after unmount it
	 * must fail at once). */
	void (*notify)(void *arg, uint64_t ino);
	/* Reports were coalesced: invalidate every inode that may need it. */
	void (*notify_all)(void *arg);
};

struct inval_stats {
	uint64_t queued;    /* reports taken into the queue */
	uint64_t deduped;   /* reports of an inode already queued */
	uint64_t coalesced; /* reports that found the queue full */
	uint64_t notified;  /* notify calls made */
	uint64_t all;       /* notify_all calls made */
	size_t pending;     /* inodes in the queue now */
};

struct inval_queue {
	/* Set by inval_init, read-only after. */
	struct inval_hooks hooks;
	size_t cap;
	uint64_t *ring;         /* cap slots */
	pthread_mutex_t lock;   /* a leaf: guards every field below but thread */
	pthread_cond_t work;    /* CLOCK_MONOTONIC; the thread waits here for
				 * a push, an overflow or stop */
	pthread_cond_t idle;    /* CLOCK_MONOTONIC; inval_wait_idle waits here */
	/* Under lock: */
	size_t head, count;     /* the queued inodes: ring[head], ... count of them */
	bool overflow;          /* reports were coalesced: notify_all is owed */
	bool busy;              /* the thread is in a notify call */
	bool stopping;          /* inval_stop was called: the thread exits */
	struct inval_stats st;  /* st.pending unused: count is */
	/* Owned by the caller of inval_start/inval_stop (one thread). */
	pthread_t thread;
	bool started;
};

/* Set up an empty queue of @cap inodes (0: INVAL_CAPACITY).  Returns 0 or
 * -errno.  Reports may be pushed from here on; they are notified once the
 * thread runs. */
int inval_init(struct inval_queue *q, size_t cap, const struct inval_hooks *hooks);

/* Start the notifying thread.  Returns 0 or -errno. */
int inval_start(struct inval_queue *q);

/* Queue @ino (0 is ignored).  Never blocks on anything but the queue's own
 * short leaf lock, never allocates: safe with any other lock held. */
void inval_push(struct inval_queue *q, uint64_t ino);

/* Wait until nothing is queued, owed or being notified, at most
 * @timeout_ms.  Returns 0, or -ETIMEDOUT. */
int inval_wait_idle(struct inval_queue *q, unsigned timeout_ms);

void inval_get_stats(struct inval_queue *q, struct inval_stats *st);

/* Stop the thread and wait for it (a notify in progress finishes first);
 * what is still queued is dropped: call it after unmounting, when the
 * kernel's cache is gone with the mount.  Pushes after it are ignored. */
void inval_stop(struct inval_queue *q);

/* Put @stand_in (a path, opened read-only) in place of the descriptor
 * @fd, atomically (dup3): the file @fd held is closed -- /dev/fuse's last
 * descriptor: the kernel ends the connection and every request still
 * waiting for an answer, unless a notice in flight holds the file (the
 * daemon ends the connection first: fs/connabort.h) -- but the number
 * stays taken until the caller closes it.  A notice written to it meanwhile fails EBADF at once; after
 * a plain close it could land in a file another thread opened under the
 * same number (libfuse forgets the number only once it has unmounted).
 * Returns 0 or -errno (@fd as it was). */
int inval_retire_fd(int fd, const char *stand_in);

/* Free the queue (after inval_stop, or if it was never started). */
void inval_destroy(struct inval_queue *q);

#endif
