/* passthrough.h - FUSE passthrough on a libfuse that has no API for it.
 *
 * Kernel >= 6.9 can serve read() and mmap() of an open FUSE file straight
 * from a backing file.  libfuse 3.14 cannot ask for it, so we speak the
 * protocol ourselves through fuse_session_custom_io(): the read hook notes
 * which requests are INIT and OPEN, the writev hook edits their replies
 * (FUSE_PASSTHROUGH in INIT, FOPEN_PASSTHROUGH + backing id in OPEN), and
 * backing files are registered with ioctls on the device fd.
 *
 * Rules the kernel enforces (and callers must follow): all opens of an inode
 * at one time are alike -- passthrough with one backing id, or not; a
 * backing id is closed only after the kernel has released the open; no
 * FOPEN_KEEP_CACHE or FOPEN_DIRECT_IO with passthrough.
 */
#ifndef WFS_PASSTHROUGH_H
#define WFS_PASSTHROUGH_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

struct fuse_session;
struct fuse_uring;

/* OPENs read and not yet answered.  Each holds a FUSE worker or a ring
 * entry until its reply: at most -o max_threads of them (opts.c caps it at
 * this) from /dev/fuse, and two a possible CPU from the rings (uring.c).
 * The list grows past this to hold them all: an OPEN not recorded would be
 * answered without passthrough while choose_mode counted it as one, and
 * the kernel refuses mixing the two (EIO to open(2)).  Should it not grow
 * (no memory), passthrough is refused from that OPEN on: daemon-served. */
#define PT_MAX_PENDING 1024

/* Rules, field by field: SET-UP: written by passthrough_install() before
 * any request is read, then read-only; LOCK: under @lock; ATOMIC: a release
 * store, read with acquire loads, no lock. */
struct passthrough {
	int devfd;           /* SET-UP */
	int wanted;          /* SET-UP: not turned off by the operator */
	int offered;         /* LOCK: the kernel's INIT offered it */
	int negotiated;      /* ATOMIC: we accepted it in our INIT reply */
	int refused;         /* ATOMIC: a registration failed: daemon-served from now on */
	pthread_mutex_t lock;
	uint64_t init_unique; /* LOCK */
	uint64_t *pending;   /* LOCK: OPEN requests not yet answered (malloc'ed) */
	size_t npending, pending_cap; /* LOCK */
	/* SET-UP.  Called for an OPEN reply: the backing id to announce for
	 * this fh, or 0 for a daemon-served open. */
	int (*backing_of)(uint64_t fh);
	/* SET-UP (may be NULL).  Called once the INIT reply is written: the
	 * kernel applies an INIT reply inside the write, so the connection's
	 * settings (read-ahead) are final when this runs. */
	void (*init_done)(void *arg);
	void *init_done_arg;
	/* FUSE over io_uring (uring.h): the INIT reply asks for it when
	 * @uring is set and the kernel offered it; the ring threads' replies
	 * are handed to it. */
	struct fuse_uring *uring; /* SET-UP (may be NULL: not wanted) */
	int uring_offered;   /* LOCK: the kernel's INIT offered it */
	size_t uring_payload; /* LOCK: > 0 once our INIT reply asked for it: the
			       * largest request or reply it allows */
	int uring_error;     /* LOCK: -errno when its rings could not be made, so
			      * the INIT reply did not ask for it */
};

/* Install the hooks on a mounted session.  Returns -errno. */
int passthrough_install(struct passthrough *pt, struct fuse_session *se, int wanted,
			int (*backing_of)(uint64_t fh));

/* Free what the hooks hold, once the session is destroyed. */
void passthrough_free(struct passthrough *pt);

/* A request read some other way than from /dev/fuse (uring.c): noted as
 * if read there (an OPEN's reply gets edited). */
void passthrough_note_request(void *pt, const void *req, size_t len);

/* May this open use passthrough at all (negotiated and not refused)? */
int passthrough_usable(const struct passthrough *pt);

/* Register @fd (a local copy, opened read-only) as a backing file.
 * Returns the backing id (> 0) or -errno; -EPERM means the kernel will not
 * have it (not negotiated, no CAP_SYS_ADMIN): the caller falls back. */
int passthrough_open_backing(struct passthrough *pt, int fd);
void passthrough_close_backing(struct passthrough *pt, int backing_id);

#endif
