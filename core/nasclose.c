/* nasclose.c - see nasclose.h. */
#include "nasclose.h"
#include "clock.h"
#include "thread.h"

#include <errno.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* Shared by the owner and the thread; freed by whichever lets go last
 * (the owner may go first: a close stuck in a hung NAS). */
struct nas_closer_q {
	pthread_mutex_t lock;
	pthread_cond_t work;     /* a descriptor queued, or stop */
	pthread_cond_t drained;  /* the queue emptied (CLOCK_MONOTONIC) */
	int *fds;                /* the queue: fds[0..n) */
	size_t n, cap;
	unsigned closing;        /* 1 while the thread is in close() */
	int stop;
	int refs;                /* 2 while both hold it */
};

static void q_put(struct nas_closer_q *q)
{
	int last;

	pthread_mutex_lock(&q->lock);
	last = --q->refs == 0;
	pthread_mutex_unlock(&q->lock);
	if (!last)
		return;
	pthread_mutex_destroy(&q->lock);
	pthread_cond_destroy(&q->work);
	pthread_cond_destroy(&q->drained);
	free(q->fds);
	free(q);
}

static void *closer_run(void *arg)
{
	struct nas_closer_q *q = arg;

	pthread_mutex_lock(&q->lock);
	for (;;) {
		if (q->n) {
			int fd = q->fds[--q->n];

			q->closing = 1;
			pthread_mutex_unlock(&q->lock);
			close(fd);
			pthread_mutex_lock(&q->lock);
			q->closing = 0;
			if (!q->n)
				pthread_cond_broadcast(&q->drained);
			continue;
		}
		if (q->stop)
			break;
		pthread_cond_wait(&q->work, &q->lock);
	}
	pthread_mutex_unlock(&q->lock);
	q_put(q);
	return NULL;
}

int nas_closer_init(struct nas_closer *c)
{
	struct nas_closer_q *q = calloc(1, sizeof(*q));
	pthread_condattr_t ca;
	int r;

	c->q = NULL;
	if (!q)
		return -ENOMEM;
	pthread_mutex_init(&q->lock, NULL);
	pthread_cond_init(&q->work, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&q->drained, &ca);
	pthread_condattr_destroy(&ca);
	q->refs = 2;
	r = thread_start(&c->thread, NULL, closer_run, q);
	if (r < 0) {
		q->refs = 1;
		q_put(q);
		return r;
	}
	c->q = q;
	return 0;
}

void nas_close_later(struct nas_closer *c, int fd)
{
	struct nas_closer_q *q = c ? c->q : NULL;

	if (fd < 0)
		return;
	if (q) {
		pthread_mutex_lock(&q->lock);
		if (q->n == q->cap) {
			size_t cap = q->cap ? q->cap * 2 : 16;
			int *v = realloc(q->fds, cap * sizeof(*v));

			if (v) {
				q->fds = v;
				q->cap = cap;
			}
		}
		if (q->n < q->cap && !q->stop) {
			q->fds[q->n++] = fd;
			pthread_cond_signal(&q->work);
			pthread_mutex_unlock(&q->lock);
			return;
		}
		pthread_mutex_unlock(&q->lock);
	}
	close(fd); /* no room to queue it: better a wait than a leak */
}

unsigned nas_closer_stop_by(struct nas_closer *c, int64_t deadline_ms)
{
	struct nas_closer_q *q = c->q;
	struct timespec until = mono_timespec(deadline_ms);
	unsigned left;

	if (!q)
		return 0;
	pthread_mutex_lock(&q->lock);
	q->stop = 1;
	pthread_cond_signal(&q->work);
	while ((q->n || q->closing) &&
	       (deadline_ms < 0 ? pthread_cond_wait(&q->drained, &q->lock) :
		pthread_cond_timedwait(&q->drained, &q->lock, &until)) != ETIMEDOUT)
		;
	left = (unsigned)q->n + q->closing;
	pthread_mutex_unlock(&q->lock);
	if (!left)
		pthread_join(c->thread, NULL);
	else
		pthread_detach(c->thread); /* stuck in the NAS: it frees @q itself */
	q_put(q);
	c->q = NULL;
	return left;
}
