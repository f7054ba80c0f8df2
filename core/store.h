/* store.h - the blob table and the local store: which NAS files have a
 * verified local copy, the promotion queue and its workers, the room the
 * copies may take, what gets promoted by itself, the index.
 *
 * A blob is one NAS file (keyed by its physical path).  Its state moves
 *   NAS -> QUEUED -> COPYING -> VERIFYING -> LOCAL
 * and back to NAS on failure, eviction, or a source that changed.  A copy
 * serves reads only once LOCAL: copied, re-read from disk, hashes equal,
 * content address checked, renamed into data/.  Knows nothing of FUSE; the
 * daemon tells it of opens, reads and closes (store_note_*), and is told of
 * demotions through a callback.
 *
 * Room: every copy reserves its size (in blocks) before it starts; the
 * copies, the reservations of copies in flight and evicted copies still
 * open never pass the size limit, and the filesystem keeps its free-space
 * floor.  What does not fit evicts least recently used copies that are
 * neither pinned nor open; what still does not fit stays on the NAS with
 * the reason in blob->reason.
 *
 * Files: store.c (table, queue, workers, hooks), store_space.c (room),
 * store_auto.c (the policy thread: hot blobs, sibling shards), store_refs.c
 * (ref pins), store_index.c (the index and the source checks).
 */
#ifndef WFS_STORE_H
#define WFS_STORE_H

#include "fetch.h"
#include "policy.h"
#include "resolve.h"

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

/* Why a blob that was wanted stays on the NAS (its reason says more). */
enum blob_hold {
	HOLD_NONE = 0,
	HOLD_EXCLUDED, /* a name of it matches an exclusion glob */
	HOLD_NO_ROOM,  /* the size limit or the free-space floor */
};

/* Why promotions failed, for the metrics (wfs_promotions_failed_total). */
enum store_fail {
	STORE_FAIL_NO_SPACE = 0,
	STORE_FAIL_SOURCE_CHANGED,
	STORE_FAIL_IO,
	STORE_FAIL_OTHER,
	STORE_FAIL_N,
};

struct blob {
	struct blob *hnext, *qnext, *hot_next;
	char *key;                  /* physical NAS path */
	/* The repo's name for it: a content address (64 or 40 hex) as a rule;
	 * a longer name is cut, which no content address is. */
	char id[96];
	uint64_t size;
	struct timespec nas_mtime, nas_ctime;
	enum blob_state state;
	int pinned, explicit_req;
	int in_queue;               /* linked in the queue (maybe no longer QUEUED) */
	int checked;                /* source sample re-checked since start-up */
	char xxh[33];               /* content hash of the local copy */
	char sample[33];            /* source identity: size + sampled hash */
	char reason[256];           /* why the last promotion failed / it stays on the NAS */
	enum blob_hold hold;
	int64_t last_used;          /* seconds (index, status) */
	_Atomic uint64_t use_ns;    /* last open or local read, CLOCK_REALTIME: the LRU order */
	uint64_t want_ns;           /* when it was queued: room is made only from copies
				     * used before that (no churn within one request) */
	uint64_t fs_ino;            /* the daemon's node for it, for invalidation */
	struct fetch_progress prog;
	_Atomic uint64_t nas_bytes, local_bytes, opens, nas_opens;
	/* under the lock: */
	char *name;                 /* a mount-relative name it was opened by, or NULL */
	int open_count;             /* opens in the daemon now: never evicted for room */
	uint64_t held;              /* an evicted copy still open: its space, until the last close */
	uint64_t reserved;          /* space reserved by the copy in flight */
	char *tmp;                  /* the copy in flight's temporary file */
	_Atomic int hot;            /* handed to the policy thread; not again until reset */
	int hot_listed;             /* on the policy thread's list */
	uint64_t hot_bytes, hot_opens; /* nas_bytes, nas_opens when @hot was last reset */
};

struct store_hooks {
	void *arg;
	void (*log)(void *arg, int prio, const char *msg);
	/* The bytes under this blob may have changed: drop cached pages. */
	void (*changed)(void *arg, uint64_t fs_ino);
};

struct store_opts {
	unsigned workers;     /* concurrent copies */
	uint64_t bw_limit;    /* bytes/s for promotion reads, all copies together; 0 = none */
	const struct policy_opts *policy; /* NULL: no automatic promotion, no limits */
	const struct hub_roots *roots;    /* NULL: names unknown (siblings, exclusion by
					   * snapshot name, ref pins are off) */
};

/* A ref pin: keep the revision a ref of a repo names local and pinned,
 * following the ref when it moves. */
struct store_ref {
	char repo[NAME_MAX + 1];
	char ref[NAME_MAX + 1];     /* "main", "pr/1": a file under <repo>/refs */
	char commit[NAME_MAX + 1];  /* the revision kept ("" until the first is local) */
	char pending[NAME_MAX + 1]; /* the revision it moves to, being promoted */
	char reason[256];           /* why it is not moving on, if it is stuck */
	time_t retry_at;            /* failed copies of @pending are retried after */
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
	int index_dirty;          /* verified copies the index does not name yet */
	int64_t index_written_ms;
	uint64_t tmp_serial;
	/* room (under the lock) */
	uint64_t reserved;          /* by copies in flight */
	uint64_t held;              /* by evicted copies still open */
	uint64_t blk;               /* block size of LOCAL_STORE's filesystem */
	unsigned auto_max, auto_running; /* automatic copies at once: at most, now */
	/* the policy thread (under the lock) */
	pthread_cond_t auto_cond;
	struct blob *hot_head, *hot_tail;
	struct store_ref *refs;
	size_t nrefs;
	int refs_poked;             /* look at the refs now */
	/* counters since start */
	_Atomic uint64_t promoted, failed, mismatches, demoted, evicted;
	_Atomic uint64_t started, cancelled, failed_by[STORE_FAIL_N];
	_Atomic uint64_t auto_queued, no_room, excluded;
	_Atomic uint64_t passthrough_opens; /* the daemon adds to it */
};

const char *blob_state_name(enum blob_state s);

/* Create the store's directories, empty tmp/, load the index (a quick check
 * per entry: local file size, NAS size).  Returns -errno. */
int store_open(struct store *s, const char *dir, const struct store_opts *opt,
	       const struct store_hooks *hooks);
/* Start the copy workers, the source re-check sweep and the policy thread. */
int store_start(struct store *s);
/* Cancel copies in flight (their temporary files are removed), stop the
 * threads, write the index. */
void store_close(struct store *s);

/* The blob for the NAS file @key (stat @st); created in state NAS.  @id is
 * the name a repo gives it ("" if none).  If the NAS size or times differ
 * from what the blob recorded, the source is re-checked (and a local copy
 * that no longer matches is demoted).  Never NULL except on ENOMEM. */
struct blob *store_blob(struct store *s, const char *key, const struct stat *st, const char *id);

/* The NAS shows @st for @b's source (an open's fstat): as store_blob. */
void store_source_attrs(struct store *s, struct blob *b, const struct stat *st);

/* The blob if known, else NULL. */
struct blob *store_find(struct store *s, const char *key);

/* Path of the verified local copy of @b (valid while LOCAL). */
int store_local_path(struct store *s, const struct blob *b, char *out, size_t sz);

/* Before serving a LOCAL blob for the first time since start-up, compare
 * the source's sampled hash.  Returns 1 if it may be served locally. */
int store_check_source(struct store *s, struct blob *b);

/* ---- the daemon's hooks (fs/file.c) ----
 * open: @b was opened by the mount-relative name @rel (may be NULL); it is
 * not evicted for room until the matching close.  read: @bytes were served,
 * from the local copy or the NAS: NAS bytes and opens make a blob hot, and a
 * hot blob is promoted in the background.  close: after the daemon has
 * closed its descriptors of this open (the space of an evicted copy comes
 * back then).  All are cheap; read takes no lock unless the blob turns hot. */
void store_note_open(struct store *s, struct blob *b, const char *rel);
void store_note_read(struct store *s, struct blob *b, uint64_t bytes, int local);
void store_note_close(struct store *s, struct blob *b);

/* Queue a promotion; explicit requests go before automatic ones. */
int store_promote(struct store *s, struct blob *b, int pin, int explicit_req);
/* Drop the local copy (pinned ones only with @force).  Returns 1 when
 * evicted, 0 when nothing to do, -EBUSY when pinned. */
int store_evict(struct store *s, struct blob *b, int force);
int store_pin(struct store *s, struct blob *b, int pin);
/* Re-check the source (and with @full re-hash the local copy).  Returns 1
 * when the blob was demoted, with @reason set. */
int store_verify(struct store *s, struct blob *b, int full, char *reason, size_t rsz);
/* Mark @b as kept on the NAS by an exclusion glob (@why says which). */
void store_exclude(struct store *s, struct blob *b, const char *why);

struct store_usage {
	uint64_t blobs, bytes, free_bytes, queued, copying;
	uint64_t used;       /* what the copies take, in blocks (what the limit counts) */
	uint64_t reserved;   /* by copies in flight */
	uint64_t held;       /* by evicted copies still open */
	uint64_t limit;      /* store_max, 0 = none */
	uint64_t floor;      /* free space kept on the filesystem */
	uint64_t fs_bytes;   /* size of the filesystem */
	uint64_t pinned_bytes, open_bytes; /* of the local copies: never evicted for room */
};
void store_usage(struct store *s, struct store_usage *u);
/* Bytes a new copy could take now without evicting anything (the limit and
 * the floor both allow it); @evictable (may be NULL) gets what evicting every
 * copy neither pinned nor open would add. */
uint64_t store_room(struct store *s, uint64_t *evictable);

/* Copy of a blob's state fields under the lock (not its strings). */
void blob_snapshot(struct store *s, const struct blob *b, struct blob *out);

/* Call @fn for every blob (under the lock: @fn must not call the store). */
void store_each(struct store *s, void (*fn)(void *arg, const struct blob *b), void *arg);

int store_write_index(struct store *s);

/* ---- ref pins (store_refs.c) ----
 * Pin the revision refs/@ref of @repo names: its blobs are pinned and
 * promoted now; when the ref moves, the new revision is, and the old one's
 * blobs are unpinned once the new one is local.  Persisted in the index.
 * @commit receives the revision.  -ENOENT: no such repo/ref/revision. */
int store_ref_pin(struct store *s, const char *repo, const char *ref, char *commit, size_t csz);
/* Drop the ref pin and unpin its revisions' blobs (unless another ref pin
 * keeps them).  -ENOENT when there was none. */
int store_ref_unpin(struct store *s, const char *repo, const char *ref);
/* A copy of the ref pins (malloc'ed; *n entries). */
struct store_ref *store_refs(struct store *s, size_t *n);
/* Wake the policy thread to look at the refs now. */
void store_refs_poke(struct store *s);

#endif
