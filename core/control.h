/* control.h - the control server: JSON lines over a unix socket.
 *
 * One request object per line, one reply object per line, one request per
 * connection (the protocol is in README.md "Control protocol").  Requests
 * that change state need the peer (SO_PEERCRED) to be root or the mount's
 * owner.  A malformed or oversized request gets an error reply; nothing a
 * client sends can stop the server.
 *
 * The socket is mode 0666 (any local user may ask status, stats, doctor,
 * progress, a dry run), so what any client can cost the daemon is bounded:
 * a fixed set of threads, a cap on connections in all and per user, a
 * deadline for the request and one for the reply, a request size limit,
 * and read-only requests that create nothing (status walks with
 * collect_peek).  The numbers, and why:
 */
#ifndef WFS_CONTROL_H
#define WFS_CONTROL_H

#include "resolve.h"
#include "store.h"

struct pins;
struct nas_gate;
struct record;

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

/* A request line: wfsctl batches progress keys to stay far below it (200
 * keys a request); a promote of many paths fits too.  Per connection the
 * buffer grows to this at most. */
#define CONTROL_MAX_REQUEST (64 * 1024)

/* Threads: one poll thread does every accept, read and write (none of
 * them blocks), CONTROL_WORKERS run the requests.  Most requests take
 * milliseconds; verify --full (re-hashes copies), and promote or status
 * of a large tree (a NAS walk) take longer.  Four let two long ones and
 * two of other users run while a progress poll still finds a worker; more
 * would mostly add NAS walks competing for the same disks. */
#define CONTROL_WORKERS 4
/* Requests of users other than root and the owner run on at most this
 * many workers at once: the others are always there for the owner. */
#define CONTROL_WORKERS_OTHER 2
/* Slow requests (walks, hashing) run on at most CONTROL_WORKERS - 1: one
 * worker is always left for the quick ones, so that the progress polls of
 * a promote --wait never wait behind a verify --full. */
#define CONTROL_WORKERS_SLOW (CONTROL_WORKERS - 1)

/* Connections: wfsctl opens one per request and closes it, so even scripts
 * running many wfsctl at once stay far below.  Each costs a descriptor,
 * up to CONTROL_MAX_REQUEST of request and its reply until sent. */
#define CONTROL_MAX_CONNS 128
/* Users other than root and the owner together: the rest is kept for them. */
#define CONTROL_MAX_CONNS_OTHER 96
/* One such user: a monitor polling status never crowds out another user. */
#define CONTROL_MAX_CONNS_PER_UID 16

/* From connect to the end of the request line: wfsctl writes it at once,
 * so only a stuck or hostile client takes more; its slot comes back this
 * soon.  Not per read: a byte every few seconds does not keep a slot. */
#define CONTROL_REQUEST_TIMEOUT_MS 10000
/* From the reply being ready to its last byte taken by the client (wfsctl
 * reads at once; a reply is at most a few MiB): a client that does not
 * read cannot hold the reply's memory longer. */
#define CONTROL_REPLY_TIMEOUT_MS 10000

struct control_conn;

/* Fields are set before control_start and read-only after it, except as
 * marked.  The poll thread owns the connections; a connection whose request
 * is queued, running or answered is the workers' until the poll thread
 * takes it back from @done (both hand-offs under @lock). */
struct control {
	const struct hub_roots *roots;
	struct store *store;
	struct pins *pins;  /* NULL: no ref pins */
	struct nas_gate *gate; /* NULL: no deadlines (tests); the NAS's state for status */
	struct record *record; /* NULL: none; the local record (status, sync) */
	const char *mount, *local;
	uid_t owner;
	char sock_path[PATH_MAX];
	int listen_fd, wake[2]; /* wake: non-blocking pipe to the poll thread */
	pthread_t thread;                     /* the poll thread */
	pthread_t workers[CONTROL_WORKERS];
	unsigned nworkers;                    /* started (control_start/stop only) */
	pthread_mutex_t lock;
	pthread_cond_t work;                  /* a request queued, a worker free, stop */
	struct control_conn *queue;           /* LOCK: requests waiting for a worker, in order */
	struct control_conn *done;            /* LOCK: replies for the poll thread to send */
	int running_other, running_slow;      /* LOCK: requests running, by kind */
	int stopping;                         /* LOCK */
	int running;                          /* control_start/stop only */
	int thread_running;                   /* control_start/stop only: @thread not joined */
	/* ATOMIC (relaxed; the poll thread writes, status reads) */
	_Atomic int conns, conns_other;       /* connections open: all, of other users */
	_Atomic uint64_t accepted, refused, timed_out;
};

/* Bind LOCAL/wfs.sock (clients may connect at once; they wait for
 * control_start()), then serve it from a thread.  Both return -errno.
 * control_stop ends at once but for requests already running (the store
 * goes away after it): connections waiting are closed. */
int control_bind(struct control *c);
int control_start(struct control *c);
void control_stop(struct control *c);
/* The daemon's bounded stop (stopby.h): the threads joined until
 * @deadline_ms (< 0: none); 0, or -ETIMEDOUT when a request is left in a
 * NAS call (a walk): the socket's name is removed, nothing is freed, and
 * control_stop must not follow (nor store_close: store_leave). */
int control_stop_by(struct control *c, int64_t deadline_ms);
/* Its first step alone: no new request is taken; the daemon tells every
 * part before it joins any (a request may wait on another part's stop). */
void control_stop_tell(struct control *c);

/* Handle one request line (exposed for tests): returns a malloc'ed reply
 * line without the newline. */
char *control_handle(struct control *c, const char *line, size_t len, uid_t peer);

#endif
