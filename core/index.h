/* index.h - the state index: which blobs have verified local copies.
 *
 * One JSON document, replaced atomically: written to a temporary file,
 * fsynced, renamed over the old one, directory fsynced.  A crash leaves
 * either the old index or the new one, never a mix.  Written a blob a line
 * and read back a line at a time (jtext.h, jflat.h); any other layout of
 * the same JSON is read too.
 *
 * Versions: 2 records, per local copy, what proves the file untouched since
 * it was verified (its inode number, mtime and ctime; its size is the
 * blob's).  1 (before) did not; it is still read, its copies then carry no
 * proof (copy_ino 0).  3 adds the state "partial": a blob with verified
 * local ranges (store_part.c), each with its offset, length and XXH3-128,
 * and the partial file's identity; 1 and 2 have none and are read as
 * before.  4 keeps a blob's two reasons to be pinned apart: "pinned" is a
 * pin by hand (wfsctl pin PATH, promote --pin) and "ref_pinned" a ref
 * pin's (pins.c), so that a ref pin moving on unpins only its own.  1 to 3
 * had one "pinned" for both: it is read as a hand pin, which never loses a
 * user's pin (a blob only a ref pin held then stays pinned until unpinned
 * by hand).  Only 4 is written.
 */
#ifndef WFS_INDEX_H
#define WFS_INDEX_H

#include <stdint.h>
#include <time.h>

#include "range.h"

#define INDEX_VERSION 4
/* An index is refused unread past this size: a damaged or hostile file
 * must not make the daemon parse gigabytes at start-up.  A record takes
 * about 700 bytes, so this is some 350,000 local copies and pins; a store
 * that outgrows it cannot write its index (index_write: -EFBIG) and keeps
 * the last one that fit. */
#define INDEX_MAX_BYTES ((long long)256 << 20)

struct index_rec {
	const char *key;    /* physical NAS path; "" when the record has none (damage) */
	const char *id;
	const char *state;  /* "local", "mismatch", "partial" or "nas" (pinned only) */
	const char *xxh;    /* content hash of the local copy */
	const char *sample; /* source identity */
	const char *reason;
	const char *name;   /* a mount-relative name it was opened or collected by
			     * ("" none; written since 2026-12-04, version 4 all the
			     * same: an older wfs reads past it) */
	uint64_t size;
	struct timespec mtime, ctime;
	int64_t last_used;  /* seconds */
	uint64_t use_ns;    /* the same, finer (the LRU order); 0 in older indexes */
	int pinned;         /* by hand */
	int ref_pinned;     /* by a ref pin (version 4; 0 before) */
	/* "local" only: the copy's identity when it was verified; copy_ino 0:
	 * none recorded (a version 1 index) */
	uint64_t copy_ino;
	struct timespec copy_mtime, copy_ctime;
	/* "partial" only: its verified ranges (read: sorted as written, the
	 * reader checks them) and the partial file's identity */
	const struct part_range *ranges;
	size_t nranges;
	uint64_t part_ino;
	struct timespec part_mtime, part_ctime;
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

/* Call the callbacks for each record.  Returns the version read (1 to 4),
 * 0 when there is no index, a callback's error, or what makes the file
 * unreadable, before any callback is called:
 *   > INDEX_VERSION  the version of an index a later wfs wrote (INT_MAX
 *            at most): no record read, no callback called
 *   -EFBIG   larger than INDEX_MAX_BYTES (not read at all)
 *   -EINVAL  not JSON, truncated, not an index, or a version below 1
 *   other    -errno of open or read (-ELOOP: a symbolic link) */
int index_read(const char *path, const struct index_cb *cb);

/* Write the index (version 4, mode 0600: only the owner may read what is
 * local and where).  Returns 0 or -errno; -EFBIG past INDEX_MAX_BYTES, the
 * old index untouched. */
int index_write(const char *path, const struct index_rec *recs, size_t n,
		const struct index_ref *refs, size_t nrefs);

#endif
