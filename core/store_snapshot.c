/* store_snapshot.c - the table as the index will say it, copied under
 * store.lock in as little time as the copy itself takes.
 *
 * The index is written from a snapshot: every blob's record, with copies
 * of the strings it names (the blobs' fields change under other threads
 * once the lock is let go).  Every opener of a local file waits on that
 * lock meanwhile.  At 40,000 blobs the snapshot used to take 50-175 ms,
 * most of it fresh memory: 26 MB of zeroed arrays and a malloc'ed key a
 * blob, each page faulted in under the lock.  Here the memory is made
 * (and its pages touched) before the lock is taken, sized from the table
 * and from the last snapshot's strings; under the lock the records are
 * only filled in and their strings copied one after another into it.
 * What was not foreseen (blobs added in between, longer strings) is
 * allocated under the lock, as before.
 */
#include "store.h"
#include "store_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* A run of the snapshot's strings and ranges; never moved once made (the
 * records point into it). */
struct snap_chunk {
	struct snap_chunk *next;
	size_t used, cap;
	_Alignas(8) char buf[];
};

#define CHUNK_MIN ((size_t)1 << 20)

/* A chunk of @cap bytes, its pages touched when @touch. */
static struct snap_chunk *chunk_new(struct index_snapshot *sn, size_t cap, int touch)
{
	struct snap_chunk *c = malloc(sizeof(*c) + cap);

	if (!c)
		return NULL;
	if (touch)
		memset(c->buf, 0, cap);
	c->used = 0;
	c->cap = cap;
	c->next = sn->chunks;
	sn->chunks = c;
	return c;
}

/* @n bytes (8-aligned) in the current chunk, or a new one: NULL when out
 * of memory. */
static void *snap_alloc(struct index_snapshot *sn, size_t n)
{
	struct snap_chunk *c = sn->chunks;
	size_t at = c ? (c->used + 7) & ~(size_t)7 : 0;
	void *p;

	if (!c || at + n > c->cap) {
		if (!(c = chunk_new(sn, n > CHUNK_MIN ? n : CHUNK_MIN, 0)))
			return NULL;
		at = 0;
	}
	p = c->buf + at;
	c->used = at + n;
	sn->bytes += n;
	return p;
}

static const char *snap_str(struct index_snapshot *sn, const char *s)
{
	size_t n = strlen(s) + 1;
	char *p;

	if (n == 1)
		return ""; /* (most reasons, many ids: nothing to copy) */
	p = snap_alloc(sn, n);
	return p ? memcpy(p, s, n) : NULL;
}

/* Room for @n records and @nrefs ref pins: 0 or -ENOMEM. */
static int make_room(struct index_snapshot *sn, size_t n, size_t nrefs, int touch)
{
	if (n > sn->cap) {
		struct index_rec *v = realloc(sn->recs, n * sizeof(*v));

		if (!v)
			return -ENOMEM;
		if (touch)
			memset(v + sn->cap, 0, (n - sn->cap) * sizeof(*v));
		sn->recs = v;
		sn->cap = n;
	}
	if (nrefs > sn->refs_cap) {
		struct index_ref *r = realloc(sn->refs, nrefs * sizeof(*r));
		struct store_ref_rec *c;

		if (!r)
			return -ENOMEM;
		sn->refs = r;
		if (!(c = realloc(sn->rcopy, nrefs * sizeof(*c))))
			return -ENOMEM;
		sn->rcopy = c;
		sn->refs_cap = nrefs;
	}
	return 0;
}

int snapshot_prepare(struct store *s, struct index_snapshot *sn)
{
	size_t n, nrefs, hint;

	pthread_mutex_lock(&s->lock);
	n = s->blobs.count;
	nrefs = s->nrefs;
	pthread_mutex_unlock(&s->lock);
	/* a little more than now: blobs added before the lock is taken
	 * again still fit */
	/* the strings: as many as the last snapshot's, or ~160 bytes a
	 * blob (a key of ~100, an id, two hashes) */
	hint = s->index_snap_bytes ? s->index_snap_bytes : n * 160;
	if (make_room(sn, n + n / 16 + 16, nrefs + 4, 1) < 0 ||
	    !chunk_new(sn, hint + hint / 8 + 4096, 1))
		return -ENOMEM;
	return 0;
}

/* The state @b's record has, or NULL for a blob with none (on the NAS
 * and not pinned).  A copy still to be re-hashed keeps its record (and
 * its old proof, which fails again: re-hashed next time too); so do
 * ranges still to be re-hashed. */
static const char *record_state(const struct blob *b)
{
	if (b->state == BLOB_LOCAL || b->reverify)
		return "local";
	if (b->state == BLOB_MISMATCH)
		return "mismatch";
	if (b->part && b->part->n)
		return "partial";
	return b->pinned ? "nas" : NULL;
}

/* @b's record, in @sn's next slot (under s->lock). */
static int snapshot_blob(struct index_snapshot *sn, const struct blob *b, const char *state)
{
	const struct blob_part *p = b->part;
	size_t nr = !strcmp(state, "partial") ? p->n : 0;
	struct part_range *ranges = nr ? snap_alloc(sn, nr * sizeof(*p->v)) : NULL;
	struct index_rec *rec = &sn->recs[sn->n];

	if (nr && !ranges)
		return -ENOMEM;
	if (nr)
		memcpy(ranges, p->v, nr * sizeof(*p->v));
	*rec = (struct index_rec){
		.key = snap_str(sn, b->key), .id = snap_str(sn, b->id), .state = state,
		.xxh = snap_str(sn, b->xxh), .sample = snap_str(sn, b->sample),
		.reason = snap_str(sn, b->reason), .name = snap_str(sn, b->name ? b->name : ""),
		.size = b->size, .mtime = b->nas_mtime, .ctime = b->nas_ctime,
		.last_used = b->last_used, .pinned = !!(b->pinned & PIN_HAND),
		.ref_pinned = !!(b->pinned & PIN_REF),
		.use_ns = atomic_load_explicit(&b->use_ns, memory_order_relaxed),
		.copy_ino = b->copy.ino, .copy_mtime = b->copy.mtime,
		.copy_ctime = b->copy.ctime,
		.ranges = ranges, .nranges = nr,
		.part_ino = p ? p->proof.ino : 0,
		.part_mtime = p ? p->proof.mtime : (struct timespec){ 0 },
		.part_ctime = p ? p->proof.ctime : (struct timespec){ 0 },
	};
	if (!rec->key || !rec->id || !rec->xxh || !rec->sample || !rec->reason || !rec->name)
		return -ENOMEM;
	sn->n++;
	return 0;
}

int snapshot_take_locked(struct store *s, struct index_snapshot *sn)
{
	if (make_room(sn, s->blobs.count ? s->blobs.count : 1, s->nrefs ? s->nrefs : 1, 0) < 0)
		return -ENOMEM;
	sn->n = 0;
	sn->bytes = 0;
	STORE_EACH(s, b) {
		const char *state = record_state(b);

		if (state && snapshot_blob(sn, b, state) < 0)
			return -ENOMEM;
	}
	sn->nrefs = s->nrefs;
	if (sn->nrefs)
		memcpy(sn->rcopy, s->refs, sn->nrefs * sizeof(*sn->rcopy));
	for (size_t i = 0; i < sn->nrefs; i++)
		sn->refs[i] = (struct index_ref){ sn->rcopy[i].repo, sn->rcopy[i].ref,
						  sn->rcopy[i].commit, sn->rcopy[i].pending };
	return 0;
}

void snapshot_free(struct index_snapshot *sn)
{
	while (sn->chunks) {
		struct snap_chunk *c = sn->chunks;

		sn->chunks = c->next;
		free(c);
	}
	free(sn->recs);
	free(sn->refs);
	free(sn->rcopy);
	memset(sn, 0, sizeof(*sn));
}
