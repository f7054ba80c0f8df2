/* store_copy.c - the promotion queue and its workers: a queued blob is
 * copied by fetch_copy_verify() (fetch.c: the copy, the hashes, the re-read
 * from disk, the content address), renamed into data/, and only then made
 * LOCAL (verify_record_locked, store_verify.c).  A blob whose content
 * address and size are a local blob's is hashed first without a copy
 * (adopt_one): the same bytes share that copy and take no new room.  See
 * store.h.
 *
 * A copy that fails leaves the blob on the NAS: its temporary file is
 * removed (fetch.c, and here when the publish fails), its state FAILED with
 * the reason (the path, the offset where the NAS read failed, the error),
 * a NAS error is reported to the gate, and the backoff starts (store.h,
 * enum store_who).  The worker holds no store lock while it copies: a NAS
 * read that hangs holds the worker and its reservation, nothing else.
 *
 * A copy reads the file it opened.  If the store sees new attributes of
 * the source meanwhile (a reader's stat or open after the NAS rewrote the
 * file, or renamed another over it), the copy may hold the old bytes, or
 * some of each: it is not made LOCAL, and its file leaves data/ (FAILED,
 * "source changed during the copy"; copied again when asked).  The store
 * stops such a copy as soon as it sees the new attributes (COPY_STOP_SOURCE,
 * store_int.h): the rest of a large file is not read for nothing.
 */
#include "store.h"
#include "store_int.h"
#include "durable.h"
#include "fetch_range.h"
#include "nasgate.h"
#include "path.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

/* ---- the queue ---- */

/* The queue is doubly linked and keeps its last explicit entry: queueing
 * and unqueueing are O(1) under the lock.  (A walk past every explicit
 * entry to place the next made a promote of 40,000 blobs take 11 s of
 * lock-held walking.) */
void store_unqueue_locked(struct store *s, struct blob *b)
{
	if (!b->in_queue)
		return;
	if (s->qexplicit == b)
		s->qexplicit = b->qprev; /* explicit entries are a prefix */
	if (b->qprev)
		b->qprev->qnext = b->qnext;
	else
		s->qhead = b->qnext;
	if (b->qnext)
		b->qnext->qprev = b->qprev;
	else
		s->qtail = b->qprev;
	b->qnext = b->qprev = NULL;
	b->in_queue = 0;
}

/* Link @b after @at (NULL: at the head). */
static void queue_insert_locked(struct store *s, struct blob *at, struct blob *b)
{
	b->qprev = at;
	b->qnext = at ? at->qnext : s->qhead;
	if (b->qnext)
		b->qnext->qprev = b;
	else
		s->qtail = b;
	if (at)
		at->qnext = b;
	else
		s->qhead = b;
}

void store_enqueue_locked(struct store *s, struct blob *b)
{
	store_unqueue_locked(s, b);
	if (b->explicit_req) { /* after the explicit ones, before the first automatic */
		queue_insert_locked(s, s->qexplicit, b);
		s->qexplicit = b;
	} else {
		queue_insert_locked(s, s->qtail, b);
	}
	b->in_queue = 1;
	pthread_cond_broadcast(&s->cond);
}

/* (its end, or an explicit request, frees it: store_free_auto_slot_locked) */
static void take_auto_slot_locked(struct store *s, struct blob *b, int auto_copy)
{
	b->auto_slot = auto_copy;
	s->auto_running += auto_copy;
}

/* The next copy to make: explicit requests first; an automatic one only
 * while fewer than auto_max automatic copies run, so one worker is always
 * free for what an operator asks.  None while the NAS is down: the queue
 * waits for it (*@held set), as the copies under way do, rather than
 * failing what an operator asked for. */
static struct blob *dequeue_locked(struct store *s, int *held)
{
	struct blob *b;

	*held = 0;
	while ((b = s->qhead) && b->state != BLOB_QUEUED)
		store_unqueue_locked(s, b); /* cancelled while queued */
	if (!b)
		return NULL;
	if (!nas_gate_up(s->opt.gate)) {
		*held = 1;
		s->queue_held++;
		return NULL;
	}
	if (!b->explicit_req && s->auto_running >= s->auto_max)
		return NULL;
	store_unqueue_locked(s, b);
	return b;
}

/* @b's copy did not start: the NAS went down between the queue and the
 * copy.  Back in the queue, which waits for the NAS (dequeue_locked):
 * returns 1.  Evicted meanwhile, or the store closing: 0, and *@r is
 * -ECANCELED -- it ends as a cancelled copy does, not as one the NAS
 * failed (FAILED, counted, backed off: for a blob the operator evicted).
 * New attributes of the source meanwhile are no reason not to copy it:
 * nothing of it was read, and the copy made later reads the file then. */
static int requeue_locked(struct store *s, struct blob *b, int *r)
{
	int src = COPY_STOP_SOURCE;

	atomic_compare_exchange_strong(&b->prog.cancel, &src, COPY_GO);
	if (atomic_load(&b->prog.cancel) || s->stop) {
		*r = -ECANCELED;
		return 0;
	}
	blob_state_set_locked(s, b, BLOB_QUEUED);
	store_enqueue_locked(s, b);
	return 1;
}

/* Rename the verified copy @tmp into data/ (@keep: made as a link of
 * @keep first); the rename is durable (the directory fsynced, and data/
 * too when the directory is new: its entry is data/'s) before the index
 * may name it.  Mode 0400 under 0700
 * directories: only the daemon reads copies (a NAS file readable by root
 * alone stays so).  A file already under that name is replaced, never
 * trusted: it may be one the index could not prove (store_verify.c) --
 * unless a LOCAL blob's proof holds for it (the same bytes, verified):
 * then @b shares it and @tmp goes, for a reader of that file would keep
 * the replaced blocks, counted nowhere. */
static int publish(struct store *s, const char *tmp, const char *xxh, const char *keep,
		   struct blob *b)
{
	char dir[PATH_MAX + 16], dst[PATH_MAX + 64];
	struct stat st;
	int r;

	snprintf(dir, sizeof(dir), "%s/%.2s", s->data_dir, xxh);
	if (mkdir(dir, 0700) == 0) {
		if ((r = durable_fsync_dir(s->data_dir)) < 0)
			return r;
	} else if (errno != EEXIST) {
		return -errno;
	}
	snprintf(dst, sizeof(dst), "%s/%s", dir, xxh);
	if (keep && link(keep, tmp) < 0)
		return -errno;
	if (chmod(tmp, 0400) < 0) {
		r = -errno;
	} else {
		/* @b's copy (the caller holds no lock): the name is @b's from
		 * the rename on, for whoever takes the lock next
		 * (store_publishing_locked) */
		if (b)
			pthread_mutex_lock(&s->lock);
		if (b && lstat(dst, &st) == 0 && copy_proven_locked(s, xxh, &st, NULL))
			r = unlink(tmp) < 0 ? -errno : 0;
		else
			r = rename(tmp, dst) < 0 ? -errno : 0;
		if (b && r == 0) {
			s->pub_xxh_n += !b->pub_xxh[0];
			snprintf(b->pub_xxh, sizeof(b->pub_xxh), "%s", xxh);
		}
		if (b)
			pthread_mutex_unlock(&s->lock);
	}
	if (r < 0) {
		if (keep)
			unlink(tmp);
		return r;
	}
	return durable_fsync_dir(dir);
}

int store_publish(struct store *s, const char *tmp, const char *xxh)
{
	return publish(s, tmp, xxh, NULL, NULL);
}

/* A link made in tmp/ and renamed into data/: link(2) cannot replace a
 * file there as the rename does; a crash in between leaves a name in tmp/,
 * which start-up empties. */
int store_publish_link_locked(struct store *s, const char *path, const char *xxh)
{
	char tmp[PATH_MAX + 64];

	snprintf(tmp, sizeof(tmp), "%s/%llu.%d.link", s->tmp_dir,
		 (unsigned long long)++s->tmp_serial, (int)getpid());
	return publish(s, tmp, xxh, path, NULL);
}

uint64_t store_copy_rate(struct store *s, int auto_copy)
{
	const struct policy_opts *pol = s->opt.policy;
	uint64_t total = atomic_load_explicit(&s->bw_limit, memory_order_relaxed);
	/* promote_mbps: the workers' copies, automatic or not, and the range
	 * worker's may all run at once */
	uint64_t share = policy_share(total, s->opt.workers + 1), auto_share;

	if (!auto_copy || !pol || !pol->auto_bw)
		return share;
	auto_share = policy_share(pol->auto_bw, s->auto_max);
	return share && share < auto_share ? share : auto_share;
}

/* The copy of @b renamed into data/ as @xxh does not serve (its source
 * changed while it was made): its file goes, unless a LOCAL blob is served
 * from that name -- the publish replaced their file with this one, of the
 * same bytes (one file per content hash), so it is what proves them now --
 * or a blob's start-up re-hash is still to come: it hashes this file, of
 * its bytes, in place of the one replaced (removed, its copy was lost). */
static void unpublish_locked(struct store *s, struct blob *b, const char *xxh)
{
	char path[PATH_MAX + 64];
	struct stat st;
	int shared = 0;

	snprintf(path, sizeof(path), "%s/%.2s/%s", s->data_dir, xxh, xxh);
	if (lstat(path, &st) < 0 || !S_ISREG(st.st_mode))
		return;
	COPY_EACH(s, xxh, o)
		if (o != b && o->state == BLOB_LOCAL) {
			file_proof_take(&o->copy, &st);
			shared = 1;
		}
	if (shared)
		store_dirty_locked(s);
	else if (store_publishing_locked(s, b, xxh))
		return; /* another copy of these bytes, renamed in since: its file */
	else if (rehash_pending_locked(s, b, xxh))
		return;
	else if (store_kept_copy(s, xxh))
		return; /* the kept index's (store.h: kept): the same bytes */
	else if (unlink(path) < 0)
		store_log_msg(s, LOG_WARNING, "cannot remove %s: %s", path, strerror(errno));
}

/* @b did not fit.  A ref pin asks for its revision's blobs at every poll
 * of the ref: its next try waits for the backoff a failure starts, and
 * the store makes it when that passes (a poll before is not one). */
static void pin_backoff_locked(struct store *s, struct blob *b)
{
	if (b->who == STORE_BY_PIN)
		store_backoff_locked(s, b);
}

static void copy_done_locked(struct store *s, struct blob *b, int r, uint64_t size,
			     const struct source_at *at, const struct fetch_result *res,
			     const char *key, const char *id)
{
	/* stopped because the source showed new attributes (store.c) */
	int stopped = r == -ECANCELED && atomic_load(&b->prog.cancel) == COPY_STOP_SOURCE;
	/* A verdict on bytes read before the NAS showed new attributes is one
	 * on the old file: a copy that ended well is not used, and a content
	 * mismatch is not flagged (the flag would outlive the file it was
	 * about: nothing but new attributes clears it, and they came first). */
	int changed = stopped || ((r == 0 || r == -EBADMSG) &&
				  (b->size != size || source_changed_locked(b, at)));

	if (r == 0 && !changed) {
		verify_record_locked(s, b, res, 1);
		atomic_store_explicit(&b->use_ns, store_now_ns(), memory_order_relaxed);
		store_made_local_locked(s, b);
		store_log_msg(s, LOG_INFO, "verified %s (%s): local copy %s", key, id, res->xxh);
		return;
	}
	if (changed && r == 0)
		unpublish_locked(s, b, res->xxh);
	store_reset_hot_locked(s, b);
	if (r == -ECANCELED && !stopped) {
		blob_state_set_locked(s, b, BLOB_NAS);
		snprintf(b->reason, sizeof(b->reason), "copy cancelled");
		s->cancelled++;
		store_log_msg(s, LOG_INFO, "promotion of %s cancelled", key);
	} else if (r == -EBADMSG && !changed) {
		blob_state_set_locked(s, b, BLOB_MISMATCH);
		snprintf(b->reason, sizeof(b->reason), "%s", res->reason);
		s->mismatches++;
		store_dirty_locked(s); /* the index keeps the flag */
		store_log_msg(s, LOG_ERR, "MISMATCH %s: %s; not promoted, served from the NAS", key,
			  res->reason);
	} else if (r == -ENOSPC || r == -EDQUOT) {
		/* Someone else filled the disk under us: not the blob's fault. */
		blob_state_set_locked(s, b, BLOB_NAS);
		b->hold = HOLD_NO_ROOM;
		snprintf(b->reason, sizeof(b->reason), "no room: %s",
			 res->reason[0] ? res->reason : strerror(-r));
		s->failed_by[STORE_FAIL_NO_SPACE]++;
		s->no_room++;
		pin_backoff_locked(s, b);
		store_log_msg(s, LOG_WARNING, "promotion of %s stopped: %s; served from the NAS", key,
			  b->reason);
	} else {
		blob_state_set_locked(s, b, BLOB_FAILED);
		if (changed && b->size != size)
			snprintf(b->reason, sizeof(b->reason), "source size changed during copy%s",
				 stopped ? ": the copy was stopped" : "");
		else if (stopped)
			snprintf(b->reason, sizeof(b->reason), "source changed during the copy (the "
				 "NAS shows a new mtime or ctime): the copy was stopped after %llu "
				 "of %llu bytes", (unsigned long long)atomic_load(&b->prog.bytes_done),
				 (unsigned long long)size);
		else if (r == 0)
			snprintf(b->reason, sizeof(b->reason), "source changed during the copy (the "
				 "NAS shows a new mtime or ctime): the copy may hold the old bytes "
				 "and is not used");
		else if (changed)
			snprintf(b->reason, sizeof(b->reason), "source changed during the copy (the "
				 "NAS shows a new mtime or ctime): the bytes read did not match "
				 "its content address (%s), the new file was not read", res->reason);
		else
			snprintf(b->reason, sizeof(b->reason), "%s",
				 res->reason[0] ? res->reason : strerror(-r));
		s->failed++;
		s->failed_by[changed || r == -ESTALE ? STORE_FAIL_SOURCE_CHANGED :
			     r == -EIO ? STORE_FAIL_IO : STORE_FAIL_OTHER]++;
		store_backoff_locked(s, b);
		if (store_retry_wanted_locked(s, b))
			store_log_msg(s, LOG_WARNING, "promotion of %s failed: %s; served from the "
				      "NAS, tried again in %lld s (failure %u in a row)", key,
				      b->reason, (long long)(b->retry_at_ms - store_now_ms() + 999) / 1000,
				      b->fail_count);
		else
			store_log_msg(s, LOG_WARNING, "promotion of %s failed: %s; served from the "
				      "NAS", key, b->reason);
	}
}

/* The gate knows the NAS is down (since the queue gave this copy out): a
 * copy now would fail, or hang in a read.  Returns 1 with @res's reason
 * then -- not started: the caller puts it back in the queue, which waits
 * for the NAS -- else 0, the copy counted as started (not before: a copy
 * that meets the NAS down is not one).  No store lock held. */
static int nas_down_at_start(struct store *s, const char *key, struct fetch_result *res)
{
	if (!nas_gate_up(s->opt.gate)) {
		snprintf(res->reason, sizeof(res->reason), "cannot copy %s: the NAS is down", key);
		return 1;
	}
	s->started++;
	return 0;
}

/* @b's bytes look local already (copy_of_name_locked): hash the NAS
 * file without writing it, and if its XXH3-128 is a local copy's, @b is
 * served by that copy -- it takes no new room, not even while hashed
 * (nothing reserved, nothing in tmp/).  Every check a copy gets but the
 * re-read (the copy it shares was re-read when it was made): the whole
 * source hashed, its content address, its size throughout, its sample.
 * Returns 1 when @b is done with (LOCAL, or failed as a copy fails), 0
 * when a copy is to be made after all (that copy went meanwhile, changed
 * on disk since it was verified, or other bytes).  Called and returns with
 * the lock held. */
static int adopt_one(struct store *s, struct blob *b)
{
	char key[PATH_MAX], id[NAME_MAX + 1];
	int auto_copy = !b->explicit_req, not_started = 0, r;
	struct fetch_result res;
	struct source_at at;
	uint64_t size = b->size, rate;

	snprintf(key, sizeof(key), "%s", b->key);
	snprintf(id, sizeof(id), "%s", b->id);
	source_at_locked(b, &at); /* what the hash below vouches for */
	blob_state_set_locked(s, b, BLOB_COPYING);
	take_auto_slot_locked(s, b, auto_copy);
	rate = store_copy_rate(s, auto_copy);
	pthread_mutex_unlock(&s->lock);

	memset(&res, 0, sizeof(res));
	if ((not_started = nas_down_at_start(s, key, &res))) {
		r = -EHOSTDOWN;
	} else {
		store_log_msg(s, LOG_INFO, "promoting %s (%s, %llu bytes%s): a local copy has its "
			      "name, hashing the NAS file to share it", key, id,
			      (unsigned long long)size, auto_copy ? ", automatic" : "");
		r = fetch_hash_source(key, size, id, rate, &b->prog, &res);
		if (res.src_err)
			nas_gate_note(s->opt.gate, res.src_err);
	}

	pthread_mutex_lock(&s->lock);
	store_free_auto_slot_locked(s, b);
	if (not_started && requeue_locked(s, b, &r))
		return 1;
	if (r == 0 && atomic_load(&b->prog.cancel)) {
		r = -ECANCELED; /* evicted or stale while hashed: nothing to undo */
	} else if (r == 0 && !copy_shareable_locked(s, res.xxh)) {
		if (copy_served_by_other_locked(s, NULL, res.xxh))
			store_log_msg(s, LOG_WARNING, "promoting %s (%s): the local copy of its "
				      "bytes (%s) changed on disk since it was verified; copying "
				      "it anew", key, id, res.xxh);
		else
			store_log_msg(s, LOG_INFO, "promoting %s (%s): no local copy has its "
				      "bytes (%s) now; copying it", key, id, res.xxh);
		blob_state_set_locked(s, b, BLOB_QUEUED);
		atomic_store(&b->prog.bytes_done, 0);
		return 0;
	}
	copy_done_locked(s, b, r, size, &at, &res, key, id);
	return 1;
}

/* Called and returns with the lock held.  *@paid: set to when the next
 * copy may start, when this one ran ahead of its cap. */
static void copy_one(struct store *s, struct blob *b, int64_t *paid)
{
	char key[PATH_MAX], id[NAME_MAX + 1], tmp[PATH_MAX + 64], why[256];
	int auto_copy = !b->explicit_req, evicted = 0, not_started = 0, r;
	struct fetch_result res;
	struct source_at at;
	uint64_t size, rate;

	if (copy_of_name_locked(s, b) && adopt_one(s, b)) {
		if (b->state == BLOB_LOCAL)
			part_retire_locked(s, b, 0);
		return;
	}
	auto_copy = !b->explicit_req; /* asked for while it was hashed */
	snprintf(key, sizeof(key), "%s", b->key);
	snprintf(id, sizeof(id), "%s", b->id);
	size = b->size;
	source_at_locked(b, &at);
	if (space_reserve_locked(s, b, store_charge(s, b->size), &b->reserved, why, sizeof(why),
				 &evicted) < 0) {
		blob_state_set_locked(s, b, BLOB_NAS);
		b->hold = HOLD_NO_ROOM;
		snprintf(b->reason, sizeof(b->reason), "%s", why);
		s->no_room++;
		store_reset_hot_locked(s, b); /* hot again later: tried again then */
		pin_backoff_locked(s, b);
		store_log_msg(s, LOG_NOTICE, "not promoting %s (%s): %s; served from the NAS", key,
			  id, why);
		return;
	}
	snprintf(tmp, sizeof(tmp), "%s/%llu.%d.part", s->tmp_dir,
		 (unsigned long long)++s->tmp_serial, (int)getpid());
	b->tmp = strdup(tmp);
	blob_state_set_locked(s, b, BLOB_COPYING);
	take_auto_slot_locked(s, b, auto_copy);
	rate = store_copy_rate(s, auto_copy);
	pthread_mutex_unlock(&s->lock);

	/* Evicted copies are gone from data/ already: the index must stop
	 * naming them before this copy can be named in their place. */
	if (evicted)
		store_write_index(s);
	memset(&res, 0, sizeof(res));
	if ((not_started = nas_down_at_start(s, key, &res))) {
		r = -EHOSTDOWN;
	} else {
		store_log_msg(s, LOG_INFO, "promoting %s (%s, %llu bytes%s)", key, id,
			      (unsigned long long)size, auto_copy ? ", automatic" : "");
		r = fetch_copy_verify(key, size, tmp, id, rate, &b->prog, &res);
		*paid = store_owed_until(res.owed_ns);
		if (r == 0 && (r = publish(s, tmp, res.xxh, NULL, b)) < 0)
			snprintf(res.reason, sizeof(res.reason), "cannot move the verified copy "
				 "into %s/%.2s/%s: %s", s->data_dir, res.xxh, res.xxh, strerror(-r));
		/* a partial copy never serves: never left behind either */
		if (r < 0)
			unlink(tmp);
		/* what the NAS did to this copy counts for its state (no
		 * store lock held: the gate's lock is a leaf) */
		if (res.src_err)
			nas_gate_note(s->opt.gate, res.src_err);
	}

	pthread_mutex_lock(&s->lock);
	space_release_locked(s, b);
	free(b->tmp);
	b->tmp = NULL;
	store_free_auto_slot_locked(s, b);
	if (not_started && requeue_locked(s, b, &r))
		return;
	/* renamed into data/, then its directory's fsync failed: not a copy
	 * the index may name, so its file goes (unless another's) */
	if (r < 0 && b->pub_xxh[0])
		unpublish_locked(s, b, b->pub_xxh);
	s->pub_xxh_n -= b->pub_xxh[0] != '\0';
	b->pub_xxh[0] = '\0';
	copy_done_locked(s, b, r, size, &at, &res, key, id);
	/* wfsctl evict came after the copy last looked at the cancel flag:
	 * the operator was told it went to the NAS, so it goes, as a local
	 * copy evicted then would (its file kept if another blob shares it,
	 * its space held while open).  Not when stopping: store_close sets
	 * the flag too, and a verified copy is kept then. */
	if (b->state == BLOB_LOCAL && atomic_load(&b->prog.cancel) == COPY_STOP && !s->stop) {
		store_demote_locked(s, b, "evicted as its copy ended", 0);
		return;
	}
	/* whole now: its ranges are in the copy (their file goes once the
	 * index says so) */
	if (b->state == BLOB_LOCAL)
		part_retire_locked(s, b, 0);
}

/* How long the index may stay dirty in a batch: INDEX_FLUSH_MS, or ten
 * times what its last write took (so a worker spends at most a tenth of
 * its time writing an index of many blobs, not all of it). */
static int64_t index_flush_ms(struct store *s)
{
	int64_t took = atomic_load_explicit(&s->index_write_ms, memory_order_relaxed);

	return took * 10 > INDEX_FLUSH_MS ? took * 10 : INDEX_FLUSH_MS;
}

/* When a worker writes the index (store.h): at the end of a batch of
 * copies, or once it has been dirty for index_flush_ms. */
static int index_due_locked(struct store *s, int idle)
{
	return s->index_dirty && ((idle && s->copies_unrecorded) ||
				  store_now_ms() - s->dirty_since_ms >= index_flush_ms(s));
}

int64_t store_owed_until(uint64_t owed_ns)
{
	return owed_ns ? store_now_ms() + (int64_t)((owed_ns + 999999) / 1000000) : 0;
}

int store_owed_wait_locked(struct store *s, pthread_cond_t *cond, int64_t *until)
{
	struct timespec ts;

	if (*until <= 0 || store_now_ms() >= *until) {
		*until = 0;
		return 0;
	}
	ts = mono_timespec(*until);
	pthread_cond_timedwait(cond, &s->lock, &ts);
	return 1;
}

void *store_worker(void *arg)
{
	struct store *s = arg;
	int64_t paid = 0; /* the cap's time for its last copy (store_owed_until) */

	pthread_setname_np(pthread_self(), "wfs-copy");
	pthread_mutex_lock(&s->lock);
	while (!s->stop) {
		int held = 0;
		int index_now = index_due_locked(s, 0);
		struct blob *b;
		int64_t due = -1;

		if (!index_now && store_owed_wait_locked(s, &s->cond, &paid))
			continue;
		b = index_now ? NULL : dequeue_locked(s, &held);

		/* A blob taken from the queue is copied: the index waits for
		 * the next turn.  (It was checked again here with the blob in
		 * hand, and a flush falling due between the two checks dropped
		 * the blob -- QUEUED in no queue, its promote --wait waiting
		 * for ever.) */
		if (!b && index_due_locked(s, 1)) {
			pthread_mutex_unlock(&s->lock);
			store_write_index(s);
			pthread_mutex_lock(&s->lock);
			continue;
		}
		if (!b && s->index_dirty)
			due = s->dirty_since_ms + index_flush_ms(s);
		if (!b && held && (due < 0 || due > store_now_ms() + STORE_QUEUE_LOOK_MS))
			due = store_now_ms() + STORE_QUEUE_LOOK_MS;
		if (!b && due >= 0) {
			struct timespec ts;

			ts = mono_timespec(due);
			pthread_cond_timedwait(&s->cond, &s->lock, &ts);
			continue;
		}
		if (!b) {
			pthread_cond_wait(&s->cond, &s->lock);
			continue;
		}
		copy_one(s, b, &paid);
		/* a settled blob (store_wait_settled), an automatic slot free */
		pthread_cond_broadcast(&s->cond);
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

