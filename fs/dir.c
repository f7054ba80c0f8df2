/* dir.c - directory listings, with no directory handles.
 *
 * OPENDIR is answered ENOSYS, so the kernel opens directories by itself:
 * it never sends OPENDIR or RELEASEDIR again, and keeps every listing it
 * reads (FOPEN_KEEP_CACHE | FOPEN_CACHE_DIR) until it sees the directory's
 * mtime change.  A warm tree walk then costs the kernel's own work and the
 * GETATTRs its listings cause, nothing more.
 *
 * With no handle, a listing is named by the offsets handed out: the high
 * 32 bits carry its id, the low ones the position.  A READDIR at offset 0
 * takes the directory's listing whole, from the NAS or, when it cannot
 * answer, the record, so positions are stable for that pass; the next
 * READDIRs find it by id in a small table, until the pass reaches its end
 * or the table wants the room.  One no longer there is taken again and
 * read on from the same position, as a listing that changed would be.
 *
 * A listing the NAS did not give (the record's names, while it is down)
 * must not stay in the kernel: each reply of one is followed by an
 * invalidation of the directory's pages.  The one after the end-of-listing
 * reply comes after every entry the kernel could have cached -- a reader
 * asks for the end only once it has taken in the reply before, and the
 * kernel adds nothing to a listing it holds whole -- so what it holds of
 * it is always dropped.
 *
 * NAS work and the kernel's run side by side where they can: the next
 * batch of a directory is classified while the kernel takes in this one,
 * and the next directory of a tree walk is listed while the walk reads
 * this one (both below). */
#include "clock.h"
#include "wfs.h"
#include "ops.h"
#include "path.h"
#include "nas.h"
#include "walkplan.h"
#include "thread.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

/* The entries of a READDIRPLUS reply, classified in one NAS call rather
 * than one each: those from @first that fit @size (a direntplus is a
 * fuse_entry_out and a fuse_dirent header, 152 bytes, and the name, to 8).
 * Entries found hidden leave room unused; the rest are looked up one by
 * one. */
struct plus_batch {
	size_t first, n;
	struct ns_batch b;
	int64_t taken_ns;    /* CLOCK_MONOTONIC: when its classification began */
};

/* A batch classified ahead serves the next request only this young: its
 * nodes are stamped with the reply's time (node.c's st_read), and a tick
 * of that clock is the slack node_attr_fresh() allows, so the attributes
 * answered are never older than attr_timeout.  A reader that paused longer
 * gets its entries classified afresh. */
#define AHEAD_MAX_AGE_NS (1000000000ull / NODE_TICKS_PER_S)

/* Was what was read at @ns (mono_ns) read within AHEAD_MAX_AGE_NS? */
static int young(int64_t ns)
{
	return (uint64_t)(mono_ns() - ns) <= AHEAD_MAX_AGE_NS;
}

struct listing {
	uint32_t id;         /* IMMUTABLE: the high half of its offsets */
	fuse_ino_t ino;      /* LISTS: the directory's (0 until claimed) */
	char rel[PATH_MAX];  /* IMMUTABLE */
	int unclaimed;       /* LISTS: made ahead for the walk, no pass has taken it */
	int64_t made_ns;     /* IMMUTABLE: CLOCK_MONOTONIC, when it was made */
	struct listing *next; /* LISTS: the table's, most recently used first */
	unsigned refs;       /* LISTS: requests using it, and the table's */
	/* LOCK lock: the kernel sends a pass's READDIRs one at a time, but on
	 * any worker thread (an order a race detector cannot see), and two
	 * passes may share a listing. */
	pthread_mutex_t lock;
	int listed;
	struct dir_entry *ents;
	size_t n;
	int from_record;     /* the NAS could not answer: the local record's names */
	/* LOCK lock: the batch the next READDIRPLUS will ask for, classified
	 * by the worker that sent this one while the kernel builds the
	 * dentries of its reply and the reader stats them; ahead_busy while
	 * that worker is at it (outside the lock), ahead_cond when it is
	 * done. */
	struct plus_batch ahead;
	int ahead_busy;
	pthread_cond_t ahead_cond;
};

/* Listings kept for passes under way: a tree walk has one or two; a pass
 * given up part way leaves its listing until it is pushed out. */
#define LISTINGS_KEPT 64

/* Offsets: the listing's id above, the position below: 1 is ".", 2 is "..",
 * 2 + i + 1 is entry i.  Ids stay below 2^31, so an offset is positive. */
#define OFF_ID(off) ((uint32_t)((uint64_t)(off) >> 32))
#define OFF_POS(off) ((uint64_t)(off) & 0xffffffffu)
#define OFF_MAKE(id, pos) ((off_t)(((uint64_t)(id) << 32) | (uint64_t)(pos)))
#define LISTING_ID_MAX 0x7fffffffu

static void plus_batch_free(struct plus_batch *b)
{
	ns_batch_free(&b->b);
	memset(b, 0, sizeof(*b));
}

static void listing_free(struct listing *l)
{
	dir_entries_free(l->ents, l->n);
	plus_batch_free(&l->ahead);
	pthread_cond_destroy(&l->ahead_cond);
	pthread_mutex_destroy(&l->lock);
	free(l);
}

int dir_lists_init(struct dir_lists *ls)
{
	memset(ls, 0, sizeof(*ls));
	pthread_mutex_init(&ls->lock, NULL);
	pthread_cond_init(&ls->tails_done, NULL);
	ls->plan = walk_plan_new();
	return ls->plan ? 0 : -ENOMEM;
}

void dir_lists_destroy(struct dir_lists *ls)
{
	struct listing *l, *next;

	for (l = ls->head; l; l = next) {
		next = l->next;
		listing_free(l);
	}
	walk_plan_free(ls->plan);
	pthread_cond_destroy(&ls->tails_done);
	pthread_mutex_destroy(&ls->lock);
}

/* Unlink and free the least recently used listing no request holds (under
 * ls->lock); none is freed while every one is in use. */
static void evict_locked(struct dir_lists *ls)
{
	struct listing **pp, **victim = NULL;

	for (pp = &ls->head; *pp; pp = &(*pp)->next)
		if ((*pp)->refs == 1)
			victim = pp;
	if (victim) {
		struct listing *l = *victim;

		*victim = l->next;
		ls->n--;
		listing_free(l);
	}
}

/* A new listing of @rel at the head of the table, with the table's
 * reference only (under ls->lock).  NULL: ENOMEM. */
static struct listing *listing_new_locked(struct dir_lists *ls, fuse_ino_t ino, const char *rel)
{
	struct listing *l = calloc(1, sizeof(*l));

	if (!l)
		return NULL;
	ls->last_id = ls->last_id % LISTING_ID_MAX + 1;
	l->id = ls->last_id;
	l->ino = ino;
	l->refs = 1; /* the table's */
	l->made_ns = mono_ns();
	pthread_mutex_init(&l->lock, NULL);
	pthread_cond_init(&l->ahead_cond, NULL);
	snprintf(l->rel, sizeof(l->rel), "%s", rel);
	if (++ls->n > LISTINGS_KEPT)
		evict_locked(ls); /* (before @l is in: never @l) */
	l->next = ls->head;
	ls->head = l;
	return l;
}

/* Let *@pp go if it was made ahead, no pass took it within a tick, and
 * nobody holds it (under ls->lock).  1: it is gone, and *@pp is the next
 * one. */
static int drop_stale_locked(struct dir_lists *ls, struct listing **pp)
{
	struct listing *l = *pp;

	if (!l->unclaimed || young(l->made_ns) || l->refs != 1)
		return 0;
	*pp = l->next;
	ls->n--;
	listing_free(l);
	return 1;
}

/* Is @l one a pass at offset 0 of @rel takes: made ahead for it, and
 * young enough (what it lists, and the attributes of its first batch, are
 * then as fresh as a listing taken now would be, to a tick)?  One too old
 * is let go by drop_stale_locked().  (under ls->lock) */
static int claimable_locked(const struct listing *l, const char *rel)
{
	return l->unclaimed && !strcmp(l->rel, rel) && young(l->made_ns);
}

/* The listing of @ino whose id @off carries, or at offset 0 one made ahead
 * for it (see prefetch_next), or a new one; with a reference.  NULL:
 * ENOMEM. */
static struct listing *listing_get(struct wfs *w, fuse_ino_t ino, struct node *dn, off_t off)
{
	struct dir_lists *ls = &w->lists;
	uint32_t id = off ? OFF_ID(off) : 0;
	struct listing **pp, *l = NULL;
	char rel[PATH_MAX];

	node_path(dn, rel, sizeof(rel));
	pthread_mutex_lock(&ls->lock);
	for (pp = &ls->head; *pp; pp = &(*pp)->next)
		if (id ? (*pp)->id == id && (*pp)->ino == ino && !strcmp((*pp)->rel, rel)
		       : claimable_locked(*pp, rel)) {
			l = *pp;
			*pp = l->next;
			l->next = ls->head;
			ls->head = l;
			if (l->unclaimed)
				atomic_fetch_add_explicit(&w->store.listed_ahead_taken, 1,
							  memory_order_relaxed);
			l->unclaimed = 0;
			l->ino = ino;
			break;
		}
	if (!l && !(l = listing_new_locked(ls, ino, rel))) {
		pthread_mutex_unlock(&ls->lock);
		return NULL;
	}
	l->refs++;
	pthread_mutex_unlock(&ls->lock);
	return l;
}

/* Drop a request's reference; @done: the pass is over (its end was sent,
 * or the listing failed), the table lets it go too. */
static void listing_put(struct wfs *w, struct listing *l, int done)
{
	struct dir_lists *ls = &w->lists;
	struct listing **pp;

	pthread_mutex_lock(&ls->lock);
	if (done)
		for (pp = &ls->head; *pp; pp = &(*pp)->next)
			if (*pp == l) {
				*pp = l->next;
				ls->n--;
				l->refs--;
				break;
			}
	if (--l->refs == 0)
		listing_free(l);
	pthread_mutex_unlock(&ls->lock);
}

/* The NAS cannot answer: a directory of a local revision lists what the
 * record holds; any other gets EIO. */
static int list_from_record(struct wfs *w, struct listing *d)
{
	char **names = NULL, rel[PATH_MAX];
	size_t n = 0;
	int r = record_list(&w->record, d->rel, &names, &n);

	if (r < 0)
		return r == -ENOENT ? -EIO : r;
	nas_gate_count_record(&w->gate);
	d->ents = calloc(n ? n : 1, sizeof(*d->ents));
	for (size_t i = 0; i < n; i++) {
		struct record_entry *re = d->ents ? malloc(sizeof(*re)) : NULL;

		if (re && path_join(d->rel, names[i], rel, sizeof(rel)) == 0 &&
		    record_lookup(&w->record, rel, re) == 0) {
			d->ents[d->n].name = names[i];
			d->ents[d->n].nas_ino = re->e.st.st_ino ?
						node_shown_ino(&w->nodes, &re->e.st) : 1;
			d->ents[d->n].type = re->e.st.st_mode & S_IFMT;
			d->n++;
			names[i] = NULL;
		}
		free(re);
		free(names[i]);
	}
	free(names);
	d->from_record = 1;
	return d->ents ? 0 : -ENOMEM;
}

/* The NAS directory @rel (below the hub): nas_list's entries, or
 * -ENAMETOOLONG when the NAS path would not fit in PATH_MAX. */
static int list_rel(struct wfs *w, const char *rel, struct dir_entry **ents, size_t *n)
{
	char path[PATH_MAX];
	int r = path_join(w->roots.path[0], rel, path, sizeof(path));

	return r < 0 ? r : nas_list(w, path, ents, n);
}

/* Take @d's whole listing (under d->lock), from the NAS or, when it cannot
 * answer, the record. */
static int dir_list(struct wfs *w, struct listing *d)
{
	int r;

	if (d->listed)
		return 0;
	r = list_rel(w, d->rel, &d->ents, &d->n);
	if (NAS_CANNOT_ANSWER(r))
		r = list_from_record(w, d);
	if (r < 0) {
		wfs_log(w, LOG_WARNING, "listing %s%s%s: %s", w->roots.path[0],
			*d->rel ? "/" : "", d->rel, strerror(-r));
		return r;
	}
	d->listed = 1;
	return 0;
}

void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
	fuse_reply_err(req, ENOSYS); /* see the top of this file */
}

#define DIRENTPLUS_LEN(namelen) (((size_t)152 + (namelen) + 7) & ~(size_t)7)

static void batch_classify(struct wfs *w, const struct listing *d, size_t first, size_t size,
			   struct plus_batch *b)
{
	const char **names;
	size_t n = 0, room = size;

	memset(b, 0, sizeof(*b));
	b->first = first;
	b->taken_ns = mono_ns();
	while (first + n < d->n && DIRENTPLUS_LEN(strlen(d->ents[first + n].name)) <= room)
		room -= DIRENTPLUS_LEN(strlen(d->ents[first + n++].name));
	if (n < 2 || !(names = calloc(n, sizeof(*names))))
		return; /* one by one */
	for (size_t k = 0; k < n; k++)
		names[k] = d->ents[first + k].name;
	if (nas_classify_batch(w, d->rel, names, n, &b->b) == 0)
		b->n = n;
	free(names);
}

/* (a worker that just replied to a READDIRPLUS of @d, holding a reference;
 * d->ahead_busy keeps other requests of the pass waiting meanwhile) */
static void classify_ahead(struct wfs *w, struct listing *d, size_t first, size_t size)
{
	struct plus_batch b;

	batch_classify(w, d, first, size, &b);
	pthread_mutex_lock(&d->lock);
	plus_batch_free(&d->ahead);
	d->ahead = b;
	d->ahead_busy = 0;
	pthread_cond_broadcast(&d->ahead_cond);
	pthread_mutex_unlock(&d->lock);
}

/* ---- listings made ahead of a walk ----
 *
 * The first READDIRPLUS of a directory waits for all the NAS work of its
 * first batch (the listing, a stat of each entry), and the batch classified
 * ahead (above) cannot help it: that overlaps the NAS work and the kernel's
 * (dentries, inodes, the reader's stats) only within a directory, and most
 * directories of a hub are one batch.  So when a reply reaches the end of
 * a directory, its worker lists the directory the walk will most likely
 * read next (core/walkplan.h), if fewer than WALK_AHEAD are being listed,
 * and classifies its first batch, into a listing that the pass at its
 * offset 0 takes if it comes within a tick (else it is let go).  Only in
 * a walk whose order the plan has seen: a plain `ls` makes none. */

/* Listings made ahead at once.  Two keep a walk waiting on the NAS less
 * than one (cold walk on the bench's tree, by hand: 0.168 -> 0.147 s on
 * the VM disk, 0.152 -> 0.139 s on the memory rig); three, no less than
 * two, and a guess past the next directory is more often wrong. */
#define WALK_AHEAD 2

/* A pass at offset 0 of @d began: the plan learns of it and of @d's
 * subdirectories.  (@d is listed: its entries no longer change.) */
static void plan_begin(struct wfs *w, const struct listing *d)
{
	const char **subs = calloc(d->n ? d->n : 1, sizeof(*subs));
	size_t k = 0;

	if (!subs)
		return;
	for (size_t i = 0; i < d->n; i++)
		if (S_ISDIR(d->ents[i].type))
			subs[k++] = d->ents[i].name;
	pthread_mutex_lock(&w->lists.lock);
	walk_plan_begin(w->lists.plan, d->rel, subs, k);
	pthread_mutex_unlock(&w->lists.lock);
	free(subs);
}

/* (a worker that just replied with the end of a directory; @size: that
 * request's, which the next pass's will be) */
static void prefetch_next(struct wfs *w, size_t size)
{
	struct dir_lists *ls = &w->lists;
	struct dir_entry *ents = NULL;
	char rel[PATH_MAX];
	struct plus_batch b = { 0 };
	struct listing *l = NULL;
	size_t n = 0;
	int r;

	pthread_mutex_lock(&ls->lock);
	for (struct listing **pp = &ls->head; *pp;) /* guesses that went unused */
		if (!drop_stale_locked(ls, pp))
			pp = &(*pp)->next;
	if (ls->prefetching < WALK_AHEAD && walk_plan_next(ls->plan, rel, sizeof(rel)) == 0 &&
	    (l = listing_new_locked(ls, 0, rel))) {
		l->unclaimed = 1;
		l->ahead_busy = 1; /* a pass that takes it meanwhile waits */
		l->refs++;
		ls->prefetching++;
	}
	pthread_mutex_unlock(&ls->lock);
	if (!l)
		return;
	r = list_rel(w, rel, &ents, &n);
	if (r == 0) {
		l->ents = ents;
		l->n = n;
		batch_classify(w, l, 0, size, &b);
		atomic_fetch_add_explicit(&w->store.listed_ahead, 1, memory_order_relaxed);
	}
	wfs_log(w, LOG_DEBUG, "listed ahead %s: %s, %zu entries, %zu classified", rel,
		r < 0 ? strerror(-r) : "ok", n, b.n);
	pthread_mutex_lock(&l->lock);
	l->listed = r == 0; /* else the pass lists it (or the record) */
	l->ahead = b;
	l->ahead_busy = 0;
	pthread_cond_broadcast(&l->ahead_cond);
	pthread_mutex_unlock(&l->lock);
	pthread_mutex_lock(&ls->lock);
	ls->prefetching--;
	pthread_mutex_unlock(&ls->lock);
	listing_put(w, l, 0);
}

/* The batch of classified entries a READDIRPLUS at @pos uses: the one made
 * ahead for it when it is still young, else one made now. */
static void take_batch(struct wfs *w, struct listing *d, size_t pos, size_t size,
		       struct plus_batch *batch)
{
	size_t first = pos > 2 ? pos - 2 : 0;

	if (d->ahead.n && d->ahead.first == first && young(d->ahead.taken_ns)) {
		*batch = d->ahead;
		memset(&d->ahead, 0, sizeof(d->ahead));
	} else {
		plus_batch_free(&d->ahead);
		batch_classify(w, d, first, size, batch);
	}
}

/* Entry @i of a pass over @d (0 and 1 are "." and ".."): its name, and what
 * the reply says of it in @e (READDIRPLUS: a lookup the kernel will hold,
 * e->ino set) and @st.  Returns 0, or -errno: see name_left_out(). */
static int entry_at(struct wfs *w, struct listing *d, struct node *dn, size_t i, int plus,
		    struct plus_batch *batch, struct ns_entry *ent, const char **name,
		    struct fuse_entry_param *e, struct stat *st)
{
	const struct dir_entry *de;
	char rel[PATH_MAX];
	size_t k;
	int r;

	memset(e, 0, sizeof(*e));
	memset(st, 0, sizeof(*st));
	if (i < 2) {
		*name = i == 0 ? "." : "..";
		st->st_mode = S_IFDIR;
		/* ".." is not ours to know */
		st->st_ino = i == 0 ? node_serial(&w->nodes, dn) : 1;
		e->attr = *st;
		return 0;
	}
	de = &d->ents[i - 2];
	*name = de->name;
	st->st_ino = de->nas_ino; /* glibc hides entries whose d_ino is 0 */
	if (path_join(d->rel, de->name, rel, sizeof(rel)) < 0)
		return -ENAMETOOLONG;
	if (!plus && (S_ISDIR(de->type) || S_ISREG(de->type) || d->from_record)) {
		st->st_mode = de->type;
		return 0;
	}
	if (!plus) {
		if ((r = nas_classify(w, rel, ent)) < 0)
			return r;
		st->st_mode = ent->st.st_mode & S_IFMT;
		st->st_ino = node_shown_ino(&w->nodes, &ent->st);
		return 0;
	}
	k = i - 2 - batch->first; /* before the batch: wraps, and is looked up */
	if (k < batch->n) {
		r = ns_batch_get(&batch->b, k, ent);
		r = lookup_classified(w, dn, de->name, rel, r, ent, e);
	} else {
		r = do_lookup(w, dn, de->name, e);
	}
	if (r == 0)
		*st = e->attr;
	return r;
}

/* Is entry_at's error @r one of the name alone -- hidden, vanished since
 * the listing, not ours to read -- so that the name is left out, as a walk
 * leaves it (ns.h, NS_WALK_STRICT)?  Any other (the NAS failing part way
 * through a pass, a name of it not in the record) ends the reply there: a
 * reply cut short, or an empty one, would read as the directory's end, and
 * a reader (an engine globbing shards) would take a short listing for a
 * whole one. */
static int name_left_out(int r)
{
	return r == -ENOENT || r == -EACCES || r == -EPERM || r == -ELOOP || r == -ENAMETOOLONG;
}

/* ---- what a READDIRPLUS does after replying ----
 *
 * Classifying the next batch ahead, listing the walk's next directory:
 * on a /dev/fuse worker, the next request meanwhile goes to another
 * worker.  A ring thread (fs/uring.h) takes no request until its handler
 * returns, and the kernel gives the next request to the entry committed
 * last -- its own -- so there the tail runs on a thread of its own, at most
 * REPLY_TAILS at once (past that, inline as on a worker).  Over rings the
 * cold walk went 1.82x -> 1.39x of direct (bench compare, README). */
#define REPLY_TAILS 4

struct reply_tail {
	struct wfs *w;
	struct listing *d; /* the reply's listing, its reference handed over */
	size_t first, size;
	int ahead, walked, note, end;
};

static void run_tail(const struct reply_tail *t)
{
	if (t->ahead)
		classify_ahead(t->w, t->d, t->first, t->size);
	else if (t->walked)
		prefetch_next(t->w, t->size);
	if (t->note)
		dir_attrs_note(&t->w->dirattr, t->d->rel);
	listing_put(t->w, t->d, t->end);
}

static void tail_ended(struct dir_lists *ls)
{
	pthread_mutex_lock(&ls->lock);
	if (--ls->tails == 0)
		pthread_cond_broadcast(&ls->tails_done);
	pthread_mutex_unlock(&ls->lock);
}

static void *tail_thread(void *arg)
{
	struct reply_tail *t = arg;
	struct dir_lists *ls = &t->w->lists;

	pthread_setname_np(pthread_self(), "wfs-dirtail");
	run_tail(t);
	free(t);
	tail_ended(ls);
	return NULL;
}

static void tail_after_reply(const struct reply_tail *t)
{
	struct dir_lists *ls = &t->w->lists;
	struct reply_tail *own;
	pthread_t th;
	int go;

	if ((t->ahead || t->walked) && uring_here() && (own = malloc(sizeof(*own)))) {
		*own = *t;
		pthread_mutex_lock(&ls->lock);
		go = ls->tails < REPLY_TAILS;
		ls->tails += go;
		pthread_mutex_unlock(&ls->lock);
		if (go && thread_start(&th, NULL, tail_thread, own) == 0) {
			pthread_detach(th);
			return;
		}
		if (go)
			tail_ended(ls);
		free(own);
	}
	run_tail(t);
}

void dir_tails_wait(struct dir_lists *ls)
{
	pthread_mutex_lock(&ls->lock);
	while (ls->tails)
		pthread_cond_wait(&ls->tails_done, &ls->lock);
	pthread_mutex_unlock(&ls->lock);
}

static void do_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, int plus)
{
	struct wfs *w = W(req);
	struct node *dn = N(w, ino);
	struct listing *d = listing_get(w, ino, dn, off);
	char *buf = calloc(1, size);
	struct ns_entry *ent = malloc(sizeof(*ent));
	size_t used = 0, pos = OFF_POS(off);
	struct plus_batch batch = { 0 };
	int r = d && buf && ent ? 0 : -ENOMEM, uncache, ahead, walked, err = 0;
	size_t i;

	if (r < 0) {
		if (d)
			listing_put(w, d, 0);
		free(buf);
		free(ent);
		fuse_reply_err(req, ENOMEM);
		return;
	}
	pthread_mutex_lock(&d->lock);
	while (d->ahead_busy)
		pthread_cond_wait(&d->ahead_cond, &d->lock);
	r = dir_list(w, d);
	if (r < 0) {
		pthread_mutex_unlock(&d->lock);
		listing_put(w, d, 1); /* the next try lists afresh */
		free(buf);
		free(ent);
		fuse_reply_err(req, -r);
		return;
	}
	if (plus && !d->from_record)
		take_batch(w, d, pos, size, &batch);
	for (i = pos; i < d->n + 2; i++) {
		struct fuse_entry_param e;
		struct stat st;
		const char *name;
		size_t sz;

		r = entry_at(w, d, dn, i, plus, &batch, ent, &name, &e, &st);
		if (r < 0 && name_left_out(r))
			continue;
		if (r < 0) {
			err = NAS_CANNOT_ANSWER(r) ? -EIO : r;
			break;
		}
		if (plus)
			sz = fuse_add_direntry_plus(req, buf + used, size - used, name, &e,
						    OFF_MAKE(d->id, i + 1));
		else
			sz = fuse_add_direntry(req, buf + used, size - used, name, &st,
					       OFF_MAKE(d->id, i + 1));
		if (sz > size - used) {
			if (plus && i >= 2)
				node_forget(&w->nodes, N(w, e.ino), 1); /* not sent: undo the lookup */
			break;
		}
		used += sz;
	}
	wfs_log(w, LOG_DEBUG, "readdir%s %s pos %zu size %zu: %zu bytes%s", plus ? "plus" : "",
		d->rel, pos, size, used, d->from_record ? " (record)" : "");
	if (err < 0)
		wfs_log(w, LOG_WARNING, "listing %s stops at %s: %s%s", d->rel, d->ents[i - 2].name,
			strerror(-err), used ? " (after the entries before it)" : "");
	/* The record's names: the kernel must not keep them (see the top). */
	uncache = d->from_record;
	if (uncache)
		__atomic_store_n(&dn->record_listed, 1, __ATOMIC_RELEASE);
	/* Entry i - 2 is the first the next request asks for.  Classified
	 * once this reply is sent, a tree walk's NAS work and the kernel's
	 * (dentries, inodes, the reader's stats) run side by side, on two
	 * cores, instead of in turn. */
	ahead = !err && plus && !d->from_record && used && i >= 2 && i - 2 < d->n;
	d->ahead_busy = ahead;
	walked = plus && !d->from_record;
	pthread_mutex_unlock(&d->lock);
	if (err < 0 && !used)
		fuse_reply_err(req, -err);
	else
		fuse_reply_buf(req, buf, used);
	if (uncache)
		inval_push(&w->inval, ino);
	free(buf);
	free(ent);
	plus_batch_free(&batch);
	if (walked && off == 0)
		plan_begin(w, d);
	if (err < 0) {
		/* Not the end: the listing stays, so that the kernel's next
		 * request at this position meets the same entries (taken
		 * again from the record, they would be others). */
		listing_put(w, d, 0);
		return;
	}
	tail_after_reply(&(struct reply_tail){ .w = w, .d = d, .first = i - 2, .size = size,
		.ahead = ahead, .walked = walked, .note = !used && !uncache,
		.end = used == 0 /* nothing sent: the end of the pass */ });
}

void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		struct fuse_file_info *fi)
{
	(void)fi;
	do_readdir(req, ino, size, off, 0);
}

void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	(void)fi;
	do_readdir(req, ino, size, off, 1);
}
