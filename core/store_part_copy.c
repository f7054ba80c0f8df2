/* store_part_copy.c - the range worker (copies and re-hashes the ranges of
 * partial copies) and wfsctl verify of them; the rules are store_part.c's. */
#include "store.h"
#include "store_int.h"
#include "durable.h"
#include "fetch_range.h"
#include "nasgate.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

/* Punch out [off, off + len) of @fd: bytes that must never serve. */
static void punch(int fd, uint64_t off, uint64_t len)
{
	if (len)
		fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len);
}

/* Open (making it, of the blob's size, if new) the partial file @path in
 * @dir.  A new one's entry in @dir is made durable before any range of it
 * is, so before the index names one: else a power loss could take the
 * file, and its verified ranges with it. */
static int open_part(const char *dir, const char *path, uint64_t size)
{
	struct stat st;
	int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600), made = 1;
	int err = 0;

	if (fd < 0 && errno == EEXIST) {
		made = 0;
		fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
	}
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0 || (!st.st_size && ftruncate(fd, (off_t)size) < 0))
		err = -errno;
	else if ((uint64_t)st.st_size != size && st.st_size)
		err = -EUCLEAN; /* not ours any more: the caller drops it */
	else if (made)
		err = durable_fsync_dir(dir);
	if (err < 0) {
		close(fd);
		return err;
	}
	return fd;
}

/* The copy of @w ended with @r: the lists follow.  @changed: the store saw
 * new attributes of the source while it was copied.  Lock held. */
static void copied_locked(struct store *s, struct blob *b, struct brange w, int r, int changed,
			  struct fetch_result *res, const struct stat *st)
{
	struct blob_part *p = b->part;
	/* stopped because the source showed new attributes (store.c) */
	int stopped = r == -ECANCELED && atomic_load(&p->prog.cancel) == COPY_STOP_SOURCE;

	if (r == 0 && p->n && strcmp(res->sample, b->sample)) {
		part_drop_locked(s, b, "source changed (sampled hash differs from its other "
				 "ranges')");
		return;
	}
	if ((r == 0 || stopped) && changed) {
		/* The range (and the sample with it) may be the old file's, or
		 * some of each (or the store stopped it as it saw the new
		 * attributes, store.c): never listed.  The ranges listed before are
		 * checked against the source before they serve an open (the
		 * new attributes left it unchecked). */
		char path[PATH_MAX + 64];
		int fd;

		r = -ESTALE;
		if (stopped)
			snprintf(res->reason, sizeof(res->reason), "source changed during the copy "
				 "(the NAS shows a new mtime or ctime): the copy of the range was "
				 "stopped after %llu of %llu bytes",
				 (unsigned long long)atomic_load(&p->prog.bytes_done),
				 (unsigned long long)w.len);
		else
			snprintf(res->reason, sizeof(res->reason), "source changed during the copy "
				 "(the NAS shows a new mtime or ctime): the range may hold the old "
				 "bytes");
		part_path_locked(s, b, path, sizeof(path));
		if ((fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW)) >= 0) {
			punch(fd, w.off, w.len);
			close(fd);
		}
	}
	if (r == 0)
		r = part_insert_locked(p, w.off, w.len, res->xxh);
	if (r < 0) {
		s->part_failed++;
		p->failed++;
		snprintf(p->reason, sizeof(p->reason), "%s", res->reason[0] ? res->reason :
			 strerror(-r));
		store_log_msg(s, LOG_WARNING, "range %llu+%llu of %s failed: %s; served from the NAS",
			      (unsigned long long)w.off, (unsigned long long)w.len, b->key, p->reason);
		return;
	}
	if (p->n == 1)
		snprintf(b->sample, sizeof(b->sample), "%s", res->sample);
	file_proof_take(&p->proof, st);
	/* the identity was taken just now, and the store saw no new
	 * attributes of the source meanwhile (else @changed) */
	b->checked = 1;
	s->part_copied++;
	s->part_bytes_copied += w.len;
	p->want_done += w.len;
	part_publish_locked(s, b);
	s->copies_unrecorded = 1;
	store_dirty_locked(s);
	store_log_msg(s, LOG_INFO, "verified range %llu+%llu of %s: %llu of %llu bytes local",
		      (unsigned long long)w.off, (unsigned long long)w.len, b->key,
		      (unsigned long long)p->bytes, (unsigned long long)b->size);
	if (p->bytes == b->size && (b->state == BLOB_NAS || b->state == BLOB_FAILED))
		p->adopt = 1; /* the worker makes it the whole copy next (adopt) */
}

/* The first part of @w that no listed range of @p covers (len 0: they
 * cover it all).  Lock held. */
static struct brange unlisted_locked(const struct blob_part *p, struct brange w)
{
	uint64_t end = w.off + w.len;
	size_t lo = 0, hi = p->n;

	while (lo < hi) { /* the first range that ends past w.off */
		size_t mid = lo + (hi - lo) / 2;

		if (p->v[mid].off + p->v[mid].len <= w.off)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (; lo < p->n && p->v[lo].off <= w.off; lo++)
		w.off = p->v[lo].off + p->v[lo].len;
	if (w.off >= end)
		return (struct brange){ end, 0 };
	return (struct brange){ w.off, (lo < p->n && p->v[lo].off < end ? p->v[lo].off : end) -
				       w.off };
}

/* @w was given out but its copy did not start: the NAS went down since the
 * worker looked.  First in @p's wants again, to wait for the NAS with the
 * rest (store_part_worker), as a whole copy goes back in its queue
 * (store_copy.c).  0, or -ENOMEM (then it fails as a copy does). */
static int want_again_locked(struct blob_part *p, struct brange w)
{
	if (p->nwant == p->capwant) {
		size_t cap = p->capwant ? 2 * p->capwant : 4;
		struct brange *v = realloc(p->want, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		p->want = v;
		p->capwant = cap;
	}
	memmove(p->want + 1, p->want, p->nwant++ * sizeof(*p->want));
	p->want[0] = w;
	return 0;
}

/* Copy the first range @b wants, or of it what no listed range covers: a
 * listed range's bytes are never written again, and those of a copy that
 * fails are punched out, so the piece copied must be none of theirs (only
 * this worker lists ranges: the list cannot grow under it meanwhile).
 * Called and returns with the lock held; *@paid as copy_one's
 * (store_copy.c). */
static void copy_want(struct store *s, struct blob *b, int64_t *paid)
{
	struct blob_part *p = b->part;
	struct brange w = unlisted_locked(p, p->want[0]);
	char key[PATH_MAX], path[PATH_MAX + 64] = "", why[256];
	struct fetch_result res = { 0 };
	struct stat st = { 0 };
	struct source_at at;
	unsigned gen = p->gen;
	uint64_t size = b->size, end = p->want[0].off + p->want[0].len;
	int evicted = 0, not_started = 0, fd, r;

	p->want_done += w.off - p->want[0].off; /* local already */
	if (w.off + w.len < end) /* the rest of it, after a listed range, next */
		p->want[0] = (struct brange){ w.off + w.len, end - (w.off + w.len) };
	else
		memmove(p->want, p->want + 1, --p->nwant * sizeof(*p->want));
	if (!w.len)
		return;
	if (space_reserve_locked(s, b, store_charge(s, w.len) + 2 * s->blk, &p->reserved, why,
				 sizeof(why), &evicted) < 0) {
		s->no_room++;
		r = -ENOSPC;
		snprintf(res.reason, sizeof(res.reason), "%s", why); /* "no room: ..." */
		copied_locked(s, b, w, r, 0, &res, &st);
		return;
	}
	source_at_locked(b, &at);
	snprintf(key, sizeof(key), "%s", b->key);
	part_path_locked(s, b, path, sizeof(path));
	part_retired_locked(s, b); /* a name of a copy since gone: never written */
	p->copying = 1;
	p->inflight = w;
	atomic_store(&p->prog.cancel, COPY_GO);
	atomic_store(&p->prog.bytes_done, 0);
	pthread_mutex_unlock(&s->lock);

	if (evicted)
		store_write_index(s);
	if (!nas_gate_up(s->opt.gate)) {
		r = -EHOSTDOWN;
		not_started = 1;
		snprintf(res.reason, sizeof(res.reason), "cannot copy %s: the NAS is down", key);
	} else if ((fd = r = open_part(s->part_dir, path, size)) >= 0) {
		r = fetch_range_verify(key, size, fd, w.off, w.len,
				       store_copy_rate(s, 0), &p->prog, &res);
		*paid = store_owed_until(res.owed_ns);
		if (r < 0)
			punch(fd, w.off, w.len); /* no listed range's bytes (above): never served */
		if (r == 0 && fstat(fd, &st) < 0)
			r = -errno;
		close(fd);
		if (res.src_err)
			nas_gate_note(s->opt.gate, res.src_err);
	} else {
		snprintf(res.reason, sizeof(res.reason), "partial file %s: %s", path,
			 r == -EUCLEAN ? "not of the blob's size" : strerror(-r));
	}

	pthread_mutex_lock(&s->lock);
	p->copying = 0;
	p->inflight = (struct brange){ 0, 0 };
	s->reserved -= p->reserved < s->reserved ? p->reserved : s->reserved;
	p->reserved = 0;
	if (gen != p->gen) {
		/* dropped meanwhile: what this copy made is no one's (a
		 * retired file goes once the index no longer names it) */
		if (!p->n && !p->retire)
			unlink(path);
		return;
	}
	if (not_started && !s->stop && want_again_locked(p, w) == 0)
		return;
	if (r == -EUCLEAN)
		part_drop_locked(s, b, "partial file not of the blob's size");
	copied_locked(s, b, w, r, source_changed_locked(b, &at), &res, &st);
}

/* Loaded without a matching identity: every range re-hashed, the bytes no
 * range names punched out.  Called and returns with the lock held. */
static void rehash(struct store *s, struct blob *b)
{
	struct blob_part *p = b->part;
	size_t n = p->n, bad = 0;
	struct part_range *v = malloc((n + 1) * sizeof(*v));
	struct brange *set = malloc((n + 1) * sizeof(*set)), *gaps = NULL;
	char path[PATH_MAX + 64];
	unsigned gen = p->gen;
	uint64_t size = b->size;
	struct stat st;
	int fd, *ok = calloc(n + 1, sizeof(*ok));

	if (!v || !set || !ok) {
		struct timespec until;

		free(v), free(set), free(ok);
		/* The ranges stay unproven (none serves) and are re-hashed in a
		 * second, the lock let go meanwhile: the worker would otherwise
		 * come straight back here, never letting go of it, for as long
		 * as memory is short -- every open and read of the store held. */
		store_log_msg(s, LOG_WARNING, "start-up: no memory to re-hash the %zu local range%s of "
			      "%s: tried again in a second", n, n == 1 ? "" : "s", b->key);
		until = mono_timespec(store_now_ms() + 1000);
		pthread_cond_timedwait(&s->part_cond, &s->lock, &until);
		return;
	}
	memcpy(v, p->v, n * sizeof(*v));
	part_path_locked(s, b, path, sizeof(path));
	p->copying = 1;
	pthread_mutex_unlock(&s->lock);

	fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
	for (size_t i = 0; fd >= 0 && i < n; i++) {
		char xxh[33];

		ok[i] = fetch_hash_range(fd, v[i].off, v[i].len, xxh) == 0 && !strcmp(xxh, v[i].xxh);
		set[i] = (struct brange){ v[i].off, v[i].len };
	}
	if (fd >= 0) {
		size_t ng = 0;

		gaps = brange_gaps_alloc(set, n, 0, size, &ng);
		for (size_t i = 0; gaps && i < ng; i++)
			punch(fd, gaps[i].off, gaps[i].len);
		for (size_t i = 0; i < n; i++)
			if (!ok[i])
				punch(fd, v[i].off, v[i].len);
	}
	pthread_mutex_lock(&s->lock);
	p->copying = 0;
	if (gen == p->gen && fd >= 0 && fstat(fd, &st) == 0) {
		p->n = p->bytes = 0;
		for (size_t i = 0; i < n; i++)
			if (ok[i])
				part_insert_locked(p, v[i].off, v[i].len, v[i].xxh);
			else
				bad++;
		p->unproven = 0;
		file_proof_take(&p->proof, &st);
		part_publish_locked(s, b);
		store_dirty_locked(s);
		store_log_msg(s, bad ? LOG_WARNING : LOG_INFO, "start-up: re-hashed the %zu local "
			      "range%s of %s: %zu dropped (not the bytes verified)", n,
			      n == 1 ? "" : "s", b->key, bad);
	} else if (gen == p->gen) {
		part_drop_locked(s, b, "partial file unreadable");
	}
	if (fd >= 0)
		close(fd);
	free(v), free(set), free(ok), free(gaps);
}

/* The adoption failed (@r, @why): the ranges keep serving -- unless it
 * found them not vouched for (-ESTALE: the partial file changed since they
 * were verified, or their bytes' sample is not the one they were copied
 * under): dropped then, the NAS serves.  Lock held. */
static void adopt_failed_locked(struct store *s, struct blob *b, int r, const char *why)
{
	if (r == -ESTALE) {
		part_drop_locked(s, b, why);
		return;
	}
	if (r == -EBADMSG) {
		/* the NAS holds other bytes than its name says: as a copy would */
		blob_state_set_locked(s, b, BLOB_MISMATCH);
		snprintf(b->reason, sizeof(b->reason), "%s", why);
		s->mismatches++;
		store_log_msg(s, LOG_ERR, "MISMATCH %s: %s; not made local whole", b->key, why);
		return;
	}
	snprintf(b->part->reason, sizeof(b->part->reason), "not made local whole: %s", why);
	store_log_msg(s, LOG_WARNING, "local ranges of %s cover it, but it was not made its whole "
		      "copy: %s; the ranges keep serving", b->key, why);
}

/* The ranges cover the whole blob: the partial file becomes its copy in
 * place.  It is hashed whole from the disk as a copy is (XXH3-128, the
 * source sample, the content address); it must still be the file the
 * ranges were verified in (its identity before and after the hashing) and
 * its sample the one the ranges were copied under.  Before the hashing
 * (seconds for a large file) the index on disk is made to name the ranges
 * that cover it, if it does not yet: a crash from then on finds them all,
 * and nothing is copied again.  Then it is linked into data/ (under the
 * lock: a link, a rename and a directory fsync in LOCAL_STORE, so no drop
 * can come in between) and the blob is LOCAL.  The partial file keeps its
 * name until an index that records the copy is on disk
 * (part_retire_locked): a crash before finds the ranges the index on disk
 * names, never a copy it does not name in their place.
 * Called and returns with the lock held; 1 when adopted. */
static int adopt(struct store *s, struct blob *b)
{
	struct blob_part *p = b->part;
	char path[PATH_MAX + 64], id[sizeof(b->id)], why[256] = "";
	struct fetch_result res = { 0 };
	struct stat st0, st1;
	unsigned gen = p->gen;
	uint64_t size = b->size;
	int r;

	p->adopt = 0;
	if (b->state != BLOB_NAS && b->state != BLOB_FAILED)
		return 0;
	part_path_locked(s, b, path, sizeof(path));
	snprintf(id, sizeof(id), "%s", b->id);
	p->copying = 1;
	pthread_mutex_unlock(&s->lock);
	store_write_index_if_dirty(s); /* a failure is logged; the ranges then are as before */
	r = lstat(path, &st0) < 0 ? -errno : fetch_verify_file(path, size, id, &res);
	/* (a name its bytes do not match: the NAS's fault only if the file
	 * hashed is the one the ranges were verified in) */
	if ((r == 0 || r == -EBADMSG) && lstat(path, &st1) < 0)
		r = -errno;
	pthread_mutex_lock(&s->lock);
	p->copying = 0;
	if (gen != p->gen || (b->state != BLOB_NAS && b->state != BLOB_FAILED))
		return 0; /* dropped, or copied whole, meanwhile */
	if ((r == 0 || r == -EBADMSG) &&
	    (!file_proof_holds(&p->proof, &st0) || !file_proof_holds(&p->proof, &st1)))
		r = -ESTALE, snprintf(why, sizeof(why), "partial file %s changed since its ranges "
				      "were verified", path);
	else if (r == 0 && strcmp(res.sample, b->sample))
		r = -ESTALE, snprintf(why, sizeof(why), "its sampled hash is not the one its ranges "
				      "were copied under");
	if (r == 0 && (r = store_publish_link_locked(s, path, res.xxh)) < 0)
		snprintf(why, sizeof(why), "linking %s into the store: %s", path, strerror(-r));
	if (r < 0) {
		adopt_failed_locked(s, b, r, why[0] ? why : res.reason[0] ? res.reason : strerror(-r));
		return 0;
	}
	/* The ranges' sample is the source's identity only as long as no
	 * new attributes were seen since it was last checked: an unchecked
	 * source stays so, and is sampled before the copy serves an open. */
	verify_record_locked(s, b, &res, b->checked);
	store_made_local_locked(s, b);
	part_retire_locked(s, b, 1); /* its file is the copy now */
	store_log_msg(s, LOG_INFO, "local ranges of %s cover it whole: the partial file is its "
		      "verified copy %s now (no second copy)", b->key, res.xxh);
	return 1;
}

void *store_part_worker(void *arg)
{
	struct store *s = arg;
	int64_t paid = 0; /* the cap's time for its last copy (store_owed_until) */

	pthread_setname_np(pthread_self(), "wfs-copyrange");
	pthread_mutex_lock(&s->lock);
	while (!s->stop) {
		struct blob *b = s->part_head;

		if (!b) {
			if (s->index_dirty && s->copies_unrecorded) {
				pthread_mutex_unlock(&s->lock);
				store_write_index(s);
				pthread_mutex_lock(&s->lock);
				continue;
			}
			pthread_cond_wait(&s->part_cond, &s->lock);
			continue;
		}
		if (b->part->unproven) {
			rehash(s, b);
		} else if (b->part->nwant && !nas_gate_up(s->opt.gate)) {
			/* No range copy starts while the NAS is down: the
			 * ranges wait for it, as the whole copies' queue does
			 * (store_copy.c); a look again soon, the gate has no
			 * callback. */
			struct timespec until;

			s->queue_held++;
			until = mono_timespec(store_now_ms() + STORE_QUEUE_LOOK_MS);
			pthread_cond_timedwait(&s->part_cond, &s->lock, &until);
			continue;
		} else if (b->part->nwant) {
			if (store_owed_wait_locked(s, &s->part_cond, &paid))
				continue;
			copy_want(s, b, &paid);
		} else if (b->part->adopt && adopt(s, b)) {
			pthread_mutex_unlock(&s->lock);
			store_write_index(s); /* the index names the copy, not the ranges */
			pthread_mutex_lock(&s->lock);
		}
		if (!b->part->nwant && !b->part->unproven && !b->part->adopt) {
			s->part_head = b->part->qnext;
			if (!s->part_head)
				s->part_tail = NULL;
			b->part->queued = 0;
		}
		pthread_cond_broadcast(&s->cond); /* settled (store_wait_settled and friends) */
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

/* ---- wfsctl verify ---- */

/* Every range of @v re-hashed from @path: 0, or the first that differs
 * (or cannot be read), said in @why. */
static int rehash_all(const char *path, const struct part_range *v, size_t n, char *why,
		      size_t wsz)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW), r = 0;

	if (fd < 0) {
		snprintf(why, wsz, "partial copy %s unreadable: %s", path, strerror(errno));
		return -1;
	}
	for (size_t i = 0; i < n && !r; i++) {
		char xxh[33];
		int e = fetch_hash_range(fd, v[i].off, v[i].len, xxh);

		if (e < 0 || strcmp(xxh, v[i].xxh)) {
			snprintf(why, wsz, "local range %llu+%llu %s", (unsigned long long)v[i].off,
				 (unsigned long long)v[i].len, e < 0 ? "unreadable" : "corrupt");
			r = -1;
		}
	}
	close(fd);
	return r;
}

int store_part_verify(struct store *s, struct blob *b, int full, char *reason, size_t rsz)
{
	char path[PATH_MAX + 64];
	struct part_range *v;
	unsigned gen;
	size_t n;
	int r = 0;

	pthread_mutex_lock(&s->lock);
	if (b->state == BLOB_LOCAL || !b->part || !b->part->n || b->part->unproven ||
	    !(v = malloc(b->part->n * sizeof(*v)))) {
		pthread_mutex_unlock(&s->lock);
		return 0;
	}
	n = b->part->n;
	memcpy(v, b->part->v, n * sizeof(*v));
	gen = b->part->gen;
	b->checked = 0;
	part_path_locked(s, b, path, sizeof(path));
	pthread_mutex_unlock(&s->lock);

	store_check_source(s, b); /* a changed source drops the ranges */
	if (full && rehash_all(path, v, n, reason, rsz) < 0)
		r = 1;
	pthread_mutex_lock(&s->lock);
	if (b->part->gen != gen) {
		snprintf(reason, rsz, "%s", b->part->reason[0] ? b->part->reason : "ranges dropped");
		r = 1;
	} else if (r) {
		part_drop_locked(s, b, reason);
	} else if (!b->checked && b->check_err) {
		snprintf(reason, rsz, "source not checked: %s; the verified ranges keep serving",
			 b->check_err == -EHOSTDOWN ? "the NAS is down" : strerror(-b->check_err));
		r = b->check_err;
	}
	pthread_mutex_unlock(&s->lock);
	free(v);
	return r;
}
