/* status_int.h - what the files of the status reply share; not for other
 * modules.
 *
 *   status_record.c  the figures of a part of the tree without the NAS:
 *                    the files the local record holds under it and the
 *                    blobs the store knows there
 *   status.c         the reply: each repo from one walk of the NAS while
 *                    it answers (else status_record.c), with its
 *                    revisions and the ref pins' from that same walk, and
 *                    the rest of the daemon's state
 */
#ifndef WFS_STATUS_INT_H
#define WFS_STATUS_INT_H

#include "collect.h"
#include "control.h"
#include "record.h"

#include <jansson.h>
#include <stdint.h>
#include <string.h>

/* The figures of a part of the tree. */
struct tally {
	json_int_t files, bytes, local_files, local_bytes, pinned_files;
	json_int_t partial_files, partial_bytes; /* not local whole: local ranges */
	json_int_t per_state[BLOB_NSTATES];
};

/* Strings (NAS paths, names) each with a size: one array of pairs, so
 * that a sort keeps each size with its key. */
struct status_key {
	char *key;
	uint64_t size;
};

struct keys {
	struct status_key *v;
	size_t n, cap;
};

int status_keys_add(struct keys *k, const char *key, uint64_t size);
void status_keys_clear(struct keys *k);
void status_keys_free(struct keys *k);

/* For qsort of struct status_key by key. */
static inline int status_cmp_key(const void *a, const void *b)
{
	return strcmp(((const struct status_key *)a)->key, ((const struct status_key *)b)->key);
}

/* For qsort of an array of strings. */
static inline int status_cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A revision's figures, as the walk of its repo found them. */
struct rev_tally {
	char *rel;          /* "<repo>/snapshots/<rev>" */
	struct tally t;
};

/* One status reply's way to the tree.  @online: the NAS may be walked;
 * once it is found down it stays 0 for the rest of the reply. */
struct view {
	struct control *c;
	int online;
	int64_t walk_until;       /* store_now_ms() past which the NAS is not
				   * walked on (0: no limit) */
	int cut;                  /* the walk passed @walk_until */
	int others;               /* another user asks (peeras.h): what the record
				   * and the store know is not for it */
	struct blob_set set;      /* scratch: blobs the store knows */
	struct nas_set nas;       /* scratch: files it does not (online) */
	struct keys keys;         /* scratch: files found without the NAS */
	struct record_entry *e;   /* scratch for record_lookup (large) */
	/* the revisions the repos' walks found, sorted by rel once each walk
	 * is done: a revision's line and a ref pin's figures come from there,
	 * not from a walk of their own */
	struct rev_tally *revs;
	size_t nrevs, caprevs;
};

/* The scratch entry for record lookups (NULL: no record, or no memory:
 * then nothing is read from the record). */
struct record_entry *status_view_entry(struct view *v);

/* @rel without the NAS: the files the record holds under it and the blobs
 * the store knows under it, as blobs in @v->set; files the store has no
 * blob for are counted in @t as on the NAS (added to what @t holds). */
void status_known_under(struct view *v, const char *rel, struct tally *t);

#endif
