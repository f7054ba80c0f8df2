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
	int64_t last_used;
	int pinned;
};

/* Call @fn for each record; a missing index is an empty one.  Returns
 * -errno, or -EINVAL for an index that cannot be parsed. */
int index_read(const char *path, int (*fn)(void *arg, const struct index_rec *r), void *arg);

int index_write(const char *path, const struct index_rec *recs, size_t n);

#endif
