/* store_verify.c - every check that lets a local copy serve, after the
 * copy itself.  Read with fetch.c, which makes the copy and proves it at
 * copy time (hashes as read, durable re-read from disk, content address):
 *
 *   copy time    fetch_copy_verify (fetch.c); its result is recorded here
 *                (verify_record_locked): the copy's XXH3-128, its identity
 *                on disk (inode, mtime, ctime; a write changes the ctime)
 *                and the source's identity (size + sampled hash, hash.h)
 *   start-up     verify_loaded_locked: the copy and the source still have
 *                the recorded size, else the record is dropped; a copy
 *                whose identity is not the recorded one (or none was: a
 *                version 1 index) is not served until re-hashed in full
 *                (reverify_one, in the sweep) -- equal: LOCAL again, else
 *                demoted and removed
 *   first open   store_check_source: the source's sampled hash, once per
 *   and sweep    start-up (store_recheck_sweep checks them all in the
 *                background) and again whenever the NAS attributes change
 *   on request   store_verify: the same, and with @full the copy re-hashed
 *                (scrub); any mismatch demotes the copy, reads go to the NAS
 *
 * A copy found corrupt is corrupt for every blob that shares it (one file
 * per content hash): they are all demoted.
 */
#include "store.h"
#include "store_int.h"
#include "hash.h"
#include "nasopen.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

/* ---- a copy's identity on disk ---- */

/* lstat: a link or anything else planted under data/ is no copy. */
static int copy_stat(const char *path, struct stat *st)
{
	if (lstat(path, st) < 0)
		return -errno;
	return S_ISREG(st->st_mode) ? 0 : -EINVAL;
}

static int same_ts(const struct timespec *a, const struct timespec *b)
{
	return a->tv_sec == b->tv_sec && a->tv_nsec == b->tv_nsec;
}

static int same_file(const struct stat *a, const struct stat *b)
{
	return a->st_ino == b->st_ino && a->st_dev == b->st_dev && a->st_size == b->st_size &&
	       same_ts(&a->st_mtim, &b->st_mtim) && same_ts(&a->st_ctim, &b->st_ctim);
}

/* Is @st the file @b's copy was when it was verified? */
static int proven_locked(const struct blob *b, const struct stat *st)
{
	return b->copy_ino && b->copy_ino == (uint64_t)st->st_ino &&
	       (uint64_t)st->st_size == b->size &&
	       same_ts(&b->copy_mtime, &st->st_mtim) && same_ts(&b->copy_ctime, &st->st_ctim);
}

static void prove_locked(struct blob *b, const struct stat *st)
{
	b->copy_ino = (uint64_t)st->st_ino;
	b->copy_mtime = st->st_mtim;
	b->copy_ctime = st->st_ctim;
}

static int is_hex32(const char *x)
{
	size_t n = strspn(x, "0123456789abcdef");

	return n == 32 && !x[n];
}

void verify_record_locked(struct store *s, struct blob *b, const struct fetch_result *res)
{
	char local[PATH_MAX + 64];
	struct stat st;

	snprintf(b->xxh, sizeof(b->xxh), "%s", res->xxh);
	snprintf(b->sample, sizeof(b->sample), "%s", res->sample);
	b->checked = 1; /* the sample was taken from the bytes just copied */
	b->copy_ino = 0;
	/* After the rename into data/ (a rename changes the ctime). */
	if (store_local_path_locked(s, b, local, sizeof(local)) < 0 || copy_stat(local, &st) < 0)
		return; /* no proof: re-hashed at the next start-up */
	prove_locked(b, &st);
	/* The name holds this file now (publish replaces what was there):
	 * the blobs that share it are proven by it too. */
	STORE_EACH(s, o)
		if (o != b && o->state == BLOB_LOCAL && !strcmp(o->xxh, b->xxh))
			prove_locked(o, &st);
}

int verify_loaded_locked(struct store *s, struct blob *b)
{
	char local[PATH_MAX + 64], why[160] = "";
	struct stat lst, nst;
	int r = -EINVAL;

	/* The quick check: both sides still have the recorded size.  The
	 * source's sampled hash is compared before the first local read. */
	if (!is_hex32(b->xxh) || store_local_path_locked(s, b, local, sizeof(local)) < 0)
		snprintf(why, sizeof(why), "the index names no valid copy");
	else if ((r = copy_stat(local, &lst)) < 0)
		snprintf(why, sizeof(why), "local copy %s", r == -ENOENT ? "missing" :
			 r == -EINVAL ? "is not a regular file" : strerror(-r));
	else if ((uint64_t)lst.st_size != b->size)
		snprintf(why, sizeof(why), "local copy has the wrong size: %llu bytes, %llu expected",
			 (unsigned long long)lst.st_size, (unsigned long long)b->size);
	else if (stat(b->key, &nst) < 0 || (uint64_t)nst.st_size != b->size)
		snprintf(why, sizeof(why), "source changed size or vanished");
	if (*why) {
		store_log_msg(s, LOG_NOTICE, "start-up: dropped local copy of %s (%s)", b->key, why);
		b->xxh[0] = '\0';
		b->copy_ino = 0;
		return 0;
	}
	if (proven_locked(b, &lst)) {
		b->state = BLOB_LOCAL;
		return 1;
	}
	/* Not served until re-hashed (the sweep): reads go to the NAS.  Its
	 * room is reserved as a copy in flight's is, so what the limit counts
	 * does not grow when it turns LOCAL. */
	b->reverify = 1;
	b->state = BLOB_COPYING;
	b->reserved = store_charge(s, b->size);
	s->reserved += b->reserved;
	b->tmp = strdup(local);
	atomic_store(&b->prog.bytes_done, 0);
	atomic_store(&b->prog.cancel, 0);
	store_log_msg(s, b->copy_ino ? LOG_WARNING : LOG_INFO,
		      "start-up: local copy %s of %s (%s) is re-hashed before it serves: %s; "
		      "served from the NAS meanwhile", local, b->key, b->id,
		      b->copy_ino ? "it changed since it was verified (inode, mtime or ctime)" :
				    "the index holds no proof of it (an earlier version wrote none)");
	return 2;
}

static int sample_source(const char *key, uint64_t size, char out[33])
{
	/* no link in any component of the key, no FIFO opened (nasopen.h) */
	int fd = nas_open(NULL, key, 0), r;

	if (fd < 0)
		return fd;
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
			store_demote_locked(s, b, why, 1);
		} else if (strcmp(sample, b->sample)) {
			store_demote_locked(s, b, "source changed (sampled hash differs)", 1);
		} else {
			b->checked = 1;
		}
	}
	r = b->state == BLOB_LOCAL;
	pthread_mutex_unlock(&s->lock);
	return r;
}

/* ---- the re-hash of a copy the index could not prove (start-up) ---- */

/* Remove @path if it is still the file @st.  Returns 1 when removed. */
static int unlink_if_same(struct store *s, const char *path, const struct stat *st)
{
	struct stat now;

	if (lstat(path, &now) < 0 || !same_file(&now, st))
		return 0;
	if (unlink(path) == 0)
		return 1;
	store_log_msg(s, LOG_WARNING, "cannot remove %s: %s", path, strerror(errno));
	return 0;
}

/* The copy @bad (the file @st, the content hash @xxh) does not hold its
 * bytes: every LOCAL blob proven by that file serves wrong bytes; demote
 * them (the copy goes with the last). */
static void demote_sharers_locked(struct store *s, const char *xxh, const struct stat *st,
				  const char *why)
{
	STORE_EACH(s, o)
		if (o->state == BLOB_LOCAL && !strcmp(o->xxh, xxh) && (!st || proven_locked(o, st)))
			store_demote_locked(s, o, why, 1);
}

/* Another blob this run proved the file @st under the same name: no
 * second hash of the same bytes (a hub holds a file in several repos). */
static int shared_proof_locked(struct store *s, const struct blob *b, const struct stat *st)
{
	STORE_EACH(s, o)
		if (o != b && o->state == BLOB_LOCAL && !strcmp(o->xxh, b->xxh) &&
		    proven_locked(o, st))
			return 1;
	return 0;
}

struct rehash {
	char local[PATH_MAX + 64], key[PATH_MAX], want[33], sample[33];
	uint64_t size;
	struct timespec nas_mtime, nas_ctime; /* the source's attributes when it began */
	struct stat before;
	int r;          /* of the hash: 0, or -errno */
	int moved;      /* the file under the name is another one since */
	int src;        /* of the source sample: 0, or -errno */
	char got[33], got_sample[33];
};

/* Lock held: the re-hash of @b is done (@h); LOCAL again or demoted. */
static void rehash_done_locked(struct store *s, struct blob *b, struct rehash *h)
{
	char why[256] = "";
	int bad_copy = 0, removed = 0;

	/* Stopping (store_close cancels the hash): still unproven, the index
	 * keeps it, the next start-up re-hashes it. */
	if (!b->reverify || s->stop)
		return;
	b->reverify = 0;
	space_release_locked(s, b);
	free(b->tmp);
	b->tmp = NULL;
	if (atomic_load(&b->prog.cancel)) {
		/* wfsctl evict while it was re-hashed: as an eviction */
		if (!shared_proof_locked(s, b, &h->before))
			unlink_if_same(s, h->local, &h->before);
		b->state = BLOB_NAS;
		b->xxh[0] = '\0';
		b->copy_ino = 0;
		b->reason[0] = '\0';
		s->evicted++;
		store_reset_hot_locked(s, b);
		store_dirty_locked(s);
		store_log_msg(s, LOG_INFO, "evicted %s (%s) while its copy was re-hashed", b->key, b->id);
		pthread_cond_broadcast(&s->cond); /* settled */
		return;
	}
	if (h->moved) {
		/* Replaced by a copy verified meanwhile (publish renames over
		 * the name): that one's proof holds for this blob too. */
		struct stat now;

		if (copy_stat(h->local, &now) == 0 && shared_proof_locked(s, b, &now)) {
			h->before = now;
			h->moved = 0;
			snprintf(h->got, sizeof(h->got), "%s", h->want);
		}
	}
	if (h->r < 0) {
		bad_copy = h->r != -ENOENT;
		snprintf(why, sizeof(why), "local copy %s", h->r == -ENOENT ? "missing" : "unreadable");
		if (bad_copy)
			snprintf(why + strlen(why), sizeof(why) - strlen(why), ": %s", strerror(-h->r));
	} else if (h->moved) {
		snprintf(why, sizeof(why), "local copy replaced while it was re-hashed");
	} else if (strcmp(h->got, h->want)) {
		bad_copy = 1;
		snprintf(why, sizeof(why), "local copy corrupt: xxh128 %s, expected %s", h->got,
			 h->want);
	} else if ((uint64_t)h->before.st_size != b->size) {
		snprintf(why, sizeof(why), "source changed size");
	} else if (h->src == 0 && strcmp(h->got_sample, h->sample)) {
		snprintf(why, sizeof(why), "source changed (sampled hash differs)");
	}
	if (!*why) {
		prove_locked(b, &h->before);
		/* A source that could not be read now, or that shows new
		 * attributes since, is sampled again before the first local
		 * read (store_check_source). */
		b->checked = h->src == 0 && same_ts(&b->nas_mtime, &h->nas_mtime) &&
			     same_ts(&b->nas_ctime, &h->nas_ctime);
		b->reason[0] = '\0';
		store_dirty_locked(s);
		atomic_store_explicit(&b->state, BLOB_LOCAL, memory_order_release);
		store_log_msg(s, LOG_NOTICE, "re-verified local copy of %s (%s): xxh128 %s as "
			      "recorded; served locally again", b->key, b->id, h->want);
		pthread_cond_broadcast(&s->cond); /* settled */
		return;
	}
	if (bad_copy)
		demote_sharers_locked(s, h->want, &h->before, why);
	/* Its own copy: removed unless another blob is served from it (a
	 * source that changed leaves the bytes good for the others). */
	if (h->r != -ENOENT && !h->moved && !shared_proof_locked(s, b, &h->before))
		removed = unlink_if_same(s, h->local, &h->before);
	b->state = BLOB_NAS;
	b->xxh[0] = '\0';
	b->copy_ino = 0;
	snprintf(b->reason, sizeof(b->reason), "%s", why);
	s->demoted++;
	store_reset_hot_locked(s, b);
	store_dirty_locked(s);
	store_log_msg(s, LOG_WARNING, "demoted %s (%s): %s; its copy %s was never served%s", b->key,
		      b->id, why, h->local, removed ? " and is removed" : "");
	pthread_cond_broadcast(&s->cond); /* settled */
}

/* Re-hash the copy of @b (a re-verification pending since start-up) in
 * full, and sample its source: neither with the lock held. */
static void reverify_one(struct store *s, struct blob *b)
{
	struct rehash h = { .src = -ENODATA };
	struct stat after;
	int shared;

	pthread_mutex_lock(&s->lock);
	if (!b->reverify || b->state != BLOB_COPYING) {
		pthread_mutex_unlock(&s->lock);
		return;
	}
	store_local_path_locked(s, b, h.local, sizeof(h.local));
	snprintf(h.key, sizeof(h.key), "%s", b->key);
	snprintf(h.want, sizeof(h.want), "%s", b->xxh);
	snprintf(h.sample, sizeof(h.sample), "%s", b->sample);
	h.size = b->size;
	h.nas_mtime = b->nas_mtime;
	h.nas_ctime = b->nas_ctime;
	h.r = copy_stat(h.local, &h.before);
	shared = h.r == 0 && shared_proof_locked(s, b, &h.before);
	pthread_mutex_unlock(&s->lock);

	if (shared) {
		snprintf(h.got, sizeof(h.got), "%s", h.want);
	} else if (h.r == 0) {
		h.r = fetch_hash_file(h.local, h.got, &b->prog);
		/* A write while it was read changes the ctime: the hash may
		 * have seen some of it, so it proves nothing. */
		h.moved = h.r == 0 && (copy_stat(h.local, &after) < 0 ||
				       !same_file(&after, &h.before));
	}
	if (h.r == 0)
		h.src = sample_source(h.key, h.size, h.got_sample);

	pthread_mutex_lock(&s->lock);
	rehash_done_locked(s, b, &h);
	pthread_mutex_unlock(&s->lock);
}

/* One pass over the table: a bucket at a time, resumed where it was (the
 * table may grow meanwhile; blobs added later were checked when made
 * LOCAL, or are checked on first open).  @todo picks what to work on. */
static void sweep(struct store *s, int (*todo)(const struct blob *),
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

			if (todo(o))
				b = o;
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
	return b->state == BLOB_LOCAL && !b->checked;
}

static void check_source(struct store *s, struct blob *b)
{
	store_check_source(s, b);
}

static int copy_unproven(const struct blob *b)
{
	return b->reverify && b->state == BLOB_COPYING;
}

/* After start-up, in the background: every local copy's source sampled
 * once (an open of an unchecked blob checks it first anyway), then every
 * copy the index could not prove re-hashed. */
void *store_recheck_sweep(void *arg)
{
	struct store *s = arg;

	sweep(s, source_unchecked, check_source);
	sweep(s, copy_unproven, reverify_one);
	return NULL;
}

int store_verify(struct store *s, struct blob *b, int full, char *reason, size_t rsz)
{
	char local[PATH_MAX + 64], xxh[33], want[33];
	int r, demoted = 0;

	pthread_mutex_lock(&s->lock);
	if (b->state != BLOB_LOCAL) {
		pthread_mutex_unlock(&s->lock);
		return 0;
	}
	b->checked = 0;
	snprintf(want, sizeof(want), "%s", b->xxh);
	store_local_path_locked(s, b, local, sizeof(local));
	pthread_mutex_unlock(&s->lock);

	if (!store_check_source(s, b)) {
		pthread_mutex_lock(&s->lock);
		snprintf(reason, rsz, "%s", b->reason);
		pthread_mutex_unlock(&s->lock);
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
		/* the same file serves every blob of that content */
		demote_sharers_locked(s, want, NULL, reason);
		demoted = 1;
	}
	pthread_mutex_unlock(&s->lock);
	return demoted;
}
