/* store_part.c - partial copies: verified byte ranges of a blob (store.h).
 *
 * A blob's partial copy is one sparse file, parts/<XXH3-128 of its key>,
 * of the blob's size, holding each verified range at its own offset, so a
 * read needs no offset map and a range is served by one pread.  Rules:
 *   - a range serves only once it is in the blob's list: copied, durable,
 *     read back equal (fetch_range_verify).  Bytes of a range copy that
 *     failed are punched out; bytes no list names (a crash) never serve
 *     and are punched out at the next load;
 *   - ranges are kept apart, each with its own XXH3-128, never overlapping;
 *     a request that overlaps local ranges, wanted ones or the piece being
 *     copied copies only the gaps (nothing is copied twice);
 *   - the file's identity (inode, mtime, ctime) after its last verified
 *     range is what lets the ranges serve after a restart; a file with
 *     another identity has every range re-hashed before any serves, and a
 *     range whose hash differs is dropped;
 *   - the source's identity (size + sampled hash: b->sample) is taken with
 *     every range: a range copied under another identity drops the others
 *     (the source changed), and it is re-checked as for whole copies;
 *   - ranges are dropped all at once (evict, source changed): the file is
 *     removed and its generation moves on; a reader with it open keeps the
 *     old bytes, which were the NAS's.  A hole is never punched under a
 *     listed range, so a read planned on a range never meets one;
 *   - ranges that cover the whole blob become its whole copy in place: the
 *     partial file is hashed whole from the disk (XXH3-128, the source
 *     sample, the content address), and, still the file the ranges were
 *     verified in, hard-linked into data/ -- no second copy, no second
 *     room;
 *   - a blob made whole (so, or by a copy from the NAS) keeps its partial
 *     file's name until an index that records the copy is on disk: until
 *     then the index on disk names the ranges, and a crash finds them (a
 *     linked file's ctime moved: re-hashed).  The name goes at once if the
 *     copy goes first; a copy that lost it is proven again (its ctime
 *     moved too).  A file of its own is counted as held meanwhile.
 * One worker thread copies ranges, one at a time, in the order asked
 * (store_part_copy.c); this file keeps the lists and loads them.
 */
#include "store.h"
#include "store_int.h"
#include "hash.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

/* A range asked for is copied and verified in pieces of at most this
 * much, each its own range once verified: a crash or a failure loses one
 * piece, not a 47 GiB partition, the index records progress as it goes,
 * and one piece's bytes are all that sit in the page cache unverified. */
#define PART_PIECE ((uint64_t)256 << 20)

void part_name(const struct blob *b, char out[33])
{
	xxh128_hex_of(b->key, strlen(b->key), out);
}

void part_path_locked(const struct store *s, const struct blob *b, char *out, size_t sz)
{
	char h[33];

	part_name(b, h);
	snprintf(out, sz, "%s/%s", s->part_dir, h);
}

struct blob_part *part_get_locked(struct store *s, struct blob *b)
{
	if (!b->part && (b->part = calloc(1, sizeof(*b->part)))) {
		b->part_next = s->part_list; /* kept until store_close */
		s->part_list = b;
	}
	return b->part;
}

void part_publish_locked(struct store *s, struct blob *b)
{
	struct blob_part *p = b->part;
	uint64_t was = atomic_load_explicit(&b->part_bytes, memory_order_relaxed);
	uint64_t now = p && !p->unproven ? p->bytes : 0;

	atomic_store_explicit(&b->part_bytes, now, memory_order_release);
	if (!was != !now)
		store_copies_moved_locked(s);
}

void store_part_free(struct blob *b)
{
	if (!b->part)
		return;
	free(b->part->v);
	free(b->part->want);
	free(b->part);
	b->part = NULL;
}

/* @b's lists emptied, its copy in flight cancelled, its generation moved
 * on: the partial file is no one's now. */
static void part_clear_locked(struct store *s, struct blob *b, const char *why)
{
	struct blob_part *p = b->part;

	if (p->copying)
		atomic_store(&p->prog.cancel, COPY_STOP);
	p->n = p->nwant = 0;
	p->bytes = p->want_total = p->want_done = 0;
	p->inflight = (struct brange){ 0, 0 }; /* its copy is no one's now (gen moves on) */
	p->unproven = 0;
	p->adopt = 0;
	p->gen++;
	snprintf(p->reason, sizeof(p->reason), "%s", why ? why : "");
	part_publish_locked(s, b);
	store_dirty_locked(s);
}

void part_drop_locked(struct store *s, struct blob *b, const char *why)
{
	struct blob_part *p = b->part;
	char path[PATH_MAX + 64];

	if (!p || (!p->n && !p->nwant && !p->unproven && !p->copying))
		return;
	part_path_locked(s, b, path, sizeof(path));
	if (unlink(path) == 0 && b->open_count && p->n) {
		uint64_t c = part_charge_locked(s, b); /* freed at the last close */

		b->held += c;
		s->held += c;
	}
	if (why && p->n)
		store_log_msg(s, LOG_NOTICE, "dropped the %zu local range%s of %s: %s", p->n,
			      p->n == 1 ? "" : "s", b->key, why);
	part_clear_locked(s, b, why);
	/* a plain NAS blob again: its reads may make it hot (a flag they set
	 * while it was staged in part, which the policy does not copy, kept it
	 * from ever turning hot again) */
	store_reset_hot_locked(s, b);
}

void part_retire_locked(struct store *s, struct blob *b, int linked)
{
	struct blob_part *p = b->part;
	uint64_t c;

	/* an index that is never written (index_kept) names nothing to keep */
	if (!p || !p->n || s->index_kept) {
		part_drop_locked(s, b, NULL);
		return;
	}
	c = linked ? 0 : part_charge_locked(s, b);
	part_clear_locked(s, b, NULL);
	s->part_retiring += !p->retire;
	p->retire = 1;
	p->retire_charge += c;
	s->held += c;
}

void part_retired_locked(struct store *s, struct blob *b)
{
	struct blob_part *p = b->part;
	char path[PATH_MAX + 64];
	struct stat st;

	if (!p || !p->retire)
		return;
	part_path_locked(s, b, path, sizeof(path));
	if (lstat(path, &st) == 0 && unlink(path) == 0 && st.st_nlink > 1)
		store_reprove_locked(s, (uint64_t)st.st_ino);
	if (b->open_count) /* a reader may hold the file: freed at the last close */
		b->held += p->retire_charge;
	else
		s->held -= p->retire_charge < s->held ? p->retire_charge : s->held;
	p->retire = 0;
	p->retire_charge = 0;
	s->part_retiring--;
}

void part_retire_snapshot_locked(struct store *s)
{
	if (!s->part_retiring)
		return;
	STORE_EACH(s, b)
		if (b->part && b->part->retire == 1 && !b->part->n)
			b->part->retire = 2;
}

void part_retire_written_locked(struct store *s, int ok)
{
	if (!s->part_retiring)
		return;
	STORE_EACH(s, b) {
		if (!b->part || b->part->retire != 2)
			continue;
		if (ok)
			part_retired_locked(s, b);
		else
			b->part->retire = 1;
	}
}

void store_reprove_locked(struct store *s, uint64_t ino)
{
	STORE_EACH(s, o) {
		char local[PATH_MAX + 64];
		struct stat st;

		if (o->state != BLOB_LOCAL || o->copy.ino != ino ||
		    store_local_path_locked(s, o, local, sizeof(local)) < 0 ||
		    lstat(local, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_ino != ino ||
		    (uint64_t)st.st_size != o->size || !same_ts(&st.st_mtim, &o->copy.mtime))
			continue;
		file_proof_take(&o->copy, &st);
		s->copies_unrecorded = 1; /* a restart before the index says so re-hashes it */
		store_dirty_locked(s);
	}
}

/* ---- requests ---- */

static int push_range(struct brange **v, size_t *n, size_t *cap, struct brange r)
{
	if (*n == *cap) {
		size_t c = *cap ? *cap * 2 : 8;
		struct brange *nv = realloc(*v, c * sizeof(*nv));

		if (!nv)
			return -ENOMEM;
		*v = nv;
		*cap = c;
	}
	(*v)[(*n)++] = r;
	return 0;
}

/* What @p has or will have: its verified and wanted ranges and the piece
 * in flight (off the want list, not listed yet: left out, it would be
 * asked for and copied a second time), normalised. */
static struct brange *held_set(const struct blob_part *p, size_t *n)
{
	struct brange *v = malloc((p->n + p->nwant + 2) * sizeof(*v));

	*n = 0;
	if (!v)
		return NULL;
	for (size_t i = 0; i < p->n; i++)
		v[(*n)++] = (struct brange){ p->v[i].off, p->v[i].len };
	for (size_t i = 0; i < p->nwant; i++)
		v[(*n)++] = p->want[i];
	if (p->inflight.len)
		v[(*n)++] = p->inflight;
	*n = brange_normalize(v, *n);
	return v;
}

void part_enqueue_locked(struct store *s, struct blob *b)
{
	if (b->part->queued)
		return;
	b->part->queued = 1;
	b->part->qnext = NULL;
	if (s->part_tail)
		s->part_tail->part->qnext = b;
	else
		s->part_head = b;
	s->part_tail = b;
	pthread_cond_broadcast(&s->part_cond);
}

/* Queue, in pieces of at most PART_PIECE, the parts of the request @r
 * (normalised) that the held set @h (normalised) does not cover: one walk
 * over both, as the two are sorted (a held set made and sorted again for
 * every range asked for held the lock 47 s at 40k ranges).
 * Returns the bytes queued, or -ENOMEM with none queued. */
static int64_t want_gaps_locked(struct blob_part *p, const struct brange *r, size_t nr,
				const struct brange *h, size_t nh)
{
	size_t j = 0, before = p->nwant;
	int64_t added = 0;

	for (size_t i = 0; i < nr; i++) {
		uint64_t pos = r[i].off, end = r[i].off + r[i].len;

		while (pos < end) {
			uint64_t stop;

			while (j < nh && h[j].off + h[j].len <= pos)
				j++;
			if (j < nh && h[j].off <= pos) { /* held: on past it */
				pos = h[j].off + h[j].len;
				continue;
			}
			stop = j < nh && h[j].off < end ? h[j].off : end;
			for (; pos < stop;) {
				uint64_t len = stop - pos < PART_PIECE ? stop - pos : PART_PIECE;

				if (push_range(&p->want, &p->nwant, &p->capwant,
					       (struct brange){ pos, len }) < 0) {
					p->nwant = before;
					return -ENOMEM;
				}
				added += (int64_t)len;
				pos += len;
			}
		}
	}
	return added;
}

int64_t store_part_request(struct store *s, struct blob *b, const struct brange *v, size_t n,
			   int pin)
{
	struct blob_part *p;
	struct brange *req = malloc((n + 1) * sizeof(*req)), *h = NULL;
	size_t nr, nh = 0;
	int64_t total = 0;

	if (!req)
		return -ENOMEM;
	if (n)
		memcpy(req, v, n * sizeof(*req));
	nr = brange_normalize(req, n); /* once, and outside the lock */
	pthread_mutex_lock(&s->lock);
	for (size_t i = 0; i < n; i++)
		if (!v[i].len || v[i].off > b->size || v[i].len > b->size - v[i].off) {
			total = -EINVAL;
			goto out;
		}
	if (s->index_kept && !b->part && b->state != BLOB_LOCAL) {
		char name[33];

		part_name(b, name);
		if (store_kept_part(s, name)) { /* the kept index's ranges (store.h: kept) */
			total = -EBUSY; /* (refused whole: not pinned either) */
			goto out;
		}
	}
	if (pin)
		store_pin_locked(s, b, PIN_HAND, 1);
	if (b->state == BLOB_LOCAL)
		goto out;
	if (!(p = part_get_locked(s, b)) || !(h = held_set(p, &nh))) {
		total = -ENOMEM;
		goto out;
	}
	if (!p->nwant && !p->copying) {
		p->want_total = p->want_done = 0; /* a new request: progress afresh */
		p->failed = 0;
	}
	p->reason[0] = '\0';
	total = want_gaps_locked(p, req, nr, h, nh);
	if (total > 0) {
		/* Asked for now: for its room, copies used before this may be
		 * evicted, as for a whole copy (copy_freeable, store_space.c);
		 * a whole copy queued or running keeps its own time. */
		if (b->state != BLOB_QUEUED && b->state != BLOB_COPYING)
			b->want_ns = store_now_ns();
		p->want_total += (uint64_t)total;
		part_enqueue_locked(s, b);
		store_dirty_locked(s);
	}
out:
	pthread_mutex_unlock(&s->lock);
	free(h);
	free(req);
	return total;
}

/* ---- the read path ---- */

size_t store_part_plan(struct store *s, struct blob *b, uint64_t off, uint64_t len,
		       struct brange *out, size_t cap, unsigned *gen)
{
	struct blob_part *p;
	size_t k = 0;

	pthread_mutex_lock(&s->lock);
	p = b->part;
	if (p && !p->unproven && b->state != BLOB_LOCAL) {
		/* the first range ending past @off, by bisection: a read over
		 * many ranges plans again for each PART_SEGS of them (fs/file.c),
		 * under the store's lock, and a file may hold tens of thousands */
		size_t lo = 0, hi = p->n;

		while (lo < hi) {
			size_t mid = lo + (hi - lo) / 2;

			if (p->v[mid].off + p->v[mid].len <= off)
				lo = mid + 1;
			else
				hi = mid;
		}
		*gen = p->gen;
		for (size_t i = lo; i < p->n && k < cap; i++) {
			uint64_t a = p->v[i].off, e = a + p->v[i].len;

			if (a >= off + len)
				break;
			a = a > off ? a : off;
			e = e < off + len ? e : off + len;
			out[k++] = (struct brange){ a, e - a };
		}
	}
	pthread_mutex_unlock(&s->lock);
	return k;
}

int store_part_path(struct store *s, struct blob *b, char *out, size_t sz, unsigned *gen)
{
	int r = -ENOENT;

	pthread_mutex_lock(&s->lock);
	if (b->part && b->part->n) {
		part_path_locked(s, b, out, sz);
		*gen = b->part->gen;
		r = 0;
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}

void store_part_read_error(struct store *s, struct blob *b)
{
	pthread_mutex_lock(&s->lock);
	s->local_read_errors++;
	part_drop_locked(s, b, "partial copy unreadable (ranges dropped; NAS bytes from now on)");
	pthread_mutex_unlock(&s->lock);
}

void store_part_open_error(struct store *s, struct blob *b, unsigned gen, int err)
{
	char why[160];

	pthread_mutex_lock(&s->lock);
	if (b->part && b->part->n && b->part->gen == gen) {
		s->local_read_errors++;
		snprintf(why, sizeof(why), "partial copy cannot be opened: %s (ranges dropped; NAS "
			 "bytes from now on)", strerror(err < 0 ? -err : err));
		part_drop_locked(s, b, why);
	}
	pthread_mutex_unlock(&s->lock);
}

void store_part_note_read(struct store *s, struct blob *b, uint64_t bytes)
{
	atomic_fetch_add_explicit(&s->part_local_read, bytes, memory_order_relaxed);
	atomic_fetch_add_explicit(&b->local_bytes, bytes, memory_order_relaxed);
	atomic_store_explicit(&b->use_ns, store_now_ns(), memory_order_relaxed);
}

int store_part_ranges(struct store *s, struct blob *b, struct brange **v, size_t *n)
{
	int r = 0;

	*v = NULL;
	*n = 0;
	pthread_mutex_lock(&s->lock);
	if (b->part && b->part->n) {
		*v = malloc(b->part->n * sizeof(**v));
		if (!*v)
			r = -ENOMEM;
		for (size_t i = 0; *v && i < b->part->n; i++)
			(*v)[i] = (struct brange){ b->part->v[i].off, b->part->v[i].len };
		*n = *v ? b->part->n : 0;
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}

const char *blob_info_state_name(const struct blob_info *in)
{
	if (in->part_bytes && (in->state == BLOB_NAS || in->state == BLOB_FAILED))
		return "partial";
	return blob_state_name(in->state);
}

/* ---- the lists ---- */

int part_insert_locked(struct blob_part *p, uint64_t off, uint64_t len, const char *xxh)
{
	size_t i, lo = 0, hi = p->n;

	while (lo < hi) { /* the first range that starts at or past @off */
		size_t mid = lo + (hi - lo) / 2;

		if (p->v[mid].off < off)
			lo = mid + 1;
		else
			hi = mid;
	}
	i = lo;
	/* the list stays disjoint: an overlap would count its bytes twice (a
	 * blob with holes taken as whole), and the index would be refused at
	 * the next start-up; each range keeps its own hash, so none is merged */
	if ((i > 0 && p->v[i - 1].off + p->v[i - 1].len > off) ||
	    (i < p->n && p->v[i].off < off + len))
		return -EEXIST;
	if (p->n == p->cap) {
		size_t c = p->cap ? p->cap * 2 : 8;
		struct part_range *v = realloc(p->v, c * sizeof(*v));

		if (!v)
			return -ENOMEM;
		p->v = v;
		p->cap = c;
	}
	memmove(&p->v[i + 1], &p->v[i], (p->n - i) * sizeof(*p->v));
	p->v[i] = (struct part_range){ .off = off, .len = len };
	snprintf(p->v[i].xxh, sizeof(p->v[i].xxh), "%s", xxh);
	p->n++;
	p->bytes += len;
	return 0;
}

/* ---- load ---- */

static int ranges_valid(const struct index_rec *r)
{
	uint64_t end = 0;

	for (size_t i = 0; i < r->nranges; i++) {
		const struct part_range *x = &r->ranges[i];

		if (!x->len || x->off < end || x->off > r->size || x->len > r->size - x->off ||
		    !xxh128_hex_valid(x->xxh))
			return 0;
		end = x->off + x->len;
	}
	return r->nranges > 0 && xxh128_hex_valid(r->sample);
}

int part_load_locked(struct store *s, struct blob *b, const struct index_rec *r)
{
	struct blob_part *p;
	char path[PATH_MAX + 64];
	struct stat st;

	if (!ranges_valid(r)) {
		store_log_msg(s, LOG_WARNING, "start-up: dropped the partial copy of %s (its index "
			      "record's ranges or sampled hash are not valid)", b->key);
		return 0;
	}
	if (!(p = part_get_locked(s, b)))
		return 0;
	for (size_t i = 0; i < r->nranges; i++)
		part_insert_locked(p, r->ranges[i].off, r->ranges[i].len, r->ranges[i].xxh);
	snprintf(b->sample, sizeof(b->sample), "%s", r->sample);
	p->proof = (struct file_proof){ r->part_ino, r->part_mtime, r->part_ctime };
	part_path_locked(s, b, path, sizeof(path));
	if (lstat(path, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != b->size) {
		store_log_msg(s, LOG_WARNING, "start-up: partial copy %s of %s is gone or not of its "
			      "size: its %zu ranges dropped", path, b->key, p->n);
		p->n = p->bytes = 0;
		return 0;
	}
	if (!file_proof_holds(&p->proof, &st))
		p->unproven = 1;
	/* covered whole but not made the copy yet (a restart came first) */
	p->adopt = p->bytes == b->size;
	if (p->unproven || p->adopt)
		part_enqueue_locked(s, b);
	part_publish_locked(s, b);
	return p->unproven ? 2 : 1;
}
