/* dirattr.c - a listed directory's attributes put back in the kernel; see
 * dirattr.h for why and the rules. */
#include "dirattr.h"
#include "clock.h"
#include "thread.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* Under q->lock: @rel at @r's tail, due @ms from now (dropped when @r
 * is full). */
static void push_locked(struct dir_attrs *q, struct dir_attr_ring *r, const char *rel, int ms)
{
	char *copy;

	if (q->stop)
		return;
	if (r->count == DIR_ATTRS_CAPACITY || !(copy = strdup(rel)))
		return;
	r->v[(r->head + r->count) % DIR_ATTRS_CAPACITY] =
		(struct dir_attr_item){ .rel = copy, .due_ns = mono_ns() + (int64_t)ms * 1000000 };
	r->count++;
	pthread_cond_signal(&q->work);
}

void dir_attrs_note(struct dir_attrs *q, const char *rel)
{
	pthread_mutex_lock(&q->lock);
	if (q->started)
		push_locked(q, &q->soon, rel, DIR_ATTRS_SOON_MS);
	pthread_mutex_unlock(&q->lock);
}

/* Under q->lock: the ring whose head is due first, or NULL when both are
 * empty. */
static struct dir_attr_ring *next_locked(struct dir_attrs *q)
{
	if (!q->soon.count)
		return q->late.count ? &q->late : NULL;
	if (!q->late.count)
		return &q->soon;
	return q->soon.v[q->soon.head].due_ns <= q->late.v[q->late.head].due_ns ? &q->soon
										  : &q->late;
}

/* The stat that makes the kernel ask again when it must (no lock held). */
static void refresh(struct dir_attrs *q, const char *rel)
{
	char path[PATH_MAX * 2];
	struct stat st;

	snprintf(path, sizeof(path), "%s%s%s", q->mnt, *rel ? "/" : "", rel);
	if (fstatat(AT_FDCWD, path, &st, AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT) == 0 && q->refreshed)
		atomic_fetch_add_explicit(q->refreshed, 1, memory_order_relaxed);
}

static void *dir_attrs_main(void *arg)
{
	struct dir_attrs *q = arg;

	pthread_setname_np(pthread_self(), "wfs-dirattr");
	pthread_mutex_lock(&q->lock);
	while (!q->stop) {
		struct dir_attr_ring *r = next_locked(q);
		struct dir_attr_item it;

		if (!r) {
			pthread_cond_wait(&q->work, &q->lock);
			continue;
		}
		it = r->v[r->head];
		if (mono_ns() < it.due_ns) {
			struct timespec ts = { .tv_sec = it.due_ns / 1000000000,
					       .tv_nsec = it.due_ns % 1000000000 };

			pthread_cond_timedwait(&q->work, &q->lock, &ts);
			continue;
		}
		r->head = (r->head + 1) % DIR_ATTRS_CAPACITY;
		r->count--;
		pthread_mutex_unlock(&q->lock);
		refresh(q, it.rel);
		pthread_mutex_lock(&q->lock);
		if (r == &q->soon)
			push_locked(q, &q->late, it.rel, DIR_ATTRS_LATE_MS);
		free(it.rel);
	}
	pthread_mutex_unlock(&q->lock);
	return NULL;
}

int dir_attrs_init(struct dir_attrs *q, const char *mnt, _Atomic uint64_t *refreshed)
{
	pthread_condattr_t ca;
	int r;

	memset(q, 0, sizeof(*q));
	if (strlen(mnt) >= sizeof(q->mnt))
		return -ENAMETOOLONG;
	memcpy(q->mnt, mnt, strlen(mnt) + 1);
	q->refreshed = refreshed;
	if ((r = pthread_condattr_init(&ca)) != 0)
		return -r;
	r = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	if (r == 0)
		r = pthread_cond_init(&q->work, &ca);
	pthread_condattr_destroy(&ca);
	if (r == 0 && (r = pthread_mutex_init(&q->lock, NULL)) != 0)
		pthread_cond_destroy(&q->work);
	return -r;
}

int dir_attrs_start(struct dir_attrs *q)
{
	int r;

	pthread_mutex_lock(&q->lock);
	q->stop = false;
	r = thread_start(&q->thread, NULL, dir_attrs_main, q);
	q->started = r == 0;
	pthread_mutex_unlock(&q->lock);
	return r;
}

static void drain(struct dir_attr_ring *r)
{
	for (; r->count; r->count--, r->head = (r->head + 1) % DIR_ATTRS_CAPACITY)
		free(r->v[r->head].rel);
}

void dir_attrs_stop(struct dir_attrs *q)
{
	bool started;

	pthread_mutex_lock(&q->lock);
	started = q->started;
	q->stop = true;
	q->started = false;
	pthread_cond_signal(&q->work);
	pthread_mutex_unlock(&q->lock);
	if (started)
		pthread_join(q->thread, NULL);
	pthread_mutex_lock(&q->lock);
	drain(&q->soon);
	drain(&q->late);
	pthread_mutex_unlock(&q->lock);
}
