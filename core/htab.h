/* htab.h - an intrusive hash table: the one behind the store's blob table
 * and the daemon's inode table.
 *
 * An entry embeds a struct hlink and is found again with container_of.
 * The table keeps each entry's hash, so growing never re-hashes a key; it
 * doubles when it holds as many entries as buckets.  No locking: the
 * owner's lock covers the table and every link in it.
 */
#ifndef WFS_HTAB_H
#define WFS_HTAB_H

#include <stddef.h>
#include <stdint.h>

struct hlink {
	struct hlink *next;
	uint64_t hash;
};

struct htab {
	struct hlink **b;
	size_t nb, count;  /* buckets (a power of two), entries */
};

#define htab_entry(link, type, member) \
	((type *)(void *)((char *)(link) - offsetof(type, member)))

/* An empty table of @nb buckets (rounded up to a power of two).  -ENOMEM. */
int htab_init(struct htab *t, size_t nb);
/* Free the buckets (not the entries: walk them first with HTAB_EACH). */
void htab_free(struct htab *t);
/* Link @l with @hash.  Growing may fail quietly (longer chains). */
void htab_add(struct htab *t, struct hlink *l, uint64_t hash);
/* Unlink @l; returns 0, or -ENOENT when it was not linked. */
int htab_del(struct htab *t, struct hlink *l);

/* The chain @hash falls in: for (l = htab_chain(t, h); l; l = l->next)
 * if (l->hash == h && <key equal>) ... */
static inline struct hlink *htab_chain(const struct htab *t, uint64_t hash)
{
	return t->b[hash & (t->nb - 1)];
}

/* Every link: HTAB_EACH(t, i, l) { ... } (do not add or delete inside;
 * collect first). */
#define HTAB_EACH(t, i, l) \
	for (size_t i = 0; i < (t)->nb; i++) \
		for (struct hlink *l = (t)->b[i]; l; l = l->next)

#endif
