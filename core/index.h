/* index.h - the state index: which blobs have verified local copies.
 *
 * One JSON document (jansson), replaced atomically: written to a temporary
 * file, fsynced, renamed over the old one, directory fsynced.  A crash
 * leaves either the old index or the new one, never a mix.
 */
#ifndef WFS_INDEX_H
#define WFS_INDEX_H

#include <stdint.h>
#include <time.h>

struct index_rec {
	const char *key;    /* physical NAS path */
	const char *id;
	const char *state;  /* "local", "mismatch" or "nas" (pinned only) */
	const char *xxh;    /* content hash of the local copy */
	const char *sample; /* source identity */
	const char *reason;
	uint64_t size;
	struct timespec mtime, ctime;
	int64_t last_used;  /* seconds */
	uint64_t use_ns;    /* the same, finer (the LRU order); 0 in older indexes */
	int pinned;
};

/* A ref pin (wfsctl pin --ref): the revision kept, and the one it moves to. */
struct index_ref {
	const char *repo, *ref, *commit, *pending;
};

struct index_cb {
	void *arg;
	int (*blob)(void *arg, const struct index_rec *r);
	int (*ref)(void *arg, const struct index_ref *r); /* may be NULL */
};

/* Call the callbacks for each record; a missing index is an empty one.
 * Returns -errno, or -EINVAL for an index that cannot be parsed. */
int index_read(const char *path, const struct index_cb *cb);

int index_write(const char *path, const struct index_rec *recs, size_t n,
		const struct index_ref *refs, size_t nrefs);

#endif
