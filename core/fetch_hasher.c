/* fetch_hasher.c - the content-address hasher of the verified copy: the
 * thread that hashes the source slots (content address and XXH3-128) in
 * offset order while the copying thread drives the I/O.  struct hasher, in
 * fetch_int.h, says how the two threads share the slots; fetch.c's
 * hasher_wait() is the copying thread's side of the wake-ups.
 */
#include "fetch_int.h"
#include "thread.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* the hasher feeds each hash this much at a time (it stays in L1/L2) */
#define HASH_PIECE ((size_t)64 << 10)

static void *hasher_main(void *arg)
{
	struct hasher *h = arg;
	uint64_t one = 1, w, end;

	pthread_setname_np(pthread_self(), "wfs-hash");
	pthread_mutex_lock(&h->lock);
	for (;;) {
		int64_t p0 = h->prof ? mono_ns() : 0;
		struct slot *sl;

		while (!h->n && !h->stop)
			pthread_cond_wait(&h->cond, &h->lock);
		if (h->prof)
			h->idle_ns += mono_ns() - p0;
		if (!h->n)
			break;
		sl = h->q[h->head];
		pthread_mutex_unlock(&h->lock);
		/* both hashes over each piece while it is in the cache */
		for (size_t o = 0; o < sl->want; o += HASH_PIECE) {
			size_t m = sl->want - o < HASH_PIECE ? sl->want - o : HASH_PIECE;

			if (atomic_load_explicit(&h->abort, memory_order_relaxed))
				break;
			content_hash_update_id(h->ch, sl->buf + o, m);
			content_hash_update_xxh(h->ch, sl->buf + o, m);
		}
		/* (seq_cst, so also a release: the digest state and the reads
		 * of the slot come before the copying thread may reuse the
		 * slot or finish; the slot is not looked at after it) */
		end = sl->off + sl->want;
		atomic_store(&h->done, end);
		/* the copying thread sleeps until the hashing reaches wake_at:
		 * whichever of the two takes wake_at back to 0 writes efd */
		w = atomic_load(&h->wake_at);
		if (w && end >= w &&
		    atomic_compare_exchange_strong(&h->wake_at, &w, 0))
			while (write(h->efd, &one, sizeof(one)) < 0 && errno == EINTR)
				;
		pthread_mutex_lock(&h->lock);
		h->head = (h->head + 1) % NSRC;
		h->n--;
	}
	pthread_mutex_unlock(&h->lock);
	if (h->prof) {
		/* time on the CPU, and runnable but waiting for one */
		FILE *f = fopen("/proc/thread-self/schedstat", "r");
		long long on, rq;

		h->cpu_ns = clock_ns(CLOCK_THREAD_CPUTIME_ID);
		if (f && fscanf(f, "%lld %lld", &on, &rq) == 2)
			h->rq_ns = rq;
		if (f)
			fclose(f);
	}
	return NULL;
}

/* Start the hasher for @ch; 0 when it could not start (then the copying
 * thread hashes everything itself). */
int hasher_start(struct hasher *h, struct content_hash *ch)
{
	h->ch = ch;
	h->efd = eventfd(0, EFD_CLOEXEC);
	if (h->efd < 0)
		return 0;
	if (pthread_mutex_init(&h->lock, NULL) != 0)
		goto no_lock;
	if (pthread_cond_init(&h->cond, NULL) != 0)
		goto no_cond;
	if (thread_start(&h->thread, NULL, hasher_main, h) != 0)
		goto no_thread;
	h->started = h->ran = 1;
	return 1;
no_thread:
	pthread_cond_destroy(&h->cond);
no_cond:
	pthread_mutex_destroy(&h->lock);
no_lock:
	close(h->efd);
	h->efd = -1;
	return 0;
}

void hasher_post(struct hasher *h, struct slot *sl)
{
	pthread_mutex_lock(&h->lock);
	h->q[(h->head + h->n) % NSRC] = sl;
	h->n++;
	pthread_cond_signal(&h->cond);
	pthread_mutex_unlock(&h->lock);
	h->posted = sl->off + sl->want;
}

/* Bytes of the source hashed by the hasher (all, without one). */
uint64_t hasher_done(struct hasher *h)
{
	return h->started ? atomic_load_explicit(&h->done, memory_order_acquire) : UINT64_MAX;
}

/* Waits for what it was handed (skipping the hashing when @abort), then
 * ends; safe to call again, and without a hasher. */
void hasher_stop(struct hasher *h, int abort)
{
	if (!h->started)
		return;
	if (abort)
		atomic_store(&h->abort, 1);
	pthread_mutex_lock(&h->lock);
	h->stop = 1;
	pthread_cond_signal(&h->cond);
	pthread_mutex_unlock(&h->lock);
	pthread_join(h->thread, NULL);
	pthread_cond_destroy(&h->cond);
	pthread_mutex_destroy(&h->lock);
	close(h->efd);
	h->efd = -1;
	h->started = 0;
}
