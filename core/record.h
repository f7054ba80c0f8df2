/* record.h - the store's own record of its local revisions.
 *
 * What the mount needs to show the files that have a verified local copy
 * without asking the NAS: for every such file, every name that reaches it
 * in its repo (snapshot entries, links and their texts, blobs/<id>), the
 * directories above them, and the repo's refs (their bytes: a reader
 * resolves "main" through refs/main first), each with the attributes the
 * mount last presented.  Kept in LOCAL_STORE/record.json, written
 * atomically (durable.h) beside index.json.
 *
 * While the NAS answers, the NAS is the truth and the record is not read;
 * the rebuild thread keeps it current: when the set of local blobs changes
 * (polled from the store once a second) or record_sync() asks, it walks the
 * repos that hold a local blob (ns_walk) and replaces the record when the
 * walk ended without a NAS error -- an outage mid-walk leaves the old one.
 * While the NAS is down (nasgate.h), the fs glue answers lookups, getattr,
 * readlink, readdir and opens under local revisions from it.
 *
 * Which repos: a local blob's NAS path NAS_HUB/<repo>/..., and the first
 * component of the mount-relative name it was opened by (a hub-level blob
 * store outside the repos is reached through a name).  What is kept from
 * such a repo's walk: FILE entries whose NAS file is a LOCAL blob, LINK
 * entries whose text leads (lexically, from the link's directory) to a
 * kept FILE entry, every FILE under refs/ (bytes up to RECORD_MAX_DATA),
 * the FILE entries under .no_exist/<rev>/ of a revision whose
 * snapshots/<rev> is kept (with their bytes, as refs), that revision's
 * file list trees/<rev>.json (with its bytes, up to RECORD_MAX_TREE; a
 * larger one is left out, logged once: never served cut short), and every
 * directory above a kept entry.
 *
 * A refs file is kept with the bytes the NAS gave it -- unless it names a
 * revision not all local (a file not copied, or only some of its ranges;
 * what an exclusion glob keeps on the NAS aside)
 * while the record showed it, before this build, at a revision that is:
 * then it keeps the bytes and attributes it had (record_refs.c), so that
 * an engine offline during an outage loads that revision whole rather
 * than the new one with holes; the NAS's bytes are kept beside them
 * (record_held_refs), and the log says so once.
 *
 * Knows nothing of FUSE.
 */
#ifndef WFS_RECORD_H
#define WFS_RECORD_H

#include "nasgate.h"
#include "ns.h"
#include "resolve.h"
#include "store.h"

#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* 2: a link whose way crosses a directory some class cannot search is
 * kept as a link, with its target (ns.c present_closed); a version-1
 * record showed it as the target file, readable by every reader during an
 * outage: such files (a backing other than NAS_HUB/<path>) are left out
 * when one is read, until the next build. */
#define RECORD_VERSION 2
#define RECORD_FILE "record.json"
#define RECORD_MAX_DATA 4096 /* bytes of a refs file kept (a larger one: has_data 0) */
/* Bytes of a revision's file list (trees/<rev>.json) kept; a larger one is
 * not kept.  Recent huggingface_hub clients read it offline to tell a
 * complete snapshot from an incomplete one: a few KiB for a model, more for
 * a dataset of many files. */
#define RECORD_MAX_TREE ((size_t)1 << 20)
/* The file lists of one build together: past this, a list is left out
 * (logged) so that they cannot push record.json past RECORD_MAX_BYTES. */
#define RECORD_MAX_TREES_TOTAL ((size_t)64 << 20)
/* A record.json larger than this is damaged, set aside unread: a broken or
 * hostile file must not make start-up parse gigabytes.  An entry takes
 * about 600 bytes: some 400,000 names. */
#define RECORD_MAX_BYTES ((long long)256 << 20)

/* One name as the mount showed it; copied out of the record. */
struct record_entry {
	struct ns_entry e;          /* kind, link_state, st, backing (FILE: the NAS path,
				     * the blob's key), target (LINK), blob_id */
	int has_data;               /* a refs file, marker or file list: its bytes are kept
				     * (record_lookup_data; st.st_size is their length); 0 for
				     * a refs file over RECORD_MAX_DATA: shown, not readable
				     * while the NAS is down (never cut short) */
	size_t data_len;
};

struct record_table; /* record.c: the entries, by path, with each directory's children */

/* Rules: IMMUTABLE after record_open; LOCK (record.lock); BUILD
 * (build_lock: the rebuild running); owner (the rebuild thread,
 * record_start/stop).
 *
 * Lock order: build_lock -> store.lock (a rebuild reads the store);
 * build_lock -> file_lock -> record.lock (the write of record.json);
 * record.lock is a leaf: held only to copy out of the table or swap a new
 * one in, never across a call to the store, the NAS or the disk, so the fs
 * glue may take it under its own locks. */
struct record {
	pthread_mutex_t lock;
	pthread_cond_t cond;          /* LOCK: kicks, stop, a build done (CLOCK_MONOTONIC) */
	pthread_mutex_t build_lock;   /* one rebuild at a time (the thread's, a test's) */
	pthread_mutex_t file_lock;    /* held across the look at @stop and the write of
				       * record.json; record_stop_by keeps it when it
				       * leaves the thread behind */
	char path[4096];              /* IMMUTABLE: LOCAL_STORE/record.json */
	char nas[4096];               /* LOCK: the NAS_HUB it was built for ("" if none) */
	struct record_table *table;   /* LOCK: replaced whole by a rebuild */
	uint64_t built_gen;           /* LOCK: builds finished (ok or not) */
	uint64_t looks;               /* LOCK: the thread's looks at the local copies (each
				       * second, each sync), a build or not */
	uint64_t asked_gen;           /* LOCK: builds asked for (record_sync) */
	uint64_t served_gen;          /* LOCK: asked_gen when the last finished build started */
	int last_err;                 /* LOCK: that build's result */
	int running;                  /* LOCK: the thread runs (record_sync has someone to ask) */
	int stop;                     /* LOCK */
	int readonly;                 /* IMMUTABLE: LOCAL_STORE cannot be written */
	int newer;                    /* IMMUTABLE: record.json is of a newer version: left
				       * alone, never replaced */
	void (*log)(void *arg, int prio, const char *msg); /* IMMUTABLE, may be NULL */
	void *log_arg;                /* IMMUTABLE */
	uint64_t file_sig;            /* BUILD: record_sig of what record.json holds */
	int file_known;               /* BUILD: @file_sig says what is on disk */
	int file_older;               /* record.json is of an older version: the
				       * first build writes it, changed or not */
	int write_err, walk_err;      /* BUILD: errno last logged (said once, not each retry) */
	char **big_trees;             /* BUILD: the lines the last build logged (file lists left
				       * out, refs held back: each logged once, when first
				       * seen), sorted */
	size_t nbig_trees;            /* BUILD */
	const struct hub_roots *roots; /* owner */
	struct store *store;          /* owner */
	struct nas_gate *gate;        /* owner */
	pthread_t thread;             /* owner */
	int started;                  /* owner */
	uint64_t files, entries;      /* LOCK: of the current table */
	int64_t built_at;             /* LOCK: CLOCK_REALTIME seconds of the last good build (0: none) */
};

/* Load LOCAL_STORE/record.json if there is one (none: an empty record).
 * An unreadable or damaged file is renamed aside to record.json.damaged
 * and logged (left in place when @readonly); a newer version is left in
 * place, not read, and never replaced.  Entries with bad fields, or paths
 * that are not relative and normalised, are skipped (logged).  Returns 0,
 * -ENOMEM, or -ENAMETOOLONG (@store_dir too long). */
int record_open(struct record *r, const char *store_dir, int readonly,
		void (*log)(void *arg, int prio, const char *msg), void *log_arg);
/* Start the rebuild thread (after any fork). */
int record_start(struct record *r, const struct hub_roots *roots, struct store *s,
		 struct nas_gate *gate);
/* Stop the thread (an unfinished walk is dropped), free the table.  No
 * other call on @r may be running or start (record_sync waiters are woken
 * with -ESRCH, but must be gone before the lock is destroyed). */
void record_close(struct record *r);
/* The daemon's bounded stop (stopby.h): the thread told to stop (a walk
 * ends at its next entry) and joined until @deadline_ms (< 0: none).  0,
 * or -ETIMEDOUT: the thread is left in a NAS call, record.json is never
 * written again by it, and @r must not be closed (nothing is freed). */
int record_stop_by(struct record *r, int64_t deadline_ms);
/* Its first step alone: the thread (and a record_sync waiting for a
 * build) told to stop, not joined. */
void record_stop_tell(struct record *r);

/* The NAS_HUB (canonical) the record was built for, copied to @out; ""
 * when the record is empty. */
void record_nas(struct record *r, char *out, size_t sz);
/* Is the record non-empty? */
int record_has_any(struct record *r);

/* @rel ("" is the root) as recorded: 0, or -ENOENT. */
int record_lookup(struct record *r, const char *rel, struct record_entry *out);
/* The file the record shows at @rel: @rel's own entry, or -- @rel being a
 * resolved link -- the entry its text names, resolved lexically as the
 * record keeps links (one hop: a snapshot entry's link to blobs/<id>).  0
 * with that FILE entry in @out, or -ENOENT. */
int record_lookup_file(struct record *r, const char *rel, struct record_entry *out);
/* As record_lookup; when the entry has bytes (has_data), a malloc'ed
 * copy of them in *@data (NULL otherwise), taken from the same table as
 * @out.  0, -ENOENT, or -ENOMEM. */
int record_lookup_data(struct record *r, const char *rel, struct record_entry *out,
		       char **data);
/* The recorded children of the directory @rel, by name (copies, sorted);
 * *@names is malloc'ed, one malloc'ed string each.  0, or -ENOENT when
 * @rel is not a recorded directory, -ENOMEM. */
int record_list(struct record *r, const char *rel, char ***names, size_t *n);

/* A refs file the record shows, while the NAS is down, at another
 * revision than the NAS named (record.h, above). */
struct record_held {
	char path[PATH_MAX];       /* "<repo>/refs/<ref>" */
	char shows[NAME_MAX + 1];  /* the revision shown: all local */
	char nas[NAME_MAX + 1];    /* the NAS's, at the last build: not all local */
};

/* The refs held back in the current table: *@v malloc'ed (NULL when none),
 * *@n of them.  0 or -ENOMEM. */
int record_held_refs(struct record *r, struct record_held **v, size_t *n);

/* Ask for a rebuild now and wait until one that started after this call
 * has finished, at most @timeout_ms.  Returns 0 when it succeeded, the
 * walk's -errno (-EHOSTDOWN: the gate is down, nothing walked), -ETIMEDOUT,
 * or -ESRCH when no thread runs (before record_start, after record_close). */
int record_sync(struct record *r, int64_t timeout_ms);

/* For tests and the thread: build from the NAS now, on this thread, and
 * write the file if the table changed.  0 or -errno: a walk that failed
 * (-EHOSTDOWN when the gate is or went down) leaves the old record, in
 * memory and on disk; a write that failed (logged once) leaves the new
 * table in memory and returns the write's error (the next build that
 * succeeds writes it).  A read-only LOCAL_STORE or a record.json of a newer
 * version is never written (0). */
int record_rebuild(struct record *r, const struct hub_roots *roots, struct store *s);

#endif
