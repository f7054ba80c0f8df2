/* store_copies.c - the blobs by content hash and by id, and the room their copies take.
 *
 * A copy is one file, data/<xx>/<xxh>, shared by every blob whose bytes
 * hash to <xxh> (the same file in two repos).  The questions asked of it
 * at every copy, publish and demotion -- does another local blob serve
 * this file, what do the local copies take -- were answered by a walk of
 * the whole table (with a sort, for the room): a promotion of a dataset
 * of 40,000 files made 40,000 such walks, and spent minutes in them.
 *
 * Here they cost what the copy's sharers do: each blob with a content
 * hash is linked in store.by_xxh under it, and store.copies_used counts
 * each file that a LOCAL blob serves once.  Both hold only because a
 * blob's state and hash change through the two setters below; the room's
 * full tally (store_space.c) counts again and says so if they ever differ.
 * Likewise each blob with an id (its hub content address, as a rule) is in
 * store.by_id: a copy asks whether a local blob has its name already.
 */
#include "store.h"
#include "store_int.h"
#include "path.h"

#include <stdio.h>
#include <string.h>

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

uint64_t copy_hash(const char *xxh)
{
	return path_hash(xxh);
}

struct blob *copy_first_locked(struct store *s, const char *xxh, uint64_t h, struct hlink **at)
{
	if (!xxh[0])
		return NULL;
	for (struct hlink *l = htab_chain(&s->by_xxh, h); l; l = l->next) {
		struct blob *o = htab_entry(l, struct blob, xl);

		if (l->hash == h && !strcmp(o->xxh, xxh)) {
			*at = l;
			return o;
		}
	}
	return NULL;
}

struct blob *copy_next_locked(struct hlink **at)
{
	const struct blob *b = htab_entry(*at, struct blob, xl);

	for (struct hlink *l = (*at)->next; l; l = l->next) {
		struct blob *o = htab_entry(l, struct blob, xl);

		if (l->hash == (*at)->hash && !strcmp(o->xxh, b->xxh)) {
			*at = l;
			return o;
		}
	}
	return NULL;
}

int copy_served_by_other_locked(struct store *s, const struct blob *b, const char *xxh)
{
	COPY_EACH(s, xxh, o)
		if (o != b && o->state == BLOB_LOCAL)
			return 1;
	return 0;
}

int rehash_pending_locked(struct store *s, const struct blob *b, const char *xxh)
{
	COPY_EACH(s, xxh, o)
		if (o != b && o->reverify)
			return 1;
	return 0;
}

/* A blob is publishing only between a rename and the record (a copy
 * worker's few system calls): mostly none, and no walk. */
int store_publishing_locked(struct store *s, const struct blob *b, const char *xxh)
{
	if (!s->pub_xxh_n || !xxh[0])
		return 0;
	STORE_EACH(s, o)
		if (o != b && o->pub_xxh[0] && !strcmp(o->pub_xxh, xxh))
			return 1;
	return 0;
}

/* @b's copy is counted while @b is LOCAL with a hash: once a file, by
 * whichever of its blobs came first. */
static void count_out(struct store *s, const struct blob *b)
{
	uint64_t c;

	if (b->state != BLOB_LOCAL || !b->xxh[0] || copy_served_by_other_locked(s, b, b->xxh))
		return;
	c = store_charge(s, b->size);
	s->copies_used -= c < s->copies_used ? c : s->copies_used;
}

static void count_in(struct store *s, const struct blob *b)
{
	if (b->state == BLOB_LOCAL && b->xxh[0] && !copy_served_by_other_locked(s, b, b->xxh))
		s->copies_used += store_charge(s, b->size);
}

void blob_state_set_locked(struct store *s, struct blob *b, enum blob_state st)
{
	if (b->state == st)
		return;
	if (b->state == BLOB_LOCAL || st == BLOB_LOCAL) {
		s->room_gen++;
		store_copies_moved_locked(s);
	}
	count_out(s, b);
	atomic_store(&b->state, st);
	count_in(s, b);
	/* Back on the NAS (ranges dropped, a mismatch flag dropped, a copy
	 * evicted or failed): its reads may make it hot again.  A flag left
	 * set by reads made while it was partial or flagged -- which no
	 * promotion followed -- kept it from ever turning hot. */
	if (st == BLOB_NAS)
		store_reset_hot_locked(s, b);
}

void blob_xxh_set_locked(struct store *s, struct blob *b, const char *xxh)
{
	if (!strcmp(b->xxh, xxh))
		return;
	if (b->state == BLOB_LOCAL)
		s->room_gen++;
	count_out(s, b);
	if (b->xxh[0])
		htab_del(&s->by_xxh, &b->xl);
	snprintf(b->xxh, sizeof(b->xxh), "%s", xxh);
	if (b->xxh[0])
		htab_add(&s->by_xxh, &b->xl, copy_hash(b->xxh));
	count_in(s, b);
}

void blob_id_set_locked(struct store *s, struct blob *b, const char *id)
{
	if (!strcmp(b->id, id))
		return;
	if (b->id[0])
		htab_del(&s->by_id, &b->il);
	snprintf(b->id, sizeof(b->id), "%s", id);
	if (b->id[0])
		htab_add(&s->by_id, &b->il, path_hash(b->id));
}

const struct blob *copy_of_name_locked(struct store *s, const struct blob *b)
{
	uint64_t h = path_hash(b->id);

	if (!hub_id_kind(b->id))
		return NULL;
	for (struct hlink *l = htab_chain(&s->by_id, h); l; l = l->next) {
		const struct blob *o = htab_entry(l, struct blob, il);

		if (l->hash == h && o != b && o->state == BLOB_LOCAL && o->xxh[0] &&
		    o->size == b->size && !strcmp(o->id, b->id))
			return o;
	}
	return NULL;
}
