/* fetch_pipeline.c - the verified copy's pipeline: the source and
 * verification streams over one ring of slots, the syncs, the throttle.
 *
 *
 * Two streams share one ring.  The source stream reads the NAS file into a
 * ring of slots; reads complete in any order, but the slots are hashed (and
 * their writes issued) strictly in offset order, because the hashes are
 * streaming.  Every so often the completed prefix of the copy is made durable
 * (fdatasync), and the verification stream re-reads that durable prefix from
 * the disk while the copy goes on, so the re-read costs little extra time.
 * The last segment is re-read after the final fsync.
 *
 * A slot is reused only once its previous chunk is fully written and hashed
 * (source) or hashed (verification); with chunk k always in slot k % n, that
 * keeps the bookkeeping to three offsets per stream.
 *
 * Where the time goes (WFS_FETCH_PROFILE, test_fetch --bench): SHA-256 is
 * the cost that cannot shrink, about 0.5 ns a byte on one core; XXH3 is a
 * tenth of that; the rest is the kernel's I/O.  Hashing everything on the
 * copying thread made a copy take SHA-256 + XXH3 twice + the I/O in turn.
 * So when the blob is named by a content address, the source bytes are
 * hashed (the address and XXH3-128) on a hasher thread of their own, slot
 * by slot in offset order, 64 KiB of one hash then the same 64 KiB of the
 * other while they are in the cache, and the copying thread only drives the
 * I/O, samples the source and hashes the re-read (XXH3 only: equal to the
 * XXH3 of the source read, it proves the durable copy is the bytes the
 * address was computed over).  A copy then goes at the hasher's pace as
 * long as another core takes the rest.  The slot memory is registered with
 * the ring (fixed buffers: no pages pinned and dirtied per operation), a
 * third less CPU for the copying thread.  The periodic fdatasyncs run in the
 * ring while the copy goes on; the hasher is seldom left waiting for them.
 *
 * The job is set up, and its end checked, in fetch.c; the engine (io_uring,
 * or the same operations done synchronously) is in fetch_engine.c, the
 * content-address hasher in fetch_hasher.c; what they share is in
 * fetch_int.h.
 */
#include "fetch_int.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* the copying thread waits for the hasher to hash this many slots more
 * (fewer wake-ups; the other slots keep the reads and writes going) */
#define WAKE_BATCH 4
/* a throttled pipeline still looks at the cancel flag this often */
#define MAX_NAP_NS 100000000LL

static int64_t prof_now(const struct job *j)
{
	return j->prof ? mono_ns() : 0;
}

/* ---- the pipeline ---- */

static struct slot *slot_at(struct stream *s, uint64_t off)
{
	return &s->slots[(off / CHUNK) % s->n];
}

static uint64_t ud_of(struct slot *sl, int op)
{
	return (uint64_t)(uintptr_t)sl | (uint64_t)op;
}

/* An O_DIRECT request refused with EINVAL (alignment the filesystem will
 * not take, or no direct I/O at all): go on buffered, once. */
static int retry_buffered(struct stream *s, struct slot *sl, int res)
{
	if (res != -EINVAL || !sl->direct)
		return 0;
	if (s->direct) {
		int fl = fcntl(s->fd, F_GETFL);

		if (fl < 0 || fcntl(s->fd, F_SETFL, fl & ~O_DIRECT) < 0)
			return 0;
		s->direct = 0;
	}
	return 1;
}

static void submit_read(struct job *j, struct stream *s, struct slot *sl)
{
	size_t len = sl->want - sl->got;

	if (sl->off + sl->want == j->size) {
		/* asking one byte past the end makes a longer source visible */
		len = round_up(len + (s->is_src ? 1 : 0), ALIGN);
	}
	sl->direct = s->direct;
	eng_rw(&j->eng, 0, s->fd, sl->buf + sl->got, len, sl->off + sl->got, ud_of(sl, OP_READ));
}

static void submit_write(struct job *j, struct slot *sl)
{
	struct stream *d = &j->ver;
	size_t len = sl->want - sl->got;

	sl->direct = d->direct;
	if (d->direct) {
		/* O_DIRECT writes whole blocks; the padding is trimmed at the end */
		size_t padded = round_up(len, ALIGN);

		memset(sl->buf + sl->want, 0, padded - len);
		len = padded;
	}
	eng_rw(&j->eng, 1, d->fd, sl->buf + sl->got, len, sl->off + sl->got, ud_of(sl, OP_WRITE));
}

static void read_done(struct job *j, struct slot *sl, int res)
{
	struct stream *s = sl->st;
	/* the source changing under us is "stale"; the copy doing so is damage */
	int changed = s->is_src ? -ESTALE : -EIO;

	if (res < 0) {
		if (retry_buffered(s, sl, res) || res == -EAGAIN || res == -EINTR)
			submit_read(j, s, sl);
		else if (s->is_src)
			job_fail_src(j, res, "read error on %s at offset %" PRIu64 ": %s", s->path,
				 sl->off + sl->got, strerror(-res));
		else
			job_fail(j, res, "read error on %s at offset %" PRIu64 ": %s", s->path,
			     sl->off + sl->got, strerror(-res));
		return;
	}
	if (res == 0) {
		job_fail(j, changed, "short read on %s at offset %" PRIu64, s->path, sl->off + sl->got);
		return;
	}
	sl->got += (size_t)res;
	if (sl->got > sl->want)
		job_fail(j, changed, "%s is longer than %" PRIu64 " bytes", s->path, j->size);
	else if (sl->got < sl->want)
		submit_read(j, s, sl);
	else
		sl->state = SLOT_READY;
}

static void write_done(struct job *j, struct slot *sl, int res)
{
	if (res < 0) {
		if (retry_buffered(&j->ver, sl, res) || res == -EAGAIN || res == -EINTR)
			submit_write(j, sl);
		else
			job_fail_write(j, res, "write error on");
		return;
	}
	if (res == 0) {
		job_fail(j, -EIO, "short write on %s at offset %" PRIu64, j->ver.path, sl->off + sl->got);
		return;
	}
	sl->got += (size_t)res;
	if (sl->got < sl->want) {
		submit_write(j, sl);
		return;
	}
	sl->state = SLOT_WRITTEN;
}

/* Free the source slots written and hashed, in offset order. */
static void src_reap(struct job *j)
{
	struct stream *s = &j->src;
	uint64_t id_done = hasher_done(&j->hs), was = s->done;

	j->hs.seen = id_done;
	while (s->done < s->hashed) {
		struct slot *d = slot_at(s, s->done);

		if (d->state != SLOT_WRITTEN || d->off + d->want > id_done)
			break;
		d->state = SLOT_FREE;
		s->done += d->want;
	}
	if (j->prog && s->done != was)
		atomic_store(&j->prog->bytes_done, s->done);
}

/* @final: the fsync after the last write, else the periodic fdatasync (one
 * at a time, so its target is still j->sync_asked) */
static void sync_done(struct job *j, int final, int res)
{
	uint64_t target = final ? j->size : j->sync_asked;

	j->syncs--;
	if (j->prof) {
		int64_t now = mono_ns();

		if (final)
			j->prof->final_sum += now - j->prof->final_t;
		else
			j->prof->sync_sum += now - j->prof->sync_t;
	}
	if (res < 0) {
		job_fail_write(j, res, "fsync failed on");
		return;
	}
	if (target > j->ver.limit) {
		if (fetch_test_durable && j->copying)
			fetch_test_durable(j->ver.path, target);
		j->ver.limit = target;
	}
	j->final_synced |= final;
}

static void complete(struct job *j, uint64_t ud, int res)
{
	struct slot *sl = (struct slot *)(uintptr_t)(ud & ~(uint64_t)3);

	if ((ud & 3) == OP_SYNC)
		sync_done(j, (int)(ud >> 2), res);
	else if ((ud & 3) == OP_WAKE)
		j->hs.waiting = 0;  /* the hasher moved on: looked at in advance() */
	else if (j->err)
		return;  /* after a failure, operations in flight are only drained */
	else if ((ud & 3) == OP_READ)
		read_done(j, sl, res);
	else
		write_done(j, sl, res);
}

/* The bucket's tokens at @now, refilled at the rate since it was last
 * looked at (not capped at a chunk: throttle_take does that). */
static double tokens_at(const struct job *j, const struct timespec *now)
{
	return j->tokens + j->rate * ((double)(now->tv_sec - j->last.tv_sec) +
				      (double)(now->tv_nsec - j->last.tv_nsec) / 1e9);
}

/* Sleep-based token bucket: a read may start whenever the bucket is not in
 * debt, and takes its whole size; so the average never passes the rate and a
 * burst never passes one chunk, whatever the rate. */
static int throttle_take(struct job *j, size_t n)
{
	uint64_t set = j->prog ? atomic_load_explicit(&j->prog->rate, memory_order_relaxed) : 0;
	struct timespec now;

	/* another thread changed the cap (fetch.h): it holds from this read
	 * on; a debt run up at the old one is at most a chunk */
	if (set)
		j->rate = set == FETCH_RATE_NONE ? 0 : (double)set;
	if (j->rate <= 0)
		return 1;
	clock_gettime(CLOCK_MONOTONIC, &now);
	j->tokens = tokens_at(j, &now);
	if (j->tokens > (double)CHUNK)
		j->tokens = (double)CHUNK;
	j->last = now;
	if (j->tokens < 0) {
		double ns = -j->tokens / j->rate * 1e9 + 1;

		j->wait_ns = ns > MAX_NAP_NS ? MAX_NAP_NS : (int64_t)ns;
		return 0;
	}
	j->tokens -= (double)n;
	return 1;
}

uint64_t throttle_owed_ns(const struct job *j)
{
	struct timespec now;
	double tokens;

	if (j->rate <= 0)
		return 0;
	clock_gettime(CLOCK_MONOTONIC, &now);
	tokens = tokens_at(j, &now);
	return tokens >= 0 ? 0 : (uint64_t)(-tokens / j->rate * 1e9);
}

/* The source slots read, in offset order: sampled, hashed (here, or handed
 * to the hasher) and written. */
static void src_hash(struct job *j)
{
	struct stream *s = &j->src;

	while (!j->err && s->hashed < j->size) {
		struct slot *sl = slot_at(s, s->hashed);
		int64_t p0;

		if (sl->state != SLOT_READY || sl->off != s->hashed)
			break;
		p0 = prof_now(j);
		sample_hash_feed(&j->sh, sl->off, sl->buf, sl->want);
		if (j->hs.started) {
			hasher_post(&j->hs, sl);
		} else {
			content_hash_update(&j->ch, sl->buf, sl->want);
			if (j->prof)
				j->prof->hash_here += mono_ns() - p0;
		}
		if (!s->direct)
			posix_fadvise(s->fd, (off_t)sl->off, (off_t)sl->want, POSIX_FADV_DONTNEED);
		s->hashed += sl->want;
		sl->state = SLOT_WRITING;
		sl->got = 0;
		submit_write(j, sl);
	}
}

/* Start reads into the free slots, up to s->limit: the source's size, or
 * for the verification the prefix of the copy known durable. */
static void read_more(struct job *j, struct stream *s)
{
	while (s->sub < s->limit) {
		struct slot *sl = slot_at(s, s->sub);
		size_t want = j->size - s->sub < CHUNK ? (size_t)(j->size - s->sub) : CHUNK;

		if (sl->state != SLOT_FREE || (s->is_src && !throttle_take(j, want)))
			break;
		/* a buffered re-read must come from the disk: drop the (clean,
		 * synced) cached pages first -- whole pages: a range ending
		 * inside one keeps it, and the file's last page would be
		 * compared from the cache */
		if (!s->is_src && !s->direct)
			posix_fadvise(s->fd, (off_t)s->sub, (off_t)round_up(want, 4096),
				      POSIX_FADV_DONTNEED);
		sl->off = s->sub;
		sl->want = want;
		sl->got = 0;
		sl->state = SLOT_READING;
		submit_read(j, s, sl);
		s->sub += want;
	}
}

/* Once every byte is written: settle the content address, trim the O_DIRECT
 * padding, and issue the fsync that makes the whole copy durable. */
static void src_finish(struct job *j)
{
	struct stream *s = &j->src;
	struct stat st;

	if (j->finalized || s->done < j->size)
		return;
	j->finalized = 1;
	content_hash_final(&j->ch, j->res->xxh, &j->res->id_check);
	sample_hash_final(&j->sh, j->res->sample);
	if (j->res->id_check == 0) {
		job_fail(j, -EBADMSG, "content does not match its name: %s %s (blob id %s)",
		     j->ch.kind == HUB_ID_SHA256 ? "sha256" : "git blob sha1", j->ch.id_hex,
		     j->ch.expected);
		return;
	}
	if (fstat(s->fd, &st) < 0) {
		job_fail_src(j, -errno, "cannot stat %s: %s", s->path, strerror(errno));
		return;
	}
	if ((uint64_t)st.st_size != j->size) {
		job_fail(j, -ESTALE, "%s changed size during the copy (%" PRIu64 " bytes, expected %" PRIu64 ")",
		     s->path, (uint64_t)st.st_size, j->size);
		return;
	}
	/* Rewritten in place (same size) while read: the bytes read may be
	 * part old, part new -- a file the NAS never held, and its hash and
	 * sample agree with it.  Only the times tell. */
	if (!same_file_state(&j->src_st, &st)) {
		job_fail(j, -ESTALE, "%s changed during the copy (a new mtime or ctime: written "
			 "in place)", s->path);
		return;
	}
	if (ftruncate(j->ver.fd, (off_t)j->size) < 0 || fchmod(j->ver.fd, 0444) < 0) {
		job_fail_write(j, -errno, "cannot finish");
		return;
	}
	j->syncs++;
	if (j->prof)
		j->prof->final_t = mono_ns();
	eng_sync(&j->eng, j->ver.fd, 0, (1 << 2) | OP_SYNC);
}

static void sync_more(struct job *j)
{
	struct stream *s = &j->src;

	if (j->finalized || j->syncs || s->done >= j->size || s->done - j->sync_asked < j->seg)
		return;
	j->sync_asked = s->done;
	j->syncs++;
	if (j->prof) {
		j->prof->sync_t = mono_ns();
		j->prof->syncs++;
	}
	eng_sync(&j->eng, j->ver.fd, 1, OP_SYNC);
}

static void ver_hash(struct job *j)
{
	struct stream *v = &j->ver;

	while (!j->err && v->hashed < j->size) {
		struct slot *sl = slot_at(v, v->hashed);
		int64_t p0;

		if (sl->state != SLOT_READY || sl->off != v->hashed)
			break;
		p0 = prof_now(j);
		content_hash_update(&j->vh, sl->buf, sl->want);
		if (j->prof)
			j->prof->hash_ver += mono_ns() - p0;
		if (!v->direct)
			posix_fadvise(v->fd, (off_t)sl->off, (off_t)sl->want, POSIX_FADV_DONTNEED);
		v->hashed += sl->want;
		sl->state = SLOT_FREE;
		if (j->prog && !j->copying)
			atomic_store(&j->prog->bytes_done, v->hashed);
	}
}

/* While the hasher has work, a read of its eventfd is in flight (with
 * io_uring; without, a blocking read only once nothing else is pending),
 * done once the hasher is WAKE_BATCH slots further (or has all it holds).
 * The hasher stores done, then loads wake_at; this stores wake_at, then
 * loads done (all seq_cst): one of the two sees the other's store, and the
 * one whose compare-exchange takes wake_at to 0 writes efd, once. */
static int hasher_wait(struct job *j)
{
	struct hasher *h = &j->hs;
	uint64_t done, at, one = 1;

	if (!h->started)
		return 0;
	done = hasher_done(h);
	if (done > h->seen)
		return 1;  /* it moved on since src_reap() looked: advance again */
	if (h->waiting || done >= h->posted || (!j->eng.uring && j->eng.inflight))
		return 0;
	at = done + WAKE_BATCH * CHUNK;
	if (at > h->posted)
		at = h->posted;
	atomic_store(&h->wake_at, at);
	if (atomic_load(&h->done) >= at) {
		uint64_t want = at;

		/* reached already: the hasher may not have seen wake_at */
		if (atomic_compare_exchange_strong(&h->wake_at, &want, 0))
			while (write(h->efd, &one, sizeof(one)) < 0 && errno == EINTR)
				;
	}
	h->waiting = 1;
	eng_wake(&j->eng, h->efd, &h->efd_buf, OP_WAKE);
	return 0;
}

static void advance_once(struct job *j)
{
	j->wait_ns = 0;
	if (j->prog && atomic_load(&j->prog->cancel))
		job_fail(j, -ECANCELED, "cancelled");
	if (j->err) {
		if (j->hs.started)  /* what it holds is only drained */
			atomic_store(&j->hs.abort, 1);
		return;
	}
	if (j->copying) {
		src_reap(j);
		src_hash(j);
		src_finish(j);
		sync_more(j);
		if (!j->err)
			read_more(j, &j->src);
	}
	ver_hash(j);
	if (!j->err)
		read_more(j, &j->ver);
}

/* Everything that can go on now; then, if the hasher is what is waited
 * for, a read of its eventfd in flight. */
static void advance(struct job *j)
{
	do
		advance_once(j);
	while (!j->err && hasher_wait(j));
}

static int finished(struct job *j)
{
	return j->ver.hashed == j->size && (!j->copying || j->final_synced);
}

void job_run(struct job *j)
{
	for (;;) {
		uint64_t ud;
		int64_t p0;
		int res, r;

		advance(j);
		if (j->eng.inflight == 0) {
			if (j->err || finished(j))
				return;
			if (j->wait_ns <= 0) {
				job_fail(j, -EIO, "internal error: copy pipeline stalled");
				return;
			}
		}
		p0 = prof_now(j);
		r = eng_next(&j->eng, 1, j->wait_ns > 0 ? j->wait_ns : -1, &ud, &res);
		if (j->prof) {
			j->prof->wait += mono_ns() - p0;
			j->prof->waits++;
		}
		while (r > 0) {
			complete(j, ud, res);
			r = eng_next(&j->eng, 0, 0, &ud, &res);
		}
		if (r < 0) {
			/* the ring is broken: nothing in flight can be waited for */
			j->ring_broken = j->eng.inflight > 0;
			job_fail(j, r, "io_uring failed: %s", strerror(-r));
			return;
		}
	}
}
