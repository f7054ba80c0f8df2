/* store.c - blob table, promotion queue and workers; see store.h.
 *
 * Locking: s->lock guards the table, the queue and every blob's state
 * fields.  Copies, hashing and NAS reads run without it.
 */
#include "store.h"
#include "hash.h"
#include "index.h"
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

static void slog(struct store *s, int prio, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void slog(struct store *s, int prio, const char *fmt, ...)
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

static uint64_t hash_str(const char *p)
{
	uint64_t h = 1469598103934665603ull;

	for (; *p; p++)
		h = (h ^ (unsigned char)*p) * 1099511628211ull;
	return h;
}

static int64_t now_s(void)
{
	return (int64_t)time(NULL);
}

/* ---- the table ---- */

static struct blob *find_locked(struct store *s, const char *key)
{
	struct blob *b = s->buckets[hash_str(key) & (s->nbuckets - 1)];

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
			size_t h = hash_str(b->key) & (nb - 1);

			next = b->hnext;
			b->hnext = nbk[h];
			nbk[h] = b;
		}
	}
	free(s->buckets);
	s->buckets = nbk;
	s->nbuckets = nb;
}

static struct blob *insert_locked(struct store *s, const char *key)
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
	h = hash_str(key) & (s->nbuckets - 1);
	b->hnext = s->buckets[h];
	s->buckets[h] = b;
	s->count++;
	return b;
}

struct blob *store_find(struct store *s, const char *key)
{
	struct blob *b;

	pthread_mutex_lock(&s->lock);
	b = find_locked(s, key);
	pthread_mutex_unlock(&s->lock);
	return b;
}

int store_local_path(struct store *s, const struct blob *b, char *out, size_t sz)
{
	int n = snprintf(out, sz, "%s/%.2s/%s", s->data_dir, b->xxh, b->xxh);

	return n < 0 || (size_t)n >= sz ? -ENAMETOOLONG : 0;
}

/* Remove @b's local copy unless another local blob has the same bytes. */
static void drop_copy_locked(struct store *s, struct blob *b)
{
	char path[PATH_MAX + 64];

	for (size_t i = 0; i < s->nbuckets; i++)
		for (struct blob *o = s->buckets[i]; o; o = o->hnext)
			if (o != b && o->state == BLOB_LOCAL && !strcmp(o->xxh, b->xxh))
				return;
	if (b->xxh[0] && store_local_path(s, b, path, sizeof(path)) == 0)
		unlink(path);
}

/* A LOCAL blob goes back to the NAS. */
static void demote_locked(struct store *s, struct blob *b, const char *why)
{
	uint64_t ino = b->fs_ino;

	if (b->state != BLOB_LOCAL)
		return;
	b->state = BLOB_NAS;
	drop_copy_locked(s, b);
	b->xxh[0] = '\0';
	snprintf(b->reason, sizeof(b->reason), "%s", why);
	s->demoted++;
	slog(s, LOG_WARNING, "demoted %s (%s): %s", b->key, b->id, why);
	if (s->hooks.changed && ino)
		s->hooks.changed(s->hooks.arg, ino);
}

static int sample_source(const char *key, uint64_t size, char out[33])
{
	int fd = open(key, O_RDONLY | O_CLOEXEC | O_NOFOLLOW), r;

	if (fd < 0)
		return -errno;
	r = source_sample(fd, size, out);
	close(fd);
	return r;
}

int store_check_source(struct store *s, struct blob *b)
{
	char sample[33], key[PATH_MAX];
	uint64_t size;
	int r;

	pthread_mutex_lock(&s->lock);
	if (b->state != BLOB_LOCAL || b->checked) {
		r = b->state == BLOB_LOCAL;
		pthread_mutex_unlock(&s->lock);
		return r;
	}
	snprintf(key, sizeof(key), "%s", b->key);
	size = b->size;
	pthread_mutex_unlock(&s->lock);

	r = sample_source(key, size, sample);
	pthread_mutex_lock(&s->lock);
	if (b->state == BLOB_LOCAL) {
		if (r < 0) {
			char why[128];

			snprintf(why, sizeof(why), "source unreadable: %s", strerror(-r));
			demote_locked(s, b, why);
		} else if (strcmp(sample, b->sample)) {
			demote_locked(s, b, "source changed (sampled hash differs)");
		} else {
			b->checked = 1;
		}
	}
	r = b->state == BLOB_LOCAL;
	pthread_mutex_unlock(&s->lock);
	if (!r)
		store_write_index(s);
	return r;
}

struct blob *store_blob(struct store *s, const char *key, const struct stat *st, const char *id)
{
	struct blob *b;
	int changed = 0;

	pthread_mutex_lock(&s->lock);
	b = find_locked(s, key);
	if (!b) {
		b = insert_locked(s, key);
		if (!b) {
			pthread_mutex_unlock(&s->lock);
			return NULL;
		}
		b->size = (uint64_t)st->st_size;
		b->nas_mtime = st->st_mtim;
		b->nas_ctime = st->st_ctim;
	} else if (b->size != (uint64_t)st->st_size ||
		   b->nas_mtime.tv_sec != st->st_mtim.tv_sec ||
		   b->nas_mtime.tv_nsec != st->st_mtim.tv_nsec ||
		   b->nas_ctime.tv_sec != st->st_ctim.tv_sec ||
		   b->nas_ctime.tv_nsec != st->st_ctim.tv_nsec) {
		/* The NAS shows new attributes: re-check before serving locally. */
		if (b->size != (uint64_t)st->st_size)
			demote_locked(s, b, "source size changed");
		b->size = (uint64_t)st->st_size;
		b->nas_mtime = st->st_mtim;
		b->nas_ctime = st->st_ctim;
		b->checked = 0;
		changed = 1;
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
	out->key = NULL; /* not owned by the copy */
}

void store_each(struct store *s, void (*fn)(void *arg, const struct blob *b), void *arg)
{
	pthread_mutex_lock(&s->lock);
	for (size_t i = 0; i < s->nbuckets; i++)
		for (struct blob *b = s->buckets[i]; b; b = b->hnext)
			fn(arg, b);
	pthread_mutex_unlock(&s->lock);
}

/* ---- the queue ---- */

int store_promote(struct store *s, struct blob *b, int pin, int explicit_req)
{
	pthread_mutex_lock(&s->lock);
	if (pin)
		b->pinned = 1;
	if (b->state == BLOB_NAS || b->state == BLOB_FAILED) {
		b->state = BLOB_QUEUED;
		b->reason[0] = '\0';
		b->explicit_req = explicit_req;
		b->prog.bytes_done = 0;
		b->prog.cancel = 0;
		b->qnext = NULL;
		if (explicit_req) {
			/* Before the first automatic request. */
			struct blob **pp = &s->qhead;

			while (*pp && (*pp)->explicit_req)
				pp = &(*pp)->qnext;
			b->qnext = *pp;
			*pp = b;
			if (!b->qnext)
				s->qtail = b;
		} else {
			if (s->qtail)
				s->qtail->qnext = b;
			else
				s->qhead = b;
			s->qtail = b;
		}
		pthread_cond_broadcast(&s->cond);
	}
	pthread_mutex_unlock(&s->lock);
	if (pin)
		store_write_index(s);
	return 0;
}

static struct blob *dequeue_locked(struct store *s)
{
	struct blob *b = s->qhead;

	if (b) {
		s->qhead = b->qnext;
		if (!s->qhead)
			s->qtail = NULL;
		b->qnext = NULL;
	}
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

static void copy_one(struct store *s, struct blob *b)
{
	char key[PATH_MAX], id[NAME_MAX + 1], tmp[PATH_MAX + 64];
	struct fetch_result res;
	struct statvfs sv;
	uint64_t size;
	int r;

	snprintf(key, sizeof(key), "%s", b->key);
	snprintf(id, sizeof(id), "%s", b->id);
	size = b->size;
	snprintf(tmp, sizeof(tmp), "%s/%llu.%d.part", s->tmp_dir,
		 (unsigned long long)++s->tmp_serial, (int)getpid());
	b->state = BLOB_COPYING;
	pthread_mutex_unlock(&s->lock);

	memset(&res, 0, sizeof(res));
	if (statvfs(s->dir, &sv) == 0 && (uint64_t)sv.f_bavail * sv.f_frsize < size + (1u << 20)) {
		r = -ENOSPC;
		snprintf(res.reason, sizeof(res.reason), "not enough space in %s: %llu bytes free, "
			 "%llu needed", s->dir, (unsigned long long)sv.f_bavail * sv.f_frsize,
			 (unsigned long long)size);
	} else {
		slog(s, LOG_INFO, "promoting %s (%s, %llu bytes)", key, id,
		     (unsigned long long)size);
		r = fetch_copy_verify(key, size, tmp, id, s->opt.bw_limit, &b->prog, &res);
	}
	if (r == 0)
		r = publish(s, tmp, res.xxh);
	if (r < 0)
		unlink(tmp);

	pthread_mutex_lock(&s->lock);
	if (r == 0 && b->size == size) {
		b->state = BLOB_LOCAL;
		snprintf(b->xxh, sizeof(b->xxh), "%s", res.xxh);
		snprintf(b->sample, sizeof(b->sample), "%s", res.sample);
		b->checked = 1;
		b->reason[0] = '\0';
		b->last_used = now_s();
		s->promoted++;
		slog(s, LOG_INFO, "verified %s (%s): local copy %s", key, id, res.xxh);
	} else if (r == -ECANCELED) {
		b->state = BLOB_NAS;
		snprintf(b->reason, sizeof(b->reason), "copy cancelled");
		slog(s, LOG_INFO, "promotion of %s cancelled", key);
	} else if (r == -EBADMSG) {
		b->state = BLOB_MISMATCH;
		snprintf(b->reason, sizeof(b->reason), "%s", res.reason);
		s->mismatches++;
		slog(s, LOG_ERR, "MISMATCH %s: %s; not promoted, served from the NAS", key,
		     res.reason);
	} else {
		b->state = BLOB_FAILED;
		if (r == 0)
			snprintf(b->reason, sizeof(b->reason), "source size changed during copy");
		else
			snprintf(b->reason, sizeof(b->reason), "%s",
				 res.reason[0] ? res.reason : strerror(-r));
		s->failed++;
		slog(s, LOG_WARNING, "promotion of %s failed: %s", key, b->reason);
	}
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
			pthread_cond_wait(&s->cond, &s->lock);
			continue;
		}
		if (b->state != BLOB_QUEUED)
			continue;
		copy_one(s, b);
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

/* ---- evict, pin, verify ---- */

int store_evict(struct store *s, struct blob *b, int force)
{
	int r = 0;

	pthread_mutex_lock(&s->lock);
	if (b->pinned && !force) {
		r = -EBUSY;
	} else if (b->state == BLOB_LOCAL) {
		b->pinned = 0;
		demote_locked(s, b, "evicted");
		b->reason[0] = '\0';
		s->evicted++;
		r = 1;
	} else if (b->state == BLOB_QUEUED || b->state == BLOB_COPYING) {
		b->prog.cancel = 1; /* the worker removes its temporary file */
		if (b->state == BLOB_QUEUED)
			b->state = BLOB_NAS;
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

int store_verify(struct store *s, struct blob *b, int full, char *reason, size_t rsz)
{
	char key[PATH_MAX], local[PATH_MAX + 64], xxh[33], want[33];
	int r, demoted = 0;

	pthread_mutex_lock(&s->lock);
	if (b->state != BLOB_LOCAL) {
		pthread_mutex_unlock(&s->lock);
		return 0;
	}
	b->checked = 0;
	snprintf(key, sizeof(key), "%s", b->key);
	snprintf(want, sizeof(want), "%s", b->xxh);
	store_local_path(s, b, local, sizeof(local));
	pthread_mutex_unlock(&s->lock);

	if (!store_check_source(s, b)) {
		snprintf(reason, rsz, "%s", b->reason);
		return 1;
	}
	if (!full)
		return 0;
	r = fetch_hash_file(local, xxh, NULL);
	pthread_mutex_lock(&s->lock);
	if (b->state == BLOB_LOCAL && (r < 0 || strcmp(xxh, want))) {
		if (r < 0)
			snprintf(reason, rsz, "local copy unreadable: %s", strerror(-r));
		else
			snprintf(reason, rsz, "local copy corrupt: xxh128 %s, expected %s", xxh, want);
		demote_locked(s, b, reason);
		demoted = 1;
	}
	pthread_mutex_unlock(&s->lock);
	if (demoted)
		store_write_index(s);
	return demoted;
}

void store_usage(struct store *s, struct store_usage *u)
{
	struct statvfs sv;

	memset(u, 0, sizeof(*u));
	pthread_mutex_lock(&s->lock);
	for (size_t i = 0; i < s->nbuckets; i++)
		for (struct blob *b = s->buckets[i]; b; b = b->hnext) {
			if (b->state == BLOB_LOCAL) {
				u->blobs++;
				u->bytes += b->size;
			} else if (b->state == BLOB_QUEUED) {
				u->queued++;
			} else if (b->state == BLOB_COPYING || b->state == BLOB_VERIFYING) {
				u->copying++;
			}
		}
	pthread_mutex_unlock(&s->lock);
	if (statvfs(s->dir, &sv) == 0)
		u->free_bytes = (uint64_t)sv.f_bavail * sv.f_frsize;
}

/* ---- the index ---- */

static int load_rec(void *arg, const struct index_rec *r)
{
	struct store *s = arg;
	char local[PATH_MAX + 64];
	struct stat lst, nst;
	struct blob *b;
	int local_ok;

	b = insert_locked(s, r->key);
	if (!b)
		return -ENOMEM;
	snprintf(b->id, sizeof(b->id), "%s", r->id);
	b->size = r->size;
	b->nas_mtime = r->mtime;
	b->nas_ctime = r->ctime;
	b->pinned = r->pinned;
	b->last_used = r->last_used;
	if (!strcmp(r->state, "mismatch")) {
		b->state = BLOB_MISMATCH;
		snprintf(b->reason, sizeof(b->reason), "%s", r->reason);
		return 0;
	}
	if (strcmp(r->state, "local"))
		return 0;
	snprintf(b->xxh, sizeof(b->xxh), "%s", r->xxh);
	snprintf(b->sample, sizeof(b->sample), "%s", r->sample);
	store_local_path(s, b, local, sizeof(local));
	/* The quick check: both sides still have the recorded size.  The
	 * source's sampled hash is compared before the first local read. */
	local_ok = strlen(r->xxh) == 32 && stat(local, &lst) == 0 && S_ISREG(lst.st_mode) &&
		   (uint64_t)lst.st_size == r->size;
	if (local_ok && stat(r->key, &nst) == 0 && (uint64_t)nst.st_size == r->size) {
		b->state = BLOB_LOCAL;
	} else {
		slog(s, LOG_NOTICE, "start-up: dropped local copy of %s (%s)", r->key,
		     local_ok ? "source changed size or vanished" : "local copy missing or wrong size");
		b->xxh[0] = '\0';
	}
	return 0;
}

/* Local files no index entry names are leftovers: remove them. */
static void drop_orphans(struct store *s)
{
	DIR *top = opendir(s->data_dir);
	struct dirent *de;

	if (!top)
		return;
	while ((de = readdir(top))) {
		char sub[PATH_MAX + 300];
		struct dirent *fe;
		DIR *d;

		if (de->d_name[0] == '.')
			continue;
		snprintf(sub, sizeof(sub), "%s/%s", s->data_dir, de->d_name);
		d = opendir(sub);
		if (!d)
			continue;
		while ((fe = readdir(d))) {
			int used = 0;

			if (fe->d_name[0] == '.')
				continue;
			for (size_t i = 0; i < s->nbuckets && !used; i++)
				for (struct blob *b = s->buckets[i]; b && !used; b = b->hnext)
					used = b->state == BLOB_LOCAL && !strcmp(b->xxh, fe->d_name);
			if (!used && unlinkat(dirfd(d), fe->d_name, 0) == 0)
				slog(s, LOG_NOTICE, "start-up: removed unreferenced copy %s/%s", sub,
				     fe->d_name);
		}
		closedir(d);
	}
	closedir(top);
}

static int index_load(struct store *s)
{
	int r;

	pthread_mutex_lock(&s->lock);
	r = index_read(s->index_path, load_rec, s);
	if (r == -EINVAL)
		slog(s, LOG_ERR, "index %s unreadable: starting empty", s->index_path);
	drop_orphans(s);
	pthread_mutex_unlock(&s->lock);
	return r == -EINVAL ? 0 : r;
}

int store_write_index(struct store *s)
{
	struct index_rec *recs;
	struct rec_strings {
		char *key;
		char id[NAME_MAX + 1], xxh[33], sample[33], reason[256];
	} *str;
	size_t n = 0, cap;
	int r;

	pthread_mutex_lock(&s->index_lock);
	pthread_mutex_lock(&s->lock);
	cap = s->count ? s->count : 1;
	recs = calloc(cap, sizeof(*recs));
	str = calloc(cap, sizeof(*str));
	if (!recs || !str) {
		free(recs);
		free(str);
		pthread_mutex_unlock(&s->lock);
		pthread_mutex_unlock(&s->index_lock);
		return -ENOMEM;
	}
	for (size_t i = 0; i < s->nbuckets; i++)
		for (struct blob *b = s->buckets[i]; b; b = b->hnext) {
			const char *state = b->state == BLOB_LOCAL ? "local" :
					    b->state == BLOB_MISMATCH ? "mismatch" : "nas";

			if (!strcmp(state, "nas") && !b->pinned)
				continue;
			/* Copies: the fields change under other threads once we
			 * let go of the lock. */
			str[n].key = strdup(b->key);
			memcpy(str[n].id, b->id, sizeof(str[n].id));
			memcpy(str[n].xxh, b->xxh, sizeof(str[n].xxh));
			memcpy(str[n].sample, b->sample, sizeof(str[n].sample));
			memcpy(str[n].reason, b->reason, sizeof(str[n].reason));
			if (!str[n].key)
				continue;
			recs[n] = (struct index_rec){
				.key = str[n].key, .id = str[n].id, .state = state,
				.xxh = str[n].xxh, .sample = str[n].sample, .reason = str[n].reason,
				.size = b->size, .mtime = b->nas_mtime, .ctime = b->nas_ctime,
				.last_used = b->last_used, .pinned = b->pinned,
			};
			n++;
		}
	pthread_mutex_unlock(&s->lock);
	r = index_write(s->index_path, recs, n);
	pthread_mutex_unlock(&s->index_lock);
	for (size_t i = 0; i < n; i++)
		free(str[i].key);
	free(str);
	free(recs);
	if (r < 0)
		slog(s, LOG_ERR, "cannot write index %s: %s", s->index_path, strerror(-r));
	return r;
}

/* ---- life cycle ---- */

static void empty_tmp(struct store *s)
{
	DIR *d = opendir(s->tmp_dir);
	struct dirent *de;
	int n = 0;

	if (!d)
		return;
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		if (unlinkat(dirfd(d), de->d_name, 0) == 0)
			n++;
	}
	closedir(d);
	if (n)
		slog(s, LOG_NOTICE, "start-up: discarded %d unverified copies in %s", n, s->tmp_dir);
}

int store_open(struct store *s, const char *dir, const struct store_opts *opt,
	       const struct store_hooks *hooks)
{
	memset(s, 0, sizeof(*s));
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->cond, NULL);
	pthread_mutex_init(&s->index_lock, NULL);
	if (hooks)
		s->hooks = *hooks;
	s->opt = *opt;
	if (!s->opt.workers)
		s->opt.workers = 1;
	snprintf(s->dir, sizeof(s->dir), "%s", dir);
	snprintf(s->data_dir, sizeof(s->data_dir), "%s/data", dir);
	snprintf(s->tmp_dir, sizeof(s->tmp_dir), "%s/tmp", dir);
	snprintf(s->index_path, sizeof(s->index_path), "%s/index.json", dir);
	s->nbuckets = 1024;
	s->buckets = calloc(s->nbuckets, sizeof(*s->buckets));
	if (!s->buckets)
		return -ENOMEM;
	if ((mkdir(s->data_dir, 0755) < 0 && errno != EEXIST) ||
	    (mkdir(s->tmp_dir, 0700) < 0 && errno != EEXIST))
		return -errno;
	empty_tmp(s);
	return index_load(s);
}

/* Re-check every local copy's source once after start-up, in the
 * background; an open of an unchecked blob checks it first anyway. */
static void *recheck_sweep(void *arg)
{
	struct store *s = arg;

	for (;;) {
		struct blob *todo = NULL;

		pthread_mutex_lock(&s->lock);
		for (size_t i = 0; i < s->nbuckets && !todo; i++)
			for (struct blob *b = s->buckets[i]; b && !todo; b = b->hnext)
				if (b->state == BLOB_LOCAL && !b->checked)
					todo = b;
		pthread_mutex_unlock(&s->lock);
		if (!todo || s->stop)
			return NULL;
		store_check_source(s, todo);
	}
}

int store_start(struct store *s)
{
	s->threads = calloc(s->opt.workers + 1, sizeof(*s->threads));
	if (!s->threads)
		return -ENOMEM;
	if (pthread_create(&s->threads[s->nthreads], NULL, recheck_sweep, s) == 0)
		s->nthreads++;
	for (unsigned i = 0; i < s->opt.workers; i++) {
		int r = pthread_create(&s->threads[i], NULL, worker, s);

		if (r)
			return -r;
		s->nthreads++;
	}
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
	pthread_mutex_unlock(&s->lock);
	for (unsigned i = 0; i < s->nthreads; i++)
		pthread_join(s->threads[i], NULL);
	free(s->threads);
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
			free(b);
		}
	}
	free(s->buckets);
	s->buckets = NULL;
	pthread_mutex_destroy(&s->index_lock);
	pthread_cond_destroy(&s->cond);
	pthread_mutex_destroy(&s->lock);
}
