/* store_int.h - what the files of the store share; not for other modules.
 *
 * The files, each calling only those listed before it:
 *   store_table.c   the blob table, blob_info, the dirty flag, log, clocks
 *   store_copies.c  the blobs by content hash and by id; a blob's state,
 *                   hash and id change there only (the room local copies take)
 *   store_space.c   the room (of partial copies too); demotion (a copy
 *                   gives its room back)
 *   store_part.c    partial copies: their lists, requests, read plans, load
 *   store_verify.c  the checks that let a copy serve (with fetch.c)
 *   store_index.c   LOCAL_STORE on disk: its directories and modes,
 *                   index.json: load (checked by store_verify.c), write
 *   store_copy.c    the queue and the copy workers
 *   store_part_copy.c  the range worker; wfsctl verify of partial copies
 *   store.c         the API the layers above use; life cycle
 *
 * Locking: store.lock guards the table, the queue, the hot list, the room
 * accounting, the ref records and every blob field marked LOCK in store.h.
 * Functions named *_locked expect it held.
 */
#ifndef WFS_STORE_INT_H
#define WFS_STORE_INT_H

#include "clock.h"
#include "store.h"
#include "index.h"

/* Every blob of the table: STORE_EACH(s, b) { ... } (lock held; no
 * insertion inside). */
#define STORE_EACH(s, b) \
	HTAB_EACH(&(s)->blobs, i_, l_) \
		for (struct blob *b = htab_entry(l_, struct blob, hl); b; b = NULL)

/* ---- store_copies.c ---- */
/* A blob's state and content hash ("" none) are set here only: they keep
 * store.by_xxh and store.copies_used true. */
void blob_state_set_locked(struct store *s, struct blob *b, enum blob_state st);
/* store.copies_gen moved (lock held). */
static inline void store_copies_moved_locked(struct store *s)
{
	atomic_fetch_add_explicit(&s->copies_gen, 1, memory_order_release);
}
void blob_xxh_set_locked(struct store *s, struct blob *b, const char *xxh);
/* Every blob with the content hash @xxh: COPY_EACH(s, xxh, o) { ... } (no
 * blob's hash set inside; its state may be); COPY_EACH_OF(s, b, o): those
 * of @b's copy, @b among them (its table hash kept: none computed). */
#define COPY_EACH_H(s, xxh, h, o) \
	for (struct hlink *at_ = NULL, **once_ = &at_; once_; once_ = NULL) \
		for (struct blob *o = copy_first_locked(s, xxh, h, &at_); o; \
		     o = copy_next_locked(&at_))
#define COPY_EACH(s, xxh, o) COPY_EACH_H(s, xxh, copy_hash(xxh), o)
#define COPY_EACH_OF(s, b, o) COPY_EACH_H(s, (b)->xxh, (b)->xl.hash, o)
uint64_t copy_hash(const char *xxh);
struct blob *copy_first_locked(struct store *s, const char *xxh, uint64_t h, struct hlink **at);
struct blob *copy_next_locked(struct hlink **at);
/* A blob's id is set here only: it keeps store.by_id true. */
void blob_id_set_locked(struct store *s, struct blob *b, const char *id);
/* A local blob with @b's content address and size: if @b's bytes are
 * what its name says, they are that blob's copy already.  A guess only --
 * a local blob's name may have been learnt after its copy was verified --
 * the hashes decide (store_copy.c: adopt_one). */
const struct blob *copy_of_name_locked(struct store *s, const struct blob *b);
/* Does a LOCAL blob other than @b have the copy @xxh? */
int copy_served_by_other_locked(struct store *s, const struct blob *b, const char *xxh);
/* Is a blob other than @b, of copy name @xxh, still to be re-hashed (a
 * re-verification pending since start-up, store_verify.c)?  Then the file
 * is that blob's to prove: removing it with @b would lose a copy that may
 * be good. */
int rehash_pending_locked(struct store *s, const struct blob *b, const char *xxh);
/* Is a blob other than @b's copy in data/ as @xxh and not yet recorded
 * (blob.pub_xxh, store_copy.c)?  Then that file is not @b's to remove. */
int store_publishing_locked(struct store *s, const struct blob *b, const char *xxh);

/* ---- store_table.c ---- */
int store_local_path_locked(struct store *s, const struct blob *b, char *out, size_t sz);
struct blob *store_find_locked(struct store *s, const char *key);
struct blob *store_insert_locked(struct store *s, const char *key);
/* The index is behind the table: a worker or store_sync writes it. */
void store_dirty_locked(struct store *s);
/* @b may turn hot again after as many NAS bytes and opens again. */
void store_reset_hot_locked(struct store *s, struct blob *b);

/* Is data/<xx>/@xxh a copy the kept index names (store.h: kept)? */
int store_kept_copy(const struct store *s, const char *xxh);
/* Is parts/@name a partial file the kept index names (store.h: kept)? */
int store_kept_part(const struct store *s, const char *name);
/* Would the store queue @b again by itself once its backoff passes?  (A
 * failed copy, or a copy found unreadable, asked for by the policy.) */
int store_retry_wanted_locked(const struct store *s, const struct blob *b);
/* A copy of @b failed (or its local copy was found unreadable): one more
 * in a row; its backoff starts now, and the policy thread is woken when
 * the store is to retry it (store_retry_due). */
void store_backoff_locked(struct store *s, struct blob *b);
/* The store is to queue @b again when its backoff passes, if it wants
 * to (store_retry_wanted_locked): the policy thread learns when. */
void store_retry_schedule_locked(struct store *s, struct blob *b);
/* @st is what proves the file now; is @st still the file proven? */
void file_proof_take(struct file_proof *p, const struct stat *st);
int file_proof_holds(const struct file_proof *p, const struct stat *st);
/* A copy of @b was verified: no backoff any more. */
void store_backoff_clear_locked(struct blob *b);
/* store_wait_hot returns (its caller looks at what is due again). */
void store_wake_hot_locked(struct store *s);
/* @b's local copy serves again (found sound by a re-hash, or a fresh
 * one): a ref pin holding it is told (store_take_ref_landed). */
void store_landed_locked(struct store *s, struct blob *b);
/* A fresh copy of @b, verified and recorded (verify_record_locked), is
 * its local copy now: no backoff, reason or hold; used now; LOCAL (last:
 * a lock-free reader that sees it sees the rest); counted; the index due;
 * store_landed_locked. */
void store_made_local_locked(struct store *s, struct blob *b);

/* ---- store_space.c ---- */

/* A LOCAL blob goes back to the NAS; its copy is removed unless another
 * local blob has the same bytes.  @invalidate: the bytes may differ from
 * what the kernel cached (a demotion), not merely moved (an eviction). */
void store_demote_locked(struct store *s, struct blob *b, const char *why, int invalidate);

/* The space a copy of @size bytes takes, in whole blocks (with room for
 * the filesystem's own extent blocks). */
uint64_t store_charge(const struct store *s, uint64_t size);
/* Blocks @b's partial copy takes (counted as local copies are). */
uint64_t part_charge_locked(const struct store *s, const struct blob *b);
/* Before a copy for @b taking @need bytes (store_charge): reserve them
 * into *@slot (the blob's own, or its part's), evicting least recently
 * used copies that are neither pinned nor open if that makes it fit.
 * Returns 0 (reserved), or -ENOSPC with @why saying what does not fit.
 * Sets *@evicted to the number of copies evicted. */
int space_reserve_locked(struct store *s, struct blob *b, uint64_t need, uint64_t *slot,
			 char *why, size_t wsz, int *evicted);
void space_release_locked(struct store *s, struct blob *b);
/* At the start: copies over store_max (a limit lowered since the last run)
 * are evicted, least recently used first, until they fit; pinned and open
 * ones stay (logged when they alone are over it). */
void store_trim(struct store *s);
/* @b's copy was unlinked: while it is open its blocks stay in use. */
void space_unlinked_locked(struct store *s, struct blob *b);
/* The last open of @b closed. */
void space_closed_locked(struct store *s, struct blob *b);

/* ---- store_verify.c: the checks before a copy serves ---- */

/* At load: may the index's record @b (state LOCAL as recorded) serve?
 * The copy must still have its size, else the record is dropped: 0
 * (-ENOENT when the copy is not there at all), state NAS, the reason
 * logged.  A copy that is the file verified (its
 * identity, store.h) is LOCAL at once: 1.  Otherwise it is re-hashed in
 * the background before it may serve: 2, state COPYING, its room reserved,
 * logged.  Its source is verify_sources_loaded's. */
int verify_loaded_locked(struct store *s, struct blob *b);
/* Is @st the file a LOCAL blob of content hash @xxh (other than @except,
 * may be NULL) was verified as? */
int copy_proven_locked(struct store *s, const char *xxh, const struct stat *st,
		       const struct blob *except);
/* May a blob share the copy of content hash @xxh in data/?  Only while it
 * is the file some LOCAL blob was verified as (copy_proven_locked): one
 * changed on disk since is vouched for by no one, and sharing it would
 * record it as proven -- served after a restart with no re-hash. */
int copy_shareable_locked(struct store *s, const char *xxh);
/* store_startcheck.c.  At load, after verify_loaded_locked, with no lock
 * held (a stat of each source is NAS I/O): a copy whose source is gone, not
 * a regular file, or of another size is dropped; an error that proves
 * nothing keeps it (one line, the gate told); while the gate says the NAS
 * is down no source is looked at.  The stats run on a thread of their own,
 * each waited for at most the NAS deadline (past it: the NAS is marked
 * down) and all at most a few seconds, so a frozen NAS never holds up the
 * start.  Kept copies are unchecked: the sweep and the first open check
 * them.  Returns the number dropped. */
size_t verify_sources_loaded(struct store *s);
/* store_verify.c.  The NAS root the source @key lies in, into @root ("" if
 * not known), for nas_missing_or_gone: 1 if it is NAS_HUB, 0 a further
 * root.  A look at the key's text only. */
int store_source_root(const struct store *s, const char *key, char *root, size_t sz);
/* The source's attributes as the store knows them when a copy begins: the
 * copy is evidence about that file only.  source_changed_locked: the store
 * has seen other ones since (a reader's stat or open, source_attrs_locked
 * in store.c): the NAS file was rewritten or another renamed over it while
 * it was copied, so the copy may hold the old bytes, or some of each. */
struct source_at {
	struct timespec mtime, ctime;
};
void source_at_locked(const struct blob *b, struct source_at *at);
int source_changed_locked(const struct blob *b, const struct source_at *at);
/* An automatic copy holds one of auto_max's slots while it runs
 * (b->auto_slot), until it ends or is asked for explicitly: from then on
 * it is an explicit copy, and another automatic one may start (the
 * workers are told).  No-op when @b holds none. */
void store_free_auto_slot_locked(struct store *s, struct blob *b);
/* Why a copy's prog.cancel was set: how the copy ends depends on it.  A
 * copy whose source shows new attributes can only end unused, so it is
 * stopped at once (COPY_STOP_SOURCE, store.c) and ends as one that found
 * the source changed at its end would: FAILED, "source changed".  The other
 * reasons (wfsctl evict, the store closing) set COPY_STOP, which wins over
 * it: the copy ends "cancelled", on the NAS. */
enum copy_stop { COPY_GO = 0, COPY_STOP = 1, COPY_STOP_SOURCE = 2 };
/* A copy just verified (fetch_copy_verify, or a partial file hashed whole)
 * and renamed into data/: record what proves it (its hashes; its identity,
 * taken now).  @checked: its sample is the source's identity as the store
 * knows the source now (a copy made under the attributes the store still
 * holds); 0: the source is sampled again before the copy serves an open
 * (store_check_source) and by the sweep. */
void verify_record_locked(struct store *s, struct blob *b, const struct fetch_result *res,
			  int checked);
/* Served locally, whole or in part: what a source check is for. */
int served_locally_locked(const struct blob *b);
/* Re-hash the copy of @b (a re-verification pending since start-up) in
 * full, and sample its source: neither with the lock held. */
void store_reverify_one(struct store *s, struct blob *b);

/* ---- store_sweep.c ---- */
/* A thread: every source checked once, then every copy the index could
 * not prove re-hashed, then the checks the NAS could not answer. */
void *store_recheck_sweep(void *arg);

/* ---- store_index.c ---- */
/* LOCAL_STORE's directories made (data/, tmp/ recreated if missing) and
 * its modes tightened; a read-only or full filesystem logged.  Never
 * fails: a store that cannot hold copies leaves every read on the NAS. */
void store_layout(struct store *s);
/* Load the index (each record checked by store_verify.c).  An unreadable
 * one is moved aside to index.json.damaged and the store starts with no
 * records, data/ untouched.  Returns 0 or -ENOMEM. */
int index_load(struct store *s);
int store_write_index(struct store *s);
/* The same if the index is behind the table (after any write in flight);
 * store_sync. */
int store_write_index_if_dirty(struct store *s);
/* store_write_index with index_lock and store.lock held by the caller, who
 * keeps them (store_leave). */
int store_write_index_held(struct store *s);
void store_empty_tmp(struct store *s);

/* ---- store_snapshot.c: the table as the index will say it ---- */

struct snap_chunk;

/* Records pointing into copies of every string they name. */
struct index_snapshot {
	struct index_rec *recs;
	size_t n, cap;
	struct snap_chunk *chunks;  /* the strings and ranges */
	size_t bytes;               /* of them */
	struct index_ref *refs;
	struct store_ref_rec *rcopy;
	size_t nrefs, refs_cap;
};

/* Memory for a snapshot of the table as it is now, made and its pages
 * touched before store.lock is taken (index_lock held, store.lock not):
 * under the lock, snapshot_take_locked then only copies.  0, or -ENOMEM
 * (what was made is kept: snapshot_take_locked makes the rest). */
int snapshot_prepare(struct store *s, struct index_snapshot *sn);
/* Every blob's record into @sn (under store.lock; what snapshot_prepare
 * made no room for is allocated here).  -ENOMEM when any record cannot be
 * copied: an index short of a verified copy's record would have the next
 * start discard that copy, so none is written. */
int snapshot_take_locked(struct store *s, struct index_snapshot *sn);
void snapshot_free(struct index_snapshot *sn);

/* ---- store_part.c (and, marked, store_part_copy.c): partial copies
 * (store.h) ---- */
/* parts/<XXH3-128 of @b's key>; part_name: the name alone (@b->key is
 * immutable: no lock needed). */
void part_path_locked(const struct store *s, const struct blob *b, char *out, size_t sz);
void part_name(const struct blob *b, char out[33]);
/* @b's part, made if it has none (NULL: out of memory). */
struct blob_part *part_get_locked(struct store *s, struct blob *b);
/* b->part_bytes (the read path's lock-free check) follows the list. */
void part_publish_locked(struct store *s, struct blob *b);
/* On the range worker's queue (once). */
void part_enqueue_locked(struct store *s, struct blob *b);
/* A verified range into @p's list, in offset order: 0, -EEXIST (it
 * overlaps a listed range: not inserted) or -ENOMEM. */
int part_insert_locked(struct blob_part *p, uint64_t off, uint64_t len, const char *xxh);
/* Drop every local range of @b and remove its partial file (the ranges
 * asked for too; a copy in flight is cancelled).  @why (may be NULL)
 * becomes the part's reason and is logged.  The bytes were the NAS's:
 * nothing for the kernel to forget.  Marks the index dirty. */
void part_drop_locked(struct store *s, struct blob *b, const char *why);
/* @b is LOCAL now, its ranges in its whole copy (@linked: their partial
 * file linked into data/, adopt; else a copy made from the NAS): they
 * are dropped, but the partial file's name stays until an index recording
 * the copy is on disk -- until then the index on disk names the ranges,
 * and a crash must find them.  A file of its own is counted as held
 * meanwhile; a link takes no room of its own. */
void part_retire_locked(struct store *s, struct blob *b, int linked);
/* A retired partial file's name goes now (an index naming none of its
 * ranges is on disk, its copy is evicted, or ranges are copied again). */
void part_retired_locked(struct store *s, struct blob *b);
/* The index write (store_index.c): at its snapshot, the retired names it
 * covers (marked); once it is on disk (@ok), they go, else wait for the
 * next. */
void part_retire_snapshot_locked(struct store *s);
void part_retire_written_locked(struct store *s, int ok);
/* The copy of inode @ino lost a name (its ctime moved): the LOCAL blobs it
 * proved are proven again by it as it is now (same inode, size and mtime:
 * the bytes were not written), and the index is to say so. */
void store_reprove_locked(struct store *s, uint64_t ino);
/* At load, a "partial" record: its ranges, checked against the file.
 * Returns 1 serving, 2 re-hashed first, 0 dropped. */
int part_load_locked(struct store *s, struct blob *b, const struct index_rec *r);
/* store_part_copy.c: the range worker. */
void *store_part_worker(void *arg);
void store_part_free(struct blob *b);

/* ---- store_copy.c: the queue and the workers ---- */
/* A verified copy @tmp becomes data/<xx>/@xxh (mode 0400, replacing what
 * was there; directory fsynced): 0 or -errno. */
int store_publish(struct store *s, const char *tmp, const char *xxh);
/* As store_publish, but @path keeps its name too (a hard link: no second
 * copy).  Lock held (the temporary name's serial). */
int store_publish_link_locked(struct store *s, const char *path, const char *xxh);
/* store_pin_why under the lock: 1 when @b's pins changed (the index
 * marked dirty). */
int store_pin_locked(struct store *s, struct blob *b, int why, int pin);
void store_unqueue_locked(struct store *s, struct blob *b);
void store_enqueue_locked(struct store *s, struct blob *b);
void *store_worker(void *arg);
/* promote_mbps across copies: a copy may read its first chunk ahead of
 * the cap (fetch.h, owed_ns), so a run of small ones was not slowed at
 * all; the worker that made it starts its next only once that time is
 * past.  store_owed_until: that time in store_now_ms() terms (0 when
 * nothing is owed).
 * store_owed_wait_locked: *@until past (or 0): sets it 0, returns 0; else
 * waits on @cond until then or until woken (a stop, the index: the caller
 * looks again) and returns 1.  Called with the lock held. */
int64_t store_owed_until(uint64_t owed_ns);
int store_owed_wait_locked(struct store *s, pthread_cond_t *cond, int64_t *until);
/* Bytes/s a copy may read from the NAS (0: no cap): promote_mbps is shared
 * by every copy that may run at once (the workers' and the range worker's),
 * and an automatic copy keeps to its share of auto_mbps too. */
uint64_t store_copy_rate(struct store *s, int auto_copy);

#endif
