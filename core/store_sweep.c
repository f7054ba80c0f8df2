/* store_sweep.c - the background thread that makes the checks a local
 * copy is owed after start-up (store_verify.c says what each one is): every
 * source checked once, every copy the index could not prove re-hashed, and
 * from then on the source checks the NAS could not answer, once it does.
 * A pass walks the blob table a bucket at a time with no lock held during
 * the work: a hung NAS costs a check its deadline, never the thread.
 */
#include "store.h"
#include "store_int.h"
#include "clock.h"
#include "nasgate.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

/* One pass over the table: a bucket at a time, resumed where it was (the
 * table may grow meanwhile; blobs added later were checked when made
 * LOCAL, or are checked on first open).  @todo picks what to work on; a
 * blob is worked on once per @pass (a check the NAS could not answer
 * leaves it as it was: not again and again in the same pass). */
static void sweep(struct store *s, uint64_t pass, int (*todo)(const struct blob *),
		  void (*work)(struct store *, struct blob *))
{
	for (size_t i = 0;; i++) {
		struct blob *b = NULL;

		pthread_mutex_lock(&s->lock);
		if (s->stop || i >= s->blobs.nb) {
			pthread_mutex_unlock(&s->lock);
			return;
		}
		for (struct hlink *l = s->blobs.b[i]; l && !b; l = l->next) {
			struct blob *o = htab_entry(l, struct blob, hl);

			if (o->swept != pass && todo(o)) {
				b = o;
				b->swept = pass;
			}
		}
		pthread_mutex_unlock(&s->lock);
		if (b) {
			work(s, b);
			i--; /* the same bucket again: it may hold more */
		}
	}
}

static int source_unchecked(const struct blob *b)
{
	return served_locally_locked(b) && !b->checked;
}

static void check_source(struct store *s, struct blob *b)
{
	store_check_source(s, b);
}

static int copy_unproven(const struct blob *b)
{
	return b->reverify && b->state == BLOB_COPYING;
}

/* A pass over the sources left unchecked is tried this often while the
 * NAS is up and some check could not be made (an EIO the NAS may not
 * repeat); at once when the gate comes back up. */
#define RECHECK_MS (60 * 1000)

static uint64_t gate_gen(struct store *s)
{
	return s->opt.gate ? atomic_load(&s->opt.gate->generation) : 0;
}

/* Wait until another pass over the unchecked sources is worth making:
 * some check could not be made and the NAS is up, and it came (back) up
 * since the last pass (its generation changed) or RECHECK_MS passed.
 * Returns 0 when the store stops.  The gate has no callback: looked at
 * once a second (two atomic loads). */
static int recheck_wait(struct store *s, uint64_t *gen, int64_t *last)
{
	pthread_mutex_lock(&s->lock);
	while (!s->stop) {
		int64_t now = store_now_ms();
		uint64_t g = gate_gen(s);
		struct timespec ts = mono_timespec(now + 1000);

		if (s->recheck_wanted && nas_gate_up(s->opt.gate) &&
		    (g != *gen || now - *last >= RECHECK_MS)) {
			s->recheck_wanted = 0; /* set again by what fails in the pass */
			*gen = g;
			*last = now;
			pthread_mutex_unlock(&s->lock);
			return 1;
		}
		pthread_cond_timedwait(&s->cond, &s->lock, &ts); /* CLOCK_MONOTONIC */
	}
	pthread_mutex_unlock(&s->lock);
	return 0;
}

/* After start-up, in the background: every local copy's source checked
 * once (an open of an unchecked blob checks it first anyway) -- not while
 * the NAS is down --, then every copy the index could not prove re-hashed;
 * then, for as long as the store runs, the sources whose check the NAS
 * could not answer, once it does.  Every NAS call through the gate: a
 * hung NAS costs a deadline, never the thread (store_close joins it). */
void *store_recheck_sweep(void *arg)
{
	struct store *s = arg;
	uint64_t pass = 0, gen = gate_gen(s);
	int64_t last = store_now_ms();

	pthread_setname_np(pthread_self(), "wfs-recheck");
	if (nas_gate_up(s->opt.gate)) {
		sweep(s, ++pass, source_unchecked, check_source);
	} else {
		pthread_mutex_lock(&s->lock);
		s->recheck_wanted = 1;
		pthread_mutex_unlock(&s->lock);
	}
	sweep(s, ++pass, copy_unproven, store_reverify_one);
	while (recheck_wait(s, &gen, &last))
		sweep(s, ++pass, source_unchecked, check_source);
	return NULL;
}
