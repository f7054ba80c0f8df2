/* store_space.c - the room the local copies may take; see store.h.
 *
 * The limit (store_max) counts, in whole blocks: every local copy, the
 * reservation of every copy in flight (its full size from the moment it
 * starts), and evicted copies that are still open (their blocks are only
 * freed at the last close).  So the copies never take more than the limit,
 * whatever is in flight.  The floor (min_free) is checked against the
 * filesystem's free space, less what copies in flight have reserved but
 * not yet allocated.
 *
 * A copy is one file, data/<xx>/<xxh>, shared by every local blob with
 * that content hash (the same file in two repos): it is counted once, and
 * only evicting the last of its blobs frees it -- so eviction for room
 * picks whole copies, never one that a blob evicted while open may still
 * hold (open_xxh), and counts what they free, not what their blobs weigh.
 */
#include "store.h"
#include "store_int.h"
#include "fmt.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <syslog.h>
#include <unistd.h>

uint64_t part_charge_locked(const struct store *s, const struct blob *b)
{
	const struct blob_part *p = b->part;

	/* each range may start and end inside a block */
	return p && p->n ? store_charge(s, p->bytes) + p->n * (s->blk ? s->blk : 4096) : 0;
}

/* The room store_max leaves the copies (0: no limit). */
static uint64_t limit_of(const struct store *s)
{
	return s->opt.policy ? s->opt.policy->store_max : 0;
}

/* The LOCAL blobs, those sharing a copy adjacent (copy_end), and the
 * copies that blobs evicted while open may still hold. */
struct copies {
	struct blob **v;
	size_t n;
	const char **held;
	size_t nheld;
};

/* Is @b the first LOCAL blob of its copy (in store.by_xxh's order)?  A
 * LOCAL blob always has its hash; one without is a copy of its own. */
static int copy_first_local(struct store *s, const struct blob *b)
{
	COPY_EACH_OF(s, b, o)
		if (o->state == BLOB_LOCAL)
			return o == b;
	return 1;
}

static void copies_free(struct copies *cs)
{
	free(cs->v);
	free(cs->held);
	memset(cs, 0, sizeof(*cs));
}

/* 0, or -ENOMEM (then the caller counts each blob as a copy of its own:
 * never less than the truth). */
static int copies_get_locked(struct store *s, struct copies *cs)
{
	size_t n = 0, nheld = 0;

	memset(cs, 0, sizeof(*cs));
	STORE_EACH(s, b) {
		n += b->state == BLOB_LOCAL;
		nheld += b->open_count && b->open_xxh[0];
	}
	cs->v = malloc((n ? n : 1) * sizeof(*cs->v));
	cs->held = malloc((nheld ? nheld : 1) * sizeof(*cs->held));
	if (!cs->v || !cs->held) {
		copies_free(cs);
		return -ENOMEM;
	}
	/* each copy's blobs from its chain, by its first: no sort (this runs
	 * at every copy that does not fit at once, and at every status) */
	STORE_EACH(s, b) {
		if (b->state == BLOB_LOCAL && !b->xxh[0] && cs->n < n)
			cs->v[cs->n++] = b;
		else if (b->state == BLOB_LOCAL && copy_first_local(s, b))
			COPY_EACH_OF(s, b, o)
				if (o->state == BLOB_LOCAL && cs->n < n)
					cs->v[cs->n++] = o;
		if (b->open_count && b->open_xxh[0] && cs->nheld < nheld)
			cs->held[cs->nheld++] = b->open_xxh;
	}
	return 0;
}

/* The end of the copy whose first blob is v[@i]: its blobs are v[@i..end). */
static size_t copy_end(const struct copies *cs, size_t i)
{
	size_t j = i + 1;

	while (j < cs->n && cs->v[i]->xxh[0] && !strcmp(cs->v[j]->xxh, cs->v[i]->xxh))
		j++;
	return j;
}

/* May a reader of a blob evicted while open still hold the copy @xxh? */
static int copy_held_open(const struct copies *cs, const char *xxh)
{
	for (size_t i = 0; i < cs->nheld; i++)
		if (!strcmp(cs->held[i], xxh))
			return 1;
	return 0;
}

/* Count one copy, shared by the @n blobs @v. */
static void tally_copy(struct store *s, struct store_usage *u, struct blob *const *v, size_t n)
{
	uint64_t c = store_charge(s, v[0]->size);
	int pinned = 0, open = 0;

	for (size_t i = 0; i < n; i++) {
		pinned |= v[i]->pinned;
		open |= v[i]->open_count > 0;
	}
	u->bytes += v[0]->size;
	u->used += c;
	if (pinned)
		u->pinned_bytes += c;
	else if (open)
		u->open_bytes += c;
}

/* The table's count of the copies, @copies, against the one kept as
 * they come and go (store_copies.c): the two differ only through a bug;
 * the table's is the truth. */
static void recount_locked(struct store *s, uint64_t copies)
{
	if (copies == s->copies_used)
		return;
	store_log_msg(s, LOG_ERR, "store: the local copies take %llu bytes; %llu were counted "
		      "(a wfs accounting bug): counted again", (unsigned long long)copies,
		      (unsigned long long)s->copies_used);
	s->copies_used = copies;
	s->copies_recounted++;
}

static void tally_locked(struct store *s, struct store_usage *u)
{
	struct copies cs;
	uint64_t parts;

	memset(u, 0, sizeof(*u));
	STORE_EACH(s, b) {
		if (b->part && b->part->n) {
			uint64_t c = part_charge_locked(s, b);

			u->parts++;
			u->part_bytes += b->part->bytes;
			u->used += c;
			if (b->pinned)
				u->pinned_bytes += c;
			else if (b->open_count)
				u->open_bytes += c;
		}
		if (b->state == BLOB_LOCAL)
			u->blobs++;
		else if (b->state == BLOB_QUEUED)
			u->queued++;
		else if (b->state == BLOB_COPYING)
			u->copying++;
	}
	parts = u->used;
	if (copies_get_locked(s, &cs) == 0) {
		for (size_t i = 0, j; i < cs.n; i = j) {
			j = copy_end(&cs, i);
			tally_copy(s, u, cs.v + i, j - i);
		}
		copies_free(&cs);
		recount_locked(s, u->used - parts);
	} else {
		STORE_EACH(s, b)
			if (b->state == BLOB_LOCAL)
				tally_copy(s, u, &b, 1);
	}
	u->reserved = s->reserved;
	u->held = s->held;
	u->limit = limit_of(s);
}

/* May evicting the blobs v[0..@n) of one copy, to make room for @b, free
 * it?  None may be pinned, open or @b itself, nor -- when @b is given --
 * used since @b was asked for; and no reader of a blob evicted while open
 * may hold it. */
static int copy_freeable(const struct copies *cs, struct blob *const *v, size_t n,
			 const struct blob *b)
{
	for (size_t i = 0; i < n; i++)
		if (v[i] == b || v[i]->pinned || v[i]->open_count ||
		    (b && v[i]->use_ns >= b->want_ns))
			return 0;
	return !v[0]->xxh[0] || !copy_held_open(cs, v[0]->xxh);
}

static void fs_space(struct store *s, struct store_usage *u)
{
	struct statvfs sv;

	if (statvfs(s->dir, &sv) < 0)
		return;
	u->free_bytes = (uint64_t)sv.f_bavail * sv.f_frsize;
	u->fs_bytes = (uint64_t)sv.f_blocks * sv.f_frsize;
	u->floor = policy_floor(s->opt.policy, u->fs_bytes);
}

void store_usage(struct store *s, struct store_usage *u)
{
	pthread_mutex_lock(&s->lock);
	tally_locked(s, u);
	pthread_mutex_unlock(&s->lock);
	fs_space(s, u);
}

static uint64_t unallocated_locked(struct store *s);

uint64_t store_room(struct store *s, uint64_t *evictable)
{
	struct store_usage u;
	struct copies cs;
	uint64_t pending, ev = 0, room = UINT64_MAX, taken;

	pthread_mutex_lock(&s->lock);
	tally_locked(s, &u);
	pending = unallocated_locked(s);
	if (copies_get_locked(s, &cs) == 0) {
		for (size_t i = 0, j; i < cs.n; i = j) {
			j = copy_end(&cs, i);
			if (copy_freeable(&cs, cs.v + i, j - i, NULL))
				ev += store_charge(s, cs.v[i]->size);
		}
		copies_free(&cs);
	}
	pthread_mutex_unlock(&s->lock);
	fs_space(s, &u);
	taken = u.used + u.reserved + u.held;
	if (u.limit)
		room = u.limit > taken ? u.limit - taken : 0;
	if (u.fs_bytes) {
		uint64_t keep = u.floor + pending;
		uint64_t fs_room = u.free_bytes > keep ? u.free_bytes - keep : 0;

		room = fs_room < room ? fs_room : room;
	}
	if (evictable)
		*evictable = ev;
	return room == UINT64_MAX ? u.free_bytes : room;
}

/* Reserved by copies in flight but not yet allocated on disk (the fetcher
 * allocates the whole file when it starts): the free space does not show
 * it yet. */
static uint64_t unallocated_locked(struct store *s)
{
	uint64_t n = 0;

	STORE_EACH(s, b) {
		struct stat st;
		uint64_t have = 0;

		if (b->part)
			n += b->part->reserved; /* written as it goes: all of it counted */
		if (!b->reserved)
			continue;
		if (b->tmp && stat(b->tmp, &st) == 0)
			have = (uint64_t)st.st_blocks * 512;
		else if (atomic_load(&b->prog.bytes_done) >= b->size)
			have = b->reserved; /* written, renamed into data/ */
		n += b->reserved > have ? b->reserved - have : 0;
	}
	return n;
}

/* A copy eviction may free: its blobs cs.v[i..j), last used at @last (the
 * latest use of any of them). */
struct cand {
	size_t i, j;
	uint64_t last;
	const char *key;
};

static int lru_cmp(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;

	if (x->last != y->last)
		return x->last < y->last ? -1 : 1;
	return strcmp(x->key, y->key);
}

struct room {
	uint64_t need, limit, used, avail, floor, pending;
	int have_fs;
};

/* Does the copy fit once @freed bytes of copies are evicted? */
static int fits(const struct room *m, uint64_t freed)
{
	if (m->limit && m->used + m->need > m->limit + freed)
		return 0;
	if (m->have_fs && m->avail + freed < m->floor + m->pending + m->need)
		return 0;
	return 1;
}

static void explain(const struct room *m, const struct store_usage *u,
		    uint64_t evictable, char *why, size_t wsz)
{
	char need[32], lim[32], used[32], pin[32], open[32], res[32], held[32], ev[32];

	fmt_bytes(m->need, need, sizeof(need));
	fmt_bytes(m->limit, lim, sizeof(lim));
	fmt_bytes(evictable, ev, sizeof(ev));
	/* "evictable": neither pinned nor open, and last used before the request */
	if (m->limit && m->need > m->limit) {
		snprintf(why, wsz, "no room: needs %s, more than store_max (%s)", need, lim);
	} else if (m->limit && m->used + m->need > m->limit + evictable) {
		snprintf(why, wsz, "no room: needs %s; store_max %s holds %s of copies (%s pinned, "
			 "%s open), %s reserved in flight, %s evicted but still open; evictable "
			 "copies would free %s", need, lim, fmt_bytes(u->used, used, sizeof(used)),
			 fmt_bytes(u->pinned_bytes, pin, sizeof(pin)),
			 fmt_bytes(u->open_bytes, open, sizeof(open)),
			 fmt_bytes(u->reserved, res, sizeof(res)), fmt_bytes(u->held, held, sizeof(held)), ev);
	} else {
		snprintf(why, wsz, "no room: needs %s; the store's filesystem has %s free and keeps "
			 "%s (min_free), %s more reserved in flight; evictable copies would free %s",
			 need, fmt_bytes(m->avail, used, sizeof(used)), fmt_bytes(m->floor, pin, sizeof(pin)),
			 fmt_bytes(m->pending, res, sizeof(res)), ev);
	}
}

/* The filesystem's free space and floor; 0, or -1 when statvfs fails
 * (then only the limit is kept). */
static int room_fs(struct store *s, struct room *m)
{
	struct statvfs sv;

	if (statvfs(s->dir, &sv) < 0)
		return -1;
	m->have_fs = 1;
	m->avail = (uint64_t)sv.f_bavail * sv.f_frsize;
	m->floor = policy_floor(s->opt.policy, (uint64_t)sv.f_blocks * sv.f_frsize);
	return 0;
}

/* What the copies, reservations and held copies take now, and the
 * filesystem's free space, floor and pending allocations. */
static void room_now_locked(struct store *s, struct room *m, struct store_usage *u)
{
	tally_locked(s, u);
	m->limit = u->limit;
	m->used = u->used + s->reserved + s->held;
	if (room_fs(s, m) == 0)
		m->pending = unallocated_locked(s);
}

/* The ranges' room: a walk of the blobs that have had ranges only. */
static uint64_t parts_used_locked(struct store *s)
{
	uint64_t n = 0;

	for (struct blob *b = s->part_list; b; b = b->part_next)
		n += part_charge_locked(s, b);
	return n;
}

/* What store_max counts, on the counts kept: the copies, the ranges, the
 * reservations and the evicted copies still open. */
static uint64_t counted_use_locked(struct store *s)
{
	return s->copies_used + parts_used_locked(s) + s->reserved + s->held;
}

/* Does @need fit as things are, on the counts kept (@used,
 * counted_use_locked: no walk, no sort -- a promotion of many small files
 * asks at every one)?  Every reservation counts as not yet allocated, so
 * what fits here fits room_now_locked's finer look too; what does not is
 * looked at again there. */
static int fits_counted_locked(struct store *s, uint64_t need, uint64_t used)
{
	struct room m = { .need = need, .used = used };

	m.limit = limit_of(s);
	if (room_fs(s, &m) == 0)
		m.pending = s->reserved;
	return fits(&m, 0);
}

/* Evict least recently used copies until @m fits: copies whose every blob
 * is neither pinned nor open and, when @b is given, was last used before
 * @b was asked for -- so the blobs of one request (a repo larger than the
 * room) do not evict each other in turn.  A copy another blob still serves
 * frees nothing: it is no candidate.  Unless @partial, nothing is evicted
 * when evicting every candidate would not make it fit.  Returns 0, or
 * -ENOSPC (-ENOMEM) with *@evictable what the candidates take. */
static int evict_lru_locked(struct store *s, struct room *m, const struct blob *b,
			    const char *msg, int partial, uint64_t *evictable, int *evicted)
{
	struct copies cs;
	struct cand *cand = NULL;
	size_t ncand = 0;
	uint64_t freed = 0;

	*evictable = 0;
	if (copies_get_locked(s, &cs) < 0)
		return -ENOMEM;
	cand = malloc((cs.n ? cs.n : 1) * sizeof(*cand));
	for (size_t i = 0, j; cand && i < cs.n; i = j) {
		uint64_t last = 0;

		j = copy_end(&cs, i);
		/* (nor does one the kept index names: its file stays, store.h) */
		if (!copy_freeable(&cs, cs.v + i, j - i, b) || store_kept_copy(s, cs.v[i]->xxh))
			continue;
		for (size_t k = i; k < j; k++)
			last = cs.v[k]->use_ns > last ? cs.v[k]->use_ns : last;
		cand[ncand++] = (struct cand){ i, j, last, cs.v[i]->key };
		*evictable += store_charge(s, cs.v[i]->size);
	}
	if (!cand || (!partial && !fits(m, *evictable))) {
		/* Evicting would not make it fit: keep every copy. */
		free(cand);
		copies_free(&cs);
		return cand ? -ENOSPC : -ENOMEM;
	}
	qsort(cand, ncand, sizeof(*cand), lru_cmp);
	for (size_t n = 0; n < ncand && !fits(m, freed); n++) {
		freed += store_charge(s, cs.v[cand[n].i]->size);
		/* every blob of the copy: the last one removes the file */
		for (size_t k = cand[n].i; k < cand[n].j; k++) {
			store_demote_locked(s, cs.v[k], msg, 0);
			cs.v[k]->reason[0] = '\0';
			s->evicted++;
			(*evicted)++;
		}
	}
	free(cand);
	copies_free(&cs);
	return fits(m, freed) ? 0 : -ENOSPC;
}

/* The blobs of a request larger than the room (a dataset of many files,
 * store_max holding half) each found no room by the full tally and the
 * eviction's walk: O(n) a blob, 17-19 s for 10,000 files into room for
 * 5,000.  So the store_max verdict of one is kept, and holds for a blob
 * that needs as much or more, asked for no later (no copy is evictable for
 * it that was not for the first), while store_max is the same, the counted
 * use no lower, and room_gen has not moved (store.h: what may make a copy
 * evictable or room free that the counts do not show).  Only a verdict of
 * store_max is kept: the filesystem's free space moves by itself. */
static void no_room_keep_locked(struct store *s, const struct blob *b, const struct room *m,
				const struct store_usage *u, uint64_t evictable)
{
	/* m->used: the tally's, which the counts kept were just checked
	 * against (recount_locked) */
	s->room_kept = (struct no_room_kept){ .valid = 1, .gen = s->room_gen, .limit = m->limit,
		.used = m->used, .need = m->need, .want_ns = b->want_ns, .evictable = evictable,
		.pinned_bytes = u->pinned_bytes, .open_bytes = u->open_bytes };
}

/* @used: counted_use_locked's. */
static int no_room_still_locked(struct store *s, const struct blob *b, uint64_t need,
				uint64_t used, char *why, size_t wsz)
{
	const struct no_room_kept *k = &s->room_kept;
	struct store_usage u = { .used = used - s->reserved - s->held, .reserved = s->reserved,
				 .held = s->held, .pinned_bytes = k->pinned_bytes,
				 .open_bytes = k->open_bytes };
	struct room m = { .need = need, .limit = limit_of(s), .used = used };

	if (!k->valid || k->gen != s->room_gen || k->limit != m.limit || used < k->used ||
	    need < k->need || b->want_ns > k->want_ns)
		return 0;
	explain(&m, &u, k->evictable, why, wsz);
	atomic_fetch_add_explicit(&s->no_room_kept_hits, 1, memory_order_relaxed);
	return 1;
}

int space_reserve_locked(struct store *s, struct blob *b, uint64_t need, uint64_t *slot,
			 char *why, size_t wsz, int *evicted)
{
	struct store_usage u;
	struct room m = { 0 };
	uint64_t evictable = 0, used;
	char msg[PATH_MAX + 128];

	*evicted = 0;
	used = counted_use_locked(s);
	if (fits_counted_locked(s, need, used))
		goto reserve;
	if (no_room_still_locked(s, b, need, used, why, wsz))
		return -ENOSPC;
	room_now_locked(s, &m, &u);
	m.need = need;
	if (fits(&m, 0))
		goto reserve;
	snprintf(msg, sizeof(msg), "evicted for room (least recently used) for %s", b->key);
	if (evict_lru_locked(s, &m, b, msg, 0, &evictable, evicted) < 0 && !*evicted) {
		explain(&m, &u, evictable, why, wsz);
		if (m.limit && m.used + need > m.limit + evictable)
			no_room_keep_locked(s, b, &m, &u, evictable);
		return -ENOSPC;
	}
	/* What is on disk now, whatever the plan said. */
	room_now_locked(s, &m, &u);
	if (!fits(&m, 0)) {
		explain(&m, &u, 0, why, wsz);
		return -ENOSPC;
	}
reserve:
	s->reserved += need;
	*slot = need;
	return 0;
}

void store_trim(struct store *s)
{
	struct store_usage u;
	struct room m = { 0 };
	uint64_t evictable;
	char msg[128], lim[32], used[32];
	int evicted = 0, r;

	pthread_mutex_lock(&s->lock);
	room_now_locked(s, &m, &u);
	m.have_fs = 0; /* the floor is kept by the copies that start, not here */
	if (fits(&m, 0)) {
		pthread_mutex_unlock(&s->lock);
		return;
	}
	fmt_bytes(m.limit, lim, sizeof(lim));
	fmt_bytes(m.used, used, sizeof(used));
	snprintf(msg, sizeof(msg), "evicted (least recently used): the copies (%s) were over "
		 "store_max (%s)", used, lim);
	r = evict_lru_locked(s, &m, NULL, msg, 1, &evictable, &evicted);
	room_now_locked(s, &m, &u);
	store_log_msg(s, r < 0 ? LOG_WARNING : LOG_NOTICE, "store_max %s: the copies took %s; "
		      "%d evicted, %s now%s", lim, used, evicted,
		      fmt_bytes(m.used, used, sizeof(used)), r < 0 ? ", still over: the rest is "
		      "pinned or open" : "");
	pthread_mutex_unlock(&s->lock);
}

void space_release_locked(struct store *s, struct blob *b)
{
	s->reserved -= b->reserved < s->reserved ? b->reserved : s->reserved;
	b->reserved = 0;
}

void space_unlinked_locked(struct store *s, struct blob *b)
{
	struct blob *holder = b->open_count ? b : NULL;
	uint64_t c;

	/* Its blocks stay while any reader holds the file: @b's own, or those
	 * of a blob that shared it and was evicted while open.  Held once, by
	 * one of them, until the last of them closes (held_xxh marks them).
	 * (No such blob, no scan: an evict of a whole dataset demotes its
	 * blobs one after another.) */
	if (holder)
		snprintf(b->held_xxh, sizeof(b->held_xxh), "%s", b->xxh);
	if (s->open_xxh_n)
		STORE_EACH(s, o) {
			if (!o->open_xxh[0] || strcmp(o->open_xxh, b->xxh))
				continue;
			if (o->open_count) {
				snprintf(o->held_xxh, sizeof(o->held_xxh), "%s", o->open_xxh);
				holder = holder ? holder : o;
			}
			o->open_xxh[0] = '\0'; /* the file it held is accounted for now */
			s->open_xxh_n--;
		}
	if (!holder)
		return;
	c = store_charge(s, b->size);
	holder->held += c;
	s->held += c;
}

/* @b's last close: the charge of a removed file it held passes to another
 * blob whose readers hold that file still, if one does. */
static void pass_held_locked(struct store *s, struct blob *b)
{
	uint64_t c = store_charge(s, b->size);

	c = c < b->held ? c : b->held;
	STORE_EACH(s, o)
		if (o != b && o->open_count && !strcmp(o->held_xxh, b->held_xxh)) {
			o->held += c;
			b->held -= c;
			return;
		}
}

void space_closed_locked(struct store *s, struct blob *b)
{
	s->room_gen++; /* its copy, or the one it held, may be evictable now */
	if (b->held && b->held_xxh[0])
		pass_held_locked(s, b);
	b->held_xxh[0] = '\0';
	s->held -= b->held < s->held ? b->held : s->held;
	b->held = 0;
	if (b->open_xxh[0])
		s->open_xxh_n--;
	b->open_xxh[0] = '\0';
}


/* ---- demotion: a copy gives its room back ---- */

/* Does another local blob serve @b's copy (the same bytes, one file), is
 * one still to re-hash it (store_verify.c), or has one just renamed its
 * own copy of them there (store_publishing_locked)? */
static int copy_shared_locked(struct store *s, const struct blob *b)
{
	return b->xxh[0] && (copy_served_by_other_locked(s, b, b->xxh) ||
			     rehash_pending_locked(s, b, b->xxh) || store_publishing_locked(s, b, b->xxh));
}

/* Remove @b's local copy.  Returns 1 when the file was unlinked -- or is
 * the kept index's (store.h: kept), left for it and gone from this run's
 * room all the same. */
static int drop_copy_locked(struct store *s, struct blob *b)
{
	char path[PATH_MAX + 64];

	if (!b->xxh[0] || store_local_path_locked(s, b, path, sizeof(path)) < 0)
		return 0;
	if (store_kept_copy(s, b->xxh)) {
		store_log_msg(s, LOG_INFO, "%s: left in place: the index this run does not read "
			      "(%s) names it", path, s->index_path);
		return 1;
	}
	return unlink(path) == 0;
}

void store_demote_locked(struct store *s, struct blob *b, const char *why, int invalidate)
{
	uint64_t ino = atomic_load_explicit(&b->fs_ino, memory_order_relaxed);

	if (b->state != BLOB_LOCAL)
		return;
	blob_state_set_locked(s, b, BLOB_NAS);
	/* the ranges it was made of go with it: a second name would keep
	 * its blocks */
	part_retired_locked(s, b);
	atomic_fetch_add_explicit(&b->copy_gen, 1, memory_order_release);
	if (invalidate) /* its bytes are wrong now (an evicted copy's are not) */
		atomic_fetch_add_explicit(&b->bytes_gen, 1, memory_order_release);
	if (copy_shared_locked(s, b)) {
		/* Kept for the others; its readers may hold it until they close. */
		if (b->open_count) {
			s->open_xxh_n += !b->open_xxh[0];
			snprintf(b->open_xxh, sizeof(b->open_xxh), "%s", b->xxh);
		}
	} else if (drop_copy_locked(s, b)) {
		space_unlinked_locked(s, b);
	}
	blob_xxh_set_locked(s, b, "");
	snprintf(b->reason, sizeof(b->reason), "%s", why);
	store_reset_hot_locked(s, b);
	store_dirty_locked(s);
	if (!invalidate) {
		store_log_msg(s, LOG_INFO, "evicted %s (%s): %s", b->key, b->id, why);
		return;
	}
	s->demoted++;
	store_log_msg(s, LOG_WARNING, "demoted %s (%s): %s", b->key, b->id, why);
	if (s->hooks.changed && ino)
		s->hooks.changed(s->hooks.arg, ino);
}
