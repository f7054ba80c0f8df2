/* store_auto.c - the store's policy thread: what the engine reads from the
 * NAS becomes local by itself, with the shards a loader will read next; and
 * every few seconds the ref pins are followed (store_refs.c).  See store.h.
 *
 * The daemon's read path only marks a blob hot (store_note_read); the
 * walks this needs (the names of a blob, its sibling shards, a revision's
 * blobs) read NAS directories, so they run here, never in a FUSE thread.
 */
#include "store.h"
#include "store_int.h"
#include "collect.h"
#include "path.h"

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

/* ---- hot blobs ---- */

void auto_hot_locked(struct store *s, struct blob *b)
{
	b->hot = 1;
	if (b->hot_listed || (b->state != BLOB_NAS && b->state != BLOB_FAILED) ||
	    b->hold == HOLD_EXCLUDED)
		return;
	b->hot_listed = 1;
	b->hot_next = NULL;
	if (s->hot_tail)
		s->hot_tail->hot_next = b;
	else
		s->hot_head = b;
	s->hot_tail = b;
	pthread_cond_broadcast(&s->auto_cond);
}

void auto_reset_locked(struct store *s, struct blob *b)
{
	(void)s;
	__atomic_store_n(&b->hot_bytes, atomic_load(&b->nas_bytes), __ATOMIC_RELAXED);
	b->hot_opens = b->nas_opens;
	b->hot = 0;
}

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

static int is_snapshot_name(const char *rel)
{
	char dir[PATH_MAX];

	return hub_snapshot_blob_dir(rel, dir, sizeof(dir));
}

/* The revisions some ref of @repo names (refs/main, refs/pr/1, ...). */
static void ref_commits(const struct hub_roots *roots, const char *repo, const char *sub,
			struct names *out, int depth)
{
	char rel[PATH_MAX], path[PATH_MAX];
	struct dirent *de;
	DIR *d;

	snprintf(rel, sizeof(rel), "%s/refs%s%s", repo, *sub ? "/" : "", sub);
	if (path_join(roots->path[0], rel, path, sizeof(path)) < 0 || !(d = opendir(path)))
		return;
	while ((de = readdir(d))) {
		char child[PATH_MAX], commit[NAME_MAX + 1];

		if (de->d_name[0] == '.')
			continue;
		snprintf(child, sizeof(child), "%s%s%s", sub, *sub ? "/" : "", de->d_name);
		if (refs_read(roots, repo, child, commit, sizeof(commit)) == 0)
			names_add(out, commit);
		else if (depth < 2 && de->d_type == DT_DIR)
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

	if (strchr(file, '/') || !strcmp(file, sc->base))
		return 0; /* only files of the index's own directory */
	return names_add(sc->files, file) < 0 ? -ENOMEM : 0;
}

/* The files of @dir (mount-relative) a loader reads with @base: shards of
 * the same checkpoint, and the files a *.index.json weight_map lists with
 * it. */
static void find_siblings(struct store *s, const char *dir, const char *base,
			  struct names *files)
{
	const struct hub_roots *roots = s->opt.roots;
	struct ns_entry *e = malloc(sizeof(*e));
	struct sibling_scan sc = { base, files };
	char path[PATH_MAX];
	struct dirent *de;
	DIR *d = NULL;

	if (e && hub_check_parents(roots, dir) == 0 &&
	    path_join(roots->path[0], dir, path, sizeof(path)) == 0)
		d = opendir(path);
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
static void queue_siblings(struct store *s, const char *name)
{
	const struct policy_opts *pol = s->opt.policy;
	struct names files = { 0 };
	struct blob_set set = { 0 };
	char dir[PATH_MAX];
	const char *base = strrchr(name, '/') ? strrchr(name, '/') + 1 : name;
	size_t queued = 0, excluded = 0;

	path_dirname(name, dir, sizeof(dir));
	find_siblings(s, dir, base, &files);
	for (size_t i = 0; i < files.n; i++) {
		char rel[PATH_MAX];

		if (path_join(dir, files.v[i], rel, sizeof(rel)) == 0)
			collect(s->opt.roots, s, pol, rel, &set);
	}
	blob_set_unique(&set);
	for (size_t i = 0; i < set.n; i++) {
		struct blob *b = set.v[i];
		int go;

		if (set.glob[i]) {
			char why[PATH_MAX + 300];

			snprintf(why, sizeof(why), "excluded by '%s' (%s): kept on the NAS",
				 set.glob[i], set.name[i]);
			store_exclude(s, b, why);
			excluded++;
			continue;
		}
		pthread_mutex_lock(&s->lock);
		go = (b->state == BLOB_NAS || b->state == BLOB_FAILED) && b->hold != HOLD_EXCLUDED;
		if (go)
			b->hot = 1; /* queued now: its own reads need not queue it again */
		pthread_mutex_unlock(&s->lock);
		if (go) {
			store_promote(s, b, 0, 0);
			queued++;
		}
	}
	if (queued || excluded)
		store_log(s, LOG_INFO, "%s is hot: queued %zu sibling shard%s of it (%zu excluded)",
			  name, queued, queued == 1 ? "" : "s", excluded);
	blob_set_free(&set);
	names_free(&files);
}

/* The snapshot names of every blob of one repo, from one walk: a repo with
 * many small files turning hot one after the other costs one walk, not one
 * each.  Only the policy thread uses it. */
#define NAME_CACHE_S 30        /* a new revision's names are seen this late at most */
#define NAME_CACHE_MAX 200000  /* names kept */

struct name_cache {
	char repo[NAME_MAX + 1];
	time_t at;
	json_t *map;           /* NAS key -> [mount-relative names] */
	size_t n;
};

static int cache_one(void *arg, const char *rel, const struct ns_entry *e)
{
	struct name_cache *nc = arg;
	json_t *v = json_object_get(nc->map, e->backing);

	if (nc->n >= NAME_CACHE_MAX)
		return 1;
	if (!v) {
		v = json_array();
		if (!v || json_object_set_new(nc->map, e->backing, v) < 0)
			return -ENOMEM;
	}
	nc->n++;
	return json_array_append_new(v, json_string(rel)) < 0 ? -ENOMEM : 0;
}

static void names_of(struct store *s, struct name_cache *nc, const char *repo, const char *key,
		     struct names *out)
{
	time_t now = time(NULL);
	json_t *v, *name;
	size_t i;

	/* a blob the cache does not know may be in a revision newer than it */
	if (nc->map && !strcmp(nc->repo, repo) && now > nc->at &&
	    !json_object_get(nc->map, key))
		nc->at = 0;
	if (strcmp(nc->repo, repo) || now - nc->at > NAME_CACHE_S || !nc->map) {
		char snaps[PATH_MAX];

		json_decref(nc->map);
		nc->map = json_object();
		nc->n = 0;
		nc->at = now;
		snprintf(nc->repo, sizeof(nc->repo), "%s", repo);
		snprintf(snaps, sizeof(snaps), "%s/snapshots", repo);
		if (nc->map)
			collect_walk(s->opt.roots, snaps, cache_one, nc);
	}
	v = json_object_get(nc->map, key);
	json_array_foreach(v, i, name)
		names_add(out, json_string_value(name));
}

static void handle_hot(struct store *s, struct blob *b, struct name_cache *nc)
{
	const struct policy_opts *pol = s->opt.policy;
	const struct hub_roots *roots = s->opt.roots;
	struct names names = { 0 }, refs = { 0 };
	char key[PATH_MAX], repo[NAME_MAX + 1] = "";
	const char *glob = NULL, *gname = NULL;
	enum blob_state st;

	pthread_mutex_lock(&s->lock);
	snprintf(key, sizeof(key), "%s", b->key);
	st = b->state;
	if (b->name)
		names_add(&names, b->name);
	pthread_mutex_unlock(&s->lock);
	if (st != BLOB_NAS && st != BLOB_FAILED)
		goto out;
	if (roots) {
		const char *rel = names.n ? names.v[0] : path_under(roots->path[0], key);

		if (rel)
			snprintf(repo, sizeof(repo), "%.*s", (int)strcspn(rel, "/"), rel);
		/* Opened as <repo>/blobs/<id> (a snapshot link followed by the
		 * kernel): its snapshot names are what globs and shards speak of. */
		if (*repo && (!names.n || !is_snapshot_name(names.v[0])))
			names_of(s, nc, repo, key, &names);
	}
	for (size_t i = 0; i < names.n && !glob; i++)
		if ((glob = policy_excluded(pol, names.v[i])))
			gname = names.v[i];
	if (glob) {
		char why[PATH_MAX + 300];

		snprintf(why, sizeof(why), "excluded by '%s' (%s): kept on the NAS", glob, gname);
		store_exclude(s, b, why);
		store_log(s, LOG_INFO, "hot, not promoted: %s %s", key, why);
		goto out;
	}
	store_log(s, LOG_INFO, "hot (read from the NAS): promoting %s%s%s%s", key,
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
				any_ref = is_snapshot_name(names.v[i]) && !strcmp(rev, refs.v[k]);
		}
		for (size_t i = 0; i < names.n; i++) {
			char rev[NAME_MAX + 1];
			int named = 0;

			if (!is_snapshot_name(names.v[i]))
				continue;
			rev_of(names.v[i], rev, sizeof(rev));
			for (size_t k = 0; k < refs.n; k++)
				named |= !strcmp(rev, refs.v[k]);
			if (!any_ref || named)
				queue_siblings(s, names.v[i]);
		}
	}
out:
	names_free(&names);
	names_free(&refs);
}

/* ---- the thread ---- */

static void *auto_thread(void *arg)
{
	struct store *s = arg;
	double poll = s->opt.policy ? s->opt.policy->ref_poll : POLICY_REF_POLL;
	struct name_cache nc = { .map = NULL };
	struct timespec next;

	clock_gettime(CLOCK_REALTIME, &next);
	pthread_mutex_lock(&s->lock);
	while (!s->stop) {
		struct blob *b = s->hot_head;
		struct timespec now;

		if (b) {
			s->hot_head = b->hot_next;
			if (!s->hot_head)
				s->hot_tail = NULL;
			b->hot_next = NULL;
			b->hot_listed = 0;
			pthread_mutex_unlock(&s->lock);
			handle_hot(s, b, &nc);
			pthread_mutex_lock(&s->lock);
			continue;
		}
		clock_gettime(CLOCK_REALTIME, &now);
		if (s->opt.roots && (s->refs_poked || now.tv_sec > next.tv_sec ||
				     (now.tv_sec == next.tv_sec && now.tv_nsec >= next.tv_nsec))) {
			s->refs_poked = 0;
			pthread_mutex_unlock(&s->lock);
			refs_poll(s);
			pthread_mutex_lock(&s->lock);
			clock_gettime(CLOCK_REALTIME, &next);
			next.tv_sec += (time_t)poll;
			next.tv_nsec += (long)((poll - (double)(time_t)poll) * 1e9);
			if (next.tv_nsec >= 1000000000L) {
				next.tv_sec++;
				next.tv_nsec -= 1000000000L;
			}
			continue;
		}
		if (s->opt.roots)
			pthread_cond_timedwait(&s->auto_cond, &s->lock, &next);
		else
			pthread_cond_wait(&s->auto_cond, &s->lock);
	}
	pthread_mutex_unlock(&s->lock);
	json_decref(nc.map);
	return NULL;
}

int auto_start(struct store *s, pthread_t *t)
{
	int r;

	if (!s->opt.policy && !s->opt.roots)
		return 0;
	r = pthread_create(t, NULL, auto_thread, s);
	return r ? -r : 1;
}
