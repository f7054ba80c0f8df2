/* store.c - the top of the store, what the layers above call: blobs by
 * NAS path (store_blob), the daemon's hooks (open, read, close) and the
 * hot list they feed, requests (promote, evict, pin, exclude, sync), the
 * ref records kept for pins.c, life cycle.  Built on the other store
 * files (store_int.h has their order); see store.h for the rules.
 */
#include "store.h"
#include "store_int.h"
#include "nasgate.h"
#include "path.h"
#include "stopby.h"
#include "thread.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <syslog.h>
#include <unistd.h>

/* ---- the table ---- */

/* A copy of @b's source in flight, whole or a range, was begun under the
 * attributes just replaced: it can only end unused (store_copy.c,
 * store_part_copy.c), so it stops now rather than after reading the rest
 * of the file -- minutes for a large shard.  An evict or a close that
 * stopped it already keeps its own reason. */
static void stop_stale_copies_locked(struct blob *b)
{
	int go = COPY_GO;

	/* (a re-hash of a loaded copy is COPYING too: its own checks follow,
	 * the source's sample before it serves) */
	if (b->state == BLOB_COPYING && !b->reverify)
		atomic_compare_exchange_strong(&b->prog.cancel, &go, COPY_STOP_SOURCE);
	go = COPY_GO;
	if (b->part && b->part->copying)
		atomic_compare_exchange_strong(&b->part->prog.cancel, &go, COPY_STOP_SOURCE);
}

/* The NAS shows @st for @b's source: new attributes mean a re-check
 * before the next local read (a new size, a demotion).  Returns 1 if they
 * were new. */
static int source_attrs_locked(struct store *s, struct blob *b, const struct stat *st)
{
	if (b->size == (uint64_t)st->st_size && same_ts(&b->nas_mtime, &st->st_mtim) &&
	    same_ts(&b->nas_ctime, &st->st_ctim))
		return 0;
	if (b->size != (uint64_t)st->st_size) {
		store_demote_locked(s, b, "source size changed", 1);
		part_drop_locked(s, b, "source size changed");
	}
	/* A LOCAL blob's source is sampled before its copy serves again (a
	 * change demotes it); nothing looks at this one's: what was read of
	 * it before (an evicted copy still open, the NAS file an open passed
	 * through) may not be its bytes now. */
	if (b->state != BLOB_LOCAL)
		atomic_fetch_add_explicit(&b->bytes_gen, 1, memory_order_release);
	atomic_store_explicit(&b->size, (uint64_t)st->st_size, memory_order_release);
	b->nas_mtime = st->st_mtim;
	b->nas_ctime = st->st_ctim;
	b->checked = 0;
	if (b->state == BLOB_MISMATCH) {
		/* The flag was of the bytes it had then (a bad rsync, say); a
		 * new file there (re-downloaded) is checked afresh by its next
		 * copy, which flags it again if it is still wrong. */
		blob_state_set_locked(s, b, BLOB_NAS);
		b->reason[0] = '\0';
		store_log_msg(s, LOG_NOTICE, "%s: the NAS shows new attributes: its mismatch "
			      "flag is dropped; its next promotion checks it again", b->key);
	}
	stop_stale_copies_locked(b);
	store_dirty_locked(s);
	return 1;
}

void store_source_attrs(struct store *s, struct blob *b, const struct stat *st)
{
	pthread_mutex_lock(&s->lock);
	source_attrs_locked(s, b, st);
	pthread_mutex_unlock(&s->lock);
}

struct blob *store_blob(struct store *s, const char *key, const struct stat *st, const char *id)
{
	struct blob *b;

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
		source_attrs_locked(s, b, st);
	}
	if (id && *id && (!b->id[0] || (hub_id_kind(id) && !hub_id_kind(b->id))))
		blob_id_set_locked(s, b, id);
	pthread_mutex_unlock(&s->lock);
	return b;
}

enum blob_state store_wait_settled(struct store *s, struct blob *b, int64_t timeout_ms)
{
	int64_t deadline = store_now_ms() + timeout_ms;
	enum blob_state st;
	struct timespec ts;

	ts = mono_timespec(deadline);
	pthread_mutex_lock(&s->lock);
	/* every copy that ends broadcasts s->cond */
	while (((st = b->state) == BLOB_QUEUED || st == BLOB_COPYING) &&
	       store_now_ms() < deadline)
		pthread_cond_timedwait(&s->cond, &s->lock, &ts);
	pthread_mutex_unlock(&s->lock);
	return st;
}

/* ---- the hot list: blobs the reads made hot, for the policy ---- */

static void hot_locked(struct store *s, struct blob *b)
{
	atomic_store_explicit(&b->hot, 1, memory_order_relaxed);
	if (b->hot_listed || (b->state != BLOB_NAS && b->state != BLOB_FAILED) ||
	    b->hold == HOLD_EXCLUDED)
		return;
	b->hot_listed = 1;
	b->hot_next = NULL;
	if (s->hot_tail)
		s->hot_tail->hot_next = b;
	else
		s->hot_head = b;
	s->hot_tail = b;
	pthread_cond_broadcast(&s->hot_cond);
}

void store_mark_hot(struct store *s, struct blob *b)
{
	(void)s;
	atomic_store_explicit(&b->hot, 1, memory_order_relaxed);
}

struct blob *store_wait_hot(struct store *s, int64_t deadline_ms)
{
	struct blob *b = NULL;
	struct timespec ts;

	ts = mono_timespec(deadline_ms);
	pthread_mutex_lock(&s->lock);
	while (!s->stop && !s->hot_head && !s->hot_woken &&
	       (deadline_ms < 0 || store_now_ms() < deadline_ms)) {
		if (deadline_ms < 0)
			pthread_cond_wait(&s->hot_cond, &s->lock);
		else
			pthread_cond_timedwait(&s->hot_cond, &s->lock, &ts);
	}
	s->hot_woken = 0;
	if (!s->stop && (b = s->hot_head)) {
		s->hot_head = b->hot_next;
		if (!s->hot_head)
			s->hot_tail = NULL;
		b->hot_next = NULL;
		b->hot_listed = 0;
	}
	pthread_mutex_unlock(&s->lock);
	return b;
}

void store_wake_hot(struct store *s)
{
	pthread_mutex_lock(&s->lock);
	store_wake_hot_locked(s);
	pthread_mutex_unlock(&s->lock);
}

int store_take_ref_landed(struct store *s)
{
	int r;

	pthread_mutex_lock(&s->lock);
	r = s->ref_landed;
	s->ref_landed = 0;
	pthread_mutex_unlock(&s->lock);
	return r;
}

/* ---- the daemon's hooks ---- */

/* Keep @rel as @b's name when it has none, or a snapshot name for one that
 * is not: the exclusion globs and the shard rule look at it, and the
 * record walks the repo it names (a blob of a hub-level store is in no
 * repo by its key).  A local blob's new name goes into the index. */
static void name_locked(struct store *s, struct blob *b, const char *rel)
{
	char *n;

	if (!rel || !*rel ||
	    (b->name && (hub_is_snapshot_name(b->name) || !hub_is_snapshot_name(rel))))
		return;
	n = strdup(rel);
	if (!n)
		return; /* a name is a hint: none kept is no error */
	free(b->name);
	b->name = n;
	store_copies_moved_locked(s);
	if (b->state == BLOB_LOCAL || b->part)
		store_dirty_locked(s);
}

void store_note_name(struct store *s, struct blob *b, const char *rel)
{
	pthread_mutex_lock(&s->lock);
	name_locked(s, b, rel);
	pthread_mutex_unlock(&s->lock);
}

void store_note_open(struct store *s, struct blob *b, const char *rel)
{
	const struct policy_opts *pol = s->opt.policy;
	uint64_t now = store_now_ns();

	pthread_mutex_lock(&s->lock);
	b->open_count++;
	atomic_fetch_add_explicit(&b->opens, 1, memory_order_relaxed);
	atomic_store_explicit(&b->use_ns, now, memory_order_relaxed);
	b->last_used = (int64_t)(now / 1000000000u);
	name_locked(s, b, rel);
	if (b->state != BLOB_LOCAL) {
		uint64_t opens = atomic_fetch_add(&b->nas_opens, 1) + 1;

		if (pol && pol->auto_on && !b->hot &&
		    policy_is_hot(pol, b->size, b->nas_bytes - b->hot_bytes, opens - b->hot_opens))
			hot_locked(s, b);
	}
	pthread_mutex_unlock(&s->lock);
}

void store_note_read(struct store *s, struct blob *b, uint64_t bytes, int local)
{
	const struct policy_opts *pol = s->opt.policy;
	uint64_t n, size, base;

	if (local) {
		atomic_fetch_add_explicit(&b->local_bytes, bytes, memory_order_relaxed);
		atomic_store_explicit(&b->use_ns, store_now_ns(), memory_order_relaxed);
		return;
	}
	n = atomic_fetch_add_explicit(&b->nas_bytes, bytes, memory_order_relaxed) + bytes;
	if (!pol || !pol->auto_on || atomic_load_explicit(&b->hot, memory_order_relaxed))
		return;
	/* A first look without the lock: most reads are far from the mark. */
	size = atomic_load_explicit(&b->size, memory_order_relaxed);
	base = atomic_load_explicit(&b->hot_bytes, memory_order_relaxed);
	if (!policy_is_hot(pol, size, n - base, 0))
		return;
	pthread_mutex_lock(&s->lock);
	if (!b->hot && policy_is_hot(pol, b->size, b->nas_bytes - b->hot_bytes,
				     b->nas_opens - b->hot_opens))
		hot_locked(s, b);
	pthread_mutex_unlock(&s->lock);
}

void store_note_close(struct store *s, struct blob *b)
{
	pthread_mutex_lock(&s->lock);
	if (b->open_count > 0 && --b->open_count == 0)
		space_closed_locked(s, b);
	pthread_mutex_unlock(&s->lock);
}

/* ---- requests ---- */

/* Queue @b (NAS or FAILED) now, as asked for at @asked_ns (0: now). */
static void queue_locked(struct store *s, struct blob *b, int explicit_req, uint64_t asked_ns)
{
	blob_state_set_locked(s, b, BLOB_QUEUED);
	b->reason[0] = '\0';
	b->hold = HOLD_NONE;
	b->explicit_req = explicit_req;
	atomic_store(&b->prog.bytes_done, 0);
	atomic_store(&b->prog.cancel, COPY_GO);
	atomic_store(&b->prog.rate, 0); /* the copy's own, set when it starts */
	b->want_ns = asked_ns ? asked_ns : store_now_ns();
	if (!explicit_req)
		s->auto_queued++;
	store_enqueue_locked(s, b);
}

void store_free_auto_slot_locked(struct store *s, struct blob *b)
{
	if (!b->auto_slot)
		return;
	b->auto_slot = 0;
	s->auto_running--;
	pthread_cond_broadcast(&s->cond);
}

static int request_locked(struct store *s, struct blob *b, enum store_who who, int now,
			  uint64_t asked_ns)
{
	int explicit_req = who != STORE_BY_AUTO;

	/* Staged in part on purpose (wfsctl promote --range): the policy does
	 * not copy the rest by itself, however hot its NAS bytes make it. */
	if (who == STORE_BY_AUTO && b->part && (b->part->n || b->part->nwant))
		return 0;
	if (b->state == BLOB_NAS || b->state == BLOB_FAILED) {
		b->who = who;
		if (who != STORE_BY_USER && !now && b->fail_count &&
		    store_now_ms() < b->retry_at_ms) {
			/* In its backoff: the store queues it when that passes
			 * (store_retry_due), if still wanted then. */
			store_retry_schedule_locked(s, b);
			return 0;
		}
		queue_locked(s, b, explicit_req, asked_ns);
		return 1;
	}
	if (b->state == BLOB_QUEUED || b->state == BLOB_COPYING)
		b->who = who; /* the last request says who is retried */
	if (b->state == BLOB_QUEUED && explicit_req && !b->explicit_req) {
		b->explicit_req = 1; /* asked for now: ahead of the automatic ones */
		b->want_ns = asked_ns ? asked_ns : store_now_ns();
		store_enqueue_locked(s, b);
	} else if (b->state == BLOB_COPYING && !b->reverify && explicit_req && !b->explicit_req) {
		/* An automatic copy in flight: it goes on at an explicit copy's
		 * rate from its next read, the bytes it has kept (fetch.h). */
		uint64_t rate = store_copy_rate(s, 0);

		b->explicit_req = 1;
		store_free_auto_slot_locked(s, b);
		atomic_store(&b->prog.rate, rate ? rate : FETCH_RATE_NONE);
		store_log_msg(s, LOG_INFO, "promotion of %s asked for now: its automatic copy goes "
			      "on at the explicit rate", b->key);
	}
	return 0;
}

int store_request(struct store *s, struct blob *b, enum store_who who, int now)
{
	int r;

	pthread_mutex_lock(&s->lock);
	r = request_locked(s, b, who, now, 0);
	pthread_mutex_unlock(&s->lock);
	return r;
}

int store_promote_at(struct store *s, struct blob *b, int pin, int explicit_req,
		     uint64_t asked_ns)
{
	pthread_mutex_lock(&s->lock);
	if (pin)
		store_pin_locked(s, b, PIN_HAND, 1);
	request_locked(s, b, explicit_req ? STORE_BY_USER : STORE_BY_AUTO, explicit_req,
		       asked_ns);
	pthread_mutex_unlock(&s->lock);
	return 0;
}

int store_promote(struct store *s, struct blob *b, int pin, int explicit_req)
{
	return store_promote_at(s, b, pin, explicit_req, 0);
}

int64_t store_retry_due(struct store *s)
{
	struct nas_gate *g = s->opt.gate;
	/* the gate's state read first: its lock is a leaf, never under ours */
	int up = nas_gate_up(g);
	uint64_t gen = g ? atomic_load(&g->generation) : 0;
	int64_t now = store_now_ms(), next = -1;
	int came_up, pending = 0;

	pthread_mutex_lock(&s->lock);
	if (!s->retry_pending || s->stop) {
		s->retry_gen = gen;
		pthread_mutex_unlock(&s->lock);
		return -1;
	}
	if (!up) {
		/* A copy now fails or hangs: wait for the gate, looking once
		 * a second (it has no callback). */
		pthread_mutex_unlock(&s->lock);
		return now + 1000;
	}
	came_up = gen != s->retry_gen;
	s->retry_gen = gen;
	if (!came_up && now < s->retry_next_ms) {
		next = s->retry_next_ms;
		pthread_mutex_unlock(&s->lock);
		return next;
	}
	STORE_EACH(s, b) {
		if (!store_retry_wanted_locked(s, b))
			continue;
		if (came_up || b->retry_at_ms <= now) {
			queue_locked(s, b, b->who != STORE_BY_AUTO, 0);
			s->retries++;
			store_log_msg(s, LOG_INFO, "retrying the copy of %s (%s) after %u failure%s%s",
				      b->key, b->id, b->fail_count, b->fail_count == 1 ? "" : "s",
				      came_up ? ": the NAS is up again" : "");
		} else if (!pending || b->retry_at_ms < next) {
			pending = 1;
			next = b->retry_at_ms;
		}
	}
	s->retry_pending = pending;
	s->retry_next_ms = next;
	pthread_mutex_unlock(&s->lock);
	return pending ? next : -1;
}

/* @b has local ranges, or ranges on their way. */
static int part_held_locked(const struct blob *b)
{
	return b->part && (b->part->n || b->part->nwant || b->part->unproven || b->part->copying);
}

int store_evict(struct store *s, struct blob *b, int force)
{
	int r = 0, dropped = 0;

	pthread_mutex_lock(&s->lock);
	if (b->pinned && (!force || (b->pinned & PIN_REF))) {
		/* A pin with nothing local nor on its way (wfsctl pin does not
		 * promote) keeps nothing from an evict: not "skipped", which
		 * --force would not change either. */
		r = part_held_locked(b) || b->state == BLOB_LOCAL || b->state == BLOB_QUEUED ||
		    b->state == BLOB_COPYING ? -EBUSY : 0;
		pthread_mutex_unlock(&s->lock);
		return r;
	}
	/* Its local ranges first (a copy of them in flight is cancelled), then
	 * its whole copy or the whole copy queued or running -- which may be
	 * one made from those ranges. */
	if (part_held_locked(b)) {
		part_drop_locked(s, b, NULL);
		dropped = 1;
	}
	if (b->state == BLOB_LOCAL) {
		/* The bytes are the same on the NAS: nothing for the kernel to
		 * forget; a reader with the copy open keeps reading it. */
		store_demote_locked(s, b, "evicted", 0);
		dropped = 1;
	} else if (b->state == BLOB_QUEUED || b->state == BLOB_COPYING) {
		/* The worker removes its temporary file; a copy verified
		 * before it saw the flag is evicted as it ends (copy_one). */
		atomic_store(&b->prog.cancel, COPY_STOP);
		if (b->state == BLOB_QUEUED) {
			blob_state_set_locked(s, b, BLOB_NAS);
			store_unqueue_locked(s, b);
			store_reset_hot_locked(s, b);
			pthread_cond_broadcast(&s->cond); /* settled */
		}
		/* Sent to the NAS as a local copy is: unpinned too, or a pin
		 * left behind would keep a later copy from ever being evicted
		 * (and status would call it pinned while "evicted" was said). */
		store_pin_locked(s, b, b->pinned, 0);
		r = 1;
	}
	if (dropped) {
		store_pin_locked(s, b, b->pinned, 0);
		b->reason[0] = '\0';
		s->evicted++;
		r = 1;
	}
	/* An operator sent it to the NAS: no retry of the policy's brings it
	 * back by itself (its reads may make it hot again). */
	b->who = STORE_BY_USER;
	pthread_mutex_unlock(&s->lock);
	return r;
}

int store_local_read_error(struct store *s, struct blob *b, unsigned copy_gen, int err)
{
	char path[PATH_MAX + 64], want[33], why[256];
	int n = 0;

	err = err < 0 ? -err : err;
	pthread_mutex_lock(&s->lock);
	if (b->state != BLOB_LOCAL || atomic_load(&b->copy_gen) != copy_gen) {
		/* demoted already (another reader saw it first, or a check), or
		 * the descriptor that failed was of a copy before this one */
		pthread_mutex_unlock(&s->lock);
		return 0;
	}
	snprintf(want, sizeof(want), "%s", b->xxh);
	store_local_path_locked(s, b, path, sizeof(path));
	snprintf(why, sizeof(why), "local copy unreadable: %s (demoted; NAS bytes from now on)",
		 strerror(err));
	s->local_read_errors++;
	/* One file per content hash: every blob it serves reads the same bad
	 * file; the last one demoted removes it (store_demote_locked). */
	STORE_EACH(s, o) {
		if (o->state != BLOB_LOCAL || strcmp(o->xxh, want))
			continue;
		store_demote_locked(s, o, why, 1);
		o->local_error = 1;
		o->checked = 0;
		store_backoff_locked(s, o); /* a re-promotion waits, as after a failed copy */
		n++;
	}
	store_log_msg(s, LOG_WARNING, "local copy %s of %s (%s) failed a read: %s; %d blob%s it "
		      "served demoted, read from the NAS from now on; the copy %s", path, b->key,
		      b->id, strerror(err), n, n == 1 ? "" : "s", access(path, F_OK) == 0 ?
		      "could not be removed (removed at the next start-up)" : "is removed");
	pthread_mutex_unlock(&s->lock);
	return n;
}

int store_pin_locked(struct store *s, struct blob *b, int why, int pin)
{
	int was = b->pinned;

	b->pinned = pin ? was | why : was & ~why;
	if (b->pinned == was)
		return 0;
	if (was & ~b->pinned)
		s->room_gen++; /* an unpin: its copy may be evictable now */
	store_dirty_locked(s);
	return 1;
}

int store_pin_why(struct store *s, struct blob *b, int why, int pin)
{
	int changed;

	pthread_mutex_lock(&s->lock);
	changed = store_pin_locked(s, b, why, pin);
	pthread_mutex_unlock(&s->lock);
	return changed;
}

void store_pin(struct store *s, struct blob *b, int pin)
{
	store_pin_why(s, b, PIN_HAND, pin);
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

void store_set_bw_limit(struct store *s, uint64_t bw)
{
	atomic_store_explicit(&s->bw_limit, bw, memory_order_relaxed);
}

int store_set_refs(struct store *s, const struct store_ref_rec *v, size_t n)
{
	struct store_ref_rec *copy = malloc((n ? n : 1) * sizeof(*copy));

	if (!copy)
		return -ENOMEM;
	if (n)
		memcpy(copy, v, n * sizeof(*copy));
	pthread_mutex_lock(&s->lock);
	free(s->refs);
	s->refs = copy;
	s->nrefs = n;
	store_dirty_locked(s);
	pthread_mutex_unlock(&s->lock);
	return 0;
}

struct store_ref_rec *store_get_refs(struct store *s, size_t *n)
{
	struct store_ref_rec *v;

	pthread_mutex_lock(&s->lock);
	*n = s->nrefs;
	v = malloc((s->nrefs ? s->nrefs : 1) * sizeof(*v));
	if (v && s->nrefs)
		memcpy(v, s->refs, s->nrefs * sizeof(*v));
	if (!v)
		*n = 0;
	pthread_mutex_unlock(&s->lock);
	return v;
}

int store_sync(struct store *s)
{
	return store_write_index_if_dirty(s);
}

/* ---- life cycle ---- */

int store_open(struct store *s, const char *dir, const struct store_opts *opt,
	       const struct store_hooks *hooks)
{
	pthread_condattr_t mono;
	struct statvfs sv;
	int r;

	memset(s, 0, sizeof(*s));
	pthread_mutex_init(&s->lock, NULL);
	/* Every timed wait is on the monotonic clock: a clock step must not
	 * stall or hurry the policy. */
	pthread_condattr_init(&mono);
	pthread_condattr_setclock(&mono, CLOCK_MONOTONIC);
	pthread_cond_init(&s->cond, &mono);
	pthread_cond_init(&s->hot_cond, &mono);
	pthread_cond_init(&s->part_cond, &mono);
	pthread_condattr_destroy(&mono);
	pthread_mutex_init(&s->index_lock, NULL);
	if (hooks)
		s->hooks = *hooks;
	s->opt = *opt;
	if (!s->opt.workers)
		s->opt.workers = 1;
	s->bw_limit = s->opt.bw_limit;
	/* One worker stays free for explicit requests when there are two. */
	s->auto_max = s->opt.workers > 1 ? s->opt.workers - 1 : 1;
	snprintf(s->dir, sizeof(s->dir), "%s", dir);
	snprintf(s->data_dir, sizeof(s->data_dir), "%s/data", dir);
	snprintf(s->tmp_dir, sizeof(s->tmp_dir), "%s/tmp", dir);
	snprintf(s->index_path, sizeof(s->index_path), "%s/index.json", dir);
	snprintf(s->part_dir, sizeof(s->part_dir), "%s/parts", dir);
	s->blk = statvfs(dir, &sv) == 0 && sv.f_frsize ? (uint64_t)sv.f_frsize : 4096;
	r = htab_init(&s->blobs, 1024) < 0 || htab_init(&s->by_xxh, 1024) < 0 ||
	    htab_init(&s->by_id, 1024) < 0 ? -ENOMEM : 0;
	if (!r) {
		/* Damage or a read-only or full store is logged, never
		 * fatal: the mount serves from the NAS what cannot be served
		 * locally. */
		store_layout(s);
		store_empty_tmp(s);
		r = index_load(s);
	}
	/* A store that failed to open is closed without writing its index:
	 * a table read in part would replace index.json with one naming only
	 * some copies, and the next start would remove the others. */
	if (r < 0)
		s->index_kept = 1;
	return r;
}

int store_start(struct store *s)
{
	int r;

	s->threads = calloc(s->opt.workers + 1, sizeof(*s->threads));
	if (!s->threads)
		return -ENOMEM;
	store_trim(s); /* before the first copy: it fits with the truth counted */
	if (thread_start(&s->threads[s->nthreads], NULL, store_recheck_sweep, s) == 0)
		s->nthreads++;
	for (unsigned i = 0; i < s->opt.workers; i++) {
		r = thread_start(&s->threads[s->nthreads], NULL, store_worker, s);
		if (r)
			return r;
		s->nthreads++;
	}
	r = thread_start(&s->part_thread, NULL, store_part_worker, s);
	s->part_started = r == 0;
	return r;
}

/* Stop and cancel what runs. */
static void stop_locked(struct store *s)
{
	s->stop = 1;
	STORE_EACH(s, b) {
		if (b->state == BLOB_COPYING)
			atomic_store(&b->prog.cancel, COPY_STOP);
		if (b->part && b->part->copying)
			atomic_store(&b->part->prog.cancel, COPY_STOP);
	}
	pthread_cond_broadcast(&s->cond);
	pthread_cond_broadcast(&s->part_cond);
	pthread_cond_broadcast(&s->hot_cond);
}

void store_stop_tell(struct store *s)
{
	pthread_mutex_lock(&s->lock);
	stop_locked(s);
	pthread_mutex_unlock(&s->lock);
}

int store_stop_by(struct store *s, int64_t deadline_ms)
{
	int left = 0;

	store_stop_tell(s);
	/* a thread left behind is detached: its handle is dropped, never
	 * joined again (store_close after a first call) */
	for (unsigned i = 0; i < s->nthreads; i++)
		left |= join_by(s->threads[i], deadline_ms) < 0;
	s->nthreads = 0;
	if (s->part_started && join_by(s->part_thread, deadline_ms) < 0)
		left = 1;
	s->part_started = 0;
	return left ? -ETIMEDOUT : 0;
}

void store_leave(struct store *s)
{
	unsigned n = 0;

	pthread_mutex_lock(&s->index_lock);
	pthread_mutex_lock(&s->lock);
	stop_locked(s);
	/* A copy's worker may be in it still: the blob goes to the NAS in the
	 * index and in the table, which that worker, blocked on the lock, never
	 * sees again. */
	STORE_EACH(s, b) {
		/* A copy waiting for its start-up re-hash is COPYING too, but its
		 * b->tmp is the copy itself (shared, maybe, with LOCAL blobs):
		 * kept, and re-hashed at the next start as the index says. */
		if (b->state == BLOB_COPYING && !b->reverify) {
			n++;
			store_log_msg(s, LOG_NOTICE, "stopping: the copy of %s is left unfinished "
				      "(%llu of %llu bytes; its worker is still in a NAS call): not "
				      "promoted%s", b->key,
				      (unsigned long long)atomic_load(&b->prog.bytes_done),
				      (unsigned long long)b->size,
				      b->tmp ? ", its temporary file removed" : "");
			if (b->tmp)
				unlink(b->tmp);
		}
		if (b->state == BLOB_QUEUED || b->state == BLOB_COPYING)
			blob_state_set_locked(s, b, BLOB_NAS);
	}
	if (s->blobs.b)
		store_write_index_held(s);
	store_log_msg(s, LOG_NOTICE, "stopping without waiting for the NAS: index %s written%s",
		      s->index_path, n ? "; copies left unfinished are not in it" : "");
	/* index_lock and lock stay held: see store.h */
}

void store_close(struct store *s)
{
	store_stop_by(s, -1);
	free(s->threads);
	free(s->kept.v);
	free(s->kept_parts.v);
	s->kept = s->kept_parts = (struct kept_names){ 0 };
	s->threads = NULL;
	s->nthreads = 0;
	/* Whatever was queued or cancelled is simply on the NAS next time. */
	STORE_EACH(s, b)
		if (b->state == BLOB_QUEUED || b->state == BLOB_COPYING)
			blob_state_set_locked(s, b, BLOB_NAS);
	if (s->blobs.b)
		store_write_index(s);
	for (size_t i = 0; i < s->blobs.nb; i++) {
		struct hlink *l = s->blobs.b[i], *next;

		for (; l; l = next) {
			struct blob *b = htab_entry(l, struct blob, hl);

			next = l->next;
			store_part_free(b);
			free(b->key);
			free(b->name);
			free(b->tmp);
			free(b);
		}
	}
	htab_free(&s->blobs);
	htab_free(&s->by_xxh);
	htab_free(&s->by_id);
	free(s->refs);
	s->refs = NULL;
	pthread_mutex_destroy(&s->index_lock);
	pthread_cond_destroy(&s->hot_cond);
	pthread_cond_destroy(&s->cond);
	pthread_cond_destroy(&s->part_cond);
	pthread_mutex_destroy(&s->lock);
}
