/* inval.c - the invalidation queue; see inval.h. */
#include "inval.h"
#include "thread.h"
#include "clock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int cond_init_monotonic(pthread_cond_t *c)
{
	pthread_condattr_t a;
	int e = pthread_condattr_init(&a);

	if (e)
		return -e;
	e = pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	if (!e)
		e = pthread_cond_init(c, &a);
	pthread_condattr_destroy(&a);
	return -e;
}

int inval_init(struct inval_queue *q, size_t cap, const struct inval_hooks *hooks)
{
	int e;

	memset(q, 0, sizeof(*q));
	q->hooks = *hooks;
	q->cap = cap ? cap : INVAL_CAPACITY;
	q->ring = calloc(q->cap, sizeof(*q->ring));
	if (!q->ring)
		return -ENOMEM;
	e = pthread_mutex_init(&q->lock, NULL);
	if (e) {
		free(q->ring);
		return -e;
	}
	if ((e = cond_init_monotonic(&q->work)) < 0) {
		pthread_mutex_destroy(&q->lock);
		free(q->ring);
		return e;
	}
	if ((e = cond_init_monotonic(&q->idle)) < 0) {
		pthread_cond_destroy(&q->work);
		pthread_mutex_destroy(&q->lock);
		free(q->ring);
		return e;
	}
	return 0;
}

void inval_push(struct inval_queue *q, uint64_t ino)
{
	if (!ino || !q->ring) /* !ring: before inval_init (a zeroed queue) */
		return;
	pthread_mutex_lock(&q->lock);
	if (q->stopping)
		goto out;
	/* A linear scan: at most cap compares of one cache-friendly array,
	 * and pushes are rare (a demotion, a source that changed). */
	for (size_t i = 0; i < q->count; i++) {
		if (q->ring[(q->head + i) % q->cap] == ino) {
			q->st.deduped++;
			goto out;
		}
	}
	if (q->overflow) {
		/* notify_all is owed already and covers this inode too. */
		q->st.coalesced++;
	} else if (q->count == q->cap) {
		q->overflow = true;
		q->st.coalesced++;
		pthread_cond_signal(&q->work);
	} else {
		q->ring[(q->head + q->count++) % q->cap] = ino;
		q->st.queued++;
		pthread_cond_signal(&q->work);
	}
out:
	pthread_mutex_unlock(&q->lock);
}

static void *inval_thread(void *arg)
{
	struct inval_queue *q = arg;

	pthread_setname_np(pthread_self(), "wfs-inval");
	pthread_mutex_lock(&q->lock);
	while (!q->stopping) {
		if (q->overflow) {
			/* Everything queued is covered by the sweep: drop it
			 * first, so that reports arriving during the sweep
			 * queue afresh (the sweep may have passed them). */
			q->overflow = false;
			q->head = q->count = 0;
			q->busy = true;
			q->st.all++;
			pthread_mutex_unlock(&q->lock);
			q->hooks.notify_all(q->hooks.arg);
			pthread_mutex_lock(&q->lock);
		} else if (q->count) {
			uint64_t ino = q->ring[q->head];

			q->head = (q->head + 1) % q->cap;
			q->count--;
			q->busy = true;
			q->st.notified++;
			pthread_mutex_unlock(&q->lock);
			q->hooks.notify(q->hooks.arg, ino);
			pthread_mutex_lock(&q->lock);
		} else {
			q->busy = false;
			pthread_cond_broadcast(&q->idle);
			pthread_cond_wait(&q->work, &q->lock);
			continue;
		}
		q->busy = false;
	}
	q->busy = false;
	pthread_cond_broadcast(&q->idle);
	pthread_mutex_unlock(&q->lock);
	return NULL;
}

int inval_start(struct inval_queue *q)
{
	int e = thread_start(&q->thread, NULL, inval_thread, q);

	if (e)
		return e;
	q->started = true;
	return 0;
}

int inval_wait_idle(struct inval_queue *q, unsigned timeout_ms)
{
	struct timespec until = mono_timespec(mono_ms() + timeout_ms);
	int e = 0;

	pthread_mutex_lock(&q->lock);
	while ((q->count || q->overflow || q->busy) && !q->stopping && e != ETIMEDOUT)
		e = pthread_cond_timedwait(&q->idle, &q->lock, &until);
	e = q->count || q->overflow || q->busy ? -ETIMEDOUT : 0;
	pthread_mutex_unlock(&q->lock);
	return e;
}

void inval_get_stats(struct inval_queue *q, struct inval_stats *st)
{
	pthread_mutex_lock(&q->lock);
	*st = q->st;
	st->pending = q->count;
	pthread_mutex_unlock(&q->lock);
}

void inval_stop(struct inval_queue *q)
{
	if (!q->ring)
		return;
	pthread_mutex_lock(&q->lock);
	q->stopping = true;
	q->head = q->count = 0;
	q->overflow = false;
	pthread_cond_signal(&q->work);
	pthread_mutex_unlock(&q->lock);
	if (q->started) {
		pthread_join(q->thread, NULL);
		q->started = false;
	}
}

int inval_retire_fd(int fd, const char *stand_in)
{
	int in = open(stand_in, O_RDONLY | O_CLOEXEC), r = 0;

	if (in < 0)
		return -errno;
	if (dup3(in, fd, O_CLOEXEC) < 0)
		r = -errno;
	close(in);
	return r;
}

void inval_destroy(struct inval_queue *q)
{
	if (!q->ring)
		return;
	pthread_cond_destroy(&q->idle);
	pthread_cond_destroy(&q->work);
	pthread_mutex_destroy(&q->lock);
	free(q->ring);
	q->ring = NULL;
}
