/* store.h - the store: the blob table, the verified local copies and the
 * room they take, the copy queue and its workers, the index on disk.
 *
 * Layers (DESIGN.md "Layers"), read top to bottom; no file calls up:
 *   fs/ (FUSE glue), control.c (control server), metrics.c, doctor.c
 *   auto.c (automatic promotion), pins.c (ref pins), collect.c (which blobs
 *     a repo, revision, path or glob means)          -- the promotion policy
 *   store.c (table, state, hooks), store_copy.c (queue, workers, publish),
 *     store_space.c (room), store_verify.c (every check that lets a copy
 *     serve), store_index.c (index.json), store_part.c and
 *     store_part_copy.c (partial copies: local ranges) -- the store
 *   ns.c, resolve.c (namespace), fetch.c (the verified copy), index.c,
 *     hash.c, policy.c (pure rules), path.c, file.c   -- below the store
 *
 * A blob is one NAS file (keyed by its physical path).  Its state moves
 *   NAS -> QUEUED -> COPYING -> LOCAL
 * and back to NAS on failure, eviction, or a source that changed.  A copy
 * serves reads only once LOCAL: copied, re-read from disk, hashes equal,
 * content address checked, renamed into data/ (store_verify.c says where
 * each of those checks is made); a blob whose bytes are a local copy's
 * already is hashed from the NAS and shares that copy (store_copy.c,
 * adopt_one).  A copy the index names but cannot prove
 * untouched since (index.h: inode, size, mtime, ctime) starts in COPYING,
 * re-hashed in the background, and goes LOCAL or, removed, to NAS.  Knows
 * nothing of FUSE; the daemon tells it of opens, reads and closes
 * (store_note_*), and is told of demotions through a hook.
 *
 * Room: every copy reserves its size (in blocks) before it starts; the
 * copies, the reservations of copies in flight and evicted copies still
 * open never pass the size limit, and the filesystem keeps its free-space
 * floor.  What does not fit evicts least recently used copies that are
 * neither pinned nor open; what still does not fit stays on the NAS with
 * the reason in the blob's reason.  A copy shared by several blobs (one
 * file per content hash) counts once and is freed with the last of them
 * (store_space.c).
 *
 * The index: changes mark it dirty; it is written once per control request
 * (the server calls store_sync), when a batch of copies ends (the worker
 * that finds the queue empty), when it has been dirty for INDEX_FLUSH_MS
 * or ten times what the last write took, whichever is longer (long
 * batches; changes the read path noticed: an index of 40,000 blobs takes
 * 0.3-1.5 s to write), and at close -- never once per blob.  A copy the
 * index does not name yet is an orphan after a crash: removed at start-up,
 * never served; a demotion it does not record yet is found again by the
 * checks at start-up or first open.
 *
 * LOCK ORDER, for the whole daemon (take left before right, never the
 * reverse; a lock not listed is a leaf taken with nothing else held):
 *   pins.lock -> fs locks (fh.lock, nodes.lock) -> store.index_lock
 *     -> store.lock -> hook locks (the fs invalidation queue's lock)
 * store.lock is never held across NAS I/O, copies or hashing (a statvfs of
 * LOCAL_STORE, stats and unlinks of its files, and the rename into data/
 * of a partial copy made whole, with its directory's fsync, are the
 * exceptions: so a stop may always take it, store_leave); the
 * hooks are called with it held and must not block or call the store.  The
 * NAS gate's lock (nasgate.h) is a leaf: the store calls the gate with no
 * lock of its own held, but for nas_gate_up, a lock-free read (the copy
 * workers look at it under store.lock before they take a copy).
 *
 * The NAS failing: a verified copy is never dropped or demoted because the
 * NAS cannot be reached -- only positive evidence demotes (the source gone,
 * another size, another sampled hash; store_verify.c).  A check the NAS
 * cannot answer leaves the copy serving and unchecked, to be checked once
 * the NAS answers.  Copies that fail are retried with backoff (enum
 * store_who).
 */
#ifndef WFS_STORE_H
#define WFS_STORE_H

#include "fetch.h"
#include "htab.h"
#include "range.h"
#include "policy.h"
#include "resolve.h"

struct nas_gate;

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>

#define INDEX_FLUSH_MS 2000
/* While the NAS is down no copy starts (a read could hang, or fail): the
 * queue waits, and the workers look at the NAS's state this often (the
 * gate has no callback). */
#define STORE_QUEUE_LOOK_MS 200

enum blob_state {
	BLOB_NAS = 0,
	BLOB_QUEUED,
	BLOB_COPYING,
	BLOB_LOCAL,
	BLOB_MISMATCH, /* the NAS bytes do not match the content-address name */
	BLOB_FAILED,   /* the last copy failed; served from the NAS */
	BLOB_NSTATES,
};

/* Why a blob that was wanted stays on the NAS (its reason says more). */
enum blob_hold {
	HOLD_NONE = 0,
	HOLD_EXCLUDED, /* a name of it matches an exclusion glob */
	HOLD_NO_ROOM,  /* the size limit or the free-space floor */
};

/* Who asked for a copy (store_request).  Retries: a copy of the policy's
 * that fails (automatic promotions; the revisions of ref pins, pins.c) is
 * queued again by the store itself, after STORE_RETRY_FIRST_MS, doubling
 * at every failure in a row up to STORE_RETRY_MAX_MS, and at once when the
 * NAS gate comes back up; a blob in its backoff is not queued again by a
 * request of the policy's before then.  A user's request (wfsctl promote)
 * is never retried by the store -- the user sees the failure -- and is not
 * held back by a backoff either: the user asked now. */
enum store_who {
	STORE_BY_USER = 0, /* wfsctl promote: before automatic requests */
	STORE_BY_AUTO,     /* automatic promotion (the policy thread) */
	STORE_BY_PIN,      /* a ref pin's revision: before automatic requests; retried
			    * while the blob stays pinned */
};
#define STORE_RETRY_FIRST_MS 2000
#define STORE_RETRY_MAX_MS (5 * 60 * 1000)

/* Why a blob is pinned (struct blob's @pinned is a mask of them): by hand
 * (wfsctl pin PATH, promote --pin) and by a ref pin whose revision holds it
 * (pins.c).  Each is set and cleared on its own, so a ref pin that moves on
 * or is dropped never takes a user's hand pin with it, nor a hand unpin a
 * ref pin's blob.  Pinned for eviction and room: either one. */
enum store_pin_why {
	PIN_HAND = 1,
	PIN_REF = 2,
};

/* Why promotions failed, for the metrics (wfs_promotions_failed_total). */
enum store_fail {
	STORE_FAIL_NO_SPACE = 0,
	STORE_FAIL_SOURCE_CHANGED,
	STORE_FAIL_IO,
	STORE_FAIL_OTHER,
	STORE_FAIL_N,
};

/* The routes the daemon's reads take besides plain calls, each as the
 * kernel and the daemon's confinement settled it (fs/ says so; stats
 * reports it): passthrough (the kernel reads a file itself), io_uring (NAS
 * reads and copies), fuse_uring (requests taken through io_uring). */
enum store_route {
	STORE_ROUTE_PASSTHROUGH = 0,
	STORE_ROUTE_IO_URING,
	STORE_ROUTE_FUSE_URING,
	STORE_ROUTES,
};
enum store_route_state {
	STORE_ROUTE_STARTING = 0, /* not settled yet (before the INIT reply) */
	STORE_ROUTE_ON,
	STORE_ROUTE_OFF,          /* turned off by an option */
	STORE_ROUTE_NOT_OFFERED,  /* the kernel does not offer it */
	STORE_ROUTE_REFUSED,      /* refused (a seccomp filter, a capability): the error says */
	STORE_ROUTE_STATES,
};

/* The mount's read-ahead as the daemon asked for it (fs/connready.c):
 * what it asked, whether its write failed, and the file that says what is
 * in effect (read at each metrics_collect: an operator may set it from
 * outside, where a container's read-only /sys refused the daemon). */
struct store_readahead {
	unsigned want_kb; /* 0: left to the kernel (-o readahead_kb=0) */
	int err;          /* -errno of the daemon's write; 0: written or not tried */
	char path[64];    /* /sys/class/bdi/MAJ:MIN/read_ahead_kb; "": the bdi not known */
};

/* What proves a local file is the one that was verified: a write to it
 * changes its ctime, which utimes cannot set back.  ino 0: nothing proven
 * (store_table.c: file_proof_take, file_proof_holds). */
struct file_proof {
	uint64_t ino;
	struct timespec mtime, ctime;
};

/* The local ranges of a blob that is not copied whole: its partial copy,
 * parts/<XXH3-128 of the key>, a sparse file of the blob's size holding
 * the verified ranges at their own offsets (store_part.c says how a range
 * is copied, verified, kept, served and dropped).  Every field LOCK; the
 * struct lives while a range copy is in flight (@copying), even dropped. */
struct blob_part {
	struct part_range *v;       /* verified: sorted, disjoint, kept apart */
	size_t n, cap;
	uint64_t bytes;             /* their total */
	struct brange *want;        /* asked for, not copied yet: in order */
	size_t nwant, capwant;
	uint64_t want_total, want_done; /* of the requests since the last idle (progress) */
	struct file_proof proof;    /* the partial file after its last verified range: what
				     * lets the ranges serve after a restart */
	unsigned gen;               /* the partial file's generation: +1 when removed */
	int copying;                /* a range copy (or the re-hash) in flight */
	int unproven;               /* loaded without a matching identity: every range is
				     * re-hashed before any serves */
	int queued;                 /* on the store's part queue */
	int adopt;                  /* the ranges cover the blob: to become its whole copy,
				     * in place (store_part_copy.c) */
	int retire;                 /* 1: the blob is whole now, but the index on disk may
				     * still name the ranges: the partial file keeps its
				     * name until an index that does not is written
				     * (part_retire_locked); 2: that write is in flight */
	uint64_t retire_charge;     /* its blocks meanwhile, in store.held (0: a link of the
				     * copy, no room of its own) */
	struct blob *qnext;
	uint64_t reserved;          /* room reserved by the range copy in flight */
	struct brange inflight;     /* the piece that copy is writing (len 0: none): held
				     * as the wanted ones are, so no request asks for it
				     * again while it is off the want list */
	struct fetch_progress prog; /* ATOMIC: the range copy in flight */
	char reason[256];           /* why the last range copy failed; "" */
	uint64_t failed;            /* range copies failed since the last request */
};

/* One NAS file.  Outside the store, a struct blob is a handle: read it
 * only through blob_state() and blob_info().  Rules, field by field:
 * IMMUTABLE once inserted; LOCK: read and written under store.lock only;
 * ATOMIC: written under store.lock with a release store (or, for counters,
 * by anyone with relaxed adds), readable without the lock. */
struct blob {
	struct hlink hl;            /* LOCK: in the table (htab.h) */
	struct hlink xl;            /* LOCK: in store.by_xxh while @xxh is set */
	struct blob *qnext, *qprev, *hot_next; /* LOCK: queue, hot list */
	char *key;                  /* IMMUTABLE: physical NAS path */
	/* LOCK: the repo's name for it: a content address (64 or 40 hex) as a
	 * rule; a longer name is cut, which no content address is. */
	char id[96];                /* (set by blob_id_set_locked only) */
	struct hlink il;            /* LOCK: in store.by_id while @id is set */
	_Atomic uint64_t size;      /* ATOMIC (the read path's hotness check) */
	struct timespec nas_mtime, nas_ctime; /* LOCK */
	_Atomic enum blob_state state; /* ATOMIC: acquire loads in the read path */
	/* ATOMIC: +1 whenever a copy made before may no longer hold the blob's
	 * bytes: a demotion for cause (the source changed, the copy failed a
	 * check or a read; not an eviction), or new NAS attributes while it is
	 * not LOCAL (no check of its source follows then).  A file the daemon
	 * gave the kernel to read at one value holds the blob's bytes while the
	 * value lasts (fs/file.c: choose_mode). */
	_Atomic unsigned bytes_gen;
	/* ATOMIC: +1 whenever its local copy stops serving (demoted or
	 * evicted): a descriptor of the copy opened at one value is of an
	 * earlier copy at any other (a copy made again may have the same path). */
	_Atomic unsigned copy_gen;
	int pinned;                 /* LOCK: enum store_pin_why mask (0: not pinned) */
	int explicit_req;           /* LOCK */
	int auto_slot;              /* LOCK: its copy in flight holds one of auto_max's slots */
	int in_queue;               /* LOCK: linked in the queue (maybe no longer QUEUED) */
	int checked;                /* LOCK: source sample re-checked since start-up */
	char xxh[33];               /* LOCK: content hash of the local copy (set by
				     * blob_xxh_set_locked only; @state likewise) */
	/* LOCK: the local copy's identity when it was verified (a write to it
	 * changes its ctime): what lets the index's copy serve after a restart
	 * without a re-hash.  copy.ino 0: none (re-hashed at start-up). */
	struct file_proof copy;
	int reverify;               /* LOCK: the copy named by @xxh is re-hashed before it may
				     * serve (state COPYING; store_verify.c) */
	char sample[33];            /* LOCK: source identity: size + sampled hash */
	char reason[256];           /* LOCK: why the last promotion failed / it stays on the NAS */
	enum blob_hold hold;        /* LOCK */
	int64_t last_used;          /* LOCK: seconds (index, status) */
	_Atomic uint64_t use_ns;    /* ATOMIC: last open or local read, CLOCK_REALTIME_COARSE:
				     * the LRU order (a hint: relaxed) */
	uint64_t want_ns;           /* LOCK: when it was queued: room is made only from
				     * copies used before that (no churn within a request) */
	_Atomic uint64_t fs_ino;    /* ATOMIC: the daemon's node for it, for invalidation */
	struct fetch_progress prog; /* ATOMIC (fetch.h) */
	_Atomic uint64_t nas_bytes, local_bytes, opens, nas_opens; /* ATOMIC counters */
	char *name;                 /* LOCK: a mount-relative name it was opened or collected
				     * by (a snapshot name kept over any other), or NULL;
				     * in the index */
	int open_count;             /* LOCK: opens in the daemon now: never evicted for room */
	uint64_t held;              /* LOCK: an evicted copy still open: its space, until
				     * the last close */
	char open_xxh[33];          /* LOCK: evicted while open, its copy kept for another
				     * local blob sharing it: that copy's content hash (its
				     * readers may hold the file: not freed by evicting the
				     * others, held if removed); "" after the last close */
	char held_xxh[33];          /* LOCK: open when the copy of that content hash it read
				     * was removed: its readers hold the file.  The file's
				     * charge is in @held of one such blob, and passes to
				     * another still open at that one's last close; ""
				     * after the last close */
	uint64_t reserved;          /* LOCK: space reserved by the copy in flight (or the copy
				     * being re-hashed) */
	char *tmp;                  /* LOCK: the copy in flight's temporary file (re-hashed:
				     * the copy itself), for its allocated size */
	/* LOCK: its verified copy's content hash from the rename into data/
	 * until the copy's end is recorded: that name's file is its own then,
	 * and a blob of the same bytes demoted meanwhile must leave it
	 * (store_publishing_locked); "" otherwise */
	char pub_xxh[33];
	_Atomic int hot;            /* ATOMIC: handed to the policy; not again until reset */
	int hot_listed;             /* LOCK: on the hot list */
	_Atomic uint64_t hot_bytes; /* ATOMIC: nas_bytes when @hot was last reset */
	uint64_t hot_opens;         /* LOCK: nas_opens then */
	/* The backoff (store.h "Retries"): copies failed in a row -- a local
	 * copy found unreadable counts as one --, 0 again once a copy is
	 * verified; and when the next may start: no request of the policy's
	 * queues it before @retry_at_ms (CLOCK_MONOTONIC; 0 with @fail_count). */
	unsigned fail_count;        /* LOCK */
	int64_t retry_at_ms;        /* LOCK */
	enum store_who who;         /* LOCK: who asked for its last copy: the store retries
				     * the policy's requests by itself, never a user's */
	int local_error;            /* LOCK: its local copy failed a read (store_local_read_error)
				     * since it was last verified */
	int check_err;              /* LOCK: -errno of the last source check that could not be
				     * made (the NAS did not answer): logged when it changes,
				     * not at every open; 0 once a check is made */
	uint64_t swept;             /* LOCK: the sweep pass that looked at it last (a blob is
				     * worked on once per pass: store_verify.c) */
	struct blob_part *part;     /* LOCK: its local ranges, or NULL (store_part.c) */
	struct blob *part_next;     /* LOCK: store.part_list (a part is kept until store_close) */
	_Atomic uint64_t part_bytes; /* ATOMIC: bytes of its verified ranges that may serve
				      * (0: none; the read path's check before the lock) */
};

/* What a blob is now, copied under the lock (for status, doctor, metrics). */
struct blob_info {
	const char *key;            /* the blob's own (immutable) */
	char id[96];
	enum blob_state state;
	enum blob_hold hold;
	uint64_t size, bytes_done;  /* bytes_done: of the copy in flight, or size when LOCAL */
	int pinned, open_count;     /* pinned: 1 for any reason, which @pin_why says */
	int pin_why;                /* enum store_pin_why mask */
	char reason[256];
	uint64_t nas_bytes, local_bytes, opens, nas_opens;
	int64_t last_used;
	char xxh[33];               /* the local copy's content hash ("" if none) */
	const char *name;           /* a name it was opened by: in store_each's callback
				     * only (NULL from blob_info) */
	int local_error;            /* its local copy failed a read: demoted (reason says more) */
	unsigned fail_count;        /* copies failed in a row (the backoff) */
	int64_t retry_at_ms;        /* CLOCK_MONOTONIC (store_now_ms): no automatic copy before
				     * this; 0: no backoff */
	int auto_retry;             /* 1: the store queues it again by itself at retry_at_ms */
	/* its local ranges (not LOCAL: "partial" when part_bytes > 0) */
	uint64_t part_bytes, part_want, part_done;
	size_t part_n;              /* verified ranges */
	int part_copying, part_unproven;
	char part_reason[256];
};

struct store_hooks {
	void *arg;
	void (*log)(void *arg, int prio, const char *msg);
	/* The bytes under this blob may have changed: drop cached pages.
	 * Called with store.lock held: must queue, never block. */
	void (*changed)(void *arg, uint64_t fs_ino);
};

struct store_opts {
	unsigned workers;     /* concurrent copies */
	uint64_t bw_limit;    /* bytes/s for promotion reads, all copies together; 0 = none */
	const struct policy_opts *policy; /* NULL: no automatic promotion, no limits */
	struct nas_gate *gate; /* NULL: NAS calls run on the caller (tools, tests);
				* else the read path's NAS calls go through it, and
				* the NAS errors the store sees are reported to it */
	const struct hub_roots *roots; /* the NAS roots the keys lie in (outlives the
					* store); NULL: only the gate's, NAS_HUB */
};

/* A ref pin as the index keeps it (the policy layer, pins.c, owns them;
 * the store only persists them with the blobs, in one write). */
struct store_ref_rec {
	char repo[NAME_MAX + 1];
	char ref[NAME_MAX + 1];
	char commit[NAME_MAX + 1];
	char pending[NAME_MAX + 1];
};

/* Rules: IMMUTABLE after store_open; LOCK (store.lock); ATOMIC. */
struct store {
	pthread_mutex_t lock;
	pthread_cond_t cond;        /* the queue, stop, a dirty index (with @lock) */
	pthread_cond_t hot_cond;    /* the hot list, wake-ups (with @lock; CLOCK_MONOTONIC) */
	pthread_mutex_t index_lock; /* one index writer at a time; before @lock */
	char dir[PATH_MAX], data_dir[PATH_MAX + 8], tmp_dir[PATH_MAX + 8]; /* IMMUTABLE */
	char index_path[PATH_MAX + 16]; /* IMMUTABLE */
	struct htab blobs;          /* LOCK: keyed by path_hash(key) */
	struct htab by_xxh;         /* LOCK: blobs with a content hash, keyed by it */
	struct htab by_id;          /* LOCK: blobs with an id (blob.id), keyed by it */
	uint64_t copies_used;       /* LOCK: what the files LOCAL blobs serve take (store_charge),
				     * each file once (store_copies.c) */
	_Atomic uint64_t copies_recounted; /* the room's tally found @copies_used wrong */
	size_t pub_xxh_n;           /* LOCK: blobs with blob.pub_xxh set (0: no scan for them) */
	struct blob *part_list;     /* LOCK: the blobs with a blob_part, by blob.part_next */
	/* LOCK: moved whenever a copy may have become evictable or room come
	 * free in a way the counts (copies_used, reserved, held, ranges) do
	 * not show: a blob joining or leaving LOCAL, a LOCAL blob's hash set,
	 * an unpin, a last close.  The "no room" a request's blob met holds
	 * for its other blobs until it moves (store_space.c). */
	uint64_t room_gen;
	/* ATOMIC, moved under LOCK (release): whenever what the record of
	 * local revisions is built from may have changed -- a blob joining or
	 * leaving LOCAL, its verified ranges becoming servable or not
	 * (blob.part_bytes zero or not), the name it was opened by.  The
	 * record's thread looks at the table only when it moved, not every
	 * second (a look at 40,000 local blobs held @lock ~10 ms). */
	_Atomic uint64_t copies_gen;
	struct no_room_kept {
		int valid;
		uint64_t gen, limit, used, need, want_ns, evictable;
		uint64_t pinned_bytes, open_bytes; /* for the reason given */
	} room_kept;
	_Atomic uint64_t no_room_kept_hits; /* reservations refused by it (no walk) */
	/* LOCK: the copy queue, explicit requests first (@qexplicit the last
	 * of them, NULL: none), then automatic ones */
	struct blob *qhead, *qtail, *qexplicit;
	int stop;                   /* LOCK */
	pthread_t *threads;         /* owner thread (store_start, store_stop_by, store_close) */
	unsigned nthreads;
	struct store_opts opt;      /* IMMUTABLE (bw_limit: ATOMIC, store_set_bw_limit) */
	_Atomic uint64_t bw_limit;
	struct store_hooks hooks;   /* IMMUTABLE */
	int index_dirty;            /* LOCK: the index on disk is behind the table */
	int64_t dirty_since_ms;     /* LOCK: CLOCK_MONOTONIC, when it became so */
	int copies_unrecorded;      /* LOCK: copies verified since the last write */
	_Atomic int64_t index_write_ms; /* how long the last index write took */
	size_t index_snap_bytes;    /* index_lock: the last snapshot's strings (the
				     * next one's room: store_snapshot.c) */
	int index_err;              /* index_lock: errno of the last failed index write
				     * (logged once, not at every retry); 0 after a success */
	int index_kept;             /* IMMUTABLE: index.json could not be read, and is not
				     * damaged (a later wfs's version, a read error), or
				     * store_open failed (the table read in part): never
				     * replaced, nothing cleaned up after it (index_left) */
	/* IMMUTABLE: with index_kept, the files data/ and parts/ held at the
	 * start (their names, sorted): the kept index's, never removed or
	 * written by this run -- an eviction or a failed publish of the same
	 * bytes unlinked a copy, a range copy wrote into (and a drop removed)
	 * a partial file, and the wfs that wrote that index lost them */
	struct kept_names {
		char (*v)[33];
		size_t n, cap;
	} kept, kept_parts;
	uint64_t tmp_serial;        /* LOCK */
	uint64_t reserved;          /* LOCK: room reserved by copies in flight */
	uint64_t held;              /* LOCK: by evicted copies still open */
	size_t open_xxh_n;          /* LOCK: blobs with blob.open_xxh set (0: no scan for them) */
	size_t part_retiring;       /* LOCK: blobs whose part->retire is set */
	uint64_t blk;               /* IMMUTABLE: block size of LOCAL_STORE's filesystem */
	unsigned auto_max, auto_running; /* IMMUTABLE, LOCK: automatic copies at once: at most, now */
	struct blob *hot_head, *hot_tail; /* LOCK */
	int hot_woken;              /* LOCK: store_wake_hot() since the last wait */
	int ref_landed;             /* LOCK: a copy a ref pin holds became local (store_take_ref_landed) */
	struct store_ref_rec *refs; /* LOCK: the ref pins to persist */
	size_t nrefs;               /* LOCK */
	/* ATOMIC counters since start */
	_Atomic uint64_t promoted, failed, mismatches, demoted, evicted;
	_Atomic uint64_t started, cancelled, failed_by[STORE_FAIL_N];
	_Atomic uint64_t auto_queued, no_room, excluded, index_writes;
	/* looks of a worker that left the queue as it was: the NAS down */
	_Atomic uint64_t queue_held;
	_Atomic uint64_t passthrough_opens;
	/* each route's enum store_route_state, and the -errno of a refusal */
	_Atomic int route_state[STORE_ROUTES], route_err[STORE_ROUTES];
	struct store_readahead readahead; /* LOCK */
	/* directories the fs listed ahead of a tree walk, and those a walk
	 * then took (fs/dir.c) */
	_Atomic uint64_t listed_ahead, listed_ahead_taken;
	/* listed directories stat'ed again through the mount (fs/dirattr.h) */
	_Atomic uint64_t dir_attrs_refreshed;
	/* requests taken through io_uring (fs/uring.h) */
	_Atomic uint64_t uring_requests;
	/* NAS reads of FUSE requests made on the reading thread's own io_uring,
	 * and on a NAS thread (fs/nas.c); reads refused (the NAS down) are not
	 * counted */
	_Atomic uint64_t nas_reads_ring, nas_reads_handed;
	/* the fs's inodes now, the root aside: each one the kernel looked up
	 * and has not forgotten (fs/node.h) */
	_Atomic uint64_t fs_nodes;
	_Atomic uint64_t retries;   /* failed copies queued again by the store (the backoff) */
	_Atomic uint64_t local_read_errors; /* store_local_read_error calls that demoted */
	int retry_pending;          /* LOCK: some blob may wait for a retry (store_retry_due
				     * looks); 0 once a look found none */
	int64_t retry_next_ms;      /* LOCK: CLOCK_MONOTONIC: the earliest retry is due then */
	uint64_t retry_gen;         /* LOCK: the gate's generation store_retry_due saw last */
	int recheck_wanted;         /* LOCK: a source check could not be made: the sweep
				     * tries again (store_verify.c) */
	/* partial copies (store_part.c) */
	char part_dir[PATH_MAX + 8]; /* IMMUTABLE: LOCAL_STORE/parts */
	pthread_cond_t part_cond;   /* the part queue, stop (with @lock) */
	struct blob *part_head, *part_tail; /* LOCK: blobs with ranges to copy or re-hash */
	pthread_t part_thread;      /* the one range worker */
	int part_started;           /* owner thread */
	_Atomic uint64_t part_copied, part_failed, part_bytes_copied; /* ATOMIC counters */
	_Atomic uint64_t part_local_read; /* ATOMIC: bytes read from verified ranges */
};

const char *blob_state_name(enum blob_state s);

/* The blob's state now, without the lock. */
static inline enum blob_state blob_state(const struct blob *b)
{
	return atomic_load_explicit(&((struct blob *)b)->state, memory_order_acquire);
}
/* Its bytes_gen now, without the lock. */
static inline unsigned blob_bytes_gen(const struct blob *b)
{
	return atomic_load_explicit(&((struct blob *)b)->bytes_gen, memory_order_acquire);
}
/* Its copy_gen now, without the lock. */
static inline unsigned blob_copy_gen(const struct blob *b)
{
	return atomic_load_explicit(&((struct blob *)b)->copy_gen, memory_order_acquire);
}
void blob_info(struct store *s, const struct blob *b, struct blob_info *out);
/* Wait until @b is neither queued nor copying, at most @timeout_ms;
 * returns its state then (tests, and callers that promised to wait). */
enum blob_state store_wait_settled(struct store *s, struct blob *b, int64_t timeout_ms);
/* The daemon's node for @b (for the changed hook). */
void blob_set_fs_ino(struct blob *b, uint64_t ino);

/* Create the store's directories and tighten their modes, empty tmp/, load
 * the index (per entry: both sizes and the copy's identity, store_verify.c;
 * an unproven copy is re-hashed after store_start).  Damage, a read-only or
 * a full LOCAL_STORE are logged and never fatal (store_index.c).  Linear in
 * the number of blobs and files.  Returns 0 or -ENOMEM; after -ENOMEM the
 * table may hold some of the index's records: store_close it, which then
 * writes no index (nothing is lost: the next open reads the same file). */
int store_open(struct store *s, const char *dir, const struct store_opts *opt,
	       const struct store_hooks *hooks);
/* Start the copy workers and the source re-check sweep. */
int store_start(struct store *s);
/* Cancel copies in flight (their temporary files are removed), stop the
 * threads, write the index. */
void store_close(struct store *s);
/* The daemon's bounded stop (stopby.h): cancel copies in flight and stop
 * the threads, joining them until @deadline_ms (< 0: none).  0 when all
 * ended (store_close then writes the index and frees), or -ETIMEDOUT: a
 * thread is left in a NAS call (a copy's read of a frozen NAS), and the
 * caller ends the store with store_leave. */
int store_stop_by(struct store *s, int64_t deadline_ms);
/* Its first step alone: copies cancelled, workers told to stop, not
 * joined; a request made after it is refused (store_stopping). */
void store_stop_tell(struct store *s);
/* After store_stop_by left a thread behind, or another thread that uses
 * the store was (a control request, the record's rebuild, the policy):
 * write the index as store_close does -- every verified copy in it, a copy
 * in flight not (its temporary file removed now; one left by a thread
 * that ends meanwhile goes at the next start) -- and keep index_lock and
 * store.lock until the process ends, so that a thread left behind changes
 * nothing more: it blocks at its next call to the store.  (No thread holds
 * either lock across a NAS call: the wait for them is bounded by local
 * work.)  Nothing is freed; the process is to exit at once. */
void store_leave(struct store *s);

/* The blob for the NAS file @key (stat @st); created in state NAS.  @id is
 * the name a repo gives it ("" if none).  If the NAS size or times differ
 * from what the blob recorded, the source is re-checked (and a local copy
 * that no longer matches is demoted).  Never NULL except on ENOMEM. */
struct blob *store_blob(struct store *s, const char *key, const struct stat *st, const char *id);

/* The NAS shows @st for @b's source (an open's fstat): as store_blob. */
void store_source_attrs(struct store *s, struct blob *b, const struct stat *st);

/* The blob if known, else NULL. */
struct blob *store_find(struct store *s, const char *key);

/* Path of the verified local copy of @b: 0, or -ENOENT when @b is not
 * LOCAL.  The path stays valid until the blob is demoted or evicted (an open
 * descriptor of it keeps the bytes). */
int store_local_path(struct store *s, const struct blob *b, char *out, size_t sz);
/* An open was handed to the kernel's passthrough (for the metrics). */
void store_count_passthrough_open(struct store *s);
/* @route is now @state; @err: the refusal's -errno (REFUSED), else
 * ignored.  A route once REFUSED stays so. */
void store_note_route(struct store *s, enum store_route route, enum store_route_state state,
		      int err);
/* The read-ahead the daemon asked for, and how that went (a copy is kept). */
void store_note_readahead(struct store *s, const struct store_readahead *ra);
void store_get_readahead(struct store *s, struct store_readahead *out);

/* Before serving a LOCAL blob for the first time since start-up (or since
 * the NAS showed new attributes), compare the source's size and sampled
 * hash (store_verify.c), through the gate (a deadline).  Returns 1 if it may
 * be served locally.  Only positive evidence demotes: the source is gone
 * (ENOENT, ENOTDIR; a link or a non-regular file in its place), has another
 * size, or another sampled hash.  A check the NAS cannot answer now
 * (timeout, NAS down, EIO, EACCES, ...) keeps the verified copy serving:
 * 1, the blob left unchecked (checked again at the next open and by the
 * sweep once the NAS is up), one log line per blob and error. */
int store_check_source(struct store *s, struct blob *b);

/* A read of @b's local copy failed with @err (EIO and friends; either
 * sign): the copy is bad -- if it is the copy of @copy_gen (blob_copy_gen
 * when the descriptor read was opened: an error of a copy since demoted or
 * evicted says nothing of the one verified now).  Every LOCAL blob served
 * from that file (one file per content hash) is demoted -- reads go to the
 * NAS from now on, the changed hook drops the kernel's pages --, the file
 * removed, the reason "local copy unreadable: <error> (demoted; NAS bytes
 * from now on)", local_error set, the backoff counted as for a failed copy
 * (an automatic or pinned re-promotion waits for it), logged, the index
 * marked dirty.
 * No NAS I/O: a FUSE worker may call it.  Returns the number of blobs
 * demoted (0: @b was not LOCAL any more, or its copy was another). */
int store_local_read_error(struct store *s, struct blob *b, unsigned copy_gen, int err);
/* @fd, just opened on @b's local copy (of @copy_gen, as above), is about to
 * serve: is it the file that was verified (its identity, index.h: inode,
 * size, mtime, ctime)?  One written to, touched or replaced since (by hand,
 * a tool run over LOCAL_STORE) is vouched for by no one: every LOCAL blob
 * served from it is demoted -- "local copy changed on disk since it was
 * verified" --, the file removed with the last, logged; the caller serves
 * the NAS's bytes.  (A copy of the same bytes renamed over it by a publish
 * still to be recorded is one, and so is a file another blob of those
 * bytes was proven by.)  A copy with no identity recorded is let be, as
 * before: the next start-up re-hashes it.  No NAS I/O.  Returns 0 (serve
 * it) or -ESTALE. */
int store_copy_opened(struct store *s, struct blob *b, unsigned copy_gen, int fd);

/* ---- the daemon's hooks (fs/file.c) ----
 * open: @b was opened by the mount-relative name @rel (may be NULL); it is
 * not evicted for room until the matching close.  read: @bytes were served,
 * from the local copy or the NAS: NAS bytes and opens make a blob hot, and a
 * hot blob is handed to the policy (store_wait_hot).  close: after the
 * daemon has closed its descriptors of this open (the space of an evicted
 * copy comes back then).  All are cheap; read takes no lock unless the blob
 * turns hot. */
void store_note_open(struct store *s, struct blob *b, const char *rel);
/* @b is reachable by the mount-relative name @rel (a promote's walk found
 * it there): kept as its name by the rule of an open's (store.c). */
void store_note_name(struct store *s, struct blob *b, const char *rel);
void store_note_read(struct store *s, struct blob *b, uint64_t bytes, int local);
void store_note_close(struct store *s, struct blob *b);

/* ---- requests (the control server, the policy) ----
 * Each marks the index dirty; the caller makes it durable with one
 * store_sync() per request, however many blobs it touched. */

/* Queue a promotion; explicit requests go before automatic ones.  With
 * @pin the blob is pinned (by hand) too.  store_request(@explicit_req ? STORE_BY_USER
 * : STORE_BY_AUTO). */
int store_promote(struct store *s, struct blob *b, int pin, int explicit_req);
/* The same, as asked for at @asked_ns (store_now_ns(); 0: now): the blobs
 * of one request share its time, so that none is evicted for room by
 * another (a request of 10,000 files takes a while to queue, and its first
 * copies land meanwhile). */
int store_promote_at(struct store *s, struct blob *b, int pin, int explicit_req,
		     uint64_t asked_ns);
/* Queue a copy of @b (NAS or FAILED) for @who (see enum store_who); a
 * request of the policy's for a blob in its backoff is remembered and
 * queued by the store when the backoff passes, unless @now (an operator
 * asked: wfsctl pin --ref).  A blob queued already moves ahead of the
 * automatic ones when @who is not STORE_BY_AUTO; the last request names
 * who is retried.  Returns 1 when queued now, 0 otherwise. */
int store_request(struct store *s, struct blob *b, enum store_who who, int now);
/* Drop the local copy (pinned ones only with @force, which drops a hand
 * pin; a blob a ref pin holds never: its ref pin would copy it back, and
 * only unpin --ref lets it go -- decided under the lock, so a ref pin set
 * just before is never lost to an evict).  Returns 1 when evicted, 0 when
 * nothing to do (pinned or not), -EBUSY when pinned and there was. */
int store_evict(struct store *s, struct blob *b, int force);
/* Pin (@pin 1) or unpin @b for the reason @why (enum store_pin_why); the
 * other reason is left as it is.  Returns 1 when that reason changed. */
int store_pin_why(struct store *s, struct blob *b, int why, int pin);
/* store_pin_why(PIN_HAND): wfsctl pin / unpin PATH. */
void store_pin(struct store *s, struct blob *b, int pin);
/* Re-check the source (and with @full re-hash the local copy).  Returns 1
 * when the blob was demoted, with @reason set; -errno when the source
 * could not be checked (the NAS did not answer: the copy keeps serving,
 * @reason says so; -EHOSTDOWN: the NAS is down); else 0. */
int store_verify(struct store *s, struct blob *b, int full, char *reason, size_t rsz);
/* Mark @b as kept on the NAS by an exclusion glob (@why says which). */
void store_exclude(struct store *s, struct blob *b, const char *why);
/* Write the index if anything changed since it was last written.
 * Returns -errno of the write (logged too). */
int store_sync(struct store *s);
/* Change the promotion bandwidth cap (bytes/s, 0: none) for copies that
 * start from now on. */
void store_set_bw_limit(struct store *s, uint64_t bw);

/* ---- for the policy (auto.c) ----
 * A blob the daemon's reads made hot, in the order they turned hot; waits
 * until one is, @deadline_ms (CLOCK_MONOTONIC, store_now_ms; < 0: none)
 * passes, store_wake_hot() is called, or the store stops: then NULL. */
struct blob *store_wait_hot(struct store *s, int64_t deadline_ms);
void store_wake_hot(struct store *s);
/* Did a copy of a blob a ref pin holds (PIN_REF) become local since the
 * last call?  Its landing wakes store_wait_hot, so that the pin can settle
 * on its revision when the last one lands, not at the next ref_poll. */
int store_take_ref_landed(struct store *s);
/* Queue again the failed copies whose backoff has passed -- all of them
 * when the NAS gate has come up since the last call; none while it is
 * down.  Returns when to call again (CLOCK_MONOTONIC ms; -1: nothing
 * waits).  The policy thread calls it each time it wakes; a failure that
 * starts a backoff wakes it (store_wait_hot returns NULL). */
int64_t store_retry_due(struct store *s);
/* A blob the policy is about to queue itself: its own reads need not. */
void store_mark_hot(struct store *s, struct blob *b);
/* The policy could not decide about hot @b now (a NAS walk it needed
 * failed): it is not hot any more, and more reads make it hot again. */
void store_hot_again(struct store *s, struct blob *b);
/* A mount-relative name @b was opened by (a snapshot name if it had one),
 * copied into @out; "" if none. */
void store_blob_name(struct store *s, const struct blob *b, char *out, size_t sz);
/* One log line through the daemon's hook (syslog priorities). */
void store_log_msg(struct store *s, int prio, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Is the store stopping? */
int store_stopping(struct store *s);
int64_t store_now_ms(void); /* CLOCK_MONOTONIC, milliseconds */
uint64_t store_now_ns(void); /* CLOCK_REALTIME_COARSE: the LRU order, last_used */

/* ---- partial copies: ranges of a blob (store_part.c) ----
 * Ask for local copies of the byte ranges @v (any order, may overlap) of
 * @b: the parts not already verified, asked for or being copied are queued
 * for the range worker (a request in offset order, after those before it),
 * each to be copied and verified alone (fetch_range.h).
 * Every range must lie inside the blob (-EINVAL otherwise, nothing asked).
 * @pin pins the blob (its ranges are not dropped for room; evict --force).
 * A blob that is LOCAL has nothing to copy: 0.  -EBUSY: the blob's
 * partial file is one the index this run leaves as it is names
 * (index_kept), which this run neither writes nor removes.  Returns the
 * bytes queued now, or -errno.  Marks the index dirty. */
int64_t store_part_request(struct store *s, struct blob *b, const struct brange *v, size_t n,
			   int pin);
/* For a read of [@off, @off + @len) of @b: the parts of it that its
 * verified ranges serve, in order, clipped to the read, at most @cap (the
 * rest is read from the NAS), and *@gen, the partial file's generation
 * they belong to.  Returns how many were written; 0 when none. */
size_t store_part_plan(struct store *s, struct blob *b, uint64_t off, uint64_t len,
		       struct brange *out, size_t cap, unsigned *gen);
/* The path of @b's partial copy and its generation now: 0, or -ENOENT. */
int store_part_path(struct store *s, struct blob *b, char *out, size_t sz, unsigned *gen);
/* wfsctl verify of a partial file: as store_verify (its source, and with
 * @full every range re-hashed from the partial file; one that differs
 * drops them all).  Returns 1 when the ranges were dropped (@reason says
 * why), -errno when the source could not be checked, else 0. */
int store_part_verify(struct store *s, struct blob *b, int full, char *reason, size_t rsz);
/* A read of @b's partial copy failed: every range dropped, logged. */
void store_part_read_error(struct store *s, struct blob *b);
/* The partial file of generation @gen could not be opened (-@err: gone
 * from parts/, unreadable): its ranges are dropped, as after a read
 * error, unless the generation moved on meanwhile. */
void store_part_open_error(struct store *s, struct blob *b, unsigned gen, int err);
/* @bytes of a read of @b were served from its verified ranges. */
void store_part_note_read(struct store *s, struct blob *b, uint64_t bytes);
/* The verified ranges of @b now (malloc'ed into *@v, *@n of them; NULL
 * and 0 when none).  0 or -ENOMEM. */
int store_part_ranges(struct store *s, struct blob *b, struct brange **v, size_t *n);
/* The name status and xattrs give @in's state: "partial" for a blob not
 * LOCAL with verified ranges, else blob_state_name. */
const char *blob_info_state_name(const struct blob_info *in);

/* ---- the ref pins to persist (pins.c owns their meaning) ---- */
int store_set_refs(struct store *s, const struct store_ref_rec *v, size_t n);
/* A copy of the ref pins loaded or last set (malloc'ed, *n entries). */
struct store_ref_rec *store_get_refs(struct store *s, size_t *n);

struct store_usage {
	uint64_t blobs, bytes, free_bytes, queued, copying;
	uint64_t used;       /* what the copies take, in blocks (what the limit counts) */
	uint64_t reserved;   /* by copies in flight */
	uint64_t held;       /* by evicted copies still open */
	uint64_t limit;      /* store_max, 0 = none */
	uint64_t floor;      /* free space kept on the filesystem */
	uint64_t fs_bytes;   /* size of the filesystem */
	uint64_t pinned_bytes, open_bytes; /* of the local copies: never evicted for room */
	/* @bytes, @used, @pinned_bytes and @open_bytes count a copy once, however
	 * many blobs share it (one file per content hash); @blobs counts blobs. */
	uint64_t parts, part_bytes; /* partial copies, the bytes of their verified ranges
				     * (their blocks are in @used) */
};
void store_usage(struct store *s, struct store_usage *u);
/* Bytes a new copy could take now without evicting anything (the limit and
 * the floor both allow it); @evictable (may be NULL) gets what evicting every
 * copy neither pinned nor open would add. */
uint64_t store_room(struct store *s, uint64_t *evictable);

/* Call @fn with the info of every blob (under the lock: @fn must not call
 * the store). */
void store_each(struct store *s, void (*fn)(void *arg, const struct blob_info *b), void *arg);
/* store.copies_gen now (acquire): read it before a store_each, and a
 * change the walk did not see moves it past what was read. */
uint64_t store_copies_gen(struct store *s);

#endif
