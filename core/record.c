/* record.c - the store's record of its local revisions; see record.h.
 *
 * The table and its readers are in record_table.c, record.json in
 * record_file.c; here the build and the thread that runs it.
 *
 * The build: which repos (store_each: the LOCAL blobs' keys and names),
 * their walk (ns_walk: every entry of the repo, one at a time), what is
 * kept (record.h), then the root's attributes and the parents of what was
 * kept.  Links are decided after the walk: a snapshot may be listed before
 * the blobs/ its links lead to.  record.json (record_file.c) is written
 * only when the content changed: the thread builds every time the set of
 * local blobs changes, and most builds find what the last one did.
 */
#include "record_int.h"
#include "clock.h"
#include "path.h"
#include "stopby.h"
#include "thread.h"
#include "trim.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

/* A build that failed waits this long before the thread tries again on its
 * own (doubling from 1 s); record_sync asks at once. */
#define RECORD_RETRY_MAX_MS 60000

/* ---- which repos, and the signature of the local blobs ---- */

struct scan {
	const char *root;   /* NAS_HUB */
	int collect;        /* gather the repos to walk; 0: the signature only */
	const struct hub_roots *roots; /* with @collect: note the roots in use */
	unsigned roots_used; /* bit i: a local blob's source lies in roots->path[i] */
	char **repos;
	size_t n, cap;
	int err;
	uint64_t sum, mix, count;
};

static void add_repo(struct scan *sc, const char *rel)
{
	size_t n = rel ? hub_repo_len(rel) : 0;

	if (!n || sc->err)
		return;
	for (size_t i = sc->n; i-- > 0;)
		if (strlen(sc->repos[i]) == n && !strncmp(sc->repos[i], rel, n))
			return;
	if (sc->n == sc->cap) {
		size_t cap = sc->cap ? 2 * sc->cap : 8;
		char **v = realloc(sc->repos, cap * sizeof(*v));

		if (!v) {
			sc->err = -ENOMEM;
			return;
		}
		sc->repos = v;
		sc->cap = cap;
	}
	if (!(sc->repos[sc->n] = strndup(rel, n)))
		sc->err = -ENOMEM;
	else
		sc->n++;
}

/* The hash of the repo folder @rel (may be NULL) is in; 0 when none. */
static uint64_t repo_hash(const char *rel)
{
	size_t n = rel ? hub_repo_len(rel) : 0;

	return n ? XXH3_64bits(rel, n) : 0;
}

/* store_each's callback, under store.lock: no call to the store. */
static void scan_blob(void *arg, const struct blob_info *b)
{
	struct scan *sc = arg;
	const char *rel = sc->root ? path_under(sc->root, b->key) : NULL;
	uint64_t h, named;

	if (b->state != BLOB_LOCAL && !b->part_bytes)
		return;
	/* What a build depends on: the key, and a repo the name the blob was
	 * opened by leads the walk to beyond the key's own -- not the name.
	 * The first open of a local copy sets a name, in the key's repo as a
	 * rule: that changes no walk and must not start one, a NAS walk of
	 * the repo for reading bytes that are local.  Order-free: the table's
	 * order is not the blobs'. */
	named = repo_hash(b->name);
	h = path_hash(b->key) ^ (named != repo_hash(rel) ? named * 31 : 0);
	sc->sum += h;
	sc->mix ^= h * 0x9e3779b97f4a7c15ull;
	sc->count++;
	if (sc->collect) {
		const char *rest;
		int i = sc->roots ? hub_root_of(sc->roots, b->key, &rest) : -1;

		add_repo(sc, rel);
		add_repo(sc, b->name);
		if (i > 0)
			sc->roots_used |= 1u << i;
	}
}

static uint64_t scan_sig(const struct scan *sc)
{
	return sc->sum ^ (sc->mix << 1 | sc->mix >> 63) ^ sc->count * 0xff51afd7ed558ccdull;
}

static void scan_free(struct scan *sc)
{
	for (size_t i = 0; i < sc->n; i++)
		free(sc->repos[i]);
	free(sc->repos);
}

/* ---- the build ---- */

struct build {
	struct record *r;
	const struct hub_roots *roots;
	struct store *s;
	struct htab h;       /* every node of the walk, by path */
	struct rnodes all;
	size_t big_refs;     /* refs over RECORD_MAX_DATA (logged once a build) */
	size_t tree_bytes;   /* of the file lists kept (RECORD_MAX_TREES_TOTAL) */
	struct revs partial; /* revisions with a file not wholly local (record_refs.c) */
	char **big;          /* a log line for each file list left out, each ref held */
	size_t nbig, capbig;
};

static int stopping(struct record *r)
{
	int stop;

	pthread_mutex_lock(&r->lock);
	stop = r->stop;
	pthread_mutex_unlock(&r->lock);
	return stop;
}

/* 2: a wholly local copy; 1: local ranges only; 0: neither. */
static int is_local(struct store *s, const char *key)
{
	struct blob *b = key[0] ? store_find(s, key) : NULL;

	return !b ? 0 : blob_state(b) == BLOB_LOCAL ? 2 : !!atomic_load(&b->part_bytes);
}

static struct rnode *node_of(const char *rel, const struct ns_entry *e)
{
	struct rnode *n = calloc(1, sizeof(*n));

	if (!n)
		return NULL;
	n->kind = e->kind;
	n->link_state = e->link_state;
	n->st = e->st;
	n->path = strdup(rel);
	n->backing = e->backing[0] ? strdup(e->backing) : NULL;
	n->target = e->kind == NS_LINK ? strdup(e->target) : NULL;
	n->blob_id = e->blob_id[0] ? strdup(e->blob_id) : NULL;
	if (!n->path || (e->backing[0] && !n->backing) || (e->kind == NS_LINK && !n->target) ||
	    (e->blob_id[0] && !n->blob_id)) {
		rnode_free(n);
		return NULL;
	}
	return n;
}

/* A line for the log (rebuild says each line once, say_big). */
static int note_line(void *arg, const char *line)
{
	struct build *b = arg;

	if (b->nbig == b->capbig) {
		size_t cap = b->capbig ? 2 * b->capbig : 4;
		char **v = realloc(b->big, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		b->big = v;
		b->capbig = cap;
	}
	if (!(b->big[b->nbig] = strdup(line)))
		return -ENOMEM;
	b->nbig++;
	return 0;
}

/* A file list left out, for the log. */
static int note_big(struct build *b, const struct rnode *n, const char *why)
{
	char line[2 * PATH_MAX + 200];

	snprintf(line, sizeof(line), "record: %s/%s not kept (%s): while the NAS is down it "
		 "answers EIO", b->roots->path[0], n->path, why);
	return note_line(b, line);
}

static int take(void *arg, const char *rel, const struct ns_entry *e);

/* Each of @norm's prefixes not taken yet, classified and taken (@t:
 * scratch): 0 or -errno (a name not there: 0). */
static int take_prefixes(struct build *b, char *norm, struct ns_entry *t)
{
	int r = 0;

	for (char *p = norm; !r && p; ) {
		p = strchr(p + 1, '/');
		if (p)
			*p = '\0';
		if (!rnode_find(&b->h, norm) && (r = ns_classify(b->roots, norm, t)) == 0) {
			r = take(b, norm, t);
			if (p && t->kind == NS_LINK)
				break; /* (what lies through it is the ways' own) */
		}
		if (p)
			*p = '/';
	}
	return r == -ENOENT ? 0 : r;
}

/* A link to a local blob whose file lies outside the repos walked: a repo
 * blob shown as a link because its way crosses a directory some class
 * cannot search (ns.c present_closed), into a hub-level store.  The
 * reader's kernel follows it through the mount, so the file and each
 * directory above it are kept too, classified one by one. */
static int take_link_target(struct build *b, const char *rel, const struct ns_entry *e)
{
	char dir[PATH_MAX], joined[PATH_MAX], norm[PATH_MAX];
	const char *phys;
	struct ns_entry *t;
	int r;

	path_dirname(rel, dir, sizeof(dir));
	if (path_join(dir, e->target, joined, sizeof(joined)) < 0 ||
	    path_normalize(joined, norm, sizeof(norm)) < 0 || hub_repo_len(norm) || !norm[0] ||
	    (!strncmp(norm, "..", 2) && (norm[2] == '/' || !norm[2])) ||
	    !is_local(b->s, e->backing) || !(t = malloc(sizeof(*t))))
		return 0; /* (in a repo: that repo's walk has it) */
	r = take_prefixes(b, norm, t);
	/* and the file where the chain ends, with its directories: the first
	 * hop's way may pass a link to a directory (.dl -> .closed), which
	 * the names above do not hold */
	if (!r && (phys = path_under(b->roots->path[0], e->backing)) && *phys &&
	    !hub_repo_len(phys)) {
		snprintf(norm, sizeof(norm), "%s", phys);
		r = take_prefixes(b, norm, t);
	}
	free(t);
	return r;
}

/* ns_walk's callback: every directory, link and .no_exist marker (decided
 * after the walk), the FILE entries that are local blobs or refs. */
static int take(void *arg, const char *rel, const struct ns_entry *e)
{
	struct build *b = arg;
	struct rnode *n;
	char rev[PATH_MAX];
	int ref = e->kind == NS_FILE && record_is_ref(rel), r = 0;
	int local = e->kind == NS_FILE ? is_local(b->s, e->backing) : 0;
	enum side side = SIDE_NONE;

	if (stopping(b->r))
		return -ECANCELED; /* record_close: the walk is dropped */
	if (e->kind == NS_FILE && !ref && !local &&
	    !(side = record_side_of(rel, rev, sizeof(rev))))
		return revs_note(&b->partial, rel, b->s->opt.policy); /* not all local */
	if (!(n = node_of(rel, e)))
		return -ENOMEM;
	n->keep = e->kind == NS_FILE && !side;
	n->full = local == 2;
	if (ref && (r = record_read_bytes(b->roots, n, RECORD_MAX_DATA)) == 2) {
		b->big_refs++;
		r = 0; /* too large: shown, never served cut short */
	}
	if (r) {
		rnode_free(n);
		return r > 0 ? 0 : r;
	}
	if (rnodes_push(&b->all, n) < 0)
		return -ENOMEM;
	htab_add(&b->h, &n->hl, path_hash(n->path));
	/* (the store is asked only for a link that leads out of the repos:
	 * every snapshot entry is a link) */
	if (e->kind == NS_LINK && e->link_state == NS_LINK_RESOLVED && e->backing[0])
		return take_link_target(b, rel, e);
	return 0;
}

static void keep_parents(struct build *b, const struct rnode *n)
{
	char p[PATH_MAX], parent[PATH_MAX];
	struct rnode *d;

	snprintf(p, sizeof(p), "%s", n->path);
	while (p[0]) {
		path_dirname(p, parent, sizeof(parent));
		d = rnode_find(&b->h, parent);
		if (!d || d->keep)
			return; /* the root comes later; a kept one has its parents */
		d->keep = 1;
		snprintf(p, sizeof(p), "%s", parent);
	}
}

/* A .no_exist marker and the file list of a kept revision are kept, with
 * their bytes: offline loading (huggingface_hub's try_to_load_from_cache)
 * asks a marker before the snapshot, and a name it cannot see there is one
 * to download; recent clients read trees/<rev>.json to tell a complete
 * snapshot from an incomplete one.  A marker over RECORD_MAX_DATA is kept
 * without its bytes, as a refs file; a file list over RECORD_MAX_TREE, or
 * past the build's RECORD_MAX_TREES_TOTAL, is left out (noted: logged
 * once), never served cut short.  0, or -errno of the NAS. */
static int keep_side(struct build *b, struct rnode *n)
{
	char rev[PATH_MAX], why[160];
	enum side k;
	struct rnode *d;
	int r;

	if (n->kind != NS_FILE || n->keep || !(k = record_side_of(n->path, rev, sizeof(rev))))
		return 0;
	d = rnode_find(&b->h, rev);
	if (!d || d->kind != NS_DIR || !d->keep)
		return 0;
	r = record_read_bytes(b->roots, n, record_side_max(k));
	if (r == 2 && k == SIDE_TREE) {
		snprintf(why, sizeof(why), "a file list over %zu bytes", (size_t)RECORD_MAX_TREE);
		return note_big(b, n, why);
	}
	if (r == 2)
		b->big_refs++;
	else if (r)
		return r > 0 ? 0 : r;
	if (k == SIDE_TREE && b->tree_bytes + n->data_len > RECORD_MAX_TREES_TOTAL) {
		snprintf(why, sizeof(why), "the record's file lists would pass %zu bytes",
			 (size_t)RECORD_MAX_TREES_TOTAL);
		return note_big(b, n, why);
	}
	b->tree_bytes += k == SIDE_TREE ? n->data_len : 0;
	n->keep = 1;
	keep_parents(b, n);
	return 0;
}

/* After the walks: links, parents, markers, the root; the kept nodes into a
 * table. */
static int settle(struct build *b, struct record_table **out)
{
	struct rnodes kept = { 0 };
	struct ns_entry *root = NULL;
	size_t dropped;
	int e = 0, more = 1;

	for (size_t i = 0; i < b->all.n; i++)
		record_keep_link(&b->h, b->all.v[i], 0);
	for (size_t i = 0; i < b->all.n; i++)
		if (b->all.v[i]->keep)
			keep_parents(b, b->all.v[i]);
	/* A directory is kept once something under it is: links to
	 * directories after the parents, until no more is kept (a link may
	 * be all a directory holds). */
	while (more) {
		more = 0;
		for (size_t i = 0; i < b->all.n; i++)
			if (record_keep_link(&b->h, b->all.v[i], 1)) {
				keep_parents(b, b->all.v[i]);
				more = 1;
			}
	}
	for (size_t i = 0; !e && i < b->all.n; i++)
		e = keep_side(b, b->all.v[i]);
	if (!e)
		e = record_hold_refs(b->r, &b->h, &b->all, &b->partial, b->s->opt.policy,
				     note_line, b);
	for (size_t i = 0; !e && i < b->all.n; i++) {
		struct rnode *n = b->all.v[i];

		b->all.v[i] = NULL;
		if (n->keep)
			e = rnodes_push(&kept, n);
		else
			rnode_free(n);
	}
	if (!e && kept.n && !(root = malloc(sizeof(*root))))
		e = -ENOMEM;
	if (!e && root && !(e = ns_classify(b->roots, "", root))) {
		struct rnode *n = node_of("", root);

		e = n ? rnodes_push(&kept, n) : -ENOMEM;
	}
	free(root);
	if (!e && !(*out = record_table_make(&kept, &dropped)))
		e = -ENOMEM;
	rnodes_free(&kept);
	return e;
}

/* Write record.json for @t if its content is not what the file holds. */
static int write_file(struct record *r, const struct record_table *t, const char *nas,
		      int64_t now)
{
	uint64_t sig;
	int e;

	if (r->readonly || r->newer)
		return 0;
	e = record_sig(t, nas, &sig);
	if (e < 0)
		return e;
	if (r->file_known && sig == r->file_sig)
		return 0;
	e = record_write(r->path, t, nas, now);
	if (e < 0 && -e != r->write_err)
		record_log(r, LOG_ERR, "cannot write record %s: %s (the last one written stays)",
			   r->path, strerror(-e));
	r->write_err = e < 0 ? -e : 0;
	if (!e) {
		r->file_sig = sig;
		r->file_known = 1;
	}
	return e;
}

static void publish(struct record *r, struct record_table *t, const char *nas, int64_t now)
{
	struct record_table *old;

	pthread_mutex_lock(&r->lock);
	old = r->table;
	r->table = t;
	snprintf(r->nas, sizeof(r->nas), "%s", t->n ? nas : "");
	r->files = t->files;
	r->entries = t->n;
	r->built_at = now;
	pthread_mutex_unlock(&r->lock);
	record_table_free(old);
}

/* The walks of @sc's repos into @b.  0 or -errno (logged with the repo). */
static int walk_repos(struct build *b, struct scan *sc)
{
	for (size_t i = 0; i < sc->n; i++) {
		int e = ns_walk(b->roots, sc->repos[i], NS_WALK_STRICT, take, b);

		/* The repo went away: nothing of it to show -- unless everything
		 * did (the NAS not mounted: its empty mount point seen), when
		 * the record keeps what it holds. */
		if (e == -ENOENT && (e = nas_missing_or_gone(b->roots->path[0], 1, e)) == -ENOENT)
			continue;
		if (e < 0 && e != -ECANCELED && e != -ENOMEM)
			nas_gate_note(b->r->gate, e);
		/* The strict walk stops at an entry it cannot read; an outage
		 * the gate saw meanwhile (EIO, say, that a probe confirmed)
		 * makes the build suspect too: never publish a record with
		 * holes for a whole one. */
		if (e == 0 && !nas_gate_up(b->r->gate))
			e = -EHOSTDOWN;
		if (e == 0)
			continue;
		if (e != -ECANCELED && -e != b->r->walk_err)
			record_log(b->r, LOG_WARNING, "record: walking %s/%s failed: %s; the record "
				   "keeps its last build", b->roots->path[0], sc->repos[i],
				   strerror(-e));
		b->r->walk_err = e == -ECANCELED ? b->r->walk_err : -e;
		return e;
	}
	return 0;
}

/* Is each further root (-o root=DIR) that holds a local copy's source
 * mounted?  One that is not (empty or missing: its mount point seen) makes
 * every link into it dangle: a build now would drop those copies' names,
 * and the mount, its NAS answering, would show them dangling.  -ENOLINK
 * then (said once until a build passes), and the record keeps its last
 * build; the next try comes with the back-off. */
static int roots_there(struct build *b, const struct scan *sc)
{
	for (int i = 1; i < b->roots->n; i++) {
		if (!(sc->roots_used & 1u << i) || nas_root_gone(b->roots->path[i]) != 1)
			continue;
		if (b->r->walk_err != ENOLINK)
			record_log(b->r, LOG_WARNING, "record: %s: %s; the record keeps its last "
				   "build", b->roots->path[i], NAS_ROOT_GONE_WHY);
		b->r->walk_err = ENOLINK;
		return -ENOLINK;
	}
	return 0;
}

static int by_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void free_strs(char **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

/* Log the lines of this build (file lists left out, refs held) that the
 * last one did not say: once each, not at every build (the thread builds
 * whenever a copy lands).  This build's are kept for the next. */
static void say_big(struct record *r, struct build *b)
{
	if (b->nbig)
		qsort(b->big, b->nbig, sizeof(*b->big), by_str);
	for (size_t i = 0; i < b->nbig; i++)
		if (!r->nbig_trees ||
		    !bsearch(&b->big[i], r->big_trees, r->nbig_trees, sizeof(*b->big), by_str))
			record_log(r, LOG_WARNING, "%s", b->big[i]);
	free_strs(r->big_trees, r->nbig_trees);
	r->big_trees = b->big;
	r->nbig_trees = b->nbig;
	b->big = NULL;
	b->nbig = b->capbig = 0;
}

static int rebuild(struct record *r, const struct hub_roots *roots, struct store *s)
{
	struct scan sc = { .root = roots->path[0], .collect = 1, .roots = roots };
	struct build b = { .r = r, .roots = roots, .s = s };
	struct record_table *t = NULL;
	int64_t now = (int64_t)time(NULL);
	int e;

	if (!nas_gate_up(r->gate))
		return -EHOSTDOWN; /* never walk a NAS known down: it would hang */
	store_each(s, scan_blob, &sc);
	e = sc.err ? sc.err : roots_there(&b, &sc);
	if (!e)
		e = htab_init(&b.h, 256);
	if (!e)
		e = walk_repos(&b, &sc);
	if (!e && (e = settle(&b, &t)) < 0 && e != -ECANCELED && e != -ENOMEM) {
		nas_gate_note(r->gate, e); /* as the walk's: the NAS gone, say */
		if (-e != r->walk_err)
			record_log(r, LOG_WARNING, "record: reading refs and markers of %s failed: "
				   "%s; the record keeps its last build", roots->path[0],
				   strerror(-e));
		r->walk_err = -e;
	}
	if (!e && b.big_refs)
		record_log(r, LOG_NOTICE, "record: %zu refs files over %d bytes are shown without "
			   "their bytes (not readable while the NAS is down)", b.big_refs,
			   RECORD_MAX_DATA);
	if (!e)
		say_big(r, &b);
	free_strs(b.big, b.nbig);
	revs_free(&b.partial);
	rnodes_free(&b.all);
	htab_free(&b.h);
	scan_free(&sc);
	if (e)
		return e;
	if (r->walk_err)
		record_log(r, LOG_INFO, "record: built again from %s", roots->path[0]);
	r->walk_err = 0;
	/* A build left behind by the daemon's stop (record_stop_by) writes
	 * nothing: the stop holds file_lock from then on. */
	pthread_mutex_lock(&r->file_lock);
	if (stopping(r)) {
		pthread_mutex_unlock(&r->file_lock);
		record_table_free(t);
		return -ECANCELED;
	}
	e = write_file(r, t, roots->path[0], now);
	pthread_mutex_unlock(&r->file_lock);
	record_log(r, LOG_DEBUG, "record: built from %s: %llu files, %zu entries",
		   roots->path[0], (unsigned long long)t->files, t->n);
	publish(r, t, roots->path[0], now);
	return e;
}

int record_rebuild(struct record *r, const struct hub_roots *roots, struct store *s)
{
	int e;

	pthread_mutex_lock(&r->build_lock);
	e = rebuild(r, roots, s);
	pthread_mutex_unlock(&r->build_lock);
	return e;
}

/* ---- life cycle and the thread ---- */

int record_open(struct record *r, const char *store_dir, int readonly,
		void (*log)(void *arg, int prio, const char *msg), void *log_arg)
{
	pthread_condattr_t mono;
	int64_t built;
	int e;

	memset(r, 0, sizeof(*r));
	if (snprintf(r->path, sizeof(r->path), "%s/%s", store_dir, RECORD_FILE) >=
	    (int)sizeof(r->path))
		return -ENAMETOOLONG;
	r->readonly = readonly;
	r->log = log;
	r->log_arg = log_arg;
	e = record_load(r, &r->table, r->nas, sizeof(r->nas), &built);
	if (e)
		return e;
	if (r->table->n) {
		/* what the file holds, for a build that finds the same to
		 * write nothing (without it the first build writes) */
		r->file_known = !r->file_older && record_sig(r->table, r->nas, &r->file_sig) == 0;
		r->built_at = built;
	} else {
		r->nas[0] = '\0';
	}
	r->files = r->table->files;
	r->entries = r->table->n;
	pthread_mutex_init(&r->lock, NULL);
	pthread_mutex_init(&r->build_lock, NULL);
	pthread_mutex_init(&r->file_lock, NULL);
	/* Timed waits on the monotonic clock: a clock step must not stall or
	 * hurry the builds. */
	pthread_condattr_init(&mono);
	pthread_condattr_setclock(&mono, CLOCK_MONOTONIC);
	pthread_cond_init(&r->cond, &mono);
	pthread_condattr_destroy(&mono);
	return 0;
}

static void wait_until(struct record *r, int64_t deadline_ms)
{
	struct timespec ts = mono_timespec(deadline_ms);

	pthread_cond_timedwait(&r->cond, &r->lock, &ts);
}

static uint64_t local_sig(struct store *s, const char *root)
{
	struct scan sc = { .root = root };

	store_each(s, scan_blob, &sc);
	return scan_sig(&sc);
}

/* Build when the local blobs or the repos they lead to changed (polled
 * each second: store copies_gen, and a pass over the table under
 * store.lock when it moved) or a sync asked; after a failure, the changes
 * wait with a back-off, a sync does not. */
static void *run(void *arg)
{
	struct record *r = arg;
	/* sig: the local copies as the last look saw them, at store
	 * copies_gen @seen (a look only when it moved) */
	uint64_t sig = 0, built_sig = 0, seen = 0, gen;
	/* next_at: a build of many files (40,000: ~1 s) comes at most a
	 * tenth of the time, not every second; a sync asked for waits not */
	int64_t retry_at = 0, delay = 1000, next_at = 0, t0, now;
	int have = 0, looked = 0;

	pthread_setname_np(pthread_self(), "wfs-record");
	pthread_mutex_lock(&r->lock);
	while (!r->stop) {
		uint64_t asked = r->asked_gen;
		int sync = asked != r->served_gen, tried = 0, e = 0;

		pthread_mutex_unlock(&r->lock);
		gen = store_copies_gen(r->store);
		if (!looked || gen != seen) {
			sig = local_sig(r->store, r->roots->path[0]);
			seen = gen;
			looked = 1;
		}
		if (sync || ((!have || sig != built_sig) && mono_ms() >= retry_at &&
			     mono_ms() >= next_at && nas_gate_up(r->gate))) {
			t0 = mono_ms();
			e = record_rebuild(r, r->roots, r->store);
			now = mono_ms();
			next_at = now + 9 * (now - t0);
			tried = 1;
			have = e == 0 || have;
			built_sig = e == 0 ? sig : built_sig;
			retry_at = e == 0 ? 0 : now + delay;
			delay = e == 0 ? 1000 : delay * 2 > RECORD_RETRY_MAX_MS ?
				RECORD_RETRY_MAX_MS : delay * 2;
			/* a build's walk, its table and its text are freed
			 * now: give the memory back (glibc keeps it) */
			heap_give_back();
		}
		pthread_mutex_lock(&r->lock);
		if (tried) {
			r->built_gen++;
			r->served_gen = asked;
			r->last_err = e;
			pthread_cond_broadcast(&r->cond);
		}
		r->looks++;
		if (!r->stop && r->asked_gen == r->served_gen)
			wait_until(r, mono_ms() + 1000);
	}
	pthread_mutex_unlock(&r->lock);
	return NULL;
}

int record_start(struct record *r, const struct hub_roots *roots, struct store *s,
		 struct nas_gate *gate)
{
	int e;

	r->roots = roots;
	r->store = s;
	r->gate = gate;
	pthread_mutex_lock(&r->lock);
	r->running = 1;
	pthread_mutex_unlock(&r->lock);
	e = thread_start(&r->thread, NULL, run, r);
	if (e) {
		pthread_mutex_lock(&r->lock);
		r->running = 0;
		pthread_mutex_unlock(&r->lock);
		return e;
	}
	r->started = 1;
	return 0;
}

int record_sync(struct record *r, int64_t timeout_ms)
{
	int64_t deadline = mono_ms() + (timeout_ms > 0 ? timeout_ms : 0);
	uint64_t mine;
	int e;

	pthread_mutex_lock(&r->lock);
	mine = ++r->asked_gen;
	pthread_cond_broadcast(&r->cond);
	while (r->running && r->served_gen < mine && mono_ms() < deadline)
		wait_until(r, deadline);
	e = r->served_gen >= mine ? r->last_err : !r->running ? -ESRCH : -ETIMEDOUT;
	pthread_mutex_unlock(&r->lock);
	return e;
}

void record_stop_tell(struct record *r)
{
	pthread_mutex_lock(&r->lock);
	r->stop = 1;
	r->running = 0;
	pthread_cond_broadcast(&r->cond);
	pthread_mutex_unlock(&r->lock);
}

int record_stop_by(struct record *r, int64_t deadline_ms)
{
	int e = 0;

	record_stop_tell(r);
	if (r->started && (e = join_by(r->thread, deadline_ms)) < 0) {
		/* Left in a walk of a frozen NAS: record.json is not written
		 * again by it (rebuild looks at @stop under @file_lock). */
		pthread_mutex_lock(&r->file_lock);
		record_log(r, LOG_NOTICE, "stopping: the rebuild of the record is left in a walk "
			   "of the NAS that has not returned; %s keeps its last build", r->path);
	}
	r->started = 0;
	return e;
}

void record_close(struct record *r)
{
	record_stop_by(r, -1);
	record_table_free(r->table);
	r->table = NULL;
	free_strs(r->big_trees, r->nbig_trees);
	r->big_trees = NULL;
	r->nbig_trees = 0;
	pthread_cond_destroy(&r->cond);
	pthread_mutex_destroy(&r->file_lock);
	pthread_mutex_destroy(&r->build_lock);
	pthread_mutex_destroy(&r->lock);
}
