/* pins.h - ref pins: "keep the revision refs/<ref> of <repo> names local
 * and pinned, and follow the ref when it moves" (wfsctl pin --ref).
 *
 * Part of the promotion policy, above the store: it decides which blobs a
 * revision means (collect.c) and pins and queues them through the store;
 * the store only persists the pins with its index.  When the ref moves,
 * the new revision is promoted, and once all of it is local the old one's
 * blobs are unpinned (unless another ref pin keeps them).  A ref pin sets
 * and clears only its own reason (PIN_REF, store.h): a blob pinned by hand
 * too stays pinned.  The policy thread
 * (auto.c) calls pins_poll every ref_poll seconds.  A copy of a pin's that
 * fails is retried by the store, with backoff, while its blob stays pinned
 * (STORE_BY_PIN, store.h).
 *
 * Concurrency: every operation (pin, unpin, poll) runs whole under
 * @op_lock, so none sees another's half-done work or writes back a stale
 * copy (no lost pin, no orphaned one); @lock guards the table for the
 * quick readers (status).  Lock order: op_lock -> store locks; @lock is a
 * leaf (nothing is called while it is held).  A client's request waits
 * for @op_lock only while the NAS is up: the operation before it may be
 * stuck in a NAS listing that hangs (pins.c op_lock_request).
 *
 * Crash order: the index (pins and blobs' reasons together) may be
 * written by a copy worker between any two steps.  A pin is saved before
 * its blobs are pinned and its end before they are unpinned, so a stop
 * leaves at worst blobs pinned by no pin, which the first poll unpins
 * (a pin whose revision is not pinned would let its copies be evicted).
 * A poll's own unpins come before it saves the pin's move: a stop then
 * leaves the old revision saved, which the next poll lets go again.
 */
#ifndef WFS_PINS_H
#define WFS_PINS_H

#include "policy.h"
#include "resolve.h"
#include "store.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>

struct pin {
	char repo[NAME_MAX + 1];
	char ref[NAME_MAX + 1];     /* "main", "pr/1": a file under <repo>/refs */
	char commit[NAME_MAX + 1];  /* the revision kept ("" until the first is local) */
	char pending[NAME_MAX + 1]; /* the revision it moves to, being promoted */
	char reason[256];           /* why it is not moving on, if it is stuck */
};

struct pins {
	pthread_mutex_t op_lock;    /* one operation at a time (see above) */
	pthread_mutex_t lock;       /* @v, @n */
	struct store *store;        /* IMMUTABLE after pins_open */
	const struct hub_roots *roots;
	const struct policy_opts *policy;
	struct pin *v;              /* @lock to read; @op_lock and @lock to change */
	size_t n;
	_Atomic int poked;          /* look at the refs now (pins_poke) */
	int orphans_checked;        /* @op_lock: unpin_orphans done */
};

/* The pins the store's index holds.  @roots NULL: pins are unavailable
 * (-ENOTSUP).  Returns -errno. */
int pins_open(struct pins *p, struct store *s, const struct hub_roots *roots,
	      const struct policy_opts *policy);
void pins_close(struct pins *p);

/* Pin the revision refs/@ref of @repo names: its blobs are pinned and
 * queued now, the pin persisted before the return.  @commit receives the
 * revision.  Returns the number of blobs pinned (excluded ones are not),
 * -ENOENT (no such repo, ref or revision), -EINVAL (a bad name),
 * -EMEDIUMTYPE (not a repo's folder), -ENOTSUP, or -errno of the walk of
 * the revision (the NAS): on any error nothing is pinned or saved -- but
 * for the -errno of the index write (ENOSPC, EIO) after the pin is made:
 * in place then, and not saved. */
int pins_pin(struct pins *p, const char *repo, const char *ref, char *commit, size_t csz);
/* Drop the pin and unpin its revisions' blobs (unless another ref pin
 * keeps them; a blob pinned by hand too stays pinned: store.h
 * PIN_HAND).  Returns the number unpinned, -ENOENT when there was no pin,
 * or the -errno of a listing of its revisions or another pin's that failed
 * (the NAS): the pin is kept then, nothing unpinned; or the -errno of the
 * index write after it is dropped (dropped, not saved). */
int pins_unpin(struct pins *p, const char *repo, const char *ref);
/* A copy of the pins (malloc'ed; *n entries). */
struct pin *pins_list(struct pins *p, size_t *n);

/* Follow every pin once (the policy thread). */
void pins_poll(struct pins *p);
/* Ask the policy thread to poll now. */
void pins_poke(struct pins *p);
/* Was pins_poke called since the last call? */
int pins_take_poke(struct pins *p);

/* Read <repo>/refs/<ref> on the NAS: a revision name.  Returns -errno. */
int refs_read(const struct hub_roots *roots, const char *repo, const char *ref, char *out,
	      size_t sz);

#endif
