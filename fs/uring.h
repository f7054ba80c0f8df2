/* uring.h - FUSE over io_uring on a libfuse that cannot speak it
 * (-o fuse_uring=on).
 *
 * Kernel >= 6.14 can hand FUSE requests to the daemon through io_uring
 * instead of read() and write() on /dev/fuse: one queue a CPU, a request
 * queued on the CPU of the task that made it and given to a daemon thread
 * waiting in io_uring_enter() as task work.  libfuse 3.14 has no such
 * loop, so we run one: the INIT reply asks for it (passthrough.c edits the
 * reply), then ring threads register a header and a payload buffer each
 * and hand every request they get to fuse_session_process_buf().  Its
 * reply comes back through the session's writev hook (passthrough.c),
 * which gives it to uring_take_reply(): copied into that request's
 * buffers, and its thread commits it and fetches the next.
 *
 * What it buys is mostly the NAS read: a ring thread makes it on its own
 * ring (uring_pread) and waits for it there with the deadline as the
 * wait's timeout, where a /dev/fuse worker hands it to a NAS thread and
 * back (core/nasgate.h) -- two wake-ups a read, the bulk of a 4 KiB read's
 * cost through the mount.
 *
 * Rules the kernel sets: INIT, FORGET and INTERRUPT still come through
 * /dev/fuse (libfuse's own loop keeps running for them), and notifications
 * are written there; requests go the new way only once every queue has an
 * entry registered -- and from the INIT reply that asked for the protocol
 * until then, the kernel holds every new request (fs/fuse/dev.c
 * fuse_block_alloc), so a queue without a ring would hang the mount: the
 * rings are made before that reply (uring_prepare), which asks for the
 * protocol only if every queue has one; a payload buffer holds the
 * connection's largest request or reply; every request sent to an entry is
 * answered before the entry gets another.  The module parameter
 * /sys/module/fuse/parameters/enable_uring must be set before the mount:
 * without it the kernel does not offer the protocol and the mount runs as
 * if the option were off (logged).
 */
#ifndef WFS_URING_H
#define WFS_URING_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/uio.h>

struct fuse_session;
struct ringread;
struct uring_ent;

/* Rules: SET-UP before uring_prepare; OWNER: the ring threads'; ATOMIC;
 * GATE: under @gate. */
struct fuse_uring {
	struct fuse_session *se;    /* SET-UP */
	int devfd;                  /* SET-UP */
	unsigned threads;           /* SET-UP: ring threads in all (at least 2 a queue) */
	void (*log)(void *arg, int prio, const char *msg); /* SET-UP */
	void *log_arg;              /* SET-UP */
	_Atomic uint64_t *requests; /* SET-UP (may be NULL): counted per request taken */
	/* SET-UP (may be NULL): shown each request (laid out as /dev/fuse
	 * gives it) before libfuse is, as passthrough.c sees those it reads */
	void (*note_request)(void *arg, const void *req, size_t len);
	void *note_arg;             /* SET-UP */
	/* SET-UP: where a ring thread that ends leaves the NAS reads still
	 * running (their buffers), until the process ends */
	struct ringread *keep;
	struct uring_ent *ents;     /* OWNER: written by uring_prepare, freed by uring_stop */
	_Atomic unsigned nents;     /* ATOMIC: entries of @ents */
	_Atomic int stop;
	/* The start gate (uring.c): threads report their ring, then wait */
	pthread_mutex_t gate;
	pthread_cond_t gate_cond;
	unsigned made, failed;      /* GATE: threads whose ring was made, not made */
	int first_err;              /* GATE: the first failure's -errno */
	int go;                     /* GATE: uring_start was called */
	int gate_inited;            /* OWNER */
};

/* Start the ring threads and make their rings for a connection whose
 * INIT reply is about to ask for the protocol: @payload is the largest
 * request or reply (max_write, max_pages).  Called once, before that
 * reply is written.  0: every queue has a ring (a thread whose ring could
 * not be made has left, logged), the others wait for uring_start();
 * -errno (the first failure; nothing is left running): the reply must not
 * ask for the protocol. */
int uring_prepare(struct fuse_uring *u, size_t payload);

/* The INIT reply that asked for the protocol is written: the threads
 * register their entries and serve. */
void uring_start(struct fuse_uring *u);

/* The writev hook's question: is this reply (@iov[0] the out header) for a
 * request a ring thread took?  Then it is copied into that request's
 * buffers (or, if it does not fit them, the request is answered EIO) and
 * its thread commits it: returns the reply's length.  -ENOENT: not a ring
 * request; the caller writes it to /dev/fuse. */
ssize_t uring_take_reply(struct fuse_uring *u, const struct iovec *iov, int count);

/* Is this a ring thread (handling a request it took)? */
int uring_here(void);

/* On a ring thread: pread @len bytes of @fd at @off on the thread's own
 * ring, into an aligned buffer of the call's (*@buf: free it), waiting at
 * most @timeout_ms -- no hand-off to another thread.  Returns the bytes
 * read or -errno; -ETIMEDOUT when the deadline passed (the read goes on
 * into its own buffer, freed when it ends or, if the thread ends first,
 * kept in @keep until the daemon ends), -EHOSTDOWN when this thread
 * has RINGREAD_MAX_LEFT such reads still hanging, -ENOTSUP when not on a ring
 * thread.  A read's own -ETIMEDOUT (a soft NFS mount) comes back as
 * -ENOTCONN. */
ssize_t uring_pread(int fd, size_t len, off_t off, unsigned timeout_ms, void **buf);

/* Stop and join the ring threads, then close their rings (the kernel ends
 * requests still queued on them).  After fuse_session_unmount(); no-op if
 * never started. */
void uring_stop(struct fuse_uring *u);

#endif
