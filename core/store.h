/* store.h - the blob table and the local store: which NAS files have a
 * verified local copy, the promotion queue and its workers, the index.
 *
 * A blob is one NAS file (keyed by its physical path).  Its state moves
 *   NAS -> QUEUED -> COPYING -> VERIFYING -> LOCAL
 * and back to NAS on failure, eviction, or a source that changed.  A copy
 * serves reads only once LOCAL: copied, re-read from disk, hashes equal,
 * content address checked, renamed into data/.  Knows nothing of FUSE; the
 * daemon is told of demotions through a callback.
 */
#ifndef WFS_STORE_H
#define WFS_STORE_H

#include "fetch.h"

#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>

enum blob_state {
	BLOB_NAS = 0,
	BLOB_QUEUED,
	BLOB_COPYING,
	BLOB_VERIFYING,
	BLOB_LOCAL,
	BLOB_MISMATCH, /* the NAS bytes do not match the content-address name */
	BLOB_FAILED,   /* the last copy failed; served from the NAS */
};

struct blob {
	struct blob *hnext, *qnext;
	char *key;                  /* physical NAS path */
	char id[NAME_MAX + 1];      /* blob id (the repo's name for it) */
	uint64_t size;
	struct timespec nas_mtime, nas_ctime;
	enum blob_state state;
	int pinned, explicit_req;
	int checked;                /* source sample re-checked since start-up */
	char xxh[33];               /* content hash of the local copy */
	char sample[33];            /* source identity: size + sampled hash */
	char reason[256];           /* why the last promotion failed */
	int64_t last_used;
	uint64_t fs_ino;            /* the daemon's node for it, for invalidation */
	struct fetch_progress prog;
	_Atomic uint64_t nas_bytes, local_bytes, opens;
};

struct store_hooks {
	void *arg;
	void (*log)(void *arg, int prio, const char *msg);
	/* The bytes under this blob may have changed: drop cached pages. */
	void (*changed)(void *arg, uint64_t fs_ino);
};

struct store_opts {
	unsigned workers;     /* concurrent copies */
	uint64_t bw_limit;    /* bytes/s for promotion reads, 0 = none */
};

struct store {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	pthread_mutex_t index_lock; /* one index writer at a time */
	char dir[PATH_MAX], data_dir[PATH_MAX + 8], tmp_dir[PATH_MAX + 8];
	char index_path[PATH_MAX + 16];
	struct blob **buckets;
	size_t nbuckets, count;
	struct blob *qhead, *qtail;
	int stop;
	pthread_t *threads;
	unsigned nthreads;
	struct store_opts opt;
	struct store_hooks hooks;
	uint64_t tmp_serial;
	/* counters since start */
	_Atomic uint64_t promoted, failed, mismatches, demoted, evicted;
};

const char *blob_state_name(enum blob_state s);

/* Create the store's directories, empty tmp/, load the index (a quick check
 * per entry: local file size, NAS size).  Returns -errno. */
int store_open(struct store *s, const char *dir, const struct store_opts *opt,
	       const struct store_hooks *hooks);
int store_start(struct store *s);
/* Cancel copies in flight (their temporary files are removed), stop the
 * workers, write the index. */
void store_close(struct store *s);

/* The blob for the NAS file @key (stat @st); created in state NAS.  @id is
 * the name a repo gives it ("" if none).  If the NAS size or times differ
 * from what the blob recorded, the source is re-checked (and a local copy
 * that no longer matches is demoted).  Never NULL except on ENOMEM. */
struct blob *store_blob(struct store *s, const char *key, const struct stat *st, const char *id);

/* The blob if known, else NULL. */
struct blob *store_find(struct store *s, const char *key);

/* Path of the verified local copy of @b (valid while LOCAL). */
int store_local_path(struct store *s, const struct blob *b, char *out, size_t sz);

/* Before serving a LOCAL blob for the first time since start-up, compare
 * the source's sampled hash.  Returns 1 if it may be served locally. */
int store_check_source(struct store *s, struct blob *b);

/* Queue a promotion; explicit requests go before automatic ones. */
int store_promote(struct store *s, struct blob *b, int pin, int explicit_req);
/* Drop the local copy (pinned ones only with @force).  Returns 1 when
 * evicted, 0 when nothing to do, -EBUSY when pinned. */
int store_evict(struct store *s, struct blob *b, int force);
int store_pin(struct store *s, struct blob *b, int pin);
/* Re-check the source (and with @full re-hash the local copy).  Returns 1
 * when the blob was demoted, with @reason set. */
int store_verify(struct store *s, struct blob *b, int full, char *reason, size_t rsz);

struct store_usage {
	uint64_t blobs, bytes, free_bytes, queued, copying;
};
void store_usage(struct store *s, struct store_usage *u);

/* Copy of a blob's state fields under the lock. */
void blob_snapshot(struct store *s, const struct blob *b, struct blob *out);

/* Call @fn for every blob (under the lock: @fn must not call the store). */
void store_each(struct store *s, void (*fn)(void *arg, const struct blob *b), void *arg);

int store_write_index(struct store *s);

#endif
