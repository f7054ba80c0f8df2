/* store_table.c - the bottom of the store: the blob table (a hash table
 * keyed by NAS path), what a blob is now (blob_info), the index's dirty
 * flag, the log hook and the clocks.  Everything else in the store is
 * built on these; this file calls none of it.  See store.h for the rule of
 * every field.
 */
#include "store.h"
#include "store_int.h"
#include "clock.h"
#include "path.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *blob_state_name(enum blob_state st)
{
	switch (st) {
	case BLOB_NAS: return "nas";
	case BLOB_QUEUED: return "queued";
	case BLOB_COPYING: return "copying";
	case BLOB_LOCAL: return "local";
	case BLOB_MISMATCH: return "mismatch";
	case BLOB_FAILED: return "failed";
	case BLOB_NSTATES: break;
	}
	return "?";
}

void store_log_msg(struct store *s, int prio, const char *fmt, ...)
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

int64_t store_now_ms(void)
{
	return mono_ms();
}

uint64_t store_now_ns(void)
{
	struct timespec ts;

	/* Coarse is enough for an LRU order and costs no syscall. */
	clock_gettime(CLOCK_REALTIME_COARSE, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

struct blob *store_find_locked(struct store *s, const char *key)
{
	uint64_t h = path_hash(key);

	for (struct hlink *l = htab_chain(&s->blobs, h); l; l = l->next) {
		struct blob *b = htab_entry(l, struct blob, hl);

		if (l->hash == h && !strcmp(b->key, key))
			return b;
	}
	return NULL;
}

struct blob *store_insert_locked(struct store *s, const char *key)
{
	struct blob *b = calloc(1, sizeof(*b));

	if (!b || !(b->key = strdup(key))) {
		free(b);
		errno = ENOMEM;
		return NULL;
	}
	htab_add(&s->blobs, &b->hl, path_hash(key));
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

int store_local_path_locked(struct store *s, const struct blob *b, char *out, size_t sz)
{
	int n = snprintf(out, sz, "%s/%.2s/%s", s->data_dir, b->xxh, b->xxh);

	return n < 0 || (size_t)n >= sz ? -ENAMETOOLONG : 0;
}

int store_local_path(struct store *s, const struct blob *b, char *out, size_t sz)
{
	int r = -ENOENT;

	pthread_mutex_lock(&s->lock);
	if (b->state == BLOB_LOCAL)
		r = store_local_path_locked(s, b, out, sz);
	pthread_mutex_unlock(&s->lock);
	return r;
}

void store_count_passthrough_open(struct store *s)
{
	atomic_fetch_add_explicit(&s->passthrough_opens, 1, memory_order_relaxed);
}

void store_note_route(struct store *s, enum store_route route, enum store_route_state state,
		      int err)
{
	int cur = atomic_load(&s->route_state[route]);

	/* the error first: a reader that sees REFUSED sees its reason */
	if (state == STORE_ROUTE_REFUSED)
		atomic_store(&s->route_err[route], err);
	/* REFUSED stays: a refusal noted by a request that ran before the
	 * start-up's own note (an open racing the INIT reply's) wins */
	while (cur != STORE_ROUTE_REFUSED &&
	       !atomic_compare_exchange_weak(&s->route_state[route], &cur, (int)state))
		;
}

void store_note_readahead(struct store *s, const struct store_readahead *ra)
{
	pthread_mutex_lock(&s->lock);
	s->readahead = *ra;
	pthread_mutex_unlock(&s->lock);
}

void store_get_readahead(struct store *s, struct store_readahead *out)
{
	pthread_mutex_lock(&s->lock);
	*out = s->readahead;
	pthread_mutex_unlock(&s->lock);
}

void store_dirty_locked(struct store *s)
{
	if (!s->index_dirty) {
		s->index_dirty = 1;
		s->dirty_since_ms = store_now_ms();
		pthread_cond_broadcast(&s->cond); /* an idle worker starts its clock */
	}
}

static void info_locked(const struct blob *b, struct blob_info *out)
{
	enum blob_state st = blob_state(b);

	out->key = b->key;
	memcpy(out->id, b->id, sizeof(out->id));
	memcpy(out->reason, b->reason, sizeof(out->reason));
	memcpy(out->xxh, b->xxh, sizeof(out->xxh));
	out->state = st;
	out->hold = b->hold;
	out->size = atomic_load(&b->size);
	out->bytes_done = st == BLOB_LOCAL ? out->size : atomic_load(&b->prog.bytes_done);
	out->pinned = b->pinned != 0;
	out->pin_why = b->pinned;
	out->open_count = b->open_count;
	out->nas_bytes = atomic_load_explicit(&b->nas_bytes, memory_order_relaxed);
	out->local_bytes = atomic_load_explicit(&b->local_bytes, memory_order_relaxed);
	out->opens = atomic_load_explicit(&b->opens, memory_order_relaxed);
	out->nas_opens = atomic_load_explicit(&b->nas_opens, memory_order_relaxed);
	out->last_used = b->last_used;
	out->name = NULL;
	out->local_error = b->local_error;
	out->fail_count = b->fail_count;
	out->retry_at_ms = b->fail_count ? b->retry_at_ms : 0;
	out->part_bytes = out->part_want = out->part_done = 0;
	out->part_n = 0;
	out->part_copying = out->part_unproven = 0;
	out->part_reason[0] = '\0';
	if (b->part) {
		const struct blob_part *p = b->part;

		out->part_bytes = p->bytes;
		out->part_n = p->n;
		out->part_want = p->want_total;
		/* a range copy's bytes so far; not the adopt's or a re-hash's,
		 * which leave the last range's count in @prog (shown twice) */
		out->part_done = p->want_done + (p->inflight.len ?
						 atomic_load(&p->prog.bytes_done) : 0);
		out->part_copying = p->copying || p->nwant || p->adopt;
		out->part_unproven = p->unproven;
		memcpy(out->part_reason, p->reason, sizeof(out->part_reason));
	}
}

void blob_info(struct store *s, const struct blob *b, struct blob_info *out)
{
	pthread_mutex_lock(&s->lock);
	info_locked(b, out);
	out->auto_retry = store_retry_wanted_locked(s, b);
	pthread_mutex_unlock(&s->lock);
}

void blob_set_fs_ino(struct blob *b, uint64_t ino)
{
	atomic_store_explicit(&b->fs_ino, ino, memory_order_relaxed);
}

void store_each(struct store *s, void (*fn)(void *arg, const struct blob_info *b), void *arg)
{
	struct blob_info info;

	pthread_mutex_lock(&s->lock);
	STORE_EACH(s, b) {
		info_locked(b, &info);
		info.auto_retry = store_retry_wanted_locked(s, b);
		info.name = b->name;
		fn(arg, &info);
	}
	pthread_mutex_unlock(&s->lock);
}

uint64_t store_copies_gen(struct store *s)
{
	return atomic_load_explicit(&s->copies_gen, memory_order_acquire);
}

void store_reset_hot_locked(struct store *s, struct blob *b)
{
	(void)s;
	atomic_store_explicit(&b->hot_bytes, atomic_load(&b->nas_bytes), memory_order_relaxed);
	b->hot_opens = atomic_load(&b->nas_opens);
	atomic_store_explicit(&b->hot, 0, memory_order_relaxed);
}

void store_hot_again(struct store *s, struct blob *b)
{
	pthread_mutex_lock(&s->lock);
	store_reset_hot_locked(s, b);
	pthread_mutex_unlock(&s->lock);
}

/* ---- the backoff of failed copies (store.h, enum store_who) ---- */

int store_retry_wanted_locked(const struct store *s, const struct blob *b)
{
	const struct policy_opts *pol = s->opt.policy;

	if (!b->fail_count || b->hold == HOLD_EXCLUDED ||
	    (b->state != BLOB_NAS && b->state != BLOB_FAILED))
		return 0;
	/* automatic copies only while automatic promotion is on; a ref pin's
	 * only while the blob is still pinned */
	return (b->who == STORE_BY_AUTO && pol && pol->auto_on) ||
	       (b->who == STORE_BY_PIN && b->pinned);
}

/* STORE_RETRY_FIRST_MS doubled for every failure in a row after the first,
 * at most STORE_RETRY_MAX_MS. */
static int64_t backoff_ms(unsigned fails)
{
	int64_t d = STORE_RETRY_FIRST_MS;

	for (unsigned i = 1; i < fails && d < STORE_RETRY_MAX_MS; i++)
		d *= 2;
	return d < STORE_RETRY_MAX_MS ? d : STORE_RETRY_MAX_MS;
}

void store_backoff_locked(struct store *s, struct blob *b)
{
	if (b->fail_count < UINT_MAX)
		b->fail_count++;
	b->retry_at_ms = store_now_ms() + backoff_ms(b->fail_count);
	store_retry_schedule_locked(s, b);
}

void store_retry_schedule_locked(struct store *s, struct blob *b)
{
	if (!store_retry_wanted_locked(s, b))
		return;
	/* The policy thread sleeps until its own deadline: wake it when this
	 * retry is due before the one it knows of. */
	if (!s->retry_pending || b->retry_at_ms < s->retry_next_ms) {
		s->retry_pending = 1;
		s->retry_next_ms = b->retry_at_ms;
		store_wake_hot_locked(s);
	}
}

void file_proof_take(struct file_proof *p, const struct stat *st)
{
	p->ino = (uint64_t)st->st_ino;
	p->mtime = st->st_mtim;
	p->ctime = st->st_ctim;
}

int file_proof_holds(const struct file_proof *p, const struct stat *st)
{
	return p->ino && p->ino == (uint64_t)st->st_ino && same_ts(&p->mtime, &st->st_mtim) &&
	       same_ts(&p->ctime, &st->st_ctim);
}

void store_backoff_clear_locked(struct blob *b)
{
	b->fail_count = 0;
	b->retry_at_ms = 0;
	b->local_error = 0;
}

void store_wake_hot_locked(struct store *s)
{
	s->hot_woken = 1;
	pthread_cond_broadcast(&s->hot_cond);
}

void store_landed_locked(struct store *s, struct blob *b)
{
	if (!(b->pinned & PIN_REF))
		return;
	s->ref_landed = 1;
	store_wake_hot_locked(s);
}

void store_made_local_locked(struct store *s, struct blob *b)
{
	store_backoff_clear_locked(b);
	b->reason[0] = '\0';
	b->hold = HOLD_NONE;
	b->last_used = (int64_t)time(NULL);
	blob_state_set_locked(s, b, BLOB_LOCAL);
	s->promoted++;
	s->copies_unrecorded = 1;
	store_dirty_locked(s);
	store_landed_locked(s, b);
}

void store_blob_name(struct store *s, const struct blob *b, char *out, size_t sz)
{
	pthread_mutex_lock(&s->lock);
	snprintf(out, sz, "%s", b->name ? b->name : "");
	pthread_mutex_unlock(&s->lock);
}

int store_stopping(struct store *s)
{
	int r;

	pthread_mutex_lock(&s->lock);
	r = s->stop;
	pthread_mutex_unlock(&s->lock);
	return r;
}
