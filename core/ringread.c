/* ringread.c - see ringread.h. */
#include "ringread.h"

#include "clock.h"

#include <errno.h>
#include <liburing.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Submissions are one at a time; completions outstanding at most
 * RINGREAD_MAX_LEFT + 1, within the completion queue (twice this). */
#define RING_ENTRIES 8

#if defined(__SANITIZE_THREAD__)
#define RING_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RING_TSAN 1
#endif
#endif

#ifdef RING_TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);

/* @fn on every page of @ring's memory: the rings, the SQE array.  Reads
 * only struct io_uring's own fields: nothing of the ring's memory is read
 * before @fn acquired it. */
static void ring_pages(struct io_uring *ring, void (*fn)(void *))
{
	size_t sqe = ring->flags & IORING_SETUP_SQE128 ? 128 : 64;
	const struct { void *p; size_t len; } part[] = {
		{ ring->sq.ring_ptr, ring->sq.ring_sz },
		{ ring->cq.ring_ptr, ring->cq.ring_sz },
		{ ring->sq.sqes, (size_t)ring->sq.ring_entries * sqe },
	};

	for (size_t i = 0; i < sizeof(part) / sizeof(part[0]); i++)
		for (size_t off = 0; part[i].p && off < part[i].len; off += 4096)
			fn((char *)part[i].p + off);
}
#define RING_MAPPED(ring) ring_pages((ring), __tsan_acquire)
#define RING_UNMAPPING(ring) ring_pages((ring), __tsan_release)
#else
#define RING_MAPPED(ring) ((void)(ring))
#define RING_UNMAPPING(ring) ((void)(ring))
#endif

/* A read's own buffer, its address the read's user_data. */
struct ringread_left {
	void *buf;
	struct ringread_left *next; /* on a thread's or @rr's list of reads left */
};

struct ring_thread {
	struct ringread *rr;
	struct io_uring ring;
	int usable;                  /* the ring was made */
	struct ringread_lefts left;  /* reads past their deadline, not ended */
};

static void left_free(struct ringread_left *l)
{
	while (l) {
		struct ringread_left *next = l->next;

		free(l->buf);
		free(l);
		l = next;
	}
}

int ringread_reap(struct ringread_lefts *l, uint64_t ud, uint64_t tag)
{
	struct ringread_left **p = &l->head;
	struct ringread_left *rd;

	while (*p && (uint64_t)(uintptr_t)*p != (ud & ~tag))
		p = &(*p)->next;
	if (!(rd = *p))
		return 0;
	*p = rd->next;
	rd->next = NULL;
	left_free(rd);
	l->n--;
	return 1;
}

static void reap_other(void *arg, uint64_t ud, int res)
{
	struct ring_thread *t = arg;

	(void)res;
	ringread_reap(&t->left, ud, 0); /* an earlier read left */
}

/* Free the reads left that have ended, without waiting. */
static void reap_ended(struct ring_thread *t)
{
	struct io_uring_cqe *cqe;

	io_uring_get_events(&t->ring); /* deferred task work: completions */
	while (io_uring_peek_cqe(&t->ring, &cqe) == 0) {
		uint64_t ud = cqe->user_data;

		io_uring_cqe_seen(&t->ring, cqe);
		ringread_reap(&t->left, ud, 0);
	}
}

static void thread_end(void *arg)
{
	struct ring_thread *t = arg;

	if (t->usable) {
		reap_ended(t);
		ringread_end(&t->ring);
	}
	ringread_keep(t->rr, &t->left); /* the kernel may write them yet */
	free(t);
}

int ringread_init(struct ringread *rr)
{
	int r;

	memset(rr, 0, sizeof(*rr));
	if ((r = pthread_mutex_init(&rr->lock, NULL)))
		return -r;
	if ((r = pthread_key_create(&rr->key, thread_end))) {
		pthread_mutex_destroy(&rr->lock);
		return -r;
	}
	rr->key_made = 1;
	return 0;
}

void ringread_fini(struct ringread *rr)
{
	if (!rr->key_made)
		return;
	pthread_key_delete(rr->key);
	left_free(rr->orphans.head);
	rr->orphans = (struct ringread_lefts){ 0 };
	pthread_mutex_destroy(&rr->lock);
	rr->key_made = 0;
}

int ringread_check(struct io_uring *ring)
{
	struct io_uring_sqe *sqe;
	struct io_uring_cqe *cqe = NULL;
	int r;

	RING_MAPPED(ring);
	sqe = io_uring_get_sqe(ring);
	if (!sqe)
		return -EBUSY;
	io_uring_prep_nop(sqe);
	io_uring_sqe_set_data64(sqe, 0);
	while ((r = io_uring_submit_and_wait(ring, 1)) == -EINTR)
		;
	if (r < 0)
		return r;
	while ((r = io_uring_wait_cqe(ring, &cqe)) == -EINTR)
		;
	if (r < 0)
		return r;
	r = cqe->res;
	io_uring_cqe_seen(ring, cqe);
	return r < 0 ? r : 0;
}

void ringread_end(struct io_uring *ring)
{
	RING_UNMAPPING(ring);
	io_uring_queue_exit(ring);
}

int ringread_make(struct io_uring *ring, unsigned entries, unsigned flags)
{
	int r = io_uring_queue_init(entries, ring, flags | IORING_SETUP_SINGLE_ISSUER |
				    IORING_SETUP_DEFER_TASKRUN);

	if (r == -EINVAL) /* a kernel before 6.1 */
		r = io_uring_queue_init(entries, ring, flags);
	if (r == 0 && (r = ringread_check(ring)) < 0)
		ringread_end(ring); /* made, but nothing goes through */
	return r;
}

int ringread_probe(void)
{
	struct io_uring ring;
	int r = io_uring_queue_init(2, &ring, 0);

	if (r == 0) {
		r = ringread_check(&ring);
		ringread_end(&ring);
	}
	return r;
}

void ringread_keep(struct ringread *rr, struct ringread_lefts *l)
{
	struct ringread_left *last;

	if (!l->head)
		return;
	for (last = l->head; last->next; last = last->next)
		;
	pthread_mutex_lock(&rr->lock);
	last->next = rr->orphans.head;
	rr->orphans.head = l->head;
	rr->orphans.n += l->n;
	pthread_mutex_unlock(&rr->lock);
	*l = (struct ringread_lefts){ 0 };
}

/* This thread's ring, made on its first call; NULL with errno ENOMEM. */
static struct ring_thread *thread_ring(struct ringread *rr)
{
	struct ring_thread *t = pthread_getspecific(rr->key);

	if (t)
		return t;
	if (!(t = calloc(1, sizeof(*t))))
		return NULL;
	t->rr = rr;
	t->usable = ringread_make(&t->ring, RING_ENTRIES, 0) == 0;
	if ((errno = pthread_setspecific(rr->key, t))) {
		if (t->usable)
			ringread_end(&t->ring);
		free(t);
		return NULL;
	}
	return t;
}

int ringread_ready(struct ringread *rr)
{
	struct ring_thread *t = thread_ring(rr);

	return t ? t->usable : -ENOMEM;
}

ssize_t ringread_pread(struct ringread *rr, int fd, size_t len, off_t off,
		       unsigned timeout_ms, void **buf)
{
	struct ring_thread *t = thread_ring(rr);
	int64_t deadline = mono_ms() + timeout_ms;

	if (!t)
		return -errno;
	if (!t->usable)
		return -ENOTSUP;
	if (t->left.n >= RINGREAD_MAX_LEFT)
		reap_ended(t);
	return ringread_read_on(&t->ring, &t->left, 0, fd, len, off, deadline,
				reap_other, t, buf);
}

ssize_t ringread_read_on(struct io_uring *ring, struct ringread_lefts *l, uint64_t tag,
			 int fd, size_t len, off_t off, int64_t deadline_ms,
			 void (*other)(void *arg, uint64_t ud, int res), void *arg, void **buf)
{
	struct io_uring_sqe *sqe;
	struct ringread_left *rd;
	uint64_t ud;
	int r, res;

	if (l->n >= RINGREAD_MAX_LEFT)
		return -EHOSTDOWN;
	if (!(rd = calloc(1, sizeof(*rd))))
		return -ENOMEM;
	if (posix_memalign(&rd->buf, 4096, len ? len : 4096)) {
		free(rd);
		return -ENOMEM;
	}
	if (!(sqe = io_uring_get_sqe(ring))) { /* never: one read at a time */
		left_free(rd);
		return -EBUSY;
	}
	/* a FUSE ring's entries are 128 bytes: no command's leftovers */
	memset(sqe, 0, (ring->flags & IORING_SETUP_SQE128) ? 2 * sizeof(*sqe) : sizeof(*sqe));
	ud = (uint64_t)(uintptr_t)rd | tag;
	io_uring_prep_read(sqe, fd, rd->buf, (unsigned)len, (uint64_t)off);
	io_uring_sqe_set_data64(sqe, ud);
	r = io_uring_submit(ring);
	if (r >= 0)
		r = ringread_wait(ring, ud, deadline_ms, other, arg, &res);
	if (r < 0) {
		/* past the deadline (or the ring failed): the read goes on
		 * into its own buffer, freed when it ends */
		rd->next = l->head;
		l->head = rd;
		l->n++;
		return r == -ETIME ? -ETIMEDOUT : r;
	}
	if (res < 0) {
		left_free(rd);
		/* -ETIMEDOUT says the deadline passed; a soft NFS mount's is not that */
		return res == -ETIMEDOUT ? -ENOTCONN : res;
	}
	*buf = rd->buf;
	free(rd);
	return res;
}

int ringread_wait(struct io_uring *ring, uint64_t ud, int64_t deadline_ms,
		  void (*other)(void *arg, uint64_t ud, int res), void *arg, int *res)
{
	for (;;) {
		struct io_uring_cqe *cqe = NULL;
		int64_t left = deadline_ms - mono_ms();
		struct __kernel_timespec ts = { .tv_sec = left / 1000,
						.tv_nsec = (left % 1000) * 1000000 };
		uint64_t got;
		int r = left > 0 ? io_uring_wait_cqe_timeout(ring, &cqe, &ts) : -ETIME;

		if (r == -EINTR || (r == 0 && !cqe))
			continue;
		if (r < 0)
			return r;
		got = cqe->user_data;
		r = cqe->res;
		io_uring_cqe_seen(ring, cqe);
		if (got == ud) {
			*res = r;
			return 0;
		}
		other(arg, got, r);
	}
}
