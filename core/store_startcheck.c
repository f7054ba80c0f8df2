/* store_startcheck.c - at start-up, do the sources of the index's local
 * copies still exist, with the recorded size?  (verify_sources_loaded,
 * store_int.h; the rest of a copy's checks are store_verify.c's.)
 *
 * This runs before anything is mounted and before the daemon forks, so the
 * NAS gate's threads cannot make these calls (a fork copies no thread), and
 * a plain stat on the caller's thread would hang the whole start -- a
 * systemd start, `mount -t fuse.wfs` -- on a NAS that answered the check of
 * NAS_HUB and then froze.  So one thread of its own makes the stats, as
 * fs/main.c's check of NAS_HUB does, and the caller waits for each at most
 * the NAS deadline and for all of them at most STARTCHECK_BUDGET_MS.  A
 * stat past its deadline marks the NAS down.  Whatever is left unlooked-at
 * serves, unchecked, exactly as a copy whose source could not be stat'ed
 * always did: the first open and the sweep check it through the gate
 * (store_check_source), with the sampled hash, which says more than this
 * stat.  The thread works on copies of the keys and sizes, so one stuck in
 * the NAS touches nothing of the store; whichever of it and the caller
 * lets go last frees them.
 */
#include "store.h"
#include "store_int.h"
#include "clock.h"
#include "nasgate.h"
#include "thread.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <time.h>

/* All the start-up stats together: a slow but working NFS server answers
 * a stat in ~1 ms, so this is thousands of copies; past it the rest are
 * checked at their first open, and the mount is not held up. */
#define STARTCHECK_BUDGET_MS 5000

/* Start-up logs name at most this many sources that could not be checked
 * (an unreachable NAS would fail them all): then a count. */
#define LOAD_LOG_MAX 5

/* What a start-up stat says of a source: 0 as recorded, 1 gone or changed
 * (@why says), -errno it proves nothing.  A source gone along with
 * everything in its root (@root, "" if not known; @hub: NAS_HUB) is that
 * root not mounted: -ENOMEDIUM, or -ENOLINK (nas_missing_or_gone). */
static int loaded_source(const char *root, int hub, const char *key, uint64_t size, char *why,
			 size_t wsz)
{
	struct stat st;

	if (stat(key, &st) < 0) {
		int err = -errno;

		err = nas_missing_or_gone(root, hub, err);
		if (err != -ENOENT && err != -ENOTDIR)
			return err; /* -ENOMEDIUM, -ENOLINK too */
		snprintf(why, wsz, "source vanished (%s)", strerror(-err));
		return 1;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(why, wsz, "source is not a regular file any more");
		return 1;
	}
	if ((uint64_t)st.st_size != size) {
		snprintf(why, wsz, "source changed size: %llu bytes, %llu recorded",
			 (unsigned long long)st.st_size, (unsigned long long)size);
		return 1;
	}
	return 0;
}

/* The stats to make, and what they said.  Rules: IMMUTABLE once the thread
 * runs; LOCK: under @lock. */
struct load_job {
	pthread_mutex_t lock;
	pthread_cond_t progress; /* LOCK: @done moved, @finished (CLOCK_MONOTONIC) */
	int refs;                /* LOCK: the caller and the thread */
	int cancel;              /* LOCK: the caller stopped waiting */
	int finished;            /* LOCK: the thread made its last stat */
	size_t n;                /* IMMUTABLE */
	size_t done;             /* LOCK: verdicts [0, done) are made */
	char **keys;             /* IMMUTABLE */
	char **roots;            /* IMMUTABLE: the root each key lies in, "" if not known */
	signed char *hub;        /* IMMUTABLE: that root is NAS_HUB */
	uint64_t *sizes;         /* IMMUTABLE */
	int *verdict;            /* LOCK (below done): loaded_source's answer */
	char **why;              /* LOCK (below done): its reason, for a 1 */
};

static void job_put(struct load_job *j)
{
	int last;

	pthread_mutex_lock(&j->lock);
	last = --j->refs == 0;
	pthread_mutex_unlock(&j->lock);
	if (!last)
		return;
	for (size_t i = 0; i < j->n; i++) {
		if (j->keys)
			free(j->keys[i]);
		if (j->roots)
			free(j->roots[i]);
		if (j->why)
			free(j->why[i]);
	}
	free(j->keys);
	free(j->roots);
	free(j->hub);
	free(j->sizes);
	free(j->verdict);
	free(j->why);
	pthread_cond_destroy(&j->progress);
	pthread_mutex_destroy(&j->lock);
	free(j);
}

static void *load_job_thread(void *arg)
{
	struct load_job *j = arg;

	pthread_setname_np(pthread_self(), "wfs-srccheck");
	for (size_t i = 0; i < j->n; i++) {
		char why[192] = "";
		int r, stop;

		pthread_mutex_lock(&j->lock);
		stop = j->cancel;
		pthread_mutex_unlock(&j->lock);
		if (stop)
			break;
		r = loaded_source(j->roots[i], j->hub[i], j->keys[i], j->sizes[i], why,
				  sizeof(why));
		pthread_mutex_lock(&j->lock);
		j->verdict[i] = r;
		j->why[i] = r == 1 ? strdup(why) : NULL;
		j->done = i + 1;
		pthread_cond_broadcast(&j->progress);
		pthread_mutex_unlock(&j->lock);
		/* the NAS itself cannot answer: the rest would not either */
		if (r < 0 && nas_gate_unavailable(r))
			break;
	}
	pthread_mutex_lock(&j->lock);
	j->finished = 1;
	pthread_cond_broadcast(&j->progress);
	pthread_mutex_unlock(&j->lock);
	job_put(j);
	return NULL;
}

static struct load_job *job_new(struct store *s, struct blob *const *v, size_t n)
{
	char root[PATH_MAX];
	struct load_job *j = calloc(1, sizeof(*j));
	pthread_condattr_t ca;
	int ok;

	if (!j)
		return NULL;
	j->n = n;
	j->refs = 1;
	j->keys = calloc(n, sizeof(*j->keys));
	j->roots = calloc(n, sizeof(*j->roots));
	j->hub = calloc(n, 1);
	j->sizes = calloc(n, sizeof(*j->sizes));
	j->verdict = calloc(n, sizeof(*j->verdict));
	j->why = calloc(n, sizeof(*j->why));
	ok = j->keys && j->roots && j->hub && j->sizes && j->verdict && j->why;
	for (size_t i = 0; ok && i < n; i++) {
		j->hub[i] = (signed char)store_source_root(s, v[i]->key, root, sizeof(root));
		ok = (j->keys[i] = strdup(v[i]->key)) && (j->roots[i] = strdup(root));
		j->sizes[i] = atomic_load(&v[i]->size);
	}
	pthread_mutex_init(&j->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&j->progress, &ca);
	pthread_condattr_destroy(&ca);
	if (!ok) {
		job_put(j);
		return NULL;
	}
	return j;
}

/* Every verdict made (lock held): the thread may not have said so yet, and
 * a wait that ends in between must not take it for a stuck stat of the
 * key past the last. */
static int job_over(const struct load_job *j)
{
	return j->finished || j->done >= j->n;
}

/* Wait for the thread: each stat at most @timeout_ms, all of them at most
 * the budget.  Returns how many verdicts are made; *@stuck is 1 if a stat
 * passed its deadline, 2 if the budget ran out. */
static size_t job_wait(struct load_job *j, unsigned timeout_ms, int *stuck)
{
	int64_t budget_end = mono_ms() + STARTCHECK_BUDGET_MS;
	size_t done;

	*stuck = 0;
	pthread_mutex_lock(&j->lock);
	while (!job_over(j) && !*stuck) {
		size_t seen = j->done;
		int64_t end = mono_ms() + timeout_ms;
		struct timespec at = mono_timespec(end < budget_end ? end : budget_end);
		int rc = 0;

		while (!job_over(j) && j->done == seen && rc != ETIMEDOUT)
			rc = pthread_cond_timedwait(&j->progress, &j->lock, &at);
		if (rc == ETIMEDOUT && !job_over(j) && j->done == seen)
			*stuck = end < budget_end ? 1 : 2;
		else if (!job_over(j) && mono_ms() >= budget_end)
			*stuck = 2;
	}
	j->cancel = 1;
	done = j->done;
	pthread_mutex_unlock(&j->lock);
	return done;
}

/* Lock held: the record of @b (LOCAL, or unproven and to be re-hashed)
 * goes: its source is not the file copied. */
static void drop_loaded_locked(struct store *s, struct blob *b)
{
	if (b->reverify) {
		b->reverify = 0;
		space_release_locked(s, b);
		free(b->tmp);
		b->tmp = NULL;
	}
	blob_state_set_locked(s, b, BLOB_NAS);
	blob_xxh_set_locked(s, b, "");
	b->copy.ino = 0;
	b->checked = 0;
	store_dirty_locked(s);
}

/* The verdicts [0, @done) of @j, logged and told to the gate; *@drop[i]
 * set for a source gone or changed. */
static void job_report(struct store *s, struct load_job *j, size_t done, signed char *drop)
{
	size_t unmade = 0;

	for (size_t i = 0; i < done; i++) {
		int r = j->verdict[i];

		if (r == 1) {
			drop[i] = 1;
			store_log_msg(s, LOG_NOTICE, "start-up: dropped local copy of %s (%s)",
				      j->keys[i], j->why[i] ? j->why[i] : "source changed");
		} else if (r < 0) {
			/* proves nothing: kept, checked before it serves */
			if (unmade++ < LOAD_LOG_MAX)
				store_log_msg(s, LOG_WARNING, "start-up: cannot stat the source %s "
					      "of a local copy: %s; the copy is kept, its source "
					      "checked at its first open", j->keys[i],
					      nas_err_why(r));
			nas_gate_note(s->opt.gate, r); /* an unreachable NAS marks the gate down */
		}
	}
	if (unmade > LOAD_LOG_MAX)
		store_log_msg(s, LOG_WARNING, "start-up: %zu sources of local copies could not be "
			      "looked at in all; their copies are kept", unmade);
}

/* The stats of @n sources, on the job's thread.  Sets @drop[i] for a
 * source gone or changed. */
static void check_sources(struct store *s, struct blob *const *v, size_t n, signed char *drop)
{
	struct nas_gate *g = s->opt.gate;
	unsigned timeout_ms = g ? g->timeout_ms : NAS_GATE_TIMEOUT_MS;
	struct load_job *j = job_new(s, v, n);
	pthread_t t;
	size_t done;
	int stuck;

	if (!j) {
		store_log_msg(s, LOG_WARNING, "start-up: the sources of %zu local copies are not "
			      "looked at now (out of memory); they are checked at their first open", n);
		return;
	}
	j->refs = 2;
	if (thread_start(&t, NULL, load_job_thread, j) != 0) {
		j->refs = 1;
		job_put(j);
		store_log_msg(s, LOG_WARNING, "start-up: the sources of %zu local copies are not "
			      "looked at now (no thread); they are checked at their first open", n);
		return;
	}
	done = job_wait(j, timeout_ms, &stuck);
	/* A thread that finished is joined: it may not have returned yet, and
	 * fuse_daemonize() forks after us (a fork with a second thread alive
	 * copies only ours: the job's last reference is then never dropped in
	 * the daemon, and ThreadSanitizer kills it).  One stuck in a hung NAS
	 * is left to it. */
	if (stuck)
		pthread_detach(t);
	else
		pthread_join(t, NULL);
	job_report(s, j, done, drop);
	if (stuck == 1) {
		char why[PATH_MAX + 96];

		snprintf(why, sizeof(why), "start-up: a stat of %s took longer than %u ms",
			 j->keys[done], timeout_ms);
		nas_gate_set_down(g, why);
		store_log_msg(s, LOG_WARNING, "%s: the NAS is down; the sources of %zu local copies "
			      "are not looked at now; the copies serve, their sources are checked at "
			      "their first open", why, n - done);
	} else if (stuck == 2) {
		store_log_msg(s, LOG_NOTICE, "start-up: %zu of %zu sources of local copies looked at "
			      "in %d ms; the rest are checked at their first open and by the sweep",
			      done, n, STARTCHECK_BUDGET_MS);
	}
	job_put(j);
}

size_t verify_sources_loaded(struct store *s)
{
	struct nas_gate *g = s->opt.gate;
	struct blob **v;
	signed char *drop;
	size_t n = 0, cap, dropped = 0;

	pthread_mutex_lock(&s->lock);
	cap = s->blobs.count ? s->blobs.count : 1;
	v = malloc(cap * sizeof(*v));
	drop = calloc(cap, 1);
	if (v && drop)
		STORE_EACH(s, b)
			if ((b->state == BLOB_LOCAL || b->reverify) && n < cap)
				v[n++] = b;
	pthread_mutex_unlock(&s->lock);
	if (!v || !drop) {
		/* unchecked: every copy's source is checked before it serves */
		free(v);
		free(drop);
		return 0;
	}
	if (n && !nas_gate_up(g))
		store_log_msg(s, LOG_NOTICE, "start-up: the NAS is down: the sources of %zu local "
			      "copies are not looked at now; the copies serve, their sources are "
			      "checked once it is back", n);
	else if (n)
		check_sources(s, v, n, drop);
	pthread_mutex_lock(&s->lock);
	for (size_t i = 0; i < n; i++) {
		struct blob *b = v[i];

		/* (the others are unchecked: the sweep and the first open check them) */
		if (drop[i] && (b->state == BLOB_LOCAL || b->reverify)) {
			drop_loaded_locked(s, b);
			dropped++;
		}
	}
	pthread_mutex_unlock(&s->lock);
	free(v);
	free(drop);
	return dropped;
}
