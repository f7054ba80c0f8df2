/* store_int.h - what the parts of the store (store.c, store_space.c,
 * store_auto.c, store_refs.c, store_index.c) share; not for other modules.
 *
 * Locking: s->lock guards the table, the queue, every blob's state fields,
 * the room accounting, the hot list and the ref pins.  Copies, hashing, NAS
 * reads and walks run without it.  Functions named *_locked expect it held.
 */
#ifndef WFS_STORE_INT_H
#define WFS_STORE_INT_H

#include "store.h"

void store_log(struct store *s, int prio, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
uint64_t store_now_ns(void);

struct blob *store_find_locked(struct store *s, const char *key);
struct blob *store_insert_locked(struct store *s, const char *key);

/* A LOCAL blob goes back to the NAS; its copy is removed unless another
 * local blob has the same bytes.  @invalidate: the bytes may differ from
 * what the kernel cached (a demotion), not merely moved (an eviction). */
void store_demote_locked(struct store *s, struct blob *b, const char *why, int invalidate);

/* Take @b out of the queue if it is linked there. */
void store_unqueue_locked(struct store *s, struct blob *b);

/* ---- store_space.c ---- */

/* The space a copy of @size bytes takes, in whole blocks (with room for
 * the filesystem's own extent blocks). */
uint64_t store_charge(const struct store *s, uint64_t size);
/* Before a copy of @b: reserve its space, evicting least recently used
 * copies that are neither pinned nor open if that makes it fit.  Returns 0
 * (reserved), or -ENOSPC with @why saying what does not fit.  Sets
 * *@evicted to the number of copies evicted. */
int space_reserve_locked(struct store *s, struct blob *b, char *why, size_t wsz, int *evicted);
void space_release_locked(struct store *s, struct blob *b);
/* @b's copy was unlinked: while it is open its blocks stay in use. */
void space_unlinked_locked(struct store *s, struct blob *b);
/* The last open of @b closed. */
void space_closed_locked(struct store *s, struct blob *b);

/* ---- store_auto.c ---- */

/* Hand @b to the policy thread (once, until reset_hot). */
void auto_hot_locked(struct store *s, struct blob *b);
/* @b may become hot again, after as many NAS bytes/opens again. */
void auto_reset_locked(struct store *s, struct blob *b);
int auto_start(struct store *s, pthread_t *t);

/* ---- store_refs.c ---- */

/* Read <repo>/refs/<ref> on the NAS: a revision name.  Returns -errno. */
int refs_read(const struct hub_roots *roots, const char *repo, const char *ref, char *out,
	      size_t sz);
/* Follow every ref pin once (the policy thread, every ref_poll seconds). */
void refs_poll(struct store *s);
/* A ref pin loaded from the index. */
int auto_ref_add_locked(struct store *s, const struct store_ref *r);

/* ---- store_index.c ---- */

int index_load(struct store *s);
void store_empty_tmp(struct store *s);
void *store_recheck_sweep(void *arg); /* a thread: every source checked once */

#endif
