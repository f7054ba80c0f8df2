/* collect.c - the blobs under a mount-relative path; see collect.h. */
#include "collect.h"
#include "path.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>


static int set_add(struct blob_set *set, struct blob *b, const char *glob, const char *name)
{
	if (set->n == set->cap) {
		size_t cap = set->cap ? set->cap * 2 : 64;
		struct blob **v = realloc(set->v, cap * sizeof(*v));
		const char **g;
		char **nm;

		if (!v)
			return -ENOMEM;
		set->v = v;
		g = realloc(set->glob, cap * sizeof(*g));
		if (!g)
			return -ENOMEM;
		set->glob = g;
		nm = realloc(set->name, cap * sizeof(*nm));
		if (!nm)
			return -ENOMEM;
		set->name = nm;
		set->cap = cap;
	}
	set->v[set->n] = b;
	set->glob[set->n] = glob;
	set->name[set->n] = glob ? strdup(name) : NULL;
	set->n++;
	return 0;
}

int blob_set_add(struct blob_set *set, struct blob *b)
{
	return set_add(set, b, NULL, NULL);
}

struct order {
	struct blob *b;
	const char *glob;
	char *name;
};

static int order_cmp(const void *a, const void *b)
{
	const struct order *x = a, *y = b;

	if (x->b != y->b)
		return x->b < y->b ? -1 : 1;
	/* an excluded name first, so that it is the one kept */
	return (y->glob != NULL) - (x->glob != NULL);
}

void blob_set_unique(struct blob_set *set)
{
	struct order *o;
	size_t w = 0;

	if (set->n < 2)
		return;
	o = malloc(set->n * sizeof(*o));
	if (!o)
		return; /* duplicates are harmless, only slower */
	for (size_t i = 0; i < set->n; i++)
		o[i] = (struct order){ set->v[i], set->glob[i], set->name[i] };
	qsort(o, set->n, sizeof(*o), order_cmp);
	for (size_t i = 0; i < set->n; i++) {
		if (w && set->v[w - 1] == o[i].b) {
			free(o[i].name);
			continue;
		}
		set->v[w] = o[i].b;
		set->glob[w] = o[i].glob;
		set->name[w] = o[i].name;
		w++;
	}
	set->n = w;
	free(o);
}

int blob_set_has(const struct blob_set *set, const struct blob *b)
{
	size_t lo = 0, hi = set->n;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (set->v[mid] == b)
			return 1;
		if ((const void *)set->v[mid] < (const void *)b)
			lo = mid + 1;
		else
			hi = mid;
	}
	return 0;
}

void blob_set_clear(struct blob_set *set)
{
	for (size_t i = 0; i < set->n; i++)
		free(set->name[i]);
	set->n = 0;
}

void blob_set_free(struct blob_set *set)
{
	blob_set_clear(set);
	free(set->v);
	free(set->glob);
	free(set->name);
	memset(set, 0, sizeof(*set));
}

struct file_walk {
	int (*fn)(void *arg, const char *rel, const struct ns_entry *e);
	void *arg;
};

static int file_only(void *arg, const char *rel, const struct ns_entry *e)
{
	struct file_walk *fw = arg;

	if (e->kind == NS_FILE ||
	    (e->kind == NS_LINK && e->link_state == NS_LINK_RESOLVED && e->backing[0]))
		return fw->fn(fw->arg, rel, e);
	return 0;
}

int collect_walk(const struct hub_roots *roots, const char *rel, int strict,
		 int (*fn)(void *arg, const char *rel, const struct ns_entry *e), void *arg)
{
	struct file_walk fw = { fn, arg };

	return ns_walk(roots, rel, NS_WALK_WEIGHTS | (strict ? NS_WALK_STRICT : 0), file_only,
		       &fw);
}

/* ---- the snapshot names of blobs ---- */

struct name_map {
	json_t *map;
	size_t n, max;
};

static int map_one(void *arg, const char *rel, const struct ns_entry *e)
{
	struct name_map *nm = arg;
	json_t *v = json_object_get(nm->map, e->backing);

	if (nm->n >= nm->max)
		return -E2BIG; /* part of the names would hide an exclusion */
	if (!v) {
		v = json_array();
		/* _nocheck: NAS names need not be UTF-8, and this map is
		 * never serialised */
		if (!v || json_object_set_new_nocheck(nm->map, e->backing, v) < 0)
			return -ENOMEM;
	}
	nm->n++;
	return json_array_append_new(v, json_string_nocheck(rel)) < 0 ? -ENOMEM : 0;
}

int collect_snapshot_names(const struct hub_roots *roots, const char *repo, json_t *map,
			   size_t max)
{
	struct name_map nm = { map, 0, max };
	char snaps[PATH_MAX];
	int r;

	if (snprintf(snaps, sizeof(snaps), "%s/snapshots", repo) >= (int)sizeof(snaps))
		return -ENAMETOOLONG;
	r = collect_walk(roots, snaps, 1, map_one, &nm);
	if (r == -ENOENT)
		return 0; /* no snapshots: no names */
	return r < 0 ? r : (int)nm.n;
}

/* A path inside "<repo>/blobs" names blobs by their blobs/<id> names only,
 * which the exclusion globs rarely speak of: their snapshot names count
 * too (README "Exclusions": a blob is excluded when any of its names is).
 * For such a path, with globs to match, a new map of @rel's repo's
 * snapshot names by NAS key in *@map (NULL otherwise).  Returns -errno:
 * without the names the exclusions cannot be told, and an excluded pack
 * must not be copied for want of them. */
static int blob_dir_names(const struct hub_roots *roots, const struct policy_opts *pol,
			  const char *rel, json_t **map)
{
	size_t len = strcspn(rel, "/");
	char repo[NAME_MAX + 1];
	int r;

	*map = NULL;
	if (!pol || !pol->nexclude || !rel[len] || strncmp(rel + len + 1, "blobs", 5) ||
	    (rel[len + 6] && rel[len + 6] != '/') || len > NAME_MAX)
		return 0;
	snprintf(repo, sizeof(repo), "%.*s", (int)len, rel);
	if (!(*map = json_object()))
		return -ENOMEM;
	r = collect_snapshot_names(roots, repo, *map, COLLECT_NAMES_MAX);
	if (r < 0) {
		json_decref(*map);
		*map = NULL;
	}
	return r < 0 ? r : 0;
}

/* The exclusion glob a snapshot name of the NAS file @key matches, that
 * name in *@name; NULL if none does. */
static const char *names_excluded(const struct policy_opts *pol, json_t *map, const char *key,
				  const char **name)
{
	json_t *v = json_object_get(map, key), *nm;
	const char *glob;
	size_t i;

	json_array_foreach(v, i, nm)
		if ((glob = policy_excluded(pol, json_string_value(nm)))) {
			*name = json_string_value(nm);
			return glob;
		}
	return NULL;
}

/* Note the glob of an excluded snapshot name of each blob of @set from
 * @from on (found by its blobs/ name, not excluded by it). */
static int set_exclude_by_names(struct blob_set *set, size_t from,
				const struct policy_opts *pol, json_t *map)
{
	for (size_t i = from; map && i < set->n; i++) {
		const char *name = NULL, *glob;

		if (set->glob[i] || !(glob = names_excluded(pol, map, set->v[i]->key, &name)))
			continue;
		if (!(set->name[i] = strdup(name)))
			return -ENOMEM;
		set->glob[i] = glob;
	}
	return 0;
}

struct collecting {
	struct store *s;
	const struct policy_opts *pol;
	struct blob_set *set;
};

/* The attributes of the regular file behind @e into @st: 0, or -1 (not
 * one, or gone).  The walk read them; a stat of @backing only when not. */
static int backing_file(const struct ns_entry *e, struct stat *st)
{
	if (e->has_backing_st)
		*st = e->backing_st;
	else if (stat(e->backing, st) < 0)
		return -1;
	return S_ISREG(st->st_mode) ? 0 : -1;
}

static int collect_one(void *arg, const char *rel, const struct ns_entry *e)
{
	struct collecting *c = arg;
	struct stat st;
	struct blob *b;

	if (backing_file(e, &st) < 0)
		return 0;
	b = store_blob(c->s, e->backing, &st, e->blob_id);
	if (!b)
		return -ENOMEM;
	/* the repo of a blob in a hub-level store: its name alone says it */
	store_note_name(c->s, b, rel);
	return set_add(c->set, b, policy_excluded(c->pol, rel), rel);
}

/* -EMEDIUMTYPE for a path that is not weight data, but -ENOENT for one
 * that is not there at all: a mistyped name ("snapshot/", a repo with one
 * dash missing) must say so, not that it is never copied. */
static int not_weights(const struct hub_roots *roots, const char *rel)
{
	struct ns_entry *e = malloc(sizeof(*e));
	int r;

	if (!e)
		return -ENOMEM;
	r = ns_classify(roots, rel, e);
	free(e);
	return r == -ENOENT || r == -ENOTDIR ? -ENOENT : -EMEDIUMTYPE;
}

int collect(const struct hub_roots *roots, struct store *s, const struct policy_opts *pol,
	    const char *rel, struct blob_set *set)
{
	struct collecting c = { s, pol, set };
	size_t n0 = set->n;
	json_t *names;
	int r;

	if (!hub_holds_weights(rel))
		return not_weights(roots, rel);
	r = collect_walk(roots, rel, 1, collect_one, &c);
	if (r < 0 || (r = blob_dir_names(roots, pol, rel, &names)) < 0)
		return r;
	r = set_exclude_by_names(set, n0, pol, names);
	json_decref(names);
	return r;
}

/* ---- read-only: collect_peek ---- */

static int nas_add(struct nas_set *set, const char *key, const char *id, uint64_t size,
		   const char *glob, const char *name)
{
	struct nas_file *f;

	if (set->n == set->cap) {
		size_t cap = set->cap ? set->cap * 2 : 64;
		struct nas_file *v = realloc(set->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		set->v = v;
		set->cap = cap;
	}
	f = &set->v[set->n];
	*f = (struct nas_file){ .key = strdup(key), .id = strdup(id), .size = size,
				.glob = glob, .name = glob ? strdup(name) : NULL };
	if (!f->key || !f->id || (glob && !f->name)) {
		free(f->key);
		free(f->id);
		free(f->name);
		return -ENOMEM;
	}
	set->n++;
	return 0;
}

static void nas_file_free(struct nas_file *f)
{
	free(f->key);
	free(f->id);
	free(f->name);
}

static int nas_cmp(const void *a, const void *b)
{
	const struct nas_file *x = a, *y = b;
	int r = strcmp(x->key, y->key);

	/* an excluded name first, so that it is the one kept */
	return r ? r : (y->glob != NULL) - (x->glob != NULL);
}

void nas_set_unique(struct nas_set *set)
{
	size_t w = 0;

	if (set->n < 2)
		return;
	qsort(set->v, set->n, sizeof(*set->v), nas_cmp);
	for (size_t i = 0; i < set->n; i++) {
		if (w && !strcmp(set->v[w - 1].key, set->v[i].key)) {
			nas_file_free(&set->v[i]);
			continue;
		}
		set->v[w++] = set->v[i];
	}
	set->n = w;
}

void nas_set_clear(struct nas_set *set)
{
	for (size_t i = 0; i < set->n; i++)
		nas_file_free(&set->v[i]);
	set->n = 0;
}

void nas_set_free(struct nas_set *set)
{
	nas_set_clear(set);
	free(set->v);
	memset(set, 0, sizeof(*set));
}

struct peeking {
	struct store *s;
	const struct policy_opts *pol;
	struct blob_set *known;
	struct nas_set *unknown;
};

int collect_peek_file(struct store *s, const struct policy_opts *pol, const char *rel,
		      const struct ns_entry *e, struct blob_set *known, struct nas_set *unknown)
{
	const char *glob = policy_excluded(pol, rel);
	struct stat st;
	struct blob *b;

	if (backing_file(e, &st) < 0)
		return 0;
	/* store_find, never store_blob: a walk by any local user must not
	 * grow the table (nor, through it, the index on disk). */
	b = store_find(s, e->backing);
	if (b)
		return set_add(known, b, glob, rel);
	return nas_add(unknown, e->backing, e->blob_id, (uint64_t)st.st_size, glob, rel);
}

static int peek_one(void *arg, const char *rel, const struct ns_entry *e)
{
	struct peeking *p = arg;

	return collect_peek_file(p->s, p->pol, rel, e, p->known, p->unknown);
}

int collect_peek(const struct hub_roots *roots, struct store *s, const struct policy_opts *pol,
		 const char *rel, struct blob_set *known, struct nas_set *unknown)
{
	struct peeking p = { s, pol, known, unknown };
	size_t k0 = known->n, u0 = unknown->n;
	json_t *names;
	int r;

	if (!hub_holds_weights(rel))
		return not_weights(roots, rel);
	r = collect_walk(roots, rel, 0, peek_one, &p);
	if (r < 0 || (r = blob_dir_names(roots, pol, rel, &names)) < 0)
		return r;
	r = set_exclude_by_names(known, k0, pol, names);
	for (size_t i = u0; names && r == 0 && i < unknown->n; i++) {
		struct nas_file *f = &unknown->v[i];
		const char *name = NULL, *glob;

		if (f->glob || !(glob = names_excluded(pol, names, f->key, &name)))
			continue;
		if (!(f->name = strdup(name)))
			r = -ENOMEM;
		else
			f->glob = glob;
	}
	json_decref(names);
	return r;
}
