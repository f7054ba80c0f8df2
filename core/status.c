/* status.c - the reply to "status": per repo and revision how much is
 * local, copies in flight, what was wanted but stays on the NAS and why,
 * the store's room, the policy, the ref pins, the NAS's state, the local
 * record and the control server's connections.  See status.h.
 *
 * Any local user may ask, so it changes nothing: the tree is walked as
 * collect_peek walks it (files the store has no blob for count as on the
 * NAS), never as collect, which would create a blob for every file walked.
 * A repo is walked once: its figures and each revision's come from that
 * walk (tally_repo), and so do a ref pin's when its repo was walked.
 *
 * It must answer during a NAS outage, so it never walks a NAS the gate
 * (nasgate.h) says is down: the tree is then what the local record
 * (record.h) holds and the blobs the store knows under it, and each repo
 * says which it came from ("from").  Before it walks, it asks the NAS
 * through the gate (within the deadline), so that a NAS that has just hung
 * is found down in a second rather than holding this worker in the
 * kernel; between repos and revisions it looks at the gate again.
 */
#include "status.h"
#include "status_int.h"
#include "collect.h"
#include "metrics.h"
#include "nasgate.h"
#include "peeras.h"
#include "nasopen.h"
#include "ns.h"
#include "path.h"
#include "pins.h"
#include "record.h"
#include "reply.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>

static const char *const FROM_NAS = "nas", *const FROM_RECORD = "record";

static void view_free(struct view *v)
{
	blob_set_free(&v->set);
	nas_set_free(&v->nas);
	status_keys_free(&v->keys);
	free(v->e);
	for (size_t i = 0; i < v->nrevs; i++)
		free(v->revs[i].rel);
	free(v->revs);
}

/* ---- is the NAS there ---- */

static int probe_fn(void *arg)
{
	const char *root = arg;
	struct statvfs sv;
	struct stat st;

	/* statvfs asks the server itself; stat may come from a cache */
	return stat(root, &st) < 0 || statvfs(root, &sv) < 0 ? -errno : 0;
}

/* Ask the NAS through the gate before walking it: a hung NAS costs this
 * request the deadline and marks it down, instead of a worker in the
 * kernel for as long as the NAS hangs. */
static int nas_answers(struct control *c)
{
	char *root;
	int r;

	if (!c->gate)
		return 1;
	if (!nas_gate_up(c->gate))
		return 0;
	/* heap, a copy: a call past its deadline goes on with it (nasgate.h) */
	if (!(root = strdup(c->roots->path[0])))
		return 1; /* no memory for the probe: walk as before */
	r = nas_call(c->gate, probe_fn, root, free);
	if (r != -ETIMEDOUT)
		free(root);
	return !nas_cannot_answer(r);
}

/* Walked on while the gate says the NAS is up and the walk's time is not
 * spent: a NAS slow but within its deadline (each call some tens of ms)
 * made a status of a few thousand entries take minutes. */
static int view_online(struct view *v)
{
	if (v->online && !nas_gate_up(v->c->gate)) {
		v->online = 0;
	} else if (v->online && v->walk_until && store_now_ms() > v->walk_until) {
		v->online = 0;
		v->cut = 1;
	}
	return v->online;
}

/* ---- tallies ---- */

/* Add what @set and @nas hold (each file once) to @t. */
static void tally_sets(struct view *v, struct blob_set *set, struct nas_set *nas,
		       struct tally *t)
{
	blob_set_unique(set);
	nas_set_unique(nas);
	for (size_t i = 0; i < nas->n; i++) {
		t->files++;
		t->bytes += (json_int_t)nas->v[i].size;
		t->per_state[BLOB_NAS]++;
	}
	for (size_t i = 0; i < set->n; i++) {
		struct blob_info snap;

		blob_info(v->c->store, set->v[i], &snap);
		t->files++;
		t->bytes += (json_int_t)snap.size;
		t->per_state[snap.state]++;
		t->pinned_files += snap.pinned;
		if (strcmp(blob_info_state_name(&snap), blob_state_name(snap.state))) {
			t->per_state[snap.state]--; /* counted as "partial" */
			t->partial_files++;
			t->partial_bytes += (json_int_t)snap.part_bytes;
		}
		if (snap.state == BLOB_LOCAL) {
			t->local_files++;
			t->local_bytes += (json_int_t)snap.size;
		}
	}
}

static int cmp_rev(const void *a, const void *b)
{
	return strcmp(((const struct rev_tally *)a)->rel, ((const struct rev_tally *)b)->rel);
}

/* The figures of the revision "<repo>/snapshots/<rev>" @rel, if its repo's
 * walk found it. */
static const struct tally *walked_rev(const struct view *v, const char *rel)
{
	struct rev_tally key = { (char *)rel, {0} }, *r;

	r = v->nrevs ? bsearch(&key, v->revs, v->nrevs, sizeof(*v->revs), cmp_rev) : NULL;
	return r ? &r->t : NULL;
}

/* Tally every file under @rel: from the NAS while it answers (or from the
 * walk of its repo, for a revision), else from what is known without it.
 * Returns where the figures came from. */
static const char *tally_path(struct view *v, const char *rel, struct tally *t)
{
	const struct tally *walked = walked_rev(v, rel);
	const char *from = walked || view_online(v) ? FROM_NAS : FROM_RECORD;

	memset(t, 0, sizeof(*t));
	if (walked) {
		*t = *walked;
		return from;
	}
	blob_set_clear(&v->set);
	nas_set_clear(&v->nas);
	/* an error leaves what was found before it: status is a best effort */
	if (from == FROM_NAS)
		collect_peek(v->c->roots, v->c->store, NULL, rel, &v->set, &v->nas);
	else
		status_known_under(v, rel, t);
	tally_sets(v, &v->set, &v->nas, t);
	return from;
}

/* One walk of a repo on the NAS: its files into the view's sets, and each
 * revision's into a set of its own, tallied when the walk leaves it (a
 * walk lists a directory's entries before the next one's: a revision's
 * files come one after another). */
struct repo_walk {
	struct view *v;
	char snaps[PATH_MAX];     /* "<repo>/snapshots/" */
	size_t snaps_len;
	struct blob_set set;      /* the current revision's */
	struct nas_set nas;
	char *rel;                /* its "<repo>/snapshots/<rev>", or NULL */
};

/* The current revision (if any) is done: its tally to the view's list. */
static int rev_done(struct repo_walk *w)
{
	struct view *v = w->v;
	struct rev_tally *r;

	if (!w->rel)
		return 0;
	if (v->nrevs == v->caprevs) {
		size_t cap = v->caprevs ? 2 * v->caprevs : 16;

		if (!(r = realloc(v->revs, cap * sizeof(*r))))
			return -ENOMEM;
		v->revs = r;
		v->caprevs = cap;
	}
	r = &v->revs[v->nrevs++];
	r->rel = w->rel;
	w->rel = NULL;
	memset(&r->t, 0, sizeof(r->t));
	tally_sets(v, &w->set, &w->nas, &r->t);
	blob_set_clear(&w->set);
	nas_set_clear(&w->nas);
	return 0;
}

static int repo_walk_one(void *arg, const char *rel, const struct ns_entry *e)
{
	struct repo_walk *w = arg;
	const char *rev = strncmp(rel, w->snaps, w->snaps_len) ? NULL : rel + w->snaps_len;
	size_t len = rev ? w->snaps_len + strcspn(rev, "/") : 0;
	int same = rev && w->rel && strlen(w->rel) == len && !strncmp(w->rel, rel, len);
	struct store *s = w->v->c->store;
	int r;

	/* a NAS found down, or the walk's time spent, meanwhile: not walked
	 * on (tally_repo takes the record's figures) */
	if (!view_online(w->v))
		return 1;
	/* a revision begins or ends here (not at each file of blobs/) */
	if (!same && (rev || w->rel)) {
		if ((r = rev_done(w)) < 0)
			return r;
		if (rev && !(w->rel = strndup(rel, len)))
			return -ENOMEM;
	}
	r = collect_peek_file(s, NULL, rel, e, &w->v->set, &w->v->nas);
	return r < 0 || !rev ? r : collect_peek_file(s, NULL, rel, e, &w->set, &w->nas);
}

/* Tally the repo @repo and each of its revisions in one walk of the NAS
 * (into @t and the view's list).  Returns where the figures came from: a
 * NAS found down before the walk or during it, the record's. */
static const char *tally_repo(struct view *v, const char *repo, struct tally *t)
{
	struct repo_walk w = { .v = v };
	size_t n0 = v->nrevs;

	if (!view_online(v))
		return tally_path(v, repo, t);
	w.snaps_len = (size_t)snprintf(w.snaps, sizeof(w.snaps), "%s/snapshots/", repo);
	if (w.snaps_len >= sizeof(w.snaps))
		return tally_path(v, repo, t);
	memset(t, 0, sizeof(*t));
	blob_set_clear(&v->set);
	nas_set_clear(&v->nas);
	/* an error leaves what was found before it: status is a best effort */
	if (collect_walk(v->c->roots, repo, 0, repo_walk_one, &w) >= 0)
		rev_done(&w);
	free(w.rel);
	blob_set_free(&w.set);
	nas_set_free(&w.nas);
	if (!view_online(v)) {
		/* cut short: what is known without the NAS, all of it */
		for (size_t i = n0; i < v->nrevs; i++)
			free(v->revs[i].rel);
		v->nrevs = n0;
		return tally_path(v, repo, t);
	}
	tally_sets(v, &v->set, &v->nas, t);
	if (v->nrevs > 1)
		qsort(v->revs, v->nrevs, sizeof(*v->revs), cmp_rev);
	return FROM_NAS;
}

static json_t *tally_json(const struct tally *t)
{
	json_t *states = json_object();

	for (int st = 0; st < BLOB_NSTATES; st++)
		if (t->per_state[st])
			json_object_set_new(states, blob_state_name((enum blob_state)st),
					    json_integer(t->per_state[st]));
	if (t->partial_files)
		json_object_set_new(states, "partial", json_integer(t->partial_files));
	return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o}", "files", t->files,
			 "bytes", t->bytes, "local_files", t->local_files,
			 "local_bytes", t->local_bytes, "partial_files", t->partial_files,
			 "partial_bytes", t->partial_bytes, "pinned_files", t->pinned_files,
			 "states", states);
}

/* ---- names: on the NAS, or in the record ---- */

/* The names in the directory @rel (mount-relative), each passed to @fn:
 * from the NAS while it answers, else the record's.  Names starting with
 * '.' are left out; with @dirs_only, what is not a directory too. */
static void each_name(struct view *v, const char *rel, int dirs_only,
		      void (*fn)(struct view *v, const char *name, void *arg), void *arg)
{
	char path[PATH_MAX * 2], **names = NULL;
	struct dirent *de;
	size_t n = 0;
	DIR *d;

	if (view_online(v)) {
		snprintf(path, sizeof(path), "%s%s%s", v->c->roots->path[0], *rel ? "/" : "", rel);
		d = nas_opendir(v->c->roots, path);
		while (d && (de = readdir(d)))
			if (de->d_name[0] != '.' && (!dirs_only || nas_dirent_is_dir(d, de)))
				fn(v, de->d_name, arg);
		if (d) {
			closedir(d);
			return;
		}
		if (view_online(v))
			return; /* the NAS answered: there is no such directory */
	}
	if (!status_view_entry(v) || record_list(v->c->record, rel, &names, &n) < 0)
		return;
	for (size_t i = 0; i < n; i++) {
		char child[PATH_MAX * 2];

		snprintf(child, sizeof(child), "%s%s%s", rel, *rel ? "/" : "", names[i]);
		if (names[i][0] != '.' && (!dirs_only || (record_lookup(v->c->record, child, v->e) == 0 &&
							   v->e->e.kind == NS_DIR)))
			fn(v, names[i], arg);
		free(names[i]);
	}
	free(names);
}

struct revs {
	const char *snaps;   /* "<repo>/snapshots" */
	json_t *list;
};

static void add_rev(struct view *v, const char *name, void *arg)
{
	struct revs *rv = arg;
	char rel[PATH_MAX * 2];
	struct tally t;
	json_t *r;

	snprintf(rel, sizeof(rel), "%s/%s", rv->snaps, name);
	tally_path(v, rel, &t);
	r = tally_json(&t);
	json_object_set_new(r, "rev", reply_path(name));
	json_array_append_new(rv->list, r);
}

/* One repo: totals, and one line per revision; "from": where the totals
 * came from (the NAS, or the record while it is down). */
static json_t *repo_json(struct view *v, const char *repo)
{
	char snaps[PATH_MAX];
	struct revs rv = { snaps, json_array() };
	struct tally t;
	const char *from = tally_repo(v, repo, &t);
	json_t *o = tally_json(&t);

	json_object_set_new(o, "repo", reply_path(repo));
	json_object_set_new(o, "from", json_string(from));
	snprintf(snaps, sizeof(snaps), "%s/snapshots", repo);
	each_name(v, snaps, 0, add_rev, &rv);
	json_object_set_new(o, "revisions", rv.list);
	return o;
}

/* ---- the whole mount ---- */

struct repo_names {
	char **v;
	size_t n, cap;
};

/* @name: @len bytes (not NUL-terminated there) */
static void add_repo_name(struct repo_names *rn, const char *name, size_t len)
{
	char **v;

	if (!hub_is_repo_folder(name, len))
		return;
	if (rn->n == rn->cap) {
		size_t cap = rn->cap ? rn->cap * 2 : 32;

		if (!(v = realloc(rn->v, cap * sizeof(*v))))
			return;
		rn->v = v;
		rn->cap = cap;
	}
	if ((rn->v[rn->n] = strndup(name, len)))
		rn->n++;
}

static void name_cb(struct view *v, const char *name, void *arg)
{
	(void)v;
	add_repo_name(arg, name, strlen(name));
}

struct store_repos {
	const char *root;
	struct repo_names *rn;
};

/* A repo the store has a blob of: NAS_HUB/<repo>/... */
static void store_repo(void *arg, const struct blob_info *b)
{
	struct store_repos *sr = arg;
	const char *rest = path_under(sr->root, b->key);
	size_t len = rest ? strcspn(rest, "/") : 0;

	if (len && rest[len] == '/')
		add_repo_name(sr->rn, rest, len);
}

/* Every repo: listed on the NAS, or (while it is down) the record's and
 * those the store has blobs of; sorted, each once. */
static void repo_names(struct view *v, struct repo_names *rn)
{
	struct store_repos sr = { v->c->roots->path[0], rn };
	size_t k = 0;

	each_name(v, "", 1, name_cb, rn);
	if (view_online(v) || v->others)
		return; /* (another user: not the store's word, peeras.h) */
	store_each(v->c->store, store_repo, &sr);
	if (rn->n > 1)
		qsort(rn->v, rn->n, sizeof(*rn->v), status_cmp_str);
	for (size_t i = 0; i < rn->n; i++) {
		if (k && !strcmp(rn->v[i], rn->v[k - 1]))
			free(rn->v[i]);
		else
			rn->v[k++] = rn->v[i];
	}
	rn->n = k;
}

/* ---- a path ---- */

/* Is @norm (a path asked for) there?  On the NAS; without it, in the
 * record or under a blob the store knows.  0 or an error reply. */
static json_t *path_check(struct view *v, const char *norm)
{
	struct ns_entry *e;
	struct tally t;
	int r = -ENOENT;

	if (view_online(v)) {
		e = malloc(sizeof(*e));
		r = e ? ns_classify(v->c->roots, norm, e) : -ENOMEM;
		free(e);
		if (r == 0 || r == -ENOMEM || view_online(v))
			return r < 0 ? reply_error(-r, "%s: %s", norm, strerror(-r)) : NULL;
	}
	memset(&t, 0, sizeof(t));
	blob_set_clear(&v->set);
	status_known_under(v, norm, &t);
	if (v->set.n || t.files || (status_view_entry(v) && record_lookup(v->c->record, norm, v->e) == 0))
		return NULL;
	return reply_error(EHOSTDOWN, "%s: not in the local record, and the NAS is down: what "
			   "it holds cannot be told until the NAS answers again", norm);
}

/* ---- the rest of the reply ---- */

#define HELD_LIST_MAX 200 /* status lists at most this many blobs kept on the NAS */

struct sums {
	int others;    /* another user asks (peeras.h): counts, no lists */
	json_int_t local_bytes, nas_bytes, opens, held, flagged_total;
	json_t *copies, *flagged, *held_list, *partial;
	/* the NAS key of each entry of @partial, as it is: the reply's "key"
	 * is escaped where the name is not UTF-8, and finds no blob */
	struct keys partial_keys;
};

static void sum_blob(void *arg, const struct blob_info *b)
{
	struct sums *s = arg;

	s->local_bytes += (json_int_t)b->local_bytes;
	s->nas_bytes += (json_int_t)b->nas_bytes;
	s->opens += (json_int_t)b->opens;
	if (s->others) {
		s->flagged_total += b->state == BLOB_MISMATCH || b->state == BLOB_FAILED ||
				    b->local_error;
		s->held += b->hold != HOLD_NONE && b->state == BLOB_NAS;
		return;
	}
	/* files with local ranges (their ranges are added after: no store
	 * call under its lock) */
	if ((b->part_bytes || b->part_copying || b->part_reason[0]) &&
	    status_keys_add(&s->partial_keys, b->key, 0) == 0 &&
	    json_array_append_new(s->partial, json_pack("{s:o, s:o, s:o?, s:s, s:I, s:I, s:I, "
			"s:b, s:o, s:I}", "key", reply_path(b->key), "id", reply_path(b->id),
			"name", reply_path(b->name), "state", blob_info_state_name(b),
			"size", (json_int_t)b->size, "local_bytes", (json_int_t)b->part_bytes,
			"nranges", (json_int_t)b->part_n, "copying", b->part_copying,
			"reason", reply_path(b->part_reason), "served_local_bytes",
			(json_int_t)b->local_bytes)) < 0)
		free(s->partial_keys.v[--s->partial_keys.n].key); /* one key per entry */
	if (b->state == BLOB_COPYING)
		json_array_append_new(s->copies, json_pack("{s:o, s:o, s:s, s:I, s:I}", "key",
			reply_path(b->key), "id", reply_path(b->id), "state", blob_state_name(b->state),
			"bytes_done", (json_int_t)b->bytes_done, "size", (json_int_t)b->size));
	/* A local copy that failed a read is flagged too: the local disk is
	 * the operator's to look at, and until it is copied again the NAS
	 * serves it (and an outage hides it). */
	if ((b->state == BLOB_MISMATCH || b->state == BLOB_FAILED || b->local_error) &&
	    s->flagged_total++ < REPLY_FLAGGED_MAX)
		json_array_append_new(s->flagged, json_pack("{s:o, s:o, s:s, s:o, s:b}", "key",
			reply_path(b->key), "id", reply_path(b->id), "state",
			blob_state_name(b->state), "reason", reply_path(b->reason),
			"local_error", b->local_error));
	/* Why what was wanted is not local: the operator's first question. */
	if (b->hold != HOLD_NONE && b->state == BLOB_NAS && s->held++ < HELD_LIST_MAX)
		json_array_append_new(s->held_list, json_pack("{s:o, s:o, s:s, s:o, s:I, s:o?}",
			"key", reply_path(b->key), "id", reply_path(b->id),
			"hold", b->hold == HOLD_EXCLUDED ? "excluded" : "no_room",
			"reason", reply_path(b->reason), "size", (json_int_t)b->size,
			"name", reply_path(b->name)));
}

/* Each partial file's verified ranges, [offset, length]. */
static void partial_ranges(struct control *c, json_t *list, const struct keys *keys)
{
	json_t *e;
	size_t i;

	json_array_foreach(list, i, e) {
		struct blob *b = store_find(c->store, keys->v[i].key);
		json_t *rl = json_array();
		struct brange *v = NULL;
		size_t n = 0;

		if (b)
			store_part_ranges(c->store, b, &v, &n);
		for (size_t k = 0; k < n; k++)
			json_array_append_new(rl, json_pack("[I, I]", (json_int_t)v[k].off,
							    (json_int_t)v[k].len));
		free(v);
		json_object_set_new(e, "ranges", rl);
	}
}

static json_t *policy_json(const struct policy_opts *p)
{
	json_t *ex;

	if (!p)
		return json_pack("{s:b}", "auto", 0);
	ex = json_array();
	for (size_t i = 0; i < p->nexclude; i++)
		json_array_append_new(ex, reply_path(p->exclude[i]));
	return json_pack("{s:b, s:I, s:I, s:f, s:b, s:o, s:I, s:I, s:I, s:f}",
		"auto", p->auto_on, "auto_bytes", (json_int_t)p->auto_bytes,
		"auto_opens", (json_int_t)p->auto_opens, "auto_mbps", (double)p->auto_bw / 1e6,
		"siblings", p->siblings, "exclude", ex, "store_max", (json_int_t)p->store_max,
		"min_free", (json_int_t)p->min_free, "min_free_pct", (json_int_t)p->min_free_pct,
		"ref_poll", p->ref_poll);
}

/* The ref pins, with how much of their revisions is local. */
static json_t *refs_json(struct view *v)
{
	size_t n = 0;
	struct pin *p = v->c->pins ? pins_list(v->c->pins, &n) : NULL;
	json_t *out = json_array();

	for (size_t i = 0; p && i < n; i++) {
		const char *revs[2] = { p[i].commit, p[i].pending }, *from = FROM_NAS;
		struct tally t[2];
		json_t *o;

		for (int k = 0; k < 2; k++) {
			char rel[PATH_MAX];

			memset(&t[k], 0, sizeof(t[k]));
			if (!*revs[k])
				continue;
			snprintf(rel, sizeof(rel), "%s/snapshots/%s", p[i].repo, revs[k]);
			if (tally_path(v, rel, &t[k]) == FROM_RECORD)
				from = FROM_RECORD;
		}
		o = json_pack("{s:o, s:o, s:o, s:o, s:o, s:I, s:I, s:I, s:I, s:s}",
			      "repo", reply_path(p[i].repo), "ref", reply_path(p[i].ref),
			      "commit", reply_path(p[i].commit), "pending", reply_path(p[i].pending),
			      "reason", reply_path(p[i].reason), "files", t[0].files,
			      "local_files", t[0].local_files, "pending_files", t[1].files,
			      "pending_local_files", t[1].local_files, "from", from);
		json_array_append_new(out, o);
	}
	free(p);
	return out;
}

/* The control server's connections and limits (control.h): what it holds
 * now, what it turned away. */
static json_t *control_json(struct control *c)
{
	return json_pack("{s:i, s:i, s:I, s:I, s:I, s:{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i}}",
		"connections", atomic_load_explicit(&c->conns, memory_order_relaxed),
		"connections_other", atomic_load_explicit(&c->conns_other, memory_order_relaxed),
		"accepted", (json_int_t)atomic_load_explicit(&c->accepted, memory_order_relaxed),
		"refused", (json_int_t)atomic_load_explicit(&c->refused, memory_order_relaxed),
		"timed_out", (json_int_t)atomic_load_explicit(&c->timed_out, memory_order_relaxed),
		"limits", "connections", CONTROL_MAX_CONNS,
		"connections_other", CONTROL_MAX_CONNS_OTHER,
		"connections_per_uid", CONTROL_MAX_CONNS_PER_UID, "workers", CONTROL_WORKERS,
		"workers_other", CONTROL_WORKERS_OTHER, "request_bytes", CONTROL_MAX_REQUEST,
		"request_timeout_ms", CONTROL_REQUEST_TIMEOUT_MS,
		"reply_timeout_ms", CONTROL_REPLY_TIMEOUT_MS);
}

/* The repos of the reply: the one @norm lies in, or every repo. */
static json_t *repos_json(struct view *v, const char *norm)
{
	struct repo_names rn = {0};
	json_t *repos = json_array();

	/* (a path outside every repo, version.txt or .locks/..., lies in none) */
	if (norm && *norm)
		add_repo_name(&rn, norm, strcspn(norm, "/"));
	else
		repo_names(v, &rn);
	for (size_t i = 0; i < rn.n; i++) {
		json_array_append_new(repos, repo_json(v, rn.v[i]));
		free(rn.v[i]);
	}
	free(rn.v);
	return repos;
}

static int from_record(json_t *list)
{
	json_t *o;
	size_t i;

	json_array_foreach(list, i, o) {
		const char *from = json_string_value(json_object_get(o, "from"));

		if (from && !strcmp(from, FROM_RECORD))
			return 1;
	}
	return 0;
}

/* "from": "record" if any repo or ref pin was counted without the NAS. */
static const char *reply_from(json_t *repos, json_t *refs)
{
	return from_record(repos) || from_record(refs) ? FROM_RECORD : FROM_NAS;
}

static json_t *store_json(struct control *c)
{
	struct store_usage u;
	uint64_t evictable = 0, room;

	store_usage(c->store, &u);
	room = store_room(c->store, &evictable);
	return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, "
		"s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
		"partial_files", (json_int_t)u.parts, "partial_bytes", (json_int_t)u.part_bytes,
		"blobs", (json_int_t)u.blobs, "bytes", (json_int_t)u.bytes,
		"free_bytes", (json_int_t)u.free_bytes, "queued", (json_int_t)u.queued,
		"copying", (json_int_t)u.copying, "used_bytes", (json_int_t)u.used,
		"limit_bytes", (json_int_t)u.limit, "min_free_bytes", (json_int_t)u.floor,
		"fs_bytes", (json_int_t)u.fs_bytes, "reserved_bytes", (json_int_t)u.reserved,
		"held_bytes", (json_int_t)u.held, "pinned_bytes", (json_int_t)u.pinned_bytes,
		"open_bytes", (json_int_t)u.open_bytes, "available_bytes", (json_int_t)room,
		"evictable_bytes", (json_int_t)evictable);
}

/* Everything but the tree. */
static void add_state(struct control *c, json_t *rep)
{
	struct metrics_nas mn;
	json_t *nas, *rec;

	metrics_collect_nas(c->gate, c->record, &mn);
	json_object_set_new(rep, "store", store_json(c));
	json_object_set_new(rep, "policy", policy_json(c->store->opt.policy));
	json_object_set_new(rep, "auto", json_pack("{s:I, s:I, s:I}",
		"queued", (json_int_t)c->store->auto_queued,
		"no_room", (json_int_t)c->store->no_room,
		"excluded", (json_int_t)c->store->excluded));
	json_object_set_new(rep, "counters", json_pack("{s:I, s:I, s:I, s:I}",
		"promoted", (json_int_t)c->store->promoted,
		"evicted", (json_int_t)c->store->evicted,
		"demoted", (json_int_t)c->store->demoted,
		"failed", (json_int_t)c->store->failed));
	/* "nas": the NAS_HUB path and the NAS's state; the path was the whole
	 * of "nas" before there was a state to report */
	nas = metrics_nas_json(&mn);
	if (nas)
		json_object_set_new(nas, "path", reply_path(c->roots->path[0]));
	json_object_set_new(rep, "nas", nas);
	rec = metrics_record_json(&mn);
	/* (the refs it holds name repos and commits: not for another user) */
	if (rec)
		json_object_set_new(rec, "refs_held", peer_as_other() ? json_array() :
				    metrics_refs_held_json(c->record));
	json_object_set_new(rep, "record", rec);
	json_object_set_new(rep, "control", control_json(c));
}

/* How long a status walks the NAS before the rest is the record's. */
static int64_t status_walk_ms(const struct control *c)
{
	return (int64_t)STATUS_WALK_TIMEOUTS * c->gate->timeout_ms;
}

/* Another user's status with the NAS down, or too slow (peeras.h). */
static json_t *others_offline(const struct view *v)
{
	if (v->cut)
		return reply_error(ETIMEDOUT, "the NAS answers too slowly: another user's status "
				   "walks it, and the walk passed %lld s (%d times nas_timeout); "
				   "ask again once it is faster, or as root or the mount's owner",
				   (long long)status_walk_ms(v->c) / 1000, STATUS_WALK_TIMEOUTS);
	return reply_error(EHOSTDOWN, "the NAS does not answer, and another user's status is "
			   "what the NAS shows that user (the local record is not checked as "
			   "you): ask again once it answers, or as root or the mount's owner");
}

json_t *status_reply(struct control *c, json_t *req, int walk)
{
	const char *path = json_string_value(json_object_get(req, "path"));
	char norm[PATH_MAX];
	struct sums sums = { .others = peer_as_other() };
	struct view v = { .c = c, .others = sums.others };
	json_t *repos, *refs, *rep;

	if (path && (path[0] == '/' || path_normalize(path, norm, sizeof(norm)) < 0))
		return reply_error(EINVAL, "%s: not a path inside the mount %s", path, c->mount);
	v.online = walk && nas_answers(c);
	v.walk_until = v.online && c->gate ? store_now_ms() + status_walk_ms(c) : 0;
	if (v.others && !v.online)
		return others_offline(&v);
	if (path && *norm && (rep = path_check(&v, norm))) {
		view_free(&v);
		return rep;
	}
	/* Another user: what its walk of the NAS shows it; the record's local
	 * revisions (the NAS down) and the ref pins are not checked as it. */
	repos = repos_json(&v, path ? norm : NULL);
	refs = sums.others ? json_array() : refs_json(&v);
	if (v.others && !view_online(&v)) { /* down in the middle of its walk */
		json_decref(repos);
		json_decref(refs);
		view_free(&v);
		return others_offline(&v);
	}
	view_free(&v);
	sums.copies = json_array();
	sums.flagged = json_array();
	sums.held_list = json_array();
	sums.partial = json_array();
	store_each(c->store, sum_blob, &sums);
	partial_ranges(c, sums.partial, &sums.partial_keys);
	status_keys_free(&sums.partial_keys);
	rep = json_pack("{s:b, s:o, s:o, s:s, s:o, s:o, s:{s:I, s:I, s:I}, s:o, s:I, s:o, s:I, "
			"s:o, s:o}",
		"ok", 1, "local", reply_path(c->local),
		"mount", reply_path(c->mount), "from", reply_from(repos, refs),
		"repos", repos, "copies", sums.copies,
		"served", "local_bytes", sums.local_bytes, "nas_bytes", sums.nas_bytes,
		"opens", sums.opens,
		"flagged", sums.flagged, "flagged_total", sums.flagged_total,
		"held", sums.held_list, "held_total", sums.held,
		"ref_pins", refs, "partial", sums.partial);
	if (rep) {
		json_object_set_new(rep, "walk_cut_s",
				    json_integer(v.cut ? status_walk_ms(c) / 1000 : 0));
		add_state(c, rep);
	}
	return rep;
}
