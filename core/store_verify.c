/* store_verify.c - every check that lets a local copy serve, after the
 * copy itself.  Read with fetch.c, which makes the copy and proves it at
 * copy time (hashes as read, durable re-read from disk, content address):
 *
 *   copy time    fetch_copy_verify (fetch.c); its result is recorded here
 *                (verify_record_locked): the copy's XXH3-128, its identity
 *                on disk (inode, mtime, ctime; a write changes the ctime)
 *                and the source's identity (size + sampled hash, hash.h).
 *                A copy whose source showed new attributes while it was
 *                made (source_changed_locked) is not published: its bytes
 *                may be the old file's (store_copy.c, store_part_copy.c)
 *   start-up     verify_loaded_locked: the copy still has the recorded
 *                size, else the record is dropped; a copy whose identity
 *                is not the recorded one (or none was: a version 1 index)
 *                is not served until re-hashed in full (reverify_one, in
 *                the sweep) -- equal: LOCAL again, else demoted and
 *                removed.  Then, without the lock, verify_sources_loaded
 *                (store_startcheck.c): the source still exists with the
 *                recorded size, each stat within the NAS deadline
 *   first open   store_check_source: the source's size and sampled hash,
 *   and sweep    once per start-up (store_recheck_sweep, store_sweep.c,
 *                checks them all in the background) and again whenever the
 *                NAS attributes change
 *   every open   store_copy_opened: the copy opened to serve is still the
 *                file verified (its identity), else it is not served
 *   on request   store_verify: the same, and with @full the copy re-hashed
 *                (scrub; right bytes: the file as it is now is the copy's
 *                identity); any mismatch demotes the copy, reads go to the
 *                NAS
 *   a read       store_local_read_error (store.c): a copy that fails a
 *                read is demoted and removed
 *
 * A copy found corrupt is corrupt for every blob that shares it (one file
 * per content hash): they are all demoted.
 *
 * The NAS failing (DESIGN.md "When the NAS fails"): only positive evidence
 * about the source demotes a verified copy -- the source is gone (ENOENT,
 * ENOTDIR), something else is in its place (a link, a directory, a FIFO or
 * device), it has another size, or another sampled hash.  Any other error
 * (ENOTCONN, ETIMEDOUT, EIO, EHOSTDOWN, EACCES, ...) proves nothing about
 * the bytes: the copy stays LOCAL and serves, unchecked (b->checked 0, so
 * the check is made again at the next open and by the sweep once the NAS
 * is up), one log line says which path and error, and the gate hears of
 * it.  Source checks run through the gate (nas_call: a deadline, on a NAS
 * thread, copies of what they read in heap memory so a check past its
 * deadline may end later without touching the blob) and never with
 * store.lock held; while the gate says the NAS is down they are not made
 * at all -- at start-up neither (the copies serve; checked once it is back).
 */
#include "store.h"
#include "store_int.h"
#include "hash.h"
#include "nasgate.h"
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

static int same_file(const struct stat *a, const struct stat *b)
{
	return a->st_ino == b->st_ino && a->st_dev == b->st_dev && a->st_size == b->st_size &&
	       same_ts(&a->st_mtim, &b->st_mtim) && same_ts(&a->st_ctim, &b->st_ctim);
}

/* Is @st the file @b's copy was when it was verified? */
static int proven_locked(const struct blob *b, const struct stat *st)
{
	return file_proof_holds(&b->copy, st) && (uint64_t)st->st_size == b->size;
}

static void prove_locked(struct blob *b, const struct stat *st)
{
	file_proof_take(&b->copy, st);
}

/* The name holds the file @st now (a publish replaced what was there, or a
 * full hash found it right): @b and every LOCAL blob that shares it are
 * proven by it. */
static void prove_sharers_locked(struct store *s, struct blob *b, const struct stat *st)
{
	prove_locked(b, st);
	COPY_EACH_OF(s, b, o)
		if (o != b && o->state == BLOB_LOCAL)
			prove_locked(o, st);
}

void source_at_locked(const struct blob *b, struct source_at *at)
{
	at->mtime = b->nas_mtime;
	at->ctime = b->nas_ctime;
}

int source_changed_locked(const struct blob *b, const struct source_at *at)
{
	return !same_ts(&b->nas_mtime, &at->mtime) || !same_ts(&b->nas_ctime, &at->ctime);
}

void verify_record_locked(struct store *s, struct blob *b, const struct fetch_result *res,
			  int checked)
{
	char local[PATH_MAX + 64];
	struct stat st;

	blob_xxh_set_locked(s, b, res->xxh);
	snprintf(b->sample, sizeof(b->sample), "%s", res->sample);
	/* The sample was taken from the bytes just copied: the source's
	 * identity only if the NAS showed no new attributes since. */
	b->checked = checked;
	if (!checked)
		s->recheck_wanted = 1;
	b->copy.ino = 0;
	/* After the rename into data/ (a rename changes the ctime). */
	if (store_local_path_locked(s, b, local, sizeof(local)) < 0 || copy_stat(local, &st) < 0)
		return; /* no proof: re-hashed at the next start-up */
	prove_sharers_locked(s, b, &st);
}

int verify_loaded_locked(struct store *s, struct blob *b)
{
	char local[PATH_MAX + 64], why[160] = "";
	struct stat lst;
	int r = -EINVAL;

	/* The quick check: the copy still has the recorded size (the source's
	 * is verify_sources_loaded's, without the lock; its sampled hash is
	 * compared before the first local read). */
	if (!xxh128_hex_valid(b->xxh) || store_local_path_locked(s, b, local, sizeof(local)) < 0)
		snprintf(why, sizeof(why), "the index names no valid copy");
	else if ((r = copy_stat(local, &lst)) < 0)
		snprintf(why, sizeof(why), "local copy %s", r == -ENOENT ? "missing" :
			 r == -EINVAL ? "is not a regular file" : strerror(-r));
	else if ((uint64_t)lst.st_size != b->size)
		snprintf(why, sizeof(why), "local copy has the wrong size: %llu bytes, %llu expected",
			 (unsigned long long)lst.st_size, (unsigned long long)b->size);
	if (*why) {
		store_log_msg(s, LOG_NOTICE, "start-up: dropped local copy of %s (%s)", b->key, why);
		blob_xxh_set_locked(s, b, "");
		b->copy.ino = 0;
		return r == -ENOENT ? -ENOENT : 0;
	}
	if (proven_locked(b, &lst)) {
		blob_state_set_locked(s, b, BLOB_LOCAL);
		return 1;
	}
	/* Not served until re-hashed (the sweep): reads go to the NAS.  Its
	 * room is reserved as a copy in flight's is, so what the limit counts
	 * does not grow when it turns LOCAL. */
	b->reverify = 1;
	blob_state_set_locked(s, b, BLOB_COPYING);
	b->reserved = store_charge(s, b->size);
	s->reserved += b->reserved;
	b->tmp = strdup(local);
	atomic_store(&b->prog.bytes_done, 0);
	atomic_store(&b->prog.cancel, COPY_GO);
	store_log_msg(s, b->copy.ino ? LOG_WARNING : LOG_INFO,
		      "start-up: local copy %s of %s (%s) is re-hashed before it serves: %s; "
		      "served from the NAS meanwhile", local, b->key, b->id,
		      b->copy.ino ? "it changed since it was verified (inode, mtime or ctime)" :
				    "the index holds no proof of it (an earlier version wrote none)");
	return 2;
}

/* ---- the source's identity, checked through the gate ---- */

/* What a source check (error -@err, 0 if none) proves, for the reason and
 * the log: the source is gone (ENOENT, ENOTDIR: it or a component of its
 * path), something else is in its place (ELOOP: a link, which nas_open
 * never follows; EISDIR, ENXIO: a directory, FIFO, socket or device), it
 * is shorter (ENODATA, source_sample), of another size, or has another
 * sampled hash.  "" when it proves nothing (any other error: one the NAS
 * may not repeat) or the source is as recorded. */
static void source_verdict(int err, uint64_t size, uint64_t size_now, const char *sample,
			   const char *want, char *why, size_t wsz)
{
	why[0] = '\0';
	if (err == -ENOENT || err == -ENOTDIR)
		snprintf(why, wsz, "source vanished (%s)", strerror(-err));
	else if (err == -ELOOP)
		snprintf(why, wsz, "source replaced by a link");
	else if (err == -EISDIR || err == -ENXIO)
		snprintf(why, wsz, "source is not a regular file any more");
	else if (err == -ENODATA)
		snprintf(why, wsz, "source changed size (shorter than recorded)");
	else if (err == 0 && size_now != size)
		snprintf(why, wsz, "source changed size: %llu bytes, %llu recorded",
			 (unsigned long long)size_now, (unsigned long long)size);
	else if (err == 0 && strcmp(sample, want))
		snprintf(why, wsz, "source changed (sampled hash differs)");
}

int store_source_root(const struct store *s, const char *key, char *root, size_t sz)
{
	const struct hub_roots *roots = s->opt.roots;
	const char *rest;
	int i = roots ? hub_root_of(roots, key, &rest) : 0;

	snprintf(root, sz, "%s", i < 0 ? "" : roots ? roots->path[i] :
		 s->opt.gate ? s->opt.gate->root : "");
	return i <= 0;
}

/* One source check, run on a NAS thread (nasgate.h).  Heap memory holding
 * copies of everything it reads: a check past its deadline ends later on
 * its thread and is freed there (src_job_free), never touching the blob. */
struct src_job {
	char key[PATH_MAX];
	char root[PATH_MAX];    /* the root @key lies in, "" if not known */
	int hub;                /* @root is NAS_HUB */
	uint64_t size;          /* recorded */
	uint64_t size_now;      /* out: the source's size now */
	char sample[33];        /* out: its sampled hash, when the sizes agree */
	int err;                /* out: 0, or -errno of the check as it failed */
};

static int src_job_run(void *arg)
{
	struct src_job *j = arg;
	struct stat st;
	/* no link in any component of the key, no FIFO opened (nasopen.h) */
	int fd = nas_open(NULL, j->key, 0);

	j->err = fd < 0 ? fd : 0;
	/* A source gone with everything else in its root is that root not
	 * mounted (its empty mount point seen instead), not a file deleted:
	 * no copy demoted for it (NAS_HUB's: the gate told, down). */
	j->err = nas_missing_or_gone(j->root, j->hub, j->err);
	if (fd >= 0) {
		if (fstat(fd, &st) < 0)
			j->err = -errno;
		else if ((j->size_now = (uint64_t)st.st_size) == j->size)
			j->err = source_sample(fd, j->size, j->sample);
		close(fd);
	}
	/* nas_call's own -ETIMEDOUT means "past the deadline: @arg is the
	 * gate's now"; the same code from the NAS itself (a soft mount) must
	 * not be taken for it.  ENOTCONN tells the gate the same thing. */
	return j->err == -ETIMEDOUT ? -ENOTCONN : j->err;
}

static void src_job_free(void *arg)
{
	free(arg);
}

/* Check the source @key (@size recorded) through the gate.  Returns 0 with
 * *@size_now and @sample (when the sizes agree) filled, or -errno:
 * -ETIMEDOUT the deadline passed, -EHOSTDOWN the NAS is down (not asked),
 * else the check's own error.  No lock held. */
static int check_source_gated(struct store *s, const char *key, uint64_t size,
			      uint64_t *size_now, char sample[33])
{
	struct src_job *j;
	int r;

	if (!nas_gate_up(s->opt.gate))
		return -EHOSTDOWN; /* not even a job: opens during an outage stay cheap */
	j = calloc(1, sizeof(*j));
	if (!j)
		return -ENOMEM;
	snprintf(j->key, sizeof(j->key), "%s", key);
	j->hub = store_source_root(s, key, j->root, sizeof(j->root));
	j->size = size;
	j->err = -EHOSTDOWN; /* as it stays if the gate refuses to run it */
	r = nas_call(s->opt.gate, src_job_run, j, src_job_free);
	if (r == -ETIMEDOUT)
		return r; /* the gate's now: freed when the check ends */
	r = r == -EBUSY ? r : j->err; /* EBUSY: not run (j->err is its default) */
	*size_now = j->size_now;
	snprintf(sample, 33, "%s", j->sample);
	free(j);
	return r;
}

/* Lock held: a source check of LOCAL @b could not be made (@err): the copy
 * keeps serving, unchecked; said once per blob and error, not per open. */
static void check_unmade_locked(struct store *s, struct blob *b, int err)
{
	char local[PATH_MAX + 64] = "";

	b->checked = 0;
	s->recheck_wanted = 1;
	if (b->check_err == err)
		return;
	b->check_err = err;
	store_local_path_locked(s, b, local, sizeof(local));
	/* (the NAS down: the gate logged the outage once; this is per blob) */
	store_log_msg(s, err == -EHOSTDOWN ? LOG_DEBUG : LOG_WARNING,
		      "cannot check the source %s of local copy %s: %s; the verified copy keeps "
		      "serving (only a source gone or changed demotes it), checked again once "
		      "the NAS answers", b->key, local, err == -EHOSTDOWN ? "the NAS is down" :
		      err == -ETIMEDOUT ? "no answer within the NAS deadline" :
		      err == -EBUSY ? "every NAS thread was busy in slow calls" :
		      nas_err_why(err));
}

int served_locally_locked(const struct blob *b)
{
	return b->state == BLOB_LOCAL || (b->part && b->part->n);
}

/* How often a source check is made again when the NAS showed new
 * attributes of the file while it ran; past that, it is left to the sweep. */
#define CHECK_TRIES 3

int store_check_source(struct store *s, struct blob *b)
{
	char sample[33] = "", key[PATH_MAX], why[192];
	uint64_t size, size_now = 0;
	struct source_at at;
	int r, tries = 0;

	pthread_mutex_lock(&s->lock);
again:
	if (!served_locally_locked(b) || b->checked) {
		r = b->state == BLOB_LOCAL;
		pthread_mutex_unlock(&s->lock);
		return r;
	}
	snprintf(key, sizeof(key), "%s", b->key);
	size = b->size;
	source_at_locked(b, &at);
	pthread_mutex_unlock(&s->lock);

	r = check_source_gated(s, key, size, &size_now, sample);
	pthread_mutex_lock(&s->lock);
	/* New attributes seen meanwhile (a reader's stat, source_attrs_locked:
	 * it cleared @checked): the sample may be of the file before them, a
	 * verdict on neither.  Made again on the file as it is now. */
	if (served_locally_locked(b) && b->size == size && source_changed_locked(b, &at)) {
		if (++tries < CHECK_TRIES)
			goto again;
		s->recheck_wanted = 1;
	} else if (served_locally_locked(b) && b->size == size) {
		/* (a new size since demoted it already: source_attrs_locked) */
		source_verdict(r, size, size_now, sample, b->sample, why, sizeof(why));
		if (*why) {
			store_demote_locked(s, b, why, 1);
			part_drop_locked(s, b, why);
		} else if (r < 0) {
			check_unmade_locked(s, b, r);
		} else {
			b->checked = 1;
			if (b->check_err)
				store_log_msg(s, LOG_INFO, "source %s checked: as recorded", b->key);
			b->check_err = 0;
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

int copy_proven_locked(struct store *s, const char *xxh, const struct stat *st,
		       const struct blob *except)
{
	COPY_EACH(s, xxh, o)
		if (o != except && o->state == BLOB_LOCAL && proven_locked(o, st))
			return 1;
	return 0;
}

int copy_shareable_locked(struct store *s, const char *xxh)
{
	char path[PATH_MAX + 64];
	struct stat st;

	snprintf(path, sizeof(path), "%s/%.2s/%s", s->data_dir, xxh, xxh);
	return copy_stat(path, &st) == 0 && copy_proven_locked(s, xxh, &st, NULL);
}

/* Another blob this run proved the file @st under the same name: no
 * second hash of the same bytes (a hub holds a file in several repos). */
static int shared_proof_locked(struct store *s, const struct blob *b, const struct stat *st)
{
	return copy_proven_locked(s, b->xxh, st, b);
}

#define COPY_CHANGED "local copy changed on disk since it was verified (its inode, size, " \
		     "mtime or ctime): NAS bytes from now on"

/* Is @st the file @b's copy (of @copy_gen) was verified as?  0 if so, or
 * if it says nothing (@b not LOCAL now, or of another copy; no identity
 * recorded; a publish of the same bytes in flight; the file a sharer was
 * proven by, which @b is proven by too now); else every LOCAL blob of its
 * bytes is demoted (COPY_CHANGED) and logged: -ESTALE. */
static int copy_identity_locked(struct store *s, struct blob *b, unsigned copy_gen,
				const struct stat *st)
{
	char path[PATH_MAX + 64], xxh[33];

	if (b->state != BLOB_LOCAL || atomic_load(&b->copy_gen) != copy_gen || !b->copy.ino ||
	    proven_locked(b, st) || store_publishing_locked(s, b, b->xxh))
		return 0;
	if (shared_proof_locked(s, b, st) && (uint64_t)st->st_size == b->size) {
		prove_locked(b, st);
		return 0;
	}
	snprintf(xxh, sizeof(xxh), "%s", b->xxh);
	store_local_path_locked(s, b, path, sizeof(path));
	demote_sharers_locked(s, xxh, NULL, COPY_CHANGED);
	store_log_msg(s, LOG_WARNING, "local copy %s of %s (%s) not served: %s; every blob "
		      "it served demoted", path, b->key, b->id, COPY_CHANGED);
	return -ESTALE;
}

int store_copy_opened(struct store *s, struct blob *b, unsigned copy_gen, int fd)
{
	struct stat st;
	int r;

	if (fstat(fd, &st) < 0)
		return 0; /* says nothing of the file */
	pthread_mutex_lock(&s->lock);
	r = copy_identity_locked(s, b, copy_gen, &st);
	pthread_mutex_unlock(&s->lock);
	return r;
}


struct rehash {
	char local[PATH_MAX + 64], key[PATH_MAX], want[33], sample[33];
	uint64_t size;
	struct timespec nas_mtime, nas_ctime; /* the source's attributes when it began */
	struct stat before;
	int r;          /* of the hash: 0, or -errno */
	int moved;      /* the file under the name is another one since */
	int src;        /* of the source check: 0, or -errno (check_source_gated) */
	uint64_t src_size; /* the source's size then */
	char got[33], got_sample[33];
};

/* wfsctl evict while @b was re-hashed: as an eviction. */
static void rehash_evicted_locked(struct store *s, struct blob *b, struct rehash *h)
{
	if (!shared_proof_locked(s, b, &h->before) && !rehash_pending_locked(s, b, b->xxh))
		unlink_if_same(s, h->local, &h->before);
	blob_state_set_locked(s, b, BLOB_NAS);
	blob_xxh_set_locked(s, b, "");
	b->copy.ino = 0;
	b->reason[0] = '\0';
	s->evicted++;
	store_reset_hot_locked(s, b);
	store_dirty_locked(s);
	store_log_msg(s, LOG_INFO, "evicted %s (%s) while its copy was re-hashed", b->key, b->id);
}

/* Why the re-hash in @h does not prove @b's copy, into @why ("" when it
 * does); 1 when the copy itself is bad (not merely its source). */
static int rehash_verdict(const struct blob *b, const struct rehash *h, char *why, size_t len)
{
	*why = '\0';
	if (h->r < 0) {
		snprintf(why, len, "local copy %s", h->r == -ENOENT ? "missing" : "unreadable");
		if (h->r == -ENOENT)
			return 0;
		snprintf(why + strlen(why), len - strlen(why), ": %s", strerror(-h->r));
		return 1;
	}
	if (h->moved) {
		snprintf(why, len, "local copy replaced while it was re-hashed");
		return 0;
	}
	if (strcmp(h->got, h->want)) {
		snprintf(why, len, "local copy corrupt: xxh128 %s, expected %s", h->got, h->want);
		return 1;
	}
	if ((uint64_t)h->before.st_size != b->size)
		snprintf(why, len, "source changed size");
	else /* only positive evidence about the source (see the top) */
		source_verdict(h->src, h->size, h->src_size, h->got_sample, h->sample, why, len);
	return 0;
}

/* The copy is proven again: served locally. */
static void rehash_proven_locked(struct store *s, struct blob *b, struct rehash *h)
{
	prove_locked(b, &h->before);
	/* A source that could not be read now, or that shows new attributes
	 * since, is sampled again before the first local read
	 * (store_check_source); the sweep tries again once the NAS answers. */
	b->checked = h->src == 0 && same_ts(&b->nas_mtime, &h->nas_mtime) &&
		     same_ts(&b->nas_ctime, &h->nas_ctime);
	if (h->src < 0)
		s->recheck_wanted = 1;
	b->reason[0] = '\0';
	store_dirty_locked(s);
	blob_state_set_locked(s, b, BLOB_LOCAL);
	store_landed_locked(s, b);
	store_log_msg(s, LOG_NOTICE, "re-verified local copy of %s (%s): xxh128 %s as recorded; "
		      "served locally again", b->key, b->id, h->want);
}

/* The copy is not proven (@why): @b is served from the NAS, its copy
 * removed unless another blob is served from it (a source that changed
 * leaves the bytes good for the others), and a bad copy demotes every
 * blob that shares it. */
static void rehash_demote_locked(struct store *s, struct blob *b, struct rehash *h,
				 const char *why, int bad_copy)
{
	int removed = 0;

	if (bad_copy)
		demote_sharers_locked(s, h->want, &h->before, why);
	/* (a bad copy goes even so: a blob still to re-hash it finds it gone) */
	if (h->r != -ENOENT && !h->moved && !shared_proof_locked(s, b, &h->before) &&
	    (bad_copy || !rehash_pending_locked(s, b, b->xxh)))
		removed = unlink_if_same(s, h->local, &h->before);
	blob_state_set_locked(s, b, BLOB_NAS);
	blob_xxh_set_locked(s, b, "");
	b->copy.ino = 0;
	snprintf(b->reason, sizeof(b->reason), "%s", why);
	s->demoted++;
	store_reset_hot_locked(s, b);
	store_dirty_locked(s);
	store_log_msg(s, LOG_WARNING, "demoted %s (%s): %s; its copy %s was never served%s", b->key,
		      b->id, why, h->local, removed ? " and is removed" : "");
}

/* Lock held: the re-hash of @b is done (@h); LOCAL again or demoted. */
static void rehash_done_locked(struct store *s, struct blob *b, struct rehash *h)
{
	char why[256];
	int bad_copy;

	/* Stopping (store_close cancels the hash): still unproven, the index
	 * keeps it, the next start-up re-hashes it. */
	if (!b->reverify || s->stop)
		return;
	b->reverify = 0;
	space_release_locked(s, b);
	free(b->tmp);
	b->tmp = NULL;
	if (atomic_load(&b->prog.cancel)) {
		rehash_evicted_locked(s, b, h);
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
	bad_copy = rehash_verdict(b, h, why, sizeof(why));
	if (!*why)
		rehash_proven_locked(s, b, h);
	else
		rehash_demote_locked(s, b, h, why, bad_copy);
	pthread_cond_broadcast(&s->cond); /* settled */
}

void store_reverify_one(struct store *s, struct blob *b)
{
	struct rehash h = { .src = -EAGAIN }; /* not checked: proves nothing */
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
		h.src = check_source_gated(s, h.key, h.size, &h.src_size, h.got_sample);

	pthread_mutex_lock(&s->lock);
	rehash_done_locked(s, b, &h);
	pthread_mutex_unlock(&s->lock);
}

int store_verify(struct store *s, struct blob *b, int full, char *reason, size_t rsz)
{
	char local[PATH_MAX + 64], xxh[33], want[33];
	int r, demoted = 0, unchecked;
	unsigned gen;
	struct stat before, after;

	pthread_mutex_lock(&s->lock);
	if (b->state != BLOB_LOCAL) {
		pthread_mutex_unlock(&s->lock);
		return 0;
	}
	b->checked = 0;
	gen = blob_copy_gen(b); /* the copy hashed below, if still this one */
	snprintf(want, sizeof(want), "%s", b->xxh);
	store_local_path_locked(s, b, local, sizeof(local));
	pthread_mutex_unlock(&s->lock);

	if (!store_check_source(s, b)) {
		pthread_mutex_lock(&s->lock);
		snprintf(reason, rsz, "%s", b->reason);
		pthread_mutex_unlock(&s->lock);
		return 1;
	}
	/* a check the NAS could not answer: said, and the copy kept */
	pthread_mutex_lock(&s->lock);
	unchecked = b->state == BLOB_LOCAL && !b->checked ? b->check_err : 0;
	if (unchecked)
		snprintf(reason, rsz, "source not checked: %s; the verified copy keeps serving",
			 unchecked == -EHOSTDOWN ? "the NAS is down" :
			 nas_err_why(unchecked));
	pthread_mutex_unlock(&s->lock);
	if (copy_stat(local, &before) < 0)
		before.st_ino = 0; /* gone: the hash below says so (ENOENT) */
	if (!full) {
		/* the copy still the file verified: else it is not served
		 * (as at an open), and the full hash would be what vouches */
		pthread_mutex_lock(&s->lock);
		if (before.st_ino && copy_identity_locked(s, b, gen, &before) < 0) {
			snprintf(reason, rsz, "%s", COPY_CHANGED);
			demoted = 1;
		}
		pthread_mutex_unlock(&s->lock);
		return demoted ? 1 : unchecked;
	}
	r = fetch_hash_file(local, xxh, NULL);
	if (r == 0 && (copy_stat(local, &after) < 0 || !before.st_ino || !same_file(&before, &after)))
		before.st_ino = 0; /* written to as it was hashed: proves no identity */
	pthread_mutex_lock(&s->lock);
	/* Hashed whole and right: this file is what the copy's identity is
	 * now, for every blob it serves (touched, say, since it was verified:
	 * an open would not serve it otherwise). */
	if (b->state == BLOB_LOCAL && blob_copy_gen(b) == gen && r == 0 && !strcmp(xxh, want) &&
	    before.st_ino && (uint64_t)before.st_size == b->size) {
		prove_sharers_locked(s, b, &before);
		store_dirty_locked(s);
	}
	/* a verdict on this copy only: one evicted meanwhile may be gone
	 * (ENOENT) while the copy made again since serves, good */
	if (b->state == BLOB_LOCAL && blob_copy_gen(b) == gen && (r < 0 || strcmp(xxh, want))) {
		if (r < 0)
			snprintf(reason, rsz, "local copy unreadable: %s", strerror(-r));
		else
			snprintf(reason, rsz, "local copy corrupt: xxh128 %s, expected %s", xxh, want);
		/* the same file serves every blob of that content */
		demote_sharers_locked(s, want, NULL, reason);
		demoted = 1;
	}
	pthread_mutex_unlock(&s->lock);
	return demoted ? 1 : unchecked;
}
