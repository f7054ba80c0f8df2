/* store_space.c - the room the local copies may take; see store.h.
 *
 * The limit (store_max) counts, in whole blocks: every local copy, the
 * reservation of every copy in flight (its full size from the moment it
 * starts), and evicted copies that are still open (their blocks are only
 * freed at the last close).  So the copies never take more than the limit,
 * whatever is in flight.  The floor (min_free) is checked against the
 * filesystem's free space, less what copies in flight have reserved but
 * not yet allocated.
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

/* A file of more than a few extents needs extent blocks of its own (ext4
 * keeps 4 in the inode, each up to 128 MiB; a fragmented file needs more):
 * one block per 64 MiB, and one for any file past 16 blocks, covers it. */
#define EXTENT_SPAN ((uint64_t)64 << 20)

uint64_t store_charge(const struct store *s, uint64_t size)
{
	uint64_t blk = s->blk ? s->blk : 4096;
	uint64_t data = (size + blk - 1) / blk * blk;

	if (size > 16 * blk)
		data += blk * (1 + size / EXTENT_SPAN);
	return data;
}

uint64_t part_charge_locked(const struct store *s, const struct blob *b)
{
	const struct blob_part *p = b->part;

	/* each range may start and end inside a block */
	return p && p->n ? store_charge(s, p->bytes) + p->n * (s->blk ? s->blk : 4096) : 0;
}

static void tally_locked(struct store *s, struct store_usage *u)
{
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
		if (b->state == BLOB_LOCAL) {
			uint64_t c = store_charge(s, b->size);

			u->blobs++;
			u->bytes += b->size;
			u->used += c;
			if (b->pinned)
				u->pinned_bytes += c;
			else if (b->open_count)
				u->open_bytes += c;
		} else if (b->state == BLOB_QUEUED) {
			u->queued++;
		} else if (b->state == BLOB_COPYING) {
			u->copying++;
		}
	}
	u->reserved = s->reserved;
	u->held = s->held;
	u->limit = s->opt.policy ? s->opt.policy->store_max : 0;
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
	uint64_t pending, ev = 0, room = UINT64_MAX, taken;

	pthread_mutex_lock(&s->lock);
	tally_locked(s, &u);
	pending = unallocated_locked(s);
	STORE_EACH(s, b)
		if (b->state == BLOB_LOCAL && !b->pinned && !b->open_count)
			ev += store_charge(s, b->size);
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

static int lru_cmp(const void *a, const void *b)
{
	const struct blob *x = *(const struct blob *const *)a, *y = *(const struct blob *const *)b;
	uint64_t ux = x->use_ns, uy = y->use_ns;

	if (ux != uy)
		return ux < uy ? -1 : 1;
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

int space_reserve_locked(struct store *s, struct blob *b, uint64_t need, uint64_t *slot,
			 char *why, size_t wsz, int *evicted)
{
	struct store_usage u;
	struct statvfs sv;
	struct room m = { 0 };
	struct blob **cand = NULL;
	size_t ncand = 0;
	uint64_t evictable = 0, freed = 0;

	*evicted = 0;
	tally_locked(s, &u);
	m.need = need;
	m.limit = u.limit;
	m.used = u.used + s->reserved + s->held;
	if (statvfs(s->dir, &sv) == 0) {
		m.have_fs = 1;
		m.avail = (uint64_t)sv.f_bavail * sv.f_frsize;
		m.floor = policy_floor(s->opt.policy, (uint64_t)sv.f_blocks * sv.f_frsize);
		m.pending = unallocated_locked(s);
	}
	if (fits(&m, 0))
		goto reserve;

	/* Candidates: local copies neither pinned nor open, and last used
	 * before @b was asked for -- so the blobs of one request (a repo
	 * larger than the room) do not evict each other in turn. */
	cand = malloc((u.blobs ? u.blobs : 1) * sizeof(*cand));
	if (cand)
		STORE_EACH(s, o)
			if (o != b && o->state == BLOB_LOCAL && !o->pinned && !o->open_count &&
			    o->use_ns < b->want_ns && ncand < u.blobs) {
				cand[ncand++] = o;
				evictable += store_charge(s, o->size);
			}
	if (!cand || !fits(&m, evictable)) {
		/* Evicting would not make it fit: keep every copy. */
		explain(&m, &u, evictable, why, wsz);
		free(cand);
		return -ENOSPC;
	}
	qsort(cand, ncand, sizeof(*cand), lru_cmp);
	for (size_t i = 0; i < ncand && !fits(&m, freed); i++) {
		char msg[PATH_MAX + 128];

		snprintf(msg, sizeof(msg), "evicted for room (least recently used) for %s", b->key);
		freed += store_charge(s, cand[i]->size);
		store_demote_locked(s, cand[i], msg, 0);
		cand[i]->reason[0] = '\0';
		s->evicted++;
		(*evicted)++;
	}
	free(cand);
	/* A copy shared by two blobs frees nothing: count again. */
	tally_locked(s, &u);
	m.used = u.used + s->reserved + s->held;
	if (m.have_fs && statvfs(s->dir, &sv) == 0)
		m.avail = (uint64_t)sv.f_bavail * sv.f_frsize;
	if (!fits(&m, 0)) {
		explain(&m, &u, 0, why, wsz);
		return -ENOSPC;
	}
reserve:
	s->reserved += m.need;
	*slot = m.need;
	return 0;
}

void space_release_locked(struct store *s, struct blob *b)
{
	s->reserved -= b->reserved < s->reserved ? b->reserved : s->reserved;
	b->reserved = 0;
}

void space_unlinked_locked(struct store *s, struct blob *b)
{
	uint64_t c;

	if (!b->open_count)
		return;
	c = store_charge(s, b->size);
	b->held += c;
	s->held += c;
}

void space_closed_locked(struct store *s, struct blob *b)
{
	s->held -= b->held < s->held ? b->held : s->held;
	b->held = 0;
}


/* ---- demotion: a copy gives its room back ---- */

/* Remove @b's local copy unless another local blob has the same bytes.
 * Returns 1 when the file was unlinked. */
static int drop_copy_locked(struct store *s, struct blob *b)
{
	char path[PATH_MAX + 64];

	STORE_EACH(s, o)
		if (o != b && o->state == BLOB_LOCAL && !strcmp(o->xxh, b->xxh))
			return 0;
	return b->xxh[0] && store_local_path_locked(s, b, path, sizeof(path)) == 0 && unlink(path) == 0;
}

void store_demote_locked(struct store *s, struct blob *b, const char *why, int invalidate)
{
	uint64_t ino = atomic_load_explicit(&b->fs_ino, memory_order_relaxed);

	if (b->state != BLOB_LOCAL)
		return;
	b->state = BLOB_NAS;
	if (drop_copy_locked(s, b))
		space_unlinked_locked(s, b);
	b->xxh[0] = '\0';
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
