/* uring.c - see uring.h.  The kernel's layouts are fuse_abi.h's. */
#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include "clock.h"
#include "fuse_abi.h"
#include "replyorder.h"
#include "ringread.h"
#include "uring.h"
#include "thread.h"

#include <errno.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>
#include <syslog.h>
#include <unistd.h>

/* How often a ring thread with nothing to do looks at u->stop. */
#define IDLE_LOOK_MS 100
/* The user_data of a NAS read's SQE: its node's address (ringread_read_on)
 * with this bit set (a FUSE command's is 0). */
#define READ_TAG 1u
/* One ring thread and the one entry it registers: so an entry the kernel
 * gives a request to always has a thread waiting for it. */
struct uring_ent {
	struct fuse_uring *u;
	unsigned qid;
	pthread_t thread;
	struct io_uring ring;
	struct iovec iov[2];     /* what REGISTER names: header, payload */
	struct uring_req_header *hdr;
	char *payload;
	size_t payload_len;
	char *req;               /* the request laid out as /dev/fuse gives it */
	pthread_mutex_t lock;
	pthread_cond_t replied_cond;
	_Atomic uint64_t unique; /* the request in hand, 0 when none */
	int replied;             /* LOCK */
	int inited, running;     /* OWNER (uring_prepare, uring_stop) */
	int ring_made;           /* GATE: its ring was made (reported at the gate) */
	/* OWNER: the reply to the request in hand is committed already (made
	 * on this thread: uring_take_reply committed it at once) */
	int committed;
	/* OWNER: the completion of this entry's next request, met by
	 * uring_pread while waiting for its read, kept for the loop */
	int stashed, stashed_res;
	struct ringread_lefts left; /* OWNER: NAS reads past their deadline, not ended */
};

/* The ring thread this is, or NULL.  Thread-local, not passed down: a NAS
 * read is asked for deep in file.c's READ handler, which libfuse calls
 * with nothing of ours that says which ring the request came from. */
static __thread struct uring_ent *ring_self;

static void ulog(struct fuse_uring *u, int prio, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void ulog(struct fuse_uring *u, int prio, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	if (!u->log)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	u->log(u->log_arg, prio, msg);
}

/* The number of queues the kernel makes: one a possible CPU
 * (num_possible_cpus(): every CPU of the list, "0-3,8-11" being 8; the
 * first range alone left queues unregistered on such a machine). */
static unsigned possible_cpus(void)
{
	FILE *f = fopen("/sys/devices/system/cpu/possible", "r");
	char line[4096], *tok, *save = NULL;
	unsigned n = 0;

	if (f && fgets(line, sizeof(line), f))
		for (tok = strtok_r(line, ",\n", &save); tok; tok = strtok_r(NULL, ",\n", &save)) {
			unsigned lo, hi;
			int k = sscanf(tok, "%u-%u", &lo, &hi);

			if (k == 1)
				n++;
			else if (k == 2 && hi >= lo)
				n += hi - lo + 1;
		}
	if (f)
		fclose(f);
	return n ? n : (unsigned)sysconf(_SC_NPROCESSORS_CONF);
}

static void queue_cmd(struct uring_ent *e, unsigned op, uint64_t commit_id)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&e->ring);
	struct uring_cmd_req *cmd;

	if (!sqe)
		return; /* one command in flight a ring: the ring holds four */
	memset((char *)sqe, 0, 2 * sizeof(*sqe)); /* a 128-byte slot */
	sqe->opcode = IORING_OP_URING_CMD;
	sqe->fd = e->u->devfd;
	sqe->cmd_op = op;
	if (op == FUSE_ABI_URING_REGISTER) {
		sqe->addr = (uint64_t)(uintptr_t)e->iov;
		sqe->len = 2;
	}
	cmd = (struct uring_cmd_req *)sqe->cmd;
	cmd->qid = (uint16_t)e->qid;
	cmd->commit_id = commit_id;
}

/* Answer the request in hand ourselves (one libfuse could not be given). */
static void answer_error(struct uring_ent *e, uint64_t unique, int err)
{
	struct out_header oh = { .len = sizeof(oh), .error = -err, .unique = unique };

	memcpy(e->hdr->in_out, &oh, sizeof(oh));
	e->hdr->ent.payload_sz = 0;
}

/* Hand the request the kernel put in our buffers to libfuse, and wait for
 * its reply (made on this thread, or later on another).  0, or -1 when
 * stopping with the reply not made. */
static int serve_request(struct uring_ent *e)
{
	struct fuse_uring *u = e->u;
	struct in_header in;
	size_t psz = e->hdr->ent.payload_sz, oplen;
	struct fuse_buf buf = { .mem = e->req };
	int r = 0;

	memcpy(&in, e->hdr->in_out, sizeof(in));
	if (psz > e->payload_len || in.len < sizeof(in) + psz ||
	    (oplen = in.len - sizeof(in) - psz) > sizeof(e->hdr->op_in)) {
		ulog(u, LOG_ERR, "FUSE over io_uring: request %llu (opcode %u) of %u bytes does "
		     "not fit its buffers; answered EIO", (unsigned long long)in.unique,
		     in.opcode, in.len);
		answer_error(e, in.unique, EIO);
		pthread_mutex_lock(&e->lock);
		e->committed = 0; /* the answer goes with the ring thread's commit */
		pthread_mutex_unlock(&e->lock);
		return 0;
	}
	memcpy(e->req, &in, sizeof(in));
	memcpy(e->req + sizeof(in), e->hdr->op_in, oplen);
	memcpy(e->req + sizeof(in) + oplen, e->payload, psz);
	buf.size = in.len;
	if (u->requests)
		atomic_fetch_add(u->requests, 1);
	pthread_mutex_lock(&e->lock);
	e->replied = 0;
	e->committed = 0;
	atomic_store(&e->unique, in.unique);
	pthread_mutex_unlock(&e->lock);
	if (u->note_request)
		u->note_request(u->note_arg, e->req, in.len);
	fuse_session_process_buf(u->se, &buf);
	pthread_mutex_lock(&e->lock);
	while (!e->replied && !atomic_load(&u->stop)) {
		struct timespec until;

		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_nsec += IDLE_LOOK_MS * 1000000L;
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&e->replied_cond, &e->lock, &until);
	}
	if (!e->replied) {
		atomic_store(&e->unique, 0);
		r = -1;
	}
	pthread_mutex_unlock(&e->lock);
	return r;
}

/* A completion met while waiting for a read (ringread_wait): an earlier
 * read left behind, or the entry's next request, kept for the loop. */
static void ring_other(void *arg, uint64_t ud, int res)
{
	struct uring_ent *e = arg;

	if (ud & READ_TAG) {
		ringread_reap(&e->left, ud, READ_TAG);
	} else {
		e->stashed = 1;
		e->stashed_res = res;
	}
}

int uring_here(void)
{
	return ring_self != NULL;
}

ssize_t uring_pread(int fd, size_t len, off_t off, unsigned timeout_ms, void **buf)
{
	struct uring_ent *e = ring_self;

	if (!e)
		return -ENOTSUP;
	return ringread_read_on(&e->ring, &e->left, READ_TAG, fd, len, off,
				mono_ms() + timeout_ms, ring_other, e, buf);
}

/* Wait for the entry's next request (its completion kept by uring_pread,
 * or from the ring), reaping reads left behind meanwhile.  1: one is in
 * the buffers; 0: none within @idle; -1: stop (asked, or the connection
 * ended). */
static int next_request(struct uring_ent *e, struct __kernel_timespec *idle)
{
	struct io_uring_cqe *cqe = NULL;
	int r;

	if (atomic_load(&e->u->stop))
		return -1;
	if (e->stashed) {
		e->stashed = 0;
		r = e->stashed_res;
	} else {
		if ((r = io_uring_submit(&e->ring)) >= 0)
			r = io_uring_wait_cqe_timeout(&e->ring, &cqe, idle);
		if (r == -ETIME || r == -EINTR || (r == 0 && !cqe))
			return 0;
		if (r == 0) { /* else the ring's own error: nothing submitted */
			r = cqe->res;
			if (cqe->user_data & READ_TAG) {
				ringread_reap(&e->left, cqe->user_data, READ_TAG);
				io_uring_cqe_seen(&e->ring, cqe);
				return 0;
			}
			io_uring_cqe_seen(&e->ring, cqe);
		}
	}
	if (r < 0) {
		/* ENOTCONN and the like: the connection ended */
		if (r != -ENOTCONN && r != -ECONNABORTED && r != -ECANCELED)
			ulog(e->u, LOG_ERR, "FUSE over io_uring: queue %u: %s; this thread's "
			     "entry is gone (the kernel holds requests until every queue has "
			     "one registered: restart without fuse_uring if the mount stops "
			     "answering)", e->qid, strerror(-r));
		return -1;
	}
	REQUEST_READ();
	return 1;
}

static void *ring_thread(void *arg)
{
	struct uring_ent *e = arg;
	struct fuse_uring *u = e->u;
	struct __kernel_timespec idle = { .tv_nsec = IDLE_LOOK_MS * 1000000L };
	int r;

	pthread_setname_np(pthread_self(), "wfs-ring");
	/* Not pinned to its queue's CPU: a reader's requests all come to the
	 * queue of its CPU, and threads pinned there would copy every reply on
	 * that one CPU, beside the reader's own copies (1 MiB sequential reads
	 * ran at 0.7x of unpinned threads; 4 KiB random reads gained ~10%
	 * pinned, within the noise).  The scheduler keeps a woken thread near
	 * its waker anyway. */
	ring_self = e;
	/* The ring is made here: its deferred work runs on this thread.  It
	 * counts once a no-op went through it (a filter may refuse
	 * io_uring_enter alone: its REGISTER would never reach the kernel).
	 * Reported, then the thread waits for the INIT reply (uring_start)
	 * or for the stop (a queue left without a ring: no protocol). */
	r = ringread_make(&e->ring, 4, IORING_SETUP_SQE128);
	pthread_mutex_lock(&u->gate);
	if (r < 0) {
		u->failed++;
		if (!u->first_err)
			u->first_err = r;
	} else {
		u->made++;
		e->ring_made = 1;
	}
	pthread_cond_broadcast(&u->gate_cond);
	while (r == 0 && !u->go && !atomic_load(&u->stop))
		pthread_cond_wait(&u->gate_cond, &u->gate);
	pthread_mutex_unlock(&u->gate);
	if (r < 0)
		return NULL;
	if (atomic_load(&u->stop)) {
		ringread_end(&e->ring);
		return NULL;
	}
	queue_cmd(e, FUSE_ABI_URING_REGISTER, 0);
	while ((r = next_request(e, &idle)) >= 0) {
		if (r == 0)
			continue;
		if (serve_request(e) < 0)
			break;
		if (!e->committed)
			queue_cmd(e, FUSE_ABI_URING_COMMIT_AND_FETCH, e->hdr->ent.commit_id);
	}
	ringread_end(&e->ring);
	/* Reads still left behind may yet write their buffers (a buffered
	 * read, or memory malloc reuses while an O_DIRECT read holds its
	 * pages): the buffers stay until the process ends. */
	ringread_keep(u->keep, &e->left);
	return NULL;
}

static void ent_free(struct uring_ent *e)
{
	if (!e->inited)
		return;
	free(e->hdr);
	free(e->payload);
	free(e->req);
	pthread_mutex_destroy(&e->lock);
	pthread_cond_destroy(&e->replied_cond);
}

static int ent_init(struct fuse_uring *u, struct uring_ent *e, unsigned qid, size_t payload)
{
	e->u = u;
	e->qid = qid;
	e->payload_len = payload;
	pthread_mutex_init(&e->lock, NULL);
	pthread_cond_init(&e->replied_cond, NULL);
	e->inited = 1;
	if (posix_memalign((void **)&e->hdr, 4096, sizeof(*e->hdr)) ||
	    posix_memalign((void **)&e->payload, 4096, payload) ||
	    !(e->req = malloc(sizeof(struct in_header) + sizeof(e->hdr->op_in) + payload)))
		return -ENOMEM;
	e->iov[0] = (struct iovec){ e->hdr, sizeof(*e->hdr) };
	e->iov[1] = (struct iovec){ e->payload, payload };
	return 0;
}

int uring_prepare(struct fuse_uring *u, size_t payload)
{
	unsigned queues = possible_cpus(), per_queue = u->threads / queues, n, started = 0;
	int r = 0, covered = 1;

	if (!u->gate_inited) {
		pthread_mutex_init(&u->gate, NULL);
		pthread_cond_init(&u->gate_cond, NULL);
		u->gate_inited = 1;
	}

	/* Two at least: a request that waits on the NAS leaves one for the
	 * queue's other readers. */
	if (per_queue < 2)
		per_queue = 2;
	n = queues * per_queue;

	u->ents = calloc(n, sizeof(*u->ents));
	if (!u->ents)
		return -ENOMEM;
	/* Before any thread runs: a reply is looked for among all of them
	 * (an entry not started never holds a request). */
	atomic_store(&u->nents, n);
	for (unsigned i = 0; i < n && r == 0; i++) {
		struct uring_ent *e = &u->ents[i];

		r = ent_init(u, e, i / per_queue, payload);
		if (r == 0)
			r = thread_start(&e->thread, NULL, ring_thread, e);
		e->running = r == 0;
		started += r == 0;
	}
	pthread_mutex_lock(&u->gate);
	while (u->made + u->failed < started)
		pthread_cond_wait(&u->gate_cond, &u->gate);
	/* Enough if every queue has a ring: a thread without one leaves */
	for (unsigned q = 0; q < queues && covered; q++) {
		unsigned ok = 0;

		for (unsigned i = q * per_queue; i < (q + 1) * per_queue; i++)
			ok += u->ents[i].ring_made;
		covered = ok > 0;
	}
	if (covered)
		r = 0;
	else if (u->first_err)
		r = u->first_err;
	else if (r == 0)
		r = -EAGAIN;
	pthread_mutex_unlock(&u->gate);
	if (r < 0) {
		/* The INIT reply will not ask for the protocol: no thread may
		 * register, every one leaves (its ring closed) */
		uring_stop(u);
		return r;
	}
	if (u->failed || started < n)
		ulog(u, LOG_WARNING, "FUSE over io_uring: %u of %u ring threads have a ring (%s); "
		     "every queue has one", u->made, n,
		     strerror(u->first_err ? -u->first_err : EAGAIN));
	ulog(u, LOG_INFO, "FUSE over io_uring: %u queues, %u threads each, %zu KiB buffers",
	     queues, per_queue, payload >> 10);
	return 0;
}

void uring_start(struct fuse_uring *u)
{
	if (!u->gate_inited)
		return;
	pthread_mutex_lock(&u->gate);
	u->go = 1;
	pthread_cond_broadcast(&u->gate_cond);
	pthread_mutex_unlock(&u->gate);
}

ssize_t uring_take_reply(struct fuse_uring *u, const struct iovec *iov, int count)
{
	const struct out_header *oh = iov[0].iov_base;
	unsigned n = atomic_load(&u->nents);

	if (!oh->unique)
		return -ENOENT; /* a notification: /dev/fuse */
	for (unsigned i = 0; i < n; i++) {
		struct uring_ent *e = &u->ents[i];
		size_t body = 0;

		if (atomic_load(&e->unique) != oh->unique)
			continue;
		pthread_mutex_lock(&e->lock);
		if (atomic_load(&e->unique) != oh->unique) {
			pthread_mutex_unlock(&e->lock);
			continue;
		}
		for (int k = 1; k < count; k++)
			body += iov[k].iov_len;
		if (body > e->payload_len) {
			answer_error(e, oh->unique, EIO);
			body = 0;
		} else {
			body = 0;
			for (int k = 1; k < count; k++) {
				memcpy(e->payload + body, iov[k].iov_base, iov[k].iov_len);
				body += iov[k].iov_len;
			}
			memcpy(e->hdr->in_out, oh, sizeof(*oh));
			e->hdr->ent.payload_sz = (uint32_t)body;
		}
		REPLY_SENT(); /* before the commit that hands it to the kernel */
		e->replied = 1;
		atomic_store(&e->unique, 0);
		pthread_cond_signal(&e->replied_cond);
		pthread_mutex_unlock(&e->lock);
		if (ring_self == e) {
			/* Made on the thread that took the request: committed now,
			 * so the reader has it while the handler does what it does
			 * after replying (a listing made ahead of a walk). */
			e->committed = 1;
			queue_cmd(e, FUSE_ABI_URING_COMMIT_AND_FETCH, e->hdr->ent.commit_id);
			io_uring_submit(&e->ring);
		}
		return (ssize_t)(sizeof(*oh) + body);
	}
	return -ENOENT;
}

void uring_stop(struct fuse_uring *u)
{
	unsigned n = atomic_load(&u->nents);

	if (!u->ents)
		return;
	atomic_store(&u->stop, 1);
	pthread_mutex_lock(&u->gate); /* threads still at the start gate */
	pthread_cond_broadcast(&u->gate_cond);
	pthread_mutex_unlock(&u->gate);
	for (unsigned i = 0; i < n; i++)
		if (u->ents[i].running)
			pthread_join(u->ents[i].thread, NULL);
	for (unsigned i = 0; i < n; i++)
		ent_free(&u->ents[i]);
	free(u->ents);
	u->ents = NULL;
	atomic_store(&u->nents, 0);
}
