/* auto.c - automatic promotion: the policy thread; see auto.h. */
#include "auto.h"
#include "collect.h"
#include "nasgate.h"
#include "nasopen.h"
#include "path.h"
#include "stopby.h"
#include "thread.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

struct names {
	char **v;
	size_t n;
};

static int names_add(void *arg, const char *rel)
{
	struct names *nm = arg;
	char **v;

	for (size_t i = 0; i < nm->n; i++)
		if (!strcmp(nm->v[i], rel))
			return 0;
	if (nm->n >= 4096)
		return 1; /* enough to decide */
	v = realloc(nm->v, (nm->n + 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	nm->v = v;
	if (!(nm->v[nm->n] = strdup(rel)))
		return -ENOMEM;
	nm->n++;
	return 0;
}

static void names_free(struct names *nm)
{
	for (size_t i = 0; i < nm->n; i++)
		free(nm->v[i]);
	free(nm->v);
	memset(nm, 0, sizeof(*nm));
}

/* The revisions some ref of @repo names (refs/main, refs/pr/1, ...). */
static void ref_commits(const struct hub_roots *roots, const char *repo, const char *sub,
			struct names *out, int depth)
{
	char rel[PATH_MAX], path[PATH_MAX];
	struct dirent *de;
	DIR *d;

	snprintf(rel, sizeof(rel), "%s/refs%s%s", repo, *sub ? "/" : "", sub);
	if (path_join(roots->path[0], rel, path, sizeof(path)) < 0 ||
	    !(d = nas_opendir(roots, path)))
		return;
	while ((de = readdir(d))) {
		char child[PATH_MAX], commit[NAME_MAX + 1];

		if (de->d_name[0] == '.')
			continue;
		snprintf(child, sizeof(child), "%s%s%s", sub, *sub ? "/" : "", de->d_name);
		if (refs_read(roots, repo, child, commit, sizeof(commit)) == 0)
			names_add(out, commit);
		else if (depth < 2 && nas_dirent_is_dir(d, de))
			ref_commits(roots, repo, child, out, depth + 1);
	}
	closedir(d);
}

/* The revision of a snapshot name "<repo>/snapshots/<rev>/...". */
static void rev_of(const char *rel, char *out, size_t sz)
{
	const char *p = strstr(rel, "/snapshots/");

	out[0] = '\0';
	if (p)
		snprintf(out, sz, "%.*s", (int)strcspn(p + 11, "/"), p + 11);
}

struct sibling_scan {
	const char *base;
	struct names *files;
};

static int is_named(void *arg, const char *file)
{
	struct sibling_scan *sc = arg;

	return strcmp(file, sc->base) ? 0 : 1;
}

static int add_listed(void *arg, const char *file)
{
	struct sibling_scan *sc = arg;

	/* only files of the index's own directory: "", "." and ".." name the
	 * directory or the one above, whose every file a walk would queue */
	if (strchr(file, '/') || !strcmp(file, sc->base) || !*file || !strcmp(file, ".") ||
	    !strcmp(file, ".."))
		return 0;
	return names_add(sc->files, file) < 0 ? -ENOMEM : 0;
}

/* The files of @dir (mount-relative) a loader reads with @base: shards of
 * the same checkpoint, and the files a *.index.json weight_map lists with
 * it. */
static void find_siblings(struct auto_promoter *a, const char *dir, const char *base,
			  struct names *files)
{
	const struct hub_roots *roots = a->roots;
	struct ns_entry *e = malloc(sizeof(*e));
	struct sibling_scan sc = { base, files };
	char path[PATH_MAX];
	struct dirent *de;
	DIR *d = NULL;

	if (e && hub_check_parents(roots, dir) == 0 &&
	    path_join(roots->path[0], dir, path, sizeof(path)) == 0)
		d = nas_opendir(roots, path);
	while (d && (de = readdir(d))) {
		char rel[PATH_MAX];

		if (de->d_name[0] == '.')
			continue;
		if (policy_shard_siblings(base, de->d_name)) {
			names_add(files, de->d_name);
			continue;
		}
		if (!policy_is_ckpt_index(de->d_name) ||
		    path_join(dir, de->d_name, rel, sizeof(rel)) < 0 ||
		    ns_classify(roots, rel, e) < 0 || !e->backing[0] ||
		    (e->kind != NS_FILE && e->kind != NS_LINK))
			continue;
		/* e->backing is where the index resolves, inside the NAS roots */
		if (policy_weight_map(e->backing, is_named, &sc) > 0)
			policy_weight_map(e->backing, add_listed, &sc);
	}
	if (d)
		closedir(d);
	free(e);
}

/* Queue the sibling shards of the snapshot name @name. */
static void queue_siblings(struct auto_promoter *a, const char *name)
{
	const struct policy_opts *pol = a->policy;
	struct store *s = a->store;
	struct names files = { 0 };
	struct blob_set set = { 0 };
	char dir[PATH_MAX];
	const char *base = strrchr(name, '/') ? strrchr(name, '/') + 1 : name;
	size_t queued = 0, excluded = 0;

	path_dirname(name, dir, sizeof(dir));
	find_siblings(a, dir, base, &files);
	for (size_t i = 0; i < files.n; i++) {
		char rel[PATH_MAX];

		if (path_join(dir, files.v[i], rel, sizeof(rel)) == 0)
			collect(a->roots, s, pol, rel, &set);
	}
	blob_set_unique(&set);
	for (size_t i = 0; i < set.n; i++) {
		struct blob *b = set.v[i];
		struct blob_info info;
		int go;

		if (set.glob[i]) {
			char why[PATH_MAX + 300];

			snprintf(why, sizeof(why), "excluded by '%s' (%s): kept on the NAS",
				 set.glob[i], set.name[i]);
			store_exclude(s, b, why);
			excluded++;
			continue;
		}
		blob_info(s, b, &info);
		go = (info.state == BLOB_NAS || info.state == BLOB_FAILED) &&
		     info.hold != HOLD_EXCLUDED;
		if (go) {
			store_mark_hot(s, b); /* queued now: its own reads need not */
			store_promote(s, b, 0, 0);
			queued++;
		}
	}
	if (queued || excluded)
		store_log_msg(s, LOG_INFO, "%s is hot: queued %zu sibling shard%s of it (%zu excluded)",
			  name, queued, queued == 1 ? "" : "s", excluded);
	blob_set_free(&set);
	names_free(&files);
}

/* The snapshot names of every blob of one repo, from one walk: a repo with
 * many small files turning hot one after the other costs one walk, not one
 * each.  Only the policy thread uses it. */
#define NAME_CACHE_S 30        /* a new revision's names are seen this late at most */

struct name_cache {
	char repo[NAME_MAX + 1];
	int64_t at_ms;             /* CLOCK_MONOTONIC */
	json_t *map;           /* NAS key -> [mount-relative names] (collect.h) */
};

/* @key's snapshot names in @repo into @out: 0, or the -errno of a walk of
 * its snapshots that failed (nothing cached then: the names are not known,
 * and an exclusion not seen would copy an excluded pack). */
static int names_of(struct auto_promoter *a, struct name_cache *nc, const char *repo,
		    const char *key, struct names *out)
{
	int64_t now = store_now_ms();
	json_t *v, *name;
	size_t i;
	int r;

	/* a blob the cache does not know may be in a revision newer than it
	 * (a second later: not one walk per unknown blob) */
	if (nc->map && !strcmp(nc->repo, repo) && now - nc->at_ms >= 1000 &&
	    !json_object_get(nc->map, key))
		nc->map = (json_decref(nc->map), NULL);
	if (strcmp(nc->repo, repo) || now - nc->at_ms > NAME_CACHE_S * 1000 || !nc->map) {
		json_decref(nc->map);
		nc->map = json_object();
		nc->at_ms = now;
		snprintf(nc->repo, sizeof(nc->repo), "%s", repo);
		r = nc->map ? collect_snapshot_names(a->roots, repo, nc->map, COLLECT_NAMES_MAX)
			    : -ENOMEM;
		if (r < 0) {
			nc->map = (json_decref(nc->map), NULL);
			return r;
		}
	}
	v = json_object_get(nc->map, key);
	json_array_foreach(v, i, name)
		names_add(out, json_string_value(name));
	return 0;
}

static void handle_hot(struct auto_promoter *a, struct blob *b, struct name_cache *nc)
{
	const struct policy_opts *pol = a->policy;
	const struct hub_roots *roots = a->roots;
	struct store *s = a->store;
	struct names names = { 0 }, refs = { 0 };
	char repo[NAME_MAX + 1] = "", name[PATH_MAX];
	const char *key = b->key; /* immutable */
	const char *glob = NULL, *gname = NULL;
	enum blob_state st = blob_state(b);

	store_blob_name(s, b, name, sizeof(name));
	if (*name)
		names_add(&names, name);
	if (st != BLOB_NAS && st != BLOB_FAILED)
		goto out;
	if (roots) {
		const char *rel = names.n ? names.v[0] : path_under(roots->path[0], key);

		if (rel)
			snprintf(repo, sizeof(repo), "%.*s", (int)strcspn(rel, "/"), rel);
		/* Every snapshot name of it, not only the one noted: the globs
		 * exclude a blob any name of which they match, and the revision
		 * a ref names is the one whose shards are loaded -- a name
		 * noted once (a wfsctl walk of an older revision) is never
		 * replaced, and its shards, not the loaded ones', were copied.
		 * Opened as <repo>/blobs/<id> (a snapshot link followed by the
		 * kernel), the noted name is not a snapshot name at all. */
		if (*repo) {
			int r = names_of(a, nc, repo, key, &names);

			if (r < 0) {
				char why[64];

				if (r == -E2BIG)
					snprintf(why, sizeof(why), "more than %d of them",
						 COLLECT_NAMES_MAX);
				else
					snprintf(why, sizeof(why), "%s", strerror(-r));
				store_log_msg(s, LOG_WARNING, "hot, not promoted now: %s: the snapshot "
					      "names the exclusion globs speak of could not be listed "
					      "(%s); it may turn hot again", key, why);
				store_hot_again(s, b);
				goto out;
			}
		}
	}
	for (size_t i = 0; i < names.n && !glob; i++)
		if ((glob = policy_excluded(pol, names.v[i])))
			gname = names.v[i];
	if (glob) {
		char why[PATH_MAX + 300];

		snprintf(why, sizeof(why), "excluded by '%s' (%s): kept on the NAS", glob, gname);
		store_exclude(s, b, why);
		store_log_msg(s, LOG_INFO, "hot, not promoted: %s %s", key, why);
		goto out;
	}
	store_log_msg(s, LOG_INFO, "hot (read from the NAS): promoting %s%s%s%s", key,
		  names.n ? " (" : "", names.n ? names.v[0] : "", names.n ? ")" : "");
	store_promote(s, b, 0, 0);
	if (!pol->siblings || !roots || !*repo)
		goto out;
	/* In several revisions: the ones a ref names are the ones loaded. */
	ref_commits(roots, repo, "", &refs, 0);
	{
		int any_ref = 0;

		for (size_t i = 0; i < names.n; i++) {
			char rev[NAME_MAX + 1];

			rev_of(names.v[i], rev, sizeof(rev));
			for (size_t k = 0; k < refs.n && !any_ref; k++)
				any_ref = hub_is_snapshot_name(names.v[i]) && !strcmp(rev, refs.v[k]);
		}
		for (size_t i = 0; i < names.n; i++) {
			char rev[NAME_MAX + 1];
			int named = 0;

			if (!hub_is_snapshot_name(names.v[i]))
				continue;
			rev_of(names.v[i], rev, sizeof(rev));
			for (size_t k = 0; k < refs.n; k++)
				named |= !strcmp(rev, refs.v[k]);
			if (!any_ref || named)
				queue_siblings(a, names.v[i]);
		}
	}
out:
	names_free(&names);
	names_free(&refs);
}

/* ---- the thread ---- */

/* Hot blobs handed over while the NAS gate says the NAS is down: what to
 * do with one needs NAS walks (its snapshot names, which the exclusion
 * globs speak of; its siblings), which would fail -- and an exclusion
 * not seen would copy an excluded pack -- or hang.  Kept until the NAS is
 * up (a blob lives as long as the store). */
struct deferred {
	struct blob **v;
	size_t n, cap;
};

static void defer(struct auto_promoter *a, struct deferred *d, struct blob *b)
{
	if (d->n == d->cap) {
		size_t cap = d->cap ? 2 * d->cap : 64;
		struct blob **v = realloc(d->v, cap * sizeof(*v));

		if (!v) {
			/* it turns hot again after a failed copy or eviction */
			store_log_msg(a->store, LOG_ERR, "automatic promotion: out of memory: "
				      "%s not promoted", b->key);
			return;
		}
		d->v = v;
		d->cap = cap;
	}
	d->v[d->n++] = b;
}

/* The earlier of two CLOCK_MONOTONIC deadlines, -1 being none. */
static int64_t earlier(int64_t x, int64_t y)
{
	return x < 0 ? y : y < 0 ? x : x < y ? x : y;
}

/* Ref pins are looked at again once a copy of theirs landed, at most so
 * often (ms). */
#define LANDED_POLL_MS 1000

static void *auto_thread(void *arg)
{
	struct auto_promoter *a = arg;
	struct nas_gate *gate = a->store->opt.gate; /* immutable */
	double poll = a->policy ? a->policy->ref_poll : POLICY_REF_POLL;
	int64_t period = (int64_t)(poll * 1000), next = store_now_ms(), last = -1;
	int landed = 0;
	struct name_cache nc = { .map = NULL };
	struct deferred later = { 0 };

	pthread_setname_np(pthread_self(), "wfs-auto");
	while (!atomic_load(&a->stop)) {
		int up = nas_gate_up(gate);
		struct blob *b;
		int64_t due;

		if (up && later.n) {
			for (size_t i = 0; i < later.n && !atomic_load(&a->stop); i++) {
				handle_hot(a, later.v[i], &nc);
				atomic_fetch_add(&a->handled, 1);
			}
			later.n = 0;
			continue;
		}
		/* (while down: refs are not read -- they would fail or hang --
		 * nor a poke taken: both wait for the NAS) */
		/* A copy a ref pin holds landed: the pin may settle on its
		 * revision now rather than at the next ref_poll -- at most
		 * once a LANDED_POLL_MS, a revision's copies landing one by
		 * one (each poll lists the pinned revisions on the NAS). */
		landed |= store_take_ref_landed(a->store);
		if (a->pins && up && (pins_take_poke(a->pins) || store_now_ms() >= next ||
				      (landed && store_now_ms() >= last + LANDED_POLL_MS))) {
			pins_poll(a->pins);
			last = store_now_ms();
			next = last + period;
			landed = 0;
			continue;
		}
		/* Failed copies whose backoff passed (or the NAS came back)
		 * are queued again; the next one due bounds the wait.  A
		 * failure that starts a backoff wakes us (store_wait_hot
		 * returns NULL), so the deadline is never one too late.  While
		 * the NAS is down the gate is looked at once a second (it has
		 * no callback). */
		due = store_retry_due(a->store);
		if (a->pins && up)
			due = earlier(due, landed ? earlier(next, last + LANDED_POLL_MS) : next);
		if (!up && (later.n || a->pins))
			due = earlier(due, store_now_ms() + 1000);
		b = store_wait_hot(a->store, due);
		if (!b && store_stopping(a->store))
			break;
		if (b && a->policy && !nas_gate_up(gate)) {
			defer(a, &later, b);
			continue;
		}
		if (b && a->policy)
			handle_hot(a, b, &nc);
		if (b)
			atomic_fetch_add(&a->handled, 1);
	}
	free(later.v);
	json_decref(nc.map);
	return NULL;
}

int auto_start(struct auto_promoter *a, struct store *s, const struct hub_roots *roots,
	       const struct policy_opts *policy, struct pins *pins)
{
	int r;

	memset(a, 0, sizeof(*a));
	a->store = s;
	a->roots = roots;
	a->policy = policy;
	a->pins = roots ? pins : NULL;
	/* (without either nothing asks for copies the store would retry) */
	if (!policy && !a->pins)
		return 0;
	r = thread_start(&a->thread, NULL, auto_thread, a);
	if (r)
		return r;
	a->started = 1;
	return 0;
}

void auto_stop_tell(struct auto_promoter *a)
{
	if (!a->started)
		return;
	atomic_store(&a->stop, 1);
	store_wake_hot(a->store);
}

int auto_stop_by(struct auto_promoter *a, int64_t deadline_ms)
{
	int r;

	if (!a->started)
		return 0;
	auto_stop_tell(a);
	r = join_by(a->thread, deadline_ms);
	a->started = 0;
	return r;
}

void auto_stop(struct auto_promoter *a)
{
	auto_stop_by(a, -1);
}
