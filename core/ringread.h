/* ringread.h - a read with a deadline, made on the calling thread's own
 * io_uring instead of handed to another thread and waited for there.
 *
 * Why: a read that must not wait past a deadline (a NAS that may hang) was
 * handed to a thread that may block and waited for with a timeout; for a
 * 4 KiB read that hand-off and the wake-up back cost about as much as the
 * read.  Here the calling thread submits the read to a ring of its own and
 * waits for its completion with the timeout: the kernel reads, no other
 * thread of ours runs.
 *
 * Rules:
 *  - Each thread that calls ringread_pread() gets a ring on its first call,
 *    closed when the thread ends (a key of @rr's destructor).  A thread
 *    whose ring could not be made or cannot submit (io_uring disabled:
 *    sysctl kernel.io_uring_disabled, a seccomp filter) gets -ENOTSUP from
 *    then on, at once: the caller reads its other way.
 *  - A read not done by its deadline is left running, into a buffer of its
 *    own that the ring keeps; a later call on that thread frees it once it
 *    ends.  A thread with RINGREAD_MAX_LEFT reads left running refuses more
 *    (-EHOSTDOWN), so a hung file holds at most that many buffers a thread.
 *  - A thread that ends with reads left running hands their buffers to @rr
 *    (the kernel may still write them, and only the process's end makes
 *    that harmless): ringread_fini() frees them, for the leak checker, as
 *    the daemon ends, every thread that read gone -- its last call before
 *    it returns from main, so that no later allocation is given their
 *    memory.
 *  - The caller's descriptor must stay open until the call returns; a read
 *    left running keeps its own reference to the file (io_uring takes one).
 */
#ifndef WFS_CORE_RINGREAD_H
#define WFS_CORE_RINGREAD_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#define RINGREAD_MAX_LEFT 4

struct ringread_left; /* ringread.c */
struct io_uring;      /* liburing.h */

/* Reads left running past their deadline on one ring, each with the
 * buffer it reads into, freed when its completion is seen.  The ring's own
 * thread owns it.  (This file's rings, and fs/uring.c's FUSE ring
 * threads.) */
struct ringread_lefts {
	struct ringread_left *head;
	unsigned n;
};

struct ringread {
	pthread_key_t key;
	int key_made;
	pthread_mutex_t lock;
	struct ringread_lefts orphans; /* LOCK: of rings that ended */
};

/* 0, or -errno (no key could be made). */
int ringread_init(struct ringread *rr);
/* Free what ended threads left; call as the process ends, when no thread
 * reads any more. */
void ringread_fini(struct ringread *rr);

/* Keep the reads of @l, emptied, until ringread_fini(): a ring's thread
 * ending with reads left running hands them over, since the kernel may
 * write their buffers yet. */
void ringread_keep(struct ringread *rr, struct ringread_lefts *l);

/* 0 if this process may use an io_uring (one is made, a no-op goes through
 * it, it is closed), else -errno: -EPERM (a seccomp filter -- one may
 * refuse io_uring_enter alone, so making a ring says nothing --;
 * kernel.io_uring_disabled=2, or =1 for a process outside its group),
 * -ENOSYS (a kernel without), -ENOMEM. */
int ringread_probe(void);

/* A no-op submitted on @ring and its completion taken: 0 if requests go
 * through it, else -errno (the submit's: io_uring_enter refused).  For a
 * ring just made, nothing else on it: every ring the daemon makes goes
 * through it first, and is ended with ringread_end. */
int ringread_check(struct io_uring *ring);

/* io_uring_queue_exit(@ring), for a ring checked by ringread_check.
 *
 * Why not the call alone: for ThreadSanitizer.  liburing maps and unmaps
 * a ring's memory with raw system calls, which TSan does not see, so a
 * ring mapped where another thread's ended ring was inherits that ring's
 * accesses and they are reported as races (seen in CI between two copy
 * workers).  The kernel orders the unmap before the map; TSan is told so,
 * page by page of the ring's memory: released here, acquired by
 * ringread_check.  Without TSan, that is nothing. */
void ringread_end(struct io_uring *ring);

/* Make @ring of @entries for the calling thread alone (@flags, e.g.
 * IORING_SETUP_SQE128, plus single issuer and deferred task work: its
 * completions run when this thread waits; without those two on a kernel
 * before 6.1) and check it (ringread_check).  0, or -errno with nothing
 * left open. */
int ringread_make(struct io_uring *ring, unsigned entries, unsigned flags);

/* 1 if this thread has a ring (made now if it had none), 0 if it cannot
 * have one, -ENOMEM. */
int ringread_ready(struct ringread *rr);

/* pread @len bytes at @off of @fd into a 4096-aligned buffer of the call's,
 * waiting at most @timeout_ms: on success *@buf (free() it) holds the bytes
 * read, the return value (maybe short).  Errors: the read's own (-EIO,
 * -ESTALE, ...; its -ETIMEDOUT as -ENOTCONN), -ETIMEDOUT (the deadline
 * passed; the read goes on, left),
 * -EHOSTDOWN (this thread has RINGREAD_MAX_LEFT reads left running),
 * -ENOTSUP (no ring on this thread), -ENOMEM. */
ssize_t ringread_pread(struct ringread *rr, int fd, size_t len, off_t off,
		       unsigned timeout_ms, void **buf);

/* Wait on @ring for the completion whose user_data is @ud until
 * CLOCK_MONOTONIC passes @deadline_ms (mono_ms's scale): 0 with *@res its
 * result, -ETIME past the deadline, or the ring's own error.  Completions
 * of other requests met on the way are consumed and given to
 * @other(@arg, user_data, result).  (Also fs/uring.c's wait for a read on
 * a FUSE ring, where the other completions are FUSE commands too.) */
int ringread_wait(struct io_uring *ring, uint64_t ud, int64_t deadline_ms,
		  void (*other)(void *arg, uint64_t ud, int res), void *arg, int *res);

/* The read of ringread_pread and uring_pread, on a ring of the caller's:
 * @len bytes at @off of @fd into a 4096-aligned buffer of the call's, its
 * user_data the address of its node on @l with @tag's bits set (bit 0 is
 * free), waited for until @deadline_ms with ringread_wait (@other, @arg as
 * there).  A ring of 128-byte entries (FUSE's) has the entry's second half
 * zeroed too.  Returns as ringread_pread: the bytes in *@buf, or -errno;
 * -ETIMEDOUT only for the deadline (the read goes on, on @l), a read's own
 * -ETIMEDOUT (a soft NFS mount giving up) as -ENOTCONN, as nas_call does;
 * -EHOSTDOWN with RINGREAD_MAX_LEFT reads on @l already. */
ssize_t ringread_read_on(struct io_uring *ring, struct ringread_lefts *l, uint64_t tag,
			 int fd, size_t len, off_t off, int64_t deadline_ms,
			 void (*other)(void *arg, uint64_t ud, int res), void *arg, void **buf);

/* A completion of @ud seen on the ring of @l: if it is one of @l's reads
 * (@tag's bits aside), free it and return 1; else 0. */
int ringread_reap(struct ringread_lefts *l, uint64_t ud, uint64_t tag);

#endif
