/* store.c - blob table, the daemon's hooks, promotion queue and workers;
 * see store.h (and store_int.h for the locking rule).
 */
#include "store.h"
#include "store_int.h"
#include "hash.h"
#include "path.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <syslog.h>
#include <unistd.h>

const char *blob_state_name(enum blob_state st)
{
	switch (st) {
	case BLOB_NAS: return "nas";
	case BLOB_QUEUED: return "queued";
	case BLOB_COPYING: return "copying";
	case BLOB_VERIFYING: return "verifying";
	case BLOB_LOCAL: return "local";
	case BLOB_MISMATCH: return "mismatch";
	case BLOB_FAILED: return "failed";
	}
	return "?";
}

void store_log(struct store *s, int prio, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	if (!s->hooks.log)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	s->hooks.log(s->hooks.arg, prio, msg);
}

uint64_t store_now_ns(void)
{
	struct timespec ts;

	/* Coarse is enough for an LRU order and costs no syscall. */
	clock_gettime(CLOCK_REALTIME_COARSE, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- the table ---- */

struct blob *store_find_locked(struct store *s, const char *key)
{
	struct blob *b = s->buckets[path_hash(key) & (s->nbuckets - 1)];

	for (; b; b = b->hnext)
		if (!strcmp(b->key, key))
			return b;
	return NULL;
}

static void grow_locked(struct store *s)
{
	size_t nb = s->nbuckets * 2;
	struct blob **nbk = calloc(nb, sizeof(*nbk));

	if (!nbk)
		return; /* keep the longer chains */
	for (size_t i = 0; i < s->nbuckets; i++) {
		struct blob *b = s->buckets[i], *next;

		for (; b; b = next) {
			size_t h = path_hash(b->key) & (nb - 1);

			next = b->hnext;
			b->hnext = nbk[h];
			nbk[h] = b;
		}
	}
	free(s->buckets);
	s->buckets = nbk;
	s->nbuckets = nb;
}

struct blob *store_insert_locked(struct store *s, const char *key)
{
	struct blob *b = calloc(1, sizeof(*b));
	size_t h;

	if (!b || !(b->key = strdup(key))) {
		free(b);
		errno = ENOMEM;
		return NULL;
	}
	if (s->count + 1 > s->nbuckets)
		grow_locked(s);
	h = path_hash(key) & (s->nbuckets - 1);
	b->hnext = s->buckets[h];
	s->buckets[h] = b;
	s->count++;
	return b;
}

struct blob *store_find(struct store *s, const char *key)
{
	struct blob *b;

	pthread_mutex_lock(&s->lock);
	b = store_find_locked(s, key);
	pthread_mutex_unlock(&s->lock);
	return b;
}

int store_local_path(struct store *s, const struct blob *b, char *out, size_t sz)
{
	int n = snprintf(out, sz, "%s/%.2s/%s", s->data_dir, b->xxh, b->xxh);

	return n < 0 || (size_t)n >= sz ? -ENAMETOOLONG : 0;
}

/* Remove @b's local copy unless another local blob has the same bytes.
 * Returns 1 when the file was unlinked. */
static int drop_copy_locked(struct store *s, struct blob *b)
{
	char path[PATH_MAX + 64];

	for (size_t i = 0; i < s->nbuckets; i++)
		for (struct blob *o = s->buckets[i]; o; o = o->hnext)
			if (o != b && o->state == BLOB_LOCAL && !strcmp(o->xxh, b->xxh))
				return 0;
	return b->xxh[0] && store_local_path(s, b, path, sizeof(path)) == 0 && unlink(path) == 0;
}

void store_demote_locked(struct store *s, struct blob *b, const char *why, int invalidate)
{
	uint64_t ino = b->fs_ino;

	if (b->state != BLOB_LOCAL)
		return;
	b->state = BLOB_NAS;
	if (drop_copy_locked(s, b))
		space_unlinked_locked(s, b);
	b->xxh[0] = '\0';
	snprintf(b->reason, sizeof(b->reason), "%s", why);
	auto_reset_locked(s, b);
	if (!invalidate) {
		store_log(s, LOG_INFO, "evicted %s (%s): %s", b->key, b->id, why);
		return;
	}
	s->demoted++;
	store_log(s, LOG_WARNING, "demoted %s (%s): %s", b->key, b->id, why);
	if (s->hooks.changed && ino)
		s->hooks.changed(s->hooks.arg, ino);
}

/* The NAS shows @st for @b's source: new attributes mean a re-check
 * before the next local read (a new size, a demotion).  Returns 1 if they
 * were new. */
static int source_attrs_locked(struct store *s, struct blob *b, const struct stat *st)
{
	if (b->size == (uint64_t)st->st_size &&
	    b->nas_mtime.tv_sec == st->st_mtim.tv_sec &&
	    b->nas_mtime.tv_nsec == st->st_mtim.tv_nsec &&
	    b->nas_ctime.tv_sec == st->st_ctim.tv_sec &&
	    b->nas_ctime.tv_nsec == st->st_ctim.tv_nsec)
		return 0;
	if (b->size != (uint64_t)st->st_size)
		store_demote_locked(s, b, "source size changed", 1);
	__atomic_store_n(&b->size, (uint64_t)st->st_size, __ATOMIC_RELAXED);
	b->nas_mtime = st->st_mtim;
	b->nas_ctime = st->st_ctim;
	b->checked = 0;
	return 1;
}

void store_source_attrs(struct store *s, struct blob *b, const struct stat *st)
{
	int changed;

	pthread_mutex_lock(&s->lock);
	changed = source_attrs_locked(s, b, st);
	pthread_mutex_unlock(&s->lock);
	if (changed)
		store_write_index(s);
}

struct blob *store_blob(struct store *s, const char *key, const struct stat *st, const char *id)
{
	struct blob *b;
	int changed = 0;

	pthread_mutex_lock(&s->lock);
	b = store_find_locked(s, key);
	if (!b) {
		b = store_insert_locked(s, key);
		if (!b) {
			pthread_mutex_unlock(&s->lock);
			return NULL;
		}
		b->size = (uint64_t)st->st_size;
		b->nas_mtime = st->st_mtim;
		b->nas_ctime = st->st_ctim;
	} else {
		changed = source_attrs_locked(s, b, st);
	}
	if (id && *id && (!b->id[0] || (hub_id_kind(id) && !hub_id_kind(b->id))))
		snprintf(b->id, sizeof(b->id), "%s", id);
	pthread_mutex_unlock(&s->lock);
	if (changed)
		store_write_index(s);
	return b;
}

void blob_snapshot(struct store *s, const struct blob *b, struct blob *out)
{
	pthread_mutex_lock(&s->lock);
	memcpy(out, b, sizeof(*out));
	pthread_mutex_unlock(&s->lock);
	/* not owned by the copy */
	out->key = out->name = out->tmp = NULL;
	out->hnext = out->qnext = out->hot_next = NULL;
}

void store_each(struct store *s, void (*fn)(void *arg, const struct blob *b), void *arg)
{
	pthread_mutex_lock(&s->lock);
	for (size_t i = 0; i < s->nbuckets; i++)
		for (struct blob *b = s->buckets[i]; b; b = b->hnext)
			fn(arg, b);
	pthread_mutex_unlock(&s->lock);
}

/* ---- the daemon's hooks ---- */

static int is_snapshot_name(const char *rel)
{
	char dir[PATH_MAX];

	return hub_snapshot_blob_dir(rel, dir, sizeof(dir));
}

void store_note_open(struct store *s, struct blob *b, const char *rel)
{
	const struct policy_opts *pol = s->opt.policy;
	uint64_t now = store_now_ns();

	pthread_mutex_lock(&s->lock);
	b->open_count++;
	b->opens++;
	b->use_ns = now;
	b->last_used = (int64_t)(now / 1000000000u);
	/* Remember a name for the policy thread, a snapshot name rather than
	 * blobs/<id>: the exclusion globs and the shard rule look at those. */
	if (rel && *rel && (!b->name || (!is_snapshot_name(b->name) && is_snapshot_name(rel)))) {
		char *n = strdup(rel);

		if (n) {
			free(b->name);
			b->name = n;
		}
	}
	if (b->state != BLOB_LOCAL) {
		uint64_t opens = ++b->nas_opens;

		if (pol && pol->auto_on && !b->hot &&
		    policy_is_hot(pol, b->size, b->nas_bytes - b->hot_bytes, opens - b->hot_opens))
			auto_hot_locked(s, b);
	}
	pthread_mutex_unlock(&s->lock);
}

void store_note_read(struct store *s, struct blob *b, uint64_t bytes, int local)
{
	const struct policy_opts *pol = s->opt.policy;
	uint64_t n, size, base;

	if (local) {
		b->local_bytes += bytes;
		atomic_store_explicit(&b->use_ns, store_now_ns(), memory_order_relaxed);
		return;
	}
	n = atomic_fetch_add(&b->nas_bytes, bytes) + bytes;
	if (!pol || !pol->auto_on || atomic_load_explicit(&b->hot, memory_order_relaxed))
		return;
	/* A first look without the lock: most reads are far from the mark. */
	size = __atomic_load_n(&b->size, __ATOMIC_RELAXED);
	base = __atomic_load_n(&b->hot_bytes, __ATOMIC_RELAXED);
	if (!policy_is_hot(pol, size, n - base, 0))
		return;
	pthread_mutex_lock(&s->lock);
	if (!b->hot && policy_is_hot(pol, b->size, b->nas_bytes - b->hot_bytes,
				     b->nas_opens - b->hot_opens))
		auto_hot_locked(s, b);
	pthread_mutex_unlock(&s->lock);
}

void store_note_close(struct store *s, struct blob *b)
{
	pthread_mutex_lock(&s->lock);
	if (b->open_count > 0 && --b->open_count == 0)
		space_closed_locked(s, b);
	pthread_mutex_unlock(&s->lock);
}

/* ---- the queue ---- */

void store_unqueue_locked(struct store *s, struct blob *b)
{
	struct blob **pp = &s->qhead, *prev = NULL;

	if (!b->in_queue)
		return;
	while (*pp && *pp != b) {
		prev = *pp;
		pp = &(*pp)->qnext;
	}
	if (*pp) {
		*pp = b->qnext;
		if (s->qtail == b)
			s->qtail = prev;
	}
	b->qnext = NULL;
	b->in_queue = 0;
}

static void enqueue_locked(struct store *s, struct blob *b)
{
	store_unqueue_locked(s, b);
	if (b->explicit_req) {
		/* Before the first automatic request. */
		struct blob **pp = &s->qhead;

		while (*pp && (*pp)->explicit_req)
			pp = &(*pp)->qnext;
		b->qnext = *pp;
		*pp = b;
		if (!b->qnext)
			s->qtail = b;
	} else {
		b->qnext = NULL;
		if (s->qtail)
			s->qtail->qnext = b;
		else
			s->qhead = b;
		s->qtail = b;
	}
	b->in_queue = 1;
	pthread_cond_broadcast(&s->cond);
}

int store_promote(struct store *s, struct blob *b, int pin, int explicit_req)
{
	pthread_mutex_lock(&s->lock);
	if (pin)
		b->pinned = 1;
	if (b->state == BLOB_NAS || b->state == BLOB_FAILED) {
		b->state = BLOB_QUEUED;
		b->reason[0] = '\0';
		b->hold = HOLD_NONE;
		b->explicit_req = explicit_req;
		b->prog.bytes_done = 0;
		b->prog.cancel = 0;
		b->want_ns = store_now_ns();
		if (!explicit_req)
			s->auto_queued++;
		enqueue_locked(s, b);
	} else if (b->state == BLOB_QUEUED && explicit_req && !b->explicit_req) {
		b->explicit_req = 1; /* asked for now: ahead of the automatic ones */
		b->want_ns = store_now_ns();
		enqueue_locked(s, b);
	}
	pthread_mutex_unlock(&s->lock);
	if (pin)
		store_write_index(s);
	return 0;
}

/* The next copy to make: explicit requests first; an automatic one only
 * while fewer than auto_max automatic copies run, so one worker is always
 * free for what an operator asks. */
static struct blob *dequeue_locked(struct store *s)
{
	struct blob *b;

	while ((b = s->qhead) && b->state != BLOB_QUEUED) {
		s->qhead = b->qnext; /* cancelled while queued */
		b->qnext = NULL;
		b->in_queue = 0;
	}
	if (!b) {
		s->qtail = NULL;
		return NULL;
	}
	if (!b->explicit_req && s->auto_running >= s->auto_max)
		return NULL;
	s->qhead = b->qnext;
	if (!s->qhead)
		s->qtail = NULL;
	b->qnext = NULL;
	b->in_queue = 0;
	return b;
}

static int publish(struct store *s, const char *tmp, const char *xxh)
{
	char dir[PATH_MAX + 16], dst[PATH_MAX + 64];
	int fd;

	snprintf(dir, sizeof(dir), "%s/%.2s", s->data_dir, xxh);
	if (mkdir(dir, 0755) < 0 && errno != EEXIST)
		return -errno;
	snprintf(dst, sizeof(dst), "%s/%s", dir, xxh);
	if (access(dst, F_OK) == 0) {
		/* The same bytes are already here (equal full hashes). */
		unlink(tmp);
		return 0;
	}
	if (rename(tmp, dst) < 0)
		return -errno;
	/* The rename must survive a crash before the index names the copy. */
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0) {
		fsync(fd);
		close(fd);
	}
	return 0;
}

/* Bytes/s this copy may read: a cap is shared by every copy that may run
 * at once under it. */
static uint64_t copy_rate(struct store *s, int auto_copy)
{
	const struct policy_opts *pol = s->opt.policy;
	uint64_t total = s->opt.bw_limit;

	if (!auto_copy)
		return policy_share(total, s->opt.workers);
	if (pol && pol->auto_bw && (!total || pol->auto_bw < total))
		total = pol->auto_bw;
	return policy_share(total, s->auto_max);
}

static void copy_done_locked(struct store *s, struct blob *b, int r, uint64_t size,
			     const struct fetch_result *res, const char *key, const char *id)
{
	if (r == 0 && b->size == size) {
		b->state = BLOB_LOCAL;
		snprintf(b->xxh, sizeof(b->xxh), "%s", res->xxh);
		snprintf(b->sample, sizeof(b->sample), "%s", res->sample);
		b->checked = 1;
		b->reason[0] = '\0';
		b->hold = HOLD_NONE;
		b->last_used = (int64_t)time(NULL);
		b->use_ns = store_now_ns();
		s->promoted++;
		store_log(s, LOG_INFO, "verified %s (%s): local copy %s", key, id, res->xxh);
		return;
	}
	auto_reset_locked(s, b);
	if (r == -ECANCELED) {
		b->state = BLOB_NAS;
		snprintf(b->reason, sizeof(b->reason), "copy cancelled");
		s->cancelled++;
		store_log(s, LOG_INFO, "promotion of %s cancelled", key);
	} else if (r == -EBADMSG) {
		b->state = BLOB_MISMATCH;
		snprintf(b->reason, sizeof(b->reason), "%s", res->reason);
		s->mismatches++;
		store_log(s, LOG_ERR, "MISMATCH %s: %s; not promoted, served from the NAS", key,
			  res->reason);
	} else if (r == -ENOSPC || r == -EDQUOT) {
		/* Someone else filled the disk under us: not the blob's fault. */
		b->state = BLOB_NAS;
		b->hold = HOLD_NO_ROOM;
		snprintf(b->reason, sizeof(b->reason), "no room: %s",
			 res->reason[0] ? res->reason : strerror(-r));
		s->failed_by[STORE_FAIL_NO_SPACE]++;
		s->no_room++;
		store_log(s, LOG_WARNING, "promotion of %s stopped: %s; served from the NAS", key,
			  b->reason);
	} else {
		b->state = BLOB_FAILED;
		if (r == 0)
			snprintf(b->reason, sizeof(b->reason), "source size changed during copy");
		else
			snprintf(b->reason, sizeof(b->reason), "%s",
				 res->reason[0] ? res->reason : strerror(-r));
		s->failed++;
		s->failed_by[r == 0 || r == -ESTALE ? STORE_FAIL_SOURCE_CHANGED :
			     r == -EIO ? STORE_FAIL_IO : STORE_FAIL_OTHER]++;
		store_log(s, LOG_WARNING, "promotion of %s failed: %s", key, b->reason);
	}
}

/* Called and returns with the lock held. */
static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void copy_one(struct store *s, struct blob *b)
{
	char key[PATH_MAX], id[NAME_MAX + 1], tmp[PATH_MAX + 64], why[256];
	int auto_copy = !b->explicit_req, evicted = 0, r;
	struct fetch_result res;
	uint64_t size, rate;

	snprintf(key, sizeof(key), "%s", b->key);
	snprintf(id, sizeof(id), "%s", b->id);
	size = b->size;
	if (space_reserve_locked(s, b, why, sizeof(why), &evicted) < 0) {
		b->state = BLOB_NAS;
		b->hold = HOLD_NO_ROOM;
		snprintf(b->reason, sizeof(b->reason), "%s", why);
		s->no_room++;
		auto_reset_locked(s, b); /* hot again later: tried again then */
		store_log(s, LOG_NOTICE, "not promoting %s (%s): %s; served from the NAS", key,
			  id, why);
		pthread_mutex_unlock(&s->lock);
		if (evicted)
			store_write_index(s);
		pthread_mutex_lock(&s->lock);
		return;
	}
	snprintf(tmp, sizeof(tmp), "%s/%llu.%d.part", s->tmp_dir,
		 (unsigned long long)++s->tmp_serial, (int)getpid());
	b->tmp = strdup(tmp);
	b->state = BLOB_COPYING;
	s->auto_running += auto_copy;
	s->started++;
	rate = copy_rate(s, auto_copy);
	pthread_mutex_unlock(&s->lock);

	if (evicted)
		store_write_index(s);
	memset(&res, 0, sizeof(res));
	store_log(s, LOG_INFO, "promoting %s (%s, %llu bytes%s)", key, id,
		  (unsigned long long)size, auto_copy ? ", automatic" : "");
	r = fetch_copy_verify(key, size, tmp, id, rate, &b->prog, &res);
	if (r == 0)
		r = publish(s, tmp, res.xxh);
	if (r < 0)
		unlink(tmp);

	pthread_mutex_lock(&s->lock);
	space_release_locked(s, b);
	free(b->tmp);
	b->tmp = NULL;
	s->auto_running -= auto_copy;
	copy_done_locked(s, b, r, size, &res, key, id);
	pthread_cond_broadcast(&s->cond); /* an automatic slot may be free */
	/* With more queued, write the index at most once a second: a copy not
	 * yet named by it is only an orphan after a crash (removed at start-up,
	 * copied again), never served unverified. */
	if (s->qhead && now_ms() - s->index_written_ms < 1000) {
		s->index_dirty = 1;
		return;
	}
	s->index_dirty = 0;
	s->index_written_ms = now_ms();
	pthread_mutex_unlock(&s->lock);
	store_write_index(s);
	pthread_mutex_lock(&s->lock);
}

static void *worker(void *arg)
{
	struct store *s = arg;

	pthread_mutex_lock(&s->lock);
	while (!s->stop) {
		struct blob *b = dequeue_locked(s);

		if (!b) {
			if (s->index_dirty) { /* the queue drained: record it now */
				s->index_dirty = 0;
				s->index_written_ms = now_ms();
				pthread_mutex_unlock(&s->lock);
				store_write_index(s);
				pthread_mutex_lock(&s->lock);
				continue;
			}
			pthread_cond_wait(&s->cond, &s->lock);
			continue;
		}
		copy_one(s, b);
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

/* ---- evict, pin, verify, exclude ---- */

int store_evict(struct store *s, struct blob *b, int force)
{
	int r = 0;

	pthread_mutex_lock(&s->lock);
	if (b->pinned && !force) {
		r = -EBUSY;
	} else if (b->state == BLOB_LOCAL) {
		b->pinned = 0;
		/* The bytes are the same on the NAS: nothing for the kernel to
		 * forget; a reader with the copy open keeps reading it. */
		store_demote_locked(s, b, "evicted", 0);
		b->reason[0] = '\0';
		s->evicted++;
		r = 1;
	} else if (b->state == BLOB_QUEUED || b->state == BLOB_COPYING) {
		b->prog.cancel = 1; /* the worker removes its temporary file */
		if (b->state == BLOB_QUEUED) {
			b->state = BLOB_NAS;
			store_unqueue_locked(s, b);
			auto_reset_locked(s, b);
		}
		r = 1;
	}
	pthread_mutex_unlock(&s->lock);
	if (r == 1)
		store_write_index(s);
	return r;
}

int store_pin(struct store *s, struct blob *b, int pin)
{
	pthread_mutex_lock(&s->lock);
	b->pinned = pin;
	pthread_mutex_unlock(&s->lock);
	return store_write_index(s);
}

void store_exclude(struct store *s, struct blob *b, const char *why)
{
	pthread_mutex_lock(&s->lock);
	if (b->state == BLOB_NAS || b->state == BLOB_FAILED) {
		b->hold = HOLD_EXCLUDED;
		snprintf(b->reason, sizeof(b->reason), "%s", why);
		s->excluded++;
	}
	pthread_mutex_unlock(&s->lock);
}

/* ---- life cycle ---- */

int store_open(struct store *s, const char *dir, const struct store_opts *opt,
	       const struct store_hooks *hooks)
{
	struct statvfs sv;

	memset(s, 0, sizeof(*s));
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->cond, NULL);
	pthread_cond_init(&s->auto_cond, NULL);
	pthread_mutex_init(&s->index_lock, NULL);
	if (hooks)
		s->hooks = *hooks;
	s->opt = *opt;
	if (!s->opt.workers)
		s->opt.workers = 1;
	/* One worker stays free for explicit requests when there are two. */
	s->auto_max = s->opt.workers > 1 ? s->opt.workers - 1 : 1;
	snprintf(s->dir, sizeof(s->dir), "%s", dir);
	snprintf(s->data_dir, sizeof(s->data_dir), "%s/data", dir);
	snprintf(s->tmp_dir, sizeof(s->tmp_dir), "%s/tmp", dir);
	snprintf(s->index_path, sizeof(s->index_path), "%s/index.json", dir);
	s->blk = statvfs(dir, &sv) == 0 && sv.f_frsize ? (uint64_t)sv.f_frsize : 4096;
	s->nbuckets = 1024;
	s->buckets = calloc(s->nbuckets, sizeof(*s->buckets));
	if (!s->buckets)
		return -ENOMEM;
	if ((mkdir(s->data_dir, 0755) < 0 && errno != EEXIST) ||
	    (mkdir(s->tmp_dir, 0700) < 0 && errno != EEXIST))
		return -errno;
	store_empty_tmp(s);
	return index_load(s);
}

int store_start(struct store *s)
{
	int r;

	s->threads = calloc(s->opt.workers + 2, sizeof(*s->threads));
	if (!s->threads)
		return -ENOMEM;
	if (pthread_create(&s->threads[s->nthreads], NULL, store_recheck_sweep, s) == 0)
		s->nthreads++;
	for (unsigned i = 0; i < s->opt.workers; i++) {
		r = pthread_create(&s->threads[s->nthreads], NULL, worker, s);
		if (r)
			return -r;
		s->nthreads++;
	}
	r = auto_start(s, &s->threads[s->nthreads]);
	if (r < 0)
		return r;
	s->nthreads += r;
	return 0;
}

void store_close(struct store *s)
{
	pthread_mutex_lock(&s->lock);
	s->stop = 1;
	for (size_t i = 0; i < s->nbuckets; i++)
		for (struct blob *b = s->buckets[i]; b; b = b->hnext)
			if (b->state == BLOB_COPYING || b->state == BLOB_VERIFYING)
				b->prog.cancel = 1;
	pthread_cond_broadcast(&s->cond);
	pthread_cond_broadcast(&s->auto_cond);
	pthread_mutex_unlock(&s->lock);
	for (unsigned i = 0; i < s->nthreads; i++)
		pthread_join(s->threads[i], NULL);
	free(s->threads);
	s->threads = NULL;
	s->nthreads = 0;
	/* Whatever was queued or cancelled is simply on the NAS next time. */
	for (size_t i = 0; s->buckets && i < s->nbuckets; i++)
		for (struct blob *b = s->buckets[i]; b; b = b->hnext)
			if (b->state == BLOB_QUEUED || b->state == BLOB_COPYING ||
			    b->state == BLOB_VERIFYING)
				b->state = BLOB_NAS;
	if (s->buckets)
		store_write_index(s);
	for (size_t i = 0; s->buckets && i < s->nbuckets; i++) {
		struct blob *b = s->buckets[i], *next;

		for (; b; b = next) {
			next = b->hnext;
			free(b->key);
			free(b->name);
			free(b->tmp);
			free(b);
		}
	}
	free(s->buckets);
	s->buckets = NULL;
	free(s->refs);
	s->refs = NULL;
	pthread_mutex_destroy(&s->index_lock);
	pthread_cond_destroy(&s->auto_cond);
	pthread_cond_destroy(&s->cond);
	pthread_mutex_destroy(&s->lock);
}
